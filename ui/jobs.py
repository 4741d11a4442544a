"""Running jobs from a page: cached results first, then the service's job queue, with progress and Cancel.

- `fetch` / `fetch_many`: a result from this session's memory, else one `POST /jobs` per result, which answers
  the cached result at once, or `held` with its estimate, or the queued job. Several jobs are submitted together and waited on together (the Home
  page's scores and ICL curve), each with a progress bar showing the stage, the share done and the seconds
  waited, and a **Cancel** button (`DELETE /jobs/{id}`).
- A job belongs to a *slot* (by default its kind). A session has at most one job in flight per slot: when the
  settings change while a job runs, Streamlit reruns the page, and the new request for that slot cancels the
  superseded job before submitting its own, so nothing stale queues in front of it. A rerun that asks for the
  same job again re-attaches to it (it never re-submits, so the service's submitter count stays one).
- The bar is redrawn when the stage moves and every half second, which is also where Streamlit stops a run when
  a button is clicked: a Cancel click interrupts the wait at once, and its callback cancels the job before the
  page runs again. Quick jobs (under DRAW_AFTER_S) get no bar at all, so toggling does not flicker.
- Nothing long starts by itself: a page asks with `start` `if_short`, and the service holds a job estimated over
  its HOLD_OVER_S (`held`, with the estimate): it waits for its own **Run** button, its estimated time stated,
  unless the caller passes `start=True` (a section's or Home's Run was pressed). Pressing it approves that exact
  request (slot and params): a changed setting asks again. Every page's automatic fetches go through here.
- `peek`: a result without computing anything (memory or the service's cache), for sections that wait for Run.
Results carry `_waited` (seconds from the user's action to the result: from the start of the page run that the
click, the edit or the opened link started, so the page's own work before the request counts) next to the
service's own `seconds`.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import streamlit as st

from . import api, share, state
from .results import ResultError, typed

ERROR_TITLES = {
    "unreachable": "The headlens service is unreachable.",
    "unauthorized": "The service refused this app's token.",
    "job": "The job failed.",
    "cancelled": "The job was cancelled.",
    "timeout": "The job timed out.",
    "internal": "The service hit an internal error.",
    "refused": "The service refused the request.",
}
POLL_FIRST_S = 0.02
POLL_MAX_S = 0.15
DRAW_AFTER_S = 0.4  # a job still running after this gets its progress bar and Cancel button
REDRAW_S = 0.5  # the bar's seconds counter moves at this pace (a stage change redraws at once)
TIMEOUT_S = api.JOB_TIMEOUT_S
SHOW_ESTIMATE_S = 5.0  # a job estimated to take longer gets its estimated time in its Run row and progress bar


def log_note() -> str:
    """Where the servers' full output is, when `python -m backend launch` started them (it sets HEADLENS_LOG)."""
    path = os.environ.get("HEADLENS_LOG")
    return f"The servers' full output (tracebacks included) is in `{path}`." if path else \
        "`python -m backend launch` writes the servers' full output to `logs/headlens.log`."


def error_box(title: str, message: str, details: str, hint: str = "") -> None:
    """An error as one sentence (`title`: what failed, and the message's first line), and an expander with
    everything (`details`: the full message, a traceback) in a code block with a copy button, and the log."""
    first = message.strip().splitlines()[0] if message.strip() else ""
    st.error(f"**{title}**" + (f" {first}" if first else "") + (f"\n\n{hint}" if hint else ""),
             icon=":material/error:")
    with st.expander("Details", icon=":material/bug_report:"):
        st.code(details, language=None, wrap_lines=True)  # its copy button copies it all
        st.caption(log_note())


def show_error(e: api.ApiError, what: str | None = None) -> None:
    """What failed, the service's message, and what to do where we know it; the details in an expander."""
    title = ERROR_TITLES.get(e.kind, "Error.")
    if what:
        title = f"{what}: {title[0].lower()}{title[1:]}"
    details = f"{title}\n{e.message}\n\nkind: {e.kind}" + (f", HTTP status {e.status}" if e.status else "") + \
              f"\nservice: {api.backend_url()}"
    error_box(title, e.message, details, e.hint)


def begin_page() -> None:
    """Start this run's box of warnings and notes (`layout.page_setup` calls it first on every page)."""
    st.session_state["_hl_box"] = {"warnings": [], "notes": [], "holder": None}
    st.session_state["_hl_run_t0"] = time.monotonic()  # the user's action: widget callbacks ran just before


def _action_t0() -> float:
    """When the user's action that asked for this result happened: the start of this page run (`begin_page`)."""
    t0 = st.session_state.get("_hl_run_t0")
    return float(t0) if isinstance(t0, (int, float)) else time.monotonic()


def warn(text: str, note: bool = False) -> None:
    """Add a warning (or a note) to the page's one box: each text once per page, all of them in one collapsible
    box drawn where the first one came (the results' warnings, the fit check's, a link's ignored values)."""
    box = st.session_state.get("_hl_box")
    if box is None:
        begin_page()
        box = st.session_state["_hl_box"]
    into = box["notes" if note else "warnings"]
    if text in into:
        return
    into.append(text)
    w, n = box["warnings"], box["notes"]
    if box["holder"] is None:
        box["holder"] = st.empty()
    parts = ([f"{len(w)} warning{'s' if len(w) != 1 else ''}"] if w else []) + \
            ([f"{len(n)} note{'s' if len(n) != 1 else ''}"] if n else [])
    with box["holder"].container():
        with st.expander(" · ".join(parts) + " on this page", icon=":material/warning:" if w else ":material/info:"):
            for x in w:
                st.warning(x, icon=":material/warning:")
            for x in n:
                st.caption(f":material/info: {x}")


def show_warnings(result: dict[str, Any] | None) -> None:
    """A result's warnings and notes, into the page's one box (see `warn`)."""
    for w in (result or {}).get("warnings") or []:
        warn(w)
    for n in (result or {}).get("notes") or []:
        warn(n, note=True)


def timing(result: dict[str, Any]) -> str:
    """Where a result came from and how long the user waited: "computed in 2.8 s (waited 3.1 s)"."""
    waited = result.get("_waited")
    src = (f"from the cache ({result['seconds']:.2f} s)" if result["cache_hit"]
           else f"computed in {result['seconds']:.1f} s")
    return src + (f" · shown {waited:.1f} s after the request" if waited is not None else " · kept in this session")


def with_precision(params: dict[str, Any]) -> dict[str, Any]:
    """`params` with the sidebar's precision added when one is picked and the job names a model: its results (and
    this session's memory of them) are then apart from the default precision's."""
    picked = state.value("precision")
    if not picked or "model" not in params or "precision" in params:
        return params
    return {**params, "precision": picked}


@dataclass
class Job:
    """One request of a page: a kind (its registry name or an alias), its params, and the progress bar's label."""

    kind: str
    params: dict[str, Any]
    label: str
    what: str | None = None
    slot: str | None = None
    on_live: Callable[[dict[str, Any]], None] | None = field(default=None, compare=False)
    """Called with the running job's `live` data (e.g. a training's loss so far) at every poll that has some."""

    def __post_init__(self) -> None:
        self.params = with_precision(self.params)

    @property
    def key(self) -> str:
        return state.result_key(self.kind, self.params)

    @property
    def where(self) -> str:
        return self.slot or self.kind


def _inflight() -> dict[str, dict[str, Any]]:
    return st.session_state.setdefault("_hl_inflight", {})


def _cancelled() -> dict[str, str]:
    return st.session_state.setdefault("_hl_cancelled", {})


def _approved() -> dict[str, str]:
    """Slot -> the key of the request whose Run button was pressed (it may start although estimated long)."""
    return st.session_state.setdefault("_hl_approved", {})


def _approve(pairs: list[tuple[str, str]]) -> None:
    _approved().update(pairs)


def estimated(estimates: list[dict[str, Any]]) -> str:
    """The jobs' time together, `about 3 min` or `2 to 5 min` (the sum of their ranges), and what it rests on
    (each estimate's `basis`, from `service/timing.py`). Pure."""
    from backend.text import describe_seconds

    total = sum(e["seconds"] for e in estimates)
    low = sum(e.get("low") or e["seconds"] for e in estimates)
    high = sum(e.get("high") or e["seconds"] for e in estimates)
    passes = sum(e.get("passes") or 0 for e in estimates)
    basis = "; ".join(dict.fromkeys(e["basis"] for e in estimates if e.get("basis")))
    return f"**{describe_seconds(total, low, high)}** ({passes:,.0f} prompt passes" + (f"; from {basis})" if basis else ")")


def run_text(held: list[tuple["Job", dict[str, Any]]]) -> str:
    """The line beside a held job's Run button: what it is and its estimated time."""
    what = " and ".join(f"**{j.label}**" for j, _ in held)
    return (f"{what}: estimated {estimated([e for _, e in held])}, so it waits for Run. Results are cached: it runs "
            f"once.")


def _ask_to_run(held: list[tuple["Job", dict[str, Any]]]) -> None:
    """One Run row for the jobs of a request held by the rule; pressing it approves them (see the docstring)."""
    c1, c2 = st.columns([5, 1], vertical_alignment="center")
    c1.info(run_text(held), icon=":material/schedule:")
    c2.button("Run", key="autorun_" + "_".join(j.where for j, _ in held), type="primary",
              icon=":material/play_arrow:", width="stretch", on_click=_approve,
              args=([(j.where, j.key) for j, _ in held],))


def cancel_slot(slot: str) -> None:
    """Cancel this session's job in `slot` (a Cancel button's callback); the page then shows it cancelled."""
    job = _inflight().pop(slot, None)
    if job is None:
        return
    _cancelled()[slot] = job["key"]
    try:
        api.cancel(job["id"])
    except api.ApiError:
        pass  # already finished or forgotten: nothing left to cancel


def _supersede(job: Job) -> dict[str, Any] | None:
    """The slot's job in flight when it is this request's; a different one is cancelled (and None returned)."""
    cur = _inflight().get(job.where)
    if cur is None:
        return None
    if cur["key"] == job.key:
        return cur
    _inflight().pop(job.where, None)
    try:
        api.cancel(cur["id"])
    except api.ApiError:
        pass
    return None


def _remember(job: Job, result: dict[str, Any], t0: float) -> dict[str, Any]:
    """The service's result, checked against its kind's result schema and read by attribute (`ui.results`: the
    one place a result enters the session), with `_waited`; an ApiError when it does not fit."""
    try:
        result = typed(api.kind_name(job.kind), {**result, "_waited": time.monotonic() - t0})
    except ResultError as e:
        raise api.ApiError(f"the service's {job.kind} result does not fit this dashboard: {e}", kind="internal") from e
    api.trace(f"result:{job.kind}:{'hit' if result['cache_hit'] else 'computed'}:{result['seconds']:.3f}",
              1000 * result["_waited"])
    state.remember(job.kind, job.params, result)
    return result


def keep(kind: str, params: dict[str, Any], result: dict[str, Any]) -> dict[str, Any] | None:
    """Remember a result the service answered (checked against its schema); None when it does not fit."""
    try:
        return _remember(Job(kind, params, ""), result, _action_t0())
    except api.ApiError:
        return None


def peek(kind: str, params: dict[str, Any], *, ask_service: bool = True) -> dict[str, Any] | None:
    """A result without computing: this session's memory, else (with `ask_service`) the service's cache."""
    params = with_precision(params)
    hit = state.remembered(kind, params)
    if hit is not None or not ask_service:
        if hit is not None:
            share.used(kind, params)
        return hit
    t0 = _action_t0()
    try:
        found = api.cached(kind, params)
        if found is None:
            return None
        found = _remember(Job(kind, params, ""), found, t0)
    except api.ApiError:
        return None
    share.used(kind, params)
    return found


def _show_cancelled(job: Job) -> None:
    c1, c2 = st.columns([5, 1], vertical_alignment="center")
    c1.info(f"**{job.label}** was cancelled.", icon=":material/stop_circle:")
    c2.button("Run again", key=f"rerun_{job.where}", icon=":material/replay:", width="stretch",
              on_click=lambda slot=job.where: _cancelled().pop(slot, None))


def fetch(kind: str, params: dict[str, Any], label: str, *, what: str | None = None, quiet: bool = False,
          slot: str | None = None, on_live: Callable[[dict[str, Any]], None] | None = None,
          start: bool = False) -> dict[str, Any] | None:
    """The result of a `kind` job with `params` (see the module docstring); None after a failure (shown as an
    st.error unless `quiet`), a cancel (shown with a Run again button) or while a long job waits for its Run
    button (`start`: the caller's Run was pressed, so it starts whatever its estimate)."""
    return fetch_many([Job(kind, params, label, what, slot, on_live)], quiet=quiet, start=start)[0]


def fetch_many(requests: list[Job], *, quiet: bool = False, start: bool = False) -> list[dict[str, Any] | None]:
    """Results of several jobs, submitted together and waited on together; those estimated over AUTO_START_MAX_S
    wait for one Run button unless `start`."""
    out: list[dict[str, Any] | None] = [None] * len(requests)
    pending: list[tuple[int, Job, dict[str, Any]]] = []
    held: list[tuple[Job, dict[str, Any]]] = []
    for i, job in enumerate(requests):
        hit = state.remembered(job.kind, job.params)
        if hit is not None:
            out[i] = hit
            continue
        if _cancelled().get(job.where) == job.key:
            _show_cancelled(job)
            continue
        _cancelled().pop(job.where, None)
        cur = _supersede(job)
        if cur is None:
            t0 = _action_t0()
            try:
                go = start or _approved().get(job.where) == job.key
                j = api.ask(job.kind, job.params, "always" if go else "if_short")
                if j["status"] == "done":
                    out[i] = _remember(job, j["result"], t0)
                    continue
                if j["status"] == "held":
                    held.append((job, j["estimate"]))  # long: it waits for its Run button
                    continue
                cur = {"key": job.key, "id": j["id"], "t0": t0, "eta": _eta(j.get("estimate"))}
            except api.ApiError as e:
                if not quiet:
                    show_error(e, job.what or job.label)
                continue
            _inflight()[job.where] = cur
        pending.append((i, job, cur))
    if held:
        _ask_to_run(held)
    if pending:
        for i, result in _wait(pending, quiet).items():
            out[i] = result
    for job, result in zip(requests, out):
        if result is not None:
            share.used(job.kind, job.params)  # its command goes into the page's Share as HTML file
    return out


def _wait(pending: list[tuple[int, Job, dict[str, Any]]], quiet: bool) -> dict[int, dict[str, Any] | None]:
    """Poll the pending jobs until each ends. A job still running after DRAW_AFTER_S gets a progress bar (stage,
    share done, seconds waited) and a Cancel button; a quick one (a cache hit, a small toggle) gets neither, so
    the page does not flicker. The bar is redrawn at most every REDRAW_S unless the stage moves."""
    slots: dict[int, dict[str, Any]] = {i: {"job": job, "cur": cur, "holder": None, "bar": None, "shown": None,
                                            "drawn_at": 0.0} for i, job, cur in pending}
    results: dict[int, dict[str, Any] | None] = {}
    delay, started = POLL_FIRST_S, time.monotonic()
    while len(results) < len(slots):
        for i, sl in slots.items():
            if i in results:
                continue
            job, cur = sl["job"], sl["cur"]
            try:
                j = api.job(cur["id"])
            except api.ApiError as e:
                _inflight().pop(job.where, None)
                if sl["holder"] is not None:
                    sl["holder"].empty()
                if not quiet:
                    show_error(e, job.what or job.label)
                results[i] = None
                continue
            now = time.monotonic()
            waited = now - cur["t0"]
            if j["status"] in ("queued", "running"):
                if waited > TIMEOUT_S:
                    cancel_slot(job.where)
                    if sl["holder"] is not None:
                        sl["holder"].empty()
                    show_error(api.ApiError(f"no result after {waited:.0f} s; the job was cancelled", "timeout"))
                    results[i] = None
                elif now - started >= DRAW_AFTER_S:
                    _draw(sl, j, waited, now)
                    if job.on_live is not None and j.get("live"):
                        job.on_live(j["live"])  # e.g. a training's loss so far, drawn below the bar
                continue
            _inflight().pop(job.where, None)
            if sl["holder"] is not None:
                sl["holder"].empty()
            if j["status"] == "done" and isinstance(j.get("result"), dict):
                try:
                    results[i] = _remember(job, j["result"], cur["t0"])
                except api.ApiError as e:
                    show_error(e, job.what or job.label)
                    results[i] = None
            elif j["status"] == "cancelled":
                _cancelled()[job.where] = job.key
                _show_cancelled(job)
                results[i] = None
            else:
                if not quiet:
                    show_error(api.ApiError(j.get("error") or "the job failed", kind="job"), job.what or job.label)
                results[i] = None
        if len(results) < len(slots):
            time.sleep(delay)
            delay = min(delay * 1.5, POLL_MAX_S)
    return results


def _eta(e: dict[str, Any] | None) -> str:
    """` of about 3 min` (the service's estimate `e` of a job over SHOW_ESTIMATE_S s), else ""; what a progress bar
    adds after the seconds waited."""
    return f" of {e['text']}" if e and e.get("seconds") is not None and e["seconds"] >= SHOW_ESTIMATE_S else ""


def bar_text(label: str, message: str, frac: float, waited: float, eta: str = "") -> str:
    """A running job's bar: "SITE: training: step 154/400 · loss 0.31 · 9% of the job · 41.0 s of about 3 min".
    The share is the whole job's (a stage's own count, such as a training's steps, comes in its message)."""
    return f"{label}: {message} · {frac:.0%} of the job · {waited:.1f} s{eta}"


def time_left(j: dict[str, Any], prior: str) -> str:
    """What a progress bar adds after the seconds waited: ` · about 40 s left` from the job's own progress (the
    service's `remaining_s`, once the job has made enough to extrapolate), else `prior` (` of about 3 min`: the
    estimate before it ran). Pure."""
    from backend.text import describe_seconds

    left = j.get("remaining_s")
    if j.get("status") == "running" and isinstance(left, (int, float)) and left >= 0:
        return f" · {describe_seconds(left)} left"
    return prior


def _draw(sl: dict[str, Any], j: dict[str, Any], waited: float, now: float) -> None:
    """Draw (the first time) or update a running job's progress bar and Cancel button."""
    job = sl["job"]
    frac = min(max(float(j.get("progress") or 0.0), 0.0), 1.0)
    eta = time_left(j, sl["cur"].get("eta") or "")
    stage = (j.get("message") or j["status"], round(frac, 2), eta)
    if sl["holder"] is None:
        sl["holder"] = st.empty()
        with sl["holder"].container():
            c1, c2 = st.columns([6, 1], vertical_alignment="bottom")
            sl["bar"] = c1.progress(frac, text=bar_text(job.label, stage[0], frac, waited, eta))
            c2.button("Cancel", key=f"cancel_{job.where}", icon=":material/stop_circle:", width="stretch",
                      on_click=cancel_slot, args=(job.where,), help="Stop this job (DELETE /jobs/{id}).")
    elif stage != sl["shown"] or now - sl["drawn_at"] >= REDRAW_S:
        sl["bar"].progress(frac, text=bar_text(job.label, stage[0], frac, waited, eta))
    else:
        return
    sl["shown"], sl["drawn_at"] = stage, now


def in_flight(job: Job) -> bool:
    """True when this session's job for `job` is still running on the service (a rerun re-attaches to it)."""
    cur = _inflight().get(job.where)
    return cur is not None and cur["key"] == job.key
