"""Kind `task_fit`: does a task fit a model? Checked before anything runs.

Two things make a task unusable on a model, and neither shows in the results:
- words the tokenizer does not know: a word-level tokenizer (the embedded default model's) maps them to its
  unknown token, so the prompts the model sees are mostly `<unk>`; only labels used to be checked;
- prompts longer than the context window (the analyses then drop demonstrations).

`fit` measures the share of inputs, input tokens, labels and template tokens that are unknown, and the longest
prompt at the asked shots against the context window, and gives a verdict: `ok`, `warn` or `refuse` (inputs
mostly unknown, classification labels unknown, or not even zero-shot prompts fit). The shots-independent part
(`primitives.fit.require_fit`) runs before every other analysis computes (`kernel.analyze`, the kinds with
`needs_fit`), so a task that does not fit fails with a clear TaskError instead of running to meaningless results.
"""
from __future__ import annotations

from typing import Any

from pydantic import Field

from ..primitives import options as o

from ..primitives.options import PERTURBATIONS
from ...tasks.base import Task, TaskError
from ..kernel import Context
from ..params import BosParams, Int
from ..primitives.bos import prompt_ids
from ..primitives.cost import NONE, Shape, Sizes, Work
from ..results import Model, Result
from ..primitives.fit import verdict, vocabulary_fit


class TaskFitParams(BosParams):
    """kind `task_fit`: does the task fit the model (unknown tokens in inputs and labels, prompt length)?"""

    shots: Int = Field(o.SHOTS, ge=0, description="demonstrations per prompt (for the prompt length)")
    seed: Int = Field(o.SEED, ge=0)

    def work(self, shape: Shape, sizes: Sizes) -> Work:
        return NONE  # the tokenizer only


class ContextFit(Model):
    longest_prompt: int = Field(..., description="tokens of the longest of a few prompts at `shots`")
    context_window: int | None = None
    shots: int
    shots_that_fit: int = Field(..., description="most demonstrations whose prompts fit (-1: not even zero-shot)")


class TaskFitResult(Result):
    """Does the task fit the model: unknown-token shares (0..1), prompt length, and a verdict with its reasons."""

    verdict: str = Field(..., description="ok | warn | refuse")
    messages: list[str] = Field(default_factory=list)
    has_unknown_token: bool
    n_inputs: int
    n_labels: int
    unknown_inputs: float = Field(..., description="share of inputs with at least one unknown token")
    unknown_input_tokens: float = Field(..., description="share of the inputs' tokens that are unknown")
    unknown_labels: float
    unknown_template: float
    unknown_words: list[str] = Field(default_factory=list)
    unknown_label_words: list[str] = Field(default_factory=list)
    context: ContextFit | None = None
    perturbations: dict[str, str | None] = Field(default_factory=dict, description="perturbation -> None when "
                                                 "it can run on this model and task, else why not")


LENGTH_PROMPTS = 16  # prompts whose length is measured


def context_fit(lm: Any, task: Task, shots: int, seed: int) -> dict[str, Any]:
    """The longest of a few prompts at `shots` (in tokens) against the context window, and the most shots
    (halving, as the analyses do) whose prompts fit."""
    window = lm.max_positions
    n = max(1, min(LENGTH_PROMPTS, task.n_queries(seed)))

    def longest(k: int) -> int:
        return max(len(prompt_ids(lm.tokenizer, p.text)) for p in task.build_prompts(k, n, seed))

    first = longest(shots)
    k, length = shots, first
    while window and length > window and k > 0:
        k = k // 2 if k > 1 else 0
        length = longest(k)
    return {"longest_prompt": first, "context_window": window, "shots": shots,
            "shots_that_fit": k if not window or length <= window else -1}


def perturbation_fit(lm: Any, task: Task, shots: int, seed: int) -> dict[str, str | None]:
    """Which demonstration perturbations can run on this model and task: None, or why not (kind `perturbation_report`
    skips those with this reason)."""
    from ...tasks.perturb import get_perturbation
    from ..primitives.batching import build_prompts, encode

    out: dict[str, str | None] = {}
    for name in PERTURBATIONS:
        try:
            built = build_prompts(lm, task, shots, 2, seed, perturb=get_perturbation(name))
            encode(lm, built.prompts, task.kind)
            out[name] = None
        except TaskError as e:
            out[name] = str(e)
    return out


def task_fit(ctx: Context, p: TaskFitParams) -> dict[str, Any]:
    """Unknown-token shares, prompt length against the context window, and a verdict with its reasons."""
    lm, task = ctx.lm, ctx.task
    ctx.progress(0.0, "tokenising the task")
    v = vocabulary_fit(lm, task)
    ctx.progress(0.6, "measuring prompt lengths")
    try:
        v["context"] = context_fit(lm, task, p.shots, p.seed)
    except TaskError as e:  # prompts that cannot be built (too few examples for the shots, ...)
        v["context"] = None
        ctx.warn(str(e))
    v["verdict"], v["messages"] = verdict(v, task.kind)
    ctx.progress(0.8, "checking the perturbations")
    v["perturbations"] = perturbation_fit(lm, task, p.shots, p.seed) if v["verdict"] != "refuse" else {}
    return v
