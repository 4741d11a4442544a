"""The synthetic task language of the embedded model: held-out, seeded, ambiguous queries, label sets."""
from __future__ import annotations

import random
from collections import Counter

import pytest

from backend.tasks.base import Task, TaskError
from backend.tasks.synthetic import (CLASS_LABELS, CLASS_TASKS, GEN_TASKS, RMAP_BASES, SEP, build_world, group_of,
                                     icl_episode, repetition_sequence, synthetic_tasks, task_names)

SHOTS = (0, 1, 2, 4, 8, 16)


@pytest.fixture(scope="module")
def tasks() -> dict[str, Task]:
    return {t.name: t for t in synthetic_tasks()}


def parse(text: str) -> tuple[list[tuple[str, str]], str]:
    """`x y ; x y ; q` -> ([(x, y), ...], q)."""
    parts = text.split(f" {SEP} ")
    demos = [tuple(p.split(" ")) for p in parts[:-1]]
    assert all(len(d) == 2 for d in demos), text
    return demos, parts[-1]


def test_names_kinds_and_metadata(tasks):
    assert list(tasks) == task_names()
    assert len(tasks) == len(CLASS_TASKS) + len(GEN_TASKS) + len(RMAP_BASES) == 13
    for name, t in tasks.items():
        assert name.startswith("syn-") and name == name.lower() and " " not in name
        assert t.models == "default" and t.version and t.description
        assert t.kind == ("generation" if group_of(name) == "generation" else "classification")
    assert {n for n, t in tasks.items() if t.builder is not None} == {f"syn-rmap-{b}" for b in RMAP_BASES}
    # distinct content hashes, and none collides with a natural-language task name
    assert len({t.content_hash() for t in tasks.values()}) == len(tasks)
    assert not {"sentiment", "antonym", "capital", "plural"} & set(tasks)


def test_world_is_deterministic_and_words_are_single_tokens():
    w = build_world()
    build_world.cache_clear()
    assert build_world() == w
    vocab = w.vocabulary()
    assert len(vocab) == len(set(vocab))
    assert all(" " not in v and v for v in vocab)
    # every fact's input and output is a word of the vocabulary
    vs = set(vocab)
    for t in (*CLASS_TASKS, *GEN_TASKS):
        for x, y in w.facts(t).items():
            assert x in vs and y in vs


def test_every_query_word_is_ambiguous():
    w = build_world()
    for e in w.entities:  # valid under 4 of the 5 classification tasks, with 4 different answers
        ts = w.tasks_of(e)
        assert len(ts) == 4 and set(ts) <= set(CLASS_TASKS)
        assert len({w.facts(t)[e] for t in ts}) == 4
    for x in w.line:
        ts = w.tasks_of(x)
        assert 3 <= len(ts) <= 4 and set(ts) <= set(GEN_TASKS)
        answers = [w.facts(t)[x] for t in ts]
        assert len(set(answers)) == len(answers), (x, ts, answers)  # the answer tells the task apart


def test_facts_are_balanced_and_structured():
    w = build_world()
    for t, labs in CLASS_TASKS.items():
        c = Counter(w.class_facts[t].values())
        assert set(c) == set(labs) and max(c.values()) - min(c.values()) <= 1
        assert len(w.class_facts[t]) >= 32  # a 16-shot demonstration pool
    line = list(w.line)
    for x, y in w.gen_facts["successor"].items():
        assert line.index(y) == line.index(x) + 1 and w.gen_facts["predecessor"].get(y, x) == x
    for x, y in w.gen_facts["antonym"].items():
        assert line.index(x) + line.index(y) == len(line) - 1
    assert all(y == x + "s" for x, y in w.gen_facts["plural"].items())
    assert all(len(f) >= 32 for f in w.gen_facts.values())


@pytest.mark.parametrize("shots", SHOTS)
def test_prompts_are_held_out_and_well_formed(tasks, shots):
    w = build_world()
    for name, t in tasks.items():
        prompts = t.build_prompts(shots, 40, seed=3)
        assert len(prompts) == 40
        for p in prompts:
            demos, q = parse(p.text)
            assert len(demos) == shots == p.n_shots and q == p.query
            assert q not in {x for x, _ in demos}, (name, p.text)
            assert not p.text.endswith(" ") and p.gold.startswith(" ") and p.gold in p.labels
            assert all(lab.startswith(" ") and " " not in lab[1:] for lab in p.labels)
            assert len(p.text.split()) + 1 <= 3 * 16 + 2  # with <s>: fits the trained length
            if group_of(name) == "random-mapping":
                continue
            facts = w.facts(name.removeprefix("syn-"))
            assert all(facts[x] == y for x, y in demos) and " " + facts[q] == p.gold


def test_prompts_are_seeded(tasks):
    for t in tasks.values():
        a, b = t.build_prompts(4, 30, seed=1), t.build_prompts(4, 30, seed=1)
        assert a == b
        assert a != t.build_prompts(4, 30, seed=2)


def test_classification_label_sets(tasks):
    """Each prompt's label set is the task's own (in-context) labels, not the union of all 14."""
    assert len(set(CLASS_LABELS)) == len(CLASS_LABELS) == 14
    for b in CLASS_TASKS:
        t = tasks[f"syn-{b}"]
        assert t.labels == CLASS_TASKS[b]
        for p in t.build_prompts(2, 20, seed=0):
            assert p.labels == tuple(" " + y for y in CLASS_TASKS[b])


def test_random_mapping_labels_are_redrawn_per_prompt(tasks):
    w = build_world()
    for b in RMAP_BASES:
        t = tasks[f"syn-rmap-{b}"]
        prompts = t.build_prompts(8, 100, seed=0)
        own = set()
        for p in prompts:
            assert len(p.labels) == 2  # the prompt's own two mapped words, nothing else
            mapped = p.labels
            assert len(set(mapped)) == 2 and all(m[1:] in w.nonsense for m in mapped)
            assert p.gold in mapped
            own.add(mapped)
            demos, q = parse(p.text)
            facts = w.class_facts[b]
            # the mapping is consistent: one nonsense word per class, and the gold follows it
            by_class = {}
            for x, y in demos:
                assert by_class.setdefault(facts[x], y) == y
            if facts[q] in by_class:
                assert " " + by_class[facts[q]] == p.gold
            # the other class's word is the other mapped word
            cls = CLASS_TASKS[b]
            assert mapped[cls.index(facts[q])] == p.gold
        assert len(own) > 50  # redrawn, not fixed
    with pytest.raises(TaskError):
        tasks["syn-rmap-size"].build_prompts(30, 5, seed=0)


def test_zero_shot_prompts_are_the_bare_query(tasks):
    for t in tasks.values():
        for p in t.build_prompts(0, 10, seed=0):
            assert p.text == p.query and " " not in p.text


def test_training_episodes():
    w = build_world()
    rng = random.Random(0)
    ep = icl_episode(rng, "syn-sentiment", 21)
    assert len(ep) == 21 and len({x for x, _ in ep}) == 21  # no repeats without burst
    assert all(w.class_facts["sentiment"][x] == y for x, y in ep)
    ep = icl_episode(rng, "syn-rmap-parity", 21, burst=1.0)
    assert len({x for x, _ in ep}) == 1  # fully bursty: the first input repeats
    eps = [icl_episode(random.Random(i), "syn-rmap-parity", 21, burst=0.0) for i in range(20)]
    for ep in eps:
        m = {}
        for x, y in ep:
            assert y in w.nonsense and m.setdefault(w.class_facts["parity"][x], y) == y
    assert len({tuple(sorted(set(y for _, y in ep))) for ep in eps}) > 10
    assert icl_episode(random.Random(5), "syn-capital", 8) == icl_episode(random.Random(5), "syn-capital", 8)


def test_repetition_sequences_copy_at_varying_distances():
    words = build_world().vocabulary()
    dists = set()
    for i in range(50):
        seq, tgt = repetition_sequence(random.Random(i), words, 63)
        assert len(seq) == len(tgt) == 63 and len(set(seq)) == len(seq) - sum(tgt) - 1
        pos = [j for j, t in enumerate(tgt) if t]
        assert pos
        # every target equals the word after the previous occurrence of the word before it
        for j in pos:
            prev = max(k for k in range(j - 1) if seq[k] == seq[j - 1])
            assert seq[prev + 1] == seq[j]
            dists.add(j - prev - 1)
    assert len(dists) > 20
