"""Kind `ltv`'s mechanism stages, each opt-in (issue 25): a stage left out is absent and the result validates, a
stage's numbers do not depend on which other stages run, each stage is a named part of the kind's cost, and the
page's stage labels come from the service's estimates.

Tiny random-weight models (GPT-2 tokenisation) and one small task; every test takes seconds.
"""
from __future__ import annotations

import numpy as np
import pytest

from backend.analysis.kernel import analyze
from backend.analysis.kinds import get_kind
from backend.analysis.primitives.cost import Shape, Sizes
from backend.model.loading import wrap
from backend.tasks.base import Task, Template
from tiny_models import tiny_model

FAST = dict(epochs=2, train_prompts=12, val_prompts=4, prompts=8, shots=2, top_k=2, random_draws=2,
            perturbations=8)
STAGES = ("key_heads", "ov", "propagation")


def parity_task(n: int = 40) -> Task:
    return Task("tiny-parity", "classification", [(str(i), "even" if i % 2 == 0 else "odd") for i in range(n)],
                Template("{input} is {output}\n"))


@pytest.fixture(scope="module")
def llama(gpt2_tokenizer):
    return wrap(tiny_model("llama", 0), gpt2_tokenizer, "tiny-llama-0")


def only(*stages: str) -> dict:
    return {"mechanism": bool(stages), **{s: s in stages for s in STAGES}}


def test_defaults_run_key_heads_and_ov_not_propagation():
    p = get_kind("ltv").params()
    assert p.mechanism and p.key_heads and p.ov and not p.propagation
    assert p.stages() == ("key_heads", "ov")
    assert get_kind("ltv").params(mechanism=False, propagation=True).stages() == ()


def test_each_stage_alone_is_what_it_is_among_all(llama):
    """One layer, every stage on, against each stage alone and none: a stage left out is absent (the result model
    validates without it), and a stage's numbers are the same whichever others run (exactly: same seeds, same
    passes)."""
    full = analyze("ltv", llama, parity_task(), cache=False, layer=1, **FAST, **only(*STAGES))
    e = full.per_layer[0]
    assert e.key_heads is not None and e.ov is not None and e.propagation is not None
    assert full.rotation == [e.propagation.rotation] and full.stretch == [e.propagation.stretch]
    for stage in STAGES:
        r = analyze("ltv", llama, parity_task(), cache=False, layer=1, **FAST, **only(stage))
        one = r.per_layer[0]
        assert r.table == full.table  # the comparison does not depend on the mechanism
        for other in STAGES:
            assert (getattr(one, other) is None) == (other != stage), (stage, other)
        assert getattr(one, stage).model_dump() == getattr(e, stage).model_dump(), stage
        if stage != "propagation":
            assert r.rotation == [None] and r.stretch == [None]
    none = analyze("ltv", llama, parity_task(), cache=False, layer=1, **FAST, **only())
    assert none.table == full.table
    assert all(getattr(none.per_layer[0], s) is None for s in STAGES)
    off = analyze("ltv", llama, parity_task(), cache=False, layer=1, mechanism=False, **FAST)
    assert all(getattr(off.per_layer[0], s) is None for s in STAGES)


def test_default_request_runs_the_default_stages_on_a_sweep(llama):
    r = analyze("ltv", llama, parity_task(), cache=False, layer="all", **FAST)
    assert [bool(e.key_heads) and bool(e.ov) and e.propagation is None for e in r.per_layer] == [True, True]
    assert r.rotation == [None, None]


def test_each_stage_is_a_named_part_of_the_cost():
    shape, sizes = Shape(30, 9, 576, 8192, 135_000_000, "config"), Sizes(6.0, 11.0, 2.0, "tokenizer", 50, 50)
    kind = get_kind("ltv")
    base = kind.params(layer=15, **only()).work(shape, sizes)
    names = {"key_heads": "key heads", "ov": "OV reconstruction", "propagation": "linear propagation"}
    for stage in STAGES:
        w = kind.params(layer=15, **only(stage)).work(shape, sizes)
        parts = {n: c.tokens for n, c in w.stages}
        assert parts[names[stage]] == pytest.approx(w.tokens - base.tokens) and parts[names[stage]] > 0
        assert all(names[s] not in parts for s in STAGES if s != stage)
    # linear propagation: one token step per perturbation and prompt from the layer on, 2 d_model = 1,024 of them
    prop = kind.params(layer=15, **only("propagation")).work(shape, sizes).stage("linear propagation").tokens
    assert prop == pytest.approx(1024 * 50 * 15 / 30 + 50 * 6 + 50 * 16 / 30)  # + its clean pass, the surrogate
    assert kind.params(layer=15, **only("propagation"), perturbations=256).work(shape, sizes).tokens < \
        kind.params(layer=15, **only("propagation")).work(shape, sizes).tokens
    # a sweep runs the stages at every layer; a joint vector runs none
    sweep = kind.params(layer=[10, 20], **only("propagation")).work(shape, sizes)
    assert sweep.stage("linear propagation").tokens > prop
    joint = kind.params(layer=[10, 20], joint=True, **only(*STAGES)).work(shape, sizes)
    assert not any(n in dict(joint.stages) for n in names.values())


def test_stage_labels_from_the_estimates():
    from ui.ltv import stages as ls

    seen = []

    def estimate(kind: str, params: dict) -> dict:
        seen.append(params)
        return {"seconds": 10.0 + 5 * params["key_heads"] + 2 * params["ov"] + 200 * params["propagation"]}

    got = ls.stage_seconds(estimate, "ltv", {"layer": 15})
    assert got == {"key_heads": 5.0, "ov": 2.0, "propagation": 200.0}
    assert seen[0] == {"layer": 15, "mechanism": False, "key_heads": False, "ov": False, "propagation": False}
    assert ls.stage_params({"layer": 1}, ["ov"]) == {"layer": 1, "mechanism": True, "key_heads": False, "ov": True,
                                                     "propagation": False}
    assert ls.stage_label("propagation", 200.0) == "Linear propagation (+about 3 min)"
    assert ls.stage_label("ov", None) == "OV reconstruction"
    assert ls.stage_seconds(lambda k, p: None, "ltv", {}) == dict.fromkeys(ls.STAGES)
    assert tuple(ls.STAGES) == ("key_heads", "ov", "propagation")


def test_the_page_state_offers_the_kinds_stages():
    from ui import state

    assert set(state.LTV_MECHANISM) == set(STAGES) and set(STAGES) <= set(get_kind("ltv").params.model_fields)
    p = get_kind("ltv").params()
    assert set(state.ltv_mechanism_default()) == set(p.stages())
    assert state.FIELDS["ltv_mech"].parse("propagation,ov") == ["propagation", "ov"]
    with pytest.raises(ValueError):
        state.FIELDS["ltv_mech"].parse("everything")


def test_kept_zero_shot_prefixes_give_the_same_result(llama, monkeypatch):
    """The comparison and the mechanism's configurations read the zero-shot prompts' clean prefixes kept by the
    first pass (`prefix_store`); with nothing kept (every call its own clean pass) the numbers are the same."""
    from backend.analysis.primitives.batching import encode
    from backend.analysis.primitives.prefix_store import STORE

    STORE.clear()
    kept = analyze("ltv", llama, parity_task(), cache=False, layer=1, **FAST, **only(*STAGES))
    task = parity_task()
    zero = encode(llama, task.build_prompts(0, FAST["prompts"], 0), task.kind)
    assert STORE.get(llama, zero.ids) is not None  # the zero-shot prompts' prefixes were kept
    STORE.clear()
    monkeypatch.setenv("HEADLENS_PREFIX_CACHE_MB", "0")
    fresh = analyze("ltv", llama, parity_task(), cache=False, layer=1, **FAST, **only(*STAGES))
    assert STORE.nbytes == 0
    assert kept.table == fresh.table
    a, b = kept.per_layer[0], fresh.per_layer[0]
    assert a.key_heads.heads == b.key_heads.heads
    assert a.key_heads.ablated == b.key_heads.ablated and a.key_heads.random == b.key_heads.random
    assert a.key_heads.gold_prob == pytest.approx(b.key_heads.gold_prob, rel=1e-5)
    assert a.ov.final == b.ov.final and a.ov.same_layer == b.ov.same_layer and a.ov.direct == b.ov.direct
    assert a.propagation.surrogate == b.propagation.surrogate
    assert a.propagation.rotation == pytest.approx(b.propagation.rotation, abs=1e-5)
    np.testing.assert_allclose(np.asarray(a.key_heads.saliency), np.asarray(b.key_heads.saliency), rtol=1e-5)
