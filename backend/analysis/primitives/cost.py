"""What a job costs, as a function of its params (no torch here): the arithmetic each kind's `work` is written in.

A kind's `work(shape, sizes)` is its **plan**: its stages in the order its run takes them (`Work.stages`, each a
`Cost`). Admission counts its totals (the work limit) and its `units` (the estimate: `service/timing.py`); the run's
progress bar gives each stage the share its weight is of the whole (`stages.plan_spans`). One plan for both.

Counted in tokens through the whole model and forward calls: a full pass of a T-token prompt is T tokens, a
one-token step over a KV cache 1, an all-position ablation from a later layer on the share of the layers it runs;
`train` tokens run a backward pass too (about twice a forward). The model enters as its `Shape` (read from its
config), the prompts as their `Sizes` (from the task and the model's tokenizer, or bytes).

    w = passes("ICL", 50, sizes.prompt(8)) + passes("zero-shot", 50, sizes.prompt(0))
    w.tokens, w.calls, w.units(shape), w.how()
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

BYTES_PER_TOKEN = 4  # rough UTF-8 bytes per BPE token of natural text, when no tokenizer is at hand
INDUCTION_BATCH, INDUCTION_TOKENS = 4, 50  # induction scores: a batch of [bos] r r, r of 50 tokens
BATCH, STEP_BATCH = 16, 128  # rows per forward call: the prompts' batch size; the sweep engine's step passes (its
# batch of 32 prompts, options.SWEEP_BATCH_SIZE, x engine_fast.STEP_ROWS_FACTOR configurations packed per row)
ALL_POSITION_SHARE = 0.8
"""The share of a full pass an all-position head ablation of unknown heads costs (it starts at the first layer it
changes; top heads and random sets usually include an early layer)."""


@dataclass(frozen=True)
class Shape:
    """The model's size as the cost model needs it; `source` says where it came from (config, gguf, assumed).
    `n_params`: the parameters a token passes through, the decoder layers' (the embedding is a lookup, the
    unembedding runs for the last token only)."""

    n_layers: int
    n_heads: int
    d_model: int
    max_positions: int | None = None
    n_params: int | None = None
    source: str = "assumed"
    logit_tokens: float = 0.0
    """A row of full-vocabulary logits in tokens through the whole model: the unembedding's weights over the
    decoder layers' (0: unknown)."""

    @property
    def heads(self) -> int:
        return self.n_layers * self.n_heads


ASSUMED = Shape(32, 32, 4096, 8192, 6_500_000_000, "assumed")
"""A model whose files cannot be read without loading it (a Hugging Face id not downloaded): a 7B-class one."""


@dataclass(frozen=True)
class Sizes:
    """Tokens of the job's prompts: `query` (the prompt without demonstrations), `demo` (one more demonstration),
    `answer` (a gold answer); `queries` and `pool`: the task's held-out queries and demonstration pool (None:
    unknown); `source`: tokenizer or bytes."""

    query: float = 8.0
    demo: float = 8.0
    answer: float = 2.0
    source: str = "assumed"
    queries: int | None = None
    pool: int | None = None
    tasks: tuple[str, ...] = ()  # the tasks a kind over several tasks runs (empty: unknown)

    def prompt(self, shots: int) -> float:
        """Tokens of one prompt with `shots` demonstrations."""
        return self.query + max(int(shots), 0) * self.demo

    def n(self, prompts: int) -> int:
        """Prompts of held-out queries a job scores: as many as asked, at most the task's queries."""
        return min(prompts, self.queries) if self.queries else prompts


GENERIC = Sizes()
"""Prompts of a job without one task (a kind over several tasks): a typical built-in task's."""


def sizes_of(task: object, count: Callable[[str], int] | None = None, seed: int = 0, k: int = 4) -> Sizes:
    """The `Sizes` of a task's prompts: tokens of a few 0-shot and k-shot prompts, counted by `count` (a tokenizer's
    length; None: UTF-8 bytes / BYTES_PER_TOKEN). A task that cannot build them gets GENERIC."""
    source = "tokenizer" if count is not None else "bytes"
    count = count or (lambda text: -(-len(text.encode("utf-8")) // BYTES_PER_TOKEN))
    try:
        fixed = getattr(task, "fixed", None)
        if fixed is not None:  # prompts given as they are: no demonstrations to add
            texts = [p.text for p in list(fixed)[:8]]
            q = sum(count(t) for t in texts) / max(len(texts), 1)
            return Sizes(q, 0.0, 2.0, source, len(fixed), 0)
        try:
            pool, queries = task.split(seed)  # type: ignore[attr-defined]
            n_pool, n_queries = len(pool), len(queries)
        except Exception:
            n_pool = n_queries = None
        zero = task.build_prompts(0, 4, seed)  # type: ignore[attr-defined]
        few, shots = [], 0
        for shots in (k, 2, 1):
            try:
                few = task.build_prompts(shots, 4, seed)  # type: ignore[attr-defined]
                break
            except Exception:  # too few demonstrations for k
                continue
        q = sum(count(p.text) for p in zero) / len(zero)
        demo = max((sum(count(p.text) for p in few) / len(few) - q) / shots, 1.0) if few else GENERIC.demo
        answer = sum(max(count(" " + p.gold), 1) for p in zero) / len(zero)
        return Sizes(q, demo, answer, source, n_queries or None, n_pool)
    except Exception:
        return GENERIC


def mean_sizes(many: Sequence[Sizes], names: Sequence[str]) -> Sizes:
    """The mean prompt sizes of several tasks (a kind that runs each, `names`)."""
    if not many:
        return GENERIC
    k = len(many)
    mean = lambda f: sum(getattr(s, f) for s in many) / k  # noqa: E731
    queries = [s.queries for s in many if s.queries]
    pools = [s.pool for s in many if s.pool]
    return Sizes(mean("query"), mean("demo"), mean("answer"), many[0].source, min(queries) if queries else None,
                 min(pools) if pools else None, tuple(names))


@dataclass(frozen=True)
class Cost:
    """One stage's cost: tokens through the whole model (`train` of them in training forward passes, each followed
    by its backward pass), forward `calls` (`train_calls` of them training steps) and `logits`, rows of
    full-vocabulary logits (a training's counted 3x: forward and backward)."""

    tokens: float = 0.0
    train: float = 0.0
    calls: float = 0.0
    train_calls: float = 0.0
    logits: float = 0.0

    def __add__(self, o: "Cost") -> "Cost":
        return Cost(self.tokens + o.tokens, self.train + o.train, self.calls + o.calls,
                    self.train_calls + o.train_calls, self.logits + o.logits)

    def __mul__(self, k: float) -> "Cost":
        return Cost(self.tokens * k, self.train * k, self.calls * k, self.train_calls * k, self.logits * k)

    def weight(self, shape: "Shape") -> float:
        """Its time in tokens through the whole model, as the progress bar weighs it: a token 1, a training
        token 3 (forward and backward), a call OVERHEAD_TOKENS (reading the weights), a row of logits the
        unembedding's share of the model (`Shape.logit_tokens`)."""
        return (self.tokens + 2 * self.train + OVERHEAD_TOKENS * (self.calls + 2 * self.train_calls)
                + self.logits * shape.logit_tokens)


OVERHEAD_TOKENS = 16
"""A forward call's fixed cost in tokens: on a CPU a pass of a few rows is bound by reading the weights, about as
much as this many more tokens (SmolLM2-135M: a 4-row training step runs at the speed of ~20 tokens)."""


@dataclass(frozen=True)
class Work:
    """A job's cost plan: its stages in the order it runs them, each a named `Cost`. Its totals are what admission
    and the estimate count (`service/estimate.py`); its stages' weights are the progress bar's shares
    (`stages.plan_spans`). Adding two plans keeps the order and merges stages of one name."""

    stages: tuple[tuple[str, Cost], ...] = field(default=())

    def _total(self, f: str) -> float:
        return float(sum(getattr(c, f) for _, c in self.stages))

    tokens = property(lambda self: self._total("tokens"))
    train = property(lambda self: self._total("train"))
    calls = property(lambda self: self._total("calls"))
    train_calls = property(lambda self: self._total("train_calls"))
    logits = property(lambda self: self._total("logits"))

    @property
    def parts(self) -> tuple[tuple[str, float], ...]:
        """(stage, tokens) in order."""
        return tuple((n, c.tokens) for n, c in self.stages)

    def cost(self) -> Cost:
        """The whole plan as one Cost."""
        return sum((c for _, c in self.stages), Cost())

    def units(self, shape: "Shape") -> float:
        """Its time in token-equivalents (`Cost.weight`): what the estimate multiplies by seconds per unit."""
        return float(sum(c.weight(shape) for _, c in self.stages))

    def stage(self, name: str) -> Cost:
        """The stage called `name` (an empty Cost when there is none)."""
        return dict(self.stages).get(name, Cost())

    def __add__(self, other: "Work") -> "Work":
        return Work(_merge(self.stages + other.stages))

    def __mul__(self, k: float) -> "Work":
        return Work(tuple((n, c * k) for n, c in self.stages))

    __rmul__ = __mul__

    def named(self, name: str) -> "Work":
        """The same work as one stage called `name`."""
        c = self.cost()
        return Work(((name, c),)) if c != Cost() else NONE

    def without(self, names: "set[str] | frozenset[str]") -> "Work":
        """The same plan less the stages called `names` (work a job will skip: e.g. a clean pass whose states are
        held in memory, a sub-result already cached)."""
        return Work(tuple(s for s in self.stages if s[0] not in names))

    def passes(self, per_pass: float) -> float:
        """In passes of a prompt of `per_pass` tokens."""
        return self.tokens / max(per_pass, 1.0)

    def how(self, top: int = 4) -> str:
        """The largest parts, e.g. `training 40,000 tokens, ICL 1,300, zero-shot 150`."""
        parts = sorted((p for p in self.parts if p[1] >= 0.5), key=lambda p: -p[1])
        if not parts:
            return "no forward passes"
        shown = ", ".join(f"{n} {t:,.0f}" for n, t in parts[:top])
        rest = len(parts) - top
        return f"{shown} tokens" + (f" (+{rest} smaller part{'s' if rest != 1 else ''})" if rest > 0 else "")


NONE = Work()


def _merge(stages: tuple[tuple[str, Cost], ...]) -> tuple[tuple[str, Cost], ...]:
    out: dict[str, Cost] = {}
    for n, c in stages:
        out[n] = out[n] + c if n in out else c
    return tuple(out.items())


def batches(rows: float, batch: float) -> float:
    """Forward calls of `rows` rows in batches of `batch`: ceil(rows / batch) (0 for no rows)."""
    return float(math.ceil(rows / max(batch, 1) - 1e-9)) if rows > 0 else 0.0


def passes(name: str, n: float, tokens: float, batch: float = BATCH, repeat: float = 1, logits: float = 1) -> Work:
    """`repeat` x `n` full forward passes of prompts of `tokens` tokens, `batch` rows per call, `logits` rows of
    logits per prompt (its last token's; 0: a pass that only captures states)."""
    return stage(name, Cost(repeat * n * tokens, 0.0, repeat * batches(n, batch), 0.0, repeat * n * logits))


def stage(name: str, c: Cost) -> Work:
    """A plan of one stage (none when `c` is empty)."""
    return Work(((name, c),)) if c != Cost() else NONE


def steps(name: str, n: float, batch: float = STEP_BATCH, repeat: float = 1, share: float = 1.0) -> Work:
    """`repeat` x `n` one-token steps over a KV cache (decoding, last-token configurations), `batch` rows per
    call, each through the `share` of the model's layers it runs (a step from a later layer on: its tokens and its
    calls' fixed cost both scale with the layers run), with its row of logits."""
    return stage(name, Cost(float(repeat * n * share), 0.0, repeat * batches(n, batch) * share, 0.0,
                            float(repeat * n)))


def training(name: str, n: float, tokens: float, batch: float = 1) -> Work:
    """`n` training forward passes of prompts of `tokens` tokens (each with its backward pass), `batch` rows per
    step."""
    calls = batches(n, batch)
    return stage(name, Cost(n * tokens, n * tokens, calls, calls, 3.0 * n))


def induction(shape: Shape) -> Work:
    """The induction scores' pass: a batch of [bos] r r (r shortened to fit the trained context)."""
    n = INDUCTION_TOKENS if not shape.max_positions else max(1, min(INDUCTION_TOKENS, (shape.max_positions - 1) // 2))
    return passes("induction", INDUCTION_BATCH, 2 * n + 1)


def generation(name: str, n: float, tokens: float, max_new_tokens: int, batch: float = BATCH) -> Work:
    """Greedy generation of `n` prompts of `tokens` tokens: the prefill, then `max_new_tokens` - 1 decoding steps (a
    batch decodes until its last row has stopped, and one row that does not stop is the rule, not the exception:
    measured on zero-shot prompts, where the answer rambles on)."""
    return (passes(name, n, tokens, batch) + steps(name, n, batch, max(max_new_tokens - 1, 0))).named(name)


def ablation_share(shape: Shape, heads: Sequence[tuple[int, int]] | None = None) -> float:
    """The share of a full pass an all-position head ablation costs: from its first ablated layer on."""
    if not heads:
        return ALL_POSITION_SHARE
    first = min(l for l, _ in heads)
    return max(shape.n_layers - first, 1) / max(shape.n_layers, 1)
