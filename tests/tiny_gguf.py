"""A tiny GGUF file written with the `gguf` package: a random-weight Llama (2 layers, d_model 64, 4 heads, 2 KV
heads) with a byte-level BPE tokenizer of 256 tokens plus a few merges, its matrices quantised to Q8_0, so that
the conversion path (read, dequantise, save, reload) runs in a second or two."""
from __future__ import annotations

from pathlib import Path

import numpy as np

D, FF, H, KV, LAYERS = 64, 128, 4, 2, 2
SPECIALS = ["<|endoftext|>", "<|pad|>"]


def _byte_tokens() -> list[str]:
    """GPT-2's byte-to-unicode table: 256 printable stand-ins for the bytes."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs]


def write_tiny_gguf(path: str | Path, arch: str = "llama", seed: int = 0, quantize: bool = True) -> Path:
    """Write the tiny model to `path` (a .gguf file) and return it. `arch` is written as general.architecture
    (a name other than llama gives a file the loader must refuse)."""
    import gguf

    path = Path(path)
    rng = np.random.default_rng(seed)
    tokens = _byte_tokens()
    merges = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a"]
    tokens += [m.replace(" ", "") for m in merges] + SPECIALS
    types = [gguf.TokenType.NORMAL] * (len(tokens) - len(SPECIALS)) + [gguf.TokenType.CONTROL] * len(SPECIALS)
    vocab = len(tokens)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("headlens tiny gguf")
    w.add_block_count(LAYERS)
    w.add_context_length(256)
    w.add_embedding_length(D)
    w.add_feed_forward_length(FF)
    w.add_head_count(H)
    w.add_head_count_kv(KV)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(D // H)
    w.add_vocab_size(vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(vocab - 2)
    w.add_eos_token_id(vocab - 2)
    w.add_pad_token_id(vocab - 1)

    def tensor(name: str, shape: tuple[int, ...], scale: float = 0.08, norm: bool = False) -> None:
        a = (1.0 + 0.1 * rng.standard_normal(shape) if norm else scale * rng.standard_normal(shape)).astype(np.float32)
        if quantize and a.ndim == 2 and a.shape[-1] % 32 == 0:
            q = gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(name, a)

    dh = D // H
    tensor("token_embd.weight", (vocab, D), 0.3)
    for i in range(LAYERS):
        tensor(f"blk.{i}.attn_norm.weight", (D,), norm=True)
        tensor(f"blk.{i}.attn_q.weight", (H * dh, D))
        tensor(f"blk.{i}.attn_k.weight", (KV * dh, D))
        tensor(f"blk.{i}.attn_v.weight", (KV * dh, D))
        tensor(f"blk.{i}.attn_output.weight", (D, H * dh))
        tensor(f"blk.{i}.ffn_norm.weight", (D,), norm=True)
        tensor(f"blk.{i}.ffn_gate.weight", (FF, D))
        tensor(f"blk.{i}.ffn_up.weight", (FF, D))
        tensor(f"blk.{i}.ffn_down.weight", (D, FF))
    tensor("output_norm.weight", (D,), norm=True)
    tensor("output.weight", (vocab, D))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
