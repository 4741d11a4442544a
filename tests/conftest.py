from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
# the shared test helpers (tiny_models, hang, ...) and the tiers' modules, which share fixtures by module name
sys.path[:0] = [str(TESTS), *(str(TESTS / tier) for tier in ("unit", "integration", "acceptance"))]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HEADLENS_AUTO_PULL", "0")  # a `launch` in a test never downloads a model in the background

from tiny_models import CONFIGS, GPT2_TOKENIZER, tiny_model  # noqa: E402
from backend.analysis.kinds import KINDS  # noqa: E402
from ui import settings as ui_settings  # noqa: E402

# a page reads the kinds (names, aliases, params schemas) from the service's capabilities; a test that reads a setting
# or a kind's name without a page reads the registry's own (the same entries)
ui_settings.FALLBACK = lambda kind: (lambda k: k and {"name": k.name, "aliases": list(k.aliases),
                                                    "params": k.schema()})(KINDS.get(kind))

try:  # no deadline for any property test: a busy machine makes any example slow (see tests/hang.py)
    from hypothesis import HealthCheck, settings
except ImportError:  # hypothesis comes with requirements-dev.txt; the fuzz tests skip without it
    pass
else:
    settings.register_profile("headlens", deadline=None, suppress_health_check=[HealthCheck.too_slow])
    settings.load_profile("headlens")


def pytest_report_header(config):
    """Say at the top of every run whether the real-model tier runs (tests/acceptance/test_real_models.py)."""
    from backend.weights import presets

    if presets.is_pulled("smollm2-135m"):
        return f"real-model tier: smollm2-135m is pulled ({presets.preset_dir('smollm2-135m')})"
    return ("real-model tier: SKIPPED, smollm2-135m is not pulled (python -m backend models pull smollm2-135m; "
            "HEADLENS_MODELS_DIR)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """HEADLENS_TEST_CPU_LOG=<file>: one line per test, `cpu_s<TAB>wall_s<TAB>test id` (setup, call and teardown; the
    CPU of this process and of the subprocesses it reaped meanwhile): where the suite's CPU goes, which on a busy
    machine is what its wall time follows."""
    log = os.environ.get("HEADLENS_TEST_CPU_LOG")
    if not log:
        yield
        return
    import time

    t0, w0 = sum(os.times()[:4]), time.monotonic()
    yield
    with open(log, "a") as f:
        f.write(f"{sum(os.times()[:4]) - t0:.2f}\t{time.monotonic() - w0:.2f}\t{item.nodeid}\n")


def pytest_collection_modifyitems(config, items):
    """The tests marked `ray` run last, together, on one shared Ray cluster (`ray_cluster`): Ray starts once for all
    of them and stops at the end of the session, right after them (an idle Ray would use CPU all along)."""
    items[:] = sorted(items, key=lambda item: item.get_closest_marker("ray") is not None)  # stable: order kept


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray instance (2 CPUs: two actors of 1 CPU at most) for every test marked `ray`, started by the first
    of them; skipped without the Ray extra. A script joins it with RAY_ADDRESS set to
    `ray_cluster.get_runtime_context().gcs_address`."""
    ray = pytest.importorskip("ray")
    started = not ray.is_initialized()
    if started:
        # Ray's processes take RAY_AUTH_MODE from the environment, its driver from the one it was imported in: a
        # `token` set since (connect() sets it when this machine has a cluster's token) would lock the driver out
        mode = os.environ.pop("RAY_AUTH_MODE", None)
        try:
            ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="warning",
                     log_to_driver=False)
        finally:
            if mode is not None:
                os.environ["RAY_AUTH_MODE"] = mode
    yield ray
    if started:
        ray.shutdown()


@pytest.fixture(autouse=True)
def _shared_ray(request):
    """A test marked `ray` runs with the shared cluster up (a test that starts Ray only when it is not running
    joins it instead)."""
    if request.node.get_closest_marker("ray") is not None and request.node.get_closest_marker("netns") is None:
        request.getfixturevalue("ray_cluster")  # (a `netns` test brings its own cluster, in other hosts)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Every test gets its own cache folder, so no test reads another's results; estimates are not corrected by
    the runs of earlier tests (`service/timing.py`: HEADLENS_TIMINGS off; its own tests turn it on)."""
    monkeypatch.setenv("HEADLENS_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    monkeypatch.setenv("HEADLENS_TIMINGS", "off")


@pytest.fixture(scope="session")
def gpt2_tokenizer():
    if not GPT2_TOKENIZER.is_dir():
        pytest.skip("../shared/gpt2-tokenizer is absent")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(GPT2_TOKENIZER))


_lm_cache: dict = {}


@pytest.fixture(params=sorted(CONFIGS))
def tiny_lm(request, gpt2_tokenizer):
    """A LoadedModel of each supported family, random weights, real GPT-2 tokenisation."""
    from backend.model.loading import wrap

    arch = request.param
    if arch not in _lm_cache:
        _lm_cache[arch] = wrap(tiny_model(arch), gpt2_tokenizer, f"tiny-{arch}")
    return _lm_cache[arch]


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module of tiny-model tests (as the kinds run them on a CPU; faster on a busy one).
    A module asks for it with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory):
    """One cache folder per test module, so a module's tests reuse each other's results."""
    return tmp_path_factory.mktemp("module-cache")


@pytest.fixture
def inprocess(monkeypatch, shared_cache):
    """The service in this process (`HEADLENS_BACKEND_URL=inprocess`), on the module's cache folder."""
    from ui import api

    for var in ("HEADLENS_TOKEN", "HEADLENS_MODEL_ROOT", "HEADLENS_DEFAULT_MODEL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HEADLENS_BACKEND_URL", "inprocess")
    monkeypatch.setenv("HEADLENS_CACHE_DIR", str(shared_cache))
    api.reset_clients()
    yield api
    api.reset_clients()
