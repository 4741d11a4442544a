"""TSLA head maps of encoded prompts: one hooked, batched forward pass per batch.

For every prompt and head, the write o[l, h] at the last token is scored against the prompt's label set
(`tsla.tsla`); the maps are means over the prompts, each (layers, heads). The same pass yields the
prompt-level metrics (accuracy, label accuracy, TR ratio).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ...hooks import hooked
from ...models import LoadedModel
from ..primitives.batching import Batch, Encoded, Progress, forward_last_logits, map_batches
from ..primitives.predict import Outcomes, predict_rows
from ..primitives.prefix_store import clean_forward, fits
from ..primitives.tsla import apply_final_ln, head_writes, label_space, tsla

MAP_NAMES = ("tr", "tl", "dla_tr", "dla_tl", "flagged")


@dataclass
class HeadMaps:
    """Means over prompts, each (layers, heads) float64: tr, tl, dla_tr, dla_tl, flagged (share of prompts
    where TR was zero and TL set to 0); and the per-prompt outcomes of the pass."""

    tr: np.ndarray
    tl: np.ndarray
    dla_tr: np.ndarray
    dla_tl: np.ndarray
    flagged: np.ndarray
    outcomes: Outcomes

    def metrics(self) -> dict:
        return self.outcomes.summary(0)


def head_maps(lm: LoadedModel, enc: Encoded, batch_size: int = 16, apply_ln: bool = False,
              progress: Progress | None = None, padding: str = "left", keep_prefix: bool = False) -> HeadMaps:
    """TSLA maps and outcomes of the encoded prompts. `keep_prefix`: keep the prompts' clean prefix states in
    memory (`prefix_store`), so a later last-token ablation of them needs no clean pass."""
    L, H, dev = lm.n_layers, lm.n_heads, lm.device
    sums = torch.zeros(len(MAP_NAMES), L, H, dtype=torch.float64, device=dev)
    out = Outcomes.empty(1, len(enc.ids))
    pinv_cache: dict[tuple[int, ...], torch.Tensor] = {}
    unembed = lm.unembed
    centered = lm.spec.norm == "layernorm"
    gain = lm.norm_gain().to(dev) if apply_ln else None

    keep = keep_prefix and padding == "left" and fits(lm, sum(len(x) for x in enc.ids))

    def step(batch: Batch) -> None:
        pending = None
        with hooked(lm, capture_z=True, capture_resid_final=apply_ln, last=batch.last) as trace:
            if keep:
                logits, pending = clean_forward(lm, batch.input_ids, batch.attention_mask, batch.position_ids,
                                                [enc.ids[r] for r in batch.rows])
            else:
                logits = forward_last_logits(lm, batch)
        if pending is not None:
            pending.store(trace.z(H))
        lab = [enc.label_ids[r] for r in batch.rows]
        gold = [enc.gold[r] for r in batch.rows]
        out.record(np.zeros(len(batch.rows), np.int64), np.array(batch.rows), predict_rows(logits, lab, gold))
        ls = label_space(unembed, lab, gold, pinv_cache)
        z = trace.z(H).float()  # (batch, layers, heads, head_dim)
        for layer in range(L):
            o = head_writes(z[:, layer], lm.w_o(layer), trace.write_scale[layer])  # (batch, heads, d)
            if apply_ln:
                o = apply_final_ln(o, trace.resid_final, gain, lm.norm_eps, centered)
            st = tsla(o, ls)
            for i, v in enumerate((st.tr, st.tl, st.dla_tr, st.dla_tl, st.flagged.double())):
                sums[i, layer] += v.sum(0)

    map_batches(lm, enc.ids, batch_size, step, progress, "scoring heads", padding)
    means = (sums / len(enc.ids)).cpu().numpy()
    return HeadMaps(*means, outcomes=out)
