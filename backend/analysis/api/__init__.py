"""The Python API: one typed function per built-in kind of the registry, named by its entry's `api`, built here at
import from the registry (`call.kind_function`), so a new kind has its function with nothing more written.

    from backend import load_model, load_task, head_scores
    r = head_scores(load_model("default"), load_task("syn-sentiment"), shots=8, prompts=50)  # -> HeadScoresResult

Each function's keyword parameters are its kind's params model's fields (names, types, defaults), its docstring
their descriptions, its return annotation the kind's result model; it runs the cached analysis (`kernel.analyze`).
`backend.<api>` is the same function, imported on first use (`import backend` pulls in no torch); a kind
registered at run time gets one there too.
"""
from __future__ import annotations

from ..kinds import builtin
from .call import call, kind_function

globals().update({k.api: kind_function(k) for k in builtin()})
__all__ = [*(k.api for k in builtin()), "call", "kind_function"]
