"""Kind `findings_report`: the three papers' findings measured on one model, each with the paper's figure beside it and a
verdict (holds / partly / does not hold), by the rules of `report.py` (fixed before any result is read).

The sections (`tsla`, `site`, `ltv`) run the analysis kinds through this job's cache, progress and cancel:
TSLA per task and seed (`icl` at 0 and k shots, `scores`, `ablation_curves` of the top TR / TL / random heads at
k = 3% and 10% of the heads, `geometry`); SITE on the first `site_tasks` tasks (`site` with patching, random-k
patching, and `site_transfer` when two tasks of a similarity group are among them); LTV on the first `ltv_tasks`
tasks (`ltv` at L/2 with its mechanism, `steer` runs of the extracted vectors over every layer on two seeds; `ltv_sweep`: the LTV
at L/4 and 3L/4 too, on the first task). `markdown` is the report; `python -m backend report` writes it as one
self-contained HTML file (`backend/report/findings_html.py`). `bench/real_findings.py` runs the same sections over
several models.
"""
from __future__ import annotations

import argparse
import time
from typing import Any, Literal

from pydantic import Field, field_validator

from ...tasks.registry import builtin_by_names, model_tasks
from ..kernel import Context, analyze
from ..kinds import get_kind
from ..params import Bool, BosParams, Int, NonNegative
from ..primitives.cost import NONE, Shape, Sizes, Work
from ..primitives.stages import planned_over
from ..results import Model, Result
from .report import SECTIONS, measure_model, render, sections_by_name
from .verdicts import RULE

Section = Literal[SECTIONS]  # type: ignore[valid-type]
DEFAULT_TASKS = 4  # tasks = None: the model's first built-in tasks


class FindingsReportParams(BosParams):
    """kind `findings_report`: the papers' findings on one model (sizes small enough for a CPU by default)."""

    tasks: list[str] | None = Field(None, min_length=1, max_length=16,
                                    description="built-in task names; None = the model's first 4 built-in tasks")
    sections: list[Section] = Field(default_factory=lambda: list(SECTIONS), min_length=1,
                                    description="which papers: tsla, site, ltv")
    seeds: list[NonNegative] = Field(default_factory=lambda: [0], min_length=1, max_length=8,
                                     description="TSLA seeds (each its own demonstration/query split)")
    shots: Int = Field(8, ge=1, le=64, description="TSLA and LTV demonstrations per prompt")
    prompts: Int = Field(20, ge=2, le=500, description="TSLA held-out queries per seed")
    random_sets: Int = Field(2, ge=1, le=16, description="random head sets per k (TSLA ablation)")
    site_tasks: Int = Field(1, ge=0, le=16, description="SITE on the first this many tasks")
    site_prompts: Int = Field(20, ge=2, le=500, description="SITE test prompts")
    ltv_tasks: Int = Field(1, ge=0, le=16, description="LTV on the first this many tasks")
    ltv_prompts: Int = Field(20, ge=2, le=500, description="LTV and its steer runs: held-out queries")
    ltv_perturbations: Int = Field(64, ge=2, le=1024, description="linear propagation: perturbed vectors")
    ltv_sweep: Bool = Field(False, description="the LTV at L/4 and 3L/4 too, on the first task")

    @field_validator("sections")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        return list(dict.fromkeys(v))

    def work(self, shape: Shape, sizes: Sizes) -> Work:
        """Each kind call the sections make, a stage named as `stage_of` names it, in the run's order (the TSLA
        calls' shared `scores` counted in the kinds that read them; SITE's transfer not counted)."""
        n_tasks = len(self.tasks) if self.tasks else DEFAULT_TASKS
        names = [*sizes.tasks[:n_tasks], *(f"task {i + 1}" for i in range(len(sizes.tasks), n_tasks))]
        k3 = max(4, round(0.03 * shape.heads))
        w = NONE
        for section in self.sections:
            if section == "tsla":
                common = {"prompts": self.prompts}
                calls = {"icl_curve": get_kind("icl_curve").params(shots=[0, self.shots], examples=0, **common),
                         "ablation_curves": get_kind("ablation_curves").params(
                             orders=["tr", "tl", "random"], ks=[0, k3], random_seeds=list(range(self.random_sets)),
                             shots=self.shots, **common),
                         "geometry": get_kind("geometry").params(shots=self.shots, top_pct=10.0, **common)}
                for t in names:
                    for s in self.seeds:
                        for kind, q in calls.items():
                            w = w + q.work(shape, sizes).named(f"{kind} on {t} (seed {s})")
            elif section == "site" and self.site_tasks:
                site = get_kind("site_alphas").params(prompts=self.site_prompts, budget=[], correlations=[], icl_shots=[10],
                                               compare=["zero_shot", "icl", "fv", "vanilla", "all_ones"])
                for t in names[:min(self.site_tasks, n_tasks)]:
                    w = w + site.work(shape, sizes).named(f"site_alphas on {t}")
            elif section == "ltv" and self.ltv_tasks:
                steer = get_kind("steer").params(vectors=["vanilla", "fv", "tr", "tl"], layer="all",
                                                 shots=self.shots, prompts=self.ltv_prompts).work(shape, sizes)
                ltv = get_kind("ltv_layers").params(shots=self.shots, prompts=self.ltv_prompts, propagation=True,
                                             perturbations=self.ltv_perturbations).work(shape, sizes)
                for i, t in enumerate(names[:min(self.ltv_tasks, n_tasks)]):
                    w = w + steer.named(f"steer on {t} (seed 0)") + steer.named(f"steer on {t} (seed 1)")
                    w = w + ltv.named(f"ltv_layers on {t}")
                    for j in ((1, 2) if self.ltv_sweep and i == 0 else ()):  # L/4 and 3L/4, the first task
                        w = w + ltv.named(f"ltv_layers on {t} (scan {j})")
        return w


def stage_of(kind: str, task: Any, params: dict[str, Any], scans: int) -> str:
    """The plan's stage (`FindingsReportParams.work`) of a section's call of `kind` (`scans`: the task's LTV layer scan
    calls before it); a call the plan does not count (the TSLA `scores` the next kinds read, SITE's transfer) gets a
    name the plan lacks."""
    t = task.name if task is not None else ""
    if kind in ("icl_curve", "ablation_curves", "geometry", "steer"):
        return f"{kind} on {t} (seed {params.get('seed')})"
    if kind == "ltv_layers" and "layer" in params:
        return f"ltv_layers on {t} (scan {scans + 1})"
    return f"{kind} on {t}"


class TaskTest(Model):
    """One per-task test of a finding (`verdicts`): what was tested, the effect with its 95% interval, p and the
    Benjamini-Hochberg q across the finding's tests on this model, and the outcome under the rule."""

    task: str
    k: int | None = Field(None, description="heads ablated or patched, where the finding has several k")
    test: str = Field(..., description="the test's name and what it compares")
    effect: float | None = Field(..., description="the measured difference, in the finding's units")
    ci: tuple[float, float] | None = Field(None, description="its 95% interval")
    ci_note: str | None = Field(None, description="why there is no interval (rank tests on a few layers or tasks)")
    p: float
    q: float = Field(..., description="p adjusted across the finding's tests (Benjamini-Hochberg)")
    direction: int = Field(..., description="+1 / -1: the sign the paper's finding predicts")
    n: int = Field(..., description="prompts (or heads, layers, tasks) the test rests on")
    outcome: str = Field(..., description="for | against | neither")


class SummaryRow(Model):
    paper: str
    finding: str
    paper_figure: str = Field(..., description="what the paper reports")
    ours: str = Field(..., description="the verdict and the numbers behind it, on this model")
    key: str = Field("", description="the finding's short name (rise, f1, ..., mid, key, prop, icl, patch, transfer)")
    test: str = Field("", description="the per-task test")
    verdict: str = Field("not run", description="holds | partly | does not hold (by `verdicts.RULE`) | not tested "
                                                "(nothing testable was measured) | not run")
    correction: str = Field("Benjamini-Hochberg", description="how the per-task p-values are corrected")
    detectable: str = Field("", description="the smallest true effect the sample detects (80% power, alpha 0.05)")
    tests: list[TaskTest] = Field(default_factory=list, description="the per-task tests behind the verdict")


class FindingsReportResult(Result):
    """The report on one model: the summary (a row per finding) and the whole report as markdown."""

    model: str
    shape: str
    tasks: list[str]
    sections: list[str]
    summary: list[SummaryRow]
    markdown: str
    command: str = Field("", description="the command line that reproduces the report")
    seconds: float
    rule: str = Field("", description="how per-task tests become holds / partly / does not hold")
    data: dict[str, Any] = Field(default_factory=dict, description="the measurements behind the report (the HTML "
                                                                   "report's figures read them)")


def findings_report(ctx: Context, p: FindingsReportParams) -> dict[str, Any]:
    lm = ctx.lm
    tasks = builtin_by_names(p.tasks, "findings") if p.tasks else model_tasks(lm.name)[:DEFAULT_TASKS]
    named = [(t.name, t) for t in tasks]
    names = [n for n, _ in named]
    sections = list(p.sections)
    # progress by the plan's stages (`work`: one per call, on the tasks' mean prompt sizes, as the estimate's)
    share = planned_over(ctx, p, tasks if p.tasks else model_tasks(lm.name))
    at = {"pos": 0.0, "scans": 0}

    def run(kind: str, lm_: Any, task: Any, **params: Any) -> Any:
        """A section's analysis, through this job's cache and tensors; the bar advances by its stage's share."""
        stage = stage_of(kind, task, params, at["scans"])
        at["scans"] += kind == "ltv_layers" and "layer" in params
        lo, hi = share.get(stage, (at["pos"], at["pos"]))  # not in the plan: counted in the next call's stage
        at["pos"] = hi
        what = f"{kind} on {task.name}" if task is not None else kind
        r = analyze(kind, lm_, task, params, cache=ctx.store if ctx.store is not None else False,
                    tensors=ctx.tensors, progress=ctx.stage(lo, hi, what))
        for w in r.warnings:
            ctx.warn(f"{what}: {w}")
        return r

    a = argparse.Namespace(
        seeds=list(p.seeds), prompts=p.prompts, shots=p.shots, random_sets=p.random_sets, site_prompts=p.site_prompts,
        site_tasks=",".join(names[:p.site_tasks]), ltv_main_tasks=",".join(names[:p.ltv_tasks]),
        ltv_tasks=names[0] if p.ltv_sweep and p.ltv_tasks else "", ltv_layers="quarters", ltv_prompts=p.ltv_prompts,
        ltv_shots=p.shots, ltv_perturbations=p.ltv_perturbations, site_recipe={}, ltv_recipe={}, light="",
        analyze=run, tensors=ctx.tensors)
    t0 = time.time()
    label = lm.name
    entry = measure_model(lm, lm.name, label, named, a, sections)
    data = {"args": {"model": label, "sections": ",".join(sections), "seeds": a.seeds, "prompts": a.prompts,
                     "shots": a.shots, "random_sets": a.random_sets, "site_prompts": a.site_prompts,
                     "ltv_prompts": a.ltv_prompts, "ltv_shots": a.ltv_shots, "ltv_perturbations": a.ltv_perturbations,
                     "ltv_layers": a.ltv_layers, "ltv_tasks": a.ltv_tasks, "out": None},
            "notes": [], "models": {label: entry}, "seconds": time.time() - t0}
    runners = sections_by_name()
    summary = [_row(r, label) for s in sections for r in runners[s].summary(data["models"], data["args"])]
    command = " ".join(["python -m backend report --model", label, "--tasks", ",".join(names), "--sections",
                        ",".join(sections), *_flags(p)])
    ctx.progress(1.0, "done")
    return {"model": label, "shape": entry["shape"], "tasks": names, "sections": sections, "summary": summary,
            "markdown": render(data, sections, command=command), "command": command, "seconds": data["seconds"],
            "rule": RULE, "data": {"args": data["args"], "models": data["models"]}}


def _row(r: dict[str, Any], label: str) -> dict[str, Any]:
    """A summary row on this model: the cell, and the verdict with its per-task tests."""
    f = (r.get("stats") or {}).get(label)
    row = {"paper": r["paper"], "finding": r["finding"], "paper_figure": r["paper_figure"],
           "ours": r["ours"].get(label, "not run"), "key": r.get("key", ""), "test": r.get("test", "")}
    if f:
        row |= {"verdict": f["verdict"], "correction": f["correction"], "detectable": f["detectable"],
                "tests": [{k: t.get(k) for k in ("task", "k", "test", "effect", "ci", "ci_note", "p", "q",
                                                  "direction", "n", "outcome")} for t in f["tests"]]}
    return row


def _flags(p: FindingsReportParams) -> list[str]:
    """The CLI flags of the fields that differ from their defaults (tasks and sections aside)."""
    out = []
    for name, f in FindingsReportParams.model_fields.items():
        v = getattr(p, name)
        if name in ("tasks", "sections") or v == f.get_default(call_default_factory=True):
            continue
        flag = "--" + name.replace("_", "-")
        if isinstance(v, bool):
            out.append(flag if v else "--no-" + name.replace("_", "-"))
        else:
            out += [flag, ",".join(map(str, v)) if isinstance(v, list) else str(v)]
    return out
