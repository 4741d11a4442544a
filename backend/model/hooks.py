"""`hooked(...)`: capture, ablate and inject by keyword, built on the intervention objects of `interventions.py`
(the one module that registers hooks), with a `Trace` of what it captured.

Batches are normally left-padded, so the last prompt token of every row sits at sequence position -1;
with right padding, pass each row's last index as `last`.
The hooks never run under their own `torch.inference_mode` and never edit an activation in place, so
the same code works under autograd (a trained vector or per-head alpha flows through them).
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, Literal, Sequence

import torch

from .interventions import (Capture, HeadMask, Intervention, Record, WriteScale, add_at, injection, intervene,
                            replace_last, take_last)
from .loading import LoadedModel

__all__ = ["Trace", "hooked", "take_last", "add_at", "replace_last", "Positions"]

Positions = Literal["all", "last"]


@dataclass
class Trace:
    """What a hooked forward pass recorded.

    z_last:      per layer, the output projection's input at the last token, (batch, heads * head_dim).
    write_scale: per layer, where the family has a post-attention norm (Gemma 2 / 3), that norm linearised at the
                 last token: g / rms(o_proj output), (batch, d_model) float32; a head's write into the residual
                 stream is (z_h @ W_O[h]) * write_scale. None per layer for pre-norm families. Captured with z.
    resid_final: the final norm's input at the last token, (batch, d_model).
    hidden:      per layer, the decoder layer's output at the last token, (batch, d_model).
    embed:       the input of decoder layer 0 (the embeddings) at the last token, (batch, d_model), captured with
                 `hidden` (before any injection there); with `hidden[:-1]`, the input of every decoder layer.
    Everything is on the model's device (`lm.device`, the unembedding's), also for a model spread over devices.
    """

    z_last: list[torch.Tensor | None] = field(default_factory=list)
    resid_final: torch.Tensor | None = None
    hidden: list[torch.Tensor | None] = field(default_factory=list)
    write_scale: list[torch.Tensor | None] = field(default_factory=list)
    embed: torch.Tensor | None = None

    def z(self, heads: int) -> torch.Tensor:
        """Stacked last-token head inputs, shape (batch, layers, heads, head_dim)."""
        zs = torch.stack([t for t in self.z_last if t is not None], dim=1)
        return zs.reshape(zs.shape[0], zs.shape[1], heads, -1)


@contextmanager
def hooked(
    lm: LoadedModel,
    *,
    capture_z: bool = False,
    capture_resid_final: bool = False,
    capture_hidden: bool = False,
    head_mask: torch.Tensor | None = None,
    head_fill: torch.Tensor | None = None,
    mask_scope: Positions = "all",
    inject: dict[int, torch.Tensor] | None = None,
    inject_positions: Sequence[int] = (-1,),
    last: torch.Tensor | None = None,
    prefill_only: bool = False,
) -> Iterator[Trace]:
    """The keyword form of `intervene` for one or more forward passes (its hooks come off on exit, exceptions
    included), with a `Trace` of what it captured. New code can pass intervention objects to `intervene` directly.

    capture_z: record z at the last token per layer (and, for post-attention-norm families, `write_scale`).
    capture_hidden: record each decoder layer's output and the embeddings (`embed`) at the last token.

    head_mask: (batch, layers, heads) multipliers on each head's z (1 keeps, 0 ablates), applied at the
               output projection's input at `mask_scope`; per-row, so one batch can hold many
               ablation configurations.
    head_fill: (layers, heads, head_dim) values that ablated heads take instead of 0 (mean ablation):
               z' = m * z + (1 - m) * fill.
    inject:    {layer: vector (d_model,) or (batch, d_model)} added at the INPUT of decoder layer `layer`
               (0: the embeddings; l: the output of layer l - 1; n_layers: the final norm's input, the last layer's
               output) at each position of `inject_positions`. "At layer l" is a layer's input everywhere.
    inject_positions: negative offsets from each row's last prompt token (-1 = the last token).
    last:      (batch,) index of each row's last prompt token; None means position -1 (left padding).
    prefill_only: interventions act on the first forward pass only (the prompt's prefill); later passes
               in the context (decoding steps over the KV cache) run untouched. Captures follow the same rule.
    """
    trace = Trace(z_last=[None] * lm.n_layers, hidden=[None] * lm.n_layers, write_scale=[None] * lm.n_layers)
    dev = lm.device  # the one device of the trace (a device map's layers capture on their own: gathered here)
    items: list[Intervention] = []
    if capture_hidden:
        items.append(Record("layer_in", lambda _, x: setattr(trace, "embed", take_last(x, last).clone().to(dev)),
                            at=[0]))
    if inject:
        items += injection(lm, inject, inject_positions, last)
    if head_mask is not None:
        items.append(HeadMask(head_mask, head_fill, at=mask_scope, last=last))
    if capture_z:
        items.append(Capture("z", last=last, into=trace.z_last, device=dev))
        if lm.spec.post_attn_norm:
            items.append(WriteScale(trace.write_scale, last, device=dev))
    if capture_hidden:
        items.append(Capture("layer_out", last=last, into=trace.hidden, device=dev))
    if capture_resid_final:
        items.append(Record("final_in", lambda _, x: setattr(trace, "resid_final",
                                                             take_last(x, last).clone().to(dev))))
    with intervene(lm, items, prefill_only=prefill_only):
        yield trace
