"""Every kind's declared cost (`Params.work`) against what its run really puts through the default model.

The cost model counts tokens through the whole model (`analysis/primitives/cost.py`). Measured here: a pre-hook on
every layer's output projection adds rows x positions of each call, over the number of layers; so a full pass of T
tokens counts T, a one-token step over a KV cache 1, a pass that starts at a later layer the share of the layers it
runs, and layers that only pass their input through (the configuration engine's) nothing. Each kind runs once on small
params with an empty store (its sub-calls computed, as on a cold cache); the estimate, from the params, the model's
files and the task alone (`service/estimate.py`), must lie within 2x of the measurement.
"""
from __future__ import annotations

import pytest

from backend.analysis.kinds import KINDS, builtin

from kind_cases import CASES, MemoryStore, case


@pytest.fixture(scope="module")
def counted():
    """The default model with a token counter on every output projection."""
    from backend import load_model

    lm = load_model("default")
    count = [0.0]

    def pre(_module, args, kwargs):
        x = args[0] if args else kwargs["input"]
        count[0] += x.shape[0] * x.shape[1] / lm.n_layers

    handles = [lm.o_proj(l).register_forward_pre_hook(pre, with_kwargs=True) for l in range(lm.n_layers)]
    yield lm, count
    for h in handles:
        h.remove()


def test_every_kind_has_a_case():
    """Every built-in kind's entry gives a small request (`Kind.example`) that its params model accepts; CASES is
    keyed by the names the kinds' cached results are filed under (`Kind.key`: bench/bit_identical.py's baseline
    uses them), which the registry accepts as names or aliases."""
    from backend.tasks.registry import load_task

    for k in builtin():
        task, params = case(k)  # an entry without one: the message says what to add
        k.params.model_validate(params)
        assert task is None or load_task(task).examples, k.name
    assert {KINDS[c].name for c in CASES} == {k.name for k in builtin()}
    assert all(KINDS[c].key == c for c in CASES)


@pytest.mark.parametrize("kind", sorted(CASES))
def test_declared_cost_matches_measured_tokens(kind, counted):
    from backend.analysis.kernel import analyze
    from backend.analysis.kinds import get_kind
    from backend.service.timing import estimate
    from backend.tasks.registry import load_task

    lm, count = counted
    name, params = CASES[kind]
    spec = get_kind(kind)
    task = load_task(name) if name else None
    p = spec.params.model_validate(params)
    est = estimate(spec, p, "default" if spec.uses_model else None, task)[0]
    assert est.shape.source == "config" and (est.shape.n_layers, est.shape.n_heads) == (lm.n_layers, lm.n_heads)
    from backend.analysis.primitives import induction
    from backend.analysis.primitives.prefix_store import STORE

    # a cold run, as the estimate assumes: memos of the process (another test may have filled them) emptied
    induction._MEMO.clear()
    STORE.clear()
    count[0] = 0.0
    analyze(kind, lm, task, p, cache=MemoryStore())
    measured = count[0]
    if measured == 0:
        assert est.tokens == 0, f"{kind}: no forward pass, estimated {est.tokens:.0f} tokens ({est.how})"
        return
    ratio = est.tokens / measured
    assert 0.5 <= ratio <= 2.0, f"{kind}: estimated {est.tokens:.0f} tokens ({est.how}), measured {measured:.0f}"
