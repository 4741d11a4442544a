"""Saved trained tensors: the file format's round trip (the same bytes for the same tensors, so the same id), and
refusal for another model, d_model or kind."""
from __future__ import annotations

import pytest
import torch

from backend.analysis.primitives.saved import SavedTensorError, decode, encode, load_tensors, save_tensors
from backend.model.loading import wrap
from backend.store.tensor_store import TensorMissing, TensorSession, TensorStore
from tiny_models import tiny_model


def test_round_trip_and_refusals(gpt2_tokenizer, tmp_path):
    a = wrap(tiny_model("llama"), gpt2_tokenizer, "tiny-llama")
    b = wrap(tiny_model("llama", seed=1), gpt2_tokenizer, "tiny-llama-2")
    store = TensorSession(TensorStore(tmp_path / "tensors"))
    theta = torch.randn(1, a.d_model)
    tid = save_tensors(store, {"theta": theta}, a, "ltv", task_hash="abc", task_name="t",
                       recipe={"layers": [1], "lr": 5e-3})
    assert tid.startswith("ltv-") and len(tid) == 36
    again = save_tensors(store, {"theta": theta.clone()}, a, "ltv", task_hash="abc", task_name="t",
                         recipe={"layers": [1], "lr": 5e-3})
    assert again == tid  # the same bytes: the same id
    got, meta = load_tensors(store, tid, a, "ltv")
    assert torch.equal(got["theta"], theta) and meta["recipe"] == {"layers": [1], "lr": 5e-3}
    assert meta["task_hash"] == "abc" and meta["fingerprint"] == a.fingerprint
    with pytest.raises(SavedTensorError, match="another model") as e:
        load_tensors(store, tid, b, "ltv")
    assert a.fingerprint not in str(e.value) and b.fingerprint not in str(e.value)
    with pytest.raises(SavedTensorError, match="not a site"):
        load_tensors(store, tid, a, "site")
    g = wrap(tiny_model("gpt2"), gpt2_tokenizer, "tiny-gpt2")
    g.d_model = a.d_model + 1  # another width
    with pytest.raises(SavedTensorError, match="d_model"):
        load_tensors(store, tid, g, "ltv")
    with pytest.raises(TensorMissing, match="no tensor"):
        load_tensors(store, "ltv-" + "0" * 32, a, "ltv")


def test_the_format_is_safetensors(tmp_path):
    """What `encode` writes, the safetensors library reads (and the other way round)."""
    from safetensors.torch import load, save

    t = {"theta": torch.randn(2, 5), "alpha": torch.rand(3, 4)}
    data = encode(t, {"format": "x", "kind": "ltv"})
    back = load(data)
    assert all(torch.equal(back[k], t[k]) for k in t)
    got, meta = decode(save(t, metadata={"a": "b"}), "f")
    assert all(torch.equal(got[k], t[k]) for k in t) and meta == {"a": "b"}
