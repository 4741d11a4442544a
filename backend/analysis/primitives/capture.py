"""Capturing activations over prompts: per-prompt rows or their mean.

Sites (all at each row's last prompt token):
    z:      the attention output projection's input, split by head   -> (layers, heads, head_dim) per prompt
    write:  each head's write into the residual stream (`tsla.head_writes`: through a post-attention norm,
            linearised, where the family has one)                     -> (layers, heads, d_model) per prompt
    hidden: each decoder layer's output (optionally through the final norm) -> (layers, d_model) per prompt
    resid:  the residual stream at each decoder layer's INPUT (row 0: the embeddings; row l: the output of layer
            l - 1), where every vector "at layer l" is added (`primitives.layer_inputs`) -> (layers, d_model)
"""
from __future__ import annotations

from typing import Literal, Sequence

import torch

from ...model.hooks import hooked
from ...model.loading import LoadedModel
from .batching import Batch, Encoded, Progress, forward_last_logits, map_batches
from .tsla import head_writes

Site = Literal["z", "write", "hidden", "resid"]


def capture(lm: LoadedModel, enc: Encoded, site: Site, *, reduce: Literal["mean", "rows"] = "mean",
            inject: dict[int, torch.Tensor] | None = None, final_norm: bool = False, batch_size: int = 16,
            progress: Progress | None = None) -> torch.Tensor:
    """Activations at `site` over the encoded prompts.

    reduce="mean": their mean over prompts, (layers, heads, head_dim) or (layers, d_model), float32 on the
    model's device (summed in float64); reduce="rows": one per prompt, (prompts, ...) float32 on the CPU.
    `inject` ({layer: (d_model,)}) is added at the INPUT of those layers (last token) while capturing.
    """
    return capture_sites(lm, enc, (site,), reduce=reduce, inject=inject, final_norm=final_norm,
                         batch_size=batch_size, progress=progress)[site]


def capture_sites(lm: LoadedModel, enc: Encoded, sites: Sequence[Site], *, reduce: Literal["mean", "rows"] = "mean",
                  inject: dict[int, torch.Tensor] | None = None, final_norm: bool = False, batch_size: int = 16,
                  progress: Progress | None = None) -> dict[Site, torch.Tensor]:
    """`capture` of several sites from one pass over the prompts: {site: what `capture` gives for it}."""
    shapes = {"z": (lm.n_layers, lm.n_heads, lm.head_dim), "write": (lm.n_layers, lm.n_heads, lm.d_model),
              "hidden": (lm.n_layers, lm.d_model), "resid": (lm.n_layers, lm.d_model)}
    sites = tuple(dict.fromkeys(sites))
    totals = {s: torch.zeros(shapes[s], dtype=torch.float64, device=lm.device) for s in sites}
    rows = {s: torch.zeros((len(enc.ids), *shapes[s])) for s in sites} if reduce == "rows" else None
    heads = any(s in ("z", "write") for s in sites)
    states = any(s in ("hidden", "resid") for s in sites)

    def step(batch: Batch) -> None:
        with hooked(lm, capture_z=heads, capture_hidden=states, inject=inject, inject_positions=(-1,),
                    last=batch.last) as tr:
            forward_last_logits(lm, batch)
        for site in sites:
            if site == "z":
                x = tr.z(lm.n_heads)  # (batch, layers, heads, head_dim)
            elif site == "write":
                z = tr.z(lm.n_heads).float()
                x = torch.stack([head_writes(z[:, l], lm.w_o(l), tr.write_scale[l]) for l in range(lm.n_layers)], 1)
            elif site == "resid":
                x = torch.stack([tr.embed, *tr.hidden[:-1]], 1)  # (batch, layers, d_model): each layer's input
            else:
                x = torch.stack(tr.hidden, 1)  # (batch, layers, d_model)
                if final_norm:
                    x = lm.final_norm(x)
            if rows is not None:
                rows[site][batch.rows] = x.float().cpu()
            else:
                totals[site].add_(x.double().sum(0))

    map_batches(lm, enc.ids, batch_size, step, progress, f"capturing {', '.join(sites)}")
    if rows is not None:
        return rows
    return {s: (t / len(enc.ids)).float() for s, t in totals.items()}


def capture_means(lm: LoadedModel, enc: Encoded, site: Site, batch_size: int = 16,
                  progress: Progress | None = None) -> torch.Tensor:
    """Mean last-token activation at `site` over the prompts: (layers, heads, head_dim | d_model) or
    (layers, d_model)."""
    return capture(lm, enc, site, batch_size=batch_size, progress=progress)
