"""One convention for a vector "at layer l": added at the INPUT of decoder layer l (layer 0: the embeddings).

The residual stream captured at each layer's input equals Hugging Face's hidden_states[l]; the engine path (layer
l - 1's output) equals the hooks' input injection at every layer, 0 included; and the vanilla task vector at layer
l gives the same numbers in `steer`, `ltv` and SITE's baseline. Tiny random-weight models; seconds each.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from backend.analysis.kernel import analyze
from backend.analysis.kinds import get_kind
from backend.analysis.primitives.batching import encode, make_batch
from backend.analysis.primitives.capture import capture
from backend.analysis.primitives.inject import Injection, evaluate_injections
from backend.analysis.primitives.layer_inputs import run_at_inputs
from backend.model.loading import wrap
from backend.tasks.base import Task, Template
from tiny_models import tiny_model

WORDS = ["cat", "dog", "red", "blue", "sun", "moon", "tree", "rock", "fish", "bird", "car", "boat", "king", "queen",
         "hot", "cold", "up", "down", "left", "right", "one", "two", "old", "new"]
_lms: dict = {}




@pytest.fixture
def lm_of(gpt2_tokenizer):
    def get(arch: str):
        if arch not in _lms:
            cfg_model = tiny_model(arch)
            if arch == "llama":  # three layers, so the middle layer is neither the first nor the last
                import transformers as T
                torch.manual_seed(0)
                cfg = T.LlamaConfig(num_attention_heads=6, num_key_value_heads=2, num_hidden_layers=3,
                                    hidden_size=48, intermediate_size=96, vocab_size=50257,
                                    max_position_embeddings=256)
                cfg_model = T.AutoModelForCausalLM.from_config(cfg).eval()
            _lms[arch] = wrap(cfg_model, gpt2_tokenizer, f"tiny-{arch}-layers")
        return _lms[arch]
    return get


def task() -> Task:
    return Task("tiny-yesno", "classification", [(w, "yes" if i % 2 else "no") for i, w in enumerate(WORDS)],
                Template("{input} = {output} ;\n"), labels=("yes", "no"))


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_resid_is_hugging_faces_hidden_states(lm_of, arch):
    """capture(..., "resid") row l is hidden_states[l] at the last token: the embeddings (GPT-2: with the position
    embedding, so not 0 between prompts of different lengths), then each layer's input."""
    lm = lm_of(arch)
    t = task()
    enc = encode(lm, t.build_prompts(2, 5, 0), t.kind)
    got = capture(lm, enc, "resid", reduce="rows", batch_size=2)
    b = make_batch(lm, enc.ids, list(range(5)))
    with torch.inference_mode():
        hs = lm.model(input_ids=b.input_ids, attention_mask=b.attention_mask, position_ids=b.position_ids,
                      output_hidden_states=True).hidden_states
    want = torch.stack([h[:, -1] for h in hs[: lm.n_layers]], 1).float()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_engine_path_equals_input_injection_at_every_layer(lm_of, arch):
    lm = lm_of(arch)
    t = task()
    enc = encode(lm, t.build_prompts(0, 6, 0), t.kind)
    g = torch.Generator().manual_seed(0)
    vs = [torch.randn(lm.d_model, generator=g) * 4 for _ in range(lm.n_layers)]
    configs = [{}] + [{l: vs[l]} for l in range(lm.n_layers)]
    got = run_at_inputs(lm, enc, configs, batch_size=4)
    want = evaluate_injections(lm, enc, [Injection({l: v for l, v in c.items()}) for c in configs], batch_size=4)
    np.testing.assert_allclose(got.gold_prob, want.gold_prob, rtol=1e-4, atol=1e-6)
    assert np.array_equal(got.pred_token, want.pred_token)
    assert not np.allclose(got.gold_prob[1:], got.gold_prob[:1])  # every vector moved something
    zero = run_at_inputs(lm, enc, [{0: torch.zeros(lm.d_model)}], batch_size=4)
    np.testing.assert_array_equal(zero.gold_prob[0], got.gold_prob[0])  # a zero vector at the embeddings: none
    with pytest.raises(ValueError, match="out of range"):
        run_at_inputs(lm, enc, [{lm.n_layers: vs[0]}])


def test_one_vanilla_vector_in_steer_ltv_and_site():
    """The vanilla task vector at the middle layer: the same accuracy in `steer`, in `ltv`'s table and as SITE's
    baseline (same shots, prompts, seed, queries), on the embedded model, where it differs between the middle layer's
    input (0.4) and its output (1.0): the two sites the kinds used before."""
    from backend import load_model, load_task

    lm, t = load_model("default"), load_task("syn-antonym")
    mid = lm.n_layers // 2
    n, shots = 10, 2
    steer = analyze("steer", lm, t, cache=False, vectors=["vanilla"], layer="all", shots=shots, prompts=n)
    v = steer.vectors["vanilla"]
    assert v.accuracy[mid] < v.accuracy[mid + 1]  # the test can tell the two sites apart
    ltv = analyze("ltv", lm, t, cache=False, mechanism=False, shots=shots, prompts=n, epochs=1, train_prompts=4,
                  val_prompts=4)
    site = analyze("site", lm, t, cache=False, m=4, shots=shots, prompts=n, steps=2, val_every=2, val_prompts=3,
                   max_new_tokens=2, compare=["vanilla"], patching=[], budget=[], correlations=[])
    assert steer.layers == list(range(lm.n_layers)) and v.norm[0] == pytest.approx(0.0, abs=1e-4)  # same embedding
    assert ltv.layer == mid and ltv.table["vanilla"].accuracy == v.accuracy[mid]
    assert site.baselines["vanilla"].metrics.accuracy == v.accuracy[mid]
    assert "input of layer" in site.baselines["vanilla"].note


def test_methods_at_a_fixed_layer_and_at_each_vectors_best_layer():
    from backend import load_model, load_task

    lm, t = load_model("default"), load_task("syn-antonym")
    common = dict(shots=2, prompts=10, site_m=4, site_shots=2, site_steps=2)
    fixed = analyze("methods", lm, t, cache=False, **common)
    swept = analyze("methods", lm, t, cache=False, sweep=True, **common)
    steer = analyze("steer", lm, t, cache=False, vectors=["vanilla", "fv", "tr", "tl"], layer="all", shots=2,
                    prompts=10)
    mid = lm.n_layers // 2
    for a, b in zip(fixed.rows, swept.rows):
        assert a.key == b.key and a.accuracy == b.accuracy  # the fixed layer reads the same either way
        if a.family == "extracted":
            acc = steer.vectors[a.key].accuracy
            assert a.layer == mid and a.best_layer is None and a.accuracy == acc[mid]
            assert b.best_accuracy == max(acc) and acc[b.best_layer] == max(acc) and b.best_accuracy >= b.accuracy
    vanilla = next(r for r in swept.rows if r.key == "vanilla")
    assert vanilla.best_layer == mid + 1 and vanilla.best_accuracy == 1.0 > vanilla.accuracy


def test_kinds_whose_site_moved_have_a_new_key():
    assert all(get_kind(k).version >= 1 for k in ("vectors", "steer", "geometry", "site", "methods"))
    assert get_kind("scores").version == 1  # the sequential TR null, not the layers (ltv: 1 for its random sets, 2
    # for its paired tests, 3 for its opt-in linear propagation; not the layers either)
