"""Batches of configurations over the prompts ((configuration, prompt) pairs), read as prompt-level outcomes; and the
head sets and layers they use. (A *sweep* is the service's models x tasks grid, `service/sweeps.py`.)

A configuration (`RowConfig`) is a head mask and/or injections:
    mask:   z'[l, h] = m[l, h] z[l, h] + (1 - m[l, h]) fill[l, h]   (fill = 0: zero ablation; mean: mean ablation)
    inject: h[l] <- h[l] + v  at the output of decoder layer l, last prompt token
The engine (`engine.run_configs`) recomputes only what a configuration changes: last-token configurations are
one-token passes over the clean prefix's KV cache, all-position masks start at the first layer they change.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ...errors import BadInput
from ...model.loading import LoadedModel
from .batching import Encoded, Progress
from .engine import RowConfig, run_configs
from .predict import Outcomes, predict_rows

__all__ = ["RowConfig", "run_configs", "score_configs", "head_mask", "resolve_layers"]


def score_configs(lm: LoadedModel, enc: Encoded, configs: Sequence[RowConfig], *, fill: torch.Tensor | None = None,
                  batch_size: int = 32, progress: Progress | None = None, keep_prefix: bool = False) -> Outcomes:
    """Accuracy, label accuracy, TR ratio and predictions of every prompt under every configuration,
    each (configs, prompts). `keep_prefix`: keep the prompts' clean prefix states for later calls
    (`prefix_store`)."""
    out = Outcomes.empty(len(configs), len(enc.ids))

    def on_logits(logits: torch.Tensor, cs: torch.Tensor, ps: torch.Tensor) -> None:
        pl = ps.tolist()
        rp = predict_rows(logits, [enc.label_ids[i] for i in pl], [enc.gold[i] for i in pl])
        out.record(cs.cpu().numpy(), np.array(pl), rp)

    run_configs(lm, enc.ids, configs, on_logits, fill=fill, batch_size=batch_size, progress=progress,
              keep_prefix=keep_prefix)
    return out


def head_mask(lm: LoadedModel, heads: Sequence[tuple[int, int]]) -> torch.Tensor:
    """(layers, heads) mask: 0 at the given heads, 1 elsewhere. Out-of-range heads are an error."""
    m = torch.ones(lm.n_layers, lm.n_heads)
    for l, h in heads:
        if not (0 <= l < lm.n_layers and 0 <= h < lm.n_heads):
            raise BadInput(f"head ({l}, {h}) is outside this model's {lm.n_layers} layers x {lm.n_heads} heads")
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
        raise BadInput(f"layer {bad[0] if len(bad) == 1 else bad} out of range: this model has layers "
                         f"0..{lm.n_layers - 1}")
    return layers
