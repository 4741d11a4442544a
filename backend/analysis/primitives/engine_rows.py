"""The configuration engine's configurations and their bookkeeping: `RowConfig` (what a configuration does), `route_config` (what
the engine does with it: nothing, a last-token step, or a pass from its start layer), `Emitter` (each
(configuration, prompt) pair's logits handed on exactly once), one pass's last-token logits, and halving the batch
on out-of-memory. The engine: `engine.py` (`run_configs`, full passes) and `engine_fast.py` (the fast paths)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal, Sequence

import torch

from ...model.loading import LoadedModel

from .batching import is_oom

OnLogits = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]
Progress = Callable[[float, str], None]


@dataclass(frozen=True)
class RowConfig:
    """One configuration.

    mask:      (layers, heads) multipliers on each head's z (1 keeps, 0 ablates); with `fill`,
               z' = m z + (1 - m) fill. None: no mask.
    scope: where the mask acts: "all" positions or the "last" token.
    inject:    {layer: (d_model,)} added at the input of decoder layer `layer` at the last token (1..n_layers: the
               output of layer - 1; n_layers: the final norm's input; the embeddings, 0, are not an engine site).
    """

    mask: torch.Tensor | None = None
    scope: Literal["all", "last"] = "all"
    inject: dict[int, torch.Tensor] | None = None


@dataclass
class Route:
    """What the engine does with one configuration."""

    kind: Literal["clean", "last", "all"]
    start: int = 0  # first decoder layer that computes anything other than the clean run does
    mask: torch.Tensor | None = None  # non-trivial mask, on the model's device
    inject: dict[int, torch.Tensor] | None = None  # {input layer: v}, non-zero vectors only, on the model's device


def route_config(lm: LoadedModel, i: int, cfg: RowConfig) -> Route:
    L, H, d = lm.n_layers, lm.n_heads, lm.d_model
    if cfg.scope not in ("all", "last"):
        raise ValueError(f"configuration {i}: scope must be 'all' or 'last', not {cfg.scope!r}")
    mask = None
    if cfg.mask is not None:
        if tuple(cfg.mask.shape) != (L, H):
            raise ValueError(f"configuration {i}: mask of shape {tuple(cfg.mask.shape)}, expected ({L}, {H}) "
                             f"(layers, heads)")
        m = cfg.mask.detach().to(device=lm.device, dtype=torch.float32)
        if (m != 1).any():
            mask = m
    inject = {}
    for layer, v in (cfg.inject or {}).items():
        layer = int(layer)
        if not 1 <= layer <= L:
            raise ValueError(f"configuration {i}: injection at the input of layer {layer}; the engine injects at "
                             f"the inputs of layers 1..{L} ({L}: the final norm's input)")
        if tuple(v.shape) != (d,):
            raise ValueError(f"configuration {i}: injected vector of shape {tuple(v.shape)}, expected ({d},)")
        v = v.detach().to(device=lm.device, dtype=torch.float32)
        if (v != 0).any():
            inject[layer] = inject[layer] + v if layer in inject else v
    inject = inject or None
    if mask is None and inject is None:
        return Route("clean")
    start = L  # the first decoder layer whose input (or, for a mask, whose own output) differs from the clean run's
    if mask is not None:
        start = int((mask != 1).any(1).nonzero()[0])
    if inject:
        start = min(start, min(inject))
    if mask is None or cfg.scope == "last" or start >= L - 1:
        # only the last token leaves the last layer: an all-position mask there acts as a last-token one
        return Route("last", start=start, mask=mask, inject=inject)
    return Route("all", start=start, mask=mask, inject=inject)


class Emitter:
    """Hands rows to `on_logits` once each (retries after an OOM skip what was delivered) and reports progress."""

    def __init__(self, n_configs: int, n_prompts: int, on_logits: OnLogits, progress: Progress | None):
        self.done = torch.zeros(n_configs, n_prompts, dtype=torch.bool)
        self.count, self.total = 0, n_configs * n_prompts
        self.on_logits, self.progress = on_logits, progress

    def pending(self, configs: Sequence[int], prompts: Sequence[int]) -> list[int]:
        """The configurations not yet delivered for every one of `prompts`."""
        sub = self.done[torch.tensor(list(configs), dtype=torch.long)][:, torch.tensor(list(prompts), dtype=torch.long)]
        return [c for c, full in zip(configs, sub.all(1).tolist()) if not full]

    def emit(self, logits: torch.Tensor, cs: torch.Tensor, ps: torch.Tensor, message: str) -> None:
        cc, pp = cs.cpu(), ps.cpu()
        keep = ~self.done[cc, pp]
        if not keep.any():
            return
        if not keep.all():
            k = keep.to(logits.device)
            logits, cs, ps, cc, pp = logits[k], cs[k], ps[k], cc[keep], pp[keep]
        self.done[cc, pp] = True
        self.count += len(cc)
        self.on_logits(logits.float(), cs, ps)
        if self.progress:
            self.progress(self.count / self.total, message)


def last_logits(lm: LoadedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 position_ids: torch.Tensor, cache=None) -> torch.Tensor:
    o = lm.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, cache=cache,
                 use_cache=cache is not None, logits_to_keep=1)
    return o.logits[:, -1].float()


def halve(lm: LoadedModel, e: BaseException, bs: int) -> int:
    if not is_oom(e):
        raise e
    if lm.device.type == "cuda":
        torch.cuda.empty_cache()
    if bs == 1:
        raise MemoryError(f"out of memory even at batch size 1 on {lm.device}: the prompts are too long for this "
                          f"model on this device (try fewer shots or a smaller model)") from e
    return max(1, bs // 2)
