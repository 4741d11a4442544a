"""Soft head selection (SITE): the generation primitive, the injection's invariants, training, saving and loading,
clear errors, the `site`, `site_transfer` and `methods` kinds, on tiny random-weight models (GQA included)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from backend.analysis.kernel import analyze
from backend.analysis.site import soft_select as S
from backend.analysis.primitives.batching import encode, forward_last_logits, make_batch
from backend.analysis.primitives.capture import capture_means
from backend.analysis.site.generate import (GenerationError, cut, evaluate_generation, exact_match, generate,
                                                  require_kv_cache, stop_strings, strict_match)
from backend.analysis.primitives.saved import SavedTensorError
from backend.model.loading import wrap
from backend.store.tensor_store import TensorSession, tensor_path
from backend.tasks.base import Task, TaskError, Template
from hang import HANG_S
from tiny_models import tiny_model

REPO = Path(__file__).resolve().parents[2]
SMALL = dict(m=4, shots=2, prompts=6, steps=6, val_every=3, val_prompts=3, max_new_tokens=4)
NO_EXTRAS = dict(compare=[], patching=[], budget=[], correlations=[])


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def lms(gpt2_tokenizer):
    """Tiny llama (6 query heads over 2 KV heads), qwen2 (GQA) and gpt2 models."""
    return {a: wrap(tiny_model(a), gpt2_tokenizer, f"tiny-{a}") for a in ("llama", "qwen2", "gpt2")}


WORDS = ["cat", "dog", "red", "blue", "sun", "moon", "tree", "rock", "fish", "bird", "car", "boat", "king", "queen",
         "hot", "cold", "up", "down", "left", "right"]


@pytest.fixture(scope="module")
def task():
    """A small classification task of single GPT-2 words (20 examples: a split of 10 and 10)."""
    ex = [(w, "yes" if i % 2 else "no") for i, w in enumerate(WORDS)]
    return Task("tiny-yesno", "classification", ex, Template("{input} = {output} ;\n"), labels=("yes", "no"))


@pytest.fixture(scope="module")
def gen_task():
    ex = [(w, WORDS[(i + 1) % len(WORDS)]) for i, w in enumerate(WORDS)]
    return Task("tiny-next", "generation", ex, Template("{input} = {output} ;\n"))


def _enc(lm, task, n=4, shots=0):
    return encode(lm, task.build_prompts(shots, n, 0), task.kind)


def _embedding(lm, task):
    return capture_means(lm, _enc(lm, task, 6, 2), "z")


# -- generation ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_generation_matches_full_recompute_and_batching(lms, task, arch):
    lm = lms[arch]
    enc = _enc(lm, task, 4, 1)
    batched = generate(lm, enc.ids, max_new_tokens=5, stop=(), batch_size=4)
    alone = generate(lm, enc.ids, max_new_tokens=5, stop=(), batch_size=1)
    assert batched.tokens == alone.tokens
    torch.testing.assert_close(batched.first_logits, alone.first_logits, rtol=1e-4, atol=1e-4)
    with torch.inference_mode():  # the same greedy tokens without a cache, recomputing the whole sequence
        for i, ids in enumerate(enc.ids):
            seq = list(ids)
            for _ in range(5):
                nxt = int(lm.model(input_ids=torch.tensor([seq])).logits[0, -1].argmax())
                if nxt == lm.tokenizer.eos_token_id:
                    break
                seq.append(nxt)
            assert alone.tokens[i] == seq[len(ids):]


def test_cut_and_matches(task):
    assert stop_strings(task) == [";", "\n"]
    assert cut(" yes ; no", [";", "\n"]) == " yes "
    assert exact_match([" yes ", " yesno", " yes dog", " no"], [" yes"] * 4) == [True, False, True, False]
    assert strict_match([" yes ", " yes dog"], [" yes", " yes"]) == [True, False]


def test_model_without_kv_cache_is_refused(lms, monkeypatch):
    lm = lms["llama"]
    real = lm.model.forward

    def no_cache(*a, **kw):
        out = real(*a, **kw)
        out.cache = None
        return out

    monkeypatch.setattr(lm.model, "forward", no_cache)
    with pytest.raises(GenerationError, match="no KV cache"):
        require_kv_cache(lm)


# -- the injection's invariants ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_alpha_zero_reproduces_plain_logits_exactly(lms, task, arch):
    lm = lms[arch]
    enc = _enc(lm, task, 5, 2)
    t = _embedding(lm, task)
    zero = torch.zeros(lm.n_layers, lm.n_heads)
    assert torch.equal(S.soft_logits(lm, enc, zero, t), S.soft_logits(lm, enc, None, None))
    assert not torch.equal(S.soft_logits(lm, enc, torch.full_like(zero, 0.7), t), S.soft_logits(lm, enc, None, None))
    plain = evaluate_generation(lm, enc, max_new_tokens=3)
    with_zero = evaluate_generation(lm, enc, hooks=S.hook_factory(lm, zero, t), max_new_tokens=3)
    assert plain == with_zero


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_injection_touches_only_the_prefills_last_position(lms, task, arch):
    lm = lms[arch]
    t = _embedding(lm, task) * 5
    alpha = torch.full((lm.n_layers, lm.n_heads), 0.9)
    ids = torch.tensor([lm.tokenizer("the cat sat on the")["input_ids"]])
    b = make_batch(lm, [ids[0].tolist()], [0])
    with torch.inference_mode():
        plain = lm.model(input_ids=ids, use_cache=True)
        with S.soft_hooks(lm, alpha, t, 1, b.last):
            inj = lm.model(input_ids=ids, use_cache=True)
            nxt = inj.logits[:, -1].argmax(-1, keepdim=True)
            pos = torch.tensor([[ids.shape[1]]])
            step_hooked = lm.model(input_ids=nxt, position_ids=pos, cache=inj.cache, use_cache=True).logits
        # the prefill: every position but the last is untouched, in the logits and in the cache
        assert torch.equal(inj.logits[:, :-1], plain.logits[:, :-1])
        assert not torch.allclose(inj.logits[:, -1], plain.logits[:, -1])
        n = ids.shape[1]
        for layer in range(lm.n_layers):  # (inj.cache now also holds the decoding step's token)
            k_p, v_p = plain.cache.layers[layer].keys, plain.cache.layers[layer].values
            k_i, v_i = inj.cache.layers[layer].keys, inj.cache.layers[layer].values
            assert torch.equal(k_i[..., :n - 1, :], k_p[..., :n - 1, :])
            assert torch.equal(v_i[..., :n - 1, :], v_p[..., :n - 1, :])
        assert not torch.equal(inj.cache.layers[-1].values[..., n - 1, :], plain.cache.layers[-1].values[..., n - 1, :])
        # a decoding step: bit-identical to an uninjected decode over the same (injected) cache
        with S.soft_hooks(lm, alpha, t, 1, b.last):
            again = lm.model(input_ids=ids, use_cache=True)
        step_plain = lm.model(input_ids=nxt, position_ids=pos, cache=again.cache, use_cache=True).logits
    assert torch.equal(step_hooked, step_plain)


def test_soft_hooks_are_differentiable(lms, task):
    lm = lms["qwen2"]
    enc = _enc(lm, task, 2)
    t = _embedding(lm, task)
    logits = torch.zeros(lm.n_layers, lm.n_heads, requires_grad=True)
    b = make_batch(lm, enc.ids, [0, 1])
    with torch.enable_grad(), S.soft_hooks(lm, torch.sigmoid(logits), t, 2, b.last):
        out = forward_last_logits(lm, b)
    torch.nn.functional.cross_entropy(out, S.gold_tokens(enc)).backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_prefix_reuse_gives_the_same_logits_and_gradients(lms, task, arch):
    lm = lms[arch]
    enc = _enc(lm, task, 3, 2)  # few-shot prompts: long enough for a prefix, of different lengths (left padding)
    t = _embedding(lm, task)
    b = make_batch(lm, enc.ids, [0, 1, 2])
    got = {}
    for name, prefix_from in (("one pass", 10**6), ("prefix", 2)):
        logits = torch.full((lm.n_layers, lm.n_heads), 0.3, requires_grad=True)
        with torch.enable_grad():
            out = S.injected_last_logits(lm, b, torch.sigmoid(logits), t, prefix_from=prefix_from)
            torch.nn.functional.cross_entropy(out, S.gold_tokens(enc)).backward()
        got[name] = (out.detach(), logits.grad)
    torch.testing.assert_close(got["prefix"][0], got["one pass"][0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got["prefix"][1], got["one pass"][1], rtol=1e-3, atol=1e-6)


# -- data and errors --------------------------------------------------------------------------------------------------------
def test_splits_are_disjoint_and_sized(lms, task):
    lm = lms["llama"]
    d = S.site_data(lm, task, m=30, shots=3, val_prompts=100, test_prompts=100, seed=0)
    pool, queries = task.split(0)
    train_q, val_q, test_q = {p.query for p in d.train}, {p.query for p in d.val}, {p.query for p in d.test}
    assert not train_q & val_q and not (train_q | val_q) & test_q
    assert test_q == {x for x, _ in queries} and train_q | val_q == {x for x, _ in pool}
    assert {p.query for p in d.embed} <= {x for x, _ in pool} and len(d.embed) == 30 and d.shots == 3
    assert all(p.n_shots == 3 and p.query not in p.text[:-len(p.query) - 1] for p in d.embed)
    assert any("held-out queries" in w for w in d.warnings) and any("validated on" in w for w in d.warnings)


def test_small_tasks_and_short_contexts(lms, task):
    lm = lms["llama"]
    tiny = Task("two", "classification", [("cat", "yes"), ("dog", "no"), ("sun", "yes")], Template("{input} = {output}\n"))
    with pytest.raises(TaskError, match="at least 2"):
        S.site_data(lm, tiny, m=5, shots=2, val_prompts=5, test_prompts=5, seed=0)
    d = S.site_data(lm, task, m=4, shots=50, val_prompts=2, test_prompts=2, seed=0)
    assert d.shots == 9 and any("used 9" in w for w in d.warnings)
    short = wrap(lm.model, lm.tokenizer, "tiny-llama-short")
    short.max_positions = 16
    d = S.site_data(short, task, m=4, shots=8, val_prompts=2, test_prompts=2, seed=0)
    assert d.shots < 8 and any("context window" in w for w in d.warnings)


def test_prompt_building_tasks_are_refused(lms):
    from backend.tasks.registry import builtin_tasks

    rmap = builtin_tasks()["syn-rmap-size"]
    with pytest.raises(TaskError, match="builds its own prompts"):
        S.site_data(lms["llama"], rmap, m=2, shots=1, val_prompts=2, test_prompts=2, seed=0)


# -- training, saving, loading --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_training_moves_alphas_and_keeps_the_best(lms, task, arch):
    lm = lms[arch]
    d = S.site_data(lm, task, m=6, shots=2, val_prompts=3, test_prompts=4, seed=0)
    enc = S.encode_all(lm, task, d)
    t = capture_means(lm, enc["embed"], "z")
    seen = []
    tr = S.train_alphas(lm, t, enc["train"], enc["val"], steps=8, lr=0.2, val_every=4, live=seen.append)
    assert len(tr.loss) == 8 and [v["step"] for v in tr.val] == [0, 4, 8]
    assert tr.best_step in (4, 8)
    best = min(tr.val[1:], key=lambda v: v["loss"])
    assert tr.best_step == best["step"]
    assert tr.logits.shape == (lm.n_layers, lm.n_heads) and tr.logits.abs().max() > 0.1
    assert seen and seen[-1]["step"] == 8 and len(seen[-1]["loss"]) == 8
    again = S.train_alphas(lm, t, enc["train"], enc["val"], steps=8, lr=0.2, val_every=4)
    assert torch.equal(again.logits, tr.logits)  # seeded


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_training_over_kept_prefixes_equals_full_passes(lms, task, arch, monkeypatch):
    """Steps of one token over each prompt's kept prefix give the full passes' losses, validations and alphas."""
    lm = lms[arch]
    d = S.site_data(lm, task, m=6, shots=2, val_prompts=3, test_prompts=4, seed=0)
    enc = S.encode_all(lm, task, d)
    t = capture_means(lm, enc["embed"], "z")
    fast = S.train_alphas(lm, t, enc["train"], enc["val"], steps=8, lr=0.2, val_every=4, batch=2)
    monkeypatch.setattr(S, "clean_prefixes", lambda *a, **k: None)  # the reference: full passes
    ref = S.train_alphas(lm, t, enc["train"], enc["val"], steps=8, lr=0.2, val_every=4, batch=2)
    assert fast.loss == pytest.approx(ref.loss, rel=1e-5, abs=1e-6)
    assert [v["loss"] for v in fast.val] == pytest.approx([v["loss"] for v in ref.val], rel=1e-5, abs=1e-6)
    assert fast.best_step == ref.best_step and torch.allclose(fast.logits, ref.logits, atol=1e-5)


def test_site_kind_save_load_same_accuracy_and_refusals(lms, task, gpt2_tokenizer, tmp_path):
    lm = lms["llama"]
    r = analyze("site", lm, task, **SMALL, compare=["zero_shot", "icl", "all_ones"], icl_shots=[2], patching=[1, 2, 40],
                budget=[], correlations=[])
    assert r.alpha.shape == (lm.n_layers, lm.n_heads) and r.params_count["site"] == lm.n_layers * lm.n_heads
    assert r.params_count["lora"] == lm.n_layers * 8 * ((48 + 48) + (48 + 2 * 8))
    assert set(r.baselines) == {"zero_shot", "icl_2", "all_ones"} and r.baselines["icl_2"].metrics is not None
    assert r.patching.ks == [1, 2, lm.n_layers * lm.n_heads] and len(r.patching.top.accuracy) == 3
    assert r.patching.top.accuracy[-1] == r.patching.bottom.accuracy[-1]  # all heads either way
    assert len(r.loss) == SMALL["steps"] and r.site.exact_match is not None and tensor_path(r.tensor).is_file()
    loaded = analyze("site", lm, task, **SMALL, **NO_EXTRAS, load=r.tensor)
    assert loaded.loaded and loaded.train_seconds == 0
    assert loaded.site == r.site and loaded.site_hard == r.site_hard
    assert torch.allclose(torch.as_tensor(loaded.alpha), torch.as_tensor(r.alpha), atol=1e-6)
    other = wrap(tiny_model("llama", seed=1), gpt2_tokenizer, "tiny-llama-other")
    with pytest.raises(SavedTensorError, match="another model"):
        S.load_site(TensorSession(), r.tensor, other)


def test_generation_task_and_gqa_qwen(lms, gen_task):
    r = analyze("site", lms["qwen2"], gen_task, **SMALL, compare=["zero_shot"], patching=[1], budget=[],
                correlations=["tr", "tl", "induction"])
    assert r.site.n == 6 and r.baselines["zero_shot"].metrics.n == 6
    assert set(r.correlations) == {"tr", "tl", "induction"}
    assert 0 <= r.decisive["decided"] <= 1 and r.decisive["decided_2x"] >= r.decisive["decided"]


def test_budget_curve_runs_site_per_m(lms, task):
    r = analyze("site", lms["llama"], task, **{**SMALL, "steps": 3}, compare=[], patching=[], budget=[1, 4],
                correlations=[])
    assert r.budget.m == [1, 4] and len(r.budget.accuracy) == 2 and r.budget.accuracy[1] == r.site.accuracy


def test_transfer_and_methods(lms, task, gen_task, monkeypatch):
    from backend.analysis.site import site_transfer as st

    lm = lms["llama"]
    monkeypatch.setattr(st, "resolve_tasks", lambda lm, names: [task, gen_task])
    r = analyze("site_transfer", lm, None, **{k: v for k, v in SMALL.items()})
    assert r.tasks == ["tiny-yesno", "tiny-next"] and len(r.accuracy) == 2 and len(r.accuracy[0]) == 2
    assert r.head_jaccard[0][0] == 1.0 and r.alpha_spearman[0][0] is None
    assert r.top_k == 4 and len(r.accuracy_top_k) == 2 and "own_top_k" in r.summary
    own = analyze("site", lm, task, **SMALL, **NO_EXTRAS)
    assert r.accuracy[0][0] == pytest.approx(own.site.accuracy)  # the diagonal is SITE itself
    m = analyze("methods", lm, task, shots=2, prompts=6, site_m=4, site_shots=2, site_steps=4)
    keys = [row.key for row in m.rows]
    assert keys[:2] == ["zero_shot", "icl"] and keys[-1] == "site" and {"vanilla", "tr", "tl"} <= set(keys)
    site_row = m.rows[-1]
    assert site_row.trainable == lm.n_layers * lm.n_heads and site_row.train_seconds is not None
    assert any("LTV" in x for x in m.missing) or "ltv" in keys


def test_the_ltv_baseline_is_found_whatever_the_fields_it_does_not_read(lms, task):
    """Issue 19, defect 8: SITE found the `ltv` result only when every other parameter was a default; after
    `ltv --no-mechanism` or `--perturbations 128` it said there was none. A SITE result computed before the LTV
    was cached is recomputed once it is (cached equals fresh)."""
    lm = lms["llama"]
    site = dict(SMALL, compare=["ltv"], patching=[], budget=[], correlations=["ltv"])
    before = analyze("site", lm, task, **site)
    assert "no cached LTV result" in before.baselines["ltv"].note and "ltv" not in before.correlations
    ltv = analyze("ltv", lm, task, prompts=6, seed=0, shots=2, epochs=2, train_prompts=8, val_prompts=4,
                  mechanism=False, perturbations=128)
    after = analyze("site", lm, task, **site)
    assert not after.cache_hit  # recomputed: the LTV it looked for is cached now
    row = after.baselines["ltv"]
    assert row.metrics.accuracy == pytest.approx(ltv.table["ltv"].accuracy)
    assert "epochs 2" in row.note and "train_prompts 8" in row.note  # the recipe off its defaults is named
    assert "ltv" not in after.correlations  # the key heads need the mechanism
    with_keys = analyze("ltv", lm, task, prompts=6, seed=0, shots=2, epochs=2, train_prompts=8, val_prompts=4,
                        random_draws=2, perturbations=8, key_pct=20.0)
    assert with_keys.per_layer[0].key_heads is not None
    third = analyze("site", lm, task, **site)
    assert not third.cache_hit and "ltv" in third.correlations
    assert analyze("site", lm, task, **site).cache_hit
    m = analyze("methods", lm, task, shots=2, prompts=6, site_m=4, site_shots=2, site_steps=4, top_k=3)
    assert "ltv" in [r.key for r in m.rows] and not any("LTV" in x for x in m.missing)


def test_cli_flags_and_api():
    import backend

    assert backend.train_site.__name__ == "site_alphas" and backend.train_site is backend.site_alphas  # an old name
    out = subprocess.run([sys.executable, "-m", "backend", "site", "--help"], cwd=REPO, capture_output=True, text=True,
                         timeout=HANG_S)
    assert out.returncode == 0
    for flag in ("--m ", "--shots", "--steps", "--json", "--load", "--patching", "--budget", "--beta2"):
        assert flag in out.stdout


DEFAULT = REPO / "models" / "headlens-tiny" / "config.json"


@pytest.mark.skipif(not DEFAULT.is_file(), reason="the default model is absent")
def test_default_model_site_beats_zero_shot():
    from backend.model.loading import load_model
    from backend.tasks.registry import builtin_tasks

    lm = load_model("default")
    r = analyze("site", lm, builtin_tasks()["syn-sentiment"], m=20, steps=40, val_every=20, compare=["zero_shot"],
                patching=[], budget=[], correlations=[], cache=False)
    assert r.site.accuracy >= 0.9 > r.baselines["zero_shot"].metrics.accuracy
    json.dumps(r.to_json())
