"""The `ltv` job's mechanism stages on the Learned task vectors page: which run, and what each adds to the estimate.

Each stage is a param of the kind (`key_heads`, `ov`, `propagation`; `mechanism` False when none is picked). What a
stage costs is the difference of two service estimates (POST /jobs/estimate): the job with that stage alone against
the job with none, so the figure is the kind's own cost model (`LtvLayersParams.work`), on this model and task.

    stage_params(params, ["key_heads"])      # {..., "mechanism": True, "key_heads": True, "ov": False, ...}
    stage_seconds(estimate, "ltv_layers", params)   # {"key_heads": 12.0, "ov": 4.1, "propagation": 140.0}
"""
from __future__ import annotations

from typing import Any, Callable, Iterable

STAGES = {"key_heads": "Key heads", "ov": "OV reconstruction", "propagation": "Linear propagation"}
HELP = ("Per injection layer. **Key heads**: head saliency |a·∂p/∂a| with the LTV in, the top heads ablated against "
        "random sets, their overlap with the TR / TL / induction maps. **OV reconstruction**: Σ heads A·W_O W_V θ, "
        "injected instead of θ. **Linear propagation**: W = QS fitted on perturbed vectors (rotation and stretch); "
        "the costliest (one token step per perturbation and prompt, 2·d_model perturbations up to 1,024), so it is "
        "off by default. Each label gives the time the stage adds to the estimate.")


def stage_params(params: dict[str, Any], stages: Iterable[str]) -> dict[str, Any]:
    """The `ltv` job's params with exactly `stages` of the mechanism on (none: `mechanism` False)."""
    on = set(stages)
    return {**params, "mechanism": bool(on), **{s: s in on for s in STAGES}}


def stage_seconds(estimate: Callable[[str, dict[str, Any]], dict[str, Any] | None], kind: str,
                  params: dict[str, Any]) -> dict[str, float | None]:
    """Seconds each stage adds to the job's estimate (None where the service gives no seconds)."""
    def seconds(stages: Iterable[str]) -> float | None:
        e = estimate(kind, stage_params(params, stages))
        return None if not e or e.get("seconds") is None else float(e["seconds"])

    base = seconds([])
    out: dict[str, float | None] = {}
    for s in STAGES:
        one = seconds([s])
        out[s] = None if one is None or base is None else max(one - base, 0.0)
    return out


def stage_label(stage: str, seconds: float | None) -> str:
    """`Linear propagation (+about 2 min)`; the name alone without an estimate."""
    from backend.text import describe_seconds

    name = STAGES[stage]
    return name if seconds is None else f"{name} (+{describe_seconds(seconds)})"
