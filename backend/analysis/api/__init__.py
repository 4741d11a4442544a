"""The Python API: one typed function per analysis kind of the registry, named by its entry's `api`.

    from backend import load_model, load_task, head_scores
    r = head_scores(load_model("default"), load_task("syn-sentiment"), shots=8, prompts=50)  # -> ScoresResult

Each function's keyword parameters are its kind's params model's fields (names, types, defaults), its docstring
their descriptions, its return annotation the kind's result model; it runs the cached analysis (`kernel.analyze`).
The modules are written from the registry by `python -m backend.analysis.api.generate` (tests/unit/test_api.py checks
them against it). `backend.<api>` is the same function, imported on first use (`import backend` pulls in no torch).
"""
from __future__ import annotations

from .call import call, kind_function
from .general import *  # noqa: F403
from .general import __all__ as _general
from .ltv import *  # noqa: F403
from .ltv import __all__ as _ltv
from .site import *  # noqa: F403
from .site import __all__ as _site
from .tsla import *  # noqa: F403
from .tsla import __all__ as _tsla

__all__ = [*_general, *_tsla, *_ltv, *_site, "call", "kind_function"]
