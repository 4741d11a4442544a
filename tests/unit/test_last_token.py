"""Last-token fast paths equal their full-pass references: linear propagation's one-token steps from the injection
layer, injections evaluated through the configuration engine, last-token steps that start at their first changed layer,
and the clean prefix states kept between calls (the Ablation page's live toggle). Tiny random-weight models."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from backend.analysis.kernel import analyze
from backend.analysis.primitives import engine_fast as S
from backend.analysis.primitives import threads
from backend.analysis.primitives import inject as I
from backend.analysis.ltv import propagation as PR
from backend.analysis.primitives.batching import encode, map_batches
from backend.analysis.primitives.capture import capture_means
from backend.analysis.primitives.configs import head_mask
from backend.analysis.primitives.engine import RowConfig, run_configs
from backend.analysis.primitives.inject import Injection, evaluate_injections, final_states, injected_logits
from backend.analysis.primitives.last_token import final_change
from backend.analysis.primitives.prefix_store import STORE
from backend.model.loading import wrap
from backend.tasks.base import Task, Template
from tiny_models import CONFIGS

_lms: dict = {}


def _lm(arch: str, tok, layers: int = 3):
    if (arch, layers) not in _lms:
        import transformers as T

        d = CONFIGS[arch]().to_dict()
        d["n_layer" if "n_layer" in d else "num_hidden_layers"] = layers
        d.pop("layer_types", None)  # derived from the depth again
        cfg = type(CONFIGS[arch]())(**d)
        torch.manual_seed(0)
        _lms[(arch, layers)] = wrap(T.AutoModelForCausalLM.from_config(cfg).eval(), tok, f"tiny-{arch}-{layers}l")
    return _lms[(arch, layers)]


def _task() -> Task:  # inputs of 1-3 tokens: prompts of different lengths in one batch
    return Task("tiny-parity", "classification", [(str(i) * (1 + i % 3), "even" if i % 2 == 0 else "odd")
                                                  for i in range(40)], Template("{input} is {output}\n"))


@pytest.fixture(autouse=True)
def _empty_store():
    STORE.clear()
    yield
    STORE.clear()


@pytest.mark.parametrize("arch", ["llama", "gpt2", "gemma3_text"])
def test_final_change_equals_full_passes(arch, gpt2_tokenizer, monkeypatch):
    lm = _lm(arch, gpt2_tokenizer)
    enc = encode(lm, _task().build_prompts(2, 7, 0), "classification")
    n, P, d = 9, len(enc.ids), lm.d_model
    vecs = torch.randn(n, d, generator=torch.Generator().manual_seed(0)) * 2
    for layer in (0, 2):
        base = final_states(lm, enc.ids, list(range(P)), {}, (-1,), 4)
        states = final_states(lm, enc.ids, [i for _ in range(n) for i in range(P)],
                              {layer: vecs.repeat_interleave(P, 0)}, (-1,), 4)
        ref = (states - base.repeat(n, 1)).reshape(n, P, d).mean(1)
        assert ref.abs().max() > 1e-3
        for packed in (True, False):
            monkeypatch.setattr(S, "PACKED", packed)
            got = final_change(lm, enc.ids, layer, vecs, batch_size=3, rows=8)  # several batches and chunks
            assert (got - ref).abs().max().item() <= 1e-5 * ref.abs().max().item(), (layer, packed)


def test_linear_propagation_fast_equals_reference(gpt2_tokenizer, monkeypatch):
    lm = _lm("llama", gpt2_tokenizer)
    enc = encode(lm, _task().build_prompts(0, 6, 0), "classification")
    theta = torch.randn(lm.d_model, generator=torch.Generator().manual_seed(1))
    calls = []
    real = PR.final_change
    monkeypatch.setattr(PR, "final_change", lambda *a, **k: calls.append(1) or real(*a, **k))
    n = 2 * lm.d_model  # W determined (with fewer, its polar factor is not: rotation is then ill-conditioned)
    fast = PR.linear_propagation(lm, enc, 1, theta, (-1,), n, seed=3)
    monkeypatch.setattr(PR, "final_change", lambda *a, **k: None)  # the reference: full passes
    ref = PR.linear_propagation(lm, enc, 1, theta, (-1,), n, seed=3)
    assert calls == [1]
    assert torch.allclose(fast["w"], ref["w"], rtol=1e-4, atol=1e-5)
    assert fast["rotation"] == pytest.approx(ref["rotation"], abs=1e-5)
    assert fast["stretch"] == pytest.approx(ref["stretch"], rel=1e-5)
    assert fast["r2"] == pytest.approx(ref["r2"], abs=1e-6)


def _reference(lm, enc, injections) -> np.ndarray:
    """Gold-token probabilities (injections, prompts) from one full hooked pass per injection and batch."""
    gold = I.gold_tokens(enc)
    out = np.zeros((len(injections), len(enc.ids)))
    for c, inj in enumerate(injections):
        def step(batch, c=c, inj=inj):
            p = torch.softmax(injected_logits(lm, batch, inj), -1)
            out[c, batch.rows] = p.gather(1, gold[batch.rows][:, None]).squeeze(1).numpy()
        map_batches(lm, enc.ids, 4, step)
    return out


def test_evaluate_injections_through_the_engine_equals_full_passes(gpt2_tokenizer, monkeypatch):
    lm = _lm("llama", gpt2_tokenizer)
    L, H, d = lm.n_layers, lm.n_heads, lm.d_model
    enc = encode(lm, _task().build_prompts(2, 7, 0), "classification")
    g = torch.Generator().manual_seed(2)
    mask = torch.ones(L, H)
    mask[1, 0] = mask[2, 3] = 0
    last = [Injection(), Injection({1: torch.randn(d, generator=g) * 3}), Injection(final=torch.randn(d, generator=g)),
            Injection({2: torch.randn(d, generator=g)}, mask=mask), Injection(mask=mask)]
    used = []
    real = I.score_configs
    monkeypatch.setattr(I, "score_configs", lambda *a, **k: used.append(1) or real(*a, **k))
    got = evaluate_injections(lm, enc, last, batch_size=3)
    assert used == [1]
    np.testing.assert_allclose(got.gold_prob, _reference(lm, enc, last), rtol=1e-4, atol=1e-6)
    # a vector at the embeddings (layer 0's input) or at other positions: full passes, as before
    for other in ([Injection({0: torch.randn(d, generator=g)})], [Injection({1: torch.randn(d)}, (-1, -2))]):
        used.clear()
        got = evaluate_injections(lm, enc, other, batch_size=3)
        assert used == []
        np.testing.assert_allclose(got.gold_prob, _reference(lm, enc, other), rtol=1e-5, atol=1e-7)


def test_last_token_steps_start_at_their_first_changed_layer(gpt2_tokenizer, monkeypatch):
    """Tokens through each layer's attention: a last-token configuration starting at layer s adds one token per
    prompt at layers >= s only; logits equal the full engine's."""
    lm = _lm("llama", gpt2_tokenizer, layers=4)
    L, d = lm.n_layers, lm.d_model
    ids = [torch.randint(0, 50000, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (6, 9, 4)]
    N, W = len(ids), max(len(x) for x in ids)

    def at(*heads):
        return head_mask(lm, heads)

    configs = [RowConfig(mask=at((2, 0)), scope="last"), RowConfig(inject={1: torch.randn(d)}),  # from 2, 1
               RowConfig(inject={L: torch.randn(d)}), RowConfig(mask=at((0, 1), (3, 0)), scope="last")]
    starts = [2, 1, L, 0]
    monkeypatch.setattr(S, "STEP_ROWS_FACTOR", 1)  # one configuration per step (batch_size 3 = 3 prompts)
    # no thread probe (`threads.best_threads`) inside the counted run: its passes would add to the count
    monkeypatch.setattr(threads, "best_threads", lambda lm: torch.get_num_threads())
    tokens = {l: 0 for l in range(L)}
    handles = [lm.o_proj(l).register_forward_pre_hook(
        lambda m, a, l=l: tokens.__setitem__(l, tokens[l] + a[0].shape[0] * a[0].shape[1])) for l in range(L)]
    got = torch.zeros(len(configs), N, lm.model.config.vocab_size)
    try:
        run_configs(lm, ids, configs, lambda lg, cs, ps: got.__setitem__((cs, ps), lg), batch_size=3)
    finally:
        for h in handles:
            h.remove()
    assert tokens == {l: N * W + N * sum(s <= l for s in starts) for l in range(L)}
    ref = torch.zeros_like(got)
    run_configs(lm, ids, configs, lambda lg, cs, ps: ref.__setitem__((cs, ps), lg), engine="full")
    assert (got - ref).abs().max().item() <= 1e-5


def _ablate(lm, task, **kw):
    return analyze("ablate", lm, task, cache=False, shots=2, prompts=6, heads=[[1, 0], [2, 3]], **kw)


@pytest.mark.parametrize("arch", ["llama", "gemma3_text"])
def test_kept_prefix_serves_the_next_toggle_without_a_clean_pass(arch, gpt2_tokenizer, monkeypatch):
    """After the head maps' pass (or one toggle), a last-token toggle of the same prompts runs one token per prompt
    and gives the numbers of a fresh computation; mean ablation takes its fill from the kept states."""
    lm, task = _lm(arch, gpt2_tokenizer), _task()
    fresh = {m: _ablate(lm, task, positions="last", mode=m) for m in ("zero", "mean")}
    STORE.clear()
    analyze("scores", lm, task, cache=False, shots=2, prompts=6)
    assert STORE.nbytes > 0
    counted = []
    h = lm.layers[0].register_forward_pre_hook(lambda m, a, k: counted.append((a[0] if a else k["hidden_states"]).shape),
                                               with_kwargs=True)
    try:
        kept = {m: _ablate(lm, task, positions="last", mode=m) for m in ("zero", "mean")}
    finally:
        h.remove()
    assert all(s[1] == 1 for s in counted), counted  # step tokens only: no clean pass, no means pass
    for m in ("zero", "mean"):
        for a, b in zip(kept[m].rows, fresh[m].rows):
            assert a.gold_prob_before == pytest.approx(b.gold_prob_before, abs=1e-5)
            assert a.gold_prob_after == pytest.approx(b.gold_prob_after, abs=1e-5)
        assert kept[m].after == fresh[m].after
    enc = encode(lm, task.build_prompts(2, 6, 0), task.kind)
    from backend.analysis.primitives.prefix_store import stored_z_mean
    assert torch.allclose(stored_z_mean(lm, enc.ids), capture_means(lm, enc, "z"), atol=1e-5)


def test_a_toggle_keeps_its_prefix_within_the_budget(gpt2_tokenizer, monkeypatch):
    lm, task = _lm("llama", gpt2_tokenizer), _task()
    monkeypatch.setenv("HEADLENS_PREFIX_CACHE_MB", "0")
    _ablate(lm, task, positions="last")
    assert STORE.nbytes == 0  # nothing kept
    monkeypatch.setenv("HEADLENS_PREFIX_CACHE_MB", "64")
    _ablate(lm, task, positions="last")
    assert 0 < STORE.nbytes <= 64 * 2 ** 20
    monkeypatch.setenv("HEADLENS_PREFIX_CACHE_MB", "lots")
    with pytest.raises(ValueError, match="HEADLENS_PREFIX_CACHE_MB must be a number"):
        _ablate(lm, task, positions="last", seed=1)


def test_ltv_kind_fast_paths_equal_the_full_pass_reference(gpt2_tokenizer, monkeypatch):
    """The whole `ltv` kind (comparison and mechanism) with the last-token fast paths, and with them switched off."""
    lm = _lm("llama", gpt2_tokenizer)
    task = Task("tiny-parity", "classification", [(str(i), "even" if i % 2 == 0 else "odd") for i in range(40)],
                Template("{input} is {output}\n"))
    fast_params = dict(epochs=2, train_prompts=12, val_prompts=4, prompts=8, shots=2, top_k=2, random_draws=2,
                       perturbations=96, layer=1, propagation=True)  # >= d_model: W determined, well-conditioned
    fast = analyze("ltv", lm, task, cache=False, **fast_params)
    monkeypatch.setattr(I, "as_row_configs", lambda *a: None)
    monkeypatch.setattr(PR, "final_change", lambda *a, **k: None)
    ref = analyze("ltv", lm, task, cache=False, **fast_params)
    assert fast.table == ref.table
    a, b = fast.per_layer[0], ref.per_layer[0]
    assert a.key_heads.ablated == b.key_heads.ablated and a.key_heads.random == b.key_heads.random
    assert a.ov.final == b.ov.final and a.propagation.surrogate == b.propagation.surrogate
    assert a.propagation.rotation == pytest.approx(b.propagation.rotation, abs=1e-5)
    assert a.propagation.stretch == pytest.approx(b.propagation.stretch, rel=1e-4)


@pytest.mark.parametrize("arch", ["llama", "gemma3_text"])
def test_training_steps_over_kept_prefixes_equal_full_passes(arch, gpt2_tokenizer, monkeypatch):
    """A training at the last token (one token step per prompt over its kept prefix) gives the full passes' losses,
    held-out scores and vector; also for two layers trained jointly."""
    from backend.analysis.ltv import learn as LE

    lm, task = _lm(arch, gpt2_tokenizer), _task()
    train, val = (encode(lm, task.build_prompts(0, n, s), task.kind) for n, s in ((12, 0), (4, 1)))
    recipe = LE.Recipe(epochs=2, batch_size=3, lr=5e-2, patience=5)
    for layers in ([1], [1, 2]):
        fast = LE.train_injection(lm, layers, (-1,), train, val, recipe)
        with monkeypatch.context() as m:
            m.setattr(LE, "clean_prefixes", lambda *a, **k: None)  # the reference: full passes
            ref = LE.train_injection(lm, layers, (-1,), train, val, recipe)
        np.testing.assert_allclose(fast.loss, ref.loss, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(fast.val_loss, ref.val_loss, rtol=1e-5, atol=1e-5)
        assert fast.val_accuracy == ref.val_accuracy
        for l in layers:
            assert torch.allclose(fast.vectors[l], ref.vectors[l], atol=1e-5)
