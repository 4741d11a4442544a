"""Head map: layer x head maps of TR, TL, DLA-TR, DLA-TL and induction; click heads to select them and to drill
into one (its attention pattern, per-label DLA and ablation effect on a prompt)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from ui import figures, fit, head_view, heads, jobs, layout, share, snippets, state
from ui import metrics as M
from ui.sections import download

s, caps = layout.page_setup("Head map", ":material/grid_on:")
st.title(":material/grid_on: Head map")
st.caption("Every attention head scored on the task's prompts, at the last token (means over prompts). "
           "Click a cell to select or unselect a head and drill into it; drag a box or lasso (toolbar) to add many.")
layout.need_task(s)
fit.check(s)

score_params = s.job(**s.selection())
scores = jobs.fetch("scores", score_params, "Scoring heads", what="Head scores")
if scores is None:
    st.stop()
jobs.show_warnings(scores)
L, H = int(scores["n_layers"]), int(scores["n_heads"])
selected = heads.current(L, H)
ctx = figures.subtitle(figures.caption(s.model, s.task_title, scores["shots"], int(scores["top_k"])))

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
               f"{M.pct(zero['label_accuracy'])} → {M.pct(k_shot['label_accuracy'])}. Head scores {jobs.timing(scores)}.")

# -- the selectable map -------------------------------------------------------------------------------------
state.bind(st.segmented_control, "Map", "map", options=list(figures.METRICS),
           format_func=lambda k: figures.METRICS[k]["label"], required=True)
metric = state.get().map or "tr"
main, side = st.columns([3, 1.25], gap="medium")
with main:
    top = {"tr": scores.get("top_tr"), "tl": scores.get("top_tl")}.get(metric) or int(scores["top_k"])
    fig = figures.head_heatmap(scores[metric], metric, selected=selected, top=top,
                               title=f"{figures.METRICS[metric]['label']}: {figures.METRICS[metric]['long']}{ctx}")
    share.chart(fig, f"headmap-{metric}", key=heads.chart_key("hm"), on_select=heads.on_chart_select("hm"),
                selection_mode=("points", "box", "lasso"))
    st.caption(figures.METRICS[metric]["caption"])
with side:
    selected = heads.multiselect(L, H)
    heads.quick_picks(scores, L, H, key="hm", compact=True)
    if selected:
        st.page_link("pages/2_Ablation.py", label="Ablate this head" if len(selected) == 1 else
                     f"Ablate these {len(selected)} heads", icon=":material/power_settings_new:",
                     query_params=state.query())
    snippets.show("scores", score_params, f"r.{metric}        # numpy (layers, heads)\nr.top_tr, r.top_tl, r.overlap")
    st.caption(":material/photo_camera: Every figure's toolbar (top right, on hover) has a camera button that saves "
               "it as a PNG at 2× resolution; its title says what it was computed on.")

# -- drill-down: the clicked head ---------------------------------------------------------------------------------
drill = state.value("head")
if drill is not None and not (0 <= drill[0] < L and 0 <= drill[1] < H):
    drill = None
st.subheader("Drill down into one head", divider="gray")
if drill is None:
    st.info("Click a cell of the map to see that head's attention pattern, its write onto each label and what "
            "ablating it does on one prompt.", icon=":material/touch_app:")
else:
    d1, d2, d3 = st.columns([1.2, 1, 2], vertical_alignment="bottom")
    with d1:
        state.bind(st.selectbox, "Head", "head", options=[(l, h) for l in range(L) for h in range(H)],
                   format_func=figures.head_name, to_widget=lambda v: tuple(v))
    with d2:
        state.bind(st.number_input, "Prompt", "prompt", min_value=0, max_value=max(int(scores["prompts"]) - 1, 0),
                   step=1, help="Which of the task's prompts (0-based; the same prompts the maps average over).")
    with d3:
        st.page_link("pages/4_Head.py", label="Open the full drill-down (your own prompt, logit lens)",
                     icon=":material/open_in_new:", query_params=state.query())
    drill, prompt = tuple(state.value("head")), min(int(state.value("prompt")), max(int(scores["prompts"]) - 1, 0))
    hp = head_view.job_params(s, drill, prompt, None, False)
    hv = jobs.fetch("head", hp, f"Drilling into {figures.head_name(drill)}", what="Head drill-down")
    if hv is not None:
        head_view.render(hv, s, hp, L * H, compact=True, key="hm_drill")

if state.bind(st.toggle, "All five maps side by side", "all_maps",
              help="Each map on its own colour scale, with its colour bar (drawn on demand: five more heatmaps)."):
    share.chart(figures.all_maps(scores, selected, f"All five maps{ctx}"), "headmaps-all", key="all_maps")
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
c1 = st.container()  # the table at full width (in a column its rank columns were clipped)
with c1:
    if not 1 <= int(state.value("top_n")) <= L * H:
        state.put("top_n", min(10, L * H))
    n = state.bind(st.slider, "How many", "top_n", min_value=1, max_value=L * H)
    top = table.sort_values(f"{metric}_rank").head(n)
    cfg = {k: st.column_config.NumberColumn(figures.METRICS[k]["label"], format="%.4g") for k in figures.METRICS}
    cfg.update({f"{k}_rank": st.column_config.NumberColumn(f"{figures.METRICS[k]['label']} rank", format="%d")
                for k in figures.METRICS})
    cfg["selected"] = st.column_config.CheckboxColumn("sel.")
    st.dataframe(top, hide_index=True, column_config=cfg, key="top_table",
                 column_order=["head", metric, f"{metric}_rank",
                               *[c for k in figures.METRICS if k != metric for c in (k, f"{k}_rank")], "selected"])
    st.caption(f"Sorted by {figures.METRICS[metric]['label']}; rank 1 = largest of {L * H}.")
c2, c3 = st.columns([1, 1], gap="large")
with c2:
    ov = scores.get("overlap", {})
    names = {"tr_tl": "TR vs TL", "tr_induction": "TR vs induction", "tl_induction": "TL vs induction"}
    odf = pd.DataFrame([{"pair": names.get(k, k), "Jaccard": v.get("jaccard"), "Spearman ρ": v.get("spearman"),
                         "Kendall τ": v.get("kendall")} for k, v in ov.items()])
    st.markdown("**Overlap between rankings**")
    st.dataframe(odf, hide_index=True, key="overlap_table", placeholder="—",
                 column_config={c: st.column_config.NumberColumn(format="%.3f")
                                for c in ("Jaccard", "Spearman ρ", "Kendall τ")})
    n_top = int(scores.get("top_k", len(scores.get("top_tr", []))))
    st.caption(f"Jaccard: overlap of the top-head sets ({s.top_label()}: {n_top} head{'s' if n_top != 1 else ''} "
               "each). Spearman and Kendall: rank correlation over all heads.")
with c3:
    share.chart(figures.layer_distribution(scores, n, f"Layer of the top {n} heads{ctx}"), "layer-distribution",
                key="layer_dist", heads=f"top{n}")

# -- downloads -----------------------------------------------------------------------------------------------------
st.subheader("Download", divider="gray")
stem = f"headlens-{s.task}-{s.shots}shot-seed{s.seed}".replace(":", "-").replace("/", "-")
d = st.columns(3)
d[0].download_button("Per-head table (CSV)", table.to_csv(index=False).encode(), f"{stem}-heads.csv",
                     "text/csv", icon=":material/table:", key="dl_csv", on_click="ignore")
with d[1]:
    download("Full result (JSON)", scores, f"{stem}-scores.json", "dl_json")
d[2].caption("Figures: the camera button in each figure's toolbar saves a PNG.")
