"""The pieces of a page section that runs a job on demand: its Run row, its result, a guard and a JSON download.

A section computes once its Run button was pressed (or while its job runs); before that it shows only what the
service already has, so a shared link reopens a cached result at once, without recomputing or retraining.
"""
from __future__ import annotations

import json
import traceback
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import streamlit as st

from . import jobs, share
from . import metrics as M


@contextmanager
def guard(what: str) -> Iterator[None]:
    """A result the page cannot draw is one sentence, with the traceback in an expander (st.stop/rerun pass
    through)."""
    try:
        yield
    except Exception as e:
        jobs.error_box(f"{what}: could not draw the result.", f"{type(e).__name__}: {e}", traceback.format_exc())


def run_row(text: str, caption: str, key: str, label: str = "Run",
            estimate: list[tuple[str, dict[str, Any]]] | None = None) -> bool:
    """A section's description and its Run button; True on the rerun where it was pressed. `estimate`: the jobs the
    button runs, (kind, params): their estimated time is stated when over jobs.SHOW_ESTIMATE_S, and a job over the
    service's work limit says so before it is run. A job the service refuses outright (its model cannot load) gets
    the reason instead of an estimate, and no Run button."""
    left, right = st.columns([4, 1], vertical_alignment="center")
    refused = None
    with left:
        st.markdown(text)
        st.caption(caption)
        if estimate:
            refused = estimate_line(estimate)
    if refused:
        return False
    with right:
        return st.button(label, type="primary", icon=":material/play_arrow:", width="stretch", key=key)


def estimate_text(estimates: list[dict[str, Any] | None]) -> tuple[str, str | None]:
    """(the caption stating the jobs' estimated time, or ""; the first refusal, or None) from the estimates POST
    /jobs answered with its `held` jobs. Pure: the page draws it."""
    found = [e for e in estimates if e]
    refusal = next((e["refusal"] for e in found if not e.get("admitted", True) and e.get("refusal")), None)
    timed = [e for e in found if e.get("seconds") is not None]
    if not timed or sum(e["seconds"] for e in timed) < jobs.SHOW_ESTIMATE_S:
        return "", refusal
    return f":material/schedule: Estimated time: {jobs.estimated(timed)}. Results are cached: it runs once.", refusal


def estimate_line(jobs_: list[tuple[str, dict[str, Any]]]) -> str | None:
    """Draw the jobs' estimated time (or the work limit's refusal), none for the jobs whose results are cached
    (remembered for the section); returns the reason they cannot run at all, drawn instead of an estimate (the
    Run button is then left out), or None."""
    from . import api, state

    try:  # a result this session has already needs no estimate
        asked = [(kind, jobs.with_precision(params)) for kind, params in jobs_]
        answers = [(kind, params, *api.checked(kind, params)) for kind, params in asked
                   if state.remembered(kind, params) is None]
    except api.ApiError:
        return None  # the page's own calls report an unreachable service
    blocked = next((r for *_, r in answers if r), None)
    if blocked:
        st.error(f"Cannot run: {blocked}", icon=":material/block:")
        return blocked
    for kind, params, j, _ in answers:
        if j and j["status"] == "done":
            jobs.keep(kind, params, j["result"])
    text, refusal = estimate_text([j.get("estimate") for *_, j, _ in answers if j and j["status"] == "held"])
    if text:
        st.caption(text)
    if refusal:
        st.warning(refusal, icon=":material/hourglass_disabled:")
    return None


def section(name: str, clicked: bool, job: jobs.Job, waiting: str) -> dict[str, Any] | None:
    """A section's result: computed after its Run button was pressed once in this session (or while its job runs,
    drawing `job.on_live` data); before that, only what the service already has; otherwise a hint to press Run."""
    flag = f"_hl_section_live_{name}"
    if clicked:
        st.session_state[flag] = True
    if st.session_state.get(flag) or jobs.in_flight(job):
        return jobs.fetch(job.kind, job.params, job.label, what=job.what, on_live=job.on_live, start=True)
    found = jobs.peek(job.kind, job.params)
    if found is None:
        st.info(waiting, icon=":material/play_arrow:")
    return found


def run(job: jobs.Job, text: str, caption: str, key: str, waiting: str = "Press **Run** to compute it.",
        label: str = "Run", estimate: bool = True) -> dict[str, Any] | None:
    """A whole Run section: its `run_row` (button `run_<key>`; `estimate`: the job's estimate stated), its result
    (`section`) and the result's warnings. The page draws the result."""
    clicked = run_row(text, caption, f"run_{key}", label, estimate=[(job.kind, job.params)] if estimate else None)
    r = section(key, clicked, job, waiting)
    if r is not None:
        jobs.show_warnings(r)
    return r


def icl_metrics(cols: list[Any], scores: dict[str, Any], title: str, more: dict[str, Any]) -> None:
    """The head scores' k-shot accuracy, label accuracy and TR ratio in the first three of `cols` (the arrow: the
    change from 0 shots; the 95% interval below); the same numbers and `more` into the page's HTML file (`title`)."""
    k_shot, zero, k = scores["icl"], scores.get("zero_shot"), scores["shots"]
    for col, n in zip(cols, M.NAMES):
        col.metric(f"{M.LABEL[n]} ({k}-shot)", M.pct(k_shot[n]), delta=None if zero is None else
                   M.points(k_shot[n], zero[n]), border=True, help=M.HELP[n] + (
                       "" if zero is None else f" 0-shot: {M.pct(zero[n])} (the arrow: the change from 0 shots)."))
        if M.ci_of(k_shot, n):
            col.caption(f"95% interval {M.span(M.ci_of(k_shot, n))}")
    share.numbers(title, {f"{M.LABEL[n]} ({k}-shot)": k_shot[n] for n in M.NAMES}
                  | ({f"{M.LABEL[n]} (0-shot)": zero[n] for n in M.NAMES} if zero else {})
                  | {f"{M.LABEL[n]} ({k}-shot) 95% interval": M.span(M.ci_of(k_shot, n)) for n in M.NAMES
                     if M.ci_of(k_shot, n)} | more)


class LiveChart:
    """A running job's live figure (a training's loss so far), redrawn in one place below what the page drew before
    it started. Each draw of a script run gets its own element key (`<name>_live_<n>`, n counting the draws of
    this run): a key built from the data (a training's step) repeats when a job trains several times (SITE's
    budget runs restart at step 0) and Streamlit refuses a key used twice in one run."""

    def __init__(self, name: str, min_interval_s: float = 0.3):
        self.name, self.min_interval_s = name, min_interval_s
        self.box: Any = None
        self.draws, self.last, self.shown_at = 0, None, 0.0

    def draw(self, figure: Callable[[dict[str, Any]], Any], data: dict[str, Any], signature: Any = None,
             config: dict[str, Any] | None = None) -> bool:
        """Draw `figure(data)` unless `signature` (what changed, e.g. the step) is the one drawn last or the last
        draw is under `min_interval_s` old; True when it drew. The placeholder is made at the first draw, so the
        chart appears below the Run row and the progress bar, never above them."""
        import time

        now = time.monotonic()
        if signature is not None and signature == self.last or now - self.shown_at < self.min_interval_s:
            return False
        if self.box is None:
            self.box = st.empty()
        self.draws += 1
        self.last, self.shown_at = signature, now
        self.box.plotly_chart(figure(data), key=f"{self.name}_live_{self.draws}", config=config)
        return True

    def clear(self) -> None:
        if self.box is not None:
            self.box.empty()


def download(label: str, result: dict[str, Any], name: str, key: str) -> None:
    """A download button for a result as JSON (without the client's private `_` fields)."""
    clean = {k: v for k, v in result.items() if not k.startswith("_")}
    st.download_button(label, json.dumps(clean, indent=1).encode(), name.replace(":", "-").replace("/", "-"),
                       "application/json", icon=":material/data_object:", key=key, on_click="ignore")
