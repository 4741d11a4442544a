"""Where a vector "at layer l" goes, for every kind: the residual stream at the INPUT of decoder layer l.

One convention for steering, the vanilla task vector, head-set and function vectors, learned task vectors (LTV),
SITE's vector baselines and the methods table: a vector at layer l is added to the hidden state entering decoder
layer l, at the last prompt token. Layer 0 is the embeddings; the input of layer l >= 1 is the output of layer l - 1
(the same tensor: Hugging Face's `hidden_states[l]`, TransformerLens' `blocks.l.hook_resid_pre`). The vanilla task
vector at layer l is the mean ICL-minus-zero-shot difference of that same state (`capture(..., "resid")`).

    run_at_inputs(lm, enc, [{}, {4: v}, {0: w}])   # Outcomes (configs, prompts)

Layers >= 1 run through the configuration engine (an addition to layer l - 1's output: one token over the clean prefix's
KV cache, `inject.as_row_configs`); a configuration with a vector at layer 0 runs as full passes with the hooks'
input injection, without sending the others there too.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ...errors import BadInput
from ...model.loading import LoadedModel
from .batching import Encoded, Progress
from .inject import Injection, as_row_configs, evaluate_injections
from .predict import OUTCOMES, Outcomes
from .configs import score_configs

Vectors = dict[int, torch.Tensor]


def run_at_inputs(lm: LoadedModel, enc: Encoded, configs: Sequence[Vectors], batch_size: int = 32,
                    progress: Progress | None = None) -> Outcomes:
    """Accuracy, label accuracy, TR ratio and predictions of every prompt with each configuration's vectors added at
    their layers' inputs (last token), each (configs, prompts). An empty configuration is the plain pass; a zero
    vector at layer 0 is none."""
    for c, vectors in enumerate(configs):
        bad = [l for l in vectors if not 0 <= int(l) < lm.n_layers]
        if bad:
            raise BadInput(f"configuration {c}: layer {bad[0]} out of range: this model has decoder layers "
                             f"0..{lm.n_layers - 1} (a vector is added at a layer's input)")
    injections = [Injection({int(l): v for l, v in ((l, torch.as_tensor(v, dtype=torch.float32))
                                                    for l, v in vectors.items()) if int(l) or bool((v != 0).any())})
                  for vectors in configs]
    rows = [as_row_configs(lm, [inj]) for inj in injections]  # None: a vector at the embeddings
    fast = [c for c, r in enumerate(rows) if r is not None]
    slow = [c for c, r in enumerate(rows) if r is None]
    out = Outcomes.empty(len(configs), len(enc.ids))
    share = len(fast) / max(len(configs), 1)
    if fast:
        sub = None if progress is None else (lambda f, m="": progress(share * f, m))
        _place(out, fast, score_configs(lm, enc, [rows[c][0] for c in fast], batch_size=batch_size, progress=sub))
    if slow:
        sub = None if progress is None else (lambda f, m="": progress(share + (1 - share) * f, m))
        _place(out, slow, evaluate_injections(lm, enc, [injections[c] for c in slow], batch_size, sub))
    return out


def _place(out: Outcomes, idx: Sequence[int], sub: Outcomes) -> None:
    """Copy the rows of `sub` (len(idx), prompts) into `out` at configurations `idx`."""
    at = np.asarray(idx, dtype=np.int64)
    for k in OUTCOMES:
        getattr(out, k)[at] = getattr(sub, k)
