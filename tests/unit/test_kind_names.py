"""One name per analysis: the registry's name is the kind's name everywhere (HTTP, CLI, Python, pages); its older
names are aliases declared in its entry, resolved once (`kinds.get_kind`); a renamed kind keeps its cache key."""
from __future__ import annotations

import pytest

from backend.analysis.kinds import KINDS, Kind, aliases, get_kind, register, unregister
from backend.analysis.params import Params
from backend.analysis.results import Result

OLD = {"maps": "head_maps", "scores": "head_scores", "icl": "icl_curve", "vectors": "task_vectors",
       "build_vectors": "task_vectors", "perturb": "perturbation_report", "patching": "activation_patching",
       "fit": "task_fit", "head": "head_view", "ltv_train": "ltv_vector", "ltv": "ltv_layers", "train_ltv": "ltv_layers",
       "ltv_tasks": "ltv_across_tasks", "site": "site_alphas", "train_site": "site_alphas",
       "findings": "findings_report", "methods": "compare_methods", "head_view": "head_view"}
"""Every name the product answered to before (kind names, Python function names) -> the kind's name now."""


def test_every_old_name_resolves_to_one_kind():
    for old, new in OLD.items():
        assert get_kind(old).name == new and old in KINDS and KINDS[old] is KINDS[new], old


def test_names_and_aliases_are_unique_and_python_identifiers():
    names = [n for k in KINDS.values() for n in k.names]
    assert len(names) == len(set(names))
    assert all(n.isidentifier() and n == n.lower() for n in names)
    assert set(aliases()) == {a for k in KINDS.values() for a in k.aliases}
    assert list(KINDS) == [k.name for k in KINDS.values()]  # iteration: the names only, no alias
    assert all(k.api == k.name and k.cli == k.name.replace("_", "-") for k in KINDS.values())


def test_a_renamed_kind_keeps_its_cache_key():
    """The key is made from `Kind.key`, the name the results were filed under before the rename, so every cached
    result is still found (bench/bit_identical.py compares the entries themselves)."""
    from backend.analysis.kernel import cache_key, index_key, validate_params

    for old, new in OLD.items():
        spec = get_kind(new)
        if old != spec.key:
            continue
        before = Kind(old, spec.params_model, spec.result_model, spec.fn, spec.description, version=spec.version)
        p = validate_params(spec, {f: v for f, v in {"heads": [[0, 1]], "head": [0, 1]}.items()
                                   if f in spec.params.model_fields})
        assert cache_key(spec, None, None, p) == cache_key(before, None, None, p) and \
            cache_key(spec, None, None, p).startswith(f"{old}:"), new
        assert index_key(spec.key, None, None) == index_key(old, None, None)
    assert get_kind("head_scores").params.__name__ == "HeadScoresParams"  # the module's classes keep their names
    assert all(k.key == k.name for k in KINDS.values() if not k.aliases)


def test_an_unknown_name_lists_the_kinds_and_a_taken_name_is_refused():
    with pytest.raises(KeyError, match="unknown analysis kind 'scorez'; kinds: model_info, head_maps"):
        get_kind("scorez")

    class P(Params):
        pass

    with pytest.raises(ValueError, match="'scores' is already registered \\(as 'head_scores'\\)"):
        register(Kind("t_names", P, Result, "x:y", "", aliases=("scores",)))
    assert "t_names" not in KINDS
    with pytest.raises(ValueError, match="built-in"):
        unregister("scores")
    register(Kind("t_names", P, Result, "x:y", "", aliases=("t_old",)))
    try:
        assert get_kind("t_old").name == "t_names"
    finally:
        unregister("t_old")  # an alias names its kind here too
    assert "t_names" not in KINDS and "t_old" not in KINDS


def test_the_readme_lists_every_old_name():
    """The README's table of old names: every kind that has aliases, with them; a row is the registry's. A kind with
    no old name (a new one) needs no row."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    table = text.split("| kind | old names (aliases) |", 1)[1].split("\n\n", 1)[0]
    rows = {name: re.findall(r"`(\w+)`", old) for name, old in re.findall(r"^\| `(\w+)` \| (.*) \|$", table, re.M)}
    assert rows == {name: list(KINDS[name].aliases) for name in rows if name in KINDS}, "a row not the registry's"
    assert {k.name for k in KINDS.values() if k.aliases} <= set(rows), "a kind with old names missing from the table"
