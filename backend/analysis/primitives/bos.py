"""Whether a prompt starts with the BOS token: the `prepend_bos` convention, for every kind that tokenises prompts.

- "tokenizer" (the default): the tokenizer's own choice, `tokenizer(text)["input_ids"]` (SmolLM2's adds no BOS, the
  default model's and Llama's do).
- "always": TransformerLens's convention (`prepend_bos=True`): the BOS token first in every prompt, prepended when
  the tokenizer did not add it. A tokenizer without a BOS token cannot follow it: a clear error.

The kernel (`kernel.analyze`) sets the convention from a job's `prepend_bos` around the analysis, and a kind that
another one calls inherits it when its call does not name it, so every `encode` of the call tree (and every length
check) tokenises the same way without the convention being threaded through each primitive. No torch here.
"""
from __future__ import annotations

import contextvars
from contextlib import contextmanager
from typing import Any, Iterator

from . import options as o
from ...errors import BadInput

PREPEND_BOS = o.PREPEND_BOS
DEFAULT = o.PREPEND_BOS_DEFAULT

_CURRENT: contextvars.ContextVar[str | None] = contextvars.ContextVar("headlens_prepend_bos", default=None)


def current() -> str | None:
    """The convention of the analysis running in this thread; None outside any (then: the default)."""
    return _CURRENT.get()


@contextmanager
def convention(value: str | None) -> Iterator[None]:
    """Tokenise prompts with `value` while the block runs (None: keep the one in force)."""
    if value is None:
        yield
        return
    if value not in PREPEND_BOS:
        raise ValueError(f"prepend_bos must be one of {', '.join(PREPEND_BOS)}, not {value!r}")
    token = _CURRENT.set(value)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def bos_id(tok: Any) -> int:
    """The tokenizer's BOS id; a BadInput (a ValueError) in one sentence when it has none."""
    i = getattr(tok, "bos_token_id", None)
    if i is None:
        raise BadInput("prepend_bos='always' needs a BOS token, and this model's tokenizer has none; use "
                         "prepend_bos='tokenizer'")
    return int(i)


def with_bos(tok: Any, ids: list[int], prepend_bos: str | None = None) -> list[int]:
    """`ids` (the tokenizer's own encoding of a prompt) under the convention `prepend_bos` (None: the one in force):
    as they are, or with the BOS id first when it is not already."""
    if (prepend_bos or current() or DEFAULT) == "tokenizer":
        return ids
    b = bos_id(tok)
    return ids if ids and ids[0] == b else [b, *ids]


def prompt_ids(tok: Any, text: str, prepend_bos: str | None = None) -> list[int]:
    """A prompt's token ids under the convention `prepend_bos` (None: the one in force)."""
    return with_bos(tok, list(tok(text)["input_ids"]), prepend_bos)
