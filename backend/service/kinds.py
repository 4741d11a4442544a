"""The built-in job kinds: model_info, scores, icl, ablation_curves, ablate, steer, geometry, perturb.

Each calls one analysis function with the job's model, task and progress callback; the analyses cache
their results on disk themselves. Analysis modules are imported inside the functions (torch is heavy).
"""
from __future__ import annotations

from typing import Any

from .registry import JobContext, register_job_kind
from .schemas import (AblateParams, AblationCurvesParams, GeometryParams, IclParams, ModelParams, PerturbParams,
                      ScoresParams, SteerParams)


@register_job_kind("model_info", ModelParams, "load a model (it stays resident) and describe it", uses_task=False)
def run_model_info(ctx: JobContext, p: ModelParams) -> dict[str, Any]:
    ctx.progress(0.0, f"loading {p.model}")
    return ctx.lm().info()


@register_job_kind("scores", ScoresParams, "TR, TL, DLA-TR, DLA-TL and induction head maps with accuracy")
def run_scores(ctx: JobContext, p: ScoresParams) -> dict[str, Any]:
    from ..analysis.scores import head_scores

    r = head_scores(ctx.lm(), ctx.task(), shots=p.shots, n_prompts=p.prompts, seed=p.seed, batch_size=p.batch_size,
                    apply_ln=p.apply_ln, top_pct=p.top_pct, cache=True, progress=ctx.progress)
    return r.to_json()


@register_job_kind("icl", IclParams, "accuracy and TR ratio against the number of demonstrations")
def run_icl(ctx: JobContext, p: IclParams) -> dict[str, Any]:
    from ..analysis.icl import icl_curve

    return icl_curve(ctx.lm(), ctx.task(), shots=p.shots, n_prompts=p.prompts, seed=p.seed, batch_size=p.batch_size,
                     cache=True, progress=ctx.progress, examples=p.examples)


@register_job_kind("ablation_curves", AblationCurvesParams,
                   "accuracy and TR ratio against the number of top heads ablated, per order")
def run_ablation_curves(ctx: JobContext, p: AblationCurvesParams) -> dict[str, Any]:
    from ..analysis.ablation import ablation_curves

    return ablation_curves(ctx.lm(), ctx.task(), orders=p.orders, ks=p.ks, mode=p.mode, shots=p.shots,
                           n_prompts=p.prompts, seed=p.seed, random_seeds=p.random_seeds, batch_size=p.batch_size,
                           positions=p.positions, cache=True, progress=ctx.progress)


def _admit_heads(p: AblateParams, task: Any, model: dict[str, Any] | None) -> None:
    if model is None:
        return  # checked by the analysis once the model is loaded
    bad = [(l, h) for l, h in (p.heads or []) if l >= model["n_layers"] or h >= model["n_heads"]]
    if bad:
        raise ValueError(f"head(s) {bad[:5]} outside the model's {model['n_layers']} layers x "
                         f"{model['n_heads']} heads")


@register_job_kind("ablate", AblateParams, "ablate a head set: accuracy, TR ratio and per-prompt rows before/after",
                   admit=_admit_heads)
def run_ablate(ctx: JobContext, p: AblateParams) -> dict[str, Any]:
    from ..analysis.ablation import ablate

    return ablate(ctx.lm(), ctx.task(), heads=p.heads, mode=p.mode, shots=p.shots, n_prompts=p.prompts, seed=p.seed,
                  batch_size=p.batch_size, positions=p.positions, cache=True, progress=ctx.progress)


@register_job_kind("steer", SteerParams, "inject task vectors (TR, TL, random, function, vanilla) into zero-shot prompts",
                   admit=_admit_heads)
def run_steer(ctx: JobContext, p: SteerParams) -> dict[str, Any]:
    from ..analysis.steering import steer

    return steer(ctx.lm(), ctx.task(), vectors=p.vectors, layer=p.layer, alpha=p.alpha, shots=p.shots,
                 n_prompts=p.prompts, seed=p.seed, top_pct=p.top_pct, heads=p.heads, batch_size=p.batch_size,
                 cache=True, progress=ctx.progress)


@register_job_kind("geometry", GeometryParams, "hidden-state alignment, logit difference, rotation and PCA per layer")
def run_geometry(ctx: JobContext, p: GeometryParams) -> dict[str, Any]:
    from ..analysis.geometry import geometry

    return geometry(ctx.lm(), ctx.task(), layer=p.layer, alpha=p.alpha, shots=p.shots, n_prompts=p.prompts,
                    seed=p.seed, final_norm=p.final_norm, pca_layer=p.pca_layer, top_pct=p.top_pct,
                    batch_size=p.batch_size, cache=True, progress=ctx.progress)


@register_job_kind("perturb", PerturbParams, "demonstration perturbations: accuracy, TR ratio, map differences, ablations")
def run_perturb(ctx: JobContext, p: PerturbParams) -> dict[str, Any]:
    from ..analysis.perturbations import perturbation_report

    return perturbation_report(ctx.lm(), ctx.task(), perturbations=p.perturbations, shots=p.shots,
                               n_prompts=p.prompts, seed=p.seed, k=p.k, top_pct=p.top_pct, batch_size=p.batch_size,
                               cache=True, progress=ctx.progress)
