"""What every page starts with: page config, the state from the URL, the service's capabilities, and the
sidebar holding the shared settings (model, task, shots, prompts, seed) and a shareable link."""
from __future__ import annotations

import dataclasses
import html
import threading
import time
from typing import Any
from urllib.parse import urlencode

import streamlit as st

from . import api, jobs, settings, share, state
from .jobs import show_error
from .model_box import model_box

CSS = """
<style>
  .block-container {padding-top: 2.2rem; padding-bottom: 3rem;}
  [data-testid="stMetricValue"] {font-size: clamp(1.15rem, 2.1vw, 1.9rem);}  /* "100…" in narrow columns */
  [data-testid="stSidebar"] .hl-brand {font-size: 1.35rem; font-weight: 700; letter-spacing: .02em;}
  .hl-muted {color: rgba(120,120,140,.95); font-size: .88rem;}
  .hl-link {font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: .78rem; word-break: break-all;
            background: rgba(128,128,140,.08); border-radius: 6px; padding: 6px 8px; margin-bottom: .4rem;}
  .hl-link a {color: inherit; text-decoration: none;}
  /* labels wrap instead of ending in an ellipsis ("Label accuracy (8-s…", truncated button labels) */
  [data-testid="stMetricLabel"], [data-testid="stMetricLabel"] * {white-space: normal !important;
      overflow: visible !important; text-overflow: clip !important; height: auto !important;}
  [data-testid^="stBaseButton"] p, [data-testid^="stBaseButton"] div {white-space: normal !important;
      overflow: visible !important; text-overflow: clip !important; line-height: 1.25; word-break: normal !important;
      overflow-wrap: normal !important;}
  /* the selected heads' chips wrap onto more lines (in one scrolling line the last ones were cut off) */
  [data-testid="stMultiSelectTagsContainer"] {flex-wrap: wrap !important; overflow: visible !important;}
  [data-testid="stMultiSelect"] .react-aria-ComboBox > div {max-height: none !important; height: auto !important;}
  /* a page link's label wraps instead of ending cut off ("Open the full drill-down (your own prompt, logit l") */
  [data-testid="stPageLink-NavLink"], [data-testid="stPageLink-NavLink"] * {white-space: normal !important;
      overflow: visible !important; text-overflow: clip !important; height: auto !important;}
  @media (max-width: 640px) {
    /* a phone: a figure's toolbar keeps its camera (the first group) and no longer covers the title; a table's
       toolbar gets room above the table instead of covering what is above it */
    .js-plotly-plot .modebar-group {display: none !important;}
    .js-plotly-plot .modebar-group:first-child {display: inline-block !important;}
    [data-testid="stElementContainer"]:has([data-testid="stDataFrame"]) {padding-top: 2.4rem;}
    [data-testid="stDataFrame"] {max-width: 100%;}
  }
</style>
"""
CAPS_TTL_S = 15.0
PAGES = [("app.py", "Home", ":material/home:"), ("pages/1_Head_map.py", "Head map", ":material/grid_on:"),
         ("pages/2_Ablation.py", "Ablation", ":material/power_settings_new:"),
         ("pages/3_Steering_geometry.py", "Steering & geometry", ":material/explore:"),
         ("pages/4_Head.py", "Head drill-down", ":material/center_focus_strong:"),
         ("pages/5_Learned_task_vectors.py", "Learned task vectors", ":material/model_training:"),
         ("pages/6_Soft_head_selection.py", "Soft head selection", ":material/tune:"),
         ("pages/7_Sweeps.py", "Sweeps", ":material/table_chart:")]


_CAPS: dict[tuple[str, int], tuple[float, dict[str, Any]]] = {}  # per service, shared by this process's sessions


_REFRESHING: set[tuple[str, int]] = set()


def capabilities(force: bool = False) -> dict[str, Any]:
    """The service's capabilities, kept per dashboard process: a page never waits for them once this process has
    them (they take the service 0.1-0.3 s to build); a copy older than CAPS_TTL_S is served while a background
    thread asks for a new one. Raises ApiError when there is no copy and the service does not answer."""
    url = (api.backend_url(), api.generation())
    cached = _CAPS.get(url)
    if not force and cached:
        if time.monotonic() - cached[0] >= CAPS_TTL_S and url not in _REFRESHING:
            _REFRESHING.add(url)
            threading.Thread(target=_refresh, args=(url,), daemon=True, name="headlens-caps").start()
        return cached[1]
    caps = api.capabilities()
    _CAPS[url] = (time.monotonic(), caps)
    return caps


def _refresh(url: tuple[str, int]) -> None:
    try:
        caps = api.capabilities()
        if url == (api.backend_url(), api.generation()):
            _CAPS[url] = (time.monotonic(), caps)
    except api.ApiError:
        pass  # the next page that needs them asks again (the stale copy stays)
    finally:
        _REFRESHING.discard(url)


def forget_capabilities() -> None:
    _CAPS.pop((api.backend_url(), api.generation()), None)


def is_default_model(model: str) -> bool:
    return model in ("default", "headlens-tiny")


def suitable(t: dict[str, Any], model: str) -> bool:
    """Tasks written for the embedded model (`models: default`) only make sense on it, and the natural-language
    built-ins (`models: any`) use words the embedded model's vocabulary does not have."""
    if t.get("source") == "upload":
        return True  # the fit check says
    return (t.get("models", "any") == "default") == is_default_model(model)


def task_options(caps: dict[str, Any], model: str, current: str | None) -> tuple[list[str], dict[str, dict]]:
    """Task ids for the picker and their info: the default model's own tasks first when it is picked, last
    (marked) otherwise. A task id the service does not list (an upload from a link) is kept as is."""
    info: dict[str, dict] = {t["id"]: t for t in caps.get("tasks", [])}
    info.update(st.session_state.get("_hl_uploads", {}))
    own = [i for i, t in info.items() if t.get("models", "any") == "default"]
    general = [i for i, t in info.items() if t.get("models", "any") != "default" and t.get("source") != "upload"]
    uploads = [i for i, t in info.items() if t.get("source") == "upload"]
    ids = own + general + uploads if is_default_model(model) else general + uploads + own
    if current and current not in info:
        ids.append(current)
        info[current] = {"id": current, "name": current, "kind": "?", "n_examples": 0,
                         "source": "upload" if current.startswith("upload:") else "builtin"}
    return ids, info


def task_info(caps: dict[str, Any], task_id: str | None) -> dict[str, Any]:
    """What the service (or this session's uploads) says about a task: {id, name, kind, labels, ...}; {} if unknown."""
    return task_options(caps, "default", task_id)[1].get(task_id or "", {}) if task_id else {}


def task_label(t: dict[str, Any], model: str = "default") -> str:
    if t.get("kind") == "?":
        return f"{t['name']}"
    name = t["name"] + (" (uploaded)" if t.get("source") == "upload" else "")
    mark = ""
    if not suitable(t, model):
        mark = " · ⊘ for the default model" if t.get("models") == "default" else " · ⊘ words unknown to this model"
    return f"{name} · {t['kind']} · {t['n_examples']} ex.{mark}"


def share_link(page_path: str | None = None) -> str:
    """A link to the current page (or `page_path`) that reopens the current view."""
    q = urlencode(state.query(), safe=",:/")
    base = ""
    try:
        base = (st.context.url or "").split("?")[0]
    except Exception:
        base = ""
    if page_path is not None and base:
        root = base.rstrip("/").rsplit("/", 1)[0] if base.rstrip("/").count("/") > 2 else base.rstrip("/")
        base = f"{root}/{page_path}"
    return f"{base}?{q}" if base else f"?{q}"


def _clamp(name: str, lo: int, hi: int | None) -> None:
    v = max(int(st.session_state[f"s_{name}"]), lo)
    st.session_state[f"s_{name}"] = v if hi is None else min(v, hi)


def sidebar(caps: dict[str, Any]) -> None:
    s = state.get()
    limits = caps.get("limits", {})
    with st.sidebar:
        st.html('<div class="hl-brand">headlens</div>')
        st.caption("Which attention heads do in-context learning?")
        q = state.query()
        for path, label, icon in PAGES:
            st.page_link(path, label=label, icon=icon, query_params=q)
        st.subheader("Settings", divider="gray")
        model_box(caps, on_installed=forget_capabilities)
        s = state.get()
        ids, info = task_options(caps, s.model, s.task)
        if s.task is None or s.task not in ids:
            state.put("task", ids[0] if ids else None)
        if ids:
            model_now = state.get().model  # format_func must not read session state (AppTest calls it bare)
            state.bind(st.selectbox, "Task", "task", options=ids,
                       format_func=lambda i: task_label(info[i], model_now),
                       help="Built-in tasks, and the ones you upload on the Home page.")
            t = info.get(state.get().task) or {}
            if t.get("description"):
                st.caption(t["description"])
            if t and not suitable(t, state.get().model):
                st.caption(":orange[:material/warning: This task's words exist only in the default model's "
                           "vocabulary.]" if t.get("models") == "default" else
                           ":orange[:material/block: A natural-language task: its words are not in the default "
                           "model's vocabulary, so it cannot run on it. Pick a `syn-…` task, or another model.]")
        else:
            st.warning("The service lists no tasks.")
        (shots_lo, shots_hi), (prompts_lo, prompts_hi) = state.bounds("shots", limits), state.bounds("prompts", limits)
        _clamp("shots", shots_lo, shots_hi)
        _clamp("prompts", prompts_lo, prompts_hi)
        c1, c2 = st.columns(2)
        with c1:
            state.bind(st.number_input, "Shots (k)", "shots", min_value=shots_lo, max_value=shots_hi,
                       step=1, help=settings.help_text("shots"))
        with c2:
            state.bind(st.number_input, "Prompts", "prompts", min_value=prompts_lo, max_value=prompts_hi, step=10,
                       help=settings.help_text("prompts", "Results are means over them."))
        pool = task_info(caps, state.get().task).get("n_queries")
        if pool and state.get().prompts > int(pool):
            st.caption(f"This task has {pool} held-out queries: all {pool} are scored, each once.")
        state.bind(st.number_input, "Seed", "seed", **settings.widget_bounds("seed"), step=1,
                   help=settings.help_text("seed"))
        state.bind(st.selectbox, "BOS token", "prepend_bos", options=state.options("prepend_bos"),
                   format_func=lambda v: {"tokenizer": "as the tokenizer does", "always": "always first"}[v],
                   help="Whether every prompt starts with the BOS token. As the tokenizer does: its own choice "
                        "(SmolLM2's adds none, Llama's does). Always first: TransformerLens's convention "
                        "(prepend_bos=True); it changes the maps (README: Conventions). A model without a BOS "
                        "token cannot use it.")
        top_heads_control()
        st.subheader("Share", divider="gray")
        st.caption("This link reopens the current view (settings and selected heads):")
        link = share_link()
        # a link, not st.code: st.code loads a 1.5 MB syntax highlighter, 0.5-1.5 s of a fresh session's first view;
        # st.html, not st.markdown's unsafe HTML, which waits for a 190 kB HTML parser (rehype-raw) before it draws
        st.html(f'<div class="hl-link"><a href="{html.escape(link, quote=True)}">{html.escape(link)}</a></div>')
        share.button(caps, link)
        state.bind(st.segmented_control, "Figure files", "img", options=list(share.FORMATS), required=True,
                   format_func=str.upper, help="What each figure's camera button (its toolbar, top right) saves: a "
                                               "PNG at 2x, or an SVG. File names carry the model, task, shots and "
                                               "heads.")
        st.caption(f"Service: `{api.backend_url()}` · {caps.get('device', '?')} / {caps.get('dtype', '?')} · "
                   f"v{caps.get('version', '?')}")


def _top_unit_changed() -> None:
    if st.session_state.get("w_top_unit") == "heads":
        state.put("top_k", state.get().top_k or state.MIN_TOP_HEADS)
    else:
        state.put("top_k", None)


def top_heads_control() -> None:
    """The size of every top-head set (top TR / TL heads, the random and function-vector sets): a percentage
    of the heads (never fewer than 4; the backend applies that rule) or a count. Sent as top_pct / top_k."""
    s = state.get()
    st.session_state["w_top_unit"] = "heads" if s.top_k else "%"
    c1, c2 = st.columns([1, 1], vertical_alignment="bottom")
    with c2:
        st.segmented_control("Unit", ["%", "heads"], key="w_top_unit", on_change=_top_unit_changed,
                             required=True, label_visibility="collapsed")
    with c1:
        if s.top_k:
            state.bind(st.number_input, "Top heads", "top_k", **settings.widget_bounds("top_k"), step=1,
                       help="Size of the top-head sets (top TR, top TL, random, function vector): a count.")
        else:
            state.bind(st.number_input, "Top heads", "top_pct", **settings.widget_bounds("top_pct"), step=1.0,
                       format="%g", help="Size of the top-head sets (top TR, top TL, random, function vector): "
                                         f"a percentage of all heads, never fewer than {state.MIN_TOP_HEADS}.")


def page_setup(title: str, icon: str = ":material/search:") -> tuple[state.Settings, dict[str, Any]]:
    """Config, state, capabilities and sidebar. Stops the page with an error when the service is unreachable."""
    api.trace(f"page:{title.replace(' ', '_')}")
    # "auto": open on a wide screen, collapsed on a phone (expanded, it covered 75% of a 390 px screen)
    st.set_page_config(page_title=f"{title} · headlens", page_icon=icon, layout="wide",
                       initial_sidebar_state="auto")
    st.html(CSS)  # style tags only: sent to the event container, no space taken and no HTML parser to load
    jobs.begin_page()
    share.begin(title)
    try:
        caps = capabilities()
    except api.ApiError as e:
        st.title(title)
        show_error(e, "Connecting to the service")
        if st.button("Retry", icon=":material/refresh:"):
            forget_capabilities()
            st.rerun()
        st.stop()
    settings.load(caps)  # every setting's default, bounds and help: the kinds' params schemas, as the service states
    problems = state.init(caps.get("limits"))  # a link's shots and prompts within this service's limits
    for p in problems:
        jobs.warn(p)
    sidebar(caps)
    state.sync_url()
    return effective(state.get(), caps), caps


def needed(kind: str, params: dict[str, Any], label: str, what: str, **kw: Any) -> Any:
    """A result the page cannot go on without (`jobs.fetch`); the page stops where there is none (its error, its
    Run button or its Cancel is shown)."""
    r = jobs.fetch(kind, params, label, what=what, **kw)
    if r is None:
        st.stop()
    return r


def fit_shape(r: dict[str, Any], prompts: bool = False) -> tuple[int, int]:
    """(layers, heads) of a result that states them (`model_info`, `head_scores`). Every setting beyond a model of
    that shape, or (`prompts`) beyond the result's prompts, is set back to its default (the model's,
    `ui.model_defaults`), keeping the selected heads that fit; each with the page's "ignored" warning."""
    from ui.model_defaults import defaults_for

    L, H, n_prompts = int(r["n_layers"]), int(r["n_heads"]), int(r["prompts"]) if prompts else None
    fits = lambda lh: 0 <= int(lh[0]) < L and 0 <= int(lh[1]) < H  # noqa: E731
    layer = lambda v: v in (None, "all") or 0 <= int(v) < L  # noqa: E731
    ok = {"heads": lambda v: all(map(fits, v)), "head": lambda v: v is None or fits(v), "sg_layer": layer,
          "sg_pca_layer": layer, "sg_bar_layer": layer, "ltv_layer": layer, "ltv_show": layer,
          "kmax": lambda v: v <= L * H, "top_k": lambda v: v is None or v <= L * H,
          "prompt": lambda v: n_prompts is None or v < max(n_prompts, 1)}
    bad = [name for name, check in ok.items() if not check(state.value(name))]
    for name in bad:
        v = state.value(name)
        beyond = [h for h in v if not fits(h)] if name == "heads" else v
        limit = f"the {n_prompts} prompts scored" if name == "prompt" else f"the model's {L} layers × {H} heads"
        jobs.warn(f"ignored `{name}={state.FIELDS[name].fmt(beyond)}`: beyond {limit}")
        state.put(name, [h for h in v if fits(h)] if name == "heads" else
                  defaults_for(state.get().model).get(name, state.FIELDS[name].default()))
    if bad:
        state.sync_url()  # the page's URL without them (the sidebar's link follows at the next run)
    return L, H


def effective(s: state.Settings, caps: dict[str, Any]) -> state.Settings:
    """The settings the jobs get: `prompts` at most the task's held-out queries (the sidebar says so), so the
    default 50 on a task of 20 queries asks for 20 and no result warns that it had fewer than asked; and the name
    figures give the task (an upload's file name, not its id)."""
    info = task_info(caps, s.task)
    pool = info.get("n_queries")
    name = (info.get("filename") or info.get("name")) if info.get("source") == "upload" else None
    return dataclasses.replace(s, prompts=int(pool) if pool and s.prompts > int(pool) else s.prompts, task_name=name)


def need_task(s: state.Settings) -> None:
    if not s.task:
        st.info("Pick a task in the sidebar (or upload one on the Home page).", icon=":material/arrow_back:")
        st.stop()
