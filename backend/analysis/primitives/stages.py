"""Progress over an analysis's stages, from the same cost plan as its estimate: a kind's `Params.work(shape, sizes)`
(`cost.Work`, its stages in the order it runs them) is what admission counts and what the progress bar is shared
by, each stage taking the share its weight (`cost.Cost.weight`: tokens, calls and rows of logits) is of the whole.
So the fraction done, and the time left a bar extrapolates from it, tell the truth, and there is one cost model.

In a run the plan gets the loaded model's `shape_of(lm)` and the task's `run_sizes` (the estimate's `sizes_of`,
counted by the model's tokenizer; a kind over several tasks, `planned_over`: their mean, as the estimate's); a stage
whose result is cached already weighs 0 (a composite kind's sub-calls are its stages).

    plan = p.work(shape_of(lm), run_sizes(lm, task))
    share = plan_spans(plan, shape_of(lm), skip={"head scores"})   # {stage: (lo, hi)}, in order
    ctx.stage(*share["training"], "training")
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from .cost import Shape, Sizes, Work, mean_sizes, sizes_of


def spans(costs: Mapping[str, float]) -> dict[str, tuple[float, float]]:
    """Consecutive (lo, hi) shares of [0, 1] in proportion to each stage's cost (in the mapping's order); all
    stages equal when every cost is 0."""
    values = [max(0.0, float(c)) for c in costs.values()]
    total = sum(values)
    if total <= 0:
        values, total = [1.0] * len(values), float(len(values) or 1)
    out, acc = {}, 0.0
    for name, c in zip(costs, values):
        lo = acc / total
        acc += c
        out[name] = (lo, min(1.0, acc / total))  # the last ends at 1.0 exactly (the same sum as `total`)
    return out


def plan_spans(plan: Work | Mapping[str, Work], shape: Shape, skip: Iterable[str] = ()) -> dict[str, tuple[float, float]]:
    """The progress bar's (lo, hi) per stage of `plan`, in order: a plan's stages, or (a run that takes a plan's
    stages in its own order) named sub-plans; each weighs its `Cost.weight`, those in `skip` (cached) 0."""
    gone = set(skip)
    named = plan.stages if isinstance(plan, Work) else [(n, w.cost()) for n, w in plan.items()]
    return spans({n: 0.0 if n in gone else c.weight(shape) for n, c in named})


def between(share: Mapping[str, tuple[float, float]], first: str, last: str | None = None) -> tuple[float, float]:
    """The span from stage `first`'s start to stage `last`'s end (None: the end of the bar): a step of the run
    that takes several of the plan's stages (a sub-call whose plan's stages are kept, to show what each costs)."""
    return share[first][0], share[last][1] if last is not None else 1.0


def planned(ctx: Any, p: Any, skip: Iterable[str] = ()) -> dict[str, tuple[float, float]]:
    """`plan_spans` of the job's own plan: `p.work` on the loaded model's shape and the task's sizes."""
    shape = shape_of(ctx.lm)
    return plan_spans(p.work(shape, run_sizes(ctx.lm, ctx.task)), shape, skip)


def planned_over(ctx: Any, p: Any, tasks: Sequence[Any], skip: Iterable[str] = ()) -> dict[str, tuple[float, float]]:
    """`planned` of a kind over several `tasks`: its plan on the mean of their prompt sizes (as the estimate's
    `job_sizes` counts them), with their names."""
    shape = shape_of(ctx.lm)
    sizes = mean_sizes([run_sizes(ctx.lm, t) for t in tasks], [t.name for t in tasks])
    return plan_spans(p.work(shape, sizes), shape, skip)


def shape_of(lm: Any) -> Shape:
    """The loaded model's `Shape` (as `service/model_shape` reads it from the files, with the decoder's and the
    unembedding's parameters counted)."""
    decoder = sum(p.numel() for layer in lm.layers for p in layer.parameters())
    return Shape(lm.n_layers, lm.n_heads, lm.d_model, lm.max_positions, decoder, "loaded",
                 lm.unembed.numel() / max(decoder, 1))


def run_sizes(lm: Any, task: Any) -> Sizes:
    """The task's prompt sizes as the estimate counts them (`cost.sizes_of`), with the loaded model's tokenizer."""
    tok = lm.tokenizer
    return sizes_of(task, lambda text: len(tok(text)["input_ids"]))
