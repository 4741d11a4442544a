"""TSLA formulas against explicit linear algebra, on synthetic vectors."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from backend.analysis.primitives.selection import n_top, overlap, random_heads, top_heads
from backend.analysis.primitives.tsla import apply_final_ln, label_space, projector, tsla


def test_tr_tl_dla_match_explicit_projection():
    g = torch.Generator().manual_seed(0)
    d, vocab, b, H = 16, 50, 3, 5
    W = torch.randn(vocab, d, generator=g)
    labels = [[3, 7, 11], [3, 7, 11], [5, 9, 20, 21]]
    gold = [0, 2, 1]
    o = torch.randn(b, H, d, generator=g)
    st = tsla(o, label_space(W, labels, gold))
    for i in range(b):
        U = W[labels[i]].double()
        P = projector(U)
        target = U[gold[i]] - torch.cat([U[:gold[i]], U[gold[i] + 1:]]).mean(0)
        for h in range(H):
            oo = o[i, h].double()
            tr = (P @ oo).norm()
            assert abs(st.tr[i, h] - tr) < 1e-5
            assert abs(st.tl[i, h] - (oo @ target) / tr) < 1e-4
            assert abs(st.dla_tr[i, h] - (U @ oo).sum()) < 1e-4
            assert abs(st.dla_tl[i, h] - U[gold[i]] @ oo) < 1e-4
    assert not st.flagged.any()


def test_projector_is_idempotent_and_handles_dependent_labels():
    g = torch.Generator().manual_seed(1)
    U = torch.randn(3, 8, generator=g, dtype=torch.float64)
    U = torch.cat([U, U[:1] + U[1:2]])  # rank 3 with 4 rows: pinv, not inverse
    P = projector(U)
    torch.testing.assert_close(P @ P, P, atol=1e-10, rtol=0)
    torch.testing.assert_close(P @ U.T, U.T, atol=1e-10, rtol=0)


def test_write_orthogonal_to_label_subspace_gets_zero_tl_and_a_flag():
    W = torch.zeros(10, 4)
    W[1, 0] = 1.0
    W[2, 1] = 1.0
    o = torch.tensor([[[0.0, 0.0, 3.0, 0.0], [0.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]])  # (1, 3, 4)
    st = tsla(o, label_space(W, [[1, 2]], [0]))
    assert st.tr[0].tolist() == [0.0, 0.0, 1.0]
    assert st.tl[0, 0] == 0 and st.tl[0, 1] == 0 and st.flagged[0, :2].all()
    assert abs(st.tl[0, 2] - 1.0) < 1e-12 and not st.flagged[0, 2]


def test_final_ln_scaling():
    o = torch.tensor([[[1.0, 2.0, 3.0, 6.0]]])
    resid = torch.tensor([[2.0, 2.0, 2.0, 2.0]])
    gain = torch.tensor([1.0, 1.0, 2.0, 1.0])
    rms = apply_final_ln(o, resid, gain, eps=0.0, centered=False)
    torch.testing.assert_close(rms, torch.tensor([[[0.5, 1.0, 3.0, 3.0]]]))
    resid = torch.tensor([[1.0, 3.0, 1.0, 3.0]])  # variance 1
    ln = apply_final_ln(o, resid, torch.ones(4), eps=0.0, centered=True)
    torch.testing.assert_close(ln, torch.tensor([[[-2.0, -1.0, 0.0, 3.0]]]))


def test_head_selection_and_overlap():
    s = np.arange(24, dtype=float).reshape(4, 6)
    # top p% of the heads, never fewer than 4 (issue: 3% of 32 heads was one head); an explicit k as given
    assert n_top(4, 6, 3.0) == 4 and n_top(32, 32, 3.0) == 31 and n_top(4, 8, 10.0) == 4 and n_top(12, 12, 10) == 15
    assert n_top(1, 2, 3.0) == 2 and n_top(4, 6, 3.0, k=1) == 1 and n_top(4, 6, k=100) == 24
    assert top_heads(s, 3.0) == [(3, 5), (3, 4), (3, 3), (3, 2)]
    assert top_heads(s, k=3) == [(3, 5), (3, 4), (3, 3)]
    r1, r2 = random_heads(4, 6, 5, seed=0), random_heads(4, 6, 5, seed=0)
    assert r1 == r2 and len(set(r1)) == 5 and random_heads(4, 6, 5, seed=1) != r1
    same = overlap(s, s, 3)
    assert same["jaccard"] == 1.0 and same == pytest.approx({"jaccard": 1, "spearman": 1, "kendall": 1})
    rev = overlap(s, -s, 3)
    assert rev["jaccard"] == 0.0 and rev["spearman"] == pytest.approx(-1.0)
