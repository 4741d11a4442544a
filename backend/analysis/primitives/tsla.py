"""Task Subspace Logit Attribution: the pure math, on tensors.

For head (l, h) at a prompt's last token, its write into the residual stream is
    o[l, h] = z[l, h] @ W_O[l, h]                      (d_model,)
or, where a post-attention norm follows (Gemma 2 / 3), that write through the norm linearised at the position,
    o[l, h] = g ⊙ (z[l, h] @ W_O[l, h]) / rms(sum_h z[l, h] @ W_O[l, h] + b)    (`hooks.Trace.write_scale`)
With U the unembedding rows of the prompt's label first tokens, shape (n_labels, d_model),
    P = U^T (U U^T)^+ U                                  projector onto the label subspace
    TR = ||P o||_2 = sqrt(a^T G^+ a),  a = U o,  G = U U^T
    TL = <o, U[y*] - mean_{c != y*} U[c]> / TR  = (a[y*] - mean_{c != y*} a[c]) / TR   (0 where TR = 0)
    DLA-TR = sum_c a[c],  DLA-TL = a[y*]
so only a = U o, of shape (n_labels,), is ever needed per head.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

ZERO_TOL = 1e-9  # TR below this fraction of ||o|| counts as zero: TL is set to 0 and the head flagged


def head_writes(z: torch.Tensor, w_o: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
    """Per-head writes o = (z_h @ W_O[h]) * scale: z (batch, heads, head_dim), w_o (heads, head_dim, d),
    scale (batch, d) the post-attention norm linearised at the position, or None (no such norm)
    -> (batch, heads, d)."""
    o = torch.einsum("bhk,hkd->bhd", z, w_o)
    return o if scale is None else o * scale[:, None, :].to(o.dtype)


def gram_pinv(u: torch.Tensor) -> torch.Tensor:
    """(U U^T)^+ in float64 for label rows u (n_labels, d) -> (n_labels, n_labels)."""
    u = u.double()
    return torch.linalg.pinv(u @ u.T, hermitian=True)


def projector(u: torch.Tensor) -> torch.Tensor:
    """P = U^T (U U^T)^+ U in float64, (d, d). For tests and geometry; scoring never forms it."""
    u = u.double()
    return u.T @ gram_pinv(u) @ u


@dataclass
class LabelSpace:
    """Label rows of a batch, padded to the largest label set.

    u: (batch, n, d) float32, zero rows where `valid` is False; valid: (batch, n) bool;
    gold: (batch,) index of the gold label; g_pinv: (batch, n, n) float64, (U U^T)^+ per row.
    """

    u: torch.Tensor
    valid: torch.Tensor
    gold: torch.Tensor
    g_pinv: torch.Tensor


def label_space(unembed: torch.Tensor, label_ids: list[list[int]], gold: list[int],
                pinv_cache: dict[tuple[int, ...], torch.Tensor] | None = None) -> LabelSpace:
    """Gather label rows of W_U (vocab, d) for each row; pinvs are shared between identical label sets."""
    b, n = len(label_ids), max(len(x) for x in label_ids)
    d, dev = unembed.shape[1], unembed.device
    u = torch.zeros(b, n, d, device=dev)
    valid = torch.zeros(b, n, dtype=torch.bool, device=dev)
    gp = torch.zeros(b, n, n, dtype=torch.float64, device=dev)
    cache = pinv_cache if pinv_cache is not None else {}
    for i, ids in enumerate(label_ids):
        rows = unembed[torch.tensor(ids, device=dev)].float()
        u[i, : len(ids)] = rows
        valid[i, : len(ids)] = True
        key = tuple(ids)
        if key not in cache:
            cache[key] = gram_pinv(rows)
        gp[i, : len(ids), : len(ids)] = cache[key]
    return LabelSpace(u, valid, torch.tensor(gold, device=dev), gp)


@dataclass
class HeadStats:
    """Per-prompt, per-head scores, each (batch, heads) float64, and flagged (batch, heads) bool."""

    tr: torch.Tensor
    tl: torch.Tensor
    dla_tr: torch.Tensor
    dla_tl: torch.Tensor
    flagged: torch.Tensor


def tsla(o: torch.Tensor, ls: LabelSpace) -> HeadStats:
    """TR, TL, DLA-TR and DLA-TL of writes o (batch, heads, d) against each row's label space."""
    a = torch.einsum("bhd,bnd->bhn", o.float(), ls.u).double()  # (b, H, n)
    a = a * ls.valid[:, None, :]
    tr = torch.einsum("bhn,bnm,bhm->bh", a, ls.g_pinv, a).clamp_min(0).sqrt()
    a_gold = a.gather(-1, ls.gold[:, None, None].expand(-1, a.shape[1], 1)).squeeze(-1)
    n_other = (ls.valid.sum(-1) - 1).clamp_min(1)[:, None].double()
    others = (a.sum(-1) - a_gold) / n_other
    onorm = o.double().norm(dim=-1)
    flagged = tr <= ZERO_TOL * onorm
    flagged |= onorm == 0
    tl = torch.where(flagged, torch.zeros_like(tr), (a_gold - others) / torch.where(flagged, 1.0, tr))
    return HeadStats(tr=tr, tl=tl, dla_tr=a.sum(-1), dla_tl=a_gold, flagged=flagged)


def apply_final_ln(o: torch.Tensor, resid: torch.Tensor, gain: torch.Tensor, eps: float, centered: bool) -> torch.Tensor:
    """Scale writes as the final norm would scale them inside the whole residual stream.

    o (batch, heads, d), resid (batch, d) the final norm's input at the same position, gain (d,).
    LayerNorm: gain * (o - mean_d o) / sqrt(var(resid) + eps); RMSNorm: gain * o / sqrt(mean(resid^2) + eps).
    """
    resid = resid.float()
    if centered:
        o = o - o.mean(-1, keepdim=True)
        scale = (resid.var(-1, unbiased=False) + eps).sqrt()
    else:
        scale = (resid.pow(2).mean(-1) + eps).sqrt()
    return o * gain / scale[:, None, None]
