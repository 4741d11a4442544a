"""Every request and response of the service, as Pydantic models (the OpenAPI schema follows from them).

A job request is flat: `{"kind": "head_scores", "model": "default", "task": "sentiment", "shots": 8, ...}`.
`kind` picks an entry of the job-kind registry (`backend.analysis.kinds`), whose params model validates the
fields besides `model` and `task`; unknown fields are refused, so a typo is a 422, not a silent default.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..analysis.primitives.options import MAX_TEXT

JobState = Literal["queued", "running", "done", "error", "cancelled", "held"]
ACTIVE_STATES = ("queued", "running")


# -- the fields every job shares (each kind's own fields: `backend.analysis.params`) ------------------------
def _not_blank(v: str) -> str:
    v = v.strip()
    if not v:
        raise ValueError("must not be empty")
    return v


class JobFields(BaseModel):
    """`model` and `task`, validated before the kind's own parameters."""

    model_config = ConfigDict(extra="ignore")

    model: str = Field("default", max_length=MAX_TEXT,
                       description="`default`, a local model folder, or a Hugging Face id")
    task: str | None = Field(None, max_length=MAX_TEXT,
                             description="a built-in task name or an `upload:<hash>` id from POST /tasks/upload")
    precision: Literal["float32", "bfloat16", "float32-onednn"] | None = Field(
        None, description="the dtype the model runs in (default: the server's, float32 on CPU); bfloat16 is ~3x "
                          "faster on a CPU with avx512_bf16 and changes every number; float32-onednn (CPU) is "
                          "float32 through oneDNN's kernels (other last bits); each is cached apart")

    @field_validator("model")
    @classmethod
    def _model_not_blank(cls, v: str) -> str:
        return _not_blank(v)

    @field_validator("task")
    @classmethod
    def _task_not_blank(cls, v: str | None) -> str | None:
        return None if v is None else _not_blank(v)


# -- jobs ----------------------------------------------------------------------------------------------
class JobRequest(BaseModel):
    """`kind` plus that kind's parameters, flat (see GET /capabilities for each kind's fields), and `start`."""

    model_config = ConfigDict(extra="allow", json_schema_extra={
        "examples": [{"kind": "head_scores", "model": "default", "task": "sentiment", "shots": 8, "prompts": 50}]})

    kind: str
    start: Literal["always", "if_short", "never"] = Field(
        "always", description="a result not cached: always queue the job; if_short: only when estimated at most "
                              "a few seconds (else `held`, with its estimate, until asked with `always`: a page's "
                              "Run); never: answer the cached result or `held`")


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
    remaining_s: float | None = Field(None, description="while running: seconds left, from the job's own progress "
                                                          "(elapsed x (1 - progress) / progress; null until it has "
                                                          "made enough)")
    cache_hit: bool | None = None
    submitters: int = Field(1, description="submissions sharing this job; a DELETE cancels it only at the last")
    lane: Literal["live", "interactive", "sweep"] = Field(
        "interactive", description="live (an interactive job estimated at most a few seconds: a toggle) runs first, "
                                   "then interactive, then a sweep's jobs")
    preempted: int = Field(0, description="times this job gave way to a job of a higher lane (it then starts again; "
                                          "what it finished through cached sub-results is kept)")
    live: dict[str, Any] | None = Field(None, description="while running: data a page draws live (e.g. the loss "
                                                            "curve so far of a training)")
    estimate: dict[str, Any] | None = Field(None, description="the admission's estimate (POST /jobs answers): as "
                                                              "POST /jobs/estimate's")
    ran_on: dict[str, Any] | None = Field(None, description="where the job ran, when the runner says (the Ray "
                                          "runner): `node_ip`, `node_id`, `host`, `pid`; `lost`: the nodes of earlier "
                                          "attempts whose worker died (the job was retried); `runner`: `ray` or "
                                          "`local` (the service's own runner, once the cluster is lost)")


class JobEstimate(BaseModel):
    """A job's work and time before it runs (backend/service/timing.py)."""

    kind: str
    passes: float = Field(..., description="prompt passes of the job's own prompts (HEADLENS_MAX_WORK's unit)")
    tokens: float = Field(..., description="tokens through the whole model, training forward passes included")
    train_tokens: float = Field(..., description="of which in training (each with a backward pass, ~2x)")
    units: float = Field(0.0, description="its time in token-equivalents (tokens, calls, logit rows)")
    held_tokens: float = Field(0.0, description="of which the job skips: states an earlier pass kept in memory (a "
                                                "toggle's clean prefix); left out of `seconds`")
    how: str = Field(..., description="the largest parts of the work")
    seconds: float | None = Field(None, description="estimated seconds (the median of the runs it rests on); null "
                                                    "when unknown")
    low: float | None = Field(None, description="the shortest it may take, from the runs' spread")
    high: float | None = Field(None, description="the longest it may take")
    basis: str = Field("", description="what the seconds rest on: this kind's earlier runs here, other kinds' "
                                       "runs on this model, or the model's size")
    runs: int = Field(0, description="earlier runs of this kind on this model it rests on")
    text: str = Field(..., description="the seconds in words: `about 3 min`, or a range")
    shape: dict[str, Any] = Field(default_factory=dict, description="the model's size, read from its files")
    sizes: dict[str, Any] = Field(default_factory=dict, description="tokens of the job's prompts")
    limit: int = Field(..., description="HEADLENS_MAX_WORK")
    admitted: bool
    refusal: str | None = None
    refusal_status: int | None = Field(None, description="the status POST /jobs refuses this job with (the work "
                                                         "limit), when `admitted` is false")


# -- tasks -----------------------------------------------------------------------------------------------
class TaskInfo(BaseModel):
    """A task as listed: `id` is what a job's `task` field takes."""

    id: str
    source: Literal["builtin", "upload"]
    name: str
    kind: str
    n_examples: int
    n_queries: int | None = Field(None, description="held-out queries a seed scores (prompts beyond it are capped)")
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


class TensorInfo(BaseModel):
    """A saved tensor file the service holds (POST /tensors, GET /tensors/{id})."""

    id: str = Field(..., description="`<kind>-<32 hex digits>` (a hash of the file): use it as `load`")
    kind: Literal["ltv", "site"]
    model: str = Field(..., description="the model it was trained for (its name in the file)")
    task: str = Field("", description="the task it was trained on (its name in the file)")
    d_model: int
    n_layers: int
    n_heads: int
    shapes: dict[str, list[int]]
    bytes: int


# -- service ---------------------------------------------------------------------------------------------
class Health(BaseModel):
    status: Literal["ok"] = "ok"
    version: str


class JobKindInfo(BaseModel):
    name: str
    description: str
    aliases: list[str] = Field(default_factory=list, description="older names of the kind, accepted wherever its "
                               "name is (a job's `kind`, a sweep's `kinds`); answers carry the name")
    uses_task: bool = True
    uses_model: bool = True
    params: dict[str, Any] = Field(..., description="JSON schema of the kind's parameters (besides model, task)")
    result: dict[str, Any] = Field(default_factory=dict, description="JSON schema of the kind's result")


class PullInfo(BaseModel):
    status: Literal["idle", "running", "done", "error"] = "idle"
    progress: float = 0.0
    message: str = ""
    error: str | None = None
    started: float | None = None
    finished: float | None = None
    seconds: float | None = None


class PresetInfo(BaseModel):
    """A named real model (backend/weights/presets.py) and whether this server has it."""

    name: str
    title: str
    family: str
    shape: str
    licence: str
    download_bytes: int
    disk_bytes: int
    packages: list[str]
    note: str = ""
    pulled: bool
    converted: bool
    pull_command: str
    pull: PullInfo = Field(default_factory=PullInfo, description="this service's pull of it")


class Capabilities(BaseModel):
    version: str
    device: str
    dtype: str
    loaded_models: list[dict[str, Any]]
    tasks: list[TaskInfo]
    limits: dict[str, int | None]  # Limits.to_json(); sweep_window None: from the runner
    job_kinds: list[JobKindInfo]
    model_root: bool = Field(False, description="local model paths must lie under the server's model folder "
                                                "(HEADLENS_MODEL_ROOT; its path is not shown)")
    allow_hub: bool = True
    auth_required: bool = False
    presets: list[PresetInfo] = Field(default_factory=list, description="the named real models (GET /models)")
    allow_pull: bool = True


class ErrorResponse(BaseModel):
    detail: str
