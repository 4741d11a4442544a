"""Converting a GGUF file, once, into a safetensors folder that every later load reads in seconds.

transformers reads a GGUF file through `from_pretrained(folder, gguf_file=...)`, dequantising every weight to
float (16 s for SmolLM2-135M, 80 s for Gemma-3-270M with its tokenizer, on 2 cores). Its `save_pretrained` then
refuses ("The model is quantized with gguf and is not serializable") although the weights are plain float: the
quantizer state is cleared before saving. The folder, `<models dir>/converted/<sha256>/` (float32), is written
under a temporary name and renamed when finished (backend/store/atomic_dirs.py), one process at a time per file (a
lock per sha256), and checked before it is kept: the tokenizer it saved encodes a probe text as the GGUF's does,
and the reloaded model's logits on it equal the GGUF load's within TOLERANCE (measured: max |Δ| 0.0).
"""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable

import torch

from ..model.adapters import UnsupportedArchitecture, spec_for, spec_for_gguf
from ..store.atomic_dirs import staging
from .gguf_files import MARKER, GgufError, architecture, converted_dir, converted_marker, converted_root, sha256_file
from ..store.locks import KeyLocks
from ..text import clip

PROBE = "The capital of France is Paris. The opposite of hot is cold. Translate: chat ->"
TOLERANCE = 1e-4
Progress = Callable[[float, str], None]


def check_architecture(path: Path) -> str:
    """The file's architecture, when both the adapter table and this transformers can read it; otherwise
    UnsupportedArchitecture, one sentence naming the architecture. Reads the header only."""
    arch = architecture(path)
    spec_for_gguf(arch, clip(path.name, 80))
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    if arch not in GGUF_SUPPORTED_ARCHITECTURES:
        import transformers

        raise UnsupportedArchitecture(f"{clip(path.name, 80)} holds a model of architecture {arch!r}, which "
                                      f"transformers {transformers.__version__} cannot read from a GGUF file")
    return arch


_load_lock = threading.Lock()  # one GGUF read at a time in a process (it patches transformers' progress bar)


def load_gguf(path: Path, dtype: torch.dtype = torch.float32, progress: Progress | None = None) -> tuple[Any, Any]:
    """(model, tokenizer) straight from the GGUF file, every weight dequantised to `dtype`, in eval mode.
    `progress(fraction, message)` follows the tensors as they are dequantised (transformers' own bar is muted)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig
    from transformers import modeling_gguf_pytorch_utils as hf_gguf

    say = progress or (lambda f, m: None)

    def tensors(items: Any, desc: str = "", **_: Any) -> Any:  # stands in for tqdm over the file's tensors
        n = max(len(items), 1)
        for i, item in enumerate(items):
            if i % 8 == 0:
                say(0.1 + 0.6 * i / n, f"dequantising tensor {i} of {n}")
            yield item

    with _load_lock:
        bar, hf_gguf.tqdm = hf_gguf.tqdm, tensors
        try:
            say(0.0, f"reading {path.name}: its header and vocabulary (up to a minute)")
            model, info = AutoModelForCausalLM.from_pretrained(
                str(path.parent), gguf_file=path.name, dtype=dtype, output_loading_info=True,
                quantization_config=GgufConfig(dequantize=True))  # plain nn.Linear weights, even with `kernels`
            missing = sorted(info.get("missing_keys") or ()) + sorted(str(k) for k in info.get("mismatched_keys") or ())
            if missing:  # transformers would fill them with random numbers and go on
                raise GgufError(f"{clip(path.name, 80)} lacks {len(missing)} weight(s) a {model.config.model_type} "
                                f"model needs ({', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}); "
                                f"transformers would fill them with random numbers, so it is not used")
            say(0.75, "building the tokenizer from the GGUF vocabulary")
            tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        finally:
            hf_gguf.tqdm = bar
    return model.eval(), tok


def forget_quantizer(model: Any) -> None:
    """Make a dequantised GGUF model saveable: drop transformers' record that it came quantised."""
    model.hf_quantizer = None
    for attr in ("is_quantized", "quantization_method"):
        if attr in vars(model):
            delattr(model, attr)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config


@torch.inference_mode()
def probe_logits(model: Any, tok: Any) -> tuple[list[int], torch.Tensor]:
    ids = tok(PROBE, return_tensors="pt")["input_ids"]
    return ids[0].tolist(), model(input_ids=ids).logits[0].float()


def convert(path: str | Path, sha256: str | None = None, progress: Progress | None = None) -> Path:
    """The converted folder of the GGUF file at `path` (sha256 given, or computed), converting it if needed.

    Raises UnsupportedArchitecture (before reading any weight) or GgufError (unreadable file, a conversion that
    does not reproduce the GGUF's logits). Nothing half-written is ever left at the folder's path."""
    path = Path(path)
    say = progress or (lambda f, m: None)
    check_architecture(path)
    sha = sha256 or sha256_file(path, lambda f, m: say(0.05 * f, m))
    target = converted_dir(sha)
    if converted_marker(sha) is not None:
        return target
    with KeyLocks(converted_root() / ".locks").hold(f"convert:{sha}"):
        if converted_marker(sha) is not None:  # converted by another process while we waited
            return target
        t0 = time.perf_counter()
        with staging(target, replace=True) as tmp:
            try:
                model, tok = load_gguf(path, progress=lambda f, m: say(0.05 + 0.65 * f, m))
            except (MemoryError, KeyboardInterrupt, GgufError):
                raise
            except Exception as e:  # a quantisation type or layout this transformers cannot read
                first = (str(e).splitlines() or [""])[0][:300]
                raise GgufError(f"transformers could not read {clip(path.name, 80)}: {type(e).__name__}: {first}") \
                    from e
            model_type = model.config.model_type
            spec_for(model_type)
            ids, ref = probe_logits(model, tok)
            say(0.7, "writing safetensors")
            forget_quantizer(model)
            model.save_pretrained(tmp)
            tok.save_pretrained(tmp)
            for f in tmp.iterdir():  # safetensors writes 0600; the folder is as readable as any model folder
                os.chmod(f, 0o644)
            del model
            say(0.85, "checking the conversion against the GGUF load")
            diff = _check(tmp, ids, ref, path)
            (tmp / MARKER).write_text(json.dumps({
                "gguf_sha256": sha, "gguf_name": path.name, "architecture": architecture(path),
                "model_type": model_type, "dtype": "float32", "probe_max_abs_diff": diff,
                "seconds": round(time.perf_counter() - t0, 1), "transformers": _hf_version()}, indent=1))
        say(1.0, "converted")
    return target


def _check(folder: Path, ids: list[int], ref: torch.Tensor, source: Path) -> float:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    got_ids, got = probe_logits(model, tok)
    if got_ids != ids:
        raise GgufError(f"converting {clip(source.name, 80)}: the saved tokenizer encodes text differently from the "
                        f"GGUF's ({got_ids[:8]} vs {ids[:8]}); the conversion is not kept")
    diff = float((got - ref).abs().max())
    if not diff <= TOLERANCE:
        raise GgufError(f"converting {clip(source.name, 80)}: the saved model's logits differ from the GGUF load's "
                        f"by {diff:.3g} (> {TOLERANCE:g}); the conversion is not kept")
    return diff


def _hf_version() -> str:
    import transformers

    return transformers.__version__
