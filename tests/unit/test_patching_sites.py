"""Kind `site_patching` (patching at any site and position) on tiny random-weight models, llama-like and gemma3-like:
the sites add up (a layer's input + attn_out + mlp_out = the next layer's input, every family), patching a run with
its own activations changes nothing, patching resid_pre at every position restores the clean run, a prompt alone
equals the same prompt in a padded batch, positions by role pair from each role's end, and bad inputs are refused in
one sentence.

(Named test_patching_sites.py: tests/integration/test_site_patching.py, SITE's patching curves, has the other name,
and two test modules of one basename cannot be collected in one run.)"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from backend.analysis.general import site_patching as SP
from backend.analysis.kernel import analyze
from backend.analysis.primitives import roles as R
from backend.analysis.primitives.batching import encode
from backend.analysis.primitives.patch import gold_ids, target_prompts
from backend.errors import BadInput
from backend.model.interventions import Patch, Record, intervene
from backend.model.loading import wrap
from backend.tasks.base import Task, Template
from tiny_models import CONFIGS, tiny_model

WORDS = ["cat", "dog", "red", "blue", "sun", "moon", "tree", "rock", "fish", "bird", "car", "boat", "king", "queen",
         "hot", "cold", "up", "down", "left", "right"]
ARCHS = ["llama", "gemma3_text"]
SITES = ["resid_pre", "attn_out", "mlp_out", "z"]
_LMS: dict = {}


def _lm(arch, tok):
    if arch not in _LMS:
        _LMS[arch] = wrap(tiny_model(arch), tok, f"tiny-{arch}-sites")
    return _LMS[arch]


def _task(ragged=False):
    """word -> next word; `ragged`: inputs of 1 to 3 words, so prompts differ in length."""
    inputs = [" ".join([w] * (1 + i % 3)) if ragged else w for i, w in enumerate(WORDS)]
    return Task("tiny-next", "generation", [(x, WORDS[(i + 1) % len(WORDS)]) for i, x in enumerate(inputs)],
                Template("Q: {input} = {output} ;\n"))


def _encoded(lm, task, shots=2, n=5, target="random_labels"):
    clean = encode(lm, task.build_prompts(shots, n, 0), task.kind)
    corrupt = encode(lm, target_prompts(task, target, shots, n, 0), task.kind)
    return clean, corrupt


@pytest.mark.parametrize("arch", sorted(CONFIGS))
def test_a_layers_input_plus_attn_out_plus_mlp_out_is_the_next_layers_input(gpt2_tokenizer, arch):
    lm = wrap(tiny_model(arch), gpt2_tokenizer, f"tiny-{arch}-sum")
    got: dict = {}
    items = [Record(s, (lambda s: lambda l, x: got.__setitem__((s, l), x.detach().clone()))(s))
             for s in ("layer_in", "attn_out", "mlp_out")]
    items.append(Record("final_in", lambda _, x: got.__setitem__(("layer_in", lm.n_layers), x.detach().clone())))
    ids = torch.tensor([gpt2_tokenizer("Q: cat = dog ;\nQ: red = blue ;\nQ: sun =")["input_ids"]])
    with torch.inference_mode(), intervene(lm, items):
        lm.model(input_ids=ids)
    for l in range(lm.n_layers):
        s = got["layer_in", l] + got["attn_out", l] + got["mlp_out", l]
        torch.testing.assert_close(s, got["layer_in", l + 1], rtol=0, atol=1e-5)
        assert got["attn_out", l].abs().max() > 0 and got["mlp_out", l].abs().max() > 0
    if lm.spec.post_attn_norm:  # Gemma 2 / 3: the sites are the post-norms' outputs
        assert lm.spec.site_path("attn_out", 0).endswith("post_attention_layernorm")
        assert lm.spec.site_path("mlp_out", 0).endswith("post_feedforward_layernorm")


def _plan(lm, clean, corrupt, task, names):
    rc = SP.prompt_roles(lm, clean, task.template.text)
    rt = SP.prompt_roles(lm, corrupt, task.template.text)
    cols = SP.columns_of(names, rt, rc)
    return [SP.Cells(cols, [(c, None) for c in range(len(names))]),
            SP.Cells(SP.columns_of(["last"], rt, rc), [(0, h) for h in range(lm.n_heads)])]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("site", SITES)
def test_patching_a_run_with_its_own_activations_changes_nothing(gpt2_tokenizer, arch, site):
    lm, task = _lm(arch, gpt2_tokenizer), _task()
    _, corrupt = _encoded(lm, task)
    names = ["label:1", "label:2", "separator", "query", "last", "-3"]
    plan = _plan(lm, corrupt, corrupt, task, names)
    if site != "z":
        plan = plan[:1]
    layers = list(range(lm.n_layers))
    runs = SP.patch_sites(lm, corrupt.ids, corrupt.ids, gold_ids(corrupt), SP.SITES[site], layers, plan,
                          batch_size=8)
    for r in runs:
        np.testing.assert_allclose(r.source_logit, r.target_logit, atol=1e-5, rtol=0)
        np.testing.assert_allclose(r.logit, np.broadcast_to(r.target_logit, r.logit.shape), atol=1e-5, rtol=0)
        np.testing.assert_allclose(r.prob, np.broadcast_to(r.target_prob, r.prob.shape), atol=1e-6, rtol=0)


def _same_length_corruption(clean, seed=0):
    """Target prompts of the clean prompts' lengths: every third token replaced by another word's token."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for ids in clean.ids:
        x = list(ids)
        for j in range(0, len(x) - 1, 3):
            x[j] = int(torch.randint(300, 5000, (1,), generator=g))
        out.append(x)
    return out


@pytest.mark.parametrize("arch", ARCHS)
def test_patching_resid_pre_at_every_position_restores_the_clean_run(gpt2_tokenizer, arch):
    lm, task = _lm(arch, gpt2_tokenizer), _task()
    clean, _ = _encoded(lm, task)
    target = _same_length_corruption(clean)
    every = [[[(t, t) for t in range(len(x))] for x in clean.ids]]
    last = [[[(len(x) - 1, len(x) - 1)] for x in clean.ids]]
    plan = [SP.Cells(every + last, [(0, None), (1, None)])]
    runs = SP.patch_sites(lm, clean.ids, target, gold_ids(clean), "layer_in", list(range(lm.n_layers)), plan,
                          batch_size=4)[0]
    assert np.abs(runs.source_logit - runs.target_logit).max() > 1e-3  # the corruption does change the run
    for li in range(lm.n_layers):  # at layer 0 (the embeddings) and at every later layer's input
        np.testing.assert_allclose(runs.logit[li, 0], runs.source_logit, atol=1e-4, rtol=0)
    assert np.abs(runs.logit[0, 1] - runs.source_logit).max() > 1e-4  # the last token alone at layer 0 is not
    # the metric the kind reports from these runs: every cell of all positions recovers exactly 1
    maps = SP._maps(SP.Runs(runs.source_logit, runs.source_prob, runs.target_logit, runs.target_prob,
                            runs.logit[:, :1], runs.prob[:, :1]), lm.n_layers, 1)
    np.testing.assert_allclose(maps["recovered"], 1.0, atol=1e-4)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("site", ["attn_out", "z"])
def test_a_prompt_alone_equals_the_same_prompt_in_a_padded_batch(gpt2_tokenizer, arch, site):
    lm, task = _lm(arch, gpt2_tokenizer), _task(ragged=True)
    clean, corrupt = _encoded(lm, task, shots=2, n=6, target="zero_shot")
    assert len({len(x) for x in clean.ids}) > 1 and len(clean.ids[0]) != len(corrupt.ids[0])  # padding happens
    plan = _plan(lm, clean, corrupt, task, ["query", "last", "-2"])
    if site != "z":
        plan = plan[:1]
    args = (lm, clean.ids, corrupt.ids, gold_ids(corrupt), site, [0, 1], plan)
    together = SP.patch_sites(*args, batch_size=64)
    alone = SP.patch_sites(*args, batch_size=1)
    for a, b in zip(together, alone):
        for f in ("source_logit", "target_logit", "logit", "prob"):
            np.testing.assert_allclose(getattr(a, f), getattr(b, f), atol=1e-4, rtol=1e-5)
    assert np.abs(together[0].logit - together[0].target_logit).max() > 1e-4  # the patches do something


def test_roles_of_a_prompt_and_their_pairing_from_the_end():
    t = "Q: {input} = {output} ;\n"
    tmpl = Template(t)
    text = tmpl.demo("cat", "dog") + tmpl.demo("red", "blue") + tmpl.query("sun")
    segs = R.segments(text, t, 2, "sun")
    assert "".join(text[s.start:s.end] for s in segs) == text
    assert [(text[s.start:s.end], s.role) for s in segs if s.role != "separator"] == [
        ("cat", "input:1"), (" dog", "label:1"), ("red", "input:2"), (" blue", "label:2"), ("sun", "query")]
    # tokens by character offsets: one overlapping a label and a separator is the label's
    roles = R.token_roles([(0, 0), (0, 2), (3, 6), (6, 8), (8, 12), (12, 15)], segs)
    assert roles == [None, "separator", "input:1", "separator", "label:1", "separator"]
    clean = ["separator", "query", "query", "separator", "label:1", "query", "separator"]
    short = ["query", "separator"]
    assert R.align(short, clean, "query") == [(0, 5)]
    assert R.align(short, clean, "separator") == [(1, 6)]
    assert R.align(short, clean, "last") == [(1, 6)] and R.align(short, clean, "-2") == [(0, 5)]
    assert R.positions(clean, "label") == [4] and R.shared_roles(short, clean, 1) == ["separator", "query", "last"]
    with pytest.raises(R.RoleError, match="absent from the corrupted prompt"):
        R.align(short, clean, "label:1")
    with pytest.raises(R.RoleError, match="unknown position"):
        R.positions(clean, "labels")
    with pytest.raises(R.RoleError, match="does not end with its query"):
        R.segments(text + "x", t, 2, "sun")


@pytest.mark.parametrize("arch", ARCHS)
def test_the_kind_end_to_end_with_standard_errors(gpt2_tokenizer, arch):
    lm, task = _lm(arch, gpt2_tokenizer), _task()
    r = analyze("site_patching", lm, task, cache=False, shots=2, prompts=5, view="both", site="mlp_out")
    assert r.columns == ["label:1", "label:2", "separator", "query", "last"]
    assert r.recovered.shape == r.recovered_se.shape == (lm.n_layers, 5)
    assert r.head_recovered.shape == r.head_recovered_se.shape == (lm.n_layers, lm.n_heads)
    assert np.isfinite(r.logit_gain_se).all() and np.isfinite(r.head_prob_gain_se).all()
    assert r.tokens[:2] == [1.0, 1.0] and r.position == "last" and r.head_tokens == 1.0
    each = analyze("site_patching", lm, task, cache=False, shots=2, prompts=5, positions="each", max_positions=4,
                   layers=[1])
    assert each.columns == ["-4", "-3", "-2", "-1"] and each.recovered.shape == (1, 4) and each.layers == [1]
    roles = analyze("site_patching", lm, task, cache=False, shots=2, prompts=5, layers=[1], batch_size=3)
    np.testing.assert_allclose(each.recovered[0, -1], roles.recovered[0, roles.columns.index("last")], atol=1e-6)


@pytest.mark.parametrize("bad, match", [
    ({"site": "resid_post"}, "site"),
    ({"view": "heads", "position": "label:7"}, "absent"),
    ({"view": "heads", "position": "middle"}, "unknown position"),
    ({"layers": [5]}, "out of range"),
])
def test_bad_inputs_are_refused_in_one_sentence(gpt2_tokenizer, bad, match):
    lm, task = _lm("llama", gpt2_tokenizer), _task()
    with pytest.raises(ValueError, match=match):
        analyze("site_patching", lm, task, cache=False, shots=2, prompts=3, **bad)


def test_a_patch_of_the_wrong_shape_is_refused(gpt2_tokenizer):
    lm = _lm("llama", gpt2_tokenizer)
    ids = torch.tensor([gpt2_tokenizer("Q: cat = dog")["input_ids"]])
    bad = Patch("attn_out", 0, torch.zeros(1, 2, lm.d_model), torch.ones(1, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="patch source of shape"), torch.inference_mode(), intervene(lm, [bad]):
        lm.model(input_ids=ids)
    with pytest.raises(BadInput, match="out of range"):
        SP.patch_sites(lm, [[1, 2]], [[1, 2]], [3], "layer_in", [9], [])


@pytest.mark.parametrize("arch", ARCHS)
def test_the_heads_map_at_the_last_token_is_activation_patching(gpt2_tokenizer, arch):
    """One head's z at the last token, clean prompt i into target i, through full passes from the head's layer on
    (`patch_sites`), equals `activation_patching` (paired) on the configuration engine's last-token steps, which is
    what the kind runs for a heads map at the last token; at another position it runs the full passes."""
    lm, task = _lm(arch, gpt2_tokenizer), _task()
    common = dict(cache=False, shots=2, prompts=5, target="random_labels")
    ap = analyze("activation_patching", lm, task, patch="paired", top_k=2, **common)
    clean, corrupt = _encoded(lm, task, shots=2, n=5)
    plan = _plan(lm, clean, corrupt, task, ["last"])[1:]
    full = SP.patch_sites(lm, clean.ids, corrupt.ids, gold_ids(corrupt), "z", list(range(lm.n_layers)), plan,
                          batch_size=8)[0]
    gain = (full.logit - full.target_logit).mean(-1)
    np.testing.assert_allclose(gain, ap.logit_gain, atol=1e-4, rtol=0)
    np.testing.assert_allclose((full.prob - full.target_prob).mean(-1), ap.prob_gain, atol=1e-5, rtol=0)
    assert np.abs(gain).max() > 1e-3
    r = analyze("site_patching", lm, task, view="heads", position="last", **common)
    np.testing.assert_allclose(r.head_logit_gain, gain, atol=1e-4, rtol=0)
    np.testing.assert_allclose(r.head_logit_gain_se, ap.logit_gain_se, atol=1e-4, rtol=0)
    assert r.clean_logit == pytest.approx(ap.clean_logit, abs=1e-4) and r.gap == pytest.approx(ap.gap, abs=1e-4)
    sub = analyze("site_patching", lm, task, view="heads", position="-1", layers=[1], **common)
    np.testing.assert_allclose(sub.head_recovered, r.head_recovered[1:], atol=1e-6)
    other = analyze("site_patching", lm, task, view="heads", position="query", **common)  # full passes
    assert other.head_tokens == 1.0 and other.head_recovered.shape == (lm.n_layers, lm.n_heads)


def test_corrupted_prompts_equal_to_their_clean_ones_are_warned_about(gpt2_tokenizer):
    lm = _lm("llama", gpt2_tokenizer)
    task = Task("tiny-two", "classification", [(w, "yes" if i % 2 else "no") for i, w in enumerate(WORDS)],
                Template("Q: {input} = {output} ;\n"))
    r = analyze("site_patching", lm, task, cache=False, shots=1, prompts=6, target="random_labels", layers=[0])
    clean = task.build_prompts(1, 6, 0)
    same = sum(a.text == b.text for a, b in zip(clean, target_prompts(task, "random_labels", 1, 6, 0)))
    assert same > 0 and any(f"{same} of 6 random labels prompts are their clean prompt" in w for w in r.warnings)
