"""The training pipeline of the embedded model, on the tiny config: the loss falls, the folder reloads."""
from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest
import torch

from backend.tasks.synthetic import build_world
from backend.analysis.general.train_default import (CONFIGS, build_tokenizer, icl_batch, label_loss, lr_factor, main, rep_batch,
                                            rep_length_at)

# one torch thread: the tiny config's training (the suite's costliest fixture) takes 103 CPU-s on one thread and
# 119 on two, on a busy 2-core machine (and less wall time)
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny-model")
    rc = main(["--config", "tiny", "--out", str(out), "--seed", "0", "--eval-prompts", "10", "--no-progress"])
    assert rc == 0
    return out


def test_loss_falls_and_metrics_are_written(trained):
    m = json.loads((trained / "metrics.json").read_text())
    hist = m["history"]
    assert [h["step"] for h in hist] == [100, 200, 300]
    assert hist[-1]["loss"] < 0.8 * hist[0]["loss"]
    assert hist[-1]["classification"] > 0.5  # beyond chance after 300 tiny steps
    assert set(m["eval"]["groups"]) == {"classification", "generation", "random-mapping"}
    assert set(m["eval"]["groups"]["classification"]) == {"accuracy", "label_accuracy", "tr_ratio"}
    assert (trained / "README.md").read_text().startswith("# headlens-tiny")
    assert len(m["induction"]["scores"]) == CONFIGS["tiny"].layers


def test_saved_folder_reloads_and_encodes(trained):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(trained))
    model = AutoModelForCausalLM.from_pretrained(str(trained))
    assert type(model).__name__ == "LlamaForCausalLM"
    cfg = model.config
    assert cfg.max_position_embeddings == CONFIGS["tiny"].seq_len
    assert cfg.num_key_value_heads < cfg.num_attention_heads
    assert next(model.parameters()).dtype == torch.float32
    w = build_world()
    x, y = w.entities[0], w.class_facts["size"].get(w.entities[0], "big")
    text = f"{x} {y} ; {w.entities[1]}"
    ids = tok(text)["input_ids"]
    assert ids[0] == tok.bos_token_id and len(ids) == 5 and tok.unk_token_id not in ids
    assert tok.decode(ids, skip_special_tokens=True) == text
    full = tok(text + " pos")["input_ids"]
    assert full[:-1] == ids and full[-1] == tok.convert_tokens_to_ids("pos")
    assert tok.pad_token_id is not None and tok.pad_token_id != tok.bos_token_id
    # the reloaded model gives the logits of the saved one's tokenizer-built input
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([ids])).logits
    assert logits.shape == (1, 5, len(tok)) and torch.isfinite(logits).all()


def test_batches_mark_labels_and_copies():
    cfg = CONFIGS["tiny"]
    tok = build_tokenizer(cfg.seq_len)
    vocab = tok.get_vocab()
    ids, tgt = icl_batch(random.Random(0), cfg, vocab, burst=0.5)
    assert ids.shape == tgt.shape == (cfg.batch_icl, 3 * cfg.icl_demos + 1)
    assert (ids[:, 0] == tok.bos_token_id).all() and (ids[:, 3::3] == vocab[";"]).all()
    assert tgt.sum(1).eq(cfg.icl_demos).all() and tgt[:, 2::3].all()
    rids, rtgt = rep_batch(random.Random(0), cfg, vocab)
    assert rids.shape == (cfg.rep_tokens // cfg.seq_len, cfg.seq_len) and rtgt.any(1).all()
    assert rep_batch(random.Random(0), cfg, vocab, 16)[0].shape == (cfg.rep_tokens // 16, 16)
    assert [rep_length_at(cfg, s) for s in (0, cfg.steps // 4, cfg.steps // 2, cfg.steps - 1)] == [16, 32, 64, 64]
    for r in range(len(rids)):  # each target is the word after the previous occurrence of its predecessor
        row = rids[r].tolist()
        for j in torch.nonzero(rtgt[r]).flatten().tolist():
            prev = max(k for k in range(j - 1) if row[k] == row[j - 1])
            assert row[prev + 1] == row[j]


def test_label_loss_counts_only_targets():
    ids = torch.tensor([[1, 5, 6, 7]])
    tgt = torch.tensor([[False, False, True, False]])
    logits = torch.zeros(1, 4, 10)
    logits[0, 1, 6] = 10.0  # position 1 predicts ids[2] = 6
    logits[0, 2, 0] = 50.0  # a wrong prediction at a non-target position is ignored
    assert label_loss(logits, ids, tgt).item() < 1e-3


def test_lr_schedule():
    cfg = replace(CONFIGS["default"], steps=1000, warmup=100)
    assert lr_factor(cfg, 0) == pytest.approx(0.01)
    assert lr_factor(cfg, 99) == pytest.approx(1.0)
    assert lr_factor(cfg, 999) == pytest.approx(0.05, abs=1e-3)


def test_permuted_episodes_keep_the_label_set_and_vary_the_mapping():
    """`permute`: a classification episode relabels its classes by a permutation of the task's own labels, so the
    label set is the task's and the class -> label mapping has to be read off the demonstrations."""
    from backend.tasks.synthetic import CLASS_TASKS, icl_episode

    facts = build_world().facts("category")
    plain = icl_episode(random.Random(0), "syn-category", 12)
    assert all(y == facts[x] for x, y in plain)
    mappings = set()
    for s in range(20):
        ep = icl_episode(random.Random(s), "syn-category", 12, permute=1.0)
        assert {y for _, y in ep} <= set(CLASS_TASKS["category"])
        m = {facts[x]: y for x, y in ep}
        assert len(set(m.values())) == len(m)  # a permutation: distinct classes keep distinct labels
        mappings.add(tuple(sorted(m.items())))
    assert len(mappings) > 1
    assert CONFIGS["default"].permute == 0.0  # the shipped model: a lever, off (see bench/FINDINGS.md)
