"""headlens dashboard, Home: pick a model and a task, run, and read the in-context learning summary.

Run with `python -m backend launch` (service + dashboard), or `streamlit run app.py` with
HEADLENS_BACKEND_URL pointing at a running service. Pages only render and call `ui.api`; no torch here.
"""
from __future__ import annotations

import hashlib

import pandas as pd
import streamlit as st

from ui import api, figures, fit, jobs, layout, settings, share, snippets, state
from ui import metrics as M
from ui.sections import icl_metrics, run, run_row
from ui.tsla import anytime

s, caps = layout.page_setup("Home", ":material/search:")
st.title(":material/search: headlens")
st.markdown("Find the attention heads that do **in-context learning**: score every head by how it writes into "
            "the task's label space, browse the maps, and switch heads off live.")
cols = st.columns(2)
cols[0].caption("**TR** (task recognition): does the head push the output into the span of the label tokens?")
cols[1].caption("**TL** (task learning): within that span, does it push towards the *correct* label?")


# -- bring your own task ---------------------------------------------------------------------------------
def upload_section() -> bool:
    """The upload expander; True when it showed the fit check of the task now picked (an upload just made)."""
    with st.expander("Bring your own task (JSON, JSONL or CSV)", icon=":material/upload_file:",
                     expanded=bool(st.session_state.get("_hl_upload_msg"))):
        c1, c2 = st.columns([3, 1])
        with c2:
            kind = st.selectbox("Kind", ["auto", "classification", "generation"], key="w_upload_kind",
                                help="auto: classification when the outputs take 2–10 distinct values, each "
                                     "seen at least twice on average; otherwise generation.")
        with c1:
            f = st.file_uploader("Task file", type=["json", "jsonl", "ndjson", "csv", "tsv"], key="w_upload",
                                 help="Records of an input and an output.")
        st.caption("Formats: `.json` a list of `{\"input\": …, \"output\": …}` objects · `.jsonl` one such object "
                   "per line · `.csv`/`.tsv` with a header naming `input` and `output` columns.")
        if f is not None:
            data = f.getvalue()
            digest = hashlib.sha256(data + f.name.encode() + kind.encode()).hexdigest()
            if st.session_state.get("_hl_upload_digest") != digest:
                st.session_state["_hl_upload_digest"] = digest
                try:
                    r = api.upload_task(f.name, data, kind=None if kind == "auto" else kind)
                except api.ApiError as e:
                    st.session_state["_hl_upload_msg"] = ("error", e)
                else:
                    summary = dict(r["summary"], id=r["id"], source="upload", filename=f.name)
                    st.session_state.setdefault("_hl_uploads", {})[r["id"]] = summary
                    state.put("task", r["id"])
                    layout.forget_capabilities()
                    st.session_state["_hl_upload_msg"] = ("ok", summary)
                    st.rerun()  # redraw the sidebar with the new task picked
        msg = st.session_state.get("_hl_upload_msg")
        if msg and msg[0] == "error":
            jobs.show_error(msg[1], "Upload")
        elif msg:
            t = msg[1]
            labels = f" Labels: {', '.join(t['labels'][:12])}." if t.get("labels") else ""
            st.success(f"**{t['name']}** is a valid task file: {t['kind']}, {t['n_examples']} examples.{labels} "
                       f"It is now the task in the sidebar.", icon=":material/check_circle:")
            if state.get().task == t["id"]:  # checked against the model in use
                fit.check(state.get(), stop=False)
                return True
    return False


checked = upload_section()
layout.need_task(s)
if not checked:
    fit.check(s)
elif (state.remembered("task_fit", fit.params(s)) or {}).get("verdict") == "refuse":
    st.stop()

# -- run ----------------------------------------------------------------------------------------------------
ks = s.icl_shots()
score_job = jobs.Job("head_scores", s.job(**s.selection()), "Scoring heads", "Head scores")
icl_job = jobs.Job("icl_curve", s.job(shots=ks, examples=settings.kind_default("icl_curve", "examples")), "ICL curve",
                   "ICL curve")

st.subheader("Run", divider="gray")
clicked = run_row(f"**Model** `{s.model}` · **task** `{s.task}` · **{s.shots}** shots · **{s.prompts}** prompts · "
                  f"seed {s.seed}",
                  "Scores every head (TR, TL, DLA, induction) and measures accuracy for k = "
                  f"{', '.join(map(str, ks))} demonstrations. Results are cached by the service, so a rerun or a "
                  "collaborator opening your link gets them at once.", "run",
                  estimate=[(j.kind, j.params) for j in (score_job, icl_job)])

if clicked or jobs.in_flight(score_job) or jobs.in_flight(icl_job):
    partial = anytime.PartialView("home")  # the accuracies so far while the heads are scored ("8 of 50 prompts")
    score_job.on_live = anytime.summary_drawer(partial)
    scores, icl = jobs.fetch_many([score_job, icl_job], start=True)
    partial.clear()
else:  # what is cached shows at once (a shared link); the rest waits for Run
    scores, icl = (jobs.peek(j.kind, j.params) for j in (score_job, icl_job))
    if scores is None or icl is None:
        st.info("Press **Run** to score the heads of this model on this task.", icon=":material/play_arrow:")

# -- summary ------------------------------------------------------------------------------------------------
if scores is not None:
    st.subheader("Summary", divider="gray")
    jobs.show_warnings(scores)
    k_shot, zero = scores["icl"], scores.get("zero_shot")
    k = scores["shots"]
    m = st.columns(4)
    icl_metrics(m, scores, "Summary", {"prompts": scores["prompts"], "layers x heads": f"{scores['n_layers']} x "
                                       f"{scores['n_heads']}", "noise": M.noise_sentence(scores["prompts"])})
    m[3].metric("Heads", f"{scores['n_layers']} × {scores['n_heads']}", help="layers × heads per layer", border=True)
    if zero is not None:
        st.markdown(" · ".join(f"{M.LABEL[n]} with **0** shots: **{M.pct(zero[n])}**" for n in M.NAMES)
                    + " (the arrows above: the change from 0 to "
                    + f"{k} shots, in points).")
        sentence = M.zero_shot_sentence(zero, k_shot, k)
        if sentence:
            st.info(sentence, icon=":material/lightbulb:")
    if layout.task_info(caps, s.task).get("kind") == "generation":
        st.caption(M.GENERATION_NOTE)
    # labels spanning several tokens: the result's own warning says so, in the page's one box (once)
    st.caption(f"{scores['prompts']} prompts, {k} shots, seed {s.seed} · head scores {jobs.timing(scores)}. "
               f"Brackets: 95% Wilson intervals. {M.noise_sentence(scores['prompts'])}")
    snippets.show("head_scores", score_job.params, "r.icl, r.zero_shot   # Metrics: accuracy, label_accuracy, tr_ratio\n"
                                              "r.icl.accuracy_ci    # its 95% Wilson interval\n"
                                              "r.tr, r.tl           # head maps, numpy (layers, heads)")
    if icl is not None:
        jobs.show_warnings(icl)
        c1, c2 = st.columns([1, 1], gap="medium")
        with c1:
            share.chart(figures.icl_curve(icl, "In-context learning" + figures.subtitle(
                figures.caption(s.model, s.task_title))), "icl-curve", key="icl_fig", heads="")
            st.caption(f"ICL curve {jobs.timing(icl)}. Error bars: 95% Wilson intervals. "
                       + M.noise_sentence(icl.get("prompts")))
            snippets.show("icl_curve", icl_job.params, "r.shots, r.accuracy, r.label_accuracy, r.tr_ratio\n"
                                                 "r.accuracy_ci   # 95% Wilson interval per k")
        with c2:
            st.markdown("**Example prompts**")
            ex = icl.get("examples") or []
            shots_used = list(icl["shots"])
            if ex:
                k = state.bind(st.select_slider, "k (demonstrations)", "ex_k", options=shots_used,
                               to_widget=lambda v: v if v in shots_used else shots_used[-1])
                k = k if k in shots_used else shots_used[-1]
                rows = ex[shots_used.index(k)]
                share.dataframe(f"Example prompts (k = {k})", 
                    pd.DataFrame([{"correct": bool(r.get("correct")), "label_correct": bool(r.get("label_correct")),
                                   "query": str(r.query).strip(), "gold": str(r.gold).strip(),
                                   "answer": str(r.pred_token).strip() or "∅",
                                   "prediction": str(r.pred).strip() or "∅",
                                   "p(gold)": r.get("gold_prob")}
                                  for r in rows]),
                    hide_index=True, key="examples_table",
                    column_config={"correct": st.column_config.CheckboxColumn("ok", help=M.HELP["accuracy"]),
                                   "label_correct": st.column_config.CheckboxColumn("label ok",
                                                                                    help=M.HELP["label_accuracy"]),
                                   "answer": st.column_config.TextColumn("top token",
                                                                         help="The full-vocabulary argmax."),
                                   "prediction": st.column_config.TextColumn("best label",
                                                                             help="The argmax among the labels."),
                                   "p(gold)": st.column_config.NumberColumn(format="%.3f")})
                if rows:
                    st.caption("The full prompt of the first example:")
                    full = rows[0]["prompt"] if len(rows[0]["prompt"]) < 1500 else "…" + rows[0]["prompt"][-1500:]
                    st.code(full, language=None, wrap_lines=True, height=220 if len(full) > 400 else "content")
            else:
                st.caption("No example rows came back.")
        with st.expander("ICL curve as a table"):
            share.dataframe("ICL curve", pd.DataFrame({"k": icl["shots"], **{f"{M.LABEL[n]} %": [100 * a for a in icl[n]]
                                                             for n in M.NAMES},
                                                          **{f"{M.LABEL[n]} 95% interval": [M.span(c) for c in icl[f"{n}_ci"]]
                                                             for n in M.NAMES if icl.get(f"{n}_ci")}}),
                         hide_index=True, key="icl_table",
                         column_config={f"{M.LABEL[n]} %": st.column_config.NumberColumn(format="%.1f")
                                        for n in M.NAMES})
    st.subheader("Next", divider="gray")
    n1, n2 = st.columns(2)
    n1.page_link("pages/1_Head_map.py", label="Browse the head maps", icon=":material/grid_on:",
                 query_params=state.query())
    n2.page_link("pages/2_Ablation.py", label="Switch heads off (ablation)", icon=":material/power_settings_new:",
                 query_params=state.query())

# -- the findings report ---------------------------------------------------------------------------------------------
st.subheader("Findings report", divider="gray")
report_job = jobs.Job("findings_report", {"model": s.model, "tasks": [s.task], **s.conventions()}, "Findings report",
                      "Findings report")
if s.task.startswith("upload:"):  # the report reproduces the papers' setups: built-in tasks only
    st.caption("The findings report runs on built-in tasks (the papers' setups), not on an uploaded file: pick a "
               "built-in task in the sidebar for it.")
    report = None
else:
    report = run(report_job, f"The three papers' findings on `{s.model}`, task `{s.task}` (TSLA, LTV, SITE; small "
                 "sizes)", "Each finding with the paper's figure beside ours and holds / partly / does not hold, as "
                 "one HTML file that opens with no server: the file to mail after a demo (`python -m backend report` "
                 "for more tasks).", "findings", "Press **Build report** to build it.", label="Build report")
if report is not None:
    from backend.report.findings_html import report_html

    st.dataframe([{"paper": r["paper"], "finding": r["finding"], "paper's figure": r["paper_figure"],
                   "on this model": r["ours"]} for r in report["summary"]], hide_index=True, use_container_width=True)
    st.download_button("Download the report (HTML)", report_html(report), mime="text/html",
                       file_name=f"findings-{share.file_stem('report')}.html", icon=":material/download:")
