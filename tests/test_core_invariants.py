"""Invariants that hold for every architecture in the adapter table."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from backend.analysis.primitives.batching import encode, forward_last_logits, make_batch
from backend.analysis.tsla.head_maps import head_maps
from backend.hooks import hooked
from backend.tasks.base import Task

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


def test_head_writes_plus_bias_equal_output_projection(tiny_lm):
    """sum_h z_h @ W_O[h] + b == o_proj(z) at the last token, for every layer."""
    enc = encoded(tiny_lm)
    batch = make_batch(tiny_lm, enc.ids, list(range(len(enc.ids))))
    outs = {}
    handles = [tiny_lm.o_proj(l).register_forward_hook(
        lambda m, a, o, l=l: outs.__setitem__(l, o[:, -1].detach().clone())) for l in range(tiny_lm.n_layers)]
    try:
        with torch.inference_mode(), hooked(tiny_lm, capture_z=True) as tr:
            forward_last_logits(tiny_lm, batch)
    finally:
        for h in handles:
            h.remove()
    z = tr.z(tiny_lm.n_heads)
    assert z.shape == (len(enc.ids), tiny_lm.n_layers, tiny_lm.n_heads, tiny_lm.head_dim)
    for layer in range(tiny_lm.n_layers):
        o = torch.einsum("bhk,hkd->bhd", z[:, layer], tiny_lm.w_o(layer))
        total = o.sum(1)
        bias = tiny_lm.o_bias(layer)
        if bias is not None:
            total = total + bias
        torch.testing.assert_close(total, outs[layer].float(), rtol=1e-5, atol=1e-5)


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
    alone = head_maps(tiny_lm, enc, batch_size=1, padding=padding)
    together = head_maps(tiny_lm, enc, batch_size=6, padding=padding)
    for name in ("tr", "tl", "dla_tr", "dla_tl"):
        a, b = getattr(alone, name), getattr(together, name)
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6, err_msg=f"{name} ({padding} padding)")
    assert alone.metrics() == together.metrics()


def test_left_and_right_padding_agree(tiny_lm):
    enc = encoded(tiny_lm, n=6)
    left = head_maps(tiny_lm, enc, batch_size=6, padding="left")
    right = head_maps(tiny_lm, enc, batch_size=6, padding="right")
    np.testing.assert_allclose(left.tr, right.tr, rtol=1e-4, atol=1e-6)


def test_bf16_scores_track_fp32(gpt2_tokenizer):
    """bf16 weights run through the same path and land near the fp32 numbers."""
    from backend.models import wrap
    from tiny_models import tiny_model

    lm32 = wrap(tiny_model("llama"), gpt2_tokenizer, "tiny-llama")
    lm16 = wrap(tiny_model("llama").to(torch.bfloat16), gpt2_tokenizer, "tiny-llama-bf16")
    enc = encoded(lm32, n=4)
    a = head_maps(lm32, enc, batch_size=4).tr
    b = head_maps(lm16, enc, batch_size=4).tr
    assert np.isfinite(b).all()
    np.testing.assert_allclose(a, b, rtol=0.1, atol=1e-3)
