"""Speed on a real model (issue 17): ratios and wall times on a local model folder, CPU.

    python bench/bench_real.py --model /tmp/models/smol --task present-past            # every section
    python bench/bench_real.py --model M --only scores,toggle --json out.json

Sections (each in its own cache folder, results not cached between sections):
  scores   a plain forward pass over N k-shot prompts (batch 16, last-token logits) against the `scores` kind on the
           same prompts (cache off, cold: the maps' hooked pass keeping the prompts' prefixes, the zero-shot prompts,
           the model's induction pass), alternated, medians; also the hooked scoring pass alone (`score_heads`).
  toggle   the Ablation page's live toggle through the kernel after `scores` (its pass keeps the prompts' clean
           prefix): three different last-token head sets, one all-position set, and a last-token set with nothing
           kept (the cold case); N k-shot prompts.
  ltv      the `ltv` kind at L/2 with its mechanism (defaults), stage by stage, with the progress bar's fraction
           against the elapsed share of the wall time; the full-pass linear propagation timed on a few
           perturbations and extrapolated to the default count.
  site     the `site` kind (defaults), stage by stage.
  threads  1 against 2 torch threads: a forward pass of 64 tokens, an LTV training step, the measured choice
           (`threads.best_threads`).
  service  `python -m backend serve` (one torch thread, as `launch` starts it) on a fresh cache: the cold Head map
           (`scores` at the pages' defaults on the model's first task), toggles over HTTP, peak RSS (VmHWM).
Other work may share the CPU: the load average is printed before and after; compare ratios within one run.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402


def fresh_cache() -> str:
    d = tempfile.mkdtemp(prefix="bench-real-")
    os.environ["HEADLENS_CACHE_DIR"] = d
    return d


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def timed(fn, *a, **k) -> tuple[float, object]:
    t = time.perf_counter()
    out = fn(*a, **k)
    return time.perf_counter() - t, out


def section_scores(lm, task, a) -> dict:
    from backend.analysis.kernel import analyze
    from backend.analysis.primitives import induction
    from backend.analysis.primitives.batching import build_prompts, encode, forward_last_logits, map_batches
    from backend.analysis.tsla.scoring_pass import score_heads
    from backend.analysis.primitives.prefix_store import STORE

    def scores_kind():  # cold: no induction scores of this model yet, nothing kept
        induction._MEMO.clear()
        STORE.clear()
        analyze("scores", lm, task, cache=False, shots=a.shots, prompts=a.prompts)

    enc = encode(lm, build_prompts(lm, task, a.shots, a.prompts, 0).prompts, task.kind)
    runs = {"plain": lambda: map_batches(lm, enc.ids, 16, lambda b: forward_last_logits(lm, b)),
            "scoring_pass": lambda: score_heads(lm, enc, 16),
            "scores_kind": scores_kind}
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(a.reps):
        for name, fn in runs.items():
            times[name].append(timed(fn)[0])
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"prompts": len(enc.ids), "tokens": sum(map(len, enc.ids)), "seconds": med, "runs": times,
            "ratio_scoring_pass": med["scoring_pass"] / med["plain"], "ratio_scores_kind": med["scores_kind"] / med["plain"]}


def section_toggle(lm, task, a) -> dict:
    from backend.analysis.kernel import analyze
    from backend.analysis.primitives.prefix_store import STORE

    fresh_cache()
    STORE.clear()
    common = dict(shots=a.shots, prompts=a.prompts, seed=0)
    t_scores, _ = timed(analyze, "scores", lm, task, common)
    L, H = lm.n_layers, lm.n_heads
    sets = [[[L // 2, 0], [L // 2 + 1, 1], [L - 2, 2]], [[1, 0], [L // 3, 3]], [[L - 1, H - 1]]]
    out = {"scores_s": t_scores, "kept_mb": STORE.nbytes / 2 ** 20, "last": [], "all": None, "cold_last": None}
    for hs in sets:
        out["last"].append(timed(analyze, "ablate", lm, task, {**common, "heads": hs, "positions": "last"})[0])
    out["all"] = timed(analyze, "ablate", lm, task, {**common, "heads": sets[0], "positions": "all"})[0]
    out["all_early"] = timed(analyze, "ablate", lm, task, {**common, "heads": sets[1], "positions": "all"})[0]
    STORE.clear()
    out["cold_last"] = timed(analyze, "ablate", lm, task, {**common, "heads": [[L // 2, 4]], "positions": "last"})[0]
    return out


def section_ltv(lm, task, a) -> dict:
    from backend.analysis.kernel import analyze
    from backend.analysis.primitives.batching import encode
    from backend.analysis.primitives.inject import final_states

    fresh_cache()
    t0 = time.perf_counter()
    stages: list[tuple[float, float, str]] = []

    def progress(f: float, m: str = "") -> None:
        stages.append((time.perf_counter() - t0, f, m))

    r = analyze("ltv", lm, task, {"propagation": True}, progress=progress)  # every mechanism stage
    total = time.perf_counter() - t0
    marks, prev = [], None
    for t, f, m in stages:
        key = m.split(":")[0] + (":" + m.split(":")[1] if m.count(":") > 1 else "")
        if key[:40] != prev:
            marks.append({"t": round(t, 1), "fraction": round(f, 3), "stage": m[:80]})
        prev = key[:40]
    off = max(abs(f - t / total) for t, f, _ in stages)
    # the reference linear propagation (every perturbation a full pass), on a few perturbations
    zero = encode(lm, task.build_prompts(0, r.prompts, 0), task.kind)
    n, P, layer = 8, len(zero.ids), r.layer
    vec = torch.randn(n, lm.d_model)
    ref_s, _ = timed(final_states, lm, zero.ids, [i for _ in range(n) for i in range(P)],
                     {layer: vec.repeat_interleave(P, 0)}, (-1,), 64)
    n_default = r.per_layer[0].propagation.n
    return {"total_s": total, "stages": marks, "max_progress_off": off, "table": r.table,
            "propagation": {"rotation": r.rotation, "stretch": r.stretch, "n": n_default},
            "reference_propagation_s_per_perturbation": ref_s / n,
            "reference_propagation_s_extrapolated": ref_s / n * n_default}


def section_site(lm, task, a) -> dict:
    from backend.analysis.kernel import analyze

    fresh_cache()
    t0 = time.perf_counter()
    marks, prev = [], [None]

    def progress(f: float, m: str = "") -> None:
        key = m[:30]
        if key != prev[0]:
            marks.append({"t": round(time.perf_counter() - t0, 1), "fraction": round(f, 3), "stage": m[:80]})
            prev[0] = key

    r = analyze("site", lm, task, {}, progress=progress)
    return {"total_s": time.perf_counter() - t0, "train_s": r.train_seconds, "embed_s": r.embed_seconds,
            "stages": marks, "site": r.site.model_dump()}


def section_threads(lm, task, a) -> dict:
    from backend.analysis.primitives import threads
    from backend.analysis.primitives.inject import Injection, injected_logits
    from backend.analysis.primitives.batching import encode, make_batch

    ceiling = torch.get_num_threads()
    ids = torch.randint(0, lm.unembed.shape[0], (1, 64))
    zero = encode(lm, task.build_prompts(0, 8, 0), task.kind)
    batch = make_batch(lm, zero.ids, [0, 1, 2, 3])
    theta = torch.zeros(lm.d_model, requires_grad=True)

    def forward():
        with torch.inference_mode():
            lm.model(input_ids=ids, use_cache=False, logits_to_keep=1)

    def train_step():
        with torch.enable_grad():
            injected_logits(lm, batch, Injection({lm.n_layers // 2: theta}))[:, 0].sum().backward()

    out: dict = {"ceiling": ceiling}
    for name, fn in (("forward_64", forward), ("train_step_4x", train_step)):
        times: dict[int, list[float]] = {1: [], ceiling: []}
        for n in times:
            torch.set_num_threads(n)
            fn()
        for _ in range(a.reps + 1):
            for n in times:
                torch.set_num_threads(n)
                times[n].append(timed(fn)[0])
        torch.set_num_threads(ceiling)
        out[name] = {n: statistics.median(v) for n, v in times.items()}
    t, best = timed(threads.best_threads, lm, 0.0)
    out.update(best_threads=best, probe_s=t)
    return out


def section_service(a) -> dict:
    import socket

    import httpx

    cache = fresh_cache()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "HEADLENS_CACHE_DIR": cache, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    log = open(Path(cache) / "serve.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "backend", "serve", "--port", str(port), "--log-level", "warning"],
                            cwd=REPO, env=env, stdout=log, stderr=log)
    http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120)

    def rss() -> dict:
        fields = dict(line.split(":", 1) for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines()
                      if ":" in line)
        return {k: int(fields[k].split()[0]) / 1024 for k in ("VmRSS", "VmHWM")}

    def run(body: dict) -> tuple[float, dict]:
        t = time.perf_counter()
        j = http.post("/jobs", json=body).json()
        while j.get("status") in ("queued", "running"):
            time.sleep(0.05)
            j = http.get(f"/jobs/{j['id']}").json()
        if j.get("status") != "done":
            raise RuntimeError(f"{body['kind']}: {j}")
        return time.perf_counter() - t, j["result"]

    try:
        t0 = time.perf_counter()
        while True:
            try:
                if http.get("/health").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        out = {"startup_s": time.perf_counter() - t0, "rss_idle_mb": rss()}
        from backend.service.warm import demo_requests, first_task

        task = first_task(a.model, http.get("/capabilities").json().get("tasks", []))
        kind, params = demo_requests(a.model, task)[0]
        out["task"] = task
        out["model_info_s"], _ = run({"kind": "model_info", "model": a.model})
        out["rss_loaded_mb"] = rss()
        out["cold_head_map_s"], res = run({"kind": kind, **params})
        out["warm_head_map_s"], _ = run({"kind": kind, **params})
        L = int(res["n_layers"])
        base = {"kind": "ablate", "model": a.model, "task": task, "shots": params["shots"],
                "prompts": params["prompts"], "seed": params["seed"]}
        out["toggle_last_s"] = [run({**base, "heads": hs, "positions": "last"})[0]
                                for hs in ([[L // 2, 0]], [[L // 2, 0], [L - 2, 1]], [[2, 3]])]
        out["toggle_all_s"] = run({**base, "heads": [[L // 2, 0]], "positions": "all"})[0]
        out["rss_end_mb"] = rss()
        return out
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="/tmp/models/smol")
    ap.add_argument("--task", default="present-past")
    ap.add_argument("--shots", type=int, default=10)
    ap.add_argument("--prompts", type=int, default=50)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2, help="torch threads of this process (the ceiling)")
    ap.add_argument("--only", default="scores,toggle,threads,ltv,site,service")
    ap.add_argument("--json", default=None)
    ap.add_argument("--smoke", action="store_true", help="the embedded model, tiny sizes, scores and toggles only "
                                                          "(seconds; numbers meaningless)")
    a = ap.parse_args()
    if a.smoke:
        a.model, a.task, a.shots, a.prompts, a.reps, a.threads, a.only = "default", "syn-antonym", 2, 4, 1, 1, \
            "scores,toggle"
    torch.set_num_threads(a.threads)
    fresh_cache()
    from backend.model.loading import load_model
    from backend.tasks.registry import load_task

    res: dict = {"model": a.model, "task": a.task, "shots": a.shots, "prompts": a.prompts, "threads": a.threads,
                 "load_before": load()}
    lm, task = load_model(a.model), load_task(a.task)
    for name in a.only.split(","):
        t = time.perf_counter()
        res[name] = section_service(a) if name == "service" else globals()[f"section_{name}"](lm, task, a)
        res[name]["section_s"] = time.perf_counter() - t
        res[name]["load_after"] = load()
        print(json.dumps({name: res[name]}, default=str), flush=True)
    res["load_after"] = load()
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1, default=str))


if __name__ == "__main__":
    main()
