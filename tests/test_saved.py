"""Saved trained tensors: round trip, and refusal for another model, d_model or kind."""
from __future__ import annotations

import pytest
import torch

from backend.analysis.primitives.saved import SavedTensorError, load_tensors, save_tensors
from backend.models import wrap
from tiny_models import tiny_model


def test_round_trip_and_refusals(gpt2_tokenizer, tmp_path):
    a = wrap(tiny_model("llama"), gpt2_tokenizer, "tiny-llama")
    b = wrap(tiny_model("llama", seed=1), gpt2_tokenizer, "tiny-llama-2")
    theta = torch.randn(3, a.d_model)
    path = save_tensors(tmp_path / "v.safetensors", {"theta": theta}, a, "ltv", task_hash="abc", task_name="t",
                        recipe={"layers": [1], "lr": 5e-3})
    got, meta = load_tensors(path, a, "ltv")
    assert torch.equal(got["theta"], theta) and meta["recipe"] == {"layers": [1], "lr": 5e-3}
    assert meta["task_hash"] == "abc" and meta["fingerprint"] == a.fingerprint
    with pytest.raises(SavedTensorError, match="another model"):
        load_tensors(path, b, "ltv")
    with pytest.raises(SavedTensorError, match="not a site"):
        load_tensors(path, a, "site")
    g = wrap(tiny_model("gpt2"), gpt2_tokenizer, "tiny-gpt2")
    g.d_model = a.d_model + 1  # another width
    with pytest.raises(SavedTensorError, match="d_model"):
        load_tensors(path, g, "ltv")
    (tmp_path / "junk.safetensors").write_bytes(b"not a file")
    with pytest.raises(SavedTensorError, match="not a readable safetensors file"):
        load_tensors(tmp_path / "junk.safetensors", a, "ltv")
