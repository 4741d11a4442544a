"""Kinds `ablation_curves` and `ablate`: knock heads out and measure what breaks.

A configuration is a head mask m (layers, heads) applied to z at the output projection's input:
    zero ablation: z'[l, h] = m z[l, h]
    mean ablation: z'[l, h] = m z[l, h] + (1 - m) mean_prompts(z[l, h] at the last token)
at every position or the last one only. All configurations share one engine run (`primitives.configs`).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
from pydantic import Field, field_validator

from ..primitives import options as o
from ...errors import BadInput

from ..kernel import Context
from ..kinds import get_kind
from ..params import Heads, Int, NonNegative, PromptParams
from ..primitives import cost
from ..primitives.cost import NONE, Shape, Sizes, Work, passes
from ..primitives.stages import between, planned
from ..results import Metrics, Model, PairedTest, Result
from ..primitives.batching import Encoded, built_and_encoded
from ..primitives.capture import capture_means
from ..primitives.predict import predicted_label
from ..primitives.prefix_store import stored_z_mean
from ..primitives.rates import config_outcomes, curve_intervals, paired_along, paired_rates, set_curve_intervals
from ..primitives.selection import Head, random_heads, ranking
from ..primitives.stats import pack_outcomes
from ..primitives.configs import RowConfig, head_mask, score_configs


class AblationCurvesParams(PromptParams):
    """kind `ablation_curves`: accuracy, label accuracy and TR ratio against k, the number of top heads ablated."""

    orders: list[o.Order] = Field(default_factory=lambda: list(o.ORDERS), min_length=1)
    ks: list[Int] = Field(default_factory=lambda: list(o.ABLATION_KS), min_length=1, max_length=64)
    mode: o.Mode = "zero"
    positions: o.Positions = "all"
    random_seeds: list[NonNegative] = Field(default_factory=lambda: list(o.RANDOM_SEEDS), min_length=1, max_length=16)
    batch_size: Int = Field(o.CONFIG_BATCH_SIZE, ge=1, le=1024)

    @field_validator("orders")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        return list(dict.fromkeys(v))

    @field_validator("ks")
    @classmethod
    def _ks(cls, v: list[int]) -> list[int]:
        if any(k < 0 for k in v):
            raise ValueError("ks must be non-negative")
        return sorted(set(v))

    def work(self, shape: Shape, sizes: Sizes) -> Work:
        ranked = [o for o in self.orders if o != "random"]
        rankings = len(ranked) + (len(self.random_seeds) if "random" in self.orders else 0)
        ks = {min(k, shape.heads) for k in self.ks if k > 0}
        # the scores: the rankings, and the top sets the random orders stay out of
        w = get_kind("head_scores").params(shots=self.shots, prompts=self.prompts).work(shape, sizes).named("head scores")
        return w + _run(self, shape, sizes, rankings * len(ks), f"{rankings} rankings x {len(ks)} values of k")

    def held(self, lm: Any, task: Any) -> set[str]:
        """The parts of `work` the resident model `lm` will skip: the head scores when the same prompts' are cached
        (the Head map's: `head_orders` reads them, nothing is computed), and at the last token the clean prefix an
        earlier pass kept (`AblateParams.held`)."""
        got = _held(self, lm, task)
        if lm is not None and task is not None and _scores_cached(self, lm, task):
            got.add("head scores")
        return got


class AblateParams(PromptParams):
    """kind `ablate`: ablate one head set; metrics and per-prompt rows before and after."""

    def work(self, shape: Shape, sizes: Sizes) -> Work:
        return _run(self, shape, sizes, 1, "the head set", self.heads)

    def held(self, lm: Any, task: Any) -> set[str]:
        """The parts of `work` the resident model `lm` will skip: a last-token toggle on prompts whose clean prefix
        states an earlier pass kept (the Head map's, a toggle's) makes no clean pass (nor a mean pass, when their z
        was kept), so the toggle is estimated at its one token step per prompt."""
        return _held(self, lm, task)

    heads: Heads = Field(..., description="[[layer, head], ...]")
    mode: o.Mode = "zero"
    positions: o.Positions = "all"
    batch_size: Int = Field(o.CONFIG_BATCH_SIZE, ge=1, le=1024)


def _scores_cached(p: Any, lm: Any, task: Any) -> bool:
    """Whether `head_orders`' call of head_scores on these prompts (or the head_maps it reads) is cached; never
    computes."""
    from ..kernel import lookup

    same = {"shots": p.shots, "prompts": p.prompts, "seed": p.seed, "batch_size": p.batch_size}
    try:
        return any(lookup(kind, lm, task, **same) is not None for kind in ("head_scores", "head_maps"))
    except Exception:  # a store that cannot be read, a task that cannot be keyed: counted as computed
        return False


def _held(p: Any, lm: Any, task: Any) -> set[str]:
    """`_run`'s parts a last-token run skips on `lm` now (see AblateParams.held); empty for every position."""
    from ..primitives.prefix_store import STORE

    if p.positions != "last" or lm is None or task is None:
        return set()
    try:
        _, enc = built_and_encoded(lm, task, p.shots, p.prompts, p.seed)
    except ValueError:  # prompts that cannot be built: the job says why
        return set()
    if not STORE.holds(lm, enc.ids):
        return set()
    return {"clean", "mean head outputs"} if STORE.holds(lm, enc.ids, z=True) else {"clean"}


def _run(p: Any, shape: Shape, sizes: Sizes, configs: int, what: str,
           heads: list[tuple[int, int]] | None = None) -> Work:
    """In the run's order: a mean-ablation pass (mode mean), the clean pass and `configs` head masks over the ICL
    prompts."""
    t, n = sizes.prompt(p.shots), sizes.n(p.prompts)
    per = t * cost.ablation_share(shape, heads) if p.positions == "all" else 1.0
    w = passes("mean head outputs", n, t, logits=0) if p.mode == "mean" else NONE
    return w + passes("clean", n, t) + passes(f"ablating {what}", n * configs, per)


class Curve(Model):
    accuracy: list[float]
    label_accuracy: list[float]
    tr_ratio: list[float]
    heads: list[Head] = Field(default_factory=list, description="the ranked heads (random: the first seed's)")
    accuracy_std: list[float] | None = None
    label_accuracy_std: list[float] | None = None
    tr_ratio_std: list[float] | None = None
    seeds: list[int] | None = None
    accuracy_ci: list[tuple[float, float]] | None = Field(None, description="95% interval per k: Wilson for a "
                                                          "ranked order; random: over the sets and the prompts")
    label_accuracy_ci: list[tuple[float, float]] | None = None
    tr_ratio_ci: list[tuple[float, float]] | None = None
    vs_random: dict[str, list[PairedTest]] | None = Field(None, description="per rate, per k: the top-k set against "
                                                                            "the random sets' mean, prompt by prompt "
                                                                            "(effect = this order minus random)")
    per_prompt: list[list[str]] | None = Field(None, description="per set (one for a ranked order; random: one per "
                                                                 "seed), per k: the prompts' outcomes packed as in "
                                                                 "`Metrics.per_prompt` (`stats.unpack_outcomes`)")


class AblationCurvesResult(Result):
    ks: list[int]
    mode: str
    positions: str
    shots: int
    prompts: int
    curves: dict[str, Curve]
    n_configs: int


class AblateRow(Model):
    prompt: str
    query: str
    gold: str
    pred_before: str
    pred_after: str
    correct_before: bool
    correct_after: bool
    label_correct_before: bool
    label_correct_after: bool
    gold_prob_before: float
    gold_prob_after: float


class AblateResult(Result):
    heads: list[Head]
    mode: str
    positions: str
    shots: int
    prompts: int
    before: Metrics
    after: Metrics
    rows: list[AblateRow]
    test: dict[str, PairedTest] | None = Field(None, description="per rate: after against before on the same "
                                                                 "prompts (effect = after minus before)")


def _prompts(ctx: Context, p: PromptParams, mode: str, progress: Any = None) -> tuple[Encoded, torch.Tensor | None]:
    """The encoded ICL prompts, and the mean-ablation fill (layers, heads, head_dim) when mode is mean."""
    built, enc = built_and_encoded(ctx.lm, ctx.task, p.shots, p.prompts, p.seed)  # a toggle's prompts: remembered
    for w in built.warnings:
        ctx.warn(w)
    fill = None
    if mode == "mean":  # from the prompts' kept clean states when the head maps' pass left them, else a pass
        fill = stored_z_mean(ctx.lm, enc.ids)
        if fill is None:
            fill = capture_means(ctx.lm, enc, "z", p.batch_size, progress)
    return enc, fill


def head_orders(ctx: Context, p: AblationCurvesParams,
                share: dict[str, tuple[float, float]]) -> dict[str, list[list[Head]]]:
    """Ranked head lists per order; "random" has one permutation per seed, starting with the heads outside the
    top max(ks) TR and TL heads, so the random set at every k up to there is disjoint from both top sets (the
    control `random_heads` draws everywhere). Rankings come from the cached `scores` of the same prompts."""
    L, H = ctx.lm.n_layers, ctx.lm.n_heads
    out: dict[str, list[list[Head]]] = {}
    r = ctx.call("head_scores", shots=p.shots, prompts=p.prompts, seed=p.seed, batch_size=p.batch_size,
                 progress=ctx.stage(*share["head scores"], "head scores"))
    for o in p.orders:
        if o != "random":
            out[o] = [ranking(getattr(r, o))]
    if "random" in p.orders:
        kmax = max(p.ks)
        top = set(ranking(r.tr)[:kmax]) | set(ranking(r.tl)[:kmax])
        out["random"] = [random_heads(L, H, L * H, seed=s, exclude=top) for s in p.random_seeds]
    return out


def ablation_curves(ctx: Context, p: AblationCurvesParams) -> dict[str, Any]:
    """Accuracy, label accuracy and TR ratio against k, the number of top heads ablated, per order, each with its
    95% interval; random orders give the mean, std and interval over `random_seeds`, and each ranked order its
    paired test against them per k. Repeated head sets (k = 0 in every order) run once."""
    lm = ctx.lm
    total = lm.n_layers * lm.n_heads
    too_many = [k for k in p.ks if k > total]
    if too_many:
        raise BadInput(f"ks: {too_many[:5]} exceed this model's {total} heads ({lm.n_layers} layers x "
                         f"{lm.n_heads}); use k <= {total}")
    share = planned(ctx, p)  # the plan's stages (`work`): head scores, mean head outputs, clean pass, masks
    ranked = head_orders(ctx, p, share)
    enc, fill = _prompts(ctx, p, p.mode, ctx.stage(*share.get("mean head outputs", share["clean"][:1] * 2),
                                                   "mean head outputs"))
    index: dict[bytes, int] = {}
    masks: list[torch.Tensor] = []
    where: dict[str, list[list[int]]] = {}
    for name, perms in ranked.items():
        where[name] = []
        for perm in perms:
            row = []
            for k in p.ks:
                m = head_mask(lm, perm[:k])
                b = m.numpy().tobytes()
                if b not in index:
                    index[b] = len(masks)
                    masks.append(m)
                row.append(index[b])
            where[name].append(row)
    res = score_configs(lm, enc, [RowConfig(mask=m, scope=p.positions) for m in masks], fill=fill,
                         batch_size=p.batch_size, progress=ctx.stage(*between(share, "clean"), "ablating"))
    means = res.means()
    out = {}
    for name, rows in where.items():
        curve: dict[str, Any] = {"heads": ranked[name][0][: p.ks[-1]]}
        for m, v in means.items():
            a = np.array([[v[c] for c in row] for row in rows])
            curve[m] = a.mean(0)
            if len(rows) > 1:
                curve[f"{m}_std"] = a.std(0)
        if len(rows) > 1:
            curve["seeds"] = list(p.random_seeds)
        # intervals and paired tests from the same outcomes (no extra pass): a ranked order's rate is Wilson; the
        # random sets' mean resamples sets and prompts
        curve.update(set_curve_intervals(res, rows) if len(rows) > 1 else curve_intervals(res, rows[0]))
        curve["per_prompt"] = [[pack_outcomes(res.correct[c], res.label_correct[c], res.in_labels[c]) for c in row]
                               for row in rows]  # for tests pooled over several results (the findings' seeds)
        out[name] = curve
    if "random" in where:
        rand = [config_outcomes(res, [row[j] for row in where["random"]]) for j in range(len(p.ks))]
        for name, rows in where.items():
            if name != "random":
                out[name]["vs_random"] = paired_along([config_outcomes(res, c) for c in rows[0]], rand)
    return {"ks": p.ks, "mode": p.mode, "positions": p.positions, "shots": enc.prompts[0].n_shots,
            "prompts": len(enc.ids), "curves": out, "n_configs": len(masks)}


def ablate(ctx: Context, p: AblateParams) -> dict[str, Any]:
    """Ablate one head set: metrics before and after, and a per-prompt table."""
    lm = ctx.lm
    after = head_mask(lm, p.heads)  # out-of-range heads are an error before any pass
    share = planned(ctx, p)  # the plan's stages (`work`): mean head outputs, clean pass, the head set
    enc, fill = _prompts(ctx, p, p.mode, ctx.stage(*share.get("mean head outputs", (0.0, 0.0)), "mean head outputs"))
    # the prompts' clean prefix stays in memory: the next toggle of a last-token ablation is one token step each
    res = score_configs(lm, enc, [RowConfig(), RowConfig(mask=after, scope=p.positions)], fill=fill,
                         batch_size=p.batch_size, progress=ctx.stage(*between(share, "clean"), "ablating"), keep_prefix=True)
    rows = []
    for i, pr in enumerate(enc.prompts):
        pred = [predicted_label(lm, enc, i, int(res.pred_label[c, i]), int(res.pred_token[c, i])) for c in (0, 1)]
        rows.append({"prompt": pr.text, "query": pr.query, "gold": pr.gold, "pred_before": pred[0],
                     "pred_after": pred[1], "correct_before": res.correct[0, i], "correct_after": res.correct[1, i],
                     "label_correct_before": res.label_correct[0, i], "label_correct_after": res.label_correct[1, i],
                     "gold_prob_before": res.gold_prob[0, i], "gold_prob_after": res.gold_prob[1, i]})
    return {"heads": p.heads, "mode": p.mode, "positions": p.positions, "shots": enc.prompts[0].n_shots,
            "prompts": len(enc.ids), "before": res.summary(0), "after": res.summary(1), "rows": rows,
            "test": paired_rates(config_outcomes(res, 1), config_outcomes(res, 0))}
