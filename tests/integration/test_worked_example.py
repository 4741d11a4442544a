"""The worked example of docs/architecture.md ("Adding a kind"): a kind is its three blocks there, and nothing else.

The test takes the module, the registry entry and the page section from the page itself (so the docs cannot drift
from what works), loads the module under its documented name (`backend.analysis.general.head_norms`, from a temporary
file: the product's tree is not touched and `head_norms` is not one of the product's kinds), registers the entry at
run time, and checks the kind answers over HTTP, on the command line and in Python with the same numbers, that its
Python function has a real signature, and that its page section renders its settings and its result.
"""
from __future__ import annotations

import importlib.util
import inspect
import json
import re
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import backend
from hang import HANG_S

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "architecture.md"
MODULE = "backend.analysis.general.head_norms"


def blocks() -> dict[str, str]:
    """The worked example's code blocks by name (`<!-- example: NAME -->` before a python block)."""
    return dict(re.findall(r"<!-- example: (\w+) -->\n```python\n(.*?)```", DOC.read_text(), re.S))


@pytest.fixture(scope="module")
def kind(tmp_path_factory):
    from backend.analysis.kinds import KINDS, Kind, register, unregister

    b = blocks()
    assert set(b) == {"module", "entry", "page"}
    assert "head_norms" not in KINDS and MODULE not in sys.modules
    assert not (REPO / "backend/analysis/general/head_norms.py").exists()  # not one of the product's kinds
    path = tmp_path_factory.mktemp("example") / "head_norms.py"
    path.write_text(b["module"])
    spec = importlib.util.spec_from_file_location(MODULE, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[MODULE] = module
    spec.loader.exec_module(module)
    entry = eval(b["entry"], {"Kind": Kind})  # the entry exactly as the docs write it in _ENTRIES
    register(entry)
    yield entry
    unregister("head_norms")
    sys.modules.pop(MODULE, None)
    vars(backend).pop("head_norms", None)


@pytest.fixture(scope="module")
def lm():
    return backend.load_model("default")


def expected(lm, norm: str) -> np.ndarray:
    """||W_O[l, h]||_F or sigma_max(W_O[l, h]), head by head, computed here independently."""
    out = np.zeros((lm.n_layers, lm.n_heads))
    for l in range(lm.n_layers):
        w = lm.w_o(l)
        for h in range(lm.n_heads):
            out[l, h] = float(torch.sqrt((w[h] ** 2).sum()) if norm == "fro" else torch.linalg.svdvals(w[h])[0])
    return out


def test_the_python_function_has_a_real_signature_and_the_numbers(kind, lm):
    sig = inspect.signature(backend.head_norms)
    assert list(sig.parameters) == ["lm", "norm", "top_k", "cache", "progress"]
    assert sig.parameters["norm"].default == "fro" and sig.parameters["top_k"].default == 5
    assert "fro: the Frobenius norm" in backend.head_norms.__doc__
    fro = backend.head_norms(lm, cache=False)
    assert type(fro).__name__ == "HeadNormsResult" and fro.norms.shape == (lm.n_layers, lm.n_heads)
    assert np.allclose(fro.norms, expected(lm, "fro"), rtol=1e-5)
    spectral = backend.head_norms(lm, norm="spectral", top_k=3, cache=False)
    assert np.allclose(spectral.norms, expected(lm, "spectral"), rtol=1e-4)
    assert np.all(spectral.norms <= fro.norms * (1 + 1e-6))  # sigma_max <= ||.||_F
    assert len(spectral.top) == 3 and [spectral.norms[l, h] for l, h in spectral.top] == \
        sorted(spectral.norms.ravel(), reverse=True)[:3]
    with pytest.raises(TypeError, match="takes no task"):
        backend.head_norms(lm, "a task")


def test_it_answers_over_http_with_its_schema(kind, lm):
    from fastapi.testclient import TestClient

    from backend.service.app import create_app

    with TestClient(create_app()) as c:
        caps = {k["name"]: k for k in c.get("/capabilities").json()["job_kinds"]}
        assert caps["head_norms"]["params"]["properties"]["norm"]["enum"] == ["fro", "spectral"]
        assert caps["head_norms"]["uses_task"] is False and "norms" in caps["head_norms"]["result"]["properties"]
        bad = c.post("/jobs", json={"kind": "head_norms", "model": "default", "norm": "nuclear"})
        assert bad.status_code == 422 and "norm" in bad.json()["detail"]
        est = c.post("/jobs/estimate", json={"kind": "head_norms", "model": "default"})
        assert est.status_code == 200 and est.json()["admitted"] is True
        job = c.post("/jobs", json={"kind": "head_norms", "model": "default", "norm": "spectral", "top_k": 3}).json()
        deadline = time.monotonic() + HANG_S
        while job["status"] in ("queued", "running") and time.monotonic() < deadline:
            time.sleep(0.05)
            job = c.get(f"/jobs/{job['id']}").json()
        assert job["status"] == "done", job.get("error")
    assert np.allclose(job["result"]["norms"], expected(lm, "spectral"), rtol=1e-4)
    assert [list(h) for h in job["result"]["top"]] == [list(h) for h in backend.head_norms(
        lm, norm="spectral", top_k=3, cache=False).top]


def test_it_is_a_subcommand_with_flags_from_its_params(kind, lm, tmp_path):
    from backend.cli import main

    out = tmp_path / "n.json"
    assert main(["head-norms", "--model", "default", "--norm", "spectral", "--top-k", "2", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert np.allclose(r["norms"], expected(lm, "spectral"), rtol=1e-4) and len(r["top"]) == 2
    assert main(["head-norms", "--model", "default", "--top-k", "0"]) == 2  # validated by its params model


def test_its_page_section_renders_its_settings_and_result(kind, lm, inprocess, tmp_path):
    from streamlit.testing.v1 import AppTest

    from page_checks import assert_clean, figure, vals

    (tmp_path / "app.py").write_text((REPO / "app.py").read_text())  # the dashboard, one more page: the example
    (tmp_path / "pages").mkdir()
    for f in (REPO / "pages").glob("*.py"):
        (tmp_path / "pages" / f.name).symlink_to(f)
    page = tmp_path / "pages" / "8_Head_norms.py"
    page.write_text("from ui import layout\n\ns, caps = layout.page_setup('Head norms')\n" + blocks()["page"])
    at = AppTest.from_file(str(tmp_path / "app.py"), default_timeout=HANG_S)
    at.switch_page("pages/8_Head_norms.py")
    at.run()
    assert_clean(at)
    norm = next(w for w in at.selectbox if w.label == "Norm")
    assert norm.options == ["fro", "spectral"] and norm.value == "fro"
    assert any(w.label == "Top k" and w.value == 5 for w in at.number_input)
    norm.set_value("spectral").run()
    at.button(key="run_head_norms").click().run()
    assert_clean(at)
    z = vals(figure(at, "head_norms_norms")["data"][0]["z"])
    assert np.allclose(z, expected(lm, "spectral"), rtol=1e-4)
    code = "\n".join(c.value for c in at.code)
    assert "head_norms(lm, norm='spectral')" in code and "r.norms, r.top" in code
