"""Hidden-state geometry against the label subspace, per layer, and PCA views.

For a hidden state h (d_model,) at the last token, with the prompt's label rows U, P the projector onto
their span and t = U[y*] - mean_{c != y*} U[c] (which lies in that span, so P t = t):
    alignment  cos = ||P h|| / ||h||
    LD         = <h, t>
    rotation   = angle(P h, t) in degrees, cos = <h, t> / (||P h|| ||t||)
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from ..cache import ResultCache, default_cache, make_key
from ..hooks import hooked
from ..models import LoadedModel
from ..tasks.base import Task
from .batching import Batch, Encoded, Progress, answer_tokens, encode, fit_prompts, forward_last_logits, map_batches
from .tsla import LabelSpace, label_space

CONDITIONS = ("zero_shot", "zero_shot+tr", "zero_shot+tl", "zero_shot+random", "icl")


def hidden_metrics(h: torch.Tensor, ls: LabelSpace) -> dict[str, torch.Tensor]:
    """alignment, LD and rotation (degrees) of hidden states h (batch, d) against each row's label space."""
    h = h.double()
    a = torch.einsum("bd,bnd->bn", h, ls.u.double()) * ls.valid
    ph = torch.einsum("bn,bnm,bm->b", a, ls.g_pinv, a).clamp_min(0).sqrt()
    a_gold = a.gather(1, ls.gold[:, None]).squeeze(1)
    n_other = (ls.valid.sum(1) - 1).clamp_min(1).double()
    ld = a_gold - (a.sum(1) - a_gold) / n_other
    u = ls.u.double()
    u_gold = u.gather(1, ls.gold[:, None, None].expand(-1, 1, u.shape[-1])).squeeze(1)
    t = u_gold - (u.sum(1) - u_gold) / n_other[:, None]
    cos = ld / (ph * t.norm(dim=-1)).clamp_min(1e-30)
    return {"alignment": ph / h.norm(dim=-1).clamp_min(1e-30), "ld": ld,
            "rotation": torch.rad2deg(torch.arccos(cos.clamp(-1, 1)))}


def layer_hiddens(lm: LoadedModel, enc: Encoded, inject: dict[int, torch.Tensor] | None = None,
                  final_norm: bool = False, batch_size: int = 16) -> torch.Tensor:
    """Last-token output of every decoder layer, (prompts, layers, d_model), optionally through the final norm."""
    out = torch.zeros(len(enc.ids), lm.n_layers, lm.d_model)

    def step(batch: Batch) -> None:
        with hooked(lm, capture_hidden=True, inject=inject, last=batch.last) as tr:
            forward_last_logits(lm, batch)
        h = torch.stack(tr.hidden, 1)
        if final_norm:
            h = lm.final_norm(h)
        out[batch.rows] = h.float().cpu()

    with lm.lock, torch.inference_mode():
        map_batches(lm, enc.ids, batch_size, step)
    return out


def summarize(per_prompt: dict[str, torch.Tensor]) -> dict[str, dict[str, list[float]]]:
    """{metric: {"mean": [layers], "std": [layers]}} from {metric: (prompts, layers)}."""
    return {k: {"mean": v.mean(0).tolist(), "std": v.std(0, unbiased=False).tolist()} for k, v in per_prompt.items()}


def pca_view(states: dict[str, np.ndarray], label_rows: np.ndarray, label_names: Sequence[str],
             components: int = 3) -> dict[str, Any]:
    """PCA of the stacked hidden states of all conditions, (n, d) each; label unembedding directions
    are mapped into the same basis (directions, not points: no mean is subtracted), scaled to the cloud."""
    from sklearn.decomposition import PCA

    names = list(states)
    X = np.concatenate([states[n] for n in names])
    k = max(1, min(components, X.shape[0], X.shape[1]))
    pca = PCA(n_components=k, random_state=0).fit(X)
    coords = {}
    for n in names:
        coords[n] = pca.transform(states[n]).tolist()
    dirs = label_rows @ pca.components_.T  # (labels, k)
    spread = np.abs(pca.transform(X)).max() or 1.0
    norms = np.linalg.norm(dirs, axis=1, keepdims=True)
    dirs = dirs / np.where(norms == 0, 1, norms.max()) * spread
    return {"points": coords, "explained_variance_ratio": pca.explained_variance_ratio_.tolist(),
            "label_directions": {lab: d.tolist() for lab, d in zip(label_names, dirs)}}


def geometry(lm: LoadedModel, task: Task, layer: int | None = None, alpha: float = 1.0, shots: int = 8,
             n_prompts: int = 50, seed: int = 0, final_norm: bool = False, pca_layer: int | None = None,
             top_pct: float = 3.0, batch_size: int = 16, cache: ResultCache | None | bool = True,
             progress: Progress | None = None) -> dict[str, Any]:
    """Per-layer alignment, LD and rotation for five conditions (zero-shot; zero-shot + TR, TL and random
    vectors injected at `layer`; ICL), with mean and std over prompts, and a PCA view at `pca_layer`."""
    from .steering import build_vectors, resolve_layers

    inj = resolve_layers(lm, layer)[0]
    pl = resolve_layers(lm, pca_layer if pca_layer is not None else lm.n_layers - 1)[0]
    store = default_cache() if cache is True else (cache or None)
    key = make_key("geometry", model=lm.fingerprint, task=task.content_hash(), layer=inj, alpha=alpha, shots=shots,
                   n=n_prompts, seed=seed, final_norm=final_norm, pca_layer=pl, top_pct=top_pct)

    def compute() -> dict[str, Any]:
        step = (lambda i: progress(i / 6, CONDITIONS[min(i, 4)])) if progress else (lambda i: None)
        step(0)
        vecs = build_vectors(lm, task, ("tr", "tl", "random"), shots, n_prompts, seed, top_pct, None, batch_size,
                             cache)
        zero = encode(lm, task.build_prompts(0, n_prompts, seed), task.kind)
        icl_prompts, _, warnings = fit_prompts(lm, task, shots, n_prompts, seed)
        icl = encode(lm, icl_prompts, task.kind)
        hs: dict[str, torch.Tensor] = {}
        for i, cond in enumerate(CONDITIONS):
            step(i + 1)
            if cond == "icl":
                hs[cond] = layer_hiddens(lm, icl, None, final_norm, batch_size)
            else:
                name = cond.partition("+")[2]
                inject = {inj: alpha * vecs[name]["vector"]} if name else None
                hs[cond] = layer_hiddens(lm, zero, inject, final_norm, batch_size)
        # same queries, same gold, same label sets in every condition: one label space serves all
        ls = label_space(lm.unembed.detach().float().cpu(), zero.label_ids, zero.gold)
        conditions = {}
        for cond, h in hs.items():
            per = [hidden_metrics(h[:, l], ls) for l in range(lm.n_layers)]
            conditions[cond] = summarize({k: torch.stack([p[k] for p in per], 1) for k in per[0]})
        labels = sorted({lab for p in zero.prompts for lab in p.labels})[:32]
        ids = [answer_tokens(lm, zero.prompts[0].text[-32:], lab)[0] for lab in labels]
        rows = lm.unembed.detach().float().cpu()[ids].numpy()
        pca = pca_view({c: h[:, pl].numpy() for c, h in hs.items()}, rows, labels)
        pca["gold"] = [p.gold for p in zero.prompts]
        pca["layer"] = pl
        step(6)
        return {"layers": list(range(lm.n_layers)), "inject_layer": inj, "alpha": alpha, "final_norm": final_norm,
                "conditions": conditions, "pca": pca,
                "vector_heads": {k: v["heads"] for k, v in vecs.items()}, "warnings": warnings}

    value, hit = store.get_or_compute(key, compute) if store else (compute(), False)
    return {"model": lm.name, "task": task.name, "shots": shots, "n_prompts": n_prompts, "seed": seed, **value,
            "cache_hit": hit}
