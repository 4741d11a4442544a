"""Kind `task_vectors`: task vectors extracted from ICL prompts.

Head-set vector (TR, TL, random or a user set S):  v = mean_prompts sum_{(l,h) in S} o[l,h]  (d_model,), with
o[l,h] the head's write into the residual stream (z[l,h] @ W_O[l,h]; through the post-attention norm, linearised,
where the family has one: `primitives.tsla`)
Function vector: the same sum over the top heads by causal indirect effect (CIE), where
    CIE(l, h) = mean_prompts [ p(gold | corrupted, z[l,h] <- mean clean z[l,h]) - p(gold | corrupted) ]
    on shuffled-input prompts, patching the last token only.
Vanilla task vector, per layer l: mean_prompts (h_ICL[l] - h_zero[l]) at the last token, (layers, d_model), with
h[l] the residual stream at the INPUT of decoder layer l (row 0: the embeddings), where every vector "at layer l"
is added (`primitives.layer_inputs`).
Vectors come from prompts whose queries and demonstrations are the seed's demonstration pool, so no held-out
(evaluated) query is ever seen (tasks that build their own prompts: prompts of seed + EXTRACTION_SEED_OFFSET).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch
from pydantic import Field, field_validator

from ..primitives import options as o
from ..primitives.options import EXTRACTION_SEED_OFFSET, FV_PROMPTS
from ...tasks.perturb import get_perturbation
from ..kernel import Context
from ..kinds import get_kind
from ..params import Heads, PromptParams, Selection
from ..primitives.cost import NONE, Shape, Sizes, Work, passes, steps
from ..primitives.engine_fast import STEP_ROWS_FACTOR
from ..results import Model, Result, Vector
from ..primitives.batching import Encoded, Progress, build_prompts, encode
from ..primitives.capture import capture_means, capture_sites
from ..primitives.selection import Head, n_top, top_heads
from ..primitives.stages import planned
from ..primitives.configs import RowConfig, head_mask, score_configs


class TaskVectorsParams(Selection, PromptParams):
    """kind `task_vectors`: task vectors extracted from ICL prompts (head sets, function vector, vanilla)."""

    types: list[o.VectorType] = Field(default_factory=lambda: list(o.VECTOR_TYPES), min_length=1)
    heads: Heads | None = Field(None, description="also a vector of this head set")

    @field_validator("types")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        return list(dict.fromkeys(v))

    def work(self, shape: Shape, sizes: Sizes) -> Work:
        """The run's stages: the head scores (for TR, TL and random sets), one pass of the ICL prompts capturing
        every mean taken from them, the function vector (a clean pass of shuffled-input prompts, then a last-token
        step per head from its layer on: (L + 1) / 2L of the model on average) and the zero-shot states."""
        t, types, n = sizes.prompt(self.shots), set(self.types), sizes.n(self.prompts)
        w = get_kind("head_scores").params(shots=self.shots, prompts=self.prompts).work(shape, sizes).named("head scores") \
            if types & {"tr", "tl", "random"} else NONE
        if types & {"tr", "tl", "random", "fv", "vanilla"} or self.heads:
            w = w + passes("ICL means", n, t, self.batch_size)
        if "fv" in types:
            c, L = min(self.prompts, FV_PROMPTS), max(shape.n_layers, 1)
            w = w + (passes("FV", c, sizes.prompt(max(self.shots, 1)), self.batch_size)
                     + steps("FV", c * (shape.heads + 1), STEP_ROWS_FACTOR * 2 * self.batch_size,
                             share=(L + 1) / (2 * L)))
        if "vanilla" in types:
            w = w + passes("zero-shot states", n, sizes.prompt(0), self.batch_size)
        return w


class VectorEntry(Model):
    vector: Vector
    heads: list[Head] = Field(default_factory=list)


class TaskVectorsResult(Result):
    d_model: int
    shots: int
    vectors: dict[str, VectorEntry]


def head_set_vector(lm: Any, means: torch.Tensor, heads: Sequence[Head], writes: bool = False) -> torch.Tensor:
    """v = sum_{(l,h) in heads} mean write of (l, h), (d_model,): the mean of sums is the sum of means.
    means: the mean z (layers, heads, head_dim), whose mean write is z_mean[l,h] @ W_O[l,h] (exact where no
    post-attention norm rescales the writes); with `writes`, the mean writes themselves (layers, heads, d_model)."""
    v = torch.zeros(lm.d_model, device=lm.device)
    for l, h in heads:
        m = means[l, h].to(lm.device)
        v = v + (m if writes else m @ lm.w_o(l)[h])
    return v


def extraction(task: Any, seed: int) -> tuple[int, str]:
    """Where vectors are extracted from: (seed, "pool") — the seed's demonstration pool, disjoint from the queries
    scored; a task that builds its own prompts cannot draw from its pool: (seed + EXTRACTION_SEED_OFFSET, "held_out")."""
    return (seed, "pool") if task.builder is None else (seed + EXTRACTION_SEED_OFFSET, "held_out")


def causal_indirect_effects(ctx: Context, p: TaskVectorsParams, clean: Encoded, z_clean: torch.Tensor,
                            progress: Progress) -> np.ndarray:
    """CIE of every head, (layers, heads): the gain in gold probability on shuffled-input prompts when the
    head's last-token z is patched with its mean over the clean ICL prompts."""
    lm, task = ctx.lm, ctx.task
    n = min(p.prompts, FV_PROMPTS)
    corrupt = task.build_prompts(max(clean.prompts[0].n_shots, 1), n, p.seed, perturb=get_perturbation(
        "shuffled_inputs"), queries="pool")
    enc = encode(lm, corrupt, task.kind)
    L, H = lm.n_layers, lm.n_heads
    configs = [RowConfig()] + [RowConfig(mask=head_mask(lm, [(l, h)]), scope="last")
                               for l in range(L) for h in range(H)]
    res = score_configs(lm, enc, configs, fill=z_clean, batch_size=p.batch_size * 2, progress=progress)
    gain = res.gold_prob[1:] - res.gold_prob[0][None]
    return gain.mean(1).reshape(L, H)


def task_vectors(ctx: Context, p: TaskVectorsParams) -> dict[str, Any]:
    """{"vectors": {type: {"vector", "heads"}}} for the requested types (and "custom" for `heads`)."""
    lm, task = ctx.lm, ctx.task
    if p.heads:
        head_mask(lm, p.heads)  # out-of-range heads are an error before any pass
    seed, queries = extraction(task, p.seed)
    built = build_prompts(lm, task, p.shots, p.prompts, seed, queries=queries)
    for w in built.warnings:
        ctx.warn(w)
    enc = encode(lm, built.prompts, task.kind)
    L, H = lm.n_layers, lm.n_heads
    k = n_top(L, H, p.top_pct, p.top_k)
    types = list(p.types)
    if "fv" in types and task.builder is not None:
        types.remove("fv")
        ctx.warn(f"no function vector for {task.name!r}: its causal indirect effects need shuffled-input prompts, "
                 f"and this task builds its own prompts")
    sets: dict[str, list[Head]] = {}
    heads = bool({"tr", "tl", "random", "fv"} & set(types) or p.heads)
    vanilla = "vanilla" in types
    zero = encode(lm, task.build_prompts(0, built.n, seed, queries=queries), task.kind) if vanilla else None
    # progress by the plan's stages (`stages`: the estimate's `work`); cached head scores weigh nothing
    scores_params = dict(shots=p.shots, prompts=p.prompts, seed=p.seed, top_pct=p.top_pct, top_k=p.top_k)
    need_scores = bool({"tr", "tl", "random"} & set(types))  # random: the scores' own set
    cached = need_scores and ctx.cached("head_scores", [scores_params], record=False) is not None
    skip = ({"head scores"} if cached else set()) | ({"FV"} if "fv" not in types else set())
    share = planned(ctx, p, skip)
    if need_scores:
        r = ctx.call("head_scores", **scores_params, batch_size=p.batch_size,
                     progress=ctx.stage(*share["head scores"], "head scores"))
        if "tr" in types:
            sets["tr"] = r.top_tr
        if "tl" in types:
            sets["tl"] = r.top_tl
        if "random" in types:  # the scores' random set: drawn from the heads in neither top set
            sets["random"] = [tuple(h) for h in r.random_heads]
    # one pass over the ICL prompts for every mean taken from them: head z (head-set vectors, the function
    # vector's patches); post-attention-norm families: each head's linearised write (its scale varies per prompt);
    # the layers' inputs (the vanilla task vector)
    writes = heads and lm.spec.post_attn_norm is not None
    sites = (["z"] if heads else []) + (["write"] if writes else []) + (["resid"] if vanilla else [])
    got = capture_sites(lm, enc, sites, batch_size=p.batch_size, progress=ctx.stage(*share["ICL means"], "ICL means")) \
        if sites else {}
    z_mean = got.get("z")
    means = got["write"] if writes else z_mean
    if "fv" in types:
        cie = causal_indirect_effects(ctx, p, enc, z_mean, ctx.stage(*share["FV"], "function vector"))
        sets["fv"] = top_heads(cie, k=k)
    if p.heads:
        sets["custom"] = list(p.heads)
    out: dict[str, dict[str, Any]] = {name: {"vector": head_set_vector(lm, means, hs, writes), "heads": hs}
                                      for name, hs in sets.items()}
    if zero is not None:
        zero_states = capture_means(lm, zero, "resid", p.batch_size,
                                    ctx.stage(*share["zero-shot states"], "vanilla task vector: zero-shot states"))
        out["vanilla"] = {"vector": got["resid"] - zero_states, "heads": []}
    order = [t for t in (*p.types, "custom") if t in out]
    return {"d_model": lm.d_model, "shots": built.shots, "vectors": {t: out[t] for t in order}}
