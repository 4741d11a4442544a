"""The pages' settings come from the kinds' params models, and pages read results without restating backend
defaults (issue 26, item 2).

- every page setting bound to a kind field (`ui.settings.WIDGETS`) has the kind's default, bounds and options, and
  a link's check takes exactly what its widget takes;
- every widget in pages/ and ui/ bound to such a setting draws its bounds from `ui.settings` (no literal
  min_value / max_value / options);
- no page or UI module reads a result with `.get("<field>", <literal>)` for a field a result model declares.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from backend.analysis.kinds import KINDS, get_kind
from ui import settings, state

ROOT = Path(__file__).resolve().parents[2]
UI_FILES = [*ROOT.glob("pages/*.py"), *ROOT.glob("ui/**/*.py"), ROOT / "app.py"]


def model_field(name: str):
    kind, fname = settings.WIDGETS[name]
    return get_kind(kind).params.model_fields[fname]


def metadata_bound(f, *attrs: str):
    for m in f.metadata:
        for a in attrs:
            if getattr(m, a, None) is not None:
                return getattr(m, a)
    return None


@pytest.mark.parametrize("name", sorted(settings.WIDGETS))
def test_each_setting_is_its_kinds_field(name):
    """Default, bounds and options of the setting are the params model's (narrowed only where UI_RANGES says)."""
    f, sp = model_field(name), settings.spec(name)
    want = f.get_default(call_default_factory=True)
    assert sp.default == (settings.UI_DEFAULTS[name] if name in settings.UI_DEFAULTS else want), name
    assert state.FIELDS[name].default() == sp.default
    if name not in settings.UI_RANGES:
        if sp.type in ("integer", "number") and not isinstance(want, list):
            assert sp.lo == metadata_bound(f, "ge"), name
            assert sp.hi == metadata_bound(f, "le"), name
    assert sp.help == (f.description or "")


@pytest.mark.parametrize("name", sorted(settings.WIDGETS))
def test_a_link_takes_what_the_widget_takes(name):
    """The URL's check of a setting (ui.state) accepts its bounds and refuses one step beyond them, with a message
    naming them; a choice outside the kind's options is refused."""
    sp, parse = settings.spec(name), state.FIELDS[name].parse
    if sp.options:
        assert parse(sp.options[-1]) in (sp.options[-1], [sp.options[-1]])
        with pytest.raises(ValueError, match="one of"):
            parse("not-an-option")
    step = 1 if sp.type == "integer" else 1e-9
    for edge, beyond in ((sp.lo, -step), (sp.hi, step)):
        if edge is None or name in state.SERVER_LIMITS and beyond > 0:
            continue
        assert parse(str(edge)) in (edge, [edge])
        with pytest.raises(ValueError, match="between"):
            parse(repr(edge + beyond))


def test_ui_ranges_and_defaults_only_narrow_what_the_kind_takes():
    for name, (lo, hi) in settings.UI_RANGES.items():
        f = model_field(name)
        kind_lo = metadata_bound(f, "ge", "gt")
        kind_hi = metadata_bound(f, "le", "lt")
        assert lo is None or kind_lo is None or lo >= kind_lo, name
        assert hi is None or kind_hi is None or hi <= kind_hi, name
    for name, v in settings.UI_DEFAULTS.items():
        assert v is None or v in (settings.spec(name).options or [v]), name


def test_the_sidebar_and_a_link_share_the_services_bounds():
    assert state.bounds("shots", {"max_shots": 32}) == (0, 32) and state.bounds("prompts", {"max_prompts": 500}) == (1, 500)
    assert state.bounds("shots") == (0, None)  # a service that states no limit: the kind's least value only


def widget_calls():
    """(file, line, setting, keywords) of every `state.bind(widget, label, "<setting>", ...)` call."""
    for f in UI_FILES:
        for node in ast.walk(ast.parse(f.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "bind"
                    and len(node.args) >= 3 and isinstance(node.args[2], ast.Constant)):
                yield f.relative_to(ROOT), node.lineno, node.args[2].value, {k.arg: k.value for k in node.keywords}


def test_every_widget_of_a_kind_setting_reads_its_bounds_from_the_kind():
    seen, bad = set(), []
    for f, line, name, kw in widget_calls():
        if name not in settings.WIDGETS:
            continue
        seen.add(name)
        for k in ("min_value", "max_value", "options", "value"):
            if k in kw and isinstance(kw[k], (ast.Constant, ast.List, ast.Tuple, ast.UnaryOp)):
                bad.append(f"{f}:{line} {name}: {k}={ast.unparse(kw[k])}")
    assert not bad, "literal bounds on kind settings: " + "; ".join(bad)
    assert {"ltv_lr", "ltv_epochs", "site_m", "sg_alpha", "seed", "top_k", "mode"} <= seen


def reads(kw: dict, what: str) -> set[str]:
    """The settings named in calls to `<module>.<what>("<setting>")` among a call's keyword values."""
    return {n.args[0].value for v in kw.values() for n in ast.walk(v)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == what
            and n.args and isinstance(n.args[0], ast.Constant)}


def test_number_inputs_and_choices_of_kind_settings_take_their_own_spec():
    """A number input of a kind setting takes `**settings.widget_bounds(<its name>)` (shots and prompts: the service's
    limits, `state.bounds`), and a choice its kind's options (`state.options(<its name>)`)."""
    bad = []
    for f, line, name, kw in widget_calls():
        if name not in settings.WIDGETS:
            continue
        spread = {n.args[0].value for k in kw if k is None for n in [kw[None]]
                  if isinstance(n, ast.Call) and n.func.attr == "widget_bounds"}
        if {"min_value", "max_value"} & set(kw) or None in kw:
            ok = spread == {name} or name in state.SERVER_LIMITS
            bad += [] if ok else [f"{f}:{line} {name}: bounds of {spread or 'literals'}"]
        if "options" in kw and name != "sg_vectors":
            bad += [] if reads(kw, "options") == {name} else [f"{f}:{line} {name}: options not its kind's"]
    assert not bad, "; ".join(bad)


def result_fields() -> set[str]:
    """Every field name a result model declares, its nested models' included."""
    out: set[str] = set()
    for k in KINDS.values():
        s = k.result_schema()
        for model in [s, *s.get("$defs", {}).values()]:
            out |= set(model.get("properties", {}))
    return out


DICT_KEYS = {("ui/site/figures.py", "site"): "params_count is a dict keyed by method, not the result's `site`"}
"""`.get(key, default)` calls whose key is a key of a plain dict that happens to share a result field's name."""
NOT_RESULTS = {"caps", "params", "t", "info", "cfg", "text"}
"""Names that hold no result: the service's capabilities, a job's request, a task's info, a model's config."""


def test_no_page_restates_a_result_default():
    """`r.get("seeds", [0, 1, 2])` restates what the backend fills in; a typed result (`ui.results`) has the field."""
    fields, bad = result_fields(), []
    for f in UI_FILES:
        rel = str(f.relative_to(ROOT))
        for node in ast.walk(ast.parse(f.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                    and len(node.args) == 2 and isinstance(node.args[0], ast.Constant)
                    and node.args[0].value in fields and (rel, node.args[0].value) not in DICT_KEYS
                    and not (isinstance(node.func.value, ast.Name) and node.func.value.id in NOT_RESULTS)
                    and not (isinstance(node.args[1], ast.Constant) and node.args[1].value is None)):
                bad.append(f"{rel}:{node.lineno} {ast.unparse(node)}")
    assert not bad, "result fields read with a restated default: " + "; ".join(bad)


# -- results read by attribute, checked once where they enter the session (ui/results.py) -------------------------------
@pytest.fixture
def schemas():
    """The result schemas as the service states them (its capabilities' `job_kinds`)."""
    settings.load({"job_kinds": [{"name": k.name, "params": k.schema(), "result": k.result_schema()}
                                 for k in KINDS.values()]})
    return settings


def curve(**extra):
    return {"accuracy": [0.5, 0.25], "label_accuracy": [1.0, 1.0], "tr_ratio": [0.4, 0.2], "heads": [[0, 1]], **extra}


def test_a_result_reads_by_attribute_with_the_models_defaults_filled(schemas):
    import copy
    import pickle

    from ui.results import Record, typed

    r = typed("ablation_curves", {"ks": [0, 1], "mode": "zero", "n_configs": 3, "positions": "all", "prompts": 4,
                                  "shots": 2, "curves": {"tr": curve(), "random": curve(seeds=[0, 1])}})
    assert isinstance(r, Record) and isinstance(r.curves, Record) and isinstance(r.curves["tr"], Record)
    assert r.curves["random"].seeds == [0, 1] and r.curves["tr"].seeds is None  # the model's default, not a guess
    assert r.warnings == [] and r.seconds == 0.0 and r.cache_hit is False  # the envelope's defaults
    assert r["prompts"] == r.prompts == 4
    with pytest.raises(AttributeError, match="no field 'nope'"):
        r.nope
    for back in (pickle.loads(pickle.dumps(r)), copy.deepcopy(r)):
        assert back == r and isinstance(back.curves["random"], Record) and back.curves["random"].seeds == [0, 1]


def test_a_result_without_a_required_field_is_refused_naming_it(schemas):
    from ui.results import ResultError, typed

    with pytest.raises(ResultError, match=r"ablation_curves.curves\['tr'\] lacks `tr_ratio`"):
        typed("ablation_curves", {"ks": [0], "mode": "zero", "n_configs": 1, "positions": "all", "prompts": 4,
                                  "shots": 2, "curves": {"tr": {k: v for k, v in curve().items() if k != "tr_ratio"}}})
    with pytest.raises(ResultError, match="ablate lacks `rows`"):
        typed("ablate", {"after": {}, "before": {}, "heads": [], "mode": "zero", "positions": "all", "prompts": 1,
                         "shots": 0})


def test_a_kind_the_service_states_no_schema_for_passes_unchecked(schemas):
    from ui.results import Record, typed

    r = typed("no_such_kind", {"value": 1})
    assert isinstance(r, Record) and r.value == 1
