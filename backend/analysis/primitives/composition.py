"""Weight-based composition between heads (Elhage et al. 2021), in low-rank factors: the pure math, on tensors.

Row convention (TransformerLens): x (1, d_model) is the residual stream; head h reads it through the per-head
matrices of `LoadedModel.w_qkv` and writes through W_O[h] (head_dim, d_model):
    W_OV[h] = W_V[kv(h)] W_O[h]        (d, d)      the value path: x W_OV is what the head writes for input x
    W_QK[h] = W_Q[h] W_K[kv(h)]^T      (d, d)      the attention score of query x_q on key x_k is x_q W_QK x_k^T
with kv(h) = h // (heads / kv_heads) under grouped-query attention. For a sender head s in a layer before the
receiver head r:
    Q-comp(s, r) = ||W_OV[s] W_QK[r]||_F   / (||W_OV[s]||_F ||W_QK[r]||_F)
    K-comp(s, r) = ||W_OV[s] W_QK[r]^T||_F / (||W_OV[s]||_F ||W_QK[r]||_F)
    V-comp(s, r) = ||W_OV[s] W_OV[r]||_F   / (||W_OV[s]||_F ||W_OV[r]||_F)
(the paper's column convention ||W_QK^T W_OV||, ||W_QK W_OV|| and ||W_OV W_OV|| are these, transposed). Each lies in
[0, 1]: ||AB||_F <= ||A||_2 ||B||_F <= ||A||_F ||B||_F.

Norms are folded in as TransformerLens's `fold_ln` does (`fold_norms`): a reader's input norm scales x by its gain
g (d,) and by 1 / rms(x) (LayerNorm: after centring, P = I - 11^T / d), so every read matrix becomes P diag(g) W; a
per-head query / key norm (Qwen3, Gemma 3) adds diag(g_q) on the head_dim side; a post-attention norm (Gemma 2 / 3)
is linearised as the TR / TL maps do, write = g ⊙ (z W_O) / rms, so W_O[h] becomes W_O[h] diag(g) (LayerNorm
families: centred, W_O P, as every reader centres). The 1 / rms factors are positive scalars at each position: they
cancel in the normalised scores, which are therefore exact for that linearisation. Biases and rotary positions are
left out (as in TransformerLens's composition scores).

Nothing (d, d) is formed. With A = Q_A R_A (reduced QR), ||A Z||_F = ||R_A Z||_F; with E^T = Q_E R_E, ||Z E||_F =
||Z R_E^T||_F. So a sender s is one factor X[s] = R_V W_O[s] (head_dim, d) with ||W_OV[s]||_F = ||X[s]||_F, a
receiver r in each mode one factor Y[r] = C R_E^T (d, head_dim), its matrix C E with ||C E||_F = ||Y[r]||_F
(Q: C = W_Q[r], E = W_K^T; K: C = W_K, E = W_Q[r]^T; V: C = W_V, E = W_O[r]), and
    score(s, r) = ||X[s] Y[r]||_F / (||X[s]||_F ||Y[r]||_F)
one (head_dim x d) @ (d x head_dim) product per pair, batched over a sender layer's heads and all its receivers.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal, Mapping, Sequence

import torch

Mode = Literal["q", "k", "v"]
MODES: tuple[Mode, ...] = ("q", "k", "v")


@dataclass
class LayerWeights:
    """One layer's per-head weights, norms folded in (`fold`): w_q (heads, d, dh), w_k and w_v (kv_heads, d, dh),
    w_o (heads, dh, d), float64 or float32."""

    w_q: torch.Tensor
    w_k: torch.Tensor
    w_v: torch.Tensor
    w_o: torch.Tensor

    @property
    def group(self) -> int:
        """Query heads per kv head."""
        return self.w_q.shape[0] // self.w_k.shape[0]


def fold(w_q: torch.Tensor, w_k: torch.Tensor, w_v: torch.Tensor, w_o: torch.Tensor, g_in: torch.Tensor | None,
         g_post: torch.Tensor | None = None, g_qk: tuple[torch.Tensor, torch.Tensor] | None = None,
         centered: bool = False) -> LayerWeights:
    """The layer's weights with its norms folded in (module docstring): reads P diag(g_in) W (P: centring, for
    LayerNorm families), queries and keys times diag(g_q), diag(g_k) on the head_dim side, writes W_O diag(g_post)
    (then W_O P when centred). g_in, g_post (d,), g_qk ((dh,), (dh,)); None: no such norm (or not folded)."""
    def read(w: torch.Tensor) -> torch.Tensor:  # (n, d, dh)
        w = w if g_in is None else w * g_in.to(w)[None, :, None]
        return w - w.mean(1, keepdim=True) if centered else w

    q, k, v = read(w_q), read(w_k), read(w_v)
    if g_qk is not None:
        q, k = q * g_qk[0].to(q)[None, None, :], k * g_qk[1].to(k)[None, None, :]
    o = w_o if g_post is None else w_o * g_post.to(w_o)[None, None, :]
    if centered:
        o = o - o.mean(2, keepdim=True)
    return LayerWeights(q, k, v, o)


def _r(a: torch.Tensor) -> torch.Tensor:
    """R of the reduced QR of each a (n, rows, cols) -> (n, min(rows, cols), cols): ||a Z||_F = ||R Z||_F."""
    return torch.linalg.qr(a, mode="r").R


def sender_factors(w: LayerWeights) -> torch.Tensor:
    """X (heads, dh', d): X[h] = R(W_V[kv(h)]) W_O[h], with ||X[h] Z||_F = ||W_OV[h] Z||_F for every Z."""
    r_v = _r(w.w_v).repeat_interleave(w.group, 0)  # (heads, dh', dh)
    return r_v @ w.w_o


def receiver_factors(w: LayerWeights, mode: Mode) -> torch.Tensor:
    """Y (heads, d, dh'): Y[h] = C R(E^T)^T for the receiver's matrix C E in `mode` (module docstring), with
    ||Z C E||_F = ||Z Y[h]||_F for every Z, and ||C E||_F = ||Y[h]||_F."""
    kv = lambda t: t.repeat_interleave(w.group, 0)  # noqa: E731 - (kv_heads, ...) -> (heads, ...)
    if mode == "q":
        c, e_t = w.w_q, kv(w.w_k)
    elif mode == "k":
        c, e_t = kv(w.w_k), w.w_q
    else:
        c, e_t = kv(w.w_v), w.w_o.transpose(1, 2)
    return c @ _r(e_t).transpose(1, 2)


def scores(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """||X[s] Y[r]||_F / (||X[s]||_F ||Y[r]||_F) for senders x (S, a, d) and receivers y (R, d, b) -> (S, R), in one
    (S a, d) @ (d, R b) product; 0 where a factor is 0."""
    S, a, d = x.shape
    R, _, b = y.shape
    prod = (x.reshape(S * a, d) @ y.permute(1, 0, 2).reshape(d, R * b)).reshape(S, a, R, b)
    num = prod.pow(2).sum((1, 3)).sqrt()
    den = x.flatten(1).norm(dim=1)[:, None] * y.flatten(1).norm(dim=1)[None, :]
    return torch.where(den > 0, num / torch.where(den > 0, den, 1.0), torch.zeros_like(num))


def composition_matrix(layers: Sequence[LayerWeights] | Mapping[int, LayerWeights],
                       receivers: Sequence[tuple[int, int]], mode: Mode, check: Callable[[], None] | None = None,
                       senders: Sequence[torch.Tensor] | None = None) -> torch.Tensor:
    """`mode`-composition of every sender head (l, h) of every layer into each receiver, (layers * heads,
    len(receivers)) float on the weights' device, rows l * heads + h; NaN where the sender's layer is not before the
    receiver's. `senders`: each layer's `sender_factors`, when computed already (the same in every mode); `layers`
    is then read at the receivers' layers only (a mapping of those is enough)."""
    x = list(senders) if senders is not None else [sender_factors(w) for w in layers]  # type: ignore[union-attr]
    n_layers, heads = len(x), x[0].shape[0]
    by_layer: dict[int, list[int]] = {}
    for j, (l, _) in enumerate(receivers):
        by_layer.setdefault(l, []).append(j)
    ys = {l: receiver_factors(layers[l], mode)[[receivers[j][1] for j in js]]
          for l, js in by_layer.items()}
    out = torch.full((n_layers * heads, len(receivers)), float("nan"), dtype=x[0].dtype, device=x[0].device)
    for ls in range(n_layers):
        later = [l for l in sorted(by_layer) if l > ls]
        if not later:
            continue
        if check is not None:
            check()
        y = torch.cat([ys[l] for l in later])
        order = torch.tensor([j for l in later for j in by_layer[l]], device=out.device)
        out[ls * heads:(ls + 1) * heads, order] = scores(x[ls], y).to(out.dtype)
    return out


def dense_ov(w: LayerWeights, h: int) -> torch.Tensor:
    """W_OV[h] (d, d), formed: for tests and the one head's OV circuit."""
    return w.w_v[h // w.group] @ w.w_o[h]


def dense_qk(w: LayerWeights, h: int) -> torch.Tensor:
    """W_QK[h] (d, d), formed: for tests."""
    return w.w_q[h] @ w.w_k[h // w.group].T
