"""A small request of every built-in analysis kind on the default model, from its registry entry (`Kind.example`):
shared by tests/integration/test_cost_model.py, tests/integration/test_cost_plan.py and bench/bit_identical.py. A
kind added to the registry joins them with no edit here."""
from __future__ import annotations

from backend.analysis.kinds import Kind, builtin


def case(kind: Kind) -> tuple[str | None, dict]:
    """(task name or None, params) of `kind`'s example; an AssertionError naming what its entry lacks."""
    where = f"kind {kind.name!r} (backend/analysis/kinds.py)"
    assert kind.example is not None, (
        f"{where} has no example: add example={{'task': 'syn-sentiment', <small params>}} to its entry "
        "(no 'task' for a kind that reads none): the per-kind tests run it on the default model")
    params = dict(kind.example)
    task = params.pop("task", None)
    assert (task is not None) == kind.uses_task, (
        f"{where}: its example {'needs' if kind.uses_task else 'takes no'} a 'task' (uses_task={kind.uses_task})")
    return task, params


CASES = {k.key: case(k) for k in builtin() if k.example is not None}
"""kind -> (task, params), keyed by the name the kind's results are filed under (`Kind.key`: bench/bit_identical.py's
baselines are keyed by it; the registry takes it as a name or an alias). A kind without an example is left out here
and named by tests/integration/test_cost_model.py."""


class MemoryStore(dict):
    """The kernel's Store protocol over a dict."""

    def get(self, key):  # noqa: D102 - the Store protocol
        return dict.get(self, key)

    def put(self, key, value):
        self[key] = value
