"""Composition scores on real weights (kind `composition`), the real-model tier: SmolLM2-135M (9 query heads over 3
kv heads) and Gemma 3 270M (4 over 1, query / key norms, post-attention norms), each skipped when not pulled. The
factored scores of a few senders into two late receivers equal those of the explicit (d_model, d_model) matrices
read off the modules (`tests/unit/test_composition.py: _dense`). Weights only: seconds."""
from __future__ import annotations

import pytest
import torch

from backend.weights import presets
from test_composition import _dense, _fro

pytestmark = pytest.mark.real_model


@pytest.mark.parametrize("preset,receiver_layer", [("smollm2-135m", 25), ("gemma3-270m", 9)])
def test_real_scores_equal_dense_matrices(preset, receiver_layer):
    if not presets.is_pulled(preset):
        pytest.skip(f"{preset} is not pulled: {presets.pull_command(preset)}")
    from backend.analysis.general.composition import _layers
    from backend.analysis.primitives import composition as comp
    from backend.model.loading import load_model

    lm = load_model(preset, device="cpu")
    layers = _layers(lm, fold_norms=True)
    receivers = [(receiver_layer, 0), (receiver_layer, lm.n_heads - 1)]
    got = {m: comp.composition_matrix(layers, receivers, m).double() for m in comp.MODES}
    ov_r, qk_r = _dense(lm, receiver_layer)
    for ls in (0, receiver_layer - 1):
        ov_s, _ = _dense(lm, ls)
        for hs in range(lm.n_heads):
            for j, (_, hr) in enumerate(receivers):
                a, q = ov_s[hs], qk_r[hr]
                want = {"q": _fro(a @ q) / (_fro(a) * _fro(q)), "k": _fro(a @ q.T) / (_fro(a) * _fro(q)),
                        "v": _fro(a @ ov_r[hr]) / (_fro(a) * _fro(ov_r[hr]))}
                for m in comp.MODES:
                    assert float(got[m][ls * lm.n_heads + hs, j]) == pytest.approx(want[m], rel=1e-3), (m, ls, hs, hr)
    assert torch.isnan(got["v"][receiver_layer * lm.n_heads:]).all()
