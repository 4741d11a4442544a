"""Estimates against real runs (issue 25, item 3): every kind, on the embedded model and on SmolLM2-135M.

    python bench/bench_estimates.py                                   # both models, every kind
    python bench/bench_estimates.py --models default --kinds maps,site --json out.json
    python bench/bench_estimates.py --smoke                           # three kinds on the embedded model (CI)

What the service does before a job, done here in one process: load the model, run `model_info` (it measures the
model's seconds per pass and per token, `pass_speed`) and keep that speed (`estimate.note_speed`), then ask
`estimate()` for each job (the number `POST /jobs/estimate` answers and a page shows beside its Run button).
Each kind then runs once, cold (an empty result store, the process's memos emptied), timed by the wall clock,
with torch's threads as the service runs them (HEADLENS_TORCH_THREADS, default 1, unless OMP_NUM_THREADS is set).
The params are small but real (a few prompts and shots, short trainings) so the whole table finishes in minutes
on 2 cores. The target is estimate / real within 0.67-1.5x.

SmolLM2 needs its folder: HEADLENS_MODELS_DIR=/work/main/models/pulled (or wherever `pull` put it); a model that
cannot load is reported and skipped. Other work may share the CPU: each row prints the 1-minute load average.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("OMP_NUM_THREADS", os.environ.get("HEADLENS_TORCH_THREADS", "1"))  # as `launch` runs the service
os.environ.setdefault("HEADLENS_CACHE_DIR", tempfile.mkdtemp(prefix="bench-estimates-"))

SMALL = dict(prompts=8, shots=4)
LTV = dict(epochs=2, patience=2, train_prompts=8, val_prompts=4, batch_size=4)
SITE = dict(m=8, shots=4, steps=40, val_every=20, val_prompts=4, prompts=8, max_new_tokens=4)


def cases(model: str) -> dict[str, tuple[str | None, dict]]:
    """kind -> (task, params) on `model`: its own tasks (the synthetic ones on the embedded model)."""
    syn = model == "default"
    cls, gen = ("syn-sentiment", "syn-antonym") if syn else ("sentiment", "antonym")
    two = ["syn-antonym", "syn-successor"] if syn else ["antonym", "present-past"]
    return {
        "model_info": (None, {}),
        "fit": (cls, {}),
        "maps": (cls, SMALL),
        "scores": (cls, SMALL),
        "icl": (cls, {"prompts": 8, "shots": [0, 2, 4]}),
        "ablation_curves": (cls, {**SMALL, "ks": [0, 2, 4, 8], "random_seeds": [0, 1]}),
        "ablate": (cls, {**SMALL, "heads": [[1, 2], [3, 0]], "mode": "mean"}),
        "head": (cls, {**SMALL, "head": [1, 2]}),
        "vectors": (gen, SMALL),
        "steer": (gen, {**SMALL, "layer": "all"}),
        "geometry": (gen, SMALL),
        "perturb": (cls, {**SMALL, "perturbations": ["shuffled_inputs", "random_labels"]}),
        "patching": (cls, SMALL),
        "ltv_train": (gen, LTV),
        "ltv": (gen, {**LTV, **SMALL, "perturbations": 16, "random_draws": 2}),
        "ltv_tasks": (None, {**LTV, **SMALL, "tasks": two}),
        "site": (gen, {**SITE, "budget": [4], "patching": [1, 4], "icl_shots": [2]}),
        "site_transfer": (None, {**SITE, "tasks": two}),
        "methods": (gen, {**SMALL, "site_m": 8, "site_shots": 4, "site_steps": 40}),
        "findings": (None, {"tasks": [cls], "sections": ["tsla"], "prompts": 8, "shots": 4, "random_sets": 1}),
    }


SMOKE = {"model_info": (None, {}), "maps": ("syn-sentiment", {"prompts": 4, "shots": 2}),
         "site": ("syn-antonym", {**SITE, "m": 4, "shots": 2, "steps": 4, "val_every": 2, "prompts": 4,
                                  "budget": [], "patching": [], "correlations": [], "compare": ["zero_shot"]})}


class MemoryStore(dict):
    """An empty result store per run: every job computes cold, its sub-calls too."""

    def get(self, key):  # noqa: D102 - the Store protocol
        return dict.get(self, key)

    def put(self, key, value):
        self[key] = value


def cold() -> None:
    """Empty the process's memos a job may reuse (the speed stays measured, as in the service)."""
    from backend.analysis.primitives import induction
    from backend.analysis.primitives.prefix_store import STORE

    induction._MEMO.clear()
    STORE.clear()


def warm_up(smoke: bool, kinds: list[str] | None) -> None:
    """Every kind once on the embedded model, untimed: the imports a kind makes on first use (scipy, sklearn, ...)
    and one-time setup are a process's, not a job's (the service pays them once)."""
    from backend.analysis.kernel import analyze
    from backend.model.loading import load_model
    from backend.tasks.registry import load_task

    lm = load_model("default")
    for kind, (task_name, params) in (SMOKE if smoke else cases("default")).items():
        if kinds and kind not in kinds:
            continue
        try:
            analyze(kind, lm, load_task(task_name) if task_name else None, params, cache=MemoryStore())
        except Exception:  # noqa: BLE001 - the timed run reports it
            pass
    print(f"warmed up; load {os.getloadavg()[0]:.1f}", flush=True)


def timed(model: str | None, spec, lm, task, p) -> tuple[float, str | None]:
    """One cold run of a kind, wall-clock seconds (and its error), taught to the estimate's correction as the
    service's executor does (`calibration.measuring`: CPU seconds against the plan)."""
    from backend.analysis.kernel import analyze
    from backend.service.calibration import measuring
    from backend.service.execute import planned

    plan, cpu = planned(spec, p.model_dump(mode="json"), model, task, lm)
    t = time.perf_counter()
    try:
        with measuring(model, spec.name, plan, cpu):
            analyze(spec.name, lm, task, p, cache=MemoryStore() if spec.cached else False)
        return time.perf_counter() - t, None
    except Exception as ex:  # noqa: BLE001 - a row, not a crash
        return time.perf_counter() - t, f"{type(ex).__name__}: {str(ex)[:120]}"


def run_model(model: str, kinds: list[str] | None, smoke: bool, count_calls: bool = False,
              twice: bool = False) -> list[dict]:
    from backend.analysis.kernel import analyze
    from backend.analysis.kinds import get_kind
    from backend.model.loading import load_model
    from backend.service.estimate import canonical_name, estimate, note_speed
    from backend.tasks.registry import load_task

    try:
        lm = load_model(model)
    except Exception as e:  # noqa: BLE001 - reported, the other model still runs
        print(f"{model}: cannot load ({type(e).__name__}: {str(e)[:160]}); skipped", flush=True)
        return []
    name = canonical_name(model)
    t0 = time.perf_counter()
    info = analyze("model_info", lm, None, {}, cache=False).to_json()
    note_speed(name, info)
    print(f"{model}: measured in {time.perf_counter() - t0:.1f} s: {info.get('seconds_per_pass')} s/pass, "
          f"{info.get('seconds_per_token')} s/token, load {os.getloadavg()[0]:.1f}", flush=True)
    count = [0.0, 0.0]  # tokens and forward calls through the whole model, as test_cost_model counts them

    def pre(_module, args, kwargs):
        x = args[0] if args else kwargs["input"]
        count[0] += x.shape[0] * x.shape[1] / lm.n_layers
        count[1] += 1 / lm.n_layers

    for layer in range(lm.n_layers if count_calls else 0):  # a hook per layer costs a little: off by default
        lm.o_proj(layer).register_forward_pre_hook(pre, with_kwargs=True)
    rows = []
    table = SMOKE if smoke else cases(model)
    for kind, (task_name, params) in table.items():
        if kinds and kind not in kinds:
            continue
        spec = get_kind(kind)
        task = load_task(task_name) if task_name else None
        p = spec.params.model_validate(params)
        e = estimate(spec, p, name if spec.uses_model else None, task)
        cold()
        if kind == "model_info":  # its work is the speed measurement, made once per model: time it again
            from backend.analysis.primitives import pass_speed

            pass_speed._SPEED.clear()
        count[:] = [0.0, 0.0]
        load = os.getloadavg()[0]
        real, error = timed(name if spec.uses_model else None, spec, lm, task, p)
        ratio = e.seconds / real if e.seconds is not None and real > 0 else None
        row = {"model": model, "kind": kind, "estimate_s": e.seconds, "real_s": real, "ratio": ratio,
               "basis": e.seconds_basis, "how": e.how + e.load_note, "load_factor": e.load_factor,
               "tokens": e.tokens, "real_tokens": count[0], "calls": getattr(e, "calls", None), "real_calls": count[1], "load": load, "error": error}
        if twice and kind != "model_info":  # the same job again: its estimate now corrected by the first run
            e2 = estimate(spec, p, name if spec.uses_model else None, task)
            cold()
            real2, error2 = timed(name if spec.uses_model else None, spec, lm, task, p)
            row.update(estimate2_s=e2.seconds, real2_s=real2, correction=e2.correction, load_factor2=e2.load_factor,
                       ratio2=e2.seconds / real2 if e2.seconds is not None and real2 > 0 else None,
                       error=error or error2)
        rows.append(row)
        est = f"{e.seconds:8.2f}" if e.seconds is not None else "     n/a"
        print(f"{model:14s} {kind:16s} est {est} s  real {real:8.2f} s  ratio "
              f"{ratio if ratio is None else round(ratio, 2)!s:>5}  load {load:4.1f}  tokens {e.tokens:7.0f}/{count[0]:7.0f}"
              f"  calls {getattr(e, 'calls', float('nan')):6.0f}/{count[1]:6.0f}"
              + (f"  ERROR {error}" if error else ""), flush=True)
        if "ratio2" in row:
            print(f"{'':14s} {'  again':16s} est {row['estimate2_s']:8.2f} s  real {row['real2_s']:8.2f} s  ratio "
                  f"{row['ratio2'] if row['ratio2'] is None else round(row['ratio2'], 2)!s:>5}  correction "
                  f"x{row['correction']:.2f}", flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="default,smollm2-135m")
    ap.add_argument("--kinds", default="", help="comma-separated kinds (default: every kind)")
    ap.add_argument("--json", default="")
    ap.add_argument("--count", action="store_true", help="also count the tokens and forward calls each run makes "
                    "(a hook on every layer; slower)")
    ap.add_argument("--smoke", action="store_true", help="three small kinds on the embedded model")
    ap.add_argument("--twice", action="store_true", help="run each kind a second time, cold, its estimate corrected "
                    "by the first run (`service/calibration.py`): the estimate a user gets from the second run on")
    a = ap.parse_args()
    models = ["default"] if a.smoke else [m for m in a.models.split(",") if m]
    kinds = [k for k in a.kinds.split(",") if k] or None
    print(f"threads {os.environ['OMP_NUM_THREADS']}, cores {os.cpu_count()}, load "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    warm_up(a.smoke, kinds)
    rows = [r for m in models for r in run_model(m, kinds, a.smoke, a.count, a.twice)]
    ok = [r for r in rows if r["ratio"] is not None and r["error"] is None]
    inside = [r for r in ok if 0.67 <= r["ratio"] <= 1.5]
    if a.twice:
        ok2 = [r for r in rows if r.get("ratio2") is not None and r["error"] is None]
        print(f"the second runs (corrected estimates) within 0.67-1.5x: "
              f"{sum(0.67 <= r['ratio2'] <= 1.5 for r in ok2)} of {len(ok2)}", flush=True)
    print(f"within 0.67-1.5x: {len(inside)} of {len(ok)}; load at the end "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    if a.smoke:
        bad = [r for r in rows if r["error"]]
        print("smoke: ok" if not bad else f"smoke: FAILED {bad}")
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
