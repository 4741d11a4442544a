"""Kind `site_patching`: exact activation patching at any site, layer and position, from clean ICL prompts into
corrupted ones (issue 33, part 2).

Source: the clean k-shot prompts of the head maps; target, the same queries in the same order as zero-shot prompts or
with perturbed demonstrations (`primitives/patch.py`'s `Target`, as `activation_patching`). Sites, per layer l
(`adapters.Site` through the model's `ArchSpec`, so Gemma 2 / 3's are taken after their post-norms):

    resid_pre   the residual stream at layer l's input (0: the embeddings)                 (d_model)
    attn_out    what layer l's attention adds to the residual stream                       (d_model)
    mlp_out     what layer l's MLP adds to it (resid_pre[l] + attn_out[l] + mlp_out[l] = resid_pre[l + 1])
    z           the attention output projection's input, per head                          (heads, head_dim)

Positions (`primitives/roles.py`): the prompts differ in length, so positions are named by role and paired from
each role's end between clean prompt i and target prompt i: each demonstration's label tokens (`label:j`), the
separators, the query's tokens, the last token; or by offset from the last token (-1, -2, ...; `positions="each"`).
A cell (layer l, position p) runs target prompt i with the site's activation at p's positions (all heads at z)
replaced by clean prompt i's at the paired positions, from layer l on (the layers below are the target's own: they
are skipped, their recorded output fed in). The layer x head map patches one head's z at one chosen position.
Read out: the gold answer's first-token logit g and probability p. With g_c, g_t (prompts,) the clean and target runs
and g_p the patched one, per cell (as `activation_patching`'s heads):

    recovered  = mean_i (g_p - g_t) / mean_i (g_c - g_t)       (its standard error by the delta method)
    logit_gain = mean_i (g_p - g_t),  prob_gain = mean_i (p_p - p_t)   (standard errors over prompts)

Patching the target with its own activations changes nothing; patching resid_pre at layer 0 at every position of a
target of the clean prompts' lengths gives the clean run (tests/unit/test_site_patching.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Sequence

import numpy as np
import torch
from pydantic import Field, field_validator

from ...errors import BadInput
from ...model.interventions import Patch, Record, intervene, skip_below
from ...model.loading import LoadedModel
from ...tasks.base import TaskError
from ..kernel import Context
from ..params import Int, Layer, PromptParams
from ..primitives import roles as R
from ..primitives.batching import Encoded, Progress, build_prompts, encode, make_batch
from ..primitives.cost import NONE, Shape, Sizes, Work, passes, steps
from ..primitives.capture import capture
from ..primitives.patch import Target, gold_ids, patch_heads, recovered_share, recovered_stderr, target_prompts
from ..primitives.stages import planned
from ..primitives.stats import stderr
from ..primitives.stopping import check
from ..results import Grid, Result

SiteName = Literal["resid_pre", "attn_out", "mlp_out", "z"]
SITES: dict[str, str] = {"resid_pre": "layer_in", "attn_out": "attn_out", "mlp_out": "mlp_out", "z": "z"}
"""The kind's site names (TransformerLens's) -> the intervention layer's (`adapters.Site`)."""


class SitePatchingParams(PromptParams):
    """kind `site_patching`: clean activations patched into corrupted prompts at a site, per layer and position."""

    target: Target = Field("random_labels", description="the prompt set patched into: zero-shot prompts, or the "
                                                        "k-shot prompts with perturbed demonstrations")
    site: SiteName = Field("resid_pre", description="resid_pre: a layer's input; attn_out / mlp_out: what its "
                                                    "attention / MLP adds to the residual stream; z: every head's "
                                                    "input to the output projection")
    view: Literal["positions", "heads", "both"] = Field("positions", description="positions: a layer x position "
                                                                                 "map of the site; heads: a layer x "
                                                                                 "head map of z at `position`")
    positions: Literal["roles", "each"] = Field("roles", description="the map's columns: roles (each "
                                                                     "demonstration's labels, separators, query, "
                                                                     "last token) or each of the last "
                                                                     "`max_positions` positions")
    max_positions: Int = Field(12, ge=1, le=256, description="positions='each': how many positions from the end")
    position: str = Field("last", max_length=16, description="the heads map's position: last, query, separator, "
                                                             "label, label:j, input, input:j, or -n (n-th from the "
                                                             "end)")
    layers: list[Layer] | None = Field(None, max_length=256, description="the layers patched (default: all)")
    batch_size: Int = Field(16, ge=1, le=1024, description="rows per forward pass: prompts x cells (speed only)")
    not_in_key: ClassVar[frozenset[str]] = frozenset({"batch_size"})

    @field_validator("position")
    @classmethod
    def _position(cls, v: str) -> str:
        return R.check_name(v)  # a name no prompt could have is refused at admission

    def columns(self, shape: Shape, sizes: Sizes) -> int:
        """The map's columns (an upper bound before the prompts are tokenised)."""
        if self.positions == "each":
            return max(1, min(self.max_positions, int(sizes.prompt(self.target_shots()))))
        return self.target_shots() + 3  # each label, the separators, the query, the last token

    def last_token_heads(self) -> bool:
        """Whether the heads map is at the last token: then it runs on the configuration engine's one-token steps."""
        return self.position in ("last", "-1")

    def target_shots(self) -> int:
        return 0 if self.target == "zero_shot" else self.shots

    def work(self, shape: Shape, sizes: Sizes) -> Work:
        """Per view, the clean and the target prompts: one pass each; the position map: each cell one pass of a
        target prompt from its layer on ((L - l) / L of the model), `batch_size` rows a call; the heads map: the same
        per head, or at the last token the configuration engine's (z captured and the clean prompts scored: 2 passes;
        the target's prefix: 1; one token step per head and prompt, from its layer on)."""
        n, L = sizes.n(self.prompts), max(shape.n_layers, 1)
        layers = sorted(set(self.layers)) if self.layers is not None else list(range(L))
        share = sum(max(L - l, 1) for l in layers) / (L * max(len(layers), 1))
        clean, target = sizes.prompt(self.shots), sizes.prompt(self.target_shots())
        w = NONE
        if self.view != "heads":
            w = passes("clean prompts", n, clean) + passes("target prompts", n, target)
            w = w + passes("position patches", n * len(layers) * self.columns(shape, sizes), target * share,
                           batch=self.batch_size)
        if self.view != "positions" and self.last_token_heads():
            w = (w + passes("clean prompts", 2 * n, clean) + passes("target prompts", n, target)
                 + steps("head patches", n * (shape.heads + 1), share=(L + 1) / (2 * L)))
        elif self.view != "positions":
            w = (w + passes("clean prompts", n, clean) + passes("target prompts", n, target)
                 + passes("head patches", n * len(layers) * shape.n_heads, target * share, batch=self.batch_size))
        return w


class SitePatchingResult(Result):
    """Layer x position maps of a site and a layer x head map of z at one position, with standard errors."""

    n_layers: int
    n_heads: int
    shots: int
    prompts: int
    target: str
    site: str = Field(..., description="the position map's site (z for the heads map alone)")
    layers: list[int] = Field(..., description="the maps' rows: the layers patched")
    columns: list[str] = Field(default_factory=list, description="the position map's columns: roles or offsets")
    tokens: list[float] = Field(default_factory=list, description="per column, the mean tokens patched per prompt")
    recovered: Grid | None = Field(None, description="(layers, columns) share of the clean-minus-target gold logit "
                                                     "recovered")
    recovered_se: Grid | None = None
    logit_gain: Grid | None = Field(None, description="(layers, columns) mean change of the gold logit")
    logit_gain_se: Grid | None = None
    prob_gain: Grid | None = Field(None, description="(layers, columns) mean change of p(gold)")
    prob_gain_se: Grid | None = None
    position: str | None = Field(None, description="the heads map's position")
    head_tokens: float | None = Field(None, description="mean tokens of `position` patched per prompt")
    head_recovered: Grid | None = Field(None, description="(layers, heads) recovered share, one head's z at "
                                                          "`position`")
    head_recovered_se: Grid | None = None
    head_logit_gain: Grid | None = None
    head_logit_gain_se: Grid | None = None
    head_prob_gain: Grid | None = None
    head_prob_gain_se: Grid | None = None
    clean_logit: float
    target_logit: float
    gap: float = Field(..., description="clean_logit - target_logit: what there is to recover")
    clean_prob: float
    target_prob: float


# -- the engine ---------------------------------------------------------------------------------------------------
@dataclass
class Cells:
    """What to patch at each layer: `columns[c][i]`, the (target position, source position) pairs of column c in
    prompt i (unpadded); per cell, (column, head or None for every head / the whole activation)."""

    columns: list[list[list[tuple[int, int]]]]
    cells: list[tuple[int, int | None]]


@dataclass
class Runs:
    """Gold-token logits and probabilities (float64): `source_*`, `target_*` (prompts,) the unpatched runs;
    `logit`, `prob` (layers, cells, prompts) the patched ones."""

    source_logit: np.ndarray
    source_prob: np.ndarray
    target_logit: np.ndarray
    target_prob: np.ndarray
    logit: np.ndarray
    prob: np.ndarray


def _gold(logits: torch.Tensor, gold: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    lg = logits.float().gather(1, gold[:, None]).squeeze(1)
    pg = torch.softmax(logits.float(), -1).gather(1, gold[:, None]).squeeze(1)
    return lg.double().cpu().numpy(), pg.double().cpu().numpy()


def patch_sites(lm: LoadedModel, source: Sequence[Sequence[int]], target: Sequence[Sequence[int]],
                gold: Sequence[int], site: str, layers: Sequence[int], plan: Sequence[Cells], *,
                batch_size: int = 16, progress: Progress | None = None) -> list[Runs]:
    """Target prompt i run with the activation at `site` (an `adapters.Site`) of each layer in `layers` replaced,
    cell by cell, by source prompt i's at the paired positions (`Cells`; several plans share the source and target
    passes), read at the gold token `gold[i]`. Left-padded batches of prompts, each layer's cells batched
    `batch_size` rows a call; layers below the patched one are skipped (the target's recorded output fed in)."""
    N, L = len(target), lm.n_layers
    if len(source) != N or len(gold) != N:
        raise ValueError("source, target and gold must pair prompt by prompt")
    bad = [l for l in layers if not 0 <= l < L]
    if bad:
        raise BadInput(f"layer {bad[0]} out of range: the model has layers 0..{L - 1}")
    for cells in plan:
        if any(h is not None and (site != "z" or not 0 <= h < lm.n_heads) for _, h in cells.cells):
            raise BadInput("a head is patched at site z only, with 0 <= head < n_heads")
    out = [Runs(np.zeros(N), np.zeros(N), np.zeros(N), np.zeros(N), np.zeros((len(layers), len(c.cells), N)),
                np.zeros((len(layers), len(c.cells), N))) for c in plan]
    most = max((len(c.cells) for c in plan), default=1)
    per = max(1, batch_size // max(most, 1))  # prompts a batch
    order = sorted(range(N), key=lambda i: -len(target[i]))
    batches = [order[k:k + per] for k in range(0, N, per)]
    goldt = torch.tensor(list(gold), device=lm.device)
    with lm.lock, torch.inference_mode():
        for n_done, rows in enumerate(batches):
            check()
            _patch_batch(lm, source, target, goldt, site, layers, plan, rows, batch_size, out)
            if progress:
                progress((n_done + 1) / len(batches), "patching")
    return out


def _patch_batch(lm: LoadedModel, source: Sequence[Sequence[int]], target: Sequence[Sequence[int]],
                 gold: torch.Tensor, site: str, layers: Sequence[int], plan: Sequence[Cells], rows: list[int],
                 batch_size: int, out: list[Runs]) -> None:
    b = len(rows)
    sb, tb = make_batch(lm, source, rows), make_batch(lm, target, rows)
    Ws, Wt = sb.input_ids.shape[1], tb.input_ids.shape[1]
    g = gold[rows]
    # every pair of the batch, in padded coordinates: target (row, position) <- source (row, position)
    pair: dict[tuple[int, int], int] = {}
    for cells in plan:
        for col in cells.columns:
            for r, i in enumerate(rows):
                for t, s in col[i]:
                    key, src = (r, Wt - len(target[i]) + t), Ws - len(source[i]) + s
                    if pair.setdefault(key, src) != src:
                        raise ValueError(f"prompt {i}: target position {t} paired with two source positions")
    rr = torch.tensor([k[0] for k in pair], dtype=torch.long, device=lm.device)
    tt = torch.tensor([k[1] for k in pair], dtype=torch.long, device=lm.device)
    ss = torch.tensor(list(pair.values()), dtype=torch.long, device=lm.device)
    wanted = sorted(set(layers))
    src: dict[int, torch.Tensor] = {}

    def gather(layer: int | None, x: torch.Tensor) -> None:  # only the paired positions, in the target's layout
        y = torch.zeros((b, Wt, x.shape[-1]), dtype=x.dtype, device=x.device)
        y[rr, tt] = x[rr, ss]
        src[layer] = y  # type: ignore[index]

    with intervene(lm, [Record(site, gather, at=wanted)]):  # type: ignore[arg-type]
        logits = lm.model(input_ids=sb.input_ids, attention_mask=sb.attention_mask, position_ids=sb.position_ids,
                          use_cache=False, logits_to_keep=1).logits[:, -1]
    sl, sp = _gold(logits, g)
    below = sorted({l - 1 for l in wanted if l > 0})
    rec: dict[int, torch.Tensor] = {}
    with intervene(lm, [Record("layer_out", lambda l, x: rec.__setitem__(l, x.detach()), at=below)]):
        logits = lm.model(input_ids=tb.input_ids, attention_mask=tb.attention_mask, position_ids=tb.position_ids,
                          use_cache=False, logits_to_keep=1).logits[:, -1]
    tl, tp = _gold(logits, g)
    for o in out:
        o.source_logit[rows], o.source_prob[rows] = sl, sp
        o.target_logit[rows], o.target_prob[rows] = tl, tp
    H = lm.n_heads
    for li, layer in enumerate(layers):
        for cells, o in zip(plan, out):
            masks = []  # per cell (b, Wt, H) bool: the target positions (and heads) it patches
            for c, h in cells.cells:
                m = torch.zeros((b, Wt, H), dtype=torch.bool, device=lm.device)
                for r, i in enumerate(rows):
                    ts = [Wt - len(target[i]) + t for t, _ in cells.columns[c][i]]
                    if ts:
                        m[r, ts, slice(None) if h is None else h] = True
                masks.append(m if site == "z" else m[..., 0])
            step = max(1, batch_size // b)
            for k in range(0, len(masks), step):
                check()
                chunk = masks[k:k + step]
                c = len(chunk)
                items: list[Any] = [Patch(site, layer, src[layer].repeat(c, 1, 1), torch.cat(chunk, 0))]  # type: ignore[arg-type]
                if layer > 0:
                    items.insert(0, skip_below(layer, rec[layer - 1].repeat(c, 1, 1)))
                with intervene(lm, items):
                    logits = lm.model(input_ids=tb.input_ids.repeat(c, 1), attention_mask=tb.attention_mask.repeat(c, 1),
                                      position_ids=tb.position_ids.repeat(c, 1), use_cache=False,
                                      logits_to_keep=1).logits[:, -1]
                lg, pg = _gold(logits, g.repeat(c))
                for j in range(c):
                    o.logit[li, k + j, rows] = lg[j * b:(j + 1) * b]
                    o.prob[li, k + j, rows] = pg[j * b:(j + 1) * b]


# -- positions by role ---------------------------------------------------------------------------------------------
def prompt_roles(lm: LoadedModel, enc: Encoded, template: str) -> list[list[str | None]]:
    """Each encoded prompt's token roles (`primitives/roles.py`)."""
    out = []
    for p, ids in zip(enc.prompts, enc.ids):
        segs = R.segments(p.text, template, p.n_shots, p.query)
        out.append(R.token_roles(R.offsets_of(lm.tokenizer, p.text, ids), segs))
    return out


def columns_of(names: Sequence[str], target: Sequence[Sequence[str | None]],
               source: Sequence[Sequence[str | None]]) -> list[list[list[tuple[int, int]]]]:
    """Per name, per prompt, the (target, source) position pairs (`roles.align`)."""
    out = []
    for name in names:
        col = []
        for i, (t, s) in enumerate(zip(target, source)):
            try:
                col.append(R.align(t, s, name))
            except R.RoleError as e:
                raise BadInput(f"{e} (prompt {i + 1})") from None
        out.append(col)
    return out


def _maps(runs: Runs, rows: int, cols: int) -> dict[str, np.ndarray]:
    g_c, g_t = runs.source_logit, runs.target_logit
    per = runs.logit.reshape(rows * cols, -1)
    prob = runs.prob.reshape(rows * cols, -1)
    rec, _ = recovered_share(per, g_c, g_t)
    return {"recovered": rec.reshape(rows, cols),
            "recovered_se": recovered_stderr(per, g_c, g_t).reshape(rows, cols),
            "logit_gain": (per - g_t[None]).mean(1).reshape(rows, cols),
            "logit_gain_se": stderr((per - g_t[None]).T).reshape(rows, cols),
            "prob_gain": (prob - runs.target_prob[None]).mean(1).reshape(rows, cols),
            "prob_gain_se": stderr((prob - runs.target_prob[None]).T).reshape(rows, cols)}


def _last_token_heads(lm: LoadedModel, clean: Encoded, target: Encoded, layers: Sequence[int], batch_size: int,
                      progress: Progress) -> Runs:
    """The heads map at the last token on the configuration engine (`patch.patch_heads`, paired: one token step per
    head and prompt over the target's cached prefix, as `activation_patching`): the same numbers as full passes
    (tests/unit/test_patching_sites.py), for every head of the model, then the rows of `layers`."""
    L, H, N = lm.n_layers, lm.n_heads, len(target.ids)
    z = capture(lm, clean, "z", reduce="rows", batch_size=batch_size, progress=lambda f, m="": progress(0.2 * f, m))
    base = patch_heads(lm, clean, None, batch_size=batch_size)
    runs = patch_heads(lm, target, z.to(lm.device), batch_size=batch_size,
                       progress=lambda f, m="": progress(0.2 + 0.8 * f, m))
    rows = list(layers)
    return Runs(base.gold_logit[0], base.gold_prob[0], runs.gold_logit[0], runs.gold_prob[0],
                runs.per_head().reshape(L, H, N)[rows], runs.per_head("gold_prob").reshape(L, H, N)[rows])


def site_patching(ctx: Context, p: SitePatchingParams) -> dict[str, Any]:
    """The site's layer x position map and / or z's layer x head map at `position`, clean into target."""
    lm, task = ctx.lm, ctx.task
    if task.builder is not None:
        raise TaskError(f"task {task.name!r} builds its own prompts: it has no corrupted counterpart of the same "
                        f"queries, nor a template to read the positions' roles from")
    L, H = lm.n_layers, lm.n_heads
    layers = sorted(set(p.layers)) if p.layers is not None else list(range(L))
    if not layers:
        raise BadInput("give at least one layer, or none for all")
    if layers[-1] >= L:
        raise BadInput(f"layer {layers[-1]} out of range: the model has layers 0..{L - 1}")
    R.check_name(p.position)
    built = build_prompts(lm, task, p.shots, p.prompts, p.seed)
    for w in built.warnings:
        ctx.warn(w)
    share = planned(ctx, p)
    clean = encode(lm, built.prompts, task.kind)
    target = encode(lm, target_prompts(task, p.target, built.shots, built.n, p.seed), task.kind)
    if gold_ids(clean) != gold_ids(target) or [q.query for q in clean.prompts] != [q.query for q in target.prompts]:
        raise TaskError(f"the {p.target.replace('_', ' ')} prompts do not pair with the clean ones (another query or "
                        f"gold token): nothing to patch")
    same = sum(a == b for a, b in zip(clean.ids, target.ids))
    if same:
        ctx.warn(f"{same} of {built.n} {p.target.replace('_', ' ')} prompts are their clean prompt token for token "
                 f"(e.g. random labels that drew the true ones): they have nothing to recover, and a standard error "
                 f"over few differing prompts is small by construction")
    try:
        rc, rt = prompt_roles(lm, clean, task.template.text), prompt_roles(lm, target, task.template.text)
    except R.RoleError as e:
        raise TaskError(f"task {task.name!r}: cannot read its prompts' positions by role: {e}") from None
    plan, names = [], []
    if p.view != "heads":
        if p.positions == "each":
            shortest = min(min(len(x) for x in clean.ids), min(len(x) for x in target.ids))
            names = [str(-k) for k in range(min(p.max_positions, shortest), 0, -1)]
        else:
            common = [set(R.shared_roles(t, s, built.shots)) for t, s in zip(rt, rc)]
            names = [n for n in R.shared_roles(rt[0], rc[0], built.shots) if all(n in c for c in common)]
            gone = sorted(set().union(*common) - set(names))
            if gone:
                ctx.warn(f"positions {', '.join(gone)} are left out: some prompts lack them")
        cols = columns_of(names, rt, rc)
        plan.append(Cells(cols, [(c, None) for c in range(len(names))]))
    if p.view != "positions" and not p.last_token_heads():
        head_col = columns_of([p.position], rt, rc)
        plan.append(Cells(head_col, [(0, h) for h in range(H)]))
    lo, hi = share["clean prompts"][0], 1.0
    mid = share["head patches"][0] if p.view == "both" else hi
    runs: list[Runs] = []
    if p.view != "heads":
        runs += patch_sites(lm, clean.ids, target.ids, gold_ids(target), SITES[p.site], layers, plan[:1],
                            batch_size=p.batch_size, progress=ctx.stage(lo, mid, "patching positions"))
    hlo = lo if p.view == "heads" else mid
    if p.view != "positions" and p.last_token_heads():
        runs.append(_last_token_heads(lm, clean, target, layers, p.batch_size, ctx.stage(hlo, hi, "patching heads")))
    elif p.view != "positions":
        runs += patch_sites(lm, clean.ids, target.ids, gold_ids(target), "z", layers, plan[-1:],
                            batch_size=p.batch_size, progress=ctx.stage(hlo, hi, "patching heads"))
    base = runs[0]
    gap = float(np.mean(base.source_logit - base.target_logit))
    if abs(gap) < 1e-6:
        ctx.warn(f"the clean and the {p.target.replace('_', ' ')} prompts give the same mean gold logit (gap "
                 f"{gap:.2g}): there is nothing to recover, so the recovered share is 0 everywhere")
    res: dict[str, Any] = {
        "n_layers": L, "n_heads": H, "shots": built.shots, "prompts": built.n, "target": p.target,
        "site": "z" if p.view == "heads" else p.site,
        "layers": layers, "clean_logit": float(base.source_logit.mean()), "target_logit": float(base.target_logit.mean()),
        "gap": gap, "clean_prob": float(base.source_prob.mean()), "target_prob": float(base.target_prob.mean()),
        "multi_token_labels": sorted(set(clean.multi_token) | set(target.multi_token))}
    k = 0
    if p.view != "heads":
        res.update(_maps(runs[0], len(layers), len(names)), columns=names,
                   tokens=[float(np.mean([len(x) for x in col])) for col in plan[0].columns])
        k = 1
    if p.view != "positions":
        res.update({f"head_{n}": v for n, v in _maps(runs[k], len(layers), H).items()}, position=p.position,
                   head_tokens=1.0 if p.last_token_heads() else float(np.mean([len(x) for x in plan[-1].columns[0]])))
    return res
