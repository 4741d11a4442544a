"""Ablation: batched configurations equal one-at-a-time runs; masks really ablate; curves and live toggling."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from backend import ablate, ablation_curves
from backend.analysis.primitives.batching import encode, forward_last_logits, make_batch
from backend.analysis.primitives.capture import capture_means
from backend.analysis.primitives.configs import RowConfig, head_mask, score_configs
from backend.model.loading import wrap
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
    fill = capture_means(lm, enc, "z") if mode == "mean" else None
    configs = [RowConfig(mask=head_mask(lm, hs), scope=positions)
               for hs in ([], [(0, 1)], [(0, 1), (1, 3)], [(1, 0), (1, 1), (1, 2)])]
    together = score_configs(lm, enc, configs, fill=fill, batch_size=7)  # batches mix configurations
    for c, cf in enumerate(configs):
        alone = score_configs(lm, enc, [cf], fill=fill, batch_size=1)
        assert np.array_equal(together.correct[c], alone.correct[0])
        assert np.array_equal(together.pred_token[c], alone.pred_token[0])
        np.testing.assert_allclose(together.gold_prob[c], alone.gold_prob[0], rtol=1e-5, atol=1e-9)


def test_ablation_changes_logits_and_empty_mask_does_not(lm):
    task = sentiment_task()
    enc = encode(lm, task.build_prompts(2, 4, 0), task.kind)
    base = score_configs(lm, enc, [RowConfig(mask=torch.ones(lm.n_layers, lm.n_heads))])
    b = make_batch(lm, enc.ids, list(range(4)))
    with torch.inference_mode():
        plain = torch.softmax(forward_last_logits(lm, b), -1)
    gold_tok = [enc.label_ids[r][enc.gold[r]] for r in b.rows]
    np.testing.assert_allclose(base.gold_prob[0][b.rows], plain[range(4), gold_tok].numpy(), rtol=1e-6)
    allgone = score_configs(lm, enc, [RowConfig(mask=torch.zeros(lm.n_layers, lm.n_heads))])
    assert not np.allclose(allgone.gold_prob, base.gold_prob)


def test_mean_ablation_of_one_prompt_with_its_own_mean_is_a_no_op_at_the_last_token(lm):
    """With a single prompt, the mean last-token z is that prompt's z: mean-ablating every head at the
    last position must give back the unablated logits."""
    task = sentiment_task()
    enc = encode(lm, task.build_prompts(2, 1, 0), task.kind)
    fill = capture_means(lm, enc, "z")
    base = score_configs(lm, enc, [RowConfig()])
    meaned = score_configs(lm, enc, [RowConfig(mask=torch.zeros(lm.n_layers, lm.n_heads), scope="last")],
                            fill=fill)
    np.testing.assert_allclose(meaned.gold_prob, base.gold_prob, rtol=1e-4)


def test_curves_and_live_ablation(lm):
    task = sentiment_task()
    r = ablation_curves(lm, task, ks=[0, 1, 2, 4], shots=2, prompts=6, cache=False)
    assert r.ks == [0, 1, 2, 4]
    assert set(r.curves) == {"tr", "tl", "induction", "random"}
    first = {name: (c.accuracy[0], c.label_accuracy[0], c.tr_ratio[0]) for name, c in r.curves.items()}
    assert len(set(first.values())) == 1  # k=0 is the same unablated run for every order
    assert len(r.curves["random"].accuracy_std) == 4 and r.curves["random"].seeds == [0, 1, 2]
    live = ablate(lm, task, heads=[(0, 0), (1, 1)], shots=2, prompts=6, cache=False)
    assert (live.before.accuracy, live.before.label_accuracy, live.before.tr_ratio) == first["tr"]
    assert len(live.rows) == 6 and live.rows[0].pred_after is not None
    assert live.heads == [(0, 0), (1, 1)]
    with pytest.raises(ValueError, match="outside this model"):
        ablate(lm, task, heads=[(5, 0)], shots=2, prompts=2, cache=False)
    with pytest.raises(ValueError, match="exceed this model's 8 heads"):
        ablation_curves(lm, task, ks=[0, 100], shots=2, prompts=2, cache=False)
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="orders"):
        ablation_curves(lm, task, orders=["bogus"], shots=2, prompts=2, cache=False)
