"""Induction (prefix-matching) scores on repeated random tokens.

A batch of random token sequences r of length n is repeated: [bos] r r. For query position i in the
second copy, the induction target is the token after i's first occurrence. The score of head (l, h) is
the mean attention probability on those targets, over positions and the batch: (layers, heads).
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

import numpy as np
import torch

from ...model.loading import LoadedModel
from .prefix_store import frozen


@contextmanager
def eager_attention(lm: LoadedModel) -> Iterator[None]:
    """Switch the model to eager attention (which returns probabilities), and back."""
    cfg = lm.model.config
    before = getattr(cfg, "_attn_implementation", None) or "sdpa"
    if before == "eager":
        yield
        return
    lm.model.set_attn_implementation("eager")
    try:
        yield
    finally:
        lm.model.set_attn_implementation(before)


def random_repeated_tokens(lm: LoadedModel, n: int, batch: int, seed: int, bos: bool = True) -> tuple[torch.Tensor, int]:
    """(batch, offset + 2n) ids: BOS (when the tokenizer has one and `bos`), then n random non-special tokens
    twice. Returns (ids, offset)."""
    tok = lm.tokenizer
    vocab = min(len(tok), lm.unembed.shape[0])
    special = set(tok.all_special_ids)
    allowed = torch.tensor([i for i in range(vocab) if i not in special])
    g = torch.Generator().manual_seed(seed)
    r = allowed[torch.randint(len(allowed), (batch, n), generator=g)]
    ids = torch.cat([r, r], dim=1)
    bos_id = tok.bos_token_id if bos else None
    if bos_id is not None:
        ids = torch.cat([torch.full((batch, 1), bos_id), ids], dim=1)
    return ids, int(bos_id is not None)


def induction_length(lm: LoadedModel, n: int = 50) -> int:
    """Length of the repeated sequence: n, shortened so that [bos] r r fits the trained context."""
    if lm.max_positions:
        n = min(n, (lm.max_positions - 1) // 2)
    return max(2, n)


_MEMO: dict[tuple, np.ndarray] = {}
_MEMO_LOCK = threading.Lock()


def induction_scores(lm: LoadedModel, n: int = 50, batch: int = 4, seed: int = 0, bos: bool = True) -> np.ndarray:
    """Prefix-matching score per head, (layers, heads), from one eager pass with attention probabilities. They
    depend on the model alone (not the task): computed once per (frozen) model and arguments in a process."""
    key = (lm.fingerprint, str(lm.device), str(lm.dtype), n, batch, seed, bos)
    if not frozen(lm):  # a model in training: its weights move under one fingerprint
        return _induction_scores(lm, n, batch, seed, bos)
    with _MEMO_LOCK:
        found = _MEMO.get(key)
    if found is None:
        found = _induction_scores(lm, n, batch, seed, bos)
        with _MEMO_LOCK:
            if len(_MEMO) > 64:
                _MEMO.clear()
            _MEMO[key] = found
    return found.copy()


def _induction_scores(lm: LoadedModel, n: int, batch: int, seed: int, bos: bool) -> np.ndarray:
    n = induction_length(lm, n)
    ids, off = random_repeated_tokens(lm, n, batch, seed, bos)
    ids = ids.to(lm.device)
    q = torch.arange(off + n, off + 2 * n, device=lm.device)  # second copy
    k = q - n + 1  # token after the first occurrence
    with lm.lock, torch.inference_mode(), eager_attention(lm):
        out = lm.model(input_ids=ids, output_attentions=True, use_cache=False, logits_to_keep=1)
    scores = []
    for att in out.attentions:  # (batch, H, T, T)
        scores.append(att[:, :, q, k].float().mean(dim=(0, 2)))
    return torch.stack(scores).cpu().numpy().astype(np.float64)
