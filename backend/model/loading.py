"""Loading a Hugging Face causal LM and viewing it through its adapter.

`LoadedModel` is the one object every analysis takes: the model, its tokenizer, its `ArchSpec`, and
the head geometry read from the config and the weights.
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .adapters import ArchSpec, Site, UnsupportedArchitecture, config_attr, spec_for
from .precision import (DTYPES, ONEDNN, PRECISIONS, ContiguousLinear, OneDnnLinear,  # noqa: F401 (re-exported)
                        contiguous_unembedding, dtype_name, precision_dtype, use_onednn, uses_onednn)
from ..weights.model_sources import ModelLoadError  # defined without torch, so the CLI can catch it before torch loads
from ..text import clip, model_name_problem



def _get(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


@dataclass
class LoadedModel:
    """A causal LM with its tokenizer and adapter.

    Shapes: `n_layers` L, `n_heads` H query heads, `n_kv_heads`, `head_dim` dh, `d_model` d.
    The output projection of layer l takes `z` of shape `(batch, seq, H * dh)`.
    """

    model: nn.Module
    tokenizer: Any
    spec: ArchSpec
    name: str
    fingerprint: str
    n_layers: int = field(init=False)
    n_heads: int = field(init=False)
    n_kv_heads: int = field(init=False)
    head_dim: int = field(init=False)
    d_model: int = field(init=False)
    max_positions: int | None = field(init=False)
    lock: threading.RLock = field(default_factory=threading.RLock, repr=False)

    def __post_init__(self) -> None:
        cfg = self.model.config
        self.n_layers = len(self.layers)
        self.n_heads = config_attr(cfg, self.spec.n_heads_attr)
        self.n_kv_heads = config_attr(cfg, self.spec.n_kv_heads_attr)
        in_features, self.d_model = self.spec.o_proj_matrix(self.o_proj(0).weight).shape
        head_dim = getattr(cfg, "head_dim", None)
        self.head_dim = int(head_dim) if head_dim else in_features // self.n_heads
        if self.head_dim * self.n_heads != in_features:
            raise UnsupportedArchitecture(
                f"{self.name}: {self.n_heads} heads x head_dim {self.head_dim} != output projection input "
                f"width {in_features}")
        self.max_positions = next((int(v) for k in ("max_position_embeddings", "n_positions")
                                   if (v := getattr(cfg, k, None))), None)

    # -- modules ---------------------------------------------------------------------------------
    @property
    def layers(self) -> nn.ModuleList:
        return _get(self.model, self.spec.layers)

    def site_module(self, site: Site, layer: int | None = None) -> nn.Module:
        """The module whose input (output, for "layer_out", "attn_out", "mlp_out") is `site` (`adapters.Site`) of `layer`."""
        return _get(self.model, self.spec.site_path(site, layer))

    def o_proj(self, layer: int) -> nn.Module:
        return _get(self.layers[layer], self.spec.o_proj)

    def input_norm(self, layer: int) -> nn.Module:
        """The norm a decoder layer applies to its input before attention."""
        return _get(self.layers[layer], self.spec.input_norm)

    def values(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """Value vectors of the attention of `layer` for its (already normed) input x (..., d_model):
        (..., n_kv_heads, head_dim), bias included. Query head h reads kv head h // (n_heads // n_kv_heads)."""
        out = _get(self.layers[layer], self.spec.v_proj)(x)
        return self.spec.values_of(out, self.n_heads, self.n_kv_heads, self.head_dim)

    @property
    def final_norm(self) -> nn.Module:
        return _get(self.model, self.spec.final_norm)

    @property
    def unembed(self) -> torch.Tensor:
        """Unembedding matrix W_U, shape (vocab, d_model)."""
        return self.model.get_output_embeddings().weight

    @property
    def device(self) -> torch.device:
        return self.unembed.device

    @property
    def dtype(self) -> torch.dtype:
        return self.unembed.dtype

    @property
    def precision(self) -> str:
        """What the forward pass computes in, by name: `float32`, `bfloat16`, `float16`, or `float32-onednn`
        (float32 with the decoder's Linears through oneDNN, `OneDnnLinear`)."""
        return ONEDNN if uses_onednn(self.model) else dtype_name(self.dtype)

    def w_o(self, layer: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Per-head slices of W_O for one layer, shape (heads, head_dim, d_model): o_h = z_h @ w_o[h]."""
        w = self.spec.o_proj_matrix(self.o_proj(layer).weight)  # (H*dh, d)
        return w.to(dtype).reshape(self.n_heads, self.head_dim, self.d_model)

    def w_qkv(self, layer: int, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per-head W_Q (heads, d_model, head_dim), W_K and W_V (kv_heads, d_model, head_dim) of one layer: head h's
        query is x @ W_Q[h] for x the input norm's output (biases and rotary aside); query head h reads kv head
        h // (heads // kv_heads)."""
        block = self.layers[layer]
        sep = self.spec.qkv == "separate"
        q, k = ((_get(block, self.spec.q_proj).weight, _get(block, self.spec.k_proj).weight) if sep else (None, None))
        mats = self.spec.qkv_matrices(q, k, _get(block, self.spec.v_proj).weight, self.n_heads, self.n_kv_heads,
                                      self.head_dim)
        return tuple(m.detach().to(dtype) for m in mats)  # type: ignore[return-value]

    def input_gain(self, layer: int) -> torch.Tensor:
        """Effective elementwise gain of the norm before attention of `layer`, (d_model,) float32."""
        return self._gain(self.input_norm(layer))

    def qk_norm_gains(self, layer: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The gains (head_dim,) float32 of the per-head query and key norms of `layer` (Qwen3, Gemma 3), or None
        where the layer has none."""
        paths = self.spec.qk_norms
        block = self.layers[layer]
        try:
            norms = [_get(block, path) for path in paths] if paths else None
        except AttributeError:  # a family entry whose older members lack them (Gemma 2 beside Gemma 3)
            return None
        if norms is None:
            return None
        return tuple(self.spec.gain(getattr(n, "weight", None), self.head_dim, self.device) for n in norms)  # type: ignore[return-value]

    def o_bias(self, layer: int) -> torch.Tensor | None:
        return getattr(self.o_proj(layer), "bias", None)

    def post_attn_norm(self, layer: int) -> nn.Module | None:
        """The norm that rescales the attention output of `layer` before the residual add (Gemma 2 / 3), or None."""
        return _get(self.layers[layer], self.spec.post_attn_norm) if self.spec.post_attn_norm else None

    def _gain(self, norm: nn.Module) -> torch.Tensor:
        return self.spec.gain(getattr(norm, "weight", None), self.d_model, self.device)

    def norm_gain(self) -> torch.Tensor:
        """Effective elementwise gain of the final norm, shape (d_model,)."""
        return self._gain(self.final_norm)

    def post_attn_gain(self, layer: int) -> torch.Tensor:
        """Effective elementwise gain g of the post-attention norm of `layer`, (d_model,) float32 (Gemma: 1 + w);
        only for families that have one."""
        norm = self.post_attn_norm(layer)
        if norm is None:
            raise ValueError(f"{self.spec.family} has no post-attention norm")
        return self._gain(norm)

    @staticmethod
    def _eps(norm: nn.Module) -> float:
        return float(getattr(norm, "eps", None) or getattr(norm, "variance_epsilon", None) or 1e-5)

    @property
    def norm_eps(self) -> float:
        return self._eps(self.final_norm)

    def post_attn_eps(self, layer: int) -> float:
        return self._eps(self.post_attn_norm(layer))

    def info(self) -> dict[str, Any]:
        return {"name": self.name, "family": self.spec.family, "model_type": self.model.config.model_type,
                "n_layers": self.n_layers, "n_heads": self.n_heads, "n_kv_heads": self.n_kv_heads,
                "head_dim": self.head_dim, "d_model": self.d_model, "max_positions": self.max_positions,
                "device": str(self.device), "dtype": self.precision,
                "fingerprint": self.fingerprint}


# -- fingerprints ------------------------------------------------------------------------------------
def _file_digest(path: Path, full_limit: int = 256 << 20, chunk: int = 16 << 20) -> str:
    """sha256 of a weights file; files over `full_limit` bytes hash their size and first/last chunks."""
    h = hashlib.sha256()
    size = path.stat().st_size
    h.update(str(size).encode())
    with path.open("rb") as f:
        if size <= full_limit:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        else:
            h.update(f.read(chunk))
            f.seek(size - chunk)
            h.update(f.read(chunk))
    return h.hexdigest()


def _params_digest(model: nn.Module) -> str:
    h = hashlib.sha256()
    for name, p in model.state_dict().items():
        h.update(name.encode())
        h.update(p.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()


def fingerprint(model: nn.Module, name: str, folder: Path | None = None) -> str:
    """Identity of the weights: name, config, and the weight files' hash (local), the hub revision, or
    the parameters themselves (in-memory models), and the precision the weights run in when it is not float32. Families whose head writes are taken after a post-attention norm
    (`ArchSpec.post_attn_norm`) add that site, so results computed when writes were taken at o_proj are never
    served again; every other fingerprint is unchanged."""
    cfg = model.config.to_dict()
    cfg.pop("_commit_hash", None)
    parts = [name, json.dumps(cfg, sort_keys=True, default=str)]
    weights_dtype = next((p.dtype for p in model.parameters()), torch.float32)
    if weights_dtype != torch.float32:  # results computed in bf16 / fp16 are their own; float32's key is unchanged
        parts.append(f"precision {dtype_name(weights_dtype)}")
    elif uses_onednn(model):  # float32 through other kernels: other last bits, other results
        parts.append(f"precision {ONEDNN}")
    site = spec_for(model.config.model_type).post_attn_norm
    if site:
        parts.append(f"head writes after {site}")
    if folder is not None and folder.is_dir():
        files = sorted(p for p in folder.iterdir() if p.suffix in (".safetensors", ".bin", ".pt"))
        parts += [f"{p.name}:{_file_digest(p)}" for p in files]
    elif getattr(model.config, "_commit_hash", None):
        parts.append(f"revision:{model.config._commit_hash}")
    else:
        parts.append(_params_digest(model))
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]


_fingerprint = fingerprint  # wrap()'s parameter of the same name shadows it


# -- loading ---------------------------------------------------------------------------------------------
def _prepare_tokenizer(tok: Any) -> Any:
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token if tok.eos_token is not None else tok.unk_token
    if tok.pad_token is None:
        raise ModelLoadError("the tokenizer has no pad, eos or unk token to pad batches with")
    tok.padding_side = "left"
    return tok


def wrap(model: nn.Module, tokenizer: Any, name: str, folder: Path | None = None, frozen: bool = True,
         fingerprint: str | None = None) -> LoadedModel:
    """A `LoadedModel` around an already built model and tokenizer (tests, notebooks). `frozen` (the default)
    puts it in eval mode without parameter gradients; a model in training passes False. `fingerprint` overrides
    the one computed from the name, config and weights (a GGUF model's is its file's hash)."""
    spec = spec_for(model.config.model_type)
    contiguous_unembedding(model)
    if frozen:
        model.eval()
        for p in model.parameters():
            p.requires_grad_(False)
    return LoadedModel(model=model, tokenizer=_prepare_tokenizer(tokenizer), spec=spec, name=name,
                       fingerprint=fingerprint or _fingerprint(model, name, folder))


# -- the hub: offline detection ---------------------------------------------------------------------------
HUB_PROBE_TIMEOUT = 1.5  # seconds to connect to the hub endpoint before calling it unreachable
HUB_PROBE_TTL = 60.0  # a probe's answer is reused this long
_hub_probe: dict[str, tuple[float, bool]] = {}
_hub_probe_lock = threading.Lock()


def hub_endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def hub_offline_flag() -> str | None:
    """The variable that puts the hub offline (HF_HUB_OFFLINE, TRANSFORMERS_OFFLINE), or None."""
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if (os.environ.get(var) or "").strip().lower() in ("1", "true", "yes", "on"):
            return var
    return None


def hub_reachable(timeout: float = HUB_PROBE_TIMEOUT) -> bool:
    """Whether the hub endpoint answers an HTTP HEAD (any status) within `timeout` s. The request runs in a
    helper thread, so neither a hanging name lookup nor a proxy that accepts the connection and never
    answers can hold the caller longer. The answer is cached HUB_PROBE_TTL s per endpoint."""
    import urllib.error
    import urllib.request

    endpoint = hub_endpoint()
    now = time.monotonic()
    with _hub_probe_lock:
        hit = _hub_probe.get(endpoint)
        if hit is not None and now - hit[0] < HUB_PROBE_TTL:
            return hit[1]
    ok: list[bool] = []

    def probe() -> None:
        try:
            with urllib.request.urlopen(urllib.request.Request(endpoint + "/", method="HEAD"), timeout=timeout):
                ok.append(True)
        except urllib.error.HTTPError:  # an answer, even 4xx/5xx: the hub is there
            ok.append(True)
        except Exception:  # no route, no name, refused, timed out, bad URL
            pass

    t = threading.Thread(target=probe, name="headlens-hub-probe", daemon=True)
    t.start()
    t.join(timeout + 0.25)
    reachable = bool(ok)
    with _hub_probe_lock:
        _hub_probe[endpoint] = (time.monotonic(), reachable)
    return reachable


def cached_on_hub_cache(repo_id: str) -> bool:
    """Whether `repo_id`'s config.json is in the local Hugging Face cache (HF_HUB_CACHE / HF_HOME)."""
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except Exception:  # not a valid repo id, unreadable cache
        return False


def _hub_access(name: str) -> bool:
    """For a hub id: True when it must load from the local cache only (hub offline or unreachable, id
    cached); raises ModelLoadError at once when it is not cached and the hub cannot be reached."""
    flag = hub_offline_flag()
    if flag is None and hub_reachable():
        return False
    if cached_on_hub_cache(name):
        return True
    why = (f"{flag} is set" if flag else
           f"no answer from {hub_endpoint()} within {HUB_PROBE_TIMEOUT:g} s (HF_ENDPOINT)")
    raise ModelLoadError(f"model {clip(name)!r} is not cached locally and the Hugging Face hub is unreachable "
                         f"(offline: {why}); give `default`, a local model folder, or an id already in the "
                         f"Hugging Face cache")


def resolve_name(name_or_path: str) -> tuple[str, Path | None]:
    """The canonical name and its path (backend/weights/model_sources.py): `default` -> the embedded model's folder; a
    preset -> its pulled GGUF file; an existing .gguf file, or a folder holding one -> that file; a folder with
    config.json -> itself; anything else is a hub id (path None).

    Names too long for the filesystem (or with control characters), missing paths, folders that hold no model,
    presets not pulled yet and GGUF files of an architecture the adapter table lacks are a ModelLoadError.
    """
    from ..weights.model_sources import SourceError, resolve

    problem = model_name_problem(name_or_path)
    if problem:
        raise ModelLoadError(problem)
    try:
        src = resolve(name_or_path)
    except SourceError as e:
        raise ModelLoadError(str(e)) from None
    except (OSError, RuntimeError, ValueError) as e:
        raise ModelLoadError(f"model: {clip(name_or_path)!r} is not a usable name ({type(e).__name__})") from None
    return src.name, src.path


def gguf_fingerprint(sha256: str, dtype: torch.dtype) -> str:
    """A GGUF model's identity: the file's sha256 (whatever its path or preset name) and the dtype it runs in."""
    return hashlib.sha256(f"gguf\n{sha256}\n{str(dtype).replace('torch.', '')}".encode()).hexdigest()[:20]


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def load_model(name_or_path: str = "default", device: str | None = None, dtype: str | torch.dtype | None = None,
               device_map: str | None = None, trust_remote_code: bool = False,
               precision: str | None = None) -> LoadedModel:
    """Load `default`, a preset, a GGUF file, a local HF folder or a hub id. CUDA + bf16 when present, else
    CPU + fp32; `precision` (`float32`, `bfloat16`: PRECISIONS) picks the weights' dtype by name, and a `dtype`
    that disagrees with it is an error. A precision other than float32 is part of the model's fingerprint, so its
    results are cached apart. A GGUF file is converted once into a safetensors folder (backend/weights/gguf_convert.py), which this
    and every later load read.

    `device_map="auto"` spreads the model over the visible GPUs with accelerate.
    """
    name, folder = resolve_name(name_or_path)
    gguf_sha = None
    if folder is not None and folder.is_file():  # a GGUF file (a preset's too): its conversion, made once
        folder, gguf_sha = _converted(name, folder)
    source = str(folder) if folder is not None else name
    local_only = {"local_files_only": True} if folder is None and _hub_access(name) else {}
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    device = device or default_device()
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise ModelLoadError(f"dtype must be one of {', '.join(DTYPES)}, not {clip(dtype, 40)!r}")
        dtype = DTYPES[dtype]
    if precision is not None:
        try:
            chosen = precision_dtype(precision)
        except ValueError as e:
            raise ModelLoadError(str(e)) from None
        if dtype is not None and dtype != chosen:
            raise ModelLoadError(f"precision {precision!r} and dtype {dtype_name(dtype)!r} disagree; give one")
        dtype = chosen
        if precision == ONEDNN and (device_map or not str(device).startswith("cpu")):
            raise ModelLoadError(f"precision {ONEDNN!r} is for the CPU; on {device_map or device} use float32")
    dtype = dtype or (torch.bfloat16 if device.startswith("cuda") else torch.float32)
    try:
        config = AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code, **local_only)
    except Exception as e:  # hub unreachable, unknown id, bad folder
        raise ModelLoadError(
            f"could not load the config of {clip(name_or_path)!r}: {type(e).__name__}: "
            f"{(str(e).splitlines() or [''])[0][:300]}. "
            f"Give `default`, a local folder with config.json, or a Hugging Face id that is cached locally "
            f"or reachable.") from e
    spec_for(config.model_type)  # fail early, before any weights are read
    try:
        model = AutoModelForCausalLM.from_pretrained(
            source, dtype=dtype, trust_remote_code=trust_remote_code, **local_only,
            **({"device_map": device_map} if device_map else {}))
        tok = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code, **local_only)
    except Exception as e:
        raise ModelLoadError(f"could not load {clip(name_or_path)!r}: {type(e).__name__}: "
                             f"{(str(e).splitlines() or [''])[0][:300]}") from e
    if not device_map:
        model.to(device)
    if precision == ONEDNN:
        use_onednn(_get(model, spec_for(config.model_type).layers))
    return wrap(model, tok, name, folder, fingerprint=gguf_fingerprint(gguf_sha, dtype) if gguf_sha else None)


def _converted(name: str, gguf: Path) -> tuple[Path, str]:
    """(the safetensors folder, the GGUF's sha256) of a GGUF file, converting it the first time."""
    from ..weights import presets
    from ..weights.gguf_convert import convert
    from ..weights.gguf_files import GgufError, sha256_file

    rec = presets.record(name) if name in presets.PRESETS else None
    try:  # a pulled preset's digest was verified by the pull: not hashed again
        sha = rec["gguf_sha256"] if rec else sha256_file(gguf)
        return convert(gguf, sha), sha
    except (GgufError, UnsupportedArchitecture) as e:
        raise ModelLoadError(str(e)) from None
    except OSError as e:
        raise ModelLoadError(f"could not convert {clip(name)!r}: {e.strerror or e}") from None
