"""The precisions a model runs in: their names, the dtypes, and the kernels a precision swaps in.

`float32` (the default on CPU), `bfloat16` and `float32-onednn` (float32 through oneDNN's kernels) are picked at
load (`loading.load_model(precision=...)`); each other than float32 is part of the model's fingerprint
(`loading.fingerprint`), so its results are cached apart.
"""
from __future__ import annotations

import torch
from torch import nn

from ..text import clip


ONEDNN = "float32-onednn"
PRECISIONS: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, ONEDNN: torch.float32}
"""The precisions a user picks (sidebar, `--precision`, `load_model(precision=...)`). bfloat16 keeps float32's range
with 8 bits of mantissa: the forward runs ~3x faster on a CPU with avx512_bf16, and every number moves.
`float32-onednn` (CPU only; CLI and API, not the sidebar) is float32 with the decoder's Linears through oneDNN:
logits within 1e-4 of float32's, maps within 1e-6 of their scale, 1.0-1.1x faster here; not the default because
its last bits differ, so every cached result would change (bench/RESULTS.md, "The forward at the processor's
rate")."""


class OneDnnLinear(nn.Module):
    """A float32 Linear computed by oneDNN: y (..., out) = x (..., in) @ W.T + b, W pre-packed once.

    `weight` and `bias` stay the Linear's own parameters (dense: the adapters read W_O from them); `packed` is
    oneDNN's blocked copy of the weight (not in the state dict)."""

    def __init__(self, lin: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = lin.in_features, lin.out_features
        self.weight, self.bias = lin.weight, lin.bias
        self.packed = torch.ops.mkldnn._reorder_linear_weight(lin.weight.detach(), None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


def use_onednn(layers: nn.Module) -> int:
    """Swap every float32 `nn.Linear` under `layers` (the decoder layers) for a `OneDnnLinear`; the count."""
    n = 0
    for name, child in list(layers.named_children()):
        if type(child) is nn.Linear and child.weight.dtype == torch.float32:
            setattr(layers, name, OneDnnLinear(child))
            n += 1
        else:
            n += use_onednn(child)
    return n


def uses_onednn(model: nn.Module) -> bool:
    return any(isinstance(m, OneDnnLinear) for m in model.modules())
DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16,
           "fp32": torch.float32, "float32": torch.float32}


def dtype_name(dtype: torch.dtype) -> str:
    """`torch.bfloat16` -> `bfloat16`."""
    return str(dtype).replace("torch.", "")


def precision_dtype(precision: str) -> torch.dtype:
    """The dtype of a precision name (`float32`, `bfloat16`); anything else is a ValueError naming the choices."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, not {clip(str(precision), 40)!r}")
    return PRECISIONS[precision]


class ContiguousLinear(nn.Linear):
    """`nn.Linear` on a contiguous copy of its input: y (..., out) = x (..., in) @ W.T + b, the same numbers.

    The unembedding of a model in bfloat16 gets the last position of each row, a strided (batch, 1, d) view: torch
    2.13's CPU bf16 matmul then copies the weight expanded over the batch (SmolLM2: 16 x 576 x 49152 values, 2 s
    of a 2.6 s pass); on a contiguous input it is one GEMM (7 ms)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.contiguous())


def contiguous_unembedding(model: nn.Module) -> None:
    """Outside float32, the output embedding reads its input contiguous (`ContiguousLinear`); float32's is left
    as it is (its GEMM takes the view as fast, and its numbers stay bit-identical)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if type(head) is nn.Linear and head.weight.dtype != torch.float32:
        head.__class__ = ContiguousLinear
