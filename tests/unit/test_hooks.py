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
    """`inject={l: v}` is at the INPUT of decoder layer l: the same as adding v to layer l - 1's output, and at
    l = n_layers to the final norm's input (the last layer's output); a zero vector changes nothing."""
    from backend.model.interventions import Add, intervene
    from backend.model.loading import wrap
    from tiny_models import tiny_model

    lm = wrap(tiny_model(arch), gpt2_tokenizer, f"tiny-{arch}")
    b, L = _batch(lm), lm.n_layers
    v = torch.randn(lm.d_model)
    with torch.inference_mode():
        with intervene(lm, [Add("layer_out", {0: v}, last=b.last)]):
            out = forward_last_logits(lm, b)
        with hooked(lm, inject={1: v}, last=b.last):
            inp = forward_last_logits(lm, b)
        with intervene(lm, [Add("layer_out", {L - 1: v}, last=b.last)]):
            last_out = forward_last_logits(lm, b)
        with hooked(lm, inject={L: v}, last=b.last):
            final_in = forward_last_logits(lm, b)
        plain = forward_last_logits(lm, b)
        with hooked(lm, inject={1: torch.zeros(lm.d_model)}):
            zero = forward_last_logits(lm, b)
    assert torch.equal(inp, out) and torch.equal(final_in, last_out)
    assert torch.equal(zero, plain)
    assert not torch.allclose(inp, plain) and not torch.allclose(final_in, plain)


def test_positions_and_range(gpt2_tokenizer):
    from backend.model.loading import wrap
    from tiny_models import tiny_model

    lm = wrap(tiny_model("llama"), gpt2_tokenizer, "tiny-llama")
    b = _batch(lm)
    v = torch.randn(lm.d_model)
    with torch.inference_mode():
        with hooked(lm, inject={0: v}, inject_positions=(-1,)):
            one = forward_last_logits(lm, b)
        with hooked(lm, inject={0: v}, inject_positions=(-2, -1)):
            two = forward_last_logits(lm, b)
    assert not torch.allclose(one, two)  # the second-to-last token's change reaches the last through attention
    with pytest.raises(ValueError, match=r"injection at layer 9: a layer's input is 0\.\."):
        with hooked(lm, inject={9: v}):
            pass
    with pytest.raises(ValueError, match="negative offsets"):
        with torch.inference_mode(), hooked(lm, inject={0: v}, inject_positions=(0,)):
            forward_last_logits(lm, b)


def test_prefill_only_leaves_decoding_untouched(gpt2_tokenizer):
    from backend.model.loading import wrap
    from tiny_models import tiny_model

    lm = wrap(tiny_model("llama"), gpt2_tokenizer, "tiny-llama")
    ids = torch.tensor([lm.tokenizer("the cat sat on")["input_ids"]])
    v = torch.randn(lm.d_model) * 5
    with torch.inference_mode():
        with hooked(lm, inject={1: v}, prefill_only=True):
            pre = lm.model(input_ids=ids, use_cache=True)
            nxt = pre.logits[:, -1].argmax(-1, keepdim=True)
            step = lm.model(input_ids=nxt, cache=pre.cache, use_cache=True).logits
        # the same cache, continued with no hooks at all
        pre2 = None
        with hooked(lm, inject={1: v}):
            pre2 = lm.model(input_ids=ids, use_cache=True)
        plain_step = lm.model(input_ids=nxt, cache=pre2.cache, use_cache=True).logits
    assert torch.equal(step, plain_step)
    assert not torch.allclose(pre.logits, lm.model(input_ids=ids).logits)
