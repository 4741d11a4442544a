"""Page state shared by every page, mirrored in the URL's query parameters.

The state lives in `st.session_state` under `s_<field>`; widgets use their own keys `w_<field>` and copy
their value over in an `on_change` callback, so a value survives page switches (Streamlit drops the state
of widgets that a page does not draw). On the first run of a session the state is read from the URL, and
every run writes it back, so a copied link reopens the same view:

    ?model=default&task=syn-sentiment&shots=8&prompts=50&seed=0&heads=2.6,1.5&mode=zero&map=tr

Heads are written `layer.head`, comma-separated, as the CLI's `--heads` takes them. Every setting of every
page is a field here (the Steering page's `sg_*`, the drill-down's `head`, `prompt`, `text`, ...); view fields
are left out of the URL while they hold their default, so links stay short.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import streamlit as st

from . import settings
from .settings import fmt_ints, offsets  # noqa: F401 (the LTV page's positions: state.offsets)

Head = tuple[int, int]
MAPS = ("tr", "tl", "dla_tr", "dla_tl", "induction", "cie")  # the five of `scores`, and the CIE (kind `activation_patching`)
MIN_TOP_HEADS = 4  # the backend's rule for a top-p% set (options.MIN_TOP_HEADS), named in the sidebar's help


def default_model() -> str:
    return os.environ.get("HEADLENS_DEFAULT_MODEL") or "default"


def parse_heads(text: str | Iterable[str]) -> list[Head]:
    """`"2.6,1.5"` (or ["2.6", "1.5"], or "L2.H6") -> [(1, 5), (2, 6)]; raises ValueError on a bad entry."""
    parts = [text] if isinstance(text, str) else list(text)
    out: set[Head] = set()
    for chunk in parts:
        for item in str(chunk).replace(";", ",").split(","):
            item = item.strip().upper().replace("L", "").replace("H", "")
            if not item:
                continue
            l, _, h = item.partition(".")
            if not l.isdigit() or not h.isdigit():
                raise ValueError(f"heads are written layer.head, e.g. 2.6, not {item!r}")
            out.add((int(l), int(h)))
    return sorted(out)


def format_heads(heads: Iterable[Sequence[int]]) -> str:
    return ",".join(f"{int(l)}.{int(h)}" for l, h in sorted({(int(l), int(h)) for l, h in heads}))


def _int_in(lo: int, hi: int) -> Callable[[str], int]:
    def parse(s: str) -> int:
        v = int(s)
        if not lo <= v <= hi:
            raise ValueError(f"must be between {lo} and {hi}")
        return v
    return parse


PRECISIONS = ("float32", "bfloat16")  # the sidebar's choices of the service's `precision` field


def _choice(options: Sequence[str]) -> Callable[[str], str]:
    def parse(s: str) -> str:
        if s not in options:
            raise ValueError(f"must be one of {', '.join(options)}")
        return s
    return parse


def _text(s: str) -> str:
    s = s.strip()
    if not s:
        raise ValueError("must not be empty")
    return s


SWEEP_METRICS = ("tr_depth", "tl_depth", "tr_induction", "tl_induction", "accuracy", "zero_shot_accuracy",
                 "icl_accuracy", "icl_gain", "ablation_drop_tr", "ablation_drop_tl")
CUSTOM_VECTOR = "custom"
"""The Steering page's vector of the selected heads, beside the kinds' vector types (`vector_types()`)."""


def options(name: str) -> list[Any]:
    """The options of a setting bound to a kind's field (`ui.settings.WIDGETS`): its kind's, never restated here."""
    return list(settings.spec(name).options or ())


def vector_types() -> list[str]:
    """The Steering page's vector types: the `steer` kind's, and the custom vector of the selected heads."""
    return [*options("sg_vectors"), CUSTOM_VECTOR]


def _fmt_flag(v: Any) -> str:
    return "1" if v else "0"


def _choices(options: Sequence[str]) -> Callable[[str], list[str]]:
    def parse(s: str) -> list[str]:
        items = [x.strip() for x in str(s).split(",") if x.strip()]
        bad = [x for x in items if x not in options]
        if bad:
            raise ValueError(f"{bad[0]!r} is not one of {', '.join(options)}")
        return list(dict.fromkeys(items))
    return parse


def _join(v: Iterable[str]) -> str:
    return ",".join(v)


LTV_SWEEP_MAX_LAYERS = 8
"""The LTV page sweeps every layer by default only on a model this shallow: the sweep trains one vector and runs
its mechanism per layer (on the embedded model, seconds each; on SmolLM2-135M's 30 layers on a CPU, hours)."""
LTV_MECHANISM = ("key_heads", "ov", "propagation")
"""The `ltv` kind's mechanism stages, each a param of its own (`LtvLayersParams.key_heads`, `ov`, `propagation`)."""


def ltv_mechanism_default() -> list[str]:
    """The stages the `ltv` kind runs by default (its boolean fields' defaults: linear propagation is opt-in)."""
    return [m for m in LTV_MECHANISM if settings.field("ltv_layers", m).get("default")]


def ltv_default_layer(n_layers: int) -> int | str:
    """The LTV page's injection layer when the link names none: "all" (the sweep) on a model of at most
    LTV_SWEEP_MAX_LAYERS layers, else the middle layer."""
    return "all" if n_layers <= LTV_SWEEP_MAX_LAYERS else n_layers // 2


def _layer_or_all(s: str) -> int | str:
    return "all" if str(s).strip() == "all" else _int_in(0, 100000)(s)


def _kind_field(name: str, fmt: Callable[[Any], str] = str, parse: Callable[[str], Any] | None = None,
                view: bool = False) -> "Field":
    """A state field bound to a kind's params field (`ui.settings.WIDGETS`): its default and its link check are the
    kind's, as its widget's are."""
    check = (lambda s: settings.check(name, parse(s))) if parse else (lambda s: settings.from_text(name, s))
    return Field(name, lambda: settings.default(name), check, fmt, view)


def _g(v: Any) -> str:
    return f"{float(v):g}"


def _raw_text(s: str) -> str:
    if not str(s).strip():
        raise ValueError("must not be empty")
    return str(s)[:8192]


def _head(s: str) -> Head:
    hs = parse_heads(s)
    if len(hs) != 1:
        raise ValueError("one head, written layer.head")
    return hs[0]


@dataclass(frozen=True)
class Field:
    """A state field: its default, how the URL's text parses into it and back. A `view` field (how a page
    shows things, not what it computes) is left out of the URL while it holds its default."""

    name: str
    default: Callable[[], Any]
    parse: Callable[[str], Any]
    fmt: Callable[[Any], str] = str
    view: bool = False


FIELDS: dict[str, Field] = {f.name: f for f in (
    Field("model", default_model, _text),
    # None: the service's default; in the URL (and a job's params, `jobs.with_precision`) only when picked
    Field("precision", lambda: None, _choice(PRECISIONS), view=True),
    Field("task", lambda: None, _text),
    _kind_field("shots"),  # the service's limits (`bounds`) apply after the parse
    _kind_field("prompts"),
    _kind_field("seed"),
    Field("heads", list, parse_heads, format_heads),
    _kind_field("mode"),
    Field("map", lambda: "tr", _choice(MAPS)),
    Field("kmax", lambda: 16, _int_in(1, 100000)),
    _kind_field("top_pct", _g),
    _kind_field("top_k"),
    # a convention: in the URL (and in a job's params) only when off the tokenizer's own choice
    _kind_field("prepend_bos", view=True),
    # -- Home, Head map, Ablation: view settings
    Field("ex_k", lambda: None, _int_in(0, 100000), view=True),
    Field("top_n", lambda: 10, _int_in(1, 100000), view=True),
    Field("only_changed", lambda: False, settings.flag, _fmt_flag, view=True),
    _kind_field("ab_positions", view=True),  # where the live toggle ablates
    Field("all_maps", lambda: False, settings.flag, _fmt_flag, view=True),
    Field("sig_only", lambda: False, settings.flag, _fmt_flag, view=True),  # the map's significant heads only
    Field("cscale", lambda: "linear", _choice(("linear", "log", "rank", "clip")), view=True),  # the maps' colours
    Field("img", lambda: "png", _choice(("png", "svg")), view=True),  # what a figure's camera button saves
    # -- Head map: activation patching, and a second run side by side
    Field("pt", lambda: False, settings.flag, _fmt_flag, view=True),  # the patching section open
    _kind_field("pt_target", view=True),
    _kind_field("pt_patch", view=True),
    Field("cmp", lambda: False, settings.flag, _fmt_flag, view=True),
    Field("cmp_model", lambda: None, _text, view=True),  # None: the same model
    Field("cmp_task", lambda: None, _text, view=True),  # None: the same task
    Field("cmp_seed", lambda: None, lambda s: settings.from_text("seed", s), view=True),  # None: seed + 1
    # -- head drill-down (Head map panel, Head page)
    Field("head", lambda: None, _head, lambda h: f"{int(h[0])}.{int(h[1])}", view=True),
    Field("prompt", lambda: 0, _int_in(0, 100000), view=True),
    Field("text", lambda: None, _raw_text, view=True),
    Field("lens", lambda: False, settings.flag, _fmt_flag, view=True),
    Field("grid", lambda: False, settings.flag, _fmt_flag, view=True),  # every head of the layer (the attention grid)
    # -- Steering & geometry
    Field("sg_vectors", lambda: settings.default("sg_vectors"), lambda s: _choices(vector_types())(s), _join,
          view=True),
    Field("sg_layer", lambda: None, _layer_or_all, view=True),  # None: the middle layer
    _kind_field("sg_alpha", _g, view=True),
    Field("sg_pca_layer", lambda: None, _int_in(0, 100000), view=True),  # None: the last layer
    _kind_field("sg_final_norm", _fmt_flag, view=True),  # the logit difference in logits
    _kind_field("sg_perturbations", _join, view=True),  # None: those that run
    Field("sg_color", lambda: "condition", _choice(("condition", "gold")), view=True),
    Field("sg_arrows", lambda: False, settings.flag, _fmt_flag, view=True),
    Field("sg_dirs", lambda: True, settings.flag, _fmt_flag, view=True),
    Field("sg_bar_layer", lambda: None, _int_in(0, 100000), view=True),
    Field("sg_pmap", lambda: None, lambda s: _choice(options("sg_perturbations"))(s), view=True),
    # -- Learned task vectors
    Field("ltv_layer", lambda: None, _layer_or_all, view=True),  # None: what fits the model (ltv_default_layer)
    _kind_field("ltv_positions", fmt_ints, offsets, view=True),
    _kind_field("ltv_lr", _g, view=True),
    _kind_field("ltv_epochs", view=True),
    _kind_field("ltv_batch", view=True),
    _kind_field("ltv_units", view=True),
    Field("ltv_mech", ltv_mechanism_default, _choices(LTV_MECHANISM), _join, view=True),  # its stages
    Field("ltv_show", lambda: None, _int_in(0, 100000), view=True),  # the layer whose mechanism is shown
    Field("ltv_metric", lambda: "accuracy", _choice(("accuracy", "label_accuracy", "tr_ratio")), view=True),
    # -- Sweeps
    Field("sweep", lambda: None, _text, view=True),  # the sweep shown
    Field("sw_metric", lambda: "tr_depth", _choice(SWEEP_METRICS), view=True),
    # -- Soft head selection (SITE)
    _kind_field("site_m", view=True),
    _kind_field("site_shots", view=True),
    _kind_field("site_steps", view=True),
)}


SERVER_LIMITS: dict[str, str] = {"shots": "max_shots", "prompts": "max_prompts"}
"""Fields the service bounds: its capabilities' `limits` key (`backend/service/limits.py`)."""


def bounds(name: str, limits: dict[str, Any] | None = None) -> tuple[int, int | None]:
    """(least, greatest) value of `shots` or `prompts` on this service: the kind's least value, and the service's
    limit (`limits`: its capabilities' limits; None when it states none): the one source of the sidebar's widgets
    and of what a link may ask."""
    hi = (limits or {}).get(SERVER_LIMITS[name])
    return int(settings.spec(name).lo or 0), None if hi is None else int(hi)


@dataclass
class Settings:
    """What a page computes on: the job parameters and the view."""

    model: str
    task: str | None
    shots: int
    prompts: int
    seed: int
    heads: list[Head] = field(default_factory=list)
    mode: str = "zero"
    map: str = "tr"
    kmax: int = 16
    top_pct: float = field(default_factory=lambda: settings.default("top_pct"))
    top_k: int | None = None
    prepend_bos: str = field(default_factory=lambda: settings.default("prepend_bos"))
    """Whether each prompt starts with the BOS token: "tokenizer" (its own choice) or "always" (TransformerLens's)."""
    task_name: str | None = None
    """What figures call the task: an upload's file name rather than its `upload:<hash>` id (`layout` sets it)."""

    @property
    def task_title(self) -> str | None:
        return self.task_name or self.task

    def job(self, **extra: Any) -> dict[str, Any]:
        """Parameters common to every job; `extra` adds or overrides."""
        return {"model": self.model, "task": self.task, "shots": self.shots, "prompts": self.prompts,
                "seed": self.seed, **self.conventions(), **extra}

    def conventions(self) -> dict[str, Any]:
        """The prompt conventions of every job that tokenises prompts, only when off their default (so a job's
        params, and its cache key, stay as they were)."""
        return {"prepend_bos": self.prepend_bos} if self.prepend_bos != settings.default("prepend_bos") else {}

    def icl_shots(self) -> list[int]:
        """The demonstration counts of an ICL curve: 0, 1, 2, 4, ... up to `shots`, and `shots` itself."""
        return sorted({k for k in (0, 1, 2, 4, 8, 16, 32) if k <= self.shots} | {0, self.shots})

    def selection(self) -> dict[str, Any]:
        """The top-head set size as the service takes it: `top_k` when set, else `top_pct`."""
        return {"top_k": int(self.top_k)} if self.top_k else {"top_pct": float(self.top_pct)}

    def top_label(self) -> str:
        """The top-head set size in words."""
        return f"top {self.top_k} heads" if self.top_k else f"top {self.top_pct:g}% of heads (at least {MIN_TOP_HEADS})"


_SETTINGS_FIELDS = frozenset(Settings.__dataclass_fields__)


def init(limits: dict[str, Any] | None = None) -> list[str]:
    """Load the state from the URL on a session's first run; later runs keep the session's state. `shots` and
    `prompts` outside this service's bounds (`bounds`, from its capabilities' `limits`) are brought inside.

    Returns messages about URL values that were ignored or changed."""
    ss = st.session_state
    problems: list[str] = []
    if not ss.get("_hl_init"):
        qp = st.query_params
        for name, f in FIELDS.items():
            value = f.default()
            if name in qp:
                raw = qp.get_all(name) if name == "heads" else qp.get(name)
                try:
                    value = f.parse(",".join(raw) if isinstance(raw, list) else raw)
                except (ValueError, TypeError) as e:
                    problems.append(f"ignored `{name}={raw if not isinstance(raw, list) else ','.join(raw)}` "
                                    f"in the link: {e}")
                if name in SERVER_LIMITS and isinstance(value, int):
                    lo, hi = bounds(name, limits)
                    hi = value if hi is None else hi
                    if not lo <= value <= hi:
                        problems.append(f"`{name}={value}` in the link is outside this service's {lo}–{hi}: "
                                        f"using {min(max(value, lo), hi)}")
                        value = min(max(value, lo), hi)
            ss[f"s_{name}"] = value
        # the model's own starting settings (`ui.model_defaults`) where the link names none: a link of the model alone
        # opens as picking it in the model box does; a link's top_pct keeps the percentage
        apply_model_defaults(ss["s_model"], keep=set(qp.keys()) | ({"top_k"} if "top_pct" in qp else set()))
        ss["_hl_from_link"] = "task" in qp
        ss["_hl_init"] = True
    for name, f in FIELDS.items():  # fields added after the session started
        ss.setdefault(f"s_{name}", f.default())
    return problems


def get() -> Settings:
    ss = st.session_state
    return Settings(**{name: ss[f"s_{name}"] for name in FIELDS if name in _SETTINGS_FIELDS})


def value(name: str) -> Any:
    """A state field's value (page view fields are read this way rather than through `Settings`)."""
    return st.session_state.get(f"s_{name}", FIELDS[name].default())


def put(name: str, value: Any) -> None:
    st.session_state[f"s_{name}"] = value


def opened_from_link() -> bool:
    """True when this session started from a URL that named a task (a shared link)."""
    return bool(st.session_state.get("_hl_from_link"))


def query(settings: Settings | None = None) -> dict[str, str]:
    """The query parameters that reproduce `settings` (default: the current state) and every page's view."""
    from ui.model_defaults import defaults_for

    s = settings or get()
    out: dict[str, str] = {}
    model = defaults_for(s.model)  # a view field at the model's default is left out: `init` sets it back
    for name, f in FIELDS.items():
        v = getattr(s, name) if name in _SETTINGS_FIELDS else value(name)
        if v is None or (name == "heads" and not v) or (f.view and v == model.get(name, f.default())):
            continue
        out[name] = f.fmt(v)
    return out


def sync_url() -> None:
    """Write the state into the URL (only when it differs, so the browser history stays clean)."""
    want = query()
    have = {k: st.query_params.get(k) for k in st.query_params.keys()}
    if have != want:
        st.query_params.from_dict(want)


# -- widgets bound to the state ---------------------------------------------------------------------
def _copy(name: str, convert: Callable[[Any], Any] | None) -> None:
    v = st.session_state[f"w_{name}"]
    before = st.session_state.get(f"s_{name}")
    st.session_state[f"s_{name}"] = convert(v) if convert else v
    if name == "model" and st.session_state[f"s_{name}"] != before:
        apply_model_defaults(st.session_state[f"s_{name}"])


def apply_model_defaults(model: str, keep: Iterable[str] = ()) -> list[str]:
    """Set the settings a newly picked model starts on (`ui.model_defaults`: measured per model; task, shots,
    top-k, the ablation curve's largest k, the Steering and LTV pages' layer), but those in `keep`; the names set."""
    from ui.model_defaults import defaults_for

    done = []
    for name, value in defaults_for(model).items():
        if name in FIELDS and name not in keep:
            put(name, value)
            done.append(name)
    return done


KMAX_STEPS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def kmax_choices(n_heads_total: int, model: str | None = None, current: int | None = None) -> list[int]:
    """The Ablation page's "ablate up to k heads" options: 1, 2, 4, ... below the model's head count, all of them,
    the model's measured default (`ui.model_defaults`: 27 on SmolLM2-135M, which the powers of two skip) and
    the current value (a link's `kmax=5`), each when it is within the model's heads."""
    from ui.model_defaults import defaults_for

    extra = {defaults_for(model).get("kmax") if model else None, current}
    return sorted({k for k in KMAX_STEPS if k < n_heads_total} | {n_heads_total}
                  | {int(k) for k in extra if k is not None and 1 <= int(k) <= n_heads_total})


def bind(widget: Callable[..., Any], label: str, name: str, *, to_widget: Callable[[Any], Any] | None = None,
         from_widget: Callable[[Any], Any] | None = None, **kw: Any) -> Any:
    """Draw `widget(label, key="w_<name>", ...)` showing state field `name`; edits write back to the state."""
    v = st.session_state[f"s_{name}"]
    st.session_state[f"w_{name}"] = to_widget(v) if to_widget else v
    widget(label, key=f"w_{name}", on_change=_copy, args=(name, from_widget), **kw)
    return st.session_state[f"s_{name}"]


# -- results of this session --------------------------------------------------------------------------
MAX_RESULTS = 48


def result_key(kind: str, params: dict[str, Any]) -> str:
    import json

    return kind + ":" + json.dumps(params, sort_keys=True, default=str)


def remembered(kind: str, params: dict[str, Any]) -> dict[str, Any] | None:
    return st.session_state.setdefault("_hl_results", {}).get(result_key(kind, params))


def remember(kind: str, params: dict[str, Any], result: dict[str, Any]) -> None:
    store: dict[str, Any] = st.session_state.setdefault("_hl_results", {})
    store[result_key(kind, params)] = result
    while len(store) > MAX_RESULTS:
        store.pop(next(iter(store)))
