"""Does the task fit the model? The `fit` job's verdict, shown above every page's results and in the upload
confirmation: unknown tokens in inputs and labels, prompt length against the context window."""
from __future__ import annotations

from typing import Any

import streamlit as st

from . import jobs, state


def params(s: state.Settings, task: str | None = None) -> dict[str, Any]:
    return {"model": s.model, "task": task or s.task, "shots": s.shots, "seed": s.seed, **s.conventions()}


def summary(r: dict[str, Any]) -> str:
    """One line: the unknown-token shares and the prompt length."""
    parts = []
    if r.get("has_unknown_token"):
        parts.append(f"{100 * r['unknown_input_tokens']:.0f}% of the input tokens and {100 * r['unknown_labels']:.0f}% "
                     f"of the labels are unknown to the model's tokenizer")
    else:
        parts.append("the tokenizer reads any text (no unknown token)")
    c = r.get("context")
    if c and c.get("context_window"):
        parts.append(f"prompts of {c['shots']} shots take up to {c['longest_prompt']} of {c['context_window']} tokens")
    elif c:
        parts.append(f"prompts of {c['shots']} shots take up to {c['longest_prompt']} tokens")
    return "; ".join(parts)


def show(r: dict[str, Any] | None, model: str) -> None:
    """The verdict as a caption (fits), a warning, or an error (refused)."""
    if r is None:
        return
    why = "\n".join(f"- {m}" for m in r.get("messages") or [])
    if r["verdict"] == "refuse":
        st.error(f"**This task does not fit model `{model}`**: {summary(r)}.\n\n{why}", icon=":material/block:")
    elif r["verdict"] == "warn":
        jobs.warn(f"**This task may not fit model `{model}`**: {summary(r)}.\n\n{why}")
    else:
        st.caption(f":material/check_circle: Fits `{model}`: {summary(r)}.")


def check(s: state.Settings, stop: bool = True) -> dict[str, Any] | None:
    """Run (or recall) the fit check of the current model and task and show it; stop the page when the task
    is refused (nothing on it could run)."""
    r = jobs.fetch("task_fit", params(s), "Checking the task against the model", what="Fit check")
    show(r, s.model)
    if stop and r is not None and r["verdict"] == "refuse":
        st.stop()
    return r
