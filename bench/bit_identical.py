"""Fingerprints of every analysis kind's cached result, to show a refactor changes no number.

    python bench/bit_identical.py --out before.json            # at the old commit
    python bench/bit_identical.py --compare before.json         # at the new one: exit 1 on any difference

Each kind runs once, cold (the process's memos emptied), on the embedded default model with the small params of
`tests/kind_cases.py`, into an empty in-memory store, on one thread. Every entry the run writes to the store (the
kind's result and its sub-calls', under their cache keys) is fingerprinted: sha256 of its canonical JSON (floats in
their shortest exact repr), wall-clock fields (`*seconds`, `*elapsed`) left out. Equal fingerprints under equal keys
mean the cached results are bit-identical. One thread, because the product measures whether one or two threads run
faster, and the two sum floats in another order: a timing-chosen thread count differs between runs in the last bits.
`--smoke` runs three cheap kinds.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from kind_cases import CASES, MemoryStore  # noqa: E402


VOLATILE = ("seconds", "elapsed")
"""Keys whose values are wall-clock times (`train_seconds`, a stage's `seconds`): left out of the fingerprint."""


def scrub(value: object) -> object:
    """`value` without its wall-clock fields, at any depth."""
    if isinstance(value, dict):
        return {k: scrub(v) for k, v in value.items() if not any(str(k).endswith(t) for t in VOLATILE)}
    if isinstance(value, list):
        return [scrub(v) for v in value]
    return value


def fingerprints(kinds: list[str], dump: str | None = None) -> dict[str, dict[str, str]]:
    """{kind: {cache key: sha256 of the stored entry}}, each kind run cold into its own store."""
    import torch

    torch.set_num_threads(1)  # the product picks 1 or 2 threads by timing; float sums then differ in the last bits
    from backend import load_model
    from backend.analysis.kernel import analyze
    from backend.analysis.primitives import induction
    from backend.analysis.primitives.prefix_store import STORE
    from backend.tasks.registry import load_task
    from backend.store.tensor_store import TensorStore

    lm = load_model("default")
    out: dict[str, dict[str, str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for kind in kinds:
            name, params = CASES[kind]
            induction._MEMO.clear()
            STORE.clear()
            store = MemoryStore()
            analyze(kind, lm, load_task(name) if name else None, params, cache=store,
                    tensors=TensorStore(Path(tmp) / kind))
            out[kind] = {k: hashlib.sha256(json.dumps(scrub(v), sort_keys=True).encode()).hexdigest()
                         for k, v in sorted(store.items())}
            if dump:
                Path(dump).mkdir(parents=True, exist_ok=True)
                (Path(dump) / f"{kind}.json").write_text(json.dumps(scrub(dict(sorted(store.items()))), indent=1, sort_keys=True))
            print(f"{kind}: {len(store)} entries", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None, help="write the fingerprints here (JSON)")
    ap.add_argument("--compare", default=None, help="compare with fingerprints written before; exit 1 if any differ")
    ap.add_argument("--kinds", default=",".join(CASES))
    ap.add_argument("--dump", default=None, help="also write each kind's stored entries to this folder")
    ap.add_argument("--smoke", action="store_true", help="three cheap kinds")
    a = ap.parse_args()
    kinds = ["model_info", "scores", "fit"] if a.smoke else [k for k in a.kinds.split(",") if k]
    got = fingerprints(kinds, a.dump)
    if a.out:
        Path(a.out).write_text(json.dumps(got, indent=1, sort_keys=True))
    if a.compare:
        before = json.loads(Path(a.compare).read_text())
        bad = [k for k in kinds if k in before and before[k] != got[k]]
        for k in kinds:
            print(f"{k:16s} {'identical' if k not in bad else 'DIFFERS'} ({len(got[k])} entries)"
                  if k in before else f"{k:16s} not in {a.compare}")
        sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
