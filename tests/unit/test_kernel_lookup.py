"""The kernel's cross-kind lookup (`Context.cached`), notes and the one multi-token-label warning, on two kinds
registered here (no model): a `source` whose result another kind reads, and a `reader` that shows the source's
result only when it is cached (as SITE and `methods` show the cached LTV).

Checked: a cached source is found whatever the fields the reader does not name hold (issue 19, defect 8: SITE
found an `ltv` result only when every other parameter was a default); the default is preferred among several; a
field the reader names must match; a reader cached before its source is recomputed once the source is cached
(cached equals fresh), and is then a plain hit; notes stay apart from warnings, through `ctx.call` too.
"""
from __future__ import annotations

from typing import Any

import pytest

from backend.analysis import kinds
from backend.store.cache import default_cache
from backend.analysis.kernel import Context, analyze, lookup
from backend.analysis.params import Params
from backend.analysis.primitives.notes import Note
from backend.analysis.results import Result

CALLS = {"source": 0, "reader": 0}


class SourceParams(Params):
    seed: int = 0
    layer: int | str | None = None
    detail: int = 5  # what the reader does not read
    recipe: float = 1.0


class SourceResult(Result):
    value: float


class ReaderParams(Params):
    seed: int = 0


class ReaderResult(Result):
    found: float | None = None
    found_params: dict[str, Any] | None = None


def source(ctx: Context, p: SourceParams) -> dict[str, Any]:
    CALLS["source"] += 1
    ctx.warn(Note(f"sized to the task (detail {p.detail})"))
    return {"value": 100 * p.seed + 10 * p.recipe + p.detail}


def reader(ctx: Context, p: ReaderParams) -> dict[str, Any]:
    CALLS["reader"] += 1
    r = ctx.cached("t_source", [{"seed": p.seed, "layer": None}, {"seed": p.seed, "layer": "all"}])
    return {"found": None if r is None else r.value, "found_params": None if r is None else r.params}


def computer(ctx: Context, p: ReaderParams) -> dict[str, Any]:
    """Shows the source when cached, else computes it (as `methods` with ltv=true)."""
    r = ctx.cached("t_source", [{"seed": p.seed}]) or ctx.call("t_source", seed=p.seed, detail=2)
    return {"found": r.value}


def caller(ctx: Context, p: ReaderParams) -> dict[str, Any]:
    r = ctx.call("t_source", seed=p.seed, detail=7)
    ctx.warn("a real warning")
    return {"found": r.value}


@pytest.fixture(autouse=True)
def registered():
    made = [kinds.register(kinds.Kind("t_source", SourceParams, SourceResult, "test_kernel_lookup:source", "",
                                      "t_source", uses_task=False, uses_model=False, needs_fit=False, indexed=True)),
            kinds.register(kinds.Kind("t_reader", ReaderParams, ReaderResult, "test_kernel_lookup:reader", "",
                                      "t_reader", uses_task=False, uses_model=False, needs_fit=False)),
            kinds.register(kinds.Kind("t_caller", ReaderParams, ReaderResult, "test_kernel_lookup:caller", "",
                                      "t_caller", uses_task=False, uses_model=False, needs_fit=False)),
            kinds.register(kinds.Kind("t_computer", ReaderParams, ReaderResult, "test_kernel_lookup:computer", "",
                                      "t_computer", uses_task=False, uses_model=False, needs_fit=False))]
    CALLS.update(source=0, reader=0)
    yield
    for k in made:
        kinds.unregister(k.name)


def test_a_source_with_other_fields_off_their_defaults_is_found():
    analyze("t_source", None, None, seed=1, detail=9, recipe=2.0)  # not the defaults: an exact key would miss it
    r = analyze("t_reader", None, None, seed=1)
    assert r.found == 100 + 20 + 9 and r.found_params["detail"] == 9
    assert analyze("t_reader", None, None, seed=2).found is None  # a named field must match


def test_the_defaults_are_preferred_then_the_newest():
    analyze("t_source", None, None, seed=0, layer="all", detail=1)
    analyze("t_source", None, None, seed=0, layer=None, detail=2)
    analyze("t_source", None, None, seed=0, layer=None, detail=3, recipe=4.0)
    assert analyze("t_reader", None, None, seed=0).found == 10 + 2  # one field off its default beats two
    analyze("t_source", None, None, seed=0)  # all defaults: the exact key
    ctx = Context(None, None, store=default_cache())
    assert ctx.cached("t_source", [{"seed": 0, "layer": None}]).value == 10 + 5 and not ctx.absent
    assert ctx.cached("t_source", [{"seed": 0, "detail": 1}]).params["layer"] == "all"
    assert ctx.cached("t_source", [{"seed": 9}]) is None and ctx.absent == [{"kind": "t_source",
                                                                            "tries": [{"seed": 9}]}]


def test_a_reader_cached_before_its_source_is_recomputed_once_the_source_is_cached():
    first = analyze("t_reader", None, None, seed=4)
    assert first.found is None and not first.cache_hit and CALLS["reader"] == 1
    again = analyze("t_reader", None, None, seed=4)
    assert again.cache_hit and again.found is None and CALLS["reader"] == 1  # nothing new: a plain hit
    assert lookup("t_reader", None, None, {"seed": 4}) is not None
    analyze("t_source", None, None, seed=4, detail=1)
    assert lookup("t_reader", None, None, {"seed": 4}) is None  # stale: what POST /jobs/cached answers
    fresh = analyze("t_reader", None, None, seed=4)
    assert not fresh.cache_hit and fresh.found == 411 and CALLS["reader"] == 2
    assert analyze("t_reader", None, None, seed=4).cache_hit and CALLS["reader"] == 2
    assert "absent_inputs" not in fresh.to_json()  # the kernel's bookkeeping stays out of the JSON


def test_a_miss_the_reader_then_computed_itself_does_not_make_it_stale():
    r = analyze("t_computer", None, None, seed=6)
    assert r.found == 612 and not r.absent_inputs
    assert analyze("t_computer", None, None, seed=6).cache_hit


def test_notes_stay_apart_from_warnings_through_calls():
    r = analyze("t_caller", None, None, seed=0)
    assert r.found == 17 and r.warnings == ["a real warning"]
    assert r.notes == ["sized to the task (detail 7)"]
    hit = analyze("t_caller", None, None, seed=0)
    assert hit.cache_hit and hit.notes == r.notes and hit.warnings == r.warnings


def test_a_stage_cost_lookup_does_not_make_a_result_stale(tmp_path):
    """ltv's progress weights look up `vectors` and `scores` (record=False): a miss there must not mark the result
    stale once they are cached, so the same call is a cache hit (here: mechanism off, so nothing else calls scores)."""
    from backend.analysis.kernel import analyze
    from backend.store.cache import ResultCache
    from backend.model.loading import load_model
    from backend.tasks.registry import load_task

    lm, task, store = load_model("default"), load_task("syn-antonym"), ResultCache(tmp_path)
    recipe = dict(epochs=1, train_prompts=4, val_prompts=2, batch_size=4)
    fields = dict(recipe, prompts=2, shots=1, mechanism=False)
    assert not analyze("ltv", lm, task, fields, cache=store).cache_hit
    again = analyze("ltv", lm, task, fields, cache=store)
    assert again.cache_hit and again.absent_inputs == []
