"""CPU threads for small models: one torch intra-op thread while a small model runs on the CPU.

A small model's matrices are too small to split across threads, and on a CPU shared with other work the spinning
threads wait for each other: each op gets tens of times slower (measured in bench/RESULTS.md). Larger models and
GPUs keep torch's setting.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch

from ...models import LoadedModel

SMALL_D_MODEL = 1024


@contextmanager
def cpu_threads(lm: LoadedModel) -> Iterator[None]:
    """One torch intra-op thread while `lm` (d_model <= SMALL_D_MODEL, on the CPU) runs; restored after."""
    if lm.device.type != "cpu" or lm.d_model > SMALL_D_MODEL or torch.get_num_threads() == 1:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
