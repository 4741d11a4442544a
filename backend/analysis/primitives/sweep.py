"""One sweep over (configuration, prompt) rows: per-row head masks, injections, or both.

Every row r of a batch is (configuration c, prompt i) and carries its own intervention, so one batch holds
many configurations:
    mask:   z'[l, h] = m[l, h] z[l, h] + (1 - m[l, h]) fill[l, h]   (fill = 0: zero ablation; mean: mean ablation)
    inject: h[l] <- h[l] + v  at the output of decoder layer l, last prompt token
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal, Sequence

import numpy as np
import torch

from ...hooks import hooked
from ...models import LoadedModel
from .batching import Batch, Encoded, Progress, forward_last_logits, map_batches
from .predict import Outcomes, predict_rows

OnLogits = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]


@dataclass(frozen=True)
class RowConfig:
    """One configuration: a head mask (layers, heads) acting at `positions`, and/or injections
    {layer: (d_model,)} added at the output of that layer at the last token. None: untouched."""

    mask: torch.Tensor | None = None
    positions: Literal["all", "last"] = "all"
    inject: dict[int, torch.Tensor] | None = None


def run_sweep(lm: LoadedModel, ids: Sequence[Sequence[int]], configs: Sequence[RowConfig], on_logits: OnLogits, *,
              fill: torch.Tensor | None = None, batch_size: int = 32, progress: Progress | None = None) -> None:
    """Call `on_logits(logits (rows, vocab), config_idx (rows,), prompt_idx (rows,))` with the last-token
    logits of every (configuration, prompt) pair, exactly once each. `fill` (layers, heads, head_dim) is the
    mean-ablation value shared by all configurations."""
    C, N = len(configs), len(ids)
    if C == 0 or N == 0:
        return
    rows = [(c, i) for c in range(C) for i in range(N)]
    L, H = lm.n_layers, lm.n_heads
    masks = torch.stack([cf.mask if cf.mask is not None else torch.ones(L, H) for cf in configs]).to(lm.device)
    masked = torch.tensor([cf.mask is not None for cf in configs], device=lm.device)
    last_only = torch.tensor([cf.positions == "last" for cf in configs], device=lm.device)
    inj_layers = sorted({l for cf in configs for l in (cf.inject or {})})
    vecs = {l: torch.stack([(cf.inject or {}).get(l, torch.zeros(lm.d_model)).float().to(lm.device)
                            for cf in configs]) for l in inj_layers}
    fill = fill.to(lm.device) if fill is not None else None

    def step(batch: Batch) -> None:
        cs = torch.tensor([rows[r][0] for r in batch.rows], device=lm.device)
        ps = torch.tensor([rows[r][1] for r in batch.rows], device=lm.device)
        inject = {l: v[cs] for l, v in vecs.items()} or None
        groups = [(pos, sel) for pos, sel in (("all", masked[cs] & ~last_only[cs]), ("last", masked[cs] & last_only[cs]))
                  if sel.any()]
        if len(groups) > 1:  # rows of both kinds in one batch: one pass per kind
            for pos, sel in groups:
                idx = sel.nonzero().squeeze(1)
                sub = Batch([batch.rows[i] for i in idx.tolist()], batch.input_ids[idx], batch.attention_mask[idx],
                            batch.position_ids[idx], None if batch.last is None else batch.last[idx])
                _pass(lm, sub, masks[cs[idx]], fill, pos, {l: v[idx] for l, v in (inject or {}).items()} or None,
                      cs[idx], ps[idx], on_logits)
            rest = (~masked[cs]).nonzero().squeeze(1)
            if len(rest):
                sub = Batch([batch.rows[i] for i in rest.tolist()], batch.input_ids[rest], batch.attention_mask[rest],
                            batch.position_ids[rest], None if batch.last is None else batch.last[rest])
                _pass(lm, sub, None, None, "all", {l: v[rest] for l, v in (inject or {}).items()} or None, cs[rest],
                      ps[rest], on_logits)
            return
        pos = groups[0][0] if groups else "all"
        _pass(lm, batch, masks[cs] if groups else None, fill, pos, inject, cs, ps, on_logits)

    map_batches(lm, [ids[i] for _, i in rows], batch_size, step, progress, "sweep")


def _pass(lm: LoadedModel, batch: Batch, masks: torch.Tensor | None, fill: torch.Tensor | None, positions: str,
          inject: dict[int, torch.Tensor] | None, cs: torch.Tensor, ps: torch.Tensor, on_logits: OnLogits) -> None:
    with hooked(lm, head_mask=masks, head_fill=fill, mask_positions=positions, inject=inject, last=batch.last):
        logits = forward_last_logits(lm, batch)
    on_logits(logits, cs, ps)


def sweep_outcomes(lm: LoadedModel, enc: Encoded, configs: Sequence[RowConfig], *, fill: torch.Tensor | None = None,
                   batch_size: int = 32, progress: Progress | None = None) -> Outcomes:
    """Accuracy, label accuracy, TR ratio and predictions of every prompt under every configuration,
    each (configs, prompts)."""
    out = Outcomes.empty(len(configs), len(enc.ids))

    def on_logits(logits: torch.Tensor, cs: torch.Tensor, ps: torch.Tensor) -> None:
        pl = ps.tolist()
        rp = predict_rows(logits, [enc.label_ids[i] for i in pl], [enc.gold[i] for i in pl])
        out.record(cs.cpu().numpy(), np.array(pl), rp)

    run_sweep(lm, enc.ids, configs, on_logits, fill=fill, batch_size=batch_size, progress=progress)
    return out


def head_mask(lm: LoadedModel, heads: Sequence[tuple[int, int]]) -> torch.Tensor:
    """(layers, heads) mask: 0 at the given heads, 1 elsewhere. Out-of-range heads are an error."""
    m = torch.ones(lm.n_layers, lm.n_heads)
    for l, h in heads:
        if not (0 <= l < lm.n_layers and 0 <= h < lm.n_heads):
            raise ValueError(f"head ({l}, {h}) is outside this model's {lm.n_layers} layers x {lm.n_heads} heads")
        m[l, h] = 0.0
    return m


def resolve_layers(lm: LoadedModel, layer: "int | str | Sequence[int] | None") -> list[int]:
    """None -> [L // 2]; "all" -> every layer; an int or list is checked against the model."""
    if layer is None:
        return [lm.n_layers // 2]
    if layer == "all":
        return list(range(lm.n_layers))
    layers = [int(layer)] if isinstance(layer, (int, str)) else [int(x) for x in layer]
    bad = [l for l in layers if not 0 <= l < lm.n_layers]
    if bad:
        raise ValueError(f"layer {bad[0] if len(bad) == 1 else bad} out of range: this model has layers "
                         f"0..{lm.n_layers - 1}")
    return layers
