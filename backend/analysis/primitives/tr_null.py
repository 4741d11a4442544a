"""The TR null: every head's TR onto random label subspaces of the same size, from the same writes (no forward pass).

TR = ||P o|| measures how much of a head's write o lies in the label subspace span(U). Any write has some projection
onto any subspace of the same dimension (for a random n-dimensional subspace of R^d, E ||P o||^2 = n/d ||o||^2),
so the null of "this head writes onto the labels" is not TR = 0: it is TR onto a random subspace of the same size.

Random subspaces are frequency-matched: each label token t is replaced by a random vocabulary row from t's id band
(the ids cut into BANDS equal bands; BPE vocabularies number tokens roughly in merge order, so an id's rank is a
proxy for its frequency), from a pool of POOL rows per band that holds no label token of the task, distinct within a
band in one draw. Draw r replaces each label token by the same row in every prompt: for a task with one label set
each draw is one random subspace of the label subspace's dimension, shared by all prompts, as the label subspace is.

Shapes: writes o (batch, heads, d), all layers' heads at once; the pool's rows (M, d), M = POOL x bands in use;
draws R. Per prompt: a = W_pool o^T (M, heads), one GEMM, and TR_null = sqrt(a_r^T G_r^+ a_r) with a_r a's n rows
of draw r and G_r = U_r U_r^T (n, n), as `tsla.tsla` computes TR, here as ||W_r^T a_r|| with W_r W_r^T = G_r^+
(`whitening`): the n sums of W_r^T a_r are n weighted bags of a's rows, one `embedding_bag` over all draws (the
gather and the n x n products in one kernel: n^2 R heads multiply-adds a prompt, on contiguous rows of heads).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

BANDS = 16  # equal bands of token ids: the frequency proxy
POOL = 128  # random rows per band a label token can be replaced by
MIN_DRAWS, MAX_DRAWS, DRAWS_PER_HEAD = 1000, 20_000, 10
CHUNK = 1 << 20  # floats of one chunk of bag sums (4 MB: in cache)


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
class NullRow:
    """One label tuple's draws: used (m,) the pool rows any draw takes for it; idx (R, n) each draw's rows as
    positions in `used`; wt (R, n, n) float32, W_r^T with W_r W_r^T = (U_r U_r^T)^+, so TR^2 = ||W_r^T a||^2."""

    used: torch.Tensor
    idx: torch.Tensor
    wt: torch.Tensor


@dataclass
class TrNull:
    """Random label subspaces for one prompt set.

    rows: (M, d) float32 pool rows of W_U, band by band (rows[blocks[j][0]:blocks[j][1]] band j's); gram: (M, M)
    float64 = rows rows^T, filled block by block as label sets need them (`filled`: (bands, bands) bool); repl:
    (R, T) pool index of each of the task's T label tokens (columns in `col`, its band's block `block[col]`) in each
    draw; `seen`: each label tuple's `NullRow` (`null_rows`)."""

    rows: torch.Tensor
    repl: torch.Tensor
    col: dict[int, int]
    blocks: list[tuple[int, int]]
    block: np.ndarray
    gram: torch.Tensor = field(init=False)
    filled: np.ndarray = field(init=False)
    seen: dict[tuple[int, ...], NullRow] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.gram = torch.empty(len(self.rows), len(self.rows), dtype=torch.float64, device=self.rows.device)
        self.filled = np.zeros((len(self.blocks),) * 2, dtype=bool)

    def fill(self, cols: list[int]) -> None:
        """Compute the gram's blocks among the bands of label columns `cols` (each block once, by symmetry)."""
        bs = sorted({int(self.block[c]) for c in cols})
        for i, bi in enumerate(bs):
            for bj in bs[i:]:
                if not self.filled[bi, bj]:
                    (a0, a1), (b0, b1) = self.blocks[bi], self.blocks[bj]
                    blk = self.rows[a0:a1].double() @ self.rows[b0:b1].double().T
                    self.gram[a0:a1, b0:b1], self.gram[b0:b1, a0:a1] = blk, blk.T
                    self.filled[bi, bj] = self.filled[bj, bi] = True

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
    block, blocks = np.zeros(len(labels), dtype=np.int64), []
    for b in np.unique(lb):
        lo, hi = int(b) * vocab // BANDS, (int(b) + 1) * vocab // BANDS if b < BANDS - 1 else vocab
        cand = np.setdiff1d(np.arange(lo, hi), labels)
        if cand.size == 0:  # a band of label tokens only (a tiny vocabulary): any non-label row
            cand = np.setdiff1d(np.arange(vocab), labels) if vocab > len(labels) else np.arange(vocab)
        pick = rng.choice(cand, size=min(POOL, cand.size), replace=False)
        start = sum(len(x) for x in pool_ids)
        block[which := np.flatnonzero(lb == b)] = len(blocks)
        pool_ids.append(pick)
        blocks.append((start, start + len(pick)))
        k = len(pick)
        if len(which) <= k:  # distinct rows within the band in each draw: the subspace keeps its dimension
            choice = np.argsort(rng.random((draws, k)), axis=1)[:, : len(which)]
        else:
            choice = rng.integers(0, k, size=(draws, len(which)))
        repl[:, which] = start + choice
    ids = torch.as_tensor(np.concatenate(pool_ids) if pool_ids else np.zeros(0, np.int64), device=dev)
    return TrNull(unembed[ids].float(), torch.as_tensor(repl, device=dev), {int(t): i for i, t in enumerate(labels)},
                  blocks, block)


PIVOT = 1e-8  # a Cholesky pivot^2 under this x the gram's largest diagonal: rank-deficient, whitened by eigh


def whitening(gram: torch.Tensor) -> torch.Tensor:
    """W (..., n, n) with W W^T = gram^+ for PSD grams (..., n, n) float64: L^-T of the Cholesky factor gram = L L^T
    where every pivot^2 exceeds PIVOT x the largest diagonal (full rank); else (a rank-deficient draw: two label
    tokens with one first token, or two equal rows) V diag(1 / sqrt(lambda)) over the eigenvalues above the
    pseudo-inverse's cutoff (as `torch.linalg.pinv`'s, hermitian). Both give the same W W^T (to rounding)."""
    low, info = torch.linalg.cholesky_ex(gram)
    diag = gram.diagonal(dim1=-2, dim2=-1)
    ok = (info == 0) & (low.diagonal(dim1=-2, dim2=-1).square().amin(-1) > PIVOT * diag.amax(-1))
    eye = torch.eye(gram.shape[-1], dtype=gram.dtype, device=gram.device).expand_as(gram)
    w = torch.linalg.solve_triangular(torch.where(ok[..., None, None], low, eye), eye, upper=False).mT
    if not bool(ok.all()):
        lam, vec = torch.linalg.eigh(gram[~ok])
        cut = lam.amax(-1, keepdim=True).clamp_min(0) * gram.shape[-1] * torch.finfo(gram.dtype).eps
        w[~ok] = vec * torch.where(lam > cut, lam.clamp_min(1e-300).rsqrt(), torch.zeros_like(lam))[..., None, :]
    return w


def null_rows(null: TrNull, label_ids: list[list[int]]) -> list[NullRow]:
    """Each row's label tokens replaced in every draw, and their W^T per draw (once per label tuple)."""
    out = []
    for ids in label_ids:
        key = tuple(int(t) for t in ids)
        if key not in null.seen:
            cols = [null.col[t] for t in key]
            null.fill(cols)
            ix = null.repl[:, cols]  # (R, n)
            mask = torch.zeros(len(null.rows), dtype=torch.bool, device=ix.device)
            mask[ix.flatten()] = True
            wt = whitening(null.gram.take(ix[:, :, None] * len(null.rows) + ix[:, None, :])).mT.float().contiguous()
            null.seen[key] = NullRow(mask.nonzero()[:, 0], (mask.cumsum(0) - 1)[ix], wt)
        out.append(null.seen[key])
    return out


def null_tr_sum(o: torch.Tensor, null: TrNull, rows: list[NullRow], first: int = 0, stop: int | None = None
                ) -> torch.Tensor:
    """TR of writes o (batch, heads, d) onto the random label subspaces of draws first..stop (None: all R), summed
    over the batch's rows -> (heads, stop - first) float64. Per label tuple (its g rows together): a = W_pool[used]
    o^T (m, g heads); bag (r, k) sums a's rows idx[r] weighted by W_r^T[k], c (R, n, g heads) = W_r^T a[idx_r];
    TR = ||c|| over the n bags; in chunks of draws of CHUNK floats."""
    H, R = o.shape[1], null.draws if stop is None else stop
    out = torch.zeros(R, H, dtype=torch.float64, device=o.device)
    groups: dict[int, list[int]] = {}
    for i, row in enumerate(rows):
        groups.setdefault(id(row), []).append(i)
    for members in groups.values():
        row, g, n = rows[members[0]], len(members), rows[members[0]].idx.shape[1]
        a = null.rows[row.used] @ o[members].flatten(0, 1).float().T  # (m, g H)
        bags = row.idx[:R, None, :].expand(R, n, n)  # bag (r, k): draw r's n rows
        step = max(1, CHUNK // (n * g * H))
        for lo in range(first, R, step):
            hi = min(R, lo + step)
            c = F.embedding_bag(bags[lo:hi].reshape(-1, n), a, mode="sum",
                                per_sample_weights=row.wt[lo:hi].reshape(-1, n))  # ((hi - lo) n, g H)
            out[lo:hi] += c.view(hi - lo, n, g, H).square_().sum(1).sqrt_().sum(1, dtype=torch.float64)
    return out[first:].T


FIRST_DRAWS, STOP_P = 300, 0.1
"""The sequential null (`sequential_null`): every head gets the first FIRST_DRAWS draws; a head whose p from them,
(1 + e) / (1 + FIRST_DRAWS), is already >= STOP_P stops there, the others get all R. A head BH can call significant
needs p <= 0.05 (q <= 0.05 needs p <= 0.05 k / m <= 0.05); one with a true p of 0.05 stops only if e >= 30 of 300
draws when 15 are expected (binomial sd 3.8): probability 6e-5. A stopped head's p then carries its Monte Carlo
error from 300 draws, sqrt(p (1 - p) / 300): 0.017 at p = 0.1, 0.029 at p = 0.5. The draws are the same seeded
draws in the same order: a head that does not stop has the p it had with every draw."""


def sequential_null(writes: torch.Tensor, rows: list[NullRow], observed: torch.Tensor, null: TrNull) -> torch.Tensor:
    """Mean TR over the prompts onto each draw's random subspace, (R, heads) float64, NaN past FIRST_DRAWS for the
    heads that stopped there (see FIRST_DRAWS). writes (prompts, heads, d): every prompt's head writes; rows: each
    prompt's `NullRow`; observed (heads,): each head's mean TR over the prompts."""
    n, H, R = writes.shape[0], writes.shape[1], null.draws
    first = min(R, FIRST_DRAWS)
    out = torch.full((R, H), float("nan"), dtype=torch.float64, device=writes.device)
    out[:first] = null_tr_sum(writes, null, rows, 0, first).T / n
    if first < R:
        tie = observed.abs().clamp_min(1.0) * 1e-12  # as `stats.permutation_p`: ties count as at least as extreme
        e = (out[:first] >= observed - tie).sum(0)
        go = ((1 + e) / (1 + first) < STOP_P).nonzero()[:, 0]
        if len(go):
            out[first:, go] = null_tr_sum(writes[:, go], null, rows, first, R).T / n
    return out
