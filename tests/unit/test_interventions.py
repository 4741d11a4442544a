"""The intervention layer (`backend/model/interventions.py`): one module registers hooks, each intervention keeps
its invariant on every family, and the applier always cleans up."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from backend.analysis.primitives.batching import forward_last_logits, make_batch
from tiny_models import CONFIGS, tiny_model

from backend.model.interventions import (Add, Capture, HeadMask, Record, Replace, Skip, intervene, mask_heads,
                                         skip_below)



@pytest.fixture(scope="module", params=sorted(CONFIGS))
def lm(request, gpt2_tokenizer):
    """A LoadedModel of each supported family (random weights), built once for this module."""
    from backend.model.loading import wrap

    return wrap(tiny_model(request.param), gpt2_tokenizer, f"tiny-{request.param}")


@pytest.fixture(scope="module", params=["gemma2", "gpt2", "llama"])
def some_lm(request, gpt2_tokenizer):
    """Three families (tuple outputs aside, the plumbing does not depend on the family): GPT-2's fused layout,
    grouped-query Llama, Gemma 2's post-attention norm."""
    from backend.model.loading import wrap

    return wrap(tiny_model(request.param), gpt2_tokenizer, f"tiny-{request.param}")

REPO = Path(__file__).resolve().parents[2]
HOOK_CALLS = ("register_forward", "register_full_backward", "register_module_forward")


def _batch(lm, texts=("the cat sat on the mat and looked", "a dog ran")):
    ids = [lm.tokenizer(t)["input_ids"] for t in texts]
    return make_batch(lm, ids, list(range(len(ids))))


def _logits(lm, batch, items=(), **kw):
    with torch.inference_mode(), intervene(lm, list(items), **kw):
        return forward_last_logits(lm, batch)


def _hook_count(lm) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in lm.model.modules())


def test_only_the_intervention_module_registers_hooks():
    """No product module but interventions.py registers a hook or replaces a module's forward."""
    files = [*(REPO / "backend").rglob("*.py"), *(REPO / "ui").rglob("*.py"), *(REPO / "pages").rglob("*.py"),
             REPO / "app.py"]
    found = []
    for path in files:
        if not path.is_file():
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            hook = isinstance(node, ast.Attribute) and node.attr.startswith(HOOK_CALLS)
            patch = (isinstance(node, ast.Assign) and any(isinstance(t, ast.Attribute) and t.attr == "forward"
                                                          for t in node.targets))
            if hook or patch:
                found.append(str(path.relative_to(REPO)))
    assert found and set(found) == {"backend/model/interventions.py"}, sorted(set(found))


def test_zero_additions_and_full_masks_leave_the_logits_bit_identical(lm):
    b = _batch(lm)
    plain = _logits(lm, b)
    zero = torch.zeros(lm.d_model)
    ones = torch.ones(1, lm.n_layers, lm.n_heads)
    for items in ([Add("layer_in", {0: zero, 1: zero}, at=(-2, -1))], [Add("layer_out", {0: zero}, at="last")],
                  [Add("layer_out", {1: zero}, at="all")], [HeadMask(ones)], [HeadMask(ones, at="last")],
                  [HeadMask({})], [Capture("z"), Capture("layer_out"), Capture("final_in")]):
        assert torch.equal(_logits(lm, b, items), plain), items


def test_hooks_come_off_after_an_exception(some_lm):
    lm = some_lm
    b = _batch(lm)
    before = _hook_count(lm)
    items = [Capture("z"), Add("layer_in", {1: torch.randn(lm.d_model)}), HeadMask(torch.zeros(1, lm.n_layers,
             lm.n_heads)), Record("final_in", lambda l, x: None), skip_below(1)]
    with pytest.raises(RuntimeError, match="boom"):
        with intervene(lm, items, prefill_only=True):
            assert _hook_count(lm) > before
            assert "forward" in lm.layers[0].__dict__
            raise RuntimeError("boom")
    assert _hook_count(lm) == before
    assert not any("forward" in layer.__dict__ for layer in lm.layers)
    assert torch.equal(_logits(lm, b), _logits(lm, b, []))


def test_captured_z_through_the_output_projection_is_the_attention_output(lm):
    """sum_h z_h @ W_O[h] + b == o_proj(z) at the last token, z from `Capture("z")`."""
    b = _batch(lm)
    outs = {}
    handles = [lm.o_proj(l).register_forward_hook(lambda m, a, o, l=l: outs.__setitem__(l, o[:, -1].clone()))
               for l in range(lm.n_layers)]
    cap = Capture("z")
    try:
        _logits(lm, b, [cap])
    finally:
        for h in handles:
            h.remove()
    for l in range(lm.n_layers):
        z = cap.got[l].float().reshape(-1, lm.n_heads, lm.head_dim)
        total = torch.einsum("bhk,hkd->bd", z, lm.w_o(l))
        if lm.o_bias(l) is not None:
            total = total + lm.o_bias(l).float()
        torch.testing.assert_close(total, outs[l].float(), rtol=1e-5, atol=1e-5)


def test_a_mask_sets_ablated_heads_to_their_fill(lm):
    """After HeadMask (on one module, interventions act in list order), an ablated head's z is its fill and the
    others are untouched: the one head-mask formula."""
    b = _batch(lm)
    L, H, dh = lm.n_layers, lm.n_heads, lm.head_dim
    mask = torch.ones(2, L, H)
    mask[:, 1, 0] = 0
    fill = torch.randn(L, H, dh)
    clean, masked = Capture("z"), Capture("z")
    _logits(lm, b, [clean])
    for at in ("all", "last"):
        logits = _logits(lm, b, [HeadMask(mask, fill, at=at), masked])
        z = masked.got[1].reshape(2, H, dh)
        torch.testing.assert_close(z[:, 0], fill[1, 0].expand(2, dh).to(z.dtype))
        assert torch.equal(z[:, 1:], clean.got[1].reshape(2, H, dh)[:, 1:])
        assert not torch.allclose(logits, _logits(lm, b))
    m = torch.tensor([1.0, 0.5])
    z = torch.randn(3, 2, 4)
    f = torch.randn(2, 4)
    torch.testing.assert_close(mask_heads(z, m, f), torch.stack([z[:, 0], 0.5 * z[:, 1] + 0.5 * f[1]], 1))


def test_adding_after_a_layer_equals_adding_before_the_next(some_lm):
    lm = some_lm
    b = _batch(lm)
    v = torch.randn(lm.d_model)
    after = _logits(lm, b, [Add("layer_out", {0: v}, at="last")])
    before = _logits(lm, b, [Add("layer_in", {1: v}, at=(-1,))])
    torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(after, _logits(lm, b))


def test_skipping_below_a_layer_with_its_clean_input_changes_nothing(lm):
    """Layers < k skipped, layer k - 1 returning its recorded clean output (or layer k reading it): the fast
    paths' principle, bit for bit."""
    b = _batch(lm)
    plain = _logits(lm, b)
    out: dict = {}
    _logits(lm, b, [Record("layer_out", out.__setitem__)])
    k = lm.n_layers - 1
    assert torch.equal(_logits(lm, b, [skip_below(k, out[k - 1])]), plain)
    assert torch.equal(_logits(lm, b, [skip_below(k), Replace("layer_in", k, out[k - 1])]), plain)
    assert not torch.allclose(_logits(lm, b, [Skip([0])]), plain)


def test_prefill_only_acts_on_the_first_pass(some_lm):
    lm = some_lm
    b = _batch(lm)
    seen: list = []
    with torch.inference_mode(), intervene(lm, [Record("final_in", lambda l, x: seen.append(1))],
                                           prefill_only=True) as state:
        forward_last_logits(lm, b)
        forward_last_logits(lm, b)
    assert state.passes == 2 and seen == [1]
    assert state.odd_outputs == []


def test_layers_and_sites_are_checked_before_anything_runs(some_lm):
    lm = some_lm
    before = _hook_count(lm)
    with pytest.raises(ValueError, match="out of range"):
        with intervene(lm, [Capture("z"), Add("layer_in", {lm.n_layers: torch.zeros(lm.d_model)})]):
            pass
    with pytest.raises(ValueError, match="unknown site"):
        with intervene(lm, [Capture("attn")]):  # type: ignore[arg-type]
            pass
    assert _hook_count(lm) == before
    if lm.spec.post_attn_norm is None:
        with pytest.raises(ValueError, match="no post-attention norm"):
            with intervene(lm, [Capture("post_attn_in")]):
                pass
