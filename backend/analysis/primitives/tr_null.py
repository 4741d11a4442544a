"""The TR null: every head's TR onto random label subspaces of the same size, from the same writes (no forward pass).

TR = ||P o|| measures how much of a head's write o lies in the label subspace span(U). Any write has some projection
onto any subspace of the same dimension (for a random n-dimensional subspace of R^d, E ||P o||^2 = n/d ||o||^2),
so the null of "this head writes onto the labels" is not TR = 0: it is TR onto a random subspace of the same size.

Random subspaces are frequency-matched: each label token t is replaced by a random vocabulary row from t's id band
(the ids cut into BANDS equal bands; BPE vocabularies number tokens roughly in merge order, so an id's rank is a
proxy for its frequency), from a pool of POOL rows per band that holds no label token of the task, distinct within a
band in one draw. Draw r replaces each label token by the same row in every prompt: for a task with one label set
each draw is one random subspace of the label subspace's dimension, shared by all prompts, as the label subspace is.

Shapes: writes o (batch, heads, d); the pool's rows (M, d), M = POOL x bands in use; draws R.
Per layer and batch: a = o W_pool^T (batch, heads, M), gathered to (batch, heads, R, n) and
TR_null = sqrt(a^T G_r^+ a) with G_r = U_r U_r^T (R, n, n), as `tsla.tsla` computes TR, here as ||W_r^T a||
with W_r W_r^T = G_r^+ (`whitening`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

BANDS = 16  # equal bands of token ids: the frequency proxy
POOL = 128  # random rows per band a label token can be replaced by
MIN_DRAWS, MAX_DRAWS, DRAWS_PER_HEAD = 1000, 20_000, 10


def n_draws(n_heads: int) -> int:
    """Draws for a model of `n_heads` heads in all: 10 per head (1000 to 20000). A Monte Carlo p has the floor
    1/(R+1), so after Benjamini-Hochberg over all heads the q of the m heads beyond every draw is n_heads / (m (R+1)):
    about 0.1 / m, so two such heads reach q <= 0.05 (one alone does not). 20 per head would let one alone, at twice
    the cost (bench/RESULTS.md: the statistics' cost)."""
    return int(min(MAX_DRAWS, max(MIN_DRAWS, DRAWS_PER_HEAD * n_heads)))


def band(ids: np.ndarray, vocab: int) -> np.ndarray:
    """The id band of each token id (0 .. BANDS - 1)."""
    return np.minimum(np.asarray(ids, dtype=np.int64) * BANDS // max(vocab, 1), BANDS - 1)


@dataclass
class TrNull:
    """Random label subspaces for one prompt set.

    rows: (M, d) float32 pool rows of W_U; gram: (M, M) float64 = rows rows^T; repl: (R, T) pool index of each of the
    task's T label tokens (columns in `col`) in each draw; pinv: (U_r U_r^T)^+ per label tuple, (R, n, n)."""

    rows: torch.Tensor
    gram: torch.Tensor
    repl: torch.Tensor
    col: dict[int, int]
    pinv: dict[tuple[int, ...], torch.Tensor] = field(default_factory=dict)

    @property
    def draws(self) -> int:
        return int(self.repl.shape[0])


def build_null(unembed: torch.Tensor, label_ids: list[list[int]], draws: int, seed: int = 0) -> TrNull:
    """The pool and each draw's replacement of every label token (seeded), for prompts with these label sets."""
    vocab, dev = unembed.shape[0], unembed.device
    labels = np.array(sorted({int(t) for ids in label_ids for t in ids}), dtype=np.int64)
    lb = band(labels, vocab)
    rng = np.random.default_rng(seed)
    pool_ids: list[np.ndarray] = []
    repl = np.zeros((draws, len(labels)), dtype=np.int64)
    for b in np.unique(lb):
        lo, hi = int(b) * vocab // BANDS, (int(b) + 1) * vocab // BANDS if b < BANDS - 1 else vocab
        cand = np.setdiff1d(np.arange(lo, hi), labels)
        if cand.size == 0:  # a band of label tokens only (a tiny vocabulary): any non-label row
            cand = np.setdiff1d(np.arange(vocab), labels) if vocab > len(labels) else np.arange(vocab)
        pick = rng.choice(cand, size=min(POOL, cand.size), replace=False)
        start = sum(len(x) for x in pool_ids)
        pool_ids.append(pick)
        which = np.flatnonzero(lb == b)
        k = len(pick)
        if len(which) <= k:  # distinct rows within the band in each draw: the subspace keeps its dimension
            choice = np.argsort(rng.random((draws, k)), axis=1)[:, : len(which)]
        else:
            choice = rng.integers(0, k, size=(draws, len(which)))
        repl[:, which] = start + choice
    ids = torch.as_tensor(np.concatenate(pool_ids) if pool_ids else np.zeros(0, np.int64), device=dev)
    rows = unembed[ids].float()
    gram = rows.double() @ rows.double().T
    return TrNull(rows, gram, torch.as_tensor(repl, device=dev), {int(t): i for i, t in enumerate(labels)})


@dataclass
class NullBatch:
    """A batch's random label rows: idx (batch, R, n) pool indices (0 where padded); white (batch, R, n, n) float32,
    W with W W^T = (U_r U_r^T)^+ per row and draw (zero where padded), so TR^2 = ||W^T a||^2; `shared`: every row
    has the same label set (then only row 0's are used)."""

    idx: torch.Tensor
    white: torch.Tensor
    shared: bool = False


def whitening(gram: torch.Tensor) -> torch.Tensor:
    """W (..., n, n) with W W^T = gram^+ for PSD grams (..., n, n) float64: V diag(1 / sqrt(lambda)) over the
    eigenvalues above the pseudo-inverse's cutoff (as `torch.linalg.pinv`'s, hermitian)."""
    lam, vec = torch.linalg.eigh(gram)
    cut = lam.amax(-1, keepdim=True).clamp_min(0) * gram.shape[-1] * torch.finfo(gram.dtype).eps
    inv = torch.where(lam > cut, lam.clamp_min(1e-300).rsqrt(), torch.zeros_like(lam))
    return vec * inv[..., None, :]


def null_batch(null: TrNull, label_ids: list[list[int]]) -> NullBatch:
    """Each row's label tokens replaced in every draw, and their whitening per row and draw (shared by equal label
    sets)."""
    b, n, R = len(label_ids), max(len(x) for x in label_ids), null.draws
    dev = null.rows.device
    idx = torch.zeros(b, R, n, dtype=torch.long, device=dev)
    white = torch.zeros(b, R, n, n, dtype=torch.float32, device=dev)
    for i, ids in enumerate(label_ids):
        ix = null.repl[:, [null.col[int(t)] for t in ids]]  # (R, n_i)
        idx[i, :, : len(ids)] = ix
        key = tuple(int(t) for t in ids)
        if key not in null.pinv:
            null.pinv[key] = whitening(null.gram[ix[:, :, None], ix[:, None, :]]).float()
        white[i, :, : len(ids), : len(ids)] = null.pinv[key]
    return NullBatch(idx, white, len({tuple(x) for x in label_ids}) == 1)


def null_tr(o: torch.Tensor, null: TrNull, nb: NullBatch) -> torch.Tensor:
    """TR of writes o (batch, heads, d) onto each draw's random label subspace -> (batch, heads, R) float32:
    a = o W_pool^T (batch, heads, M) once, then c_k = sum_i W[i, k] a_i and TR = sqrt(sum_k c_k^2), elementwise over
    (batch, heads, R) per label position (batched n x n products of that size run several times slower); one label
    set for the whole batch (a classification task) reads the draws' columns with one index per position."""
    b, H = o.shape[:2]
    R, n = nb.idx.shape[1:]
    a = torch.einsum("bhd,md->bhm", o.float(), null.rows)  # (b, H, M)
    if nb.shared:
        parts = [a.index_select(2, nb.idx[0, :, i]) for i in range(n)]  # each (b, H, R)
        w = nb.white[0]  # (R, n, n), broadcast over rows and heads
    else:
        parts = [a.gather(2, nb.idx[:, None, :, i].expand(b, H, R)) for i in range(n)]
        w = nb.white[:, None]  # (b, 1, R, n, n)
    out = None
    for k in range(n):
        c = parts[0] * w[..., 0, k]
        for i in range(1, n):
            c.addcmul_(parts[i], w[..., i, k])
        out = c.mul_(c) if out is None else out.addcmul_(c, c)
    return out.sqrt_()
