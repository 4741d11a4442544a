"""Activation patching of single heads at the last token, on the configuration engine's per-row configurations.

For target prompts i (encoded, N of them) and every head (l, h), the target is run with z[l, h] at its last
token replaced by a source activation (the output projection's input, split by head):

    fill (layers, heads, head_dim):          the same for every prompt (mean patching: the function vector's CIE)
    fill (prompts, layers, heads, head_dim): prompt i's own source (paired patching: clean prompt i -> target i)

Configuration 0 is the target untouched; configuration 1 + l * H + h patches head (l, h) alone (a last-token mask
with the fill: `engine_rows.RowConfig(mask=head_mask(...), scope="last")`, one token over the clean prefix's KV
cache in the engine). Read out: the gold answer's first-token logit and its probability. Paired fills run one
batch of configurations per prompt (the engine's fill is shared by the prompts of a batch).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from ...model.loading import LoadedModel
from ...tasks.base import TaskError
from ...tasks.perturb import get_perturbation
from .batching import Encoded, Progress
from .configs import RowConfig, head_mask, run_configs


@dataclass
class Patched:
    """gold_logit, gold_prob: (1 + layers * heads, prompts) float64; row 0 the target untouched, row 1 + l * H + h
    with head (l, h) patched."""

    gold_logit: np.ndarray
    gold_prob: np.ndarray

    def per_head(self, which: str = "gold_logit") -> np.ndarray:
        """(layers * heads, prompts) of the patched rows."""
        return getattr(self, which)[1:]


TARGETS = ("zero_shot", "shuffled_inputs", "random_labels", "flipped_labels")
"""Prompt sets to patch into; the perturbations keep the gold answer's token (symbol / number labels rename it)."""
Target = Literal[TARGETS]  # type: ignore[valid-type]


def target_prompts(task: Any, target: str, shots: int, n: int, seed: int) -> list:
    """The `n` prompts patched into: zero-shot ones, or `shots`-shot ones with the demonstrations perturbed."""
    if target == "zero_shot":
        return task.build_prompts(0, n, seed)
    if shots == 0:
        raise TaskError(f"{target.replace('_', ' ')} needs demonstrations to perturb: set shots above 0")
    return task.build_prompts(shots, n, seed, perturb=get_perturbation(target))


def head_configs(lm: LoadedModel) -> list[RowConfig]:
    """Configuration 0 untouched, then one per head (layer-major): that head's last-token z takes the fill."""
    return [RowConfig()] + [RowConfig(mask=head_mask(lm, [(l, h)]), scope="last")
                            for l in range(lm.n_layers) for h in range(lm.n_heads)]


def gold_ids(enc: Encoded) -> list[int]:
    """The gold answer's first-token id of each encoded prompt."""
    return [enc.label_ids[i][enc.gold[i]] for i in range(len(enc.ids))]


def patch_heads(lm: LoadedModel, enc: Encoded, fill: torch.Tensor | None, *, batch_size: int = 32,
                progress: Progress | None = None) -> Patched:
    """The target prompts `enc`, untouched and with each head's last-token z patched to `fill` (see the module);
    fill None: the prompts untouched only (one row)."""
    L, H, dh = lm.n_layers, lm.n_heads, lm.head_dim
    N = len(enc.ids)
    configs = head_configs(lm) if fill is not None else [RowConfig()]
    C = len(configs)
    logit = np.zeros((C, N))
    prob = np.zeros((C, N))
    gold = torch.tensor(gold_ids(enc), device=lm.device)
    per_prompt = fill is not None and fill.dim() == 4
    if per_prompt and tuple(fill.shape) != (N, L, H, dh):
        raise ValueError(f"paired fill of shape {tuple(fill.shape)}, expected ({N}, {L}, {H}, {dh})")

    def reader(prompt_of: list[int]):
        def on_logits(logits: torch.Tensor, cs: torch.Tensor, ps: torch.Tensor) -> None:
            rows = torch.tensor([prompt_of[i] for i in ps.tolist()], device=logits.device)
            g = gold.to(logits.device)[rows]
            lg = logits.gather(1, g[:, None]).squeeze(1)
            pg = torch.softmax(logits.float(), -1).gather(1, g[:, None]).squeeze(1)
            c, p = cs.cpu().numpy(), rows.cpu().numpy()
            logit[c, p] = lg.double().cpu().numpy()
            prob[c, p] = pg.double().cpu().numpy()
        return on_logits

    if not per_prompt:
        run_configs(lm, enc.ids, configs, reader(list(range(N))), fill=fill, batch_size=batch_size, progress=progress)
    else:
        for i in range(N):
            sub = None if progress is None else (lambda f, m="", i=i: progress((i + f) / N, m))
            run_configs(lm, [enc.ids[i]], configs, reader([i]), fill=fill[i], batch_size=batch_size, progress=sub)
    return Patched(logit, prob)


def recovered_share(patched: np.ndarray, clean: np.ndarray, target: np.ndarray,
                    min_gap: float = 1e-6) -> tuple[np.ndarray, float]:
    """The share of the clean-minus-target gold logit that patching a head recovers, and the gap itself.

    patched (heads, prompts): the target's gold logit with one head patched; clean, target (prompts,): unpatched.
        R[head] = mean_i (patched[head, i] - target[i]) / mean_i (clean[i] - target[i])
    a ratio of means over prompts (a prompt whose own gap is ~0 does not blow it up): 1 = the head's source
    activation alone restores the clean gold logit on average, 0 = no change; below 0 or above 1 happen. Where
    |gap| < `min_gap` there is nothing to recover: R is 0 everywhere (the caller says so)."""
    gap = float(np.mean(clean - target))
    if not np.isfinite(gap) or abs(gap) < min_gap:
        return np.zeros(patched.shape[0]), gap
    return (patched - target[None]).mean(1) / gap, gap


def recovered_stderr(patched: np.ndarray, clean: np.ndarray, target: np.ndarray, min_gap: float = 1e-6) -> np.ndarray:
    """Standard error (heads,) of `recovered_share`'s ratio of means R = mean(a) / mean(b), with a_i = patched_i -
    target_i and b_i = clean_i - target_i over prompts i, by the delta method: se = sd_i(a_i - R b_i) /
    (sqrt(prompts) |mean(b)|). 0 where the gap is under `min_gap` (R is 0 there); NaN under 2 prompts."""
    from .stats import stderr

    r, gap = recovered_share(patched, clean, target, min_gap)
    if not np.isfinite(gap) or abs(gap) < min_gap:
        return np.zeros(patched.shape[0])
    resid = (patched - target[None]) - r[:, None] * (clean - target)[None]  # (heads, prompts)
    return stderr(resid.T) / abs(gap)
