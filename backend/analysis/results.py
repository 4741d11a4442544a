"""What every kind's result model is built from: the envelope `Result`, `Metrics`, `Overlap` and the array types.
Each kind's own result model lives in its module, beside its params model and its function (e.g.
`tsla/scores.py: HeadScoresResult`); together they are the shapes the service, the UI and notebooks share.

Every result carries the envelope `Result` (model, task, the requested params, warnings, cache_hit,
seconds). Head maps are `Grid`s: numpy arrays of shape (layers, heads) in Python, nested lists in JSON.
Values read back from the cache are validated against these models; one that does not fit is recomputed.
No torch here.
"""
from __future__ import annotations

import base64
from typing import Annotated, Any

import numpy as np
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, WithJsonSchema, model_validator

from .primitives.stats import pack_outcomes, rate_ci_of, unpack_outcomes

Head = tuple[int, int]


def _array(v: Any) -> np.ndarray:
    a = np.asarray(v, dtype=np.float64)
    if a.dtype == object:
        raise ValueError("not a rectangular array of numbers")
    return a


def _grid(v: Any) -> np.ndarray:
    a = _array(v)
    if a.ndim != 2:
        raise ValueError(f"expected a (layers, heads) grid, got shape {a.shape}")
    return a


Grid = Annotated[np.ndarray, BeforeValidator(_grid), PlainSerializer(lambda a: a.tolist(), return_type=list),
                 WithJsonSchema({"type": "array", "items": {"type": "array", "items": {"type": "number"}},
                                 "description": "(layers, heads)"})]
"""A per-head map: numpy (layers, heads) in Python, a list of rows in JSON."""
Vector = Annotated[np.ndarray, BeforeValidator(_array), PlainSerializer(lambda a: a.tolist(), return_type=list),
                   WithJsonSchema({"type": "array", "description": "(d_model,) or (layers, d_model)"})]
"""A vector (d_model,) or one per layer (layers, d_model)."""


def pack_array(a: Any) -> dict[str, Any]:
    """A float64 array as {"shape", "dtype", "b64"}: its bytes (little-endian) in base64, 8 bytes a number where a
    JSON list of floats costs about 20 (per-prompt maps are prompts x layers x heads)."""
    a = np.ascontiguousarray(np.asarray(a, dtype="<f8"))
    return {"shape": list(a.shape), "dtype": "float64", "b64": base64.b64encode(a.tobytes()).decode("ascii")}


def _packed(v: Any) -> np.ndarray:
    if isinstance(v, dict) and "b64" in v:
        shape = tuple(int(x) for x in v.get("shape", ()))
        raw = base64.b64decode(str(v["b64"]), validate=True)
        if v.get("dtype") != "float64" or len(raw) != 8 * int(np.prod(shape, dtype=np.int64)):
            raise ValueError("a packed array whose bytes do not fit its shape and dtype (float64)")
        return np.frombuffer(raw, dtype="<f8").reshape(shape).astype(np.float64)
    a = _array(v)
    if a.ndim != 3:
        raise ValueError(f"expected (prompts, layers, heads), got shape {a.shape}")
    return a


PromptMaps = Annotated[np.ndarray, BeforeValidator(_packed), PlainSerializer(pack_array, return_type=dict),
                       WithJsonSchema({"type": "object", "description": "(prompts, layers, heads) float64: {shape, "
                                                                       "dtype, b64 (little-endian bytes)}"})]
"""Per-prompt head maps: numpy (prompts, layers, heads) in Python, packed (`pack_array`) in JSON."""


class Model(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True, extra="ignore")


class Result(Model):
    """The envelope of every result."""

    model: str | None = Field(None, description="the model's name as loaded")
    task: str | None = Field(None, description="the task's name")
    params: dict[str, Any] = Field(default_factory=dict, description="the requested parameters")
    warnings: list[str] = Field(default_factory=list, description="what makes a number mean less than it says")
    notes: list[str] = Field(default_factory=list, description="how the request was fitted to the task (e.g. a "
                                                                "default training set cycled through a small task)")
    multi_token_labels: list[str] = Field(default_factory=list, description="labels that span several tokens "
                                                                              "(scored by their first)")
    absent_inputs: list[dict[str, Any]] = Field(default_factory=list, exclude=True,
                                                description="other kinds' cached results looked for and not found "
                                                            "(the kernel recomputes this one once they are cached)")
    cache_hit: bool = False
    seconds: float = Field(0.0, description="time this request took (a cache hit: the read)")

    def to_json(self) -> dict[str, Any]:
        """JSON-able dict (numpy arrays as lists)."""
        return self.model_dump(mode="json")


class TensorsInline(Model):
    """A result of a kind that trains tensors (LTV, SITE): those that could not be saved (a full or read-only
    disk), inline; such a result is not cached."""

    unsaved_tensors: dict[str, str] = Field(default_factory=dict, description="tensor id -> the file's bytes "
                                                                              "(base64) when it could not be saved: "
                                                                              "POST them to /tensors to keep it")


class Metrics(Model):
    """Prompt-level outcomes.

    accuracy: the full-vocabulary argmax is the gold answer's first token (what the model would answer).
    label_accuracy: the argmax within the prompt's label set is the gold one (for generation tasks the label
        set is the prompt's candidates: the gold, the demonstrations' outputs and padding words: a weaker measure).
    tr_ratio: the full-vocabulary argmax is one of the label set's first tokens.
    Each rate carries its 95% Wilson interval over the n prompts (`<rate>_ci`: independent prompts); a result read
    back without them (cached before they existed) gets them from the rate and n. `per_prompt` keeps the outcomes
    prompt by prompt, so two arms on the same prompts can be tested paired (`outcomes()`).
    """

    accuracy: float
    label_accuracy: float
    tr_ratio: float
    n: int = 0
    accuracy_ci: tuple[float, float] | None = Field(None, description="95% Wilson interval of accuracy")
    label_accuracy_ci: tuple[float, float] | None = Field(None, description="95% Wilson interval of label accuracy")
    tr_ratio_ci: tuple[float, float] | None = Field(None, description="95% Wilson interval of the TR ratio")
    per_prompt: str | None = Field(None, description="one digit per prompt, in order: 1 x correct + 2 x "
                                                     "label_correct + 4 x in_labels (`Metrics.outcomes()` unpacks it)")

    @model_validator(mode="after")
    def _intervals(self) -> "Metrics":
        for name in RATES:
            if getattr(self, f"{name}_ci") is None and self.n > 0 and getattr(self, name) == getattr(self, name):
                setattr(self, f"{name}_ci", rate_ci_of(getattr(self, name), self.n))
        return self

    def outcomes(self) -> dict[str, "np.ndarray"] | None:
        """{correct, label_correct, in_labels}: (prompts,) booleans, or None when not kept."""
        return unpack_outcomes(self.per_prompt) if self.per_prompt else None


RATES = ("accuracy", "label_accuracy", "tr_ratio")
OUTCOME_OF = {"accuracy": "correct", "label_accuracy": "label_correct", "tr_ratio": "in_labels"}
"""The per-prompt outcome whose mean each rate is."""


class PairedTest(Model):
    """Arm a against arm b on the same prompts: the effect mean(a - b) with its 95% bootstrap interval and a
    two-sided p (exact McNemar for 0/1 outcomes, a sign-flip permutation test otherwise; `stats.paired_comparison`);
    on one prompt neither (None)."""

    effect: float = Field(..., description="mean over prompts of a - b (for rates: the difference of the rates)")
    ci_low: float | None
    ci_high: float | None
    p: float | None
    n: int = Field(..., description="paired prompts")
    test: str = Field(..., description="exact McNemar | sign-flip permutation")


class Overlap(Model):
    jaccard: float
    spearman: float | None = None
    kendall: float | None = None
