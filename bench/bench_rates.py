"""What the intervals and paired tests on rates cost (issue 27, items 3 and 4): their seconds inside each kind.

    python bench/bench_rates.py [--model default] [--task syn-sentiment] [--prompts 50] [--json out.json]
    python bench/bench_rates.py --smoke        # 6 prompts, icl and ablate: does it still run (the CI test)

Each kind runs uncached with its statistics functions wrapped by a timer (the Wilson intervals and packed
outcomes of every `Metrics`, the random sets' two-level bootstrap, the paired tests, patching's standard errors);
the table gives the kind's wall time, the seconds inside those functions and their share. They read the outcomes
the kind computed anyway: no extra forward pass.
"""
from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backend.analysis.kernel import analyze  # noqa: E402
from backend.analysis.primitives import predict  # noqa: E402
from backend.analysis.tsla import ablation, activation_patching as patching, geometry, steering  # noqa: E402
from backend.model.loading import load_model  # noqa: E402
from backend.tasks.registry import load_task  # noqa: E402

SPENT = [0.0]
WRAPPED = {predict: ("rate_ci", "pack_outcomes"),
           ablation: ("set_curve_intervals", "curve_intervals", "paired_along", "paired_rates", "config_outcomes"),
           steering: ("curve_intervals",), geometry: ("bootstrap_ci",), patching: ("recovered_stderr", "stderr")}


def _timed(fn):
    @functools.wraps(fn)
    def run(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            SPENT[0] += time.perf_counter() - t
    return run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="default")
    ap.add_argument("--task", default="syn-sentiment")
    ap.add_argument("--prompts", type=int, default=50)
    ap.add_argument("--shots", type=int, default=8)
    ap.add_argument("--kinds", default="icl,ablation_curves,ablate,steer,geometry,patching")
    ap.add_argument("--json")
    ap.add_argument("--smoke", action="store_true", help="6 prompts, icl and ablate only (the CI test)")
    a = ap.parse_args()
    if a.smoke:
        a.prompts, a.shots, a.kinds = 6, 2, "icl,ablate"
    for mod, names in WRAPPED.items():
        for n in names:
            setattr(mod, n, _timed(getattr(mod, n)))
    lm, task = load_model(a.model), load_task(a.task)
    L, H = lm.n_layers, lm.n_heads
    common = dict(shots=a.shots, prompts=a.prompts)
    runs = {"icl": dict(shots=[0, 1, 2, 4, 8], prompts=a.prompts),
            "ablation_curves": dict(common, ks=[k for k in (0, 1, 2, 4, 8, 16, 32, 64) if k <= L * H]),
            "ablate": dict(common, heads=[(l, h) for l in range(L) for h in range(H)][: max(1, L * H // 4)]),
            "steer": dict(common, layer="all"), "geometry": dict(common), "patching": dict(common)}
    analyze("scores", lm, task, **common)  # the head maps the curves and patching read: cached, not timed
    rows = []
    for kind in a.kinds.split(","):
        SPENT[0] = 0.0
        t = time.perf_counter()
        analyze(kind, lm, task, cache=False, **runs[kind])
        wall = time.perf_counter() - t
        rows.append({"kind": kind, "seconds": round(wall, 2), "statistics_s": round(SPENT[0], 4),
                     "share": round(SPENT[0] / wall, 4)})
        print(f"{kind:16s} {wall:8.2f} s   statistics {SPENT[0]:7.3f} s   {100 * SPENT[0] / wall:5.2f}%", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps({"model": a.model, "task": a.task, "prompts": a.prompts, "rows": rows},
                                           indent=1))


if __name__ == "__main__":
    main()
