"""Head map: layer x head maps of TR, TL, DLA-TR, DLA-TL and induction; click heads to select them."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import streamlit as st

from ui import figures, heads, jobs, layout, state
from ui import metrics as M

s, caps = layout.page_setup("Head map", ":material/grid_on:")
st.title(":material/grid_on: Head map")
st.caption("Every attention head scored on the task's prompts, at the last token (means over prompts). "
           "Click a cell to select or unselect a head; drag a box or lasso (toolbar) to add many.")
layout.need_task(s)

scores = jobs.fetch("scores", s.job(**s.selection()), "Scoring heads", what="Head scores")
if scores is None:
    st.stop()
jobs.show_warnings(scores)
L, H = int(scores["n_layers"]), int(scores["n_heads"])
selected = heads.current(L, H)

k_shot, zero = scores["icl"], scores.get("zero_shot")
m = st.columns(5)
for col, name in zip(m, M.NAMES):
    col.metric(f"{M.LABEL[name]} ({scores['shots']}-shot)", M.pct(k_shot[name]),
               delta=None if zero is None else M.points(k_shot[name], zero[name]),
               help=M.HELP[name] + ("" if zero is None else f" 0-shot: {M.pct(zero[name])} (the arrow: the change "
                                                            f"from 0 shots)."), border=True)
m[3].metric("Heads", f"{L} × {H}", help="layers × heads per layer", border=True)
m[4].metric("Selected", f"{len(selected)}", border=True)
if zero is not None:
    st.caption(f"TR ratio **{M.pct(zero['tr_ratio'])}** with 0 shots → **{M.pct(k_shot['tr_ratio'])}** with "
               f"{scores['shots']}: the demonstrations make the model answer with a label word. Accuracy "
               f"{M.pct(zero['accuracy'])} → {M.pct(k_shot['accuracy'])}, label accuracy "
               f"{M.pct(zero['label_accuracy'])} → {M.pct(k_shot['label_accuracy'])}.")

# -- the selectable map -------------------------------------------------------------------------------------
state.bind(st.segmented_control, "Map", "map", options=list(figures.METRICS),
           format_func=lambda k: figures.METRICS[k]["label"], required=True)
metric = state.get().map or "tr"
main, side = st.columns([3, 1.25], gap="medium")
with main:
    fig = figures.head_heatmap(scores[metric], metric, selected=selected)
    st.plotly_chart(fig, key=heads.chart_key("hm"), on_select=heads.on_chart_select("hm"),
                    selection_mode=("points", "box", "lasso"),
                    config=figures.png_config(f"headmap-{metric}-{s.task}"))
    st.caption(figures.METRICS[metric]["caption"])
with side:
    selected = heads.multiselect(L, H)
    heads.quick_picks(scores, L, H, key="hm", compact=True)
    if selected:
        st.page_link("pages/2_Ablation.py", label="Ablate this head" if len(selected) == 1 else f"Ablate these {len(selected)} heads",
                     icon=":material/power_settings_new:", query_params=state.query())
    st.caption(":material/photo_camera: Every figure's toolbar (top right, on hover) has a camera button that saves it as a PNG "
               "at 2× resolution.")

with st.expander("All five maps side by side", expanded=True):
    st.plotly_chart(figures.all_maps(scores, selected), key="all_maps",
                    config=figures.png_config(f"headmaps-all-{s.task}"))
    st.caption(" · ".join(f"{v['caption']}" for k, v in figures.METRICS.items() if k != metric))

# -- tables ------------------------------------------------------------------------------------------------------
rows = []
rk = {k: figures.ranks(np.asarray(scores[k], dtype=float)) for k in figures.METRICS}
for l in range(L):
    for h in range(H):
        row = {"head": figures.head_name((l, h)), "layer": l, "index": h}
        for k in figures.METRICS:
            row[k] = float(scores[k][l][h])
            row[f"{k}_rank"] = int(rk[k][l, h])
        row["selected"] = (l, h) in selected
        rows.append(row)
table = pd.DataFrame(rows)

st.subheader("Top heads", divider="gray")
c1, c2 = st.columns([3, 2], gap="large")
with c1:
    n = st.slider("How many", 1, L * H, min(10, L * H), key="w_top_n")
    top = table.sort_values(f"{metric}_rank").head(n)
    cfg = {k: st.column_config.NumberColumn(figures.METRICS[k]["label"], format="%.4g") for k in figures.METRICS}
    cfg.update({f"{k}_rank": st.column_config.NumberColumn(f"{figures.METRICS[k]['label']} rank", format="%d")
                for k in figures.METRICS})
    cfg["selected"] = st.column_config.CheckboxColumn("sel.")
    st.dataframe(top, hide_index=True, column_config=cfg, key="top_table",
                 column_order=["head", metric, f"{metric}_rank",
                               *[c for k in figures.METRICS if k != metric for c in (k, f"{k}_rank")], "selected"])
    st.caption(f"Sorted by {figures.METRICS[metric]['label']}; rank 1 = largest of {L * H}.")
with c2:
    ov = scores.get("overlap", {})
    names = {"tr_tl": "TR vs TL", "tr_induction": "TR vs induction", "tl_induction": "TL vs induction"}
    odf = pd.DataFrame([{"pair": names.get(k, k), "Jaccard": v.get("jaccard"), "Spearman ρ": v.get("spearman"),
                         "Kendall τ": v.get("kendall")} for k, v in ov.items()])
    st.markdown("**Overlap between rankings**")
    st.dataframe(odf, hide_index=True, key="overlap_table",
                 column_config={c: st.column_config.NumberColumn(format="%.3f")
                                for c in ("Jaccard", "Spearman ρ", "Kendall τ")})
    n_top = int(scores.get("top_k", len(scores.get("top_tr", []))))
    st.caption(f"Jaccard: overlap of the top-head sets ({s.top_label()}: {n_top} head{'s' if n_top != 1 else ''} "
               "each). Spearman and Kendall: rank correlation over all heads.")
    st.plotly_chart(figures.layer_distribution(scores, n), key="layer_dist",
                    config=figures.png_config(f"layer-distribution-{s.task}"))

# -- downloads -----------------------------------------------------------------------------------------------------
st.subheader("Download", divider="gray")
stem = f"headlens-{s.task}-{s.shots}shot-seed{s.seed}".replace(":", "-").replace("/", "-")
d = st.columns(3)
d[0].download_button("Per-head table (CSV)", table.to_csv(index=False).encode(), f"{stem}-heads.csv",
                     "text/csv", icon=":material/table:", key="dl_csv", on_click="ignore")
d[1].download_button("Full result (JSON)", json.dumps(scores, indent=1).encode(), f"{stem}-scores.json",
                     "application/json", icon=":material/data_object:", key="dl_json", on_click="ignore")
d[2].caption("Figures: the camera button in each figure's toolbar saves a PNG.")
