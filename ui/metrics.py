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


# -- intervals and paired tests (issue 27) ----------------------------------------------------------------------------
def ci_of(m: dict[str, Any] | None, name: str) -> tuple[float, float] | None:
    """The 95% interval `<name>_ci` of a metrics dict, or None (a result without one)."""
    ci = (m or {}).get(f"{name}_ci")
    return (float(ci[0]), float(ci[1])) if ci is not None and len(ci) == 2 and None not in ci else None


def span(ci: tuple[float, float] | None) -> str:
    """(0.71, 0.91) -> "[71–91%]"; None -> ""."""
    return "" if ci is None else f"[{100 * ci[0]:.0f}–{100 * ci[1]:.0f}%]"


def pct_ci(m: dict[str, Any] | None, name: str, digits: int = 1) -> str:
    """The rate with its 95% interval: "83.0% [71–91%]" ("n/a" when absent; the rate alone when it has none)."""
    if not m or m.get(name) is None:
        return "n/a"
    ci = ci_of(m, name)
    return pct(m[name], digits) + ("" if ci is None else f" {span(ci)}")


def signed(x: float) -> str:
    """A difference of rates in points, with a true minus sign: -0.42 -> "−42"."""
    v = 100 * float(x)
    return ("−" if v < -0.05 else "+" if v > 0.05 else "") + f"{abs(v):.0f}"


def p_text(p: float | None) -> str:
    """p = 0.034 -> "p = 0.034"; under 0.001 -> "p < 0.001"."""
    if p is None:
        return "p n/a"
    return "p < 0.001" if p < 0.001 else f"p = {p:.3f}" if p < 0.1 else f"p = {p:.2f}"


def paired_text(t: dict[str, Any] | None, what: str = "") -> str:
    """A paired test as one phrase: "top-k vs random: −42 pts [−55, −30], p < 0.001 (exact McNemar, 30 prompts)";
    "" when there is none. The effect is in points (of a rate), its 95% bootstrap interval beside it."""
    if not t:
        return ""
    head = f"{what}: " if what else ""
    if any(t.get(k) is None or t[k] != t[k] for k in ("ci_low", "ci_high", "p")):  # None (JSON) or NaN: no test
        return f"{head}{signed(t['effect'])} pts ({too_few(int(t['n'])) or 'no interval and no test'})"
    return (f"{head}{signed(t['effect'])} pts [{signed(t['ci_low'])}, {signed(t['ci_high'])}], {p_text(t.get('p'))} "
            f"({t['test']}, {t['n']} prompts)")


def too_few(n: int) -> str:
    """"1 prompt: no interval and no test (they need 2 prompts or more)" under 2 prompts (the backend's
    `stats.too_few`, a result's warning), else ""."""
    return f"{n} prompt{'s' if n != 1 else ''}: no interval and no test (they need 2 prompts or more)" if n < 2 else ""


def noise_floor(n: int) -> float:
    """Half the width of a rate's 95% interval at its widest (p = 0.5) on n prompts: 1.96 x 0.5 / sqrt(n) (the
    backend's `stats.noise_floor`; a rate differing by less is within noise)."""
    return 1.959964 * 0.5 / max(int(n), 1) ** 0.5


def noise_sentence(n: int | None) -> str:
    """"30 prompts: differences under about 0.18 are within noise." ("" without n). Said where the sample is
    small: every rate of a page of n prompts."""
    if not n:
        return ""
    return f"{n} prompt{'s' if n != 1 else ''}: differences under about {noise_floor(n):.2f} are within noise."
