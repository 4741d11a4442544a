"""Command line: `python -m backend {tasks,scores,icl,...}`.

Results go to `--json OUT` (or stdout), progress bars and errors to stderr. A bad input exits with
status 2 and a one-line message; nothing prints a traceback at a user.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

COMMANDS: dict[str, Callable[[argparse.Namespace], Any]] = {}


def command(name: str):
    def deco(fn):
        COMMANDS[name] = fn
        return fn
    return deco


def _emit(obj: Any, out: str | None) -> None:
    text = json.dumps(obj, indent=1, allow_nan=True)
    if out and out != "-":
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text)
        print(f"wrote {out}", file=sys.stderr)
    else:
        print(text)


class Bar:
    """A tqdm bar on stderr fed by progress(fraction, message) callbacks."""

    def __init__(self, desc: str):
        from tqdm import tqdm

        self.bar = tqdm(total=1000, desc=desc, file=sys.stderr, leave=False,
                        bar_format="{desc}: {percentage:3.0f}%|{bar}| {elapsed}<{remaining} {postfix}")

    def __call__(self, frac: float, msg: str = "") -> None:
        self.bar.n = int(1000 * min(max(frac, 0.0), 1.0))
        self.bar.set_postfix_str(msg, refresh=False)
        self.bar.refresh()

    def close(self) -> None:
        self.bar.close()


def _ints(s: str) -> list[int]:
    try:
        return [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {s!r}") from None


def _model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="default", help="`default`, a local HF folder, or a Hugging Face id")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if present)")
    p.add_argument("--dtype", default=None, choices=["fp32", "bf16", "fp16"], help="default: bf16 on GPU, fp32 on CPU")
    p.add_argument("--device-map", default=None, help="`auto` spreads the model over GPUs (accelerate)")
    p.add_argument("--trust-remote-code", action="store_true", help="allow the model repo's own code (off by default)")
    p.add_argument("--batch-size", type=int, default=16)


def _task_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--task", help="a built-in task name or a task file (JSON / JSONL / CSV)")
    p.add_argument("--kind", choices=["classification", "generation"], help="override the inferred task kind")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", dest="out", default=None, help="write the result JSON here (default: stdout)")


def _size_args(p: argparse.ArgumentParser, shots: bool = True, prompts: int = 50, top_pct: bool = False) -> None:
    """The arguments every analysis command shares: --shots, --prompts, [--top-pct], --no-cache."""
    if shots:
        p.add_argument("--shots", type=int, default=8)
    p.add_argument("--prompts", type=int, default=prompts)
    if top_pct:
        p.add_argument("--top-pct", type=float, default=3.0)
    p.add_argument("--no-cache", action="store_true")


def _load_model(a: argparse.Namespace):
    from .models import load_model

    return load_model(a.model, device=a.device, dtype=a.dtype, device_map=a.device_map,
                      trust_remote_code=a.trust_remote_code)


def _load_task(a: argparse.Namespace):
    from .tasks.base import TaskError
    from .tasks.registry import load_task

    if not a.task:
        raise TaskError("--task is required (see `python -m backend tasks`)")
    return load_task(a.task, kind=a.kind)


def _run_task_command(a: argparse.Namespace, desc: str, fn: Callable[[Any, Any, Bar], dict]) -> dict:
    """Load the model and task, run `fn(lm, task, progress_bar)`, print its warnings, write its JSON."""
    lm, task = _load_model(a), _load_task(a)
    bar = Bar(desc)
    try:
        r = fn(lm, task, bar)
    finally:
        bar.close()
    for w in r.get("warnings", []):
        print(f"warning: {w}", file=sys.stderr)
    _emit(r, a.out)
    return r


@command("tasks")
def cmd_tasks(a: argparse.Namespace) -> None:
    from .tasks.registry import builtin_tasks, task_summary

    rows = [task_summary(t) for t in builtin_tasks().values()]
    if a.json:
        print(json.dumps(rows, indent=1))
        return
    for r in rows:
        labels = ", ".join(r["labels"][:6]) + (" ..." if len(r["labels"]) > 6 else "") if r["labels"] else "(open)"
        print(f"{r['name']:<24} {r['kind']:<15} {r['n_examples']:>5}  models={r['models']:<8} labels: {labels}")


@command("scores")
def cmd_scores(a: argparse.Namespace) -> None:
    from .analysis.scores import head_scores

    lm = _load_model(a)
    if a.prompts_file:
        from .tasks.files import load_prompts_file

        prompts = load_prompts_file(a.prompts_file)
        task, kind = None, a.kind or "classification"
    else:
        prompts, task, kind = None, _load_task(a), None
    bar = Bar("scores")
    try:
        r = head_scores(lm, task, shots=a.shots, n_prompts=a.prompts, seed=a.seed, prompts=prompts, kind=kind,
                        batch_size=a.batch_size, apply_ln=a.apply_ln, top_pct=a.top_pct, cache=not a.no_cache,
                        progress=bar)
    finally:
        bar.close()
    for w in r.warnings:
        print(f"warning: {w}", file=sys.stderr)
    if r.multi_token_labels:
        print(f"note: {len(r.multi_token_labels)} label(s) span several tokens and are scored by their first: "
              f"{r.multi_token_labels[:8]}", file=sys.stderr)
    _emit(r.to_json(), a.out)


@command("icl")
def cmd_icl(a: argparse.Namespace) -> None:
    from .analysis.icl import icl_curve

    _run_task_command(a, "icl", lambda lm, task, bar: icl_curve(
        lm, task, a.shots, a.prompts, a.seed, a.batch_size, cache=not a.no_cache, progress=bar))


def _heads(s: str) -> list[tuple[int, int]]:
    """`3.5,10.2` -> [(3, 5), (10, 2)] (layer.head)."""
    try:
        return [(int(x.split(".")[0]), int(x.split(".")[1])) for x in s.split(",") if x.strip()]
    except (ValueError, IndexError):
        raise argparse.ArgumentTypeError(f"heads are written layer.head, comma-separated (3.5,10.2), not {s!r}") from None


@command("ablate")
def cmd_ablate(a: argparse.Namespace) -> None:
    from .analysis.ablation import ablate, ablation_curve

    def run(lm, task, bar):
        common = dict(mode=a.mode, shots=a.shots, n_prompts=a.prompts, seed=a.seed, batch_size=a.batch_size,
                      positions=a.positions, cache=not a.no_cache, progress=bar)
        return ablate(lm, task, a.heads, **common) if a.heads else ablation_curve(lm, task, a.by, ks=a.ks, **common)

    _run_task_command(a, "ablate", run)


def _layer(s: str) -> int | str:
    return s if s == "all" else int(s)


@command("steer")
def cmd_steer(a: argparse.Namespace) -> None:
    from .analysis.steering import steer

    _run_task_command(a, "steer", lambda lm, task, bar: steer(
        lm, task, vectors=a.vector, layer=a.layer, alpha=a.alpha, shots=a.shots, n_prompts=a.prompts, seed=a.seed,
        top_pct=a.top_pct, heads=a.heads, batch_size=a.batch_size, cache=not a.no_cache, progress=bar))


@command("geometry")
def cmd_geometry(a: argparse.Namespace) -> None:
    from .analysis.geometry import geometry

    _run_task_command(a, "geometry", lambda lm, task, bar: geometry(
        lm, task, layer=a.layer, alpha=a.alpha, shots=a.shots, n_prompts=a.prompts, seed=a.seed,
        final_norm=a.final_norm, pca_layer=a.pca_layer, top_pct=a.top_pct, batch_size=a.batch_size,
        cache=not a.no_cache, progress=bar))


@command("perturb")
def cmd_perturb(a: argparse.Namespace) -> None:
    from .analysis.perturbations import perturbation_report

    _run_task_command(a, "perturb", lambda lm, task, bar: perturbation_report(
        lm, task, perturbations=a.perturbations, shots=a.shots, n_prompts=a.prompts, seed=a.seed, k=a.k,
        top_pct=a.top_pct, batch_size=a.batch_size, cache=not a.no_cache, progress=bar))


def _words(s: str) -> list[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


@command("launch")
def cmd_launch(a: argparse.Namespace) -> None:
    from .launch import launch

    launch(a)


@command("serve")
def cmd_serve(a: argparse.Namespace) -> None:
    import uvicorn

    from .service.app import create_app

    if a.host not in ("127.0.0.1", "localhost", "::1") and not os.environ.get("HEADLENS_TOKEN"):
        print(f"warning: serving on {a.host} without HEADLENS_TOKEN: anyone who can reach it can run jobs",
              file=sys.stderr)
    print(f"headlens service on http://{a.host}:{a.port} (clients find it through HEADLENS_BACKEND_URL)",
          file=sys.stderr)
    uvicorn.run(create_app(), host=a.host, port=a.port, log_level=a.log_level)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m backend", description="headlens: which heads do in-context learning")
    sub = p.add_subparsers(dest="cmd", required=True)

    t = sub.add_parser("tasks", help="list built-in tasks")
    t.add_argument("--json", action="store_true", help="print a JSON list")

    s = sub.add_parser("scores", help="per-head TR / TL / DLA / induction maps of a task")
    _model_args(s)
    _task_args(s)
    _size_args(s, top_pct=True)
    s.add_argument("--prompts-file", help="JSONL of {prompt, label, labels} records, scored as given")
    s.add_argument("--apply-ln", action="store_true", help="scale head writes by the final norm's scale")

    i = sub.add_parser("icl", help="accuracy and TR ratio against the number of demonstrations")
    _model_args(i)
    _task_args(i)
    i.add_argument("--shots", type=_ints, default=[0, 1, 2, 4, 8])
    _size_args(i, shots=False, prompts=100)

    b = sub.add_parser("ablate", help="ablation curve over top-k heads, or a given head set")
    _model_args(b)
    _task_args(b)
    b.add_argument("--by", choices=["tr", "tl", "induction", "random"], default="tr")
    b.add_argument("--ks", type=_ints, default=[0, 1, 2, 4, 8])
    b.add_argument("--heads", type=_heads, help="ablate this set instead, e.g. 3.5,10.2 (layer.head)")
    b.add_argument("--mode", choices=["zero", "mean"], default="zero")
    b.add_argument("--positions", choices=["all", "last"], default="all", help="ablate at every token or the last")
    _size_args(b)

    st = sub.add_parser("steer", help="add task vectors built from heads to zero-shot prompts")
    _model_args(st)
    _task_args(st)
    st.add_argument("--vector", type=_words, default=["tr", "tl", "random", "fv", "vanilla"],
                    help="comma-separated: tr, tl, random, fv, vanilla")
    st.add_argument("--layer", type=_layer, default=None, help="decoder layer (default L/2), or `all` to sweep")
    st.add_argument("--alpha", type=float, default=1.0)
    st.add_argument("--heads", type=_heads, help="also a vector from this head set (layer.head,...)")
    _size_args(st, top_pct=True)

    g = sub.add_parser("geometry", help="hidden-state alignment, LD, rotation per layer; PCA")
    _model_args(g)
    _task_args(g)
    g.add_argument("--layer", type=int, default=None, help="injection layer of the steered conditions (default L/2)")
    g.add_argument("--alpha", type=float, default=1.0)
    g.add_argument("--final-norm", action="store_true", help="apply the final norm to hidden states first")
    g.add_argument("--pca-layer", type=int, default=None)
    _size_args(g, top_pct=True)

    pe = sub.add_parser("perturb", help="demonstration perturbations: accuracy, TR ratio, map diffs, ablations")
    _model_args(pe)
    _task_args(pe)
    pe.add_argument("--perturbations", type=_words, default=None,
                    help="comma-separated: shuffled_inputs, random_labels, flipped_labels, symbol_labels, number_labels")
    pe.add_argument("--k", type=int, default=None, help="heads ablated per set (default: the top-pct set size)")
    _size_args(pe, top_pct=True)

    la = sub.add_parser("launch", help="start the backend service and the dashboard together, print the URL")
    la.add_argument("--host", default="127.0.0.1")
    la.add_argument("--port", type=int, default=8501, help="dashboard port")
    la.add_argument("--backend-port", type=int, default=8765)
    la.add_argument("--model", default="default", help="model the dashboard opens on")
    la.add_argument("--no-browser", action="store_true")

    v = sub.add_parser("serve", help="run the HTTP service (FastAPI + uvicorn)")
    v.add_argument("--host", default="127.0.0.1", help="interface to bind (default: loopback only)")
    v.add_argument("--port", type=int, default=8765)
    v.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    return p


def main(argv: list[str] | None = None) -> int:
    from .adapters import UnsupportedArchitecture
    from .models import ModelLoadError
    from .tasks.base import TaskError

    a = build_parser().parse_args(argv)
    try:
        COMMANDS[a.cmd](a)
    except (TaskError, ModelLoadError, UnsupportedArchitecture, MemoryError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 0
