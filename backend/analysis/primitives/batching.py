"""Tokenising prompts and running them in sorted, left-padded batches.

Left padding puts every row's last prompt token at position -1; explicit position ids
(cumsum of the mask) make a padded row compute exactly what it computes alone.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from ...model.loading import LoadedModel
from .stopping import check
from ...tasks.base import Prompt, Queries, Task, TaskError
from .bos import DEFAULT as BOS_DEFAULT, current as bos_convention, prompt_ids
from .fit import unknown_id
from .notes import Note, report_multi_token
from .stats import too_few

Progress = Callable[[float, str], None]


@dataclass
class Encoded:
    """Token ids of the prompts and the first token of each candidate label.

    label_ids[i]: first-token ids of prompt i's labels (classification: the order of `Prompt.labels`;
    generation: gold first, then other labels with distinct first tokens); gold[i]: index of the gold
    label in them. multi_token: label strings that span several tokens (scored by the first).
    """

    prompts: list[Prompt]
    ids: list[list[int]]
    label_ids: list[list[int]]
    gold: list[int]
    kind: str
    multi_token: list[str] = field(default_factory=list)


def answer_tokens(lm: LoadedModel, text: str, answer: str) -> list[int]:
    """Tokens of `answer` as it continues `text`: those of text+answer after those of text.

    Falls back to encoding the answer alone when the boundary merges across (BPE can do that).
    """
    tok = lm.tokenizer
    a = tok(text, add_special_tokens=False)["input_ids"]
    b = tok(text + answer, add_special_tokens=False)["input_ids"]
    if b[: len(a)] == a and len(b) > len(a):
        return b[len(a):]
    alone = tok(answer, add_special_tokens=False)["input_ids"]
    if not alone:
        raise TaskError(f"label {answer!r} encodes to no tokens with this tokenizer")
    return alone


def encode(lm: LoadedModel, prompts: Sequence[Prompt], kind: str) -> Encoded:
    """Tokenise prompts and labels; reject prompts beyond the context window and classification labels
    that share a first token."""
    tok = lm.tokenizer
    ids = []
    for p in prompts:
        check()
        ids.append(prompt_ids(tok, p.text))  # the BOS convention in force (primitives/bos.py)
    if lm.max_positions:
        too_long = [i for i, x in enumerate(ids) if len(x) > lm.max_positions]
        if too_long:
            i = too_long[0]
            raise TaskError(f"{len(too_long)} prompt(s) exceed the model's context window of {lm.max_positions} "
                            f"tokens (prompt {i + 1} has {len(ids[i])} tokens); use fewer shots or shorter inputs")
    memo: dict[tuple[str, str], list[int]] = {}
    unk = unknown_id(tok)
    label_ids, gold, multi = [], [], {}
    for p in prompts:
        check()
        firsts = []
        for lab in p.labels:
            # how a label tokenises after a prompt depends only on the prompt's last characters
            key = (p.text[-32:], lab)
            if key not in memo:
                memo[key] = answer_tokens(lm, *key)
            toks = memo[key]
            if unk is not None and toks[0] == unk:
                raise TaskError(f"label {lab!r} is unknown to this model's tokenizer (it encodes to "
                                f"{tok.unk_token!r}); this task does not fit this model")
            if len(toks) > 1 and lab not in multi:
                multi[lab] = tok.decode([toks[0]])
            firsts.append(toks[0])
        if kind == "classification" and len(set(firsts)) < len(firsts):
            seen: dict[int, str] = {}
            for lab, t in zip(p.labels, firsts):
                if t in seen:
                    raise TaskError(f"labels {seen[t]!r} and {lab!r} share their first token "
                                    f"{tok.convert_ids_to_tokens(t)!r}; classification labels need distinct "
                                    f"first tokens")
                seen[t] = lab
        g = p.labels.index(p.gold)
        if kind == "generation":  # open labels: one row per distinct first token, the gold's kept
            keep = [g] + [i for i, t in enumerate(firsts) if t != firsts[g]]
            keep = [i for n, i in enumerate(keep) if firsts[i] not in {firsts[j] for j in keep[:n]}]
            firsts, g = [firsts[i] for i in keep], 0
        label_ids.append(firsts)
        gold.append(g)
    report_multi_token(multi)  # the kernel's one warning for the whole analysis (primitives/notes.py)
    return Encoded(list(prompts), ids, label_ids, gold, kind, sorted(multi))


@dataclass
class Built:
    """Prompts as built for a request: `shots` and `n` may be fewer than asked, and `warnings` say why."""

    prompts: list[Prompt]
    shots: int
    warnings: list[str] = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.prompts)


def build_prompts(lm: LoadedModel, task: Task, shots: int, n: int, seed: int, perturb=None,
                  queries: Queries = "held_out") -> Built:
    """`n` prompts of `shots` demonstrations, seeded, that the model can read.

    - `n` is capped at the task's query pool, so no query is scored twice (a warning says so);
    - demonstrations are dropped (k -> k // 2 ... 0) until every prompt fits the context window (a warning
      says so); even zero-shot prompts not fitting is an error;
    (A task whose inputs the model cannot read is refused before any analysis runs: `kernel.analyze`.)
    `queries` picks the held-out queries (scoring) or the demonstration pool (extracting or training vectors).
    """
    warnings: list[str] = []
    pool = task.n_queries(seed, queries)
    if task.fixed is not None:  # a given prompt set: as given, whatever the shots
        prompts = task.build_prompts(shots, min(n, pool), seed)
        return Built(prompts, max(p.n_shots for p in prompts), _few(len(prompts), queries))
    if n > pool:  # the scored queries capped: a warning; the prompts a vector is extracted from: a note
        what = "held-out queries" if queries == "held_out" else "examples in its demonstration pool"
        text = f"task {task.name!r} has {pool} {what} for seed {seed}; used {pool} prompts, not the {n} asked " \
               f"(each query once)"
        warnings.append(text if queries == "held_out" else Note(text))
        n = pool
    k = shots
    while True:
        prompts = task.build_prompts(k, n, seed, perturb=perturb, queries=queries)
        if not lm.max_positions:
            break
        longest = max(len(prompt_ids(lm.tokenizer, p.text)) for p in prompts)
        if longest <= lm.max_positions:
            break
        if k == 0:
            raise TaskError(f"even the zero-shot prompts of task {task.name!r} exceed the context window of "
                            f"{lm.max_positions} tokens (longest: {longest})")
        k = k // 2 if k > 1 else 0
    if k != shots:
        warnings.append(f"prompts with {shots} demonstrations exceed the context window of {lm.max_positions} "
                        f"tokens; used {k} demonstrations instead")
    return Built(prompts, k, warnings + _few(len(prompts), queries))


def _few(n: int, queries: Queries) -> list[str]:
    """`stats.too_few`'s warning for n scored prompts (none for a vector's extraction prompts)."""
    return [too_few(n)] if queries == "held_out" and too_few(n) else []


_ENCODED: "OrderedDict[tuple, tuple[Built, Encoded]]" = OrderedDict()
_ENCODED_LOCK = threading.Lock()


def built_and_encoded(lm: LoadedModel, task: Task, shots: int, n: int, seed: int) -> tuple[Built, Encoded]:
    """`build_prompts` then `encode` of the held-out queries, remembered for the last few (model, task, shots, n,
    seed, BOS convention) in this process: a live toggle asks for the same prompts again and again. Treat the result as read-only."""
    key = (lm.fingerprint, task.content_hash(), task.kind, shots, n, seed, bos_convention() or BOS_DEFAULT)
    with _ENCODED_LOCK:
        found = _ENCODED.get(key)
        if found is not None:
            _ENCODED.move_to_end(key)
            return found
    built = build_prompts(lm, task, shots, n, seed)
    found = (built, encode(lm, built.prompts, task.kind))
    with _ENCODED_LOCK:
        _ENCODED[key] = found
        while len(_ENCODED) > 16:
            _ENCODED.popitem(last=False)
    return found


@dataclass
class Batch:
    rows: list[int]  # indices into the encoded prompts
    input_ids: torch.Tensor  # (batch, seq)
    attention_mask: torch.Tensor  # (batch, seq)
    position_ids: torch.Tensor  # (batch, seq)
    last: torch.Tensor | None = None  # (batch,) last real token per row; None = position -1 (left padding)


def make_batch(lm: LoadedModel, ids: Sequence[Sequence[int]], rows: list[int], padding: str = "left") -> Batch:
    """Pad rows of token ids to one width; position ids count real tokens only."""
    pad = lm.tokenizer.pad_token_id
    width = max(len(ids[r]) for r in rows)
    inp = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        x = ids[r]
        sl = slice(width - len(x), width) if padding == "left" else slice(0, len(x))
        inp[i, sl] = torch.tensor(x, dtype=torch.long)
        mask[i, sl] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    dev = lm.device
    last = None if padding == "left" else (mask.sum(-1) - 1).to(dev)
    return Batch(rows, inp.to(dev), mask.to(dev), pos.to(dev), last)


def forward_last_logits(lm: LoadedModel, batch: Batch) -> torch.Tensor:
    """Logits at the last token of each row, (batch, vocab), in float32."""
    out = lm.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids,
                   use_cache=False, logits_to_keep=1 if batch.last is None else 0)
    if batch.last is None:
        return out.logits[:, -1].float()
    return out.logits[torch.arange(len(batch.rows), device=out.logits.device), batch.last].float()


def is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower()


def map_batches(lm: LoadedModel, ids: Sequence[Sequence[int]], batch_size: int,
                fn: Callable[[Batch], None], progress: Progress | None = None, label: str = "",
                padding: str = "left") -> int:
    """Apply `fn` to sorted left-padded batches covering all rows, holding the model's lock, under
    `torch.inference_mode`; halve the batch size on CUDA OOM. Returns the batch size that finally worked."""
    with lm.lock, torch.inference_mode():
        return _map_batches(lm, ids, batch_size, fn, progress, label, padding)


def _map_batches(lm: LoadedModel, ids: Sequence[Sequence[int]], batch_size: int, fn: Callable[[Batch], None],
                 progress: Progress | None, label: str, padding: str) -> int:
    order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
    done = 0
    while done < len(order):
        check()  # once per batch: a cancelled job or one past its time limit stops here (`stopping`)
        rows = order[done:done + batch_size]
        try:
            fn(make_batch(lm, ids, rows, padding))
        except (torch.OutOfMemoryError, RuntimeError) as e:
            if not is_oom(e):
                raise
            if lm.device.type == "cuda":
                torch.cuda.empty_cache()
            if batch_size == 1:
                raise MemoryError(f"out of memory even at batch size 1 on {lm.device}: the prompts are too long "
                                  f"for this model on this device (try fewer shots or a smaller model)") from e
            batch_size = max(1, batch_size // 2)
            continue
        done += len(rows)
        if progress:
            progress(done / len(order), label)
    return batch_size
