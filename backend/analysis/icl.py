"""ICL curves: accuracy and TR ratio as functions of the number of demonstrations k."""
from __future__ import annotations

from typing import Any, Sequence

from ..cache import ResultCache, default_cache, make_key
from ..models import LoadedModel
from ..tasks.base import Task
from .batching import Progress, fit_prompts
from .evaluate import evaluate


def icl_curve(lm: LoadedModel, task: Task, shots: Sequence[int] = (0, 1, 2, 4, 8), n_prompts: int = 100,
              seed: int = 0, batch_size: int = 16, cache: ResultCache | None | bool = True,
              progress: Progress | None = None, examples: int = 0) -> dict[str, Any]:
    """{"shots": [k...], "accuracy": [...], "tr_ratio": [...]} over `n_prompts` held-out prompts per k.

    `examples` > 0 also returns that many example rows (prompt, gold, prediction) per k.
    Where prompts of k shots exceed the context window, fewer are used and a warning says so.
    """
    shots = list(shots)
    store = default_cache() if cache is True else (cache or None)
    key = make_key("icl", model=lm.fingerprint, task=task.content_hash(), shots=shots, n=n_prompts, seed=seed,
                   examples=examples)

    def compute() -> dict[str, Any]:
        acc, ratio, used, warns, ex = [], [], [], [], []
        for i, k in enumerate(shots):
            sub = (lambda f, m, i=i: progress((i + f) / len(shots), f"k={k}")) if progress else None
            prompts, k_used, w = fit_prompts(lm, task, k, n_prompts, seed)
            r = evaluate(lm, prompts, task.kind, batch_size, sub, keep_rows=examples > 0)
            acc.append(r.accuracy)
            ratio.append(r.tr_ratio)
            used.append(k_used)
            warns += w
            if examples:
                ex.append(r.rows[:examples])
        out = {"shots": used, "accuracy": acc, "tr_ratio": ratio, "warnings": warns}
        if examples:
            out["examples"] = ex
        return out

    value, hit = store.get_or_compute(key, compute) if store else (compute(), False)
    return {"model": lm.name, "task": task.name, **value, "n_prompts": n_prompts, "seed": seed, "cache_hit": hit}
