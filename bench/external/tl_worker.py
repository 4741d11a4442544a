"""TransformerLens's side of `bench/check_transformerlens.py`. Runs in TransformerLens's own virtualenv (never the
project's): it imports neither headlens nor anything of this repository.

    <venv>/bin/python bench/external/tl_worker.py IN.json OUT.json

IN.json: {"model_dir", "threads", "ablate": [[layer, head], ...],
          "prompts": [{"text", "ids", "label_ids", "gold"}, ...]}
OUT.json: per prompt, from a TransformerBridge booted offline from `model_dir` and run on the given `ids`:
  - "tr", "tl" (layers x heads): the TSLA maps from TransformerLens's own hook_z and W_O / W_U, in float64:
    o = z[l, -1, h] @ W_O[l, h]; U = W_U.T[label_ids]; P = U^T (U U^T)^+ U; TR = |P o|;
    TL = <o, U[gold] - mean_{c != gold} U[c]> / TR (0 where TR = 0);
  - "clean", "ablated": the last position's full-vocabulary argmax, the label logits (label_ids order) and the
    argmax among the labels, without and with `ablate`'s heads' z set to 0 at every position (hook_z);
  - "to_tokens": TransformerLens's own tokenisation of `text` (`to_tokens`, its BOS convention).
"""
from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def tsla(o, u, gold):
    """TR, TL of the head writes o (heads, d) against the label rows u (labels, d), gold an index of u; float64."""
    import torch

    g = u @ u.T
    p = u.T @ torch.linalg.pinv(g) @ u  # (d, d) projector onto the span of the label rows
    tr = (o @ p.T).norm(dim=-1)
    others = [c for c in range(u.shape[0]) if c != gold]
    direction = u[gold] - (u[others].mean(0) if others else torch.zeros_like(u[gold]))
    tl = torch.where(tr > 0, (o @ direction) / torch.where(tr > 0, tr, torch.ones_like(tr)), torch.zeros_like(tr))
    return tr, tl


def main() -> None:
    src, dst = sys.argv[1], sys.argv[2]
    job = json.load(open(src))
    import torch
    import transformer_lens
    import transformers
    from transformer_lens.model_bridge import TransformerBridge

    torch.set_num_threads(int(job.get("threads") or 1))
    t0 = time.time()
    bridge = TransformerBridge.boot_transformers(job["model_dir"], device="cpu", dtype=torch.float32)
    bridge.eval()
    boot_s = time.time() - t0
    L, H = bridge.cfg.n_layers, bridge.cfg.n_heads
    w_o = bridge.W_O.detach().double()  # (layers, heads, d_head, d_model)
    w_u = bridge.W_U.detach().double()  # (d_model, vocab)
    ablate = [tuple(h) for h in job.get("ablate") or []]

    def zero_heads(z, hook):
        layer = int(hook.name.split(".")[1])
        for l, h in ablate:
            if l == layer:
                z[:, :, h, :] = 0.0
        return z

    ablate_hooks = [(f"blocks.{l}.attn.hook_z", zero_heads) for l in sorted({l for l, _ in ablate})]
    rows = []
    t0 = time.time()
    for pr in job["prompts"]:
        ids = torch.tensor([pr["ids"]])
        labels = pr["label_ids"]
        with torch.inference_mode():
            logits, cache = bridge.run_with_cache(ids, names_filter=lambda n: n.endswith("attn.hook_z"))
            z = torch.stack([cache[f"blocks.{l}.attn.hook_z"][0, -1] for l in range(L)]).double()  # (L, H, d_head)
            u = w_u.T[labels]  # (labels, d_model)
            tr = torch.zeros(L, H, dtype=torch.float64)
            tl = torch.zeros(L, H, dtype=torch.float64)
            for l in range(L):
                o = torch.einsum("hd,hdm->hm", z[l], w_o[l])  # (heads, d_model)
                tr[l], tl[l] = tsla(o, u, pr["gold"])
            out = {}
            for name, hooks in (("clean", []), ("ablated", ablate_hooks)):
                lg = logits if not hooks else bridge.run_with_hooks(ids, fwd_hooks=hooks)
                last = lg[0, -1].double()
                lab = last[labels]
                out[name] = {"argmax": int(last.argmax()), "label_logits": lab.tolist(),
                             "label_argmax": int(lab.argmax())}
        rows.append({"tr": tr.tolist(), "tl": tl.tolist(), **out,
                     "to_tokens": bridge.to_tokens(pr["text"])[0].tolist() if pr.get("text") is not None else None})
    json.dump({"versions": {"transformer_lens": getattr(transformer_lens, "__version__", None) or _dist_version(),
                            "torch": torch.__version__, "transformers": transformers.__version__},
               "bridge": type(bridge).__name__, "n_layers": L, "n_heads": H,
               "default_prepend_bos": getattr(bridge.cfg, "default_prepend_bos", None),
               "boot_seconds": boot_s, "run_seconds": time.time() - t0, "prompts": rows}, open(dst, "w"))


def _dist_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("transformer_lens")
    except Exception:  # noqa: BLE001 (a version string only)
        return None


if __name__ == "__main__":
    main()
