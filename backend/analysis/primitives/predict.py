"""Prompt-level outcomes from last-token logits: the two accuracies and the TR ratio.

accuracy:       the full-vocabulary argmax is the gold answer's first token (what the model would answer);
label_accuracy: the argmax over the prompt's label set (its label words' first tokens) is the gold one;
TR ratio:       the full-vocabulary argmax is one of the label set's first tokens.
For generation tasks the label set is the prompt's candidates (gold, demonstrations' outputs, padding words).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import torch

from ...model.loading import LoadedModel
from .batching import Batch, Encoded, Progress, forward_last_logits, map_batches
from .stats import pack_outcomes, rate_ci

OUTCOMES = ("correct", "label_correct", "in_labels", "pred_token", "pred_label", "gold_prob")


@dataclass
class RowPredictions:
    """Per-prompt outcomes, each of shape (batch,)."""

    correct: torch.Tensor  # bool: full-vocabulary argmax == gold first token
    label_correct: torch.Tensor  # bool: argmax within the label set == gold
    in_labels: torch.Tensor  # bool: full-vocabulary argmax is a label token
    pred_token: torch.Tensor  # long, full-vocabulary argmax
    pred_label: torch.Tensor  # long, argmax index within the label set
    gold_prob: torch.Tensor  # float, softmax probability of the gold first token


def predict_rows(logits: torch.Tensor, label_ids: Sequence[Sequence[int]], gold: Sequence[int]) -> RowPredictions:
    """Outcomes from last-token logits (batch, vocab) and each row's label first tokens (gold at `gold[i]`)."""
    b = logits.shape[0]
    n = max(len(x) for x in label_ids)
    ids = torch.zeros(b, n, dtype=torch.long, device=logits.device)
    valid = torch.zeros(b, n, dtype=torch.bool, device=logits.device)
    for i, x in enumerate(label_ids):
        ids[i, : len(x)] = torch.tensor(x, device=logits.device)
        valid[i, : len(x)] = True
    gold_t = torch.tensor(list(gold), device=logits.device)
    lab_logits = logits.gather(1, ids).masked_fill(~valid, float("-inf"))
    pred_label = lab_logits.argmax(-1)
    pred_token = logits.argmax(-1)
    gold_tok = ids.gather(1, gold_t[:, None]).squeeze(1)
    in_labels = ((ids == pred_token[:, None]) & valid).any(-1)
    gold_prob = torch.softmax(logits.float(), -1).gather(1, gold_tok[:, None]).squeeze(1)
    return RowPredictions(pred_token == gold_tok, pred_label == gold_t, in_labels, pred_token, pred_label, gold_prob)


def metrics(correct: np.ndarray, label_correct: np.ndarray, in_labels: np.ndarray) -> dict[str, Any]:
    """{accuracy, label_accuracy, tr_ratio, n} from per-prompt booleans (prompts,), each rate with its 95% Wilson
    interval (`<rate>_ci`), and the outcomes themselves (`per_prompt`, `stats.pack_outcomes`) for paired tests."""
    out: dict[str, Any] = {"accuracy": float(np.mean(correct)), "label_accuracy": float(np.mean(label_correct)),
                           "tr_ratio": float(np.mean(in_labels)), "n": int(len(correct))}
    for name, x in (("accuracy", correct), ("label_accuracy", label_correct), ("tr_ratio", in_labels)):
        out[f"{name}_ci"] = rate_ci(x)
    out["per_prompt"] = pack_outcomes(correct, label_correct, in_labels)
    return out


@dataclass
class Outcomes:
    """Per configuration and prompt, each (configs, prompts)."""

    correct: np.ndarray
    label_correct: np.ndarray
    in_labels: np.ndarray
    pred_token: np.ndarray
    pred_label: np.ndarray
    gold_prob: np.ndarray

    @classmethod
    def empty(cls, n_configs: int, n_prompts: int) -> "Outcomes":
        shape = (n_configs, n_prompts)
        return cls(np.zeros(shape, bool), np.zeros(shape, bool), np.zeros(shape, bool), np.zeros(shape, np.int64),
                   np.zeros(shape, np.int64), np.zeros(shape, np.float64))

    def record(self, configs: np.ndarray, prompts: np.ndarray, rp: RowPredictions) -> None:
        for k in OUTCOMES:
            getattr(self, k)[configs, prompts] = getattr(rp, k).cpu().numpy()

    def summary(self, c: int) -> dict[str, Any]:
        """Metrics of configuration c over the prompts."""
        return metrics(self.correct[c], self.label_correct[c], self.in_labels[c])

    def means(self) -> dict[str, np.ndarray]:
        """accuracy, label_accuracy, tr_ratio per configuration, each (configs,)."""
        return {"accuracy": self.correct.mean(1), "label_accuracy": self.label_correct.mean(1),
                "tr_ratio": self.in_labels.mean(1)}


@dataclass
class EvalResult:
    metrics: dict[str, Any]
    rows: list[dict[str, Any]] = field(default_factory=list)
    multi_token_labels: list[str] = field(default_factory=list)

    @property
    def accuracy(self) -> float:
        return self.metrics["accuracy"]

    @property
    def label_accuracy(self) -> float:
        return self.metrics["label_accuracy"]

    @property
    def tr_ratio(self) -> float:
        return self.metrics["tr_ratio"]


def predicted_label(lm: LoadedModel, enc: Encoded, i: int, pred_label: int, pred_token: int) -> str:
    """What prompt i's prediction reads as: the label word for classification, the decoded token otherwise."""
    if enc.kind == "classification":
        return enc.prompts[i].labels[pred_label]
    return lm.tokenizer.decode([pred_token])


def evaluate(lm: LoadedModel, enc: Encoded, batch_size: int = 16, progress: Progress | None = None,
             keep_rows: bool = False) -> EvalResult:
    """Metrics of the encoded prompts under a plain forward pass; with `keep_rows`, a record per prompt
    (prompt, query, gold, pred, pred_token, correct, label_correct, in_labels, gold_prob)."""
    out = Outcomes.empty(1, len(enc.ids))

    def step(batch: Batch) -> None:
        rp = predict_rows(forward_last_logits(lm, batch), [enc.label_ids[r] for r in batch.rows],
                          [enc.gold[r] for r in batch.rows])
        out.record(np.zeros(len(batch.rows), np.int64), np.array(batch.rows), rp)

    map_batches(lm, enc.ids, batch_size, step, progress, "evaluate")
    rows = outcome_rows(lm, enc, out, 0) if keep_rows else []
    return EvalResult(out.summary(0), rows, enc.multi_token)


def outcome_rows(lm: LoadedModel, enc: Encoded, out: Outcomes, c: int) -> list[dict[str, Any]]:
    """Per-prompt records of configuration c."""
    dec = lm.tokenizer.decode
    rows = []
    for i, p in enumerate(enc.prompts):
        rows.append({"prompt": p.text, "query": p.query, "gold": p.gold,
                     "pred": predicted_label(lm, enc, i, int(out.pred_label[c, i]), int(out.pred_token[c, i])),
                     "pred_token": dec([int(out.pred_token[c, i])]), "correct": bool(out.correct[c, i]),
                     "label_correct": bool(out.label_correct[c, i]), "in_labels": bool(out.in_labels[c, i]),
                     "gold_prob": float(out.gold_prob[c, i])})
    return rows
