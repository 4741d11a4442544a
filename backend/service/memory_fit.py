"""Does a model fit this machine's memory? Checked at admission, from its config.json, before anything loads.

    weights  = parameters x bytes per parameter of the precision it loads in (float32: 4, bfloat16: 2)
    needed   = weights x (1 + WORKING_SHARE) + WORKING_BYTES   (activations, the KV cache, a batch's logits)
    free     = HEADLENS_MEMORY_BYTES when set, else the GPU's free memory on a GPU, else the smaller of the
               system's available memory and the cgroup's limit left

Parameters are counted from the config (`parameter_count`): embeddings, the unembedding when untied, and per
decoder layer its query, key, value and output projections (grouped-query attention's smaller key/value heads
included) and its MLP (gated: three matrices; GPT-2: two). A resident model passes: it fits already.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

WORKING_SHARE, WORKING_BYTES = 0.25, 512 << 20
BYTES = {"float32": 4, "float32-onednn": 4, "bfloat16": 2, "float16": 2}
_CGROUP = Path("/sys/fs/cgroup")


def parameter_count(cfg: dict[str, Any]) -> int | None:
    """The parameters a transformers config.json describes (its text config for a multimodal one); None if the
    config lacks the sizes. Norms and biases are left out (under 0.1% of any model here)."""
    cfg = cfg.get("text_config") or cfg
    get = lambda *ks: next((cfg[k] for k in ks if isinstance(cfg.get(k), int) and cfg[k] > 0), None)  # noqa: E731
    layers, heads, d = get("num_hidden_layers", "n_layer"), get("num_attention_heads", "n_head"), \
        get("hidden_size", "n_embd")
    vocab = get("vocab_size")
    if None in (layers, heads, d, vocab):
        return None
    head_dim = get("head_dim") or d // heads
    kv = get("num_key_value_heads") or heads
    ff = get("intermediate_size", "n_inner") or 4 * d
    gated = cfg.get("model_type") not in ("gpt2", "gpt_neox")  # their MLP: two matrices
    attn = d * head_dim * (2 * heads + 2 * kv)
    mlp = (3 if gated else 2) * d * ff
    embed = vocab * d * (1 if cfg.get("tie_word_embeddings", True) else 2)
    if cfg.get("model_type") == "gpt2":  # its learned positions
        embed += (get("n_positions", "max_position_embeddings") or 0) * d
    return int(layers * (attn + mlp) + embed)


def needed_bytes(n_params: int, precision: str = "float32") -> int:
    """The memory a model of `n_params` parameters needs loaded in `precision` and running (module docstring)."""
    return int(n_params * BYTES[precision] * (1 + WORKING_SHARE) + WORKING_BYTES)


def _cgroup_left() -> int | None:
    try:
        limit = (_CGROUP / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return int(limit) - int((_CGROUP / "memory.current").read_text().strip())
    except (OSError, ValueError):
        return None


def free_bytes() -> tuple[int, str]:
    """(bytes free for a model, where: "this machine's memory" or "the GPU's memory")."""
    forced = os.environ.get("HEADLENS_MEMORY_BYTES")
    if forced:
        return int(float(forced)), "this machine's memory (HEADLENS_MEMORY_BYTES)"
    import torch

    if torch.cuda.is_available():
        return int(torch.cuda.mem_get_info()[0]), "the GPU's free memory"
    import psutil

    free = int(psutil.virtual_memory().available)
    left = _cgroup_left()
    return (min(free, left) if left is not None else free), "this machine's memory"


def gb(n: float) -> str:
    return f"{n / 1e9:.1f} GB"


def memory_problem(name: str, cfg: dict[str, Any] | None, precision: str = "float32") -> str | None:
    """Why model `name` (its config.json `cfg`) cannot load here in `precision`, as one sentence; None when it fits
    or its size is unknown (the load then says)."""
    n = parameter_count(cfg) if cfg else None
    if n is None:
        return None
    need = needed_bytes(n, precision)
    free, where = free_bytes()
    if need <= free:
        return None
    half = needed_bytes(n, "bfloat16")
    options = [f"bfloat16 (precision=bfloat16: about {gb(half)})"] if BYTES[precision] > 2 and half <= free else []
    options += [f"a GPU with at least {gb(need)} of memory, or several GPUs with device_map=\"auto\" (the layers "
                f"spread over them)", "a machine with more memory"]
    return (f"model {name!r} needs about {gb(need)} of memory in {precision} ({n / 1e9:.2f}B parameters x "
            f"{BYTES[precision]} bytes, plus {WORKING_SHARE:.0%} and {gb(WORKING_BYTES)} to run), but only "
            f"{gb(free)} of {where} is free; it would take " + "; or ".join(options) + ". Nothing was loaded.")
