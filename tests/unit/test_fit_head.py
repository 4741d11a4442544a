"""Kinds `fit` (does a task fit a model) and `head` (one head on one prompt), on tiny random models.

fit: a word-level tokenizer maps unknown words to `<unk>`; a task whose inputs are mostly unknown is refused (and
every analysis of it fails with a clear TaskError), one that fits is `ok`, prompts over the context window are
reported with the shots that fit. head: attention rows sum to 1 and never look ahead; the per-label DLA equals the
head's last-token write dotted with the labels' unembedding rows; the ablated pass equals the same ablation through
the sweep; the logit lens at the last layer is the model's own prediction.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from backend.analysis.kernel import analyze
from backend.model.hooks import hooked
from backend.model.loading import wrap
from backend.tasks.base import Task, TaskError
from hang import wait_until

WORDS = ["x", "y", "z", "w", "v", "u", "t", "s", "r", "q"]


@pytest.fixture(scope="module")
def word_lm():
    """A tiny Llama with a word-level tokenizer that knows WORDS, yes, no and ';' (everything else is <unk>),
    and a context window of 24 tokens."""
    import transformers as T
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["<unk>", "<pad>", "<s>", "yes", "no", ";", *WORDS])}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="<unk>", pad_token="<pad>", bos_token="<s>",
                                  eos_token="<s>")
    torch.manual_seed(0)
    cfg = T.LlamaConfig(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, hidden_size=32,
                        intermediate_size=64, vocab_size=len(vocab), max_position_embeddings=24)
    return wrap(T.AutoModelForCausalLM.from_config(cfg), tok, "word-level")


def word_task(inputs: list[str], name: str = "t") -> Task:
    from backend.tasks.base import Template

    return Task(name, "classification", [(x, "yes" if i % 2 else "no") for i, x in enumerate(inputs)],
                template=Template("{input} {output} ; "), labels=("yes", "no"))


# -- fit ---------------------------------------------------------------------------------------------------------
def test_a_task_of_known_words_fits(word_lm):
    r = analyze("fit", word_lm, word_task([f"{a} {b}" for a in WORDS[:4] for b in WORDS[4:8]]), shots=1, cache=False)
    assert r.verdict == "ok" and r.messages == []
    assert r.has_unknown_token and r.unknown_inputs == r.unknown_input_tokens == r.unknown_labels == 0.0
    assert r.context is not None and r.context.shots_that_fit == 1 and r.context.context_window == 24


def test_a_task_of_unknown_words_is_refused_and_analyses_fail_clearly(word_lm):
    english = word_task([f"great film number {i}" for i in range(12)] + ["x y"] * 2, "english")
    r = analyze("fit", word_lm, english, shots=1, cache=False)
    assert r.verdict == "refuse"
    assert r.unknown_inputs == pytest.approx(12 / 14) and r.unknown_input_tokens > 0.8
    assert "great" in r.unknown_words and "film" in r.unknown_words
    assert any("unknown token" in m for m in r.messages)
    # every analysis, also those that build no prompts through build_prompts (the trained vectors)
    for kind, params in (("scores", {"shots": 1, "prompts": 2}), ("ltv_train", {}), ("site", {})):
        with pytest.raises(TaskError, match="does not fit model 'word-level'.*unknown token"):
            analyze(kind, word_lm, english, params, cache=False)


def test_a_few_unknown_words_warn(word_lm):
    task = word_task([f"{a} {b}" for a in WORDS[:4] for b in WORDS[4:8]] + ["x hello"])
    r = analyze("fit", word_lm, task, shots=0, cache=False)
    assert r.verdict == "warn" and r.unknown_words == ["hello"]
    assert 0 < r.unknown_input_tokens < 0.05 < r.unknown_inputs


def test_prompts_over_the_context_window_report_the_shots_that_fit(word_lm):
    task = word_task([f"{a} {b} {a}" for a in WORDS for b in WORDS[:3]])  # 5 tokens a demonstration
    r = analyze("fit", word_lm, task, shots=8, cache=False)
    assert r.context.longest_prompt > 24 and 0 <= r.context.shots_that_fit < 8
    assert r.verdict == "warn" and any("context window of 24" in m for m in r.messages)


# -- head --------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def lms(gpt2_tokenizer):
    from tiny_models import tiny_model

    return {arch: wrap(tiny_model(arch), gpt2_tokenizer, f"tiny-{arch}") for arch in ("gpt2", "llama")}


@pytest.fixture(scope="module")
def task() -> Task:
    from backend.tasks.registry import load_task

    return load_task("sentiment")


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_head_view_pattern_dla_ablation_and_lens(lms, task, arch):
    lm = lms[arch]
    layer, h = 1, 2
    r = analyze("head", lm, task, head=(layer, h), shots=2, prompts=3, prompt=1, logit_lens=True, cache=False)
    T = len(r.tokens)
    A = np.asarray(r.attention)
    assert r.attention_rows == list(range(T)) and A.shape == (T, T)
    assert np.allclose(A.sum(1), 1.0, atol=1e-5)  # every destination's attention is a distribution
    assert np.allclose(np.triu(A, 1), 0.0)  # causal: no token attends ahead
    # the per-label DLA is the head's last-token write dotted with the labels' unembedding rows
    ids = lm.tokenizer(r.text)["input_ids"]
    with torch.inference_mode(), hooked(lm, capture_z=True) as tr:
        logits = lm.model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1]
    o = tr.z(lm.n_heads)[0, layer, h].float() @ lm.w_o(layer)[h]
    from backend.analysis.primitives.batching import answer_tokens

    first = [answer_tokens(lm, r.text[-32:], lab)[0] for lab in r.labels]
    want = (lm.unembed.detach().float()[first] @ o).tolist()
    assert r.labels == [" positive", " negative"] and np.allclose(r.label_dla, want, rtol=1e-4, atol=1e-5)
    assert r.write_norm == pytest.approx(float(o.norm()), rel=1e-4)
    assert r.pred == lm.tokenizer.decode([int(logits.argmax())])
    assert r.gold in r.labels and r.tl is not None and r.tr >= 0
    # the ablated pass is the same zero ablation the sweep applies
    from backend.analysis.primitives.configs import head_mask

    with torch.inference_mode(), hooked(lm, head_mask=head_mask(lm, [(layer, h)])[None]):
        ab = lm.model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1]
    gold_id = first[r.labels.index(r.gold)]
    p_ab = torch.softmax(ab.float(), -1)
    assert r.ablated.gold_prob == pytest.approx(float(p_ab[gold_id]), rel=1e-4)
    assert r.ablated.top_probs == pytest.approx([float(p_ab[t.id]) for t in r.top], rel=1e-4, abs=1e-9)
    # the logit lens after the last layer is the model's own next-token distribution
    assert len(r.logit_lens) == lm.n_layers and r.logit_lens[-1][0].token == r.top[0].token
    assert set(r.ranks) == {"tr", "tl", "induction"} and all(1 <= v <= lm.n_layers * lm.n_heads
                                                             for v in r.ranks.values())


def test_head_view_on_your_own_prompt_and_bad_inputs(lms, task):
    lm = lms["llama"]
    r = analyze("head", lm, task, head=(0, 1), text="Q: a lovely day\nA:", ranks=False, cache=False)
    assert r.prompt_index is None and r.gold is None and r.tl is None
    assert r.labels == [" positive", " negative"] and len(r.top) == 10 and r.logit_lens is None
    assert r.ranks.keys() == {"induction"}
    with pytest.raises(ValueError, match="outside this model"):
        analyze("head", lm, task, head=(9, 0), cache=False)
    with pytest.raises(TaskError, match="prompt 99 does not exist"):
        analyze("head", lm, task, head=(0, 0), prompt=99, prompts=3, shots=1, cache=False)


# -- the service: refusal at admission, cached lookups ------------------------------------------------------------
DEFAULT_PRESENT = __import__("pathlib").Path(__file__).resolve().parents[2].joinpath(
    "models", "headlens-tiny", "config.json").is_file()


@pytest.mark.skipif(not DEFAULT_PRESENT, reason="needs the default model")
def test_service_refuses_an_unreadable_task_and_looks_up_cached_results(tmp_path, monkeypatch):
    from starlette.testclient import TestClient

    from backend.service.app import create_app

    monkeypatch.setenv("HEADLENS_CACHE_DIR", str(tmp_path))
    app = create_app()
    with TestClient(app) as c:
        body = {"kind": "scores", "model": "default", "task": "syn-sentiment", "shots": 2, "prompts": 4}
        r = c.post("/jobs/cached", json=body)
        assert r.status_code == 404 and "no cached head_scores result" in r.json()["detail"]  # nothing computed yet
        job = c.post("/jobs", json=body).json()
        j = wait_until(lambda: (j := c.get(f"/jobs/{job['id']}").json())["status"] not in ("queued", "running") and j,
                       "the scores job finishing")
        assert j["status"] == "done", j
        hit = c.post("/jobs/cached", json=body)
        assert hit.status_code == 200 and hit.json()["cache_hit"] is True
        assert hit.json()["result"]["tr"] == j["result"]["tr"]
        assert c.post("/jobs/cached", json={**body, "seed": 1}).status_code == 404  # not computed: not cached
        english = "input,output\n" + "".join(f"{w} film,{'pos' if i % 2 else 'neg'}\n" for i, w in enumerate(
            "great awful lovely boring superb dull charming tedious brilliant weak fine poor".split()))
        up = c.post("/tasks/upload", files={"file": ("english.csv", english.encode())}).json()
        refused = c.post("/jobs", json={**body, "task": up["id"]})  # the model is resident now: refused at once
        assert refused.status_code == 422 and "does not fit model" in refused.json()["detail"]
        assert "unknown token" in refused.json()["detail"]
        fit = c.post("/jobs", json={"kind": "fit", "model": "default", "task": up["id"], "shots": 2})
        assert fit.status_code == 202  # the check itself runs, and says why
