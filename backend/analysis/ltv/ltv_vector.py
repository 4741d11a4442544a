"""Kind `ltv_vector`: train one learned task vector (LTV) through the frozen model.

theta (d_model,) is added to the hidden state at the INPUT of decoder layer l (default L/2) at `positions`
(negative offsets, -1 = the last prompt token); with several layers, one theta per layer, trained together.
Objective: the cross-entropy of the gold answer's first token on zero-shot prompts. Recipe (the reference
implementation's): theta ~ U(-0.1, 0.1), AdamW (weight decay 0.01, lr 5e-3) with linear decay, batch 1, at most
10 epochs of 100 training prompts, early stopping with patience 2 on the held-out full-vocabulary accuracy,
keeping the best theta (see `learn`). Three adaptations, all in the recipe's metadata:
- units="residual" (the default): theta = r * phi with r the RMS of the residual stream entering the layer (mean
  over the training prompts) and phi trained by the recipe, so lr 5e-3 means the same step on every model.
  The reference's absolute numbers were tuned on Llama; the default model's stream has RMS ~11 at L/2, where
  they give 88% mean held-out accuracy at batch 1 and 52% at batch 4, against 100% in units of r
  (bench/RESULTS.md). units="absolute" is the reference as is.
- an epoch always draws `train_prompts` prompts, cycling through a smaller training set (the synthetic tasks
  have 14-15), so a small task gets the recipe's number of steps (without it, 150 steps: 15-50% in absolute units).
- batch 4 by default (the reference: 1): ~4x faster on a CPU at the same accuracy (bench/RESULTS.md).

Data: zero-shot prompts of the seed's demonstration pool (training and held-out); the seed's query pool, which
every analysis scores, is never seen. Progress reports every step; `ctx.live` carries the loss curve so far
({"loss": [...], "val_accuracy": [...], ...}). The vector is saved as safetensors (model fingerprint, d_model,
task hash and the recipe in its metadata) in the tensor store; its id (a hash of the file) is the result's
`tensor`. The store is checked to take a file before the training starts; a save that fails afterwards returns
the vector inline (the kernel: `unsaved_tensors`) with a warning.
"""
from __future__ import annotations

import hashlib
import math
import time
from typing import Any

import torch
from pydantic import Field

from ..kernel import Context
from ..params import Layer
from ..primitives.cost import Shape, Sizes, Work, stage
from ..primitives.stages import between, planned
from ..results import Result, TensorsInline
from .recipe import LtvRecipeParams, LtvTraining
from ..primitives.batching import encode
from ..primitives.notes import Note
from ..primitives.inject import check_layers, check_positions
from .learn import Recipe, residual_rms, train_injection, training_split
from ..primitives.saved import require_writable, save_tensors


class LtvVectorParams(LtvRecipeParams):
    """kind `ltv_vector`: train one learned task vector (several layers: one theta each, trained together)."""

    layer: Layer | list[Layer] | None = Field(None, description="decoder layer whose input theta is added to; "
                                                                "None = L/2; a list: one theta per layer, jointly")

    def work(self, shape: Shape, sizes: Sizes) -> Work:
        at = self.layer if not isinstance(self.layer, list) else min(self.layer)
        w = self.training_work(sizes, shape, at)  # in the run's order: the residual scale's pass, then the training
        return stage("residual scale", w.stage("residual scale")) + w.without({"residual scale"})

    def writes_tensors(self) -> bool:
        return True


class LtvVectorResult(Result, LtvTraining, TensorsInline):
    """kind `ltv_vector`: one trained LTV."""

    d_model: int
    multi_token_labels: list[str] = Field(default_factory=list)


LIVE_EVERY_S = 0.25


def ltv_vector(ctx: Context, p: LtvVectorParams) -> dict[str, Any]:
    """{"layers", "positions", "theta" (layers, d_model), training history, "tensor" (its id), ...}."""
    lm, task = ctx.lm, ctx.task
    layers = [lm.n_layers // 2] if p.layer is None else [p.layer] if isinstance(p.layer, int) else p.layer
    layers = check_layers(lm, sorted(set(layers)))
    split = training_split(task, p.seed, p.train_prompts, p.val_prompts)
    for w in split.warnings:
        ctx.warn(w)
    train, val = encode(lm, split.train, task.kind), encode(lm, split.val, task.kind)
    multi = sorted(set(train.multi_token) | set(val.multi_token))  # the kernel warns once (primitives/notes.py)
    positions = check_positions(train.ids + val.ids, p.positions)
    require_writable(ctx.tensors, "ltv")  # a folder that cannot take the vector: an error now, not after training
    # theta's start is seeded by the seed *and* the task, so two tasks' vectors never share a starting point
    init_seed = int(hashlib.sha256(f"{p.seed}:{task.content_hash()}".encode()).hexdigest()[:12], 16)
    recipe = Recipe(lr=p.lr, epochs=p.epochs, patience=p.patience, weight_decay=p.weight_decay,
                    init_scale=p.init_scale, batch_size=p.batch_size, seed=p.seed, init_seed=init_seed)
    share = planned(ctx, p)  # the plan's stages (`work`): the residual scale, the training and its held-out checks
    if "residual scale" in share:
        ctx.progress(share["residual scale"][0], "residual scale")
    scale = ({l: residual_rms(lm, train, l, positions) for l in layers} if p.units == "residual"
             else {l: 1.0 for l in layers})
    per_epoch = p.train_prompts
    if len(train.ids) < per_epoch:
        ctx.warn(Note(f"an epoch draws {per_epoch} training prompts, cycling through the {len(train.ids)} there are"))
    total = p.epochs * math.ceil(per_epoch / p.batch_size)
    where = f"layer {layers[0]}" if len(layers) == 1 else f"layers {', '.join(map(str, layers))}"
    live: dict[str, Any] = {"kind": "ltv_vector", "layers": layers, "loss": [], "val_accuracy": [], "epoch": 0,
                            "epochs": p.epochs, "step": 0, "steps": total}
    last = [0.0]
    training = ctx.stage(*between(share, "LTV training"))

    def send(force: bool = False) -> None:
        now = time.perf_counter()
        if force or now - last[0] >= LIVE_EVERY_S:
            last[0] = now
            ctx.live({**live, "loss": list(live["loss"]), "val_accuracy": list(live["val_accuracy"])})

    def on_step(step: int, epoch: int, loss: float) -> None:
        live["loss"].append(loss)
        live.update(step=step, epoch=epoch)
        training(min(step / total, 1.0), f"training the LTV at {where}: epoch {epoch}/{p.epochs}, step {step}, "
                                         f"loss {loss:.3f}")
        send(step == 1)

    def on_epoch(epoch: int, acc: float, loss: float) -> None:
        live["val_accuracy"].append(acc)
        send(True)

    trained = train_injection(lm, layers, positions, train, val, recipe, on_step, on_epoch, scale=scale,
                              samples_per_epoch=per_epoch)
    theta = torch.stack([trained.vectors[l].float().cpu() for l in layers])
    recipe_meta = {"layers": layers, "positions": list(positions), "lr": p.lr, "epochs": p.epochs,
                   "patience": p.patience, "weight_decay": p.weight_decay, "init_scale": p.init_scale,
                   "batch_size": p.batch_size, "seed": p.seed, "units": p.units,
                   "scale": [scale[l] for l in layers], "samples_per_epoch": per_epoch,
                   "n_train": len(train.ids), "n_val": len(val.ids),
                   "best_epoch": trained.best_epoch, "objective": "CE of the gold first token, zero-shot prompts",
                   "site": "decoder layer input"}
    tid = save_tensors(ctx.tensors, {"theta": theta}, lm, "ltv", task_hash=task.content_hash(),
                       task_name=task.name, recipe=recipe_meta)
    ctx.progress(1.0, f"trained the LTV at {where}")
    return {"layers": layers, "positions": list(positions), "theta": theta.numpy(),
            "norm": [float(v.norm()) for v in theta], "loss": trained.loss, "val_accuracy": trained.val_accuracy,
            "val_loss": trained.val_loss, "init_val_accuracy": trained.init_val_accuracy,
            "best_epoch": trained.best_epoch, "epochs_run": trained.epochs_run, "stopped": trained.stopped,
            "train_seconds": trained.seconds, "n_train": len(train.ids), "n_val": len(val.ids),
            "recipe": recipe_meta, "tensor": tid, "d_model": lm.d_model, "multi_token_labels": multi}
