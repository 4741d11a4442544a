"""Kind `ltv` with its mechanism, by stage: where a run's wall time goes (issue 25, item 6).

    HEADLENS_MODELS_DIR=models/pulled python bench/bench_ltv_stages.py --model smollm2-135m --task present-past \
        --layer 15 --shots 8
    python bench/bench_ltv_stages.py --set perturbations=256 --set key_heads=false   # any LtvLayersParams field
    python bench/bench_ltv_stages.py --smoke   # the embedded model, tiny sizes (the CI test)

One `ltv` in a fresh cache folder (nothing cached: the training, the extracted vectors and the head scores all
run), its progress messages timed: a stage is the part of the message before the first ':' ("LTV 1/1",
"extracted vectors", "k-shot prompts", "comparing", "mechanism at layer 15: head saliency", ...); its seconds run
from its first message to the next stage's, in wall time and in the process's CPU time (all its threads: on a
shared machine the steadier of the two). Prints the table, the totals and the load average at the start and end
(compare shares, not absolute seconds), and with --json writes them with the result.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ["HEADLENS_CACHE_DIR"] = tempfile.mkdtemp(prefix="bench-ltv-stages-")

from backend.analysis.kernel import analyze  # noqa: E402
from backend.model.loading import load_model  # noqa: E402
from backend.tasks.registry import load_task  # noqa: E402


def stage_of(message: str) -> str:
    """The stage a progress message belongs to: its text up to the second ':' for the mechanism's sub-stages, else
    up to the first."""
    parts = [s.strip() for s in message.split(":")]
    if parts[0].startswith("mechanism") and len(parts) > 1:
        return f"{parts[0]}: {parts[1].split(' (')[0]}"
    return parts[0]


def value(s: str) -> object:
    low = s.lower()
    if low in ("true", "false"):
        return low == "true"
    if low == "none":
        return None
    for cast in (int, float):
        try:
            return cast(s)
        except ValueError:
            pass
    return s


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="default")
    ap.add_argument("--task", default=None, help="default: the model's default task")
    ap.add_argument("--layer", type=int, default=None)
    ap.add_argument("--shots", type=int, default=8)
    ap.add_argument("--set", action="append", default=[], help="field=value of LtvLayersParams (repeatable)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--smoke", action="store_true", help="the embedded model, tiny sizes (the CI test)")
    a = ap.parse_args()
    if a.smoke:
        a.model, a.shots = "default", 2
        a.set += ["prompts=6", "epochs=1", "train_prompts=4", "val_prompts=2", "propagation=true",
                  "perturbations=8", "random_draws=1"]
    lm = load_model(a.model)
    task = load_task(a.task or ("present-past" if "smollm2" in a.model else "syn-sentiment"))
    params = {"shots": a.shots, **({"layer": a.layer} if a.layer is not None else {}),
              **{k: value(v) for k, v in (s.split("=", 1) for s in a.set)}}
    marks: list[tuple[float, float, str]] = []

    def progress(fraction: float, message: str = "") -> None:
        st = stage_of(message or "")
        if not marks or marks[-1][2] != st:
            marks.append((time.perf_counter(), time.process_time(), st))

    load0 = os.getloadavg()
    t0, c0 = time.perf_counter(), time.process_time()
    r = analyze("ltv", lm, task, params, progress=progress)
    total, cpu = time.perf_counter() - t0, time.process_time() - c0
    load1 = os.getloadavg()
    stages: dict[str, list[float]] = {}
    ends = [(m[0], m[1]) for m in marks[1:]] + [(t0 + total, c0 + cpu)]
    for (t, c, st), (te, ce) in zip(marks, ends):
        acc = stages.setdefault(st, [0.0, 0.0])
        acc[0] += te - t
        acc[1] += ce - c
    print(f"ltv {params} on {a.model}: {total:.1f} s wall, {cpu:.1f} CPU s; load average {load0[0]:.1f} -> "
          f"{load1[0]:.1f}")
    for st, (w, c) in stages.items():
        print(f"  {st:55s} {w:8.1f} s {100 * w / total:5.1f}%   {c:7.1f} CPU s {100 * c / max(cpu, 1e-9):5.1f}%")
    print("table:", {k: round(v["accuracy"], 4) for k, v in r.model_dump()["table"].items()})
    pl = r.per_layer[0]
    if pl.propagation is not None:
        print(f"rotation {pl.propagation.rotation:.4f} stretch {pl.propagation.stretch:.3f} r2 {pl.propagation.r2:.4f}")
    if a.json:
        Path(a.json).write_text(json.dumps({"params": params, "model": a.model, "seconds": total, "cpu_seconds": cpu,
                                            "load": [load0[0], load1[0]], "stages": stages,
                                            "result": r.model_dump(mode="json")}, default=str))


if __name__ == "__main__":
    main()
