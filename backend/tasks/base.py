"""Task and prompt records: the data every analysis consumes.

A *task* is a set of (input, output) examples plus a template; it turns into *prompts*, each a string
that ends right before the answer, with its gold answer and its candidate label words.
Label words carry the text that follows the prompt verbatim (usually a leading space: `" positive"`).
"""
from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, field
from typing import Callable, Literal, Protocol, Sequence

from ..errors import BadInput

Kind = Literal["classification", "generation"]
Queries = Literal["held_out", "pool"]

DEFAULT_TEMPLATE = "Q: {input}\nA: {output}\n\n"


class TaskError(BadInput):
    """A task, task file or prompt set that cannot be used, with a message for the user."""


@dataclass(frozen=True)
class Prompt:
    """One scored prompt.

    text:   the prompt, ending right before the answer (`"...Q: great film\\nA:"`).
    gold:   the gold answer as it continues `text` (`" positive"`).
    labels: candidate answers in the same form, gold included; the label subspace is spanned by the
            unembedding rows of their first tokens.
    query:  the query input, for display; n_shots: demonstrations in the prompt.
    """

    text: str
    gold: str
    labels: tuple[str, ...]
    query: str = ""
    n_shots: int = 0

    def __post_init__(self) -> None:
        if self.gold not in self.labels:
            raise TaskError(f"gold answer {self.gold!r} is not among the prompt's labels {list(self.labels)}")


@dataclass(frozen=True)
class Template:
    """A demonstration template with `{input}` and `{output}` slots, e.g. `"Q: {input}\\nA: {output}\\n\\n"`.

    A demonstration is the template filled in; the query is the template cut right before `{output}`,
    with the whitespace that precedes `{output}` moved onto the answer (so answers read `" positive"`).
    """

    text: str = DEFAULT_TEMPLATE

    def __post_init__(self) -> None:
        t = self.text
        if t.count("{input}") != 1 or t.count("{output}") != 1 or t.index("{input}") > t.index("{output}"):
            raise TaskError(f"template {t!r} must contain {{input}} once, then {{output}} once")

    @property
    def _parts(self) -> tuple[str, str, str]:
        head, tail = self.text.split("{output}")
        stripped = head.rstrip(" ")
        return stripped, head[len(stripped):], tail  # (before answer, answer prefix, after answer)

    def demo(self, x: str, y: str) -> str:
        # Fill the slots positionally: an input that itself contains "{output}" must stay verbatim.
        pre, rest = self.text.split("{input}")
        mid, post = rest.split("{output}")
        return pre + x + mid + y + post

    def query(self, x: str) -> str:
        return self._parts[0].replace("{input}", x)

    def answer(self, y: str) -> str:
        return self._parts[1] + y


PromptBuilder = Callable[["Task", int, int, int], list[Prompt]]
Pair = tuple[str, str]


class DemoPerturbation(Protocol):
    """What prompt building needs of a perturbation (`tasks.perturb.Perturbation` is one): a name, a change to
    the demonstrations, an optional renaming of the classes, and a check that the task admits it."""

    name: str

    @property
    def demos(self) -> Callable[["Task", list[Pair], random.Random], list[Pair]]: ...

    @property
    def relabel(self) -> Callable[["Task"], dict[str, str]] | None: ...

    def check(self, task: "Task") -> None: ...


@dataclass
class Task:
    """A task: name, kind, examples and template; classification tasks also fix their label set.

    `builder`, when set, replaces the template-based prompt construction (synthetic tasks whose label
    words are redrawn per prompt use it). `models` says which models the task is meant for:
    "any" for natural-language tasks, "default" for the embedded model's task language.
    """

    name: str
    kind: Kind
    examples: list[tuple[str, str]]
    template: Template = field(default_factory=Template)
    labels: tuple[str, ...] | None = None
    description: str = ""
    models: str = "any"
    builder: PromptBuilder | None = None
    version: str = ""  # bump when a builder's output changes; part of the content hash
    fixed: tuple[Prompt, ...] | None = None  # a prompt set scored as given (see `from_prompts`)

    @classmethod
    def from_prompts(cls, name: str, prompts: Sequence[Prompt], kind: Kind = "classification") -> "Task":
        """A task whose prompts are given (bring-your-own prompts): `build_prompts` returns the first n of
        them, whatever the shots; the content hash covers every prompt's text, gold and labels."""
        if not prompts:
            raise TaskError(f"prompt set {name!r} is empty")
        return cls(name, kind, [(p.text, p.gold) for p in prompts], labels=None, models="any",
                   description=f"{len(prompts)} prompts scored as given", fixed=tuple(prompts),
                   builder=_fixed_prompts)

    def __post_init__(self) -> None:
        if not self.examples and self.builder is None:
            raise TaskError(f"task {self.name!r} has no examples")
        if self.kind not in ("classification", "generation"):
            raise TaskError(f"task {self.name!r}: kind must be 'classification' or 'generation', not {self.kind!r}")
        if self.kind == "classification" and self.labels is None:
            self.labels = tuple(sorted({y for _, y in self.examples}))
        elif self.kind == "classification" and self.builder is None:
            assert self.labels is not None
            self.labels = tuple(self.labels)
            if len(set(self.labels)) != len(self.labels):
                raise TaskError(f"task {self.name!r}: duplicated labels in {list(self.labels)}")
            missing = sorted({y for _, y in self.examples} - set(self.labels))
            if missing:
                raise TaskError(f"task {self.name!r}: outputs {missing[:5]} are not among the labels {list(self.labels)}")

    # -- identity -------------------------------------------------------------------------------
    def content_hash(self) -> str:
        """sha256 of everything that determines the prompts (examples, template, labels, kind)."""
        blob = json.dumps(
            {"name": self.name, "kind": self.kind, "examples": self.examples, "template": self.template.text,
             "labels": self.labels, "builder": getattr(self.builder, "__qualname__", None), "version": self.version,
             "fixed": [(p.text, p.gold, p.labels) for p in self.fixed] if self.fixed else None},
            sort_keys=True, ensure_ascii=False,
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    # -- prompts --------------------------------------------------------------------------------
    def n_queries(self, seed: int, queries: Queries = "held_out") -> int:
        """How many distinct queries the prompts of `seed` can draw on (held-out ones, or the demonstration pool)."""
        if self.fixed is not None:
            return len(self.fixed)
        return len(self.split(seed)[0 if queries == "pool" else 1])

    def split(self, seed: int) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
        """Seeded disjoint split of the examples into (demonstration pool, query pool), about 1:1."""
        ex = list(self.examples)
        random.Random(f"split-{seed}").shuffle(ex)
        if len(ex) < 2:
            raise TaskError(f"task {self.name!r} needs at least 2 examples, has {len(ex)}")
        cut = len(ex) // 2
        return ex[:cut], ex[cut:]

    def label_words(self, gold: str, demos: Sequence[tuple[str, str]], rng: random.Random) -> tuple[str, ...]:
        """Candidate answers for one prompt, in answer form (`" positive"`), gold included.

        `gold` and the demonstrations are raw outputs (`"positive"`).
        classification: the task's label set. generation: the gold answer, the demonstrations'
        outputs, and other outputs of the task drawn with `rng` until there are at least 4.
        """
        t = self.template
        if self.kind == "classification":
            assert self.labels is not None
            return tuple(t.answer(y) for y in self.labels)
        words = [gold] + [y for _, y in demos if y != gold]
        pool = sorted({y for _, y in self.examples} - set(words))
        rng.shuffle(pool)
        while len(set(words)) < 4 and pool:
            words.append(pool.pop())
        return tuple(dict.fromkeys(t.answer(y) for y in words))

    def prompt(self, x: str, y: str, demos: Sequence[tuple[str, str]], rng: random.Random) -> Prompt:
        """The prompt of query (x, y) after `demos` (raw pairs), its label words drawn with `rng` (`label_words`)."""
        t = self.template
        text = "".join(t.demo(dx, dy) for dx, dy in demos) + t.query(x)
        return Prompt(text=text, gold=t.answer(y), labels=self.label_words(y, demos, rng), query=x,
                      n_shots=len(demos))

    def build_prompts(self, shots: int, n: int, seed: int = 0, perturb: DemoPerturbation | None = None,
                      queries: Queries = "held_out") -> list[Prompt]:
        """`n` prompts of `shots` demonstrations each, seeded.

        queries="held_out" (what is scored): queries from the seed's query pool, demonstrations from its
        demonstration pool, disjoint from every query. queries="pool" (what vectors are extracted or trained from):
        queries from the demonstration pool too, each prompt's demonstrations the pool's other examples, so no
        held-out query is ever seen. `perturb` (see `tasks.perturb`) changes the demonstrations only, and may rename
        the classes.
        """
        if shots < 0 or n <= 0:
            raise TaskError(f"need shots >= 0 and prompts > 0, got shots={shots}, prompts={n}")
        if perturb is not None:
            perturb.check(self)
        if self.builder is not None:
            if queries == "pool":  # never fall back to the scored queries without saying so
                raise TaskError(f"task {self.name!r} builds its own prompts: it has no demonstration pool to draw "
                                f"queries from (use held-out prompts of another seed)")
            return self.builder(self, shots, n, seed)
        demo_pool, query_pool = self.split(seed)
        if queries == "pool":
            if shots > len(demo_pool) - 1:
                raise TaskError(f"task {self.name!r}: {shots} shots asked, but the demonstration pool has "
                                f"{len(demo_pool)} examples, one of which is each prompt's query")
            rng = random.Random(f"pool-prompts-{seed}-{shots}")
            pairs = ((*demo_pool[i % len(demo_pool)], demo_pool[:i % len(demo_pool)]
                      + demo_pool[i % len(demo_pool) + 1:]) for i in range(n))
        else:
            if shots > len(demo_pool):
                raise TaskError(f"task {self.name!r}: {shots} shots asked, but only {len(demo_pool)} examples "
                                f"are in the demonstration pool")
            rng = random.Random(f"prompts-{seed}-{shots}")
            pairs = ((*query_pool[i % len(query_pool)], demo_pool) for i in range(n))
        if perturb is None:
            return [self.prompt(x, y, rng.sample(pool, shots), rng) for x, y, pool in pairs]
        prng = random.Random(f"perturb-{seed}-{shots}-{perturb.name}")
        rename = perturb.relabel(self) if perturb.relabel else None
        t = self.template
        out = []
        for x, y, pool in pairs:
            demos = rng.sample(pool, shots)
            labels = self.label_words(y, demos, rng)
            demos = perturb.demos(self, demos, prng)
            if rename is not None:
                demos = [(dx, rename[dy]) for dx, dy in demos]
                y, labels = rename[y], tuple(t.answer(v) for v in rename.values())
            text = "".join(t.demo(dx, dy) for dx, dy in demos) + t.query(x)
            out.append(Prompt(text=text, gold=t.answer(y), labels=labels, query=x, n_shots=shots))
        return out


def _fixed_prompts(task: Task, shots: int, n: int, seed: int) -> list[Prompt]:
    """The builder of `Task.from_prompts`: the given prompts, the first n."""
    assert task.fixed is not None
    return list(task.fixed[:n])
