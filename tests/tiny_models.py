"""Tiny random-weight models of every supported family, built from transformers config classes."""
from __future__ import annotations

from pathlib import Path

import torch
import transformers as T

SHARED = Path(__file__).resolve().parents[2] / "shared"
GPT2_TOKENIZER = SHARED / "gpt2-tokenizer"
FV_DATASETS = SHARED / "fv_datasets"
VOCAB = 50257
POST_NORM_TYPES = ("gemma2", "gemma3_text")  # families whose attention output passes a norm before the residual add

_common = dict(num_hidden_layers=2, hidden_size=48, intermediate_size=96, vocab_size=VOCAB,
               max_position_embeddings=256)
CONFIGS = {
    "gpt2": lambda: T.GPT2Config(n_layer=2, n_head=4, n_embd=48, vocab_size=VOCAB, n_positions=256,
                                 bos_token_id=50256, eos_token_id=50256),
    "gpt_neox": lambda: T.GPTNeoXConfig(num_attention_heads=4, **_common),
    "llama": lambda: T.LlamaConfig(num_attention_heads=6, num_key_value_heads=2, **_common),
    "mistral": lambda: T.MistralConfig(num_attention_heads=4, num_key_value_heads=2, **_common),
    "qwen2": lambda: T.Qwen2Config(num_attention_heads=4, num_key_value_heads=2, **_common),
    "qwen3": lambda: T.Qwen3Config(num_attention_heads=4, num_key_value_heads=2, head_dim=16, **_common),
    "gemma": lambda: T.GemmaConfig(num_attention_heads=4, num_key_value_heads=1, head_dim=16, **_common),
    "gemma2": lambda: T.Gemma2Config(num_attention_heads=4, num_key_value_heads=2, head_dim=16, **_common),
    "gemma3_text": lambda: T.Gemma3TextConfig(num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                              **_common),
}


def tiny_model(arch: str, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    cfg = CONFIGS[arch]()
    model = T.AutoModelForCausalLM.from_config(cfg)
    # random biases on every output projection, so the decomposition test covers them
    for name, mod in model.named_modules():
        if getattr(mod, "bias", None) is not None and isinstance(mod.bias, torch.nn.Parameter):
            torch.nn.init.normal_(mod.bias, std=0.02)
    # post-attention norms (Gemma 2 / 3) with per-dimension gains far from 1 (1 + w, w ~ N(1, 0.5)), so the tests
    # of head writes taken after that norm have teeth
    for name, mod in model.named_modules():
        if name.endswith("post_attention_layernorm") and cfg.model_type in POST_NORM_TYPES:
            torch.nn.init.normal_(mod.weight, mean=1.0, std=0.5)
    return model.eval()
