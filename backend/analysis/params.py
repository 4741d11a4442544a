"""The parameters of every analysis kind, as Pydantic models: defaults and bounds declared once.

The service validates a job's fields with them, the CLI builds its flags from them and validates its
arguments with them, the Python API and the pages fill them. Integers are strict (`true` is not 1), floats
finite, strings and lists bounded. `batch_size` changes speed, never results: it is not part of a cache key.
No torch here.
"""
from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, Strict, field_validator

from .. import options as o

Int = Annotated[int, Strict()]
Bool = Annotated[bool, Strict()]
Float = Annotated[float, Field(allow_inf_nan=False)]
Head = tuple[Int, Int]
Layer = Annotated[int, Strict(), Field(ge=0)]

ASSUMED_LAYERS = 32  # the work of a job on a model not loaded yet is estimated for a model this deep ...
ASSUMED_HEADS = 1024  # ... with this many heads in all
NOT_IN_KEY = frozenset({"batch_size"})
"""Fields that change how a result is computed but not the result."""


def _heads(v: list[tuple[int, int]]) -> list[tuple[int, int]]:
    if any(l < 0 or h < 0 for l, h in v):
        raise ValueError("layer and head indices must be non-negative")
    return sorted(set(v))


Heads = Annotated[list[Head], Field(max_length=o.MAX_LIST), AfterValidator(_heads)]
"""[[layer, head], ...], sorted and without repeats."""


class Params(BaseModel):
    """Base of every kind's parameters: unknown fields are refused, so a typo is an error, not a default."""

    model_config = ConfigDict(extra="forbid")

    def work(self, model: dict | None = None) -> tuple[int, str]:
        """An estimate of the job's work in prompt passes (one prompt through the model once), and how it was
        counted; `model` is the model's info when known (layers, heads), else a large model is assumed."""
        n = getattr(self, "prompts", 1)
        return n, f"{n} prompts"
    not_in_key: ClassVar[frozenset[str]] = NOT_IN_KEY
    """Fields left out of this kind's cache key (a kind whose `batch_size` changes its result keys it)."""


class PromptParams(Params):
    """How the prompts are built: `shots` demonstrations each, `prompts` held-out queries, `seed`."""

    shots: Int = Field(o.SHOTS, ge=0, description="demonstrations per prompt")
    prompts: Int = Field(o.PROMPTS, ge=1, description="held-out queries (prompts) scored")
    seed: Int = Field(o.SEED, ge=0, description="seed of the demonstration/query split and prompt sampling")
    batch_size: Int = Field(o.BATCH_SIZE, ge=1, le=1024, description="rows per forward pass (speed only)")


class Selection(Params):
    """How many top heads a head set holds: `top_k` when given, else the top `top_pct` percent (at least
    `MIN_TOP_HEADS`)."""

    top_pct: Float = Field(o.TOP_PCT, gt=0, le=100, description="top-head set size in percent of all heads")
    top_k: Int | None = Field(None, ge=1, le=o.MAX_LIST, description="top-head set size as a count (overrides top_pct)")


class ModelInfoParams(Params):
    """kind `model_info`: no parameters besides the model."""


class MapsParams(PromptParams):
    """kind `maps`: TR / TL / DLA / induction head maps and accuracies (no head selection)."""

    apply_ln: Bool = Field(False, description="scale head writes by the final norm's scale")

    def work(self, model: dict | None = None) -> tuple[int, str]:
        return 2 * self.prompts, f"{self.prompts} prompts x 2 (ICL, zero-shot)"


class ScoresParams(Selection, MapsParams):
    """kind `scores`: the head maps with top heads and overlaps (a new selection size reuses the cached maps)."""


class IclParams(Params):
    """kind `icl`: accuracy, label accuracy and TR ratio against the number of demonstrations."""

    shots: list[Int] = Field(default_factory=lambda: list(o.ICL_SHOTS), min_length=1, max_length=33)
    prompts: Int = Field(o.ICL_PROMPTS, ge=1)
    seed: Int = Field(o.SEED, ge=0)
    examples: Int = Field(o.EXAMPLES, ge=0, le=50, description="example rows (prompt, gold, prediction) kept per k")
    batch_size: Int = Field(o.BATCH_SIZE, ge=1, le=1024)

    @field_validator("shots")
    @classmethod
    def _shots(cls, v: list[int]) -> list[int]:
        if any(k < 0 for k in v):
            raise ValueError("shots must be non-negative")
        return sorted(set(v))

    def work(self, model: dict | None = None) -> tuple[int, str]:
        return self.prompts * len(self.shots), f"{self.prompts} prompts x {len(self.shots)} values of k"


class AblationCurvesParams(PromptParams):
    """kind `ablation_curves`: accuracy, label accuracy and TR ratio against k, the number of top heads ablated."""

    orders: list[o.Order] = Field(default_factory=lambda: list(o.ORDERS), min_length=1)
    ks: list[Int] = Field(default_factory=lambda: list(o.ABLATION_KS), min_length=1, max_length=64)
    mode: o.Mode = "zero"
    positions: o.Positions = "all"
    random_seeds: list[Int] = Field(default_factory=lambda: list(o.RANDOM_SEEDS), min_length=1, max_length=16)
    batch_size: Int = Field(o.SWEEP_BATCH_SIZE, ge=1, le=1024)

    @field_validator("orders")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        return list(dict.fromkeys(v))

    @field_validator("ks")
    @classmethod
    def _ks(cls, v: list[int]) -> list[int]:
        if any(k < 0 for k in v):
            raise ValueError("ks must be non-negative")
        return sorted(set(v))

    def work(self, model: dict | None = None) -> tuple[int, str]:
        rankings = len([o for o in self.orders if o != "random"]) + (len(self.random_seeds) if "random" in self.orders
                                                                      else 0)
        n = self.prompts * (rankings * len(self.ks) + 2)
        return n, (f"{self.prompts} prompts x ({rankings} rankings x {len(self.ks)} values of k + 2 for the head "
                   f"scores)")


class AblateParams(PromptParams):
    """kind `ablate`: ablate one head set; metrics and per-prompt rows before and after."""

    def work(self, model: dict | None = None) -> tuple[int, str]:
        return 2 * self.prompts, f"{self.prompts} prompts x 2 (before, after)"

    heads: Heads = Field(..., description="[[layer, head], ...]")
    mode: o.Mode = "zero"
    positions: o.Positions = "all"
    batch_size: Int = Field(o.SWEEP_BATCH_SIZE, ge=1, le=1024)


class VectorsParams(Selection, PromptParams):
    """kind `vectors`: task vectors extracted from ICL prompts (head sets, function vector, vanilla)."""

    types: list[o.VectorType] = Field(default_factory=lambda: list(o.VECTOR_TYPES), min_length=1)
    heads: Heads | None = Field(None, description="also a vector of this head set")

    @field_validator("types")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        return list(dict.fromkeys(v))

    def work(self, model: dict | None = None) -> tuple[int, str]:
        heads = model["n_layers"] * model["n_heads"] if model else ASSUMED_HEADS
        n, why = 4 * self.prompts, f"{self.prompts} prompts x 4 (head scores, head means, vanilla)"
        if "fv" in self.types:
            fv = min(self.prompts, o.FV_PROMPTS) * (heads + 1)
            n, why = n + fv, why + f" + {min(self.prompts, o.FV_PROMPTS)} prompts x {heads + 1} head patches (FV)"
        return n, why


class SteerParams(Selection, PromptParams):
    """kind `steer`: zero-shot prompts with alpha * v added at a layer (or every layer), per vector type."""

    vectors: list[o.VectorType] = Field(default_factory=lambda: list(o.VECTOR_TYPES), min_length=1)
    layer: Layer | Literal["all"] | None = Field(None, description="decoder layer (output); None = L/2; `all` sweeps")
    alpha: Float = Field(1.0, ge=-100, le=100)
    heads: Heads | None = Field(None, description="an extra user head set")
    batch_size: Int = Field(o.SWEEP_BATCH_SIZE, ge=1, le=1024)

    @field_validator("vectors")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        return list(dict.fromkeys(v))

    def work(self, model: dict | None = None) -> tuple[int, str]:
        layers = (model["n_layers"] if model else ASSUMED_LAYERS) if self.layer == "all" else 1
        built, why = VectorsParams(types=self.vectors, shots=self.shots, prompts=self.prompts).work(model)
        n = built + self.prompts * (2 + len(self.vectors) * layers)
        return n, f"{why} + {self.prompts} prompts x ({len(self.vectors)} vectors x {layers} layers + 2 references)"


class GeometryParams(Selection, PromptParams):
    """kind `geometry`: per-layer alignment, logit difference and rotation for five conditions, and PCA."""

    layer: Layer | None = Field(None, description="injection layer of the steered conditions; None = L/2")
    alpha: Float = Field(1.0, ge=-100, le=100)
    final_norm: Bool = Field(True, description="measure the states after the final norm (as the unembedding reads "
                                                "them: the logit difference is in logits); false: the raw residual")
    pca_layer: Layer | None = Field(None, description="layer of the PCA view; None = the last")

    def work(self, model: dict | None = None) -> tuple[int, str]:
        built, why = VectorsParams(types=["tr", "tl", "random"], shots=self.shots, prompts=self.prompts).work(model)
        return built + 5 * self.prompts, f"{why} + {self.prompts} prompts x 5 conditions"


class PerturbParams(Selection, PromptParams):
    """kind `perturb`: ICL metrics, TR/TL maps and ablation effects under demonstration perturbations."""

    perturbations: list[o.Perturbation] = Field(default_factory=lambda: list(o.PERTURBATIONS), min_length=1)

    @field_validator("perturbations")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        return list(dict.fromkeys(v))

    def work(self, model: dict | None = None) -> tuple[int, str]:
        per = len(self.perturbations)
        return self.prompts * (6 + 5 * per), (f"{self.prompts} prompts x (6 + 5 x {per} perturbations: maps and "
                                             f"4 ablation configurations each)")


class FitParams(Params):
    """kind `fit`: does the task fit the model (unknown tokens in inputs and labels, prompt length)?"""

    shots: Int = Field(o.SHOTS, ge=0, description="demonstrations per prompt (for the prompt length)")
    seed: Int = Field(o.SEED, ge=0)


class HeadParams(PromptParams):
    """kind `head`: one head on one prompt (a task prompt, or `text`): its attention pattern, its write onto
    each label's unembedding, its TR / TL / induction ranks, its effect when zero-ablated; the model's top next
    tokens, optionally per layer (logit lens)."""

    head: Head = Field(..., description="[layer, head]")
    prompt: Int = Field(0, ge=0, description="which of the task's prompts (0-based)")
    text: str | None = Field(None, min_length=1, max_length=o.MAX_TEXT * 8,
                             description="your own prompt instead of a task prompt (ends right before the answer)")
    labels: list[Annotated[str, Field(min_length=1, max_length=200)]] | None = Field(
        None, max_length=64, description="candidate answers as they continue the prompt (e.g. ' pos'); default: "
                                         "the task prompt's labels")
    top_tokens: Int = Field(o.HEAD_TOP_TOKENS, ge=1, le=50)
    logit_lens: Bool = Field(False, description="top tokens after every layer (final norm + unembedding)")
    ranks: Bool = Field(True, description="the head's TR / TL ranks on the task (from the cached `scores`)")

    @field_validator("head")
    @classmethod
    def _head(cls, v: tuple[int, int]) -> tuple[int, int]:
        if v[0] < 0 or v[1] < 0:
            raise ValueError("layer and head indices must be non-negative")
        return v


# -- learned task vectors -----------------------------------------------------------------------------------
Offset = Annotated[int, Strict(), Field(lt=0, ge=-4096)]


class LtvRecipeParams(Params):
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

    def training_work(self) -> tuple[int, str]:
        """One training: a forward and backward pass (~3 passes) per training prompt and epoch, the held-out
        prompts after each epoch, and the residual scale's pass."""
        n = 3 * self.epochs * self.train_prompts + self.epochs * self.val_prompts + self.train_prompts
        return n, f"{self.epochs} epochs x ({self.train_prompts} training prompts x 3 + {self.val_prompts} held out)"


class LtvTrainParams(LtvRecipeParams):
    """kind `ltv_train`: train one learned task vector (several layers: one theta each, trained together)."""

    layer: Layer | list[Layer] | None = Field(None, description="decoder layer whose input theta is added to; "
                                                                "None = L/2; a list: one theta per layer, jointly")

    def work(self, model: dict | None = None) -> tuple[int, str]:
        return self.training_work()


class LtvParams(Selection, LtvRecipeParams):
    """kind `ltv`: train LTVs and compare them, at each injection layer, with zero-shot, k-shot ICL, the vanilla
    task vector, the function vector and the TR / TL head-set vectors; LTV on top of ICL; and how it works
    (key heads, OV reconstruction, linear propagation)."""

    layer: Layer | list[Layer] | Literal["all"] | None = Field(
        None, description="injection layer (a decoder layer's input); None = L/2; `all` or a list: one LTV per "
                          "layer (the layer sweep), or one joint vector with `joint`")
    joint: Bool = Field(False, description="with several layers: one theta per layer trained together")
    shots: Int = Field(o.SHOTS, ge=0, description="demonstrations of the ICL conditions and extracted vectors")
    prompts: Int = Field(o.PROMPTS, ge=1, description="held-out queries scored (zero-shot prompts)")
    mechanism: Bool = Field(True, description="key heads, OV reconstruction and linear propagation per layer")
    key_pct: Float = Field(o.LTV_KEY_PCT, gt=0, le=100, description="key heads: top percent by saliency")
    random_draws: Int = Field(o.LTV_RANDOM_DRAWS, ge=1, le=100, description="random head sets ablated for contrast")
    perturbations: Int | None = Field(None, ge=2, le=16384, description="linear propagation: perturbed vectors "
                                                                        "(default 2 d_model, at most 1024)")
    load: str | None = Field(None, min_length=1, max_length=o.MAX_TEXT,
                             description="a saved LTV (.safetensors) to compare instead of training one")

    def work(self, model: dict | None = None) -> tuple[int, str]:
        L = model["n_layers"] if model else ASSUMED_LAYERS
        d = int(model.get("d_model", 4096)) if model else 4096
        layers = L if self.layer == "all" else len(self.layer) if isinstance(self.layer, list) else 1
        trainings = 0 if self.load else (1 if self.joint else layers)
        train, _ = self.training_work()
        built, _ = VectorsParams(types=["tr", "tl", "fv", "vanilla"], shots=self.shots, prompts=self.prompts,
                                 top_pct=self.top_pct, top_k=self.top_k).work(model)
        per_layer = 8 * self.prompts  # the conditions, LTV + ICL
        why = f"{trainings} trainings x {train} + vectors {built} + {layers} layers x ({self.prompts} prompts x 8"
        if self.mechanism and not self.joint:
            n_pert = self.perturbations or min(2 * d, o.LTV_MAX_PERTURBATIONS)
            per_layer += self.prompts * (3 + self.random_draws + 6 + n_pert + 2)
            why += f" + mechanism: {self.random_draws} random sets, {n_pert} perturbations"
        return trainings * train + built + layers * per_layer, why + ")"


class LtvTasksParams(Selection, LtvRecipeParams):
    """kind `ltv_tasks`: LTVs of several tasks at one layer: the comparison task by task (the paper's ordering),
    the cosine similarity of the vectors, and composition (the sum of two tasks' vectors on their composed task)."""

    tasks: list[Annotated[str, Field(min_length=1, max_length=200)]] | None = Field(
        None, max_length=64, description="built-in task names; None = the model's built-in tasks (the default "
                                         "model: its 10 synthetic classification and generation tasks)")
    layer: Layer | None = Field(None, description="injection layer; None = L/2")
    shots: Int = Field(o.SHOTS, ge=0)
    prompts: Int = Field(o.PROMPTS, ge=1)
    compose: Bool = Field(True, description="evaluate vector sums on the composed tasks the task language defines")

    def work(self, model: dict | None = None) -> tuple[int, str]:
        fields = {k: getattr(self, k) for k in LtvRecipeParams.model_fields}
        one, _ = LtvParams(**fields, layer=self.layer, shots=self.shots, prompts=self.prompts, top_pct=self.top_pct,
                           top_k=self.top_k, mechanism=False).work(model)
        n = len(self.tasks) if self.tasks else 10
        return n * one + (7 * 5 * self.prompts if self.compose else 0), f"{n} tasks x {one} (one LTV each)"


# -- soft head selection (SITE) ---------------------------------------------------------------------------------
SiteComparison = Literal["zero_shot", "icl", "fv", "vanilla", "all_ones", "ltv"]
SiteCorrelation = Literal["tr", "tl", "induction", "ltv"]


def _unique_ints(v: list[int]) -> list[int]:
    if any(k < 1 for k in v):
        raise ValueError("values must be at least 1")
    return sorted(set(v))


class SiteRecipeParams(PromptParams):
    """How soft head selection (SITE) trains: the task embedding t from `m` few-shot prompts of `shots`
    demonstrations (training split); per-head alphas = sigmoid(logits), logits from 0, Adam (`lr`) for `steps`
    steps of `train_batch` random zero-shot training prompts, validated every `val_every` steps on up to
    `val_prompts` held-out training queries (the best alphas kept); tested on `prompts` held-out queries."""

    m: Int = Field(o.SITE_M, ge=1, le=10_000, description="few-shot prompts averaged into the task embedding (M)")
    shots: Int = Field(o.SITE_SHOTS, ge=0, description="demonstrations in each of those prompts (N)")
    prompts: Int = Field(o.SITE_PROMPTS, ge=1, description="held-out test queries (zero-shot prompts)")
    steps: Int = Field(o.SITE_STEPS, ge=0, le=100_000, description="Adam steps on the alpha logits")
    lr: Float = Field(o.SITE_LR, gt=0, le=100, description="Adam learning rate")
    beta2: Float = Field(o.SITE_BETA2, ge=0, lt=1, description="Adam's second-moment decay (the reference's 0.999; a "
                                                               "lower one keeps the alphas moving once the loss is ~0)")
    train_batch: Int = Field(1, ge=1, le=1024, description="zero-shot training prompts per step")
    val_every: Int = Field(o.SITE_VAL_EVERY, ge=1, le=100_000, description="validate (and keep the best) every so "
                                                                           "many steps")
    val_prompts: Int = Field(o.SITE_VAL_PROMPTS, ge=1, le=100_000,
                             description="validation prompts (at most; held out of the training split)")
    max_new_tokens: Int = Field(o.SITE_MAX_NEW_TOKENS, ge=1, le=256, description="greedy generation length")

    def work(self, model: dict | None = None) -> tuple[int, str]:
        n = self.m + self.steps * self.train_batch + (self.steps // self.val_every + 1) * min(self.val_prompts, 500)
        return n + 4 * self.prompts, f"{self.m} embedding prompts, {self.steps} steps, validations, tests"


class SiteParams(SiteRecipeParams):
    """kind `site`: train SITE alphas (or load saved ones) and evaluate them zero-shot with generation; compare
    with zero-shot, k-shot ICL, the function and vanilla task vectors, every alpha = 1 and LTV; patch the top /
    bottom k heads by alpha; the alpha budget curve over M; rank correlations with the TR / TL / induction maps."""

    compare: list[SiteComparison] = Field(default_factory=lambda: ["zero_shot", "icl", "fv", "vanilla", "all_ones",
                                                                   "ltv"], max_length=6,
                                          description="baselines (empty: none); ltv only when its result is cached")
    icl_shots: list[Int] = Field(default_factory=lambda: list(o.SITE_ICL_SHOTS), max_length=8,
                                 description="demonstrations of the ICL baselines (those that fit)")
    patching: list[Int] = Field(default_factory=lambda: list(o.SITE_PATCH_KS), max_length=64,
                                description="k of the top-k / bottom-k patching curves (empty: none)")
    budget: list[Int] = Field(default_factory=lambda: list(o.SITE_BUDGET), max_length=16,
                              description="M values of the budget curve, each a SITE run (empty: none)")
    correlations: list[SiteCorrelation] = Field(default_factory=lambda: ["tr", "tl", "induction", "ltv"], max_length=4,
                                                description="maps to rank-correlate alpha with (ltv: when cached)")
    load: str | None = Field(None, min_length=1, max_length=o.MAX_TEXT,
                             description="a saved SITE file (.safetensors: alphas and task embedding) to evaluate "
                                         "instead of training")

    @field_validator("compare", "correlations")
    @classmethod
    def _unique_names(cls, v: list[str]) -> list[str]:
        return list(dict.fromkeys(v))

    @field_validator("icl_shots")
    @classmethod
    def _shots_list(cls, v: list[int]) -> list[int]:
        if any(k < 0 for k in v):
            raise ValueError("shots must be non-negative")
        return sorted(set(v))

    @field_validator("patching", "budget")
    @classmethod
    def _positive(cls, v: list[int]) -> list[int]:
        return _unique_ints(v)

    def work(self, model: dict | None = None) -> tuple[int, str]:
        n, _ = super().work(model)
        runs = 1 + len(self.budget)
        return n * runs + self.prompts * (len(self.compare) + 2 * len(self.patching)), \
            f"{runs} SITE run(s), {len(self.compare)} baselines, {2 * len(self.patching)} patchings"


class SiteTransferParams(SiteRecipeParams):
    """kind `site_transfer`: SITE alphas of each task applied to every task's embedding: an accuracy matrix."""

    tasks: list[Annotated[str, Field(min_length=1, max_length=200)]] | None = Field(
        None, max_length=64, description="built-in task names; None = the model's built-in example tasks (the "
                                         "default model: its 10 synthetic classification and generation tasks)")
    top_k: Int = Field(o.SITE_TRANSFER_TOP_K, ge=1, le=o.MAX_LIST,
                       description="also: only task A's top-k heads by alpha, injected outright (alpha = 1)")

    def work(self, model: dict | None = None) -> tuple[int, str]:
        n, _ = super().work(model)
        k = len(self.tasks) if self.tasks else 10
        return k * n + k * k * self.prompts, f"{k} SITE runs and {k * k} transfers"


class MethodsParams(Selection, PromptParams):
    """kind `methods`: every steering method on one task and model side by side: the extracted vectors (vanilla,
    function vector, TR / TL head sets, from `steer`), LTV (its cached result) and SITE; accuracy, TR ratio,
    parameter count and training seconds."""

    layer: Layer | None = Field(None, description="injection layer of the extracted vectors; None = L/2")
    site_m: Int = Field(o.SITE_M, ge=1, le=10_000, description="SITE: few-shot prompts of the task embedding")
    site_shots: Int = Field(o.SITE_SHOTS, ge=0, description="SITE: demonstrations per embedding prompt")
    site_steps: Int = Field(o.SITE_STEPS, ge=0, le=100_000, description="SITE: training steps")
    ltv: Bool = Field(False, description="train the LTV when no cached result is found (else it is left out)")
