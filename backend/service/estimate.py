"""A job's estimated work and time, before it runs: what admission checks against HEADLENS_MAX_WORK, what
`POST /jobs/estimate` answers and what a page shows beside its Run button.

    e = estimate(spec, params, "smollm2-135m", task)
    e.passes, e.seconds, e.how

Work comes from the kind's params alone (`Params.work(shape, sizes)`, in tokens through the model): the model's
`Shape` and the prompts' `Sizes` are read from the model's files and the task (`model_shape.py`), never from a
loaded model, so a job is admitted or refused the same on a fresh service and on one that has it resident.
`passes` is the work in prompts of the job's own length (`Params.reference_shots`): the unit of HEADLENS_MAX_WORK.

Seconds = (tokens + 2 x training tokens) x seconds per token, from (in order):
1. the figure `model_info` measured on this model (`primitives/token_speed.py`, recorded here by the runners);
2. else a fallback from the model's size: 2 x parameters FLOP per token at FALLBACK_FLOPS (a shared CPU) or
   FALLBACK_GPU_FLOPS, marked `assumed`.
"""
from __future__ import annotations

import threading
from dataclasses import asdict, dataclass
from typing import Any

from ..analysis.primitives.cost import GENERIC, Shape, Sizes, mean_sizes, sizes_of
from .model_shape import model_shape, token_counter

FALLBACK_FLOPS = 5e10  # effective FLOP/s of a batched forward pass on 2 CPU cores (SmolLM2-135M, measured: ~7e10)
FALLBACK_GPU_FLOPS = 2e13
_SPEEDS: dict[str, float] = {}
_SIZES: dict[tuple[str, str], Sizes] = {}
_LOCK = threading.Lock()


@dataclass(frozen=True)
class Estimate:
    passes: float
    tokens: float
    train_tokens: float
    how: str
    seconds: float | None
    seconds_basis: str  # measured | assumed
    seconds_per_token: float | None
    shape: Shape
    sizes: Sizes
    held_tokens: float = 0.0  # of `tokens`, those the job skips (states an earlier pass kept): not in `seconds`

    def to_json(self) -> dict[str, Any]:
        return {"passes": round(self.passes, 1), "tokens": round(self.tokens), "train_tokens": round(self.train_tokens),
                "held_tokens": round(self.held_tokens),
                "how": self.how, "seconds": self.seconds,
                "seconds_basis": self.seconds_basis, "seconds_per_token": self.seconds_per_token,
                "shape": asdict(self.shape), "sizes": asdict(self.sizes)}


def note_speed(model: str | None, result: dict[str, Any] | None) -> None:
    """Keep the seconds per token a `model_info` result measured for `model` (a canonical name)."""
    v = (result or {}).get("seconds_per_token")
    if model and isinstance(v, (int, float)) and v > 0:
        with _LOCK:
            _SPEEDS[model] = float(v)


def measured_speed(model: str | None) -> float | None:
    with _LOCK:
        return _SPEEDS.get(model or "")


def task_sizes(task: Any, model: str | None) -> Sizes:
    """The task's prompt sizes under the model's tokenizer (memoised by task content and model; seed 0)."""
    key = (task.content_hash(), model or "")
    with _LOCK:
        if key in _SIZES:
            return _SIZES[key]
    got = sizes_of(task, token_counter(model))
    with _LOCK:
        if len(_SIZES) > 4096:
            _SIZES.clear()
        _SIZES[key] = got
    return got


def job_sizes(spec: Any, p: Any, model: str | None, task: Any) -> Sizes:
    """The prompt sizes of a job: its task's, or (a kind over several tasks) the mean of the tasks it runs."""
    if task is not None:
        return task_sizes(task, model)
    if "tasks" in type(p).model_fields:
        from ..tasks.registry import builtin_by_names, model_tasks

        try:
            tasks = builtin_by_names(p.tasks, spec.name) if p.tasks else model_tasks(model or "default")
        except Exception:
            return GENERIC
        return mean_sizes([task_sizes(t, model) for t in tasks], [t.name for t in tasks])
    return GENERIC


def estimate(spec: Any, p: Any, model: str | None, task: Any = None, device: str = "cpu", lm: Any = None) -> Estimate:
    """The estimate of job `spec` with params `p` on the model of canonical name `model` (None: a kind without
    one) and `task` (the Task, or None). `lm`: the model when it is resident; the parts of the work its params'
    `held(lm, task)` names (states an earlier pass kept in memory, e.g. a toggle's clean prefix) are left out of its
    seconds (not of its work: the work limit is the same whether the model is loaded or not)."""
    shape = model_shape(model) if model else Shape(0, 0, 0, None, 0, "none")
    if not hasattr(p, "work"):  # a params model that declares no cost (a kind registered at run time: tests, plugins)
        return Estimate(0.0, 0.0, 0.0, "no cost declared", None, "unknown", None, shape, GENERIC)
    sizes = job_sizes(spec, p, model, task)
    w = p.work(shape, sizes)
    held = w.tokens - w.without(p.held(lm, task)).tokens if lm is not None and hasattr(p, "held") else 0.0
    per_token, basis = measured_speed(model), "measured"
    if per_token is None and shape.n_params:
        per_token = 2 * shape.n_params / (FALLBACK_GPU_FLOPS if device.startswith("cuda") else FALLBACK_FLOPS)
        basis = "assumed"
    seconds = (w.tokens - held + 2 * w.train) * per_token if per_token is not None else None
    how = w.how() + (f"; {held:,.0f} of them held in memory from an earlier pass" if held else "")
    return Estimate(w.passes(sizes.prompt(p.reference_shots())), w.tokens, w.train, how, seconds, basis,
                    per_token, shape, sizes, held)


def canonical_name(model: str) -> str:
    """The canonical name of a model named on the command line (its estimate reads the model's files); the name
    itself when it names no model (loading it then says why)."""
    from ..model_sources import resolve
    from ..text import model_name_problem

    if model_name_problem(model):
        return model
    try:
        return resolve(model).name
    except (ValueError, OSError, RuntimeError):
        return model
