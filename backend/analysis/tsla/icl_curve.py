"""Kind `icl_curve`: accuracy, label accuracy and TR ratio as functions of the number of demonstrations k."""
from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from ..primitives import options as o

from ..kernel import Context
from ..params import BosParams, Int
from ..primitives.cost import NONE, Shape, Sizes, Work, passes
from ..primitives.stages import planned
from ..results import Model, Result
from ..primitives.batching import build_prompts, encode
from ..primitives.predict import evaluate


class IclCurveParams(BosParams):
    """kind `icl_curve`: accuracy, label accuracy and TR ratio against the number of demonstrations."""

    shots: list[Int] = Field(default_factory=lambda: list(o.ICL_SHOTS), min_length=1, max_length=33)
    prompts: Int = Field(o.ICL_PROMPTS, ge=1)
    seed: Int = Field(o.SEED, ge=0)
    examples: Int = Field(o.EXAMPLES, ge=0, le=50, description="example rows (prompt, gold, prediction) kept per k")
    batch_size: Int = Field(o.BATCH_SIZE, ge=1, le=1024)

    @field_validator("shots")
    @classmethod
    def _shots(cls, v: list[int]) -> list[int]:
        if any(k < 0 for k in v):
            raise ValueError("shots must be non-negative")
        return sorted(set(v))

    def work(self, shape: Shape, sizes: Sizes) -> Work:
        return sum((passes(f"k={k}", sizes.n(self.prompts), sizes.prompt(k)) for k in self.shots), NONE)


class ExampleRow(Model):
    prompt: str
    query: str
    gold: str
    pred: str
    pred_token: str
    correct: bool
    label_correct: bool
    in_labels: bool
    gold_prob: float


class IclCurveResult(Result):
    shots: list[int] = Field(..., description="demonstrations used per point")
    accuracy: list[float]
    label_accuracy: list[float]
    tr_ratio: list[float]
    accuracy_ci: list[tuple[float, float]] | None = Field(None, description="95% Wilson interval per k")
    label_accuracy_ci: list[tuple[float, float]] | None = None
    tr_ratio_ci: list[tuple[float, float]] | None = None
    prompts: int
    examples: list[list[ExampleRow]] = Field(default_factory=list)


def icl_curve(ctx: Context, p: IclCurveParams) -> dict[str, Any]:
    """Metrics per k (each rate with its 95% Wilson interval) over the same held-out queries; `examples` rows
    (prompt, gold, prediction) per k.
    Where prompts of k shots exceed the context window, fewer are used and a warning says so."""
    out: dict[str, list] = {"shots": [], "accuracy": [], "label_accuracy": [], "tr_ratio": [], "examples": [],
                            "accuracy_ci": [], "label_accuracy_ci": [], "tr_ratio_ci": []}
    n = p.prompts
    share = planned(ctx, p)  # the plan's stages (`work`): one per k
    for k in p.shots:
        built = build_prompts(ctx.lm, ctx.task, k, p.prompts, p.seed)
        for w in built.warnings:
            ctx.warn(w)
        enc = encode(ctx.lm, built.prompts, ctx.task.kind)
        r = evaluate(ctx.lm, enc, p.batch_size, ctx.stage(*share[f"k={k}"], f"k={k}"),
                     keep_rows=p.examples > 0)
        out["shots"].append(built.shots)
        for m in ("accuracy", "label_accuracy", "tr_ratio", "accuracy_ci", "label_accuracy_ci", "tr_ratio_ci"):
            out[m].append(r.metrics[m])
        if p.examples:
            out["examples"].append(r.rows[: p.examples])
        n = built.n
    return {**out, "prompts": n}
