"""Every request and response of the service, as Pydantic models (the OpenAPI schema follows from them).

A job request is flat: `{"kind": "scores", "model": "default", "task": "sentiment", "shots": 8, ...}`.
`kind` picks an entry of the job-kind registry (`backend.service.registry`), whose params model below
validates the other fields; unknown fields are refused, so a typo is a 422, not a silent default.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

JobState = Literal["queued", "running", "done", "error", "cancelled"]
Mode = Literal["zero", "mean"]
Order = Literal["tr", "tl", "induction", "random"]
Positions = Literal["all", "last"]
ACTIVE_STATES = ("queued", "running")


# -- job parameters, one model per kind --------------------------------------------------------------
def _not_blank(v: str) -> str:
    v = v.strip()
    if not v:
        raise ValueError("must not be empty")
    return v


class ModelParams(BaseModel):
    """kind `model_info`: load the model (kept resident) and return its `info()`: n_layers, n_heads, ..."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field("default", description="`default`, a local model folder, or a Hugging Face id")

    @field_validator("model")
    @classmethod
    def _model_not_blank(cls, v: str) -> str:
        return _not_blank(v)


class JobParams(ModelParams):
    """Fields every model-and-task job shares."""

    task: str = Field(..., description="a built-in task name or an `upload:<hash>` id from POST /tasks/upload")
    seed: int = Field(0, ge=0, description="seed of the demonstration/query split and prompt sampling")

    @field_validator("task")
    @classmethod
    def _task_not_blank(cls, v: str) -> str:
        return _not_blank(v)


class ScoresParams(JobParams):
    """kind `scores`: TR / TL / DLA / induction head maps (`ScoreResult.to_json()`)."""

    shots: int = 8
    prompts: int = 50
    apply_ln: bool = False
    top_pct: float = Field(3.0, gt=0, le=100)
    batch_size: int = Field(16, ge=1, le=512)


class IclParams(JobParams):
    """kind `icl`: accuracy and TR ratio against the number of demonstrations."""

    shots: list[int] = Field(default_factory=lambda: [0, 1, 2, 4, 8], min_length=1, max_length=33)
    prompts: int = 100
    examples: int = Field(3, ge=0, le=50, description="example rows (prompt, gold, prediction) kept per k")
    batch_size: int = Field(16, ge=1, le=512)


class AblationCurvesParams(JobParams):
    """kind `ablation_curves`: accuracy and TR ratio against k, the number of top heads ablated, per order."""

    orders: list[Order] = Field(default_factory=lambda: ["tr", "tl", "induction", "random"], min_length=1)
    ks: list[int] = Field(default_factory=lambda: [0, 1, 2, 4, 8], min_length=1, max_length=64)
    mode: Mode = "zero"
    shots: int = 8
    prompts: int = 50
    random_seeds: list[int] = Field(default_factory=lambda: [0, 1, 2], min_length=1, max_length=16)
    positions: Positions = "all"
    batch_size: int = Field(32, ge=1, le=512)

    @field_validator("orders")
    @classmethod
    def _unique_orders(cls, v: list[str]) -> list[str]:
        return list(dict.fromkeys(v))

    @field_validator("ks")
    @classmethod
    def _sorted_ks(cls, v: list[int]) -> list[int]:
        if any(k < 0 for k in v):
            raise ValueError("ks must be non-negative")
        return sorted(set(v))


class AblateParams(JobParams):
    """kind `ablate`: ablate one head set; accuracy, TR ratio and per-prompt rows before and after."""

    heads: list[tuple[int, int]] = Field(..., max_length=4096, description="[[layer, head], ...]")
    mode: Mode = "zero"
    shots: int = 8
    prompts: int = 50
    positions: Positions = "all"
    batch_size: int = Field(32, ge=1, le=512)

    @field_validator("heads")
    @classmethod
    def _sorted_heads(cls, v: list[tuple[int, int]]) -> list[tuple[int, int]]:
        if any(l < 0 or h < 0 for l, h in v):
            raise ValueError("layer and head indices must be non-negative")
        return sorted(set(v))


VectorType = Literal["tr", "tl", "random", "fv", "vanilla"]
Perturbation = Literal["shuffled_inputs", "random_labels", "flipped_labels", "symbol_labels", "number_labels"]


class SteerParams(JobParams):
    """kind `steer`: zero-shot prompts with alpha * v added at a layer (or every layer), per vector type."""

    vectors: list[VectorType] = Field(default_factory=lambda: ["tr", "tl", "random", "fv", "vanilla"], min_length=1)
    layer: int | Literal["all"] | None = Field(None, description="decoder layer to inject at; None = L/2; `all` sweeps")
    alpha: float = Field(1.0, ge=-100, le=100)
    heads: list[tuple[int, int]] | None = Field(None, max_length=4096, description="an extra user head set")
    shots: int = 8
    prompts: int = 50
    top_pct: float = Field(3.0, gt=0, le=100)
    batch_size: int = Field(32, ge=1, le=512)

    @field_validator("vectors")
    @classmethod
    def _unique_vectors(cls, v: list[str]) -> list[str]:
        return list(dict.fromkeys(v))


class GeometryParams(JobParams):
    """kind `geometry`: per-layer alignment, logit difference and rotation for five conditions, and PCA."""

    layer: int | None = Field(None, description="injection layer for the steered conditions; None = L/2")
    alpha: float = Field(1.0, ge=-100, le=100)
    final_norm: bool = False
    pca_layer: int | None = Field(None, description="layer of the PCA view; None = last")
    shots: int = 8
    prompts: int = 50
    top_pct: float = Field(3.0, gt=0, le=100)
    batch_size: int = Field(16, ge=1, le=512)


class PerturbParams(JobParams):
    """kind `perturb`: ICL accuracy, TR ratio, TR/TL maps and ablation effects under demonstration perturbations."""

    perturbations: list[Perturbation] = Field(
        default_factory=lambda: ["shuffled_inputs", "random_labels", "flipped_labels", "symbol_labels",
                                 "number_labels"], min_length=1)
    k: int | None = Field(None, ge=1, le=4096, description="heads ablated per set; None = the top_pct set size")
    shots: int = 8
    prompts: int = 50
    top_pct: float = Field(3.0, gt=0, le=100)
    batch_size: int = Field(16, ge=1, le=512)


# -- jobs ----------------------------------------------------------------------------------------------
class JobRequest(BaseModel):
    """`kind` plus that kind's parameters, flat (see GET /capabilities for each kind's fields)."""

    model_config = ConfigDict(extra="allow", json_schema_extra={
        "examples": [{"kind": "scores", "model": "default", "task": "sentiment", "shots": 8, "prompts": 50}]})

    kind: str


class JobStatus(BaseModel):
    """A job as GET /jobs/{id} shows it. `result` is set when `status` is `done`, `error` when `error`."""

    id: str
    kind: str
    status: JobState
    progress: float = Field(0.0, ge=0.0, le=1.0)
    message: str = ""
    result: dict[str, Any] | None = None
    error: str | None = None
    error_type: str | None = None
    params: dict[str, Any] = Field(default_factory=dict, description="the normalized request")
    created: float = Field(..., description="unix time")
    started: float | None = None
    finished: float | None = None
    cache_hit: bool | None = None


# -- tasks -----------------------------------------------------------------------------------------------
class TaskInfo(BaseModel):
    """A task as listed: `id` is what a job's `task` field takes."""

    id: str
    source: Literal["builtin", "upload"]
    name: str
    kind: str
    n_examples: int
    labels: list[str] | None = None
    models: str = "any"
    description: str = ""


class UploadRequest(BaseModel):
    """JSON form of POST /tasks/upload (the multipart form takes `file` and optional `kind`)."""

    model_config = ConfigDict(extra="forbid")

    filename: str = Field(..., description="its extension picks the format: .json .jsonl .ndjson .csv .tsv")
    content: str
    kind: Literal["classification", "generation"] | None = None


class UploadResponse(BaseModel):
    id: str = Field(..., description="`upload:<hash>`; use it as a job's `task`")
    summary: TaskInfo


# -- service ---------------------------------------------------------------------------------------------
class Health(BaseModel):
    status: Literal["ok"] = "ok"
    version: str


class JobKindInfo(BaseModel):
    name: str
    description: str
    params: dict[str, Any] = Field(..., description="JSON schema of the kind's parameters")


class Capabilities(BaseModel):
    version: str
    device: str
    dtype: str
    loaded_models: list[dict[str, Any]]
    tasks: list[TaskInfo]
    limits: dict[str, int]
    job_kinds: list[JobKindInfo]
    model_root: str | None = None
    allow_hub: bool = True
    auth_required: bool = False


class ErrorResponse(BaseModel):
    detail: str
