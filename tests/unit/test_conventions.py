"""The references' conventions as options (issue 27, item 6): `prepend_bos` (the tokenizer's own choice, or a BOS
token first in every prompt as TransformerLens does) and SITE's kept alpha (`keep_alpha`: the best validation's, or
the last one's as the reference implementation keeps). Neither changes a cached result's key while at its default."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from backend.analysis.kernel import Context, analyze, cache_key, lookup, validate_params
from backend.analysis.kinds import get_kind
from backend.analysis.primitives import bos
from backend.analysis.primitives.batching import encode
from backend.analysis.primitives.capture import capture_means
from backend.analysis.site import soft_select as S
from backend.store.cache import ResultCache, make_key
from backend.cli import main
from backend.model.loading import wrap
from backend.tasks.base import Task, Template
from test_core_invariants import sentiment_task
from tiny_models import tiny_model
from hang import HANG_S  # noqa: E402



@pytest.fixture(scope="module")
def lm(gpt2_tokenizer):
    return wrap(tiny_model("llama"), gpt2_tokenizer, "tiny-llama")  # GPT-2's tokenizer adds no BOS


@pytest.fixture(scope="module")
def no_bos_lm(gpt2_tokenizer):
    tok = copy.deepcopy(gpt2_tokenizer)
    tok.bos_token = None
    assert tok.bos_token_id is None
    return wrap(tiny_model("llama"), tok, "tiny-llama-no-bos")


def test_always_puts_one_bos_first_and_tokenizer_leaves_the_ids(lm):
    task = sentiment_task()
    prompts = task.build_prompts(1, 4, 0)
    plain = encode(lm, prompts, task.kind)
    with bos.convention("always"):
        first = encode(lm, prompts, task.kind)
    b = lm.tokenizer.bos_token_id
    assert all(x[0] != b for x in plain.ids)
    assert all(x == [b, *y] for x, y in zip(first.ids, plain.ids))
    assert first.label_ids == plain.label_ids and first.gold == plain.gold  # the answers do not move
    with bos.convention("tokenizer"):
        assert encode(lm, prompts, task.kind).ids == plain.ids
    assert bos.with_bos(lm.tokenizer, [b, 5, 6], "always") == [b, 5, 6]  # a tokenizer that adds it: not twice
    with pytest.raises(ValueError, match="prepend_bos must be one of tokenizer, always"):
        with bos.convention("sometimes"):
            pass


def test_the_remembered_prompts_of_a_live_toggle_follow_the_convention(lm):
    from backend.analysis.primitives.batching import built_and_encoded

    task = sentiment_task()
    _, plain = built_and_encoded(lm, task, 1, 4, 0)
    with bos.convention("always"):
        _, first = built_and_encoded(lm, task, 1, 4, 0)
    assert first.ids == [[lm.tokenizer.bos_token_id, *x] for x in plain.ids]
    assert built_and_encoded(lm, task, 1, 4, 0)[1].ids == plain.ids


def test_a_tokenizer_without_bos_cannot_prepend_one(no_bos_lm):
    with pytest.raises(ValueError, match=r"^prepend_bos='always' needs a BOS token, and this model's tokenizer has "
                                         r"none; use prepend_bos='tokenizer'$"):
        analyze("scores", no_bos_lm, sentiment_task(), shots=1, prompts=4, prepend_bos="always", cache=False)
    r = analyze("scores", no_bos_lm, sentiment_task(), shots=1, prompts=4, cache=False)  # its default works
    assert np.isfinite(r.tr).all()


@pytest.mark.parametrize("kind,field,value", [("scores", "prepend_bos", "always"), ("icl", "prepend_bos", "always"),
                                              ("ltv_train", "prepend_bos", "always"), ("site", "keep_alpha", "last"),
                                              ("site", "prepend_bos", "always")])
def test_a_convention_at_its_default_keeps_the_cache_key_it_had_before(lm, kind, field, value):
    """Results cached before the option existed keep their key: the field is in the key only when set."""
    spec, task = get_kind(kind), sentiment_task()
    p = validate_params(spec, {})
    before = make_key(kind, model=lm.fingerprint, task=task.content_hash(),
                      params=p.model_dump(mode="json", exclude=set(p.not_in_key) | {"prepend_bos", "keep_alpha"}),
                      **({"kind_version": spec.version} if spec.version else {}))
    assert cache_key(spec, lm, task, p) == before
    assert cache_key(spec, lm, task, validate_params(spec, {field: value})) != before


def test_always_changes_the_maps_and_is_cached_apart(lm, tmp_path):
    cache, task = ResultCache(tmp_path / "c"), sentiment_task()
    plain = analyze("scores", lm, task, shots=2, prompts=6, cache=cache)
    first = analyze("scores", lm, task, shots=2, prompts=6, prepend_bos="always", cache=cache)
    assert not first.cache_hit and first.params["prepend_bos"] == "always"
    assert np.abs(first.tr - plain.tr).max() > 1e-4 * np.abs(plain.tr).max()
    again = analyze("scores", lm, task, shots=2, prompts=6, prepend_bos="always", cache=cache)
    assert again.cache_hit and np.array_equal(again.tr, first.tr)
    assert analyze("scores", lm, task, shots=2, prompts=6, prepend_bos="tokenizer", cache=cache).cache_hit


def test_a_kind_called_by_another_inherits_its_convention(lm, tmp_path):
    cache, task = ResultCache(tmp_path / "c"), sentiment_task()
    analyze("ablation_curves", lm, task, shots=2, prompts=6, ks=[0, 1], orders=["tr"], random_seeds=[0],
            prepend_bos="always", cache=cache)
    scores = dict(shots=2, prompts=6, seed=0)
    assert lookup("scores", lm, task, scores, prepend_bos="always", cache=cache) is not None  # scored with BOS
    assert lookup("scores", lm, task, scores, cache=cache) is None  # and not filed as the tokenizer's convention
    with bos.convention("always"):  # a call inside an analysis that names no convention takes the caller's
        assert validate_params(get_kind("icl"), {}).prepend_bos == "always"
        assert validate_params(get_kind("icl"), {"prepend_bos": "tokenizer"}).prepend_bos == "tokenizer"
    assert validate_params(get_kind("icl"), {}).prepend_bos == "tokenizer"


def test_context_cached_finds_only_results_of_its_own_convention(lm, tmp_path):
    cache, task = ResultCache(tmp_path / "c"), sentiment_task()
    analyze("icl", lm, task, shots=[0, 2], prompts=4, prepend_bos="always", cache=cache)
    want = [{"shots": [0, 2], "prompts": 4}]
    assert Context(lm, task, store=cache).cached("icl", want) is None
    with bos.convention("always"):
        assert Context(lm, task, store=cache).cached("icl", want) is not None


# -- SITE: the kept alpha -----------------------------------------------------------------------------------------------
WORDS = ["cat", "dog", "red", "blue", "sun", "moon", "tree", "rock", "fish", "bird", "car", "boat", "king", "queen",
         "hot", "cold", "up", "down", "left", "right"]


@pytest.fixture(scope="module")
def yesno():
    ex = [(w, "yes" if i % 2 else "no") for i, w in enumerate(WORDS)]
    return Task("tiny-yesno", "classification", ex, Template("{input} = {output} ;\n"), labels=("yes", "no"))


def test_keep_last_keeps_the_last_validation_s_alphas(lm, yesno):
    d = S.site_data(lm, yesno, m=6, shots=2, val_prompts=3, test_prompts=4, seed=0)
    enc = S.encode_all(lm, yesno, d)
    t = capture_means(lm, enc["embed"], "z")
    kw = dict(steps=8, lr=0.2, val_every=3)
    best = S.train_alphas(lm, t, enc["train"], enc["val"], **kw)
    last = S.train_alphas(lm, t, enc["train"], enc["val"], keep="last", **kw)
    assert [v["step"] for v in last.val] == [0, 3, 6, 8] and last.best_step == 8
    assert best.best_step == min(best.val[1:], key=lambda v: v["loss"])["step"]
    assert best.loss == last.loss  # the same training; only what is kept differs
    longer = S.train_alphas(lm, t, enc["train"], enc["val"], keep="last", **{**kw, "steps": 9})
    assert not torch.equal(longer.logits, last.logits)  # the kept alphas are the latest ones
    if best.best_step == 8:
        assert torch.equal(best.logits, last.logits)


def test_site_keep_alpha_last_reports_the_last_step(lm, yesno):
    small = dict(m=4, shots=2, prompts=4, steps=5, val_every=2, val_prompts=3, max_new_tokens=3, compare=[],
                 patching=[], budget=[], correlations=[], cache=False)
    r = analyze("site", lm, yesno, keep_alpha="last", **small)
    assert r.best_step == 5 and r.params["keep_alpha"] == "last"


# -- the edges: the command line and the dashboard's settings --------------------------------------------------------------
def test_the_cli_takes_the_conventions_and_refuses_others(tmp_path, gpt2_tokenizer, capsys):
    d = tmp_path / "tiny-gpt2"
    tiny_model("gpt2").save_pretrained(d)
    gpt2_tokenizer.save_pretrained(d)
    out = tmp_path / "s.json"
    assert main(["scores", "--model", str(d), "--task", "sentiment", "--shots", "1", "--prompts", "3",
                 "--prepend-bos", "always", "--json", str(out), "--no-cache"]) == 0
    import json

    assert json.loads(out.read_text())["params"]["prepend_bos"] == "always"
    assert main(["scores", "--model", str(d), "--task", "sentiment", "--prepend-bos", "sometimes"]) == 2
    assert "--prepend-bos: 'sometimes' is not one of tokenizer, always" in capsys.readouterr().err


def test_the_dashboard_sends_the_convention_only_when_set():
    from ui import state

    s = state.Settings(model="m", task="t", shots=2, prompts=3, seed=0)
    assert "prepend_bos" not in s.job() and s.conventions() == {}
    s.prepend_bos = "always"
    assert s.job()["prepend_bos"] == "always" and s.job(prepend_bos="tokenizer")["prepend_bos"] == "tokenizer"
    assert state.FIELDS["prepend_bos"].parse("always") == "always"
    with pytest.raises(ValueError):
        state.FIELDS["prepend_bos"].parse("sometimes")


def test_a_link_with_the_convention_sets_the_sidebar_and_the_share_link(inprocess):
    pytest.importorskip("streamlit.testing.v1")
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(Path(__file__).resolve().parents[2] / "app.py"), default_timeout=HANG_S)
    at.query_params["prepend_bos"] = "always"
    at.run()
    assert not at.exception
    assert at.selectbox(key="w_prepend_bos").value == "always"
    assert "prepend_bos=always" in " ".join(m.value for m in at.sidebar.html)
    at.selectbox(key="w_prepend_bos").set_value("tokenizer").run()
    assert not at.exception and "prepend_bos" not in " ".join(m.value for m in at.sidebar.html)
