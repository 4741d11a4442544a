"""A model's size and tokenizer from its files, without loading its weights: what the cost model needs
(`analysis/primitives/cost.py`), the same whether or not the model is resident.

| canonical name | shape from | tokens counted by |
|---|---|---|
| `default`, a model folder, a pulled preset or a GGUF file once converted | its config.json | its tokenizer.json |
| a GGUF file not converted yet | the GGUF header (`<arch>.block_count`, ...) | bytes / 4 |
| a Hugging Face id in the local hub cache | the cached config.json | the cached tokenizer |
| anything else (a hub id not downloaded) | `cost.ASSUMED` (a 7B-class model) | bytes / 4 |

Both are memoised per canonical name and weights folder (a GGUF's first load converts it once; from then on its
converted folder answers). No torch and no transformers here: a tokenizer.json is read by `tokenizers` alone.
"""
from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any, Callable

from ..analysis.primitives.cost import ASSUMED, Shape

log = logging.getLogger(__name__)
_SHAPES: dict[tuple[str, str], Shape] = {}
_COUNTERS: dict[tuple[str, str], Callable[[str], int] | None] = {}
_TYPES: dict[tuple[str, str], str | None] = {}
_LOCK = threading.Lock()


def _folder(canonical: str) -> Path | None:
    """The folder holding the model's config.json and tokenizer: its weights folder, or a hub id's cached snapshot."""
    from ..weights.model_sources import weights_folder

    folder = weights_folder(canonical)
    if folder is not None and (folder / "config.json").is_file():
        return folder
    if folder is None and not Path(canonical).exists():
        try:
            from huggingface_hub import try_to_load_from_cache

            cfg = try_to_load_from_cache(canonical, "config.json")
            return Path(cfg).parent if isinstance(cfg, str) else None
        except Exception:
            return None
    return None


def shape_from_config(cfg: dict[str, Any], source: str = "config") -> Shape | None:
    """The Shape a transformers config.json describes (its text config, for a multimodal one); None if it lacks one."""
    cfg = cfg.get("text_config") or cfg
    layers = cfg.get("num_hidden_layers", cfg.get("n_layer"))
    heads = cfg.get("num_attention_heads", cfg.get("n_head"))
    d = cfg.get("hidden_size", cfg.get("n_embd"))
    if not all(isinstance(x, int) and x > 0 for x in (layers, heads, d)):
        return None
    ff = cfg.get("intermediate_size") or 4 * d
    params = layers * (4 * d * d + 3 * d * ff)  # what a token passes through: the decoder layers
    vocab = cfg.get("vocab_size")
    logit = vocab * d / params if isinstance(vocab, int) and vocab > 0 else 0.0  # a row of logits, in tokens
    return Shape(layers, heads, d, cfg.get("max_position_embeddings") or cfg.get("n_positions"), params, source,
                 logit)


def _gguf_shape(path: Path) -> Shape | None:
    from ..weights.gguf_files import read_header

    meta = read_header(path)
    arch = meta.get("general.architecture")
    get = lambda k: meta.get(f"{arch}.{k}")  # noqa: E731
    layers, heads, d = get("block_count"), get("attention.head_count"), get("embedding_length")
    if not all(isinstance(x, int) and x > 0 for x in (layers, heads, d)):
        return None
    ff = get("feed_forward_length") if isinstance(get("feed_forward_length"), int) else 4 * d
    return Shape(layers, heads, d, get("context_length"), layers * (4 * d * d + 3 * d * ff), "gguf")


def _key(canonical: str) -> tuple[str, str]:
    try:
        from ..weights.model_sources import weights_folder

        return canonical, str(weights_folder(canonical))
    except Exception:
        return canonical, ""


def model_shape(canonical: str | None) -> Shape:
    """The model's Shape from its files (see the module docstring); `cost.ASSUMED` when they cannot be read."""
    if not canonical:
        return ASSUMED
    key = _key(canonical)
    with _LOCK:
        if key in _SHAPES:
            return _SHAPES[key]
    shape = None
    try:
        folder = _folder(canonical)
        if folder is not None:
            shape = shape_from_config(json.loads((folder / "config.json").read_text()))
        elif canonical.lower().endswith(".gguf") and Path(canonical).is_file():
            shape = _gguf_shape(Path(canonical))
        elif canonical not in ("default",):
            from ..weights import presets

            if canonical in presets.PRESETS:
                rec = presets.record(canonical)
                gguf = presets.preset_dir(canonical) / presets.GGUF_NAME
                shape = _gguf_shape(gguf) if rec and gguf.is_file() else None
    except Exception as e:  # unreadable files: the assumed shape
        log.info("shape of %s unknown (%s: %s); assuming a 7B-class model", canonical, type(e).__name__, e)
    shape = shape or ASSUMED
    with _LOCK:
        _SHAPES[key] = shape
    return shape


def model_type(canonical: str | None) -> str | None:
    """The `model_type` its config.json declares (the adapter table's key), read without loading; None when it has
    no config.json on this disk yet (a GGUF file not converted: its header was checked by `model_sources`)."""
    if not canonical:
        return None
    key = _key(canonical)
    with _LOCK:
        if key in _TYPES:
            return _TYPES[key]
    kind = None
    try:
        folder = _folder(canonical)
        if folder is None:
            return None  # not memoised: a hub id's config may be fetched, a GGUF converted, later
        cfg = json.loads((folder / "config.json").read_text())
        kind = cfg.get("model_type") if isinstance(cfg, dict) else None
        kind = kind if isinstance(kind, str) else None
    except Exception:  # unreadable: the load says why
        return None
    with _LOCK:
        _TYPES[key] = kind
    return kind


def forget(canonical: str) -> None:
    """Drop what is memoised for `canonical` (its config.json has just been fetched into the hub cache)."""
    with _LOCK:
        for memo in (_SHAPES, _COUNTERS, _TYPES):
            for key in [k for k in memo if k[0] == canonical]:
                del memo[key]


def token_counter(canonical: str | None) -> Callable[[str], int] | None:
    """len(tokenizer(text)) of the model's own tokenizer, read from its files without the weights; None when it has
    none on this disk (the caller estimates from bytes)."""
    if not canonical:
        return None
    key = _key(canonical)
    with _LOCK:
        if key in _COUNTERS:
            return _COUNTERS[key]
    count = None
    try:
        folder = _folder(canonical)
        if folder is not None and (folder / "tokenizer.json").is_file():
            from tokenizers import Tokenizer  # the fast tokenizer's own file: no transformers import (seconds)

            tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
            count = lambda text: len(tok.encode(text).ids)  # noqa: E731
    except Exception as e:
        log.info("no tokenizer for %s without loading it (%s); counting bytes", canonical, type(e).__name__)
    with _LOCK:
        _COUNTERS[key] = count
    return count
