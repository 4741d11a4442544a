"""Anytime head maps: the maps so far are published as prompts finish, and the final maps are today's, bit for bit."""
from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from backend.analysis.kernel import analyze
from backend.analysis.primitives.batching import encode
from backend.analysis.primitives.prefix_store import STORE
from backend.analysis.primitives.stats import stderr
from backend.analysis.tsla.scoring_pass import FIRST_ROWS, MAP_NAMES, PER_PROMPT, score_heads, slices
from test_core_invariants import sentiment_task
from test_pages import MODEL, default_task, needs_model
from hang import HANG_S  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")  # the first batch runs in slices on one CPU thread (the service's)

N = 21  # two batches of 16 and 5: the first one runs in slices of FIRST_ROWS


def encoded(lm, n=N, shots=2):
    task = sentiment_task()
    return encode(lm, task.build_prompts(shots, n, seed=0), task.kind)


@pytest.mark.parametrize("keep_prefix", [False, True])
def test_the_anytime_maps_equal_the_plain_ones_exactly(tiny_lm, keep_prefix):
    enc = encoded(tiny_lm)
    assert len({len(x) for x in enc.ids[:16]}) > 1, "the first batch must really pad"
    STORE.clear()
    plain = score_heads(tiny_lm, enc, batch_size=16, keep_prefix=keep_prefix)
    seen: list[dict] = []
    STORE.clear()
    anytime = score_heads(tiny_lm, enc, batch_size=16, keep_prefix=keep_prefix, partial=seen.append)
    for name in MAP_NAMES:
        a, b = getattr(plain, name), getattr(anytime, name)
        assert a.dtype == b.dtype and np.array_equal(a, b), f"{name} differs"
    for k in ("correct", "label_correct", "in_labels", "pred_token", "pred_label", "gold_prob"):
        assert np.array_equal(getattr(plain.outcomes, k), getattr(anytime.outcomes, k)), k
    assert plain.metrics() == anytime.metrics()
    # published with their prompt counts, increasing: each slice of the first batch, the first batch, the rest
    assert [d["prompts_done"] for d in seen] == [FIRST_ROWS, 2 * FIRST_ROWS, 16, N] == [4, 8, 16, N]
    assert all(d["prompts"] == N for d in seen)
    last = seen[-1]
    for name in MAP_NAMES:  # the last view is the final maps
        assert np.array_equal(np.asarray(last[name]), getattr(anytime, name)), name
    assert last["icl"] == {**anytime.metrics()}
    first = seen[0]
    assert np.asarray(first["tr"]).shape == (tiny_lm.n_layers, tiny_lm.n_heads)
    assert first["icl"]["n"] == FIRST_ROWS
    if keep_prefix:  # the sliced first batch kept every prompt's prefix state, as the plain pass does
        assert STORE.get(tiny_lm, enc.ids) is not None
    for k in PER_PROMPT:  # the per-prompt maps too (the slices' rows are written again by the whole batch)
        assert np.array_equal(plain.per_prompt[k], anytime.per_prompt[k]), k


def test_each_view_carries_its_interval_narrowing_as_prompts_finish(tiny_lm):
    """Each view's `stats`: per head the SE of the prompts done (those of the views after a whole batch exactly the
    final per-prompt rows'), a normal interval around the view's mean; wider after 4 prompts than after all."""
    enc = encoded(tiny_lm)
    seen: list[dict] = []
    hm = score_heads(tiny_lm, enc, batch_size=16, partial=seen.append)
    order = sorted(range(N), key=lambda i: -len(enc.ids[i]))  # the batches' order (by length)
    for d in seen:
        assert d["interval"] == "normal" and set(d["stats"]) == set(PER_PROMPT)
        rows = np.sort(order[:d["prompts_done"]])
        for k in PER_PROMPT:
            st = {f: np.asarray(v, dtype=float) for f, v in d["stats"][k].items()}
            want = stderr(hm.per_prompt[k][rows])
            if d["prompts_done"] in (16, N):  # after a whole batch: the final rows, bit for bit
                assert np.array_equal(st["se"], want), (k, d["prompts_done"])
            else:
                np.testing.assert_allclose(st["se"], want, rtol=1e-5, atol=1e-12, err_msg=k)
            mean = np.asarray(d[k])
            np.testing.assert_allclose(st["ci_high"] - mean, 1.959963984540054 * st["se"], rtol=1e-9, atol=1e-15)
            assert np.all(st["ci_low"] <= mean) and np.all(mean <= st["ci_high"])
            sd = hm.per_prompt[k][rows].std(axis=0, ddof=1)  # the half-width per sd: 1.96 / sqrt(prompts done)
            ok = sd > 0
            np.testing.assert_allclose(((st["ci_high"] - mean) / np.where(ok, sd, 1))[ok],
                                       1.959963984540054 / np.sqrt(len(rows)), rtol=1e-4)
    assert [d["prompts_done"] for d in seen] == [4, 8, 16, N]  # so the interval narrows as 1 / sqrt(4, 8, 16, 21)


def test_with_several_threads_the_views_come_per_batch(gpt2_tokenizer):
    """No slices with several torch threads (there each extra pass costs their waits): a view per batch, the same
    final maps."""
    from backend.model.loading import wrap
    from tiny_models import tiny_model

    lm = wrap(tiny_model("llama"), gpt2_tokenizer, "tiny-llama")
    enc = encoded(lm)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        seen: list[dict] = []
        anytime = score_heads(lm, enc, batch_size=16, partial=seen.append)
        plain = score_heads(lm, enc, batch_size=16)
    finally:
        torch.set_num_threads(before)
    assert [d["prompts_done"] for d in seen] == [16, N]
    assert all(np.array_equal(getattr(plain, k), getattr(anytime, k)) for k in MAP_NAMES)


def test_slices_cover_the_batch_doubling():
    assert slices(16) == [(0, 4), (4, 8), (8, 16)]
    assert slices(32) == [(0, 4), (4, 8), (8, 16), (16, 32)]
    assert slices(10) == [(0, 4), (4, 8), (8, 10)] and slices(3) == [(0, 3)]


def test_the_first_view_is_the_mean_over_the_first_prompts(tiny_lm):
    """The first slice's maps equal the plain maps of those prompts alone (to float rounding)."""
    enc = encoded(tiny_lm)
    seen: list[dict] = []
    score_heads(tiny_lm, enc, batch_size=16, partial=seen.append)
    order = sorted(range(N), key=lambda i: -len(enc.ids[i]))[:FIRST_ROWS]
    sub = type(enc)([enc.prompts[i] for i in order], [enc.ids[i] for i in order],
                    [enc.label_ids[i] for i in order], [enc.gold[i] for i in order], enc.kind)
    alone = score_heads(tiny_lm, sub, batch_size=FIRST_ROWS)
    for name in MAP_NAMES:
        np.testing.assert_allclose(np.asarray(seen[0][name]), getattr(alone, name), rtol=1e-6, atol=1e-9,
                                   err_msg=name)


def test_a_scores_job_publishes_the_maps_so_far_and_ends_with_todays_result(gpt2_tokenizer):
    from backend.model.loading import wrap
    from tiny_models import tiny_model

    lm = wrap(tiny_model("llama"), gpt2_tokenizer, "tiny-llama")
    task = sentiment_task()
    live: list[dict] = []
    params = dict(shots=2, prompts=20, seed=0)
    a = analyze("scores", lm, task, params, cache=False, live=live.append)
    b = analyze("scores", lm, task, params, cache=False)
    for name in (*MAP_NAMES, "induction"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert a.icl == b.icl and a.top_tr == b.top_tr and a.top_tl == b.top_tl
    done = [d["prompts_done"] for d in live if d.get("kind") == "maps"]
    assert done == sorted(done) and done[0] == FIRST_ROWS and done[-1] == 20
    assert all(d["prompts"] == 20 and d["n_layers"] == lm.n_layers and d["shots"] == 2 for d in live)


def test_the_anytime_pass_caches_under_the_same_key(gpt2_tokenizer):
    """A result computed with a listener is the cache hit of one computed without."""
    from backend.model.loading import wrap
    from tiny_models import tiny_model

    lm = wrap(tiny_model("gpt2"), gpt2_tokenizer, "tiny-gpt2")
    params = dict(shots=2, prompts=12, seed=1)
    first = analyze("maps", lm, sentiment_task(), params, live=lambda d: None)
    again = analyze("maps", lm, sentiment_task(), params)
    assert not first.cache_hit and again.cache_hit
    assert np.array_equal(first.tr, again.tr)
    assert torch.equal(torch.as_tensor(first.tl), torch.as_tensor(again.tl))


@needs_model
def test_a_service_job_shows_the_partial_maps_as_its_live_data(inprocess):
    """Through the service: a running scores job's `live` field holds the maps so far, prompts_done increasing."""
    params = {"model": MODEL, "task": default_task(), "shots": 2, "prompts": 18, "seed": 5}
    job_id = inprocess.submit("scores", params)
    seen: list[int] = []
    while True:
        j = inprocess.job(job_id)
        live = j.get("live") or {}
        if live.get("kind") == "maps" and (not seen or live["prompts_done"] != seen[-1]):
            seen.append(live["prompts_done"])
            assert live["prompts"] == 18 and live["n_layers"] > 0
        if j["status"] not in ("queued", "running"):
            break
        time.sleep(0.01)
    assert j["status"] == "done", j.get("error")
    assert j["result"]["prompts"] == 18
    assert seen and seen == sorted(seen) and set(seen) <= {4, 8, 16, 18}


def test_the_partial_view_is_marked_with_its_prompt_counts():
    """The Head map's and Home's drawers: "Partial: 8 of 50 prompts", the map of the picked metric (TR when the
    picked one is not in the partial data), and the accuracies so far."""
    from streamlit.testing.v1 import AppTest

    def script():
        from ui.tsla import anytime

        L, H = 3, 4
        data = {"kind": "maps", "prompts_done": 8, "prompts": 50, "n_layers": L, "n_heads": H, "shots": 8,
                "icl": {"accuracy": 0.625, "label_accuracy": 0.75, "tr_ratio": 1.0, "n": 8},
                **{k: [[float(l * H + h) for h in range(H)] for l in range(L)] for k in anytime.PARTIAL_MAPS}}
        data["interval"] = "normal"
        data["stats"] = {"tr": {"se": [[0.01 * (l * H + h + 1) for h in range(H)] for l in range(L)],
                                "ci_low": [[-1.0] * H] * L, "ci_high": [[2.0] * H] * L}}
        view = anytime.PartialView("t", min_interval_s=0.0)
        anytime.map_drawer(view, lambda: "induction", " · test")(data)
        anytime.map_drawer(view, lambda: "induction", " · test")(data)  # the same count: not drawn again
        home = anytime.PartialView("h", min_interval_s=0.0)
        anytime.summary_drawer(home)(data)
        anytime.summary_drawer(home)({"kind": "ltv_vector", "loss": [1.0]})  # another kind's live data: ignored

    at = AppTest.from_function(script, default_timeout=HANG_S)
    at.run()
    assert not at.exception
    infos = [i.value for i in at.info]
    assert len(infos) == 2 and all("Partial: 8 of 50 prompts" in i for i in infos)
    assert "Accuracy so far: **62.5%**" in infos[0]
    charts = at.get("plotly_chart")
    assert len(charts) == 1
    import json

    fig = json.loads(charts[0].proto.spec)
    assert "TR (partial: 8 of 50 prompts)" in fig["layout"]["title"]["text"]
    heads = next(t for t in fig["data"] if t.get("name") == "heads")  # each head's SE and interval so far
    assert "SE 0.01 · 95% normal CI so far [-1, 2]" in heads["customdata"][0][2]
    assert "%{customdata[2]}" in heads["hovertemplate"]
    assert [c.value for c in at.caption if "SE up to 0.12; narrowing as prompts finish" in c.value]
    assert [m.value for m in at.metric] == ["62.5%", "75.0%", "100.0%"]
