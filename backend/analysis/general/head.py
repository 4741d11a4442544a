"""Kind `head`: one attention head on one prompt, the drill-down a notebook user expects.

For head (l, h) on a prompt (one of the task's, or your own `text`), from one eager forward pass:
    attention  A[l, h]: (tokens, tokens), row i = how destination token i attends to the source tokens
    write      o = z[l, h] @ W_O[l, h] at the last token                          (d_model,)
    per-label DLA   o . U[c] for each label c (U: the unembedding rows of the labels' first tokens)
    TR, TL     of this prompt against its labels (`primitives.tsla`; TL needs the gold label)
and from a second pass with the head zero-ablated (every position): the prediction, p(gold) and the label
probabilities. Ranks (1 = largest) of the head on the task's TR, TL and induction maps come from the cached
`scores` of the same prompts. With `logit_lens`, the top tokens after every layer (final norm + unembedding
of the last token's hidden state).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ...hooks import hooked
from ...options import HEAD_MAX_PATTERN
from ...tasks.base import TaskError
from ..kernel import Context
from ..params import HeadParams
from ..primitives.batching import answer_tokens, build_prompts
from ..primitives.induction import eager_attention, induction_scores
from ..primitives.sweep import head_mask
from ..primitives.tsla import head_writes, label_space, tsla

LENS_TOP = 5


def _rank(values: Any, layer: int, head: int) -> int:
    """Rank of (layer, head) in a (layers, heads) map, 1 = largest (ties by position, as top-k lists are)."""
    flat = np.nan_to_num(np.asarray(values, dtype=float).ravel(), nan=-np.inf)
    order = np.argsort(-flat, kind="stable")
    H = np.asarray(values).shape[1]
    return int(np.nonzero(order == layer * H + head)[0][0]) + 1


def _top(lm: Any, logits: torch.Tensor, k: int) -> list[dict[str, Any]]:
    probs = torch.softmax(logits.float(), -1)
    p, i = probs.topk(min(k, probs.shape[-1]))
    dec = lm.tokenizer.decode
    return [{"token": dec([int(t)]), "id": int(t), "prob": float(q), "logit": float(logits[int(t)])}
            for q, t in zip(p, i)]


def _prompt(ctx: Context, p: HeadParams) -> dict[str, Any]:
    """The text, gold, query and labels of the prompt to show."""
    lm, task = ctx.lm, ctx.task
    if p.text is not None:
        labels = p.labels
        if labels is None and task.kind == "classification" and task.labels:
            labels = [task.template.answer(y) for y in task.labels]
        return {"index": None, "text": p.text, "gold": None, "query": None, "labels": labels, "shots": p.shots}
    built = build_prompts(lm, task, p.shots, p.prompts, p.seed)
    for w in built.warnings:
        ctx.warn(w)
    if p.prompt >= built.n:
        raise TaskError(f"prompt {p.prompt} does not exist: this task has {built.n} prompts for seed {p.seed} "
                        f"(0..{built.n - 1})")
    q = built.prompts[p.prompt]
    return {"index": p.prompt, "text": q.text, "gold": q.gold, "query": q.query,
            "labels": list(p.labels or q.labels), "shots": built.shots}


def head(ctx: Context, p: HeadParams) -> dict[str, Any]:
    """The head's attention pattern, per-label DLA, TR / TL, ranks and ablation effect on one prompt."""
    lm = ctx.lm
    layer, h = p.head
    mask = head_mask(lm, [(layer, h)])  # out-of-range heads are an error before any pass
    pr = _prompt(ctx, p)
    tok = lm.tokenizer
    ids = tok(pr["text"])["input_ids"]
    if lm.max_positions and len(ids) > lm.max_positions:
        raise TaskError(f"the prompt has {len(ids)} tokens, over the model's context window of {lm.max_positions}")
    ctx.progress(0.1, "forward pass")
    x = torch.tensor([ids], device=lm.device)
    with lm.lock, torch.inference_mode(), eager_attention(lm):
        with hooked(lm, capture_z=True, capture_hidden=p.logit_lens) as trace:
            out = lm.model(input_ids=x, output_attentions=True, use_cache=False, logits_to_keep=1)
        logits = out.logits[0, -1].float()
        att = out.attentions[layer][0, h].float().cpu()  # (T, T)
        ctx.progress(0.5, "ablated pass")
        with hooked(lm, head_mask=mask[None].to(lm.device)):
            ablated = lm.model(input_ids=x, use_cache=False, logits_to_keep=1).logits[0, -1].float()
        lens = None
        if p.logit_lens:
            hs = torch.stack([t[0] for t in trace.hidden])  # (layers, d_model)
            lens_logits = lm.model.get_output_embeddings()(lm.final_norm(hs)).float()
            lens = [_top(lm, lens_logits[i], LENS_TOP) for i in range(lm.n_layers)]
    z = trace.z(lm.n_heads)[0, layer, h].float()  # (head_dim,)
    o = head_writes(z[None, None], lm.w_o(layer)[h:h + 1])[0, 0]  # (d_model,)
    top = _top(lm, logits, p.top_tokens)
    labels = pr["labels"] or [t["token"] for t in top]
    first = [answer_tokens(lm, pr["text"][-32:], lab)[0] for lab in labels]
    u = lm.unembed.detach().float()[torch.tensor(first, device=lm.device)]  # (labels, d_model)
    dla = (u @ o.to(u.device)).tolist()
    gold = labels.index(pr["gold"]) if pr["gold"] in labels else None
    ls = label_space(lm.unembed.detach().float(), [first], [gold or 0])
    stats = tsla(o[None, None].to(lm.device), ls)
    probs, probs_ab = torch.softmax(logits, -1), torch.softmax(ablated, -1)
    gold_id = first[gold] if gold is not None else None
    T = len(ids)
    rows = list(range(T)) if T <= HEAD_MAX_PATTERN else [T - 1]
    ctx.progress(0.7, "ranks")
    if p.ranks:  # the task's cached head maps hold the induction map too
        sc = ctx.call("scores", shots=p.shots, prompts=p.prompts, seed=p.seed, batch_size=p.batch_size,
                      progress=ctx.stage(0.7, 1.0, "head scores"))
        ind = np.asarray(sc.induction, dtype=float)
        ranks = {"induction": _rank(ind, layer, h), "tr": _rank(sc.tr, layer, h), "tl": _rank(sc.tl, layer, h)}
    else:
        ind = induction_scores(lm)
        ranks = {"induction": _rank(ind, layer, h)}
    return {
        "layer": layer, "head": h, "prompt_index": pr["index"], "text": pr["text"],
        "tokens": [tok.decode([i]) for i in ids], "attention": att[rows].tolist(), "attention_rows": rows,
        "query": pr["query"], "gold": pr["gold"], "labels": labels, "label_dla": dla,
        "label_probs": [float(probs[i]) for i in first], "write_norm": float(o.norm()),
        "tr": float(stats.tr[0, 0]), "tl": float(stats.tl[0, 0]) if gold is not None else None,
        "ranks": ranks, "induction": float(ind[layer, h]), "top": top, "pred": top[0]["token"],
        "gold_prob": float(probs[gold_id]) if gold_id is not None else None,
        "ablated": {"pred": tok.decode([int(ablated.argmax())]),
                    "gold_prob": float(probs_ab[gold_id]) if gold_id is not None else None,
                    "label_probs": [float(probs_ab[i]) for i in first], "top": _top(lm, ablated, p.top_tokens),
                    "top_probs": [float(probs_ab[t["id"]]) for t in top]},
        "logit_lens": lens, "shots": pr["shots"],
    }
