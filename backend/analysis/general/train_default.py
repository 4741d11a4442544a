"""Train the embedded default model on the synthetic task language and write it in HF format.

    python -m backend train-default [--out models/headlens-tiny] [--config default|tiny] [--steps N] [--seed S]

A `LlamaForCausalLM` with grouped-query attention learns the tasks of `backend.tasks.synthetic` from
in-context episodes `x y ; x y ; ...` (loss on label tokens only) plus a list-repetition task (loss on
the copied words) that grows induction heads. Seeded; a GPU is used when present. At the end the folder
holds the weights (fp32 safetensors), a word-level tokenizer, `metrics.json` and a model card.

Only what is specific to training lives here (tokenizer, batches, loss, schedule, the loop); evaluation goes
through the analysis stack (`wrap` + `encode` + `evaluate`, `induction_scores`, `top_heads`), so the model card
reports the same numbers the dashboard shows. The card text is `backend.analysis.general.model_card`.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ...store.atomic_dirs import WriteError, check_file_target, staging, write_file, write_reason
from .model_card import model_card
from ...model.loading import LoadedModel, wrap
from ...store.paths import DEFAULT_MODEL_DIR
from ...tasks.base import Prompt
from ...tasks.synthetic import (CLASS_TASKS, GEN_TASKS, RMAP_BASES, build_world, group_of, icl_episode,
                               repetition_sequence, synthetic_tasks)
from ..primitives.batching import encode
from ..primitives.induction import induction_scores
from ..primitives.predict import evaluate
from ..primitives.selection import top_heads

if TYPE_CHECKING:
    from transformers import LlamaConfig, PreTrainedModel, PreTrainedTokenizerBase, PreTrainedTokenizerFast

DEFAULT_OUT = DEFAULT_MODEL_DIR
SPECIALS = ("<pad>", "<s>", "</s>", "<unk>")
PAD, BOS, EOS, UNK = range(4)
GROUPS = ("classification", "generation", "random-mapping")
EVAL_SHOTS = (0, 1, 2, 4, 8)


@dataclass(frozen=True)
class TrainConfig:
    """Model shape and training schedule.

    ICL rows hold `icl_demos` demonstrations: BOS + 3 tokens per pair (`x y ;`), shape (batch_icl, 3*icl_demos+1).
    Repetition rows grow through `rep_lengths` (short rows grow induction heads fast), ending at `seq_len`,
    the trained length, which becomes `max_position_embeddings`.
    """

    hidden: int = 128
    layers: int = 4
    heads: int = 8
    kv_heads: int = 2
    head_dim: int = 32
    intermediate: int = 384
    seq_len: int = 64
    icl_demos: int = 21
    batch_icl: int = 48
    rep_lengths: tuple[int, ...] = (24, 40, 64)  # curriculum of repetition-row lengths (last = seq_len)
    rep_tokens: int = 1024  # repetition tokens per step: rows = rep_tokens // current length
    rep_curriculum: float = 0.5  # share of training over which the lengths step up
    steps: int = 3000
    lr: float = 3e-3
    warmup: int = 300
    weight_decay: float = 0.01
    burst_start: float = 0.8
    burst_end: float = 0.3
    burst_fade: float = 0.5  # share of training over which burstiness fades
    group_weights: tuple[float, float, float] = (0.3, 0.3, 0.4)  # classification, generation, random mapping
    rep_no_bos: float = 0.25  # share of repetition rows without BOS (the induction test may omit it)
    rep_weight: float = 1.0
    eval_every: int = 250
    permute: float = 0.0  # share of classification episodes relabelled by a permutation of the task's own labels


CONFIGS: dict[str, TrainConfig] = {
    "default": TrainConfig(),
    "tiny": TrainConfig(hidden=32, layers=2, heads=4, kv_heads=2, head_dim=8, intermediate=64, seq_len=64,
                        icl_demos=12, batch_icl=16, rep_lengths=(16, 32, 64), rep_tokens=256, steps=300, lr=1e-2, warmup=30, eval_every=100),
}


# -- tokenizer ------------------------------------------------------------------------------------
def build_tokenizer(max_len: int) -> PreTrainedTokenizerFast:
    """A word-level fast tokenizer over the synthetic vocabulary: whitespace split, `<s>` prepended.

    ids: 0 <pad>, 1 <s>, 2 </s>, 3 <unk>, then `World.vocabulary()` in order.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate([*SPECIALS, *build_world().vocabulary()])}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tk.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                      special_tokens=[("<s>", BOS)])
    tk.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    return PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>", model_max_length=max_len)


def save_tokenizer(tok: PreTrainedTokenizerBase, out: Path) -> None:
    """Save; name the generic fast class (a model-family class would ignore the word-level tokenizer.json)."""
    tok.save_pretrained(str(out))
    p = out / "tokenizer_config.json"
    cfg = json.loads(p.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg.pop("backend", None)
    cfg["add_bos_token"] = True
    p.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def model_config(cfg: TrainConfig, vocab_size: int) -> LlamaConfig:
    """The LlamaConfig of a TrainConfig."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=vocab_size, hidden_size=cfg.hidden, intermediate_size=cfg.intermediate,
                       num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads,
                       num_key_value_heads=cfg.kv_heads, head_dim=cfg.head_dim,
                       max_position_embeddings=cfg.seq_len, rms_norm_eps=1e-5, tie_word_embeddings=False,
                       bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD, use_cache=True)


# -- batches --------------------------------------------------------------------------------------
def training_task_names() -> dict[str, list[str]]:
    """Task names per group, as sampled for training rows."""
    return {"classification": [f"syn-{t}" for t in CLASS_TASKS], "generation": [f"syn-{t}" for t in GEN_TASKS],
            "random-mapping": [f"syn-rmap-{b}" for b in RMAP_BASES]}


def burst_at(cfg: TrainConfig, step: int) -> float:
    """Probability that a random-mapping input repeats an earlier one: fades start -> end."""
    frac = min(1.0, step / max(1.0, cfg.burst_fade * cfg.steps))
    return cfg.burst_start + (cfg.burst_end - cfg.burst_start) * frac


def icl_batch(rng: random.Random, cfg: TrainConfig, vocab: dict[str, int], burst: float
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """ICL rows `<s> x y ; x y ; ... x y ;`: ids (B, T) and target mask (B, T), True where ids[t] is a label."""
    names = training_task_names()
    T = 3 * cfg.icl_demos + 1
    ids = torch.full((cfg.batch_icl, T), PAD, dtype=torch.long)
    tgt = torch.zeros((cfg.batch_icl, T), dtype=torch.bool)
    for b in range(cfg.batch_icl):
        group = rng.choices(GROUPS, weights=cfg.group_weights)[0]
        name = rng.choice(names[group])
        ep = icl_episode(rng, name, cfg.icl_demos, burst if group == "random-mapping" else 0.0,
                         cfg.permute if group == "classification" else 0.0)
        row = [BOS]
        for x, y in ep:
            row += [vocab[x], vocab[y], vocab[";"]]
        ids[b] = torch.tensor(row)
        tgt[b, 2::3] = True
    return ids, tgt


def rep_length_at(cfg: TrainConfig, step: int) -> int:
    """Length of the repetition rows at `step`: the curriculum steps through `rep_lengths`."""
    frac = step / max(1.0, cfg.rep_curriculum * cfg.steps)
    return cfg.rep_lengths[min(len(cfg.rep_lengths) - 1, int(frac * (len(cfg.rep_lengths) - 1)))]


def rep_batch(rng: random.Random, cfg: TrainConfig, vocab: dict[str, int], length: int | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """List-repetition rows: ids (B, T) and target mask (B, T) over the copied words.

    T = `length` (default seq_len), B = rep_tokens // T.
    """
    words = [w for w in vocab if w not in SPECIALS]
    T = length or cfg.seq_len
    B = max(1, cfg.rep_tokens // T)
    ids = torch.empty((B, T), dtype=torch.long)
    tgt = torch.zeros((B, T), dtype=torch.bool)
    for b in range(B):
        bos = rng.random() >= cfg.rep_no_bos
        seq, t = repetition_sequence(rng, words, T - int(bos))
        row = ([BOS] if bos else []) + [vocab[w] for w in seq]
        ids[b] = torch.tensor(row)
        tgt[b] = torch.tensor(([False] if bos else []) + t)
    return ids, tgt


def label_loss(logits: torch.Tensor, ids: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of predicting ids[:, t] from position t-1, over positions where target[:, t].

    logits: (B, T, V); ids, target: (B, T).
    """
    lg = logits[:, :-1][target[:, 1:]]
    return F.cross_entropy(lg.float(), ids[:, 1:][target[:, 1:]])


# -- evaluation (through the analysis stack) -------------------------------------------------------
def as_loaded(model: PreTrainedModel, tok: PreTrainedTokenizerBase) -> LoadedModel:
    """The model in training, seen as the analyses see a loaded model (not frozen, cheap fingerprint)."""
    return wrap(model, tok, "headlens-tiny (training)", frozen=False)


def evaluate_prompts(lm: LoadedModel, prompts: Sequence[Prompt], kind: str, batch_size: int = 256) -> dict[str, Any]:
    """{accuracy, label_accuracy, tr_ratio, n} of prompts (see `primitives.predict`)."""
    return evaluate(lm, encode(lm, prompts, kind), batch_size).metrics


def evaluate_language(lm: LoadedModel, shots: Sequence[int] = EVAL_SHOTS, n: int = 300, seed: int = 0,
                      tasks: Sequence[str] | None = None) -> dict[str, Any]:
    """Metrics per task and k, and their means per group.

    Returns {"tasks": {name: {k: {...}}}, "groups": {group: {metric: [per k]}}, "shots": [...], "prompts": n}.
    """
    per_task: dict[str, dict[int, dict[str, Any]]] = {}
    for task in synthetic_tasks():
        if tasks is not None and task.name not in tasks:
            continue
        per_task[task.name] = {k: evaluate_prompts(lm, task.build_prompts(k, min(n, task.n_queries(seed)), seed),
                                                   task.kind) for k in shots}
    groups: dict[str, dict[str, list[float]]] = {}
    for g in GROUPS:
        names = [t for t in per_task if group_of(t) == g]
        if names:
            groups[g] = {m: [float(np.mean([per_task[t][k][m] for t in names])) for k in shots]
                         for m in ("accuracy", "label_accuracy", "tr_ratio")}
    return {"tasks": per_task, "groups": groups, "shots": list(shots), "prompts": n}


def induction_summary(lm: LoadedModel) -> dict[str, Any]:
    """Prefix-matching scores with and without `<s>`, and the top heads of each."""
    ind = induction_scores(lm)
    top = lambda a: [(l, h, float(a[l, h])) for l, h in top_heads(a, k=5)]  # noqa: E731
    return {"n": min(50, (lm.max_positions - 1) // 2), "batch": 4, "scores": ind.round(4).tolist(), "top": top(ind),
            "heads_above_0.5": int((ind > 0.5).sum()), "no_bos_top": top(induction_scores(lm, bos=False))}


# -- training -------------------------------------------------------------------------------------
def pick_device(device: str | None = None) -> torch.device:
    """The device asked for, else the loader's default (`models.default_device`: CUDA when present, else CPU)."""
    from ...model.loading import default_device

    return torch.device(device or default_device())


def lr_factor(cfg: TrainConfig, step: int) -> float:
    """Linear warm-up, then cosine decay to 5% of the peak."""
    if step < cfg.warmup:
        return (step + 1) / cfg.warmup
    frac = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac)))


def quick_eval_set(tok: PreTrainedTokenizerBase, n: int = 40, shots: int = 8, seed: int = 12345) -> dict[str, list[tuple[Prompt, str]]]:
    """Fixed prompts for the progress bar: n per task at `shots` demonstrations, grouped."""
    out: dict[str, list[tuple[Prompt, str]]] = {g: [] for g in GROUPS}
    for t in synthetic_tasks():
        out[group_of(t.name)] += [(p, t.kind) for p in t.build_prompts(shots, n, seed)]
    return out


def quick_eval(lm: LoadedModel, sets: dict[str, list[tuple[Prompt, str]]]) -> dict[str, float]:
    """8-shot accuracy per group on the fixed progress-bar prompts."""
    was = lm.model.training
    lm.model.eval()
    res = {g: evaluate_prompts(lm, [p for p, _ in items], items[0][1])["accuracy"] for g, items in sets.items()}
    lm.model.train(was)
    return res


def train(cfg: TrainConfig, out: Path, seed: int = 0, device: str | None = None, progress: bool = True,
          final_eval_prompts: int = 300, command: str = "") -> dict[str, Any]:
    """Train, save weights + tokenizer + metrics + model card into `out`; return the metrics dict."""
    from tqdm import tqdm
    from transformers import LlamaForCausalLM

    dev = pick_device(device)
    if dev.type == "cpu":  # the weights depend on the thread count (a float sum's order does)
        torch.set_num_threads(max(1, os.cpu_count() or 1))
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    rng = random.Random(f"train-{seed}")
    tok = build_tokenizer(cfg.seq_len)
    vocab = tok.get_vocab()
    mcfg = model_config(cfg, len(tok))
    mcfg._attn_implementation = "sdpa"
    model = LlamaForCausalLM(mcfg).to(dev)
    model.train()
    lm = as_loaded(model, tok)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.98), weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(cfg, s))
    sets = quick_eval_set(tok)
    history: list[dict[str, float]] = []
    ema = None
    acc = {g: 0.0 for g in GROUPS}
    t0 = time.time()
    bar = tqdm(range(cfg.steps), disable=not progress, desc="train", mininterval=2.0, file=sys.stderr)
    for step in bar:
        ids, tgt = icl_batch(rng, cfg, vocab, burst_at(cfg, step))
        rids, rtgt = rep_batch(rng, cfg, vocab, rep_length_at(cfg, step))
        if ids.shape[1] == rids.shape[1]:  # one forward pass for both kinds of rows
            both = torch.cat([ids, rids]).to(dev)
            logits = model(input_ids=both).logits
            icl_loss = label_loss(logits[: len(ids)], both[: len(ids)], tgt.to(dev))
            rep_loss = label_loss(logits[len(ids):], both[len(ids):], rtgt.to(dev))
        else:
            icl_loss = label_loss(model(input_ids=ids.to(dev)).logits, ids.to(dev), tgt.to(dev))
            rep_loss = label_loss(model(input_ids=rids.to(dev)).logits, rids.to(dev), rtgt.to(dev))
        loss = icl_loss + cfg.rep_weight * rep_loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        cur = {"icl": icl_loss.item(), "rep": rep_loss.item()}
        ema = cur if ema is None else {k: 0.98 * ema[k] + 0.02 * v for k, v in cur.items()}
        if (step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps:
            acc = quick_eval(lm, sets)
            history.append({"step": step + 1, "loss": ema["icl"] + cfg.rep_weight * ema["rep"], "icl_loss": ema["icl"],
                            "rep_loss": ema["rep"], "seconds": round(time.time() - t0, 1), **acc})
            if not progress:
                print(json.dumps(history[-1]), file=sys.stderr, flush=True)
        bar.set_postfix(icl=f"{ema['icl']:.3f}", rep=f"{ema['rep']:.3f}", cls=f"{acc['classification']:.2f}", gen=f"{acc['generation']:.2f}",
                        rmap=f"{acc['random-mapping']:.2f}", refresh=False)
    seconds = time.time() - t0
    model.eval()
    metrics: dict[str, Any] = {"config": asdict(cfg), "seed": seed, "device": str(dev),
                               "train_seconds": round(seconds, 1), "params": sum(p.numel() for p in model.parameters()),
                               "history": history, "command": command}
    with staging(out, replace=True) as tmp:  # the folder appears whole (weights, tokenizer, card) or not at all
        model.save_pretrained(str(tmp))
        save_tokenizer(tok, tmp)
        metrics = write_card(lm, tmp, metrics, final_eval_prompts)
    return metrics


def write_card(lm: LoadedModel, out: Path, metrics: dict[str, Any], eval_prompts: int = 300) -> dict[str, Any]:
    """Evaluate (when eval_prompts > 0) and write metrics.json and the model card README.md into `out`."""
    if eval_prompts:
        metrics["eval"] = evaluate_language(lm, n=eval_prompts)
        metrics["induction"] = induction_summary(lm)
    write_file(out / "metrics.json", json.dumps(metrics, indent=1) + "\n")  # each whole or not at all
    write_file(out / "README.md", model_card(metrics))
    return metrics


def reevaluate(out: Path, eval_prompts: int = 300) -> dict[str, Any]:
    """Re-run the evaluation of a trained folder (after the evaluation changed) and rewrite its card; the
    training record in metrics.json is kept."""
    from ...model.loading import load_model

    metrics = json.loads((out / "metrics.json").read_text())
    metrics.pop("induction_no_bos_top", None)
    metrics["command"] = metrics.get("command", "").replace("-m backend.train_default", "-m backend train-default")
    return write_card(load_model(str(out), device="cpu"), out, metrics, eval_prompts)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m backend train-default", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (default: models/headlens-tiny)")
    ap.add_argument("--config", choices=sorted(CONFIGS), default="default")
    ap.add_argument("--steps", type=int, default=None, help="training steps (default: the config's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--permute", type=float, default=None,
                    help="share of classification episodes whose labels are permuted among the task's own labels "
                         "(default: the config's; a lever tried for the TSLA findings, off in the shipped model)")
    ap.add_argument("--device", default=None, help="cuda / cpu (default: cuda when present)")
    ap.add_argument("--eval-prompts", type=int, default=300, help="prompts per task and k in the final table (0: skip)")
    ap.add_argument("--no-progress", action="store_true", help="log JSON lines instead of a progress bar")
    ap.add_argument("--eval-only", action="store_true", help="re-evaluate the trained folder --out, rewrite its card")
    args = ap.parse_args(argv)
    problem = out_problem(args.out, args.eval_only)
    if problem:  # before any training
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if args.eval_only:
        try:
            summary(reevaluate(args.out, args.eval_prompts))
        except OSError as e:
            print(f"error: --out {args.out}: cannot write its card ({write_reason(e)}); the files are as they were",
                  file=sys.stderr)
            return 2
        return 0
    cfg = CONFIGS[args.config]
    if args.steps is not None:
        cfg = replace(cfg, steps=args.steps, warmup=min(cfg.warmup, max(1, args.steps // 10)))
    if args.permute is not None:
        if not 0.0 <= args.permute <= 1.0:
            ap.error(f"--permute is a share in [0, 1], got {args.permute}")
        cfg = replace(cfg, permute=args.permute)
    cmd = "python -m backend train-default " + " ".join(sys.argv[1:] if argv is None else argv)
    try:
        m = train(cfg, args.out, args.seed, args.device, not args.no_progress, args.eval_prompts, cmd.strip())
    except OSError as e:  # a full disk at the end: the folder is not written (staging), the older one kept
        print(f"error: --out {args.out}: cannot write the model ({write_reason(e)}); nothing was written",
              file=sys.stderr)
        return 2
    summary(m)
    print(f"trained in {m['train_seconds']:.0f} s -> {args.out}")
    return 0


def out_problem(out: Path, eval_only: bool = False) -> str | None:
    """Why the model folder `out` cannot be written, in one sentence naming its folder as given (None: it can):
    checked before training. `eval_only`: `out` is the trained folder whose card is rewritten."""
    if eval_only:
        if not (out / "metrics.json").is_file():
            return f"--out {out}: no trained model folder (it holds no metrics.json)"
        folder, probe = out, out / "metrics.json"
    else:
        if out.exists() and not out.is_dir():
            return f"--out {out}: is a file; give a folder"
        folder, probe = out.parent, out.parent / f"{out.name}.new"
    try:
        check_file_target(probe)
    except WriteError as e:
        return f"--out {out}: cannot write in the folder {folder} ({e.reason})"
    return None


def summary(m: dict[str, Any]) -> None:
    """Print the per-group metrics and the top induction heads."""
    if "eval" in m:
        fmt = lambda xs: " | ".join(f"{x:.2f}" for x in xs)  # noqa: E731
        for g, d in m["eval"]["groups"].items():
            print(f"{g:15s} acc {fmt(d['accuracy'])}   label acc {fmt(d['label_accuracy'])}   TR {fmt(d['tr_ratio'])}")
        print("induction top:", m["induction"]["top"])


if __name__ == "__main__":
    raise SystemExit(main())
