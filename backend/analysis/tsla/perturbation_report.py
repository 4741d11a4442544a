"""Kind `perturbation_report`: what perturbing the demonstrations does to ICL, to the head maps, and to the effect of
ablating the original top TR and TL heads.

For each perturbation: ICL metrics; TR and TL maps under it and their differences from the unperturbed maps,
(layers, heads); and metrics when the *unperturbed* top-k TR heads, top-k TL heads, or k random heads are
zero-ablated on the perturbed prompts. A perturbation that does not apply to the task reports why.
"""
from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from ..primitives import options as o

from ...tasks.base import TaskError
from ...tasks.perturb import get_perturbation
from ..kernel import Context
from ..kinds import get_kind
from ..params import PromptParams, Selection
from ..primitives import cost
from ..primitives.cost import Shape, Sizes, Work, passes
from ..primitives.stages import planned
from ..results import Grid, Head, Metrics, Model, Result
from ..primitives.batching import Encoded, build_prompts, encode
from .scoring_pass import score_heads
from ..primitives.configs import RowConfig, head_mask, score_configs


class PerturbationReportParams(Selection, PromptParams):
    """kind `perturbation_report`: ICL metrics, TR/TL maps and ablation effects under demonstration perturbations."""

    perturbations: list[o.Perturbation] = Field(default_factory=lambda: list(o.PERTURBATIONS), min_length=1)

    @field_validator("perturbations")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        return list(dict.fromkeys(v))

    def work(self, shape: Shape, sizes: Sizes) -> Work:
        t = sizes.prompt(self.shots)
        base = get_kind("head_scores").params(shots=self.shots, prompts=self.prompts, top_pct=self.top_pct,
                                         top_k=self.top_k).work(shape, sizes).named("head scores")
        n = sizes.n(self.prompts)
        ablations = (passes("ablations", n, t)  # the clean pass, then the TR, TL and random sets
                     + passes("ablations", 3 * n, t * cost.ablation_share(shape)))
        plan = base + ablations.named("ablating, unperturbed")
        for name in self.perturbations:  # in the run's order: each perturbation's head maps, then its ablations
            plan = plan + passes(f"{name}: head maps", n, t) + ablations.named(f"{name}: ablating")
        return plan


class PerturbEntry(Model):
    skipped: str | None = None
    icl: Metrics | None = None
    tr: Grid | None = None
    tl: Grid | None = None
    tr_diff: Grid | None = None
    tl_diff: Grid | None = None
    ablation: dict[str, Metrics] | None = None
    example: str | None = None


class PerturbationReportResult(Result):
    top_k: int
    shots: int
    prompts: int
    heads: dict[str, list[Head]]
    perturbations: dict[str, PerturbEntry]


def perturbation_report(ctx: Context, p: PerturbationReportParams) -> dict[str, Any]:
    """The unperturbed baseline ("none") plus one entry per perturbation (or `skipped` with the reason)."""
    lm, task = ctx.lm, ctx.task
    scores = dict(shots=p.shots, prompts=p.prompts, seed=p.seed, top_pct=p.top_pct, top_k=p.top_k)
    # progress by the plan's stages (`work`); cached head scores weigh nothing
    share = planned(ctx, p, {"head scores"} if ctx.cached("head_scores", [scores], record=False) is not None else ())
    base = ctx.call("head_scores", **scores, batch_size=p.batch_size,
                    progress=ctx.stage(*share["head scores"], "head scores"))
    k = base.top_k
    # the scores' own random set: `random_heads` from the heads in neither top set (a disjoint control)
    sets = {"tr": base.top_tr, "tl": base.top_tl, "random": [tuple(h) for h in base.random_heads]}
    configs = [RowConfig()] + [RowConfig(mask=head_mask(lm, s)) for s in sets.values()]

    def ablations(enc: Encoded, progress: Any = None) -> dict[str, dict[str, Any]]:
        res = score_configs(lm, enc, configs, batch_size=p.batch_size * 2, progress=progress)
        return {name: res.summary(i) for i, name in enumerate(["none", *sets])}

    original = encode(lm, build_prompts(lm, task, base.shots, p.prompts, p.seed).prompts, task.kind)
    out: dict[str, Any] = {"none": {"icl": base.icl, "tr": base.tr, "tl": base.tl,
                                    "ablation": ablations(original, ctx.stage(*share["ablating, unperturbed"],
                                                                              "ablating, unperturbed"))}}
    for name in p.perturbations:
        ctx.progress(share[f"{name}: head maps"][0], name)
        try:
            built = build_prompts(lm, task, base.shots, p.prompts, p.seed, perturb=get_perturbation(name))
            enc = encode(lm, built.prompts, task.kind)
        except TaskError as e:
            out[name] = {"skipped": str(e)}
            continue
        maps = score_heads(lm, enc, p.batch_size, progress=ctx.stage(*share[f"{name}: head maps"], f"{name}: head maps"))
        out[name] = {"icl": maps.metrics(), "tr": maps.tr, "tl": maps.tl, "tr_diff": maps.tr - base.tr,
                     "tl_diff": maps.tl - base.tl,
                     "ablation": ablations(enc, ctx.stage(*share[f"{name}: ablating"], f"{name}: ablating")),
                     "example": built.prompts[0].text[-400:]}
    return {"top_k": k, "shots": base.shots, "prompts": len(original.ids),
            "heads": {n: list(s) for n, s in sets.items()}, "perturbations": out}
