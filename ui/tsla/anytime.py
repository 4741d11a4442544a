"""Anytime views of a running `scores` job: its head maps and accuracies so far, marked partial.

The job's `live` data while it scores heads (backend/analysis/tsla/head_scores.py, `head_maps(partial=...)`):
{"kind": "maps", "prompts_done", "prompts", "tr", "tl", "dla_tr", "dla_tl", "flagged" (layers x heads, the means
over the prompts done), "icl" (accuracy, label_accuracy, tr_ratio, n over them), "n_layers", "n_heads", "shots",
"stats" ({tr, tl, dla_tr, dla_tl: {se, ci_low, ci_high}} over the prompts done, the interval normal: mean ± 1.96 SE)
and "interval": "normal"}. The map's hover carries each head's SE and interval so far (`map_uncertainty`).
Drawn below the job's progress bar and replaced by the final result when the job ends.
"""
from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np
import streamlit as st

from .. import figures
from .. import metrics as M
from . import map_uncertainty as mu

PARTIAL_MAPS = ("tr", "tl", "dla_tr", "dla_tl", "flagged")


def is_partial_maps(data: dict[str, Any] | None) -> bool:
    return bool(data) and data.get("kind") == "maps" and all(k in data for k in ("prompts_done", "prompts", "tr"))


def partial_note(data: dict[str, Any]) -> str:
    """"Partial: 8 of 50 prompts" and what is still to come."""
    done, total = int(data["prompts_done"]), int(data["prompts"])
    rest = ("the maps refine as prompts finish" if done < total else
            "all prompts scored; the 0-shot run and the induction scores follow")
    return f"**Partial: {done} of {total} prompts** · {rest}."


def interval_note(data: dict[str, Any], metric: str) -> str:
    """"SE up to 0.012 ..." of the map so far ("" when the view has no statistics for this map)."""
    se = np.asarray((((data.get("stats") or {}).get(metric) or {}).get("se")) or [], dtype=float)
    if not se.size or not np.isfinite(se).any():
        return ""
    return (f"Hover a head for its standard error and 95% interval over the {data['prompts_done']} prompts done "
            f"(a normal interval, mean ± 1.96 SE; the final map's is a bootstrap): SE up to "
            f"{float(np.nanmax(se)):.3g}; narrowing as prompts finish.")


class PartialView:
    """A running scores job's view so far, redrawn in one place when more prompts are done (at most every
    `min_interval_s`). Each draw of a script run gets its own element key (Streamlit refuses a key used twice)."""

    def __init__(self, name: str, min_interval_s: float = 0.3):
        self.name, self.min_interval_s = name, min_interval_s
        self.box: Any = None
        self.draws, self.last, self.shown_at = 0, None, 0.0

    def _due(self, data: dict[str, Any]) -> bool:
        now = time.monotonic()
        sig = int(data["prompts_done"])
        if sig == self.last or now - self.shown_at < self.min_interval_s:
            return False
        if self.box is None:
            self.box = st.empty()
        self.draws += 1
        self.last, self.shown_at = sig, now
        return True

    def metrics(self, data: dict[str, Any]) -> None:
        """The accuracies over the prompts done (Home's summary, partial)."""
        with self.box.container():
            st.info(partial_note(data), icon=":material/hourglass_top:")
            icl, shots = data.get("icl") or {}, data.get("shots")
            cols = st.columns(len(M.NAMES))
            for col, name in zip(cols, M.NAMES):
                if name in icl:
                    col.metric(f"{M.LABEL[name]} ({shots}-shot, so far)", M.pct(icl[name]), border=True,
                               help=M.HELP[name] + f" Over the first {data['prompts_done']} prompts.")

    def head_map(self, data: dict[str, Any], metric: str, title: str) -> None:
        """The map of `metric` over the prompts done (TR when `metric` is not one of them), with its accuracy."""
        metric = metric if metric in PARTIAL_MAPS and metric in data else "tr"
        spec = figures.map_spec(metric)
        icl = data.get("icl") or {}
        with self.box.container():
            acc = f" Accuracy so far: **{M.pct(icl['accuracy'])}**." if "accuracy" in icl else ""
            st.info(partial_note(data) + acc, icon=":material/hourglass_top:")
            fig = figures.head_heatmap(data[metric], metric,
                                       title=f"{spec['label']} (partial: {data['prompts_done']} of "
                                             f"{data['prompts']} prompts): {spec['long']}{title}")
            mu.annotate(fig, data, metric)
            st.plotly_chart(fig, key=f"{self.name}_partial_{self.draws}",
                            config=figures.png_config(f"headmap-{metric}-partial"))
            note = interval_note(data, metric)
            if note:
                st.caption(note)

    def clear(self) -> None:
        if self.box is not None:
            self.box.empty()


def map_drawer(view: PartialView, metric: Callable[[], str], title: str) -> Callable[[dict[str, Any]], None]:
    """An `on_live` callback drawing the partial map of the metric picked (`metric()`) into `view`."""
    def draw(data: dict[str, Any]) -> None:
        if is_partial_maps(data) and view._due(data):
            view.head_map(data, metric(), title)
    return draw


def summary_drawer(view: PartialView) -> Callable[[dict[str, Any]], None]:
    """An `on_live` callback drawing the partial accuracies into `view`."""
    def draw(data: dict[str, Any]) -> None:
        if is_partial_maps(data) and view._due(data):
            view.metrics(data)
    return draw
