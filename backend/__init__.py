"""headlens backend: which attention heads do in-context learning, and how.

    from backend import load_model, load_task, head_scores
    lm = load_model("default")
    r = head_scores(lm, load_task("syn-sentiment"), shots=8, n_prompts=50, seed=0)
    r.tr, r.tl  # (layers, heads)

Imports are lazy, so `import backend.client` does not pull in torch.
"""
from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "load_model": "backend.models",
    "wrap": "backend.models",
    "LoadedModel": "backend.models",
    "load_task": "backend.tasks.registry",
    "load_task_file": "backend.tasks.files",
    "load_prompts_file": "backend.tasks.files",
    "builtin_tasks": "backend.tasks.registry",
    "head_scores": "backend.analysis.scores",
    "ScoreResult": "backend.analysis.scores",
    "icl_curve": "backend.analysis.icl",
    "evaluate": "backend.analysis.evaluate",
    "induction_scores": "backend.analysis.induction",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'backend' has no attribute {name!r}")
