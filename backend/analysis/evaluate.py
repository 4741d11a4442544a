"""Accuracy and TR ratio of prompts, from last-token logits.

accuracy: classification -> argmax over the prompt's label first tokens is the gold one;
          generation     -> argmax over the full vocabulary is the gold answer's first token.
TR ratio: share of prompts whose full-vocabulary argmax is one of the prompt's label first tokens.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import torch

from ..models import LoadedModel
from ..tasks.base import Prompt
from .batching import Batch, Encoded, Progress, encode, forward_last_logits, map_batches


@dataclass
class RowPredictions:
    """Per-prompt outcomes, each of shape (batch,)."""

    correct: torch.Tensor  # bool
    in_labels: torch.Tensor  # bool
    pred_token: torch.Tensor  # long, full-vocabulary argmax
    pred_label: torch.Tensor  # long, argmax index within the label set
    gold_prob: torch.Tensor  # float, softmax probability of the gold first token


def predict_rows(logits: torch.Tensor, label_ids: Sequence[Sequence[int]], gold: Sequence[int],
                 kind: str) -> RowPredictions:
    """Outcomes from last-token logits (batch, vocab) and each row's label first tokens."""
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
    correct = pred_label == gold_t if kind == "classification" else pred_token == gold_tok
    gold_prob = torch.softmax(logits.float(), -1).gather(1, gold_tok[:, None]).squeeze(1)
    return RowPredictions(correct, in_labels, pred_token, pred_label, gold_prob)


@dataclass
class EvalResult:
    accuracy: float
    tr_ratio: float
    n: int
    rows: list[dict[str, Any]] = field(default_factory=list)
    multi_token_labels: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"accuracy": self.accuracy, "tr_ratio": self.tr_ratio, "n": self.n, "rows": self.rows,
                "multi_token_labels": self.multi_token_labels}


def rows_table(lm: LoadedModel, enc: Encoded, preds: dict[int, RowPredictions], idx: dict[int, int]) -> list[dict]:
    """Per-prompt records: prompt, gold, prediction (as text), correctness, gold probability."""
    out = []
    dec = lm.tokenizer.decode
    for r, p in enumerate(enc.prompts):
        rp, j = preds[r], idx[r]
        pl = int(rp.pred_label[j])
        out.append({"prompt": p.text, "query": p.query, "gold": p.gold,
                    "pred": p.labels[pl] if enc.kind == "classification" else dec([int(rp.pred_token[j])]),
                    "pred_token": dec([int(rp.pred_token[j])]), "correct": bool(rp.correct[j]),
                    "in_labels": bool(rp.in_labels[j]), "gold_prob": float(rp.gold_prob[j])})
    return out


def evaluate(lm: LoadedModel, prompts: Sequence[Prompt], kind: str, batch_size: int = 16,
             progress: Progress | None = None, keep_rows: bool = False) -> EvalResult:
    """Accuracy and TR ratio of `prompts` under a plain forward pass (inference mode)."""
    enc = encode(lm, prompts, kind)
    return evaluate_encoded(lm, enc, batch_size, progress, keep_rows)


def evaluate_encoded(lm: LoadedModel, enc: Encoded, batch_size: int = 16, progress: Progress | None = None,
                     keep_rows: bool = False, forward=None) -> EvalResult:
    """As `evaluate`; `forward(batch) -> logits (batch, vocab)` may replace the plain forward pass."""
    forward = forward or (lambda b: forward_last_logits(lm, b))
    correct = np.zeros(len(enc.ids), dtype=bool)
    inlab = np.zeros(len(enc.ids), dtype=bool)
    preds: dict[int, RowPredictions] = {}
    idx: dict[int, int] = {}

    def step(batch: Batch) -> None:
        logits = forward(batch)
        rp = predict_rows(logits, [enc.label_ids[r] for r in batch.rows], [enc.gold[r] for r in batch.rows],
                          enc.kind)
        correct[batch.rows] = rp.correct.cpu().numpy()
        inlab[batch.rows] = rp.in_labels.cpu().numpy()
        if keep_rows:
            rp = RowPredictions(*(t.cpu() for t in vars(rp).values()))
            for j, r in enumerate(batch.rows):
                preds[r], idx[r] = rp, j

    with lm.lock, torch.inference_mode():
        map_batches(lm, enc.ids, batch_size, step, progress, "evaluate")
    rows = rows_table(lm, enc, preds, idx) if keep_rows else []
    return EvalResult(float(correct.mean()), float(inlab.mean()), len(enc.ids), rows, enc.multi_token)
