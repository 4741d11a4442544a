"""Copy as Python: the few lines of the product's API that reproduce a view in a notebook.

Every view of every page offers them (a popover with a code block and its copy button). The lines call the
Python API (`from backend import ...`, one function per analysis kind, named by the kind's name) with the
very parameters the page sent, so a notebook gets the same cached result.
"""
from __future__ import annotations

from typing import Any

import streamlit as st

from . import api

def _value(v: Any) -> str:
    if isinstance(v, list) and v and all(isinstance(x, (list, tuple)) and len(x) == 2 for x in v):
        return "[" + ", ".join(f"({int(a)}, {int(b)})" for a, b in v) + "]"
    if isinstance(v, (list, tuple)) and len(v) == 2 and all(isinstance(x, int) for x in v):
        return f"({int(v[0])}, {int(v[1])})"
    return repr(v)


def python(kind: str, params: dict[str, Any], then: str = "", task_file: str | None = None) -> str:
    """The notebook lines for a `kind` job with `params` (as sent to the service), and `then`
    (lines using the result `r`). An uploaded task is loaded from its file (`task_file`, its name)."""
    fn = api.kind_name(kind)  # the kind's one name: its Python function's too
    model, task = params.get("model", "default"), params.get("task")
    args = ", ".join(f"{k}={_value(v)}" for k, v in params.items() if k not in ("model", "task", "precision"))
    at = f", precision={params['precision']!r}" if params.get("precision") else ""
    if task is None:
        imports, load, call = f"load_model, {fn}", "", f"r = {fn}(lm{', ' + args if args else ''})"
    elif str(task).startswith("upload:"):
        imports = f"load_model, load_task_file, {fn}"
        load = f"task = load_task_file({(task_file or 'my_task.csv')!r})  # the file you uploaded\n"
        call = f"r = {fn}(lm, task{', ' + args if args else ''})"
    else:
        imports, load = f"load_model, load_task, {fn}", f"task = load_task({task!r})\n"
        call = f"r = {fn}(lm, task{', ' + args if args else ''})"
    return (f"from backend import {imports}\n\nlm = load_model({model!r}{at})\n{load}{call}"
            + (f"\n{then.strip()}" if then.strip() else ""))


def show(kind: str, params: dict[str, Any], then: str = "") -> None:
    """A "Copy as Python" popover with the lines that reproduce this view."""
    upload = (st.session_state.get("_hl_uploads") or {}).get(str(params.get("task")), {})
    with st.popover("Copy as Python", icon=":material/code:"):
        st.caption("The same result in a notebook (run from the repository root; results come from the same cache):")
        st.code(python(kind, params, then, upload.get("filename")), language="python")


def defaults(caps: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each service kind's parameter defaults, from the capabilities' params schemas."""
    out: dict[str, dict[str, Any]] = {}
    for k in caps.get("job_kinds") or []:
        props = (k.get("params") or {}).get("properties") or {}
        out[k["name"]] = {n: f.get("default") for n, f in props.items() if "default" in f}
    return out


def _flag_value(v: Any) -> str:
    if isinstance(v, (list, tuple)) and v and all(isinstance(x, (list, tuple)) and len(x) == 2 for x in v):
        return ",".join(f"{int(a)}.{int(b)}" for a, b in v)  # heads, as --heads 3.5,1.2
    if isinstance(v, (list, tuple)):
        return ",".join(str(x) for x in v)
    return str(v)


HEAD_FIELDS = frozenset({"head"})
"""Fields holding one (layer, head): written layer.head on the command line."""


def cli(kind: str, params: dict[str, Any], kind_defaults: dict[str, dict[str, Any]] | None = None,
        task_file: str | None = None, out: str | None = None) -> str:
    """The `python -m backend <kind>` line that computes the same result as a `kind` job with `params`
    (as sent to the service; an uploaded task is named by its file, `task_file`). Booleans are switches (`--x`, or
    `--no-x` for one that defaults to on: `kind_defaults`, service kind -> its defaults, see `defaults`), lists
    comma-separated, heads layer.head; a value that starts with '-' is written `--flag=value`."""
    import shlex

    service_kind = api.kind_name(kind)
    words = ["python", "-m", "backend", service_kind.replace("_", "-")]
    dflt = (kind_defaults or {}).get(service_kind) or {}
    for name, v in params.items():
        if v is None or name == "batch_size":
            continue
        if name == "task" and str(v).startswith("upload:"):
            v = task_file or "my_task.csv"
        flag = "--" + name.replace("_", "-")
        if isinstance(v, bool):
            if v and dflt.get(name) is not True:
                words.append(flag)
            elif not v and dflt.get(name) is True:
                words.append("--no-" + name.replace("_", "-"))
            continue
        text = f"{int(v[0])}.{int(v[1])}" if name in HEAD_FIELDS else _flag_value(v)
        words += [f"{flag}={text}"] if text.startswith("-") else [flag, text]
    if out:
        words += ["--json", out]
    return " ".join(shlex.quote(w) for w in words)
