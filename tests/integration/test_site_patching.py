"""SITE's top-k / bottom-k patching is the SITE injection itself at alpha in {0, 1}: the `site` kind's curves equal the
soft-injection hooks (full passes) with hard alphas on the ranked heads, on tiny models (GQA included)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from backend.analysis.kernel import analyze
from backend.analysis.site import soft_select as S
from backend.analysis.primitives.batching import encode
from backend.analysis.primitives.inject import gold_tokens
from backend.analysis.primitives.configs import RowConfig, score_configs
from backend.model.loading import wrap
from backend.tasks.base import Task, Template
from tiny_models import tiny_model

WORDS = ["cat", "dog", "red", "blue", "sun", "moon", "tree", "rock", "fish", "bird", "car", "boat", "king", "queen",
         "hot", "cold", "up", "down", "left", "right"]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_patching_curves_equal_the_soft_injection_with_hard_alphas(gpt2_tokenizer, arch):
    lm = wrap(tiny_model(arch), gpt2_tokenizer, f"tiny-{arch}-patch")
    task = Task("tiny-next", "generation", [(w, WORDS[(i + 1) % len(WORDS)]) for i, w in enumerate(WORDS)],
                Template("{input} = {output} ;\n"))
    ks = [1, 3, 5]
    r = analyze("site", lm, task, cache=False, m=4, shots=2, prompts=8, steps=6, val_every=3, val_prompts=3,
                max_new_tokens=2, compare=[], patching=ks, budget=[], correlations=[])
    from backend.store.tensor_store import default_store

    alpha, t, _ = S.load_site(default_store(), r.tensor, lm)
    data = S.site_data(lm, task, m=1, shots=0, val_prompts=1, test_prompts=8, seed=0)
    enc = encode(lm, data.test, task.kind)
    gold = gold_tokens(enc)
    order = S.ranked_heads(alpha.numpy())
    assert [tuple(h) for h in r.patching.top.heads] == order[:ks[-1]]
    assert [tuple(h) for h in r.patching.bottom.heads] == order[::-1][:ks[-1]]
    for i, k in enumerate(ks):
        for curve, heads in ((r.patching.top, order[:k]), (r.patching.bottom, order[::-1][:k])):
            logits = S.soft_logits(lm, enc, S.hard_alpha(lm, heads), t.float())
            assert curve.accuracy[i] == pytest.approx(float((logits.argmax(-1) == gold).float().mean()))
    # the sweep the kind runs (the engine's last-token path over the clean prefix) against full passes through the
    # SITE hooks: the same gold probabilities, not just the same (here often zero) accuracies
    res = score_configs(lm, enc, [RowConfig(mask=1.0 - S.hard_alpha(lm, order[:k]), scope="last") for k in ks],
                         fill=t.float(), batch_size=4)
    for i, k in enumerate(ks):
        p = torch.softmax(S.soft_logits(lm, enc, S.hard_alpha(lm, order[:k]), t.float()), -1)
        np.testing.assert_allclose(res.gold_prob[i], p.gather(1, gold[:, None]).squeeze(1).numpy(), rtol=1e-4,
                                   atol=1e-7)
    plain = S.soft_logits(lm, enc, None, None)
    assert not torch.allclose(plain, S.soft_logits(lm, enc, S.hard_alpha(lm, order[:1]), t.float()))
