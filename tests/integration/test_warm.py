"""The warm-up (`python -m backend warm`) computes exactly what the dashboard asks for first, so a freshly pulled
model's first view is a cache hit; it starts detached at low priority."""
from __future__ import annotations

import os
import subprocess

import pytest

from backend.analysis.kernel import lookup
from backend.service import warm as W

pytest.importorskip("streamlit")
from ui import state  # noqa: E402


def _fields(params: dict) -> dict:
    return {k: v for k, v in params.items() if k not in ("model", "task")}


def test_the_demo_is_the_home_pages_first_requests():
    s = state.Settings(model="m", task="t", shots=8, prompts=50, seed=0)  # the pages' defaults (ui/state.FIELDS)
    assert [f.default() for f in (state.FIELDS["shots"], state.FIELDS["prompts"], state.FIELDS["seed"])] == [8, 50, 0]
    home = [("head_scores", s.job(**s.selection())), ("icl_curve", s.job(shots=s.icl_shots(), examples=3))]
    assert W.demo_requests("m", "t") == home


def test_first_task_is_the_dashboards():
    tasks = [{"id": "syn-a", "models": "default"}, {"id": "antonym", "models": "any"},
             {"id": "upload:x", "models": "any", "source": "upload"}]
    assert W.first_task("default", tasks) == "syn-a" and W.first_task("/some/model", tasks) == "antonym"


def test_warm_fills_the_cache_the_pages_read(tmp_path, gpt2_tokenizer, monkeypatch):
    from tiny_models import tiny_model

    monkeypatch.setattr(W, "DEMO", {"shots": 2, "prompts": 6, "seed": 0})  # smaller settings: seconds

    folder = tmp_path / "tiny-llama"
    tiny_model("llama").save_pretrained(folder)
    gpt2_tokenizer.save_pretrained(folder)
    rows = W.warm(str(folder))
    assert [(r["kind"], r["task"], r["cache_hit"]) for r in rows] == [("head_scores", "antonym", False),
                                                                     ("icl_curve", "antonym", False)]
    from backend.model.loading import load_model
    from backend.tasks.registry import load_task

    lm, task = load_model(str(folder)), load_task("antonym")
    for kind, params in W.demo_requests(str(folder), "antonym"):
        assert lookup(kind, lm, task, _fields(params)) is not None, kind  # what the page asks: cached


def test_start_warm_runs_detached_at_low_priority(tmp_path, monkeypatch):
    seen = {}

    class Fake:
        def __init__(self, cmd, **kw):
            seen.update(cmd=cmd, **kw)

    monkeypatch.setattr(subprocess, "Popen", Fake)
    W.start_warm("smollm2-135m", log=tmp_path / "warm.log")
    assert seen["cmd"][1:] == ["-m", "backend", "warm", "--model", "smollm2-135m"]
    assert seen["env"]["OMP_NUM_THREADS"] == "1" and seen["start_new_session"]
    calls = []
    monkeypatch.setattr(os, "nice", calls.append)
    seen["preexec_fn"]()
    assert calls == [W.NICE] and (tmp_path / "warm.log").exists()
