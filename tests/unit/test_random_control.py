"""The random control: every kind that draws a random head set draws it with `selection.random_heads`, from the
heads outside the top sets it is compared with, so the control is disjoint from them (the README's promise)."""
from __future__ import annotations

import pytest
import torch

from backend.analysis.kernel import analyze
from backend.analysis.primitives import selection
from backend.analysis.primitives.selection import random_heads
from backend.model.loading import wrap
from test_core_invariants import sentiment_task
from tiny_models import tiny_model

COMMON = dict(shots=2, prompts=4, seed=0, top_k=2)


@pytest.fixture(scope="module")
def lm(gpt2_tokenizer):
    """Tiny llama: 2 layers x 6 heads, so two top sets of 2 leave 8 heads to draw from."""
    return wrap(tiny_model("llama"), gpt2_tokenizer, "tiny-llama")


def _flat(heads):
    return {(int(l), int(h)) for l, h in heads}


def test_random_heads_is_disjoint_seeded_and_falls_back_in_order():
    top = {(0, 0), (0, 1), (1, 2)}
    for seed in range(20):
        r = random_heads(3, 4, 5, seed, exclude=top)
        assert len(set(r)) == 5 and not set(r) & top and r == random_heads(3, 4, 5, seed, exclude=top)
    assert random_heads(3, 4, 5, 0, exclude=top, draw=1) != random_heads(3, 4, 5, 0, exclude=top)
    # a random order over every head: the 9 outside the top set first, then the top set
    order = random_heads(3, 4, 12, 0, exclude=top)
    assert sorted(order) == [(l, h) for l in range(3) for h in range(4)] and set(order[9:]) == top
    # a pool: only its heads, none excluded
    pool = [(2, h) for h in range(4)]
    assert set(random_heads(3, 4, 2, 0, exclude={(2, 0)}, pool=pool)) <= {(2, 1), (2, 2), (2, 3)}


def test_scores_and_vectors(lm):
    task = sentiment_task()
    r = analyze("scores", lm, task, **COMMON)
    top = _flat(r.top_tr) | _flat(r.top_tl)
    assert len(r.random_heads) == 2 and not _flat(r.random_heads) & top
    v = analyze("vectors", lm, task, types=["tr", "tl", "random"], **COMMON)
    assert _flat(v.vectors["random"].heads) == _flat(r.random_heads)


def test_perturbations(lm):
    """Steering's *Perturbed demonstrations*: the "random ablated" set holds no top TR or TL head."""
    r = analyze("perturb", lm, sentiment_task(), perturbations=["shuffled_inputs"], **COMMON)
    assert len(r.heads["random"]) == 2 and not _flat(r.heads["random"]) & (_flat(r.heads["tr"]) | _flat(r.heads["tl"]))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ablation_curves(lm, seed):
    """The random order's first k heads hold none of the top k TR or TL heads, for every k of the curve."""
    kw = {k: v for k, v in COMMON.items() if k != "top_k"}
    r = analyze("ablation_curves", lm, sentiment_task(), orders=["tr", "tl", "random"], ks=[0, 1, 2, 3],
                random_seeds=[seed], **kw)
    c = r.curves
    assert len(c["random"].heads) == 3
    for k in (1, 2, 3):
        assert not _flat(c["random"].heads[:k]) & (_flat(c["tr"].heads[:k]) | _flat(c["tl"].heads[:k]))


def test_ltv_key_head_random_sets(lm):
    from test_ltv import FAST, parity_task

    r = analyze("ltv", lm, parity_task(), cache=False, layer=0, **FAST)
    kh = r.per_layer[0].key_heads
    assert len(kh.random_heads) == 2 and len(kh.random_heads[0]) == len(kh.heads)
    for draw in kh.random_heads:
        assert not _flat(draw) & _flat(kh.heads)
    assert kh.random_heads[0] != kh.random_heads[1]


def test_site_findings_random_patching(lm, monkeypatch):
    """The findings' SITE extras: random-k patching is drawn outside the top k heads by alpha, and the random
    sets of k = the heads switched on outside those heads."""
    from backend.analysis.findings import site as fsite
    from backend.analysis.site import soft_select

    L, H = lm.n_layers, lm.n_heads
    alpha = torch.rand(L, H, generator=torch.Generator().manual_seed(0))
    monkeypatch.setattr(soft_select, "load_site",
                        lambda store, tid, lm_: (alpha, torch.zeros(L, H, lm.head_dim), {}))
    drawn = []
    real = selection.random_heads

    def spy(*a, **kw):
        out = real(*a, **kw)
        drawn.append((out, set(kw.get("exclude") or ())))
        return out

    monkeypatch.setattr(selection, "random_heads", spy)
    order = soft_select.ranked_heads(alpha.numpy())
    on = int((alpha > 0.5).sum())
    fsite._extra_patching(lm, sentiment_task(), type("R", (), {"tensor": "x"})(), [1, 2, 4], prompts=4)
    assert len(drawn) == 3 * fsite.RANDOM_DRAWS + fsite.RANDOM_DRAWS
    for out, excl in drawn:
        assert excl == set(order[:len(out)]) and not set(out) & excl
    assert {len(out) for out, _ in drawn[-fsite.RANDOM_DRAWS:]} == {on}
