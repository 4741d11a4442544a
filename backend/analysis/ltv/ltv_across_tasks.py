"""Kind `ltv_across_tasks`: learned task vectors of several tasks at one layer.

For each task (built-in names; default: the model's built-in tasks whose prompts a vector can learn, for the
default model its 5 classification and 5 generation tasks) the `ltv` kind's comparison at `layer` (cached, the
mechanism left out), then:
- the table task by task and its means, against the paper's anchor (Llama-3.1-8B, layer 16, mean over tasks:
  vanilla 37.8, FV 37.3, LTV 83.5) and, per task, the order of LTV, vanilla and FV accuracy;
- the cosine similarity of the tasks' vectors; tasks whose outputs share a label space (half the smaller output
  set in common) are grouped, and the mean similarity within and across groups is reported;
- composition: where the task language defines a composed task x -> b(a(x)) of two listed tasks (the default
  model's language: plural / capital of successor / predecessor / antonym, antonym of successor), zero-shot
  prompts of it with theta_a, theta_b and theta_a + theta_b added, against k-shot ICL of the composed task.
"""
from __future__ import annotations

from itertools import combinations
from typing import Annotated, Any

import numpy as np
import torch
from pydantic import Field

from ..primitives import options as o
from ...tasks.base import Task, TaskError
from ...tasks.registry import builtin_by_names, model_tasks
from ..kernel import Context, analyze
from ..kinds import get_kind
from ..params import Bool, Int, Layer, Selection
from ..primitives.cost import NONE, Shape, Sizes, Work, passes
from ..primitives.stages import planned_over
from ..results import Metrics, Model, Result, TensorsInline
from .recipe import LtvRecipeParams
from ..primitives.batching import build_prompts, encode
from ..primitives.inject import Injection, check_layers, evaluate_injections
from ..primitives.threads import cpu_threads


DEFAULT_TASKS = 10  # the model's built-in tasks, when `tasks` is not given (the default model has 10)


class LtvAcrossTasksParams(Selection, LtvRecipeParams):
    """kind `ltv_across_tasks`: LTVs of several tasks at one layer: the comparison task by task (the paper's ordering),
    the cosine similarity of the vectors, and composition (the sum of two tasks' vectors on their composed task)."""

    tasks: list[Annotated[str, Field(min_length=1, max_length=200)]] | None = Field(
        None, max_length=64, description="built-in task names; None = the model's built-in tasks (the default "
                                         "model: its 10 synthetic classification and generation tasks)")
    layer: Layer | None = Field(None, description="injection layer; None = L/2")
    shots: Int = Field(o.SHOTS, ge=0)
    prompts: Int = Field(o.PROMPTS, ge=1)
    compose: Bool = Field(True, description="evaluate vector sums on the composed tasks the task language defines")

    def work(self, shape: Shape, sizes: Sizes) -> Work:
        fields = {k: getattr(self, k) for k in LtvRecipeParams.model_fields}
        one = get_kind("ltv_layers").params(**fields, layer=self.layer, shots=self.shots, prompts=self.prompts,
                                     top_pct=self.top_pct, top_k=self.top_k, mechanism=False).work(shape, sizes)
        from ...tasks.synthetic import COMPOSITIONS as compositions

        k, n = len(self.tasks or sizes.tasks) or DEFAULT_TASKS, sizes.n(self.prompts)
        names = set(self.tasks or sizes.tasks) if self.tasks or sizes.tasks else None  # None: unknown, all pairs
        pairs = 0 if not self.compose else sum(  # the synthetic language's composed tasks
            names is None or (f"syn-{a}" in names and f"syn-{b}" in names) for a, b in compositions)
        compose = passes("compositions", 4 * pairs * n, sizes.prompt(0)) + passes("compositions", pairs * n,
                                                                                 sizes.prompt(self.shots))
        listed = sizes.tasks or self.tasks or ()  # the tasks' names as the run resolves them, else as asked
        runs = sum((one.named(f"LTV on {t}") for t in listed), NONE) if listed else one.named(f"{k} tasks' LTVs") * k
        return runs + compose  # in the run's order: an LTV per task, then the compositions

    def writes_tensors(self) -> bool:
        return True


class Composition(Model):
    """theta_a + theta_b on the composed task x -> b(a(x)), zero-shot."""

    a: str
    b: str
    task: str = Field(..., description="the composed task")
    zero_shot: Metrics
    icl: Metrics = Field(..., description="k-shot prompts of the composed task (can the model compose at all?)")
    a_only: Metrics
    b_only: Metrics
    sum: Metrics


class LtvAcrossTasksResult(Result, TensorsInline):
    """kind `ltv_across_tasks`: LTVs of several tasks at one layer."""

    layer: int
    tasks: list[str]
    kinds: dict[str, str] = Field(..., description="task -> classification | generation")
    label_spaces: dict[str, str] = Field(..., description="task -> a name of its label space (tasks that share one "
                                                          "have the same name)")
    conditions: list[str]
    table: dict[str, dict[str, Metrics]] = Field(..., description="task -> condition -> metrics")
    mean: dict[str, float] = Field(..., description="condition -> accuracy, mean over the tasks")
    ordering: dict[str, str] = Field(..., description="task -> the order of ltv, vanilla and fv accuracy")
    ltv_beats_vanilla: dict[str, list[str]] = Field(..., description="task kind -> tasks where LTV's accuracy is "
                                                                     "above the vanilla task vector's")
    paper: dict[str, Any] = Field(..., description="the paper's anchor (Llama-3.1-8B, layer 16, mean accuracy %)")
    similarity: list[list[float]] = Field(..., description="cosine similarity of the tasks' LTVs (tasks x tasks)")
    within_space: float | None = Field(None, description="mean similarity of tasks sharing a label space")
    across_spaces: float | None = Field(None, description="mean similarity of tasks with different label spaces")
    within_kind: dict[str, float | None] = Field(default_factory=dict, description="mean similarity of pairs of "
                                                                                  "classification / generation tasks")
    across_kinds: float | None = Field(None, description="mean similarity of classification-generation pairs")
    compositions: list[Composition] = Field(default_factory=list)
    tensors: dict[str, str] = Field(..., description="task -> id of its LTV file (GET /tensors/{id})")


RECIPE = (*LtvRecipeParams.model_fields, "shots", "prompts", "top_pct", "top_k")  # what each task's ltv call takes
EVAL_BATCH = o.CONFIG_BATCH_SIZE


def label_spaces(tasks: list[Task]) -> dict[str, str]:
    """Task -> a name of its label space: tasks are joined when half the smaller output set is shared."""
    outs = {t.name: {y for _, y in t.examples} for t in tasks}
    parent = {t.name: t.name for t in tasks}

    def find(x: str) -> str:
        while parent[x] != x:
            x = parent[x]
        return x

    for a, b in combinations(outs, 2):
        if len(outs[a] & outs[b]) >= 0.5 * min(len(outs[a]), len(outs[b])):
            parent[find(a)] = find(b)
    groups: dict[str, list[str]] = {}
    for t in outs:
        groups.setdefault(find(t), []).append(t)
    return {t: " | ".join(sorted(groups[find(t)])) for t in outs}


def ordering(acc: dict[str, float]) -> str:
    """'ltv > vanilla = fv' from {name: accuracy}."""
    items = sorted(acc.items(), key=lambda kv: -kv[1])
    text = items[0][0]
    for (_, a), (nb, b) in zip(items, items[1:]):
        text += (" = " if abs(a - b) < 1e-9 else " > ") + nb
    return text


def ltv_across_tasks(ctx: Context, p: LtvAcrossTasksParams) -> dict[str, Any]:
    with cpu_threads(ctx.lm):
        return _ltv_tasks(ctx, p)


def _ltv_tasks(ctx: Context, p: LtvAcrossTasksParams) -> dict[str, Any]:
    lm = ctx.lm
    tasks = builtin_by_names(p.tasks, "ltv_tasks") if p.tasks else model_tasks(lm.name)
    if len(tasks) < 2:
        raise TaskError("ltv_tasks compares at least two tasks")
    layer = lm.n_layers // 2 if p.layer is None else check_layers(lm, [p.layer])[0]
    fields = {k: getattr(p, k) for k in RECIPE}
    results = {}
    store = ctx.store if ctx.store is not None else False
    run = {**fields, "layer": layer, "mechanism": False}
    # progress by the plan's stages (`work`): a task's LTV already cached weighs nothing
    share = planned_over(ctx, p, tasks, {f"LTV on {name}" for name in ctx.cached_on("ltv_layers", tasks, run)})
    for t in tasks:
        stage = ctx.stage(*share[f"LTV on {t.name}"], t.name)
        r = analyze("ltv_layers", lm, t, run, cache=store, progress=stage, live=ctx.report, tensors=ctx.tensors)
        for w in r.warnings:
            if "held-out queries" not in w and "demonstration pool" not in w and "an epoch draws" not in w:
                ctx.warn(f"{t.name}: {w}")
        results[t.name] = r
    names = [t.name for t in tasks]
    first = results[names[0]]
    conditions = list(first.conditions)
    table = {n: {c: m.model_dump() for c, m in results[n].table.items()} for n in names}
    mean = {c: float(np.mean([results[n].table[c].accuracy for n in names if c in results[n].table]))
            for c in conditions}
    order = {n: ordering({c: results[n].table[c].accuracy for c in ("ltv", "vanilla", "fv") if c in results[n].table})
             for n in names}
    kinds = {t.name: t.kind for t in tasks}
    beats: dict[str, list[str]] = {"classification": [], "generation": []}
    for n in names:
        tb = results[n].table
        if "vanilla" in tb and tb["ltv"].accuracy > tb["vanilla"].accuracy:
            beats[kinds[n]].append(n)

    thetas = {n: torch.as_tensor(np.asarray(results[n].per_layer[0].training.theta)[0], dtype=torch.float32)
              for n in names}
    stack = torch.stack([thetas[n] for n in names])
    unit = stack / stack.norm(dim=1, keepdim=True).clamp_min(1e-12)
    sim = (unit @ unit.T).numpy()
    spaces = label_spaces(tasks)
    within = [sim[i, j] for i, j in combinations(range(len(names)), 2) if spaces[names[i]] == spaces[names[j]]]
    across = [sim[i, j] for i, j in combinations(range(len(names)), 2) if spaces[names[i]] != spaces[names[j]]]

    by_kind = {k: [sim[i, j] for i, j in combinations(range(len(names)), 2)
                   if kinds[names[i]] == kinds[names[j]] == k] for k in ("classification", "generation")}
    mixed = [sim[i, j] for i, j in combinations(range(len(names)), 2) if kinds[names[i]] != kinds[names[j]]]

    comps = []
    if p.compose:
        from ...tasks import synthetic

        pairs = [(a, b, ct) for a, b, ct in synthetic.compositions() if a in thetas and b in thetas]
        composing = ctx.stage(*share.get("compositions", (share[f"LTV on {names[-1]}"][1],) * 2))
        for j, (a, b, ct) in enumerate(pairs):
            composing(j / len(pairs), f"composition {ct.name}")
            comps.append(_compose(lm, p, layer, results, thetas, a, b, ct))
    ctx.progress(1.0, "done")
    return {"layer": layer, "tasks": names, "kinds": kinds, "label_spaces": spaces, "conditions": conditions,
            "table": table, "mean": mean, "ordering": order, "ltv_beats_vanilla": beats, "paper": dict(o.LTV_PAPER),
            "similarity": sim.tolist(), "within_space": float(np.mean(within)) if within else None,
            "across_spaces": float(np.mean(across)) if across else None,
            "within_kind": {k: float(np.mean(v)) if v else None for k, v in by_kind.items()},
            "across_kinds": float(np.mean(mixed)) if mixed else None, "compositions": comps,
            "tensors": {n: results[n].tensor for n in names}}


def _compose(lm: Any, p: LtvAcrossTasksParams, layer: int, results: dict[str, Any], thetas: dict[str, torch.Tensor],
             a: str, b: str, task: Task) -> dict[str, Any]:
    """Zero-shot prompts of the composed task with theta_a, theta_b and their sum (at the LTVs' positions)."""
    pos = tuple(results[a].positions)
    built = build_prompts(lm, task, p.shots, p.prompts, p.seed)
    zero = encode(lm, task.build_prompts(0, built.n, p.seed), task.kind)
    out = evaluate_injections(lm, zero, [Injection(), Injection({layer: thetas[a]}, pos),
                                         Injection({layer: thetas[b]}, pos),
                                         Injection({layer: thetas[a] + thetas[b]}, pos)], EVAL_BATCH)
    icl = evaluate_injections(lm, encode(lm, built.prompts, task.kind), [Injection()], EVAL_BATCH)
    return {"a": a, "b": b, "task": task.name, "zero_shot": out.summary(0), "icl": icl.summary(0),
            "a_only": out.summary(1), "b_only": out.summary(2), "sum": out.summary(3)}
