"""The real-model tier: a few checks on SmolLM2-135M (the `smollm2-135m` preset), seconds each, one model load for
the module. Marked `real_model` (`pytest -m "not real_model"` leaves them out) and skipped when the preset is not
pulled (`python -m backend models pull smollm2-135m`; CI pulls it once per run, `.ci/run`).

- the per-head decomposition on real weights: the heads' writes plus the bias equal o_proj's output;
- in-context learning is there: 10-shot accuracy above 0-shot by at least 0.3 on a built-in task;
- one `scores` run gives finite (layers, heads) maps and its accuracies;
- the converted folder gives the logits of transformers' direct GGUF load, within 1e-4.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from backend.weights import presets

PRESET = "smollm2-135m"
pytestmark = [pytest.mark.real_model, pytest.mark.skipif(
    not presets.is_pulled(PRESET), reason=f"{PRESET} is not pulled: {presets.pull_command(PRESET)}")]


@pytest.fixture(scope="module")
def real_lm():
    from backend.model.loading import load_model

    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    return load_model(PRESET, device="cpu")


def test_head_writes_plus_bias_equal_the_output_projection_on_real_weights(real_lm):
    from backend.analysis.primitives.batching import forward_last_logits, make_batch
    from backend.model.hooks import hooked

    lm = real_lm
    assert (lm.n_layers, lm.n_heads, lm.n_kv_heads, lm.head_dim, lm.d_model) == (30, 9, 3, 64, 576)
    texts = ["Q: walk\nA: walked\n\nQ: sing\nA:", "The capital of France is", "Review: a joy to watch.\nSentiment:"]
    ids = [lm.tokenizer(t)["input_ids"] for t in texts]
    batch = make_batch(lm, ids, list(range(len(ids))))  # left-padded: the last position is every prompt's last
    outs = {}
    handles = [lm.o_proj(l).register_forward_hook(
        lambda m, a, o, l=l: outs.__setitem__(l, o[:, -1].detach().clone())) for l in range(lm.n_layers)]
    try:
        with torch.inference_mode(), hooked(lm, capture_z=True) as tr:
            forward_last_logits(lm, batch)
    finally:
        for h in handles:
            h.remove()
    z = tr.z(lm.n_heads)
    for layer in range(lm.n_layers):
        total = torch.einsum("bhk,hkd->bd", z[:, layer].float(), lm.w_o(layer))
        if lm.o_bias(layer) is not None:
            total = total + lm.o_bias(layer)
        torch.testing.assert_close(total, outs[layer].float(), rtol=1e-4, atol=1e-4)


def test_ten_shots_beat_zero_shots_by_at_least_0_3(real_lm):
    from backend.analysis.kernel import analyze
    from backend.tasks.registry import load_task

    r = analyze("icl", real_lm, load_task("present-past"), {"shots": [0, 10], "prompts": 24, "seed": 0}, cache=False)
    zero, ten = r.accuracy
    assert ten - zero >= 0.3, (zero, ten)
    assert r.tr_ratio[0] <= 0.2 and ten >= 0.6


def test_a_scores_run_gives_the_head_maps(real_lm):
    from backend.analysis.kernel import analyze
    from backend.tasks.registry import load_task

    r = analyze("scores", real_lm, load_task("sentiment"), {"shots": 4, "prompts": 8, "seed": 0}, cache=False)
    for grid in (r.tr, r.tl, r.induction):
        assert np.asarray(grid).shape == (30, 9) and np.isfinite(np.asarray(grid, dtype=float)).all()
    assert (np.asarray(r.tr) >= 0).all() and np.asarray(r.tr).max() > 0
    assert len(r.top_tr) >= 4 and all(0 <= l < 30 and 0 <= h < 9 for l, h in r.top_tr)
    assert 0.0 <= r.zero_shot.accuracy <= 1.0 and 0.0 <= r.icl.accuracy <= 1.0


def test_the_converted_folder_gives_the_direct_gguf_logits(real_lm):
    """transformers' own GGUF load (about 15 s: it dequantises the file again) against the converted folder."""
    from transformers import AutoModelForCausalLM, GgufConfig

    gguf = presets.gguf_path(PRESET)
    direct = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32,
                                                  quantization_config=GgufConfig(dequantize=True)).eval()
    ids = real_lm.tokenizer("Q: walk\nA: walked\n\nQ: sing\nA: sang\n\nQ: bring\nA:", return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        want, got = direct(input_ids=ids).logits, real_lm.model(input_ids=ids).logits
    assert (got - want).abs().max().item() <= 1e-4
