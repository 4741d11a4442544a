"""Kind `head_view`: one attention head on one prompt, the drill-down a notebook user expects.

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

from typing import Annotated, Any, ClassVar

import numpy as np
import torch
from pydantic import Field, field_validator

from ..primitives import options as o
from ...model.hooks import hooked
from ..primitives.options import HEAD_MAX_PATTERN
from ...tasks.base import TaskError
from ..kernel import Context
from ..kinds import get_kind
from ..params import Bool, Head, Int, PromptParams
from ..primitives import cost
from ..primitives.cost import Shape, Sizes, Work, passes
from ..primitives.stages import planned
from ..results import Model, Result
from ..primitives.bos import prompt_ids
from ..primitives.batching import answer_tokens, build_prompts
from ..primitives.fit import unknown_id
from ..primitives.induction import eager_attention, induction_scores
from ..primitives.configs import head_mask
from ..primitives.tsla import head_writes, label_space, tsla


class HeadViewParams(PromptParams):
    """kind `head_view`: one head on one prompt (a task prompt, or `text`): its attention pattern, its write onto
    each label's unembedding, its TR / TL / induction ranks, its effect when zero-ablated; the model's top next
    tokens, optionally per layer (logit lens)."""

    head: Head = Field(..., description="[layer, head]")
    prompt: Int = Field(0, ge=0, description="which of the task's prompts (0-based)")
    text: str | None = Field(None, min_length=1, max_length=o.MAX_TEXT * 8,
                             description="your own prompt instead of a task prompt (ends right before the answer)")
    labels: list[Annotated[str, Field(min_length=1, max_length=200)]] | None = Field(
        None, max_length=64, description="candidate answers as they continue the prompt (e.g. ' pos'); default: "
                                         "the task prompt's labels")
    top_tokens: Int = Field(o.HEAD_TOP_TOKENS, ge=1, le=50)
    logit_lens: Bool = Field(False, description="top tokens after every layer (final norm + unembedding)")
    ranks: Bool = Field(True, description="the head's TR / TL ranks on the task (from the cached `scores`)")
    layer_heads: Bool = Field(False, description="also every head of the head's layer: their attention patterns "
                                                 "(the CircuitsVis grid)")
    added_fields: ClassVar[frozenset[str]] = frozenset({"layer_heads"})

    @field_validator("head")
    @classmethod
    def _head(cls, v: tuple[int, int]) -> tuple[int, int]:
        if v[0] < 0 or v[1] < 0:
            raise ValueError("layer and head indices must be non-negative")
        return v

    def work(self, shape: Shape, sizes: Sizes) -> Work:
        t = len(self.text.encode("utf-8")) / cost.BYTES_PER_TOKEN if self.text else sizes.prompt(self.shots)
        extra = get_kind("head_scores").params(shots=self.shots, prompts=self.prompts).work(shape, sizes).named(
            "head scores") if self.ranks else cost.induction(shape)
        return passes("forward pass", 1, t) + passes("ablated pass", 1, t) + extra


class TokenProb(Model):
    token: str
    id: int
    prob: float
    logit: float | None = None


class HeadAblation(Model):
    """The prompt with the head zero-ablated (at every position)."""

    pred: str
    gold_prob: float | None = None
    label_probs: list[float]
    top: list[TokenProb]
    top_probs: list[float] = Field(default_factory=list, description="the probability, after ablation, of each "
                                                                     "token of the unablated `top` list")


class HeadViewResult(Result):
    layer: int
    head: int
    prompt_index: int | None = Field(None, description="the task prompt shown (None: your own text)")
    text: str
    tokens: list[str] = Field(..., description="the prompt's tokens, decoded one by one")
    attention: list[list[float]] = Field(..., description="attention of the head: rows = destination tokens "
                                                          "(`attention_rows`), columns = source tokens")
    attention_rows: list[int]
    query: str | None = None
    gold: str | None = None
    labels: list[str]
    label_dla: list[float] = Field(..., description="the head's last-token write dotted with each label's "
                                                    "unembedding row (first token)")
    label_probs: list[float]
    write_norm: float
    tr: float = Field(..., description="this prompt: ||P o|| over the labels")
    tl: float | None = Field(None, description="this prompt (needs a gold label)")
    ranks: dict[str, int] = Field(default_factory=dict, description="rank of the head on the task (1 = largest): "
                                                                    "tr, tl, induction")
    induction: float
    top: list[TokenProb]
    pred: str
    gold_prob: float | None = None
    ablated: HeadAblation
    logit_lens: list[list[TokenProb]] | None = None
    layer_attention: list[list[list[float]]] | None = Field(
        None, description="with `layer_heads`: every head of the layer, (heads, rows, tokens), rows `attention_rows`")
    shots: int


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


def _prompt(ctx: Context, p: HeadViewParams) -> dict[str, Any]:
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


def unknown_words(tok: Any, text: str) -> str | None:
    """A warning when the tokenizer reads part of `text` as its unknown token (a word-level vocabulary, such as
    the embedded model's, turns "hello world" into `<unk> <unk>`), naming the words; None when it reads it all."""
    unk = unknown_id(tok)
    if unk is None:
        return None
    ids = tok(text, add_special_tokens=False)["input_ids"]
    n = sum(i == unk for i in ids)
    if not n:
        return None
    words = list(dict.fromkeys(w[:40] for w in text.split() if unk in tok(w, add_special_tokens=False)["input_ids"]))
    shown = ", ".join(repr(w) for w in words[:8]) + (", ..." if len(words) > 8 else "")
    which = "every token of your prompt is" if n == len(ids) else f"{n} of your prompt's {len(ids)} tokens are"
    return (f"{which} unknown to this model's tokenizer and read as {tok.unk_token!r}" + (f" ({shown})" if shown else "")
            + ": the model sees no word there, so what it attends to and predicts there means nothing. Use words "
            "from the task's prompts.")


def head_view(ctx: Context, p: HeadViewParams) -> dict[str, Any]:
    """The head's attention pattern, per-label DLA, TR / TL, ranks and ablation effect on one prompt."""
    lm = ctx.lm
    layer, h = p.head
    mask = head_mask(lm, [(layer, h)])  # out-of-range heads are an error before any pass
    pr = _prompt(ctx, p)
    tok = lm.tokenizer
    ids = prompt_ids(tok, pr["text"])
    if lm.max_positions and len(ids) > lm.max_positions:
        raise TaskError(f"the prompt has {len(ids)} tokens, over the model's context window of {lm.max_positions}")
    if p.text is not None:
        unknown = unknown_words(tok, p.text)
        if unknown is not None:
            ctx.warn(unknown)
    scores = dict(shots=p.shots, prompts=p.prompts, seed=p.seed)
    # progress by the plan's stages (`work`); cached head scores weigh nothing
    cached = p.ranks and ctx.cached("head_scores", [scores], record=False) is not None
    share = planned(ctx, p, {"head scores"} if cached else ())
    ctx.progress(share["forward pass"][0], "forward pass")
    x = torch.tensor([ids], device=lm.device)
    with lm.lock, torch.inference_mode(), eager_attention(lm):
        with hooked(lm, capture_z=True, capture_hidden=p.logit_lens) as trace:
            out = lm.model(input_ids=x, output_attentions=True, use_cache=False, logits_to_keep=1)
        logits = out.logits[0, -1].float()
        layer_att = out.attentions[layer][0].float().cpu()  # (heads, T, T)
        att = layer_att[h]  # (T, T)
        ctx.progress(share["ablated pass"][0], "ablated pass")
        with hooked(lm, head_mask=mask[None].to(lm.device)):
            ablated = lm.model(input_ids=x, use_cache=False, logits_to_keep=1).logits[0, -1].float()
        lens = None
        if p.logit_lens:
            hs = torch.stack([t[0] for t in trace.hidden])  # (layers, d_model)
            lens_logits = lm.model.get_output_embeddings()(lm.final_norm(hs)).float()
            lens = [_top(lm, lens_logits[i], LENS_TOP) for i in range(lm.n_layers)]
    z = trace.z(lm.n_heads)[0, layer, h].float()  # (head_dim,)
    o = head_writes(z[None, None], lm.w_o(layer)[h:h + 1], trace.write_scale[layer])[0, 0]  # (d_model,)
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
    ctx.progress(share["ablated pass"][1], "ranks")
    if p.ranks:  # the task's cached head maps hold the induction map too
        sc = ctx.call("head_scores", **scores, batch_size=p.batch_size,
                      progress=ctx.stage(*share["head scores"], "head scores"))
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
        "layer_attention": layer_att[:, rows].mul(1e4).round().div(1e4).tolist() if p.layer_heads else None,
    }
