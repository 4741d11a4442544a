"""Vectors added to decoder-layer inputs: logits, metrics and final states under injections, autograd-safe.

An `Injection` adds vectors {layer: v (d_model,)} to the hidden state at the INPUT of decoder layer `layer`
(layer 0: the embeddings; the input of layer l is the output of layer l - 1) at each position of
`positions` (negative offsets from the last prompt token, -1 = the last token). It may also add `final`
(d_model,) to the last decoder layer's output at the last token (the final norm's input: what the
unembedding reads), and zero-ablate heads at the last token with `mask` (layers, heads; 1 keeps, 0 ablates).

    evaluate_injections(lm, enc, [Injection(), Injection({4: theta})])  # Outcomes, (configs, prompts)

`injected_logits` runs no `inference_mode` of its own, so a trained vector (requires_grad) gets its gradient
through it; the batch helpers here run under the model lock and inference mode (`map_batches`). Where every
injection acts at the last token only (above the embeddings), `evaluate_injections` runs them through the configuration
engine: one token step each over the clean prefix's KV cache (`engine`), equal to full passes within float
tolerance.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from ...errors import BadInput
from ...model.hooks import hooked
from ...model.loading import LoadedModel
from .batching import Batch, Encoded, Progress, forward_last_logits, map_batches
from .predict import Outcomes, predict_rows
from .configs import RowConfig, score_configs


@dataclass(frozen=True)
class Injection:
    """One intervention: vectors at layer inputs (at `positions`), a vector at the final residual (last token),
    a head mask at the last token. The empty Injection is the plain forward pass."""

    vectors: dict[int, torch.Tensor] = field(default_factory=dict)
    positions: tuple[int, ...] = (-1,)
    final: torch.Tensor | None = None
    mask: torch.Tensor | None = None


def check_layers(lm: LoadedModel, layers: Sequence[int]) -> list[int]:
    """The layers as ints, or a ValueError naming the model's range."""
    bad = [l for l in layers if not 0 <= int(l) < lm.n_layers]
    if bad:
        raise BadInput(f"layer {bad[0] if len(bad) == 1 else bad} out of range: this model has decoder layers "
                         f"0..{lm.n_layers - 1} (a vector is added at a layer's input)")
    return [int(l) for l in layers]


def check_positions(ids: Sequence[Sequence[int]], positions: Sequence[int]) -> tuple[int, ...]:
    """Positions as a tuple of distinct negative offsets, nearest the end first (-1, -2, ...), that every prompt
    has; a ValueError otherwise."""
    pos = tuple(sorted(set(int(p) for p in positions), reverse=True))
    if not pos:
        raise BadInput("positions: give at least one offset (-1 = the last prompt token)")
    if pos[0] >= 0:
        raise BadInput(f"positions are negative offsets from the last prompt token (-1 = last), not {pos[0]}")
    shortest = min(len(x) for x in ids)
    if -pos[-1] > shortest:
        raise BadInput(f"position {pos[-1]} reaches before the start of the shortest prompt ({shortest} tokens); "
                         f"use offsets from -1 to -{shortest}")
    return pos


def injected_logits(lm: LoadedModel, batch: Batch, inj: Injection) -> torch.Tensor:
    """Last-token logits (batch, vocab), float32, with `inj` applied (gradients flow to its tensors)."""
    n = len(batch.rows)
    mask = None if inj.mask is None else (inj.mask if inj.mask.dim() == 3 else inj.mask[None].expand(n, -1, -1))
    vectors = dict(inj.vectors or {})
    if inj.final is not None:  # at the final norm's input; added at every position of `positions`, read at the last
        L = lm.n_layers
        vectors[L] = vectors[L] + inj.final if L in vectors else inj.final
    with hooked(lm, inject=vectors or None, inject_positions=inj.positions, head_mask=mask, mask_scope="last",
                last=batch.last):
        return forward_last_logits(lm, batch)


def evaluate_injections(lm: LoadedModel, enc: Encoded, injections: Sequence[Injection], batch_size: int = 32,
                        progress: Progress | None = None, keep_prefix: bool = False) -> Outcomes:
    """Accuracy, label accuracy, TR ratio and predictions of every prompt under every injection,
    each (injections, prompts). `keep_prefix`: keep the prompts' clean prefix states (`prefix_store`), so later
    last-token injections on the same prompts skip their clean pass."""
    configs = as_row_configs(lm, injections)
    if configs is not None:  # all at the last token: the configuration engine's steps over the clean prefix cache
        return score_configs(lm, enc, configs, batch_size=batch_size, progress=progress, keep_prefix=keep_prefix)
    out = Outcomes.empty(len(injections), len(enc.ids))
    for c, inj in enumerate(injections):
        def step(batch: Batch, c: int = c, inj: Injection = inj) -> None:
            logits = injected_logits(lm, batch, inj)
            rp = predict_rows(logits, [enc.label_ids[r] for r in batch.rows], [enc.gold[r] for r in batch.rows])
            out.record(np.full(len(batch.rows), c), np.array(batch.rows), rp)

        sub = None if progress is None else (lambda f, m="", c=c: progress((c + f) / len(injections), m))
        map_batches(lm, enc.ids, batch_size, step, sub, "evaluating injections")
    return out


def as_row_configs(lm: LoadedModel, injections: Sequence[Injection]) -> list[RowConfig] | None:
    """The injections as engine configurations when each acts at the last prompt token only and above the
    embeddings: a vector at the input of layer l >= 1 stays there, `final` goes to the final norm's input (the input
    of layer n_layers), the mask is a last-token mask (zero ablation). None when one of them does not fit (a vector at
    the embeddings or at other positions, a per-row mask or vector)."""
    out = []
    for inj in injections:
        inject: dict[int, torch.Tensor] = {}
        if inj.vectors and (tuple(inj.positions) != (-1,) or min(inj.vectors) < 1):
            return None
        extra = [(int(l), v) for l, v in inj.vectors.items()]
        if inj.final is not None:
            extra.append((lm.n_layers, inj.final))
        for l, v in extra:
            if v.dim() != 1:
                return None
            v = v.detach().float().cpu()
            inject[l] = inject[l] + v if l in inject else v
        if inj.mask is not None and inj.mask.dim() != 2:
            return None
        out.append(RowConfig(mask=inj.mask, scope="last", inject=inject or None))
    return out


def final_states(lm: LoadedModel, ids: Sequence[Sequence[int]], rows: Sequence[int],
                 vectors: dict[int, torch.Tensor], positions: Sequence[int] = (-1,), batch_size: int = 64,
                 progress: Progress | None = None) -> torch.Tensor:
    """The final norm's input at the last token, (R, d_model) float32 on the CPU, for R rows: row r is prompt
    `rows[r]` with vectors[layer][r] (R, d_model) added at that layer's input at `positions`."""
    row_ids = [ids[i] for i in rows]
    out = torch.zeros(len(row_ids), lm.d_model)

    def step(batch: Batch) -> None:
        idx = torch.tensor(batch.rows)
        inj = {l: v[idx].to(lm.device) for l, v in vectors.items()}
        with hooked(lm, inject=inj or None, inject_positions=tuple(positions), capture_resid_final=True,
                    last=batch.last) as tr:
            forward_last_logits(lm, batch)
        out[idx] = tr.resid_final.float().cpu()

    map_batches(lm, row_ids, batch_size, step, progress, "final states")
    return out


def vector_at(vector: np.ndarray | torch.Tensor, layer: int) -> torch.Tensor:
    """The vector to inject at `layer`: itself (d_model,), or its row of a per-layer (layers, d_model) vector."""
    v = torch.as_tensor(np.asarray(vector), dtype=torch.float32)
    return v[layer] if v.dim() == 2 else v


def gold_tokens(enc: Encoded) -> torch.Tensor:
    """The gold answer's first token id of every encoded prompt, (prompts,)."""
    return torch.tensor([enc.label_ids[i][enc.gold[i]] for i in range(len(enc.ids))], dtype=torch.long)
