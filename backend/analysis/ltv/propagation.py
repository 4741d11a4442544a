"""How an injected vector acts: head saliency, OV reconstruction, and its linear propagation to the last layer.

Head saliency under an injection, per head (layers, heads), mean over prompts:
    s[l, h] = | a[l, h] . d p(gold) / d a[l, h] |,   a = the head's output-projection input z at the last token
computed exactly as the gradient of p(gold) with respect to a last-token head multiplier m (z -> m z) at m = 1.

OV reconstruction of theta injected at the input of layer l at positions P: every head h of a layer l' >= l
reads theta through its value path and writes it to the last token with weight A[l', h](last -> p):
    r = mean_prompts sum_{l' >= l} sum_h sum_{p in P} A[l', h](last, p) * (J_{l'} theta) W_V[kv(h)] W_O[h]
with J_{l'} theta the layer's input norm linearised at the run's residual at p (a Jacobian-vector product), so
the norm's scale is in; kv(h) is the key-value head that query head h reads (grouped-query attention). Where a
post-attention norm follows (Gemma 2 / 3), each write is taken through it, linearised at the run's last token
(`hooks.Trace.write_scale`), as every head write is.

Linear propagation: perturbed vectors theta_i = theta + lambda_i ||theta|| e_i (e_i random unit vectors) are
injected, and W (d, d) is fitted by least squares to Delta_i = mean_prompts (h_final(theta_i) - h_final(0)) ~ W
theta_i, h_final the last layer's output at the last token. With theta at the last token only, each perturbation is
one token step over the clean prefix's KV cache from layer l on (`last_token.final_change`); other positions run
full passes. Its polar decomposition W = Q S (Q orthogonal, S symmetric positive semi-definite) splits
propagation into a rotation, cos(theta, Q theta), and a stretch,
||S theta|| / ||theta||.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ...model.hooks import hooked
from ...model.interventions import Record, intervene
from ...model.loading import LoadedModel
from ..primitives.stopping import check
from ..primitives.batching import Batch, Encoded, Progress, make_batch, map_batches
from ..primitives.induction import eager_attention
from ..primitives.inject import Injection, final_states, gold_tokens, injected_logits
from ..primitives.last_token import final_change
from ..primitives.tsla import head_writes


def head_saliency(lm: LoadedModel, enc: Encoded, inj: Injection, batch_size: int = 32,
                  progress: Progress | None = None) -> np.ndarray:
    """Mean over prompts of |a . dp(gold)/da| per head at the last token under `inj`, (layers, heads)."""
    gold = gold_tokens(enc)
    total = torch.zeros(lm.n_layers, lm.n_heads, dtype=torch.float64)
    order = sorted(range(len(enc.ids)), key=lambda i: -len(enc.ids[i]))
    with lm.lock, torch.enable_grad():
        for s in range(0, len(order), batch_size):
            check()  # once per batch (`stopping`)
            rows = order[s:s + batch_size]
            batch = make_batch(lm, enc.ids, rows)
            m = torch.ones(len(rows), lm.n_layers, lm.n_heads, device=lm.device, requires_grad=True)
            vectors = {l: v.detach() for l, v in inj.vectors.items()}
            logits = injected_logits(lm, batch, Injection(vectors, inj.positions, inj.final, m))
            p = torch.softmax(logits, -1).gather(1, gold[rows].to(logits.device)[:, None]).sum()
            (grad,) = torch.autograd.grad(p, m)
            total += grad.abs().double().sum(0).cpu()
            if progress:
                progress(min(1.0, (s + len(rows)) / len(order)), "head saliency")
    return (total / len(order)).numpy()


def ov_reconstruction(lm: LoadedModel, enc: Encoded, layer: int, theta: torch.Tensor, positions: Sequence[int],
                      batch_size: int = 32, progress: Progress | None = None) -> tuple[torch.Tensor, np.ndarray]:
    """(r (d_model,), per-head norms of the mean write ||r[l', h]|| (layers, heads)) of theta injected at the
    input of `layer` at `positions` (see the module docstring). Heads before `layer` write nothing (zeros)."""
    L, H, d = lm.n_layers, lm.n_heads, lm.d_model
    group = H // lm.n_kv_heads
    later = list(range(layer, L))
    pos = tuple(positions)
    theta = theta.detach().to(lm.device, lm.dtype)
    total = torch.zeros(L, H, d, dtype=torch.float64, device=lm.device)

    def step(batch: Batch) -> None:
        inputs: dict[int, torch.Tensor] = {}
        with hooked(lm, inject={layer: theta}, inject_positions=pos, last=batch.last,
                    capture_z=lm.spec.post_attn_norm is not None) as trace, \
                intervene(lm, [Record("layer_in", inputs.__setitem__, at=later)]):  # after the injection
            out = lm.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                           position_ids=batch.position_ids, use_cache=False, logits_to_keep=1,
                           output_attentions=True)
        idx = list(pos)  # negative offsets: left padding puts the last prompt token at -1
        for l in later:
            x = inputs[l][:, idx]  # (b, P, d)
            norm = lm.input_norm(l)
            _, tangent = torch.func.jvp(lambda y: lm.values(l, norm(y)), (x,),
                                        (theta.expand_as(x).contiguous(),))  # (b, P, kv, dh)
            a = out.attentions[l][:, :, -1, idx]  # (b, H, P)
            v = tangent[:, :, torch.arange(H, device=lm.device) // group]  # (b, P, H, dh)
            z = torch.einsum("bhp,bphd->bhd", a.to(v.dtype), v)  # (b, H, dh)
            scale = trace.write_scale[l]
            if scale is None:
                write = torch.einsum("bhd,hdm->hm", z.float(), lm.w_o(l))  # summed over the batch, (H, d)
            else:
                write = head_writes(z.float(), lm.w_o(l), scale).sum(0)
            total[l] += write.double()

    with eager_attention(lm):
        map_batches(lm, enc.ids, batch_size, step, progress, "OV reconstruction")
    mean = total / len(enc.ids)
    return mean.sum((0, 1)).float().cpu(), mean.norm(dim=-1).cpu().numpy()


def polar(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """W = Q S with Q orthogonal and S symmetric positive semi-definite (from the SVD W = U diag(s) V^T:
    Q = U V^T, S = V diag(s) V^T)."""
    u, s, vh = torch.linalg.svd(w.double())
    return (u @ vh).to(w.dtype), (vh.T @ torch.diag(s) @ vh).to(w.dtype)


def rotation_stretch(w: torch.Tensor, theta: torch.Tensor) -> tuple[float, float]:
    """(cos(theta, Q theta), ||S theta|| / ||theta||) for W = Q S."""
    q, s = polar(w)
    t = theta.to(w.dtype)
    qt, st = q @ t, s @ t
    cos = float(torch.dot(t, qt) / (t.norm() * qt.norm()).clamp_min(1e-30))
    return cos, float(st.norm() / t.norm().clamp_min(1e-30))


def fit_linear(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Least-squares W (d_out, d_in) with y ~ x W^T, x (n, d_in), y (n, d_out); and the fit's R^2 (share of y's
    variance around its mean that W explains). With n < d_in it is the minimum-norm solution."""
    xd, yd = x.double(), y.double()
    wt = torch.linalg.lstsq(xd, yd, driver="gelsd").solution if xd.device.type == "cpu" else \
        torch.linalg.pinv(xd) @ yd
    resid = yd - xd @ wt
    var = (yd - yd.mean(0)).pow(2).sum()
    r2 = float(1 - resid.pow(2).sum() / var.clamp_min(1e-30))
    return wt.T.float(), r2


def linear_propagation(lm: LoadedModel, enc: Encoded, layer: int, theta: torch.Tensor, positions: Sequence[int],
                       n: int, scale: float = 1.0, seed: int = 0, batch_size: int = 64,
                       progress: Progress | None = None) -> dict:
    """Fit W: theta_i -> mean change of the final hidden state (see the module docstring) from n perturbations
    theta + lambda_i ||theta|| e_i, lambda_i ~ U(0, scale). Returns {"w": (d, d), "r2", "rotation", "stretch",
    "n"}."""
    d = lm.d_model
    g = torch.Generator().manual_seed(seed)
    e = torch.randn(n, d, generator=g)
    e = e / e.norm(dim=1, keepdim=True)
    lam = torch.rand(n, generator=g) * scale
    t = theta.detach().float().cpu()
    thetas = t[None] + lam[:, None] * t.norm() * e  # (n, d)
    # theta at the last token only: one token step per perturbation over the clean prefix, from `layer` on
    delta = final_change(lm, enc.ids, layer, thetas, batch_size, progress=progress) if tuple(positions) == (-1,) \
        else None
    if delta is None:  # the reference: every (perturbation, prompt) pair a full pass
        P = len(enc.ids)
        base = final_states(lm, enc.ids, list(range(P)), {}, positions, batch_size)  # (P, d)
        rows = [i for _ in range(n) for i in range(P)]
        vec = thetas.repeat_interleave(P, dim=0)  # row r = (perturbation r // P, prompt r % P)
        states = final_states(lm, enc.ids, rows, {layer: vec}, positions, batch_size, progress)
        delta = (states - base.repeat(n, 1)).reshape(n, P, d).mean(1)  # (n, d)
    w, r2 = fit_linear(thetas, delta)
    rot, stretch = rotation_stretch(w, t)
    return {"w": w, "r2": r2, "rotation": rot, "stretch": stretch, "n": n}
