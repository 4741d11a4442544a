"""Trained tensors (learned task vectors, soft head selections): the file format, its checks, and saving and
loading them by id through the tensor store (`backend/store/tensor_store.py`: where, and under which name).

A file is safetensors (an 8-byte little-endian header length, a JSON header, the data), written here byte for byte
the same for the same tensors and metadata (names and keys sorted, float32), so its id (a hash of its bytes) is
stable. Metadata: format, kind (`ltv`, `site`), the model's name and fingerprint, d_model, n_layers, n_heads,
head_dim, the task's content hash and name, and the recipe (JSON).

Every file is checked when it is read (an upload, a local file, a stored id), before any of its numbers is used;
each failure is one sentence (`SavedTensorError`, a ValueError: a 4xx in the service, exit 2 in the CLI):
  the container  a header of at most 64 KiB of JSON, at most 16 tensors of dtype F16, BF16, F32 or F64 and at most
                 4 dimensions, whose data offsets tile the data exactly;
  the content    `ltv`: theta (vectors, width), one row per layer of the recipe, width = the metadata's d_model;
                 `site`: alpha (layers, heads) in [0, 1], alpha_logits of the same shape whose sigmoid is alpha,
                 task_embedding (layers, heads, head_dim); every value finite and at most MAX_ABS in magnitude;
  the model      (when it is used) the fingerprint, d_model, layers, heads and head_dim of the model at hand.
A refusal never prints a fingerprint, and clips every name it echoes.
"""
from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path
from typing import Any

import torch

from ...errors import BadInput
from ...model.loading import LoadedModel
from ...store.tensor_store import KINDS, MAX_READ_BYTES, TensorStore, TensorWriteError, default_store, tensor_id
from ...text import clip

FORMAT = "headlens-tensors-1"
MAX_HEADER = 64 << 10
MAX_TENSORS = 16
MAX_DIMS = 4
MAX_ABS = 1e5
"""Largest magnitude of a saved value: a trained vector's entries stay far below (theta is about the residual
stream's RMS, 1-100), and a file beyond it would only overflow the model."""
ALPHA_TOLERANCE = 1e-4  # |sigmoid(alpha_logits) - alpha| at most (float32 rounding)
DTYPES = {"F16": (torch.float16, 2), "BF16": (torch.bfloat16, 2), "F32": (torch.float32, 4),
          "F64": (torch.float64, 8)}
NAMES = {"ltv": {"theta"}, "site": {"alpha", "alpha_logits", "task_embedding"}}
WHAT = {"ltv": "task vector", "site": "soft head selection"}


class SavedTensorError(BadInput):
    """A saved-tensor file that cannot be used here, with the reason in one sentence."""


# -- the container ------------------------------------------------------------------------------------------------
def encode(tensors: dict[str, torch.Tensor], meta: dict[str, str]) -> bytes:
    """Safetensors bytes of `tensors` (as float32) and `meta`, the same bytes for the same input."""
    header: dict[str, Any] = {"__metadata__": {k: str(v) for k, v in sorted(meta.items())}}
    chunks, offset = [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().to(device="cpu", dtype=torch.float32).contiguous()
        raw = t.numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(chunks)


def _int(v: Any) -> bool:
    return type(v) is int


def decode(data: bytes, src: str) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(tensors as float32 on the CPU, metadata) of safetensors bytes, checked as the module docstring says;
    `src` names the file in the messages."""
    bad = lambda why: SavedTensorError(f"{src} is not a readable headlens tensor file: {why}")  # noqa: E731
    if len(data) < 8:
        raise bad(f"{len(data)} bytes")
    n = struct.unpack("<Q", data[:8])[0]
    if n > MAX_HEADER:
        raise bad(f"its header is {n:,} bytes, over the limit of {MAX_HEADER:,}")
    if 8 + n > len(data):
        raise bad("it ends inside its header (truncated)")
    try:
        header = json.loads(data[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise bad("its header is not JSON") from None
    if not isinstance(header, dict):
        raise bad("its header is not a JSON object")
    meta = header.pop("__metadata__", None)
    if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise bad("it has no metadata of text values")
    if not header:
        raise bad("it holds no tensors")
    if len(header) > MAX_TENSORS:
        raise bad(f"it holds {len(header)} tensors, over {MAX_TENSORS}")
    body = memoryview(data)[8 + n:]
    spans = []
    for name, info in header.items():
        shown = clip(name, 40)
        if not isinstance(info, dict) or info.get("dtype") not in DTYPES:
            raise bad(f"tensor {shown!r} is not of dtype {', '.join(DTYPES)}")
        shape, offsets = info.get("shape"), info.get("data_offsets")
        if not isinstance(shape, list) or len(shape) > MAX_DIMS or not all(_int(s) and s >= 0 for s in shape):
            raise bad(f"tensor {shown!r} has no shape of at most {MAX_DIMS} non-negative sizes")
        if not isinstance(offsets, list) or len(offsets) != 2 or not all(_int(o) and o >= 0 for o in offsets):
            raise bad(f"tensor {shown!r} has no data offsets")
        if offsets[1] - offsets[0] != math.prod(shape) * DTYPES[info["dtype"]][1]:
            raise bad(f"tensor {shown!r}: its data offsets do not hold its shape {shape}")
        spans.append((offsets[0], offsets[1], name))
    spans.sort()
    end = 0
    for lo, hi, _ in spans:
        if lo != end:
            raise bad("its tensors' data overlap or leave gaps")
        end = hi
    if end != len(body):
        raise bad("it is truncated" if end > len(body) else "it has bytes after its last tensor")
    tensors = {}
    for lo, hi, name in spans:
        dtype = DTYPES[header[name]["dtype"]][0]
        shape = header[name]["shape"]
        flat = torch.frombuffer(bytearray(body[lo:hi]), dtype=dtype) if hi > lo else torch.zeros(0, dtype=dtype)
        tensors[name] = flat.reshape(shape).to(torch.float32)
    return tensors, meta


# -- the content --------------------------------------------------------------------------------------------------
def check_content(tensors: dict[str, torch.Tensor], meta: dict[str, str], src: str) -> dict[str, Any]:
    """The metadata with `recipe` decoded and the sizes as ints, once the file's content is consistent and sound
    (see the module docstring); SavedTensorError otherwise."""
    if meta.get("format") != FORMAT:
        raise SavedTensorError(f"{src} is not a headlens tensor file (its metadata names no headlens format)")
    kind = meta.get("kind")
    if kind not in KINDS:
        raise SavedTensorError(f"{src} holds {clip(kind or 'nothing', 40)!r}, not one of {', '.join(KINDS)}")
    out: dict[str, Any] = dict(meta)
    for field in ("d_model", "n_layers", "n_heads", "head_dim"):
        raw = meta.get(field)
        if raw is None and field == "head_dim":
            out[field] = None  # files written before it was recorded
            continue
        if raw is None or not raw.isdigit() or int(raw) < 1 or len(raw) > 9:
            raise SavedTensorError(f"{src}: its metadata's {field} is not a positive number")
        out[field] = int(raw)
    try:
        recipe = json.loads(meta.get("recipe") or "{}")
    except (ValueError, RecursionError):
        recipe = None
    if not isinstance(recipe, dict):
        raise SavedTensorError(f"{src}: its metadata's recipe is not a JSON object")
    out["recipe"] = recipe
    extra = sorted(set(tensors) - NAMES[kind])
    if extra:
        raise SavedTensorError(f"{src}: a {kind} file holds {', '.join(sorted(NAMES[kind]))}, not "
                               f"{clip(', '.join(extra), 80)}")
    for name, t in tensors.items():
        finite = torch.isfinite(t)
        if not bool(finite.all()):
            raise SavedTensorError(f"{src}: {name} holds {int((~finite).sum())} values that are NaN or infinite; a "
                                   f"saved {WHAT[kind]} must be finite")
        top = float(t.abs().max()) if t.numel() else 0.0
        if top > MAX_ABS:
            raise SavedTensorError(f"{src}: {name} holds values up to {top:.3g} in magnitude, over {MAX_ABS:.0e}; no "
                                   f"trained {WHAT[kind]} is that large (it would only overflow the model)")
    (_check_ltv if kind == "ltv" else _check_site)(tensors, out, src)
    return out


def _check_ltv(tensors: dict[str, torch.Tensor], meta: dict[str, Any], src: str) -> None:
    theta, recipe = tensors.get("theta"), meta["recipe"]
    if theta is None or theta.dim() != 2:
        raise SavedTensorError(f"{src} holds no theta of shape (layers, d_model)")
    layers, positions = recipe.get("layers"), recipe.get("positions", [-1])
    if not isinstance(layers, list) or not layers or not all(_int(l) and l >= 0 for l in layers) \
            or len(set(layers)) != len(layers):
        raise SavedTensorError(f"{src}: its recipe names no layers (a list of distinct layer numbers)")
    if not isinstance(positions, list) or not positions or not all(_int(p) and p < 0 for p in positions):
        raise SavedTensorError(f"{src}: its recipe's positions are not negative offsets")
    if theta.shape[0] != len(layers):
        raise SavedTensorError(f"{src} holds {theta.shape[0]} vector(s) for the {len(layers)} layer(s) of its recipe")
    if theta.shape[1] != meta["d_model"]:
        raise SavedTensorError(f"{src}: theta is {theta.shape[1]} wide, but its metadata says d_model "
                               f"{meta['d_model']}")


def _check_site(tensors: dict[str, torch.Tensor], meta: dict[str, Any], src: str) -> None:
    alpha, t, logits = tensors.get("alpha"), tensors.get("task_embedding"), tensors.get("alpha_logits")
    if alpha is None or t is None:
        raise SavedTensorError(f"{src} lacks the alpha or task_embedding tensor")
    grid = (meta["n_layers"], meta["n_heads"])
    if tuple(alpha.shape) != grid or t.dim() != 3 or tuple(t.shape[:2]) != grid \
            or (meta["head_dim"] is not None and t.shape[2] != meta["head_dim"]):
        raise SavedTensorError(f"{src} holds alphas {tuple(alpha.shape)} and an embedding {tuple(t.shape)}, not the "
                               f"{grid[0]} x {grid[1]} heads of its metadata")
    if alpha.numel() and (float(alpha.min()) < 0.0 or float(alpha.max()) > 1.0):
        raise SavedTensorError(f"{src}: alpha holds values from {float(alpha.min()):.3g} to {float(alpha.max()):.3g}; "
                               f"an alpha is a sigmoid, in [0, 1]")
    if logits is not None:
        if logits.shape != alpha.shape:
            raise SavedTensorError(f"{src}: alpha_logits {tuple(logits.shape)} and alpha {tuple(alpha.shape)} differ "
                                   f"in shape")
        gap = float((torch.sigmoid(logits) - alpha).abs().max()) if alpha.numel() else 0.0
        if gap > ALPHA_TOLERANCE:
            raise SavedTensorError(f"{src}: alpha is not the sigmoid of alpha_logits (they differ by up to {gap:.3g})")


def check_model(meta: dict[str, Any], lm: LoadedModel, src: str) -> None:
    """Refuse a file made for another model (fingerprint), width, or head layout than `lm`'s."""
    made = clip(meta.get("model") or "?", 80)
    if meta["d_model"] != lm.d_model:
        raise SavedTensorError(f"{src} was trained for d_model {meta['d_model']} ({made}); {clip(lm.name, 80)} has "
                               f"d_model {lm.d_model}")
    if meta.get("fingerprint") != lm.fingerprint:
        raise SavedTensorError(f"{src} was trained for another model ({made}), not {clip(lm.name, 80)}")
    if meta["kind"] == "site" and ((meta["n_layers"], meta["n_heads"]) != (lm.n_layers, lm.n_heads)
                                   or meta["head_dim"] not in (None, lm.head_dim)):
        raise SavedTensorError(f"{src} holds {meta['n_layers']} x {meta['n_heads']} heads; {clip(lm.name, 80)} has "
                               f"{lm.n_layers} x {lm.n_heads} heads of dim {lm.head_dim}")
    if meta["kind"] == "ltv":
        far = [l for l in meta["recipe"]["layers"] if l >= lm.n_layers]
        if far:
            raise SavedTensorError(f"{src} holds vectors for layer(s) {far[:4]}; {clip(lm.name, 80)} has layers 0.."
                                   f"{lm.n_layers - 1}")


# -- by id ---------------------------------------------------------------------------------------------------------
def require_writable(store: Any, kind: str) -> None:
    """Before a training: a TensorWriteError (one sentence) when `store` cannot take the file it will make."""
    try:
        store.check_writable()
    except TensorWriteError as e:
        raise TensorWriteError(f"the tensor folder cannot be written ({e.reason}): the trained {WHAT[kind]} could not "
                               f"be saved, so nothing was trained; free space or fix the cache folder") from None


def save_tensors(store: Any, tensors: dict[str, torch.Tensor], lm: LoadedModel, kind: str, *,
                 task_hash: str | None = None, task_name: str | None = None,
                 recipe: dict[str, Any] | None = None) -> str:
    """Write `tensors` with the metadata through `store` (the analysis' `ctx.tensors`; a write that fails is kept
    there and returned inline); returns the id."""
    meta = {"format": FORMAT, "kind": kind, "model": lm.name, "fingerprint": lm.fingerprint,
            "d_model": str(lm.d_model), "n_layers": str(lm.n_layers), "n_heads": str(lm.n_heads),
            "head_dim": str(lm.head_dim), "task_hash": task_hash or "", "task": task_name or "",
            "recipe": json.dumps(recipe or {}, sort_keys=True)}
    data = encode(tensors, meta)
    tid = tensor_id(kind, data)
    store.put(tid, data)
    return tid


def load_tensors(store: Any, tid: str, lm: LoadedModel, kind: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(tensors on the model's device, checked metadata with `recipe` decoded) of stored tensor `tid`; a
    TensorMissing or SavedTensorError (ValueErrors, one sentence) when it is absent, unsound, of another kind or
    made for another model."""
    src = f"tensor {tid}"
    tensors, meta = decode(store.get(tid), src)
    info = check_content(tensors, meta, src)
    if info["kind"] != kind:
        raise SavedTensorError(f"{src} holds a {info['kind']} file, not a {kind} one")
    check_model(info, lm, src)
    return {k: v.to(lm.device) for k, v in tensors.items()}, info


def inspect(data: bytes, src: str) -> tuple[str, dict[str, Any]]:
    """(id, summary) of a file's bytes once they are checked (an upload, a local file): kind, model, task,
    d_model, layers, heads and the tensors' shapes; SavedTensorError otherwise."""
    tensors, meta = decode(data, src)
    info = check_content(tensors, meta, src)
    tid = tensor_id(info["kind"], data)
    return tid, {"id": tid, "kind": info["kind"], "model": clip(info.get("model") or "", 200),
                 "task": clip(info.get("task") or "", 200), "d_model": info["d_model"], "n_layers": info["n_layers"],
                 "n_heads": info["n_heads"], "shapes": {k: list(v.shape) for k, v in sorted(tensors.items())},
                 "bytes": len(data)}


def register_file(path: str | os.PathLike[str], store: TensorStore | None = None) -> str:
    """Copy a local tensor file (the CLI's and the Python API's `load`: they run as the user) into the store once
    it is checked; returns its id. SavedTensorError (one sentence) for a file that is absent or unsound;
    TensorWriteError when the store cannot take it."""
    shown = clip(str(path))
    try:
        full = Path(os.path.realpath(os.path.expanduser(os.fspath(path))))
        if not full.is_file():
            raise FileNotFoundError
        if full.stat().st_size > MAX_READ_BYTES:
            raise SavedTensorError(f"load: {clip(full.name)!r} is over {MAX_READ_BYTES >> 20} MB; not a headlens "
                                   f"tensor file")
        data = full.read_bytes()
    except (OSError, ValueError) as e:  # absent, unreadable, a name the filesystem refuses (too long, a NUL)
        if isinstance(e, SavedTensorError):
            raise
        raise SavedTensorError(f"load: no readable tensor file {shown!r} (give a .safetensors file written by "
                               f"ltv_vector or site_alphas, or an id they returned)") from None
    tid, _ = inspect(data, clip(full.name))
    try:
        (store or default_store()).put(tid, data)
    except TensorWriteError as e:
        raise TensorWriteError(f"load: could not copy {clip(full.name)!r} into the tensor folder ({e.reason})") from None
    return tid
