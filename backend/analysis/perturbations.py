"""What perturbing the demonstrations does to ICL, to the head maps, and to the effect of ablating the
original top TR and TL heads.

For each perturbation p: ICL accuracy and TR ratio; TR and TL maps under p and their differences from
the unperturbed maps, (layers, heads); and accuracy / TR ratio when the *unperturbed* top-k TR heads,
top-k TL heads, or k random heads are zero-ablated on the perturbed prompts.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from ..cache import ResultCache, default_cache, make_key
from ..models import LoadedModel
from ..tasks.base import Task, TaskError
from ..tasks.perturb import PERTURBATIONS, get_perturbation
from .ablation import mask_for, run_configs
from .batching import Progress, encode
from .scores import head_scores, score_encoded
from .selection import n_top, random_heads, top_heads


def perturbation_report(lm: LoadedModel, task: Task, perturbations: Sequence[str] | None = None, shots: int = 8,
                        n_prompts: int = 50, seed: int = 0, k: int | None = None, top_pct: float = 3.0,
                        batch_size: int = 16, cache: ResultCache | None | bool = True,
                        progress: Progress | None = None) -> dict[str, Any]:
    """The unperturbed baseline plus one entry per applicable perturbation (others report why not)."""
    names = list(perturbations or PERTURBATIONS)
    for n in names:
        get_perturbation(n)
    store = default_cache() if cache is True else (cache or None)
    key = make_key("perturb", model=lm.fingerprint, task=task.content_hash(), names=names, shots=shots, n=n_prompts,
                   seed=seed, k=k, top_pct=top_pct)

    def compute() -> dict[str, Any]:
        base = head_scores(lm, task, shots, n_prompts, seed, top_pct=top_pct, cache=cache, batch_size=batch_size)
        kk = k or n_top(lm.n_layers, lm.n_heads, top_pct)
        sets = {"tr": top_heads(base.tr, k=kk), "tl": top_heads(base.tl, k=kk),
                "random": random_heads(lm.n_layers, lm.n_heads, kk, seed)}
        masks = torch.stack([torch.ones(lm.n_layers, lm.n_heads)] + [mask_for(lm, s) for s in sets.values()])

        def ablations(enc) -> dict[str, dict[str, float]]:
            res = run_configs(lm, enc, masks, None, batch_size * 2)
            return {name: res.summary(i) for i, name in enumerate(["none", *sets])}

        original = encode(lm, task.build_prompts(base.shots, n_prompts, seed), task.kind)
        out: dict[str, Any] = {"none": {"icl_accuracy": base.icl_accuracy, "tr_ratio": base.tr_ratio,
                                        "tr": base.tr.tolist(), "tl": base.tl.tolist(),
                                        "ablation": ablations(original)}}
        for i, name in enumerate(names):
            if progress:
                progress(i / len(names), name)
            try:
                prompts = task.build_prompts(base.shots, n_prompts, seed, perturb=get_perturbation(name))
                enc = encode(lm, prompts, task.kind)
            except TaskError as e:
                out[name] = {"skipped": str(e)}
                continue
            sums = score_encoded(lm, enc, batch_size)
            tr, tl = (sums.tr / sums.n).cpu().numpy(), (sums.tl / sums.n).cpu().numpy()
            out[name] = {"icl_accuracy": sums.correct / sums.n, "tr_ratio": sums.in_labels / sums.n,
                         "tr": tr.tolist(), "tl": tl.tolist(), "tr_diff": (tr - base.tr).tolist(),
                         "tl_diff": (tl - base.tl).tolist(), "ablation": ablations(enc),
                         "example": prompts[0].text[-400:]}
        if progress:
            progress(1.0, "done")
        return {"k": kk, "heads": {n: [list(h) for h in s] for n, s in sets.items()}, "perturbations": out,
                "shots_used": base.shots}

    value, hit = store.get_or_compute(key, compute) if store else (compute(), False)
    return {"model": lm.name, "task": task.name, "shots": shots, "n_prompts": n_prompts, "seed": seed, **value,
            "cache_hit": hit}
