"""Sweeps: one analysis over several models and tasks (and seeds), run as ordinary jobs by the service's runner
(one machine, or a Ray cluster), and the cross-model view of their results: a models x tasks table and, per model,
where the top TR / TL heads sit by relative depth and how much they overlap with induction heads."""
from __future__ import annotations

import time

import pandas as pd
import streamlit as st

from ui import api, layout, share, state
from ui import sweep_figures as SF
from ui.jobs import show_error

s, caps = layout.page_setup("Sweeps", ":material/table_chart:")
st.title(":material/table_chart: Sweeps")
st.caption("The same analysis over a model zoo and a task suite. Each cell is an ordinary job: cached results "
           "are reused, identical requests are shared, and the service's runner spreads the jobs over its workers "
           "(`HEADLENS_RUNNER=ray`: a Ray cluster). The command line does the same: `python -m backend sweep`.")

SKIP_KINDS = {"model_info", "task_fit", "head_view", "ablate", "ltv_vector", "ltv_across_tasks"}  # need inputs a sweep cannot vary


def _ints(text: str) -> list[int]:
    out = [int(x) for x in text.replace(";", ",").split(",") if x.strip()]
    if not out or any(x < 0 for x in out):
        raise ValueError("give non-negative integers, comma-separated")
    return out


# -- start one ----------------------------------------------------------------------------------------------
with st.expander("Start a sweep", icon=":material/add_circle:", expanded=not state.value("sweep")):
    task_ids = [t["id"] for t in caps.get("tasks", [])]
    kinds = [k["name"] for k in caps.get("job_kinds", []) if k.get("uses_task", True) and k["name"] not in SKIP_KINDS]
    loaded = [m["name"] for m in caps.get("loaded_models", []) if m.get("name")]
    with st.form("sweep_form", border=False):
        c1, c2 = st.columns(2)
        with c1:
            models = st.multiselect("Models", list(dict.fromkeys([s.model, "default", *loaded])), default=[s.model],
                                    accept_new_options=True, key="w_sw_models",
                                    help="`default`, model folders on the service's machine, or Hugging Face ids.")
            kinds_sel = st.multiselect("Analyses", kinds, default=[k for k in ("head_scores",) if k in kinds],
                                       key="w_sw_kinds", help="head_scores gives the TR/TL summary; icl_curve "
                                                              "and ablation_curves add their columns.")
        with c2:
            tasks_sel = st.multiselect("Tasks", task_ids, default=[t for t in [s.task] if t in task_ids],
                                       key="w_sw_tasks")
            seeds_text = st.text_input("Seeds", str(s.seed), key=f"w_sw_seeds_{s.seed}",  # the sidebar's seed
                                       help="comma-separated, e.g. 0,1,2")
        st.caption(f"Each job uses the sidebar's settings: {s.shots} shots (ICL curve: 0..{s.shots}), {s.prompts} "
                   f"prompts, {s.top_label()}.")
        start = st.form_submit_button("Start sweep", type="primary", icon=":material/play_arrow:")
    if start:
        try:
            seeds = _ints(seeds_text)
        except ValueError as e:
            st.error(f"Seeds: {e}.", icon=":material/error:")
        else:
            if not (models and tasks_sel and kinds_sel):
                st.error("Pick at least one model, one task and one analysis.", icon=":material/error:")
            else:
                params = {"shots": s.shots, "prompts": s.prompts, **s.selection(), **s.conventions(),
                          **({"icl_curve.shots": s.icl_shots()} if "icl_curve" in kinds_sel else {})}
                params = {k: v for k, v in params.items()
                          if "." in k or k in ("shots", "prompts", "prepend_bos") or "head_scores" in kinds_sel}
                try:
                    r = api.submit_sweep(models, tasks_sel, kinds_sel, seeds, params)
                except api.ApiError as e:
                    show_error(e, "Starting the sweep")
                else:
                    state.put("sweep", r["id"])
                    st.rerun()


# -- the list and the sweep shown: one fragment, redrawn together every 2 s while a sweep runs -------------------
def list_sweeps() -> list[dict] | None:
    try:
        return api.sweeps()
    except api.ApiError as e:
        show_error(e, "Listing the sweeps")
        return None


def any_running(sweeps: list[dict] | None) -> bool:
    return any(w["status"] == "running" for w in sweeps or [])


first = list_sweeps()
if first is None:
    st.stop()


@st.fragment(run_every=2.0 if any_running(first) else None)
def sweeps_view() -> None:
    """The list of sweeps, the picker and the sweep shown, all from one poll of the service: the list says what the
    detail says (it once read "running · 18%" beside "done · 15 of 15" until a reload). When the last running
    sweep ends, one full rerun stops the timer."""
    sweeps = list_sweeps()
    if sweeps is None:
        return
    cluster_view()
    st.subheader("Sweeps", divider="gray")
    if not sweeps:
        st.info("No sweeps on this service yet. Start one above, or with `python -m backend sweep` against it.",
                icon=":material/info:")
        return
    ids = [w["id"] for w in sweeps]
    if state.value("sweep") not in ids:
        state.put("sweep", ids[0])
    try:
        shown = api.sweep(state.value("sweep"))
    except api.ApiError as e:
        show_error(e, "Reading the sweep")
        return
    by_id = {w["id"]: w for w in sweeps}
    by_id[shown["id"]] = {**by_id[shown["id"]], **{k: shown[k] for k in ("status", "progress", "counts") if k in shown}}
    share.dataframe("Sweeps", pd.DataFrame([{"id": w["id"], "name": w.get("name") or "", "status": w["status"],
                                "progress": 100 * w["progress"], "jobs": w["counts"]["total"],
                                "done": w["counts"]["done"], "cached": w["counts"]["cached"],
                                "failed": w["counts"]["error"], "models": len(w["models"]),
                                "started": time.strftime("%H:%M:%S", time.localtime(w["created"]))}
                               for w in by_id.values()]),
                 hide_index=True, key="sweeps_table",
                 column_config={"progress": st.column_config.ProgressColumn("progress", format="%.0f%%", min_value=0,
                                                                            max_value=100)})
    state.bind(st.selectbox, "Sweep", "sweep", options=ids,
               format_func=lambda i: f"{i} · {by_id[i]['status']} · {by_id[i]['counts']['total']} jobs"
                                     + (f" · {by_id[i]['name']}" if by_id[i].get("name") else ""))
    state.sync_url()
    if state.value("sweep") != shown["id"]:  # just picked another: read that one
        try:
            shown = api.sweep(state.value("sweep"))
        except api.ApiError as e:
            show_error(e, "Reading the sweep")
            return
    show(shown)
    if any_running(first) and not any_running(list(by_id.values())):
        st.rerun()  # the whole page: the fragment's timer stops


def cluster_view() -> None:
    """Where the jobs run: the Ray cluster's hosts (IP, head, CPUs, GPUs, what runs there), or a line for the
    service's own runner; the sentence when the cluster's head is lost."""
    try:
        c = api.cluster()
    except api.ApiError:  # an older service without GET /cluster: nothing to show
        return
    if c.get("runner") != "ray":
        st.caption("Jobs run on the service's own runner (HEADLENS_RUNNER=local).")
        return
    if c.get("lost"):
        st.error(f"Ray cluster lost: {c['lost']}", icon=":material/cloud_off:")
    nodes = c.get("nodes") or []
    running: dict[str, list[str]] = {}
    for a in c.get("actors") or []:
        running.setdefault(a.get("node_ip") or "?", []).append(
            SF.short(str(a.get("model")), 30) + (" (busy)" if a.get("busy") else ""))
    alive = [n for n in nodes if n.get("alive")]
    with st.expander(f"Ray cluster at `{c.get('address')}` · {len(alive)} host{'s' if len(alive) != 1 else ''} · "
                     f"{sum(n.get('cpus') or 0 for n in alive):g} CPUs"
                     + (f" · {sum(n.get('gpus') or 0 for n in alive):g} GPUs" if any(n.get("gpus") for n in alive)
                        else ""), icon=":material/hub:"):
        st.dataframe(pd.DataFrame([{"host": n.get("node_ip"), "head": bool(n.get("head")), "alive": n.get("alive"),
                                    "CPUs": n.get("cpus"), "GPUs": n.get("gpus"),
                                    "models held": ", ".join(running.get(n.get("node_ip") or "", [])),
                                    "node id": (n.get("node_id") or "")[:12]} for n in nodes]),
                     hide_index=True, key="sw_cluster")


def host_of(job: dict) -> str:
    """Where a sweep's job ran: its node's IP, `local` (the service's own runner), `cache`, or empty."""
    r = job.get("ran_on") or {}
    if r.get("node_ip"):
        return r["node_ip"]
    if r.get("runner") == "local":
        return "local"
    return "cache" if job.get("cache_hit") else ""


# -- one sweep ----------------------------------------------------------------------------------------------
def show(sw: dict) -> None:
    """One sweep: its progress (and Cancel), per-model progress, failed jobs, the models x tasks table and the
    per-model summary."""
    sweep_id = sw["id"]
    c = sw["counts"]
    left, right = st.columns([4, 1], vertical_alignment="center")
    running = sw["status"] == "running"
    text = (f"**{sw['status']}** · {c['done'] + c['error'] + c['cancelled']} of {c['total']} jobs · {c['cached']} "
            f"from the cache · {c['error']} failed" + (f" · {c['running']} running" if running else ""))
    with left:  # a progress bar while it runs; a finished sweep's line without one
        if running:
            st.progress(sw["progress"], text=text)
        else:
            st.markdown(text)
    with right:
        if running and st.button("Cancel sweep", icon=":material/stop:", key="sw_cancel"):
            try:
                api.cancel_sweep(sweep_id)
            except api.ApiError as e:
                show_error(e, "Cancelling the sweep")
            st.rerun()
    message = sw.get("message") or ""
    if message not in ("", "done", "running"):  # why jobs failed (a lost cluster), what was retried
        (st.error if c["error"] else st.info)(message, icon=":material/error:" if c["error"] else ":material/replay:")
    if running:
        for m in sw["models"]:
            st.progress(m["progress"], text=f"`{SF.short(m['model'], 60)}` · {m['finished']}/{m['total']}"
                                            + (f" · {m['errors']} failed" if m["errors"] else ""))
    failed = [j for j in sw["jobs"] if j["status"] == "error"]
    if failed:
        with st.expander(f"{len(failed)} failed job{'s' if len(failed) != 1 else ''}", icon=":material/error:"):
            st.dataframe(pd.DataFrame([{k: j[k] for k in ("kind", "model", "task", "seed", "error")} for j in failed]),
                         hide_index=True, key="sw_failed")
    if any(j.get("ran_on") for j in sw["jobs"]):
        hosts = (sw.get("placement") or {}).get("hosts") or {}
        with st.expander("Jobs by host: " + ", ".join(f"{h} {n}" for h, n in sorted(hosts.items())),
                         icon=":material/dns:"):
            st.dataframe(pd.DataFrame([{"kind": j["kind"], "model": SF.short(str(j["model"]), 40), "task": j["task"],
                                        "seed": j["seed"], "status": j["status"], "host": host_of(j),
                                        "retried after losing": ", ".join(x.get("node_ip") or "?" for x in
                                                                          (j.get("ran_on") or {}).get("lost") or [])}
                                       for j in sw["jobs"]]), hide_index=True, key="sw_hosts")
    summary = sw.get("summary") or {}
    if not summary.get("rows"):
        st.info("Results appear here as the jobs finish.", icon=":material/hourglass_top:")
        return
    st.subheader("Models × tasks", divider="gray")
    present = SF.metrics_present(summary) or ["accuracy"]
    if state.value("sw_metric") not in present:
        state.put("sw_metric", present[0])
    state.bind(st.segmented_control, "Metric", "sw_metric", options=present, required=True,
               format_func=lambda m: SF.METRICS.get(m, (m,))[0])
    metric = state.value("sw_metric")
    st.caption(SF.METRICS.get(metric, ("", ""))[1].capitalize() + "; means over seeds.")
    pivot = SF.pivot(summary, metric)
    share.chart(SF.table_heatmap(summary, metric, pivot), f"sweep-{metric}", key="sw_heatmap", heads="")
    share.table(f"Models × tasks: {metric}", pivot.reset_index())
    st.dataframe(pivot, key="sw_pivot", column_config={
        col: st.column_config.NumberColumn(format="%.3f") for col in pivot.columns})
    st.subheader("Where the top heads sit, per model", divider="gray")
    st.caption("TR (task recognition) and TL (task learning) heads of the `scores` jobs: their relative depth "
               "(layer / (layers − 1)) and their Jaccard overlap with the top induction heads, over tasks and seeds.")
    table = SF.models_table(summary)
    share.dataframe("Per model", table, hide_index=True, key="sw_models", column_config={
        c: st.column_config.NumberColumn(format="%.3f") for c in table.columns if c not in ("model", "tasks",
                                                                                          "n_layers")})
    if any(m.get("tr_depth_hist") for m in summary.get("models", [])):
        c1, c2 = st.columns(2)
        with c1:
            share.chart(SF.depth_profile(summary), "sweep-depth", key="sw_depth", heads="")
        with c2:
            share.chart(SF.overlap_scatter(summary), "sweep-overlap", key="sw_overlap", heads="")


sweeps_view()
