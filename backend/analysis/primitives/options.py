"""Every option list and default size, declared once (no torch here).

The params models (`backend.analysis.params`), the CLI, the service and the pages all read these.
"""
from __future__ import annotations

from typing import Literal

# -- option lists ----------------------------------------------------------------------------------------
MAPS = ("tr", "tl", "dla_tr", "dla_tl", "induction")
"""Per-head maps of the scores kind, each (layers, heads)."""
VECTOR_TYPES = ("tr", "tl", "random", "fv", "vanilla")
"""Extracted task vectors: top-TR / top-TL / random head sets, the function vector, the vanilla task vector."""
PERTURBATIONS = ("shuffled_inputs", "random_labels", "flipped_labels", "symbol_labels", "number_labels")
ORDERS = ("tr", "tl", "induction", "random")
"""Head rankings an ablation curve walks down."""
MODES = ("zero", "mean")
"""Ablation: replace a head's z by zeros, or by its mean over the task's prompts."""
POSITIONS = ("all", "last")
"""Where an ablation acts: every token, or the last prompt token only."""
GEOMETRY_CONDITIONS = ("zero_shot", "zero_shot+tr", "zero_shot+tl", "zero_shot+random", "icl")
PREPEND_BOS = ("tokenizer", "always")
"""Whether a prompt starts with the BOS token: the tokenizer's own choice (SmolLM2's adds none), or always
(TransformerLens's `prepend_bos=True`). See README "Conventions"."""
KEEP_ALPHA = ("best", "last")
"""SITE: keep the alpha of the best validation loss, or of the last validation (the reference's behaviour)."""

# Literal types of the same lists, for the params models (Literal[tuple] is Literal of its items)
VectorType = Literal[VECTOR_TYPES]  # type: ignore[valid-type]
Perturbation = Literal[PERTURBATIONS]  # type: ignore[valid-type]
Order = Literal[ORDERS]  # type: ignore[valid-type]
Mode = Literal[MODES]  # type: ignore[valid-type]
Positions = Literal[POSITIONS]  # type: ignore[valid-type]
LtvUnits = Literal["residual", "absolute"]
PrependBos = Literal[PREPEND_BOS]  # type: ignore[valid-type]
KeepAlpha = Literal[KEEP_ALPHA]  # type: ignore[valid-type]

# -- default sizes ---------------------------------------------------------------------------------------
SHOTS = 8
PROMPTS = 50
SEED = 0
PREPEND_BOS_DEFAULT = "tokenizer"
BATCH_SIZE = 16
CONFIG_BATCH_SIZE = 32
ICL_SHOTS = (0, 1, 2, 4, 8)
ICL_PROMPTS = 100
ABLATION_KS = (0, 1, 2, 4, 8)
RANDOM_SEEDS = (0, 1, 2)
TOP_PCT = 3.0
MIN_TOP_HEADS = 4
"""A top-p% head set never has fewer heads than this (unless the model has fewer); an explicit k is taken as is."""
EXAMPLES = 3
FV_PROMPTS = 25
"""Prompts the function vector's causal indirect effects are measured on (at most)."""
EXTRACTION_SEED_OFFSET = 1000
"""Vectors are built from prompts of seed + this, so they are not built from the evaluation prompts."""

FIT_REFUSE_UNKNOWN = 0.5
"""A task whose inputs' tokens are more than this share unknown to the model's tokenizer is refused (kind `task_fit`)."""
FIT_WARN_UNKNOWN = 0.05
"""Above this share of unknown tokens (inputs, template), `fit` warns."""
HEAD_TOP_TOKENS = 10
"""Top next tokens the `head` kind lists (and per layer, with the logit lens: at most 5)."""
HEAD_MAX_PATTERN = 256
"""Prompts up to this many tokens get a head's whole attention pattern; longer ones the last row only."""

# -- learned task vectors (kinds ltv_vector, ltv_layers, ltv_across_tasks) -----------------------------------------------------
LTV_LR = 5e-3
"""The reference implementation's learning rate (its released code); the paper's text says 1e-3 (`LTV_LR_PAPER`)."""
LTV_LR_PAPER = 1e-3
LTV_EPOCHS = 10
LTV_PATIENCE = 2
LTV_WEIGHT_DECAY = 0.01
LTV_INIT_SCALE = 0.1
"""theta starts uniform in (-LTV_INIT_SCALE, LTV_INIT_SCALE)."""
LTV_TRAIN_PROMPTS = 100
LTV_VAL_PROMPTS = 20
LTV_BATCH_SIZE = 4
"""Training batch size. The reference uses 1; on the CPU batch 4 trains ~4x faster (8.0 s against 32.3 s, median over
the default model's 10 tasks on a busy 2-core machine) at the same held-out accuracy (100% on all 10); batch 8 loses
some (98%, min 90%). See bench/bench_ltv.py and bench/RESULTS.md. Pass 1 for the reference recipe."""
LTV_UNITS = "residual"
"""theta = r * phi with r the residual stream's RMS at the injection site, phi trained by the recipe; `absolute`
trains theta itself (the reference implementation, whose numbers assume Llama's residual scale)."""
LTV_KEY_PCT = 10.0
"""Key heads: the top this percent of heads by saliency."""
LTV_RANDOM_DRAWS = 10
LTV_MAX_PERTURBATIONS = 1024
"""Linear propagation: perturbed vectors per layer (default 2 * d_model, at most this)."""
LTV_PAPER = {"model": "Llama-3.1-8B", "layer": 16, "position": "last token", "vanilla": 37.8, "fv": 37.3,
             "ltv": 83.5}
"""The paper's anchor: accuracy (%) at layer 16 of Llama-3.1-8B, mean over its tasks."""

# -- bounds every edge (service, CLI) applies through the params models --------------------------------------
MAX_TEXT = 1024
"""Longest model name, task id or other free-text field, in characters."""
MAX_LIST = 4096
"""Longest list field (heads, ks, ...)."""


# -- soft head selection (SITE, kinds `site`, `site_transfer`, `methods`) -------------------------------------
SITE_M = 50
"""Few-shot prompts averaged into the task embedding t (layers, heads, head_dim)."""
SITE_SHOTS = 10
"""Demonstrations in each of those prompts."""
SITE_STEPS = 400
SITE_LR = 0.2
SITE_BETA2 = 0.999
"""Adam's second-moment decay (PyTorch's default, as the reference). On a model whose loss reaches ~0 in a few
steps, it freezes the logits near +-2 (alpha ~0.12 / 0.88); 0.9 lets them move on to decided values."""
SITE_VAL_EVERY = 50
SITE_KEEP_ALPHA = "best"
"""The alpha kept after training: that of the best validation loss. The reference (SNU-DRL/Soft_Injection,
`utils.optimize_head_selection`) never updates its best loss, so it keeps the last validation's ("last")."""
SITE_VAL_PROMPTS = 100
"""Validation prompts asked for; a small task validates on what its training split can spare (SITE_VAL_SHARE)."""
SITE_VAL_SHARE = 0.3
"""At most this share of the training split's queries is held out of the gradient steps for validation."""
SITE_PROMPTS = 100
"""Held-out test queries (capped at the task's query pool, with a warning)."""
SITE_MAX_NEW_TOKENS = 20
SITE_ICL_SHOTS = (8, 10)
SITE_PATCH_KS = (1, 2, 4, 8, 16)
SITE_BUDGET = (1, 5, 10, 50)
SITE_TRANSFER_TOP_K = 4
"""Transfer: also inject only task A's top-k heads by alpha (soft alphas transfer almost everywhere on a small model)."""
SITE_DECISIVE = 0.1
"""An alpha under this or over 1 - this counts as decided."""
LORA_RANK = 8
"""The LoRA the parameter counts are compared with: rank 8 on the q and v projections."""
