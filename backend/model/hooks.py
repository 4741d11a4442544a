"""Capture, ablate and inject, as one context manager whose hooks always come off.

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

from .loading import LoadedModel

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


def take_last(x: torch.Tensor, last: torch.Tensor | None) -> torch.Tensor:
    """x at each row's last prompt token: (b, s, d) -> (b, d); `last` (b,) indices, None for position -1."""
    if last is None:
        return x[:, -1]
    return x[torch.arange(x.shape[0], device=x.device), last.to(x.device)]


def add_at(x: torch.Tensor, v: torch.Tensor, offsets: Sequence[int], last: torch.Tensor | None) -> torch.Tensor:
    """x + v at each row's positions `last + 1 + o` for o in `offsets` (negative: -1 is the last prompt token),
    without editing x. x (b, s, d); v (d,) or (b, d), the same at every chosen position."""
    b, s, _ = x.shape
    lst = torch.full((b,), s - 1, device=x.device) if last is None else last.to(x.device)
    sel = torch.zeros(b, s, dtype=x.dtype, device=x.device)
    for o in offsets:
        if o >= 0:
            raise ValueError(f"positions are negative offsets from the last prompt token (-1 = last), not {o}")
        pos = lst + 1 + o
        if (pos < 0).any():
            raise ValueError(f"position offset {o} reaches before the start of a prompt")
        sel = sel + torch.nn.functional.one_hot(pos, s).to(x.dtype)
    v = v.to(device=x.device, dtype=x.dtype)
    return x + sel[..., None] * (v if v.dim() == 2 else v[None])[:, None, :]


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
    inject_input: dict[int, torch.Tensor] | None = None,
    inject_positions: Sequence[int] = (-1,),
    last: torch.Tensor | None = None,
    prefill_only: bool = False,
) -> Iterator[Trace]:
    """Install hooks for one or more forward passes; they are removed on exit, exceptions included.

    capture_z: record z at the last token per layer (and, for post-attention-norm families, `write_scale`).
    capture_hidden: record each decoder layer's output and the embeddings (`embed`) at the last token.

    head_mask: (batch, layers, heads) multipliers on each head's z (1 keeps, 0 ablates), applied at the
               output projection's input at `mask_positions`; per-row, so one batch can hold many
               ablation configurations.
    head_fill: (layers, heads, head_dim) values that ablated heads take instead of 0 (mean ablation):
               z' = m * z + (1 - m) * fill.
    inject:    {layer: vector (d_model,) or (batch, d_model)} added to that decoder layer's output at
               the last token.
    inject_input: {layer: vector (d_model,) or (batch, d_model)} added to that decoder layer's *input*
               (layer 0: the embeddings) at each position of `inject_positions`.
    inject_positions: negative offsets from each row's last prompt token (-1 = the last token).
    last:      (batch,) index of each row's last prompt token; None means position -1 (left padding).
    prefill_only: interventions act on the first forward pass only (the prompt's prefill); later passes
               in the context (decoding steps over the KV cache) run untouched. Captures follow the same rule.
    """
    trace = Trace(z_last=[None] * lm.n_layers, hidden=[None] * lm.n_layers, write_scale=[None] * lm.n_layers)
    handles = []
    H, dh = lm.n_heads, lm.head_dim
    passes = [0]  # forward passes begun in this context (counted at the first decoder layer)

    def active() -> bool:
        return not prefill_only or passes[0] <= 1

    def count_pass(module, args, kwargs):
        passes[0] += 1
        if capture_hidden and active():
            trace.embed = take_last(args[0] if args else kwargs["hidden_states"], last).clone()

    def make_input_hook(layer: int):
        def pre_hook(module, args, kwargs):
            if not active() or layer not in (inject_input or {}):
                return None
            h = args[0] if args else kwargs["hidden_states"]
            h = add_at(h, inject_input[layer], inject_positions, last)
            if args:
                return (h,) + tuple(args[1:]), kwargs
            return args, {**kwargs, "hidden_states": h}
        return pre_hook

    def make_pre_hook(layer: int):
        def pre_hook(module, args, kwargs):
            if not active():
                return args, kwargs
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

    def make_post_norm_hook(layer: int):
        gain, eps = lm.post_attn_gain(layer), lm.post_attn_eps(layer)

        def pre_hook(module, args):
            if active():
                x = take_last(args[0], last).float()  # (batch, d_model): the summed head writes plus the bias
                trace.write_scale[layer] = gain.to(x.device) * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        return pre_hook

    def make_layer_hook(layer: int):
        def hook(module, args, output):
            if not active():
                return output
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
        if active():
            trace.resid_final = take_last(args[0], last).clone()

    try:
        handles.append(lm.layers[0].register_forward_pre_hook(count_pass, with_kwargs=True))
        for layer in sorted(inject_input or {}):
            if not 0 <= layer < lm.n_layers:
                raise ValueError(f"layer {layer} out of range: the model has layers 0..{lm.n_layers - 1}")
            handles.append(lm.layers[layer].register_forward_pre_hook(make_input_hook(layer), with_kwargs=True))
        if capture_z or head_mask is not None:
            for layer in range(lm.n_layers):
                handles.append(lm.o_proj(layer).register_forward_pre_hook(make_pre_hook(layer), with_kwargs=True))
        if capture_z and lm.spec.post_attn_norm:
            for layer in range(lm.n_layers):
                handles.append(lm.post_attn_norm(layer).register_forward_pre_hook(make_post_norm_hook(layer)))
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
