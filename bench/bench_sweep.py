"""The configuration engine against a TransformerLens-style peer (one hooked pass per configuration, prompts batched).

    python bench/bench_sweep.py [--prompts 8] [--tokens 128] [--reps 1 [--min]] [--only last|all] [--threads N]
                                [--no-peer-last] [--json out.json]
    python bench/bench_sweep.py --smoke   # a tiny 12-layer GPT-2, 2 prompts x 8 tokens (the CI test)

Model: the GPT-2-small shape (12 layers x 12 heads, d 768, vocab 50257), random weights, CPU fp32.
Prompts: random token ids, all `--tokens` long (so the peer needs no padding).

Two sweeps of 16 configurations each:
  last: 8 last-token head ablations (1..8 random heads, zero ablation) and 8 injections of random vectors
        at the last token of layers 0..11;
  all:  top-k head ablation at all positions, k in 0,1,2,4,8,16,32,64, for two orders: "score" (a synthetic
        ranking that puts later layers first, as the TR / induction rankings do) and "random".
Each is run by
  peer:      TransformerLens 4.x `TransformerBridge` around a copy of the same HF model: one `run_with_hooks`
             per configuration on the batched prompts, hooks on `blocks.{l}.attn.hook_z` (masks) and
             `blocks.{l-1}.hook_resid_post` (injections at the input of layer l), TransformerLens's default all-position logits;
  peer-last: the same, asking the bridge for the last position's logits only (`logits_to_keep=1`);
  full:      `run_configs(engine="full")`, every (configuration, prompt) row a full pass, rows batched;
  auto:      `run_configs(engine="auto")`.
If TransformerLens cannot be imported, the peer is one HF forward per configuration with the same hooks
(labelled "peer (HF hooks, no TransformerLens)"). Predictions of every side are compared with `auto`'s.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from backend.analysis.primitives.engine import RowConfig, run_configs  # noqa: E402
from backend.model.loading import wrap  # noqa: E402

KS = (0, 1, 2, 4, 8, 16, 32, 64)


def gpt2_small(seed: int = 0, tiny: bool = False):
    """The GPT-2-small shape, random weights; `tiny`: the same 12 layers at d 32, 2 heads, vocabulary 1000."""
    import transformers as T

    torch.manual_seed(seed)
    cfg = (T.GPT2Config(n_layer=12, n_head=2, n_embd=32, vocab_size=1000, n_positions=64, bos_token_id=0,
                        eos_token_id=0) if tiny else
           T.GPT2Config(n_layer=12, n_head=12, n_embd=768, vocab_size=50257, n_positions=1024))
    return T.AutoModelForCausalLM.from_config(cfg).eval()


class _Tok:
    """Just enough of a tokenizer for pre-tokenised input (the smoke run without the GPT-2 tokenizer)."""

    pad_token_id = 0
    pad_token = "<pad>"


def tokenizer(required: bool = True):
    from tiny_models import GPT2_TOKENIZER
    from transformers import AutoTokenizer

    if not GPT2_TOKENIZER.is_dir():
        if not required:
            return _Tok()
        raise SystemExit(f"the GPT-2 tokenizer is missing at {GPT2_TOKENIZER}")
    return AutoTokenizer.from_pretrained(str(GPT2_TOKENIZER))


def last_sweep(L: int, H: int, d: int, g: torch.Generator) -> list[RowConfig]:
    out = []
    for k in range(1, 9):
        m = torch.ones(L, H)
        for i in torch.randperm(L * H, generator=g)[:k].tolist():
            m[i // H, i % H] = 0
        out.append(RowConfig(mask=m, scope="last"))
    for layer in (1, 3, 5, 7, 9, 11, 12, 6):  # decoder layers' inputs
        out.append(RowConfig(inject={layer: 4.0 * torch.randn(d, generator=g)}))
    return out


def orders(L: int, H: int, g: torch.Generator) -> dict[str, list[tuple[int, int]]]:
    heads = [(l, h) for l in range(L) for h in range(H)]
    score = torch.tensor([l / L for l, _ in heads]) + 0.5 * torch.rand(len(heads), generator=g)
    return {"score": [heads[i] for i in score.argsort(descending=True).tolist()],
            "random": [heads[i] for i in torch.randperm(len(heads), generator=g).tolist()]}


def topk_sweep(L: int, H: int, ranked: dict[str, list[tuple[int, int]]]) -> list[RowConfig]:
    out = []
    for perm in ranked.values():
        for k in KS:
            m = torch.ones(L, H)
            for l, h in perm[:k]:
                m[l, h] = 0
            out.append(RowConfig(mask=m))
    return out


def first_layers(configs: list[RowConfig]) -> list[int | None]:
    return [None if c.mask is None or (c.mask == 1).all() else int((c.mask != 1).any(1).nonzero()[0]) for c in configs]


# -- the peer ------------------------------------------------------------------------------------------------
def tl_bridge(hf_model, tok):
    """TransformerLens 4.x's bridge around a copy of the model (it switches its copy to eager attention)."""
    from importlib.metadata import version

    from transformer_lens.model_bridge import TransformerBridge

    br = TransformerBridge.boot_transformers("gpt2", hf_model=copy.deepcopy(hf_model), tokenizer=tok)
    br.eval()
    return br, f"TransformerLens {version('transformer_lens')} TransformerBridge"


def tl_hooks(cfg: RowConfig, H: int):
    hooks = []
    if cfg.mask is not None:
        for layer in (cfg.mask != 1).any(1).nonzero().flatten().tolist():
            m = cfg.mask[layer]  # (H,)

            def hz(z, hook, m=m):  # z (batch, pos, heads, d_head)
                if cfg.scope == "last":
                    z = z.clone()
                    z[:, -1] = z[:, -1] * m[:, None].to(z)
                    return z
                return z * m[None, None, :, None].to(z)
            hooks.append((f"blocks.{layer}.attn.hook_z", hz))
    for layer, v in (cfg.inject or {}).items():
        def hr(resid, hook, v=v):
            resid = resid.clone()
            resid[:, -1] = resid[:, -1] + v.to(resid)
            return resid
        # "at layer l" is the input of decoder layer l: the output of block l - 1 (block 0's input for l = 0)
        hooks.append((f"blocks.{layer - 1}.hook_resid_post" if layer else "blocks.0.hook_resid_pre", hr))
    return hooks


def tl_sweep(br, tokens: torch.Tensor, configs: list[RowConfig], H: int, last_only: bool) -> torch.Tensor:
    out = []
    kw = {"logits_to_keep": 1} if last_only else {}
    with torch.inference_mode():
        for cfg in configs:
            logits = br.run_with_hooks(tokens, return_type="logits", fwd_hooks=tl_hooks(cfg, H), **kw)
            out.append(logits[:, -1].float())
    return torch.stack(out)


def hf_peer_sweep(lm, tokens: torch.Tensor, configs: list[RowConfig], H: int, last_only: bool) -> torch.Tensor:
    """Fallback peer without TransformerLens: one HF forward per configuration, the same hooks by hand."""
    from backend.model.hooks import hooked

    out = []
    with lm.lock, torch.inference_mode():
        for cfg in configs:
            N = tokens.shape[0]
            mask = None if cfg.mask is None else cfg.mask[None].expand(N, -1, -1)
            with hooked(lm, head_mask=mask, mask_scope=cfg.scope, inject=cfg.inject):
                o = lm.model(input_ids=tokens, **({"logits_to_keep": 1} if last_only else {}))
            out.append(o.logits[:, -1].float())
    return torch.stack(out)


def ours(lm, ids: list[list[int]], configs: list[RowConfig], engine: str) -> torch.Tensor:
    C, N = len(configs), len(ids)
    out = torch.empty(C, N, lm.model.config.vocab_size)

    def on_logits(logits, cs, ps):
        out[cs.cpu(), ps.cpu()] = logits.cpu()

    run_configs(lm, ids, configs, on_logits, engine=engine, batch_size=32)
    return out


STAT = statistics.median


def timed(fn, reps: int):
    """Wall-clock and process CPU seconds over `reps` runs (median, or min with --min), and the last result."""
    wall, cpu, result = [], [], None
    for _ in range(reps):
        t, c = time.perf_counter(), time.process_time()
        result = fn()
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    return STAT(wall), STAT(cpu), result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--no-peer-last", action="store_true", help="skip the peer with last-position logits only")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    ap.add_argument("--only", choices=("last", "all"), default=None, help="run one of the two sweeps")
    ap.add_argument("--min", action="store_true", help="report the fastest of --reps runs, not the median")
    ap.add_argument("--json", default=None)
    ap.add_argument("--smoke", action="store_true", help="a tiny 12-layer model, 2 prompts x 8 tokens (seconds)")
    a = ap.parse_args()
    if a.smoke:
        a.prompts, a.tokens, a.reps = 2, 8, 1
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.min:
        global STAT
        STAT = min

    hf, tok = gpt2_small(tiny=a.smoke), tokenizer(required=not a.smoke)
    lm = wrap(hf, tok, "gpt2-small-random")
    L, H, d = lm.n_layers, lm.n_heads, lm.d_model
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, min(50000, hf.config.vocab_size), (a.prompts, a.tokens), generator=g)
    ids = tokens.tolist()
    try:
        if isinstance(tok, _Tok):
            raise ImportError("the GPT-2 tokenizer is absent")
        br, peer_name = tl_bridge(hf, tok)
        peer = lambda cf, last_only: tl_sweep(br, tokens, cf, H, last_only)  # noqa: E731
    except ImportError as e:
        peer_name = f"peer (HF hooks, no TransformerLens: {e})"
        peer = lambda cf, last_only: hf_peer_sweep(lm, tokens, cf, H, last_only)  # noqa: E731
    ranked = orders(L, H, g)
    sweeps = {"last": last_sweep(L, H, d, g), "all": topk_sweep(L, H, ranked)}
    print(f"model: GPT-2-small shape{' (tiny: d 32, 2 heads)' if a.smoke else ''}, random weights, CPU fp32, {torch.get_num_threads()} threads, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; "
          f"{a.prompts} prompts x {a.tokens} tokens; peer: {peer_name}", flush=True)
    print(f"all-position sweep, first ablated layer per configuration: {first_layers(sweeps['all'])}", flush=True)

    # warm-up on a small input
    small = [x[:8] for x in ids[:2]]
    for cf in sweeps.values():
        ours(lm, small, cf[:3], "auto")
        ours(lm, small, cf[:3], "full")
    with torch.inference_mode():
        peer(sweeps["last"][:2], False)

    results: dict = {"prompts": a.prompts, "tokens": a.tokens, "peer": peer_name, "threads": torch.get_num_threads()}
    results["stat"] = f"{'min' if a.min else 'median'} of {a.reps}"
    for name, configs in sweeps.items():
        if a.only and name != a.only:
            continue
        row: dict = {"configs": len(configs)}
        row["auto_s"], row["auto_cpu_s"], got = timed(lambda: ours(lm, ids, configs, "auto"), a.reps)
        row["full_s"], row["full_cpu_s"], full = timed(lambda: ours(lm, ids, configs, "full"), a.reps)
        row["peer_s"], row["peer_cpu_s"], ref = timed(lambda: peer(configs, False), a.reps)
        if not a.no_peer_last:
            row["peer_last_s"], row["peer_last_cpu_s"], ref_last = timed(lambda: peer(configs, True), a.reps)
            row["peer_last_same_predictions"] = float((ref_last.argmax(-1) == got.argmax(-1)).float().mean())
        row["full_vs_auto_max_abs"] = float((full - got).abs().max())
        row["peer_vs_auto_max_abs"] = float((ref - got).abs().max())
        row["same_predictions"] = float((ref.argmax(-1) == got.argmax(-1)).float().mean())
        row["full_same_predictions"] = float((full.argmax(-1) == got.argmax(-1)).float().mean())
        row["peer_over_auto"] = row["peer_s"] / row["auto_s"]
        row["full_over_auto"] = row["full_s"] / row["auto_s"]
        row["peer_over_full"] = row["peer_s"] / row["full_s"]
        if "peer_last_s" in row:
            row["peer_last_over_auto"] = row["peer_last_s"] / row["auto_s"]
        results[name] = row
        if a.smoke and not row["full_vs_auto_max_abs"] <= 1e-4:
            raise SystemExit(f"smoke: the auto engine's logits differ from full passes by {row['full_vs_auto_max_abs']}")
        print(f"\n[{name}] {len(configs)} configurations x {a.prompts} prompts")
        print(f"  auto {row['auto_s']:.2f} s | full {row['full_s']:.2f} s | peer {row['peer_s']:.2f} s"
              + (f" | peer-last {row['peer_last_s']:.2f} s" if "peer_last_s" in row else ""))
        print(f"  peer / auto = {row['peer_over_auto']:.1f}x"
              + (f"   peer-last / auto = {row['peer_last_over_auto']:.1f}x" if "peer_last_s" in row else "")
              + f"   full / auto = {row['full_over_auto']:.1f}x   peer / full = {row['peer_over_full']:.2f}x")
        print("  CPU seconds: " + " | ".join(f"{k} {row[k + '_cpu_s']:.1f}" for k in ("auto", "full", "peer", "peer_last")
                                           if k + "_cpu_s" in row)
              + f"   peer / auto = {row['peer_cpu_s'] / row['auto_cpu_s']:.1f}x"
              + (f"   peer-last / auto = {row['peer_last_cpu_s'] / row['auto_cpu_s']:.1f}x" if "peer_last_s" in row else "")
              + f"   full / auto = {row['full_cpu_s'] / row['auto_cpu_s']:.1f}x")
        print(f"  same top-1 prediction as auto: peer {row['same_predictions']:.3f}, full "
              f"{row['full_same_predictions']:.3f}; max |logit diff| peer {row['peer_vs_auto_max_abs']:.1e}, "
              f"full {row['full_vs_auto_max_abs']:.1e}", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
