"""Vectors added at one decoder layer's input at the last prompt token, run over the clean prefix's KV cache.

With a vector v added to the input of decoder layer l at the last prompt token only, every earlier position is
the clean run's, and so is the last token's residual stream below layer l. One clean pass of a prompt batch
keeps its KV cache (cut back to the prefix: all tokens but the last), the last token's input of layer l, h_l
(batch, d_model), and the final norm's input there (the clean final state). Each vector is then one more token
over that cache through layers l .. L-1 only:

    input of layer l at the last token  <-  h_l + v        (layers < l pass their input through unread)

"Packed" steps put many vectors side by side on the sequence axis of one row per prompt (same position id; the
engine's 4D mask lets each see the prefix and itself only); where one 4D mask cannot serve every layer, or the
attention kernel takes none, the cache is repeated over rows instead (`engine.packed_mask`). A vector costs about
(L - l) / (L T) of a full pass over prompts of T tokens, and no unembedding.

    final_change(lm, ids, layer, vectors)  # (n, d_model): mean over prompts of h_final(v_i) - h_final(clean)

is what linear propagation fits W to (`propagation.linear_propagation`); None where the model's decoder layers do
not return plain tensors (the caller then runs full passes, the reference).

A training over the same prompts (`learn.train_injection`) keeps each prompt's prefix once (`clean_prefixes`, no
autograd) and runs every gradient step as that one token (`step_logits`): the backward pass reaches layers >= l of
the last token only.
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Callable, ContextManager, Iterator, Sequence

import torch

from ...model.interventions import Add, Intervention, Record, Replace, Skip, intervene, skip_below
from ...model.loading import LoadedModel
from .stopping import check
from .batching import Batch, Progress, make_batch
from .engine_fast import packed_mask, record_outputs, shallow_cache, Unsupported
from .engine_rows import halve

STEP_ROWS = 2048  # (vector, prompt) rows per step pass at most ...
MAX_PACK = 64  # ... and at most this many vectors side by side in one packed row


def _at_layer_input(layer: int, new_input: torch.Tensor) -> list[Intervention | Skip]:
    """Decoder layers < `layer` pass their input through; `layer` reads `new_input` instead of its input."""
    return [skip_below(layer), Replace("layer_in", layer, new_input)]


def _final_input(into: list[torch.Tensor]) -> Record:
    """Record the final norm's input (batch, seq, d_model) of each forward pass in into[0]."""
    return Record("final_in", lambda _, x: into.__setitem__(slice(None), [x]))


def _clean(lm: LoadedModel, batch: Batch, layer: int):
    """The clean pass of a batch: (prefix cache or None for one-token prompts, h_l (P, d), final state (P, d))."""
    from transformers import DynamicCache

    W = batch.input_ids.shape[1]
    cache = None
    if W > 1:
        cache = DynamicCache(config=lm.model.config)
        cache.activate_past_recording()  # sliding-window layers keep what `crop` needs
    got: dict[str, torch.Tensor] = {}
    final: list[torch.Tensor] = []
    with intervene(lm, [Record("layer_in", lambda _, x: got.__setitem__("h", x[:, -1]), at=[layer])]), \
            record_outputs(lm, [], {}), intervene(lm, [_final_input(final)]):
        lm.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids,
                 cache=cache, use_cache=cache is not None, logits_to_keep=1)
    if cache is not None:
        cache.crop(-1)
    return cache, got["h"], final[0][:, -1].float()


def _steps(lm: LoadedModel, batch: Batch, cache, layer: int, h: torch.Tensor, vectors: torch.Tensor,
           rows: int) -> Iterator[tuple[int, int, torch.Tensor]]:
    """(first vector, count c, final states (c, P, d) float32) of the vectors over one batch, chunk by chunk."""
    P = batch.input_ids.shape[0]
    tok, pos = batch.input_ids[:, -1:], batch.position_ids[:, -1:]
    n = vectors.shape[0]
    per = max(1, min(MAX_PACK, rows // P))
    k = 0
    while k < n:
        check()  # once per chunk of vectors (`stopping`)
        c = min(per, n - k)
        v = vectors[k:k + c].to(lm.device, torch.float32)  # (c, d)
        step = None if cache is None else shallow_cache(cache)
        mask4 = packed_mask(lm, batch, step, c)
        final: list[torch.Tensor] = []
        if mask4 is not None:  # row p holds vectors k..k+c side by side
            x = (h.float()[:, None, :] + v[None]).to(lm.dtype)  # (P, c, d)
            with intervene(lm, [*_at_layer_input(layer, x), _final_input(final)]):
                lm.model(input_ids=tok.expand(P, c), attention_mask=mask4, position_ids=pos.expand(P, c), cache=step,
                         use_cache=step is not None, logits_to_keep=1)
            out = final[0].float().transpose(0, 1)  # (c, P, d)
        else:  # repeated cache: row p * c + j is prompt p under vector k + j
            if c * P > rows and c > 1:
                per = max(1, rows // P)
                continue
            if step is not None:
                step.batch_repeat_interleave(c)
            x = (h.float().repeat_interleave(c, 0) + v.repeat(P, 1)).to(lm.dtype)[:, None]  # (P c, 1, d)
            with intervene(lm, [*_at_layer_input(layer, x), _final_input(final)]):
                lm.model(input_ids=tok.repeat_interleave(c, 0), attention_mask=batch.attention_mask.repeat_interleave(
                    c, 0), position_ids=pos.repeat_interleave(c, 0), cache=step, use_cache=step is not None,
                    logits_to_keep=1)
            out = final[0][:, -1].float().reshape(P, c, -1).transpose(0, 1)  # (c, P, d)
        yield k, c, out
        k += c


def final_change(lm: LoadedModel, ids: Sequence[Sequence[int]], layer: int, vectors: torch.Tensor,
                 batch_size: int = 64, rows: int = STEP_ROWS, progress: Progress | None = None) -> torch.Tensor | None:
    """Mean over prompts of h_final(v_i) - h_final(clean), (n, d_model) float32 on the CPU, for vectors v_i (n,
    d_model) added at the input of decoder `layer` at the last prompt token; h_final is the final norm's input at
    the last token. None where the model's layers do not fit the fast path (run full passes instead)."""
    if not 0 <= layer < lm.n_layers:
        raise ValueError(f"layer {layer} out of range: the model has layers 0..{lm.n_layers - 1}")
    n, d = vectors.shape
    if d != lm.d_model:
        raise ValueError(f"vectors of width {d}, expected d_model {lm.d_model}")
    total = torch.zeros(n, d, dtype=torch.float64)
    order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
    done, bs = 0, batch_size
    with lm.lock, torch.inference_mode():
        while done < len(order):
            check()  # once per batch; the steps within it check per chunk
            prompts = order[done:done + bs]
            batch = make_batch(lm, ids, prompts)
            part = torch.zeros(n, d, dtype=torch.float64)
            try:
                cache, h, base = _clean(lm, batch, layer)
                for k, c, states in _steps(lm, batch, cache, layer, h, vectors, max(rows, bs)):
                    part[k:k + c] = (states - base[None]).double().sum(1).cpu()
                    if progress:
                        progress((done + len(prompts) * (k + c) / n) / len(order), "last-token passes")
            except Unsupported:
                return None
            except (torch.OutOfMemoryError, RuntimeError) as e:
                bs = halve(lm, e, bs)
                rows = max(1, rows // 2)
                continue
            total += part
            done += len(prompts)
    return (total / len(order)).float()


# -- many steps over the same prompts (a training) -------------------------------------------------------------------
class Prefixes:
    """Each prompt's clean prefix (per layer, keys and values (kv_heads, T - 1, head_dim)) and its last token's
    input of `layer` (d_model,), computed once without autograd, for the many gradient steps of a training over
    the same prompts (`step_logits`). Built by `clean_prefixes`."""

    def __init__(self, lm: LoadedModel, ids: Sequence[Sequence[int]], layer: int):
        self.lm, self.ids, self.layer = lm, [list(x) for x in ids], layer
        self.keys: list[list[torch.Tensor]] = [[] for _ in ids]
        self.values: list[list[torch.Tensor]] = [[] for _ in ids]
        self.h = torch.zeros(len(ids), lm.d_model, dtype=lm.dtype, device=lm.device)


def clean_prefixes(lm: LoadedModel, ids: Sequence[Sequence[int]], layer: int, batch_size: int = 32) -> Prefixes | None:
    """The prompts' `Prefixes` at `layer` (one clean pass each, under no_grad: the tensors may enter a backward
    pass); None where the model's layers do not fit (then train with full passes)."""
    pre = Prefixes(lm, ids, layer)
    order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
    with lm.lock, torch.no_grad():
        for s in range(0, len(order), batch_size):
            check()  # once per batch (`stopping`)
            rows = order[s:s + batch_size]
            batch = make_batch(lm, ids, rows)
            try:
                cache, h, _ = _clean(lm, batch, layer)
            except Unsupported:
                return None
            W = batch.input_ids.shape[1]
            for i, r in enumerate(rows):
                keep = slice(W - len(ids[r]), W - 1)
                layers = cache.layers if cache is not None else []
                if any(getattr(c, "keys", None) is None or c.keys.shape[-2] != W - 1 for c in layers):
                    return None  # a sliding window shorter than the prompts keeps only part of the prefix
                pre.keys[r] = [c.keys[i, :, keep].clone() for c in layers]
                pre.values[r] = [c.values[i, :, keep].clone() for c in layers]
                pre.h[r] = h[i]
    return pre


def step_logits(pre: Prefixes, rows: Sequence[int], inject: dict[int, torch.Tensor] | None = None,
                hooks: Callable[[int], ContextManager[Any]] | None = None) -> torch.Tensor:
    """Last-token logits (rows, vocab) float32 of prompts `rows` with `inject` ({layer >= pre.layer: (d_model,)})
    added at those layers' inputs at the last token, and/or inside `hooks(n_rows)` (hooks acting at the last token,
    at layers >= pre.layer): one token over each prompt's clean prefix, from `pre.layer` on. Runs no inference mode
    of its own: gradients flow to the injected vectors and through the hooks."""
    from transformers import DynamicCache

    lm = pre.lm
    inject = inject or {}
    if any(l < pre.layer for l in inject):
        raise ValueError(f"vectors below layer {pre.layer} need their own prefixes")
    rows = list(rows)
    batch = make_batch(lm, pre.ids, rows)
    W = batch.input_ids.shape[1]
    cache = None
    if W > 1:
        cache = DynamicCache(config=lm.model.config)
        for l in range(len(pre.keys[rows[0]])):
            k0 = pre.keys[rows[0]][l]
            keys = torch.zeros(len(rows), k0.shape[0], W - 1, k0.shape[-1], dtype=k0.dtype, device=k0.device)
            values = torch.zeros_like(keys)
            for i, r in enumerate(rows):
                n = pre.keys[r][l].shape[1]
                keys[i, :, W - 1 - n:] = pre.keys[r][l]
                values[i, :, W - 1 - n:] = pre.values[r][l]
            cache.update(keys, values, l)
    x = pre.h[rows][:, None, :]  # (rows, 1, d): the clean input of pre.layer at the last token
    with intervene(lm, [*_at_layer_input(pre.layer, x), Add("layer_in", inject, at=(-1,))]), \
            (hooks(len(rows)) if hooks is not None else nullcontext()):
        o = lm.model(input_ids=batch.input_ids[:, -1:], attention_mask=batch.attention_mask,
                     position_ids=batch.position_ids[:, -1:], cache=cache, use_cache=cache is not None,
                     logits_to_keep=1)
    return o.logits[:, -1].float()
