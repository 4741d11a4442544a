"""The LTV training recipe, shared by the kinds that train a learned task vector (`ltv_vector`, `ltv_layers`, `ltv_across_tasks`):
its params (`LtvRecipeParams`) and what one training returns (`LtvTraining`). No torch here."""
from __future__ import annotations

from typing import Annotated, Any, ClassVar

from pydantic import Field, Strict, field_validator

from ..primitives import options as o
from ..params import BosParams, Float, Int
from ..primitives.cost import Cost, Shape, Sizes, Work, batches, passes, stage, steps, training
from ..results import Model, Vector


Offset = Annotated[int, Strict(), Field(lt=0, ge=-4096)]


class LtvRecipeParams(BosParams):
    """How a learned task vector (LTV) trains: theta ~ U(-init_scale, init_scale) (times r, see `units`) added at a
    decoder layer's input at `positions`, AdamW with linear decay, at most `epochs` epochs of `train_prompts`
    zero-shot prompts each, early stopping on the full-vocabulary accuracy of `val_prompts` held-out ones. Here
    `batch_size` is the training batch size: it changes the vector, so it is part of the cache key."""

    not_in_key: ClassVar[frozenset[str]] = frozenset()

    positions: list[Offset] = Field(default_factory=lambda: [-1], min_length=1, max_length=64,
                                    description="negative offsets from the last prompt token where theta is added "
                                                "(-1 = the last token)")
    lr: Float = Field(o.LTV_LR, gt=0, le=10, description="AdamW learning rate (decays linearly to 0)")
    epochs: Int = Field(o.LTV_EPOCHS, ge=1, le=1000, description="most passes over the training prompts")
    patience: Int = Field(o.LTV_PATIENCE, ge=1, le=1000, description="epochs without a better held-out accuracy "
                                                                     "before stopping")
    weight_decay: Float = Field(o.LTV_WEIGHT_DECAY, ge=0, le=10)
    init_scale: Float = Field(o.LTV_INIT_SCALE, ge=0, le=100, description="theta starts uniform in +-init_scale")
    train_prompts: Int = Field(o.LTV_TRAIN_PROMPTS, ge=1, le=100_000,
                               description="zero-shot training prompts per epoch (from the demonstration pool; "
                                           "a smaller pool is cycled through)")
    val_prompts: Int = Field(o.LTV_VAL_PROMPTS, ge=1, le=100_000,
                             description="held-out prompts for early stopping (at most; from the demonstration pool)")
    batch_size: Int = Field(o.LTV_BATCH_SIZE, ge=1, le=1024, description="training batch size (part of the result)")
    units: o.LtvUnits = Field(o.LTV_UNITS, description="residual: theta = r * phi, r the RMS of the residual stream "
                                                       "at the injection site, phi trained (lr and init_scale in "
                                                       "units of r); absolute: theta trained as is (the reference)")
    seed: Int = Field(o.SEED, ge=0, description="seed of the split, theta's initialisation and the prompt order")

    @field_validator("positions")
    @classmethod
    def _positions(cls, v: list[int]) -> list[int]:
        return sorted(set(v), reverse=True)

    @classmethod
    def recipe_changes(cls, params: dict) -> dict:
        """The recipe fields of a result's `params` that are off their defaults (they change the trained vector)."""
        defaults = LtvRecipeParams().model_dump(mode="json")
        return {k: params[k] for k in defaults if k in params and params[k] != defaults[k]}

    def training_work(self, sizes: Sizes, shape: Shape, layer: int | None = None) -> Work:
        """One training at `layer` (None: the middle one), at most: `epochs` epochs of `train_prompts` zero-shot
        prompts (forward and backward), the held-out prompts before and after each epoch, and the residual scale's
        pass (early stopping ends sooner). At the last token only (above the embeddings), each prompt's clean prefix
        runs once and every step is that one token from the layer on (`last_token.clean_prefixes`)."""
        t0, pool = sizes.prompt(0), sizes.pool
        n_val, n_train = self.val_prompts, self.train_prompts
        if pool is not None and pool < self.train_prompts + self.val_prompts:  # learn.training_split
            n_val = min(self.val_prompts, max(2, round(pool * 0.25)))
            n_train = max(min(self.train_prompts, pool - n_val), 1)
        L = max(shape.n_layers, 1)
        layer = L // 2 if layer is None else layer
        if tuple(self.positions) == (-1,) and layer >= 1:
            share = max(L - layer + 1, 1) / L  # the layers a step runs: the layer's input is the output of layer - 1
            rows, calls = self.epochs * self.train_prompts, self.epochs * batches(self.train_prompts, self.batch_size)
            w = passes("LTV training", n_train + n_val, t0, 32, logits=0)  # the prefixes, kept
            w = w + stage("LTV training", Cost(rows * share, rows * share, calls * share, calls * share, 3 * rows))
            w = w + steps("LTV held-out", n_val, max(self.batch_size, 16), self.epochs + 1, share)
        else:
            w = training("LTV training", self.train_prompts, t0, batch=self.batch_size) * self.epochs
            w = w + passes("LTV held-out", n_val, t0, repeat=self.epochs + 1)
        return w + passes("residual scale", n_train, t0) if self.units == "residual" else w


class LtvTraining(Model):
    """One trained learned task vector (LTV) and its training: theta (one row per injection layer) is added at
    the input of each layer of `layers`, at `positions` (negative offsets, -1 = the last prompt token)."""

    layers: list[int] = Field(..., description="decoder layers whose input theta is added to (one row each)")
    positions: list[int]
    theta: Vector = Field(..., description="(len(layers), d_model): the best epoch's vector per layer")
    norm: list[float] = Field(..., description="||theta|| per layer")
    loss: list[float] = Field(..., description="training loss per step (the batch's mean CE of the gold first token)")
    val_accuracy: list[float] = Field(..., description="held-out full-vocabulary accuracy after each epoch")
    val_loss: list[float]
    init_val_accuracy: float = Field(..., description="held-out accuracy of the initial (random) theta")
    best_epoch: int = Field(..., description="the epoch whose theta is kept (1-based; 0: the initial one)")
    epochs_run: int
    stopped: str = Field(..., description="early stopping | max epochs")
    train_seconds: float = Field(..., description="time the training itself took (0 for a loaded vector)")
    n_train: int
    n_val: int
    recipe: dict[str, Any] = Field(default_factory=dict)
    tensor: str = Field(..., description="id of the saved safetensors file holding theta and its metadata (GET "
                                         "/tensors/{id}; `ltv`'s `load` takes it)")
