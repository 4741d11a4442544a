"""Head ablation: curves over the number of top heads removed, and live toggling of a head set.

Many ablation configurations run in one batch: row r of a batch is (configuration c, prompt i) and
carries its own head mask m[c] of shape (layers, heads), applied to z at the output projection's input:
    zero ablation: z'[l, h] = m * z[l, h]
    mean ablation: z'[l, h] = m * z[l, h] + (1 - m) * mean_prompts(z[l, h] at the last token)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Sequence

import numpy as np
import torch

from ..cache import ResultCache, default_cache, make_key
from ..hooks import Positions, hooked
from ..models import LoadedModel
from ..tasks.base import Task
from .batching import Batch, Encoded, Progress, encode, fit_prompts, forward_last_logits, map_batches
from .evaluate import predict_rows
from .selection import Head, random_heads, ranking

Mode = Literal["zero", "mean"]
ORDERS = ("tr", "tl", "induction", "random")


def head_means(lm: LoadedModel, enc: Encoded, batch_size: int = 16) -> torch.Tensor:
    """Mean last-token z of every head over the prompts, (layers, heads, head_dim)."""
    total = torch.zeros(lm.n_layers, lm.n_heads, lm.head_dim, dtype=torch.float64, device=lm.device)

    def step(batch: Batch) -> None:
        with hooked(lm, capture_z=True, last=batch.last) as tr:
            forward_last_logits(lm, batch)
        total.add_(tr.z(lm.n_heads).double().sum(0))

    with lm.lock, torch.inference_mode():
        map_batches(lm, enc.ids, batch_size, step)
    return (total / len(enc.ids)).float()


def mask_for(lm: LoadedModel, heads: Sequence[Head]) -> torch.Tensor:
    """(layers, heads) mask: 0 at the given heads, 1 elsewhere. Out-of-range heads are an error."""
    m = torch.ones(lm.n_layers, lm.n_heads)
    for l, h in heads:
        if not (0 <= l < lm.n_layers and 0 <= h < lm.n_heads):
            raise ValueError(f"head ({l}, {h}) is outside this model's {lm.n_layers} layers x {lm.n_heads} heads")
        m[l, h] = 0.0
    return m


@dataclass
class ConfigOutcomes:
    """Per configuration and prompt, each (configs, prompts)."""

    correct: np.ndarray
    in_labels: np.ndarray
    pred_token: np.ndarray
    pred_label: np.ndarray
    gold_prob: np.ndarray

    def summary(self, c: int) -> dict[str, float]:
        return {"accuracy": float(self.correct[c].mean()), "tr_ratio": float(self.in_labels[c].mean())}


def run_configs(lm: LoadedModel, enc: Encoded, masks: torch.Tensor, fill: torch.Tensor | None = None,
                batch_size: int = 16, positions: Positions = "all", progress: Progress | None = None) -> ConfigOutcomes:
    """Evaluate every prompt under every head mask (configs, layers, heads), configurations batched together."""
    C, N = masks.shape[0], len(enc.ids)
    rows = [(c, i) for c in range(C) for i in range(N)]
    ids = [enc.ids[i] for _, i in rows]
    out = {k: np.zeros((C, N), dtype=t) for k, t in
           (("correct", bool), ("in_labels", bool), ("pred_token", np.int64), ("pred_label", np.int64),
            ("gold_prob", np.float64))}
    masks = masks.to(lm.device)
    fill = fill.to(lm.device) if fill is not None else None

    def step(batch: Batch) -> None:
        cs = torch.tensor([rows[r][0] for r in batch.rows], device=lm.device)
        ps = [rows[r][1] for r in batch.rows]
        with hooked(lm, head_mask=masks[cs], head_fill=fill, mask_positions=positions, last=batch.last):
            logits = forward_last_logits(lm, batch)
        rp = predict_rows(logits, [enc.label_ids[i] for i in ps], [enc.gold[i] for i in ps], enc.kind)
        cc, pp = cs.cpu().numpy(), np.array(ps)
        for k in out:
            out[k][cc, pp] = getattr(rp, k).cpu().numpy()

    with lm.lock, torch.inference_mode():
        map_batches(lm, ids, batch_size, step, progress, "ablating")
    return ConfigOutcomes(**out)


def _prepare(lm: LoadedModel, task: Task, shots: int, n_prompts: int, seed: int, mode: Mode,
             batch_size: int) -> tuple[Encoded, torch.Tensor | None, list[str]]:
    if mode not in ("zero", "mean"):
        raise ValueError(f"mode must be 'zero' or 'mean', not {mode!r}")
    prompts, _, warnings = fit_prompts(lm, task, shots, n_prompts, seed)
    enc = encode(lm, prompts, task.kind)
    fill = head_means(lm, enc, batch_size) if mode == "mean" else None
    return enc, fill, warnings


def head_orders(lm: LoadedModel, task: Task, orders: Sequence[str], shots: int, n_prompts: int, seed: int,
                random_seeds: Sequence[int], cache: ResultCache | None | bool) -> dict[str, list[list[Head]]]:
    """Ranked head lists per order name; "random" has one permutation per seed."""
    from .scores import head_scores

    unknown = set(orders) - set(ORDERS)
    if unknown:
        raise ValueError(f"unknown ablation order(s) {sorted(unknown)}; choose from {list(ORDERS)}")
    L, H = lm.n_layers, lm.n_heads
    out: dict[str, list[list[Head]]] = {}
    if set(orders) - {"random"}:
        r = head_scores(lm, task, shots, n_prompts, seed, cache=cache)
        for o in orders:
            if o != "random":
                out[o] = [ranking(getattr(r, o))]
    if "random" in orders:
        out["random"] = [random_heads(L, H, L * H, seed=s) for s in random_seeds]
    return out


def ablation_curves(lm: LoadedModel, task: Task, orders: Sequence[str] = ORDERS, ks: Sequence[int] = (0, 1, 2, 4, 8),
                    mode: Mode = "zero", shots: int = 8, n_prompts: int = 50, seed: int = 0,
                    random_seeds: Sequence[int] = (0, 1, 2), batch_size: int = 32, positions: Positions = "all",
                    cache: ResultCache | None | bool = True, progress: Progress | None = None,
                    custom: dict[str, Sequence[Head]] | None = None) -> dict[str, Any]:
    """Accuracy and TR ratio against k, the number of top heads ablated, for each order.

    orders: "tr", "tl", "induction" (rankings from the head maps) and "random" (mean and std over
    `random_seeds`); `custom` adds named explicit orders. All configurations share one batched sweep.
    """
    ks = sorted({int(k) for k in ks})
    if not ks or ks[0] < 0:
        raise ValueError("ks must be non-negative integers")
    store = default_cache() if cache is True else (cache or None)
    custom = {k: [tuple(h) for h in v] for k, v in (custom or {}).items()}
    key = make_key("ablation", model=lm.fingerprint, task=task.content_hash(), orders=list(orders), ks=ks, mode=mode,
                   shots=shots, n=n_prompts, seed=seed, random_seeds=list(random_seeds), positions=positions,
                   custom=custom)

    def compute() -> dict[str, Any]:
        ranked = head_orders(lm, task, [o for o in orders], shots, n_prompts, seed, random_seeds, cache)
        ranked.update({name: [list(v)] for name, v in custom.items()})
        k_max = lm.n_layers * lm.n_heads
        kk = [k for k in ks if k <= k_max]
        enc, fill, warnings = _prepare(lm, task, shots, n_prompts, seed, mode, batch_size)
        # unique masks: k=0 and any repeated head set are computed once
        index: dict[bytes, int] = {}
        masks: list[torch.Tensor] = []
        where: dict[str, list[list[int]]] = {}
        for name, perms in ranked.items():
            where[name] = []
            for perm in perms:
                row = []
                for k in kk:
                    m = mask_for(lm, perm[:k])
                    b = m.numpy().tobytes()
                    if b not in index:
                        index[b] = len(masks)
                        masks.append(m)
                    row.append(index[b])
                where[name].append(row)
        res = run_configs(lm, enc, torch.stack(masks), fill, batch_size, positions, progress)
        acc, ratio = res.correct.mean(1), res.in_labels.mean(1)
        curves = {}
        for name, rows in where.items():
            a = np.array([[acc[c] for c in row] for row in rows])
            t = np.array([[ratio[c] for c in row] for row in rows])
            curves[name] = {"accuracy": a.mean(0).tolist(), "tr_ratio": t.mean(0).tolist(),
                            "heads": [list(h) for h in ranked[name][0][: kk[-1]]]}
            if len(rows) > 1:
                curves[name].update(accuracy_std=a.std(0).tolist(), tr_ratio_std=t.std(0).tolist(),
                                    seeds=list(random_seeds))
        return {"ks": kk, "mode": mode, "positions": positions, "curves": curves, "n_configs": len(masks),
                "warnings": warnings}

    value, hit = store.get_or_compute(key, compute) if store else (compute(), False)
    return {"model": lm.name, "task": task.name, "shots": shots, "n_prompts": n_prompts, "seed": seed, **value,
            "cache_hit": hit}


def ablation_curve(lm: LoadedModel, task: Task, order: str | Sequence[Head], ks: Sequence[int] = (0, 1, 2, 4, 8),
                   mode: Mode = "zero", **kw: Any) -> dict[str, Any]:
    """One curve: `order` is "tr", "tl", "induction", "random", or an explicit ranked head list.

    Returns {"ks", "accuracy", "tr_ratio", "heads", ...}."""
    if isinstance(order, str):
        r = ablation_curves(lm, task, orders=[order], ks=ks, mode=mode, **kw)
        name = order
    else:
        r = ablation_curves(lm, task, orders=[], ks=ks, mode=mode, custom={"custom": list(order)}, **kw)
        name = "custom"
    return {**{k: v for k, v in r.items() if k != "curves"}, **r["curves"][name], "by": name}


def ablate(lm: LoadedModel, task: Task, heads: Sequence[Head], mode: Mode = "zero", shots: int = 8,
           n_prompts: int = 50, seed: int = 0, batch_size: int = 32, positions: Positions = "all",
           cache: ResultCache | None | bool = True, progress: Progress | None = None) -> dict[str, Any]:
    """Ablate one head set; accuracy and TR ratio before and after, and a per-prompt table."""
    heads = sorted({(int(l), int(h)) for l, h in heads})
    store = default_cache() if cache is True else (cache or None)
    key = make_key("ablate", model=lm.fingerprint, task=task.content_hash(), heads=heads, mode=mode, shots=shots,
                   n=n_prompts, seed=seed, positions=positions)

    def compute() -> dict[str, Any]:
        masks = torch.stack([torch.ones(lm.n_layers, lm.n_heads), mask_for(lm, heads)])
        enc, fill, warnings = _prepare(lm, task, shots, n_prompts, seed, mode, batch_size)
        res = run_configs(lm, enc, masks, fill, batch_size, positions, progress)
        dec = lm.tokenizer.decode
        rows = []
        for i, p in enumerate(enc.prompts):
            def pred(c: int) -> str:
                if enc.kind == "classification":
                    return p.labels[int(res.pred_label[c, i])]
                return dec([int(res.pred_token[c, i])])
            rows.append({"prompt": p.text, "query": p.query, "gold": p.gold, "pred_before": pred(0),
                         "pred_after": pred(1), "correct_before": bool(res.correct[0, i]),
                         "correct_after": bool(res.correct[1, i]), "gold_prob_before": float(res.gold_prob[0, i]),
                         "gold_prob_after": float(res.gold_prob[1, i])})
        return {"heads": [list(h) for h in heads], "mode": mode, "positions": positions, "before": res.summary(0),
                "after": res.summary(1), "rows": rows, "warnings": warnings}

    value, hit = store.get_or_compute(key, compute) if store else (compute(), False)
    return {"model": lm.name, "task": task.name, "shots": shots, "n_prompts": n_prompts, "seed": seed, **value,
            "cache_hit": hit}
