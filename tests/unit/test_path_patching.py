"""Kind `path_patching` (issue 33, part 3) on tiny random-weight models of every family (2 layers) and 3-layer llama
(grouped-query attention) and gemma3 (post-attention norms, q / k norms): patching every path from the sender equals
activation-patching the sender, over the prefix cache and in full passes; a sender whose clean and target z are equal
gives 0; `logits` alone with the other heads frozen is the sender's direct write, computed by hand; receivers that
cannot read the sender are refused in one sentence; the kind end to end."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers as T

from backend.analysis.kernel import analyze
from backend.analysis.primitives import paths as P
from backend.analysis.primitives.batching import encode, forward_last_logits, make_batch
from backend.analysis.primitives.capture import capture
from backend.analysis.primitives.patch import gold_ids, patch_heads, target_prompts
from backend.errors import BadInput
from backend.model.interventions import Add, Capture, intervene
from backend.model.loading import wrap
from backend.tasks.base import Task, Template
from tiny_models import CONFIGS, VOCAB, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

WORDS = ["cat", "dog", "red", "blue", "sun", "moon", "tree", "rock", "fish", "bird", "car", "boat", "king", "queen"]
_three = dict(num_hidden_layers=3, hidden_size=48, intermediate_size=96, vocab_size=VOCAB, max_position_embeddings=256)
THREE = {"llama": lambda: T.LlamaConfig(num_attention_heads=6, num_key_value_heads=2, **_three),
         "gemma3_text": lambda: T.Gemma3TextConfig(num_attention_heads=4, num_key_value_heads=2, head_dim=16, **_three)}
_LMS: dict = {}


def _lm(arch, tok, layers=3):
    if (arch, layers) not in _LMS:
        if layers == 3:
            torch.manual_seed(1)
            model = T.AutoModelForCausalLM.from_config(THREE[arch]()).eval()
            for name, mod in model.named_modules():  # gains far from 1, so the post-norms matter
                if name.endswith("post_attention_layernorm") and arch == "gemma3_text":
                    torch.nn.init.normal_(mod.weight, mean=1.0, std=0.5)
        else:
            model = tiny_model(arch)
        _LMS[arch, layers] = wrap(model, tok, f"tiny-{arch}-{layers}-paths")
    return _LMS[arch, layers]


def _task():
    inputs = [" ".join([w] * (1 + i % 3)) for i, w in enumerate(WORDS)]  # prompts of different lengths
    return Task("tiny-next", "generation", [(x, WORDS[(i + 1) % len(WORDS)]) for i, x in enumerate(inputs)],
                Template("Q: {input} = {output} ;\n"))


def _encoded(lm, n=5, target="zero_shot"):
    task = _task()
    clean = encode(lm, task.build_prompts(2, n, 0), task.kind)
    return clean, encode(lm, target_prompts(task, target, 2, n, 0), task.kind)


def _activation_patching(lm, clean, target, sender):
    """The sender's activation patching on the configuration engine (`patch.patch_heads`, paired): (logit, prob)."""
    z = capture(lm, clean, "z", reduce="rows")
    runs = patch_heads(lm, target, z.to(lm.device), batch_size=64)
    row = sender[0] * lm.n_heads + sender[1]
    return runs.per_head()[row], runs.per_head("gold_prob")[row]


CASES = [(a, 2, (0, 1)) for a in sorted(CONFIGS)] + [("llama", 3, (0, 4)), ("llama", 3, (1, 2)),
                                                      ("gemma3_text", 3, (0, 3)), ("gemma3_text", 3, (1, 0))]


@pytest.mark.parametrize("arch, layers, sender", CASES)
def test_patching_every_path_equals_patching_the_sender(gpt2_tokenizer, arch, layers, sender):
    lm = _lm(arch, gpt2_tokenizer, layers)
    clean, target = _encoded(lm)
    every = P.every_receiver(lm, sender)
    assert {r.channel for r in every} == {"q", "k", "v", "mlp", "logits"}
    want_logit, want_prob = _activation_patching(lm, clean, target, sender)
    no_logits = [r for r in every if r.channel != "logits"]
    no_k = [r for r in every if r.channel != "k"]
    for prefix in (True, False):
        runs = P.path_patch(lm, clean.ids, target.ids, gold_ids(target), sender, [every, no_logits, no_k],
                            freeze="none", batch_size=3, prefix=prefix)
        np.testing.assert_allclose(runs.logit[0], want_logit, atol=1e-5, rtol=0)
        np.testing.assert_allclose(runs.prob[0], want_prob, atol=1e-6, rtol=0)
        np.testing.assert_allclose(runs.sender_logit, want_logit, atol=1e-5, rtol=0)  # step 1 unfrozen: the same
        assert np.abs(want_logit - runs.target_logit).max() > 1e-3  # the sender does change the output
        assert np.abs(runs.logit[1] - want_logit).max() > 1e-4  # without the direct path it is not all of it
        if layers == 3:  # and the keys of the later heads carry part of it
            assert np.abs(runs.logit[2] - want_logit).max() > 1e-6


@pytest.mark.parametrize("arch", sorted(THREE))
def test_a_sender_whose_clean_and_target_z_are_equal_has_no_effect(gpt2_tokenizer, arch):
    lm = _lm(arch, gpt2_tokenizer)
    clean, _ = _encoded(lm)
    every = P.every_receiver(lm, (0, 1))
    configs = [every] + [[r] for r in every]
    for freeze in ("heads", "none"):
        full = P.path_patch(lm, clean.ids, clean.ids, gold_ids(clean), (0, 1), configs, freeze=freeze, prefix=False)
        assert (full.logit == full.target_logit[None]).all() and (full.prob == full.target_prob[None]).all()
        assert (full.sender_logit == full.target_logit).all() and (full.step1_prob == full.target_prob).all()
        # over the prefix cache, step 2's batches hold more rows than the target's: float32 rounding at most
        fast = P.path_patch(lm, clean.ids, clean.ids, gold_ids(clean), (0, 1), configs, freeze=freeze)
        assert np.abs(fast.logit - fast.target_logit[None]).max() <= 1e-5
        assert np.abs(fast.prob - fast.target_prob[None]).max() <= 1e-7
    r = analyze("path_patching", lm, _task(), cache=False, shots=2, prompts=4, sender=[0, 1], target="random_labels",
                receivers=["1.0.q", "logits"])  # random labels of a 2-shot prompt: some prompts are the clean ones
    assert r.joint is not None and np.isfinite(r.joint.effect)


@pytest.mark.parametrize("arch", sorted(THREE))
@pytest.mark.parametrize("sender", [(0, 2), (1, 1), (2, 3)])
def test_logits_alone_with_the_heads_frozen_is_the_senders_direct_write(gpt2_tokenizer, arch, sender):
    lm = _lm(arch, gpt2_tokenizer)
    clean, target = _encoded(lm)
    s, h = sender
    dh = lm.head_dim
    rows = list(range(len(target.ids)))
    zc, zt = {}, {}
    with torch.inference_mode():
        with intervene(lm, [Capture("z", at=[s], into=zc)]):
            forward_last_logits(lm, make_batch(lm, clean.ids, rows))
        with intervene(lm, [Capture("z", at=[s], into=zt)]):
            forward_last_logits(lm, make_batch(lm, target.ids, rows))
        z = zt[s].clone()
        z[:, h * dh:(h + 1) * dh] = zc[s][:, h * dh:(h + 1) * dh]
        write = lambda x: lm.o_proj(s)(x)  # noqa: E731
        if lm.spec.post_attn_norm is not None:  # Gemma 3: the post-attention norm, recomputed
            write = lambda x: lm.post_attn_norm(s)(lm.o_proj(s)(x))  # noqa: E731
        direct = write(z) - write(zt[s])
        if lm.spec.post_attn_norm is None:  # the clean-minus-target z times W_O
            by_formula = (zc[s] - zt[s])[:, h * dh:(h + 1) * dh] @ lm.w_o(s)[h]
            torch.testing.assert_close(direct, by_formula, atol=1e-6, rtol=1e-5)
        with intervene(lm, [Add("final_in", {None: direct}, at="last")]):
            logits = forward_last_logits(lm, make_batch(lm, target.ids, rows))
    gold = torch.tensor(gold_ids(target))
    want = logits.gather(1, gold[:, None]).squeeze(1).double().numpy()
    want_p = torch.softmax(logits, -1).gather(1, gold[:, None]).squeeze(1).double().numpy()
    for prefix in (True, False):
        runs = P.path_patch(lm, clean.ids, target.ids, gold_ids(target), sender, [[P.parse_receiver("logits")]],
                            freeze="heads", prefix=prefix)
        np.testing.assert_allclose(runs.logit[0], want, atol=1e-5, rtol=0)
        np.testing.assert_allclose(runs.prob[0], want_p, atol=1e-6, rtol=0)
        assert np.abs(runs.logit[0] - runs.target_logit).max() > 1e-4
        if s < lm.n_layers - 1:  # later heads carry more than the direct path
            assert np.abs(runs.logit[0] - runs.sender_logit).max() > 1e-5


@pytest.mark.parametrize("receiver, match", [
    ("1.0.q", "not after the sender's layer 1"), ("0.2.v", "not after the sender's layer 1"),
    ("0.mlp", "before the sender's layer 1"), ("7.0.k", "outside the model"), ("1.9.q", "outside the model")])
def test_receivers_that_cannot_read_the_sender_are_refused_in_one_sentence(gpt2_tokenizer, receiver, match):
    lm = _lm("llama", gpt2_tokenizer)
    r = P.parse_receiver(receiver, lm.n_layers)
    with pytest.raises(BadInput, match=match) as e:
        P.check_receivers(lm, (1, 2), [r])
    assert "cannot read" in str(e.value) or "outside the model" in str(e.value)
    P.check_receivers(lm, (1, 2), [P.parse_receiver("1.mlp"), P.parse_receiver("2.5.k"), P.parse_receiver("logits")])
    if match.startswith("not after"):  # at admission too: the params model refuses it
        with pytest.raises(ValueError, match="not after the sender's layer 1"):
            analyze("path_patching", lm, _task(), cache=False, shots=2, prompts=3, sender=[1, 2], receivers=[receiver])
    with pytest.raises(ValueError, match="a receiver is written"):
        P.parse_receiver("1.q")


@pytest.mark.parametrize("arch", sorted(THREE))
def test_the_kind_end_to_end(gpt2_tokenizer, arch):
    lm = _lm(arch, gpt2_tokenizer)
    L, H, g = lm.n_layers, lm.n_heads, lm.n_heads // lm.n_kv_heads
    r = analyze("path_patching", lm, _task(), cache=False, shots=2, prompts=5, sender=[0, 1])
    assert r.sender == (0, 1) and r.receivers is None
    for c in ("q", "k", "v"):
        m = getattr(r, c)
        assert m.mean.shape == m.se.shape == m.ci_low.shape == (L, H)
        assert np.isnan(m.mean[0]).all() and np.isfinite(m.mean[1:]).all() and np.isfinite(m.ci_high[1:]).all()
        assert (m.ci_low[1:] <= m.mean[1:] + 1e-12).all() and (m.mean[1:] <= m.ci_high[1:] + 1e-12).all()
    for l in range(1, L):  # a kv head's key is one receiver: equal across its group of query heads
        for h in range(H):
            assert r.k.mean[l, h] == r.k.mean[l, (h // g) * g]
    assert r.mlp.mean[0] is not None and len(r.mlp.mean) == L and r.logits is not None
    assert len(r.effects) == (L - 1) * (H + 2 * lm.n_kv_heads) + L + 1
    assert abs(r.effects[0].effect) >= abs(r.effects[-1].effect)
    one = {e.receiver: e for e in r.effects}
    np.testing.assert_allclose(one["1.2.q"].effect, r.q.mean[1, 2], atol=1e-12)
    np.testing.assert_allclose(one["logits"].effect, r.logits.effect, atol=1e-12)
    some = analyze("path_patching", lm, _task(), cache=False, shots=2, prompts=5, sender=[0, 1],
                   receivers=["1.2.q", "2.1.k", "2.0.k", "logits"], metric="gold_logit")
    assert some.receivers == ["1.2.q", "2.0.k", "logits"]  # 2.1.k and 2.0.k read one kv head (llama: 3 heads each)
    assert some.joint is not None and np.isnan(some.q.mean[2]).all() and some.mlp is None
    logit = analyze("path_patching", lm, _task(), cache=False, shots=2, prompts=5, sender=[0, 1], metric="gold_logit")
    np.testing.assert_allclose({e.receiver: e.effect for e in some.effects}["1.2.q"], logit.q.mean[1, 2], atol=1e-9)


@pytest.mark.parametrize("arch", sorted(CONFIGS))
def test_a_heads_columns_of_the_q_k_v_sites_feed_that_head_alone(gpt2_tokenizer, arch):
    """Sites q / k / v and `ArchSpec.qkv_columns`, every family's layout: changing one head's query columns at the
    last token changes that head's z alone; one kv head's key or value columns, the z of its group's heads alone."""
    lm = _lm(arch, gpt2_tokenizer, 2)
    _, target = _encoded(lm, n=3)
    batch = make_batch(lm, target.ids, [0, 1, 2])
    H, dh, g = lm.n_heads, lm.head_dim, lm.n_heads // lm.n_kv_heads
    got: dict = {}

    def z_with(site=None, cols=None):
        items = [Capture("z", at=[1], into=got)]
        if site is not None:
            def noise(layer, x):  # the columns at the last token, shifted
                y = x.clone()
                y[:, -1, cols] += 3.0
                return y
            items.insert(0, _Act(site, 1, noise))
        with torch.inference_mode(), intervene(lm, items):
            forward_last_logits(lm, batch)
        return got[1].reshape(3, H, dh)

    base = z_with()
    for site, head in [("q", H - 1), ("q", 1), ("k", lm.n_kv_heads - 1), ("v", 0)]:
        kv = site != "q"
        changed = (z_with(site, lm.spec.qkv_columns(site, head, H, lm.n_kv_heads, dh)) - base).abs().amax((0, 2)) > 1e-6
        want = [h // g == head if kv else h == head for h in range(H)]
        assert changed.tolist() == want, (site, head, changed.tolist())


class _Act:
    """A test's own intervention: fn(layer, x) -> new x at one site and layer."""

    def __init__(self, site, layer, fn):
        self.site, self.layer, self.fn = site, layer, fn

    def layers(self, lm):
        return [self.layer]

    def act(self, x, layer):
        return self.fn(layer, x)


@pytest.mark.parametrize("arch", sorted(THREE))
@pytest.mark.parametrize("freeze", ["heads", "none"])
@pytest.mark.parametrize("receiver", ["2.1.q", "2.2.v", "1.mlp", "2.3.k"])
def test_one_receiver_by_hand_in_full_passes(gpt2_tokenizer, arch, freeze, receiver):
    """Wang et al.'s two steps written out on whole prompts with the intervention layer: step 1 the sender (0, 2)
    clean and (freeze heads) every later head's z the target's at every position, the receiver's input recorded;
    step 2 the target with only that input replaced at the last token."""
    from backend.model.interventions import Record, Replace

    lm = _lm(arch, gpt2_tokenizer)
    clean, target = _encoded(lm)
    rows = list(range(len(target.ids)))
    (s, hs), dh, L = (0, 2), lm.head_dim, lm.n_layers
    r = P.canonical(lm, P.parse_receiver(receiver, L))
    site = "mlp_out" if r.channel == "mlp" else r.channel
    cb, tb = make_batch(lm, clean.ids, rows), make_batch(lm, target.ids, rows)
    full: dict = {}
    keep = lambda name: lambda l, x: full.__setitem__((name, l), x.clone())  # noqa: E731
    with torch.inference_mode():
        with intervene(lm, [Capture("z", at=[s], into=(zc := {}))]):
            forward_last_logits(lm, cb)
        with intervene(lm, [Record("z", keep("z")), Record(site, keep(site), at=[r.layer])]):
            base = forward_last_logits(lm, tb)
        z = full["z", s].clone()
        z[:, -1, hs * dh:(hs + 1) * dh] = zc[s][:, hs * dh:(hs + 1) * dh]
        items = [Replace("z", s, z)] + ([Replace("z", l, full["z", l]) for l in range(s + 1, L)]
                                        if freeze == "heads" else [])
        with intervene(lm, [*items, Record(site, keep("step1"), at=[r.layer])]):
            forward_last_logits(lm, tb)
        new = full[site, r.layer].clone()
        cols = slice(None) if r.channel == "mlp" else lm.spec.qkv_columns(
            r.channel, r.head if r.channel == "q" else r.head // (lm.n_heads // lm.n_kv_heads), lm.n_heads,
            lm.n_kv_heads, dh)
        new[:, -1, cols] = full["step1", r.layer][:, -1, cols]
        with intervene(lm, [Replace(site, r.layer, new)]):
            logits = forward_last_logits(lm, tb)
    gold = torch.tensor(gold_ids(target))
    want = (logits - base).gather(1, gold[:, None]).squeeze(1).double().numpy()
    runs = P.path_patch(lm, clean.ids, target.ids, gold_ids(target), (s, hs), [[r]], freeze=freeze)
    np.testing.assert_allclose(runs.logit[0] - runs.target_logit, want, atol=2e-5, rtol=0)
    assert np.abs(want).max() > 1e-6
