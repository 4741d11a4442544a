"""Ablation engine: batched configurations equal one-at-a-time runs; masks really ablate."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from backend.analysis.ablation import ablate, ablation_curve, ablation_curves, head_means, mask_for, run_configs
from backend.analysis.batching import encode, forward_last_logits, make_batch
from backend.models import wrap
from test_core_invariants import sentiment_task
from tiny_models import tiny_model


@pytest.fixture(scope="module")
def lm(gpt2_tokenizer):
    return wrap(tiny_model("qwen2"), gpt2_tokenizer, "tiny-qwen2")


@pytest.mark.parametrize("mode", ["zero", "mean"])
@pytest.mark.parametrize("positions", ["all", "last"])
def test_batched_configurations_equal_single_runs(lm, mode, positions):
    task = sentiment_task()
    enc = encode(lm, task.build_prompts(2, 6, 0), task.kind)
    fill = head_means(lm, enc) if mode == "mean" else None
    masks = torch.stack([mask_for(lm, hs) for hs in ([], [(0, 1)], [(0, 1), (1, 3)], [(1, 0), (1, 1), (1, 2)])])
    together = run_configs(lm, enc, masks, fill, batch_size=7, positions=positions)  # batches mix configurations
    for c in range(len(masks)):
        alone = run_configs(lm, enc, masks[c:c + 1], fill, batch_size=1, positions=positions)
        assert np.array_equal(together.correct[c], alone.correct[0])
        assert np.array_equal(together.pred_token[c], alone.pred_token[0])
        np.testing.assert_allclose(together.gold_prob[c], alone.gold_prob[0], rtol=1e-5, atol=1e-9)


def test_ablation_changes_logits_and_empty_mask_does_not(lm):
    task = sentiment_task()
    enc = encode(lm, task.build_prompts(2, 4, 0), task.kind)
    base = run_configs(lm, enc, torch.ones(1, lm.n_layers, lm.n_heads))
    b = make_batch(lm, enc.ids, list(range(4)))
    with torch.inference_mode():
        plain = torch.softmax(forward_last_logits(lm, b), -1)
    gold_tok = [enc.label_ids[r][enc.gold[r]] for r in b.rows]
    np.testing.assert_allclose(base.gold_prob[0][b.rows], plain[range(4), gold_tok].numpy(), rtol=1e-6)
    allgone = run_configs(lm, enc, torch.zeros(1, lm.n_layers, lm.n_heads))
    assert not np.allclose(allgone.gold_prob, base.gold_prob)


def test_mean_ablation_of_one_prompt_with_its_own_mean_is_a_no_op_at_the_last_token(lm):
    """With a single prompt, the mean last-token z is that prompt's z: mean-ablating every head at the
    last position must give back the unablated logits."""
    task = sentiment_task()
    enc = encode(lm, task.build_prompts(2, 1, 0), task.kind)
    fill = head_means(lm, enc)
    base = run_configs(lm, enc, torch.ones(1, lm.n_layers, lm.n_heads))
    meaned = run_configs(lm, enc, torch.zeros(1, lm.n_layers, lm.n_heads), fill, positions="last")
    np.testing.assert_allclose(meaned.gold_prob, base.gold_prob, rtol=1e-4)


def test_curves_and_live_ablation_shapes(lm):
    task = sentiment_task()
    r = ablation_curves(lm, task, ks=[0, 1, 2, 4, 100], shots=2, n_prompts=6, cache=False)
    assert r["ks"] == [0, 1, 2, 4]  # k beyond L*H = 8 heads dropped
    assert set(r["curves"]) == {"tr", "tl", "induction", "random"}
    first = {name: c["accuracy"][0] for name, c in r["curves"].items()}
    assert len(set(first.values())) == 1  # k=0 is the same unablated run for every order
    assert len(r["curves"]["random"]["accuracy_std"]) == 4
    one = ablation_curve(lm, task, [(1, 1), (0, 0)], ks=[0, 2], shots=2, n_prompts=6, cache=False)
    assert one["by"] == "custom" and one["heads"] == [[1, 1], [0, 0]]
    live = ablate(lm, task, [(0, 0), (1, 1)], shots=2, n_prompts=6, cache=False)
    assert live["before"]["accuracy"] == first["tr"]
    assert len(live["rows"]) == 6 and {"pred_before", "pred_after", "gold_prob_after"} <= set(live["rows"][0])
    with pytest.raises(ValueError, match="outside this model"):
        ablate(lm, task, [(5, 0)], shots=2, n_prompts=2, cache=False)
    with pytest.raises(ValueError, match="unknown ablation order"):
        ablation_curves(lm, task, orders=["bogus"], shots=2, n_prompts=2, cache=False)
