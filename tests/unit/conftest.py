"""The unit tier runs its tiny models on one torch thread: on 2 cores, a second thread only adds scheduling cost to
these shapes, and on a busy machine it makes them several times slower."""
import pytest


@pytest.fixture(scope="session", autouse=True)
def one_thread_unit_tier():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
