"""What a result says besides its numbers: notes (how a request was fitted to the task) and the labels that span
several tokens, gathered once for every kind.

- `Note`: a message about how the request was sized to what the task has (a recipe's default training set cycled
  through a small task, a validation share): the kernel lists it under the result's `notes`, not its `warnings`.
  Warnings are kept for what makes a number mean less than it says.
- Multi-token labels: `encode` reports every label that spans several tokens (with its first token) to the
  collector the kernel opens around each analysis (`collect_multi_token`), so every kind that tokenises labels
  says so, in one warning (`multi_token_warning`), whatever primitive tokenised them.
"""
from __future__ import annotations

import contextvars
from contextlib import contextmanager
from typing import Iterator, Mapping, Sequence


class Note(str):
    """A message that is a note, not a warning (see the module docstring): `ctx.warn(Note(...))` files it there."""


_SEEN: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar("headlens_multi_token", default=None)
MULTI_TOKEN_START = "labels that span several tokens"


@contextmanager
def collect_multi_token() -> Iterator[dict[str, str]]:
    """Collect, while the block runs in this thread, the labels `encode` finds spanning several tokens:
    {label: its first token as text}. Nested blocks collect separately (a sub-analysis reports its own)."""
    seen: dict[str, str] = {}
    token = _SEEN.set(seen)
    try:
        yield seen
    finally:
        _SEEN.reset(token)


def report_multi_token(labels: Mapping[str, str]) -> None:
    """Called by `encode`: labels spanning several tokens, with their first token's text."""
    seen = _SEEN.get()
    if seen is not None:
        for label, first in labels.items():
            seen.setdefault(label, first)


def multi_token_warning(labels: Sequence[str], firsts: Mapping[str, str] | None = None) -> str:
    """The one warning for answers that span several tokens: every score and training loss uses the first one."""
    firsts = firsts or {}
    shown = sorted(labels, key=lambda x: (x not in firsts, x))[:3]
    example = ", ".join(f"{x!r} by {firsts[x]!r}" if x in firsts else repr(x) for x in shown)
    return (f"{MULTI_TOKEN_START}: {len(labels)} with this tokenizer, each scored by its first token (e.g. {example}); "
            f"every accuracy, probability and training loss reads that token only, so two answers that share a "
            f"first token count as the same answer")


def is_multi_token_warning(message: str) -> bool:
    return str(message).startswith(MULTI_TOKEN_START)
