"""A model that does not fit this machine's memory is refused at admission, from its config.json alone, with a
sentence naming the memory it needs and what it would take; the parameter count behind it equals the modules'."""
from __future__ import annotations

import json

import pytest
import transformers as T
from starlette.testclient import TestClient

from backend.service.memory_fit import BYTES, memory_problem, needed_bytes, parameter_count
from tiny_models import CONFIGS, tiny_model

LLAMA_8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
            "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
            "vocab_size": 128256, "max_position_embeddings": 131072, "tie_word_embeddings": False,
            "rms_norm_eps": 1e-5}


@pytest.mark.parametrize("arch", sorted(CONFIGS))
def test_the_count_from_the_config_equals_the_modules_matrices(arch):
    """Every matrix of the model (embeddings, projections, MLP, an untied unembedding), GQA included; vectors (norms,
    biases) are left out by design."""
    model = tiny_model(arch)
    matrices = sum(p.numel() for p in model.parameters() if p.dim() >= 2)
    assert parameter_count(model.config.to_dict()) == matrices


def test_llama_8b_is_8_03_billion_and_its_memory_by_precision():
    n = parameter_count(LLAMA_8B)
    assert n + 32 * 2 * 4096 + 4096 == 8_030_261_248  # Llama-3.1-8B's published count, with its 65 norms' gains
    assert needed_bytes(n, "float32") == int(n * 4 * 1.25 + (512 << 20))
    assert needed_bytes(n, "bfloat16") * 2 - needed_bytes(n, "float32") == 512 << 20
    assert BYTES == {"float32": 4, "float32-onednn": 4, "bfloat16": 2, "float16": 2}


def test_a_config_without_sizes_is_not_judged():
    assert parameter_count({"model_type": "llama"}) is None
    assert memory_problem("x", None) is None and memory_problem("x", {"model_type": "llama"}) is None


def test_an_8b_shape_is_refused_at_admission_before_anything_loads(tmp_path, monkeypatch):
    """Issue 35: the sentence names the memory it needs and what it would take; nothing is loaded (the folder holds
    no weights at all: a load would fail otherwise), and a model that fits passes the same check."""
    folder = tmp_path / "llama-8b-shape"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA_8B))
    monkeypatch.setenv("HEADLENS_MEMORY_BYTES", str(16e9))
    from backend.service.app import create_app

    with TestClient(create_app()) as c:
        r = c.post("/jobs", json={"kind": "head_maps", "model": str(folder), "task": "antonym"})
        assert r.status_code == 507, r.text
        msg = r.json()["detail"]
        assert "needs about 40.7 GB of memory in float32 (8.03B parameters x 4 bytes" in msg
        assert "only 16.0 GB of this machine's memory (HEADLENS_MEMORY_BYTES) is free" in msg
        assert 'device_map="auto"' in msg and "a GPU with at least 40.7 GB" in msg
        assert "bfloat16" not in msg  # 20.6 GB in bfloat16 does not fit 16 GB either: not offered
        assert "Nothing was loaded." in msg
        est = c.post("/jobs/estimate", json={"kind": "head_maps", "model": str(folder), "task": "antonym"})
        assert est.status_code == 507 and est.json()["detail"] == msg  # the estimate refuses it the same way
        r = c.post("/jobs", json={"kind": "head_maps", "model": str(folder), "task": "antonym",
                                  "precision": "bfloat16"})
        assert r.status_code == 507 and "needs about 20.6 GB of memory in bfloat16 (8.03B parameters x 2 bytes" \
            in r.json()["detail"]  # the precision asked for is the one checked
    monkeypatch.setenv("HEADLENS_MEMORY_BYTES", str(24e9))
    msg = memory_problem("m", LLAMA_8B)
    assert msg is not None and "bfloat16 (precision=bfloat16: about 20.6 GB)" in msg
    monkeypatch.setenv("HEADLENS_MEMORY_BYTES", str(64e9))
    assert memory_problem("m", LLAMA_8B) is None


def test_the_embedded_model_passes_on_this_machine():
    from backend.service.model_pool import ModelPool

    ModelPool().require_loadable(ModelPool().check("default"))  # no error: a few MB
