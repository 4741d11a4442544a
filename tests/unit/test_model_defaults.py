"""The per-model dashboard defaults: one torch-free table, found by preset name or by a folder's config, every value
a valid setting of the dashboard for that model."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ui import model_defaults as D
from backend.tasks.registry import builtin_tasks
from ui.state import FIELDS
from hang import HANG_S

REPO = Path(__file__).resolve().parents[2]


def test_the_table_needs_no_torch():
    code = "import sys, ui.model_defaults as d; d.defaults_for('smollm2-135m'); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=HANG_S)
    assert out.returncode == 0 and out.stdout.strip() == "False"


def test_every_default_is_a_valid_dashboard_setting_for_its_model():
    layers = {name: n for (_, n, _), name in D.CONFIGS.items()} | {"default": 4}
    tasks = builtin_tasks()
    for name, d in D.DEFAULTS.items():
        assert set(d) <= set(FIELDS), set(d) - set(FIELDS)
        assert d["task"] in tasks and (tasks[d["task"]].models == "default") == (name == "default")
        for key in ("sg_layer", "ltv_layer"):
            assert d[key] in (None, "all") or 0 <= d[key] < layers[name]
        assert d["top_k"] is None or 1 <= d["top_k"] and d["kmax"] >= 1 and d["shots"] >= 0
        assert D.WHY[name] and "to be measured" not in D.WHY[name]


def test_found_by_name_by_folder_config_and_not_guessed(tmp_path):
    assert D.defaults_for("smollm2-135m")["task"] == D.DEFAULTS["smollm2-135m"]["task"]
    assert D.defaults_for("headlens-tiny") == D.DEFAULTS["default"]
    smol = tmp_path / "smol"
    smol.mkdir()
    (smol / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 30, "hidden_size": 576}))
    gemma = tmp_path / "gemma"
    gemma.mkdir()
    (gemma / "config.json").write_text(json.dumps({"model_type": "gemma3", "text_config": {
        "num_hidden_layers": 18, "hidden_size": 640}}))
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 12, "hidden_size": 576}))
    assert D.known(str(smol)) == "smollm2-135m" and D.known(str(gemma)) == "gemma3-270m"
    assert D.defaults_for(str(other)) == {} and D.help_for(str(other)) == ""
    assert D.defaults_for("gpt2") == {} and D.defaults_for("") == {} and D.defaults_for("x" * 5000) == {}
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    assert D.known(str(broken)) is None
    d = D.defaults_for("smollm2-135m")
    d["task"] = "changed"
    assert D.DEFAULTS["smollm2-135m"]["task"] != "changed"  # a copy


def test_help_states_the_defaults():
    for name, d in D.DEFAULTS.items():
        h = D.help_for(name)
        assert d["task"] in h and f"{d['shots']} shots" in h and D.WHY[name] in h


def test_picking_a_model_sets_the_settings_it_starts_on(monkeypatch):
    """The model box's on_change (state._copy of `model`) applies the new model's defaults; the same model again
    changes nothing the user set."""
    import ui.state as state

    ss = {"s_model": "default", "w_model": "gemma3-270m", "s_task": "syn-sentiment", "s_shots": 4}
    monkeypatch.setattr(state.st, "session_state", ss)
    state._copy("model", None)
    want = D.defaults_for("gemma3-270m")
    assert ss["s_model"] == "gemma3-270m" and ss["s_task"] == want["task"] == "sentiment"
    assert ss["s_shots"] == want["shots"] and ss["s_sg_layer"] == want["sg_layer"]
    ss["s_task"] = "topic"
    state._copy("model", None)  # unchanged model: the user's task stays
    assert ss["s_task"] == "topic"
