"""The dashboard's starting settings per model (task, shots, layers, top heads), chosen from measurements, declared
once. No torch: the model box and the pages read them before a model is loaded.

    defaults_for("smollm2-135m")   # {"task": "present-past", "shots": 8, ...}
    help_for("gemma3-270m")        # one paragraph for the model box's help

Keys are the dashboard's state fields (`ui/state.py`): task, shots, prompts, top_k, kmax (the ablation curve's
largest k), sg_layer (the Steering page's injection layer, a decoder layer's input), ltv_layer (the LTV page's
layer: one layer, not the sweep, on a real model) and the SITE page's site_m / site_shots / site_steps. A model is
found by its preset name, or, for a local folder or a converted preset, by its config (model_type, layers, width).
The numbers behind each choice are in bench/REAL_FINDINGS.md (`bench/real_findings.py`).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DEFAULTS: dict[str, dict[str, Any]] = {
    "default": {"task": "syn-sentiment", "shots": 8, "prompts": 50, "top_k": None, "kmax": 16, "sg_layer": None,
                "ltv_layer": "all", "site_m": 50, "site_shots": 10, "site_steps": 400},
    # filled from bench/REAL_FINDINGS.md (see WHY)
    "smollm2-135m": {"task": "present-past", "shots": 8, "prompts": 50, "top_k": 27, "kmax": 27, "sg_layer": 21,
                     "ltv_layer": 15, "site_m": 50, "site_shots": 10, "site_steps": 400},
    "gemma3-270m": {"task": "sentiment", "shots": 8, "prompts": 50, "top_k": 4, "kmax": 8, "sg_layer": 13,
                    "ltv_layer": 9, "site_m": 50, "site_shots": 10, "site_steps": 400},
}
WHY: dict[str, str] = {
    "default": "the embedded model's synthetic tasks: every phenomenon shows at 8 shots (bench/FINDINGS.md).",
    "smollm2-135m": ("present-past has the largest 0 -> 8-shot gain among the tasks whose TR ratio rises (8-shot "
                     "accuracy 0.97 against 0.00 at 0 shots, 60 prompts); ablating the top 27 heads (10%) drops the "
                     "TR ratio on 6 of 8 tasks, against random heads; the vanilla task vector is best at layer 21's "
                     "input (90% on seed 0 and on seed 1, against 7% at the middle layer); the LTV reaches 93% at "
                     "layer 15 (bench/REAL_FINDINGS.md)."),
    "gemma3-270m": ("sentiment has the largest 0 -> 8-shot gain among the tasks whose TR ratio rises (accuracy 1.00 "
                    "against 0.00 at 0 shots, 30 prompts); the top 4 heads (3%) are where F1 holds on the most tasks "
                    "(4 of 8; on sentiment itself ablating them barely moves the TR ratio: try topic); the vanilla "
                    "task vector is best at layer 13's input (100% on seed 0, 90% on seed 1, against 7% at the "
                    "middle layer); the LTV reaches 100% at layer 9 (bench/REAL_FINDINGS.md)."),
}
CONFIGS: dict[tuple[str, int, int], str] = {("llama", 30, 576): "smollm2-135m", ("gemma3_text", 18, 640): "gemma3-270m"}
"""(model_type, layers, hidden size) of each preset's config, for folders that hold one of them."""
NAMES: dict[str, str] = {"headlens-tiny": "default"}


def known(model_name: str) -> str | None:
    """The defaults table's entry for a model name, preset name or model folder, or None."""
    name = str(model_name or "").strip()
    if name in DEFAULTS:
        return name
    if name in NAMES:
        return NAMES[name]
    cfg = _config(Path(name).expanduser()) if name and len(name) < 4096 else None
    if cfg is not None:
        text = cfg.get("text_config") or {}
        key = (cfg.get("model_type"), cfg.get("num_hidden_layers", text.get("num_hidden_layers")),
               cfg.get("hidden_size", text.get("hidden_size")))
        if key[0] == "gemma3":
            key = ("gemma3_text", *key[1:])
        return CONFIGS.get(key)  # type: ignore[arg-type]
    return None


def defaults_for(model_name: str) -> dict[str, Any]:
    """The dashboard's starting settings for `model_name` (a copy; {} for a model the table does not know)."""
    key = known(model_name)
    return dict(DEFAULTS[key]) if key else {}


def help_for(model_name: str) -> str:
    """One paragraph for the model box: the defaults this model starts with, and why (empty for an unknown model)."""
    key = known(model_name)
    if key is None:
        return ""
    d = DEFAULTS[key]
    layer = "the middle layer" if d["sg_layer"] is None else f"layer {d['sg_layer']}"
    top = f"the top {d['top_k']} heads" if d.get("top_k") else "the top 3% of the heads (at least 4)"
    ltv = "every layer" if d["ltv_layer"] == "all" else f"layer {d['ltv_layer']}"
    return (f"`{key}` starts on `{d['task']}` with {d['shots']} shots and {d['prompts']} prompts, {top}, ablation up "
            f"to k = {d['kmax']}, steering at {layer}'s input and the LTV at {ltv}'s: {WHY[key]}")


def _config(folder: Path) -> dict[str, Any] | None:
    """config.json of a model folder (or of a converted preset's folder beside a .gguf), or None."""
    try:
        for cand in (folder / "config.json", folder.parent / "config.json" if folder.suffix == ".gguf" else None):
            if cand is not None and cand.is_file():
                cfg = json.loads(cand.read_text())
                return cfg if isinstance(cfg, dict) else None
    except (OSError, ValueError):
        return None
    return None
