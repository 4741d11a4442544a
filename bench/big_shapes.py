"""Models no CPU here was meant to hold, rehearsed (issue 35, part 2): a Llama-3.2-1B and a Qwen2.5-1.5B shape with
random weights, in bfloat16, end to end through the service.

    nice -n 10 python bench/big_shapes.py                        # both shapes, one after the other
    nice -n 10 python bench/big_shapes.py --shapes llama-1b --json /tmp/big.json
    python bench/big_shapes.py --smoke                           # two tiny shapes of the same families (CI)

Each shape is built once (`--build`, its own process) with the published config's sizes and random weights
(transformers' init, seed 0), saved in bfloat16 as a model folder under /tmp (never in the repository) with the GPT-2
tokenizer (../shared/gpt2-tokenizer, or the one in `--tokenizer`; its 50,257 ids lie inside both vocabularies).
Then, in a fresh process per shape (its peak RSS is its own), the service runs in-process
(`ui.client.HeadlensClient`, HEADLENS_BACKEND_URL=inprocess, HEADLENS_TIMINGS on, one fresh cache folder for all the
shapes: the second borrows the first one's rates, scaled by parameters, as a user's service would) and for
each job, all with precision bfloat16: the estimate (POST /jobs/estimate) before it runs, its real time (the job's
started -> finished), their ratio (goal 0.5-2x), and the process's peak RSS during it (sampled every 20 ms):

    load       model_info (the load: the folder's safetensors into memory)
    head map   head_maps, `--shots` shots, `--prompts` prompts
    toggle     ablate, two heads at the last token (over the prefix the Head map kept)
    toggle 2   ablate, two other heads (estimated from the first toggle's rate)
    curve      ablation_curves, orders tr + random, ks 0, 2, 4, one random seed, at the last token

and the admission's memory fit (`backend/service/memory_fit.py`: the parameters counted from config.json, x 2 bytes,
+25% and 512 MB) against the measured peak RSS and its growth over the process before the load. The load (`uptime`)
is printed before and after each shape: the machine is shared.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]
TOKENIZER = REPO.parent.parent / "shared" / "gpt2-tokenizer"  # /work/shared from a worktree /work/wt/<name>
if not TOKENIZER.is_dir():
    TOKENIZER = REPO.parent / "shared" / "gpt2-tokenizer"  # /work/shared from /work/main
ROOT = Path(os.environ.get("HEADLENS_BIG_SHAPES_DIR") or Path(tempfile.gettempdir()) / "headlens-big-shapes")

SHAPES = {  # the published configs' sizes; tied embeddings as both ship
    "llama-1b": ("llama", dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                               intermediate_size=8192, vocab_size=128256, tie_word_embeddings=True, head_dim=64,
                               max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0)),
    "qwen-1.5b": ("qwen2", dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                                intermediate_size=8960, vocab_size=151936, tie_word_embeddings=True,
                                max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0)),
    # --smoke: the same families, tiny (the GPT-2 tokenizer's ids must stay inside the vocabulary)
    "llama-tiny": ("llama", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                 intermediate_size=128, vocab_size=50304, tie_word_embeddings=True,
                                 max_position_embeddings=2048)),
    "qwen-tiny": ("qwen2", dict(hidden_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                intermediate_size=96, vocab_size=50304, tie_word_embeddings=True,
                                max_position_embeddings=2048)),
}
PRECISION = "bfloat16"


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


# -- building a shape ----------------------------------------------------------------------------------------------
def build(shape: str, folder: Path, tokenizer: Path) -> None:
    """The shape's model with random weights (seed 0), saved in bfloat16 with the tokenizer, at `folder`."""
    import torch
    import transformers as T

    family, sizes = SHAPES[shape]
    cfg_cls, model_cls = {"llama": (T.LlamaConfig, T.LlamaForCausalLM),
                          "qwen2": (T.Qwen2Config, T.Qwen2ForCausalLM)}[family]
    tok = T.AutoTokenizer.from_pretrained(str(tokenizer))
    if len(tok) > sizes["vocab_size"]:
        raise SystemExit(f"{shape}: the tokenizer's {len(tok)} ids do not fit its vocabulary of {sizes['vocab_size']}")
    cfg = cfg_cls(**sizes, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, dtype="bfloat16")
    torch.manual_seed(0)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # built in bf16: no float32 copy of a 1.5B model on the way
    try:
        model = model_cls(cfg).eval()
    finally:
        torch.set_default_dtype(old)
    tmp = folder.with_name(folder.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(str(tmp))
    tok.save_pretrained(str(tmp))
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)


def ensure_built(shape: str, tokenizer: Path, rebuild: bool) -> Path:
    folder = ROOT / shape
    stamp = folder / "big_shapes.json"
    want = {"shape": shape, "sizes": SHAPES[shape][1], "tokenizer": str(tokenizer)}
    if not rebuild and stamp.is_file() and json.loads(stamp.read_text()) == want:
        return folder
    t = time.perf_counter()
    subprocess.run([sys.executable, __file__, "--build", shape, "--tokenizer", str(tokenizer)], check=True)
    stamp.write_text(json.dumps(want))
    size = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    print(f"{shape}: built in {time.perf_counter() - t:.0f} s at {folder} ({size / 1e9:.2f} GB of safetensors)",
          flush=True)
    return folder


# -- running a shape through the service ---------------------------------------------------------------------------
class PeakRss:
    """The process's RSS sampled every `every` s: `peak` since the last `reset`."""

    def __init__(self, every: float = 0.02):
        import psutil

        self.proc, self.every, self.peak = psutil.Process(), every, 0
        self._stop = threading.Event()
        self.reset()
        threading.Thread(target=self._run, daemon=True).start()

    def now(self) -> int:
        return int(self.proc.memory_info().rss)

    def reset(self) -> None:
        self.peak = self.now()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.peak = max(self.peak, self.now())

    def close(self) -> None:
        self._stop.set()


def jobs(task: str, shots: int, prompts: int) -> list[tuple[str, str, dict]]:
    base = {"task": task, "shots": shots, "prompts": prompts, "seed": 0}
    return [
        ("load", "model_info", {}),
        ("head map", "head_maps", base),
        ("toggle", "ablate", {**base, "heads": [[0, 1], [1, 2]], "positions": "last"}),
        ("toggle 2", "ablate", {**base, "heads": [[0, 3], [1, 0]], "positions": "last"}),
        ("curve", "ablation_curves", {**base, "orders": ["tr", "random"], "ks": [0, 2, 4], "random_seeds": [0],
                                      "positions": "last"}),
    ]


def run_shape(shape: str, folder: Path, task: str, shots: int, prompts: int) -> dict:
    """One shape's jobs through the in-process service (this process: fresh cache, timings on)."""
    os.environ.setdefault("HEADLENS_CACHE_DIR", tempfile.mkdtemp(prefix=f"big-shapes-{shape}-"))
    os.environ["HEADLENS_TIMINGS"] = "on"
    os.environ["HEADLENS_BACKEND_URL"] = "inprocess"
    rss = PeakRss()
    from backend.service import memory_fit
    from ui.client import HeadlensClient

    cfg = json.loads((folder / "config.json").read_text())
    n = memory_fit.parameter_count(cfg)
    fit = memory_fit.needed_bytes(n, PRECISION)
    free, where = memory_fit.free_bytes()
    out = {"shape": shape, "folder": str(folder), "parameters": n, "fit_needed_bytes": fit, "free_bytes": free,
           "free_where": where, "uptime_before": uptime(), "rows": []}
    print(f"{shape}: {n / 1e9:.3f}B parameters (config); the admission's fit in {PRECISION}: "
          f"{memory_fit.gb(fit)} needed, {memory_fit.gb(free)} of {where} free | {out['uptime_before']}", flush=True)
    with HeadlensClient(timeout=600.0) as c:
        c.health()
        base_rss = rss.now()
        out["rss_before_load"] = base_rss
        for label, kind, params in jobs(task, shots, prompts):
            body = {"model": str(folder), "precision": PRECISION, **params}
            e = c.estimate(kind, **body)
            rss.reset()
            j = c.job(c.submit(kind, **body))
            while j["status"] in ("queued", "running"):
                time.sleep(0.05)
                j = c.job(j["id"])
            if j["status"] != "done":
                raise SystemExit(f"{shape} {label}: {j['status']}: {(j.get('error') or '')[:400]}")
            real = (j["finished"] - j["started"]) if j.get("started") else float("nan")
            est = e.get("seconds")
            row = {"job": label, "kind": kind, "estimate_s": est, "low": e.get("low"), "high": e.get("high"),
                   "basis": e.get("basis"), "real_s": round(real, 3),
                   "ratio": round(est / real, 2) if est and real > 0 else None,
                   "peak_rss": rss.peak, "load1": round(os.getloadavg()[0], 2)}
            out["rows"].append(row)
            print(f"{shape:10s} {label:9s} {kind:16s} est {est if est is None else round(est, 2)!s:>8} s  real "
                  f"{real:8.2f} s  ratio {row['ratio']!s:>5}  peak RSS {rss.peak / 1e9:5.2f} GB  load "
                  f"{row['load1']:.2f}  ({e.get('basis')})", flush=True)
    out["peak_rss"] = max(r["peak_rss"] for r in out["rows"])
    out["rss_growth"] = out["peak_rss"] - base_rss
    out["fit_over_growth"] = round(fit / max(1, out["rss_growth"]), 2)
    out["uptime_after"] = uptime()
    rss.close()
    print(f"{shape}: peak RSS {memory_fit.gb(out['peak_rss'])} ({memory_fit.gb(out['rss_growth'])} over the "
          f"{memory_fit.gb(base_rss)} before the load); the fit said {memory_fit.gb(fit)}: fit / growth "
          f"{out['fit_over_growth']} | {out['uptime_after']}", flush=True)
    return out


def main() -> int:
    global ROOT
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="llama-1b,qwen-1.5b")
    ap.add_argument("--task", default="antonym")
    ap.add_argument("--shots", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--tokenizer", default=str(TOKENIZER))
    ap.add_argument("--rebuild", action="store_true", help="build the folders again even if present")
    ap.add_argument("--json", default="")
    ap.add_argument("--smoke", action="store_true", help="the tiny shapes, 2 shots, 3 prompts")
    ap.add_argument("--build", default="", help=argparse.SUPPRESS)  # internal: build one shape, in its own process
    ap.add_argument("--run", default="", help=argparse.SUPPRESS)  # internal: run one shape, in its own process
    a = ap.parse_args()
    tokenizer = Path(a.tokenizer)
    if a.build:
        build(a.build, ROOT / a.build, tokenizer)
        return 0
    if a.run:
        print("RESULT " + json.dumps(run_shape(a.run, ROOT / a.run, a.task, a.shots, a.prompts)), flush=True)
        return 0
    if a.smoke:  # a folder of its own, under /tmp: concurrent smokes never share one
        a.shapes, a.prompts, a.task = "llama-tiny,qwen-tiny", 3, "syn-sentiment"
        os.environ["HEADLENS_BIG_SHAPES_DIR"] = tempfile.mkdtemp(prefix="headlens-big-shapes-smoke-")
        ROOT = Path(os.environ["HEADLENS_BIG_SHAPES_DIR"])
    if not tokenizer.is_dir():
        print(f"smoke: skipped (no tokenizer at {tokenizer})" if a.smoke else f"no tokenizer at {tokenizer}")
        return 0 if a.smoke else 1
    ROOT.mkdir(parents=True, exist_ok=True)
    # one service's cache folder and timings for all the shapes, as a user's: a shape nothing ran on borrows the
    # rate of the nearest-sized one that ran (scaled by parameters)
    os.environ["HEADLENS_CACHE_DIR"] = tempfile.mkdtemp(prefix="big-shapes-cache-")
    results = []
    for shape in a.shapes.split(","):
        folder = ensure_built(shape, tokenizer, a.rebuild)
        p = subprocess.run([sys.executable, __file__, "--run", shape, "--task", a.task, "--shots", str(a.shots),
                            "--prompts", str(a.prompts), "--tokenizer", str(tokenizer)],
                           stdout=subprocess.PIPE, text=True)
        lines = p.stdout.splitlines()
        print("\n".join(l for l in lines if not l.startswith("RESULT ")), flush=True)
        if p.returncode != 0:
            return p.returncode
        results.append(json.loads(next(l for l in lines if l.startswith("RESULT "))[7:]))
    ratios = [r["ratio"] for res in results for r in res["rows"] if r["ratio"] is not None]
    print(f"{sum(0.5 <= x <= 2 for x in ratios)} of {len(ratios)} estimates within 0.5-2x", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    shutil.rmtree(os.environ["HEADLENS_CACHE_DIR"], ignore_errors=True)
    if a.smoke:
        shutil.rmtree(ROOT, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
