"""Train the embedded default model on the synthetic task language and write it in HF format.

    python -m backend.train_default [--out models/headlens-tiny] [--config default|tiny] [--steps N] [--seed S]

A `LlamaForCausalLM` with grouped-query attention learns the tasks of `backend.tasks.synthetic` from
in-context episodes `x y ; x y ; ...` (loss on label tokens only) plus a list-repetition task (loss on
the copied words) that grows induction heads. Seeded; a GPU is used when present. At the end the folder
holds the weights (fp32 safetensors), a word-level tokenizer, `metrics.json` and a model card.

Pure parts (tokenizer, batches, loss, evaluation, induction scores, card text) are plain functions;
`train` and `main` do the I/O.
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

from .tasks.base import Prompt
from .tasks.synthetic import (CLASS_TASKS, GEN_TASKS, RMAP_BASES, build_world, group_of, icl_episode,
                              repetition_sequence, synthetic_tasks)

if TYPE_CHECKING:
    from transformers import LlamaConfig, PreTrainedModel, PreTrainedTokenizerBase, PreTrainedTokenizerFast

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO_ROOT / "models" / "headlens-tiny"
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
        ep = icl_episode(rng, name, cfg.icl_demos, burst if group == "random-mapping" else 0.0)
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


# -- evaluation -----------------------------------------------------------------------------------
def _first_tokens(tok: PreTrainedTokenizerBase, text: str, answers: Sequence[str], memo: dict) -> list[int]:
    """First token of each answer as it continues `text` (tokens of text+answer after those of text)."""
    out = []
    tail = text.rsplit(" ", 1)[-1]
    for a in answers:
        key = (tail, a)
        if key not in memo:
            x = tok(tail, add_special_tokens=False)["input_ids"]
            y = tok(tail + a, add_special_tokens=False)["input_ids"]
            memo[key] = y[len(x)]
        out.append(memo[key])
    return out


@torch.inference_mode()
def last_logits(model: PreTrainedModel, tok: PreTrainedTokenizerBase, texts: Sequence[str], batch_size: int = 256) -> torch.Tensor:
    """Logits at the last token of each text, (N, V), float32, CPU. Left padding with position ids."""
    dev = next(model.parameters()).device
    enc = [tok(t)["input_ids"] for t in texts]
    out = []
    for i in range(0, len(enc), batch_size):
        chunk = enc[i:i + batch_size]
        w = max(len(x) for x in chunk)
        ids = torch.full((len(chunk), w), tok.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(chunk), w), dtype=torch.long)
        for j, x in enumerate(chunk):
            ids[j, w - len(x):] = torch.tensor(x)
            mask[j, w - len(x):] = 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        lg = model(input_ids=ids.to(dev), attention_mask=mask.to(dev), position_ids=pos.to(dev),
                   use_cache=False, logits_to_keep=1).logits[:, -1]
        out.append(lg.float().cpu())
    return torch.cat(out)


def score_prompts(logits: torch.Tensor, label_ids: Sequence[Sequence[int]], gold: Sequence[int], kind: str
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Per-prompt (correct, in_labels) from last-token logits (N, V).

    classification: argmax over the prompt's label first tokens is the gold one; generation: the
    full-vocabulary argmax is the gold first token. in_labels: full argmax is one of the label tokens.
    """
    full = logits.argmax(-1).numpy()
    correct = np.zeros(len(gold), dtype=bool)
    inlab = np.zeros(len(gold), dtype=bool)
    for i, (ids, g) in enumerate(zip(label_ids, gold)):
        ids = list(ids)
        inlab[i] = full[i] in ids
        if kind == "classification":
            correct[i] = int(np.argmax(logits[i, ids].numpy())) == g
        else:
            correct[i] = full[i] == ids[g]
    return correct, inlab


def evaluate_prompts(model: PreTrainedModel, tok: PreTrainedTokenizerBase, prompts: Sequence[Prompt], kind: str, batch_size: int = 256) -> dict[str, float]:
    """Accuracy and TR ratio of prompts: {"accuracy", "tr_ratio", "n"}."""
    memo: dict = {}
    label_ids = [_first_tokens(tok, p.text, p.labels, memo) for p in prompts]
    gold = [p.labels.index(p.gold) for p in prompts]
    correct, inlab = score_prompts(last_logits(model, tok, [p.text for p in prompts], batch_size), label_ids, gold,
                                   kind)
    return {"accuracy": float(correct.mean()), "tr_ratio": float(inlab.mean()), "n": len(prompts)}


def evaluate_language(model: PreTrainedModel, tok: PreTrainedTokenizerBase, shots: Sequence[int] = EVAL_SHOTS, n: int = 300, seed: int = 0,
                      tasks: Sequence[str] | None = None) -> dict[str, Any]:
    """Accuracy and TR ratio per task and k, and their means per group.

    Returns {"tasks": {name: {k: {...}}}, "groups": {group: {"accuracy": [per k], "tr_ratio": [per k]}},
    "shots": [...], "prompts": n}.
    """
    per_task: dict[str, dict[int, dict[str, float]]] = {}
    for task in synthetic_tasks():
        if tasks is not None and task.name not in tasks:
            continue
        per_task[task.name] = {k: evaluate_prompts(model, tok, task.build_prompts(k, n, seed), task.kind)
                               for k in shots}
    groups: dict[str, dict[str, list[float]]] = {}
    for g in GROUPS:
        names = [t for t in per_task if group_of(t) == g]
        if names:
            groups[g] = {m: [float(np.mean([per_task[t][k][m] for t in names])) for k in shots]
                         for m in ("accuracy", "tr_ratio")}
    return {"tasks": per_task, "groups": groups, "shots": list(shots), "prompts": n}


@torch.inference_mode()
def induction_scores(model: PreTrainedModel, tok: PreTrainedTokenizerBase, n: int = 50, batch: int = 4, seed: int = 0, bos: bool = True) -> np.ndarray:
    """Prefix-matching score per head, (layers, heads).

    Random non-special tokens r (batch, n) repeated: [<s>] r r; score = mean attention from position i of
    the second copy to the token after i's first occurrence. n is shortened to fit the trained length.
    """
    cfg = model.config
    n = min(n, (cfg.max_position_embeddings - int(bos)) // 2)
    special = set(tok.all_special_ids)
    allowed = torch.tensor([i for i in range(len(tok)) if i not in special])
    g = torch.Generator().manual_seed(seed)
    r = allowed[torch.randint(len(allowed), (batch, n), generator=g)]
    ids = torch.cat([r, r], dim=1)
    if bos:
        ids = torch.cat([torch.full((batch, 1), tok.bos_token_id), ids], dim=1)
    off = int(bos)
    q = torch.arange(off + n, off + 2 * n)
    k = q - n + 1
    before = getattr(cfg, "_attn_implementation", None) or "sdpa"
    model.set_attn_implementation("eager")
    try:
        out = model(input_ids=ids.to(next(model.parameters()).device), output_attentions=True, use_cache=False)
    finally:
        model.set_attn_implementation(before)
    return torch.stack([a[:, :, q, k].float().mean(dim=(0, 2)).cpu() for a in out.attentions]).numpy()


def top_heads(scores: np.ndarray, k: int = 5) -> list[tuple[int, int, float]]:
    """The k highest (layer, head, score) of an (L, H) array."""
    flat = np.argsort(-scores, axis=None)[:k]
    return [(int(i // scores.shape[1]), int(i % scores.shape[1]), float(scores.flat[i])) for i in flat]


# -- training -------------------------------------------------------------------------------------
def pick_device(device: str | None = None) -> torch.device:
    """CUDA when present (or as asked), else CPU."""
    if device:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


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


def quick_eval(model: PreTrainedModel, tok: PreTrainedTokenizerBase, sets: dict[str, list[tuple[Prompt, str]]]) -> dict[str, float]:
    """8-shot accuracy per group on the fixed progress-bar prompts."""
    was = model.training
    model.eval()
    res = {}
    for g, items in sets.items():
        kind = items[0][1]
        res[g] = evaluate_prompts(model, tok, [p for p, _ in items], kind)["accuracy"]
    model.train(was)
    return res


def train(cfg: TrainConfig, out: Path, seed: int = 0, device: str | None = None, progress: bool = True,
          final_eval_prompts: int = 300, command: str = "") -> dict[str, Any]:
    """Train, save weights + tokenizer + metrics + model card into `out`; return the metrics dict."""
    from tqdm import tqdm
    from transformers import LlamaForCausalLM

    dev = pick_device(device)
    if dev.type == "cpu":
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
            acc = quick_eval(model, tok, sets)
            history.append({"step": step + 1, "loss": ema["icl"] + cfg.rep_weight * ema["rep"], "icl_loss": ema["icl"],
                            "rep_loss": ema["rep"], "seconds": round(time.time() - t0, 1), **acc})
            if not progress:
                print(json.dumps(history[-1]), file=sys.stderr, flush=True)
        bar.set_postfix(icl=f"{ema['icl']:.3f}", rep=f"{ema['rep']:.3f}", cls=f"{acc['classification']:.2f}", gen=f"{acc['generation']:.2f}",
                        rmap=f"{acc['random-mapping']:.2f}", refresh=False)
    seconds = time.time() - t0
    model.eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    save_tokenizer(tok, out)
    metrics: dict[str, Any] = {"config": asdict(cfg), "seed": seed, "device": str(dev),
                               "train_seconds": round(seconds, 1), "params": sum(p.numel() for p in model.parameters()),
                               "history": history, "command": command}
    if final_eval_prompts:
        model = model.to(dev)
        metrics["eval"] = evaluate_language(model, tok, n=final_eval_prompts)
        ind = induction_scores(model, tok)
        metrics["induction"] = {"n": min(50, (cfg.seq_len - 1) // 2), "batch": 4, "scores": ind.round(4).tolist(),
                                "top": top_heads(ind), "heads_above_0.5": int((ind > 0.5).sum())}
        metrics["induction_no_bos_top"] = top_heads(induction_scores(model, tok, bos=False))
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
    (out / "README.md").write_text(model_card(metrics))
    return metrics


# -- model card -----------------------------------------------------------------------------------
def _fmt(xs: Sequence[float]) -> str:
    return " | ".join(f"{x:.2f}" for x in xs)


def model_card(m: dict[str, Any]) -> str:
    """The model card (README.md) from the metrics dict."""
    c = m["config"]
    ex = next(t for t in synthetic_tasks() if t.name == "syn-sentiment").build_prompts(2, 1, 0)[0]
    lines = [
        "# headlens-tiny: the embedded default model of headlens",
        "",
        "A small `LlamaForCausalLM` trained from scratch by `backend/train_default.py` on the synthetic task",
        "language of `backend/tasks/synthetic.py`. It exists so that the dashboard opens offline on a real model",
        "that does in-context learning: task recognition (answering in the label space) and task learning",
        "(picking the right label, even for label words redrawn per prompt), with induction heads.",
        "",
        "## Config",
        "",
        f"- `LlamaForCausalLM`, {c['layers']} layers, hidden size {c['hidden']}, {c['heads']} query heads per layer "
        f"({c['layers'] * c['heads']} in all), {c['kv_heads']} key/value heads per layer (grouped-query attention), "
        f"head_dim {c['head_dim']}, MLP {c['intermediate']}, RoPE, untied embeddings; {m['params']:,} parameters, fp32.",
        f"- Trained length {c['seq_len']} tokens = `max_position_embeddings`. A prompt of k demonstrations is "
        f"3k + 2 tokens with `<s>`, so 0-16 demonstrations (at most 50 tokens) fit.",
        "- Tokenizer: word level (one token per word, whitespace split), `tokenizer_class` "
        "`PreTrainedTokenizerFast`; it prepends `<s>` (id 1); `<pad>` is id 0, `</s>` id 2, `<unk>` id 3.",
        "",
        "## Data",
        "",
        "Episodes `<s> x y ; x y ; ... x y ;` of one task each (loss on the label tokens only), drawn on the fly:",
        "",
        "- a world of invented words: 50 entities, each valid under exactly 4 of the 5 classification tasks "
        "(sentiment pos/neg, category animal/plant/tool/food, size big/small, region north/south/east/west, "
        "parity even/odd); 56 words on a number line, each valid under 3 or 4 generation tasks (successor, "
        "predecessor, antonym = mirror word, plural `w -> ws`, capital `w -> wton`). A query alone does not say "
        "which task is meant.",
        "- random mapping (`syn-rmap-sentiment/size/parity`): the two classes are mapped to nonsense words "
        "(24-word pool) redrawn for every episode. Their inputs are bursty (repeat an earlier input) with "
        f"probability fading from {c['burst_start']:.0%} to {c['burst_end']:.0%} over the first "
        f"{c['burst_fade']:.0%} of training.",
        f"- rows: {c['batch_icl']} episodes of {c['icl_demos']} pairs ({3 * c['icl_demos'] + 1} tokens) per step, task "
        f"groups weighted {c['group_weights']} (classification, generation, random mapping); plus "
        f"{c['rep_tokens']} tokens of list-repetition rows (distinct random words: a prefix, a list of n words, a "
        "gap, the list again, a fill; n, gap and prefix vary; loss on the copy; a quarter without `<s>`), the rows "
        f"growing {' -> '.join(map(str, c['rep_lengths']))} tokens over the first {c['rep_curriculum']:.0%} of training.",
        f"- AdamW (betas 0.9/0.98, weight decay {c['weight_decay']}), lr {c['lr']} with {c['warmup']} warm-up "
        f"steps and cosine decay to 5%, gradient clipping 1.0, {c['steps']} steps, seed {m['seed']}.",
        "",
        "## Command",
        "",
        "```",
        m.get("command") or "python -m backend.train_default",
        "```",
        "",
        f"Training took {m['train_seconds']:.0f} s on {m['device']}"
        + (" (the 2-core CPU of the development machine, shared with other jobs at the time)."
           if m["device"] == "cpu" else "."),
        "",
        "## Use",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        'tok = AutoTokenizer.from_pretrained("models/headlens-tiny")',
        'model = AutoModelForCausalLM.from_pretrained("models/headlens-tiny")',
        f'ids = tok("{ex.text}")["input_ids"]  # <s> prepended; the gold answer is "{ex.gold}"',
        "```",
        "",
        "- Every word is one token; answers carry a leading space (`\" pos\"`) and are one token.",
        "- `tokenizer_config.json` names `PreTrainedTokenizerFast` on purpose: transformers 5 would otherwise pick "
        "the Llama tokenizer class, which ignores the word-level `tokenizer.json` and encodes text to nothing.",
        f"- Prompts longer than {c['seq_len']} tokens leave the trained length (RoPE degrades past it).",
        "",
        "## Label sets",
        "",
        "Every query word is valid under several tasks, so a zero-shot prompt does not say which task is meant. "
        "Classification prompts are scored against the language's whole classification vocabulary (14 words); "
        "random-mapping prompts against those 14 plus their own two mapped words. Scored against one task's own "
        "labels only, a model that knows the facts would answer zero-shot prompts right without knowing the task "
        "(the restriction itself names the task).",
        "",
    ]
    if "eval" in m:
        e = m["eval"]
        lines += [
            "## Measured",
            "",
            f"Held-out prompts (the query is never among the demonstrations), {e['prompts']} prompts per task and k, "
            "seed 0. Accuracy: argmax over the prompt's label set for classification and random mapping (the 14 "
            "classification labels, plus the prompt's two mapped words for random mapping); the full-vocabulary "
            "argmax for generation. TR ratio: share of prompts whose full-vocabulary argmax is a label word.",
            "",
            "| k demonstrations | " + " | ".join(str(k) for k in e["shots"]) + " |",
            "|---|" + "---|" * len(e["shots"]),
        ]
        names = {"classification": "classification", "generation": "generation", "random-mapping": "random-mapping"}
        for g, d in e["groups"].items():
            lines.append(f"| {names[g]} accuracy | {_fmt(d['accuracy'])} |")
        for g, d in e["groups"].items():
            lines.append(f"| {names[g]} TR ratio | {_fmt(d['tr_ratio'])} |")
        lines += ["", "Per task (accuracy at each k):", "", "| task | " + " | ".join(str(k) for k in e["shots"]) + " |",
                  "|---|" + "---|" * len(e["shots"])]
        for t, d in e["tasks"].items():
            lines.append(f"| {t} | {_fmt([d[k]['accuracy'] if k in d else d[str(k)]['accuracy'] for k in e['shots']])} |")
        ind = m["induction"]
        lines += ["", f"Induction (prefix-matching) scores on `<s>` + {ind['n']} random tokens repeated twice, batch "
                  f"{ind['batch']}: {ind['heads_above_0.5']} heads above 0.5; top heads (layer, head): "
                  + ", ".join(f"L{l}H{h} {s:.2f}" for l, h, s in ind["top"]) + "."]
        if "induction_no_bos_top" in m:
            lines += ["", "Without `<s>`, the top heads: "
                      + ", ".join(f"L{l}H{h} {s:.2f}" for l, h, s in m["induction_no_bos_top"]) + "."]
    lines += ["", "Regenerate with the command above; `metrics.json` holds the numbers and the training curve.", ""]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m backend.train_default", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (default: models/headlens-tiny)")
    ap.add_argument("--config", choices=sorted(CONFIGS), default="default")
    ap.add_argument("--steps", type=int, default=None, help="training steps (default: the config's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default=None, help="cuda / cpu (default: cuda when present)")
    ap.add_argument("--eval-prompts", type=int, default=300, help="prompts per task and k in the final table (0: skip)")
    ap.add_argument("--no-progress", action="store_true", help="log JSON lines instead of a progress bar")
    args = ap.parse_args(argv)
    cfg = CONFIGS[args.config]
    if args.steps is not None:
        cfg = replace(cfg, steps=args.steps, warmup=min(cfg.warmup, max(1, args.steps // 10)))
    cmd = "python -m backend.train_default " + " ".join(sys.argv[1:] if argv is None else argv)
    m = train(cfg, args.out, args.seed, args.device, not args.no_progress, args.eval_prompts, cmd.strip())
    if "eval" in m:
        for g, d in m["eval"]["groups"].items():
            print(f"{g:15s} acc {_fmt(d['accuracy'])}   TR {_fmt(d['tr_ratio'])}")
        print("induction top:", m["induction"]["top"])
    print(f"trained in {m['train_seconds']:.0f} s -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
