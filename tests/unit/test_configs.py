"""The configuration engine: its fast paths (shared prefix for last-token interventions, layer skipping for
all-position masks) give the full engine's logits on every family, left-padded prompts of different lengths."""
from __future__ import annotations

import pytest
import torch

from backend.analysis.primitives import engine as S
from backend.analysis.primitives import engine_fast as F
from backend.analysis.primitives import threads
from backend.analysis.primitives.configs import head_mask
from backend.analysis.primitives.engine import RowConfig, run_configs

from tiny_models import CONFIGS, tiny_model

LENGTHS = (7, 12, 1, 9, 3)  # one batch holds different lengths (left padding) and a one-token prompt
DEPTH = 4  # layers: enough for configurations to start at layers 0, 1, 2 and the last-layer shortcut


def collect(lm, ids, configs, **kw) -> torch.Tensor:
    """(configs, prompts, vocab) logits from run_configs, checking every pair arrives exactly once."""
    C, N = len(configs), len(ids)
    out = torch.full((C, N, lm.model.config.vocab_size), float("nan"))
    seen = torch.zeros(C, N, dtype=torch.long)

    def on_logits(logits, cs, ps):
        assert logits.dtype == torch.float32 and logits.shape == (len(cs), out.shape[-1]) and cs.shape == ps.shape
        out[cs.cpu(), ps.cpu()] = logits.cpu()
        seen[cs.cpu(), ps.cpu()] += 1

    run_configs(lm, ids, configs, on_logits, **kw)
    assert (seen == 1).all(), seen
    return out


def prompts(n_tokens=LENGTHS, seed=0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 50000, (n,), generator=g).tolist() for n in n_tokens]


def mixture(lm, seed=0) -> list[RowConfig]:
    """Zero and partial masks at all positions and at the last token, injections at several layers, and both."""
    g = torch.Generator().manual_seed(seed)
    L, H, d = lm.n_layers, lm.n_heads, lm.d_model

    def mask(*heads, value=0.0):
        m = torch.ones(L, H)
        for l, h in heads:
            m[l, h] = value
        return m

    def vec():
        return torch.randn(d, generator=g)

    return [
        RowConfig(mask=mask((L - 1, 0))),  # all positions, last layer only
        RowConfig(mask=mask((0, 1), (L - 1, 2))),  # all positions from layer 0
        RowConfig(mask=mask((1, 0), value=0.5)),  # a partial multiplier
        RowConfig(mask=mask((L - 2, 1), (L - 1, 0))),  # from the last layer but one
        RowConfig(mask=mask(*[(l, h) for l in range(L) for h in range(H)])),  # everything ablated
        RowConfig(mask=mask((0, 0), (1, 3)), scope="last"),
        RowConfig(mask=mask((L - 1, 1)), scope="last"),
        RowConfig(inject={1: vec()}),
        RowConfig(inject={L: vec()}),
        RowConfig(inject={1: vec(), L: vec()}),  # several layers at once
        RowConfig(mask=mask((1, 1)), scope="last", inject={1: vec()}),
        RowConfig(mask=mask((L - 1, 3)), inject={1: vec()}),  # all-position mask starting after an injection
        RowConfig(mask=mask((1, 2)), inject={L: vec()}),
        RowConfig(),  # untouched
    ]


def fast(lm, ids, configs, monkeypatch, **kw) -> torch.Tensor:
    """`collect` with the auto engine, failing if it falls back to full passes."""
    with monkeypatch.context() as m:
        m.setattr(S, "_run_full", lambda *a, **k: pytest.fail("the auto engine fell back to the full engine"))
        return collect(lm, ids, configs, **kw)


@pytest.mark.parametrize("arch", sorted(CONFIGS))
def test_fast_paths_match_full_engine_every_family(arch, gpt2_tokenizer, monkeypatch):
    """Mean ablation (fill) with the packed last-token step, on every family."""
    lm, ids = _lm(arch, gpt2_tokenizer), prompts()
    configs = mixture(lm)
    fill = torch.randn(lm.n_layers, lm.n_heads, lm.head_dim, generator=torch.Generator().manual_seed(1))
    ref = collect(lm, ids, configs, fill=fill, engine="full", batch_size=8)
    assert torch.isfinite(ref).all()
    got = fast(lm, ids, configs, monkeypatch, fill=fill, batch_size=3)  # several prompt batches and chunks
    assert (got - ref).abs().max().item() <= 1e-5


@pytest.mark.parametrize("arch", ["llama", "gpt2"])  # GQA 6/2 and plain multi-head
def test_zero_and_mean_ablation_both_step_kinds(arch, gpt2_tokenizer, monkeypatch):
    """Zero and mean ablation, last-token configurations packed over one cache or with the cache repeated."""
    lm, ids = _lm(arch, gpt2_tokenizer), prompts(seed=5)
    configs = mixture(lm, seed=5)
    fill = torch.randn(lm.n_layers, lm.n_heads, lm.head_dim, generator=torch.Generator().manual_seed(2))
    for f in (None, fill):
        ref = collect(lm, ids, configs, fill=f, engine="full", batch_size=8)
        for packed in (True, False):
            monkeypatch.setattr(F, "PACKED", packed)
            got = fast(lm, ids, configs, monkeypatch, fill=f, batch_size=3)
            assert (got - ref).abs().max().item() <= 1e-5, (f is not None, packed)


def test_untouched_configurations_are_the_plain_forward_pass(tiny_lm, monkeypatch):  # the 2-layer models
    """All-ones masks (either position kind), zero vectors and empty configurations give the clean logits."""
    from backend.analysis.primitives.engine import make_batch

    lm, ids = tiny_lm, prompts()
    L, H, d = lm.n_layers, lm.n_heads, lm.d_model
    configs = [RowConfig(), RowConfig(mask=torch.ones(L, H)), RowConfig(mask=torch.ones(L, H), scope="last"),
               RowConfig(inject={1: torch.zeros(d), L: torch.zeros(d)}),
               RowConfig(mask=torch.zeros(L, H))]  # one real configuration alongside
    fill = torch.randn(L, H, lm.head_dim)
    got = fast(lm, ids, configs, monkeypatch, fill=fill)
    order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))  # the engine's batch: longest first
    batch = make_batch(lm, ids, order)
    with torch.inference_mode():
        plain = lm.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                         position_ids=batch.position_ids, logits_to_keep=1).logits[:, -1].float()
    for c in range(4):
        assert torch.equal(got[c, order], plain)
    with torch.inference_mode():  # each prompt alone, unpadded
        for i, x in enumerate(ids):
            alone = lm.model(input_ids=torch.tensor([x])).logits[0, -1].float()
            assert (got[0, i] - alone).abs().max().item() <= 1e-5
    assert (got[4] - got[0]).abs().max() > 1e-3  # ablating every head changes the output


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_one_token_prompts(arch, gpt2_tokenizer, monkeypatch):
    """Prompts of one token have no prefix to cache; alone in a batch, or with longer ones."""
    lm = _lm(arch, gpt2_tokenizer)
    configs = mixture(lm)
    for ids in (prompts((1, 1, 1)), prompts((1, 4))):
        ref = collect(lm, ids, configs, engine="full")
        for packed in (True, False):
            monkeypatch.setattr(F, "PACKED", packed)
            assert (fast(lm, ids, configs, monkeypatch) - ref).abs().max().item() <= 1e-5


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_eager_attention_uses_an_additive_packed_mask(arch, gpt2_tokenizer, monkeypatch):
    lm = _lm(arch, gpt2_tokenizer, eager=True)
    ids, configs = prompts(seed=3), mixture(lm, seed=3)
    ref = collect(lm, ids, configs, engine="full")
    masks = []
    real = F.packed_mask
    monkeypatch.setattr(F, "packed_mask", lambda *a: masks.append(r := real(*a)) or r)
    got = fast(lm, ids, configs, monkeypatch, batch_size=2)
    assert masks and all(m is not None and m.dtype == lm.dtype for m in masks)
    assert (got - ref).abs().max().item() <= 1e-5


@pytest.mark.parametrize("arch", ["mistral", "gemma2"])
def test_sliding_window_shorter_than_the_prompts(arch, gpt2_tokenizer, monkeypatch):
    """Sliding-window caches that are already full: every layer sliding (one 4D mask still fits, offset), or
    sliding and full layers mixed (the step repeats the cache over rows instead)."""
    import transformers as T

    from backend.model.loading import wrap

    d = CONFIGS[arch]().to_dict()
    d.update(sliding_window=4, num_hidden_layers=3)
    d.pop("layer_types", None)
    torch.manual_seed(0)
    lm = wrap(T.AutoModelForCausalLM.from_config(type(CONFIGS[arch]())(**d)).eval(), gpt2_tokenizer, f"sw-{arch}")
    ids, configs = prompts(), mixture(lm)
    ref = collect(lm, ids, configs, engine="full")
    masks = []
    real = F.packed_mask
    monkeypatch.setattr(F, "packed_mask", lambda *a: masks.append(r := real(*a)) or r)
    got = fast(lm, ids, configs, monkeypatch, batch_size=3)
    assert (got - ref).abs().max().item() <= 1e-5
    assert any(m is None for m in masks) == (arch == "gemma2"), masks


def test_work_done_is_what_the_configurations_change(gpt2_tokenizer, monkeypatch):
    """Tokens through each layer's attention: a last-token configuration adds one per prompt; an all-position
    mask from layer 2 adds a full pass of layers 2.. only; a mask at the last layer only acts as last-token."""
    lm = _lm("llama", gpt2_tokenizer)
    L, H, d = lm.n_layers, lm.n_heads, lm.d_model
    ids = prompts((6, 9, 4, 8))
    N, W = len(ids), max(len(x) for x in ids)

    def at(*heads):
        return head_mask(lm, heads)

    configs = [RowConfig(mask=at((2, 0), (3, 1))), RowConfig(mask=at((L - 1, 0))),
               RowConfig(mask=at((L - 1, 0)), scope="last"), RowConfig(inject={1: torch.randn(d)}),
               RowConfig(mask=torch.zeros(L, H), scope="last"), RowConfig()]
    # no thread probe (`threads.best_threads`) inside the counted run: its passes would add to the count
    monkeypatch.setattr(threads, "best_threads", lambda lm: torch.get_num_threads())
    tokens = {l: 0 for l in range(L)}
    handles = [lm.o_proj(l).register_forward_pre_hook(
        lambda m, a, l=l: tokens.__setitem__(l, tokens[l] + a[0].shape[0] * a[0].shape[1])) for l in range(L)]
    try:
        got = fast(lm, ids, configs, monkeypatch, batch_size=8)
    finally:
        for h in handles:
            h.remove()
    clean, step = N * W, 4 * N  # one padded clean pass; one token per last-token configuration and prompt
    assert tokens == {0: clean + step, 1: clean + step, 2: 2 * clean + step, 3: 2 * clean + step}
    ref = collect(lm, ids, configs, engine="full")
    assert (got - ref).abs().max().item() <= 1e-5


def test_step_passes_run_at_the_measured_thread_count(gpt2_tokenizer, monkeypatch):
    """The clean pass keeps torch's thread count; the one-token steps run at the count `best_threads` measured
    for the model's small passes (1 here), and torch's setting is back afterwards. The logits are the full
    engine's."""
    lm = _lm("gpt2", gpt2_tokenizer)
    ids, configs = prompts(), mixture(lm)
    ref = collect(lm, ids, configs, engine="full")
    seen: dict[str, set[int]] = {"pass": set(), "step": set()}
    real = F._step_passes

    def step(*a, **k):
        seen["step"].add(torch.get_num_threads())
        return real(*a, **k)

    handle = lm.final_norm.register_forward_pre_hook(lambda m, a: seen["pass"].add(torch.get_num_threads()))
    monkeypatch.setattr(F, "_step_passes", step)
    monkeypatch.setattr(threads, "best_threads", lambda lm: 1)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        got = fast(lm, ids, configs, monkeypatch, batch_size=3)
        after = torch.get_num_threads()
    finally:
        handle.remove()
        torch.set_num_threads(before)
    assert seen == {"pass": {1, 2}, "step": {1}} and after == 2
    assert (got - ref).abs().max().item() <= 1e-5


def test_passes_start_at_their_earliest_layer():
    """Long prompts: one pass per start layer; short ones: start layers merge into fewer, fuller passes."""
    routes = [F.Route("all", start=s) for s in (5, 0, 9, 5, 2, 9)]
    todo = list(range(len(routes)))
    long = F._chunks(routes, todo, 12, tokens=8 * 512, per=4)
    assert [(s, sorted(c)) for s, c in long] == [(9, [2, 5]), (5, [0, 3]), (2, [4]), (0, [1])]
    short = F._chunks(routes, todo, 12, tokens=2, per=4)
    assert len(short) < len(long) and all(len(c) <= 4 for _, c in short)
    assert sorted(c for _, cs in short for c in cs) == todo
    assert all(s == min(routes[c].start for c in cs) for s, cs in short)


def test_each_pair_once_after_out_of_memory(gpt2_tokenizer, monkeypatch):
    """An OOM in the middle of a prompt batch halves the batch; pairs already delivered are not sent again."""
    lm = _lm("gpt2", gpt2_tokenizer)
    ids, configs = prompts(), mixture(lm)
    ref = collect(lm, ids, configs, engine="full")
    real, raised = F._from_layer, []

    def once(*a, **k):
        if not raised:
            raised.append(1)
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(*a, **k)

    monkeypatch.setattr(F, "_from_layer", once)
    got = fast(lm, ids, configs, monkeypatch, batch_size=4)  # collect asserts exactly once
    assert raised and (got - ref).abs().max().item() <= 1e-5


def test_falls_back_to_full_passes_for_the_rest(gpt2_tokenizer):
    """A model the fast paths cannot handle (seen on a later batch here) finishes on the full engine."""
    lm = _lm("gpt2", gpt2_tokenizer)
    ids, configs = prompts(), mixture(lm)
    ref = collect(lm, ids, configs, engine="full")
    real, calls = F._fast_batch, []

    def second_fails(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise F.Unsupported("simulated")
        return real(*a, **k)

    F._fast_batch = second_fails
    try:
        got = collect(lm, ids, configs, batch_size=2)
    finally:
        F._fast_batch = real
    assert (got - ref).abs().max().item() <= 1e-5


def test_progress_and_errors(gpt2_tokenizer):
    lm = _lm("gpt2", gpt2_tokenizer)
    L, H, d = lm.n_layers, lm.n_heads, lm.d_model
    ids, configs = prompts(), mixture(lm)
    seen = []
    collect(lm, ids, configs, batch_size=2, progress=lambda f, msg: seen.append((f, msg)))
    fr = [f for f, _ in seen]
    assert len(seen) > 3 and fr == sorted(fr) and fr[-1] == 1.0 and all(isinstance(m, str) for _, m in seen)
    sink = lambda *a: None  # noqa: E731
    for bad, kw in [([RowConfig(mask=torch.ones(L + 1, H))], {}), ([RowConfig(inject={L + 1: torch.ones(d)})], {}),
                    ([RowConfig(inject={0: torch.ones(d)})], {}),
                    ([RowConfig(inject={1: torch.ones(d + 1)})], {}), ([RowConfig(scope="first")], {}),
                    ([RowConfig()], {"engine": "fast"}), ([RowConfig()], {"fill": torch.zeros(L, H, 1)})]:
        with pytest.raises(ValueError):
            run_configs(lm, ids, bad, sink, **kw)
    with pytest.raises(ValueError):
        run_configs(lm, [[1, 2], []], [RowConfig()], sink)
    run_configs(lm, ids, [], sink)  # nothing to do
    run_configs(lm, [], configs, sink)


_lms: dict = {}


def deep_model(arch: str, layers: int = DEPTH, seed: int = 0) -> torch.nn.Module:
    """tests/tiny_models.py's model of a family, with more layers (random output-projection biases too)."""
    import transformers as T

    d = CONFIGS[arch]().to_dict()
    d["n_layer" if "n_layer" in d else "num_hidden_layers"] = layers
    d.pop("layer_types", None)  # rebuilt for the new depth
    torch.manual_seed(seed)
    model = T.AutoModelForCausalLM.from_config(type(CONFIGS[arch]())(**d))
    for mod in model.modules():
        if getattr(mod, "bias", None) is not None and isinstance(mod.bias, torch.nn.Parameter):
            torch.nn.init.normal_(mod.bias, std=0.02)
    return model.eval()


def _lm(arch, tok, eager=False, layers=DEPTH):
    from backend.model.loading import wrap

    key = (arch, eager, layers)
    if key not in _lms:
        model = deep_model(arch, layers) if layers != 2 else tiny_model(arch)
        if eager:
            model.config._attn_implementation = "eager"
        _lms[key] = wrap(model, tok, f"tiny-{arch}-{layers}{'-eager' if eager else ''}")
        assert _lms[key].n_layers == layers
    return _lms[key]
