"""Running jobs from a page: a progress bar fed by the job's progress, errors as `st.error`, results kept
for the session so a rerun (a click, a page switch) does not ask the service again."""
from __future__ import annotations

import time
from typing import Any

import streamlit as st

from . import api, state

ERROR_TITLES = {
    "unreachable": "The headlens service is unreachable.",
    "unauthorized": "The service refused this app's token.",
    "job": "The job failed.",
    "cancelled": "The job was cancelled.",
    "timeout": "The job timed out.",
    "internal": "The service hit an internal error.",
    "refused": "The service refused the request.",
}


def show_error(e: api.ApiError, what: str | None = None) -> None:
    """One st.error: what failed, the service's message, and what to do where we know it."""
    title = ERROR_TITLES.get(e.kind, "Error.")
    if what:
        title = f"{what}: {title[0].lower()}{title[1:]}"
    body = f"**{title}**\n\n{e.message}"
    if e.hint:
        body += f"\n\n{e.hint}"
    st.error(body, icon=":material/error:")


def fetch(kind: str, params: dict[str, Any], label: str, *, what: str | None = None,
          quiet: bool = False) -> dict[str, Any] | None:
    """The result of a `kind` job with `params`, from this session's memory or the service.

    Shows a progress bar while the job runs; on failure shows an error and returns None."""
    hit = state.remembered(kind, params)
    if hit is not None:
        return hit
    slot = st.empty()
    bar = slot.progress(0.0, text=f"{label}: submitting…")
    t0 = time.perf_counter()

    def on_progress(frac: float, msg: str) -> None:
        frac = min(max(float(frac or 0.0), 0.0), 1.0)
        bar.progress(frac, text=f"{label}: {msg or 'working'} ({frac:.0%}, {time.perf_counter() - t0:.0f} s)")

    try:
        res = api.run(kind, params, on_progress=on_progress)
    except api.ApiError as e:
        slot.empty()
        if not quiet:
            show_error(e, what or label)
        return None
    slot.empty()
    state.remember(kind, params, res)
    return res


def show_warnings(result: dict[str, Any] | None) -> None:
    for w in (result or {}).get("warnings") or []:
        st.warning(w, icon=":material/warning:")
