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
BATCH, STEP_BATCH = 16, 128  # rows per call: the prompts' batch; the configuration engine's one-token steps
ALL_POSITION_SHARE = 0.8  # of a full pass, an all-position ablation of heads not known yet (from its first layer on)
OVERHEAD_TOKENS = 16  # a call's fixed cost (reading the weights) in tokens (SmolLM2: a 4-row step ~ 20 tokens)


@dataclass(frozen=True)
class Shape:
    """The model's size; `source`: config, gguf, loaded or assumed. `n_params`: the decoder layers' parameters (what
    a token passes through); `logit_tokens`: a row of full-vocabulary logits in tokens (unembedding / decoder);
    `n_kv_heads`: key / value heads per layer (grouped-query attention), None where not read (`kv_heads`)."""

    n_layers: int
    n_heads: int
    d_model: int
    max_positions: int | None = None
    n_params: int | None = None
    source: str = "assumed"
    logit_tokens: float = 0.0
    n_kv_heads: int | None = None

    @property
    def heads(self) -> int:
        return self.n_layers * self.n_heads

    @property
    def kv_heads(self) -> int:
        """Key / value heads per layer: `n_kv_heads`, or as many as query heads where unknown (an upper bound)."""
        return self.n_kv_heads or self.n_heads


ASSUMED = Shape(32, 32, 4096, 8192, 6_500_000_000, "assumed")  # files not readable (a hub id not fetched): 7B-class


@dataclass(frozen=True)
class Sizes:
    """Tokens of a task's prompts: `query` (no demonstrations), `demo` (one more), `answer` (a gold answer);
    `queries`, `pool`: its held-out queries and demonstrations (None: unknown); `source`: tokenizer or bytes."""

    query: float = 8.0
    demo: float = 8.0
    answer: float = 2.0
    source: str = "assumed"
    queries: int | None = None
    pool: int | None = None
    tasks: tuple[str, ...] = ()  # the tasks a kind over several tasks runs (empty: unknown)

    def prompt(self, shots: int) -> float:
        return self.query + max(int(shots), 0) * self.demo

    def n(self, prompts: int) -> int:
        """Prompts a job scores: as many as asked, at most the task's queries."""
        return min(prompts, self.queries) if self.queries else prompts


GENERIC = Sizes()  # a job without one task: a typical built-in task's prompts


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
    """One stage: tokens through the model (`train` of them in training passes, each with a backward pass), forward
    `calls` (`train_calls` training steps) and `logits`, rows of full-vocabulary logits."""

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
        """Its time in tokens: a token 1, a training token 3, a call OVERHEAD_TOKENS, a logits row logit_tokens."""
        return (self.tokens + 2 * self.train + OVERHEAD_TOKENS * (self.calls + 2 * self.train_calls)
                + self.logits * shape.logit_tokens)


@dataclass(frozen=True)
class Work:
    """A job's plan: its named stages (`Cost`) in the order it runs them; adding plans keeps the order and merges
    stages of one name."""

    stages: tuple[tuple[str, Cost], ...] = field(default=())

    def _total(self, f: str) -> float:
        return float(sum(getattr(c, f) for _, c in self.stages))

    tokens = property(lambda self: self._total("tokens"))
    train = property(lambda self: self._total("train"))
    calls = property(lambda self: self._total("calls"))
    train_calls = property(lambda self: self._total("train_calls"))
    logits = property(lambda self: self._total("logits"))

    def cost(self) -> Cost:
        return sum((c for _, c in self.stages), Cost())

    def units(self, shape: "Shape") -> float:
        """Its time in token-equivalents (`Cost.weight`): what the estimate multiplies by seconds per unit."""
        return float(sum(c.weight(shape) for _, c in self.stages))

    def stage(self, name: str) -> Cost:
        return dict(self.stages).get(name, Cost())

    def __add__(self, other: "Work") -> "Work":
        return Work(_merge(self.stages + other.stages))

    def __mul__(self, k: float) -> "Work":
        return Work(tuple((n, c * k) for n, c in self.stages))

    __rmul__ = __mul__

    def named(self, name: str) -> "Work":
        """The same work as one stage called `name`."""
        return stage(name, self.cost())

    def without(self, names: "set[str] | frozenset[str]") -> "Work":
        """Less the stages called `names` (work a job skips: states held in memory, a cached sub-result)."""
        return Work(tuple(s for s in self.stages if s[0] not in names))

    def passes(self, per_pass: float) -> float:
        """In passes of a prompt of `per_pass` tokens."""
        return self.tokens / max(per_pass, 1.0)

    def how(self, top: int = 4) -> str:
        """The largest parts, e.g. `training 40,000 tokens, ICL 1,300, zero-shot 150`."""
        parts = sorted(((n, c.tokens) for n, c in self.stages if c.tokens >= 0.5), key=lambda p: -p[1])
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
    """`repeat` x `n` full passes of `tokens`-token prompts, `batch` rows a call, `logits` rows of logits each."""
    return stage(name, Cost(repeat * n * tokens, 0.0, repeat * batches(n, batch), 0.0, repeat * n * logits))


def stage(name: str, c: Cost) -> Work:
    """A plan of one stage (none when `c` is empty)."""
    return Work(((name, c),)) if c != Cost() else NONE


def steps(name: str, n: float, batch: float = STEP_BATCH, repeat: float = 1, share: float = 1.0) -> Work:
    """`repeat` x `n` one-token steps over a KV cache, `batch` rows a call, through the `share` of the layers they
    run (tokens and calls scale with it), each with its row of logits."""
    return stage(name, Cost(float(repeat * n * share), 0.0, repeat * batches(n, batch) * share, 0.0,
                            float(repeat * n)))


def training(name: str, n: float, tokens: float, batch: float = 1) -> Work:
    """`n` training passes of `tokens`-token prompts (each with its backward pass), `batch` rows a step."""
    calls = batches(n, batch)
    return stage(name, Cost(n * tokens, n * tokens, calls, calls, 3.0 * n))


def induction(shape: Shape) -> Work:
    """The induction scores' pass: a batch of [bos] r r (r shortened to fit the trained context)."""
    n = INDUCTION_TOKENS if not shape.max_positions else max(1, min(INDUCTION_TOKENS, (shape.max_positions - 1) // 2))
    return passes("induction", INDUCTION_BATCH, 2 * n + 1)


def generation(name: str, n: float, tokens: float, max_new_tokens: int, batch: float = BATCH) -> Work:
    """Greedy generation: the prefill, then `max_new_tokens` - 1 steps (a batch runs until its last row stops, and
    one row that does not stop is the rule on zero-shot prompts)."""
    return (passes(name, n, tokens, batch) + steps(name, n, batch, max(max_new_tokens - 1, 0))).named(name)


def ablation_share(shape: Shape, heads: Sequence[tuple[int, int]] | None = None) -> float:
    """The share of a full pass an all-position head ablation costs: from its first ablated layer on."""
    if not heads:
        return ALL_POSITION_SHARE
    first = min(l for l, _ in heads)
    return max(shape.n_layers - first, 1) / max(shape.n_layers, 1)
