"""The precision a user picks at load (`float32`, the default, or `bfloat16`): the weights' dtype, the model's
identity (its fingerprint, and so every cache key) apart per precision, the unembedding's contiguous input, a
bf16 head map close to float32's, and a clear error for anything else."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import backend
from backend.analysis.kernel import ModelRef, cache_key
from backend.analysis.kinds import get_kind
from backend.model.loading import ContiguousLinear, ModelLoadError, fingerprint, load_model, precision_dtype, wrap
from backend.tasks.registry import load_task
from tiny_models import tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def folder(tmp_path_factory, gpt2_tokenizer):
    """A tiny random Llama saved as a local model folder, float32."""
    path = tmp_path_factory.mktemp("tiny-llama")
    tiny_model("llama").save_pretrained(path)
    gpt2_tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def both(folder):
    return {p: load_model(str(folder), device="cpu", precision=p) for p in ("float32", "bfloat16")}


def test_bfloat16_load_gives_bfloat16_weights(both):
    for prec, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        lm = both[prec]
        assert {p.dtype for p in lm.model.parameters()} == {dtype}
        assert lm.precision == prec and lm.info()["dtype"] == prec


def test_float32_fingerprint_is_unchanged_and_bfloat16_is_apart(folder, both):
    """float32's identity is what it was before precisions existed (cached results stay found); bf16's differs."""
    plain = load_model(str(folder), device="cpu")
    assert plain.fingerprint == both["float32"].fingerprint
    assert both["bfloat16"].fingerprint != both["float32"].fingerprint
    model = both["float32"].model
    assert fingerprint(model, plain.name, folder) == plain.fingerprint


def test_cache_keys_differ_between_precisions(both):
    kind, task = get_kind("head_maps"), load_task("syn-sentiment")
    p = kind.params.model_validate({"shots": 2, "prompts": 4})
    keys = {prec: cache_key(kind, ModelRef(lm.name, lm.fingerprint), task, p) for prec, lm in both.items()}
    assert keys["float32"] != keys["bfloat16"]


def test_in_memory_models_are_apart_by_dtype(gpt2_tokenizer):
    f = wrap(tiny_model("llama"), gpt2_tokenizer, "t")
    b = wrap(tiny_model("llama").to(torch.bfloat16), gpt2_tokenizer, "t")
    assert f.fingerprint != b.fingerprint


def test_bad_precision_is_a_clear_error(folder):
    with pytest.raises(ModelLoadError, match="precision must be one of float32, bfloat16, float32-onednn, not 'fp8'"):
        load_model(str(folder), device="cpu", precision="fp8")
    with pytest.raises(ModelLoadError, match="disagree"):
        load_model(str(folder), device="cpu", precision="bfloat16", dtype="fp32")
    with pytest.raises(ModelLoadError, match="for the CPU"):
        load_model(str(folder), device="meta", precision="float32-onednn")
    with pytest.raises(ValueError, match="float32, bfloat16"):
        precision_dtype("half")


def test_unembedding_reads_a_contiguous_input_outside_float32(both):
    """bf16's output embedding is a ContiguousLinear (same numbers as nn.Linear on a strided last-position view);
    float32's is left a plain nn.Linear (bit-identical results)."""
    assert type(both["float32"].model.get_output_embeddings()) is nn.Linear
    head = both["bfloat16"].model.get_output_embeddings()
    assert isinstance(head, ContiguousLinear)
    h = torch.randn(3, 5, head.in_features, dtype=torch.bfloat16)[:, -1:, :]  # strided, as logits_to_keep=1 gives
    assert not h.is_contiguous()
    assert torch.equal(head(h), nn.functional.linear(h.contiguous(), head.weight, head.bias))


def test_bfloat16_head_maps_agree_with_float32(both):
    """On the tiny Llama (syn-sentiment, 2 shots, 8 prompts, seed 0) each bf16 map lies within 2% (TR) and 5% (TL)
    of float32's largest |value| (measured: 0.12% and 0.88%), and the top-3 TR heads are the same."""
    task = load_task("syn-sentiment")
    r = {prec: backend.head_maps(lm, task, shots=2, prompts=8, seed=0, cache=False) for prec, lm in both.items()}
    for m, tol in (("tr", 0.02), ("tl", 0.05)):
        f, b = np.asarray(getattr(r["float32"], m)), np.asarray(getattr(r["bfloat16"], m))
        assert np.abs(f).max() > 0
        assert np.abs(f - b).max() <= tol * np.abs(f).max(), m
        assert not np.array_equal(f, b)  # bf16 did run: the numbers moved
    top = {prec: set(np.argsort(-np.asarray(x.tr), axis=None)[:3].tolist()) for prec, x in r.items()}
    assert top["float32"] == top["bfloat16"]


def test_float32_onednn_is_float32_close_and_cached_apart(folder, both):
    """float32 with the decoder's Linears through oneDNN: float32 weights, logits within 1e-4 and the same argmax,
    TR / TL within 1e-5 of the map's scale, its own fingerprint (other last bits); W_O still reads as float32."""
    from backend.analysis.primitives.batching import forward_last_logits, make_batch
    from backend.model.loading import OneDnnLinear

    lm, ref = load_model(str(folder), device="cpu", precision="float32-onednn"), both["float32"]
    assert lm.precision == "float32-onednn" and lm.dtype == torch.float32
    assert isinstance(lm.o_proj(0), OneDnnLinear) and torch.equal(lm.w_o(0), ref.w_o(0))
    assert lm.fingerprint not in (ref.fingerprint, both["bfloat16"].fingerprint)
    ids = [lm.tokenizer.encode(t) for t in ("the cat sat on the", "one two three four five six", "a b")]
    with torch.inference_mode():
        a, b = (forward_last_logits(m, make_batch(m, ids, [0, 1, 2])) for m in (ref, lm))
    assert (a - b).abs().max() <= 1e-4 and torch.equal(a.argmax(-1), b.argmax(-1))
    task = load_task("syn-sentiment")
    r = [backend.head_maps(m, task, shots=2, prompts=8, seed=0, cache=False) for m in (ref, lm)]
    for m in ("tr", "tl"):
        f, g = np.asarray(getattr(r[0], m)), np.asarray(getattr(r[1], m))
        assert np.abs(f - g).max() <= 1e-5 * np.abs(f).max(), m
