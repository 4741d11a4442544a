"""Soft head selection (SITE): a task embedding per head, per-head alphas trained to inject it, and their use.

Task embedding: t[l, h] = mean over M few-shot prompts of head (l, h)'s slice of the output projection's input
at the last token, (layers, heads, head_dim) (`capture.capture_means(..., "z")`).
Soft injection, at the last prompt token of the prefill only, before the output projection:
    z[l, h] <- (1 - alpha[l, h]) z[l, h] + alpha[l, h] t[l, h],   alpha = sigmoid(logits), logits (layers, heads)
which is the hooks' head mask with a fill: m = 1 - alpha, fill = t (autograd-safe).
Training: Adam on the logits (start 0, so alpha = 0.5), cross-entropy of the gold answer's first token on
zero-shot prompts of the training split; validation every `val_every` steps on held-out training queries, and
the alphas of the lowest validation loss are kept.

Data, from the task's seeded split (demonstration pool / query pool, as every kind splits it):
    training split = the demonstration pool: the M few-shot prompts (demonstrations *and* queries) and the
                     zero-shot training and validation queries (disjoint) all come from it;
    test           = zero-shot prompts of the query pool, the same queries the other kinds score.
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Sequence

import numpy as np
import torch

from ...model.hooks import hooked
from ...model.loading import LoadedModel
from ..primitives.options import LORA_RANK, SITE_DECISIVE, SITE_VAL_SHARE
from ..primitives.stopping import check
from ...tasks.base import Prompt, Task, TaskError
from ..primitives.bos import prompt_ids
from ..primitives.batching import Batch, Encoded, Progress, encode, forward_last_logits, make_batch, map_batches
from ..primitives.inject import gold_tokens
from ..primitives.last_token import Prefixes, clean_prefixes, step_logits
from ..primitives.notes import Note
from ..primitives.saved import load_tensors, save_tensors

from .recipe import PREFIX_FROM  # training prompts this long run their prefix once; the last token back-propagates

KIND = "site"
Live = Callable[[dict[str, Any]], None]


# -- data ----------------------------------------------------------------------------------------------------
@dataclass
class SiteData:
    """The prompts of one SITE run. `embed`: the M few-shot prompts of the task embedding; `train`, `val`:
    zero-shot prompts of disjoint training-split queries; `test`: zero-shot prompts of the held-out queries."""

    embed: list[Prompt]
    train: list[Prompt]
    val: list[Prompt]
    test: list[Prompt]
    shots: int
    warnings: list[str] = field(default_factory=list)


def require_template_task(task: Task) -> None:
    """SITE builds its own zero-shot prompts from (input, output) examples; tasks that build their own prompts
    (random mapping, a given prompt set) cannot be used."""
    if task.builder is not None or task.fixed is not None:
        raise TaskError(f"task {task.name!r} builds its own prompts (a random mapping or a given prompt set): soft "
                        f"head selection trains on zero-shot prompts made from the task's examples, and a "
                        f"zero-shot prompt of such a task has no defined answer; pick a task of examples")


def _fits(lm: LoadedModel, prompts: Sequence[Prompt]) -> bool:
    return not lm.max_positions or max(len(prompt_ids(lm.tokenizer, p.text)) for p in prompts) <= lm.max_positions


def site_data(lm: LoadedModel, task: Task, *, m: int, shots: int, val_prompts: int, test_prompts: int,
              seed: int) -> SiteData:
    """The prompts of a SITE run (see the module docstring), sized to what the task has, with warnings where it
    has less than asked; a TaskError when a split is too small to train, validate and test at all."""
    require_template_task(task)
    warnings: list[str] = []
    pool, queries = task.split(seed)
    if len(pool) < 2:
        raise TaskError(f"task {task.name!r} has {len(pool)} example(s) in its training split; soft head selection "
                        f"needs at least 2 (one to train on, one to validate on)")
    rng = random.Random(f"site-{task.name}-{seed}")
    # test: zero-shot prompts of the held-out queries, in the order every other kind uses
    if test_prompts > len(queries):
        warnings.append(f"task {task.name!r} has {len(queries)} held-out queries for seed {seed}; tested on "
                        f"{len(queries)} prompts, not the {test_prompts} asked (each query once)")
    test = task.build_prompts(0, min(test_prompts, len(queries)), seed)
    # validation and training queries: disjoint parts of the training split
    order = pool[:]
    rng.shuffle(order)
    n_val = min(val_prompts, max(1, round(SITE_VAL_SHARE * len(order))), len(order) - 1)
    if n_val < val_prompts:
        warnings.append(Note(f"validated on {n_val} queries held out of the training split ({len(order)} examples), "
                             f"not the {val_prompts} asked; trained on the other {len(order) - n_val}"))
    val = [task.prompt(x, y, [], rng) for x, y in order[:n_val]]
    train = [task.prompt(x, y, [], rng) for x, y in order[n_val:]]
    # the task embedding's few-shot prompts: queries and demonstrations from the training split
    k = shots
    if k > len(pool) - 1:
        k = len(pool) - 1
        warnings.append(f"{shots} demonstrations per prompt asked, but the training split has {len(pool)} "
                        f"examples (one is each prompt's query); used {k}")
    while True:
        erng = random.Random(f"site-embed-{task.name}-{seed}-{k}")
        embed = []
        for i in range(m):
            check()  # M may be large (`stopping`)
            j = i % len(pool)
            x, y = pool[j]
            demos = erng.sample(pool[:j] + pool[j + 1:], k)
            embed.append(task.prompt(x, y, demos, erng))
        if _fits(lm, embed):
            break
        if k == 0:
            raise TaskError(f"even the zero-shot prompts of task {task.name!r} exceed the context window of "
                            f"{lm.max_positions} tokens")
        k = k // 2 if k > 1 else 0
    if k < min(shots, len(pool) - 1):
        warnings.append(f"prompts with {min(shots, len(pool) - 1)} demonstrations exceed the context window of "
                        f"{lm.max_positions} tokens; the task embedding used {k} demonstrations instead")
    if m > len(pool):
        warnings.append(Note(f"{m} few-shot prompts from {len(pool)} training examples: each query recurs (with "
                             f"other demonstrations) about {m / len(pool):.1f} times"))
    if not _fits(lm, train + val + test):
        raise TaskError(f"the zero-shot prompts of task {task.name!r} exceed the context window of "
                        f"{lm.max_positions} tokens")
    return SiteData(embed, train, val, test, k, warnings)


# -- injection -----------------------------------------------------------------------------------------------------
def soft_hooks(lm: LoadedModel, alpha: torch.Tensor, t: torch.Tensor, rows: int,
               last: torch.Tensor | None = None) -> ContextManager[Any]:
    """Hooks that inject t with weights alpha (layers, heads) — or one per row, (rows, layers, heads) — at the
    last prompt token, before each output projection, in the prefill only."""
    m = 1.0 - alpha.to(lm.device, torch.float32)
    if m.dim() == 2:
        m = m.unsqueeze(0).expand(rows, *m.shape)
    return hooked(lm, head_mask=m, head_fill=t.to(lm.device, torch.float32), mask_scope="last", last=last,
                  prefill_only=True)


def soft_logits(lm: LoadedModel, enc: Encoded, alpha: torch.Tensor | None, t: torch.Tensor | None,
                batch_size: int = 16) -> torch.Tensor:
    """Last-token logits of the prompts with the soft injection (none when alpha is None), (prompts, vocab)."""
    out = torch.zeros(len(enc.ids), lm.unembed.shape[0])

    def step(batch: Batch) -> None:
        if alpha is None:
            out[batch.rows] = forward_last_logits(lm, batch).cpu()
            return
        with soft_hooks(lm, alpha, t, len(batch.rows), batch.last):
            out[batch.rows] = forward_last_logits(lm, batch).cpu()

    map_batches(lm, enc.ids, batch_size, step)
    return out


def hook_factory(lm: LoadedModel, alpha: torch.Tensor, t: torch.Tensor) -> Callable[[Batch], ContextManager[Any]]:
    """For `generate.generate(hooks=...)`: the soft injection around each batch."""
    return lambda batch: soft_hooks(lm, alpha, t, len(batch.rows), batch.last)


# -- training -------------------------------------------------------------------------------------------------------
@dataclass
class Trained:
    """The kept (best) logits and alphas, the loss of every step, the validation points and the best one."""

    logits: torch.Tensor
    loss: list[float]
    val: list[dict[str, float]]
    best_step: int
    seconds: float

    @property
    def alpha(self) -> torch.Tensor:
        return torch.sigmoid(self.logits)


def validate(lm: LoadedModel, enc: Encoded, alpha: torch.Tensor, t: torch.Tensor, batch_size: int = 16,
             pre: Prefixes | None = None) -> tuple[float, float]:
    """(mean cross-entropy of the gold first token, first-token accuracy) on the prompts under the injection (with
    `pre`, the prompts' kept prefixes: one token step each)."""
    if pre is None:
        logits = soft_logits(lm, enc, alpha, t, batch_size)
    else:
        order, parts = list(range(len(enc.ids))), []
        with lm.lock, torch.inference_mode():
            for s in range(0, len(order), batch_size):
                check()  # once per batch (`stopping`)
                rows = order[s:s + batch_size]
                parts.append(step_logits(pre, rows, hooks=lambda n: soft_hooks(lm, alpha, t, n)).cpu())
        logits = torch.cat(parts)
    gold = gold_tokens(enc)
    loss = torch.nn.functional.cross_entropy(logits, gold).item()
    return float(loss), float((logits.argmax(-1) == gold).float().mean())


def injected_last_logits(lm: LoadedModel, batch: Batch, alpha: torch.Tensor, t: torch.Tensor,
                         prefix_from: int = PREFIX_FROM) -> torch.Tensor:
    """Last-token logits (rows, vocab) of a left-padded batch with the soft injection, differentiable in alpha.

    The injection acts at the last token only, so nothing before it depends on alpha: prompts of `prefix_from`
    tokens or more run their prefix once without autograd into a KV cache, and only the last token runs (and
    back-propagates) with the hooks. Shorter prompts run in one pass (two calls would cost more than they save)."""
    if batch.last is not None or batch.input_ids.shape[1] < max(prefix_from, 2):
        with soft_hooks(lm, alpha, t, len(batch.rows), batch.last):
            return forward_last_logits(lm, batch)
    from .generate import cache_kw, cache_of

    with torch.no_grad():
        pre = lm.model(input_ids=batch.input_ids[:, :-1], attention_mask=batch.attention_mask[:, :-1],
                       position_ids=batch.position_ids[:, :-1], use_cache=True, logits_to_keep=1)
    with soft_hooks(lm, alpha, t, len(batch.rows)):
        out = lm.model(input_ids=batch.input_ids[:, -1:], attention_mask=batch.attention_mask,
                       position_ids=batch.position_ids[:, -1:], use_cache=True, logits_to_keep=1,
                       **{cache_kw(lm): cache_of(pre)})
    return out.logits[:, -1].float()


def train_alphas(lm: LoadedModel, t: torch.Tensor, train: Encoded, val: Encoded, *, steps: int, lr: float,
                 batch: int = 1, val_every: int = 50, seed: int = 0, progress: Progress | None = None,
                 live: Live | None = None, live_every: int = 10, prefix_from: int = PREFIX_FROM,
                 beta2: float = 0.999, keep: str = "best") -> Trained:
    """Adam on the alpha logits (start 0), one batch of `batch` random training prompts a step; every `val_every`
    steps (and after the last) the validation loss, and the logits of the lowest one are kept (ties: the
    earlier); `keep="last"`: those of the last validation (the reference's behaviour: its `optimize_head_selection`
    never updates its best loss, so every validation replaces the kept alphas). `progress(f, msg)` and `live(data)` may raise to cancel. Each training and validation prompt's clean
    prefix is computed once and every step runs its last token only (`last_token.step_logits`); where that does not
    fit the model, prompts of `prefix_from` tokens or more reuse their prefix per step (`injected_last_logits`).
    `beta2`: Adam's second-moment decay."""
    L, H = lm.n_layers, lm.n_heads
    t = t.to(lm.device, torch.float32)
    logits = torch.zeros(L, H, device=lm.device, requires_grad=True)
    opt = torch.optim.Adam([logits], lr=lr, betas=(0.9, beta2))
    gold = gold_tokens(train).to(lm.device)
    rng = random.Random(f"site-train-{seed}")
    losses: list[float] = []
    val_points: list[dict[str, float]] = []
    best: tuple[float, int, torch.Tensor] | None = None
    b = min(batch, len(train.ids))

    def report(step: int, force: bool = False) -> None:
        if live is not None and (force or step % live_every == 0):
            live({"step": step, "steps": steps, "loss": list(losses), "val": list(val_points)})

    # alpha acts at the last token only: each prompt's clean prefix once, then every step (and validation) one
    # token over it (`last_token`); a training set with one-token prompts runs full passes
    pre = pre_val = None
    if min(len(x) for x in train.ids) >= 2:
        pre = clean_prefixes(lm, train.ids, 0)
        pre_val = clean_prefixes(lm, val.ids, 0) if pre is not None else None
    t0 = time.perf_counter()
    v0 = validate(lm, val, torch.sigmoid(logits.detach()), t, pre=pre_val)
    val_points.append({"step": 0, "loss": v0[0], "accuracy": v0[1]})
    for step in range(1, steps + 1):
        check()  # once per training step (`stopping`)
        rows = rng.sample(range(len(train.ids)), b)
        with lm.lock, torch.enable_grad():
            if pre is not None:
                a = torch.sigmoid(logits)
                out = step_logits(pre, rows, hooks=lambda n: soft_hooks(lm, a, t, n))
            else:
                out = injected_last_logits(lm, make_batch(lm, train.ids, rows), torch.sigmoid(logits), t,
                                           prefix_from=prefix_from)
            loss = torch.nn.functional.cross_entropy(out, gold[rows])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        losses.append(float(loss.detach()))
        if step % val_every == 0 or step == steps:
            vl, va = validate(lm, val, torch.sigmoid(logits.detach()), t, pre=pre_val)
            val_points.append({"step": step, "loss": vl, "accuracy": va})
            if best is None or vl < best[0] or keep == "last":
                best = (vl, step, logits.detach().clone())
            report(step, force=True)
        else:
            report(step)
        if progress is not None:
            progress(step / steps, f"step {step}/{steps} · loss {losses[-1]:.3f}")
    seconds = time.perf_counter() - t0
    if best is None:  # steps == 0
        best = (v0[0], 0, logits.detach().clone())
    return Trained(best[2].cpu(), losses, val_points, best[1], seconds)


# -- summaries --------------------------------------------------------------------------------------------------------
def decisive_shares(alpha: np.ndarray, margin: float = SITE_DECISIVE) -> dict[str, float]:
    """Shares of alphas under `margin` (low), over 1 - margin (high), both together (decided), and the same at
    twice the margin (decided_2x: under 0.2 or over 0.8 by default)."""
    a = np.asarray(alpha, dtype=float)
    low, high = float((a < margin).mean()), float((a > 1 - margin).mean())
    wide = float(((a < 2 * margin) | (a > 1 - 2 * margin)).mean())
    return {"low": low, "high": high, "decided": low + high, "decided_2x": wide}


def lora_params(lm: LoadedModel, rank: int = LORA_RANK) -> int:
    """Trainable parameters of a rank-r LoRA on the q and v projections of every layer:
    r (d_model + H dh) + r (d_model + H_kv dh) per layer."""
    d, q, v = lm.d_model, lm.n_heads * lm.head_dim, lm.n_kv_heads * lm.head_dim
    return lm.n_layers * rank * ((d + q) + (d + v))


def ranked_heads(alpha: np.ndarray) -> list[tuple[int, int]]:
    """All heads by alpha, largest first (ties by position)."""
    a = np.asarray(alpha, dtype=float)
    H = a.shape[1]
    return [(int(i // H), int(i % H)) for i in np.argsort(-a, axis=None, kind="stable")]


def hard_alpha(lm: LoadedModel, heads: Sequence[tuple[int, int]]) -> torch.Tensor:
    """alpha = 1 at the given heads, 0 elsewhere: those heads' z replaced by t outright."""
    a = torch.zeros(lm.n_layers, lm.n_heads)
    for l, h in heads:
        a[l, h] = 1.0
    return a


# -- saving ------------------------------------------------------------------------------------------------------------
def save_site(store: Any, lm: LoadedModel, logits: torch.Tensor, t: torch.Tensor, task: Task | None = None,
              recipe: dict[str, Any] | None = None) -> str:
    """Write the alpha logits, the alphas and the task embedding as safetensors (with the model, d_model, task
    and recipe metadata that loading checks) through `store` (`ctx.tensors`); returns the file's id."""
    return save_tensors(store, {"alpha_logits": logits, "alpha": torch.sigmoid(logits.float()), "task_embedding": t},
                        lm, KIND, task_hash=task.content_hash() if task is not None else None,
                        task_name=task.name if task is not None else None, recipe=recipe)


def load_site(store: Any, tid: str, lm: LoadedModel) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """(alpha (layers, heads), task embedding (layers, heads, head_dim), metadata) of the saved file `tid`; a
    ValueError of one sentence for an absent or unsound file (alpha outside [0, 1], values not finite, ...) or one
    made for another model (`saved.load_tensors`)."""
    tensors, meta = load_tensors(store, tid, lm, KIND)
    return tensors["alpha"], tensors["task_embedding"], meta


def encode_all(lm: LoadedModel, task: Task, data: SiteData) -> dict[str, Encoded]:
    """The run's prompt sets, tokenised."""
    return {name: encode(lm, getattr(data, name), task.kind) for name in ("embed", "train", "val", "test")}


