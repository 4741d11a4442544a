"""Kind `activation_patching`: activation patching of every head, from clean ICL prompts into a corrupted prompt set.

Source: the clean k-shot ICL prompts of the head maps (the same held-out queries, shots and seed as `scores`).
Target, with the same queries in the same order: the zero-shot prompts, or the k-shot prompts with perturbed
demonstrations (shuffled inputs, random labels, flipped labels: the gold answer is the same token).
For target prompt i and head (l, h), z[l, h] at the last token (the output projection's input, split by head;
shapes (prompts, layers, heads, head_dim)) is replaced by
    paired: clean prompt i's own z[l, h]                      (TransformerLens' activation patching)
    mean:   the mean of z[l, h] over the clean prompts        (the function vector's causal indirect effect)
and the gold answer's first-token logit g and probability p are read out. With g_c, g_t (prompts,) the clean and
target runs and g_p (layers, heads, prompts) the patched ones:
    recovered[l, h]  = mean_i (g_p[l, h, i] - g_t[i]) / mean_i (g_c[i] - g_t[i])    the share of the gold logit's
                       gap recovered: 1 = the head alone restores the clean gold logit, 0 = no change
    logit_gain[l, h] = mean_i (g_p[l, h, i] - g_t[i])                                 in logits
    prob_gain[l, h]  = mean_i (p_p[l, h, i] - p_t[i])    with patch="mean" and target="shuffled_inputs": the CIE
each (layers, heads). Patching a prompt set into itself changes nothing: g_p = g_t (recovered 1 when the target
is the clean run, 0 otherwise). The TR / TL maps of the same prompts (`scores`, cached) give the rank
correlations and top-set overlaps beside the map.
"""
from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import Field

from ..primitives import options as o
from ...tasks.base import TaskError
from ..kernel import Context
from ..kinds import get_kind
from ..params import Int, PromptParams, Selection
from ..primitives.cost import Shape, Sizes, Work, passes, steps
from ..primitives.stages import planned
from ..results import Grid, Head, Metrics, Overlap, Result
from ..primitives.batching import build_prompts, encode
from ..primitives.capture import capture
from ..primitives.patch import Target, gold_ids, patch_heads, recovered_share, recovered_stderr, target_prompts
from ..primitives.stats import stderr
from ..primitives.predict import evaluate
from ..primitives.selection import n_top, overlap, top_heads



class ActivationPatchingParams(Selection, PromptParams):
    """kind `activation_patching`: every head's last-token z patched from the clean ICL prompts into a corrupted set."""

    target: Target = Field("zero_shot", description="the prompt set patched into: zero-shot prompts, or the k-shot "
                                                    "prompts with perturbed demonstrations")
    patch: Literal["paired", "mean"] = Field("paired", description="paired: clean prompt i's own z into target i; "
                                                                   "mean: the clean prompts' mean z into every one")
    batch_size: Int = Field(o.CONFIG_BATCH_SIZE, ge=1, le=1024)

    def work(self, shape: Shape, sizes: Sizes) -> Work:
        """Clean ICL prompts: captured, run and scored (3 passes); target prompts: run and scored (2 passes);
        one last-token step per head and prompt; the head scores of the same prompts."""
        n, clean = sizes.n(self.prompts), sizes.prompt(self.shots)
        target = sizes.prompt(0 if self.target == "zero_shot" else self.shots)
        w = passes("clean prompts", 3 * n, clean) + passes("target prompts", 2 * n, target)
        L = max(shape.n_layers, 1)  # a head's patch: a step from its layer on, (L + 1) / 2L of the model on average
        w = w + steps(f"{shape.heads} head patches", n * (shape.heads + 1), share=(L + 1) / (2 * L))
        return w + get_kind("head_scores").params(shots=self.shots, prompts=self.prompts, top_pct=self.top_pct,
                                             top_k=self.top_k).work(shape, sizes).named("head scores")


class ActivationPatchingResult(Result):
    """Per-head patching maps (layers, heads) with the clean and target runs they start from."""

    n_layers: int
    n_heads: int
    shots: int = Field(..., description="demonstrations of the clean prompts")
    prompts: int
    target: str
    patch: str
    recovered: Grid = Field(..., description="share of the clean-minus-target gold logit recovered by the head")
    logit_gain: Grid = Field(..., description="mean change of the gold logit, in logits")
    prob_gain: Grid = Field(..., description="mean change of p(gold) (mean patching into shuffled inputs: the CIE)")
    recovered_se: Grid | None = Field(None, description="per-head standard error of `recovered` over prompts (delta "
                                                        "method of the ratio of means)")
    logit_gain_se: Grid | None = Field(None, description="per-head standard error of `logit_gain` over prompts")
    prob_gain_se: Grid | None = Field(None, description="per-head standard error of `prob_gain` over prompts")
    clean_logit: float = Field(..., description="mean gold logit of the clean ICL prompts")
    target_logit: float = Field(..., description="mean gold logit of the target prompts")
    gap: float = Field(..., description="clean_logit - target_logit: what there is to recover")
    clean: Metrics
    target_metrics: Metrics
    top_k: int
    top: list[Head] = Field(..., description="the top heads by recovered share, best first")
    overlap: dict[str, Overlap] = Field(default_factory=dict, description="recovered vs the tr and tl maps")



def activation_patching(ctx: Context, p: ActivationPatchingParams) -> dict[str, Any]:
    """Patch every head from the clean ICL prompts into the target set: recovered share, logit and p(gold) gains."""
    lm, task = ctx.lm, ctx.task
    if task.builder is not None:
        raise TaskError(f"task {task.name!r} builds its own prompts: it has no zero-shot or perturbed counterpart "
                        f"of the same queries to patch into")
    built = build_prompts(lm, task, p.shots, p.prompts, p.seed)
    for w in built.warnings:
        ctx.warn(w)
    share = planned(ctx, p)  # the plan's stages (`work`): clean prompts, target prompts, head patches, head scores
    clean = encode(lm, built.prompts, task.kind)
    target = encode(lm, target_prompts(task, p.target, built.shots, built.n, p.seed), task.kind)
    if gold_ids(clean) != gold_ids(target) or [q.query for q in clean.prompts] != [q.query for q in target.prompts]:
        raise TaskError(f"the {p.target.replace('_', ' ')} prompts do not pair with the clean ones (another query or "
                        f"gold token): nothing to patch")
    z = capture(lm, clean, "z", reduce="rows", batch_size=p.batch_size,
                progress=ctx.stage(*share["clean prompts"], "clean activations"))  # (prompts, layers, heads, head_dim), CPU
    fill = z.to(lm.device) if p.patch == "paired" else z.mean(0).to(lm.device)
    base = patch_heads(lm, clean, None, batch_size=p.batch_size)
    runs = patch_heads(lm, target, fill, batch_size=p.batch_size, progress=ctx.stage(share["target prompts"][0], share["head scores"][0],
                                                                    "patching heads"))
    L, H = lm.n_layers, lm.n_heads
    g_c, g_t = base.gold_logit[0], runs.gold_logit[0]
    rec, gap = recovered_share(runs.per_head(), g_c, g_t)
    if abs(gap) < 1e-6:
        ctx.warn(f"the clean and the {p.target.replace('_', ' ')} prompts give the same mean gold logit (gap "
                 f"{gap:.2g}): there is nothing to recover, so the recovered share is 0 for every head")
    logit_gain = (runs.per_head() - g_t[None]).mean(1)
    prob_gain = (runs.per_head("gold_prob") - runs.gold_prob[0][None]).mean(1)
    se = {"recovered_se": recovered_stderr(runs.per_head(), g_c, g_t).reshape(L, H),  # from the same per-prompt values
          "logit_gain_se": stderr((runs.per_head() - g_t[None]).T).reshape(L, H),
          "prob_gain_se": stderr((runs.per_head("gold_prob") - runs.gold_prob[0][None]).T).reshape(L, H)}

    k = n_top(L, H, p.top_pct, p.top_k)
    m_clean = evaluate(lm, clean, p.batch_size).metrics
    m_target = evaluate(lm, target, p.batch_size).metrics
    recovered = rec.reshape(L, H)
    sc = ctx.call("head_scores", shots=p.shots, prompts=p.prompts, seed=p.seed, top_pct=p.top_pct, top_k=p.top_k,
                  batch_size=min(p.batch_size, o.BATCH_SIZE), progress=ctx.stage(*share["head scores"], "head scores"))
    return {"n_layers": L, "n_heads": H, "shots": built.shots, "prompts": built.n, "target": p.target,
            "patch": p.patch, "recovered": recovered, "logit_gain": logit_gain.reshape(L, H),
            "prob_gain": prob_gain.reshape(L, H), **se, "clean_logit": float(g_c.mean()),
            "target_logit": float(g_t.mean()),
            "gap": gap, "clean": m_clean, "target_metrics": m_target, "top_k": k, "top": top_heads(recovered, k=k),
            "overlap": {"tr": overlap(recovered, np.asarray(sc.tr), k), "tl": overlap(recovered, np.asarray(sc.tl), k)},
            "multi_token_labels": sorted(set(clean.multi_token) | set(target.multi_token))}
