"""A job's check runs before every decoder layer of a forward pass (kernel.check_each_layer): a long pass gives way,
stops or times out within one layer, not only between batches."""
from __future__ import annotations

import pytest
import torch

from backend.analysis import kernel
from backend.analysis.primitives.stopping import Stop, checking


class GiveWay(Stop):
    pass


def test_the_check_runs_once_per_layer_and_its_stop_ends_the_pass(tiny_lm):
    kernel.check_each_layer(tiny_lm)
    kernel.check_each_layer(tiny_lm)  # installed once per model
    ids = torch.tensor([[1, 2, 3, 4]])
    calls: list[int] = []
    with torch.no_grad():
        tiny_lm.model(ids)  # outside a job: nothing runs
        with checking(lambda: calls.append(1)):
            tiny_lm.model(ids)
        assert len(calls) == tiny_lm.n_layers

        def stop_at_the_second_layer() -> None:
            calls.append(1)
            if len(calls) > tiny_lm.n_layers + 1:
                raise GiveWay("a live job waits")

        with checking(stop_at_the_second_layer), pytest.raises(GiveWay):
            tiny_lm.model(ids)
    assert len(calls) == tiny_lm.n_layers + 2  # the pass ended at its second layer
