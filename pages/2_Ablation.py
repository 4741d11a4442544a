"""Ablation: switch the selected heads off live, and curves of accuracy and TR ratio against the number of
top heads ablated (TR, TL and induction orders, and random heads over 3 seeds)."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from ui import figures, fit, heads, jobs, layout, settings, share, snippets, state
from ui import metrics as M
from ui.sections import download

MODE_HELP = ("zero: the head's output is replaced by zeros. mean: by the head's mean last-token output over the "
             "task's prompts (a gentler, in-distribution knock-out).")

WHERE_HELP = ("Last token: the heads are switched off at the prompt's last token only. The prompts' clean prefix "
              "is kept from the Head map's pass, so a toggle is one token step per prompt (about a second on "
              "SmolLM2-135M on a CPU). Every position: at every token of the prompt; the layers from the first "
              "switched-off head on are recomputed over the whole prompt (on SmolLM2-135M, 10-shot prompts, 2 CPU "
              "cores: tens of seconds).")

WHERE = {"last": "at the last token", "all": "at every position"}

s, caps = layout.page_setup("Ablation", ":material/power_settings_new:")
st.title(":material/power_settings_new: Ablation")
st.caption("Knock heads out at the output projection's input and watch accuracy and the TR ratio move.")
layout.need_task(s)
fit.check(s)

scores = layout.needed("head_scores", s.job(**s.selection()), "Scoring heads", "Head scores")
L, H = layout.fit_shape(scores)

state.bind(st.segmented_control, "Ablation mode", "mode", options=state.options("mode"), required=True,
           format_func=str.capitalize, help=MODE_HELP)
mode = state.get().mode

# -- live toggling ---------------------------------------------------------------------------------------------------
st.subheader("Switch heads off", divider="gray")
st.caption("The heads selected here or on the Head map are ablated at once.")
state.bind(st.segmented_control, "Where", "ab_positions", options=state.options("ab_positions"), required=True,
           format_func=lambda p: {"last": "Last token", "all": "Every position"}[p], help=WHERE_HELP)
selected = heads.multiselect(L, H)
heads.quick_picks(scores, L, H, key="ab")

if not selected:
    st.info("No heads selected: pick some above, use a quick pick, or click cells on the Head map.",
            icon=":material/touch_app:")
else:
    ab_params = s.job(heads=[list(h) for h in selected], mode=mode, positions=state.value("ab_positions"))
    ab = jobs.fetch("ablate", ab_params, f"Ablating {len(selected)} head(s)", what="Ablation")
    if ab is not None:
        jobs.show_warnings(ab)
        rows = pd.DataFrame(ab["rows"])
        b, a = ab["before"], ab["after"]
        changed = int((rows["pred_before"] != rows["pred_after"]).sum()) if len(rows) else 0
        c = st.columns(5)
        for col, name in zip(c, M.NAMES):
            col.metric(f"{M.LABEL[name]} after", M.pct(a[name]), delta=M.points(a[name], b[name]),
                       help=f"{M.HELP[name]} Before ablation: {M.pct(b[name])}.", border=True)
            col.caption(f"{M.span(M.ci_of(a, name))} · was {M.pct_ci(b, name)}".strip(" ·"))
        if len(rows):
            pb, pa = rows["gold_prob_before"].mean(), rows["gold_prob_after"].mean()
            c[3].metric("Mean p(gold) after", f"{pa:.3f}", delta=None if abs(pa - pb) < 5e-4 else f"{pa - pb:+.3f}",
                        border=True)
            c[3].caption(f"was {pb:.3f}")
        c[4].metric("Predictions changed", f"{changed} / {len(rows)}", border=True)
        where = WHERE[ab.positions]
        tests = ab.test or {}
        if tests:  # the same prompts before and after: a paired test, not two intervals compared by eye
            st.markdown("After against before, paired on the same prompts: "
                        + "; ".join(M.paired_text(tests[n], M.LABEL[n].lower()) for n in M.NAMES if n in tests) + ".")
        st.caption(M.noise_sentence(ab.prompts) + " Brackets: 95% Wilson intervals.")
        share.numbers("Ablation of the selected heads", {"heads": ", ".join(figures.head_name(h) for h in selected),
                                                         "mode": mode, "positions": ab.positions,
                                                         "predictions changed": changed,
                                                         **{f"{M.LABEL[n]} before": b[n] for n in M.NAMES},
                                                         **{f"{M.LABEL[n]} after": a[n] for n in M.NAMES},
                                                         **{f"{M.LABEL[n]} 95% interval after": M.span(M.ci_of(a, n))
                                                            for n in M.NAMES if M.ci_of(a, n)},
                                                         **{f"{M.LABEL[n]} after vs before": M.paired_text(tests[n])
                                                            for n in M.NAMES if n in tests}})
        st.caption(f"{mode} ablation of {', '.join(figures.head_name(h) for h in selected)} {where} · "
                   f"{ab.prompts} prompts, {ab.shots} shots · {jobs.timing(ab)}")
        snippets.show("ablate", ab_params, "r.before, r.after   # Metrics: accuracy, label_accuracy, tr_ratio\n"
                                           "r.after.accuracy_ci # its 95% Wilson interval\n"
                                           "r.test['accuracy']  # paired test after vs before: effect, ci_low, "
                                           "ci_high, p\n"
                                           "r.rows              # per prompt: pred_before, pred_after, ...")
        if len(rows):
            only = state.bind(st.toggle, "Only prompts whose prediction changed", "only_changed")
            view = rows[rows["pred_before"] != rows["pred_after"]] if only else rows
            view = view.assign(delta_p=(view["gold_prob_after"] - view["gold_prob_before"]).round(4) + 0.0,  # no -0.000
                               query=view["query"].map(lambda t: str(t).strip()),
                               gold=view["gold"].map(lambda t: str(t).strip()),
                               pred_before=view["pred_before"].map(lambda t: str(t).strip() or "∅"),
                               pred_after=view["pred_after"].map(lambda t: str(t).strip() or "∅"))
            share.dataframe(f"Per prompt: {mode} ablation of {len(selected)} head(s)", 
                view, hide_index=True, key="ablate_table",
                column_order=["query", "gold", "pred_before", "correct_before", "label_correct_before", "pred_after",
                              "correct_after", "label_correct_after", "gold_prob_before", "gold_prob_after", "delta_p",
                              "prompt"],
                column_config={
                    "query": st.column_config.TextColumn("query", width="medium"),
                    "pred_before": "pred. before", "pred_after": "pred. after",
                    "correct_before": st.column_config.CheckboxColumn("ok", width="small"),
                    "correct_after": st.column_config.CheckboxColumn("ok ", width="small"),
                    "label_correct_before": st.column_config.CheckboxColumn("label ok", width="small",
                                                                            help=M.HELP["label_accuracy"]),
                    "label_correct_after": st.column_config.CheckboxColumn("label ok ", width="small"),
                    "gold_prob_before": st.column_config.NumberColumn("p(gold) before", format="%.3f"),
                    "gold_prob_after": st.column_config.NumberColumn("p(gold) after", format="%.3f"),
                    "delta_p": st.column_config.NumberColumn("Δ p(gold)", format="%+.3f"),
                    "prompt": st.column_config.TextColumn("full prompt", width="large")})
            st.download_button("Per-prompt table (CSV)", rows.to_csv(index=False).encode(),
                               f"headlens-ablate-{s.task}.csv".replace(":", "-"), "text/csv",
                               key="dl_ablate", on_click="ignore", icon=":material/table:")

# -- curves ---------------------------------------------------------------------------------------------------------------
st.subheader("Ablation curves", divider="gray")
n_all = L * H
choices = state.kmax_choices(n_all, s.model, state.get().kmax)  # the model's default k (27 on SmolLM2) included
if state.get().kmax not in choices:
    state.put("kmax", min(choices, key=lambda k: abs(k - state.get().kmax)))
state.bind(st.select_slider, "Ablate up to k heads", "kmax", options=choices,
           help="Curves at k = 0, 1, 2, 4, … up to this many of the top-ranked heads.")
kmax = state.get().kmax
ks = sorted({0, kmax} | {k for k in state.KMAX_STEPS if k < kmax})
curve_params = s.job(ks=ks, mode=mode, orders=settings.kind_default("ablation_curves", "orders"),
                     random_seeds=settings.kind_default("ablation_curves", "random_seeds"))
curves = jobs.fetch("ablation_curves", curve_params, "Ablation curves", what="Ablation curves")
if curves is not None:
    jobs.show_warnings(curves)
    share.chart(figures.ablation_curves(curves, f"{mode.capitalize()} ablation of the top k heads" + figures.subtitle(
        figures.caption(s.model, s.task_title, curves['shots'], f'k ≤ {kmax}'))), f"ablation-curves-{mode}",
                key="curves_fig", heads=f"k{kmax}")
    rand = curves.curves["random"]
    band = "its 95% interval over the random sets and the prompts" if rand.accuracy_ci else "± standard deviation"
    here = WHERE[curves["positions"]]
    st.caption(f"{mode.capitalize()} ablation {here} of the k heads ranked highest by TR, TL or induction score "
               f"(the switch above ablates {WHERE[state.value('ab_positions')]}); random: "
               f"k random heads, mean over seeds {rand.seeds} with {band}"
               f" (grey band; drawn from the heads outside the top {kmax} TR and TL heads while there are enough: a "
               f"disjoint control). Error bars: 95% Wilson intervals. "
               f"{curves.prompts} prompts per point · {jobs.timing(curves)}. " + M.noise_sentence(curves.prompts))
    k_last = curves["ks"][-1] if curves["ks"] else None
    vs = [(figures.ORDER_STYLE.get(o, {"name": o})["name"], c["vs_random"]["accuracy"][-1])
          for o, c in curves["curves"].items() if o != "random" and (c.get("vs_random") or {}).get("accuracy")]
    if vs and k_last:
        st.markdown(f"Accuracy, the top {k_last} heads against {k_last} random heads (paired on the same prompts): "
                    + "; ".join(M.paired_text(t, name) for name, t in vs) + ".")
    rises = figures.rises(curves)
    if rises:
        st.caption(":material/info: Not monotonic in k: " + "; ".join(rises) + ". Ablating more heads can raise a "
                   "score: a head ablated later may have been working against the answer, and with several heads "
                   "out the rest compensate differently" + (" (mean ablation also writes every head's mean output, "
                                                            "not nothing)" if mode == "mean" else "") + ".")
    snippets.show("ablation_curves", curve_params, "r.ks, r.curves['tr'].tr_ratio   # per order: accuracy, label_accuracy, "
                                            "tr_ratio\nr.curves['tr'].tr_ratio_ci           # 95% interval per k\n"
                                            "r.curves['tr'].vs_random['accuracy']   # per k: paired test against "
                                            "random (effect, ci_low, ci_high, p)")
    tr_curve = curves["curves"].get("tr")
    if tr_curve and len(curves["ks"]) > 1:
        st.caption(f"TR ratio with the top {curves['ks'][-1]} TR heads ablated: **{M.pct(tr_curve['tr_ratio'][-1])}** "
                   f"(none ablated: {M.pct(tr_curve['tr_ratio'][0])}); accuracy {M.pct(tr_curve['accuracy'][-1])}, "
                   f"label accuracy {M.pct(tr_curve['label_accuracy'][-1])}.")
    flat = []
    for name, c in curves["curves"].items():
        for i, k in enumerate(curves["ks"]):
            row = {"order": name, "k": k}
            for n in M.NAMES:
                row[n] = c[n][i]
                row[f"{n}_std"] = (c.get(f"{n}_std") or [None] * len(curves["ks"]))[i]
                ci = (c.get(f"{n}_ci") or [None] * len(curves["ks"]))[i]
                row[f"{n}_ci_low"], row[f"{n}_ci_high"] = ci if ci else (None, None)
                t = ((c.get("vs_random") or {}).get(n) or [None] * len(curves["ks"]))[i]
                row[f"{n}_vs_random"], row[f"{n}_vs_random_p"] = (t["effect"], t["p"]) if t else (None, None)
            flat.append(row)
    with st.expander("Curves as a table"):
        share.dataframe("Ablation curves", pd.DataFrame(flat), hide_index=True, key="curves_table")
    d = st.columns(2)
    d[0].download_button("Curves (CSV)", pd.DataFrame(flat).to_csv(index=False).encode(),
                         f"headlens-ablation-{s.task}-{mode}.csv".replace(":", "-"), "text/csv", key="dl_curves_csv",
                         on_click="ignore", icon=":material/table:")
    with d[1]:
        download("Curves (JSON)", curves, f"headlens-ablation-{s.task}-{mode}.json", "dl_curves_json")
