"""What every kind's params model is built from: the base `Params`, the prompt set (`PromptParams`), the size of
a head set (`Selection`) and the field types. Each kind's own params model lives in its module, beside its result
model and its function (e.g. `tsla/scores.py: HeadScoresParams`).

The service validates a job's fields with them, the CLI builds its flags from them and validates its
arguments with them, the Python API and the pages fill them. Integers are strict (`true` is not 1), floats
finite, strings and lists bounded. `batch_size` changes speed, never results: it is not part of a cache key.
No torch here.
"""
from __future__ import annotations

from typing import Annotated, Any, ClassVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, Strict

from .primitives import options as o
from ..store.tensor_store import is_id
from .primitives.cost import NONE, Shape, Sizes, Work, passes

Int = Annotated[int, Strict()]
Bool = Annotated[bool, Strict()]
Float = Annotated[float, Field(allow_inf_nan=False)]
Head = tuple[Int, Int]
Layer = Annotated[int, Strict(), Field(ge=0)]
NonNegative = Annotated[int, Strict(), Field(ge=0)]

NOT_IN_KEY = frozenset({"batch_size"})
"""Fields that change how a result is computed but not the result."""
CONVENTIONS = frozenset({"prepend_bos"})
"""Shared conventions added after results were cached: in a cache key only when off their default (so every result
cached before keeps its key), and inherited by a kind another one calls when the call does not name them
(`kernel.validate_params`)."""


def _heads(v: list[tuple[int, int]]) -> list[tuple[int, int]]:
    if any(l < 0 or h < 0 for l, h in v):
        raise ValueError("layer and head indices must be non-negative")
    return sorted(set(v))


Heads = Annotated[list[Head], Field(max_length=o.MAX_LIST), AfterValidator(_heads)]
"""[[layer, head], ...], sorted and without repeats."""

TRAINED_BY = {"ltv": "ltv_vector or ltv_layers", "site": "site_alphas"}


def TensorId(kind: str) -> Any:  # noqa: N802 (a type)
    """A saved `kind` file, by the id the service issued (`<kind>-<32 hex digits>`): never a path. The message is the
    same whatever the string is (nothing is looked up here)."""
    def check(v: str) -> str:
        if not is_id(v) or not v.startswith(kind + "-"):
            raise ValueError(f"give the id of a saved {kind} file ({kind}-<32 hex digits>: the `tensor` of a "
                             f"{TRAINED_BY[kind]} result, or what POST /tensors returns); a path is not accepted here "
                             f"(the CLI and the Python API take a local file)")
        return v
    return Annotated[str, Strict(), Field(max_length=o.MAX_TEXT), AfterValidator(check)]


class Params(BaseModel):
    """Base of every kind's parameters: unknown fields are refused, so a typo is an error, not a default."""

    model_config = ConfigDict(extra="forbid")

    def work(self, shape: Shape, sizes: Sizes) -> Work:
        """The job's work: tokens through the whole model (`primitives/cost.py`), from the params, the model's
        `shape` and the task's prompt `sizes` alone (never from a loaded model). Default: one pass per prompt."""
        n, shots = getattr(self, "prompts", None), getattr(self, "shots", None)
        return passes("prompts", n, sizes.prompt(shots if isinstance(shots, int) else 0)) if n else NONE

    def reference_shots(self) -> int:
        """The demonstrations of the prompt a job's work is counted in passes of (`HEADLENS_MAX_WORK`): its `shots`
        (the most of a list), else the default."""
        shots = getattr(self, "shots", None)
        if isinstance(shots, int):
            return shots
        return max(shots) if shots else o.SHOTS

    not_in_key: ClassVar[frozenset[str]] = NOT_IN_KEY
    """Fields left out of this kind's cache key (a kind whose `batch_size` changes its result keys it)."""
    tensor_fields: ClassVar[tuple[str, ...]] = ()
    """Fields that name a saved tensor by id (`TensorId`); the CLI and the Python API also take a local file there."""

    def writes_tensors(self) -> bool:
        """Whether the job may train and save tensors (the service checks the tensor folder can take them first)."""
        return False
    added_fields: ClassVar[frozenset[str]] = frozenset()
    """Fields added after results were cached: in the key only when they differ from their default, so a request
    that does not use them keeps its key (and its cached result)."""


class BosParams(Params):
    """Kinds that tokenise prompts: whether each starts with the BOS token (`primitives/bos.py`)."""

    prepend_bos: o.PrependBos = Field(o.PREPEND_BOS_DEFAULT, description="tokenizer: the tokenizer's own choice (SmolLM2's adds "
                                    "no BOS); always: a BOS token first in every prompt (TransformerLens's "
                                    "convention; an error for a tokenizer without one)")


class PromptParams(BosParams):
    """How the prompts are built: `shots` demonstrations each, `prompts` held-out queries, `seed`, and the BOS
    convention (`prepend_bos`)."""

    shots: Int = Field(o.SHOTS, ge=0, description="demonstrations per prompt")
    prompts: Int = Field(o.PROMPTS, ge=1, description="held-out queries (prompts) scored")
    seed: Int = Field(o.SEED, ge=0, description="seed of the demonstration/query split and prompt sampling")
    batch_size: Int = Field(o.BATCH_SIZE, ge=1, le=1024, description="rows per forward pass (speed only)")


class Selection(Params):
    """How many top heads a head set holds: `top_k` when given, else the top `top_pct` percent (at least
    `MIN_TOP_HEADS`)."""

    top_pct: Float = Field(o.TOP_PCT, gt=0, le=100, description="top-head set size in percent of all heads")
    top_k: Int | None = Field(None, ge=1, le=o.MAX_LIST, description="top-head set size as a count (overrides top_pct)")
