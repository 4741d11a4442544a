"""The import graph keeps its floors: pages -> ui -> service -> analysis -> hooks -> models, tasks, cache.

Every import counts: lazy ones inside functions, and type-only ones under `if TYPE_CHECKING:` too.
Inside the analysis floor: the shared building blocks (`primitives`) import nothing above them; the kernel
(kernel, kinds, params, results) only them; each paper's package (tsla, ltv, site), the paper-less kinds (general)
and the cross-method comparison (methods) the kernel, the shared layer and their own package, never each other;
and no kind module imports another one (another kind's result comes through `ctx.call`).
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KERNEL = {"backend.analysis.kernel", "backend.analysis.kinds", "backend.analysis.params", "backend.analysis.results"}
PAPERS = ("tsla", "ltv", "site")


def modules() -> dict[str, Path]:
    files = [ROOT / "app.py", *ROOT.glob("pages/*.py"), *ROOT.glob("ui/**/*.py"), *ROOT.glob("backend/**/*.py")]
    out = {}
    for f in files:
        parts = list(f.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Project modules `name` imports (resolving relative imports), those under `if TYPE_CHECKING:` included: a
    type-only import is a dependency too (a cycle through one is a cycle)."""
    tree = ast.parse(path.read_text())
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            mod = source(node, package)
            targets = [mod] + [f"{mod}.{a.name}" for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name and not name.startswith(t + "."):
                found.add(t)
    return found


def source(node: ast.ImportFrom, package: list[str]) -> str:
    """The module a `from ... import` reads from, relative imports resolved."""
    base = ".".join(package[: len(package) - node.level + 1]) if node.level else ""
    return ".".join(x for x in (base, node.module or "") if x)


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_uses(name: str, path: Path, known: dict[str, Path]) -> list[str]:
    """The private names (`_x`) `name` takes from another project module: `from m import _x`, or `m._x` after
    `import m` / `from p import m`."""
    tree = ast.parse(path.read_text())
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    modules, out = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            mod = source(node, package)
            for a in node.names:
                if f"{mod}.{a.name}" in known:
                    modules.add(a.asname or a.name)
                elif mod in known and mod != name and private(a.name):
                    out.append(f"{name}: from {mod} import {a.name}")
        elif isinstance(node, ast.Import):
            modules.update(a.asname for a in node.names if a.asname and a.name in known)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and private(node.attr) and isinstance(node.value, ast.Name)
                and node.value.id in modules):
            out.append(f"{name}: {node.value.id}.{node.attr}")
    return out


def floor(m: str) -> int:
    if m == "app" or m.startswith("pages"):
        return 6
    if m.startswith("ui"):
        return 5
    if m.startswith("backend.service") or m in ("backend.cli", "backend.launch", "backend.__main__"):
        return 4
    if m.startswith("backend.analysis"):
        return 3
    if m == "backend.model.hooks":
        return 2
    if m == "backend":
        return 7  # the package's lazy public face
    return 1


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    known = modules()
    return {m: imports(m, p, known) for m, p in known.items()}


def test_no_import_runs_up_the_floors(graph):
    up = sorted((a, b) for a, deps in graph.items() for b in deps if floor(b) > floor(a) and floor(b) != 7)
    assert not up, "upward imports: " + "; ".join(f"{a} -> {b}" for a, b in up)


def test_no_cycles(graph):
    seen: dict[str, int] = {}  # 1 on the stack, 2 done
    cycles = []

    def visit(m: str, stack: list[str]) -> None:
        seen[m] = 1
        for d in graph.get(m, ()):
            if seen.get(d) == 1:
                cycles.append(stack[stack.index(d):] + [d])
            elif d not in seen:
                visit(d, stack + [d])
        seen[m] = 2

    for m in graph:
        if m not in seen:
            visit(m, [m])
    assert not cycles, "cycles: " + "; ".join(" -> ".join(c) for c in cycles)


UI_SHARED = {"backend.text", "backend.report.html_export", "backend.report.findings_html",
             "backend.service.app"}
"""All the UI imports of the backend (docs/architecture.md): durations in words and the HTML reports (pure
functions of plain values), and the service itself, in-process (`ui/client.py`); the registry comes through
`GET /capabilities`."""


def test_the_ui_reaches_the_backend_through_the_service_only(graph):
    bad = sorted(f"{a} -> {b}" for a, deps in graph.items() if floor(a) in (5, 6) for b in deps
                 if b.startswith("backend") and b not in UI_SHARED)
    assert not bad, "the UI imports the backend past the service: " + "; ".join(bad)


PENDING: set[str] = set()
"""Modules still allowed to take private names from another; empty since the engine's shared names became public."""


def test_no_module_takes_a_private_name_from_another():
    """A name used across files is public (no leading underscore): `from .engine_rows import _halve` would make a
    module's inside part of another's."""
    known = modules()
    bad = [use for m, p in known.items() if m not in PENDING for use in private_uses(m, p, known)]
    assert not bad, "private names imported across modules: " + "; ".join(sorted(bad))


def room(m: str) -> str:
    """Where an analysis module sits: the kernel, the shared building blocks, a paper's package (tsla, ltv, site),
    the paper-less kinds (general), the cross-method comparison (methods), the three papers' report (findings), or
    the Python API (api: one function per kind, imported by no other room)."""
    if m in KERNEL:
        return "kernel"
    part = m.split(".")[2] if m.count(".") >= 2 else ""
    return {"primitives": "shared", "compare_methods": "methods"}.get(part, part)


ALLOWED = {  # room -> the rooms it may import (its own included)
    "shared": {"shared"},
    "kernel": {"kernel", "shared"},
    **{paper: {"kernel", "shared", paper} for paper in PAPERS},
    "general": {"kernel", "shared", "general"},
    "methods": {"kernel", "shared"},
    "findings": {"kernel", "shared", "findings", "site"},  # the report's SITE section re-patches saved alphas
    "api": {"kernel", "shared", "general", *PAPERS, "methods", "findings", "api"},  # the Python API: one per kind
}


def test_analysis_rooms(graph):
    """The shared layer imports nothing above it; a paper's package imports the kernel, the shared layer and itself,
    never another paper (another kind's result comes through the kernel's cached call)."""
    analysis = [m for m in graph if m.startswith("backend.analysis.")]
    assert {room(m) for m in analysis} == set(ALLOWED), sorted({room(m) for m in analysis})
    bad = [(m, d) for m in analysis for d in graph[m] if d.startswith("backend.analysis.")
           and room(d) not in ALLOWED[room(m)]]
    assert not bad, "imports across the analysis rooms: " + "; ".join(f"{a} -> {b}" for a, b in bad)


def test_kind_modules_never_import_each_other(graph):
    from backend.analysis.kinds import KINDS

    kind_modules = {k.module for k in KINDS.values()}
    assert {"backend.analysis.tsla.head_scores", "backend.analysis.ltv.ltv_layers", "backend.analysis.site.site_alphas"} <= kind_modules
    bad = [(m, d) for m in kind_modules for d in graph[m] if d in kind_modules]
    assert not bad, "kind modules importing kind modules: " + "; ".join(f"{a} -> {b}" for a, b in bad)


def test_each_kind_is_one_module():
    """An entry points at one module that holds the kind's params model, result model and function."""
    from backend.analysis.kinds import KINDS, Kind
    from backend.analysis.params import Params
    from backend.analysis.results import Result

    builtin = [k for k in KINDS.values() if k.module.startswith("backend.analysis.")]
    assert len(builtin) >= 20  # the product's kinds, and any added since (no count to edit here)
    for k in builtin:
        assert isinstance(k, Kind) and issubclass(k.params, Params) and issubclass(k.result, Result), k.name
        assert {k.params.__module__, k.result.__module__, k.function().__module__} == {k.module}, k.name


def test_the_kernel_and_options_need_no_torch():
    import subprocess
    import sys

    code = ("import sys, backend.analysis.primitives.options, backend.analysis.kernel, backend.analysis.kinds, backend.analysis.params, "
            "backend.analysis.results; assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_no_file_over_450_lines():
    files = [ROOT / "app.py", *ROOT.glob("backend/**/*.py"), *ROOT.glob("ui/**/*.py"), *ROOT.glob("pages/*.py")]
    long = {str(f.relative_to(ROOT)): n for f in files if (n := len(f.read_text().splitlines())) > 450}
    assert not long, f"files over 450 lines (split them by job): {long}"


LOOSE = {"__init__", "__main__", "cli", "launch", "errors", "text"}
"""The backend's only loose modules: its public face, the two entry points (the CLI and the launcher, which sit on
the service's floor) and the two things every floor shares (the error root and the rule for echoing user text)."""
BACKEND_ROOMS = {  # room -> the rooms it may import besides itself and the loose errors / text
    "store": set(),
    "weights": {"store", "model"},
    "model": {"store", "weights"},
    "tasks": {"store"},
    "report": set(),
    "analysis": {"store", "weights", "model", "tasks"},
    "service": {"store", "weights", "model", "tasks", "analysis", "report"},
}


def backend_room(m: str) -> str:
    parts = m.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in BACKEND_ROOMS) else "loose"


def test_the_backend_is_rooms_with_at_most_six_loose_modules():
    loose = {f.stem for f in (ROOT / "backend").glob("*.py")}
    rooms = {d.name for d in (ROOT / "backend").iterdir() if (d / "__init__.py").is_file()}
    assert loose == LOOSE and len(loose) <= 6, sorted(loose ^ LOOSE)
    assert rooms == set(BACKEND_ROOMS), sorted(rooms ^ set(BACKEND_ROOMS))


def test_rooms_import_only_the_rooms_below(graph):
    """store imports no other room; weights and model each other's (a model loads from its files, a file is checked
    against the adapter table) and the store; tasks the store; analysis everything below it; the service all."""
    bad = [(m, d) for m, deps in graph.items() if m.startswith("backend.") for d in deps
           if d.startswith("backend.") and backend_room(d) not in ("loose", backend_room(m))
           and backend_room(m) != "loose" and backend_room(d) not in BACKEND_ROOMS[backend_room(m)]]
    assert not bad, "imports across the backend's rooms: " + "; ".join(f"{a} -> {b}" for a, b in bad)
