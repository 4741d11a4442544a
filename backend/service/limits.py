"""Request limits, read from environment variables, and the one place that checks them.

| variable                   | default | what it bounds                                            |
|----------------------------|---------|-----------------------------------------------------------|
| HEADLENS_MAX_PROMPTS       | 500     | prompts per job                                           |
| HEADLENS_MAX_SHOTS         | 32      | demonstrations per prompt                                 |
| HEADLENS_MAX_TOKENS        | 8192    | estimated tokens of one prompt (~4 UTF-8 bytes per token) |
| HEADLENS_MAX_UPLOAD_MB     | 5       | size of an uploaded task file                             |
| HEADLENS_MAX_MODELS        | 2       | models kept resident (LRU)                                |
| HEADLENS_MAX_QUEUE         | 64      | jobs waiting or running at once, per lane (live,          |
|                            |         | interactive, sweep: service/jobs.py)                      |
| HEADLENS_MAX_BODY_KB       | 256     | request body of every route but uploads (413 above it)    |
| HEADLENS_UPLOAD_QUOTA_MB   | 200     | uploaded task files kept on disk (least recently used go) |
| HEADLENS_UPLOAD_CACHE      | 32      | parsed uploads kept in memory (LRU; re-read from disk)    |
| HEADLENS_MAX_WORK          | 200000  | estimated prompt passes of one job (service/estimate.py)  |
| HEADLENS_JOB_TIMEOUT_S     | 3600    | seconds a job may run (checked every batch, step, token)  |
| HEADLENS_MAX_SWEEP_JOBS    | 10000   | jobs of one sweep                                         |
| HEADLENS_MAX_TENSOR_MB     | 32      | size of an uploaded tensor file (POST /tensors)           |
| HEADLENS_TENSOR_QUOTA_MB   | 1024    | uploaded tensor files kept on disk (least recently used   |
|                            |         | go; never one a queued or running job refers to)          |
| HEADLENS_SWEEP_WINDOW      | unset   | a sweep's jobs in flight (unset: 2 x the runner's workers |
|                            |         | and at least 32; never over half HEADLENS_MAX_QUEUE)      |

A bad setting (not a number, or too small) is a ValueError naming the variable, raised by `Limits.from_env()`,
i.e. at start-up. Every violation is a `ServiceError` (422, or 413 for uploads) whose message names the parameter, the
value, the limit and the variable that raises it.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from .errors import BadRequest, Busy, TooLarge, clip
from ..errors import BadInput

if TYPE_CHECKING:
    from ..tasks.base import Task

BYTES_PER_TOKEN = 4  # rough UTF-8 bytes per BPE token of natural text; the token limit is an estimate


def env_number(name: str, default: float, minimum: float = 1) -> float:
    """The number in environment variable `name` (`default` when unset or blank); ValueError naming the variable
    when it is not a number or below `minimum`."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise BadInput(f"{name} must be a number, not {clip(raw, 60)!r}") from None
    if not value >= minimum:  # also refuses nan
        raise BadInput(f"{name} must be at least {minimum:g}, not {clip(raw, 60)!r}")
    return value


@dataclass(frozen=True)
class Limits:
    """The service's limits; `Limits.from_env()` reads the HEADLENS_MAX_* variables."""

    max_prompts: int = 500
    max_shots: int = 32
    max_tokens: int = 8192
    max_upload_bytes: int = 5 * 1024 * 1024
    max_models: int = 2
    max_queue: int = 64
    max_body_bytes: int = 256 * 1024
    upload_quota_bytes: int = 200 * 1024 * 1024
    upload_cache: int = 32
    max_work: int = 200_000
    job_timeout_s: int = 3600
    max_sweep_jobs: int = 10_000
    max_tensor_bytes: int = 32 * 1024 * 1024
    tensor_quota_bytes: int = 1024 * 1024 * 1024
    sweep_window: int | None = None  # None: max(32, 2 x the runner's workers) (sweeps.SweepManager)

    @classmethod
    def from_env(cls) -> "Limits":
        d = cls()
        return cls(
            max_prompts=int(env_number("HEADLENS_MAX_PROMPTS", d.max_prompts)),
            max_shots=int(env_number("HEADLENS_MAX_SHOTS", d.max_shots, minimum=0)),
            max_tokens=int(env_number("HEADLENS_MAX_TOKENS", d.max_tokens)),
            max_upload_bytes=int(env_number("HEADLENS_MAX_UPLOAD_MB", d.max_upload_bytes / 2**20, 0.001) * 2**20),
            max_models=int(env_number("HEADLENS_MAX_MODELS", d.max_models)),
            max_queue=int(env_number("HEADLENS_MAX_QUEUE", d.max_queue)),
            max_body_bytes=int(env_number("HEADLENS_MAX_BODY_KB", d.max_body_bytes / 1024, 1) * 1024),
            upload_quota_bytes=int(env_number("HEADLENS_UPLOAD_QUOTA_MB", d.upload_quota_bytes / 2**20, 0.001)
                                   * 2**20),
            upload_cache=int(env_number("HEADLENS_UPLOAD_CACHE", d.upload_cache)),
            max_work=int(env_number("HEADLENS_MAX_WORK", d.max_work)),
            job_timeout_s=int(env_number("HEADLENS_JOB_TIMEOUT_S", d.job_timeout_s)),
            max_sweep_jobs=int(env_number("HEADLENS_MAX_SWEEP_JOBS", d.max_sweep_jobs)),
            max_tensor_bytes=int(env_number("HEADLENS_MAX_TENSOR_MB", d.max_tensor_bytes / 2**20, 0.001) * 2**20),
            tensor_quota_bytes=int(env_number("HEADLENS_TENSOR_QUOTA_MB", d.tensor_quota_bytes / 2**20, 0.001)
                                   * 2**20),
            # unset gives 0 (the default is not checked against the minimum; a value set must be at least 1)
            sweep_window=int(env_number("HEADLENS_SWEEP_WINDOW", 0)) or d.sweep_window,
        )

    def to_json(self) -> dict[str, int | None]:
        return asdict(self)

    # -- checks ------------------------------------------------------------------------------------
    def check_job(self, params: Any, task: "Task | None" = None) -> None:
        """Check a job's parameters (any params model with `prompts` and/or `shots`) and, given the task,
        that its prompts can be built and fit the token limit."""
        prompts = getattr(params, "prompts", None)
        if prompts is not None:
            if prompts < 1:
                raise BadRequest(f"prompts must be at least 1, got {prompts}")
            if prompts > self.max_prompts:
                raise BadRequest(f"prompts={prompts} is over this server's limit of {self.max_prompts} "
                                 f"(HEADLENS_MAX_PROMPTS)")
        shots = getattr(params, "shots", None)
        shot_list = [shots] if isinstance(shots, int) else list(shots or [])
        for k in shot_list:
            if k < 0:
                raise BadRequest(f"shots must be non-negative, got {k}")
            if k > self.max_shots:
                raise BadRequest(f"shots={k} is over this server's limit of {self.max_shots} (HEADLENS_MAX_SHOTS)")
        if task is not None and shot_list:
            self._check_prompts(task, max(shot_list), prompts or 1, getattr(params, "seed", 0))

    def check_work(self, estimate: Any) -> None:
        """Refuse a job whose estimated work (`estimate.Estimate.passes`: prompt passes of the job's own prompts,
        from its params, the model's files and the task, never from a loaded model) is over the limit."""
        n = estimate.passes
        if n > self.max_work:
            raise BadRequest(f"this job would run about {n:,.0f} prompt passes ({estimate.how}), over this server's "
                             f"limit of {self.max_work:,} (HEADLENS_MAX_WORK); use fewer prompts, values, layers, "
                             f"steps or seeds")

    def _check_prompts(self, task: "Task", shots: int, n: int, seed: int) -> None:
        from ..tasks.base import TaskError

        try:
            sample = task.build_prompts(shots, min(n, 8), seed)
        except TaskError as e:
            raise BadRequest(str(e)) from None
        longest = max((len(p.text.encode("utf-8")) for p in sample), default=0)
        estimate = -(-longest // BYTES_PER_TOKEN)
        if estimate > self.max_tokens:
            raise BadRequest(f"prompts of task {task.name!r} with {shots} demonstrations run to about {estimate} "
                             f"tokens, over this server's limit of {self.max_tokens} (HEADLENS_MAX_TOKENS); "
                             f"use fewer shots")

    def check_upload(self, n_bytes: int) -> None:
        if n_bytes > self.max_upload_bytes:
            raise TooLarge(f"the upload is {n_bytes / 2**20:.2f} MB, over this server's limit of "
                           f"{self.max_upload_bytes / 2**20:.2f} MB (HEADLENS_MAX_UPLOAD_MB)")

    def check_tensor_upload(self, n_bytes: int) -> None:
        if n_bytes > self.max_tensor_bytes:
            raise TooLarge(f"the tensor file is {n_bytes / 2**20:.2f} MB, over this server's limit of "
                           f"{self.max_tensor_bytes / 2**20:.2f} MB (HEADLENS_MAX_TENSOR_MB)")

    @property
    def max_tensor_body_bytes(self) -> int:
        """Body limit of POST /tensors: the file (raw, or in a multipart form) plus 64 KB."""
        return self.max_tensor_bytes + (1 << 16)

    @property
    def max_upload_body_bytes(self) -> int:
        """Body limit of POST /tasks/upload: the file, JSON-escaped (up to twice its size), plus 64 KB."""
        return 2 * self.max_upload_bytes + (1 << 16)

    def body_too_large(self, n_bytes: int | None, limit: int, upload: bool = False) -> TooLarge:
        """The 413 for a request body over `limit` bytes (`n_bytes` None: a chunked body past the limit)."""
        size = f"is {n_bytes / 1024:.0f} KB," if n_bytes is not None else "runs"
        if upload:
            return TooLarge(f"the upload request {size} over this server's limit for a task file of "
                            f"{self.max_upload_bytes / 2**20:.2f} MB (HEADLENS_MAX_UPLOAD_MB)")
        return TooLarge(f"the request body {size} over this server's limit of {limit / 1024:.0f} KB "
                        f"(HEADLENS_MAX_BODY_KB); task files go to POST /tasks/upload")

    def check_queue(self, active: int) -> None:
        """Called by a job runner before it queues a new (not deduplicated) job."""
        if active >= self.max_queue:
            raise Busy(f"the job queue is full ({active} jobs waiting or running; HEADLENS_MAX_QUEUE="
                       f"{self.max_queue}); try again when some have finished")
