"""What every kind's params model is built from: the base `Params`, the prompt set (`PromptParams`), the size of
a head set (`Selection`) and the field types. Each kind's own params model lives in its module, beside its result
model and its function (e.g. `tsla/scores.py: ScoresParams`).

The service validates a job's fields with them, the CLI builds its flags from them and validates its
arguments with them, the Python API and the pages fill them. Integers are strict (`true` is not 1), floats
finite, strings and lists bounded. `batch_size` changes speed, never results: it is not part of a cache key.
No torch here.
"""
from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, Strict

from .. import options as o

Int = Annotated[int, Strict()]
Bool = Annotated[bool, Strict()]
Float = Annotated[float, Field(allow_inf_nan=False)]
Head = tuple[Int, Int]
Layer = Annotated[int, Strict(), Field(ge=0)]

ASSUMED_LAYERS = 32  # the work of a job on a model not loaded yet is estimated for a model this deep ...
ASSUMED_HEADS = 1024  # ... with this many heads in all
NOT_IN_KEY = frozenset({"batch_size"})
"""Fields that change how a result is computed but not the result."""


def _heads(v: list[tuple[int, int]]) -> list[tuple[int, int]]:
    if any(l < 0 or h < 0 for l, h in v):
        raise ValueError("layer and head indices must be non-negative")
    return sorted(set(v))


Heads = Annotated[list[Head], Field(max_length=o.MAX_LIST), AfterValidator(_heads)]
"""[[layer, head], ...], sorted and without repeats."""


class Params(BaseModel):
    """Base of every kind's parameters: unknown fields are refused, so a typo is an error, not a default."""

    model_config = ConfigDict(extra="forbid")

    def work(self, model: dict | None = None) -> tuple[int, str]:
        """An estimate of the job's work in prompt passes (one prompt through the model once), and how it was
        counted; `model` is the model's info when known (layers, heads), else a large model is assumed."""
        n = getattr(self, "prompts", 1)
        return n, f"{n} prompts"
    not_in_key: ClassVar[frozenset[str]] = NOT_IN_KEY
    """Fields left out of this kind's cache key (a kind whose `batch_size` changes its result keys it)."""
    added_fields: ClassVar[frozenset[str]] = frozenset()
    """Fields added after results were cached: in the key only when they differ from their default, so a request
    that does not use them keeps its key (and its cached result)."""


class PromptParams(Params):
    """How the prompts are built: `shots` demonstrations each, `prompts` held-out queries, `seed`."""

    shots: Int = Field(o.SHOTS, ge=0, description="demonstrations per prompt")
    prompts: Int = Field(o.PROMPTS, ge=1, description="held-out queries (prompts) scored")
    seed: Int = Field(o.SEED, ge=0, description="seed of the demonstration/query split and prompt sampling")
    batch_size: Int = Field(o.BATCH_SIZE, ge=1, le=1024, description="rows per forward pass (speed only)")


class Selection(Params):
    """How many top heads a head set holds: `top_k` when given, else the top `top_pct` percent (at least
    `MIN_TOP_HEADS`)."""

    top_pct: Float = Field(o.TOP_PCT, gt=0, le=100, description="top-head set size in percent of all heads")
    top_k: Int | None = Field(None, ge=1, le=o.MAX_LIST, description="top-head set size as a count (overrides top_pct)")
