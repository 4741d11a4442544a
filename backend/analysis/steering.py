"""Task vectors built from heads, extracted baselines, and injecting them into zero-shot prompts.

Head-set vector (TR, TL, random or a user set S):  v = mean_prompts sum_{(l,h) in S} o[l, h]  (d_model,)
Function vector: sum over the top heads by causal indirect effect (CIE) of their mean outputs, where
    CIE(l, h) = mean_prompts [ p(gold | corrupted, z[l,h] <- mean clean z[l,h]) - p(gold | corrupted) ]
    on shuffled-label prompts, patching the last token only.
Vanilla task vector at layer l: mean_prompts (h_ICL[l] - h_zero[l]) at the last token.
Injection: h[l] <- h[l] + alpha * v at the output of decoder layer l, last token of a zero-shot prompt.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from ..cache import ResultCache, default_cache, make_key
from ..hooks import hooked
from ..models import LoadedModel
from ..tasks.base import Task
from ..tasks.perturb import get_perturbation
from .ablation import head_means, mask_for, run_configs
from .batching import Batch, Encoded, Progress, encode, fit_prompts, forward_last_logits, map_batches
from .evaluate import predict_rows
from .selection import Head, n_top, random_heads, top_heads

VECTOR_TYPES = ("tr", "tl", "random", "fv", "vanilla")
EXTRACTION_SEED_OFFSET = 1000  # vectors are built from prompts of another seed than the evaluation prompts


def head_set_vector(lm: LoadedModel, enc: Encoded, heads: Sequence[Head], batch_size: int = 16) -> torch.Tensor:
    """v = mean over prompts of sum_{(l,h) in heads} z[l,h] @ W_O[l,h] at the last token, (d_model,)."""
    if not heads:
        return torch.zeros(lm.d_model, device=lm.device)
    z_mean = head_means(lm, enc, batch_size)  # (L, H, dh): the sum of means is the mean of sums
    v = torch.zeros(lm.d_model, device=lm.device)
    for l, h in heads:
        v = v + z_mean[l, h] @ lm.w_o(l)[h]
    return v


def hidden_means(lm: LoadedModel, enc: Encoded, batch_size: int = 16) -> torch.Tensor:
    """Mean last-token output of every decoder layer, (layers, d_model)."""
    total = torch.zeros(lm.n_layers, lm.d_model, dtype=torch.float64, device=lm.device)

    def step(batch: Batch) -> None:
        with hooked(lm, capture_hidden=True, last=batch.last) as tr:
            forward_last_logits(lm, batch)
        total.add_(torch.stack(tr.hidden, 1).double().sum(0))

    with lm.lock, torch.inference_mode():
        map_batches(lm, enc.ids, batch_size, step)
    return (total / len(enc.ids)).float()


def causal_indirect_effects(lm: LoadedModel, task: Task, shots: int, n_prompts: int, seed: int,
                            batch_size: int = 32, progress: Progress | None = None) -> np.ndarray:
    """CIE of every head, (layers, heads): gain in gold probability on shuffled-label prompts when the
    head's last-token z is patched with its mean over clean ICL prompts."""
    clean, _, _ = fit_prompts(lm, task, shots, n_prompts, seed)
    enc_clean = encode(lm, clean, task.kind)
    corrupt = task.build_prompts(max(shots, 1), n_prompts, seed, perturb=get_perturbation("shuffled_inputs"))
    enc_corrupt = encode(lm, corrupt, task.kind)
    fill = head_means(lm, enc_clean, batch_size)
    L, H = lm.n_layers, lm.n_heads
    masks = torch.stack([torch.ones(L, H)] + [mask_for(lm, [(l, h)]) for l in range(L) for h in range(H)])
    res = run_configs(lm, enc_corrupt, masks, fill, batch_size, positions="last", progress=progress)
    gain = res.gold_prob[1:] - res.gold_prob[0][None]
    return gain.mean(1).reshape(L, H)


def build_vectors(lm: LoadedModel, task: Task, types: Sequence[str], shots: int, n_prompts: int, seed: int,
                  top_pct: float = 3.0, heads: Sequence[Head] | None = None, batch_size: int = 16,
                  cache: ResultCache | None | bool = True) -> dict[str, dict[str, Any]]:
    """{type: {"vector": (d,) or (layers, d) for vanilla, "heads": [...]}} for the requested types.

    Also "custom" when `heads` is given. Vectors come from ICL prompts of seed + 1000, so that they
    are not built from the evaluation prompts.
    """
    from .scores import head_scores

    unknown = set(types) - set(VECTOR_TYPES)
    if unknown:
        raise ValueError(f"unknown vector type(s) {sorted(unknown)}; choose from {list(VECTOR_TYPES)}")
    xseed = seed + EXTRACTION_SEED_OFFSET
    prompts, _, _ = fit_prompts(lm, task, shots, n_prompts, xseed)
    enc = encode(lm, prompts, task.kind)
    L, H = lm.n_layers, lm.n_heads
    k = n_top(L, H, top_pct)
    out: dict[str, dict[str, Any]] = {}
    if {"tr", "tl"} & set(types):
        r = head_scores(lm, task, shots, n_prompts, seed, top_pct=top_pct, cache=cache)
    sets: dict[str, list[Head]] = {}
    if "tr" in types:
        sets["tr"] = top_heads(r.tr, top_pct)
    if "tl" in types:
        sets["tl"] = top_heads(r.tl, top_pct)
    if "random" in types:
        sets["random"] = random_heads(L, H, k, seed)
    if "fv" in types:
        cie = causal_indirect_effects(lm, task, shots, min(n_prompts, 25), xseed, batch_size * 2)
        sets["fv"] = top_heads(cie, top_pct)
    if heads:
        sets["custom"] = [tuple(h) for h in heads]
    for name, hs in sets.items():
        out[name] = {"vector": head_set_vector(lm, enc, hs, batch_size), "heads": [list(h) for h in hs]}
    if "vanilla" in types:
        zero = encode(lm, task.build_prompts(0, n_prompts, xseed), task.kind)
        out["vanilla"] = {"vector": hidden_means(lm, enc, batch_size) - hidden_means(lm, zero, batch_size),
                          "heads": []}
    return out


def vector_at(entry: dict[str, Any], layer: int) -> torch.Tensor:
    v = entry["vector"]
    return v[layer] if v.dim() == 2 else v


def run_injections(lm: LoadedModel, enc: Encoded, configs: Sequence[tuple[int, torch.Tensor]],
                   batch_size: int = 32, progress: Progress | None = None) -> dict[str, np.ndarray]:
    """Evaluate every prompt under every (layer, vector) injection; configurations batched together.

    Returns correct / in_labels, each (configs, prompts)."""
    C, N = len(configs), len(enc.ids)
    rows = [(c, i) for c in range(C) for i in range(N)]
    ids = [enc.ids[i] for _, i in rows]
    correct = np.zeros((C, N), dtype=bool)
    in_labels = np.zeros((C, N), dtype=bool)
    layers = sorted({l for l, _ in configs})
    vecs = torch.stack([v.float().to(lm.device) for _, v in configs])  # (C, d)
    where = torch.tensor([l for l, _ in configs], device=lm.device)

    def step(batch: Batch) -> None:
        cs = torch.tensor([rows[r][0] for r in batch.rows], device=lm.device)
        ps = [rows[r][1] for r in batch.rows]
        inject = {l: vecs[cs] * (where[cs] == l)[:, None] for l in layers}
        with hooked(lm, inject=inject, last=batch.last):
            logits = forward_last_logits(lm, batch)
        rp = predict_rows(logits, [enc.label_ids[i] for i in ps], [enc.gold[i] for i in ps], enc.kind)
        cc, pp = cs.cpu().numpy(), np.array(ps)
        correct[cc, pp] = rp.correct.cpu().numpy()
        in_labels[cc, pp] = rp.in_labels.cpu().numpy()

    with lm.lock, torch.inference_mode():
        map_batches(lm, ids, batch_size, step, progress, "steering")
    return {"correct": correct, "in_labels": in_labels}


def resolve_layers(lm: LoadedModel, layer: int | str | Sequence[int] | None) -> list[int]:
    """None -> [L // 2]; "all" -> every layer; an int or list is checked against the model."""
    if layer is None:
        return [lm.n_layers // 2]
    if layer == "all":
        return list(range(lm.n_layers))
    layers = [int(layer)] if isinstance(layer, (int, str)) else [int(x) for x in layer]
    bad = [l for l in layers if not 0 <= l < lm.n_layers]
    if bad:
        raise ValueError(f"layer(s) {bad} out of range: the model has layers 0..{lm.n_layers - 1}")
    return layers


def steer(lm: LoadedModel, task: Task, vectors: Sequence[str] = VECTOR_TYPES, layer: int | str | Sequence[int] | None = None,
          alpha: float = 1.0, shots: int = 8, n_prompts: int = 50, seed: int = 0, top_pct: float = 3.0,
          heads: Sequence[Head] | None = None, batch_size: int = 32, cache: ResultCache | None | bool = True,
          progress: Progress | None = None) -> dict[str, Any]:
    """Accuracy and TR ratio of zero-shot prompts with alpha * v added at each requested layer, per
    vector type; with zero-shot and ICL references."""
    from .evaluate import evaluate

    layers = resolve_layers(lm, layer)
    store = default_cache() if cache is True else (cache or None)
    key = make_key("steer", model=lm.fingerprint, task=task.content_hash(), vectors=list(vectors), layers=layers,
                   alpha=alpha, shots=shots, n=n_prompts, seed=seed, top_pct=top_pct,
                   heads=[list(h) for h in heads or []])

    def compute() -> dict[str, Any]:
        notes = []
        types = list(vectors)
        if "fv" in types and task.builder is not None:
            types.remove("fv")
            notes.append(f"no function vector for {task.name!r}: its causal indirect effects need shuffled-label "
                         f"prompts, and this task builds its own prompts")
        built = build_vectors(lm, task, types, shots, n_prompts, seed, top_pct, heads, batch_size, cache)
        zero = encode(lm, task.build_prompts(0, n_prompts, seed), task.kind)
        icl_prompts, _, warnings = fit_prompts(lm, task, shots, n_prompts, seed)
        icl = evaluate(lm, icl_prompts, task.kind, batch_size)
        names = list(built)
        # configuration 0 adds a zero vector: bit-identical to the plain zero-shot pass, in the same sweep
        configs = [(layers[0], torch.zeros(lm.d_model))]
        configs += [(l, alpha * vector_at(built[nm], l)) for nm in names for l in layers]
        res = run_injections(lm, zero, configs, batch_size, progress)
        acc, ratio = res["correct"].mean(1), res["in_labels"].mean(1)
        out = {}
        for i, nm in enumerate(names):
            sl = slice(1 + i * len(layers), 1 + (i + 1) * len(layers))
            out[nm] = {"accuracy": acc[sl].tolist(), "tr_ratio": ratio[sl].tolist(), "heads": built[nm]["heads"],
                       "norm": [float(vector_at(built[nm], l).norm()) for l in layers]}
        return {"layers": layers, "alpha": alpha,
                "zero_shot": {"accuracy": float(acc[0]), "tr_ratio": float(ratio[0])},
                "icl": {"accuracy": icl.accuracy, "tr_ratio": icl.tr_ratio}, "vectors": out, "warnings": notes + warnings}

    value, hit = store.get_or_compute(key, compute) if store else (compute(), False)
    return {"model": lm.name, "task": task.name, "shots": shots, "n_prompts": n_prompts, "seed": seed, **value,
            "cache_hit": hit}
