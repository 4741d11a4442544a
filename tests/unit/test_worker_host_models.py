"""A Ray worker host without the model the service's host has is refused with a sentence naming the host and what
to do (headlens never pulls or copies a model onto a worker host), not a bare 'folder does not exist'."""
from __future__ import annotations

import pytest

from backend.weights.model_sources import ModelLoadError
from backend.service.ray_worker import ModelWorker


@pytest.mark.parametrize("model", ["/nonexistent/headlens-model-folder", "smollm2-135m"])
def test_a_worker_host_without_the_model_names_itself_and_the_shared_folder(model, tmp_path, monkeypatch):
    monkeypatch.setenv("HEADLENS_MODELS_DIR", str(tmp_path / "no-models-here"))  # this "host" has no models folder
    monkeypatch.setenv("HEADLENS_CACHE_DIR", str(tmp_path / "cache"))  # the worker points it at a private folder
    w = ModelWorker(model, "cpu", None, None, reader=None)
    with pytest.raises(ModelLoadError) as e:
        w._model_obj()
    msg = str(e.value)
    assert msg.startswith("Ray host ") and "cannot load the model" in msg
    assert "does not pull or copy models onto worker hosts" in msg and "every host shares" in msg
    assert str(tmp_path / "no-models-here") in msg
    assert ("does not exist" in msg) if model.startswith("/") else ("not pulled yet" in msg)
    assert w._lm is None  # nothing half-loaded: the next job on this actor tries again
