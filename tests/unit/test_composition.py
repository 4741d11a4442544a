"""Composition scores and the OV circuit (`composition`) against a direct computation from the weights.

On a tiny random-weight model of every family (grouped-query attention among them: Llama 6 query heads over 2 kv
heads, Gemma 4 over 1), with every norm's gain drawn far from 1: the factored Q-, K- and V-composition scores equal
the ones of explicit (d_model, d_model) matrices W_OV = P diag(g_in) W_V W_O diag(g_post) and W_QK = (P diag(g_in)
W_Q diag(g_q)) (P diag(g_in) W_K diag(g_k))^T, each read off the modules themselves (a projection applied to the
identity, a norm's gain from its output on scaled basis vectors, the heads sliced as the attention module views
them); every score lies in [0, 1], NaN exactly where the sender is not in an earlier layer; a sender that writes
into a subspace its receiver's values cannot read has V-composition 0 into the receivers of that kv head only.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tiny_models import CONFIGS, tiny_model

ARCHS = sorted(CONFIGS)


def _gains_far_from_one(model: torch.nn.Module, seed: int = 1) -> torch.nn.Module:
    """Every norm's weight (input, post-attention, query / key norms, final) random, so folding them has teeth."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, mod in model.named_modules():
            w = getattr(mod, "weight", None)
            if "norm" in type(mod).__name__.lower() and isinstance(w, torch.nn.Parameter) and w.ndim == 1:
                w.copy_(torch.randn(w.shape, generator=g) * 0.5 + 1.0)
    return model


@pytest.fixture(scope="module", params=ARCHS)
def lm(request, gpt2_tokenizer):
    from backend.model.loading import wrap

    return wrap(_gains_far_from_one(tiny_model(request.param)), gpt2_tokenizer, f"tiny-{request.param}")


def _linear(mod: torch.nn.Module, n_in: int) -> torch.Tensor:
    """The linear part of a projection module, (n_in, out) float64: mod(I) - mod(0)."""
    with torch.no_grad():
        eye = torch.eye(n_in)
        return (mod(eye) - mod(torch.zeros(1, n_in))).double()


def _rms_gain(norm: torch.nn.Module, dim: int) -> torch.Tensor:
    """An RMSNorm's elementwise gain from its output: on sqrt(dim) e_i (rms 1) it gives g_i sqrt(dim) / sqrt(1 +
    eps) e_i."""
    eps = float(getattr(norm, "eps", None) or getattr(norm, "variance_epsilon", None) or 1e-6)
    with torch.no_grad():
        out = norm(torch.eye(dim) * math.sqrt(dim)).double()
    return out.diagonal() * math.sqrt(1 + eps) / math.sqrt(dim)


def _dense(lm, layer: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per query head, W_OV and W_QK (d, d) float64 with the norms folded in, read off the layer's modules."""
    block, cfg = lm.layers[layer], lm.model.config
    d, H, Hkv, dh = lm.d_model, lm.n_heads, lm.n_kv_heads, lm.head_dim
    mt = cfg.model_type
    if mt == "gpt2":
        m = _linear(block.attn.c_attn, d)
        q, k, v = (m[:, i * H * dh:(i + 1) * H * dh].reshape(d, H, dh) for i in range(3))
    elif mt == "gpt_neox":
        m = _linear(block.attention.query_key_value, d).reshape(d, H, 3 * dh)
        q, k, v = m[..., :dh], m[..., dh:2 * dh], m[..., 2 * dh:]
    else:
        at = block.self_attn
        q = _linear(at.q_proj, d).reshape(d, H, dh)
        k, v = (_linear(mod, d).reshape(d, Hkv, dh) for mod in (at.k_proj, at.v_proj))
    o_mod = block.attn.c_proj if mt == "gpt2" else block.attention.dense if mt == "gpt_neox" else block.self_attn.o_proj
    w_o = _linear(o_mod, H * dh).reshape(H, dh, d)
    if lm.spec.centered:  # LayerNorm: its gain is its weight; P centres what it reads
        g_in = lm.input_norm(layer).weight.double()
        P = torch.eye(d, dtype=torch.float64) - 1.0 / d
    else:
        g_in, P = _rms_gain(lm.input_norm(layer), d), torch.eye(d, dtype=torch.float64)
    read = P @ torch.diag(g_in)
    qn = getattr(getattr(block, "self_attn", None), "q_norm", None)
    gq = _rms_gain(qn, dh) if qn is not None else torch.ones(dh, dtype=torch.float64)
    gk = _rms_gain(block.self_attn.k_norm, dh) if qn is not None else torch.ones(dh, dtype=torch.float64)
    post = getattr(block, "post_attention_layernorm", None) if mt in ("gemma2", "gemma3_text") else None
    write = torch.diag(_rms_gain(post, d)) if post is not None else torch.eye(d, dtype=torch.float64)
    write = write @ P  # LayerNorm families: writes centred, as every reader centres
    ov, qk = [], []
    for h in range(H):
        kv = h // (H // Hkv)
        ov.append(read @ v[:, kv] @ w_o[h] @ write)
        qk.append((read @ q[:, h] @ torch.diag(gq)) @ (read @ k[:, kv] @ torch.diag(gk)).T)
    return ov, qk


def _fro(a: torch.Tensor) -> float:
    return float(torch.linalg.matrix_norm(a))


def test_scores_equal_dense_matrices(lm):
    """Q-, K- and V-composition of every layer-0 head into every layer-1 head: factored == explicit (d, d)."""
    from backend.analysis.general.composition import _layers
    from backend.analysis.primitives import composition as comp

    H = lm.n_heads
    layers = _layers(lm, fold_norms=True)
    receivers = [(l, h) for l in range(lm.n_layers) for h in range(H)]
    got = {m: comp.composition_matrix(layers, receivers, m).double() for m in comp.MODES}
    ov0, _ = _dense(lm, 0)
    ov1, qk1 = _dense(lm, 1)
    for s in range(H):
        for r in range(H):
            want = {"q": _fro(ov0[s] @ qk1[r]) / (_fro(ov0[s]) * _fro(qk1[r])),
                    "k": _fro(ov0[s] @ qk1[r].T) / (_fro(ov0[s]) * _fro(qk1[r])),
                    "v": _fro(ov0[s] @ ov1[r]) / (_fro(ov0[s]) * _fro(ov1[r]))}
            for m in comp.MODES:
                assert float(got[m][s, H + r]) == pytest.approx(want[m], rel=2e-4, abs=1e-6), (m, s, r)
    # the factors' norms are the dense matrices' norms
    x = comp.sender_factors(layers[1])
    for m, dense in (("q", qk1), ("v", ov1)):
        y = comp.receiver_factors(layers[1], m)
        for r in range(H):
            assert _fro(y[r].double()) == pytest.approx(_fro(dense[r]), rel=1e-4)
    for s in range(H):
        assert _fro(x[s].double()) == pytest.approx(_fro(ov1[s]), rel=1e-4)


def test_scores_range_and_order(lm):
    """Every score lies in [0, 1]; it is NaN exactly where the sender's layer is not before the receiver's; Q and K
    composition differ (W_QK is not symmetric), and none is constant."""
    from backend.analysis.general.composition import _layers
    from backend.analysis.primitives import composition as comp

    L, H = lm.n_layers, lm.n_heads
    receivers = [(l, h) for l in range(L) for h in range(H)]
    layers = _layers(lm, fold_norms=True)
    earlier = np.array([[ls < lr for lr, _ in receivers] for ls in range(L) for _ in range(H)])
    got = {m: comp.composition_matrix(layers, receivers, m).numpy() for m in comp.MODES}
    for m, a in got.items():
        assert np.array_equal(~np.isnan(a), earlier), m
        vals = a[earlier]
        assert (vals >= 0).all() and (vals <= 1 + 1e-6).all(), m
        assert vals.std() > 0, m
    assert not np.allclose(got["q"][earlier], got["k"][earlier])


def test_orthogonal_write_and_read_compose_zero(gpt2_tokenizer):
    """GQA: sender (0, 0) writes only into the first half of the residual stream; kv head 0 of layer 1 reads only
    the second half. V-composition is then 0 into the query heads of kv head 0 (0, 1, 2 of 6) and not into those of
    kv head 1; undoing either edit makes it positive again."""
    from backend.analysis.general.composition import _layers
    from backend.analysis.primitives import composition as comp
    from backend.model.loading import wrap

    model = tiny_model("llama")
    lm = wrap(model, gpt2_tokenizer, "tiny-llama-orth")
    d, dh = lm.d_model, lm.head_dim
    with torch.no_grad():
        lm.o_proj(0).weight[d // 2:, :dh] = 0  # head 0 of layer 0 writes dims < d/2 only (weight (d, H dh))
        lm.layers[1].self_attn.v_proj.weight[:dh, :d // 2] = 0  # kv head 0 of layer 1 reads dims >= d/2 only
    receivers = [(1, h) for h in range(lm.n_heads)]
    v = comp.composition_matrix(_layers(lm, True), receivers, "v")[0]
    assert torch.all(v[:3].abs() < 1e-6) and torch.all(v[3:] > 1e-3)
    q = comp.composition_matrix(_layers(lm, True), receivers, "q")[0]
    assert torch.all(q > 1e-3)  # the queries still read every dimension


def test_ov_circuit_equals_module_forward(lm):
    """The OV circuit on a few tokens equals: embed, the input norm, v_proj, only head h's slot into o_proj, the
    post-attention gain (Gemma 2 / 3), dotted with the unembedding rows, biases removed."""
    from backend.analysis.general.composition import ov_circuit

    ids = [11, 257, 1000, 4000]
    layer, h = 1, lm.n_heads - 1
    got = ov_circuit(lm, (layer, h), ids)
    with torch.no_grad():
        e = lm.model.get_input_embeddings()(torch.tensor([ids]))[0]
        x = lm.input_norm(layer)(e).double()
    d, dh = lm.d_model, lm.head_dim
    o_mod = lm.o_proj(layer)
    v_all = lm.values(layer, x.float()).double() - lm.values(layer, torch.zeros(1, d)).double()  # (n, kv, dh)
    z = torch.zeros(len(ids), lm.n_heads * dh)
    z[:, h * dh:(h + 1) * dh] = v_all[:, h // (lm.n_heads // lm.n_kv_heads)].float()
    with torch.no_grad():
        o = (o_mod(z) - o_mod(torch.zeros(1, lm.n_heads * dh))).double()
    if lm.spec.post_attn_norm:
        o = o * _rms_gain(lm.post_attn_norm(layer), d)
    want = o @ lm.unembed.detach()[torch.tensor(ids)].double().T
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
