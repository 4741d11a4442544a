"""The pieces of a page section that runs a job on demand: its Run row, its result, a guard and a JSON download.

A section computes once its Run button was pressed (or while its job runs); before that it shows only what the
service already has, so a shared link reopens a cached result at once, without recomputing or retraining.
"""
from __future__ import annotations

import json
from contextlib import contextmanager
from typing import Any, Iterator

import streamlit as st

from . import jobs


@contextmanager
def guard(what: str) -> Iterator[None]:
    """A result the page cannot draw is an st.error, never a traceback (st.stop/rerun pass through)."""
    try:
        yield
    except Exception as e:
        st.error(f"**{what}: could not draw the result.**\n\n{type(e).__name__}: {e}", icon=":material/error:")


def run_row(text: str, caption: str, key: str, label: str = "Run") -> bool:
    """A section's description and its Run button; True on the rerun where it was pressed."""
    left, right = st.columns([4, 1], vertical_alignment="center")
    with left:
        st.markdown(text)
        st.caption(caption)
    with right:
        return st.button(label, type="primary", icon=":material/play_arrow:", width="stretch", key=key)


def section(name: str, clicked: bool, job: jobs.Job, waiting: str) -> dict[str, Any] | None:
    """A section's result: computed after its Run button was pressed once in this session (or while its job runs,
    drawing `job.on_live` data); before that, only what the service already has; otherwise a hint to press Run."""
    flag = f"_hl_section_live_{name}"
    if clicked:
        st.session_state[flag] = True
    if st.session_state.get(flag) or jobs.in_flight(job):
        return jobs.fetch(job.kind, job.params, job.label, what=job.what, on_live=job.on_live)
    found = jobs.peek(job.kind, job.params)
    if found is None:
        st.info(waiting, icon=":material/play_arrow:")
    return found


def download(label: str, result: dict[str, Any], name: str, key: str) -> None:
    """A download button for a result as JSON (without the client's private `_` fields)."""
    clean = {k: v for k, v in result.items() if not k.startswith("_")}
    st.download_button(label, json.dumps(clean, indent=1).encode(), name.replace(":", "-").replace("/", "-"),
                       "application/json", icon=":material/data_object:", key=key, on_click="ignore")
