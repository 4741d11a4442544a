"""Invariants that hold for every architecture in the adapter table."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from backend.analysis.primitives.batching import encode, forward_last_logits, make_batch
from backend.analysis.primitives.tsla import head_writes
from backend.analysis.tsla.scoring_pass import score_heads
from backend.model.hooks import hooked
from backend.tasks.base import Task
from tiny_models import POST_NORM_TYPES

WORDS = "the film was a joy to watch and the plot kept me guessing until the very end of it".split()


def sentiment_task() -> Task:
    ex = []
    for i in range(40):
        n = 3 + (i * 7) % 11  # inputs of varied lengths, so batches really pad
        ex.append((" ".join(WORDS[(i + j) % len(WORDS)] for j in range(n)), "positive" if i % 2 else "negative"))
    return Task("toy-sentiment", "classification", ex, labels=("positive", "negative"))


def encoded(lm, n=6, shots=2):
    task = sentiment_task()
    return encode(lm, task.build_prompts(shots, n, seed=0), task.kind)


def _last_outputs(lm, module_of, batch):
    """Each layer's `module_of(layer)` output at the last token, and the hooked trace (z captured)."""
    outs = {}
    handles = [module_of(l).register_forward_hook(
        lambda m, a, o, l=l: outs.__setitem__(l, o[:, -1].detach().clone())) for l in range(lm.n_layers)]
    try:
        with torch.inference_mode(), hooked(lm, capture_z=True) as tr:
            forward_last_logits(lm, batch)
    finally:
        for h in handles:
            h.remove()
    return outs, tr


def test_head_writes_plus_bias_equal_output_projection(tiny_lm):
    """sum_h z_h @ W_O[h] + b == o_proj(z) at the last token, for every layer."""
    enc = encoded(tiny_lm)
    batch = make_batch(tiny_lm, enc.ids, list(range(len(enc.ids))))
    outs, tr = _last_outputs(tiny_lm, tiny_lm.o_proj, batch)
    z = tr.z(tiny_lm.n_heads)
    assert z.shape == (len(enc.ids), tiny_lm.n_layers, tiny_lm.n_heads, tiny_lm.head_dim)
    for layer in range(tiny_lm.n_layers):
        o = torch.einsum("bhk,hkd->bhd", z[:, layer], tiny_lm.w_o(layer))
        total = o.sum(1)
        bias = tiny_lm.o_bias(layer)
        if bias is not None:
            total = total + bias
        torch.testing.assert_close(total, outs[layer].float(), rtol=1e-5, atol=1e-5)


def test_head_writes_sum_to_what_the_attention_block_adds(tiny_lm):
    """sum_h write_h (+ the bias's share) == what attention adds to the residual stream at the last token: o_proj's
    output, or, where a post-attention norm follows (Gemma 2 / 3), that norm's output, whose gains are not 1 here."""
    lm = tiny_lm
    enc = encoded(lm)
    batch = make_batch(lm, enc.ids, list(range(len(enc.ids))))
    post = lm.spec.post_attn_norm is not None
    assert post == (lm.model.config.model_type in POST_NORM_TYPES)
    outs, tr = _last_outputs(lm, lm.post_attn_norm if post else lm.o_proj, batch)
    z = tr.z(lm.n_heads).float()
    for layer in range(lm.n_layers):
        scale = tr.write_scale[layer]
        assert (scale is not None) == post
        if post:
            assert (lm.post_attn_gain(layer) - 1).abs().max() > 0.5  # the norm really rescales
        writes = head_writes(z[:, layer], lm.w_o(layer), scale)
        total = writes.sum(1)
        bias = lm.o_bias(layer)
        if bias is not None:
            total = total + bias.float() * (scale if post else 1)
        torch.testing.assert_close(total, outs[layer].float(), rtol=1e-5, atol=1e-5)


def residual_level_tsla(lm, enc) -> tuple[np.ndarray, np.ndarray]:
    """TR and TL maps computed apart from the scoring code: each head's share of what the attention block adds to
    the residual stream, w_h = o_h * (delta / y) with o_h = o_proj(z with every other head zeroed) - b, y = o_proj(z)
    and delta the post-attention norm's output (what is added), elementwise; then TR = ||P w_h|| with P the float64
    projector onto the label rows (numpy pinv), TL = w_h . (u_gold - mean of the other rows) / TR."""
    L, H, dh = lm.n_layers, lm.n_heads, lm.head_dim
    tr_sum, tl_sum = np.zeros((L, H)), np.zeros((L, H))
    u_all = lm.unembed.detach().double().numpy()
    for i, ids in enumerate(enc.ids):
        batch = make_batch(lm, enc.ids, [i])
        added, trace = _last_outputs(lm, lm.post_attn_norm, batch)
        z = trace.z(H)[0]  # (layers, heads, head_dim)
        u = u_all[enc.label_ids[i]]
        proj = u.T @ np.linalg.pinv(u @ u.T) @ u
        gold = enc.gold[i]
        diff = u[gold] - np.delete(u, gold, 0).mean(0)
        for layer in range(L):
            o_proj = lm.o_proj(layer)
            with torch.inference_mode():
                y = o_proj(z[layer].reshape(1, H * dh))[0].double()
                bias = o_proj.bias.double() if o_proj.bias is not None else 0
                ratio = (added[layer][0].double() / y).numpy()
                for h in range(H):
                    only = torch.zeros(H, dh)
                    only[h] = z[layer, h]
                    w = (o_proj(only.reshape(1, H * dh))[0].double() - bias).numpy() * ratio
                    tr = np.linalg.norm(proj @ w)
                    tr_sum[layer, h] += tr
                    tl_sum[layer, h] += (w @ diff) / tr
    return tr_sum / len(enc.ids), tl_sum / len(enc.ids)


@pytest.mark.parametrize("arch", POST_NORM_TYPES)
def test_post_norm_tr_tl_match_a_residual_level_computation(arch, gpt2_tokenizer):
    """On Gemma 2 and 3 (post-attention gains not 1), the scored TR / TL maps equal the residual-level ones within
    1e-3 (relative); the writes taken at o_proj, before the norm, would not."""
    from backend.model.loading import wrap
    from tiny_models import tiny_model

    lm = wrap(tiny_model(arch), gpt2_tokenizer, f"tiny-{arch}")
    enc = encoded(lm, n=4)
    maps = score_heads(lm, enc, batch_size=4)
    tr, tl = residual_level_tsla(lm, enc)
    np.testing.assert_allclose(maps.tr, tr, rtol=1e-3, atol=1e-6)
    np.testing.assert_allclose(maps.tl, tl, rtol=1e-3, atol=1e-5)
    pre_norm = pre_norm_maps(lm, enc)
    assert not np.allclose(pre_norm, tr, rtol=0.1)


def pre_norm_maps(lm, enc) -> np.ndarray:
    """TR from writes taken at o_proj (the old, pre-norm site): the control that the test above can fail."""
    from backend.analysis.primitives.tsla import label_space, tsla

    out = np.zeros((lm.n_layers, lm.n_heads))
    batch = make_batch(lm, enc.ids, list(range(len(enc.ids))))
    with torch.inference_mode(), hooked(lm, capture_z=True, last=batch.last) as tr:
        forward_last_logits(lm, batch)
    ls = label_space(lm.unembed, enc.label_ids, enc.gold)
    z = tr.z(lm.n_heads).float()
    for layer in range(lm.n_layers):
        out[layer] = tsla(head_writes(z[:, layer], lm.w_o(layer)), ls).tr.mean(0).numpy()
    return out


def test_hooked_forward_without_intervention_is_exact(tiny_lm):
    """Capturing everything, an all-ones head mask and a zero injection leave logits bit-identical."""
    enc = encoded(tiny_lm)
    batch = make_batch(tiny_lm, enc.ids, list(range(len(enc.ids))))
    L, H, d = tiny_lm.n_layers, tiny_lm.n_heads, tiny_lm.d_model
    with torch.inference_mode():
        plain = forward_last_logits(tiny_lm, batch)
        with hooked(tiny_lm, capture_z=True, capture_resid_final=True, capture_hidden=True,
                    head_mask=torch.ones(len(enc.ids), L, H), inject={L // 2: torch.zeros(d)}):
            hooked_logits = forward_last_logits(tiny_lm, batch)
    assert torch.equal(plain, hooked_logits)


@pytest.mark.parametrize("padding", ["left", "right"])
def test_prompt_scores_the_same_alone_and_in_a_padded_batch(tiny_lm, padding):
    enc = encoded(tiny_lm, n=6)
    lengths = {len(x) for x in enc.ids}
    assert len(lengths) > 1, "the batch must really pad"
    alone = score_heads(tiny_lm, enc, batch_size=1, padding=padding)
    together = score_heads(tiny_lm, enc, batch_size=6, padding=padding)
    for name in ("tr", "tl", "dla_tr", "dla_tl"):
        a, b = getattr(alone, name), getattr(together, name)
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6, err_msg=f"{name} ({padding} padding)")
    assert alone.metrics() == together.metrics()


def test_left_and_right_padding_agree(tiny_lm):
    enc = encoded(tiny_lm, n=6)
    left = score_heads(tiny_lm, enc, batch_size=6, padding="left")
    right = score_heads(tiny_lm, enc, batch_size=6, padding="right")
    np.testing.assert_allclose(left.tr, right.tr, rtol=1e-4, atol=1e-6)


def test_bf16_scores_track_fp32(gpt2_tokenizer):
    """bf16 weights run through the same path and land near the fp32 numbers."""
    from backend.model.loading import wrap
    from tiny_models import tiny_model

    lm32 = wrap(tiny_model("llama"), gpt2_tokenizer, "tiny-llama")
    lm16 = wrap(tiny_model("llama").to(torch.bfloat16), gpt2_tokenizer, "tiny-llama-bf16")
    enc = encoded(lm32, n=4)
    a = score_heads(lm32, enc, batch_size=4).tr
    b = score_heads(lm16, enc, batch_size=4).tr
    assert np.isfinite(b).all()
    np.testing.assert_allclose(a, b, rtol=0.1, atol=1e-3)
