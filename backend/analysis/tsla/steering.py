"""Kind `steer`: inject extracted task vectors into zero-shot prompts.

Injection: h[l] <- h[l] + alpha * v at the INPUT of decoder layer l (layer 0: the embeddings; the convention of
every kind, `primitives.layer_inputs`), at the last prompt token of a zero-shot prompt (vanilla vectors: their
layer-l row, the ICL-minus-zero-shot difference of that same state). Compared with the same prompts untouched
(zero-shot) and with k-shot ICL prompts of the same queries.
"""
from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import Field, field_validator

from ..primitives import options as o
from ..kernel import Context
from ..kinds import get_kind
from ..params import Float, Heads, Int, Layer, PromptParams, Selection
from ..primitives.cost import Shape, Sizes, Work, passes, steps
from ..primitives.stages import between, planned
from ..results import Head, Metrics, Model, Result
from ..primitives.batching import build_prompts, encode
from ..primitives.inject import vector_at
from ..primitives.layer_inputs import run_at_inputs
from ..primitives.predict import evaluate
from ..primitives.rates import curve_intervals
from ..primitives.configs import resolve_layers


class SteerParams(Selection, PromptParams):
    """kind `steer`: zero-shot prompts with alpha * v added at a layer (or every layer), per vector type."""

    vectors: list[o.VectorType] = Field(default_factory=lambda: list(o.VECTOR_TYPES), min_length=1)
    layer: Layer | Literal["all"] | None = Field(None, description="decoder layer whose input the vector is added "
                                                                   "to; None = L/2; `all`: every layer")
    alpha: Float = Field(1.0, ge=-100, le=100)
    heads: Heads | None = Field(None, description="an extra user head set")
    batch_size: Int = Field(o.CONFIG_BATCH_SIZE, ge=1, le=1024)

    @field_validator("vectors")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        return list(dict.fromkeys(v))

    def work(self, shape: Shape, sizes: Sizes) -> Work:
        layers = shape.n_layers if self.layer == "all" else 1
        built = get_kind("task_vectors").params(types=self.vectors, heads=self.heads, shots=self.shots, prompts=self.prompts,
                                           top_pct=self.top_pct, top_k=self.top_k).work(shape, sizes)
        n_vec = len(self.vectors) + bool(self.heads)
        n = sizes.n(self.prompts)
        L = max(shape.n_layers, 1)  # a step runs from its layer on: (L + 1) / 2L of the model over a layer scan
        share = (L + 1) / (2 * L) if self.layer == "all" else (L - (L // 2 if self.layer is None else self.layer)) / L
        return (built + passes("ICL reference", n, sizes.prompt(self.shots)) + passes("zero-shot", n, sizes.prompt(0))
                + steps(f"{n_vec} vectors x {layers} layers", n * (1 + n_vec * layers), share=max(share, 1 / L)))


class SteerVector(Model):
    """Metrics per injection layer (lists over `layers`), the head set and the vector's norm per layer."""

    accuracy: list[float]
    label_accuracy: list[float]
    tr_ratio: list[float]
    heads: list[Head] = Field(default_factory=list)
    norm: list[float]
    accuracy_ci: list[tuple[float, float]] | None = Field(None, description="95% Wilson interval per layer")
    label_accuracy_ci: list[tuple[float, float]] | None = None
    tr_ratio_ci: list[tuple[float, float]] | None = None


class SteerResult(Result):
    layers: list[int]
    alpha: float
    shots: int
    prompts: int
    zero_shot: Metrics
    icl: Metrics
    vectors: dict[str, SteerVector]


def steer(ctx: Context, p: SteerParams) -> dict[str, Any]:
    """Metrics of zero-shot prompts with alpha * v added at each requested layer, per vector type; with the
    zero-shot and ICL references."""
    lm, task = ctx.lm, ctx.task
    layers = resolve_layers(lm, p.layer)
    share = planned(ctx, p)  # the plan's stages (`work`): the vectors' stages, ICL reference, zero-shot, steering
    built = ctx.call("task_vectors", types=p.vectors, heads=p.heads, shots=p.shots, prompts=p.prompts, seed=p.seed,
                     top_pct=p.top_pct, top_k=p.top_k, batch_size=p.batch_size,
                     progress=ctx.stage(0.0, share["ICL reference"][0], "building vectors"))
    for w in built.warnings:
        ctx.warn(w)
    icl_built = build_prompts(lm, task, p.shots, p.prompts, p.seed)
    for w in icl_built.warnings:
        ctx.warn(w)
    zero = encode(lm, task.build_prompts(0, icl_built.n, p.seed), task.kind)
    icl = evaluate(lm, encode(lm, icl_built.prompts, task.kind), p.batch_size, ctx.stage(*share["ICL reference"], "ICL reference"))
    names = list(built.vectors)
    # configuration 0 adds a zero vector: bit-identical to the plain zero-shot pass, in the same batch
    configs = [{layers[0]: torch.zeros(lm.d_model)}]
    configs += [{l: p.alpha * vector_at(built.vectors[nm].vector, l)} for nm in names for l in layers]
    res = run_at_inputs(lm, zero, configs, batch_size=p.batch_size, progress=ctx.stage(*between(share, "zero-shot"), "steering"))
    means = res.means()
    out = {}
    for i, nm in enumerate(names):
        sl = slice(1 + i * len(layers), 1 + (i + 1) * len(layers))
        out[nm] = {**{m: v[sl] for m, v in means.items()}, **curve_intervals(res, range(sl.start, sl.stop)),
                   "heads": built.vectors[nm].heads,
                   "norm": [float(vector_at(built.vectors[nm].vector, l).norm()) for l in layers]}
    return {"layers": layers, "alpha": p.alpha, "shots": icl_built.shots, "prompts": icl_built.n,
            "zero_shot": res.summary(0), "icl": icl.metrics, "vectors": out}
