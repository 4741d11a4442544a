"""What every analysis kind returns, as Pydantic models: the shapes the service, the UI and notebooks share.

Every result carries the envelope `Result` (model, task, the requested params, warnings, cache_hit,
seconds). Head maps are `Grid`s: numpy arrays of shape (layers, heads) in Python, nested lists in JSON.
Values read back from the cache are validated against these models; one that does not fit is recomputed.
No torch here.
"""
from __future__ import annotations

from typing import Annotated, Any

import numpy as np
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, WithJsonSchema

Head = tuple[int, int]


def _array(v: Any) -> np.ndarray:
    a = np.asarray(v, dtype=np.float64)
    if a.dtype == object:
        raise ValueError("not a rectangular array of numbers")
    return a


def _grid(v: Any) -> np.ndarray:
    a = _array(v)
    if a.ndim != 2:
        raise ValueError(f"expected a (layers, heads) grid, got shape {a.shape}")
    return a


Grid = Annotated[np.ndarray, BeforeValidator(_grid), PlainSerializer(lambda a: a.tolist(), return_type=list),
                 WithJsonSchema({"type": "array", "items": {"type": "array", "items": {"type": "number"}},
                                 "description": "(layers, heads)"})]
"""A per-head map: numpy (layers, heads) in Python, a list of rows in JSON."""
Vector = Annotated[np.ndarray, BeforeValidator(_array), PlainSerializer(lambda a: a.tolist(), return_type=list),
                   WithJsonSchema({"type": "array", "description": "(d_model,) or (layers, d_model)"})]
"""A vector (d_model,) or one per layer (layers, d_model)."""


class Model(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True, extra="ignore")


class Result(Model):
    """The envelope of every result."""

    model: str | None = Field(None, description="the model's name as loaded")
    task: str | None = Field(None, description="the task's name")
    params: dict[str, Any] = Field(default_factory=dict, description="the requested parameters")
    warnings: list[str] = Field(default_factory=list, description="what makes a number mean less than it says")
    notes: list[str] = Field(default_factory=list, description="how the request was fitted to the task (e.g. a "
                                                                "default training set cycled through a small task)")
    multi_token_labels: list[str] = Field(default_factory=list, description="labels that span several tokens "
                                                                              "(scored by their first)")
    absent_inputs: list[dict[str, Any]] = Field(default_factory=list, exclude=True,
                                                description="other kinds' cached results looked for and not found "
                                                            "(the kernel recomputes this one once they are cached)")
    cache_hit: bool = False
    seconds: float = Field(0.0, description="time this request took (a cache hit: the read)")

    def to_json(self) -> dict[str, Any]:
        """JSON-able dict (numpy arrays as lists)."""
        return self.model_dump(mode="json")


class Metrics(Model):
    """Prompt-level outcomes.

    accuracy: the full-vocabulary argmax is the gold answer's first token (what the model would answer).
    label_accuracy: the argmax within the prompt's label set is the gold one (for generation tasks the label
        set is the prompt's candidates: the gold, the demonstrations' outputs and padding words: a weaker measure).
    tr_ratio: the full-vocabulary argmax is one of the label set's first tokens.
    """

    accuracy: float
    label_accuracy: float
    tr_ratio: float
    n: int = 0


class Overlap(Model):
    jaccard: float
    spearman: float | None = None
    kendall: float | None = None


# -- model_info --------------------------------------------------------------------------------------------
class ModelInfoResult(Result):
    name: str
    family: str
    model_type: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_model: int
    max_positions: int | None = None
    device: str
    dtype: str
    fingerprint: str


# -- scores ---------------------------------------------------------------------------------------------------
class MapsResult(Result):
    """TSLA head maps (layers, heads), means over the prompts, with the prompt-level metrics."""

    n_layers: int
    n_heads: int
    shots: int = Field(..., description="demonstrations used (fewer than asked when the context is short)")
    prompts: int = Field(..., description="prompts scored")
    tr: Grid
    tl: Grid
    dla_tr: Grid
    dla_tl: Grid
    induction: Grid
    flagged: Grid = Field(..., description="share of prompts where a head's TR was zero (TL set to 0)")
    icl: Metrics
    zero_shot: Metrics | None = None
    multi_token_labels: list[str] = Field(default_factory=list)


class ScoresResult(MapsResult):
    """The head maps with the top heads by TR and TL, a random set of the same size, and overlaps."""

    top_k: int = Field(..., description="size of the top-head sets")
    top_tr: list[Head]
    top_tl: list[Head]
    random_heads: list[Head]
    overlap: dict[str, Overlap]


# -- icl ---------------------------------------------------------------------------------------------------------
class ExampleRow(Model):
    prompt: str
    query: str
    gold: str
    pred: str
    pred_token: str
    correct: bool
    label_correct: bool
    in_labels: bool
    gold_prob: float


class IclResult(Result):
    shots: list[int] = Field(..., description="demonstrations used per point")
    accuracy: list[float]
    label_accuracy: list[float]
    tr_ratio: list[float]
    prompts: int
    examples: list[list[ExampleRow]] = Field(default_factory=list)


# -- ablation -----------------------------------------------------------------------------------------------------
class Curve(Model):
    accuracy: list[float]
    label_accuracy: list[float]
    tr_ratio: list[float]
    heads: list[Head] = Field(default_factory=list, description="the ranked heads (random: the first seed's)")
    accuracy_std: list[float] | None = None
    label_accuracy_std: list[float] | None = None
    tr_ratio_std: list[float] | None = None
    seeds: list[int] | None = None


class AblationCurvesResult(Result):
    ks: list[int]
    mode: str
    positions: str
    shots: int
    prompts: int
    curves: dict[str, Curve]
    n_configs: int


class AblateRow(Model):
    prompt: str
    query: str
    gold: str
    pred_before: str
    pred_after: str
    correct_before: bool
    correct_after: bool
    label_correct_before: bool
    label_correct_after: bool
    gold_prob_before: float
    gold_prob_after: float


class AblateResult(Result):
    heads: list[Head]
    mode: str
    positions: str
    shots: int
    prompts: int
    before: Metrics
    after: Metrics
    rows: list[AblateRow]


# -- vectors and steering -------------------------------------------------------------------------------------------
class VectorEntry(Model):
    vector: Vector
    heads: list[Head] = Field(default_factory=list)


class VectorsResult(Result):
    d_model: int
    shots: int
    vectors: dict[str, VectorEntry]


class SteerVector(Model):
    """Metrics per injection layer (lists over `layers`), the head set and the vector's norm per layer."""

    accuracy: list[float]
    label_accuracy: list[float]
    tr_ratio: list[float]
    heads: list[Head] = Field(default_factory=list)
    norm: list[float]


class SteerResult(Result):
    layers: list[int]
    alpha: float
    shots: int
    prompts: int
    zero_shot: Metrics
    icl: Metrics
    vectors: dict[str, SteerVector]


# -- geometry --------------------------------------------------------------------------------------------------------
class MeanStd(Model):
    mean: list[float]
    std: list[float]


class PcaView(Model):
    points: dict[str, list[list[float]]]
    explained_variance_ratio: list[float]
    label_directions: dict[str, list[float]]
    gold: list[str]
    layer: int


class GeometryResult(Result):
    layers: list[int]
    inject_layer: int
    alpha: float
    final_norm: bool
    shots: int
    prompts: int
    conditions: dict[str, dict[str, MeanStd]]
    pca: PcaView
    vector_heads: dict[str, list[Head]]


# -- perturbations ----------------------------------------------------------------------------------------------------
class PerturbEntry(Model):
    skipped: str | None = None
    icl: Metrics | None = None
    tr: Grid | None = None
    tl: Grid | None = None
    tr_diff: Grid | None = None
    tl_diff: Grid | None = None
    ablation: dict[str, Metrics] | None = None
    example: str | None = None


class PerturbResult(Result):
    top_k: int
    shots: int
    prompts: int
    heads: dict[str, list[Head]]
    perturbations: dict[str, PerturbEntry]


# -- fit ---------------------------------------------------------------------------------------------------------------
class ContextFit(Model):
    longest_prompt: int = Field(..., description="tokens of the longest of a few prompts at `shots`")
    context_window: int | None = None
    shots: int
    shots_that_fit: int = Field(..., description="most demonstrations whose prompts fit (-1: not even zero-shot)")


class FitResult(Result):
    """Does the task fit the model: unknown-token shares (0..1), prompt length, and a verdict with its reasons."""

    verdict: str = Field(..., description="ok | warn | refuse")
    messages: list[str] = Field(default_factory=list)
    has_unknown_token: bool
    n_inputs: int
    n_labels: int
    unknown_inputs: float = Field(..., description="share of inputs with at least one unknown token")
    unknown_input_tokens: float = Field(..., description="share of the inputs' tokens that are unknown")
    unknown_labels: float
    unknown_template: float
    unknown_words: list[str] = Field(default_factory=list)
    unknown_label_words: list[str] = Field(default_factory=list)
    context: ContextFit | None = None
    perturbations: dict[str, str | None] = Field(default_factory=dict, description="perturbation -> None when "
                                                 "it can run on this model and task, else why not")


# -- head ----------------------------------------------------------------------------------------------------------------
class TokenProb(Model):
    token: str
    id: int
    prob: float
    logit: float | None = None


class HeadAblation(Model):
    """The prompt with the head zero-ablated (at every position)."""

    pred: str
    gold_prob: float | None = None
    label_probs: list[float]
    top: list[TokenProb]
    top_probs: list[float] = Field(default_factory=list, description="the probability, after ablation, of each "
                                                                     "token of the unablated `top` list")


class HeadResult(Result):
    layer: int
    head: int
    prompt_index: int | None = Field(None, description="the task prompt shown (None: your own text)")
    text: str
    tokens: list[str] = Field(..., description="the prompt's tokens, decoded one by one")
    attention: list[list[float]] = Field(..., description="attention of the head: rows = destination tokens "
                                                          "(`attention_rows`), columns = source tokens")
    attention_rows: list[int]
    query: str | None = None
    gold: str | None = None
    labels: list[str]
    label_dla: list[float] = Field(..., description="the head's last-token write dotted with each label's "
                                                    "unembedding row (first token)")
    label_probs: list[float]
    write_norm: float
    tr: float = Field(..., description="this prompt: ||P o|| over the labels")
    tl: float | None = Field(None, description="this prompt (needs a gold label)")
    ranks: dict[str, int] = Field(default_factory=dict, description="rank of the head on the task (1 = largest): "
                                                                    "tr, tl, induction")
    induction: float
    top: list[TokenProb]
    pred: str
    gold_prob: float | None = None
    ablated: HeadAblation
    logit_lens: list[list[TokenProb]] | None = None
    shots: int


# -- learned task vectors ------------------------------------------------------------------------------------------------
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
    vector_path: str | None = Field(None, description="the safetensors file holding theta and its metadata")


class LtvTrainResult(Result, LtvTraining):
    """kind `ltv_train`: one trained LTV."""

    d_model: int
    multi_token_labels: list[str] = Field(default_factory=list)


class MetricCurve(Model):
    """accuracy, label_accuracy and TR ratio along the layer sweep (one value per layer of `LtvResult.layers`)."""

    accuracy: list[float]
    label_accuracy: list[float]
    tr_ratio: list[float]


class KeyHeads(Model):
    """Saliency |a . dp(gold)/da| of each head's last-token output under the LTV, and what ablating the top heads
    (zero, last token, LTV injected) costs against as many random heads."""

    saliency: Grid = Field(..., description="(layers, heads), mean over the scored prompts")
    heads: list[Head] = Field(..., description="the key heads: top `key_pct` percent by saliency, best first")
    ltv: Metrics = Field(..., description="LTV, nothing ablated")
    ablated: Metrics = Field(..., description="LTV with the key heads ablated")
    random: list[Metrics] = Field(..., description="LTV with as many random heads ablated, one per draw")
    random_heads: list[list[Head]]
    random_accuracy_mean: float
    random_accuracy_std: float
    gold_prob: dict[str, float] = Field(default_factory=dict, description="mean probability of the gold first token: "
                                                                          "ltv, ablated, random (mean of the draws)")
    overlap: dict[str, Overlap] = Field(default_factory=dict, description="with the tr, tl and induction rankings: "
                                                                          "top-k Jaccard and rank correlations")


class OvReconstruction(Model):
    """r = sum over heads of layers >= the injection layer of A(last -> theta's positions) * W_O W_V theta (through
    the layer's input norm, linearised), mean over prompts; injected instead of theta."""

    heads: Grid = Field(..., description="(layers, heads): norm of each head's mean OV write of theta")
    norm: float = Field(..., description="||r||")
    cosine: float = Field(..., description="cos(r, theta)")
    final: Metrics = Field(..., description="r added to the last layer's output (last token) instead of theta")
    same_layer: Metrics = Field(..., description="r added where theta was (the layer's input, last token)")
    direct: Metrics = Field(..., description="theta itself added to the last layer's output: its residual path alone")
    direct_and_ov: Metrics = Field(..., description="theta + r added to the last layer's output: the residual path and "
                                                    "the heads' OV writes, without MLPs or attention-pattern changes")


class Propagation(Model):
    """The linear surrogate W (final hidden-state change ~ W theta), fitted on perturbed thetas; W = Q S."""

    rotation: float = Field(..., description="cos(theta, Q theta)")
    stretch: float = Field(..., description="||S theta|| / ||theta||")
    r2: float = Field(..., description="share of the final-state changes' variance that W explains")
    n: int = Field(..., description="perturbed vectors fitted")
    surrogate: Metrics = Field(..., description="zero-shot prompts with W theta added to the final hidden state")
    recovered: float | None = Field(None, description="(surrogate - zero-shot) / (LTV - zero-shot) accuracy; None "
                                                      "when the LTV does not beat zero-shot")


class LtvLayer(Model):
    """Everything at one injection layer (or one joint multi-layer vector)."""

    layers: list[int]
    conditions: dict[str, Metrics] = Field(..., description="zero_shot, icl, vanilla, fv, tr, tl, ltv, ltv+icl "
                                                            "(those available)")
    training: LtvTraining
    key_heads: KeyHeads | None = None
    ov: OvReconstruction | None = None
    propagation: Propagation | None = None


class LtvResult(Result):
    """kind `ltv`: learned task vectors compared with zero-shot, ICL and extracted vectors, and how they work.

    `table` is the comparison at `layer`; `sweep` the same conditions at every layer of `layers`; the extracted
    vectors (vanilla, fv, tr, tl) are added at the last token, the LTV at `positions`. Conditions:
    zero_shot, icl (k-shot prompts), vanilla (mean ICL - zero-shot hidden state at the layer's input), fv
    (function vector), tr / tl (top-TR / top-TL head-set vectors), ltv, ltv+icl (LTV on top of the ICL prompt).
    """

    n_layers: int
    n_heads: int
    d_model: int
    layers: list[int] = Field(..., description="the injection layers of the sweep (a joint vector: its layers)")
    layer: int = Field(..., description="the table's layer (L/2 when swept)")
    joint: bool
    positions: list[int]
    shots: int
    prompts: int
    conditions: list[str] = Field(..., description="condition names, in display order")
    table: dict[str, Metrics]
    sweep: dict[str, MetricCurve]
    rotation: list[float | None] = Field(..., description="per layer of `layers`: cos(theta, Q theta)")
    stretch: list[float | None] = Field(..., description="per layer of `layers`: ||S theta|| / ||theta||")
    per_layer: list[LtvLayer]
    vector_path: str | None = Field(None, description="the table's LTV file")
    heads: dict[str, list[Head]] = Field(default_factory=dict, description="head sets of the fv, tr and tl vectors")
    multi_token_labels: list[str] = Field(default_factory=list)


class Composition(Model):
    """theta_a + theta_b on the composed task x -> b(a(x)), zero-shot."""

    a: str
    b: str
    task: str = Field(..., description="the composed task")
    zero_shot: Metrics
    icl: Metrics = Field(..., description="k-shot prompts of the composed task (can the model compose at all?)")
    a_only: Metrics
    b_only: Metrics
    sum: Metrics


class LtvTasksResult(Result):
    """kind `ltv_tasks`: LTVs of several tasks at one layer."""

    layer: int
    tasks: list[str]
    kinds: dict[str, str] = Field(..., description="task -> classification | generation")
    label_spaces: dict[str, str] = Field(..., description="task -> a name of its label space (tasks that share one "
                                                          "have the same name)")
    conditions: list[str]
    table: dict[str, dict[str, Metrics]] = Field(..., description="task -> condition -> metrics")
    mean: dict[str, float] = Field(..., description="condition -> accuracy, mean over the tasks")
    ordering: dict[str, str] = Field(..., description="task -> the order of ltv, vanilla and fv accuracy")
    ltv_beats_vanilla: dict[str, list[str]] = Field(..., description="task kind -> tasks where LTV's accuracy is "
                                                                     "above the vanilla task vector's")
    paper: dict[str, Any] = Field(..., description="the paper's anchor (Llama-3.1-8B, layer 16, mean accuracy %)")
    similarity: list[list[float]] = Field(..., description="cosine similarity of the tasks' LTVs (tasks x tasks)")
    within_space: float | None = Field(None, description="mean similarity of tasks sharing a label space")
    across_spaces: float | None = Field(None, description="mean similarity of tasks with different label spaces")
    within_kind: dict[str, float | None] = Field(default_factory=dict, description="mean similarity of pairs of "
                                                                                  "classification / generation tasks")
    across_kinds: float | None = Field(None, description="mean similarity of classification-generation pairs")
    compositions: list[Composition] = Field(default_factory=list)
    vector_paths: dict[str, str | None] = Field(default_factory=dict)


# -- soft head selection (SITE) ------------------------------------------------------------------------------------------
class GenMetrics(Metrics):
    """Metrics of greedy generation: the first-token ones (from the prefill's logits) and two answer matches of
    the continuation cut at the task's separator or a newline."""

    exact_match: float | None = Field(None, description="the cut continuation begins with the gold answer, ending "
                                                        "at a word boundary (the reference's rule)")
    strict_match: float | None = Field(None, description="the cut continuation is exactly the gold answer (the "
                                                         "model also ended it)")


class SiteRow(Model):
    query: str
    gold: str
    output: str = Field(..., description="the continuation, cut at the separator or a newline")
    correct: bool = Field(..., description="first token right")
    exact: bool


class ValPoint(Model):
    step: int
    loss: float = Field(..., description="mean cross-entropy of the gold first token on the validation prompts")
    accuracy: float


class SiteBaseline(Model):
    """One row of the comparison table."""

    label: str
    metrics: GenMetrics | None = None
    params: int | None = Field(None, description="numbers that define the method (trained or extracted)")
    trainable: int = Field(0, description="trained parameters")
    seconds: float | None = Field(None, description="training seconds (trained methods)")
    note: str = ""


class PatchCurve(Model):
    accuracy: list[float]
    label_accuracy: list[float]
    tr_ratio: list[float]
    heads: list[Head] = Field(default_factory=list, description="the ranking walked (largest k's set)")


class SitePatching(Model):
    """Zero-shot prompts with t injected outright (alpha = 1) at the top-k or bottom-k heads by alpha only."""

    ks: list[int]
    top: PatchCurve
    bottom: PatchCurve


class SiteBudget(Model):
    """SITE trained with M few-shot prompts in the task embedding, per M."""

    m: list[int]
    accuracy: list[float]
    exact_match: list[float]
    tr_ratio: list[float]
    decided: list[float] = Field(..., description="share of alphas under 0.1 or over 0.9")
    train_seconds: list[float]


class SiteResult(Result):
    """kind `site`: soft head selection (SITE) on one task."""

    n_layers: int
    n_heads: int
    head_dim: int
    m: int = Field(..., description="few-shot prompts averaged into the task embedding")
    shots: int = Field(..., description="demonstrations per embedding prompt (fewer than asked when the task or "
                                        "the context is short)")
    steps: int
    prompts: int = Field(..., description="held-out test prompts")
    n_train: int = Field(..., description="zero-shot training queries")
    n_val: int = Field(..., description="validation queries")
    alpha: Grid = Field(..., description="(layers, heads) sigmoid of the kept logits")
    alpha_logits: Grid
    decisive: dict[str, float] = Field(..., description="low: share of alpha < 0.1, high: > 0.9, decided: both; "
                                                        "decided_2x: under 0.2 or over 0.8")
    loss: list[float] = Field(default_factory=list, description="training loss per step")
    val: list[ValPoint] = Field(default_factory=list)
    best_step: int = Field(0, description="the validation step whose alphas are kept (0: the initial ones)")
    site: GenMetrics = Field(..., description="zero-shot prompts with the soft injection (the test set)")
    site_hard: GenMetrics = Field(..., description="the same with the alphas rounded to 0 / 1 at 0.5")
    baselines: dict[str, SiteBaseline] = Field(default_factory=dict, description="zero_shot, icl_<k>, fv, vanilla, "
                                                                                 "all_ones, ltv (those asked for)")
    params_count: dict[str, int] = Field(..., description="site: layers x heads; lora: rank-8 LoRA on q and v")
    patching: SitePatching | None = None
    budget: SiteBudget | None = None
    correlations: dict[str, Overlap] = Field(default_factory=dict, description="alpha against the tr, tl, induction "
                                                                               "and LTV key-head saliency maps")
    train_seconds: float = Field(..., description="the training loop (0 for loaded alphas)")
    embed_seconds: float = Field(..., description="building the task embedding")
    path: str | None = Field(None, description="the safetensors file with the alphas and the task embedding")
    loaded: bool = False
    stop: list[str] = Field(default_factory=list, description="where a generated answer is cut")
    examples: list[SiteRow] = Field(default_factory=list)
    multi_token_labels: list[str] = Field(default_factory=list)


class SiteTransferResult(Result):
    """kind `site_transfer`: task A's alphas with task B's task embedding, on B's test prompts."""

    tasks: list[str]
    kinds: dict[str, str]
    accuracy: list[list[float]] = Field(..., description="[A][B]: first-token accuracy on B with A's alphas, B's t")
    tr_ratio: list[list[float]]
    zero_shot: list[float] = Field(..., description="per B, no injection")
    all_ones: list[float] = Field(..., description="per B, every alpha = 1 with B's t")
    top_k: int = Field(0, description="heads of the sparse transfer")
    accuracy_top_k: list[list[float]] = Field(default_factory=list, description="[A][B]: only A's top-k heads by "
                                                                                "alpha, alpha = 1, B's t, on B")
    alpha_spearman: list[list[float | None]] = Field(..., description="rank correlation of the alpha maps")
    head_jaccard: list[list[float]] = Field(..., description="overlap of the heads with alpha > 0.5")
    summary: dict[str, float | None] = Field(default_factory=dict)
    paths: dict[str, str | None] = Field(default_factory=dict)


class MethodRow(Model):
    key: str
    name: str
    family: str = Field(..., description="reference | extracted | trained")
    accuracy: float | None = None
    label_accuracy: float | None = None
    tr_ratio: float | None = None
    exact_match: float | None = None
    params: int | None = Field(None, description="numbers that define the method")
    trainable: int = 0
    train_seconds: float | None = None
    source: str = Field("", description="the analysis kind the numbers come from")
    note: str = ""


class MethodsResult(Result):
    """kind `methods`: every steering method on one task and model, side by side."""

    layer: int
    shots: int
    prompts: int
    rows: list[MethodRow]
    missing: list[str] = Field(default_factory=list, description="methods left out, and why")
