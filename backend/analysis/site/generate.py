"""Greedy generation with the KV cache, in left-padded batches, with the answer cut where it ends.

    out = generate(lm, enc.ids, max_new_tokens=20, stop=[";", "\\n"])
    out.texts[i]      # prompt i's continuation, cut before the first stop string
    out.first_logits  # (prompts, vocab): the prefill's last-token logits (first-token metrics come from these)

The prefill runs over the whole (padded) prompt with `use_cache=True`; every later step feeds one token per
row over the cache. Interventions installed with `hooks.hooked(..., prefill_only=True)` around one batch act
on the prefill only, so the decoding steps run as in an uninjected decode over the (injected) cache. `hooks`
builds that context per batch (it gets the batch), so a per-row intervention sees the rows it runs on.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Sequence

import torch

from ...errors import BadInput
from ...model.loading import LoadedModel
from ..primitives.stopping import check
from ..primitives.batching import Batch, Progress, map_batches

HookFactory = Callable[[Batch], ContextManager[Any]]
NEWLINE = "\n"


class GenerationError(BadInput):
    """A model that cannot generate the way this module needs (e.g. it returns no KV cache)."""


@dataclass
class Generated:
    """Per prompt: the generated token ids (up to the stop), the continuation as text (cut before the first
    stop string) and the prefill's last-token logits, (prompts, vocab) float32 on the CPU."""

    tokens: list[list[int]]
    texts: list[str]
    first_logits: torch.Tensor
    steps: int = 0
    raw: list[str] = field(default_factory=list)


def cache_of(out: Any) -> Any:
    """The KV cache a forward pass returned (`cache` in transformers 5, `past_key_values` before), or None."""
    c = getattr(out, "cache", None)
    return c if c is not None else getattr(out, "past_key_values", None)


def cache_kw(lm: LoadedModel) -> str:
    """The forward argument that takes a cache: `cache` (transformers 5) or `past_key_values`."""
    import inspect

    names = inspect.signature(lm.model.forward).parameters
    return "cache" if "cache" in names else "past_key_values"


def require_kv_cache(lm: LoadedModel) -> None:
    """Raise GenerationError when the model returns no KV cache (generation here reuses it step by step)."""
    ids = torch.tensor([[lm.tokenizer.bos_token_id or lm.tokenizer.eos_token_id or 0] * 2], device=lm.device)
    try:
        with lm.lock, torch.inference_mode():
            out = lm.model(input_ids=ids, use_cache=True)
    except Exception as e:  # pragma: no cover - a model that cannot even run two tokens
        raise GenerationError(f"{lm.name} cannot run a forward pass with use_cache=True "
                              f"({type(e).__name__}: {str(e)[:200]})") from None
    if cache_of(out) is None:
        raise GenerationError(f"{lm.name} returns no KV cache (use_cache=True gave none): zero-shot generation "
                              f"with the cache is what this analysis evaluates; this model does not support it")


def cut(text: str, stop: Sequence[str]) -> str:
    """`text` up to (not including) the first occurrence of any stop string."""
    end = len(text)
    for s in stop:
        if s:
            i = text.find(s)
            if i >= 0:
                end = min(end, i)
    return text[:end]


def stop_strings(task: Any) -> list[str]:
    """Where an answer ends for a template task: the template's text after `{output}` (stripped: the
    synthetic tasks' `;`, or a blank line) and a newline."""
    tail = ""
    tmpl = getattr(task, "template", None)
    if tmpl is not None:
        tail = tmpl.text.split("{output}", 1)[1].strip() if "{output}" in tmpl.text else ""
    return list(dict.fromkeys(s for s in (tail, NEWLINE) if s))


def generate(lm: LoadedModel, ids: Sequence[Sequence[int]], *, max_new_tokens: int = 20,
             stop: Sequence[str] = (NEWLINE,), hooks: HookFactory | None = None, batch_size: int = 16,
             progress: Progress | None = None) -> Generated:
    """Greedy continuations of the prompts (token ids), at most `max_new_tokens` each, stopping a row at EOS
    or once its text holds a stop string. `hooks(batch)` wraps each batch's whole generation (prefill and
    decoding steps; use `prefill_only=True` to touch the prefill alone)."""
    if max_new_tokens < 1:
        raise ValueError("max_new_tokens must be at least 1")
    n = len(ids)
    tokens: list[list[int]] = [[] for _ in range(n)]
    first = torch.zeros(n, lm.unembed.shape[0])
    eos = lm.tokenizer.eos_token_id
    dec = lm.tokenizer.decode
    kw = cache_kw(lm)
    steps = [0]

    def step(batch: Batch) -> None:
        b = len(batch.rows)
        mask, pos = batch.attention_mask, batch.position_ids
        done = torch.zeros(b, dtype=torch.bool)
        with (hooks(batch) if hooks is not None else contextlib.nullcontext()):
            out = lm.model(input_ids=batch.input_ids, attention_mask=mask, position_ids=pos, use_cache=True,
                           logits_to_keep=1)
            cache = cache_of(out)
            if cache is None:
                raise GenerationError(f"{lm.name} returned no KV cache: it cannot generate with the cache")
            logits = out.logits[:, -1].float()
            first[batch.rows] = logits.cpu()
            nxt_pos = pos[:, -1:] + 1
            for t in range(max_new_tokens):
                check()  # once per generated token (`stopping`): a long generation stops within one step
                nxt = logits.argmax(-1)
                nxt_ids = nxt.tolist()  # one device -> host copy per step, not one per row
                for i, r in enumerate(batch.rows):
                    if done[i]:
                        continue
                    tok = nxt_ids[i]
                    if eos is not None and tok == eos:
                        done[i] = True
                        continue
                    tokens[r].append(tok)
                    if any(s and s in dec(tokens[r]) for s in stop):
                        done[i] = True
                steps[0] = max(steps[0], t + 1)
                if bool(done.all()) or t == max_new_tokens - 1:
                    break
                mask = torch.cat([mask, torch.ones(b, 1, dtype=mask.dtype, device=mask.device)], dim=1)
                out = lm.model(input_ids=nxt[:, None], attention_mask=mask, position_ids=nxt_pos, use_cache=True,
                               **{kw: cache})
                cache = cache_of(out)
                logits = out.logits[:, -1].float()
                nxt_pos = nxt_pos + 1

    map_batches(lm, ids, batch_size, step, progress, "generating")
    raw = [dec(t) for t in tokens]
    texts = [cut(r, stop) for r in raw]
    return Generated(tokens, texts, first, steps[0], raw)


def exact_match(texts: Sequence[str], golds: Sequence[str]) -> list[bool]:
    """The cut continuation begins with the whole gold answer (both stripped), followed by its end or a character
    that is not a letter or digit: the reference's rule (compare the answer's length of output), at a word
    boundary. A model that answers right and runs on without a separator still matches."""
    out = []
    for t, g in zip(texts, golds):
        s, g = t.strip(), g.strip()
        out.append(bool(g) and s.startswith(g) and (len(s) == len(g) or not s[len(g)].isalnum()))
    return out


def strict_match(texts: Sequence[str], golds: Sequence[str]) -> list[bool]:
    """The cut continuation, stripped, is exactly the gold answer, stripped (the model also ended it)."""
    return [t.strip() == g.strip() for t, g in zip(texts, golds)]


def evaluate_generation(lm: LoadedModel, enc: Any, *, hooks: HookFactory | None = None,
                        stop: Sequence[str] = (NEWLINE,), max_new_tokens: int = 20, batch_size: int = 16,
                        progress: Progress | None = None, keep_rows: int = 0) -> dict[str, Any]:
    """Greedy generation on encoded prompts (`batching.Encoded`): {accuracy, label_accuracy, tr_ratio, n} from the
    prefill's last-token logits (see `predict`), `exact_match` and `strict_match` of the cut answer, and the first
    `keep_rows` per-prompt records {query, gold, output, correct, exact}."""
    from ..primitives.predict import metrics, predict_rows

    g = generate(lm, enc.ids, max_new_tokens=max_new_tokens, stop=stop, hooks=hooks, batch_size=batch_size,
                 progress=progress)
    rp = predict_rows(g.first_logits, enc.label_ids, enc.gold)
    golds = [p.gold for p in enc.prompts]
    em = exact_match(g.texts, golds)
    strict = strict_match(g.texts, golds)
    out = metrics(rp.correct.numpy(), rp.label_correct.numpy(), rp.in_labels.numpy())
    out["exact_match"] = float(sum(em) / max(len(em), 1))
    out["strict_match"] = float(sum(strict) / max(len(strict), 1))
    out["rows"] = [{"query": p.query, "gold": p.gold.strip(), "output": g.texts[i].strip(),
                    "correct": bool(rp.correct[i]), "exact": bool(em[i])}
                   for i, p in enumerate(enc.prompts[:keep_rows])]
    return out
