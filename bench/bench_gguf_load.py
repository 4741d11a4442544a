"""First load of a GGUF file (which converts it) against the second (which reads the converted folder).

    python bench/bench_gguf_load.py [--model smollm2-135m] [--repeat 2] [--threads 2]
    python bench/bench_gguf_load.py --smoke     # a tiny random GGUF (tests/tiny_gguf.py), one reload: seconds

Copies the preset's GGUF (or the .gguf given) into a fresh temporary HEADLENS_MODELS_DIR, then loads it with
`load_model(path)` in a new process `1 + repeat` times: the first converts it, the others read the folder. Each
process reports its wall time for `load_model` and its peak RSS; the ratio first / second is the figure (ratios
within one run; the machine's other load changes the seconds). Also the sizes on disk.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHILD = """
import json, resource, sys, time, torch
torch.set_num_threads(int(sys.argv[2]))
from backend.model.loading import load_model
t = time.perf_counter()
lm = load_model(sys.argv[1], device="cpu")
print(json.dumps({"seconds": round(time.perf_counter() - t, 2), "peak_rss_mb": round(resource.getrusage(
    resource.RUSAGE_SELF).ru_maxrss / 1024), "fingerprint": lm.fingerprint}))
"""


def size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else path.stat().st_size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m", help="a pulled preset or a .gguf file")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--smoke", action="store_true", help="a tiny random GGUF written here, one reload (seconds)")
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from backend.weights import presets

    if a.smoke:
        a.model, a.repeat, a.threads = "tiny", 1, 1
    with tempfile.TemporaryDirectory(prefix="headlens-bench-gguf-") as tmp:
        gguf = Path(tmp) / "file" / f"{a.model.replace('/', '_')}.gguf"
        gguf.parent.mkdir()
        if a.smoke:
            sys.path.insert(0, str(ROOT / "tests"))
            from tiny_gguf import write_tiny_gguf

            write_tiny_gguf(gguf)
        else:
            shutil.copy(presets.require_pulled(a.model) if a.model in presets.PRESETS else Path(a.model), gguf)
        env = dict(os.environ, HEADLENS_MODELS_DIR=str(Path(tmp) / "models"), PYTHONPATH=str(ROOT),
                   OMP_NUM_THREADS=str(a.threads))
        runs = []
        for _ in range(1 + a.repeat):
            out = subprocess.run([sys.executable, "-c", CHILD, str(gguf), str(a.threads)], env=env, cwd=ROOT,
                                 capture_output=True, text=True, check=True).stdout
            runs.append(json.loads(out.strip().splitlines()[-1]))
        first, later = runs[0]["seconds"], min(r["seconds"] for r in runs[1:])
        print(json.dumps({"model": a.model, "gguf_mb": round(size(gguf) / 1e6),
                          "converted_mb": round(size(Path(tmp) / "models" / "converted") / 1e6),
                          "first_load_s": first, "later_load_s": later, "ratio": round(first / later, 1),
                          "peak_rss_mb": [r["peak_rss_mb"] for r in runs],
                          "same_fingerprint": len({r["fingerprint"] for r in runs}) == 1, "threads": a.threads},
                         indent=1))


if __name__ == "__main__":
    main()
