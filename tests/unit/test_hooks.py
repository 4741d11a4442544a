"""Injection at a layer's input, at several positions, and prefill-only interventions."""
from __future__ import annotations

import pytest
import torch

from backend.analysis.primitives.batching import forward_last_logits, make_batch
from backend.model.hooks import hooked


def _batch(lm, texts=("the cat sat on the mat", "a dog")):
    ids = [lm.tokenizer(t)["input_ids"] for t in texts]
    return make_batch(lm, ids, list(range(len(ids))))


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_input_of_layer_equals_output_of_previous(arch, gpt2_tokenizer):
    from backend.model.loading import wrap
    from tiny_models import tiny_model

    lm = wrap(tiny_model(arch), gpt2_tokenizer, f"tiny-{arch}")
    b = _batch(lm)
    v = torch.randn(lm.d_model)
    with torch.inference_mode():
        with hooked(lm, inject={0: v}):
            out = forward_last_logits(lm, b)
        with hooked(lm, inject_input={1: v}):
            inp = forward_last_logits(lm, b)
        plain = forward_last_logits(lm, b)
        with hooked(lm, inject_input={1: torch.zeros(lm.d_model)}):
            zero = forward_last_logits(lm, b)
    torch.testing.assert_close(inp, out, rtol=1e-5, atol=1e-5)
    assert torch.equal(zero, plain)
    assert not torch.allclose(inp, plain)


def test_positions_and_range(gpt2_tokenizer):
    from backend.model.loading import wrap
    from tiny_models import tiny_model

    lm = wrap(tiny_model("llama"), gpt2_tokenizer, "tiny-llama")
    b = _batch(lm)
    v = torch.randn(lm.d_model)
    with torch.inference_mode():
        with hooked(lm, inject_input={0: v}, inject_positions=(-1,)):
            one = forward_last_logits(lm, b)
        with hooked(lm, inject_input={0: v}, inject_positions=(-2, -1)):
            two = forward_last_logits(lm, b)
    assert not torch.allclose(one, two)  # the second-to-last token's change reaches the last through attention
    with pytest.raises(ValueError, match="out of range"):
        with hooked(lm, inject_input={9: v}):
            pass
    with pytest.raises(ValueError, match="negative offsets"):
        with torch.inference_mode(), hooked(lm, inject_input={0: v}, inject_positions=(0,)):
            forward_last_logits(lm, b)


def test_prefill_only_leaves_decoding_untouched(gpt2_tokenizer):
    from backend.model.loading import wrap
    from tiny_models import tiny_model

    lm = wrap(tiny_model("llama"), gpt2_tokenizer, "tiny-llama")
    ids = torch.tensor([lm.tokenizer("the cat sat on")["input_ids"]])
    v = torch.randn(lm.d_model) * 5
    with torch.inference_mode():
        with hooked(lm, inject_input={1: v}, prefill_only=True):
            pre = lm.model(input_ids=ids, use_cache=True)
            nxt = pre.logits[:, -1].argmax(-1, keepdim=True)
            step = lm.model(input_ids=nxt, cache=pre.cache, use_cache=True).logits
        # the same cache, continued with no hooks at all
        pre2 = None
        with hooked(lm, inject_input={1: v}):
            pre2 = lm.model(input_ids=ids, use_cache=True)
        plain_step = lm.model(input_ids=nxt, cache=pre2.cache, use_cache=True).logits
    assert torch.equal(step, plain_step)
    assert not torch.allclose(pre.logits, lm.model(input_ids=ids).logits)
