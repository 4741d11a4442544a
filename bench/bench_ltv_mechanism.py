"""The `ltv` mechanism alone, by sub-stage, in CPU seconds (robust to a shared machine's load, unlike wall time).

    HEADLENS_MODELS_DIR=models/pulled python bench/bench_ltv_mechanism.py --model smollm2-135m --task present-past \
        --layer 15 [--perturbations 1024] [--set propagation=false]
    python bench/bench_ltv_mechanism.py --smoke   # the embedded model, tiny sizes (the CI test)

theta: a random vector of the residual stream's size at the layer's input (times --scale), no training and no
extracted vectors, so only the mechanism's own passes are timed (`ltv._mechanism` with the kind's defaults
otherwise; the head scores it overlaps with are computed first, untimed). Prints, per progress stage of the
mechanism, the process's CPU seconds and the wall seconds, the load average, and the result's numbers (to compare
two versions of the code on the same request).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ["HEADLENS_CACHE_DIR"] = tempfile.mkdtemp(prefix="bench-ltv-mech-")

import torch  # noqa: E402

from backend.analysis.ltv import ltv_layers as ltv_mod  # noqa: E402
from backend.analysis.ltv.learn import residual_rms  # noqa: E402
from backend.analysis.primitives.batching import build_prompts, encode  # noqa: E402
from backend.analysis.primitives.inject import Injection, evaluate_injections  # noqa: E402
from backend.analysis.primitives.threads import cpu_threads  # noqa: E402
from backend.model.loading import load_model  # noqa: E402
from backend.analysis.primitives.stages import run_sizes, shape_of  # noqa: E402
from backend.tasks.registry import load_task  # noqa: E402
from bench_ltv_stages import value  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="default")
    ap.add_argument("--task", default="syn-sentiment")
    ap.add_argument("--layer", type=int, default=None)
    ap.add_argument("--prompts", type=int, default=50)
    ap.add_argument("--scale", type=float, default=3.0, help="||theta|| in units of the residual stream's norm")
    ap.add_argument("--set", action="append", default=[], help="field=value of LtvLayersParams (repeatable)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--smoke", action="store_true", help="the embedded model, tiny sizes (the CI test)")
    a = ap.parse_args()
    if a.smoke:
        a.model, a.task, a.prompts = "default", "syn-sentiment", 6
        a.set += ["propagation=true", "perturbations=8", "random_draws=1"]
    lm = load_model(a.model)
    task = load_task(a.task)
    layer = lm.n_layers // 2 if a.layer is None else a.layer
    p = ltv_mod.LtvLayersParams(prompts=a.prompts, layer=layer, **{k: value(v) for k, v in (s.split("=", 1) for s in a.set)})
    built = build_prompts(lm, task, 0, p.prompts, p.seed)
    zero = encode(lm, task.build_prompts(0, built.n, p.seed), task.kind)
    rms = residual_rms(lm, zero, layer, (-1,))
    theta = torch.randn(lm.d_model, generator=torch.Generator().manual_seed(0))
    theta = theta / theta.norm() * rms * lm.d_model ** 0.5 * a.scale
    with cpu_threads(lm):
        base = evaluate_injections(lm, zero, [Injection(), Injection({layer: theta})], ltv_mod.EVAL_BATCH)
    conditions = {"zero_shot": base.summary(0), "ltv": base.summary(1)}
    scores = SimpleNamespace(**{nm: torch.rand(lm.n_layers, lm.n_heads, generator=torch.Generator().manual_seed(i))
                                .numpy() for i, nm in enumerate(("tr", "tl", "induction"))})
    marks: list[tuple[float, float, str]] = []

    def progress(fraction: float, message: str = "") -> None:
        if not marks or marks[-1][2] != message:
            marks.append((time.process_time(), time.perf_counter(), message))

    ctx = SimpleNamespace(lm=lm, warn=lambda w: print("warning:", w))
    load0 = os.getloadavg()[0]
    c0, w0 = time.process_time(), time.perf_counter()
    with cpu_threads(lm):
        out = ltv_mod._mechanism(ctx, p, zero, layer, theta, (-1,), conditions,
                                 float(base.gold_prob[1].mean()), scores, progress, shape_of(lm), run_sizes(lm, task))
    c1, w1 = time.process_time(), time.perf_counter()
    load1 = os.getloadavg()[0]
    stages: dict[str, list[float]] = {}
    ends = [(m[0], m[1]) for m in marks[1:]] + [(c1, w1)]
    for (c, w, msg), (ce, we) in zip(marks, ends):
        s = stages.setdefault(msg, [0.0, 0.0])
        s[0] += ce - c
        s[1] += we - w
    print(f"mechanism at layer {layer} of {a.model} ({len(zero.ids)} prompts, {p.perturbations or 'default'} "
          f"perturbations): {c1 - c0:.1f} CPU s, {w1 - w0:.1f} wall s; load average {load0:.1f} -> {load1:.1f}")
    for msg, (c, w) in stages.items():
        print(f"  {msg:40s} {c:8.1f} CPU s {100 * c / max(c1 - c0, 1e-9):5.1f}%   {w:8.1f} wall s")
    nums = {}
    if out.get("key_heads"):
        kh = out["key_heads"]
        nums["key_heads"] = {"heads": [list(h) for h in kh["heads"]], "ablated": kh["ablated"]["accuracy"],
                             "random": [r["accuracy"] for r in kh["random"]], "saliency_sum": float(kh["saliency"].sum())}
    if out.get("ov"):
        nums["ov"] = {"norm": out["ov"]["norm"], "cosine": out["ov"]["cosine"],
                      "final": out["ov"]["final"]["accuracy"]}
    if out.get("propagation"):
        pr = out["propagation"]
        nums["propagation"] = {k: pr[k] for k in ("rotation", "stretch", "r2", "n")}
    print(json.dumps(nums))
    if a.json:
        Path(a.json).write_text(json.dumps({"cpu": c1 - c0, "wall": w1 - w0, "load": [load0, load1],
                                            "stages": stages, "numbers": nums}))


if __name__ == "__main__":
    main()
