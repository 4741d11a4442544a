"""Training vectors injected into a frozen model (learned task vectors), and the zero-shot data they train on.

    theta[l] = scale[l] * phi[l],  phi[l] ~ U(-init, init)  (d_model,) for each injection layer l
               (scale 1: theta trained as is; scale r: the recipe in units of the residual stream's RMS r)
    loss = mean over a batch of CE(logits at the last token, gold answer's first token)
    AdamW(lr, weight_decay) on phi, learning rate decaying linearly to 0 over all steps; an epoch draws
    `samples_per_epoch` prompts (cycling through shuffled passes over a smaller training set)
    after every epoch: full-vocabulary accuracy (and loss) on held-out prompts; the best theta is kept
    (higher accuracy, ties broken by lower loss); training stops after `patience` epochs without a higher
    held-out accuracy (a lower loss at the same accuracy does not hold it off: early stopping is on accuracy).

The model stays frozen (eval mode, no parameter gradients): only theta gets a gradient, through the hooks
of `inject.injected_logits`; with theta at the last token only, each prompt's clean prefix is computed once and
every step is one token over it from the lowest injection layer on (`last_token.step_logits`; the same loss and
gradient within float tolerance). Training holds the model's lock. Data: zero-shot prompts (the query alone) of the
examples of the task's *demonstration* pool for the seed, split into training and held-out prompts, so the
seed's query pool (what every analysis scores) is never trained or early-stopped on.
"""
from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from ...errors import BadInput
from ...model.interventions import Record, intervene
from ...model.loading import LoadedModel
from ..primitives.stopping import check
from ...tasks.base import Prompt, Task, TaskError
from ..primitives.threads import cpu_threads
from ..primitives.batching import Encoded, make_batch, map_batches
from ..primitives.inject import Injection, gold_tokens, injected_logits
from ..primitives.notes import Note
from ..primitives.last_token import Prefixes, clean_prefixes, step_logits

MIN_TRAIN = 4
MIN_VAL = 2
VAL_SHARE = 0.25  # of a demonstration pool too small for the requested sizes
def residual_rms(lm: LoadedModel, enc: Encoded, layer: int, positions: Sequence[int], batch_size: int = 32) -> float:
    """Mean over prompts and `positions` of the root-mean-square of the hidden state entering decoder `layer`
    (||h|| / sqrt(d_model)): the residual stream's size where a vector is injected."""
    total, count = [0.0], [0]
    idx = list(positions)

    def add(_: int | None, h: torch.Tensor) -> None:
        x = h[:, idx].float()
        total[0] += float((x.norm(dim=-1) / math.sqrt(x.shape[-1])).sum())
        count[0] += x.shape[0] * x.shape[1]

    def step(batch) -> None:
        lm.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids,
                 use_cache=False, logits_to_keep=1)

    with intervene(lm, [Record("layer_in", add, at=[layer])]):
        map_batches(lm, enc.ids, batch_size, step)
    return total[0] / max(count[0], 1)


@dataclass
class Split:
    train: list[Prompt]
    val: list[Prompt]
    warnings: list[str] = field(default_factory=list)


def training_split(task: Task, seed: int, n_train: int, n_val: int) -> Split:
    """Zero-shot training and held-out prompts from the seed's demonstration pool (never its query pool).

    With fewer examples than n_train + n_val, a quarter (at least MIN_VAL) is held out and the rest trains,
    with a warning; fewer than MIN_TRAIN + MIN_VAL examples is a TaskError."""
    if task.builder is not None or task.fixed is not None:
        why = "its prompts are given as a set" if task.fixed is not None else "it builds its own prompts"
        raise TaskError(f"a learned task vector trains on zero-shot prompts of a task's examples; task "
                        f"{task.name!r} has none ({why}, e.g. label words redrawn for every prompt), so no "
                        f"fixed vector can learn it")
    pool, _ = task.split(seed)
    pool = list(pool)
    random.Random(f"ltv-split-{seed}").shuffle(pool)
    n = len(pool)
    if n < MIN_TRAIN + MIN_VAL:
        raise TaskError(f"task {task.name!r} has {n} examples in its demonstration pool for seed {seed} (about half "
                        f"of its {len(task.examples)} examples; the other half is held out for scoring); a learned "
                        f"task vector needs at least {MIN_TRAIN + MIN_VAL}: {MIN_TRAIN} to train and {MIN_VAL} "
                        f"held out for early stopping")
    warnings = []
    if n >= n_train + n_val:
        nv, nt = n_val, n_train
    else:
        nv = min(n_val, max(MIN_VAL, round(n * VAL_SHARE)))
        nt = min(n_train, n - nv)
        warnings.append(Note(f"task {task.name!r} has {n} examples in its demonstration pool for seed {seed}: {nt} "
                             f"are training prompts (asked: {n_train}) and {nv} are held out for early stopping "
                             f"(asked: {n_val}); its query pool stays held out for scoring"))
    rng = random.Random(f"ltv-labels-{seed}")
    val = [task.prompt(x, y, [], rng) for x, y in pool[:nv]]
    train = [task.prompt(x, y, [], rng) for x, y in pool[nv:nv + nt]]
    return Split(train, val, warnings)


@dataclass(frozen=True)
class Recipe:
    """How a vector trains (defaults: the reference implementation's)."""

    lr: float = 5e-3
    epochs: int = 10
    patience: int = 2
    weight_decay: float = 0.01
    init_scale: float = 0.1
    batch_size: int = 1
    seed: int = 0  # the order of the training prompts
    init_seed: int | None = None  # theta's initialisation (None: `seed`)


@dataclass
class Trained:
    """A trained vector per layer (the best epoch's) and the training's history."""

    vectors: dict[int, torch.Tensor]
    loss: list[float]  # per step (the batch's mean cross-entropy)
    val_accuracy: list[float]  # per epoch, on the held-out prompts (full vocabulary)
    val_loss: list[float]  # per epoch
    best_epoch: int  # 1-based; 0: the initial vector was never beaten
    epochs_run: int
    stopped: str  # "early stopping" | "max epochs"
    seconds: float
    init_val_accuracy: float = 0.0


class TrainingDiverged(BadInput):
    """The loss became NaN or infinite (the message names the learning rate to lower)."""


OnStep = Callable[[int, int, float], None]  # (step, epoch, loss); may raise (a cancelled job)


def _val(lm: LoadedModel, enc: Encoded, inj: Injection, gold: torch.Tensor, batch_size: int,
         pre: Prefixes | None = None) -> tuple[float, float]:
    """(full-vocabulary accuracy, mean CE of the gold first token) of the held-out prompts under `inj` (with
    `pre`, their kept prefixes: one token step each)."""
    correct, loss = 0, 0.0
    order = sorted(range(len(enc.ids)), key=lambda i: -len(enc.ids[i]))
    with torch.no_grad():
        for s in range(0, len(order), batch_size):
            check()  # once per batch (`stopping`)
            rows = order[s:s + batch_size]
            logits = step_logits(pre, rows, inj.vectors) if pre is not None else \
                injected_logits(lm, make_batch(lm, enc.ids, rows), inj)
            g = gold[rows].to(logits.device)
            correct += int((logits.argmax(-1) == g).sum())
            loss += float(torch.nn.functional.cross_entropy(logits, g, reduction="sum"))
    return correct / len(order), loss / len(order)


def train_injection(lm: LoadedModel, layers: Sequence[int], positions: Sequence[int], train: Encoded,
                    val: Encoded, recipe: Recipe, on_step: OnStep | None = None,
                    on_epoch: Callable[[int, float, float], None] | None = None,
                    scale: dict[int, float] | None = None, samples_per_epoch: int | None = None) -> Trained:
    """Train one vector per layer in `layers` (added together at their inputs, at `positions`) to minimise the
    cross-entropy of the gold first token of the `train` prompts; early stopping on `val`'s accuracy.

    scale: theta[l] = scale[l] * phi[l] with phi trained by the recipe (a recipe in units of the residual stream's
    size); samples_per_epoch: an epoch draws this many training prompts (cycling through shuffled passes over a
    smaller set), default one pass. Raises TrainingDiverged on a NaN / infinite loss. `on_step` / `on_epoch`
    (epoch, val accuracy, val loss) report progress and may raise to stop."""
    t0 = time.perf_counter()
    dev, d = lm.device, lm.d_model
    g = torch.Generator().manual_seed(recipe.seed if recipe.init_seed is None else recipe.init_seed)
    phi = {int(l): ((torch.rand(d, generator=g) * 2 - 1) * recipe.init_scale).to(dev).requires_grad_(True)
           for l in layers}
    sc = {l: float((scale or {}).get(l, 1.0)) for l in phi}

    def vectors() -> dict[int, torch.Tensor]:
        return {l: v * sc[l] if sc[l] != 1.0 else v for l, v in phi.items()}

    pos = tuple(positions)
    gold_train, gold_val = gold_tokens(train), gold_tokens(val)
    n = len(train.ids)
    per_epoch = samples_per_epoch or n
    steps_per_epoch = math.ceil(per_epoch / recipe.batch_size)
    total = max(1, recipe.epochs * steps_per_epoch)
    opt = torch.optim.AdamW(list(phi.values()), lr=recipe.lr, weight_decay=recipe.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.0, 1.0 - s / total))
    order_rng = random.Random(f"ltv-order-{recipe.seed}")
    stream: list[int] = []
    losses: list[float] = []
    val_acc: list[float] = []
    val_loss: list[float] = []
    vb = max(recipe.batch_size, 16)
    with lm.lock, torch.enable_grad(), cpu_threads(lm):
        # theta at the last token only: each prompt's clean prefix once, then every step one token from the lowest
        # injection layer on (`last_token`); other positions: full passes
        pre_train = pre_val = None
        if pos == (-1,):
            pre_train = clean_prefixes(lm, train.ids, min(phi))
            pre_val = clean_prefixes(lm, val.ids, min(phi)) if pre_train is not None else None

        def logits_of(rows: list[int]) -> torch.Tensor:
            if pre_train is not None:
                return step_logits(pre_train, rows, vectors())
            return injected_logits(lm, make_batch(lm, train.ids, rows), Injection(vectors(), pos))

        init_acc, init_loss = _val(lm, val, Injection(vectors(), pos), gold_val, vb, pre_val)
        best = (init_acc, -init_loss)
        best_acc = init_acc  # the early-stopping criterion: epochs without a higher held-out accuracy
        best_theta = {l: v.detach().clone() for l, v in vectors().items()}
        best_epoch, bad, stopped, epoch = 0, 0, "max epochs", 0
        for epoch in range(1, recipe.epochs + 1):
            drawn = 0
            while drawn < per_epoch:
                check()  # once per training step (`stopping`): a cancelled job or one past its limit stops here
                rows = []
                while len(rows) < min(recipe.batch_size, per_epoch - drawn):
                    if not stream:  # a new shuffled pass over the training prompts
                        stream = list(range(n))
                        order_rng.shuffle(stream)
                    rows.append(stream.pop(0))
                drawn += len(rows)
                logits = logits_of(rows)
                loss = torch.nn.functional.cross_entropy(logits, gold_train[rows].to(logits.device))
                value = float(loss.detach())
                if not math.isfinite(value):
                    raise TrainingDiverged(
                        f"the training loss became {value} at epoch {epoch}, step {len(losses) + 1} (lr {recipe.lr}); "
                        f"training stopped: try a smaller learning rate or init scale")
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                sched.step()
                losses.append(value)
                if on_step is not None:
                    on_step(len(losses), epoch, value)
            acc, vloss = _val(lm, val, Injection(vectors(), pos), gold_val, vb, pre_val)
            if not math.isfinite(vloss):
                raise TrainingDiverged(f"the held-out loss became {vloss} after epoch {epoch} (lr {recipe.lr}); "
                                       f"training stopped: try a smaller learning rate or init scale")
            val_acc.append(acc)
            val_loss.append(vloss)
            if on_epoch is not None:
                on_epoch(epoch, acc, vloss)
            if (acc, -vloss) > best:
                best, best_epoch = (acc, -vloss), epoch
                best_theta = {l: v.detach().clone() for l, v in vectors().items()}
            if acc > best_acc:
                best_acc, bad = acc, 0
            else:
                bad += 1
                if bad >= recipe.patience:
                    stopped = "early stopping"
                    break
    return Trained(best_theta, losses, val_acc, val_loss, best_epoch, epoch, stopped, time.perf_counter() - t0,
                   init_acc)
