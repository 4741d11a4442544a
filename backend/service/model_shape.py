"""A model's size and tokenizer from its files, without loading its weights: what the cost plans need, the same
whether or not the model is resident. No torch and no transformers here (a tokenizer.json is read by `tokenizers`).

| canonical name | shape from | tokens counted by |
|---|---|---|
| `default`, a model folder, a pulled preset or a GGUF file once converted | its config.json | its tokenizer.json |
| a GGUF file not converted yet | the GGUF header (`<arch>.block_count`, ...) | bytes / 4 |
| a Hugging Face id in the local hub cache | the cached config.json | the cached tokenizer |
| anything else (a hub id not downloaded) | `cost.ASSUMED` (a 7B-class model) | bytes / 4 |

Memoised per canonical name and weights folder (a GGUF's first load converts it; from then on its folder answers).
"""
from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any, Callable

from ..analysis.primitives.cost import ASSUMED, Shape
from ..store.safe_json import read_json

log = logging.getLogger(__name__)
_MEMO: dict[tuple[str, str, str], Any] = {}
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


def _config(canonical: str) -> dict[str, Any] | None:
    folder = _folder(canonical)
    cfg = read_json(folder / "config.json", max_bytes=4 << 20, max_depth=12) if folder is not None else None
    return cfg if isinstance(cfg, dict) else None


def _memo(what: str, canonical: str | None, compute: Callable[[str], Any], default: Any = None) -> Any:
    """`compute(canonical)` once per model and weights folder (None: `default`, not memoised: the files may come)."""
    if not canonical:
        return default
    try:
        from ..weights.model_sources import weights_folder

        key = (what, canonical, str(weights_folder(canonical)))
    except Exception:
        key = (what, canonical, "")
    with _LOCK:
        if key in _MEMO:
            return _MEMO[key]
    try:
        got = compute(canonical)
    except Exception as e:  # unreadable files: the default
        log.info("%s of %s unknown (%s: %s)", what, canonical, type(e).__name__, e)
        got = None
    if got is None:
        return default
    with _LOCK:
        _MEMO[key] = got
    return got


def shape_from_config(cfg: dict[str, Any], source: str = "config") -> Shape | None:
    """The Shape a transformers config.json describes (its text config, for a multimodal one); None if it lacks one."""
    cfg = cfg.get("text_config") or cfg
    layers = cfg.get("num_hidden_layers", cfg.get("n_layer"))
    heads = cfg.get("num_attention_heads", cfg.get("n_head"))
    d = cfg.get("hidden_size", cfg.get("n_embd"))
    if not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in (layers, heads, d)):
        return None
    ff = cfg.get("intermediate_size") if isinstance(cfg.get("intermediate_size"), int) else 4 * d
    params = layers * (4 * d * d + 3 * d * ff)  # what a token passes through: the decoder layers
    vocab = cfg.get("vocab_size")
    logit = vocab * d / params if isinstance(vocab, int) and vocab > 0 else 0.0  # a row of logits, in tokens
    positions = cfg.get("max_position_embeddings") or cfg.get("n_positions")
    kv = cfg.get("num_key_value_heads")
    return Shape(layers, heads, d, positions if isinstance(positions, int) else None, params, source, logit,
                 kv if isinstance(kv, int) and not isinstance(kv, bool) and kv > 0 else None)


def _gguf_shape(path: Path) -> Shape | None:
    from ..weights.gguf_files import read_header

    meta = read_header(path)
    arch = meta.get("general.architecture")
    get = lambda k: meta.get(f"{arch}.{k}")  # noqa: E731
    layers, heads, d = get("block_count"), get("attention.head_count"), get("embedding_length")
    if not all(isinstance(x, int) and x > 0 for x in (layers, heads, d)):
        return None
    ff = get("feed_forward_length") if isinstance(get("feed_forward_length"), int) else 4 * d
    kv = get("attention.head_count_kv")
    return Shape(layers, heads, d, get("context_length"), layers * (4 * d * d + 3 * d * ff), "gguf",
                 n_kv_heads=kv if isinstance(kv, int) and kv > 0 else None)


def _shape(canonical: str) -> Shape | None:
    cfg = _config(canonical)
    if cfg is not None:
        return shape_from_config(cfg)
    if canonical.lower().endswith(".gguf") and Path(canonical).is_file():
        return _gguf_shape(Path(canonical))
    from ..weights import presets

    if canonical in presets.PRESETS and presets.record(canonical):
        gguf = presets.preset_dir(canonical) / presets.GGUF_NAME
        return _gguf_shape(gguf) if gguf.is_file() else None
    return None


def model_shape(canonical: str | None) -> Shape:
    """The model's Shape from its files (see the module docstring); `cost.ASSUMED` when they cannot be read."""
    return _memo("shape", canonical, _shape, ASSUMED)


def model_config(canonical: str | None) -> dict[str, Any] | None:
    """Its config.json as read from its files (None when it has none on this disk yet)."""
    return _memo("config", canonical, _config)


def model_type(canonical: str | None) -> str | None:
    """The `model_type` its config.json declares (the adapter table's key), read without loading; None when it has
    no config.json on this disk yet (a GGUF file not converted: its header was checked by `model_sources`)."""
    def kind(c: str) -> str | None:
        t = (_config(c) or {}).get("model_type")
        return t if isinstance(t, str) else None
    return _memo("type", canonical, kind)


def token_counter(canonical: str | None) -> Callable[[str], int] | None:
    """len(tokenizer(text)) of the model's own tokenizer, read from its files without the weights; None when it has
    none on this disk (the caller estimates from bytes)."""
    def counter(c: str) -> Callable[[str], int] | None:
        folder = _folder(c)
        if folder is None or not (folder / "tokenizer.json").is_file():
            return None
        from tokenizers import Tokenizer  # the fast tokenizer's own file: no transformers import (seconds)

        tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        return lambda text: len(tok.encode(text).ids)
    return _memo("tokens", canonical, counter)


def forget(canonical: str) -> None:
    """Drop what is memoised for `canonical` (its config.json has just been fetched into the hub cache)."""
    with _LOCK:
        for key in [k for k in _MEMO if k[1] == canonical]:
            del _MEMO[key]
