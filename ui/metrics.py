"""The three prompt-level outcomes, named once for every page and figure (issue 9: two accuracies, named plainly).

A result's `Metrics` is {accuracy, label_accuracy, tr_ratio, n}, each in [0, 1]:
- accuracy: the full-vocabulary argmax is the gold answer's first token: what the model would actually answer;
- label_accuracy: the argmax within the prompt's label set is the gold one (for generation tasks the label set
  is the prompt's candidates: the gold, the demonstrations' outputs and padding words; a weaker measure);
- tr_ratio: the full-vocabulary argmax is one of the label set's first tokens (task recognition).
"""
from __future__ import annotations

from typing import Any

NAMES = ("accuracy", "label_accuracy", "tr_ratio")
LABEL = {"accuracy": "Accuracy", "label_accuracy": "Label accuracy", "tr_ratio": "TR ratio"}
HELP = {
    "accuracy": "Share of queries whose top next token, over the whole vocabulary, is the gold answer's first "
                "token: what the model would actually answer.",
    "label_accuracy": "Share of queries where, among the task's label words only, the gold one scores highest.",
    "tr_ratio": "Share of queries whose top next token, over the whole vocabulary, is one of the task's label "
                "words: the model recognised *what kind* of answer is wanted (task recognition).",
}
GENERATION_NOTE = ("For a generation task the label set is each prompt's candidates (the gold answer, the "
                   "demonstrations' outputs and padding words), so label accuracy is a weaker measure than accuracy.")
ZERO_SHOT_CLAIM = ("the model knows the facts, but not which task is meant: zero-shot failure is a "
                   "task-recognition failure")


def pct(x: float | None, digits: int = 1) -> str:
    """0.953 -> "95.3%"; None -> "n/a"."""
    return "n/a" if x is None else f"{100 * float(x):.{digits}f}%"


def points(after: float, before: float) -> str | None:
    """The change in percentage points, or None when it rounds to zero (no "-0.0" with a red arrow)."""
    d = 100 * (float(after) - float(before))
    return None if abs(d) < 0.05 else f"{d:+.1f} pts"


KNOWS_FACTS_AT = 0.8
"""Zero-shot label accuracy from which the page says the model knows the answers (at 44% on two labels, under
chance, it once said so)."""


def zero_shot_sentence(zero: dict[str, Any] | None, icl: dict[str, Any], shots: int) -> str | None:
    """One sentence on why 0-shot accuracy is low while label accuracy is high, when the numbers show it: label
    accuracy at least KNOWS_FACTS_AT and 20 points above accuracy."""
    if not zero:
        return None
    if zero["label_accuracy"] < KNOWS_FACTS_AT or zero["label_accuracy"] - zero["accuracy"] < 0.2:
        return None
    return (f"With no demonstrations the model answers correctly on {pct(zero['accuracy'], 0)} of queries, yet "
            f"among the label words it ranks the right one first on {pct(zero['label_accuracy'], 0)}: only "
            f"{pct(zero['tr_ratio'], 0)} of its answers are label words at all (TR ratio; {pct(icl['tr_ratio'], 0)} "
            f"with {shots} demonstrations). So {ZERO_SHOT_CLAIM}.")
