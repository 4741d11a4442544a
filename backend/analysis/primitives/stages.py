"""Progress over an analysis's stages, from its cost plan (`cost.Work`: the stages in the order its run takes
them): each stage takes the share of the bar its weight (`cost.Cost.weight`) is of the whole, a stage whose result
is cached already 0. The plan is the admission's own (`ctx.plan`, carried with the job); a kind called from
another makes its own, on the loaded model's shape and the task's sizes.

    share = planned(ctx, p, skip={"head scores"})   # {stage: (lo, hi)}, in order
    ctx.stage(*share["training"], "training")
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from .cost import Shape, Sizes, Work, mean_sizes, sizes_of


def plan_spans(plan: Work | Mapping[str, Work], shape: Shape, skip: Iterable[str] = ()) -> dict[str, tuple[float, float]]:
    """Consecutive (lo, hi) shares of [0, 1] per stage of `plan` (a plan's stages, or named sub-plans), in
    proportion to their weights, those in `skip` 0; all equal when every weight is 0."""
    gone = set(skip)
    named = plan.stages if isinstance(plan, Work) else [(n, w.cost()) for n, w in plan.items()]
    costs = {n: 0.0 if n in gone else max(0.0, c.weight(shape)) for n, c in named}
    total = sum(costs.values())
    if total <= 0:
        costs, total = dict.fromkeys(costs, 1.0), float(len(costs) or 1)
    out, acc = {}, 0.0
    for name, c in costs.items():
        lo, acc = acc / total, acc + c
        out[name] = (lo, min(1.0, acc / total))
    return out


def between(share: Mapping[str, tuple[float, float]], first: str, last: str | None = None) -> tuple[float, float]:
    """The span from stage `first`'s start to stage `last`'s end (None: the end of the bar)."""
    return share[first][0], share[last][1] if last is not None else 1.0


def own_plan(ctx: Any, p: Any, tasks: Sequence[Any] | None = None) -> Work:
    """The job's plan: the admission's (`ctx.plan`) for the admitted params, else `p.work` on the loaded model's
    shape and the task's (or `tasks`' mean) prompt sizes."""
    if getattr(ctx, "plan", None) is not None and getattr(ctx, "planned_params", None) is p:
        return ctx.plan
    sizes = (mean_sizes([run_sizes(ctx.lm, t) for t in tasks], [t.name for t in tasks]) if tasks is not None
             else run_sizes(ctx.lm, ctx.task))
    return p.work(shape_of(ctx.lm), sizes)


def planned(ctx: Any, p: Any, skip: Iterable[str] = ()) -> dict[str, tuple[float, float]]:
    """`plan_spans` of the job's own plan."""
    return plan_spans(own_plan(ctx, p), shape_of(ctx.lm), skip)


def planned_over(ctx: Any, p: Any, tasks: Sequence[Any], skip: Iterable[str] = ()) -> dict[str, tuple[float, float]]:
    """`planned` of a kind over several `tasks` (its plan on the mean of their prompt sizes)."""
    return plan_spans(own_plan(ctx, p, tasks), shape_of(ctx.lm), skip)


def shape_of(lm: Any) -> Shape:
    """The loaded model's `Shape` (the decoder's and the unembedding's parameters counted)."""
    decoder = sum(p.numel() for layer in lm.layers for p in layer.parameters())
    return Shape(lm.n_layers, lm.n_heads, lm.d_model, lm.max_positions, decoder, "loaded",
                 lm.unembed.numel() / max(decoder, 1), lm.n_kv_heads)


def run_sizes(lm: Any, task: Any) -> Sizes:
    """The task's prompt sizes as the estimate counts them (`cost.sizes_of`), with the loaded model's tokenizer."""
    tok = lm.tokenizer
    return sizes_of(task, lambda text: len(tok(text)["input_ids"]))
