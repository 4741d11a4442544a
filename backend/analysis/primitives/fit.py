"""Does a task's vocabulary fit a model? The check every analysis applies before it builds prompts.

A word-level tokenizer (the embedded default model's) maps words it does not know to its unknown token, so the
prompts a model would see can be mostly `<unk>`: the analyses would run to meaningless results. `vocabulary_fit`
measures the share of unknown inputs, input tokens, labels and template tokens; `verdict` turns a measurement
into `ok`, `warn` or `refuse` with its reasons; `require_fit` raises a TaskError for a refused task (memoized per
model and task). The `fit` kind reports the same measurement with the prompt lengths.
"""
from __future__ import annotations

import re
import threading
from typing import Any

from .options import FIT_REFUSE_UNKNOWN, FIT_WARN_UNKNOWN
from ...tasks.base import Task, TaskError

MAX_EXAMPLES = 2000  # inputs and outputs looked at, at most (the first ones)
MAX_SHOWN = 12  # unknown words named in the messages


def unknown_id(tok: Any) -> int | None:
    """The tokenizer's unknown-token id, or None when it has none that can appear (byte-level BPE's `unk`
    is its end-of-text token, which never stands for an unknown word)."""
    if tok.unk_token is None or tok.unk_token == tok.eos_token or tok.unk_token_id is None:
        return None
    return int(tok.unk_token_id)


def _ids(tok: Any, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def vocabulary_fit(lm: Any, task: Task) -> dict[str, Any]:
    """Unknown-token shares of the task's inputs, outputs (labels) and template, with examples of unknown words."""
    tok = lm.tokenizer
    unk = unknown_id(tok)
    examples = list(task.examples[:MAX_EXAMPLES])
    labels = list(task.labels) if task.labels is not None else sorted({y for _, y in examples})
    out: dict[str, Any] = {"has_unknown_token": unk is not None, "n_inputs": len(examples), "n_labels": len(labels),
                           "unknown_inputs": 0.0, "unknown_input_tokens": 0.0, "unknown_labels": 0.0,
                           "unknown_template": 0.0, "unknown_words": [], "unknown_label_words": []}
    if unk is None or not examples:
        return out
    bad_inputs = bad_tokens = n_tokens = 0
    words: dict[str, None] = {}
    for x, _ in examples:
        ids = _ids(tok, x)
        k = sum(i == unk for i in ids)
        n_tokens += len(ids)
        bad_tokens += k
        bad_inputs += k > 0
        if k and len(words) < MAX_SHOWN:
            for w in re.split(r"\s+", x.strip()):
                if w and unk in _ids(tok, w):
                    words.setdefault(w[:40])
    bad_labels = [y for y in labels if unk in _ids(tok, task.template.answer(y))]
    fixed = re.sub(r"\{input\}|\{output\}", " ", task.template.text) if task.builder is None else ""
    t_ids = _ids(tok, fixed) if fixed.strip() else []
    out.update(unknown_inputs=bad_inputs / len(examples), unknown_input_tokens=bad_tokens / max(n_tokens, 1),
               unknown_labels=len(bad_labels) / max(len(labels), 1),
               unknown_template=sum(i == unk for i in t_ids) / len(t_ids) if t_ids else 0.0,
               unknown_words=list(words)[:MAX_SHOWN], unknown_label_words=bad_labels[:MAX_SHOWN])
    return out


def verdict(v: dict[str, Any], kind: str) -> tuple[str, list[str]]:
    """`ok`, `warn` or `refuse`, and the sentences that say why."""
    problems: list[str] = []
    refuse = False
    share = v["unknown_input_tokens"]
    if share > 0:
        words = ", ".join(v["unknown_words"][:8])
        problems.append(f"{100 * v['unknown_inputs']:.0f}% of the inputs ({100 * share:.0f}% of their tokens) map to "
                        f"the model's unknown token" + (f" (e.g. {words})" if words else ""))
        refuse |= share > FIT_REFUSE_UNKNOWN
    if v["unknown_labels"] > 0:
        problems.append(f"{100 * v['unknown_labels']:.0f}% of the labels are unknown words (e.g. "
                        f"{', '.join(repr(w) for w in v['unknown_label_words'][:5])})")
        refuse |= kind == "classification"
    if v["unknown_template"] > FIT_WARN_UNKNOWN:
        problems.append(f"{100 * v['unknown_template']:.0f}% of the prompt template's tokens are unknown")
    c = v.get("context")
    if c and c["context_window"] and c["longest_prompt"] > c["context_window"]:
        if c["shots_that_fit"] < 0:
            problems.append(f"even zero-shot prompts exceed the context window of {c['context_window']} tokens")
            refuse = True
        else:
            problems.append(f"prompts of {c['shots']} shots are up to {c['longest_prompt']} tokens, over the context "
                            f"window of {c['context_window']}: {c['shots_that_fit']} shots will be used")
    if refuse:
        return "refuse", problems + ["this task does not fit this model; pick a task made for it (for the default "
                                     "model, the `syn-…` tasks) or another model"]
    if problems or share > FIT_WARN_UNKNOWN:
        return "warn", problems
    return "ok", []


_MEMO: dict[tuple[str, str], tuple[str, list[str]]] = {}
_MEMO_LOCK = threading.Lock()


def require_fit(lm: Any, task: Task) -> None:
    """Raise TaskError when the task's words do not fit the model (memoized per model and task)."""
    key = (lm.fingerprint, task.content_hash())
    with _MEMO_LOCK:
        found = _MEMO.get(key)
    if found is None:
        found = verdict(vocabulary_fit(lm, task), task.kind)
        with _MEMO_LOCK:
            if len(_MEMO) > 256:
                _MEMO.clear()
            _MEMO[key] = found
    if found[0] == "refuse":
        raise TaskError(f"task {task.name!r} does not fit model {lm.name!r}: " + "; ".join(found[1]))
