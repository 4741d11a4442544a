"""Task vectors, injection, hidden-state geometry and perturbations."""
from __future__ import annotations


import numpy as np
import pytest
import torch

from pydantic import ValidationError

from backend import build_vectors, geometry, perturbation_report, steer
from backend.analysis.tsla.geometry import hidden_metrics, pca_view
from backend.analysis.primitives.batching import encode, forward_last_logits, make_batch
from backend.analysis.primitives.capture import capture_means
from backend.analysis.primitives.configs import RowConfig, score_configs
from backend.analysis.primitives.tsla import label_space, projector
from backend.analysis.tsla.task_vectors import head_set_vector
from backend.model.hooks import hooked
from backend.model.loading import wrap
from backend.tasks.base import Task, TaskError
from backend.tasks.perturb import PERTURBATIONS
from test_core_invariants import sentiment_task
from tiny_models import tiny_model


@pytest.fixture(scope="module")
def lm(gpt2_tokenizer):
    return wrap(tiny_model("mistral"), gpt2_tokenizer, "tiny-mistral")


# -- geometry, pure ---------------------------------------------------------------------------------
def test_hidden_metrics_on_synthetic_vectors():
    W = torch.zeros(6, 4)
    W[1] = torch.tensor([1.0, 0, 0, 0])
    W[2] = torch.tensor([0, 1.0, 0, 0])
    W[3] = torch.tensor([0, -1.0, 0, 0])
    ls = label_space(W, [[1, 2, 3]] * 3, [0, 0, 1])
    h = torch.tensor([[1.0, 0, 0, 0],   # inside the subspace, along the gold label
                      [0, 0, 3.0, 4.0],  # orthogonal to it
                      [1.0, 1.0, 1.0, 1.0]])
    m = hidden_metrics(h, ls)
    assert m["alignment"].tolist() == pytest.approx([1.0, 0.0, np.sqrt(2) / 2])
    # t = U[gold] - mean(others); row 0: (1,0,0,0) - mean((0,1),(0,-1)) = (1,0,0,0): LD 1, angle 0
    assert m["ld"][0] == pytest.approx(1.0) and m["rotation"][0] == pytest.approx(0.0, abs=1e-6)
    assert m["ld"][1] == pytest.approx(0.0)
    # row 2: gold (0,1): t = (0,1) - mean((1,0),(0,-1)) = (-0.5, 1.5); Ph = (1,1)
    t = torch.tensor([-0.5, 1.5], dtype=torch.float64)
    ph = torch.tensor([1.0, 1.0], dtype=torch.float64)
    assert m["ld"][2] == pytest.approx(float(ph @ t))
    expect = float(torch.rad2deg(torch.arccos((ph @ t) / (ph.norm() * t.norm()))))
    assert m["rotation"][2] == pytest.approx(expect)


def test_alignment_matches_explicit_projector():
    g = torch.Generator().manual_seed(3)
    W = torch.randn(20, 10, generator=g)
    h = torch.randn(5, 10, generator=g)
    m = hidden_metrics(h, label_space(W, [[2, 4, 6]] * 5, [1] * 5))
    P = projector(W[[2, 4, 6]])
    expect = (h.double() @ P).norm(dim=1) / h.double().norm(dim=1)
    torch.testing.assert_close(m["alignment"], expect)


def test_pca_view_shapes():
    rng = np.random.default_rng(0)
    states = {"a": rng.normal(size=(7, 12)), "b": rng.normal(size=(7, 12)) + 3}
    v = pca_view(states, rng.normal(size=(2, 12)), [" x", " y"], components=3)
    assert len(v["points"]["a"]) == 7 and len(v["points"]["a"][0]) == 3
    assert set(v["label_directions"]) == {" x", " y"} and len(v["explained_variance_ratio"]) == 3


# -- injection --------------------------------------------------------------------------------------
def test_zero_vector_leaves_logits_bit_identical(lm):
    task = sentiment_task()
    enc = encode(lm, task.build_prompts(0, 5, 0), task.kind)
    b = make_batch(lm, enc.ids, list(range(5)))
    with torch.inference_mode():
        plain = forward_last_logits(lm, b)
        for layer in range(lm.n_layers):
            with hooked(lm, inject={layer: torch.zeros(lm.d_model)}):
                assert torch.equal(forward_last_logits(lm, b), plain)


def _inputs(lm, b, inject=None):
    """Each decoder layer's input and the final norm's (index n_layers) at the last token, with `inject` applied."""
    from backend.model.interventions import Capture, injection, intervene

    inputs, final = Capture("layer_in", last=b.last), Capture("final_in", last=b.last)
    with intervene(lm, [*injection(lm, inject or {}, last=b.last), inputs, final]):
        forward_last_logits(lm, b)
    return [inputs.got[l] for l in range(lm.n_layers)] + [final.got[None]]


def test_injection_adds_exactly_at_the_last_token(lm):
    """`inject={l: v}`: the input of layer l at the last token moves by exactly v, its other positions not at all."""
    from backend.model.interventions import Record, injection, intervene, replace_last, take_last

    task = sentiment_task()
    enc = encode(lm, task.build_prompts(0, 3, 0), task.kind)
    b = make_batch(lm, enc.ids, list(range(3)))
    v = torch.randn(lm.d_model)
    seen = {}
    with torch.inference_mode():
        for name, inj in (("base", {}), ("steered", {1: v})):
            with intervene(lm, [*injection(lm, inj, last=b.last),
                                Record("layer_in", lambda _, x, n=name: seen.__setitem__(n, x.clone()), at=[1])]):
                forward_last_logits(lm, b)
    delta = seen["steered"] - seen["base"]  # (batch, seq, d_model)
    torch.testing.assert_close(take_last(delta, b.last), v.expand(3, -1))
    others = replace_last(delta, torch.zeros(3, lm.d_model), b.last)
    assert torch.equal(others, torch.zeros_like(others))


def test_injection_reaches_the_model_at_every_layer(lm):
    """Issue 9 asked whether a steering sweep's flat accuracy meant the vector never arrived: at every layer l
    (0: the embeddings .. n_layers: the final norm's input) the layer's input moves by exactly v, earlier inputs do
    not move, and the final state differs per layer."""
    task = sentiment_task()
    enc = encode(lm, task.build_prompts(0, 3, 0), task.kind)
    b = make_batch(lm, enc.ids, list(range(3)))
    v = torch.randn(lm.d_model) * 3
    finals = []
    with torch.inference_mode():
        base = _inputs(lm, b)
        for layer in range(lm.n_layers + 1):
            st = _inputs(lm, b, {layer: v})
            torch.testing.assert_close(st[layer], base[layer] + v)
            for earlier in range(layer):
                assert torch.equal(st[earlier], base[earlier])
            finals.append(st[-1])
    assert not torch.allclose(finals[0], finals[-1])


def test_batched_injections_equal_single_runs(lm):
    task = sentiment_task()
    enc = encode(lm, task.build_prompts(0, 4, 0), task.kind)
    g = torch.Generator().manual_seed(0)
    configs = [RowConfig(inject={1: torch.zeros(lm.d_model)}),
               RowConfig(inject={2: torch.randn(lm.d_model, generator=g) * 5}),
               RowConfig(inject={1: torch.randn(lm.d_model, generator=g) * 5})]
    together = score_configs(lm, enc, configs, batch_size=5)
    for c, cfg in enumerate(configs):
        alone = score_configs(lm, enc, [cfg], batch_size=1)
        assert np.array_equal(together.correct[c], alone.correct[0])
        np.testing.assert_allclose(together.gold_prob[c], alone.gold_prob[0], rtol=1e-5, atol=1e-9)


def test_post_norm_head_set_vector_is_the_mean_of_writes_after_the_norm(gpt2_tokenizer):
    """Gemma 3 (post-attention gains not 1): a head-set vector is the mean over prompts of the heads' writes through
    the norm, linearised per prompt; the o_proj-site vector differs from it."""
    from backend.analysis.primitives.tsla import head_writes

    lm = wrap(tiny_model("gemma3_text"), gpt2_tokenizer, "tiny-gemma3")
    task = sentiment_task()
    heads = [(0, 1), (1, 2)]
    built = build_vectors(lm, task, types=["random"], heads=heads, shots=2, prompts=4, cache=False)
    # the vectors kind extracts from the seed's demonstration pool (vectors.extraction)
    enc = encode(lm, task.build_prompts(2, 4, 0, queries="pool"), task.kind)
    b = make_batch(lm, enc.ids, list(range(len(enc.ids))))
    with torch.inference_mode(), hooked(lm, capture_z=True) as tr:
        forward_last_logits(lm, b)
    z = tr.z(lm.n_heads).float()
    expect = sum(head_writes(z[:, l], lm.w_o(l), tr.write_scale[l])[:, h] for l, h in heads).mean(0)
    got = torch.as_tensor(np.asarray(built.vectors["custom"].vector), dtype=torch.float32)
    torch.testing.assert_close(got, expect, rtol=1e-4, atol=1e-5)
    at_o_proj = sum(z[:, l, h] @ lm.w_o(l)[h] for l, h in heads).mean(0)
    assert not torch.allclose(at_o_proj, expect, rtol=0.1)


def test_head_set_vector_is_the_mean_sum_of_head_writes(lm):
    task = sentiment_task()
    enc = encode(lm, task.build_prompts(2, 4, 0), task.kind)
    heads = [(0, 1), (1, 2)]
    v = head_set_vector(lm, capture_means(lm, enc, "z"), heads)
    b = make_batch(lm, enc.ids, list(range(4)))
    with torch.inference_mode(), hooked(lm, capture_z=True) as tr:
        forward_last_logits(lm, b)
    z = tr.z(lm.n_heads)
    expect = sum(z[:, l, h] @ lm.w_o(l)[h] for l, h in heads).mean(0)
    torch.testing.assert_close(v, expect, rtol=1e-5, atol=1e-6)
    assert torch.equal(head_set_vector(lm, capture_means(lm, enc, "z"), []), torch.zeros(lm.d_model))
    built = build_vectors(lm, task, types=["tr", "random"], heads=heads, shots=2, prompts=4, cache=False)
    assert list(built.vectors) == ["tr", "random", "custom"] and built.vectors["custom"].heads == heads
    assert built.vectors["tr"].vector.shape == (lm.d_model,) and len(built.vectors["tr"].heads) == built.vectors[
        "random"].heads.__len__() == 4


def test_steer_report_and_layer_sweep(lm):
    task = sentiment_task()
    r = steer(lm, task, vectors=("tr", "tl", "random", "fv", "vanilla"), layer="all", shots=2, prompts=6,
              cache=False)
    assert r.layers == list(range(lm.n_layers))
    assert set(r.vectors) == {"tr", "tl", "random", "fv", "vanilla"}
    for v in r.vectors.values():
        assert len(v.accuracy) == lm.n_layers == len(v.tr_ratio) == len(v.label_accuracy) == len(v.norm)
    assert 0 <= r.zero_shot.accuracy <= 1 and 0 <= r.icl.accuracy <= 1
    one = steer(lm, task, vectors=("tr",), alpha=0.0, shots=2, prompts=6, cache=False)
    z = one.zero_shot
    assert one.vectors["tr"].accuracy == [z.accuracy] and one.vectors["tr"].tr_ratio == [z.tr_ratio]  # alpha 0
    with pytest.raises(ValueError, match="out of range"):
        steer(lm, task, vectors=("tr",), layer=99, shots=2, prompts=2, cache=False)
    with pytest.raises(ValidationError, match="vectors"):
        steer(lm, task, vectors=("bogus",), shots=2, prompts=2, cache=False)


def test_geometry_report(lm):
    r = geometry(lm, sentiment_task(), shots=2, prompts=6, cache=False)
    assert set(r.conditions) == {"zero_shot", "zero_shot+tr", "zero_shot+tl", "zero_shot+random", "icl"}
    zs, tr = r.conditions["zero_shot"], r.conditions["zero_shot+tr"]
    inj = r.inject_layer
    # before the injection layer the steered run is the zero-shot run
    for l in range(inj):
        assert tr["alignment"].mean[l] == pytest.approx(zs["alignment"].mean[l])
    assert all(0 <= a <= 1 + 1e-9 for a in zs["alignment"].mean)
    assert len(r.pca.points["icl"]) == 6 and len(r.pca.gold) == 6


# -- perturbations ----------------------------------------------------------------------------------
def test_perturbations_touch_demonstrations_only():
    task = sentiment_task()
    clean = task.build_prompts(4, 5, 0)
    for name, p in PERTURBATIONS.items():
        pert = task.build_prompts(4, 5, 0, perturb=p)
        for a, b in zip(clean, pert):
            assert a.query == b.query and b.text.endswith(task.template.query(a.query))
            if name in ("symbol_labels", "number_labels"):
                assert b.gold.strip() in "@#!$&*0123456789" and b.gold in b.labels
            else:
                assert a.gold == b.gold and a.labels == b.labels
    flipped = task.build_prompts(4, 1, 0, perturb=PERTURBATIONS["flipped_labels"])[0].text
    original = clean[0].text
    assert flipped.count("positive") == original.count("negative")


def test_perturbation_errors_are_specific():
    gen = Task("gen", "generation", [(str(i), str(i + 1)) for i in range(10)])
    with pytest.raises(TaskError, match="applies to classification tasks"):
        gen.build_prompts(2, 2, 0, perturb=PERTURBATIONS["flipped_labels"])
    three = Task("three", "classification", [(str(i), "abc"[i % 3]) for i in range(12)])
    with pytest.raises(TaskError, match="binary task"):
        three.build_prompts(2, 2, 0, perturb=PERTURBATIONS["flipped_labels"])


def test_shuffled_inputs_keep_the_label_sequence():
    task = sentiment_task()
    clean = task.build_prompts(6, 3, 0)
    shuf = task.build_prompts(6, 3, 0, perturb=PERTURBATIONS["shuffled_inputs"])
    for a, b in zip(clean, shuf):
        labels = lambda t: [line for line in t.split("A: ")[1:]]  # noqa: E731
        assert [x.split("\n")[0] for x in labels(a.text)] == [x.split("\n")[0] for x in labels(b.text)]
        assert a.text != b.text


def test_perturbation_report(lm):
    r = perturbation_report(lm, sentiment_task(), shots=2, prompts=6, cache=False)
    per = r.perturbations
    assert set(per) == {"none", *PERTURBATIONS}
    for name in PERTURBATIONS:
        assert per[name].tr_diff.shape == (lm.n_layers, lm.n_heads)
        np.testing.assert_allclose(per[name].tr - per["none"].tr, per[name].tr_diff)
        assert set(per[name].ablation) == {"none", "tr", "tl", "random"}
    assert per["none"].ablation["none"] == per["none"].icl  # the unablated configuration is the plain pass


def test_function_vector_is_skipped_with_a_reason_for_builder_tasks(lm):
    base = sentiment_task()
    task = Task("built", "classification", base.examples, labels=base.labels,
                builder=lambda t, k, n, s: base.build_prompts(k, n, s))
    r = steer(lm, task, vectors=("tr", "fv"), shots=2, prompts=4, cache=False)
    assert set(r.vectors) == {"tr"} and any("no function vector" in w for w in r.warnings)
