"""head_scores end to end: caching, prompt fitting, label checks, model loading errors."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from backend import head_scores
from backend.model.adapters import UnsupportedArchitecture
from backend.analysis.primitives.batching import build_prompts, encode
from backend.analysis.tsla.head_scores import HeadScoresResult
from backend.store.cache import ResultCache
from backend.model.loading import ModelLoadError, load_model, wrap
from backend.tasks.base import Prompt, Task, TaskError
from tiny_models import tiny_model
from test_core_invariants import sentiment_task


@pytest.fixture(scope="module")
def lm(gpt2_tokenizer):
    return wrap(tiny_model("llama"), gpt2_tokenizer, "tiny-llama")


def test_result_shapes_and_fields(lm):
    r = head_scores(lm, sentiment_task(), shots=2, prompts=8, seed=0, cache=False)
    for m in ("tr", "tl", "dla_tr", "dla_tl", "induction"):
        assert getattr(r, m).shape == (lm.n_layers, lm.n_heads), m
        assert np.isfinite(getattr(r, m)).all()
    assert (r.tr >= 0).all()
    assert r.top_k == 4 and len(r.top_tr) == 4 == len(r.top_tl) == len(r.random_heads)  # 3% of 12, at least 4
    assert r.top_tr[0] == tuple(np.unravel_index(np.argmax(r.tr), r.tr.shape))
    for m in (r.icl, r.zero_shot):
        assert 0 <= m.accuracy <= 1 and 0 <= m.label_accuracy <= 1 and 0 <= m.tr_ratio <= 1 and m.n == 8
    # accuracy (full vocabulary) can only be right where the answer is inside the label set
    assert r.icl.accuracy <= r.icl.tr_ratio
    d = r.to_json()
    json.dumps(d, allow_nan=False)  # strict JSON
    assert HeadScoresResult.model_validate(d).tr.tolist() == r.tr.tolist()
    assert head_scores(lm, sentiment_task(), shots=2, prompts=8, top_k=2, cache=False).top_tr == r.top_tr[:2]


def test_cached_result_equals_fresh_and_corrupt_entry_is_recomputed(lm, tmp_path):
    cache = ResultCache(tmp_path / "c")
    task = sentiment_task()
    fresh = head_scores(lm, task, shots=2, prompts=6, cache=cache)
    warm = head_scores(lm, task, shots=2, prompts=6, cache=cache, batch_size=3)  # batch_size is not in the key
    assert not fresh.cache_hit and warm.cache_hit
    for m in ("tr", "tl", "dla_tr", "dla_tl", "induction", "flagged"):
        assert np.array_equal(getattr(fresh, m), getattr(warm, m)), m
    assert fresh.icl == warm.icl and fresh.top_tr == warm.top_tr and fresh.zero_shot == warm.zero_shot
    # every stored value is JSON bytes, never a pickle
    keys = list(cache.dc.iterkeys())
    assert keys and all(isinstance(cache.dc.get(k), bytes) for k in keys)
    for k in keys:
        cache.dc.set(k, b"\x80not json")
    again = head_scores(lm, task, shots=2, prompts=6, cache=cache)
    assert not again.cache_hit and np.array_equal(again.tr, fresh.tr)
    for k in keys:
        cache.dc.set(k, 12345)  # a foreign type: also dropped and recomputed
    assert not head_scores(lm, task, shots=2, prompts=6, cache=cache).cache_hit
    for k in keys:
        cache.dc.set(k, json.dumps({"foo": 1}).encode())  # JSON, but not a scores result: recomputed
    fixed = head_scores(lm, task, shots=2, prompts=6, cache=cache)
    assert not fixed.cache_hit and np.array_equal(fixed.tr, fresh.tr)
    assert head_scores(lm, task, shots=2, prompts=6, cache=cache).cache_hit


def test_a_cache_hit_costs_no_tokenising(lm, tmp_path, monkeypatch):
    cache = ResultCache(tmp_path / "c")
    task = sentiment_task()
    head_scores(lm, task, shots=2, prompts=6, cache=cache)

    def no(*a, **k):
        raise AssertionError("tokenised on a cache hit")

    monkeypatch.setattr(lm, "tokenizer", type("T", (), {"__call__": no})())
    assert head_scores(lm, task, shots=2, prompts=6, cache=cache).cache_hit


def test_a_new_selection_size_reuses_the_cached_maps(lm, tmp_path, monkeypatch):
    cache = ResultCache(tmp_path / "c")
    task = sentiment_task()
    a = head_scores(lm, task, shots=2, prompts=6, cache=cache)

    def no(*args, **kw):
        raise AssertionError("ran the model for a new selection size")

    monkeypatch.setattr("backend.analysis.tsla.head_scores.score_heads", no)
    b = head_scores(lm, task, shots=2, prompts=6, top_k=2, cache=cache)
    assert not b.cache_hit and b.top_tr == a.top_tr[:2] and np.array_equal(a.tr, b.tr)


def test_cache_key_separates_parameters(lm, tmp_path):
    cache = ResultCache(tmp_path / "c")
    task = sentiment_task()
    head_scores(lm, task, shots=2, prompts=6, cache=cache)
    assert not head_scores(lm, task, shots=2, prompts=6, seed=1, cache=cache).cache_hit
    assert not head_scores(lm, task, shots=1, prompts=6, cache=cache).cache_hit
    assert not head_scores(lm, task, shots=2, prompts=6, apply_ln=True, cache=cache).cache_hit
    assert not head_scores(lm, task, shots=2, prompts=6, top_k=5, cache=cache).cache_hit


def test_queries_are_capped_at_the_pool_with_a_warning(lm):
    task = sentiment_task()  # 40 examples: 20 held-out queries per seed
    r = head_scores(lm, task, shots=2, prompts=50, cache=False)
    assert r.prompts == 20 and r.icl.n == 20
    assert any("20 held-out queries" in w and "not the 50 asked" in w for w in r.warnings)
    assert len({p.query for p in build_prompts(lm, task, 2, 50, 0).prompts}) == 20


def test_a_given_prompt_set_is_scored_as_given(lm):
    prompts = [Prompt(f"Q: {w}\nA:", " yes", (" yes", " no")) for w in ("red", "blue", "green")]
    task = Task.from_prompts("mine", prompts)
    r = head_scores(lm, task, prompts=50, cache=False)
    assert r.prompts == 3 and r.zero_shot is None and r.shots == 0
    other = Task.from_prompts("mine", prompts[:2] + [Prompt("Q: red\nA:", " no", (" yes", " no"))])
    assert other.content_hash() != task.content_hash()


def test_apply_ln_changes_scale_not_shape(lm):
    a = head_scores(lm, sentiment_task(), shots=2, prompts=4, cache=False)
    b = head_scores(lm, sentiment_task(), shots=2, prompts=4, apply_ln=True, cache=False)
    assert a.tr.shape == b.tr.shape and not np.allclose(a.tr, b.tr)


def test_prompts_beyond_context_drop_demonstrations(gpt2_tokenizer):
    import transformers as T

    cfg = T.LlamaConfig(num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, hidden_size=16,
                        intermediate_size=32, vocab_size=50257, max_position_embeddings=40)
    torch.manual_seed(0)
    small = wrap(T.AutoModelForCausalLM.from_config(cfg), gpt2_tokenizer, "ctx40")
    task = sentiment_task()
    built = build_prompts(small, task, 8, 5, 0)
    assert built.shots < 8 and built.warnings and "context window of 40" in built.warnings[0]
    assert all(len(gpt2_tokenizer(p.text)["input_ids"]) <= 40 for p in built.prompts)
    r = head_scores(small, task, shots=8, prompts=5, cache=False)
    assert r.shots == built.shots and r.warnings == built.warnings
    long_task = Task("long", "classification", [(" ".join(["word"] * 60), "a"), (" ".join(["word"] * 61), "b")] * 3)
    with pytest.raises(TaskError, match="even the zero-shot prompts"):
        build_prompts(small, long_task, 2, 2, 0)
    with pytest.raises(TaskError, match="exceed the model's context window of 40"):
        encode(small, long_task.build_prompts(0, 2, 0), "classification")


def test_label_first_token_collision_and_multi_token_labels(lm):
    p = Prompt("Q: x\nA:", " unhappy", (" unhappy", " unhappiness"))  # [19283] vs [14274, 42661]: no clash
    assert encode(lm, [p], "classification").multi_token == [" unhappiness"]
    p = Prompt("Q: x\nA:", " unhappiness", (" unhappiness", " unhappinesses"))
    with pytest.raises(TaskError, match="share their first token"):
        encode(lm, [p], "classification")
    enc = encode(lm, [Prompt("Q: x\nA:", " unhappiness", (" unhappiness", " Paris"))], "generation")
    assert enc.label_ids[0] == [14274, 6342]


def test_gpt2_tokenizer_leading_space(lm):
    enc = encode(lm, [Prompt("great film Sentiment:", " positive", (" positive", " negative"))], "classification")
    assert enc.label_ids[0] == [3967, 4633]


def test_load_model_from_folder_and_fingerprints(tmp_path, gpt2_tokenizer):
    m = tiny_model("gpt2")
    m.save_pretrained(tmp_path / "m")
    gpt2_tokenizer.save_pretrained(tmp_path / "m")
    a = load_model(str(tmp_path / "m"), device="cpu")
    b = load_model(str(tmp_path / "m"), device="cpu")
    assert a.fingerprint == b.fingerprint and a.n_heads == 4 and a.tokenizer.padding_side == "left"
    with torch.no_grad():
        m.lm_head.weight[0, 0] += 1.0
    m.save_pretrained(tmp_path / "m")
    assert load_model(str(tmp_path / "m"), device="cpu").fingerprint != a.fingerprint


def test_model_errors_are_specific(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_model(str(tmp_path / "empty"))
    with pytest.raises(ModelLoadError, match="'no-such-org/no-such-model'"):
        load_model("no-such-org/no-such-model")
    import transformers as T

    T.BertConfig(is_decoder=True, num_hidden_layers=1, hidden_size=16, num_attention_heads=2,
                 intermediate_size=32).save_pretrained(tmp_path / "bert")
    with pytest.raises(UnsupportedArchitecture, match=r"'bert' is not supported.*Llama.*Gemma"):
        load_model(str(tmp_path / "bert"))


def test_out_of_memory_halves_the_batch(lm, monkeypatch):
    """A CUDA OOM at large batch sizes is retried at half the size; results do not change."""
    import backend.analysis.primitives.batching as batching

    monkeypatch.setenv("HEADLENS_PREFIX_CACHE_MB", "0")  # no prefix kept: the maps' pass is forward_last_logits
    task = sentiment_task()
    ref = head_scores(lm, task, shots=2, prompts=8, cache=False, batch_size=8)
    real = batching.forward_last_logits
    seen = []

    def flaky(lm_, batch):
        seen.append(len(batch.rows))
        if len(batch.rows) > 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(lm_, batch)

    monkeypatch.setattr("backend.analysis.tsla.scoring_pass.forward_last_logits", flaky)
    got = head_scores(lm, task, shots=2, prompts=8, cache=False, batch_size=8)
    assert seen[:3] == [8, 4, 2] and max(seen[3:]) <= 2
    np.testing.assert_allclose(got.tr, ref.tr, rtol=1e-4, atol=1e-7)

    def always(lm_, batch):
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr("backend.analysis.tsla.scoring_pass.forward_last_logits", always)
    with pytest.raises(MemoryError, match="even at batch size 1"):
        head_scores(lm, task, shots=2, prompts=2, cache=False)


def test_function_vector_dataset_with_real_tokenizer(gpt2_tokenizer):
    """A real user task file (function-vectors format) scores end to end; multi-token labels are reported."""
    from tiny_models import FV_DATASETS
    from backend.tasks.registry import load_task

    if not FV_DATASETS.is_dir():
        pytest.skip("../shared/fv_datasets is absent")
    lm = wrap(tiny_model("gpt2"), gpt2_tokenizer, "tiny-gpt2")
    task = load_task(str(FV_DATASETS / "antonym.json"))
    assert task.kind == "generation" and len(task.examples) > 1000
    r = head_scores(lm, task, shots=4, prompts=12, cache=False)
    assert r.tr.shape == (2, 4) and np.isfinite(r.tl).all()
    assert r.multi_token_labels, "antonym outputs include words GPT-2 splits into several tokens"
    sent = load_task(str(FV_DATASETS / "sentiment.json"))
    assert sent.kind == "classification"
    assert head_scores(lm, sent, shots=4, prompts=6, cache=False).icl.tr_ratio >= 0


def test_labels_unknown_to_a_word_level_tokenizer_are_an_error(lm):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["<unk>", "<pad>", "x", "yes", "no", ";"])}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="<unk>", pad_token="<pad>")
    import transformers as T

    torch.manual_seed(0)
    cfg = T.LlamaConfig(num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, hidden_size=16,
                        intermediate_size=32, vocab_size=6, max_position_embeddings=32)
    word = wrap(T.AutoModelForCausalLM.from_config(cfg), tok, "word-level")
    ok = encode(word, [Prompt("x yes ; x", " yes", (" yes", " no"))], "classification")
    assert ok.label_ids == [[3, 4]]
    with pytest.raises(TaskError, match="' maybe' is unknown to this model's tokenizer"):
        encode(word, [Prompt("x yes ; x", " yes", (" yes", " maybe"))], "classification")


def test_context_cached_finds_the_first_cached_variant_and_never_computes(lm, tmp_path):
    """One feature shows another's result only when it is cached (e.g. SITE's LTV row, at L/2 or from the sweep)."""
    from backend.analysis.kernel import Context, analyze

    cache = ResultCache(tmp_path / "c")
    task = sentiment_task()
    ctx = Context(lm, task, store=cache)
    assert ctx.cached("icl", [{"shots": [0, 2], "prompts": 4}]) is None  # nothing cached: nothing computed
    assert not list(cache.dc.iterkeys())
    done = analyze("icl", lm, task, shots=[0, 2], prompts=4, cache=cache)
    got = ctx.cached("icl", [{"shots": [0, 1], "prompts": 4}, {"shots": [0, 2], "prompts": 4, "no_such_field": 1}])
    assert got is not None and got.cache_hit and got.accuracy == done.accuracy
    assert ctx.cached("no-such-kind", [{}]) is None
    assert ctx.cached("icl", [{"shots": [0, 2], "prompts": -3}]) is None  # params it would refuse: absent
    called = Context(lm, task, store=cache)
    r = called.call("icl", shots=[0, 2], prompts=10_000, warn_prefix="icl: ")  # more prompts than queries: a warning
    assert r.warnings and called.warnings == [f"icl: {w}" for w in r.warnings]  # a sub-call's warnings are passed on


def test_the_random_set_is_drawn_from_the_heads_in_neither_top_set(lm):
    """Issue 19: the "random heads" control included top heads (L1.H1, L0.H4). The steering page's random-heads
    vector is built from the same set."""
    from backend.analysis.kernel import analyze

    task = sentiment_task()
    for seed in range(4):
        r = head_scores(lm, task, shots=2, prompts=8, seed=seed, cache=False)
        assert len(r.random_heads) == r.top_k and not set(r.random_heads) & (set(r.top_tr) | set(r.top_tl))
    v = analyze("vectors", lm, task, types=["random"], shots=2, prompts=8, seed=3, cache=False)
    assert [tuple(h) for h in v.vectors["random"].heads] == [tuple(h) for h in r.random_heads]
    big = head_scores(lm, task, shots=2, prompts=8, top_k=7, cache=False)  # 12 heads: 7 + 7 top leave too few
    assert len(big.random_heads) == 7 and len(set(big.random_heads)) == 7
