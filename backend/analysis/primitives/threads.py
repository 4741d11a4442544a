"""CPU threads for a model's jobs: the thread count it runs fastest with, measured (`pass_speed.speed`).

A small model's matrices split badly across threads, and on a CPU shared with other work the spinning threads wait
for each other: each op can get tens of times slower (bench/RESULTS.md). On an idle machine, though, two threads
run SmolLM2-135M and Gemma-3-270M 1.6-1.9x faster than one. So the choice between one thread and torch's current
setting is measured on the model (a short probe, `pass_speed.best_threads`, cached per model and thread ceiling,
measured again after a few minutes), not read off its width. GPUs keep torch's setting.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch

from ...model.loading import LoadedModel
from .pass_speed import best_threads


@contextmanager
def cpu_threads(lm: LoadedModel) -> Iterator[None]:
    """Torch's intra-op threads set to the count `lm` runs fastest with on the CPU while it runs; restored after."""
    before = torch.get_num_threads()
    if lm.device.type != "cpu" or before == 1:
        yield
        return
    best = best_threads(lm)
    torch.set_num_threads(best)
    try:
        yield
    finally:
        torch.set_num_threads(before)
