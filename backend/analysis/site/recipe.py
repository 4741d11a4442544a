"""The SITE training recipe, shared by the kinds that train soft head selection (`site`, `site_transfer`).
No torch here."""
from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from ..primitives import options as o
from ..params import Float, Int, PromptParams
from ..primitives import cost
from ..primitives.cost import Shape, Sizes, Work, passes, training

PREFIX_FROM = 8
"""Training prompts of this many tokens or more run their clean prefix once and back-propagate the last token only."""


class SiteRecipeParams(PromptParams):
    """How soft head selection (SITE) trains: the task embedding t from `m` few-shot prompts of `shots`
    demonstrations (training split); per-head alphas = sigmoid(logits), logits from 0, Adam (`lr`) for `steps`
    steps of `train_batch` random zero-shot training prompts, validated every `val_every` steps on up to
    `val_prompts` held-out training queries (the best alphas kept, or the last: `keep_alpha`); tested on `prompts`
    held-out queries."""

    added_fields: ClassVar[frozenset[str]] = frozenset({"keep_alpha"})

    m: Int = Field(o.SITE_M, ge=1, le=10_000, description="few-shot prompts averaged into the task embedding (M)")
    shots: Int = Field(o.SITE_SHOTS, ge=0, description="demonstrations in each of those prompts (N)")
    prompts: Int = Field(o.SITE_PROMPTS, ge=1, description="held-out test queries (zero-shot prompts)")
    steps: Int = Field(o.SITE_STEPS, ge=0, le=100_000, description="Adam steps on the alpha logits")
    lr: Float = Field(o.SITE_LR, gt=0, le=100, description="Adam learning rate")
    beta2: Float = Field(o.SITE_BETA2, ge=0, lt=1, description="Adam's second-moment decay (the reference's 0.999; a "
                                                               "lower one keeps the alphas moving once the loss is ~0)")
    train_batch: Int = Field(1, ge=1, le=1024, description="zero-shot training prompts per step")
    val_every: Int = Field(o.SITE_VAL_EVERY, ge=1, le=100_000, description="validate (and keep the best) every so "
                                                                           "many steps")
    val_prompts: Int = Field(o.SITE_VAL_PROMPTS, ge=1, le=100_000,
                             description="validation prompts (at most; held out of the training split)")
    max_new_tokens: Int = Field(o.SITE_MAX_NEW_TOKENS, ge=1, le=256, description="greedy generation length")
    keep_alpha: o.KeepAlpha = Field(o.SITE_KEEP_ALPHA, description="best: keep the alphas of the lowest validation "
                                    "loss; last: those of the last validation (the reference implementation's "
                                    "behaviour)")

    def work(self, shape: Shape, sizes: Sizes) -> Work:
        """One SITE run: the task embedding's `m` prompts, the training steps, the validations and the test
        (soft and rounded alphas, each a generation)."""
        return self.training_work(sizes, self.m) + self.test_work(sizes)

    def training_work(self, sizes: Sizes, m: int) -> Work:
        t0, pool = sizes.prompt(0), sizes.pool
        n_val = min(self.val_prompts, max(1, round(o.SITE_VAL_SHARE * pool)), pool - 1) if pool else self.val_prompts
        rows = self.steps * (min(self.train_batch, pool - n_val) if pool else self.train_batch)
        vals = 1 + self.steps // self.val_every + (1 if self.steps % self.val_every else 0)
        # a prompt of PREFIX_FROM tokens or more runs its prefix without gradients, its last token with them
        step = min(self.train_batch, pool - n_val) if pool else self.train_batch  # rows per step (a call each)
        train = passes("training", rows, t0 - 1, step) + training("training", rows, 1, step) \
            if t0 >= PREFIX_FROM else training("training", rows, t0, step)
        # the validations run inside the training (one stage of the run's progress)
        return passes("task embedding", m, sizes.prompt(self.shots)) + train + passes("training", vals * n_val, t0)

    def test_work(self, sizes: Sizes, runs: int = 2) -> Work:
        return cost.generation("SITE test", runs * sizes.n(self.prompts), sizes.prompt(0), self.max_new_tokens)
