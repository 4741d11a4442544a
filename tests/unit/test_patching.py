"""Activation patching (kind `patching`, primitives/patch.py): known answers and the function vector's CIE.

- a prompt set patched with its own activations is unchanged: every head's patched gold logit equals the unpatched
  one, so patching the clean run's own activations recovers exactly 100% of the clean-minus-target gap, and the
  target's own activations 0%;
- mean patching into shuffled-input prompts gives, in p(gold), exactly the function vector's causal indirect effect;
- the kind: shapes, the recovered share against its definition, pairing, and its refusals.
"""
from __future__ import annotations

import numpy as np
import pytest

from backend.analysis.kernel import Context, analyze
from backend.analysis.primitives.batching import encode
from backend.analysis.primitives.capture import capture
from backend.analysis.primitives.patch import patch_heads, recovered_share
from backend.analysis.tsla.task_vectors import TaskVectorsParams, causal_indirect_effects
from backend.model.loading import wrap
from backend.tasks.base import TaskError
from backend.tasks.perturb import get_perturbation
from test_core_invariants import sentiment_task
from tiny_models import tiny_model


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def lm(request, gpt2_tokenizer):
    return wrap(tiny_model(request.param), gpt2_tokenizer, f"tiny-{request.param}")


def _sets(lm, n=6, shots=3):
    task = sentiment_task()
    clean = encode(lm, task.build_prompts(shots, n, seed=0), task.kind)
    zero = encode(lm, task.build_prompts(0, n, seed=0), task.kind)
    return task, clean, zero


def test_patching_a_run_with_its_own_activations_changes_nothing(lm):
    """Known answer: the clean run patched head by head with its own clean z gives the clean gold logit for every
    head (recovered share 100%); the target patched with its own z gives the target's (0%)."""
    task, clean, zero = _sets(lm)
    z_clean = capture(lm, clean, "z", reduce="rows", batch_size=4)  # (prompts, layers, heads, head_dim)
    z_zero = capture(lm, zero, "z", reduce="rows", batch_size=4)
    into_clean = patch_heads(lm, clean, z_clean.to(lm.device), batch_size=8)
    into_zero = patch_heads(lm, zero, z_zero.to(lm.device), batch_size=8)
    g_c, g_t = into_clean.gold_logit[0], into_zero.gold_logit[0]
    assert abs(float(np.mean(g_c - g_t))) > 1e-3  # there is a gap to recover
    L, H = lm.n_layers, lm.n_heads
    assert into_clean.per_head().shape == (L * H, 6)
    np.testing.assert_allclose(into_clean.per_head(), np.broadcast_to(g_c, (L * H, 6)), atol=1e-4, rtol=0)
    np.testing.assert_allclose(into_zero.per_head(), np.broadcast_to(g_t, (L * H, 6)), atol=1e-4, rtol=0)
    full, gap = recovered_share(into_clean.per_head(), g_c, g_t)
    none, _ = recovered_share(into_zero.per_head(), g_c, g_t)
    np.testing.assert_allclose(full, 1.0, atol=1e-4)
    np.testing.assert_allclose(none, 0.0, atol=1e-4)
    assert gap == pytest.approx(float(np.mean(g_c - g_t)))


def test_recovered_share_is_a_ratio_of_means_and_zero_without_a_gap():
    patched = np.array([[2.0, 4.0], [1.0, 1.0]])
    clean, target = np.array([3.0, 5.0]), np.array([1.0, 1.0])
    r, gap = recovered_share(patched, clean, target)
    assert gap == 3.0 and r.tolist() == pytest.approx([(1 + 3) / 2 / 3, 0.0])
    r0, gap0 = recovered_share(patched, target, target)
    assert gap0 == 0.0 and r0.tolist() == [0.0, 0.0]


def test_paired_patching_differs_per_prompt_and_equals_a_single_prompt_run(lm):
    """Paired fills run prompt by prompt: prompt i patched with clean prompt i's z, the same as a sweep of that
    prompt alone with that fill."""
    task, clean, zero = _sets(lm, n=4)
    z = capture(lm, clean, "z", reduce="rows", batch_size=4).to(lm.device)
    both = patch_heads(lm, zero, z, batch_size=8)
    one = encode(lm, [zero.prompts[2]], task.kind)
    alone = patch_heads(lm, one, z[2:3], batch_size=8)
    np.testing.assert_allclose(both.gold_logit[:, 2], alone.gold_logit[:, 0], atol=1e-5)
    mean = patch_heads(lm, zero, z.mean(0), batch_size=8)
    assert not np.allclose(both.gold_logit[1:], mean.gold_logit[1:], atol=1e-4)  # the fill is per prompt
    with pytest.raises(ValueError, match="paired fill of shape"):
        patch_heads(lm, zero, z[:2], batch_size=8)


def test_mean_patching_into_shuffled_inputs_is_the_function_vectors_cie(lm):
    """The sixth map's quantity: mean clean z patched into shuffled-input prompts, the gain in p(gold), equals
    what the function vector ranks its heads by (vectors.causal_indirect_effects) on the same prompts."""
    task = sentiment_task()
    p = TaskVectorsParams(shots=3, prompts=5, seed=0, batch_size=4)
    clean = encode(lm, task.build_prompts(3, 5, 0, queries="pool"), task.kind)
    z_mean = capture(lm, clean, "z", batch_size=4)
    cie = causal_indirect_effects(Context(lm, task), p, clean, z_mean, lambda f, m="": None)
    corrupt = encode(lm, task.build_prompts(3, 5, 0, perturb=get_perturbation("shuffled_inputs"), queries="pool"),
                     task.kind)
    got = patch_heads(lm, corrupt, z_mean, batch_size=8)
    gain = (got.gold_prob[1:] - got.gold_prob[0][None]).mean(1).reshape(lm.n_layers, lm.n_heads)
    np.testing.assert_allclose(gain, cie, atol=1e-6)


@pytest.fixture(scope="module")
def gpt2(gpt2_tokenizer):
    return wrap(tiny_model("gpt2"), gpt2_tokenizer, "tiny-gpt2")


def test_the_patching_kind(gpt2):
    lm, task = gpt2, sentiment_task()
    r = analyze("patching", lm, task, {"shots": 3, "prompts": 6, "seed": 0, "target": "zero_shot"}, cache=False)
    L, H = lm.n_layers, lm.n_heads
    assert r.recovered.shape == r.logit_gain.shape == r.prob_gain.shape == (L, H)
    assert r.prompts == 6 and r.shots == 3 and r.target == "zero_shot" and r.patch == "paired"
    assert r.gap == pytest.approx(r.clean_logit - r.target_logit)
    np.testing.assert_allclose(r.recovered * r.gap, r.logit_gain, atol=1e-9)  # the definition
    assert np.isfinite(r.recovered).all() and len(r.top) == r.top_k == 4
    assert r.top[0] == tuple(np.unravel_index(np.argmax(r.recovered), (L, H)))
    assert set(r.overlap) == {"tr", "tl"} and 0 <= r.overlap["tr"].jaccard <= 1
    assert r.clean.n == r.target_metrics.n == 6
    m = analyze("patching", lm, task, {"shots": 3, "prompts": 6, "seed": 0, "target": "shuffled_inputs",
                                       "patch": "mean"}, cache=False)
    assert m.patch == "mean" and not np.allclose(m.recovered, r.recovered)


def test_patching_refuses_what_cannot_pair(gpt2):
    lm, task = gpt2, sentiment_task()
    with pytest.raises(TaskError, match="needs demonstrations to perturb"):
        analyze("patching", lm, task, {"shots": 0, "prompts": 4, "target": "random_labels"}, cache=False)
    from backend.tasks.registry import load_task

    with pytest.raises(TaskError, match="builds its own prompts"):
        analyze("patching", lm, load_task("syn-rmap-sentiment"), {"shots": 2, "prompts": 4}, cache=False)
