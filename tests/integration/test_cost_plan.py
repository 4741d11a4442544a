"""One cost plan per kind: the progress bar's spans and the admission estimate come from the same `Params.work`.

Every built-in kind is covered, from the registry (its entry's `example`, tests/kind_cases.py): each runs once, cold,
on the default model. A kind whose plan has two stages or more takes its progress from it (`stages.planned`,
`stages.planned_over` for a kind over several tasks; ltv orders its plan's steps itself): the plan its run weighs
must total the estimate's tokens (`service/timing.py`, from the model's files and the task alone), its spans must be
the plan's stages' cumulative shares of the plan's weight, and its bar never goes back (the run takes the stages in
the plan's order). A kind whose plan has fewer stages has nothing to share a bar by; its bar still never goes back."""
from __future__ import annotations

import importlib

import pytest

from kind_cases import CASES, MemoryStore


@pytest.fixture(scope="module")
def lm():
    from backend import load_model

    return load_model("default")


def _shares(named, shape, skip):
    total = sum(0.0 if n in skip else c.weight(shape) for n, c in named)
    out, acc = {}, 0.0
    for n, c in named:
        lo = acc / total
        acc += 0.0 if n in skip else c.weight(shape)
        out[n] = (lo, acc / total)
    return out


@pytest.mark.parametrize("kind", sorted(CASES))
def test_progress_and_estimate_share_one_plan(kind, lm, monkeypatch):
    from backend.analysis.kernel import analyze
    from backend.analysis.kinds import get_kind
    from backend.analysis.primitives import induction
    from backend.analysis.primitives.cost import Work
    from backend.analysis.primitives.prefix_store import STORE
    from backend.analysis.primitives import stages
    from backend.analysis.primitives.stages import plan_spans
    from backend.service.timing import estimate
    from backend.tasks.registry import load_task

    seen = []

    def record(plan, shape, skip=()):
        got = plan_spans(plan, shape, skip)
        seen.append((plan, shape, set(skip), got))
        return got

    monkeypatch.setattr(stages, "plan_spans", record)
    monkeypatch.setattr(importlib.import_module("backend.analysis.ltv.ltv_layers"), "plan_spans", record)
    name, params = CASES[kind]
    spec, task = get_kind(kind), load_task(name) if name else None
    p = spec.params.model_validate(params)
    est, admitted_plan = estimate(spec, p, "default", task)
    induction._MEMO.clear()
    STORE.clear()
    bar: list[float] = []
    analyze(kind, lm, task, p, cache=MemoryStore(), progress=lambda f, m="": bar.append(f))
    assert bar == sorted(bar)  # the run takes the plan's stages in the plan's order: its bar never goes back
    stages_named = [n for n, _ in admitted_plan.stages]
    if len(stages_named) < 2:  # nothing to share a bar by (no forward pass, or one)
        assert not seen or len(seen[0][0].stages if isinstance(seen[0][0], Work) else seen[0][0]) < 2, kind
        return
    assert seen, (f"{spec.name}: its plan has {len(stages_named)} stages ({', '.join(stages_named)}) but its run "
                  "shares no progress bar by them: call `stages.planned(ctx, p)` in its function and report each "
                  "stage with `ctx.stage(*share[<stage>], ...)`")
    plan, shape, skip, got = seen[0]  # the kind's own run: its spans are taken before any sub-call
    named = plan.stages if isinstance(plan, Work) else [(n, w.cost()) for n, w in plan.items()]
    assert sum(c.tokens for _, c in named) == pytest.approx(est.tokens, rel=1e-9), (kind, est.how)
    assert sum(c.calls for _, c in named) == pytest.approx(admitted_plan.calls, rel=1e-9)
    assert (shape.n_layers, shape.n_heads) == (est.shape.n_layers, est.shape.n_heads)
    assert not skip  # a cold store: nothing cached to leave out
    want = _shares(named, shape, skip)
    assert list(got) == list(want)
    assert all(got[n] == pytest.approx(want[n], abs=1e-12) for n in want)
    assert got[named[-1][0]][1] == 1.0 and len(named) >= 2


@pytest.mark.parametrize("kind,sub,stage", [("perturb", "scores", "head scores"), ("geometry", "vectors", "vectors")])
def test_a_cached_sub_call_weighs_nothing(kind, sub, stage, lm, monkeypatch):
    """A composite kind whose sub-call is cached already leaves that stage out of its bar (it takes no time)."""
    from backend.analysis.kernel import analyze
    from backend.analysis.kinds import get_kind
    from backend.analysis.primitives import stages
    from backend.analysis.primitives.stages import plan_spans
    from backend.tasks.registry import load_task

    name, params = CASES[kind]
    task, store = load_task(name), MemoryStore()
    p = get_kind(kind).params.model_validate(params)
    keep = {"scores": ("shots", "prompts", "seed", "top_pct", "top_k"),
            "vectors": ("shots", "prompts", "seed", "top_pct", "top_k")}[sub]
    extra = {"types": ["tr", "tl", "random"]} if sub == "vectors" else {}
    analyze(sub, lm, task, {**{f: getattr(p, f) for f in keep}, **extra}, cache=store)  # cached first
    seen = []

    def record(plan, shape, skip=()):
        seen.append((set(skip), plan_spans(plan, shape, skip)))
        return seen[-1][1]

    monkeypatch.setattr(stages, "plan_spans", record)
    bar: list[float] = []
    analyze(kind, lm, task, p, cache=store, progress=lambda f, m="": bar.append(f))
    skip, share = seen[0]
    assert skip == {stage} and share[stage] == (0.0, 0.0)  # the cached stage is empty: the bar starts after it
    assert bar == sorted(bar) and bar[-1] == 1.0
