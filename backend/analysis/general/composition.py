"""Kind `composition`: how heads compose, from the weights alone, and which labels a head writes (its OV circuit).

Q-, K- and V-composition (Elhage et al. 2021) of every earlier head into a set of receiver heads (the task's top TR,
TL and induction heads, or a given list), in TransformerLens's conventions (`primitives/composition.py`: W_OV =
W_V W_O, W_QK = W_Q W_K^T in residual-stream space, kv heads shared under grouped-query attention, norms folded in,
a post-attention norm linearised as the TR / TL maps do):
    q, k, v           (n, n)   among the receiver set: [sender i, receiver j], NaN unless layer_i < layer_j
    feeders                    per receiver and mode, the earlier heads of the whole model that compose most with it,
                               with the z-score of the score among all of that receiver's senders
    full              (L H, L H) every pair, rows and columns l * H + h, for a model of at most FULL_MAX_HEADS heads
For one head (l, h), its OV circuit on the task's labels (the first tokens of its label words, U their unembedding
rows, e their embedding rows as the model embeds them, Gemma's scale included):
    ov_labels[i, j] = (norm_l(e_i) W_V[kv(h)] W_O[h] ⊙ g_post) . U[j]      (labels, labels)
the logit head h writes on label j when it attends to a token of label i only; norm_l (the head's input norm) is
applied exactly, g_post (Gemma 2 / 3) is the post-attention norm's gain with its 1 / rms left out (the TR / TL
linearisation, a positive factor of each row), and biases are left out. With `apply_ln`, writes are scaled by the
final norm's gain (centred for LayerNorm), its 1 / rms left out too. Every number is a function of the weights (and
the task's label tokens): there is no sampling, so no interval.
"""
from __future__ import annotations

from typing import Any, ClassVar, Literal

import numpy as np
import torch
from pydantic import Field, model_validator

from ..kernel import Context
from ..kinds import get_kind
from ..params import Bool, Head, Heads, Int, PromptParams
from ..primitives import composition as comp
from ..primitives.batching import build_prompts, encode
from ..primitives.configs import head_mask
from ..primitives.notes import Note
from ..primitives.cost import NONE, Cost, Shape, Sizes, Work, stage
from ..primitives.selection import top_heads
from ..primitives.stages import planned
from ..results import Grid, Model, Result

FULL_MAX_HEADS = 144
"""The full (L H, L H) matrices are returned for models of at most this many heads (GPT-2 small's 144; Gemma 3
270M has 72, SmolLM2-135M 270)."""
FLOPS_PER_TOKEN = 24  # x n_layers x d_model^2: a token's forward pass (attention and MLP), what a stage is counted in


class CompositionParams(PromptParams):
    """kind `composition`: Q-, K- and V-composition scores from the weights into the top TR / TL / induction heads
    (or `heads`), and one head's OV circuit on the task's labels."""

    heads: Heads | None = Field(None, description="receiver heads [[layer, head], ...]; default: the task's top "
                                                   "TR, TL and induction heads (from `head_scores`)")
    top_k: Int = Field(3, ge=1, le=32, description="how many top heads of each of TR, TL and induction form the "
                                                   "receiver set (when `heads` is not given)")
    head: Head | None = Field(None, description="the head whose OV circuit on the labels is shown; default: the "
                                                "top TL head (or the first receiver)")
    feeders: Int = Field(5, ge=1, le=64, description="earlier heads listed per receiver and mode")
    full: Bool = Field(True, description=f"also every pair of heads, (L H, L H), for a model of at most "
                                         f"{FULL_MAX_HEADS} heads")
    fold_norms: Bool = Field(True, description="fold the norms' gains into the weights (TransformerLens's fold_ln); "
                                               "off: the raw projections")
    apply_ln: Bool = Field(False, description="OV circuit: scale the head's writes by the final norm's gain")
    max_labels: Int = Field(16, ge=1, le=64, description="OV circuit: at most this many label tokens")
    not_in_key: ClassVar[frozenset[str]] = frozenset({"batch_size"})

    @model_validator(mode="after")
    def _nonnegative(self) -> "CompositionParams":
        if self.heads is not None and not self.heads:
            raise ValueError("give at least one receiver head, or none for the task's top heads")
        if self.head is not None and (self.head[0] < 0 or self.head[1] < 0):
            raise ValueError("layer and head indices must be non-negative")
        return self

    def scores_params(self) -> dict[str, Any]:
        """The `head_scores` request the receiver set is read from."""
        return {"shots": self.shots, "prompts": self.prompts, "seed": self.seed, "top_k": self.top_k}

    def receivers(self, shape: Shape) -> int:
        """Receivers scored (an upper bound when they are the top sets: their union)."""
        n = shape.heads if self.full and shape.heads <= FULL_MAX_HEADS else 0
        return max(n, min(len(self.heads) if self.heads is not None else 3 * self.top_k, shape.heads))

    def work(self, shape: Shape, sizes: Sizes) -> Work:
        """`head scores` (when the receivers are the top sets), then `composition`: 3 modes x (every sender x every
        receiver, half of them later) x 2 dh^2 d flops, dh ~ d / heads, in tokens of a forward pass."""
        w = NONE
        if self.heads is None:
            w += get_kind("head_scores").params(**self.scores_params()).work(shape, sizes).named("head scores")
        dh = shape.d_model / max(shape.n_heads, 1)
        flops = 3 * shape.heads * self.receivers(shape) * dh * dh * shape.d_model
        return w + stage("composition", Cost(tokens=flops / (FLOPS_PER_TOKEN * shape.n_layers * shape.d_model ** 2)))


class Feeder(Model):
    receiver: Head
    mode: Literal["q", "k", "v"]
    sender: Head
    score: float
    z: float = Field(..., description="(score - mean) / sd over every earlier head into this receiver, this mode")


class CompositionResult(Result):
    """Composition scores among the receiver heads, their top feeders, and one head's OV circuit on the labels."""

    n_layers: int
    n_heads: int
    n_kv_heads: int
    heads: list[Head] = Field(..., description="the receiver set, by layer then head")
    roles: list[list[str]] = Field(..., description="per receiver: tr, tl, induction (its top sets) or given")
    q: Grid = Field(..., description="Q-composition (n, n): [sender i, receiver j], NaN unless layer_i < layer_j")
    k: Grid = Field(..., description="K-composition, as q")
    v: Grid = Field(..., description="V-composition, as q")
    feeders: list[Feeder]
    mean: dict[str, list[float | None]] = Field(..., description="per mode, each receiver's mean score over every "
                                                                 "earlier head (what an ordinary sender gives); "
                                                                 "None for a layer-0 receiver")
    full: dict[str, Grid] | None = Field(None, description="per mode, (L H, L H): rows senders, columns receivers, "
                                                           "index l * H + h; NaN unless the sender's layer is "
                                                           "earlier")
    head: Head = Field(..., description="the head of the OV circuit")
    labels: list[str] = Field(..., description="the label tokens (first tokens of the task's labels)")
    ov_labels: Grid = Field(..., description="(labels, labels): [input label i, label j] the logit the head writes "
                                             "on j when it reads i's embedding")
    copying: float = Field(..., description="share of labels whose own logit is the largest in their row")
    copy_margin: float = Field(..., description="mean over rows of ov[i, i] - mean_{j != i} ov[i, j]")
    linearised: list[str] = Field(..., description="what was folded in or linearised, in words")


def layer_weights(lm: Any, layer: int, fold_norms: bool) -> comp.LayerWeights:
    """One layer's per-head weights in float32 on the model's device, norms folded in when `fold_norms`
    (`comp.fold`)."""
    w_q, w_k, w_v = lm.w_qkv(layer)
    post = fold_norms and lm.spec.post_attn_norm is not None
    return comp.fold(w_q, w_k, w_v, lm.w_o(layer).detach(), lm.input_gain(layer) if fold_norms else None,
                     lm.post_attn_gain(layer) if post else None, lm.qk_norm_gains(layer) if fold_norms else None,
                     centered=fold_norms and lm.spec.centered)


def _layers(lm: Any, fold_norms: bool) -> list[comp.LayerWeights]:
    """Every layer's `layer_weights` (tests and benchmarks; the kind keeps only the receivers' layers)."""
    return [layer_weights(lm, l, fold_norms) for l in range(lm.n_layers)]


def linearised(lm: Any, fold_norms: bool, apply_ln: bool) -> list[str]:
    """The statements of what the scores and the OV circuit take the norms to be."""
    if not fold_norms:
        out = ["norms not folded: the scores use the raw projections W_Q, W_K, W_V, W_O"]
    else:
        out = [f"each head's input norm ({lm.spec.input_norm}) folded into W_Q, W_K, W_V as its gain"
               + (" after centring (LayerNorm)" if lm.spec.centered else "") + "; its 1/rms cancels in the scores"]
        if lm.spec.qk_norms and lm.qk_norm_gains(0) is not None:
            out.append("the per-head query and key norms folded in as their gains (head_dim side)")
    if lm.spec.post_attn_norm:
        out.append(f"post-attention norm ({lm.spec.post_attn_norm}) linearised as in the TR / TL maps, write = g * "
                   "(z W_O) / rms: its gain g folded into W_O" + ("" if fold_norms else " (OV circuit only)")
                   + "; its 1/rms cancels in the scores and is a positive factor of each OV-circuit row")
    out.append("OV circuit: the head's input norm applied exactly to each label's embedding row; biases left out"
               + ("; the final norm's gain applied, its 1/rms left out" if apply_ln else
                  "; writes dotted with the unembedding as in the DLA maps (no final norm)"))
    out.append("rotary position embeddings are left out of W_QK (as in TransformerLens)")
    return out


def _label_tokens(ctx: Context, p: CompositionParams) -> list[int]:
    """The distinct first tokens of the task's labels over its prompts, in order, at most `max_labels`."""
    built = build_prompts(ctx.lm, ctx.task, p.shots, p.prompts, p.seed)
    for w in built.warnings:
        ctx.warn(w)
    ids = list(dict.fromkeys(t for row in encode(ctx.lm, built.prompts, ctx.task.kind).label_ids for t in row))
    if len(ids) > p.max_labels:
        ctx.warn(f"the task has {len(ids)} label tokens: the OV circuit shows the first {p.max_labels}")
    return ids[:p.max_labels]


def ov_circuit(lm: Any, head: tuple[int, int], ids: list[int], apply_ln: bool = False) -> torch.Tensor:
    """(labels, labels) float64: [i, j] = (norm_l(e_i) W_V[kv(h)] W_O[h] ⊙ g_post [⊙ g_final]) . U[j] (module
    docstring) for the label tokens `ids`."""
    l, h = head
    idx = torch.tensor(ids, device=lm.device)
    with torch.inference_mode():
        e = lm.model.get_input_embeddings()(idx[None])[0]  # (n, d), as the model embeds them
        x = lm.input_norm(l)(e).double()
        _, _, w_v = lm.w_qkv(l, torch.float64)
        o = x @ w_v[h // (lm.n_heads // lm.n_kv_heads)] @ lm.w_o(l, torch.float64)[h]  # (n, d)
        if lm.spec.post_attn_norm:
            o = o * lm.post_attn_gain(l).double()
        if apply_ln:
            o = (o - o.mean(-1, keepdim=True) if lm.spec.centered else o) * lm.norm_gain().double()
        return (o @ lm.unembed.detach()[idx].double().T).cpu()


def _nan_list(a: torch.Tensor) -> np.ndarray:
    return a.double().numpy()


def composition(ctx: Context, p: CompositionParams) -> dict[str, Any]:
    """Composition scores into the receiver set, their feeders, the full matrices (small models), and the OV
    circuit of `head` on the labels."""
    lm = ctx.lm
    L, H = lm.n_layers, lm.n_heads
    if p.heads is not None:
        head_mask(lm, p.heads)  # out-of-range heads are an error before any work
    if p.head is not None:
        head_mask(lm, [p.head])
    cached = p.heads is None and ctx.cached("head_scores", [p.scores_params()], record=False) is not None
    share = planned(ctx, p, {"head scores"} if cached else ())
    roles: dict[tuple[int, int], list[str]] = {}
    top_tl: list[tuple[int, int]] = []
    if p.heads is None:
        sc = ctx.call("head_scores", **p.scores_params(), batch_size=p.batch_size,
                      progress=ctx.stage(*share["head scores"], "head scores"))
        top_tl = [tuple(x) for x in sc.top_tl]
        sets = {"tr": [tuple(x) for x in sc.top_tr], "tl": top_tl,
                "induction": top_heads(np.asarray(sc.induction, dtype=float), k=p.top_k)}
        for name, hs in sets.items():
            for hd in hs:
                roles.setdefault(hd, []).append(name)
    else:
        roles = {tuple(hd): ["given"] for hd in p.heads}
    heads = sorted(roles)
    lo, hi = share["composition"]
    ctx.progress(lo, "composition: reading the weights")
    full = p.full and L * H <= FULL_MAX_HEADS
    if p.full and not full:
        ctx.warn(Note(f"the full (L H, L H) matrices are left out: the model has {L * H} heads, over "
                      f"{FULL_MAX_HEADS}; the scores into the receivers are over every earlier head all the same"))
    cols = [(l, h) for l in range(L) for h in range(H)] if full else heads
    pick = [cols.index(hd) for hd in heads]
    rows = [l * H + h for l, h in heads]
    out: dict[str, Any] = {"q": None, "k": None, "v": None}
    feeders, means, fulls = [], {}, {}
    # one layer's weights at a time: every layer's sender factor (heads, head_dim, d) is kept, the weights only at
    # the receivers' layers
    layers, senders = {}, []
    for l in range(L):
        ctx.check()
        w = layer_weights(lm, l, p.fold_norms)
        senders.append(comp.sender_factors(w))
        if any(c[0] == l for c in cols):
            layers[l] = w
    for i, mode in enumerate(comp.MODES):
        m = comp.composition_matrix(layers, cols, mode, ctx.check, senders).cpu()  # (L H, len(cols))
        ctx.progress(lo + (hi - lo) * (i + 1) / 3, f"composition: {mode.upper()}")
        if full:
            fulls[mode] = _nan_list(m)
        into = m[:, pick]  # every sender into each receiver, (L H, n)
        out[mode] = _nan_list(into[rows])
        means[mode] = []
        for j, r in enumerate(heads):
            col = into[:, j]
            ok = ~torch.isnan(col)
            vals = col[ok].double()
            mu = float(vals.mean()) if len(vals) else None
            sd = float(vals.std(unbiased=False)) if len(vals) > 1 else 0.0
            means[mode].append(mu)
            if mu is None:
                continue
            for s in torch.argsort(torch.where(ok, col, -1.0), descending=True, stable=True)[:min(p.feeders,
                                                                                                  int(ok.sum()))]:
                s = int(s)
                feeders.append({"receiver": r, "mode": mode, "sender": (s // H, s % H), "score": float(col[s]),
                                "z": (float(col[s]) - mu) / sd if sd > 0 else 0.0})
    head = tuple(p.head) if p.head is not None else (top_tl[0] if top_tl else heads[0])
    ids = _label_tokens(ctx, p)
    ov = ov_circuit(lm, head, ids, p.apply_ln)
    n = ov.shape[0]
    diag = ov.diagonal()
    off = (ov.sum(1) - diag) / max(n - 1, 1)
    ctx.progress(hi, "OV circuit")
    return {"n_layers": L, "n_heads": H, "n_kv_heads": lm.n_kv_heads, "heads": heads,
            "roles": [roles[hd] for hd in heads], **out, "feeders": feeders, "mean": means,
            "full": fulls or None, "head": head, "labels": [lm.tokenizer.decode([t]) for t in ids],
            "ov_labels": ov.numpy(), "copying": float((ov.argmax(1) == torch.arange(n)).double().mean()),
            "copy_margin": float((diag - off).mean()) if n > 1 else 0.0,
            "linearised": linearised(lm, p.fold_norms, p.apply_ln)}
