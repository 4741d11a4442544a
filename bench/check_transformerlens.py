"""An external check: headlens's TR / TL maps and zero-ablation against TransformerLens, on the same token ids.

    HEADLENS_MODELS_DIR=models/pulled python bench/check_transformerlens.py --model smollm2-135m
    python bench/check_transformerlens.py --venv /work/tlvenv ...   # an existing TransformerLens virtualenv
    python bench/check_transformerlens.py --smoke                   # seconds (skipped without the virtualenv)

TransformerLens lives in its own virtualenv (`--venv`, default `$HEADLENS_TL_VENV` or `.venv-tl/` in the repository;
never the project's). A full run creates it when it is missing (`python -m venv`, then `pip install torch==2.13.0
transformer_lens==4.3.* transformers`; `--no-install` refuses instead). The model is a pulled preset (or a model
folder), read offline by both sides.

headlens builds the prompts (task, shots, seed: by default a seed the benchmarks do not use) and their token ids
under each BOS convention (`prepend_bos` tokenizer and always), and computes, with its own code:
  - the TR / TL maps: the `maps` kind (the batched, left-padded scoring pass) and the same pass prompt by prompt;
  - zero-ablation of the top few TR heads at every position: the `ablate` kind's accuracy and, per prompt, the
    last position's logits under the head mask.
TransformerLens (`bench/external/tl_worker.py`, a subprocess in the other virtualenv) boots a TransformerBridge from
the same folder, runs the same ids, and computes TR / TL from its own hook_z, W_O and W_U (the formulas of the
README's "What it computes", with an explicit projector), and the ablation with a hook on hook_z. Reported: the
largest per-prompt and mean-map differences (relative to the map's largest |value|), top-k set agreement, and the
ablation's per-prompt agreement; also whether TransformerLens's own `to_tokens` gives headlens's `always` ids.
It is a benchmark, not a CI test: the result is recorded in bench/RESULTS.md.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
WORKER = REPO / "bench" / "external" / "tl_worker.py"
INSTALL = ["torch==2.13.0", "transformer_lens==4.3.*", "transformers"]
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"


# -- TransformerLens's virtualenv -----------------------------------------------------------------------------------
def venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def venv_problem(venv: Path) -> str | None:
    """Why the virtualenv cannot run the worker (None: it can)."""
    py = venv_python(venv)
    if not py.is_file():
        return f"no TransformerLens virtualenv at {venv} (--venv or HEADLENS_TL_VENV)"
    r = subprocess.run([str(py), "-c", "import torch, transformers, transformer_lens.model_bridge"],
                       capture_output=True, text=True, timeout=600)
    if r.returncode:
        return f"{venv} cannot import TransformerLens: {(r.stderr.strip().splitlines() or ['?'])[-1]}"
    return None


def create_venv(venv: Path) -> None:
    """A new virtualenv with TransformerLens (torch pinned as the project's, CPU wheels)."""
    print(f"creating {venv}: python -m venv, then pip install {' '.join(INSTALL)}", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv_python(venv)), "-m", "pip", "install", "--quiet"]
    subprocess.run(pip + [INSTALL[0], "--index-url", TORCH_CPU_INDEX], check=True)
    subprocess.run(pip + INSTALL, check=True)


# -- headlens's side --------------------------------------------------------------------------------------------------
def model_folder(lm) -> Path:
    """The folder headlens loaded the model from (a preset's converted folder): TransformerLens loads the same."""
    folder = Path(str(getattr(lm.model, "name_or_path", "") or ""))
    if not (folder / "config.json").is_file():
        raise SystemExit(f"{lm.name}: not loaded from a model folder ({folder}); give a preset or a folder")
    return folder


def top_set(m: np.ndarray, k: int) -> set[tuple[int, int]]:
    return {tuple(int(x) for x in np.unravel_index(i, m.shape)) for i in np.argsort(-m, axis=None, kind="stable")[:k]}


def headlens_side(lm, task, a, convention: str) -> dict:
    """Prompts, ids, maps (batched and per prompt) and ablation outcomes, all from headlens's own code."""
    import torch

    from backend.analysis.kernel import analyze
    from backend.analysis.primitives import bos
    from backend.analysis.primitives.batching import Encoded, build_prompts, encode, forward_last_logits, make_batch
    from backend.analysis.primitives.configs import head_mask
    from backend.analysis.tsla.scoring_pass import score_heads
    from backend.model.hooks import hooked

    common = dict(shots=a.shots, prompts=a.prompts, seed=a.seed, prepend_bos=convention)
    with bos.convention(convention):  # what the kinds below do inside the kernel
        built = build_prompts(lm, task, a.shots, a.prompts, a.seed)
        enc = encode(lm, built.prompts, task.kind)
    maps = analyze("maps", lm, task, cache=False, **common)
    per = [score_heads(lm, Encoded([p], [i], [li], [g], enc.kind), batch_size=1)
           for p, i, li, g in zip(enc.prompts, enc.ids, enc.label_ids, enc.gold)]
    heads = a.ablate or sorted(top_set(np.asarray(maps.tr), a.n_ablate))
    abl = analyze("ablate", lm, task, heads=[list(h) for h in heads], mode="zero", positions="all", cache=False,
                  **common)
    rows = []
    mask = head_mask(lm, heads)[None]  # (1, layers, heads): one row
    for r in range(len(enc.ids)):
        out = {}
        for name, m in (("clean", None), ("ablated", mask)):
            with torch.inference_mode(), hooked(lm, head_mask=m):
                last = forward_last_logits(lm, make_batch(lm, enc.ids, [r]))[0].double()
            lab = last[enc.label_ids[r]]
            out[name] = {"argmax": int(last.argmax()), "label_logits": lab.tolist(), "label_argmax": int(lab.argmax())}
        rows.append(out)
    return {"enc": enc, "maps": maps, "tr": np.stack([x.tr for x in per]), "tl": np.stack([x.tl for x in per]),
            "heads": [tuple(h) for h in heads], "ablate_kind": abl, "rows": rows}


def tl_side(venv: Path, folder: Path, hl: dict, threads: int) -> dict:
    enc = hl["enc"]
    job = {"model_dir": str(folder), "threads": threads, "ablate": [list(h) for h in hl["heads"]],
           "prompts": [{"text": p.text, "ids": list(i), "label_ids": list(li), "gold": int(g)}
                       for p, i, li, g in zip(enc.prompts, enc.ids, enc.label_ids, enc.gold)]}
    with tempfile.TemporaryDirectory(prefix="tl-check-") as tmp:
        src, dst = Path(tmp) / "in.json", Path(tmp) / "out.json"
        src.write_text(json.dumps(job))
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONNOUSERSITE="1")
        env.pop("PYTHONPATH", None)
        r = subprocess.run([str(venv_python(venv)), str(WORKER), str(src), str(dst)], capture_output=True, text=True,
                           env=env, cwd=tmp)
        if r.returncode:
            raise SystemExit(f"the TransformerLens worker failed:\n{r.stderr[-3000:]}")
        return json.loads(dst.read_text())


# -- the comparison -----------------------------------------------------------------------------------------------------
def compare(hl: dict, tl: dict, ks: list[int]) -> dict:
    rows = tl["prompts"]
    t_tr, t_tl = np.array([x["tr"] for x in rows]), np.array([x["tl"] for x in rows])
    out: dict = {"prompts": len(rows), "heads_ablated": [f"L{l}.H{h}" for l, h in hl["heads"]]}
    for name, h_per, t_per, h_mean in (("tr", hl["tr"], t_tr, np.asarray(hl["maps"].tr)),
                                       ("tl", hl["tl"], t_tl, np.asarray(hl["maps"].tl))):
        t_mean = t_per.mean(0)
        out[name] = {"per_prompt_max_abs": float(np.abs(h_per - t_per).max()),
                     "per_prompt_max_rel": float(np.abs(h_per - t_per).max() / np.abs(t_per).max()),
                     "mean_map_max_abs": float(np.abs(h_mean - t_mean).max()),
                     "mean_map_max_rel": float(np.abs(h_mean - t_mean).max() / np.abs(t_mean).max()),
                     "top": {k: [len(top_set(h_mean, k) & top_set(t_mean, k)), k] for k in ks}}
    for name in ("clean", "ablated"):
        h, t = [r[name] for r in hl["rows"]], [r[name] for r in rows]
        out[name] = {"argmax_agree": sum(x["argmax"] == y["argmax"] for x, y in zip(h, t)),
                     "label_argmax_agree": sum(x["label_argmax"] == y["label_argmax"] for x, y in zip(h, t)),
                     "label_logit_max_abs": float(max(np.abs(np.subtract(x["label_logits"], y["label_logits"])).max()
                                                      for x, y in zip(h, t)))}
    enc = hl["enc"]
    out["ablation_gold_logit_effect"] = float(np.mean([  # how far zeroing the heads moved the gold logit (headlens)
        abs(r["ablated"]["label_logits"][g] - r["clean"]["label_logits"][g]) for r, g in zip(hl["rows"], enc.gold)]))
    tl_acc = float(np.mean([r["ablated"]["argmax"] == enc.label_ids[i][enc.gold[i]] for i, r in enumerate(rows)]))
    out["ablate_kind_accuracy"] = float(hl["ablate_kind"].after.accuracy)
    out["ablate_kind_accuracy_before"] = float(hl["ablate_kind"].before.accuracy)
    out["tl_ablated_accuracy"] = tl_acc
    out["tl_clean_accuracy"] = float(np.mean([r["clean"]["argmax"] == enc.label_ids[i][enc.gold[i]]
                                              for i, r in enumerate(rows)]))
    out["to_tokens_equal"] = sum(r["to_tokens"] == list(i) for r, i in zip(rows, enc.ids))
    return out


def report(model: str, task: str, a, tl: dict, results: dict) -> str:
    v = tl["versions"]
    lines = [f"### headlens against TransformerLens {v['transformer_lens']} ({tl['bridge']}), {model}, {task}, "
             f"{a.shots} shots, {a.prompts} prompts, seed {a.seed}", "",
             f"torch {v['torch']}, transformers {v['transformers']} in TransformerLens's virtualenv; TransformerLens's "
             f"default_prepend_bos = {tl['default_prepend_bos']}.", "",
             "| prepend_bos | TR per prompt: max abs diff / max | TR mean map | TL per prompt: max abs diff | "
             "TL mean map | " + " | ".join(f"top-{k} TR / TL shared" for k in a.ks) + " |",
             "|---|---|---|---|---|" + "---|" * len(a.ks)]
    for c, r in results.items():
        lines.append(f"| {c} | {r['tr']['per_prompt_max_abs']:.2e} / {r['tr']['per_prompt_max_rel']:.1e} | "
                     f"{r['tr']['mean_map_max_rel']:.1e} rel | {r['tl']['per_prompt_max_abs']:.1e} | "
                     f"{r['tl']['mean_map_max_abs']:.1e} | "
                     + " | ".join(f"{r['tr']['top'][k][0]}/{k} / {r['tl']['top'][k][0]}/{k}" for k in a.ks) + " |")
    lines += ["", "| prepend_bos | heads zeroed (all positions) | argmax agrees, clean / ablated | label argmax agrees | "
              "label logits max abs diff, clean / ablated | ablation's mean abs shift of the gold logit | accuracy clean, "
              "ablated: `ablate` kind / TransformerLens | to_tokens = headlens ids |", "|---|---|---|---|---|---|---|---|"]
    for c, r in results.items():
        n = r["prompts"]
        lines.append(f"| {c} | {', '.join(r['heads_ablated'])} | {r['clean']['argmax_agree']}/{n} / "
                     f"{r['ablated']['argmax_agree']}/{n} | {r['clean']['label_argmax_agree']}/{n} / "
                     f"{r['ablated']['label_argmax_agree']}/{n} | {r['clean']['label_logit_max_abs']:.1e} / "
                     f"{r['ablated']['label_logit_max_abs']:.1e} | {r['ablation_gold_logit_effect']:.3f} | "
                     f"{r['ablate_kind_accuracy_before']:.3f}, "
                     f"{r['ablate_kind_accuracy']:.3f} / {r['tl_clean_accuracy']:.3f}, {r['tl_ablated_accuracy']:.3f} | "
                     f"{r['to_tokens_equal']}/{n} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m", help="a pulled preset or a model folder")
    ap.add_argument("--task", default=None, help="default: the model's dashboard default")
    ap.add_argument("--shots", type=int, default=None, help="default: the model's dashboard default")
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--seed", type=int, default=7, help="a seed the benchmarks do not use: prompts never scored")
    ap.add_argument("--ks", default="9,27")
    ap.add_argument("--n-ablate", type=int, default=3, help="zero-ablate the top this many TR heads")
    ap.add_argument("--ablate", default=None, help="heads to zero-ablate instead, layer.head comma-separated")
    ap.add_argument("--conventions", default="tokenizer,always")
    ap.add_argument("--venv", default=os.environ.get("HEADLENS_TL_VENV") or str(REPO / ".venv-tl"))
    ap.add_argument("--no-install", action="store_true", help="refuse instead of creating a missing virtualenv")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None)
    ap.add_argument("--smoke", action="store_true", help="the embedded model, 2 prompts (skipped without the venv)")
    a = ap.parse_args()
    venv = Path(a.venv).expanduser()
    if a.smoke:
        why = venv_problem(venv)
        if why:
            print(f"smoke: skipped ({why})")
            return
        a.model, a.task, a.shots, a.prompts, a.ks, a.n_ablate = "default", "syn-sentiment", 1, 2, "2", 1
        a.conventions = "tokenizer"
    elif (why := venv_problem(venv)) is not None:
        if a.no_install or venv_python(venv).is_file():
            raise SystemExit(why)
        create_venv(venv)
        if (why := venv_problem(venv)) is not None:
            raise SystemExit(why)
    import torch

    torch.set_num_threads(a.threads)
    from backend import load_model, load_task
    from ui.model_defaults import defaults_for

    d = defaults_for(a.model)
    a.task, a.shots = a.task or d.get("task", "syn-sentiment"), a.shots if a.shots is not None else d.get("shots", 8)
    a.ks = [int(k) for k in str(a.ks).split(",") if k]
    a.ablate = [tuple(int(x) for x in h.split(".")) for h in a.ablate.split(",")] if a.ablate else None
    lm, task = load_model(a.model), load_task(a.task)
    folder = model_folder(lm)
    results, tl_out = {}, None
    t0 = time.time()
    for c in a.conventions.split(","):
        hl = headlens_side(lm, task, a, c)
        tl_out = tl_side(venv, folder, hl, a.threads)
        results[c] = compare(hl, tl_out, a.ks)
    text = report(a.model, a.task, a, tl_out, results)
    print(text)
    print(f"\n({time.time() - t0:.0f} s)")
    if a.json:
        Path(a.json).write_text(json.dumps({"results": results, "versions": tl_out["versions"]}, indent=1))


if __name__ == "__main__":
    main()
