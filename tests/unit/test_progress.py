"""Progress tells the truth: a long kind's bar moves with the work done (not the number of stages), so the time
left a bar extrapolates from it holds. The work is what actually ran, counted in the estimate's units
(`cost.Cost.weight`, per layer): at each layer's output projection its tokens plus a pass's weight-reading cost, at the
unembedding its rows of logits; a pass under autograd (followed by its backward) as 3. No clocks."""
from __future__ import annotations

import pytest
import torch
import transformers as T

from backend.analysis.kernel import analyze
from backend.analysis.primitives.cost import OVERHEAD_TOKENS
from backend.analysis.primitives.cost import Cost, Shape, Work
from backend.analysis.primitives.stages import plan_spans
from backend.model.loading import wrap
from backend.tasks.base import Task, Template
from tiny_models import CONFIGS


def test_spans_share_the_bar_by_cost():
    def spans(costs):
        return plan_spans(Work(tuple((n, Cost(tokens=t)) for n, t in costs.items())), Shape(1, 1, 1))

    assert spans({"a": 1, "b": 3}) == {"a": (0.0, 0.25), "b": (0.25, 1.0)}
    assert spans({"a": 0, "b": 0}) == {"a": (0.0, 0.5), "b": (0.5, 1.0)}  # nothing known: equal shares
    assert spans({"cached": 0, "b": 2}) == {"cached": (0.0, 0.0), "b": (0.0, 1.0)}


def _model(tok):
    d = CONFIGS["llama"]().to_dict()
    d["num_hidden_layers"] = 4
    torch.manual_seed(0)
    return wrap(T.AutoModelForCausalLM.from_config(T.LlamaConfig(**d)).eval(), tok, "tiny-llama-4l")


TASK = Task("tiny-parity", "classification", [(str(i), "even" if i % 2 == 0 else "odd") for i in range(60)],
            Template("{input} is {output}\n"))
RUNS = {"ltv": dict(layer=2, epochs=2, train_prompts=12, val_prompts=4, prompts=8, shots=2, top_k=2, random_draws=2,
                    perturbations=96),
        "site": dict(m=4, shots=2, prompts=6, steps=12, val_every=4, val_prompts=3, max_new_tokens=4, budget=[1, 4])}


@pytest.mark.parametrize("kind", sorted(RUNS))
def test_progress_follows_the_work_done(kind, gpt2_tokenizer):
    lm, task = _model(gpt2_tokenizer), TASK
    work = [0.0]
    u = lm.unembed.numel() / sum(p.numel() for p in lm.layers[0].parameters())  # a row of logits, in layers

    def count(module, args):  # a layer's pass: its tokens, and what reading its weights costs (cost.Cost.weight)
        work[0] += (args[0].shape[0] * args[0].shape[1] + OVERHEAD_TOKENS) * (3 if torch.is_grad_enabled() else 1)

    def count_logits(module, args):  # rows of full-vocabulary logits
        work[0] += args[0].shape[0] * args[0].shape[1] * u * (3 if torch.is_grad_enabled() else 1)

    handles = [lm.o_proj(l).register_forward_pre_hook(count) for l in range(lm.n_layers)]
    handles.append(lm.model.get_output_embeddings().register_forward_pre_hook(count_logits))
    seen: list[tuple[float, float]] = []
    try:
        analyze(kind, lm, task, cache=True, progress=lambda f, m="": seen.append((f, work[0])), **RUNS[kind])
    finally:
        for h in handles:
            h.remove()
    fractions = [f for f, _ in seen]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    off = max(abs(f - w / work[0]) for f, w in seen)
    assert off <= 0.15, off  # the fixed shares before read 0.27 (ltv) off here
