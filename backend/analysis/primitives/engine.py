"""One configuration engine over (configuration, prompt) pairs that only recomputes what an intervention changes.

A configuration (`RowConfig`) is a head mask acting on z at the output projection's input, at every position or
at the last token only, and/or vectors added to decoder layers' outputs at the last token. `run_configs` hands
the last-token logits of every (configuration, prompt) pair to a callback, exactly once each.

engine="full" runs every pair as a full forward pass (configurations mixed in row batches through
`hooks.hooked`): the reference, and the fallback. engine="auto" splits the configurations:

* untouched (no mask entry != 1, no non-zero vector): the clean logits, computed once per prompt batch;
* last-token (a mask at scope="last" and/or injections only): every earlier position's keys and values are
  the clean run's. The clean pass of a prompt batch keeps its KV cache; the cache is cut back to the prefix
  (all tokens but the last) and each configuration is one more token over it. "Packed" step passes put many
  configurations side by side on the sequence axis of one row per prompt (same position id, a 4D mask lets
  each see the prefix and itself only), so the prefix cache is read once for all of them; where one 4D mask
  cannot serve every layer (layers of different cache sizes, e.g. a sliding window already full) or the
  attention kernel takes no 4D mask (flash / flex attention), the cache is repeated over rows instead.
  A configuration costs about 1/T of a pass, less where it changes nothing below some layer s: its step runs
  layers >= s only (layer s - 1 returns its clean output at the last token, recorded by the clean pass). Prompts
  whose clean prefix states are kept (`prefix_store`: by the head maps' pass, or an earlier call with
  `keep_prefix`) skip the clean pass.
  An all-position mask that changes nothing before the last layer is one of these too: only the last token's
  output of the last layer reaches the logits.
* all-position masks: the residual stream up to the first layer a configuration changes is the clean one.
  Each configuration's start layer is the first layer with a mask entry != 1 (or an injection layer + 1); the
  configurations, sorted by start layer, are cut into passes (a pass starts at its earliest configuration's
  layer s; with short prompts, a few start layers share one fuller pass, see `engine_fast._chunks`). The clean
  pass records the output of layer s - 1, and each pass runs with layers < s - 1 replaced by pass-throughs and
  layer s - 1 returning the recorded clean output, so only layers >= s compute.

Per-architecture knowledge stays in `adapters.py`: the engine only needs the adapter's decoder layers and
output projections, that a decoder layer takes the hidden states first and returns them as a tensor (checked
on the clean pass: anything else falls back to the full engine), and the model forward's `cache=`,
`attention_mask`, `position_ids` and `logits_to_keep`.

This module: `run_configs` and the full engine; `engine_rows.py`: the configurations and their bookkeeping;
`engine_fast.py`: the fast paths.
"""
from __future__ import annotations

from typing import Sequence

import torch

from ...model.hooks import hooked
from ...model.loading import LoadedModel
from .stopping import check

from .batching import make_batch
from .engine_fast import run_fast, Unsupported
from .engine_rows import OnLogits, Progress, RowConfig, Emitter, halve, last_logits, route_config

ENGINES = ("auto", "full")


def run_configs(lm: LoadedModel, ids: Sequence[Sequence[int]], configs: Sequence[RowConfig], on_logits: OnLogits, *,
              fill: torch.Tensor | None = None, batch_size: int = 32, progress: Progress | None = None,
              engine: str = "auto", keep_prefix: bool = False) -> None:
    """Call `on_logits(logits, config_idx, prompt_idx)` with the last-token logits of every (configuration,
    prompt) pair exactly once: logits (rows, vocab) float32, indices (rows,) long, all on the model's device.

    ids: token ids per prompt (each at least one token). fill: (layers, heads, head_dim) mean-ablation values
    shared by all configurations (None: zero ablation). batch_size: prompts per clean pass and rows per
    intervened pass (halved on out-of-memory). progress(fraction, message) after every delivered batch.
    engine: "auto" (recompute only what each configuration changes) or "full" (every pair a full pass).
    A prompt batch whose clean prefix states are in `prefix_store.STORE` (kept by an earlier call with
    `keep_prefix`, or by the head maps' pass) and needs no all-position pass skips its clean pass.
    """
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, not {engine!r}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, not {batch_size}")
    C, N = len(configs), len(ids)
    if C == 0 or N == 0:
        return
    empty = [i for i, x in enumerate(ids) if len(x) == 0]
    if empty:
        raise ValueError(f"prompt {empty[0]} has no tokens")
    routes = [route_config(lm, i, c) for i, c in enumerate(configs)]
    if fill is not None:
        want = (lm.n_layers, lm.n_heads, lm.head_dim)
        if tuple(fill.shape) != want:
            raise ValueError(f"fill of shape {tuple(fill.shape)}, expected {want} (layers, heads, head_dim)")
        fill = fill.detach().to(lm.device)
    out = Emitter(C, N, on_logits, progress)
    with lm.lock, torch.inference_mode():
        if engine == "full":
            _run_full(lm, ids, configs, fill, batch_size, out, [(c, i) for c in range(C) for i in range(N)])
            return
        try:
            run_fast(lm, ids, routes, fill, batch_size, out, keep_prefix)
        except Unsupported:
            rest = (~out.done).nonzero().tolist()
            _run_full(lm, ids, configs, fill, batch_size, out, [(c, i) for c, i in rest])


# -- the reference: every (configuration, prompt) pair a full pass ------------------------------------------------
def _run_full(lm: LoadedModel, ids: Sequence[Sequence[int]], configs: Sequence[RowConfig], fill: torch.Tensor | None,
              batch_size: int, out: Emitter, pairs: list[tuple[int, int]]) -> None:
    """Rows (configuration, prompt) in sorted, left-padded batches through `hooks.hooked`, one group per mask
    position kind; a batch's rows carry their own masks and vectors."""
    L, H, d, dev = lm.n_layers, lm.n_heads, lm.d_model, lm.device
    groups: dict[str, list[tuple[int, int]]] = {"all": [], "last": []}
    for c, i in pairs:
        cfg = configs[c]
        groups["last" if cfg.mask is not None and cfg.scope == "last" else "all"].append((c, i))
    for pos, rows in groups.items():
        if not rows:
            continue
        cs_all = sorted({c for c, _ in rows})
        has_mask = any(configs[c].mask is not None for c in cs_all)
        layers = sorted({int(l) for c in cs_all for l in (configs[c].inject or {})})
        masks = {c: (configs[c].mask.to(dev, torch.float32) if configs[c].mask is not None
                     else torch.ones(L, H, device=dev)) for c in cs_all} if has_mask else {}
        zero = torch.zeros(d, device=dev)
        vecs = {c: {l: (configs[c].inject or {}).get(l) for l in layers} for c in cs_all}

        def vec(c: int, l: int) -> torch.Tensor:
            v = vecs[c][l]
            return zero if v is None else v.to(dev, torch.float32)

        order = sorted(range(len(rows)), key=lambda r: -len(ids[rows[r][1]]))
        row_ids = [ids[i] for _, i in rows]
        done, bs = 0, batch_size
        while done < len(order):
            check()  # once per batch of (configuration, prompt) rows (`stopping`)
            chunk = order[done:done + bs]
            try:
                batch = make_batch(lm, row_ids, chunk)
                cl = [rows[r][0] for r in chunk]
                head_mask = torch.stack([masks[c] for c in cl]) if has_mask else None
                inject = {l: torch.stack([vec(c, l) for c in cl]) for l in layers} or None
                with hooked(lm, head_mask=head_mask, head_fill=fill if has_mask else None, mask_scope=pos,
                            inject=inject, last=batch.last):
                    logits = last_logits(lm, batch.input_ids, batch.attention_mask, batch.position_ids)
            except (torch.OutOfMemoryError, RuntimeError) as e:
                bs = halve(lm, e, bs)
                continue
            cs = torch.tensor(cl, device=logits.device)
            ps = torch.tensor([rows[r][1] for r in chunk], device=logits.device)
            out.emit(logits, cs, ps, "configurations (full passes)")
            done += len(chunk)
