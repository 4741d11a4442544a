"""Kind `geometry`: hidden-state geometry against the label subspace, per layer, and PCA views.

For a hidden state h (d_model,) at the last token, with the prompt's label rows U, P the projector onto
their span and t = U[y*] - mean_{c != y*} U[c] (which lies in that span, so P t = t):
    alignment  cos = ||P h|| / ||h||
    LD         = <h, t>
    rotation   = angle(P h, t) in degrees, cos = <h, t> / (||P h|| ||t||)
Five conditions: zero-shot; zero-shot + the TR, TL and random vectors injected at the input of decoder layer `layer`
(last token; `primitives.layer_inputs`); ICL. States are read at each decoder layer's output.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch
from pydantic import Field

from ..primitives.options import GEOMETRY_CONDITIONS
from ..kernel import Context
from ..kinds import get_kind
from ..params import Bool, Float, Layer, PromptParams, Selection
from ..primitives.cost import Shape, Sizes, Work, passes
from ..primitives.stages import planned
from ..results import Head, Model, Result
from ..primitives.batching import answer_tokens, build_prompts, encode
from ..primitives.capture import capture
from ..primitives.stats import bootstrap_ci
from ..primitives.configs import resolve_layers
from ..primitives.tsla import LabelSpace, label_space


class GeometryParams(Selection, PromptParams):
    """kind `geometry`: per-layer alignment, logit difference and rotation for five conditions, and PCA."""

    layer: Layer | None = Field(None, description="injection layer of the steered conditions (a decoder layer's "
                                                  "input); None = L/2")
    alpha: Float = Field(1.0, ge=-100, le=100)
    final_norm: Bool = Field(True, description="measure the states after the final norm (as the unembedding reads "
                                                "them: the logit difference is in logits); false: the raw residual")
    pca_layer: Layer | None = Field(None, description="layer of the PCA view; None = the last")

    def work(self, shape: Shape, sizes: Sizes) -> Work:
        built = get_kind("task_vectors").params(types=["tr", "tl", "random"], shots=self.shots, prompts=self.prompts,
                                           top_pct=self.top_pct, top_k=self.top_k).work(shape, sizes).named("vectors")
        n = sizes.n(self.prompts)
        for cond in GEOMETRY_CONDITIONS:  # in the run's order: the ICL prompts, or the zero-shot ones (injected)
            built = built + passes(cond, n, sizes.prompt(self.shots if cond == "icl" else 0))
        return built


class MeanStd(Model):
    mean: list[float]
    std: list[float]
    ci_low: list[float] | None = Field(None, description="95% bootstrap interval of the mean over prompts, per layer")
    ci_high: list[float] | None = None


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


def hidden_metrics(h: torch.Tensor, ls: LabelSpace) -> dict[str, torch.Tensor]:
    """alignment, LD and rotation (degrees) of hidden states h (batch, d) against each row's label space."""
    h = h.double()
    a = torch.einsum("bd,bnd->bn", h, ls.u.double()) * ls.valid
    ph = torch.einsum("bn,bnm,bm->b", a, ls.g_pinv, a).clamp_min(0).sqrt()
    a_gold = a.gather(1, ls.gold[:, None]).squeeze(1)
    n_other = (ls.valid.sum(1) - 1).clamp_min(1).double()
    ld = a_gold - (a.sum(1) - a_gold) / n_other
    u = ls.u.double()
    u_gold = u.gather(1, ls.gold[:, None, None].expand(-1, 1, u.shape[-1])).squeeze(1)
    t = u_gold - (u.sum(1) - u_gold) / n_other[:, None]
    cos = ld / (ph * t.norm(dim=-1)).clamp_min(1e-30)
    return {"alignment": ph / h.norm(dim=-1).clamp_min(1e-30), "ld": ld,
            "rotation": torch.rad2deg(torch.arccos(cos.clamp(-1, 1)))}


def summarize(per_prompt: dict[str, torch.Tensor]) -> dict[str, dict[str, list[float]]]:
    """{metric: {"mean": [layers], "std": [layers], "ci_low", "ci_high": [layers]}} from {metric: (prompts, layers)}:
    the interval is the seeded percentile bootstrap of the mean over prompts (`stats.bootstrap_ci`)."""
    out = {}
    for k, v in per_prompt.items():
        lo, hi = bootstrap_ci(v.numpy())
        out[k] = {"mean": v.mean(0).tolist(), "std": v.std(0, unbiased=False).tolist(), "ci_low": lo.tolist(),
                  "ci_high": hi.tolist()}
    return out


def pca_view(states: dict[str, np.ndarray], label_rows: np.ndarray, label_names: Sequence[str],
             components: int = 3) -> dict[str, Any]:
    """PCA of the stacked hidden states of all conditions, (n, d) each; label unembedding directions
    are mapped into the same basis (directions, not points: no mean is subtracted), scaled to the cloud."""
    from sklearn.decomposition import PCA

    names = list(states)
    X = np.concatenate([states[n] for n in names])
    k = max(1, min(components, X.shape[0], X.shape[1]))
    pca = PCA(n_components=k, random_state=0).fit(X)
    coords = {}
    for n in names:
        coords[n] = pca.transform(states[n]).tolist()
    dirs = label_rows @ pca.components_.T  # (labels, k)
    spread = np.abs(pca.transform(X)).max() or 1.0
    norms = np.linalg.norm(dirs, axis=1, keepdims=True)
    dirs = dirs / np.where(norms == 0, 1, norms.max()) * spread
    return {"points": coords, "explained_variance_ratio": pca.explained_variance_ratio_.tolist(),
            "label_directions": {lab: d.tolist() for lab, d in zip(label_names, dirs)}}


def geometry(ctx: Context, p: GeometryParams) -> dict[str, Any]:
    """Per-layer alignment, LD and rotation (mean and std over prompts) for the five conditions, and a PCA
    view at `pca_layer`."""
    lm, task = ctx.lm, ctx.task
    inj = resolve_layers(lm, p.layer)[0]
    pl = resolve_layers(lm, p.pca_layer if p.pca_layer is not None else lm.n_layers - 1)[0]
    sub = dict(types=["tr", "tl", "random"], shots=p.shots, prompts=p.prompts, seed=p.seed, top_pct=p.top_pct,
               top_k=p.top_k)
    # progress by the plan's stages (`work`); cached vectors weigh nothing
    share = planned(ctx, p, {"vectors"} if ctx.cached("task_vectors", [sub], record=False) is not None else ())
    vecs = ctx.call("task_vectors", **sub, batch_size=p.batch_size,
                    progress=ctx.stage(*share["vectors"], "building vectors"))
    built = build_prompts(lm, task, p.shots, p.prompts, p.seed)
    for w in built.warnings:
        ctx.warn(w)
    icl = encode(lm, built.prompts, task.kind)
    zero = encode(lm, task.build_prompts(0, built.n, p.seed), task.kind)
    hs: dict[str, torch.Tensor] = {}
    for cond in GEOMETRY_CONDITIONS:
        stage = ctx.stage(*share[cond], cond)
        name = cond.partition("+")[2]
        inject = {inj: p.alpha * torch.as_tensor(vecs.vectors[name].vector, dtype=torch.float32)} if name else None
        hs[cond] = capture(lm, icl if cond == "icl" else zero, "hidden", reduce="rows", inject=inject,
                           final_norm=p.final_norm, batch_size=p.batch_size, progress=stage)
    # same queries, same gold, same label sets in every condition: one label space serves all
    ls = label_space(lm.unembed.detach().float().cpu(), zero.label_ids, zero.gold)
    conditions = {}
    for cond, h in hs.items():
        per = [hidden_metrics(h[:, l], ls) for l in range(lm.n_layers)]
        conditions[cond] = summarize({k: torch.stack([q[k] for q in per], 1) for k in per[0]})
    labels = sorted({lab for q in zero.prompts for lab in q.labels})[:32]
    ids = [answer_tokens(lm, zero.prompts[0].text[-32:], lab)[0] for lab in labels]
    rows = lm.unembed.detach().float().cpu()[ids].numpy()
    pca = pca_view({c: h[:, pl].numpy() for c, h in hs.items()}, rows, labels)
    pca["gold"] = [q.gold for q in zero.prompts]
    pca["layer"] = pl
    return {"layers": list(range(lm.n_layers)), "inject_layer": inj, "alpha": p.alpha, "final_norm": p.final_norm,
            "shots": built.shots, "prompts": built.n, "conditions": conditions, "pca": pca,
            "vector_heads": {k: v.heads for k, v in vecs.vectors.items()}}
