"""Clean prefix states of prompts kept in memory between calls, so a last-token intervention on a prompt set the
service has already run is one token step per prompt, not a full pass (the Ablation page's live toggle).

Per prompt (its token ids, on one model), an `Entry` holds what the configuration engine's last-token path needs from the
clean pass: the KV cache of the prefix (all tokens but the last), per layer (kv_heads, T - 1, head_dim); the clean
last-token logits (vocab,); each decoder layer's clean output at the last token (layers, d_model); and, where the
pass captured it, the last token's z (layers, heads, head_dim) (the mean-ablation fill).

Entries are keyed by the model's fingerprint, dtype, device and attention kernel and the prompt's token ids, kept
least-recently-used first out within `HEADLENS_PREFIX_CACHE_MB` (default 512 MB) in all; a prompt set larger than
that is not kept. `batch_prefix` assembles a left-padded batch's cache from its prompts' entries.
"""
from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

import torch

from ...errors import BadInput
from ...model.interventions import Record, intervene
from ...model.loading import LoadedModel

DEFAULT_MB = 512


@dataclass
class Entry:
    keys: list[torch.Tensor]  # per layer (kv_heads, T - 1, head_dim)
    values: list[torch.Tensor]
    logits: torch.Tensor  # (vocab,) float32
    at_last: torch.Tensor  # (layers, d_model): each layer's clean output at the last token
    z: torch.Tensor | None = None  # (layers, heads, head_dim): the last token's z, when captured

    @property
    def nbytes(self) -> int:
        ts = [*self.keys, *self.values, self.logits, self.at_last] + ([self.z] if self.z is not None else [])
        return sum(t.numel() * t.element_size() for t in ts)


def budget_bytes() -> int:
    """HEADLENS_PREFIX_CACHE_MB (megabytes; 0 keeps nothing), else DEFAULT_MB."""
    raw = os.environ.get("HEADLENS_PREFIX_CACHE_MB", "").strip()
    try:
        mb = float(raw) if raw else DEFAULT_MB
    except ValueError:
        raise BadInput(f"HEADLENS_PREFIX_CACHE_MB must be a number of megabytes, not {raw[:40]!r}") from None
    return max(0, int(mb * 2 ** 20))


def frozen(lm: LoadedModel) -> bool:
    """Whether the model's weights are fixed (eval mode, no parameter gradients): a model in training keeps its
    fingerprint while its weights change, so nothing computed from it is kept."""
    first = next(lm.model.parameters(), None)
    return not lm.model.training and (first is None or not first.requires_grad)


def prompt_key(lm: LoadedModel, ids: Sequence[int]) -> str:
    impl = getattr(lm.model.config, "_attn_implementation", None)
    h = hashlib.sha1(f"{lm.fingerprint}|{lm.dtype}|{lm.device}|{impl}|".encode())
    h.update(torch.tensor(list(ids), dtype=torch.int64).numpy().tobytes())
    return h.hexdigest()


class PrefixStore:
    """Entries by `prompt_key`, least recently used first out, within a byte budget."""

    def __init__(self) -> None:
        self._entries: OrderedDict[str, Entry] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, lm: LoadedModel, prompts: Sequence[Sequence[int]]) -> list[Entry] | None:
        """Every prompt's entry, or None when one is missing (or the model is in training)."""
        if not frozen(lm):
            return None
        keys = [prompt_key(lm, x) for x in prompts]
        with self._lock:
            found = [self._entries.get(k) for k in keys]
            if any(e is None for e in found):
                return None
            for k in keys:
                self._entries.move_to_end(k)
        return found  # type: ignore[return-value]

    def holds(self, lm: LoadedModel, prompts: Sequence[Sequence[int]], z: bool = False) -> bool:
        """Whether every prompt has its entry (with its z, if `z`), without marking them used: what an estimate
        asks before a job runs."""
        if not frozen(lm):
            return False
        keys = [prompt_key(lm, x) for x in prompts]
        with self._lock:
            found = [self._entries.get(k) for k in keys]
        return all(e is not None and (not z or e.z is not None) for e in found)

    def put(self, lm: LoadedModel, prompts: Sequence[Sequence[int]], entries: Sequence[Entry]) -> bool:
        """Keep the entries (a set larger than the budget is not kept); True when kept."""
        budget = budget_bytes()
        size = sum(e.nbytes for e in entries)
        if size > budget or not frozen(lm):
            return False
        with self._lock:
            for x, e in zip(prompts, entries):
                k = prompt_key(lm, x)
                old = self._entries.pop(k, None)
                if old is not None:
                    self._bytes -= old.nbytes
                    if e.z is None:
                        e.z = old.z
                self._entries[k] = e
                self._bytes += e.nbytes
            while self._bytes > budget and self._entries:
                _, gone = self._entries.popitem(last=False)
                self._bytes -= gone.nbytes
        return True

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    @property
    def nbytes(self) -> int:
        return self._bytes


STORE = PrefixStore()


def fits(lm: LoadedModel, n_tokens: int) -> bool:
    """Whether the prefix caches of prompts of `n_tokens` tokens in all fit the budget (checked before a pass
    spends memory on them)."""
    per_token = 2 * lm.n_layers * lm.n_kv_heads * lm.head_dim * lm.dtype.itemsize
    return n_tokens * per_token <= budget_bytes() and frozen(lm)


def entries_of(cache, logits: torch.Tensor, at_last: dict[int, torch.Tensor], lengths: Sequence[int],
               z: torch.Tensor | None = None, width: int | None = None) -> list[Entry] | None:
    """Per-prompt entries from a left-padded batch's clean pass: `cache` cut to the prefix (width W - 1), logits
    (batch, vocab), at_last {layer: (batch, 1, d_model)}, the prompts' lengths, z (batch, layers, heads, head_dim)
    or None; `width` W, the batch's width (default: its longest prompt; wider when the rows are a slice of a
    wider batch). None when a layer does not hold the whole prefix (a sliding window shorter than the prompts)."""
    W = width or max(lengths)
    layers = cache.layers if cache is not None else []
    if any(getattr(layer, "keys", None) is None or layer.keys.shape[-2] != W - 1 for layer in layers):
        return None
    hidden = torch.cat([at_last[l] for l in sorted(at_last)], dim=1)  # (batch, layers, d)
    out = []
    for i, n in enumerate(lengths):
        keep = slice(W - n, W - 1)
        out.append(Entry([layer.keys[i, :, keep].clone() for layer in layers],
                         [layer.values[i, :, keep].clone() for layer in layers],
                         logits[i].float().clone(), hidden[i].clone(), None if z is None else z[i].clone()))
    return out


def batch_prefix(lm: LoadedModel, entries: Sequence[Entry], width: int):
    """(cache, logits (batch, vocab), at_last {layer: (batch, 1, d_model)}) of a left-padded batch of width
    `width` from its prompts' entries (None for the cache of one-token prompts)."""
    from transformers import DynamicCache

    logits = torch.stack([e.logits for e in entries])
    hidden = torch.stack([e.at_last for e in entries])  # (batch, layers, d)
    at_last = {l: hidden[:, l:l + 1] for l in range(hidden.shape[1])}
    if width <= 1:
        return None, logits, at_last
    cache = DynamicCache(config=lm.model.config)
    P = len(entries)
    for l in range(len(entries[0].keys)):
        k0 = entries[0].keys[l]
        keys = torch.zeros(P, k0.shape[0], width - 1, k0.shape[-1], dtype=k0.dtype, device=k0.device)
        values = torch.zeros_like(keys)
        for i, e in enumerate(entries):
            n = e.keys[l].shape[1]
            keys[i, :, width - 1 - n:] = e.keys[l]
            values[i, :, width - 1 - n:] = e.values[l]
        cache.update(keys, values, l)
    return cache, logits, at_last


def stored_z_mean(lm: LoadedModel, prompts: Sequence[Sequence[int]]) -> torch.Tensor | None:
    """The mean last-token z over the prompts (layers, heads, head_dim) from their entries, or None when one is
    missing or has none."""
    found = STORE.get(lm, prompts)
    if found is None or any(e.z is None for e in found):
        return None
    return torch.stack([e.z.double() for e in found]).mean(0).float()


class _Pending:
    """A clean pass's prefix state, stored once the caller has the z it captured (`store`)."""

    def __init__(self, lm: LoadedModel, prompts: Sequence[Sequence[int]], cache, logits: torch.Tensor,
                 at_last: dict[int, torch.Tensor], width: int):
        self.lm, self.prompts, self.cache, self.logits, self.at_last = lm, prompts, cache, logits, at_last
        self.width = width

    def store(self, z: torch.Tensor | None = None) -> bool:
        if self.cache is not None:
            self.cache.crop(-1)
        entries = entries_of(self.cache, self.logits, self.at_last, [len(x) for x in self.prompts], z, self.width)
        return entries is not None and STORE.put(self.lm, self.prompts, entries)


def clean_forward(lm: LoadedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                  position_ids: torch.Tensor, prompts: Sequence[Sequence[int]] | None = None
                  ) -> tuple[torch.Tensor, _Pending | None]:
    """Last-token logits (batch, vocab) float32 of a left-padded batch; with `prompts` (the rows' token ids), also
    the prefix state to keep (`.store(z)`), or None where the model's layers do not return plain tensors."""
    from transformers import DynamicCache

    W = input_ids.shape[1]
    if prompts is None:
        o = lm.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False,
                     logits_to_keep=1)
        return o.logits[:, -1].float(), None
    cache = None
    if W > 1:
        cache = DynamicCache(config=lm.model.config)
        cache.activate_past_recording()
    at_last: dict[int, torch.Tensor] = {}
    keep = Record("layer_out", lambda layer, h: at_last.__setitem__(layer, h[:, -1:].detach().clone()))
    with intervene(lm, [keep]) as seen:
        o = lm.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, cache=cache,
                     use_cache=cache is not None, logits_to_keep=1)
    logits = o.logits[:, -1].float()
    return logits, (None if seen.odd_outputs else _Pending(lm, prompts, cache, logits, at_last, W))
