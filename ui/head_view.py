"""The per-head drill-down (a panel of the Head map, and the Head page): one head on one prompt.

What CircuitsVis, the LLM Transparency Tool and a TransformerLens notebook show: the head's attention pattern over
the prompt's tokens as a token view (hover a token: what it attends to, and each weight), the head's write
projected onto each label's unembedding (per-label DLA), its TR / TL / induction ranks, what zero-ablating it does
on this prompt, and the model's top next tokens (per layer, with the logit lens). Built from the `head` job
(backend/analysis/general/head_view.py); no torch here.
"""
from __future__ import annotations

import html
import json
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from . import figures, share, snippets, state

TOKEN_CSS = """
<style>
.hl-tv {font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: .92rem; line-height: 2.0;}
.hl-tv .hl-tok {padding: 2px 3px; margin: 0 1px; border-radius: 3px; cursor: default; white-space: pre;
                border: 1px solid rgba(0,0,0,.08);}
.hl-tv .hl-tok.hl-dest {outline: 2px solid #d62728;}
.hl-tv-note {font-size: .8rem; color: rgba(110,110,130,.95); margin-bottom: .3rem;}
</style>
"""
TOKEN_JS = """
<script>
(function() {
  const root = document.getElementById("%(uid)s");
  if (!root || root.dataset.ready) return;
  root.dataset.ready = "1";
  const A = JSON.parse(root.dataset.att), rows = JSON.parse(root.dataset.rows);
  const toks = root.querySelectorAll(".hl-tok"), note = root.querySelector(".hl-tv-dest");
  function paint(d) {
    const r = rows.indexOf(d);
    if (r < 0) return;
    const w = A[r], mx = Math.max(...w.slice(0, d + 1), 1e-9);
    toks.forEach((t, j) => {
      const a = j <= d ? w[j] : 0;
      t.style.background = j <= d ? `rgba(31,119,180,${(0.08 + 0.92 * a / mx).toFixed(3)})` : "transparent";
      t.style.color = j <= d && a / mx > 0.55 ? "white" : "";
      t.title = j <= d ? `attention from "${toks[d].dataset.text}" (token ${d}) to this token: ${a.toFixed(4)}` : "after the destination";
      t.classList.toggle("hl-dest", j === d);
    });
    if (note) note.textContent = `"${toks[d].dataset.text}" (token ${d})`;
  }
  const last = rows[rows.length - 1];
  toks.forEach((t, i) => {
    t.addEventListener("mouseenter", () => paint(i));
    t.addEventListener("click", () => paint(i));
  });
  root.addEventListener("mouseleave", () => paint(last));
})();
</script>
"""


def job_params(s: state.Settings, head: tuple[int, int], prompt: int, text: str | None, lens: bool,
               grid: bool = False) -> dict[str, Any]:
    """The `head` job's parameters for the current settings (`grid`: every head of the layer too)."""
    p = s.job(head=[int(head[0]), int(head[1])], prompt=int(prompt), logit_lens=bool(lens))
    if text:
        p["text"] = text
    if grid:
        p["layer_heads"] = True
    return p


def token_view_html(r: dict[str, Any], uid: str = "hl-tv") -> str:
    """A CircuitsVis-style token view: each token coloured by the attention the destination token (the last one;
    hover another to switch) pays to it, its weight in the tooltip. Works without JavaScript for the last token."""
    tokens, att, rows = r["tokens"], r["attention"], r["attention_rows"]
    d = rows[-1]
    w = np.asarray(att[-1], dtype=float)
    mx = max(float(w[: d + 1].max()) if len(w) else 0.0, 1e-9)
    spans = []
    for j, t in enumerate(tokens):
        a = float(w[j]) if j <= d else 0.0
        shown = t.replace("\n", "↵") or "∅"
        style = f"background: rgba(31,119,180,{0.08 + 0.92 * a / mx:.3f});" + (" color: white;" if a / mx > 0.55 else "")
        cls = "hl-tok hl-dest" if j == d else "hl-tok"
        spans.append(f'<span class="{cls}" data-i="{j}" data-text="{html.escape(shown, quote=True)}" style="{style}" '
                     f'title="attention from the last token to this token: {a:.4f}">{html.escape(shown)}</span>')
    data = html.escape(json.dumps([[round(float(x), 5) for x in row] for row in att]), quote=True)
    return (TOKEN_CSS + f'<div class="hl-tv" id="{uid}" data-att="{data}" data-rows="{json.dumps(rows)}">'
            f'<div class="hl-tv-note">L{r["layer"]}.H{r["head"]} · attention from <b class="hl-tv-dest">the last '
            f'token</b> (hover or click a token to see its own attention; darker = more)</div>'
            + "".join(spans) + "</div>" + TOKEN_JS % {"uid": uid})


def token_labels(r: dict[str, Any]) -> list[str]:
    """The prompt's tokens as plotly labels: newlines shown as ↵, an empty token as ∅, escaped (`<s>` shows)."""
    return [figures.esc(t.replace("\n", "↵") or "∅") for t in r["tokens"]]


def attention_figure(r: dict[str, Any], title: str | None = None) -> go.Figure:
    """The last token's attention over the prompt's tokens, as bars (x: token position, labelled by token)."""
    w = r["attention"][-1]
    toks = token_labels(r)
    fig = go.Figure(go.Bar(x=list(range(len(w))), y=w, marker_color="#1f77b4", name="attention",
                           customdata=toks, hovertemplate="token %{x} “%{customdata}”: %{y:.4f}<extra></extra>"))
    fig.update_xaxes(tickmode="array", tickvals=list(range(len(w))), ticktext=toks, tickangle=-60, title_text="source token")
    fig.update_yaxes(title_text="attention weight", rangemode="tozero")
    fig.update_layout(title=dict(text=title or f"L{r['layer']}.H{r['head']}: attention from the last token", x=0.0),
                      showlegend=False)
    return figures.style_figure(fig, 320)


def pattern_figure(r: dict[str, Any], title: str | None = None) -> go.Figure:
    """The whole attention pattern (destination rows x source columns)."""
    toks = token_labels(r)
    rows = r["attention_rows"]
    fig = go.Figure(go.Heatmap(z=r["attention"], x=list(range(len(toks))), y=rows, colorscale="Blues", zmin=0,
                               customdata=[[f"“{toks[i]}” → “{toks[j]}”" for j in range(len(toks))] for i in rows],
                               hovertemplate="%{customdata}: %{z:.4f}<extra></extra>",
                               colorbar=dict(title=dict(text="weight", side="right"), thickness=10)))
    step = max(1, -(-len(toks) // 60))  # at most ~60 tick labels a side, so they stay readable
    fig.update_xaxes(tickmode="array", tickvals=list(range(0, len(toks), step)), ticktext=toks[::step], tickangle=-60,
                     title_text="source token", constrain="domain")
    fig.update_yaxes(tickmode="array", tickvals=rows[::step], ticktext=[toks[i] for i in rows[::step]],
                     autorange="reversed", title_text="destination token")
    fig.update_layout(title=dict(text=title or f"L{r['layer']}.H{r['head']}: attention pattern", x=0.0))
    return figures.style_figure(fig, int(min(900, max(420, 16 * len(rows) + 200))))


GRID_HOVER_CELLS = 60_000
"""Up to this many cells (heads x rows x tokens) the layer grid's hover names both tokens; beyond it, positions."""


def layer_grid_figure(r: dict[str, Any], title: str | None = None, cols: int = 4) -> go.Figure:
    """Every head of the drilled head's layer, one small attention pattern each (destination rows x source tokens),
    on one 0..1 scale, the drilled head's panel titled in bold: CircuitsVis' attention-pattern grid."""
    from plotly.subplots import make_subplots

    att = r["layer_attention"]
    H, toks, rows = len(att), token_labels(r), r["attention_rows"]
    cols = max(1, min(cols, H))
    n_rows = -(-H // cols)
    names = [f"<b>H{h} (drilled)</b>" if h == r["head"] else f"H{h}" for h in range(H)]
    fig = make_subplots(rows=n_rows, cols=cols, subplot_titles=names, horizontal_spacing=0.03,
                        vertical_spacing=0.08 if n_rows > 1 else 0.0)
    named = H * len(rows) * len(toks) <= GRID_HOVER_CELLS
    step = max(1, -(-len(toks) // 24))
    for h in range(H):
        rr, cc = h // cols + 1, h % cols + 1
        kw: dict[str, Any] = {}
        if named:
            kw["customdata"] = [[f"“{toks[i]}” → “{toks[j]}”" for j in range(len(toks))] for i in rows]
            kw["hovertemplate"] = f"L{r['layer']}.H{h} %{{customdata}}: %{{z:.3f}}<extra></extra>"
        else:
            kw["hovertemplate"] = f"L{r['layer']}.H{h} token %{{y}} → token %{{x}}: %{{z:.3f}}<extra></extra>"
        fig.add_trace(go.Heatmap(z=att[h], x=list(range(len(toks))), y=rows, zmin=0, zmax=1, colorscale="Blues",
                                 showscale=h == 0, colorbar=dict(title=dict(text="weight", side="right"),
                                                                 thickness=10, len=0.6), **kw), row=rr, col=cc)
        fig.update_xaxes(tickmode="array", tickvals=list(range(0, len(toks), step)), ticktext=toks[::step],
                         tickangle=-60, tickfont=dict(size=8), showticklabels=rr == n_rows, constrain="domain",
                         row=rr, col=cc)
        fig.update_yaxes(autorange="reversed", tickmode="array", tickvals=rows[::step],
                         ticktext=[toks[i] for i in rows[::step]], tickfont=dict(size=8), showticklabels=cc == 1,
                         scaleanchor=f"x{h + 1 if h else ''}", row=rr, col=cc)
    fig.update_layout(title=dict(text=title or f"Layer {r['layer']}: every head's attention pattern", x=0.0))
    return figures.style_figure(fig, int(min(1400, n_rows * (300 if len(toks) > 24 else 220) + 120)))


def dla_figure(r: dict[str, Any], title: str | None = None) -> go.Figure:
    """The head's last-token write dotted with each label's unembedding row, gold highlighted."""
    labels = [str(x) for x in r["labels"]]
    colors = ["#2ca02c" if x == r.get("gold") else "#9467bd" for x in labels]
    fig = go.Figure(go.Bar(x=r["label_dla"], y=[figures.esc(x.strip() or repr(x)) for x in labels], orientation="h",
                           marker_color=colors, hovertemplate="%{y}: %{x:.4g}<extra></extra>"))
    fig.update_xaxes(title_text="write · unembedding (logit contribution)", zeroline=True, zerolinecolor="#888")
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(title=dict(text=title or f"L{r['layer']}.H{r['head']}: direct logit attribution per label",
                                 x=0.0), showlegend=False)
    return figures.style_figure(fig, int(min(520, max(220, 28 * len(labels) + 120))))


def _rank(r: dict[str, Any], name: str, total: int) -> str:
    v = (r.get("ranks") or {}).get(name)
    return "n/a" if v is None else f"{v} / {total}"


def render(r: dict[str, Any], s: state.Settings, params: dict[str, Any], n_heads_total: int,
           compact: bool = False, key: str = "hv") -> None:
    """The drill-down views of a `head` result; `compact` (the Head map's panel) leaves out the pattern grid,
    the top tokens and the logit lens."""
    name = f"L{r['layer']}.H{r['head']}"
    ctx = figures.subtitle(figures.caption(s.model, s.task_title, r.get("shots")))
    where = "your own prompt" if r.get("prompt_index") is None else f"prompt {r['prompt_index']}"
    m = st.columns(5)
    m[0].metric(f"TR ({where})", f"{r['tr']:.3g}", help="‖P o‖: the head's write inside the span of the labels' "
                                                         "unembeddings, on this prompt.", border=True)
    m[1].metric("TL (this prompt)", "n/a" if r.get("tl") is None else f"{r['tl']:.3g}", border=True,
                help="Towards the gold label vs the others, per unit of TR (needs a gold label).")
    m[2].metric("TR rank on the task", _rank(r, "tr", n_heads_total), border=True)
    m[3].metric("TL rank on the task", _rank(r, "tl", n_heads_total), border=True)
    m[4].metric("Induction rank", _rank(r, "induction", n_heads_total), border=True,
                help=f"Induction score {r['induction']:.3g} (prefix matching on repeated random tokens).")
    st.markdown("**Attention pattern** (token view)")
    st.html(token_view_html(r, f"hl-tv-{key}"), unsafe_allow_javascript=True)
    c1, c2 = st.columns([3, 2], gap="medium")
    with c1:
        share.chart(attention_figure(r, f"{name}: attention from the last token{ctx}"), "attention", key=f"{key}_att",
                    heads=[(r["layer"], r["head"])])
    with c2:
        share.chart(dla_figure(r, f"{name}: per-label DLA{ctx}"), "dla", key=f"{key}_dla", heads=[(r["layer"], r["head"])])
    gold = r.get("gold")
    ab = r["ablated"]
    st.markdown(f"**Ablating {name} on this prompt** (zero ablation): prediction "
                f"`{r['pred'].strip() or '∅'}` → `{ab['pred'].strip() or '∅'}`"
                + ("" if r.get("gold_prob") is None else
                   f"; p(gold `{str(gold).strip()}`) {r['gold_prob']:.3f} → {ab['gold_prob']:.3f}")
                + f" · ‖write‖ = {r['write_norm']:.3g}")
    table = pd.DataFrame({"label": [str(x).strip() for x in r["labels"]], "DLA": r["label_dla"],
                          "p before": r["label_probs"], "p ablated": ab["label_probs"]})
    share.dataframe(f"{name}: per-label DLA and ablation", table, hide_index=True, key=f"{key}_labels",
                 column_config={c: st.column_config.NumberColumn(format="%.4g") for c in ("DLA", "p before",
                                                                                          "p ablated")})
    snippets.show("head_view", params, "r.tokens, r.attention        # the pattern: rows r.attention_rows x tokens\n"
                                  "r.labels, r.label_dla        # per-label direct logit attribution\n"
                                  "r.ranks, r.ablated.gold_prob")
    if r.get("layer_attention"):
        st.markdown(f"**All {len(r['layer_attention'])} heads of layer {r['layer']}** (attention patterns, "
                    "CircuitsVis' grid; darker = more)")
        share.chart(layer_grid_figure(r, f"Layer {r['layer']}: every head's attention pattern{ctx}"), "layer-grid",
                    key=f"{key}_grid", heads=f"L{r['layer']}")
    if compact:
        return
    # drawn only when shown: a chart drawn inside a collapsed expander keeps the width it had there (a ~64 px strip)
    if st.toggle("The whole attention pattern (every destination token)", key=f"w_{key}_pattern"):
        share.chart(pattern_figure(r, f"{name}: attention pattern{ctx}"), "pattern", key=f"{key}_pattern",
                    heads=[(r["layer"], r["head"])])
    t1, t2 = st.columns(2, gap="medium")
    with t1:
        st.markdown("**Top next tokens**")
        after = ab.get("top_probs") or [next((a["prob"] for a in ab["top"] if a["id"] == t["id"]), None)
                                        for t in r["top"]]
        share.dataframe(f"{name}: top next tokens", pd.DataFrame([{"token": t["token"], "p": t["prob"], "p with the head ablated": a}
                                   for t, a in zip(r["top"], after)]), hide_index=True, key=f"{key}_top",
                     column_config={"p": st.column_config.NumberColumn(format="%.4f"),
                                    "p with the head ablated": st.column_config.NumberColumn(format="%.4f")})
    with t2:
        lens = r.get("logit_lens")
        st.markdown("**Logit lens** (top tokens after each layer)")
        if lens:
            share.dataframe(f"{name}: logit lens", pd.DataFrame([{"layer": i, **{f"#{j + 1}": f"{t['token'].strip() or '∅'} ({t['prob']:.2f})"
                                                         for j, t in enumerate(row)}} for i, row in enumerate(lens)]),
                         hide_index=True, key=f"{key}_lens")
        else:
            st.caption("Turn on *Logit lens* above to see the top tokens after every layer.")
