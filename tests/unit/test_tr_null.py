"""The TR null's arithmetic (issue 34): `null_tr_sum` equals the elementwise formula it replaced, to float rounding,
for one label set, per-prompt sets of several sizes, a rank-deficient set and a band of label tokens only; chunks
and groups of rows do not change it; a seeded null is reproducible; its p floor is 1 / (R + 1)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from backend.analysis.primitives import map_stats as ms
from backend.analysis.primitives import tr_null
from backend.analysis.primitives.tr_null import build_null, n_draws, null_rows, null_tr_sum, whitening
from backend.analysis.primitives.tsla import gram_pinv
from backend.analysis.tsla.scoring_pass import score_heads
from backend.analysis.tsla.head_scores import head_stats
from test_core_invariants import encoded

pytestmark = pytest.mark.usefixtures("one_thread")


def reference_null_tr(o: torch.Tensor, null: tr_null.TrNull, label_ids: list[list[int]]) -> torch.Tensor:
    """The arithmetic before issue 34 (slow; tests only): per row, a = o W_pool^T; each draw's label rows whitened
    by eigh (V diag(1 / sqrt(lambda)) over the eigenvalues above pinv's cutoff); c_k = sum_i W[i, k] a_i
    elementwise; TR = sqrt(sum_k c_k^2). o (batch, heads, d) -> (batch, heads, R) float32."""
    out = []
    for i, ids in enumerate(label_ids):
        ix = null.repl[:, [null.col[int(t)] for t in ids]]  # (R, n)
        u = null.rows.double()[ix]  # (R, n, d)
        g = u @ u.mT
        lam, vec = torch.linalg.eigh(g)
        cut = lam.amax(-1, keepdim=True).clamp_min(0) * g.shape[-1] * torch.finfo(g.dtype).eps
        w = (vec * torch.where(lam > cut, lam.clamp_min(1e-300).rsqrt(), torch.zeros_like(lam))[..., None, :]).float()
        a = o[i].float() @ null.rows.T  # (heads, M)
        parts = [a[:, ix[:, j]] for j in range(len(ids))]  # each (heads, R)
        tr2 = torch.zeros_like(parts[0])
        for k in range(len(ids)):
            c = sum(parts[j] * w[:, j, k] for j in range(len(ids)))
            tr2 += c * c
        out.append(tr2.sqrt())
    return torch.stack(out)


CASES = {  # vocab, d, label sets
    "one label set": (3000, 24, [[700, 2400]] * 5),
    "per-prompt sets of several sizes": (3000, 24, [[3, 50, 700, 2900], [10, 20, 1500], [7], [3, 50, 700, 2900]]),
    "rank-deficient set (one first token twice)": (3000, 24, [[10, 10, 300], [10, 300, 2000]]),
    "a band of label tokens only": (48, 8, [[0, 1, 2], [0, 30]]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_null_tr_sum_equals_the_elementwise_formula(case):
    vocab, d, lab = CASES[case]
    g = torch.Generator().manual_seed(7)
    unembed = torch.randn(vocab, d, generator=g)
    o = torch.randn(len(lab), 6, d, generator=g)
    null = build_null(unembed, lab, 300, seed=1)
    got = null_tr_sum(o, null, null_rows(null, lab))  # (heads, R)
    want = reference_null_tr(o, null, lab).double().sum(0)
    assert got.shape == (6, 300) and got.dtype == torch.float64
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=2e-5, atol=1e-6)
    # each row alone sums to the same: grouping rows of one label set changes nothing but the order of the sums
    alone = sum(null_tr_sum(o[i:i + 1], null, null_rows(null, [ids])) for i, ids in enumerate(lab))
    np.testing.assert_allclose(got.numpy(), alone.numpy(), rtol=1e-6, atol=1e-7)


def test_chunks_of_draws_change_nothing(monkeypatch):
    vocab, d, lab = CASES["per-prompt sets of several sizes"]
    g = torch.Generator().manual_seed(3)
    unembed, o = torch.randn(vocab, d, generator=g), torch.randn(len(lab), 5, d, generator=g)
    null = build_null(unembed, lab, 200, seed=0)
    whole = null_tr_sum(o, null, null_rows(null, lab))
    monkeypatch.setattr(tr_null, "CHUNK", 37)  # a chunk of one draw
    assert torch.allclose(null_tr_sum(o, null, null_rows(null, lab)), whole, rtol=1e-6, atol=0)


def test_whitening_is_the_pseudo_inverse_and_triangular_at_full_rank():
    """W W^T = G^+ for a batch mixing full-rank and rank-deficient grams; full rank takes the Cholesky path
    (W^T lower triangular), a rank-deficient gram the eigh fallback."""
    g = torch.Generator().manual_seed(0)
    u = torch.randn(6, 4, 10, generator=g, dtype=torch.float64)
    u[2, 3] = u[2, 1]  # two equal rows
    u[4, 0] = 0.5 * u[4, 2]  # two parallel rows
    gram = u @ u.mT
    w = whitening(gram)
    for i in range(len(u)):
        np.testing.assert_allclose((w[i] @ w[i].T).numpy(), gram_pinv(u[i]).numpy(), rtol=1e-8, atol=1e-10)
    full = [0, 1, 3, 5]
    assert torch.equal(w[full].mT.tril(), w[full].mT)
    assert not torch.equal(w[2].mT.tril(), w[2].mT)  # eigh's W: not triangular


def test_a_seeded_null_is_reproducible_and_its_p_floor_is_one_over_draws_plus_one(gpt2_tokenizer):
    from backend.model.loading import wrap
    from tiny_models import tiny_model

    lm = wrap(tiny_model("llama"), gpt2_tokenizer, "tiny-llama")
    enc = encoded(lm, n=7)
    a = score_heads(lm, enc, batch_size=3, null_seed=5)
    b = score_heads(lm, enc, batch_size=4, null_seed=5)  # other batches: the same draws (the writes to rounding)
    c = score_heads(lm, enc, batch_size=3, null_seed=6)
    assert np.array_equal(a.null_tr, score_heads(lm, enc, batch_size=3, null_seed=5).null_tr, equal_nan=True)
    np.testing.assert_allclose(a.null_tr, b.null_tr, rtol=1e-5, atol=1e-9)
    assert not np.allclose(a.null_tr, c.null_tr)
    R = n_draws(lm.n_layers * lm.n_heads)
    stats = head_stats(a.per_prompt, a.tr, a.null_tr, 0)["tr"]
    assert a.null_tr.shape[0] == R and stats["p_floor"] == 1 / (R + 1)
    p = ms.tr_p(a.tr, a.null_tr)
    assert p.min() >= 1 / (R + 1) and p.max() <= 1
    # a head whose mean TR beats every draw it took sits at the floor of its draws (R; FIRST_DRAWS when it stopped)
    beyond = ms.tr_p(np.nanmax(a.null_tr, 0) + 1, a.null_tr)
    np.testing.assert_array_equal(beyond, 1 / (1 + np.isfinite(a.null_tr).sum(0)))


def test_the_sequential_null_stops_only_heads_far_from_significance(gpt2_tokenizer):
    """Issue 34: a head stops after FIRST_DRAWS draws only when its p from them is >= STOP_P; every other head has
    all R draws, each equal to the full null's bit for bit (the same seeded draws); a stopped head's first draws
    equal the full null's too, and its p is (1 + exceedances) / (1 + FIRST_DRAWS)."""
    from backend.model.loading import wrap
    from tiny_models import tiny_model

    lm = wrap(tiny_model("llama"), gpt2_tokenizer, "tiny-llama")
    enc = encoded(lm, n=6)
    H = lm.n_layers * lm.n_heads
    null = build_null(lm.unembed, enc.label_ids, n_draws(H), seed=2)
    g = torch.Generator().manual_seed(0)
    writes = torch.randn(len(enc.ids), H, lm.d_model, generator=g)
    rows = null_rows(null, enc.label_ids)
    full = null_tr_sum(writes, null, rows).T / len(enc.ids)  # (R, heads)
    observed = full.mean(0).clone()
    observed[:3] = full.max(0).values[:3] + 1.0  # three heads beyond every draw: they must not stop
    seq = tr_null.sequential_null(writes, rows, observed, null)
    F = tr_null.FIRST_DRAWS
    assert torch.equal(seq[:F], full[:F])
    kept = torch.isfinite(seq).all(0)
    stopped = ~kept
    assert kept[:3].all() and stopped.any()  # heads at their null's mean stop (p about 0.5)
    assert torch.equal(seq[:, kept], full[:, kept]) and torch.isnan(seq[F:, stopped]).all()
    p = ms.tr_p(observed.numpy(), seq.numpy())
    e = (full[:F, stopped] >= observed[stopped] - 1e-12 * observed[stopped].abs().clamp_min(1)).sum(0).numpy()
    np.testing.assert_allclose(p[stopped.numpy()], (1 + e) / (1 + F), rtol=1e-12)
    assert (p[stopped.numpy()] >= tr_null.STOP_P).all()
    np.testing.assert_allclose(p[kept.numpy()], ms.tr_p(observed.numpy(), full.numpy())[kept.numpy()], rtol=1e-12)
    assert (p[:3] == 1 / (1 + null.draws)).all()
