"""Capture, ablate and inject, as one context manager whose hooks always come off.

Batches are normally left-padded, so the last prompt token of every row sits at sequence position -1;
with right padding, pass each row's last index as `last`.
The hooks never run under their own `torch.inference_mode` and never edit an activation in place, so
the same code works under autograd (a trained vector or per-head alpha flows through them).
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, Literal

import torch

from .models import LoadedModel

Positions = Literal["all", "last"]


@dataclass
class Trace:
    """What a hooked forward pass recorded.

    z_last:      per layer, the output projection's input at the last token, (batch, heads * head_dim).
    resid_final: the final norm's input at the last token, (batch, d_model).
    hidden:      per layer, the decoder layer's output at the last token, (batch, d_model).
    """

    z_last: list[torch.Tensor | None] = field(default_factory=list)
    resid_final: torch.Tensor | None = None
    hidden: list[torch.Tensor | None] = field(default_factory=list)

    def z(self, heads: int) -> torch.Tensor:
        """Stacked last-token head inputs, shape (batch, layers, heads, head_dim)."""
        zs = torch.stack([t for t in self.z_last if t is not None], dim=1)
        return zs.reshape(zs.shape[0], zs.shape[1], heads, -1)


def take_last(x: torch.Tensor, last: torch.Tensor | None) -> torch.Tensor:
    """x at each row's last prompt token: (b, s, d) -> (b, d); `last` (b,) indices, None for position -1."""
    if last is None:
        return x[:, -1]
    return x[torch.arange(x.shape[0], device=x.device), last.to(x.device)]


def replace_last(x: torch.Tensor, new: torch.Tensor, last: torch.Tensor | None) -> torch.Tensor:
    """x with each row's last prompt token replaced by `new`, without editing x: (b, s, d), (b, d)."""
    new = new.to(x.dtype)
    if last is None:
        return torch.cat([x[:, :-1], new.unsqueeze(1)], dim=1)
    sel = torch.nn.functional.one_hot(last.to(x.device), x.shape[1]).bool()[..., None]  # (b, s, 1)
    return torch.where(sel, new[:, None], x)


@contextmanager
def hooked(
    lm: LoadedModel,
    *,
    capture_z: bool = False,
    capture_resid_final: bool = False,
    capture_hidden: bool = False,
    head_mask: torch.Tensor | None = None,
    head_fill: torch.Tensor | None = None,
    mask_positions: Positions = "all",
    inject: dict[int, torch.Tensor] | None = None,
    last: torch.Tensor | None = None,
) -> Iterator[Trace]:
    """Install hooks for one or more forward passes; they are removed on exit, exceptions included.

    head_mask: (batch, layers, heads) multipliers on each head's z (1 keeps, 0 ablates), applied at the
               output projection's input at `mask_positions`; per-row, so one batch can hold many
               ablation configurations.
    head_fill: (layers, heads, head_dim) values that ablated heads take instead of 0 (mean ablation):
               z' = m * z + (1 - m) * fill.
    inject:    {layer: vector (d_model,) or (batch, d_model)} added to that decoder layer's output at
               the last token.
    last:      (batch,) index of each row's last prompt token; None means position -1 (left padding).
    """
    trace = Trace(z_last=[None] * lm.n_layers, hidden=[None] * lm.n_layers)
    handles = []
    H, dh = lm.n_heads, lm.head_dim

    def make_pre_hook(layer: int):
        def pre_hook(module, args, kwargs):
            z = args[0] if args else kwargs["hidden_states"]
            if head_mask is not None:
                m = head_mask[:, layer].to(z.dtype)  # (batch, H)
                b, s, _ = z.shape
                if mask_positions == "last":
                    zl = take_last(z, last).reshape(b, H, dh)
                    fill = 0 if head_fill is None else head_fill[layer].to(z.dtype)
                    zl = m[..., None] * zl + (1 - m[..., None]) * fill
                    z = replace_last(z, zl.reshape(b, H * dh), last)
                else:
                    zz = z.reshape(b, s, H, dh)
                    fill = 0 if head_fill is None else head_fill[layer].to(z.dtype)
                    zz = m[:, None, :, None] * zz + (1 - m[:, None, :, None]) * fill
                    z = zz.reshape(b, s, H * dh)
                args = (z,) + tuple(args[1:]) if args else args
                if not args:
                    kwargs = {**kwargs, "hidden_states": z}
            if capture_z:
                trace.z_last[layer] = take_last(z, last).clone()
            return args, kwargs
        return pre_hook

    def make_layer_hook(layer: int):
        def hook(module, args, output):
            h = output[0] if isinstance(output, tuple) else output
            if inject is not None and layer in inject:
                v = inject[layer].to(h.device)
                h = replace_last(h, take_last(h, last) + v.to(h.dtype), last)
                output = (h,) + tuple(output[1:]) if isinstance(output, tuple) else h
            if capture_hidden:
                trace.hidden[layer] = take_last(h, last).clone()
            return output
        return hook

    def final_pre_hook(module, args):
        trace.resid_final = take_last(args[0], last).clone()

    try:
        if capture_z or head_mask is not None:
            for layer in range(lm.n_layers):
                handles.append(lm.o_proj(layer).register_forward_pre_hook(make_pre_hook(layer), with_kwargs=True))
        if inject or capture_hidden:
            for layer in range(lm.n_layers):
                if capture_hidden or layer in (inject or {}):
                    handles.append(lm.layers[layer].register_forward_hook(make_layer_hook(layer)))
        if capture_resid_final:
            handles.append(lm.final_norm.register_forward_pre_hook(final_pre_hook))
        yield trace
    finally:
        for h in handles:
            h.remove()
