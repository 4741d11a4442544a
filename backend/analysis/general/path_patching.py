"""Kind `path_patching`: which later heads (their queries, keys or values), MLPs and the logits does one sender head
feed, by exact path patching (Wang et al. 2022) from clean ICL prompts into corrupted ones (issue 33, part 3).

Source and target as `activation_patching`: the clean k-shot prompts of the head maps and, with the same queries in the
same order, the zero-shot prompts or the k-shot ones with perturbed demonstrations. The sender's z (the output
projection's input, its head's slice) is patched at the last token, clean prompt i's into target i, so every path
from it runs through the last token (`primitives/paths.py`, which runs one token over each target's prefix cache).
Receivers: `l.h.q`, `l.h.k`, `l.h.v` (head h's query, or the key / value head it reads: under grouped-query attention
a kv head, shared by its group of query heads, so the k and v maps are equal across a group), `l.mlp` (the MLP of
layer l, the sender's own layer or later) and `logits` (the sender's direct write into the final norm's input).
    step 1   target run, the sender's z clean, every other head's z frozen at the target run's (`freeze="heads"`,
             Wang et al.; "none": nothing frozen), MLPs recomputed; each receiver's input recorded
    step 2   target run with only the receivers' inputs replaced by their step-1 values; the metric read
    effect   = mean_i (m_2[i] - m_t[i]) with m the gold answer's first-token probability (or logit, `metric`), its
             standard error and 95% bootstrap interval over prompts, and a paired sign-flip test (BH q over receivers)
With `receivers` given, their joint effect (all of them patched in one step 2) and each one's alone; by default the map
of every later head's q, k and v separately (layers x heads each, NaN at the sender's layer and below), each MLP from
the sender's layer on and the logits. `sender_effect` is the sender's activation patching (nothing frozen: every path),
the scale the effects are a share of; with `freeze="none"` and every receiver downstream patched together, step 2 is
exactly that (tests/unit/test_path_patching.py).
Gemma 2 / 3: the head's z is patched before the output projection and the post-attention norm is recomputed in every
run, so nothing is linearised.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

import numpy as np
from pydantic import AfterValidator, Field, Strict, model_validator

from ...errors import BadInput
from ...tasks.base import TaskError
from ..kernel import Context
from ..kinds import get_kind
from ..params import Head, Int, Layer, PromptParams
from ..primitives import map_stats
from ..primitives import paths as P
from ..primitives.batching import build_prompts, encode
from ..primitives.cost import Shape, Sizes, Work, passes, steps
from ..primitives.patch import Target, gold_ids, target_prompts
from ..primitives.stages import planned
from ..primitives.stats import benjamini_hochberg, paired_comparison, paired_comparisons, stderr
from ..results import Grid, Model, PairedTest, Result

MAP_LAYERS = 32
"""The default map covers at most this many layers after the sender (every later layer of SmolLM2 and Gemma 3 270M);
`layers` picks others."""


def _receiver(v: str) -> str:
    return P.parse_receiver(v).name


ReceiverName = Annotated[str, Strict(), Field(max_length=24), AfterValidator(_receiver)]


class PathPatchingParams(PromptParams):
    """kind `path_patching`: one sender head's paths into later heads' q / k / v, MLPs and the logits."""

    sender: Head | None = Field(None, description="the sender head [layer, head]; default: the task's top TL head "
                                                  "(head_scores of the same prompts)")
    receivers: list[ReceiverName] | None = Field(None, max_length=256, description=(
        "receivers layer.head.q / .k / .v, layer.mlp or logits, all after the sender (k / v: the kv head that query "
        "head reads); their joint effect and each one's. Default: the map of every later head's q, k and v, each "
        f"MLP and the logits (in the first {MAP_LAYERS} layers from the sender's, or `layers`)"))
    layers: list[Layer] | None = Field(None, max_length=256, description="the map's layers (no receivers given): "
                                                                         "default every one after the sender")
    target: Target = Field("zero_shot", description="the prompt set patched into: zero-shot prompts, or the k-shot "
                                                    "prompts with perturbed demonstrations")
    freeze: P.Freeze = Field("heads", description="step 1: heads: every other head's z frozen at the target run's "
                                                  "(Wang et al.; MLPs recomputed); none: nothing frozen")
    metric: Literal["gold_prob", "gold_logit"] = Field("gold_prob", description="what an effect is a change of: "
                                                                                "p(gold first token) or its logit")
    batch_size: Int = Field(16, ge=1, le=1024, description="prompts per batch (speed only)")

    @model_validator(mode="after")
    def _after_sender(self) -> "PathPatchingParams":
        if self.sender is not None:
            parsed = [P.parse_receiver(r) for r in self.receivers or []]
            s = self.sender[0]
            bad = [r for r in parsed if r.channel != "logits" and (r.layer < s or (r.layer == s and r.channel != "mlp"))]
            if bad:
                raise ValueError(f"receiver {bad[0].name} is in layer {bad[0].layer}, not after the sender's layer {s}: "
                                 f"it cannot read the sender (a head reads what earlier layers wrote; an MLP its own "
                                 f"layer's heads and earlier ones)")
        return self

    def configs(self, shape: Shape) -> tuple[int, float]:
        """(step-2 configurations, their mean share of the layers), the sender at the middle layer when not given."""
        L, H, KV = max(shape.n_layers, 1), shape.n_heads, shape.kv_heads
        s = self.sender[0] if self.sender is not None else L // 2
        if self.receivers is not None:
            rs = [P.parse_receiver(r, L) for r in self.receivers]
            low = min((min(r.layer, L - 1) for r in rs), default=L - 1)
            shares = [(L - low) / L] + [(L - min(r.layer, L - 1)) / L for r in rs]
            return len(shares) if len(rs) > 1 else 1, float(np.mean(shares))
        layers = self.map_layers(L, s)
        per = [(l, H + 2 * KV + 1 if l > s else 1) for l in layers]
        n = sum(c for _, c in per) + 1
        return n, (sum(c * (L - l) for l, c in per) + 1) / (n * L)

    def map_layers(self, L: int, s: int) -> list[int]:
        if self.layers is not None:
            return sorted({l for l in self.layers if s <= l < L})
        return list(range(s, min(L, s + MAP_LAYERS)))

    def work(self, shape: Shape, sizes: Sizes) -> Work:
        """The head scores (no sender given); clean prompts: one pass; target prompts: one pass (their prefixes);
        then one-token steps: the target, step 1 (and the sender unfrozen) from the sender's layer on, and each
        step-2 configuration per prompt from its lowest receiver's layer on."""
        n, L = sizes.n(self.prompts), max(shape.n_layers, 1)
        clean, target = sizes.prompt(self.shots), sizes.prompt(0 if self.target == "zero_shot" else self.shots)
        w = Work()
        if self.sender is None:
            w = get_kind("head_scores").params(shots=self.shots, prompts=self.prompts).work(shape, sizes).named(
                "head scores")
        c, share = self.configs(shape)
        s = self.sender[0] if self.sender is not None else L // 2
        first = (2 if self.freeze == "none" else 3) * n
        return (w + passes("clean prompts", n, clean, batch=self.batch_size)
                + passes("target prompts", n, target, batch=self.batch_size)
                + steps("path patches", first + n * c, share=(first * (L - s) / L + n * c * share) / (first + n * c),
                        batch=P.STEP_ROWS))


class PathMap(Model):
    """Per-head effects (layers, heads) with standard errors and 95% bootstrap intervals over prompts; NaN where the
    head is no receiver (the sender's layer and below)."""

    mean: Grid
    se: Grid
    ci_low: Grid
    ci_high: Grid


class LayerEffects(Model):
    """Per-layer effects (layers,), None (NaN) below the sender's layer (and outside `layers`)."""

    mean: list[float | None]
    se: list[float | None]
    ci_low: list[float | None]
    ci_high: list[float | None]


class ReceiverEffect(PairedTest):
    """One receiver patched alone: the effect (step 2 minus target) and its paired test against the target run."""

    receiver: str
    se: float | None = None
    q: float | None = Field(None, description="Benjamini-Hochberg q over every receiver of the result")


class PathPatchingResult(Result):
    """The sender's paths into its receivers: a joint effect, one per receiver, and the q / k / v maps by default."""

    n_layers: int
    n_heads: int
    n_kv_heads: int
    shots: int
    prompts: int
    target: str
    freeze: str
    metric: str
    sender: Head
    receivers: list[str] | None = Field(None, description="the receivers given (k / v by the kv head read)")
    clean_metric: float = Field(..., description="mean metric of the clean prompts")
    target_metric: float = Field(..., description="mean metric of the target prompts")
    sender_effect: PairedTest = Field(..., description="the sender's activation patching (every path)")
    step1_effect: PairedTest = Field(..., description="step 1's own output against the target run")
    joint: PairedTest | None = Field(None, description="every given receiver patched together")
    q: PathMap | None = Field(None, description="via each later head's query")
    k: PathMap | None = Field(None, description="via the key of the kv head each later head reads")
    v: PathMap | None = Field(None, description="via the value of the kv head each later head reads")
    mlp: LayerEffects | None = Field(None, description="via each MLP from the sender's layer on")
    logits: PairedTest | None = Field(None, description="the sender's direct path to the final norm's input")
    effects: list[ReceiverEffect] = Field(default_factory=list, description="each receiver alone, largest |effect| "
                                                                             "first")


def path_patching(ctx: Context, p: PathPatchingParams) -> dict[str, Any]:
    """The sender's path-patching effects into its receivers (see the module)."""
    lm, task = ctx.lm, ctx.task
    if task.builder is not None:
        raise TaskError(f"task {task.name!r} builds its own prompts: it has no zero-shot or perturbed counterpart "
                        f"of the same queries to patch into")
    L, H = lm.n_layers, lm.n_heads
    share = planned(ctx, p)
    sender = tuple(p.sender) if p.sender is not None else None
    if sender is None:
        sc = ctx.call("head_scores", shots=p.shots, prompts=p.prompts, seed=p.seed,
                      progress=ctx.stage(*share["head scores"], "head scores"))
        sender = tuple(sc.top_tl[0])
    receivers = None if p.receivers is None else [P.parse_receiver(r, L) for r in p.receivers]
    if receivers is not None and not receivers:
        raise BadInput("give at least one receiver, or none for the map")
    if receivers is not None:
        P.check_receivers(lm, sender, receivers)
        receivers = sorted({P.canonical(lm, r) for r in receivers}, key=P.Receiver.key)
        alone = [[r] for r in receivers]
        configs = ([receivers] if len(receivers) > 1 else []) + alone
    else:
        P.check_receivers(lm, sender, [])
        listed = P.every_receiver(lm, sender, p.map_layers(L, sender[0]))
        alone = [[r] for r in listed]
        configs = alone
    built = build_prompts(lm, task, p.shots, p.prompts, p.seed)
    for w in built.warnings:
        ctx.warn(w)
    clean = encode(lm, built.prompts, task.kind)
    target = encode(lm, target_prompts(task, p.target, built.shots, built.n, p.seed), task.kind)
    if gold_ids(clean) != gold_ids(target) or [q.query for q in clean.prompts] != [q.query for q in target.prompts]:
        raise TaskError(f"the {p.target.replace('_', ' ')} prompts do not pair with the clean ones (another query or "
                        f"gold token): nothing to patch")
    runs = P.path_patch(lm, clean.ids, target.ids, gold_ids(target), sender, configs, freeze=p.freeze,
                        batch_size=p.batch_size, progress=ctx.stage(share["clean prompts"][0], 1.0, "path patching"))
    which = "prob" if p.metric == "gold_prob" else "logit"
    m = lambda name: getattr(runs, f"{name}_{which}")  # noqa: E731
    per = getattr(runs, which)  # (configs, prompts)
    m_t = m("target")
    if np.abs(m("sender") - m_t).max(initial=0.0) < 1e-9:
        ctx.warn(f"the sender {sender[0]}.{sender[1]} changes nothing on these prompts (its clean and target z give the "
                 f"same output): every path effect is 0")
    alone_rows = per[len(configs) - len(alone):]  # each receiver alone, in `alone`'s order
    tests = paired_comparisons(alone_rows.T, np.broadcast_to(m_t, alone_rows.shape).T)
    qs = benjamini_hochberg(np.array([t["p"] for t in tests], dtype=float))
    d = (alone_rows - m_t[None]).T  # (prompts, receivers)
    effects = [ReceiverEffect(**t, receiver=c[0].name, se=float(e), q=float(q))
               for t, c, e, q in zip(tests, alone, stderr(d), qs)]
    res: dict[str, Any] = {
        "n_layers": L, "n_heads": H, "n_kv_heads": lm.n_kv_heads, "shots": built.shots, "prompts": built.n,
        "target": p.target, "freeze": p.freeze, "metric": p.metric, "sender": sender,
        "receivers": None if receivers is None else [r.name for r in receivers],
        "clean_metric": float(m("clean").mean()), "target_metric": float(m_t.mean()),
        "sender_effect": paired_comparison(m("sender"), m_t), "step1_effect": paired_comparison(m("step1"), m_t),
        "effects": sorted(effects, key=lambda e: -abs(e.effect)),
        "multi_token_labels": sorted(set(clean.multi_token) | set(target.multi_token))}
    if receivers is not None and len(receivers) > 1:
        res["joint"] = paired_comparison(per[0], m_t)
    index = {c[0]: j for j, c in enumerate(alone)}
    logit = index.get(P.Receiver(L, None, "logits"))
    if logit is not None:
        res["logits"] = paired_comparison(alone_rows[logit], m_t)
    res.update(_maps(lm, index, d))
    return res


def _maps(lm: Any, index: dict, d: np.ndarray) -> dict[str, Any]:
    """The q / k / v maps (layers, heads) and the MLPs' (layers,) from the per-prompt effects d (prompts, receivers),
    for the receivers of `index` (receiver -> column); a map no receiver falls on is left out."""
    L, H, N = lm.n_layers, lm.n_heads, d.shape[0]
    out: dict[str, Any] = {}
    for c in ("q", "k", "v"):
        x = np.full((N, L, H), np.nan)
        hit = False
        for l in range(L):
            for h in range(H):
                j = index.get(P.canonical(lm, P.Receiver(l, h, c)))
                if j is not None:
                    x[:, l, h], hit = d[:, j], True
        if hit:
            u = map_stats.uncertainty(x)
            out[c] = {"mean": x.mean(0), "se": u["se"], "ci_low": u["ci_low"], "ci_high": u["ci_high"]}
    x = np.full((N, L), np.nan)
    cols = [(l, index.get(P.Receiver(l, None, "mlp"))) for l in range(L)]
    if any(j is not None for _, j in cols):
        for l, j in cols:
            if j is not None:
                x[:, l] = d[:, j]
        u = map_stats.uncertainty(x)
        out["mlp"] = {"mean": x.mean(0).tolist(), "se": u["se"].tolist(), "ci_low": u["ci_low"].tolist(),
                      "ci_high": u["ci_high"].tolist()}
    return out
