"""A model spread over devices (`device_map="auto"`, issue 35): every hook of the intervention layer puts its tensors
on its module's device, whatever device the analysis made them on.

This machine has one device, so the map puts the second half of a tiny Llama on `meta` (shapes, no data) the way
accelerate's `dispatch_model` puts blocks on GPUs: each mapped block moved there with an `AlignDevicesHook` that
moves the block's inputs to it, `hf_device_map` set. torch refuses to mix a `cpu` and a `meta` tensor in one op
("Tensor on device cpu is not on the expected device meta!"), exactly as it refuses cuda:0 with cuda:1, so a tensor
left on the wrong device fails the forward pass here as it would on two GPUs.
"""
from __future__ import annotations

import pytest
import torch
import transformers as T

from backend.model.hooks import hooked
from backend.model.interventions import (Add, Capture, HeadMask, Record, Replace, Skip, Tap, injection, intervene)
from backend.model.loading import wrap
from backend.model.placement import module_device

hooks = pytest.importorskip("accelerate.hooks")
CPU, META = torch.device("cpu"), torch.device("meta")
MAP = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.layers.0": "cpu", "model.layers.1": "meta",
       "model.layers.2": "meta", "model.norm": "meta", "lm_head": "meta"}


def _get(obj, dotted):
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


@pytest.fixture()
def spread(gpt2_tokenizer):
    """A tiny 3-layer Llama (untied, so the head can leave the embeddings) mapped as MAP: layers 1, 2, the norm and
    the head on `meta`, each block with accelerate's hook, as `dispatch_model` leaves a model."""
    torch.manual_seed(0)
    cfg = T.LlamaConfig(num_hidden_layers=3, hidden_size=48, intermediate_size=96, num_attention_heads=6,
                        num_key_value_heads=2, vocab_size=50257, max_position_embeddings=256, tie_word_embeddings=False)
    model = T.LlamaForCausalLM(cfg).eval()
    for name, device in MAP.items():
        block = _get(model, name)
        block.to(device)
        hooks.add_hook_to_module(block, hooks.AlignDevicesHook(execution_device=device))
    model.hf_device_map = dict(MAP)
    return wrap(model, gpt2_tokenizer, "tiny-llama-spread", fingerprint="spread")


def _batch(lm):
    """Two left-padded prompts on the CPU, the embeddings' device (`make_batch` would put them on `lm.device`, the
    head's: accelerate moves ids from a GPU to another GPU, but nothing can copy out of `meta`)."""
    return lm.tokenizer(["the cat sat on the mat", "a dog ran home"], padding=True, return_tensors="pt")


def _forward(lm, batch):
    return lm.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits


def test_the_map_is_as_accelerate_leaves_it(spread):
    assert [module_device(l) for l in spread.layers] == [CPU, META, META]
    assert module_device(spread.final_norm) == META and spread.device == META  # lm.device: the unembedding's
    assert module_device(spread.o_proj(0)) == CPU and module_device(spread.o_proj(2)) == META  # leaves: weights'
    logits = _forward(spread, _batch(spread))  # the plain pass runs across the two devices
    assert logits.device == META and logits.shape[-1] == 50257


def test_mask_fill_vectors_and_replacements_made_on_the_cpu_reach_meta_layers(spread):
    """The analysis makes its tensors on one device (here the CPU); a head mask and its fill at every layer, an added
    vector at each layer's input and the final norm's, a replacement of z: each reaches its module's device."""
    lm, batch = spread, _batch(spread)
    b, L, H, dh = 2, lm.n_layers, lm.n_heads, lm.head_dim
    mask = torch.ones(b, L, H)
    mask[:, :, 1] = 0
    fill = torch.randn(L, H, dh)
    vectors = {l: torch.randn(lm.d_model) for l in range(L + 1)}  # 0..L: every layer's input and the final norm's
    seen: dict = {}
    items = [HeadMask(mask, fill, at="all"), HeadMask({2: torch.zeros(b, H)}, at="last"),
             *injection(lm, vectors), Add("layer_in", {1: torch.ones(lm.d_model)}, at="all"),
             Add("layer_in", {0: torch.ones(lm.d_model)}, at=(-1, -2)),  # (offsets check their range: no meta)
             Replace("z", 2, torch.zeros(b, batch['input_ids'].shape[1], H * dh)),
             Record("layer_in", lambda l, x: seen.setdefault(("in", l), x.device)),
             Record("z", lambda l, x: seen.setdefault(("z", l), x.device)),
             Record("final_in", lambda l, x: seen.setdefault(("final", l), x.device))]
    with intervene(lm, items):
        logits = _forward(lm, batch)
    assert logits.device == META
    assert seen == {("in", 0): CPU, ("in", 1): META, ("in", 2): META, ("z", 0): CPU, ("z", 1): META,
                    ("z", 2): META, ("final", None): META}  # a layer's input on its own device, not the previous one's


def test_the_moves_go_to_each_module_s_device(spread, monkeypatch):
    """Every `.to` that carries a tensor across devices during the hooked pass targets the device of the module its
    hook sits on: recorded by wrapping Tensor.to."""
    lm, batch = spread, _batch(spread)
    moves: list[tuple[str, str]] = []
    real_to = torch.Tensor.to

    def to(self, *args, **kwargs):
        out = real_to(self, *args, **kwargs)
        if out.device != self.device:
            moves.append((self.device.type, out.device.type))
        return out

    b, H = 2, lm.n_heads
    items = [HeadMask({1: torch.zeros(b, H)}, at="last"), Add("layer_in", {2: torch.ones(lm.d_model)})]
    monkeypatch.setattr(torch.Tensor, "to", to)
    with intervene(lm, items):
        _forward(lm, batch)
    monkeypatch.undo()
    assert ("cpu", "meta") in moves and ("meta", "cpu") not in moves  # to meta layers' devices; nothing pulled back


def test_the_trace_gathers_captures_on_the_model_s_device(spread):
    """Captures sit on their module's device; `hooked`'s trace gathers them on `lm.device`, so z of every layer stacks
    (the scoring pass's (batch, layers, heads, head_dim)). A bare Capture keeps its module's device."""
    lm, batch = spread, _batch(spread)
    with hooked(lm, capture_z=True, capture_hidden=True, capture_resid_final=True,
                head_mask=torch.ones(2, lm.n_layers, lm.n_heads), inject={1: torch.randn(lm.d_model)}) as tr:
        _forward(lm, batch)
    assert tr.z(lm.n_heads).shape == (2, lm.n_layers, lm.n_heads, lm.head_dim)
    assert tr.z(lm.n_heads).device == META and tr.embed.device == META and tr.resid_final.device == META
    assert {t.device for t in tr.hidden} == {META}
    bare = Capture("layer_out")
    tap = Tap("z", at=[0, 2])
    with intervene(lm, [bare, tap]):
        _forward(lm, batch)
    assert [bare.got[l].device for l in range(lm.n_layers)] == [CPU, META, META]
    assert tap.delta[0].device == CPU and tap.delta[2].device == META


def test_skip_keeps_accelerate_s_forward_and_moves_its_output(spread):
    """A skipped layer's recorded output goes to that layer's device, and on exit the layer gets accelerate's forward
    back (which moves its input): the plain pass afterwards still runs across the devices."""
    lm, batch = spread, _batch(spread)
    wrapped = [l.__dict__.get("forward") for l in lm.layers]
    assert all(f is not None for f in wrapped)  # accelerate's hook replaced each mapped block's forward
    out = torch.zeros(2, batch['input_ids'].shape[1], lm.d_model)  # recorded on the CPU
    got: dict = {}
    with intervene(lm, [Skip([1], out), Record("layer_in", lambda l, x: got.setdefault(l, x), at=[2])]):
        _forward(lm, batch)
    assert got[2].device == META
    assert [l.__dict__.get("forward") for l in lm.layers] == wrapped
    assert _forward(lm, batch).device == META  # layer 1's hook moves the CPU input again


def test_module_device_reads_accelerate_s_hooks_before_the_weights():
    """An offloaded block keeps its weights on `meta` and computes on its execution device; a GPU index means cuda:N;
    a SequentialHook's first hook with a device decides; a module without hook, weights or buffers has none."""
    lin = torch.nn.Linear(2, 2, device="meta")
    lin._hf_hook = hooks.AlignDevicesHook(execution_device="cpu", offload=True)  # as add_hook_to_module sets it
    assert module_device(lin) == CPU
    lin._hf_hook = hooks.SequentialHook(hooks.ModelHook(), hooks.AlignDevicesHook(execution_device=1))
    assert module_device(lin) == torch.device("cuda:1")
    assert module_device(torch.nn.Linear(2, 2, device="meta")) == META and module_device(torch.nn.ReLU()) is None
