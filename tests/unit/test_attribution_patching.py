"""Attribution patching (kind `attribution_patching`, the intervention layer's `Tap`): known answers.

- the Tap leaves the forward pass bit-identical and its gradient is the metric's gradient at z (autograd vs the
  chain rule through the output projection is what the finite difference checks);
- one head patched alone: the first-order AtP estimate equals the finite difference of the metric along the patch,
  (m(z_t + eps (f - z_t)) - m(z_t - eps (f - z_t))) / 2 eps, on every head of tiny models of three families
  (grouped-query Llama, GPT-2's fused layout, Gemma 3's post-attention norm), in float64;
- a run patched with its own activations: AtP is exactly 0 (while its gradient is not);
- the kind: shapes, its mean against its per-prompt values, and the agreement with the exact map of the same params.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from backend.analysis.kernel import analyze
from backend.analysis.primitives.batching import encode, forward_last_logits, make_batch
from backend.analysis.primitives.patch import gold_ids
from backend.analysis.primitives.selection import top_heads
from backend.analysis.tsla.attribution_patching import atp_per_prompt, read_metric, z_and_grad
from backend.model.interventions import HeadMask, Tap, intervene
from backend.model.loading import wrap
from test_core_invariants import sentiment_task
from tiny_models import tiny_model


@pytest.fixture(scope="module", params=["llama", "gpt2", "gemma3_text"])
def lm64(request, gpt2_tokenizer):
    return wrap(tiny_model(request.param).double(), gpt2_tokenizer, f"tiny-{request.param}-f64")


def _sets(lm, n=3, shots=2):
    task = sentiment_task()
    return (encode(lm, task.build_prompts(shots, n, seed=0), task.kind),
            encode(lm, task.build_prompts(0, n, seed=0), task.kind))


def test_a_tap_changes_nothing_and_gives_the_gradient(lm64):
    clean, _ = _sets(lm64)
    batch = make_batch(lm64, clean.ids, list(range(len(clean.ids))))
    with torch.no_grad():
        plain = forward_last_logits(lm64, batch)
    tap = Tap("z", last=batch.last)
    with intervene(lm64, [tap]):
        tapped = forward_last_logits(lm64, batch)
    torch.testing.assert_close(plain, tapped.detach(), rtol=1e-6, atol=1e-9)  # x + 0 (another layout at most)
    tapped[:, 1:50].sum().backward()  # (not token 0: Gemma's pad row, zero in its tied unembedding)
    assert all(tap.delta[l].grad is not None and tap.delta[l].grad.abs().sum() > 0 for l in range(lm64.n_layers))


@pytest.mark.parametrize("metric", ["gold_prob", "gold_logit"])
def test_atp_of_one_head_matches_a_finite_difference(lm64, metric):
    """For each prompt and head alone: d/d eps m(z_t + eps (f - z_t)) at eps = 0 (central difference) equals the
    AtP estimate (f - z_t) . dm/dz."""
    clean, target = _sets(lm64, n=2)
    z_c, _, _ = z_and_grad(lm64, clean, metric, grad=False)
    z_t, g_t, m_t = z_and_grad(lm64, target, metric, grad=True)
    fill = z_c.mean(0)  # mean patching: one fill for every prompt
    atp = atp_per_prompt(fill, z_t, g_t)  # (prompts, L, H)
    L, H = lm64.n_layers, lm64.n_heads
    gold = torch.tensor(gold_ids(target))
    eps = 0.02  # Richardson's extrapolation of central differences at eps and eps / 2: an O(eps^4) error

    def metric_at(batch, i, l, h, e):
        mask = torch.ones(1, L, H, dtype=torch.float64)
        mask[0, l, h] = 0
        f = z_t[i].double() + e * (fill - z_t[i]).double()  # (L, H, dh): only head (l, h) takes it
        with torch.no_grad(), intervene(lm64, [HeadMask(mask, fill=f, at="last")]):
            logits = lm64.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                                position_ids=batch.position_ids).logits[:, -1]  # float64
        return float(read_metric(logits, gold[[i]], metric)[0])

    checked = 0
    for i in range(len(target.ids)):
        batch = make_batch(lm64, target.ids, [i])
        scale = np.abs(atp[i]).max()
        for l in range(L):
            for h in range(H):
                d1, d2 = ((metric_at(batch, i, l, h, e) - metric_at(batch, i, l, h, -e)) / (2 * e)
                          for e in (eps, eps / 2))
                fd = (4 * d2 - d1) / 3
                assert atp[i, l, h] == pytest.approx(fd, rel=1e-4, abs=1e-4 * scale), (i, l, h)
                checked += abs(fd) > 1e-2 * scale
    assert checked >= L * H  # most heads move the metric: the comparison has teeth


def test_atp_of_a_run_patched_with_itself_is_zero(lm64):
    clean, _ = _sets(lm64)
    z_c, _, m_c = z_and_grad(lm64, clean, "gold_prob", grad=False, batch_size=2)
    z_f, g_f, m_f = z_and_grad(lm64, clean, "gold_prob", grad=True, batch_size=2, prefix=False)  # one full pass
    assert torch.equal(z_c, z_f) and np.array_equal(m_c, m_f)
    assert g_f.abs().sum() > 0
    assert np.all(atp_per_prompt(z_c, z_f, g_f) == 0.0)


def test_the_last_token_over_its_prefix_gives_the_full_pass_gradient(lm64):
    """The kind's route (the prefix without autograd, the last token over its KV cache with the backward pass)
    against one full pass with autograd: the same z, metric and gradient."""
    _, target = _sets(lm64, n=4)
    z_f, g_f, m_f = z_and_grad(lm64, target, "gold_logit", grad=True, batch_size=3, prefix=False)
    z_p, g_p, m_p = z_and_grad(lm64, target, "gold_logit", grad=True, batch_size=3)
    torch.testing.assert_close(z_p, z_f, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g_p, g_f, rtol=1e-4, atol=1e-6 * float(g_f.abs().max()))
    np.testing.assert_allclose(m_p, m_f, rtol=1e-5)


def test_the_kind_and_its_agreement(gpt2_tokenizer):
    lm, task = wrap(tiny_model("gpt2"), gpt2_tokenizer, "tiny-gpt2"), sentiment_task()
    params = {"shots": 3, "prompts": 6, "seed": 0, "target": "shuffled_inputs", "patch": "mean"}
    r = analyze("attribution_patching", lm, task, params, cache=False)
    L, H = lm.n_layers, lm.n_heads
    assert r.atp.shape == r.atp_se.shape == r.atp_lo.shape == (L, H) and r.metric == "gold_prob"
    assert np.all(r.atp_lo <= r.atp + 1e-12) and np.all(r.atp <= r.atp_hi + 1e-12)
    assert r.top == top_heads(r.atp, k=r.top_k) and r.cpu_seconds > 0
    ex = analyze("activation_patching", lm, task, params, cache=False)
    a = r.agreement
    assert a.exact_map == "prob_gain" and a.exact_top == top_heads(ex.prob_gain, k=r.top_k)
    assert a.recall == pytest.approx(1 - len(a.missed) / r.top_k)
    assert a.max_abs_error == pytest.approx(float(np.abs(r.atp - ex.prob_gain).max()))
    assert a.planned_ratio > 1 and a.cpu_ratio is not None and a.cpu_ratio > 0
    off = analyze("attribution_patching", lm, task, {**params, "exact": False, "metric": "gold_logit"}, cache=False)
    assert off.agreement is None and not np.allclose(off.atp, r.atp)
