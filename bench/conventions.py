"""What the references' conventions change (issue 27, item 6): the README's "Conventions" numbers.

    HEADLENS_MODELS_DIR=models/pulled python bench/conventions.py --model smollm2-135m
    python bench/conventions.py --smoke          # seconds, on the embedded model (numbers meaningless)

- BOS (`prepend_bos`): the `scores` of one task with the tokenizer's own convention and with a BOS token first in
  every prompt (TransformerLens's): the top-k TR and TL sets under each (overlap, Jaccard, the heads that change),
  the largest |delta TR| and |delta TL| relative to the map's largest |value|, and the accuracies.
- SITE's kept alpha (`keep_alpha`): one SITE recipe trained twice, keeping the best validation's alphas and the last
  validation's (the reference's behaviour): the step kept, the test accuracy (soft and rounded alphas), and how far
  the alphas differ.

Defaults: the model's dashboard defaults (`ui.model_defaults`: present-past, 8 shots on SmolLM2), 50 prompts,
seed 0; SITE at the recipe's defaults except what the flags set. Results go through the cache (a rerun is cheap).
Prints a Markdown report (and `--json` writes the numbers).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def top_set(m: np.ndarray, k: int) -> list[tuple[int, int]]:
    """The k heads of largest value, (layer, head), largest first."""
    flat = np.argsort(-m, axis=None, kind="stable")[:k]
    return [tuple(int(x) for x in np.unravel_index(i, m.shape)) for i in flat]  # type: ignore[misc]


def compare_maps(a: np.ndarray, b: np.ndarray, ks: list[int]) -> dict:
    """Top-k agreement and the largest change of map b against map a (relative to a's largest |value|)."""
    from scipy.stats import spearmanr

    out = {"max_abs_delta_rel": float(np.abs(b - a).max() / np.abs(a).max()),
           "spearman": float(spearmanr(a.ravel(), b.ravel()).statistic), "top": {}}
    for k in ks:
        sa, sb = set(top_set(a, k)), set(top_set(b, k))
        out["top"][k] = {"shared": len(sa & sb), "jaccard": len(sa & sb) / len(sa | sb),
                         "left": sorted(sa - sb), "entered": sorted(sb - sa)}
    return out


def heads(hs: list) -> str:
    return ", ".join(f"L{l}.H{h}" for l, h in hs) or "none"


def bos_section(lm, task, a) -> tuple[dict, list[str]]:
    from backend.analysis.kernel import analyze

    common = dict(shots=a.shots, prompts=a.prompts, seed=a.seed, batch_size=a.batch_size)
    t0 = time.time()
    r = {c: analyze("scores", lm, task, prepend_bos=c, **common) for c in ("tokenizer", "always")}
    seconds = time.time() - t0
    tok = lm.tokenizer
    first = [tok(p.text)["input_ids"][0] for p in task.build_prompts(a.shots, 3, a.seed)]
    data = {"bos_token": tok.bos_token, "bos_id": tok.bos_token_id,
            "tokenizer_adds_bos": bool(first and all(i == tok.bos_token_id for i in first)),
            "seconds": seconds, "cache_hit": {c: x.cache_hit for c, x in r.items()},
            "prompts": r["tokenizer"].prompts if hasattr(r["tokenizer"], "prompts") else a.prompts,
            "accuracy": {c: x.icl.accuracy for c, x in r.items()},
            "tr_ratio": {c: x.icl.tr_ratio for c, x in r.items()}}
    for m in ("tr", "tl"):
        data[m] = compare_maps(getattr(r["tokenizer"], m), getattr(r["always"], m), a.ks)
    lines = [f"### BOS: `prepend_bos` tokenizer vs always ({task.name}, {a.shots} shots, {a.prompts} prompts, "
             f"seed {a.seed})", "",
             f"The tokenizer's BOS token is {data['bos_token']!r} (id {data['bos_id']}); its own encoding "
             f"{'starts' if data['tokenizer_adds_bos'] else 'does not start'} prompts with it.", "",
             "| map | max abs delta / map's max abs | Spearman (all heads) | "
             + " | ".join(f"top-{k} shared (Jaccard)" for k in a.ks) + " |",
             "|---|---|---|" + "---|" * len(a.ks)]
    for m in ("tr", "tl"):
        d = data[m]
        lines.append(f"| {m.upper()} | {d['max_abs_delta_rel']:.1%} | {d['spearman']:.3f} | "
                     + " | ".join(f"{d['top'][k]['shared']}/{k} ({d['top'][k]['jaccard']:.2f})" for k in a.ks) + " |")
    lines.append("")
    for m in ("tr", "tl"):
        for k in a.ks:
            t = data[m]["top"][k]
            if t["left"]:
                lines.append(f"- top-{k} {m.upper()}: with BOS {heads(t['entered'])} enter(s), {heads(t['left'])} "
                             f"leave(s).")
    acc, trr = data["accuracy"], data["tr_ratio"]
    lines += [f"- {a.shots}-shot accuracy {acc['tokenizer']:.3f} (tokenizer) / {acc['always']:.3f} (always); TR ratio "
              f"{trr['tokenizer']:.3f} / {trr['always']:.3f}.",
              f"- {seconds:.0f} s for both ({'cached' if all(data['cache_hit'].values()) else 'computed'})."]
    return data, lines


def site_section(lm, task, a) -> tuple[dict, list[str]]:
    from backend.analysis.kernel import analyze

    recipe = dict(m=a.site_m, steps=a.site_steps, val_every=a.site_val_every, prompts=a.site_prompts, seed=a.seed,
                  compare=[], patching=[], budget=[], correlations=[])
    t0 = time.time()
    r = {c: analyze("site", lm, task, keep_alpha=c, **recipe) for c in ("best", "last")}
    seconds = time.time() - t0
    al = {c: np.asarray(x.alpha) for c, x in r.items()}
    k = max(1, round(0.1 * al["best"].size))
    shared = len(set(top_set(al["best"], k)) & set(top_set(al["last"], k)))
    data = {"recipe": {kk: v for kk, v in recipe.items() if kk not in ("compare", "patching", "budget", "correlations")},
            "seconds": seconds, "val": [v.model_dump() for v in r["best"].val],
            "kept_step": {c: x.best_step for c, x in r.items()},
            "accuracy": {c: x.site.accuracy for c, x in r.items()},
            "accuracy_hard": {c: x.site_hard.accuracy for c, x in r.items()},
            "n_test": r["best"].prompts, "alpha_max_abs_diff": float(np.abs(al["best"] - al["last"]).max()),
            "alpha_mean_abs_diff": float(np.abs(al["best"] - al["last"]).mean()),
            "top10pct_alpha_shared": [shared, k]}
    vals = ", ".join(f"{v['step']}: {v['loss']:.3f}" for v in data["val"])
    lines = [f"### SITE: `keep_alpha` best vs last ({task.name}, M={a.site_m}, {a.site_steps} steps, validation every "
             f"{a.site_val_every}, {data['n_test']} test prompts, seed {a.seed})", "",
             "| kept | step | accuracy (soft alpha) | accuracy (alpha > 0.5) |", "|---|---|---|---|"]
    for c in ("best", "last"):
        lines.append(f"| {c} | {data['kept_step'][c]} | {data['accuracy'][c]:.3f} | {data['accuracy_hard'][c]:.3f} |")
    lines += ["", f"- validation loss by step: {vals}.",
              f"- alphas: max |best - last| {data['alpha_max_abs_diff']:.3f}, mean {data['alpha_mean_abs_diff']:.4f}; "
              f"top-10% heads by alpha shared {shared}/{k}.",
              f"- {seconds:.0f} s for both ({'cached' if all(x.cache_hit for x in r.values()) else 'computed'})."]
    return data, lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--task", default=None, help="default: the model's dashboard default")
    ap.add_argument("--shots", type=int, default=None, help="default: the model's dashboard default")
    ap.add_argument("--prompts", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ks", default="9,27", help="top-k set sizes compared")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--sections", default="bos,site")
    ap.add_argument("--site-m", type=int, default=50)
    ap.add_argument("--site-steps", type=int, default=400)
    ap.add_argument("--site-val-every", type=int, default=50)
    ap.add_argument("--site-prompts", type=int, default=50)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None)
    ap.add_argument("--smoke", action="store_true", help="seconds, on the embedded model")
    a = ap.parse_args()
    if a.smoke:
        os.environ["HEADLENS_CACHE_DIR"] = tempfile.mkdtemp(prefix="conventions-smoke-")
        a.model, a.task, a.shots, a.prompts, a.ks = "default", "syn-sentiment", 2, 4, "2"
        a.site_m, a.site_steps, a.site_val_every, a.site_prompts = 4, 4, 2, 4
    import torch

    torch.set_num_threads(a.threads)
    from backend import load_model, load_task
    from ui.model_defaults import defaults_for

    d = defaults_for(a.model)
    a.task, a.shots = a.task or d.get("task", "syn-sentiment"), a.shots if a.shots is not None else d.get("shots", 8)
    a.ks = [int(k) for k in str(a.ks).split(",") if k]
    lm, task = load_model(a.model), load_task(a.task)
    out, lines = {"model": a.model, "task": a.task}, [f"## Conventions on {a.model}", ""]
    for name, fn in (("bos", bos_section), ("site", site_section)):
        if name in a.sections.split(","):
            data, text = fn(lm, task, a)
            out[name] = data
            lines += text + [""]
    print("\n".join(lines))
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
