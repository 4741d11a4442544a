"""Small params of every analysis kind on the default model (shared by tests/integration/test_cost_model.py and
bench/bit_identical.py): small, and shaped so that the estimate's upper bounds are reached."""
from __future__ import annotations

SMALL = dict(prompts=6, shots=2)
LTV = dict(epochs=2, patience=2, train_prompts=8, val_prompts=4, batch_size=4)
SITE = dict(m=4, shots=2, steps=6, val_every=3, val_prompts=4, prompts=6, max_new_tokens=4)
CASES = {  # kind -> (task, params)
    "model_info": (None, {}),
    "maps": ("syn-sentiment", SMALL),
    "scores": ("syn-sentiment", SMALL),
    "icl": ("syn-sentiment", {"prompts": 6, "shots": [0, 2, 4]}),
    "ablation_curves": ("syn-sentiment", {**SMALL, "ks": [0, 2, 4], "random_seeds": [0, 1]}),
    "ablate": ("syn-sentiment", {**SMALL, "heads": [[1, 2], [3, 0]], "mode": "mean"}),
    "vectors": ("syn-antonym", SMALL),
    "steer": ("syn-antonym", {**SMALL, "layer": "all"}),
    "geometry": ("syn-antonym", SMALL),
    "perturb": ("syn-sentiment", {**SMALL, "perturbations": ["shuffled_inputs", "random_labels"]}),
    "fit": ("syn-sentiment", {}),
    "patching": ("syn-sentiment", SMALL),
    "findings": (None, {"tasks": ["syn-sentiment"], "sections": ["tsla"], "prompts": 4, "shots": 2, "random_sets": 1}),
    "head": ("syn-sentiment", {**SMALL, "head": [1, 2]}),
    "ltv_train": ("syn-antonym", LTV),
    "ltv": ("syn-antonym", {**LTV, **SMALL, "perturbations": 16, "random_draws": 2, "propagation": True}),
    "ltv_tasks": (None, {**LTV, **SMALL, "tasks": ["syn-antonym", "syn-successor"]}),
    "site": ("syn-antonym", {**SITE, "budget": [2], "patching": [1, 4], "icl_shots": [2]}),
    "site_transfer": (None, {**SITE, "tasks": ["syn-antonym", "syn-successor"]}),
    "methods": ("syn-antonym", {**SMALL, "site_m": 4, "site_shots": 2, "site_steps": 6}),
}


class MemoryStore(dict):
    """The kernel's Store protocol over a dict."""

    def get(self, key):  # noqa: D102 - the Store protocol
        return dict.get(self, key)

    def put(self, key, value):
        self[key] = value
