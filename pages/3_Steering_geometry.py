"""Steering & geometry: inject task vectors built from heads into zero-shot prompts, follow the hidden states
through the layers against the label subspace, and perturb the demonstrations.

Three service jobs, each cached by the service and run with a progress bar and a Cancel button: `steer`,
`geometry`, `perturb`. A section computes once its Run button is pressed and then follows the settings; a result
the service already has (a shared link) shows at once. Every setting is in the URL (`sg_*` fields).
"""
from __future__ import annotations


import pandas as pd
import streamlit as st

from ui import figures, fit, heads, jobs, layout, settings, share, snippets, state
from ui.sections import download, guard, run
from ui import metrics as M
from ui.tsla import perturbation_figures as pf
from ui.tsla import steering_figures as sf

VECTOR_HELP = {
    "tr": "the summed last-token writes of the top TR heads",
    "tl": "the summed last-token writes of the top TL heads",
    "random": "as many random heads (seeded; drawn from the heads in neither top set)",
    "fv": "function vector: the top heads by causal indirect effect (patching into shuffled-label prompts)",
    "vanilla": "the ICL hidden state minus the zero-shot one at the injection layer's input",
    "custom": "the heads selected on the Head map (or below)",
}


s, caps = layout.page_setup("Steering & geometry", ":material/explore:")
PERTURBATIONS = state.options("sg_perturbations")  # the perturb kind's
st.title(":material/explore: Steering & geometry")
st.caption("Add a task vector built from heads to zero-shot prompts and see whether it restores in-context "
           "learning; follow the hidden states through the layers; perturb the demonstrations and see which "
           "heads still matter.")
layout.need_task(s)
fit_result = fit.check(s) or {}

L, H = layout.fit_shape(layout.needed("model_info", {"model": s.model}, "Loading the model", "Model"))
ctx = figures.subtitle(figures.caption(s.model, s.task_title, s.shots, s.top_label()))

# -- settings shared by the sections (all in the URL) ------------------------------------------------------------

st.subheader("Vectors", divider="gray")
selected = heads.current(L, H)
options = state.vector_types() if selected else state.options("sg_vectors")
vecs_now = [v for v in state.value("sg_vectors") if v in options]
seen = st.session_state.get("_hl_sg_custom_for")
if seen is None and state.opened_from_link():
    st.session_state["_hl_sg_custom_for"] = selected  # a shared link: its vector types exactly as they are
elif selected and seen != selected:
    st.session_state["_hl_sg_custom_for"] = selected
    if "custom" not in vecs_now:
        vecs_now.append("custom")  # a new selection (e.g. from the Head map) joins the comparison
if vecs_now != state.value("sg_vectors"):
    state.put("sg_vectors", vecs_now)
state.bind(st.multiselect, "Vector types", "sg_vectors", options=options, format_func=sf.vector_name,
           placeholder="Pick at least one",
           help=" · ".join(f"{sf.vector_name(k)}: {v}" for k, v in VECTOR_HELP.items() if k in options))
c2, c3, _ = st.columns([1.3, 1, 2], vertical_alignment="bottom")
with c2:
    state.bind(st.selectbox, "Injection layer", "sg_layer", options=[*range(L), "all"],
               to_widget=lambda v: L // 2 if v is None else v, from_widget=lambda v: None if v == L // 2 else v,
               format_func=lambda l: "all (layer sweep)" if l == "all"
               else f"layer {l}" + (" (middle)" if l == L // 2 else ""),
               help="The vector is added to the residual stream at the input of this decoder layer (layer 0: the "
                    "embeddings), at the last token, as on every page. `all` sweeps every layer.")
with c3:
    state.bind(st.number_input, "α (scale)", "sg_alpha", **settings.widget_bounds("sg_alpha"), step=0.5, format="%.2f",
               help="The vector is added as α·v. α = 0 leaves the model untouched.")
with st.expander(f"Selected heads ({len(selected)}): the custom vector", icon=":material/touch_app:",
                 expanded=False):
    selected = heads.multiselect(L, H, label="Selected heads")
    st.caption("The selection is shared with the Head map and Ablation pages; the vector of the selected heads is "
               "their summed last-token writes, like the TR and TL vectors.")
    st.page_link("pages/1_Head_map.py", label="Pick heads on the Head map", icon=":material/grid_on:",
                 query_params=state.query())
vectors = [v for v in state.value("sg_vectors") if v in options]
if not selected:
    vectors = [v for v in vectors if v != "custom"]
layer = L // 2 if state.value("sg_layer") is None else state.value("sg_layer")
alpha = float(state.value("sg_alpha"))
st.caption(f"Vectors come from ICL prompts of another seed than the ones evaluated; head sets are the "
           f"{s.top_label()} by each score (the sidebar's *Top heads*).")

# -- steering ------------------------------------------------------------------------------------------------------
st.subheader("Steering", divider="gray")
if not vectors:
    st.info("Pick at least one vector type above.", icon=":material/arrow_upward:")
    steer = None
else:
    ask = [v for v in vectors if v != "custom"] or ["random"]  # the service wants one built-in type
    steer_params = s.job(vectors=ask, layer=layer, alpha=alpha, **s.selection(),
                         **({"heads": [list(h) for h in selected]} if "custom" in vectors else {}))
    where = "every layer (a sweep)" if layer == "all" else f"layer {layer}"
    steer = run(jobs.Job("steer", steer_params, "Steering", "Steering"),
                f"**{len(vectors)}** vector type{'s' if len(vectors) != 1 else ''} at {where}, α = {alpha:g} · "
                f"**{s.shots}** shots · **{s.prompts}** prompts",
                "Zero-shot prompts with α·v added at the last token; compared with zero-shot and ICL.", "steer",
                "Press **Run** to inject the vectors.")
if steer is not None:
    with guard("Steering"):
        layers = [int(l) for l in steer["layers"]]
        idx = 0
        if len(layers) > 1:
            share.chart(sf.steer_sweep(steer, vectors, f"Layer sweep, α = {alpha:g}{ctx}"), "steer-sweep",
                        key="steer_sweep")
            best = max(range(len(layers)), key=lambda i: max(
                (steer["vectors"][v]["accuracy"][i] for v in vectors if v in steer["vectors"]), default=0))
            at = state.bind(st.select_slider, "Bars at layer", "sg_bar_layer", options=layers,
                            to_widget=lambda v: v if v in layers else layers[best],
                            help="The layer of the bar chart below (initially the one with the best accuracy).")
            idx = layers.index(at if at in layers else layers[best])
        share.chart(sf.steer_bars(steer, vectors, idx, f"Zero-shot prompts steered at layer {layers[idx]}, "
                                                           f"α = {alpha:g}{ctx}"), f"steer-layer{layers[idx]}",
                    key="steer_bars")
        cols = st.columns(3)
        for col, name in zip(cols, M.NAMES):
            col.caption(f"**{M.LABEL[name]}**: {M.HELP[name]} (zero-shot prompts, unless ICL)")
        rows = sf.steer_rows(steer, vectors, idx)
        moved = [r for r in rows[2:] if r["tr_ratio"] > rows[0]["tr_ratio"]]
        st.markdown(f"TR ratio: **{M.pct_ci(rows[0], 'tr_ratio')}** zero-shot, **{M.pct_ci(rows[1], 'tr_ratio')}** "
                    f"with {steer['shots']} demonstrations; steered at layer {layers[idx]}: "
                    + ", ".join(f"{r['name']} **{M.pct_ci(r, 'tr_ratio')}**" for r in rows[2:]) + "."
                    + ("" if moved else " No vector raised it here."))
        table = pd.DataFrame([{"condition": r["name"], **{f"{M.LABEL[n]} %": 100 * r[n] for n in M.NAMES},
                               **{f"{M.LABEL[n]} 95% interval": M.span(r.get(f"{n}_ci")) for n in M.NAMES},
                               "‖v‖": r["norm"], "layer": r["layer"],
                               "heads": ", ".join(figures.head_name(h) for h in r["heads"])} for r in rows])
        with st.expander("As a table, with each vector's heads and norm"):
            share.dataframe("Steering", table, hide_index=True, key="steer_table", placeholder="—",  # not "None"
                         column_config={**{f"{M.LABEL[n]} %": st.column_config.NumberColumn(format="%.1f")
                                           for n in M.NAMES},
                                        "‖v‖": st.column_config.NumberColumn(format="%.4g"),
                                        "layer": st.column_config.NumberColumn(format="%d")})
            st.caption("‖v‖ is the vector's norm before scaling by α. " + " · ".join(
                f"{sf.vector_name(k)}: {VECTOR_HELP[k]}" for k in vectors if k in VECTOR_HELP) + ".")
        st.caption(f"{steer.prompts} prompts · {jobs.timing(steer)}. Brackets and error bars: 95% "
                   f"Wilson intervals. {M.noise_sentence(steer.prompts)}")
        d1, d2 = st.columns([1, 4])
        with d1:
            download("Steering result (JSON)", steer, f"headlens-steer-{s.task}.json", "dl_steer")
        with d2:
            snippets.show("steer", steer_params, "r.zero_shot, r.icl            # Metrics (with accuracy_ci, ...)\n"
                                                 "r.vectors['tr'].tr_ratio       # per injection layer (r.layers)\n"
                                                 "r.vectors['tr'].tr_ratio_ci    # their 95% Wilson intervals")

# -- geometry ------------------------------------------------------------------------------------------------------
st.subheader("Hidden-state geometry", divider="gray")
inject = L // 2 if layer == "all" else int(layer)
g1, g2 = st.columns([1.3, 1], vertical_alignment="bottom")
with g1:
    state.bind(st.selectbox, "PCA layer", "sg_pca_layer", options=list(range(L)),
               to_widget=lambda v: L - 1 if v is None else v, from_widget=lambda v: None if v == L - 1 else v,
               format_func=lambda l: f"after layer {l}" + (" (last)" if l == L - 1 else ""),
               help="The layer whose hidden states the PCA view shows.")
with g2:
    state.bind(st.toggle, "Final norm applied", "sg_final_norm",
               help="Measure the hidden states after the model's final normalisation, as the unembedding reads them "
                    "(the logit difference is then in logits, as the logit lens reads them). Off: the raw residual "
                    "stream, whose scale grows along the layers.")
pca_layer = L - 1 if state.value("sg_pca_layer") is None else int(state.value("sg_pca_layer"))
geo_params = s.job(layer=inject, alpha=alpha, **s.selection(), pca_layer=pca_layer,
                   final_norm=bool(state.value("sg_final_norm")))
geo = run(jobs.Job("geometry", geo_params, "Geometry", "Geometry"),
          f"Five conditions: zero-shot; zero-shot + TR, TL and random vectors at layer {inject}, α = {alpha:g}; ICL",
          "Last-token hidden states after every layer, measured against the label subspace"
          + (" (the sweep's middle layer: the steered conditions need one layer)." if layer == "all" else "."),
          "geometry", "Press **Run** to measure the hidden states.")
if geo is not None:
    with guard("Geometry"):
        share.chart(sf.geometry_curves(geo, title=f"Hidden states per layer (vectors at layer {inject}, "
                                                      f"α = {alpha:g}){ctx}"), "geometry", key="geometry_curves")
        cols = st.columns(3)
        cols[0].caption("**Alignment** ‖Ph‖/‖h‖: the share of the hidden state lying in the span of the label "
                        "unembeddings (1 = all of it).")
        cols[1].caption("**Logit difference** ⟨norm(h), W[gold] − mean W[other labels]⟩: how far the state favours "
                        "the correct label over the others, in logits (the logit lens' reading at each layer)."
                        if geo.get("final_norm") else
                        "**⟨h, W[gold] − mean W[other labels]⟩ without the final norm**: not logits; its size grows "
                        "with the residual stream along the layers (50–150 on small models). Turn on *Final norm "
                        "applied* for the logit difference.")
        cols[2].caption("**Rotation**: the angle between Ph and that gold-minus-others direction inside the label "
                        "subspace; under 90° leans to the correct label.")
        st.caption(f"Lines: means over {geo.prompts} prompts; bands: ±1 standard deviation; "
                   "error bars: the mean's 95% bootstrap interval over prompts; "
                   f"dotted line: the injection layer. "
                   + ("Final norm applied. " if geo.get("final_norm") else "") + jobs.timing(geo) + ".")

        st.markdown(f"**PCA of the hidden states after layer {geo['pca'].get('layer')}**")
        p1, p2, p3 = st.columns([1.4, 1, 1], vertical_alignment="bottom")
        with p1:
            color_by = state.bind(st.segmented_control, "Colour by", "sg_color", options=["condition", "gold"],
                                  format_func=lambda c: {"condition": "Condition", "gold": "Gold label"}[c],
                                  required=True) or "condition"
        with p2:
            arrows = state.bind(st.toggle, "Arrows zero-shot → steered", "sg_arrows",
                                help="From each zero-shot point to the same prompt with a vector added.")
        with p3:
            dirs = state.bind(st.toggle, "Label directions", "sg_dirs",
                              help="The label tokens' unembedding rows, projected into the same PCA basis.")
        t2, t3 = st.tabs(["2D", "3D"])
        pca_title = f"PCA after layer {geo['pca'].get('layer')}{ctx}"
        with t2:
            share.chart(sf.pca_scatter(geo, 2, color_by, arrows, label_directions=dirs, title=pca_title), "pca2d",
                        key="pca_2d")
        with t3:
            share.chart(sf.pca_scatter(geo, 3, color_by, arrows, label_directions=dirs, title=pca_title), "pca3d",
                        key="pca_3d")
        evr = geo["pca"].get("explained_variance_ratio") or []
        st.caption("PCA (scikit-learn) fitted on the five conditions' states together"
                   + (f"; the components explain {', '.join(f'{100 * e:.0f}%' for e in evr)} of the variance"
                      if evr else "")
                   + ". Label directions are drawn from the cloud's centre and scaled to the cloud: only their "
                     "direction matters. Click legend entries to hide conditions.")
        d1, d2 = st.columns([1, 4])
        with d1:
            download("Geometry result (JSON)", geo, f"headlens-geometry-{s.task}.json", "dl_geometry")
        with d2:
            snippets.show("geometry", geo_params, "r.conditions['zero_shot+tr']['alignment'].mean   # per layer\n"
                                                  "r.conditions['zero_shot+tr']['alignment'].ci_low # 95% interval\n"
                                                  "r.pca.points                                    # per condition")

# -- perturbations -------------------------------------------------------------------------------------------------
st.subheader("Perturbed demonstrations", divider="gray")
can_run = fit_result.get("perturbations") or {}
runnable = [p for p in PERTURBATIONS if not can_run.get(p)]


def perturbation_label(p: str) -> str:
    return sf.perturbation_name(p) + ("" if not can_run.get(p) else " (cannot run here)")


state.bind(st.multiselect, "Perturbations", "sg_perturbations", options=state.options("sg_perturbations"),
           to_widget=lambda v: runnable if v is None else v,
           from_widget=lambda v: None if v == runnable else v,
           format_func=perturbation_label, placeholder="Pick at least one",
           help="Applied to the demonstrations only. Shuffled inputs: the input-label pairing broken, labels kept. "
                "Random labels: drawn from the label set. Flipped labels: binary tasks. Symbol labels: @ # ! $ & *. "
                "Number labels: 0 1 2 … Preselected: those that can run on this model and task.")
not_here = [p for p in PERTURBATIONS if can_run.get(p)]
if not_here:
    st.caption("Cannot run here (and so not preselected): " + "; ".join(
        f"**{sf.perturbation_name(p)}**: {can_run[p]}" for p in not_here))
picked = state.value("sg_perturbations")
chosen = [p for p in PERTURBATIONS if p in (runnable if picked is None else picked)]
pert = None
if not chosen:
    st.info("Pick at least one perturbation.", icon=":material/arrow_upward:")
else:
    pert_params = s.job(perturbations=chosen, **s.selection())
    pert = run(jobs.Job("perturbation_report", pert_params, "Perturbations", "Perturbations"),
               f"**{len(chosen)}** perturbation{'s' if len(chosen) != 1 else ''} of the demonstrations",
               "ICL accuracy, TR ratio and head maps under each, and what ablating the original top heads does.",
               "perturb", "Press **Run** to perturb the demonstrations.")
if pert is not None:
    with guard("Perturbations"):
        rows, skipped = pf.perturbation_table(pert)
        for name, why in skipped:
            jobs.warn(f"**{sf.perturbation_name(name)}** skipped: {why}")
        share.chart(pf.perturbation_bars(pert, f"ICL under each perturbation ({pert.get('shots')} "
                                                   f"demonstrations){ctx}"), "perturb", key="perturb_bars")
        st.caption("**ICL accuracy** and **TR ratio** (top prediction is a label) with perturbed demonstrations; "
                   "symbol and number labels rename the classes in the query's label set too.")
        share.chart(pf.ablation_effects(pert, f"Ablating the original top {pert.get('top_k')} heads{ctx}"),
                    "perturb-ablation", key="perturb_ablation", heads=f"top{pert.get('top_k')}")
        changes = pf.ablation_changes(pert)
        if max(changes.values(), default=0.0) < 1e-9:
            st.info(f"Every change is 0: ablating the original top {pert.get('top_k')} TR, TL or random heads moves "
                    "neither the accuracy nor the TR ratio under any of these perturbations, so the bars above are "
                    "empty.", icon=":material/horizontal_rule:")
        hs = pert.heads
        st.caption(f"Change when the **unperturbed** top {pert.top_k} TR heads "
                   f"({', '.join(figures.head_name(h) for h in hs['tr'])}), top TL heads "
                   f"({', '.join(figures.head_name(h) for h in hs['tl'])}) or as many random heads from neither top set "
                   f"({', '.join(figures.head_name(h) for h in hs['random'])}) are zero-ablated, in points "
                   "against no ablation under the same perturbation. The paper expects shuffled inputs to make the "
                   "TL heads matter less, and number labels the TR heads.")
        sets = (("tr", "TR-ablated"), ("tl", "TL-ablated"), ("random", "random-ablated"))
        table = pd.DataFrame([{"perturbation": r["perturbation"], "ICL accuracy %": 100 * r["accuracy"],
                               "ICL label accuracy %": 100 * r["label_accuracy"], "TR ratio %": 100 * r["tr_ratio"],
                               **{f"{lab} acc. %": 100 * r[f"accuracy_{k}"] for k, lab in sets if f"accuracy_{k}" in r},
                               **{f"{lab} TR ratio %": 100 * r[f"tr_ratio_{k}"] for k, lab in sets
                                  if f"tr_ratio_{k}" in r}}
                              for r in rows]
                             + [{"perturbation": f"{sf.perturbation_name(n)} (skipped)"} for n, _ in skipped])
        share.dataframe("Perturbations", table, hide_index=True, key="perturb_table", placeholder="—",
                     column_config={c: st.column_config.NumberColumn(format="%.1f") for c in table.columns
                                    if c != "perturbation"})
        applied = [r["key"] for r in rows if r["key"] != "none"]
        if applied:
            pick = state.bind(st.segmented_control, "Head maps under", "sg_pmap", options=applied,
                              to_widget=lambda v: v if v in applied else applied[0],
                              format_func=sf.perturbation_name, required=True)
            pick = pick if pick in applied else applied[0]
            share.chart(pf.map_differences(pert, pick, f"Head maps: unperturbed vs "
                                                           f"{sf.perturbation_name(pick)}{ctx}"), f"perturb-maps-{pick}",
                        key="perturb_maps")
            st.caption("Difference maps: perturbed minus unperturbed, on a diverging scale centred at 0 (red: the "
                       "head scores higher under the perturbation, blue: lower). " + figures.METRICS["tr"]["caption"])
            ex = pert["perturbations"][pick].get("example")
            if ex:
                with st.expander("An example perturbed prompt (its end)"):
                    st.code(ex, language=None, wrap_lines=True)
        st.caption(f"{pert.prompts} prompts, {pert.shots} demonstrations · "
                   + jobs.timing(pert))
        d1, d2 = st.columns([1, 4])
        with d1:
            download("Perturbation result (JSON)", pert, f"headlens-perturb-{s.task}.json", "dl_perturb")
        with d2:
            snippets.show("perturbation_report", pert_params, "r.perturbations['shuffled_inputs'].icl   # Metrics\n"
                                                  "r.perturbations['shuffled_inputs'].tr_diff  # (layers, heads)")
