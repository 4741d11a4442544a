"""TSLA head maps of encoded prompts: one hooked, batched forward pass per batch.

For every prompt and head, the write o[l, h] at the last token is scored against the prompt's label set
(`tsla.tsla`); the maps are means over the prompts, each (layers, heads). The same pass yields the
prompt-level metrics (accuracy, label accuracy, TR ratio). Each prompt's values are kept beside the sums
(`HeadMaps.per_prompt`), and with `null_seed` each head's TR onto random label subspaces of the same size is summed
per draw from the same writes (`tr_null`): the maps' intervals and tests cost no forward pass.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from ...model.hooks import Trace, hooked
from ...model.loading import LoadedModel
from ..primitives.batching import Batch, Encoded, Progress, forward_last_logits, map_batches
from ..primitives.map_stats import normal_interval
from ..primitives.predict import Outcomes, metrics, predict_rows
from ..primitives.prefix_store import clean_forward, fits
from ..primitives.tr_null import build_null, n_draws, null_rows, null_tr_sum, sequential_null
from ..primitives.tsla import apply_final_ln, head_writes, label_space, tsla

MAP_NAMES = ("tr", "tl", "dla_tr", "dla_tl", "flagged")
PER_PROMPT = ("tr", "tl", "dla_tr", "dla_tl")
"""The maps kept prompt by prompt (the first four of MAP_NAMES)."""


@dataclass
class HeadMaps:
    """Means over prompts, each (layers, heads) float64: tr, tl, dla_tr, dla_tl, flagged (share of prompts
    where TR was zero and TL set to 0); the per-prompt outcomes of the pass; `per_prompt`: each of PER_PROMPT's
    maps prompt by prompt, (prompts, layers, heads) float64 in prompt order (their means are the maps up to the
    order of the float sums); `null_tr`: (draws, layers, heads) mean TR over the prompts onto each draw's random label
    subspace (`tr_null`; NaN for the draws a head did not need, `tr_null.sequential_null`), None without
    `null_seed`."""

    tr: np.ndarray
    tl: np.ndarray
    dla_tr: np.ndarray
    dla_tl: np.ndarray
    flagged: np.ndarray
    outcomes: Outcomes
    per_prompt: dict[str, np.ndarray] | None = None
    null_tr: np.ndarray | None = None

    def metrics(self) -> dict:
        return self.outcomes.summary(0)


PartialMaps = Callable[[dict[str, Any]], None]
"""Called with the maps so far (`partial_maps`) as prompts finish: an anytime view of a long scoring pass."""
WRITES_BYTES = 512 << 20  # every prompt's last-token head writes, kept for the null after the pass, at most this
FIRST_ROWS = 4  # an anytime pass's first view: after this many prompts (one CPU thread only; `slices`)


def slices(rows: int) -> list[tuple[int, int]]:
    """An anytime first batch's slices: FIRST_ROWS rows, then each slice as many rows as all before it (4, 4, 8,
    16, ...: a view after 4, 8, 16 ... prompts, in few passes; each extra pass costs a little on a busy CPU)."""
    out, lo = [], 0
    while lo < rows:
        hi = min(rows, max(FIRST_ROWS, 2 * lo))
        out.append((lo, hi))
        lo = hi
    return out


def partial_maps(sums: torch.Tensor, out: Outcomes, rows: list[int], total: int,
                 per: torch.Tensor | None = None) -> dict[str, Any]:
    """The maps so far: each sum over the `rows` done / their count, (layers, heads) as lists; their metrics; and
    `prompts_done` of `total`. On the side of the final means (which divide the same sums by the total once).
    With `per` (PER_PROMPT's maps prompt by prompt, (4, prompts, layers, heads), filled for the rows done):
    `stats` {map: {se, ci_low, ci_high}} of the prompts done, the interval normal (`map_stats.normal_interval`;
    the final result's is the bootstrap's), `interval: "normal"`; None where undefined (under 2 prompts)."""
    means = (sums / max(len(rows), 1)).cpu().numpy()
    idx = np.sort(np.asarray(rows, dtype=np.int64))  # prompt order (batches run by length): per_prompt reads so
    m = metrics(out.correct[0, idx], out.label_correct[0, idx], out.in_labels[0, idx])
    view = {"kind": "maps", "prompts_done": len(rows), "prompts": total,
            **{k: v.tolist() for k, v in zip(MAP_NAMES, means)}, "icl": m}
    if per is not None:
        x = per[:, torch.as_tensor(idx, device=per.device)].cpu().numpy()
        view["stats"] = {k: {f: _finite(v) for f, v in normal_interval(x[i], means[i]).items()}
                         for i, k in enumerate(PER_PROMPT)}
        view["interval"] = "normal"
    return view


def _finite(a: np.ndarray) -> list:
    """An array as nested lists with NaN as None (JSON-safe live data)."""
    return np.where(np.isfinite(a), a, None).tolist()


def score_heads(lm: LoadedModel, enc: Encoded, batch_size: int = 16, apply_ln: bool = False,
              progress: Progress | None = None, padding: str = "left", keep_prefix: bool = False,
              partial: PartialMaps | None = None, null_seed: int | None = None) -> HeadMaps:
    """TSLA maps and outcomes of the encoded prompts. `keep_prefix`: keep the prompts' clean prefix states in
    memory (`prefix_store`), so a later last-token ablation of them needs no clean pass.

    `partial` (an anytime pass): called with `partial_maps` as prompts finish, their `prompts_done` increasing.
    On a CPU with one torch thread the first batch's forward pass then runs in slices (`slices`: 4, 4, 8 ... rows) at the batch's full
    width (each row sees the same padded input; the captured tensors are joined back into the batch), the maps so
    far published after each slice, so the first view comes after FIRST_ROWS prompts, not a whole batch; then
    after each batch. The scores are computed on the joined batch as without `partial` (the slices' maps on the side),
    so the final maps are the same, bit for bit (tests/integration/test_anytime_maps.py).

    `null_seed`: also sum each head's TR onto `tr_null.n_draws` random label subspaces (seeded), for its p-value."""
    L, H, dev = lm.n_layers, lm.n_heads, lm.device
    sums = torch.zeros(len(MAP_NAMES), L, H, dtype=torch.float64, device=dev)
    out = Outcomes.empty(1, len(enc.ids))
    pinv_cache: dict[tuple[int, ...], torch.Tensor] = {}
    unembed = lm.unembed
    centered = lm.spec.centered
    gain = lm.norm_gain().to(dev) if apply_ln else None
    done: list[int] = []  # rows scored so far, in order
    n = len(enc.ids)
    per = torch.zeros(len(PER_PROMPT), n, L, H, dtype=torch.float64, device=dev)
    null = None if null_seed is None else build_null(unembed, enc.label_ids, n_draws(L * H), null_seed)
    # the null after the pass, sequentially (`tr_null.sequential_null`), from every prompt's saved writes when they
    # fit WRITES_BYTES; else every draw during the pass, batch by batch
    saved = None
    if null is not None and n * L * H * lm.d_model * 4 <= WRITES_BYTES:
        saved = torch.empty(n, L * H, lm.d_model, dtype=torch.float32, device=dev)
    null_sums = None if null is None or saved is not None else \
        torch.zeros(L, H, null.draws, dtype=torch.float64, device=dev)

    keep = keep_prefix and padding == "left" and fits(lm, sum(len(x) for x in enc.ids))
    # on one CPU thread (the service's default) a slice costs what its rows cost in the batch; with several threads
    # on a busy CPU each extra pass adds their waits on each other (1.7x the first batch's CPU time on 2 threads)
    split = partial is not None and padding == "left" and dev.type == "cpu" and torch.get_num_threads() == 1

    def forward(batch: Batch, lo: int, hi: int) -> tuple[torch.Tensor, Trace]:
        """Rows lo:hi of the batch through the hooked model: last-token logits and the trace."""
        rows = batch.rows[lo:hi]
        pending = None
        with hooked(lm, capture_z=True, capture_resid_final=apply_ln, last=batch.last) as trace:
            if keep:
                logits, pending = clean_forward(lm, batch.input_ids[lo:hi], batch.attention_mask[lo:hi],
                                                batch.position_ids[lo:hi], [enc.ids[r] for r in rows])
            elif hi - lo == len(batch.rows):
                logits = forward_last_logits(lm, batch)
            else:
                logits = forward_last_logits(lm, Batch(rows, batch.input_ids[lo:hi], batch.attention_mask[lo:hi],
                                                       batch.position_ids[lo:hi]))
        if pending is not None:
            pending.store(trace.z(H))
        return logits, trace

    def score(rows: list[int], logits: torch.Tensor, z: torch.Tensor, write_scale: list, resid_final,
              into: torch.Tensor) -> None:
        """Add the rows' per-head scores to `into` (5, layers, heads) and record their outcomes; into the final
        sums: keep them per prompt, and add their TR onto the null's random subspaces."""
        final = into is sums
        ridx = torch.as_tensor(rows, device=dev)
        lab = [enc.label_ids[r] for r in rows]
        gold = [enc.gold[r] for r in rows]
        out.record(np.zeros(len(rows), np.int64), np.array(rows), predict_rows(logits, lab, gold))
        ls = label_space(unembed, lab, gold, pinv_cache)
        nb = null_rows(null, lab) if final and null_sums is not None else None
        keep_writes = final and saved is not None
        z, writes = z.float(), []  # z (batch, layers, heads, head_dim); writes: each layer's o for the null
        for layer in range(L):
            o = head_writes(z[:, layer], lm.w_o(layer), write_scale[layer])  # (batch, heads, d)
            if apply_ln:
                o = apply_final_ln(o, resid_final, gain, lm.norm_eps, centered)
            st = tsla(o, ls)
            for i, v in enumerate((st.tr, st.tl, st.dla_tr, st.dla_tl, st.flagged.double())):
                into[i, layer] += v.sum(0)
                if i < len(PER_PROMPT):  # a slice's rows (a view's SE) are written again by the whole batch
                    per[i, ridx, layer] = v
            writes += [o] if nb is not None or keep_writes else []
        if keep_writes:
            saved[ridx] = torch.stack(writes, 1).flatten(1, 2)
        if nb is not None:  # every layer's heads at once: (batch, layers x heads, d)
            null_sums.add_(null_tr_sum(torch.stack(writes, 1).flatten(1, 2), null, nb).view(L, H, -1))

    def step(batch: Batch) -> None:
        b = len(batch.rows)
        if not (split and not done and b > FIRST_ROWS):
            logits, trace = forward(batch, 0, b)
            score(batch.rows, logits, trace.z(H), trace.write_scale, trace.resid_final, sums)
        else:  # the first batch in slices; the maps so far published on the side after each slice but the last
            parts, preview = [], sums.clone()
            for lo, hi in slices(b):
                logits, trace = forward(batch, lo, hi)
                parts.append((logits, trace))
                if hi < b:
                    score(batch.rows[lo:hi], logits, trace.z(H), trace.write_scale, trace.resid_final, preview)
                    partial(partial_maps(preview, out, done + batch.rows[:hi], n, per))
                    if progress:
                        progress(hi / n, "scoring heads")
            logits = torch.cat([p[0] for p in parts])
            z = torch.cat([p[1].z(H) for p in parts])
            scale = [None if parts[0][1].write_scale[l] is None else torch.cat([p[1].write_scale[l] for p in parts])
                     for l in range(L)]
            resid = None if parts[0][1].resid_final is None else torch.cat([p[1].resid_final for p in parts])
            score(batch.rows, logits, z, scale, resid, sums)  # as without `partial`: the whole batch at once
        done.extend(batch.rows)
        if partial is not None:
            partial(partial_maps(sums, out, done, n, per))

    map_batches(lm, enc.ids, batch_size, step, progress, "scoring heads", padding)
    means = (sums / len(enc.ids)).cpu().numpy()
    kept = dict(zip(PER_PROMPT, per.cpu().numpy()))
    nulls = None if null_sums is None else (null_sums / len(enc.ids)).permute(2, 0, 1).cpu().numpy()
    if saved is not None and null is not None:
        observed = (sums[0] / n).flatten()
        nulls = sequential_null(saved, null_rows(null, enc.label_ids), observed, null).view(-1, L, H).cpu().numpy()
    return HeadMaps(*means, outcomes=out, per_prompt=kept, null_tr=nulls)
