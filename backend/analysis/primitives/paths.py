"""Path patching (Wang et al. 2022, the IOI circuit's method) of one sender head into receivers, exact, at the last
token, through the intervention layer.

Target prompt i is run with its sender head's z (the output projection's input, split by head) at the last token
replaced by clean prompt i's. Every path from the sender runs through the last token: its patch changes no earlier
position (causal attention), so every run below is the target's prefix (its KV cache, kept once per batch) and one
token (`last_token.clean_prefixes` / `step_logits`; full left-padded passes where a model's layers do not allow it).

Receivers, each an input that reads the residual stream at the last token (`Receiver`):
    (l, h, "q")   head h's query: its columns of the query projection's output (site "q", before rotary and any
                  per-head q norm, which the model recomputes from it)
    (l, h, "k"/"v")  the key / value head that query head h reads (grouped-query attention: kv head h // (H / KV),
                  shared by its group, so patching it patches every query head of the group's key / value; named by
                  the group's first query head); at the last token that is the last position's own key / value,
                  read by the last token's attention to itself
    (l, None, "mlp")  the MLP of layer l (the sender's layer or later): its output, a function of its input at that
                  position alone, so patching one is patching the other (site "mlp_out")
    (L, None, "logits")  the sender's direct path: its own write into the final norm's input, nothing else (what
                  reaches the final norm through later heads and MLPs is theirs)

Step 1 (one run): the sender's z is clean; with `freeze="heads"` every other head's z is the target run's (all layers:
only later ones could change), MLPs recomputed; with "none" nothing is frozen (the sender's activation patching).
Each receiver's input there is recorded, and the sender's write (site attn_out of its layer minus the target's: the
other heads of that layer are the target's in every run, so that is the sender's alone; after Gemma 2 / 3's
post-attention norm, which is recomputed, so no linearisation is needed).
Step 2 (one run per configuration, a set of receivers): the target run with only those receivers' inputs replaced by
their step-1 values (the logits receiver: the sender's step-1 write minus its target write, added to the final norm's
input). A configuration starts at its lowest receiver's layer (the layers below are the target's: skipped, their
recorded output fed in). With `freeze="none"` and every receiver downstream of the sender, step 2 is the sender's
activation patching, path by path (tests/unit/test_path_patching.py).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Literal, Sequence

import numpy as np
import torch

from ...errors import BadInput
from ...model.interventions import Add, Capture, Intervention, Patch, intervene
from ...model.loading import LoadedModel
from .batching import Progress, forward_last_logits, make_batch
from .last_token import clean_prefixes, step_logits
from .stopping import check

Channel = Literal["q", "k", "v", "mlp", "logits"]
Freeze = Literal["heads", "none"]
STEP_ROWS = 64  # (configuration, prompt) rows per step at most (each row holds a copy of its prompt's prefix cache)


@dataclass(frozen=True)
class Receiver:
    """An input reading the residual stream at the last token: (layer, head, channel), head None for "mlp" and
    "logits" (layer n_layers). Written `l.h.q`, `l.h.k`, `l.h.v`, `l.mlp`, `logits`."""

    layer: int
    head: int | None
    channel: str

    def key(self) -> tuple[int, int, int]:
        """The order receivers are listed in: by layer, q k v before the MLP, by head."""
        return self.layer, "qkvml".index(self.channel[0]), -1 if self.head is None else self.head

    @property
    def name(self) -> str:
        if self.channel == "logits":
            return "logits"
        return f"{self.layer}.mlp" if self.channel == "mlp" else f"{self.layer}.{self.head}.{self.channel}"


def parse_receiver(text: str, n_layers: int | None = None) -> Receiver:
    """`l.h.q` / `l.h.k` / `l.h.v` / `l.mlp` / `logits` as a `Receiver` (ValueError in one sentence otherwise)."""
    t = text.strip()
    if t == "logits":
        return Receiver(n_layers if n_layers is not None else 1 << 30, None, "logits")
    parts = t.split(".")
    if len(parts) == 2 and parts[0].isdigit() and parts[1] == "mlp":
        return Receiver(int(parts[0]), None, "mlp")
    if len(parts) == 3 and parts[0].isdigit() and parts[1].isdigit() and parts[2] in ("q", "k", "v"):
        return Receiver(int(parts[0]), int(parts[1]), parts[2])
    raise ValueError(f"a receiver is written layer.head.q, layer.head.k, layer.head.v, layer.mlp or logits, not "
                     f"{t[:40]!r}")


def kv_head(lm: LoadedModel, head: int) -> int:
    """The key / value head query head `head` reads."""
    return head // group(lm)


def group(lm: LoadedModel) -> int:
    """Query heads per key / value head."""
    return max(lm.n_heads // max(lm.n_kv_heads, 1), 1)


def canonical(lm: LoadedModel, r: Receiver) -> Receiver:
    """The receiver as patched (idempotent): a k / v receiver named by the first query head of its kv head's group
    (two query heads of one group read one key and one value: one receiver); logits at layer n_layers."""
    if r.channel == "logits":
        return Receiver(lm.n_layers, None, "logits")
    if r.channel in ("k", "v"):
        return Receiver(r.layer, kv_head(lm, int(r.head)) * group(lm), r.channel)  # type: ignore[arg-type]
    return r


def check_receivers(lm: LoadedModel, sender: tuple[int, int], receivers: Sequence[Receiver]) -> None:
    """BadInput, one sentence, for a sender or receiver outside the model or a receiver that cannot read the
    sender (a head in the sender's layer or below; an MLP below it)."""
    L, H = lm.n_layers, lm.n_heads
    s, hs = sender
    if not (0 <= s < L and 0 <= hs < H):
        raise BadInput(f"sender head {s}.{hs} is outside the model (layers 0..{L - 1}, heads 0..{H - 1})")
    for r in receivers:
        if r.channel == "logits":
            continue
        if not 0 <= r.layer < L or (r.head is not None and not 0 <= r.head < H):
            raise BadInput(f"receiver {r.name} is outside the model (layers 0..{L - 1}, heads 0..{H - 1})")
        if r.channel == "mlp" and r.layer < s:
            raise BadInput(f"receiver {r.name} is in layer {r.layer}, before the sender's layer {s}: it cannot read "
                           f"the sender {s}.{hs} (an MLP reads the heads of its own layer and those below)")
        if r.channel != "mlp" and r.layer <= s:
            raise BadInput(f"receiver {r.name} is in layer {r.layer}, not after the sender's layer {s}: a head's "
                           f"query, key and value read only what layers before it wrote, so it cannot read the "
                           f"sender {s}.{hs}")


def every_receiver(lm: LoadedModel, sender: tuple[int, int], layers: Sequence[int] | None = None) -> list[Receiver]:
    """Every receiver downstream of the sender (in `layers` only, when given): each later layer's query heads,
    kv heads' keys and values and MLP, the sender layer's MLP, and logits (k / v as `canonical` names them)."""
    s = sender[0]
    keep = set(range(lm.n_layers)) if layers is None else set(layers)
    out: list[Receiver] = []
    for l in range(s, lm.n_layers):
        if l not in keep:
            continue
        if l > s:
            out += [Receiver(l, h, "q") for h in range(lm.n_heads)]
            out += [Receiver(l, g * group(lm), c) for c in ("k", "v") for g in range(lm.n_kv_heads)]
        out.append(Receiver(l, None, "mlp"))
    return out + [Receiver(lm.n_layers, None, "logits")]


@dataclass
class PathRuns:
    """Gold-token logits and probabilities (float64) per prompt: `clean`, `target` the unpatched runs; `sender` the
    sender's activation patching (nothing frozen: every path); `step1` step 1's own output; `logit`, `prob`
    (configurations, prompts) step 2 per configuration."""

    clean_logit: np.ndarray
    clean_prob: np.ndarray
    target_logit: np.ndarray
    target_prob: np.ndarray
    sender_logit: np.ndarray
    sender_prob: np.ndarray
    step1_logit: np.ndarray
    step1_prob: np.ndarray
    logit: np.ndarray
    prob: np.ndarray


def _gold(logits: torch.Tensor, gold: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    lg = logits.float().gather(1, gold[:, None]).squeeze(1)
    pg = torch.softmax(logits.float(), -1).gather(1, gold[:, None]).squeeze(1)
    return lg.double().cpu().numpy(), pg.double().cpu().numpy()


@dataclass
class _Runner:
    """The target prompts of one batch (local indices 0..P-1), run from a layer on at the last token: one token over
    the prefix cache (`pre`), or full left-padded passes (`pre` None)."""

    lm: LoadedModel
    ids: list[list[int]]
    pre: Any
    start_h: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> the target's last-token input (P, d)

    def width(self, prompts: Sequence[int]) -> int:
        return 1 if self.pre is not None else max(len(self.ids[p]) for p in prompts)

    def run(self, prompts: Sequence[int], start: int, items: list[Intervention]) -> torch.Tensor:
        """Last-token logits (rows, vocab) of `prompts` (repeats allowed) under `items` (acting at layers >= start)."""
        check()
        if self.pre is None:
            batch = make_batch(self.lm, self.ids, list(prompts))
            with intervene(self.lm, items):
                return forward_last_logits(self.lm, batch)
        view = copy.copy(self.pre)
        if start != self.pre.layer:
            view.layer, view.h = start, self.start_h[start]
        return step_logits(view, list(prompts), hooks=lambda _n: intervene(self.lm, items))


def _at_last(site: str, layer: int, value: torch.Tensor, mask: torch.Tensor, width: int) -> Patch:
    """A `Patch` of the last position only: value (rows, w), mask (rows, w) bool (the columns taken)."""
    b, w = value.shape
    src = torch.zeros((b, width, w), dtype=value.dtype, device=value.device)
    src[:, -1] = value
    m = torch.zeros((b, width, w), dtype=torch.bool, device=value.device)
    m[:, -1] = mask.to(value.device)
    return Patch(site, layer, src, m)  # type: ignore[arg-type]


def _columns(lm: LoadedModel, r: Receiver) -> slice:
    head = int(r.head) if r.channel == "q" else kv_head(lm, int(r.head))  # type: ignore[arg-type]
    return lm.spec.qkv_columns(r.channel, head, lm.n_heads, lm.n_kv_heads, lm.head_dim)


def _start(lm: LoadedModel, config: Sequence[Receiver]) -> int:
    return min((min(r.layer, lm.n_layers - 1) for r in config), default=lm.n_layers - 1)


def path_patch(lm: LoadedModel, clean: Sequence[Sequence[int]], target: Sequence[Sequence[int]], gold: Sequence[int],
               sender: tuple[int, int], configs: Sequence[Sequence[Receiver]], *, freeze: Freeze = "heads",
               batch_size: int = 16, prefix: bool = True, progress: Progress | None = None) -> PathRuns:
    """Path patching of `sender` (see the module) into each configuration of `configs` (receivers as `canonical`
    gives them, checked by `check_receivers`), clean prompt i into target prompt i, read at gold token gold[i].
    Batches of `batch_size` prompts; `prefix` False: full passes throughout (the reference)."""
    N, C = len(target), len(configs)
    if len(clean) != N or len(gold) != N:
        raise ValueError("clean, target and gold must pair prompt by prompt")
    configs = [sorted({canonical(lm, r) for r in c}, key=Receiver.key) for c in configs]
    check_receivers(lm, sender, [r for c in configs for r in c])
    z = lambda: np.zeros(N)  # noqa: E731
    out = PathRuns(z(), z(), z(), z(), z(), z(), z(), z(), np.zeros((C, N)), np.zeros((C, N)))
    order = sorted(range(N), key=lambda i: -len(target[i]))
    batches = [order[k:k + batch_size] for k in range(0, N, batch_size)]
    goldt = torch.tensor(list(gold), device=lm.device)
    with lm.lock, torch.inference_mode():
        for b, rows in enumerate(batches):
            check()
            sub = None if progress is None else (lambda f, m="", b=b: progress((b + f) / len(batches), m))
            _batch(lm, [list(clean[i]) for i in rows], [list(target[i]) for i in rows], goldt[rows], sender, configs,
                   freeze, prefix, rows, out, sub)
    return out


def _batch(lm: LoadedModel, clean: list[list[int]], target: list[list[int]], gold: torch.Tensor,
           sender: tuple[int, int], configs: list[list[Receiver]], freeze: str, prefix: bool, rows: list[int],
           out: PathRuns, progress: Progress | None) -> None:
    L, dh = lm.n_layers, lm.head_dim
    s, hs = sender
    P = len(rows)
    every = list(range(P))
    # the clean run: the sender's z at the last token (as the target's below: the same prompts give the same z)
    zc: dict = {}
    pre = clean_prefixes(lm, clean, s, batch_size=P) if prefix else None
    logits = _Runner(lm, clean, pre).run(every, s, [Capture("z", at=[s], into=zc)])
    out.clean_logit[rows], out.clean_prob[rows] = _gold(logits, gold)
    # the target run from the sender's layer on: z, the layers' inputs and the sender layer's write
    pre = clean_prefixes(lm, target, s, batch_size=P) if prefix else None
    run = _Runner(lm, target, pre)
    zt: dict = {}
    h: dict = {}
    wt: dict = {}
    logits = run.run(every, s, [Capture("z", at=range(s, L), into=zt), Capture("layer_in", at=range(s + 1, L), into=h),
                                Capture("attn_out", at=[s], into=wt)])
    out.target_logit[rows], out.target_prob[rows] = _gold(logits, gold)
    run.start_h = h
    W = run.width(every)
    sent = zt[s].clone()
    sent[:, hs * dh:(hs + 1) * dh] = zc[s][:, hs * dh:(hs + 1) * dh]
    full = lambda v: torch.ones(v.shape, dtype=torch.bool)  # noqa: E731
    patch_sender = _at_last("z", s, sent, full(sent), W)
    # step 1: the sender clean, the other heads frozen (or not), every receiver's input recorded
    got: dict[str, dict] = {c: {} for c in ("q", "k", "v", "mlp_out", "attn_out")}
    records: list[Intervention] = [Capture(c, at=range(s + 1, L), into=got[c]) for c in ("q", "k", "v")]
    records += [Capture("mlp_out", at=range(s, L), into=got["mlp_out"]), Capture("attn_out", at=[s], into=got["attn_out"])]
    frozen = [_at_last("z", l, zt[l], full(zt[l]), W) for l in range(s + 1, L)] if freeze == "heads" else []
    logits = run.run(every, s, [patch_sender, *frozen, *records])
    out.step1_logit[rows], out.step1_prob[rows] = _gold(logits, gold)
    if frozen:
        logits = run.run(every, s, [_at_last("z", s, sent, full(sent), W)])
    out.sender_logit[rows], out.sender_prob[rows] = _gold(logits, gold)
    direct = got["attn_out"][s] - wt[s]  # (P, d): the sender's write, step 1 minus the target
    # step 2: per configuration, the receivers' inputs replaced by their step-1 values
    groups: dict[int, list[int]] = {}
    for c, config in enumerate(configs):
        groups.setdefault(_start(lm, config), []).append(c)
    per = max(1, STEP_ROWS // P)
    n_done, total = 0, max(len(configs), 1)
    for start, cs in sorted(groups.items()):
        for k in range(0, len(cs), per):
            chunk = cs[k:k + per]
            n = len(chunk)
            items = _step2_items(lm, [configs[c] for c in chunk], got, direct, P, W)
            logits = run.run(every * n, start, items)
            lg, pg = _gold(logits, gold.repeat(n))
            for j, c in enumerate(chunk):
                out.logit[c, rows], out.prob[c, rows] = lg[j * P:(j + 1) * P], pg[j * P:(j + 1) * P]
            n_done += n
            if progress:
                progress(n_done / total, "path patching")


def _step2_items(lm: LoadedModel, configs: list[list[Receiver]], got: dict[str, dict], direct: torch.Tensor,
                 P: int, W: int) -> list[Intervention]:
    """The patches of step 2 for configurations side by side (rows: configuration-major, then prompt)."""
    n = len(configs)
    sites: dict[tuple[str, int], torch.Tensor] = {}  # (site, layer) -> mask (n P, width)
    add = torch.zeros((n * P, direct.shape[-1]), dtype=direct.dtype, device=direct.device)
    for j, config in enumerate(configs):
        sl = slice(j * P, (j + 1) * P)
        for r in config:
            if r.channel == "logits":
                add[sl] = direct
                continue
            site = "mlp_out" if r.channel == "mlp" else r.channel
            src = got[site][r.layer]
            m = sites.setdefault((site, r.layer), torch.zeros((n * P, src.shape[-1]), dtype=torch.bool))
            if r.channel == "mlp":
                m[sl] = True
            else:
                m[sl, _columns(lm, r)] = True
    items: list[Intervention] = [_at_last(site, layer, got[site][layer].repeat(n, 1), m, W)
                                 for (site, layer), m in sorted(sites.items(), key=lambda kv: (kv[0][1], kv[0][0]))]
    if any(r.channel == "logits" for c in configs for r in c):
        items.append(Add("final_in", {None: add}, at="last"))  # type: ignore[dict-item]
    return items
