"""Figures and tables of a `patching` result (backend/analysis/tsla/activation_patching.py): pure functions of the result dicts.

The recovered-share map beside the TR and TL maps of the same prompts (each with its top heads outlined), and the
top heads by recovered share with their gains and TR / TL ranks.
"""
from __future__ import annotations

from typing import Any, Iterable, Sequence

import numpy as np
import plotly.graph_objects as go

from .. import figures

TARGETS = {"zero_shot": "0-shot prompts", "shuffled_inputs": "shuffled inputs", "random_labels": "random labels",
           "flipped_labels": "flipped labels"}
"""The prompt sets a clean activation can be patched into (the kind's `target`), in words."""
PATCHES = {"paired": "paired, prompt i's own", "mean": "mean of the clean prompts"}


def patching_maps(pt: dict[str, Any], scores: dict[str, Any], selected: Iterable[Sequence[int]] = (),
                  title: str | None = None) -> go.Figure:
    """Recovered share (%, as the top-heads table gives it) | TR | TL, side by side, each with its own colour bar
    and its top heads outlined."""
    rec = 100 * np.asarray(pt["recovered"], dtype=float)
    return figures.maps_row([("recovered", rec, "Recovered share (%)"), ("tr", scores["tr"], "TR"),
                             ("tl", scores["tl"], "TL")], selected, title,
                            top=[pt.get("top") or [], scores.get("top_tr") or [], scores.get("top_tl") or []])


def top_rows(pt: dict[str, Any], scores: dict[str, Any], n: int | None = None) -> list[dict[str, Any]]:
    """The heads by recovered share, best first: recovered (%), logit and p(gold) gains, each with its standard
    error over prompts where the result has one (`± se` columns), TR and TL ranks."""
    rec = np.asarray(pt["recovered"], dtype=float)
    lg, pg = np.asarray(pt["logit_gain"], dtype=float), np.asarray(pt["prob_gain"], dtype=float)
    r_tr, r_tl = figures.ranks(np.asarray(scores["tr"], dtype=float)), figures.ranks(np.asarray(scores["tl"], dtype=float))
    order = figures.top_k(rec, n or rec.size)
    se = {k: np.asarray(pt[f"{k}_se"], dtype=float) for k in ("recovered", "logit_gain", "prob_gain")
          if pt.get(f"{k}_se") is not None}
    rows = []
    for h in order:
        row = {"head": figures.head_name(h), "recovered %": 100 * rec[h]}
        if "recovered" in se:
            row["recovered ± se"] = 100 * se["recovered"][h]
        row["logit gain"] = lg[h]
        if "logit_gain" in se:
            row["logit gain ± se"] = se["logit_gain"][h]
        row["p(gold) gain"] = pg[h]
        if "prob_gain" in se:
            row["p(gold) gain ± se"] = se["prob_gain"][h]
        rows.append(row | {"TR rank": int(r_tr[h]), "TL rank": int(r_tl[h])})
    return rows
