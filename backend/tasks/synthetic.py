"""The synthetic task language of the embedded default model (`models/headlens-tiny`).

A small, fully determined world of invented words, and thirteen tasks over it. Prompts read
`x y ; x y ; q` (no arrow between input and label: with one, the random-mapping tasks never trained);
every word is one token of the model's word-level tokenizer.

World (built once from a fixed seed, see `build_world`):
- 50 *entities* (`bako`, `fime`, ...). Each is valid under exactly 4 of the 5 classification tasks
  (sentiment pos/neg, category animal/plant/tool/food, size big/small, region north/south/east/west,
  parity even/odd), with fixed, class-balanced labels.
- 56 *line words* on an ordered "number line". Generation tasks over them: successor (next word),
  predecessor (previous word), antonym (the mirror word, first <-> last), plural (`bako` -> `bakos`),
  capital (`bako` -> `bakoton`). Each line word is valid under 3 or 4 of them.
- 24 *nonsense label words* (`dax`, `wug`, ...) for the random-mapping tasks: in `syn-rmap-<task>` the
  classes of a binary classification task are mapped to nonsense words redrawn for every prompt, so the
  mapping can only be read off the demonstrations.

Because every query word is valid under several tasks, a zero-shot prompt (`q` alone) does not say
which task is meant. Each prompt's label set is its *in-context* label set, as TSLA defines it: the task's
own labels (`pos`/`neg` for sentiment), and for random-mapping prompts just their two mapped words. So a
zero-shot prompt is answered outside the label set more often than not (a low TR ratio: the model knows
the facts, but not which task is meant), while the label accuracy, the argmax within the task's own labels,
can be high.

Training episodes (`icl_episode`, `repetition_sequence`) are word lists drawn from the same world; the
training script turns them into token ids. Everything here is pure and seeded.
"""
from __future__ import annotations

import functools
import random
from dataclasses import dataclass
from typing import Sequence

from .base import Prompt, Task, TaskError, Template

VERSION = "2"  # 2: in-context label sets (own labels; random mapping: the two mapped words)
WORLD_SEED = "headlens-syn-world-v1"
TEMPLATE = Template("{input} {output} ; ")
SEP = ";"

CLASS_TASKS: dict[str, tuple[str, ...]] = {
    "sentiment": ("pos", "neg"),
    "category": ("animal", "plant", "tool", "food"),
    "size": ("big", "small"),
    "region": ("north", "south", "east", "west"),
    "parity": ("even", "odd"),
}
GEN_TASKS: tuple[str, ...] = ("antonym", "plural", "capital", "successor", "predecessor")
RMAP_BASES: tuple[str, ...] = ("sentiment", "size", "parity")  # binary tasks: 8 demos show both classes
CLASS_LABELS: tuple[str, ...] = tuple(lab for labs in CLASS_TASKS.values() for lab in labs)

N_ENTITIES = 50
N_LINE = 56
N_NONSENSE = 24

_CONS = "bdfgklmnprstvz"
_VOWELS = "aeiou"
_NONSENSE_CONS = "bdfgjkmpvwxz"

DESCRIPTIONS = {
    "sentiment": "synthetic: is the entity word pos or neg (fixed labels)",
    "category": "synthetic: the entity word's category, animal/plant/tool/food (fixed labels)",
    "size": "synthetic: is the entity word big or small (fixed labels)",
    "region": "synthetic: the entity word's region, north/south/east/west (fixed labels)",
    "parity": "synthetic: is the entity word even or odd (fixed labels)",
    "antonym": "synthetic: the mirror word on the number line (first <-> last)",
    "plural": "synthetic: the plural of a line word (bako -> bakos)",
    "capital": "synthetic: the capital of a line word (bako -> bakoton)",
    "successor": "synthetic: the next word on the number line",
    "predecessor": "synthetic: the previous word on the number line",
}


@dataclass(frozen=True)
class World:
    """The fixed facts of the language.

    entities: classification inputs; class_facts[task][entity] = label (only for valid entities).
    line: the ordered line words; gen_facts[task][word] = answer (only for valid words).
    nonsense: label words of the random-mapping tasks.
    """

    entities: tuple[str, ...]
    class_facts: dict[str, dict[str, str]]
    line: tuple[str, ...]
    gen_facts: dict[str, dict[str, str]]
    nonsense: tuple[str, ...]

    def facts(self, task: str) -> dict[str, str]:
        """input -> output of a base task (classification or generation name, without prefix)."""
        return self.class_facts[task] if task in self.class_facts else self.gen_facts[task]

    def vocabulary(self) -> list[str]:
        """Every word of the language, in a fixed order (specials excluded): separator, labels, words."""
        words = [SEP, *CLASS_LABELS, *self.entities, *self.line]
        words += [f"{w}s" for w in self.line] + [f"{w}ton" for w in self.line] + list(self.nonsense)
        if len(set(words)) != len(words):
            raise AssertionError("the synthetic vocabulary has a duplicate word")
        return words

    def tasks_of(self, word: str) -> list[str]:
        """Base tasks (classification or generation) under which `word` is a valid input."""
        out = [t for t, f in self.class_facts.items() if word in f]
        return out + [t for t, f in self.gen_facts.items() if word in f]


def _words(rng: random.Random, n: int, make, taken: set[str]) -> list[str]:
    out: list[str] = []
    while len(out) < n:
        w = make(rng)
        if w not in taken:
            taken.add(w)
            out.append(w)
    return out


@functools.lru_cache(maxsize=1)
def build_world() -> World:
    """The world, deterministic (seeded by `WORLD_SEED`)."""
    rng = random.Random(WORLD_SEED)
    taken = set(CLASS_LABELS) | {SEP}
    cvcv = lambda r: r.choice(_CONS) + r.choice(_VOWELS) + r.choice(_CONS) + r.choice(_VOWELS)  # noqa: E731
    cvc = lambda r: r.choice(_NONSENSE_CONS) + r.choice(_VOWELS) + r.choice(_NONSENSE_CONS)  # noqa: E731
    entities = _words(rng, N_ENTITIES, cvcv, taken)
    line = _words(rng, N_LINE, cvcv, taken)
    nonsense = _words(rng, N_NONSENSE, cvc, taken)

    # classification: entity i misses exactly one task; labels balanced within each task
    tasks = list(CLASS_TASKS)
    order = entities[:]
    rng.shuffle(order)
    class_facts: dict[str, dict[str, str]] = {}
    for ti, t in enumerate(tasks):
        valid = [e for i, e in enumerate(order) if i % len(tasks) != ti]
        rng.shuffle(valid)
        labs = CLASS_TASKS[t]
        class_facts[t] = {e: labs[i % len(labs)] for i, e in enumerate(valid)}

    # generation: every line word valid under 3 or 4 tasks, task sizes balanced
    n = len(line)
    full = {
        "successor": {line[i]: line[i + 1] for i in range(n - 1)},
        "predecessor": {line[i]: line[i - 1] for i in range(1, n)},
        # the mirror word; the two middle words are each other's mirror *and* neighbours: left out
        "antonym": {line[i]: line[n - 1 - i] for i in range(n) if abs((n - 1 - i) - i) > 1},
        "plural": {w: f"{w}s" for w in line},
        "capital": {w: f"{w}ton" for w in line},
    }
    counts = {t: 0 for t in GEN_TASKS}
    chosen: dict[str, list[str]] = {}
    idx = list(range(n))
    rng.shuffle(idx)
    for j, i in enumerate(idx):
        w = line[i]
        allowed = [t for t in GEN_TASKS if w in full[t]]
        rng.shuffle(allowed)
        allowed.sort(key=lambda t: counts[t])
        pick = allowed[: 3 + j % 2]
        for t in pick:
            counts[t] += 1
        chosen[w] = pick
    gen_facts = {t: {w: full[t][w] for w in line if t in chosen[w]} for t in GEN_TASKS}
    return World(tuple(entities), class_facts, tuple(line), gen_facts, tuple(nonsense))


# -- tasks ----------------------------------------------------------------------------------------
def _answer(y: str) -> str:
    return TEMPLATE.answer(y)


def rmap_prompts(task: Task, shots: int, n: int, seed: int) -> list[Prompt]:
    """Prompts of a random-mapping task: the base task's classes mapped to nonsense words per prompt.

    Demonstrations come from the seeded demonstration pool, queries from the disjoint query pool
    (so the query never appears among the demonstrations). labels = the prompt's two mapped words in
    class order (its in-context label set); gold = the query class's mapped word.
    """
    if shots < 0 or n <= 0:
        raise TaskError(f"need shots >= 0 and prompts > 0, got shots={shots}, prompts={n}")
    world = build_world()
    base = task.name.removeprefix("syn-rmap-")
    classes = CLASS_TASKS[base]
    demo_pool, query_pool = task.split(seed)
    if shots > len(demo_pool):
        raise TaskError(f"task {task.name!r}: {shots} shots asked, but only {len(demo_pool)} examples "
                        f"are in the demonstration pool")
    rng = random.Random(f"rmap-{task.name}-{seed}-{shots}")
    out = []
    for i in range(n):
        x, c = query_pool[i % len(query_pool)]
        mapping = dict(zip(classes, rng.sample(world.nonsense, len(classes))))
        demos = rng.sample(demo_pool, shots)
        text = "".join(TEMPLATE.demo(dx, mapping[dc]) for dx, dc in demos) + TEMPLATE.query(x)
        labels = tuple(_answer(mapping[c2]) for c2 in classes)
        out.append(Prompt(text=text, gold=_answer(mapping[c]), labels=labels, query=x, n_shots=shots))
    return out


def task_names() -> list[str]:
    """Names of the synthetic tasks, in listing order."""
    return ([f"syn-{t}" for t in CLASS_TASKS] + [f"syn-{t}" for t in GEN_TASKS]
            + [f"syn-rmap-{b}" for b in RMAP_BASES])


def base_task(name: str) -> str:
    """`syn-rmap-size` -> `size`, `syn-antonym` -> `antonym`."""
    return name.removeprefix("syn-").removeprefix("rmap-")


def group_of(name: str) -> str:
    """`classification`, `generation` or `random-mapping`."""
    if name.startswith("syn-rmap-"):
        return "random-mapping"
    return "classification" if base_task(name) in CLASS_TASKS else "generation"


def synthetic_tasks() -> list[Task]:
    """The thirteen tasks of the language, for the embedded model (`models="default"`)."""
    world = build_world()
    out = []
    for t in CLASS_TASKS:
        ex = sorted(world.class_facts[t].items())
        out.append(Task(f"syn-{t}", "classification", ex, TEMPLATE, labels=CLASS_TASKS[t],
                        description=DESCRIPTIONS[t], models="default", version=VERSION))
    for t in GEN_TASKS:
        ex = sorted(world.gen_facts[t].items())
        out.append(Task(f"syn-{t}", "generation", ex, TEMPLATE, description=DESCRIPTIONS[t],
                        models="default", version=VERSION))
    for b in RMAP_BASES:
        ex = sorted(world.class_facts[b].items())
        out.append(Task(f"syn-rmap-{b}", "classification", ex, TEMPLATE, labels=world.nonsense,
                        description=(f"synthetic random mapping: the {b} classes {'/'.join(CLASS_TASKS[b])} "
                                     f"mapped to nonsense words redrawn per prompt; learnable only in context"),
                        models="default", builder=rmap_prompts, version=VERSION))
    return out


# -- compositions (evaluation only) ---------------------------------------------------------------
COMPOSITIONS: tuple[tuple[str, str], ...] = (
    ("successor", "plural"), ("predecessor", "plural"), ("antonym", "plural"),
    ("successor", "capital"), ("predecessor", "capital"), ("antonym", "capital"), ("successor", "antonym"),
)
"""(a, b) pairs of generation tasks whose composition x -> b(a(x)) the language can say: every answer is a word
of the vocabulary (`bako` -> next word's plural `fimes`). The model never trained on them: they are not in
`synthetic_tasks()` and cost no retraining; they test whether a sum of two tasks' vectors composes them."""


def composed_task(a: str, b: str) -> Task:
    """The composed task x -> b(a(x)) over the inputs of task `a` (e.g. `syn-plural-of-successor`)."""
    if (a, b) not in COMPOSITIONS:
        raise TaskError(f"the synthetic language has no composition of {a!r} then {b!r}; pairs: {list(COMPOSITIONS)}")
    world = build_world()
    n, line = len(world.line), world.line
    index = {w: i for i, w in enumerate(line)}
    full = {"successor": lambda w: line[index[w] + 1] if index[w] + 1 < n else None,
            "predecessor": lambda w: line[index[w] - 1] if index[w] > 0 else None,
            "antonym": lambda w: line[n - 1 - index[w]] if abs(n - 1 - 2 * index[w]) > 1 else None,
            "plural": lambda w: f"{w}s", "capital": lambda w: f"{w}ton"}
    ex = []
    for x, y in sorted(world.gen_facts[a].items()):
        z = full[b](y)
        if z is not None:
            ex.append((x, z))
    return Task(f"syn-{b}-of-{a}", "generation", ex, TEMPLATE, models="default", version=VERSION,
                description=f"synthetic composition (never trained): the {b} of the {a} of a line word")


def compositions() -> list[tuple[str, str, Task]]:
    """(task a, task b, composed task) for every pair of `COMPOSITIONS`, by task name (`syn-successor`, ...)."""
    return [(f"syn-{a}", f"syn-{b}", composed_task(a, b)) for a, b in COMPOSITIONS]


# -- training episodes ----------------------------------------------------------------------------
def icl_episode(rng: random.Random, name: str, n_demos: int, burst: float = 0.0,
                permute: float = 0.0) -> list[tuple[str, str]]:
    """One training episode of task `name`: `n_demos` (input, output) pairs, in order.

    Inputs are drawn without replacement while the task has unused ones; with probability `burst`
    (from the second pair on) an input repeats an earlier one instead. Random-mapping episodes draw
    a fresh class -> nonsense-word mapping. With probability `permute`, a classification episode
    relabels its classes by a random permutation of the task's own labels: the label set stays, and
    the class -> label mapping must be read off the demonstrations.
    """
    world = build_world()
    base = base_task(name)
    facts = world.facts(base)
    mapping = None
    if group_of(name) == "random-mapping":
        classes = CLASS_TASKS[base]
        mapping = dict(zip(classes, rng.sample(world.nonsense, len(classes))))
    elif permute and base in CLASS_TASKS and rng.random() < permute:
        classes = CLASS_TASKS[base]
        mapping = dict(zip(classes, rng.sample(classes, len(classes))))
    fresh = list(facts)
    rng.shuffle(fresh)
    xs: list[str] = []
    for j in range(n_demos):
        if (j and rng.random() < burst) or not fresh:
            xs.append(rng.choice(xs))
        else:
            xs.append(fresh.pop())
    return [(x, mapping[facts[x]] if mapping else facts[x]) for x in xs]


def repetition_sequence(rng: random.Random, words: Sequence[str], length: int) -> tuple[list[str], list[bool]]:
    """A list-repetition sequence of `length` words and, per word, whether it is a copy target.

    Layout: random words, a list of n random words, a gap of random words, the list again, random words
    to fill; n, the gap and the prefix vary, so the copy distance varies and no position tells where
    to copy from. All words of a row are distinct (while the vocabulary allows), so the word before a
    target occurred once before. Targets: the second copy from its second word on (each predictable by
    induction from the word before it).
    """
    n = rng.randint(min(3, length // 2), length // 2)
    gap = rng.randint(0, length - 2 * n)
    prefix = rng.randint(0, length - 2 * n - gap)
    pool = rng.sample(list(words), length) if len(words) >= length else [rng.choice(words) for _ in range(length)]
    lst, rest = pool[:n], pool[n:]
    seq = rest[:prefix] + lst + rest[prefix:prefix + gap] + lst
    target = [False] * (prefix + n + gap) + [False] + [True] * (n - 1)
    fill = length - len(seq)
    seq += rest[prefix + gap:prefix + gap + fill]
    target += [False] * fill
    return seq, target
