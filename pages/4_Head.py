"""Head drill-down: one head on one prompt (a task prompt, or one you type): its attention pattern as a token view,
every head of its layer at once (the attention grid), its write onto each label (per-label DLA), its TR / TL /
induction ranks, its effect when ablated, and the model's top next tokens, optionally after every layer (logit lens);
below, how the task's top heads compose (Q / K / V composition from the weights) and this head's OV circuit on the
labels (kind `composition`). Every view has its Copy as Python."""
from __future__ import annotations

import streamlit as st

from ui import figures, fit, head_view, jobs, layout, sections, snippets, state

s, caps = layout.page_setup("Head drill-down", ":material/center_focus_strong:")
st.title(":material/center_focus_strong: Head drill-down")
st.caption("What one attention head does on one prompt. Pick a head here, or click one on the Head map.")
layout.need_task(s)
fit.check(s)

score_params = s.job(**s.selection())
scores = layout.needed("head_scores", score_params, "Scoring heads", "Head scores")
(L, H), n_prompts = layout.fit_shape(scores, prompts=True), int(scores["prompts"])
if state.value("head") is None:
    state.put("head", tuple(scores["top_tr"][0]) if scores.get("top_tr") else (0, 0))


def _own_prompt_changed() -> None:
    if st.session_state.get("w_own_prompt"):
        hv = state.remembered("head_view", head_view.job_params(s, tuple(state.value("head")),
                                                           int(state.value("prompt")), None, False))
        state.put("text", (hv or {}).get("text") or "Type a prompt that ends right before the answer")
    else:
        state.put("text", None)


c1, c2, c3, c4, c5 = st.columns([1.1, 1, 1.3, 1, 1.2], vertical_alignment="bottom")
with c1:
    state.bind(st.selectbox, "Head", "head", options=[(l, h) for l in range(L) for h in range(H)],
               format_func=figures.head_name, to_widget=lambda v: tuple(v),
               help="L<layer>.H<head>. The Head map's last clicked head lands here.")
with c2:
    state.bind(st.number_input, "Task prompt", "prompt", min_value=0, max_value=max(n_prompts - 1, 0), step=1,
               disabled=state.value("text") is not None,
               help="Which of the task's prompts (0-based; the ones the maps average over).")
with c3:
    st.session_state["w_own_prompt"] = state.value("text") is not None
    st.toggle("Type your own prompt", key="w_own_prompt", on_change=_own_prompt_changed,
              help="Write any prompt; the labels are the task's (classification) or the top next tokens.")
with c4:
    state.bind(st.toggle, "Logit lens", "lens", help="The top next tokens after every layer (final norm + unembedding "
                                                     "of the last token's hidden state).")
with c5:
    state.bind(st.toggle, "All heads of this layer", "grid",
               help="Every head of the layer's attention pattern at once, a grid of small maps (CircuitsVis).")
text = state.value("text")
if text is not None:
    state.bind(st.text_area, "Your prompt (it ends right before the answer)", "text", height=110,
               from_widget=lambda v: v if v and v.strip() else None,
               help="Kept in the link. The model reads it as is (its tokenizer adds what it always adds, e.g. <s>).")
    text = state.value("text")

head = tuple(state.value("head"))
prompt = min(int(state.value("prompt")), max(n_prompts - 1, 0))
params = head_view.job_params(s, head, prompt, text, bool(state.value("lens")), bool(state.value("grid")))
r = jobs.fetch("head_view", params, f"Drilling into {figures.head_name(head)}", what="Head drill-down")
if r is None:
    st.stop()
jobs.show_warnings(r)
if r.get("prompt_index") is not None:
    st.markdown(f"**Prompt {r.prompt_index}** · query `{str(r.query or '').strip()}` · gold "
                f"`{str(r.gold or '').strip()}`")
with st.expander("The prompt as text", expanded=text is None and len(r["text"]) < 300):
    st.code(r["text"], language=None, wrap_lines=True)
head_view.render(r, s, params, L * H, key="head_page")
snippets.show("head_view", params, "r.attention, r.label_dla   # (destination, source) attention; the write per label")
st.caption(f"{jobs.timing(r)}. Ranks are over all {L * H} heads on the task's {n_prompts} prompts (1 = largest).")

# -- how it composes: composition scores from the weights, and the head's OV circuit on the labels ------------------
st.divider()
st.subheader("How it composes: Q / K / V composition and its OV circuit")
c1, c2, c3 = st.columns([1, 1, 2], vertical_alignment="bottom")
with c1:
    comp_k = st.number_input("Top heads per map", 1, 32, 3, key="w_comp_top_k",
                             help="The receiver set: the task's top k heads by TR, by TL and by induction.")
with c2:
    mode = st.selectbox("Composition", ["v", "k", "q"], format_func=lambda m: f"{m.upper()}-composition",
                        key="w_comp_mode", help="V: the sender's output feeds the receiver's values; K: its keys; "
                                                "Q: its queries (Elhage et al. 2021).")
comp_params = s.job(top_k=int(comp_k), head=[int(head[0]), int(head[1])])
rc = sections.run(jobs.Job("composition", comp_params, f"Composition into the top heads, OV circuit of "
                                                       f"{figures.head_name(head)}", "Composition"),
                  "Q-, K- and V-composition scores between heads, read from the weights alone (||W_OV W_QK||_F, "
                  "normalised: 0 to 1), into the task's top TR / TL / induction heads; and this head's OV circuit "
                  "on the task's label tokens (which labels it writes when it reads one).",
                  "No forward pass but the head scores' (cached once the Head map has run).", key="composition")
if rc is not None:
    with sections.guard("Composition"):
        import plotly.graph_objects as go

        names = [f"{figures.head_name(h)} ({'/'.join(r)})" for h, r in zip(rc["heads"], rc["roles"])]
        fig = go.Figure(go.Heatmap(z=rc[mode], x=names, y=names, colorscale="Viridis", zmin=0, xgap=1, ygap=1,
                                   hovertemplate="%{y} -> %{x}: %{z:.3f}<extra></extra>"))
        fig.update_layout(title=f"{mode.upper()}-composition: sender (row) -> receiver (column); blank: not earlier",
                          yaxis_autorange="reversed", xaxis_title="receiver", yaxis_title="sender")
        left, right = st.columns(2)
        left.plotly_chart(figures.style_figure(fig, 460), key="comp_heat")
        ov = go.Figure(go.Heatmap(z=rc["ov_labels"], x=rc["labels"], y=rc["labels"], colorscale="RdBu", zmid=0,
                                  hovertemplate="reads %{y}, writes %{x}: %{z:.3g}<extra></extra>"))
        ov.update_layout(title=f"OV circuit of {figures.head_name(rc['head'])}: label read (row) -> logit written "
                               "(column)", yaxis_autorange="reversed", xaxis_title="label written",
                         yaxis_title="label read")
        right.plotly_chart(figures.style_figure(ov, 460), key="comp_ov")
        right.caption(f"Copying: {rc['copying']:.0%} of labels write their own logit most; margin "
                      f"{rc['copy_margin']:.3g} (own logit minus the others' mean).")
        rows = [{"receiver": figures.head_name(f["receiver"]), "sender": figures.head_name(f["sender"]),
                 "score": round(f["score"], 4), "z among its senders": round(f["z"], 2)}
                for f in rc["feeders"] if f["mode"] == mode]
        st.markdown(f"**Which earlier heads feed each receiver** ({mode.upper()}-composition, over every earlier "
                    "head of the model)")
        st.dataframe(rows, hide_index=True)
        st.caption("Weights only: no sampling, so no interval; z compares a sender with all the receiver's other "
                   "senders. " + " · ".join(rc["linearised"]))
    snippets.show("composition", comp_params, "r.v, r.feeders, r.ov_labels   # (senders, receivers); per receiver; "
                                              "(labels, labels)")
