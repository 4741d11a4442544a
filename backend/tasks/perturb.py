"""Perturbations of the demonstrations only (the query and its gold answer are untouched, except
where the label words themselves are replaced, as with symbol and number labels).

- shuffled_inputs: demonstration inputs permuted among the demonstrations (pairing broken, labels kept);
- random_labels:   each demonstration's output drawn at random from the task's outputs;
- flipped_labels:  binary classification, each demonstration's label swapped for the other one;
- symbol_labels:   the classes renamed `@ # ! $ & *` in demonstrations, gold and label set alike;
- number_labels:   the classes renamed `0 1 2 ...` likewise.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable, Sequence

from .base import Task, TaskError

Pair = tuple[str, str]
SYMBOLS = ("@", "#", "!", "$", "&", "*")


def classes_of(task: Task) -> list[str]:
    """The classes a classification task's examples actually use, sorted."""
    return sorted({y for _, y in task.examples})


@dataclass(frozen=True)
class Perturbation:
    """A named change to the demonstrations; `relabel` renames classes everywhere (demos, gold, labels)."""

    name: str
    demos: Callable[[Task, list[Pair], random.Random], list[Pair]]
    relabel: Callable[[Task], dict[str, str]] | None = None
    kinds: tuple[str, ...] = ("classification", "generation")

    def check(self, task: Task) -> None:
        if task.builder is not None:
            raise TaskError(f"perturbation {self.name!r} needs a template-built task; {task.name!r} builds its own "
                            f"prompts")
        if task.kind not in self.kinds:
            raise TaskError(f"perturbation {self.name!r} applies to {' / '.join(self.kinds)} tasks, and "
                            f"{task.name!r} is a {task.kind} task")


def _shuffled_inputs(task: Task, demos: list[Pair], rng: random.Random) -> list[Pair]:
    xs = [x for x, _ in demos]
    if len(xs) > 1:
        order = list(range(len(xs)))
        for _ in range(20):  # prefer a derangement: no input keeps its own label
            rng.shuffle(order)
            if all(i != j for i, j in enumerate(order)):
                break
        xs = [xs[j] for j in order]
    return [(x, y) for x, (_, y) in zip(xs, demos)]


def _random_labels(task: Task, demos: list[Pair], rng: random.Random) -> list[Pair]:
    pool = classes_of(task) if task.kind == "classification" else sorted({y for _, y in task.examples})
    return [(x, rng.choice(pool)) for x, _ in demos]


def _flipped(task: Task, demos: list[Pair], rng: random.Random) -> list[Pair]:
    a, b = classes_of(task)
    return [(x, b if y == a else a) for x, y in demos]


def _rename(names: Sequence[str], what: str) -> Callable[[Task], dict[str, str]]:
    def relabel(task: Task) -> dict[str, str]:
        cls = classes_of(task)
        if len(cls) > len(names):
            raise TaskError(f"{what} labels cover at most {len(names)} classes; task {task.name!r} has {len(cls)}")
        return dict(zip(cls, names))
    return relabel


def _binary_check(task: Task) -> None:
    if len(classes_of(task)) != 2:
        raise TaskError(f"flipped labels need a binary task; {task.name!r} has {len(classes_of(task))} classes")


PERTURBATIONS: dict[str, Perturbation] = {
    "shuffled_inputs": Perturbation("shuffled_inputs", _shuffled_inputs),
    "random_labels": Perturbation("random_labels", _random_labels),
    "flipped_labels": Perturbation("flipped_labels", lambda t, d, r: (_binary_check(t), _flipped(t, d, r))[1],
                                   kinds=("classification",)),
    "symbol_labels": Perturbation("symbol_labels", lambda t, d, r: d, _rename(SYMBOLS, "symbol"),
                                  kinds=("classification",)),
    "number_labels": Perturbation("number_labels", lambda t, d, r: d, _rename([str(i) for i in range(10)], "number"),
                                  kinds=("classification",)),
}


def get_perturbation(name: str) -> Perturbation:
    try:
        return PERTURBATIONS[name]
    except KeyError:
        raise TaskError(f"unknown perturbation {name!r}; choose from {sorted(PERTURBATIONS)}") from None
