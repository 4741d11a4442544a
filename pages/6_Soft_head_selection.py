"""Soft head selection (SITE): per-head alphas trained to inject an ICL task embedding into zero-shot prompts.

Train with a progress bar and a live loss curve; then the alpha map (clickable like the Head map: selected heads
go to the Ablation page), the comparison table, the patching curves, the budget curve, the transfer matrix over
tasks and one view of every steering method side by side. Service jobs: `site`, `site_transfer`, `methods`.
"""
from __future__ import annotations

import dataclasses

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import streamlit as st

from ui import figures, fit, heads, jobs, layout, settings, share, snippets, state
from ui.sections import LiveChart, download, guard, run
from ui import metrics as M
from ui.site import figures as sf


LTV_PAGE = Path(__file__).resolve().parent / "5_Learned_task_vectors.py"


def pct_cols(table: pd.DataFrame, cols: list[str]) -> dict[str, Any]:
    return {c: st.column_config.NumberColumn(format="%.1f") for c in cols if c in table.columns}


s, caps = layout.page_setup("Soft head selection", ":material/tune:")
st.title(":material/tune: Soft head selection")
st.caption("SITE: take each head's mean last-token input to the output projection over few-shot prompts (the task "
           "embedding t), and learn one weight α per head with which a zero-shot prompt's z is replaced by t at the "
           "last token: z ← (1 − α) z + α t. The α that make zero-shot prompts answer right say which heads carry "
           "the task.")
layout.need_task(s)
# the fit-check line every page shows (unknown tokens; the length of SITE's N-shot prompts against the context)
fit.check(dataclasses.replace(s, shots=int(state.value("site_shots"))))

L, H = layout.fit_shape(layout.needed("model_info", {"model": s.model}, "Loading the model", "Model"))

# -- settings ------------------------------------------------------------------------------------------------------
c1, c2, c3 = st.columns(3)
with c1:
    state.bind(st.number_input, "M: few-shot prompts", "site_m", **settings.widget_bounds("site_m"), step=5,
               help="Prompts (from the training split) whose mean last-token z per head is the task embedding t.")
with c2:
    state.bind(st.number_input, "N: shots per prompt", "site_shots", **settings.widget_bounds("site_shots"), step=1,
               help="Demonstrations in each of those prompts (fewer when the context window is short).")
with c3:
    state.bind(st.number_input, "Training steps", "site_steps", **settings.widget_bounds("site_steps"), step=50,
               help=f"Adam steps (lr {settings.kind_default('site_alphas', 'lr'):g}, one random zero-shot prompt each); "
                    f"every {settings.kind_default('site_alphas', 'val_every')} steps the validation loss decides which α "
                    "are kept.")
recipe = {"m": int(state.value("site_m")), "shots": int(state.value("site_shots")),
          "steps": int(state.value("site_steps")), "prompts": s.prompts, "seed": s.seed, **s.conventions()}
params = {"model": s.model, "task": s.task, **recipe}

st.subheader("Train", divider="gray")
live = LiveChart("site")


def draw_live(data: dict[str, Any]) -> None:
    """The running training's loss curve (the main run's, then each budget run's: their steps restart at 0)."""
    if "loss" not in data:  # a sub-call's own live data (e.g. the head scores' partial maps)
        return
    live.draw(lambda d: sf.loss_curve(d.get("loss") or [], d.get("val") or [], d.get("steps"),
                                      title=f"Training: step {int(d.get('step') or 0)} of {d.get('steps')}"),
              data, signature=(int(data.get("step") or 0), len(data.get("loss") or [])))


res = run(jobs.Job("site_alphas", params, "Soft head selection", "SITE", on_live=draw_live),
          f"**M = {recipe['m']}** prompts × **N = {recipe['shots']}** shots · **{recipe['steps']}** steps · "
          f"{L} × {H} = **{L * H}** α to learn",
          f"Then: SITE against 0-shot, {'- and '.join(map(str, settings.kind_default('site_alphas', 'icl_shots')))}"
          "-shot ICL, the function and vanilla task vectors, every α = 1 and LTV (when cached); patching; "
          f"the budget curve over M = {', '.join(map(str, settings.kind_default('site_alphas', 'budget')))}.",
          "site", "Press **Run** to train the α (a shared link with a cached result opens it directly).")
live.clear()
if res is None:
    st.stop()

with guard("Soft head selection"):
    base = res.get("baselines") or {}
    site, zero = res["site"], (base.get("zero_shot") or {}).get("metrics")
    icl_k = min(res.params.get("icl_shots") or settings.kind_default("site_alphas", "icl_shots"))  # what ran
    icl8 = (base.get(f"icl_{icl_k}") or {}).get("metrics")
    pc = res["params_count"]
    m = st.columns(5)
    m[0].metric("SITE accuracy (0-shot)", M.pct(site["accuracy"]),
                delta=None if zero is None else M.points(site["accuracy"], zero["accuracy"]),
                help=M.HELP["accuracy"] + " The arrow: against the same prompts without injection.", border=True)
    m[1].metric("Exact match", M.pct(site.get("exact_match")),
                help="Greedy generation with the KV cache (the injection in the prefill only), cut at the task's "
                     "separator or a newline: it begins with the whole gold answer. "
                     f"Strictly the answer alone: {M.pct(site.get('strict_match'))}.", border=True)
    m[2].metric("TR ratio", M.pct(site["tr_ratio"]), help=M.HELP["tr_ratio"], border=True)
    m[3].metric(f"{icl_k}-shot ICL", M.pct(icl8["accuracy"]) if icl8 else "n/a",
                help=f"Accuracy of the same queries with {icl_k} demonstrations in the prompt.", border=True)
    m[4].metric("Trained parameters", f"{pc['site']:,}",
                help=f"L × H = {L} × {H}. A rank-8 LoRA on the q and v projections of this model trains "
                     f"{pc['lora']:,}. The task embedding t holds {pc['task_embedding']:,} values (extracted, not "
                     f"trained).", border=True)
    st.caption(f"Trained {res['steps']} steps in **{res['train_seconds']:.1f} s** (task embedding "
               f"{res['embed_seconds']:.1f} s), α kept from step {res['best_step']}; {res['n_train']} training and "
               f"{res['n_val']} validation queries from the training split, {res['prompts']} held-out test prompts. "
               f"**{pc['site']:,}** trained parameters against **{pc['lora']:,}** for LoRA (rank 8 on q and v). "
               + jobs.timing(res) + (" · α loaded from a file" if res.get("loaded") else ""))
    for col, (mm, name) in zip(m, ((site, "accuracy"), (site, "exact_match"), (site, "tr_ratio"), (icl8, "accuracy"))):
        if M.ci_of(mm, name):
            col.caption(f"95% interval {M.span(M.ci_of(mm, name))}")
    site_tests = res.get("tests") or {}
    said = [M.paired_text(site_tests[k]["accuracy"], f"SITE vs {(base.get(k.removeprefix('site vs ')) or {}).get('label') or k}")
            for k in site_tests if (site_tests[k] or {}).get("accuracy")
            and k.removeprefix("site vs ").startswith(("icl", "zero_shot"))]
    if said:
        st.markdown("Accuracy, paired on the same test queries: " + "; ".join(said) + ".")
    st.caption(f"Brackets and error bars: 95% Wilson intervals. {M.noise_sentence(res['prompts'])}")

    # -- the alpha map ---------------------------------------------------------------------------------------------------
    st.subheader("α map", divider="gray")
    alpha = np.asarray(res["alpha"], dtype=float)
    selected = heads.current(L, H)
    ctx_label = figures.caption(s.model, s.task_title, res["shots"])
    k_top = int(st.session_state.get("w_site_k") or min(4, L * H))  # the side column's "Top k by α" (drawn after)
    main, side = st.columns([3, 1.25], gap="medium")
    with main:
        share.chart(sf.alpha_map(alpha, selected, f"α per head · {ctx_label} · M = {res['m']}", top=k_top),
                    "site-alpha", key=heads.chart_key("site_alpha"), on_select=heads.on_chart_select("site_alpha"),
                    selection_mode=("points", "box", "lasso"), heads=f"top{k_top}")
        dec = res["decisive"]
        st.caption(f"**{M.pct(dec['decided'])}** of the α are decided (under 0.1: {M.pct(dec['low'])}, over 0.9: "
                   f"{M.pct(dec['high'])}); under 0.2 or over 0.8: {M.pct(dec.get('decided_2x'))}. With the α rounded to "
                   f"0 / 1 the accuracy is {M.pct(res['site_hard']['accuracy'])} (learned α: "
                   f"{M.pct(site['accuracy'])}). Click a cell to select a head, drag a box or lasso to add several.")
    with side:
        selected = heads.multiselect(L, H)
        k_pick = st.number_input("Top k by α", min_value=1, max_value=L * H, value=min(4, L * H), key="w_site_k",
                                 help="The heads outlined on the map, and what the Top k button selects.")
        b1, b2 = st.columns(2)
        b1.button("Top k", on_click=lambda: heads.put(figures.top_k(alpha, int(st.session_state["w_site_k"]))),
                  key="site_pick_top", width="stretch")
        b2.button("α > 0.5", on_click=lambda: heads.put([(l, h) for l in range(L) for h in range(H) if alpha[l, h] > 0.5]),
                  key="site_pick_half", width="stretch")
        if selected:
            st.page_link("pages/2_Ablation.py", label="Ablate this head" if len(selected) == 1 else
                         f"Ablate these {len(selected)} heads", icon=":material/power_settings_new:",
                         query_params=state.query())
        snippets.show("site_alphas", params, "r.alpha          # numpy (layers, heads)\nr.site, r.baselines, r.patching\n"
                                      "r.site.accuracy_ci   # 95% Wilson interval\n"
                                      "r.tests              # 'site vs icl_8' -> rate -> paired test\n"
                                      "r.patching.tests     # per rate, per k: top-k vs bottom-k by alpha")
    corr = res.get("correlations") or {}
    a1, a2 = st.columns([1.2, 1])
    with a1:
        share.chart(sf.alpha_histogram(alpha), "site-hist", key="site_alpha_hist", heads="")
    with a2:
        if corr:
            names = {"tr": "TR", "tl": "TL", "induction": "induction", "ltv": "LTV key-head saliency"}
            table = pd.DataFrame([{"map": names.get(k, k), "Spearman ρ": v.get("spearman"), "Kendall τ": v.get("kendall"),
                                   "top-k Jaccard": v.get("jaccard")} for k, v in corr.items()])
            st.markdown("**Rank correlation of α with the head maps**")
            share.dataframe("Correlations of α with the head maps", table, hide_index=True, key="site_corr", placeholder="—",
                         column_config={c: st.column_config.NumberColumn(format="%.2f") for c in table.columns[1:]})
            st.caption(f"Over all heads; the maps are the Head map's (8 shots, {min(int(res['prompts']), 50)} prompts, "
                       "this seed). "
                       + ("" if "ltv" in corr else "LTV's key-head saliency joins once an LTV result is cached."))

    with st.expander("Training curve", expanded=False):
        share.chart(sf.loss_curve(res.get("loss") or [], res.get("val") or [], res["steps"]), "site-loss",
                    key="site_loss", heads="")
        st.caption("Cross-entropy of the gold answer's first token: per step (one random zero-shot training prompt) and "
                   "on the validation prompts every 50 steps; the α of the lowest validation loss are kept.")

    # -- comparison ---------------------------------------------------------------------------------------------------------
    st.subheader("Comparison", divider="gray")
    share.chart(sf.comparison_bars(res, f"Zero-shot prompts: SITE against the baselines · {ctx_label}"),
                "site-compare", key="site_bars", heads="")
    rows = sf.comparison_rows(res)
    table = pd.DataFrame([{"method": r["method"], "accuracy %": None if r["accuracy"] is None else 100 * r["accuracy"],
                           "exact match %": None if r["exact_match"] is None else 100 * r["exact_match"],
                           "label accuracy %": None if r["label_accuracy"] is None else 100 * r["label_accuracy"],
                           "TR ratio %": None if r["tr_ratio"] is None else 100 * r["tr_ratio"],
                           "accuracy 95% interval": M.span(r.get("accuracy_ci")),
                           "exact match 95% interval": M.span(r.get("exact_match_ci")),
                           "parameters": r["params"], "trained": r["trainable"], "train s": r["seconds"],
                           "note": r["note"] or ""} for r in rows])
    share.dataframe("SITE against the baselines", table, hide_index=True, key="site_table", placeholder="—",
                 column_config={**pct_cols(table, ["accuracy %", "exact match %", "label accuracy %", "TR ratio %"]),
                                "train s": st.column_config.NumberColumn(format="%.1f")})
    st.caption("Accuracy: the first generated token is the gold answer's first token. Exact match: the generation, cut "
               "at the separator or a newline, begins with the whole gold answer. All on the same held-out queries.")

    # -- patching and budget ---------------------------------------------------------------------------------------------------
    p1, p2 = st.columns(2)
    refs = {"site": site["accuracy"], "zero_shot": zero["accuracy"] if zero else None}
    with p1:
        if res.get("patching"):
            share.chart(sf.patching_curves(res["patching"], refs), "site-patching", key="site_patching", heads="")
            pt = res["patching"]
            st.caption(f"t injected outright (α = 1) at the k heads with the largest or the smallest α only. At k = "
                       f"{pt['ks'][min(2, len(pt['ks']) - 1)]}: top {M.pct(pt['top']['accuracy'][min(2, len(pt['ks']) - 1)])}"
                       f", bottom {M.pct(pt['bottom']['accuracy'][min(2, len(pt['ks']) - 1)])} (the paper: 57.3 against 6.2).")
            j = min(2, len(pt["ks"]) - 1)
            tt = ((pt.get("tests") or {}).get("accuracy") or [None] * len(pt["ks"]))[j]
            if tt:
                st.caption(M.paired_text(tt, f"top-{pt['ks'][j]} vs bottom-{pt['ks'][j]} by α (paired, accuracy)") + ".")
    with p2:
        if res.get("budget"):
            share.chart(sf.budget_curve(res["budget"], {"icl": icl8["accuracy"] if icl8 else None}), "site-budget",
                        key="site_budget", heads="")
            st.caption("SITE retrained with M few-shot prompts in the task embedding (each a cached run).")

# -- transfer ---------------------------------------------------------------------------------------------------------------
st.subheader("Transfer across tasks", divider="gray")
tr_params = {"model": s.model, **recipe}
tr = run(jobs.Job("site_transfer", tr_params, "Transfer", "Transfer"),
         "Task A's α with task B's task embedding, on B's test prompts, for every pair of this model's built-in tasks",
         "A SITE run per task (cached); similar tasks should share heads.", "transfer",
         "Press **Run** to build the transfer matrix.")
if tr is not None:
    with guard("Transfer"):
        snippets.show("site_transfer", tr_params, "r.tasks, r.accuracy   # accuracy[a][b]: task a's alpha on task b")
        sm = tr.get("summary") or {}
        k = tr.get("top_k")
        modes = ["accuracy"] + (["accuracy_top_k"] if tr.get("accuracy_top_k") else [])
        which = st.segmented_control("Inject", modes, default="accuracy", key="w_site_transfer_mode", required=True,
                                     format_func=lambda m: "A's learned α" if m == "accuracy" else
                                     f"only A's top {k} heads (α = 1)") or "accuracy"
        share.chart(sf.transfer_heatmap(tr, which=which), "site-transfer", key="site_transfer", heads="")
        if which != "accuracy":
            st.caption(f"Only A's top {k} heads: own task **{M.pct(sm.get('own_top_k'))}**, another task "
                       f"**{M.pct(sm.get('others_top_k'))}** (same kind {M.pct(sm.get('same_kind_top_k'))}, the other "
                       f"kind {M.pct(sm.get('other_kind_top_k'))}); mean top-{k} overlap (Jaccard) "
                       f"{sm.get('top_k_overlap') or 0:.2f}.")
        st.caption(f"Own α (diagonal): **{M.pct(sm.get('own'))}**; another task's α: **{M.pct(sm.get('others'))}** "
                   f"(same kind of task {M.pct(sm.get('same_kind'))}, the other kind {M.pct(sm.get('other_kind'))}); "
                   f"no injection {M.pct(sm.get('zero_shot'))}, every α = 1 {M.pct(sm.get('all_ones'))}. Overlap of "
                   f"the heads with α > 0.5 against transfer accuracy, over pairs: Spearman "
                   f"{'n/a' if sm.get('overlap_vs_transfer_spearman') is None else format(sm['overlap_vs_transfer_spearman'], '.2f')}.")
        download("Transfer result (JSON)", tr, f"headlens-site-transfer-{s.model}.json", "dl_transfer")

# -- every steering method -------------------------------------------------------------------------------------------------
st.subheader("Every steering method", divider="gray")
me_params = s.job(**s.selection(), site_m=recipe["m"], site_shots=recipe["shots"], site_steps=recipe["steps"])
me = run(jobs.Job("compare_methods", me_params, "All methods", "All methods"),
         f"The extracted vectors (vanilla, function vector, top-TR / top-TL heads at the middle layer, "
         f"{s.shots} shots), LTV (when cached) and SITE on the same zero-shot prompts",
         "Accuracy, TR ratio, parameter count and training seconds side by side.", "methods",
         "Press **Run** to compare every method.")
if me is not None:
    with guard("All methods"):
        snippets.show("compare_methods", me_params, "r.rows   # one row per steering method: accuracy, TR ratio, parameters")
        share.chart(sf.methods_bars(me), "methods", key="site_methods_bars")
        mt = pd.DataFrame([{"method": r["name"], "family": r["family"],
                            "accuracy %": None if r.get("accuracy") is None else 100 * r["accuracy"],
                            "TR ratio %": None if r.get("tr_ratio") is None else 100 * r["tr_ratio"],
                            "label accuracy %": None if r.get("label_accuracy") is None else 100 * r["label_accuracy"],
                            "accuracy 95% interval": M.span(r.get("accuracy_ci")), "prompts": r.get("n"),
                            "parameters": r.get("params"), "trained": r.get("trainable"),
                            "train s": r.get("train_seconds"), "note": r.get("note")} for r in sf.methods_rows(me)])
        share.dataframe("Every steering method", mt, hide_index=True, key="site_methods_table", placeholder="—",
                     column_config={**pct_cols(mt, ["accuracy %", "TR ratio %", "label accuracy %"]),
                                    "train s": st.column_config.NumberColumn(format="%.1f")})
        for x in me.get("missing") or []:
            st.caption(f":material/info: {x}")
        has_ltv = any(r.get("key") == "ltv" for r in me.get("rows") or [])
        if not has_ltv and LTV_PAGE.is_file():  # only when there is none (it asked even with one cached)
            st.page_link("pages/5_Learned_task_vectors.py", label="Train an LTV on the Learned task vectors page",
                         icon=":material/model_training:", query_params=state.query())

download("SITE result (JSON)", res, f"headlens-site-{s.task}.json", "dl_site")
