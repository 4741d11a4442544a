"""Kind `icl`: accuracy, label accuracy and TR ratio as functions of the number of demonstrations k."""
from __future__ import annotations

from typing import Any

from ..kernel import Context
from ..params import IclParams
from ..primitives.batching import build_prompts, encode
from ..primitives.predict import evaluate


def icl(ctx: Context, p: IclParams) -> dict[str, Any]:
    """Metrics per k over the same held-out queries; `examples` rows (prompt, gold, prediction) per k.
    Where prompts of k shots exceed the context window, fewer are used and a warning says so."""
    out: dict[str, list] = {"shots": [], "accuracy": [], "label_accuracy": [], "tr_ratio": [], "examples": []}
    n = p.prompts
    for i, k in enumerate(p.shots):
        built = build_prompts(ctx.lm, ctx.task, k, p.prompts, p.seed)
        for w in built.warnings:
            ctx.warn(w)
        enc = encode(ctx.lm, built.prompts, ctx.task.kind)
        r = evaluate(ctx.lm, enc, p.batch_size, ctx.stage(i / len(p.shots), (i + 1) / len(p.shots), f"k={k}"),
                     keep_rows=p.examples > 0)
        out["shots"].append(built.shots)
        for m in ("accuracy", "label_accuracy", "tr_ratio"):
            out[m].append(r.metrics[m])
        if p.examples:
            out["examples"].append(r.rows[: p.examples])
        n = built.n
    return {**out, "prompts": n}
