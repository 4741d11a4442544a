"""Per-head TSLA scores of a task: one hooked, batched forward pass per batch of ICL prompts.

Output maps have shape (layers, heads) and are means over the N prompts.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import numpy as np
import torch

from ..cache import ResultCache, default_cache, make_key
from ..hooks import hooked
from ..models import LoadedModel
from ..tasks.base import Prompt, Task
from .batching import Batch, Encoded, Progress, encode, fit_prompts, forward_last_logits, map_batches
from .evaluate import evaluate, predict_rows
from .induction import induction_scores
from .selection import overlap, random_heads, top_heads
from .tsla import apply_final_ln, head_writes, label_space, tsla

MAPS = ("tr", "tl", "dla_tr", "dla_tl", "induction")


@dataclass
class ScoreResult:
    """Head maps (layers, heads) and prompt-level metrics of one task on one model."""

    model: str
    task: str
    n_layers: int
    n_heads: int
    shots: int
    n_prompts: int
    seed: int
    tr: np.ndarray
    tl: np.ndarray
    dla_tr: np.ndarray
    dla_tl: np.ndarray
    induction: np.ndarray
    flagged: np.ndarray  # (layers, heads) share of prompts where TR was zero (TL set to 0)
    icl_accuracy: float
    zero_shot_accuracy: float | None
    tr_ratio: float
    top_tr: list[list[int]]
    top_tl: list[list[int]]
    random_heads: list[list[int]]
    overlap: dict[str, dict[str, float | None]]
    multi_token_labels: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)
    cache_hit: bool = False
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        for k, v in d.items():
            if isinstance(v, np.ndarray):
                d[k] = v.tolist()
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "ScoreResult":
        d = dict(d)
        for k in (*MAPS, "flagged"):
            d[k] = np.asarray(d[k], dtype=np.float64)
        return cls(**d)


@dataclass
class TslaSums:
    """Running sums over prompts, each (layers, heads) float64 on the model's device."""

    tr: torch.Tensor
    tl: torch.Tensor
    dla_tr: torch.Tensor
    dla_tl: torch.Tensor
    flagged: torch.Tensor
    correct: int = 0
    in_labels: int = 0
    n: int = 0


def score_encoded(lm: LoadedModel, enc: Encoded, batch_size: int = 16, apply_ln: bool = False,
                  progress: Progress | None = None, padding: str = "left") -> TslaSums:
    """TSLA sums and prediction counts over encoded ICL prompts, one hooked pass per batch."""
    L, H, dev = lm.n_layers, lm.n_heads, lm.device
    zeros = lambda: torch.zeros(L, H, dtype=torch.float64, device=dev)  # noqa: E731
    sums = TslaSums(zeros(), zeros(), zeros(), zeros(), zeros())
    pinv_cache: dict[tuple[int, ...], torch.Tensor] = {}
    unembed = lm.unembed
    centered = lm.spec.norm == "layernorm"
    gain = lm.norm_gain().to(dev) if apply_ln else None

    def step(batch: Batch) -> None:
        with hooked(lm, capture_z=True, capture_resid_final=apply_ln, last=batch.last) as trace:
            logits = forward_last_logits(lm, batch)
        lab = [enc.label_ids[r] for r in batch.rows]
        gold = [enc.gold[r] for r in batch.rows]
        rp = predict_rows(logits, lab, gold, enc.kind)
        ls = label_space(unembed, lab, gold, pinv_cache)
        z = trace.z(H).float()  # (batch, layers, heads, head_dim)
        part = [zeros() for _ in range(5)]
        for layer in range(L):
            o = head_writes(z[:, layer], lm.w_o(layer))  # (batch, heads, d)
            if apply_ln:
                o = apply_final_ln(o, trace.resid_final, gain, lm.norm_eps, centered)
            st = tsla(o, ls)
            for acc, v in zip(part, (st.tr, st.tl, st.dla_tr, st.dla_tl, st.flagged.double())):
                acc[layer] = v.sum(0)
        for name, acc in zip(("tr", "tl", "dla_tr", "dla_tl", "flagged"), part):
            getattr(sums, name).add_(acc)
        sums.correct += int(rp.correct.sum())
        sums.in_labels += int(rp.in_labels.sum())
        sums.n += len(batch.rows)

    with lm.lock, torch.inference_mode():
        map_batches(lm, enc.ids, batch_size, step, progress, "scoring heads", padding)
    return sums


def compute_scores(lm: LoadedModel, prompts: Sequence[Prompt], kind: str, *, zero_shot: Sequence[Prompt] | None,
                   batch_size: int = 16, apply_ln: bool = False, top_pct: float = 3.0, seed: int = 0,
                   progress: Progress | None = None) -> dict[str, Any]:
    """All maps and metrics as a JSON-able dict (no caching)."""
    enc = encode(lm, prompts, kind)
    sub = (lambda lo, hi: (lambda f, m: progress(lo + (hi - lo) * f, m))) if progress else (lambda lo, hi: None)
    sums = score_encoded(lm, enc, batch_size, apply_ln, sub(0.0, 0.7))
    n = sums.n
    maps = {k: (getattr(sums, k) / n).cpu().numpy() for k in ("tr", "tl", "dla_tr", "dla_tl", "flagged")}
    zs = evaluate(lm, zero_shot, kind, batch_size, sub(0.7, 0.9)).accuracy if zero_shot else None
    ind = induction_scores(lm)
    if progress:
        progress(1.0, "done")
    L, H = ind.shape
    k = len(top_heads(maps["tr"], top_pct))
    return {
        **{m: maps[m].tolist() for m in maps}, "induction": ind.tolist(),
        "icl_accuracy": sums.correct / n, "zero_shot_accuracy": zs, "tr_ratio": sums.in_labels / n,
        "top_tr": [list(h) for h in top_heads(maps["tr"], top_pct)],
        "top_tl": [list(h) for h in top_heads(maps["tl"], top_pct)],
        "random_heads": [list(h) for h in random_heads(L, H, k, seed)],
        "overlap": {"tr_tl": overlap(maps["tr"], maps["tl"], top_pct),
                    "tr_induction": overlap(maps["tr"], ind, top_pct),
                    "tl_induction": overlap(maps["tl"], ind, top_pct)},
        "multi_token_labels": enc.multi_token, "n_prompts": n,
    }


def head_scores(lm: LoadedModel, task: Task | None = None, shots: int = 8, n_prompts: int = 50, seed: int = 0, *,
                prompts: Sequence[Prompt] | None = None, kind: str | None = None, batch_size: int = 16,
                apply_ln: bool = False, top_pct: float = 3.0, cache: ResultCache | None | bool = True,
                progress: Progress | None = None) -> ScoreResult:
    """TSLA maps of `task` (or of given `prompts`) on `lm`, cached on disk.

    Returns TR, TL, DLA-TR, DLA-TL and induction maps (layers, heads), ICL and zero-shot accuracy,
    the TR ratio, the top-`top_pct`% heads by TR and TL, a seeded random set of the same size, and
    overlap statistics between the rankings.
    """
    t0 = time.perf_counter()
    warnings: list[str] = []
    if prompts is None:
        if task is None:
            raise ValueError("give a task or prompts")
        prompts, used, warnings = fit_prompts(lm, task, shots, n_prompts, seed)
        zero = task.build_prompts(0, n_prompts, seed)
        kind = task.kind
        shots, name, content = used, task.name, task.content_hash()
    else:
        zero, kind = None, kind or "classification"
        name = task.name if task else "prompts"
        content = make_key("prompts", p=[(p.text, p.gold, p.labels) for p in prompts])
        shots = max((p.n_shots for p in prompts), default=0)
    options = {"apply_ln": apply_ln, "top_pct": top_pct}
    key = make_key("scores", model=lm.fingerprint, task=content, shots=shots, n=len(prompts), seed=seed,
                   kind=kind, **options)
    store = default_cache() if cache is True else (cache or None)

    def compute() -> dict[str, Any]:
        return compute_scores(lm, prompts, kind, zero_shot=zero, batch_size=batch_size, apply_ln=apply_ln,
                              top_pct=top_pct, seed=seed, progress=progress)

    if store is not None:
        value, hit = store.get_or_compute(key, compute)
    else:
        value, hit = compute(), False
    return ScoreResult.from_json({
        **value, "model": lm.name, "task": name, "n_layers": lm.n_layers, "n_heads": lm.n_heads, "shots": shots,
        "seed": seed, "warnings": warnings, "options": options, "cache_hit": hit,
        "seconds": time.perf_counter() - t0,
    })
