"""The configuration engine's fast paths (engine="auto"; see `engine.py` for what each recomputes): the clean pass of a
prompt batch, last-token configurations as one more token over its KV cache (packed side by side, or the cache
repeated over rows), and all-position configurations from their start layer on the recorded clean residual stream.
A model they cannot serve raises `Unsupported`, and the rest of the configurations run on full passes."""
from __future__ import annotations

import copy
from contextlib import contextmanager
from typing import Iterator, Sequence

import torch

from ...model.interventions import Add, HeadMask, Intervention, Record, intervene, skip_below
from ...model.loading import LoadedModel
from .stopping import check

from .batching import Batch, make_batch
from .prefix_store import STORE, batch_prefix, entries_of, fits
from .engine_rows import Emitter, halve, last_logits, Route
from .threads import cpu_threads

# A step pass (one new token per configuration) holds up to STEP_ROWS_FACTOR * batch_size (configuration,
# prompt) rows when packed (the prefix cache is shared), batch_size rows when the cache is repeated per row.
STEP_ROWS_FACTOR = 4
PACKED = True  # tests switch it off to exercise the repeated-cache step on every family
# The cost of one more pass, in tokens' worth of compute (weights read once per pass, per-layer overheads):
# grouping all-position configurations weighs it against recomputing clean layers. See `_chunks`.
PASS_OVERHEAD_TOKENS = 64
STORED_BATCH = 128  # prompts per batch when every clean prefix is kept (`prefix_store`): steps read the weights once


class Unsupported(Exception):
    """The model does something the fast paths do not handle; the rest of the configurations run on the full engine."""


def run_fast(lm: LoadedModel, ids: Sequence[Sequence[int]], routes: list[Route], fill: torch.Tensor | None,
             batch_size: int, out: Emitter, keep_prefix: bool = False) -> None:
    clean = [c for c, p in enumerate(routes) if p.kind == "clean"]
    last = [c for c, p in enumerate(routes) if p.kind == "last"]
    every = [c for c, p in enumerate(routes) if p.kind == "all"]
    order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
    done, bs = 0, batch_size
    if not every and STORE.get(lm, ids) is not None:  # no clean pass at all: the prompts in fewer, fuller steps
        bs = max(bs, min(len(ids), STORED_BATCH))
    while done < len(order):
        check()  # once per batch of prompts (`stopping`); the steps within a batch check too
        prompts = order[done:done + bs]
        try:
            _fast_batch(lm, make_batch(lm, ids, prompts), routes, clean, last, every, fill, bs, out,
                        [ids[i] for i in prompts], keep_prefix)
        except (torch.OutOfMemoryError, RuntimeError) as e:
            bs = halve(lm, e, bs)
            continue
        done += len(prompts)


def _chunks(routes: list[Route], todo: list[int], n_layers: int, tokens: int, per: int) -> list[tuple[int, list[int]]]:
    """All-position configurations in passes of at most `per`, each pass starting at its earliest start layer.

    Configurations sorted by start layer are cut into runs that minimise the modelled cost
    sum over passes of (layers run) * (PASS_OVERHEAD_TOKENS + tokens * configurations): one pass per start
    layer when prompts are long, fewer, fuller passes (recomputing a few clean layers) when they are short."""
    items = sorted(todo, key=lambda c: -routes[c].start)
    n = len(items)
    best, cut = [0.0] + [float("inf")] * n, [0] * (n + 1)
    for j in range(1, n + 1):
        layers = n_layers - routes[items[j - 1]].start
        for i in range(max(1, j - per + 1), j + 1):
            cost = best[i - 1] + layers * (PASS_OVERHEAD_TOKENS + tokens * (j - i + 1))
            if cost < best[j]:
                best[j], cut[j] = cost, i
    out, j = [], n
    while j > 0:
        i = cut[j]
        out.append((routes[items[j - 1]].start, items[i - 1:j]))
        j = i - 1
    return out[::-1]


def _fast_batch(lm: LoadedModel, batch: Batch, routes: list[Route], clean: list[int], last: list[int],
                every: list[int], fill: torch.Tensor | None, bs: int, out: Emitter,
                rows_ids: Sequence[Sequence[int]] = (), keep: bool = False) -> None:
    from transformers import DynamicCache

    P, W = batch.input_ids.shape
    dev = batch.input_ids.device
    prompts = batch.rows
    ps = torch.tensor(prompts, device=dev)
    clean = out.pending(clean, prompts) if clean else []
    last = out.pending(last, prompts) if last else []
    every = out.pending(every, prompts) if every else []
    passes = _chunks(routes, every, lm.n_layers, P * W, max(1, bs // P))
    need = sorted({s - 1 for s, _ in passes if s > 0})
    if not (clean or last or need):  # only passes from layer 0 left: no clean pass needed
        for s, chunk in passes:
            _from_layer(lm, batch, s, None, routes, chunk, fill, out)
        return
    recorded: dict[int, torch.Tensor] = {}
    stored = STORE.get(lm, rows_ids) if rows_ids and not need and batch.last is None else None
    if stored is not None:  # 1. the clean pass, kept from an earlier call
        cache, logits, at_last = batch_prefix(lm, stored, W)
    else:  # 1. the clean pass: clean logits, the prefix cache, the outputs of the layers passes restart after
        keep = keep and bool(rows_ids) and batch.last is None and fits(lm, sum(len(x) for x in rows_ids))
        cache = None
        if (last or keep) and W > 1:
            cache = DynamicCache(config=lm.model.config)
            cache.activate_past_recording()  # sliding-window layers keep what `crop` needs
        at_last: dict[int, torch.Tensor] = {}  # every layer's clean output at the last token (steps start later)
        with record_outputs(lm, need, recorded, at_last if (last or keep) else None):
            logits = last_logits(lm, batch.input_ids, batch.attention_mask, batch.position_ids, cache)
        if cache is not None:
            cache.crop(-1)
        if keep:
            entries = entries_of(cache, logits, at_last, [len(x) for x in rows_ids])
            if entries is not None:
                STORE.put(lm, rows_ids, entries)
    for c in clean:
        out.emit(logits, torch.full((P,), c, device=dev), ps, "untouched configurations")
    # 2. last-token configurations: one new token each over the prefix cache
    if last:
        _last_token(lm, batch, cache, routes, last, fill, bs, out, at_last)
    del cache, at_last
    # 3. all-position masks: from the first changed layer on, latest first
    for k, (s, chunk) in enumerate(passes):
        check()
        later = {t - 1 for t, _ in passes[k + 1:]}
        _from_layer(lm, batch, s, recorded.get(s - 1), routes, chunk, fill, out)
        if s - 1 not in later:
            recorded.pop(s - 1, None)


@contextmanager
def record_outputs(lm: LoadedModel, layers: Sequence[int], into: dict[int, torch.Tensor],
                   last_into: dict[int, torch.Tensor] | None = None) -> Iterator[None]:
    """Record the output (batch, seq, d_model) of the given decoder layers (and, into `last_into`, every layer's
    output at the last position, (batch, 1, d_model)); every layer's output must be a plain tensor (`Unsupported`)."""
    def keep(layer: int | None, h: torch.Tensor) -> None:
        if layer in layers:
            into[layer] = h
        if last_into is not None:
            last_into[layer] = h[:, -1:].clone()

    with intervene(lm, [Record("layer_out", keep)]) as seen:
        yield
    if seen.odd_outputs:
        raise Unsupported(f"decoder layers return {seen.odd_outputs[0]}, not a tensor")


def _edits(masks: dict[int, torch.Tensor], fill: torch.Tensor | None, inject: dict[int, torch.Tensor],
           last_only: bool, n_layers: int) -> list[Intervention]:
    """masks[l]: multipliers broadcastable to (batch, seq, heads) at layer l's z (`HeadMask`: z' = m z + (1 - m)
    fill); inject[l]: added at the input of layer l (n_layers: the final norm's input) at every position,
    broadcastable to (batch, seq, d_model), or (`last_only`) at the last one, broadcastable to (batch, d_model)."""
    at = "last" if last_only else "all"
    inner = {l: v for l, v in inject.items() if l < n_layers}
    final = [Add("final_in", {None: inject[n_layers]}, at=at)] if n_layers in inject else []  # type: ignore[dict-item]
    return [HeadMask(masks, fill), Add("layer_in", inner, at=at), *final]


def _stack(lm: LoadedModel, routes: list[Route], chunk: Sequence[int]) -> tuple[dict[int, torch.Tensor],
                                                                                 dict[int, torch.Tensor]]:
    """Per layer, the chunk's masks (c, heads) and vectors (c, d_model), only where some configuration acts."""
    L, H, d, dev = lm.n_layers, lm.n_heads, lm.d_model, lm.device
    masks, vecs = {}, {}
    ml = [routes[c].mask for c in chunk]
    if any(m is not None for m in ml):
        ones = torch.ones(L, H, device=dev)
        full = torch.stack([ones if m is None else m for m in ml])  # (c, L, H)
        for layer in (full != 1).any(2).any(0).nonzero().flatten().tolist():
            masks[layer] = full[:, layer]
    zero = torch.zeros(d, device=dev)
    for layer in sorted({l for c in chunk for l in (routes[c].inject or {})}):
        vecs[layer] = torch.stack([(routes[c].inject or {}).get(layer, zero) for c in chunk])
    return masks, vecs


def shallow_cache(cache):
    """A copy of a DynamicCache whose layers can be extended without touching the original's tensors
    (dynamic layers rebind, never write in place)."""
    c = copy.copy(cache)
    c.layers = [copy.copy(layer) for layer in cache.layers]
    return c


def packed_mask(lm: LoadedModel, batch: Batch, cache, c: int) -> torch.Tensor | None:
    """The 4D mask of a packed step of `c` new tokens per row (each sees the prefix and itself), or None when
    one mask cannot serve every layer or the attention kernel takes no 4D mask."""
    impl = getattr(lm.model.config, "_attn_implementation", None)
    if not PACKED or impl not in ("sdpa", "eager"):
        return None
    P, W = batch.input_ids.shape
    dev = batch.input_ids.device
    if cache is None:
        offset = 0
        prefix = batch.attention_mask[:, :0].bool()
    else:
        sizes = {cache.get_mask_sizes(c, layer) for layer in range(len(cache.layers))}
        if len(sizes) != 1:
            return None
        kv_length, offset = sizes.pop()
        if offset + kv_length - c != W - 1:
            return None
        prefix = batch.attention_mask[:, offset:W - 1].bool()
    eye = torch.eye(c, dtype=torch.bool, device=dev)
    m = torch.cat([prefix[:, None, :].expand(P, c, prefix.shape[1]), eye[None].expand(P, c, c)], dim=-1)[:, None]
    if impl == "eager":
        return torch.zeros(m.shape, dtype=lm.dtype, device=dev).masked_fill(~m, torch.finfo(lm.dtype).min)
    return m


def _last_token(lm: LoadedModel, batch: Batch, cache, routes: list[Route], todo: list[int],
                fill: torch.Tensor | None, bs: int, out: Emitter, at_last: dict[int, torch.Tensor]) -> None:
    """Each configuration as one new token (the prompt's last) over the clean prefix cache. Configurations go in
    order of their start layer s; a step runs layers >= s of its chunk's earliest s only (layer s - 1 returns its
    clean output at the last token, `at_last`).

    The steps are small passes (one token per row): their ops split badly over torch's intra-op threads, and on
    a shared CPU the threads wait for each other (bench/RESULTS.md: 1.5-2 CPU-s against 0.26 on one thread for
    16 configurations x 4 prompts at load 15). So they run at the thread count the model's small passes run
    fastest with (`threads.cpu_threads`, measured and cached); the clean pass keeps torch's setting."""
    with cpu_threads(lm):
        _step_passes(lm, batch, cache, routes, todo, fill, bs, out, at_last)


def _step_passes(lm: LoadedModel, batch: Batch, cache, routes: list[Route], todo: list[int], fill: torch.Tensor | None,
                 bs: int, out: Emitter, at_last: dict[int, torch.Tensor]) -> None:
    """`_last_token`'s step passes, at the current thread count."""
    P, W = batch.input_ids.shape
    dev = batch.input_ids.device
    ps = torch.tensor(batch.rows, device=dev)
    tok, pos = batch.input_ids[:, -1:], batch.position_ids[:, -1:]
    per = max(1, STEP_ROWS_FACTOR * bs // P)
    todo = sorted(todo, key=lambda c: routes[c].start)
    k = 0
    while k < len(todo):
        check()  # once per step of configurations
        chunk = todo[k:k + per]
        c = len(chunk)
        mask4 = packed_mask(lm, batch, cache, c)
        if mask4 is None and c * P > bs and c > 1:  # the repeated cache holds at most bs rows
            per = max(1, bs // P)
            continue
        masks, vecs = _stack(lm, routes, chunk)
        step = None if cache is None else shallow_cache(cache)
        cs = torch.tensor(chunk, device=dev)
        start = min(routes[i].start for i in chunk)
        rec = at_last.get(start - 1) if start > 0 else None
        if rec is None:
            start = 0
        if mask4 is not None:  # packed: row p holds configurations chunk[0..c) side by side
            masks = {l: m[None] for l, m in masks.items()}  # (1, c, H)
            vecs = {l: v[None] for l, v in vecs.items()}  # (1, c, d)
            with intervene(lm, [skip_below(start, None if rec is None else rec.expand(P, c, rec.shape[-1])),
                                *_edits(masks, fill, vecs, last_only=False, n_layers=lm.n_layers)]):
                o = lm.model(input_ids=tok.expand(P, c), attention_mask=mask4, position_ids=pos.expand(P, c),
                             cache=step, use_cache=step is not None, logits_to_keep=0)
            logits = o.logits.reshape(P * c, -1)
            out.emit(logits, cs.repeat(P), ps.repeat_interleave(c), "last-token configurations")
        else:  # repeated cache: row p * c + j is prompt p under configuration chunk[j]
            if step is not None:
                step.batch_repeat_interleave(c)
            masks = {l: m.repeat(P, 1)[:, None] for l, m in masks.items()}  # (P c, 1, H)
            vecs = {l: v.repeat(P, 1)[:, None] for l, v in vecs.items()}  # (P c, 1, d)
            with intervene(lm, [skip_below(start, None if rec is None else rec.repeat_interleave(c, 0)),
                                *_edits(masks, fill, vecs, last_only=False, n_layers=lm.n_layers)]):
                logits = last_logits(lm, tok.repeat_interleave(c, 0), batch.attention_mask.repeat_interleave(c, 0),
                                      pos.repeat_interleave(c, 0), step)
            out.emit(logits, cs.repeat(P), ps.repeat_interleave(c), "last-token configurations")
        k += c


def _from_layer(lm: LoadedModel, batch: Batch, start: int, clean_out: torch.Tensor | None, routes: list[Route],
                chunk: list[int], fill: torch.Tensor | None, out: Emitter) -> None:
    """One pass of all-position configurations (none changes a layer before `start`) from that layer on."""
    P, W = batch.input_ids.shape
    dev = batch.input_ids.device
    ps = torch.tensor(batch.rows, device=dev)
    c = len(chunk)
    masks, vecs = _stack(lm, routes, chunk)  # row j * P + p is prompt p under configuration chunk[j]
    masks = {l: m.repeat_interleave(P, 0)[:, None] for l, m in masks.items()}  # (c P, 1, H): all positions
    vecs = {l: v.repeat_interleave(P, 0) for l, v in vecs.items()}  # (c P, d), last token
    rec = None if clean_out is None else clean_out.repeat(c, 1, 1)
    with intervene(lm, [skip_below(start, rec), *_edits(masks, fill, vecs, last_only=True, n_layers=lm.n_layers)]):
        logits = last_logits(lm, batch.input_ids.repeat(c, 1), batch.attention_mask.repeat(c, 1),
                              batch.position_ids.repeat(c, 1))
    cs = torch.tensor(chunk, device=dev).repeat_interleave(P)
    out.emit(logits, cs, ps.repeat(c), f"configurations from layer {start}")
