"""Head map: layer x head maps of TR, TL, DLA-TR, DLA-TL and induction (and the CIE, from kind `activation_patching`) with
their top heads outlined; click heads to select them and to drill into one (its attention pattern, every head of its
layer, per-label DLA and ablation effect on a prompt); activation patching from the clean prompts into 0-shot or
perturbed ones beside the TR / TL maps; and the map side by side with another task, model or seed."""
from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from ui import (compare, figures, fit, head_view, heads, jobs, layout, map_colors, path_patching, settings, share,
                snippets, state)
from ui import metrics as M
from ui.sections import download, guard, icl_metrics, run
from ui.tsla import anytime, map_uncertainty as mu, patching_figures as pf

s, caps = layout.page_setup("Head map", ":material/grid_on:")
st.title(":material/grid_on: Head map")
st.caption("Every attention head scored on the task's prompts, at the last token (means over prompts). "
           "Click a cell to select or unselect a head and drill into it; drag a box or lasso (toolbar) to add many.")
layout.need_task(s)
fit.check(s)

score_params = s.job(**s.selection())
# an anytime map: while the heads are scored, the map so far (marked "partial: 8 of 50 prompts") below the bar
partial = anytime.PartialView("hm")
scores = jobs.fetch("head_scores", score_params, "Scoring heads", what="Head scores",
                    on_live=anytime.map_drawer(partial, lambda: state.get().map or "tr",
                                               figures.subtitle(figures.caption(s.model, s.task_title, s.shots))))
partial.clear()
if scores is None:
    st.stop()
jobs.show_warnings(scores)
L, H = layout.fit_shape(scores, prompts=True)
selected = heads.current(L, H)
ctx = figures.subtitle(figures.caption(s.model, s.task_title, scores["shots"], int(scores["top_k"])))

k_shot, zero = scores["icl"], scores.get("zero_shot")
m = st.columns(5)
icl_metrics(m, scores, "Accuracy", {"layers x heads": f"{L} x {H}", "prompts": scores["prompts"],
                                    "top-head set": scores["top_k"]})
m[3].metric("Heads", f"{L} × {H}", help="layers × heads per layer", border=True)
m[4].metric("Selected", f"{len(selected)}", border=True)
if zero is not None:
    st.caption(f"TR ratio **{M.pct(zero['tr_ratio'])}** with 0 shots → **{M.pct(k_shot['tr_ratio'])}** with "
               f"{scores['shots']}: the demonstrations make the model answer with a label word. Accuracy "
               f"{M.pct(zero['accuracy'])} → {M.pct(k_shot['accuracy'])}, label accuracy "
               f"{M.pct(zero['label_accuracy'])} → {M.pct(k_shot['label_accuracy'])}. Head scores {jobs.timing(scores)}.")

# -- the selectable map -------------------------------------------------------------------------------------
state.bind(st.segmented_control, "Map", "map", options=[*figures.METRICS, *figures.EXTRA_MAPS],
           format_func=lambda k: figures.map_spec(k)["label"], required=True,
           help="The five maps of the head scores, and the CIE: activation patching of each head (computed when "
                "picked: one patched pass per head).")
metric = state.get().map or "tr"
maps = {k: scores[k] for k in figures.METRICS}
cie_params = s.job(**s.selection(), target="shuffled_inputs", patch="mean")
cie = (jobs.fetch("activation_patching", cie_params, "Causal indirect effects (patching every head)", what="CIE map",
                  slot="cie") if metric == "cie" else jobs.peek("activation_patching", cie_params, ask_service=False))
if cie is not None:
    jobs.show_warnings(cie)
    maps["cie"] = cie["prob_gain"]
if metric not in maps:
    metric = "tr"
main, side = st.columns([3, 1.25], gap="medium")
with main:
    spec = figures.map_spec(metric)
    top = {"tr": scores.get("top_tr"), "tl": scores.get("top_tl")}.get(metric) or int(scores["top_k"])
    tested = mu.significant(scores, metric) is not None
    untested = mu.too_few(scores) or "Only the TR and TL maps have a test against a null."
    sig_only = state.bind(st.toggle, "Significant heads only", "sig_only", disabled=not tested,  # in the link
                          help="Leave blank the heads whose Benjamini-Hochberg q exceeds the FDR (0.05): TR tested "
                               "against TR onto random label subspaces of the same size, TL against per-prompt TL "
                               "centred on 0." if tested else untested)
    cscale = state.bind(st.segmented_control, "Colour scale", "cscale", options=list(map_colors.SCALES),
                        required=True, help="How values become colours, here and in *All five maps*: linear; log "
                        "(symmetric, sign kept); rank; or linear clipped at the 95th percentile of |value|, so one "
                        "head far above the rest no longer makes every other cell look alike. Hover: the values.")
    fig = figures.head_heatmap(maps[metric], metric, selected=selected, top=top, scale=cscale,
                               title=f"{spec['label']}: {spec['long']}{ctx}")
    mu.annotate(fig, scores, metric, significant_only=bool(sig_only) and tested)
    share.chart(fig, f"headmap-{metric}", key=heads.chart_key("hm"), on_select=heads.on_chart_select("hm"),
                selection_mode=("points", "box", "lasso"))
    st.caption(spec["caption"] + f" Outlined ({figures.TOP_COLOR_NAME}): the top {len(figures.top_set(maps[metric], top))} "
               f"heads of this map ({s.top_label()}; the sidebar's *Top heads*). "
               + ("" if cscale == "linear" else f"Colours: {map_colors.SCALES[cscale]} (hover: the values). ")
               + mu.caption(scores, metric, bool(sig_only) and tested))
    if metric == "cie":
        st.caption(f"{cie['prompts']} prompts, {cie['shots']} shots · {jobs.timing(cie)}. The same kind patches "
                   "into other prompt sets below (*Activation patching*).")
with side:
    selected = heads.multiselect(L, H)
    heads.quick_picks(scores, L, H, key="hm", compact=True)
    if selected:
        st.page_link("pages/2_Ablation.py", label="Ablate this head" if len(selected) == 1 else
                     f"Ablate these {len(selected)} heads", icon=":material/power_settings_new:",
                     query_params=state.query())
    if metric == "cie":
        snippets.show("activation_patching", cie_params, "r.prob_gain        # the CIE, numpy (layers, heads)\nr.recovered, r.top")
    else:
        snippets.show("head_scores", score_params, f"r.{metric}        # numpy (layers, heads)\n"
                                              + (f"r.stats['{metric}'].se, .ci_low, .ci_high, .p, .q, .significant\n"
                                                 if metric in (scores.get("stats") or {}) else "")
                                              + (f"r.stats['{metric}'].significant   # the heads shown "
                                                 "(Significant heads only)\n" if sig_only and tested else "")
                                              + "r.top_tr, r.top_tl, r.overlap, r.stability, r.stable_tr")
    st.caption(":material/photo_camera: Every figure's toolbar (top right, on hover) has a camera button that saves "
               "it as a PNG at 2× resolution or an SVG (the sidebar's *Figure files*); its title and file name say "
               "what it was computed on.")

# -- attribution patching beside the exact CIE map ---------------------------------------------------------------
st.subheader("Attribution patching (AtP)", divider="gray")
st.caption("The CIE map to first order: each head's patch (mean clean z into the shuffled-input prompts) estimated as "
           "(z_clean − z_corrupt) · ∂p(gold)/∂z from one backward pass for all heads, beside the exact map of the "
           "same prompts and how far they agree.")
atp_params = s.job(**s.selection(), target="shuffled_inputs", patch="mean")  # the CIE map's setup (`cie_params`)
atp = run(jobs.Job("attribution_patching", atp_params, "Attribution patching", "AtP map", slot="atp"),
          f"Estimate all **{L * H}** heads' CIE from a pass of the clean and the target prompts and **one** "
          f"backward pass (the last token's) · "
          f"**{scores['prompts']}** prompts · with the exact CIE map to compare (cached when the *CIE* map was shown)",
          "AtP: Nanda 2022. The exact map runs one patched step per head and prompt.", "atp",
          "Press **Run** to estimate every head's CIE by attribution patching.", estimate=False)
if atp is not None:
    with guard("Attribution patching"):
        ag = atp.get("agreement") or {}
        q = st.columns(4)
        tau = "—" if ag.get("kendall") is None else f"{ag['kendall']:.2f}"
        q[0].metric("Spearman ρ with exact", "—" if ag.get("spearman") is None else f"{ag['spearman']:.2f}",
                    border=True, help=f"Rank correlation of the AtP estimate with the exact CIE over all heads; "
                                      f"Kendall τ {tau}.")
        q[1].metric(f"Top-{atp['top_k']} recall", "—" if not ag else M.pct(ag["recall"]), border=True,
                    help="The share of the exact map's top heads that are among AtP's top heads.")
        q[2].metric("Cost ratio (planned)", "—" if not ag else f"{ag['planned_ratio']:.0f}×", border=True,
                    help="Exact patching's work over AtP's, in the cost model's units (tokens, calls).")
        q[3].metric("Cost ratio (CPU s)", "—" if ag.get("cpu_ratio") is None else f"{ag['cpu_ratio']:.0f}×",
                    border=True, help=f"Exact over AtP in CPU seconds (AtP {atp['cpu_seconds']:.2g} s); — when the "
                                      "exact map came from the cache.")
        share.numbers("Attribution patching", {"metric": atp["metric"], "Spearman with exact": ag.get("spearman"),
                                               "top-k recall": ag.get("recall"), "planned cost ratio":
                                               ag.get("planned_ratio"), "CPU cost ratio": ag.get("cpu_ratio")})
        row = [("cie", atp["atp"], "AtP estimate of the CIE")]
        if ag:
            row.append(("cie", ag["exact"], "Exact CIE"))
        share.chart(figures.maps_row(row, selected, f"AtP beside the exact CIE{ctx}", shared_scale=True,
                                     top=[atp.get("top") or [], *([ag.get("exact_top") or []] if len(row) > 1 else [])]),
                    "atp-cie", key="atp_maps")
        missed = ", ".join(figures.head_name(h) for h in ag.get("missed") or [])
        st.caption("One colour scale; outlined: each map's top heads. "
                   + (f"Exact top heads AtP misses: **{missed}**. " if missed else
                      "AtP finds every one of the exact top heads. " if ag else "")
                   + f"AtP's standard errors and 95% bootstrap intervals over prompts: `r.atp_se`, `r.atp_lo`, "
                   f"`r.atp_hi`. " + jobs.timing(atp) + ".")
        snippets.show("attribution_patching", atp_params, "r.atp            # numpy (layers, heads)\n"
                                                          "r.agreement.spearman, .recall, .missed, .planned_ratio")

# -- patching at any site and position ----------------------------------------------------------------------------
st.subheader("Patching at any site and position", divider="gray")
st.caption("Exact activation patching beyond single heads at the last token: a site's clean activation at each layer "
           "and position (named by role, since prompts differ in length) patched into the corrupted prompts, and "
           "each head's z at one chosen position. Each cell: the share of the clean-minus-corrupted gold logit it "
           "recovers, ± its standard error over prompts.")
if st.toggle("Patch a site at every layer and position role", key="w_sp",
             help="Opens the section (closed, the page asks the service for nothing of it)."):
    sp1, sp2, sp3 = st.columns(3, vertical_alignment="bottom")
    with sp1:
        sp_site = st.selectbox("Site", ["resid_pre", "attn_out", "mlp_out", "z"], key="w_sp_site",
                               help="resid_pre: the layer's input (0: the embeddings); attn_out / mlp_out: what "
                                    "its attention / MLP adds to the residual stream (Gemma 2 / 3: after their "
                                    "post-norms); z: every head's input to the output projection.")
    with sp2:
        sp_target = st.selectbox("Patched into", ["random_labels", "zero_shot", "shuffled_inputs", "flipped_labels"],
                                 format_func=lambda t: t.replace("_", " "), key="w_sp_target",
                                 help="The corrupted prompts: the same queries with random or flipped demonstration "
                                      "labels, shuffled inputs, or no demonstrations.")
    with sp3:
        sp_pos = st.selectbox("Heads map at", ["last", "query", "separator", "label"], key="w_sp_position",
                              help="The position of the layer × head map: the last token, the query's tokens, the "
                                   "separators, or every demonstration's label tokens.")
    sp_params = s.job(target=sp_target, site=sp_site, view="both", position=sp_pos)
    sp = run(jobs.Job("site_patching", sp_params, "Patching sites and positions", "Site patching",
                      slot="site_patching"),
             f"Patch **{sp_site}** at every layer and position role, and each head's z at **{sp_pos}**, from the "
             f"clean prompts into the **{sp_target.replace('_', ' ')}** ones · **{s.prompts}** prompts",
             "One pass of a corrupted prompt per cell, from the patched layer on.", "site_patching",
             "Press **Run** for the layer × position and layer × head maps.")
    if sp is not None:
        with guard("Site patching"):
            import plotly.graph_objects as go

            rows = [f"L{l}" for l in sp["layers"]]

            def sp_heat(z, se, x, title, xtitle):
                z, se = np.asarray(z, dtype=float), np.asarray(se, dtype=float)
                text = [[f"{a:.3f} ± {b:.3f}" for a, b in zip(zr, sr)] for zr, sr in zip(z, se)]
                fig = go.Figure(go.Heatmap(z=z, x=x, y=rows, customdata=text, colorscale="RdBu", zmid=0, xgap=1,
                                           ygap=1, hovertemplate="%{y} %{x}: %{customdata}<extra></extra>"))
                fig.update_layout(title=title, yaxis_autorange="reversed", xaxis_title=xtitle, yaxis_title="layer")
                return figures.style_figure(fig, 460)

            q = st.columns(3)
            q[0].metric("Clean gold logit", f"{sp['clean_logit']:.3f}", border=True)
            q[1].metric("Corrupted gold logit", f"{sp['target_logit']:.3f}", border=True)
            q[2].metric("Gap to recover", f"{sp['gap']:.3f}", border=True,
                        help="Clean minus corrupted mean gold logit: what a patch can recover (recovered 1 = all "
                             "of it).")
            left, right = st.columns(2)
            left.plotly_chart(sp_heat(sp["recovered"], sp["recovered_se"], sp["columns"],
                                      f"{sp['site']}: layer × position, recovered share{ctx}", "position (role)"),
                              key="sp_positions")
            right.plotly_chart(sp_heat(sp["head_recovered"], sp["head_recovered_se"], [f"H{h}" for h in range(H)],
                                       f"z at {sp['position']}: layer × head, recovered share{ctx}", "head"),
                               key="sp_heads")
            share.numbers("Site patching", {"site": sp["site"], "target": sp["target"], "gap": sp["gap"],
                                            "heads map position": sp["position"]})
            st.caption("Positions are paired from the end of each role between a clean prompt and its corrupted one; "
                       "tokens patched per prompt: " + ", ".join(f"{c} {t:g}" for c, t in zip(sp["columns"],
                                                                                         sp["tokens"]))
                       + f"; heads map {sp['head_tokens']:g}. Hover: recovered ± SE. " + jobs.timing(sp) + ".")
        snippets.show("site_patching", sp_params, "r.recovered, r.recovered_se   # numpy (layers, positions); "
                                                  "r.columns\nr.head_recovered, r.head_recovered_se   # numpy "
                                                  "(layers, heads)")

path_patching.section(s, scores, L, H, ctx)  # a top head's paths into the top TL heads' q / k / v (ui/path_patching.py)

# -- drill-down: the clicked head ---------------------------------------------------------------------------------
drill = state.value("head")
if drill is not None and not (0 <= drill[0] < L and 0 <= drill[1] < H):
    drill = None
st.subheader("Drill down into one head", divider="gray")
if drill is None:
    st.info("Click a cell of the map to see that head's attention pattern, its write onto each label and what "
            "ablating it does on one prompt.", icon=":material/touch_app:")
else:
    d1, d2, d3, d4 = st.columns([1.2, 1, 1.3, 2], vertical_alignment="bottom")
    with d1:
        state.bind(st.selectbox, "Head", "head", options=[(l, h) for l in range(L) for h in range(H)],
                   format_func=figures.head_name, to_widget=lambda v: tuple(v))
    with d2:
        state.bind(st.number_input, "Prompt", "prompt", min_value=0, max_value=max(int(scores["prompts"]) - 1, 0),
                   step=1, help="Which of the task's prompts (0-based; the same prompts the maps average over).")
    with d3:
        state.bind(st.toggle, "All heads of this layer", "grid",
                   help="Every head of the layer's attention pattern at once, a grid of small maps (CircuitsVis).")
    with d4:
        st.page_link("pages/4_Head.py", label="Open the full drill-down (your own prompt, logit lens)",
                     icon=":material/open_in_new:", query_params=state.query())
    drill, prompt = tuple(state.value("head")), min(int(state.value("prompt")), max(int(scores["prompts"]) - 1, 0))
    hp = head_view.job_params(s, drill, prompt, None, False, bool(state.value("grid")))
    hv = jobs.fetch("head_view", hp, f"Drilling into {figures.head_name(drill)}", what="Head drill-down")
    if hv is not None:
        head_view.render(hv, s, hp, L * H, compact=True, key="hm_drill")

if state.bind(st.toggle, "All five maps side by side", "all_maps",
              help="Each map on its own colour scale, with its colour bar (drawn on demand: five more heatmaps)."):
    share.chart(figures.all_maps(scores, selected, f"All five maps{ctx}", scale=cscale), "headmaps-all",
                key="all_maps")
    st.caption(" · ".join(f"{v['caption']}" for k, v in figures.METRICS.items() if k != metric))

# -- activation patching ----------------------------------------------------------------------------------------
st.subheader("Activation patching", divider="gray")
st.caption("Each head's last-token z taken from the clean ICL prompts and written into another prompt set with the "
           "same queries, one head at a time: how much of the gold answer's logit does that head alone bring back?")
if state.bind(st.toggle, "Patch every head from the clean prompts into 0-shot or perturbed ones", "pt",
              help="Activation patching (TransformerLens' most used analysis; SITE's patching experiment), beside the "
                   "TR and TL maps. Off: nothing of it is drawn (a link with it on reopens it)."):
    c1, c2 = st.columns([1.6, 1])
    with c1:
        state.bind(st.segmented_control, "Patch into", "pt_target", options=state.options("pt_target"),
                   format_func=pf.TARGETS.get, required=True,
                   help=settings.help_text("pt_target", "Random and flipped labels: binary tasks."))
    with c2:
        state.bind(st.segmented_control, "Source activation", "pt_patch", options=state.options("pt_patch"),
                   format_func=pf.PATCHES.get, required=True,
                   help=settings.help_text("pt_patch", "Paired is activation patching; mean, the function vector's "
                                                       "causal indirect effect."))
    target, patch = state.value("pt_target"), state.value("pt_patch")
    pt_params = s.job(**s.selection(), target=target, patch=patch)
    pt = run(jobs.Job("activation_patching", pt_params, "Patching heads", "Activation patching", slot="patching"),
             f"Patch every one of the **{L * H}** heads from the **{scores['shots']}-shot** prompts into "
             f"**{pf.TARGETS[target]}** · source: {pf.PATCHES[patch]} · **{scores['prompts']}** prompts",
             "One patched pass per head and prompt, each one token over the target's cached prefix. "
             "Cached: a link reopens it at once.", "patching", "Press **Run** to patch every head.", estimate=False)
    if pt is not None:
        with guard("Activation patching"):
            ov = pt.overlap
            q = st.columns(5)
            q[0].metric("Gold logit, clean", f"{pt['clean_logit']:.3g}", border=True,
                        help=f"Mean logit of the gold answer's first token on the {pt['shots']}-shot prompts.")
            q[1].metric(f"Gold logit, {pf.TARGETS[pt['target']]}", f"{pt['target_logit']:.3g}", border=True,
                        delta=f"{-pt['gap']:+.3g}", help="The same on the target prompts; the arrow: the gap to recover.")
            q[2].metric(f"Accuracy, {pf.TARGETS[pt['target']]}", M.pct(pt["target_metrics"]["accuracy"]), border=True,
                        delta=M.points(pt["target_metrics"]["accuracy"], pt["clean"]["accuracy"]),
                        help=f"Accuracy on the clean prompts: {M.pct(pt['clean']['accuracy'])} (the arrow: the change).")
            q[3].metric("Spearman ρ with TR", "—" if (ov.get("tr") or {}).get("spearman") is None else
                        f"{ov['tr']['spearman']:.2f}", border=True,
                        help=f"Rank correlation of the recovered share with the TR map over all heads; top-{pt['top_k']} "
                             f"Jaccard {f'{ov.tr.jaccard:.2f}' if 'tr' in ov else '—'}.")
            q[4].metric("Spearman ρ with TL", "—" if (ov.get("tl") or {}).get("spearman") is None else
                        f"{ov['tl']['spearman']:.2f}", border=True,
                        help=f"The same with the TL map; top-{pt['top_k']} Jaccard "
                             f"{f'{ov.tl.jaccard:.2f}' if 'tl' in ov else '—'}.")
            share.numbers("Activation patching", {"target": pt["target"], "patch": pt["patch"],
                                                  "gold logit, clean": pt["clean_logit"],
                                                  "gold logit, target": pt["target_logit"], "gap": pt["gap"],
                                                  "Spearman with TR": (ov.get("tr") or {}).get("spearman"),
                                                  "Spearman with TL": (ov.get("tl") or {}).get("spearman")})
            share.chart(pf.patching_maps(pt, scores, selected, f"Recovered share of the gold logit, beside TR and TL{ctx}"),
                        f"patching-{pt['target']}-{pt['patch']}", key="patching_maps")
            st.caption(figures.map_spec("recovered")["caption"] + " Outlined: each map's top "
                       f"{pt['top_k']} heads. " + jobs.timing(pt) + ".")
            prow = pd.DataFrame(pf.top_rows(pt, scores, n=min(10, L * H)))
            share.table("Top heads by recovered share", prow)
            st.dataframe(prow, hide_index=True, key="patching_table",
                         column_config={"recovered %": st.column_config.NumberColumn(format="%.1f"),
                                        "logit gain": st.column_config.NumberColumn(format="%.3g"),
                                        "p(gold) gain": st.column_config.NumberColumn(format="%.3g")})
            snippets.show("activation_patching", pt_params, "r.recovered, r.logit_gain, r.prob_gain   # numpy (layers, heads)\n"
                                                 "r.top, r.overlap")

# -- side by side -------------------------------------------------------------------------------------------------
st.subheader("Side by side", divider="gray")
if state.bind(st.toggle, "Compare this map with another run: another task, model or seed", "cmp",
              help="The same map of a second run, the difference A − B and their rank correlation (SITE's task "
                   "specificity, TSLA's cross-dataset consistency)."):
    cmp_metric = metric if metric in figures.METRICS else "tr"
    presets = [p["name"] for p in caps.get("presets", []) if p.get("converted") or p.get("pulled")]
    loaded = [x["name"] for x in caps.get("loaded_models", []) if x.get("name")]
    b_model = state.value("cmp_model") or s.model
    models = list(dict.fromkeys([s.model, "default", *presets, *loaded, b_model]))
    b1, b2, b3 = st.columns([1.2, 1.6, 0.8])
    with b1:
        state.bind(st.selectbox, "B: model", "cmp_model", options=models, to_widget=lambda v: v or s.model,
                   from_widget=lambda v: None if v == s.model else v)
    b_model = state.value("cmp_model") or s.model
    ids, info = layout.task_options(caps, b_model, state.value("cmp_task") or s.task)
    with b2:
        state.bind(st.selectbox, "B: task", "cmp_task", options=ids, to_widget=lambda v: v or s.task,
                   format_func=lambda i: layout.task_label(info[i], b_model),
                   from_widget=lambda v: None if v == s.task else v)
    with b3:
        state.bind(st.number_input, "B: seed", "cmp_seed", **settings.widget_bounds("seed"), step=1,
                   to_widget=lambda v: s.seed + 1 if v is None else int(v))
    b_task = state.value("cmp_task") or s.task
    b_seed = s.seed + 1 if state.value("cmp_seed") is None else int(state.value("cmp_seed"))
    b_params = {**score_params, "model": b_model, "task": b_task, "seed": b_seed}
    label_a = f"A: {s.model} · {s.task_title} · seed {s.seed}"
    label_b = f"B: {b_model} · {layout.task_info(caps, b_task).get('filename') or b_task} · seed {b_seed}"
    if b_params == score_params:
        st.info("B is A: pick another task, model or seed for B.", icon=":material/compare_arrows:")
    else:
        other = run(jobs.Job("head_scores", b_params, "Scoring B", "Map B", slot="compare"),
                    f"**{figures.map_spec(cmp_metric)['label']}** of **{label_a}** against **{label_b}**",
                    "B's head scores on the same shots, prompts and top-head size (cached ones show at once).",
                    "compare", "Press **Run** to score B.", estimate=False)
        if other is not None:
            with guard("Side by side"):
                c = compare.compare_maps(scores[cmp_metric], other[cmp_metric], int(scores["top_k"]))
                n = st.columns(4)
                n[0].metric("Spearman ρ (A, B)", "—" if c["spearman"] is None else f"{c['spearman']:.3f}", border=True,
                            help="Rank correlation over all heads (same shape) or over the layer profiles at "
                                 "relative depth (two models).")
                n[1].metric("Kendall τ (A, B)", "—" if c["kendall"] is None else f"{c['kendall']:.3f}", border=True)
                n[2].metric(f"Top-{c['k']} Jaccard", "—" if c["jaccard"] is None else f"{c['jaccard']:.2f}",
                            border=True, help="Overlap of A's and B's top heads (same shape only).")
                n[3].metric("max |A − B|", f"{c['max_abs_diff']:.3g}", border=True)
                share.numbers("Side by side", {"A": label_a, "B": label_b, "map": cmp_metric,
                                               "Spearman": c["spearman"], "Kendall": c["kendall"],
                                               "Jaccard": c["jaccard"], "max |A - B|": c["max_abs_diff"]})
                if c["same_shape"]:
                    share.chart(figures.maps_row([(cmp_metric, scores[cmp_metric], figures.esc(label_a)),
                                                  (cmp_metric, other[cmp_metric], figures.esc(label_b)),
                                                  ("diff", c["diff"], "A − B")], selected,
                                                 f"{figures.map_spec(cmp_metric)['label']}: A, B and A − B{ctx}",
                                                 top=[c["top_a"], c["top_b"], None], shared_scale=True),
                                f"compare-{cmp_metric}", key="compare_maps")
                    st.caption(f"A and B on one colour scale, each with its top {c['k']} heads outlined; A − B on "
                               "a diverging scale centred at 0. " + jobs.timing(other) + ".")
                else:
                    share.chart(compare.profile_figure(c, label_a, label_b, figures.map_spec(cmp_metric)["label"]),
                                f"compare-{cmp_metric}-depth", key="compare_profile")
                    st.caption(f"A has {L} × {H} heads and B {other['n_layers']} × {other['n_heads']}: heads do not "
                               "pair, so each layer's mean is compared at its relative depth (layer / (layers − 1)). "
                               + jobs.timing(other) + ".")

# -- tables ------------------------------------------------------------------------------------------------------
rows = []
rk = {k: figures.ranks(np.asarray(v, dtype=float)) for k, v in maps.items()}
extra = mu.table_columns(scores)  # each map's SE, CI, and TR's and TL's p, q and top-k stability
for l in range(L):
    for h in range(H):
        row = {"head": figures.head_name((l, h)), "layer": l, "index": h}
        for k in maps:
            row[k] = float(np.asarray(maps[k], dtype=float)[l, h])
            row[f"{k}_rank"] = int(rk[k][l, h])
        row.update({c: float(v[l, h]) for c, v in extra.items()})
        row["selected"] = (l, h) in selected
        rows.append(row)
table = pd.DataFrame(rows)

st.subheader("Top heads", divider="gray")
c1 = st.container()  # the table at full width (in a column its rank columns were clipped)
with c1:
    if not 1 <= int(state.value("top_n")) <= L * H:
        state.put("top_n", min(10, L * H))
    n = state.bind(st.slider, "How many", "top_n", min_value=1, max_value=L * H)
    top = table.sort_values(f"{metric}_rank").head(n)
    cfg = {k: st.column_config.NumberColumn(figures.map_spec(k)["label"], format="%.4g") for k in maps}
    cfg.update({f"{k}_rank": st.column_config.NumberColumn(f"{figures.map_spec(k)['label']} rank", format="%d")
                for k in maps})
    cfg["selected"] = st.column_config.CheckboxColumn("sel.")
    cfg.update({c: st.column_config.NumberColumn(c.replace("_", " "), format="%.3g") for c in extra})
    mine = [c for c in (f"{metric}_se", f"{metric}_q", f"{metric}_stability") if c in extra]
    order = ["head", metric, f"{metric}_rank", *mine, *[c for k in maps if k != metric for c in (k, f"{k}_rank")],
             "selected"]
    st.dataframe(top, hide_index=True, column_config=cfg, key="top_table", column_order=order)
    # the file's table: every interval and test column of this map (SE, CI, p, q, stability), then the others
    share.table(f"Top {n} heads by {figures.map_spec(metric)['label']}", top,
                [*order[:3], *mu.stat_columns(metric, extra), *[c for c in order[3:] if c not in mine]])
    st.caption(f"Sorted by {figures.map_spec(metric)['label']}; rank 1 = largest of {L * H}.")
c2, c3 = st.columns([1, 1], gap="large")
with c2:
    ov = scores.overlap
    names = {"tr_tl": "TR vs TL", "tr_induction": "TR vs induction", "tl_induction": "TL vs induction"}
    odf = pd.DataFrame([{"pair": names.get(k, k), "Jaccard": v.get("jaccard"), "Spearman ρ": v.get("spearman"),
                         "Kendall τ": v.get("kendall")} for k, v in ov.items()])
    st.markdown("**Overlap between rankings**")
    share.table("Overlap between rankings", odf)
    st.dataframe(odf, hide_index=True, key="overlap_table", placeholder="—",
                 column_config={c: st.column_config.NumberColumn(format="%.3f")
                                for c in ("Jaccard", "Spearman ρ", "Kendall τ")})
    n_top = int(scores.top_k)
    st.caption(f"Jaccard: overlap of the top-head sets ({s.top_label()}: {n_top} head{'s' if n_top != 1 else ''} "
               "each). Spearman and Kendall: rank correlation over all heads.")
with c3:
    # the subtitle without the top-set size: the title's own count is the one that holds
    share.chart(figures.layer_distribution(scores, n, f"Layer of the top {n} heads" + figures.subtitle(
        figures.caption(s.model, s.task_title, scores["shots"]))), "layer-distribution",
                key="layer_dist", heads=f"top{n}")

# -- downloads -----------------------------------------------------------------------------------------------------
st.subheader("Download", divider="gray")
stem = f"headlens-{s.task}-{s.shots}shot-seed{s.seed}".replace(":", "-").replace("/", "-")
d = st.columns(3)
d[0].download_button("Per-head table (CSV)", table.to_csv(index=False).encode(), f"{stem}-heads.csv",
                     "text/csv", icon=":material/table:", key="dl_csv", on_click="ignore")
with d[1]:
    download("Full result (JSON)", scores, f"{stem}-scores.json", "dl_json")
d[2].caption("Figures: the camera button in each figure's toolbar saves a PNG or an SVG; *Share as HTML* (sidebar) "
             "saves the whole page as one file.")
