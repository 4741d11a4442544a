"""The Head map's path-patching section (kind `path_patching`): one sender head, chosen among the top heads, patched
from the clean prompts into corrupted ones through chosen paths only (Wang et al.), by default into the top TL heads'
queries, keys and values (or every later head, a map); layer x head maps of the effect through each channel with
their 95% intervals in the hover, the effects table and the Copy as Python. Closed, it asks the service for nothing."""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import streamlit as st

from ui import figures, jobs, share, snippets
from ui.sections import guard, run

TARGETS = ["zero_shot", "random_labels", "shuffled_inputs", "flipped_labels"]


def receivers_of(top_tl: list, sender: tuple[int, int]) -> list[str]:
    """The top TL heads after the sender's layer, each head's q, k and v (`l.h.q`, ...)."""
    return [f"{l}.{h}.{c}" for l, h in top_tl if l > sender[0] for c in ("q", "k", "v")]


def _heat(m: dict[str, Any], rows: int, cols: int, title: str) -> Any:
    import plotly.graph_objects as go

    z = np.asarray(m["mean"], dtype=float)
    lo, hi = np.asarray(m["ci_low"], dtype=float), np.asarray(m["ci_high"], dtype=float)
    text = [[("—" if np.isnan(a) else f"{a:.4f} [{b:.4f}, {c:.4f}]") for a, b, c in zip(za, la, ha)]
            for za, la, ha in zip(z, lo, hi)]
    fig = go.Figure(go.Heatmap(z=z, x=[f"H{h}" for h in range(cols)], y=[f"L{l}" for l in range(rows)],
                               customdata=text, colorscale="RdBu", zmid=0, xgap=1, ygap=1,
                               hovertemplate="%{y} %{x}: %{customdata}<extra></extra>"))
    fig.update_layout(title=title, yaxis_autorange="reversed", xaxis_title="receiver head", yaxis_title="layer")
    return figures.style_figure(fig, 420)


def _effect(x: dict[str, Any]) -> str:
    return f"{x['effect']:+.4f}"


def _span(x: dict[str, Any]) -> str:
    return "—" if x["ci_low"] is None else f"95% [{x['ci_low']:+.4f}, {x['ci_high']:+.4f}] · p {x['p']:.2g}"


def section(s: Any, scores: dict[str, Any], L: int, H: int, ctx: str) -> None:
    """The section, closed by default behind its toggle."""
    st.subheader("Path patching from one head", divider="gray")
    st.caption("Which heads does one head feed? Its last-token z from the clean prompts, into the corrupted ones, "
               "through chosen paths only: the other heads frozen (step 1), then only the receivers' queries, keys or "
               "values replaced by what they read there (step 2). Each effect: the change of p(gold) over the "
               "corrupted run, mean over prompts with its 95% bootstrap interval.")
    if not st.toggle("Patch paths from a top head into later heads", key="w_pp",
                     help="Opens the section (closed, the page asks the service for nothing of it)."):
        return
    tops = list(dict.fromkeys([tuple(h) for h in scores["top_tl"]] + [tuple(h) for h in scores["top_tr"]]))
    c1, c2, c3, c4 = st.columns([1, 1.6, 1, 1], vertical_alignment="bottom")
    with c1:
        sender = st.selectbox("Sender", tops, format_func=figures.head_name, key="w_pp_sender",
                              help="One of the top TL / TR heads (TL first).")
    with c2:
        mode = st.segmented_control("Receivers", ["top_tl", "map"], default="top_tl", key="w_pp_mode",
                                    format_func={"top_tl": "top TL heads' q, k, v", "map": "every later head"}.get,
                                    help="The top TL heads after the sender (each one's query, key and value, and "
                                         "all of them together), or the map of every later head (slower: one "
                                         "patched step per receiver and prompt).") or "top_tl"
    with c3:
        target = st.selectbox("Patched into", TARGETS, format_func=lambda t: t.replace("_", " "), key="w_pp_target")
    with c4:
        freeze = st.selectbox("Step 1 freezes", ["heads", "none"], key="w_pp_freeze",
                              help="heads: every other head's z at its corrupted value (Wang et al.); none: nothing.")
    sender = tuple(int(x) for x in sender)
    receivers = receivers_of([tuple(h) for h in scores["top_tl"]], sender) if mode == "top_tl" else None
    if receivers == []:
        st.info(f"No top TL head lies after {figures.head_name(sender)}'s layer: pick an earlier sender, or every "
                f"later head.")
        return
    params = s.job(sender=list(sender), receivers=receivers, target=target, freeze=freeze)
    what = f"{len(receivers)} receivers" if receivers else "every later head's q, k and v, each MLP and the logits"
    r = run(jobs.Job("path_patching", params, "Patching paths", "Path patching", slot="path_patching"),
            f"Patch **{figures.head_name(sender)}** into {what}, from the clean prompts into the "
            f"**{target.replace('_', ' ')}** ones · **{s.prompts}** prompts",
            "One token over each corrupted prompt's cached prefix per receiver and prompt.", "path_patching",
            "Press **Run** for the sender's paths.")
    if r is None:
        return
    with guard("Path patching"):
        q = st.columns(4)
        q[0].metric("Sender, every path", _effect(r["sender_effect"]), border=True, help=_span(r["sender_effect"])
                    + ": the sender's activation patching, nothing frozen.")
        if r["joint"] is not None:
            q[1].metric("Receivers together", _effect(r["joint"]), border=True, help=_span(r["joint"]))
        if r["logits"] is not None:
            q[2].metric("Direct to the logits", _effect(r["logits"]), border=True, help=_span(r["logits"]))
        q[3].metric("p(gold), corrupted → clean", f"{r['target_metric']:.3f} → {r['clean_metric']:.3f}", border=True)
        cols = st.columns(3)
        for col, c in zip(cols, ("q", "k", "v")):
            if r[c] is not None:
                col.plotly_chart(_heat(r[c], L, H, f"via {c}{ctx}"), key=f"pp_{c}")
        rows = pd.DataFrame([{"receiver": e["receiver"], "effect": e["effect"], "95% low": e["ci_low"],
                              "95% high": e["ci_high"], "p": e["p"], "q (BH)": e["q"]} for e in r["effects"][:20]])
        share.table("Path patching: receivers by |effect|", rows)
        st.dataframe(rows, hide_index=True, key="pp_table")
        share.numbers("Path patching", {"sender": figures.head_name(sender), "target": target, "freeze": freeze,
                                        "every path": r["sender_effect"]["effect"]})
        st.caption("k and v: the key / value head each query head reads (grouped-query attention: equal across a "
                   "group). Hover: mean [95% interval]; — where the head is no receiver. " + jobs.timing(r) + ".")
    snippets.show("path_patching", params, "r.q.mean, r.k.mean, r.v.mean   # numpy (layers, heads)\n"
                                           "r.joint, r.logits, r.effects")
