"""GGUF files without torch: the header's metadata, the file's sha256, and where its conversion lives.

A GGUF file (llama.cpp's format) starts with `GGUF`, a version (2 or 3), the tensor count and the metadata count,
then the metadata: (key string, value type u32, value) triples, little-endian; a string is a u64 length and its
UTF-8 bytes, an array an element type u32, a u64 count and the elements. Only the metadata is read here (arrays,
e.g. the tokenizer's 49k tokens, are skipped and reported by length), so the service can check a file, and
refuse an architecture it cannot run, before anything is loaded.

The tensor table after the metadata is checked too, so a broken file is one sentence here, never an error deep
inside transformers: the counts must fit in the file's bytes (a header declaring 2^62 tensors is refused before
it is read), every tensor's type must be known and its data must end inside the file (a truncated file), and a
tensor with a standard llama.cpp name (`blk.N.attn_q.weight`, `token_embd.weight`, ...) must have the shape the
header's own sizes give it (embedding_length, head counts, key/value length, feed_forward_length).

A converted file is a safetensors folder `<models dir>/converted/<sha256 of the GGUF>/` (backend/weights/gguf_convert.py):
config.json, model.safetensors, the tokenizer's files and `headlens-gguf.json` (the GGUF's sha256, name,
architecture), written last, so a folder without it is incomplete.
"""
from __future__ import annotations

import hashlib
import json
import os
import struct
import threading
from pathlib import Path
from typing import Any, BinaryIO, Callable

from ..errors import BadInput
from ..store.paths import models_dir
from ..text import clip

SUFFIX = ".gguf"
MAGIC = b"GGUF"
MARKER = "headlens-gguf.json"  # written last into a converted folder
MAX_STRING_BYTES = 64 << 20  # a chat template is a few KB; anything this large is a broken file
MAX_COUNT = 1 << 31
MAX_TENSORS = 1 << 20  # a 400B-parameter model has a few thousand
MAX_DIMS = 8
MIN_KV_BYTES = 8 + 4 + 1  # a metadata entry: key length, value type, a one-byte value
MIN_TENSOR_BYTES = 8 + 4 + 4 + 8  # a tensor's entry: name length, dims count, type, offset
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9


class GgufError(BadInput):
    """A GGUF file that cannot be read or used, with the reason in one sentence."""


class _Reader:
    def __init__(self, f: BinaryIO, path: Path):
        self.f, self.path = f, path

    def take(self, n: int) -> bytes:
        b = self.f.read(n)
        if len(b) != n:
            raise GgufError(f"{clip(self.path.name)} is truncated: its GGUF header ends early")
        return b

    def scalar(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.scalar("<Q")
        if n > MAX_STRING_BYTES:
            raise GgufError(f"{clip(self.path.name)} is not a readable GGUF file: a {n}-byte string in its header")
        return self.take(n).decode("utf-8", "replace")

    def value(self, vtype: int) -> Any:
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype])
        if vtype == STRING:
            return self.string()
        if vtype == ARRAY:
            etype, count = self.scalar("<I"), self.scalar("<Q")
            if count > MAX_COUNT:
                raise GgufError(f"{clip(self.path.name)} is not a readable GGUF file: an array of {count} items")
            self.skip(etype, count)
            return _Array(etype, count)
        raise GgufError(f"{clip(self.path.name)} is not a readable GGUF file: unknown value type {vtype}")

    def skip(self, etype: int, count: int) -> None:
        if etype in _SCALARS:
            self.f.seek(struct.calcsize(_SCALARS[etype]) * count, os.SEEK_CUR)
        elif etype == STRING:
            for _ in range(count):
                self.f.seek(self.scalar("<Q"), os.SEEK_CUR)
        else:  # nested arrays do not occur in model files; read them through value()
            for _ in range(count):
                self.value(etype)


class _Array:
    """An array value of the header, skipped: its element type and length."""

    def __init__(self, etype: int, count: int):
        self.etype, self.count = etype, count

    def __repr__(self) -> str:
        return f"<array of {self.count}>"


_HEADERS: dict[tuple[str, int, int], dict[str, Any]] = {}
_DIGESTS: dict[tuple[str, int, int], str] = {}
_memo_lock = threading.Lock()


def _stat_key(path: Path) -> tuple[str, int, int]:
    st = path.stat()
    return str(path.resolve()), st.st_size, st.st_mtime_ns


def read_header(path: str | Path) -> dict[str, Any]:
    """The file's metadata: scalars and strings as values, arrays as `_Array` (type and length only).

    Raises GgufError for a file that is not GGUF (magic bytes), of an unknown version, or truncated. Memoised by
    (path, size, mtime)."""
    path = Path(path)
    key = _stat_key(path)
    with _memo_lock:
        if key in _HEADERS:
            return _HEADERS[key]
    with path.open("rb") as raw:
        import io

        r = _Reader(io.BufferedReader(raw, 1 << 20), path)
        if r.f.read(4) != MAGIC:
            raise GgufError(f"{clip(path.name)} is not a GGUF file (it does not start with the bytes `GGUF`)")
        version = r.scalar("<I")
        if version not in (2, 3):
            raise GgufError(f"{clip(path.name)} is GGUF version {version}; versions 2 and 3 can be read")
        n_tensors, n_kv = r.scalar("<Q"), r.scalar("<Q")
        size = key[1]
        if n_kv > MAX_COUNT or n_kv * MIN_KV_BYTES > size:
            raise GgufError(f"{clip(path.name)} is truncated or not a readable GGUF file: its header declares {n_kv} "
                            f"metadata entries, more than its {size} bytes can hold")
        if n_tensors > MAX_TENSORS or n_tensors * MIN_TENSOR_BYTES > size:
            raise GgufError(f"{clip(path.name)} is truncated or not a readable GGUF file: its header declares "
                            f"{n_tensors} tensors, more than its {size} bytes can hold")
        meta: dict[str, Any] = {"GGUF.version": version, "GGUF.tensor_count": n_tensors}
        for _ in range(n_kv):
            k = r.string()
            meta[k] = r.value(r.scalar("<I"))
        _check_tensors(r, meta, n_tensors, size)
    with _memo_lock:
        _HEADERS[key] = meta
    return meta


def _check_tensors(r: _Reader, meta: dict[str, Any], n_tensors: int, size: int) -> None:
    """Read the tensor table and check it against the file's size and the header's sizes (module docstring)."""
    from gguf.constants import GGML_QUANT_SIZES  # (elements per block, bytes per block) of every ggml type

    name = clip(r.path.name)
    table = []
    for _ in range(n_tensors):
        tname = r.string()
        n_dims = r.scalar("<I")
        if n_dims > MAX_DIMS:
            raise GgufError(f"{name} is not a readable GGUF file: its tensor {clip(tname, 60)!r} has {n_dims} "
                            f"dimensions")
        dims = tuple(r.scalar("<Q") for _ in range(n_dims))
        table.append((tname, dims, r.scalar("<I"), r.scalar("<Q")))
    align = meta.get("general.alignment", 32)
    if not isinstance(align, int) or align <= 0 or align & (align - 1):
        raise GgufError(f"{name} is not a readable GGUF file: its general.alignment is {align!r}, not a power of two")
    start = -(-r.f.tell() // align) * align  # the tensor data begins at the next multiple of the alignment
    shapes = expected_shapes(meta)
    for tname, dims, ttype, offset in table:
        shown = clip(tname, 60)
        if ttype not in GGML_QUANT_SIZES:
            raise GgufError(f"{name} is not a readable GGUF file: its tensor {shown!r} has the unknown type {ttype}")
        block, block_bytes = GGML_QUANT_SIZES[ttype]
        count = 1
        for d in dims:
            count *= d
        if count % block or (dims and dims[0] % block):
            raise GgufError(f"{name} is not a readable GGUF file: its tensor {shown!r} of shape {list(dims)} does "
                            f"not fill whole blocks of its type")
        end = start + offset + count // block * block_bytes
        if end > size:
            raise GgufError(f"{name} is truncated or broken: its tensor {shown!r} would end at byte {end}, past the "
                            f"end of the file ({size} bytes)")
        want = shapes.get(tname)
        if want is not None and dims != want:
            raise GgufError(f"{name} is broken: its tensor {shown!r} has shape {list(dims)}, but the sizes in its "
                            f"header make it {list(want)}")


_BLOCK_SHAPES = {  # llama.cpp's names for a block's tensors -> their shape (GGUF order: the input dimension first)
    "attn_norm": ("E",), "ffn_norm": ("E",), "post_attention_norm": ("E",), "post_ffw_norm": ("E",),
    "attn_q_norm": ("Dk",), "attn_k_norm": ("Dk",),
    "attn_q": ("E", "H*Dk"), "attn_k": ("E", "KV*Dk"), "attn_v": ("E", "KV*Dv"), "attn_output": ("H*Dv", "E"),
    "ffn_gate": ("E", "F"), "ffn_up": ("E", "F"), "ffn_down": ("F", "E"),
}
_LLAMA_LIKE = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3")


def expected_shapes(meta: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """The shape of each standard tensor of a llama-like file (GGUF order), from the header's own sizes; only the
    tensors whose sizes the header gives (an array of per-layer sizes: not checked). Empty for other architectures."""
    arch = meta.get("general.architecture")
    if arch not in _LLAMA_LIKE:
        return {}

    def num(key: str) -> int | None:
        v = meta.get(f"{arch}.{key}")
        return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None

    e, h, layers = num("embedding_length"), num("attention.head_count"), num("block_count")
    kv = num("attention.head_count_kv") or h
    dk = num("attention.key_length") or (e // h if e and h and e % h == 0 else None)
    dv = num("attention.value_length") or (e // h if e and h and e % h == 0 else None)
    sizes = {"E": e, "F": num("feed_forward_length"), "Dk": dk, "Dv": dv,
             "H*Dk": h * dk if h and dk else None, "KV*Dk": kv * dk if kv and dk else None,
             "KV*Dv": kv * dv if kv and dv else None, "H*Dv": h * dv if h and dv else None}
    out: dict[str, tuple[int, ...]] = {}
    if e:
        out["output_norm.weight"] = (e,)
    for role, dims in _BLOCK_SHAPES.items():
        shape = tuple(sizes[d] for d in dims)
        if layers and all(shape):
            for i in range(layers):
                out[f"blk.{i}.{role}.weight"] = shape  # type: ignore[assignment]
                if len(shape) == 2:
                    out[f"blk.{i}.{role}.bias"] = (shape[1],)  # type: ignore[assignment]
    return out


def architecture(path: str | Path) -> str:
    """`general.architecture` of a GGUF file (llama, gemma3, ...); GgufError when it has none."""
    arch = read_header(path).get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise GgufError(f"{clip(Path(path).name)} names no architecture (no general.architecture in its header)")
    return arch


def sha256_file(path: str | Path, progress: Callable[[float, str], None] | None = None) -> str:
    """sha256 of the whole file (hex), memoised by (path, size, mtime) for this process."""
    path = Path(path)
    key = _stat_key(path)
    with _memo_lock:
        if key in _DIGESTS:
            return _DIGESTS[key]
    h, done, total = hashlib.sha256(), 0, max(key[1], 1)
    with path.open("rb") as f:
        for block in iter(lambda: f.read(8 << 20), b""):
            h.update(block)
            done += len(block)
            if progress is not None:
                progress(done / total, f"hashing {path.name}")
    digest = h.hexdigest()
    with _memo_lock:
        _DIGESTS[key] = digest
    return digest


def remember_digest(path: str | Path, digest: str) -> None:
    """Record a digest computed while the file was written (a pull), so loading it does not hash it again."""
    with _memo_lock:
        _DIGESTS[_stat_key(Path(path))] = digest


def gguf_in_folder(folder: Path) -> Path | None:
    """The one .gguf file directly in `folder` (None when there is none); GgufError when there are several."""
    found = sorted(p for p in folder.iterdir() if p.suffix.lower() == SUFFIX and p.is_file())
    if len(found) > 1:
        names = ", ".join(p.name for p in found[:4])
        raise GgufError(f"{clip(str(folder))} holds {len(found)} GGUF files ({clip(names, 120)}); give one of "
                        f"them as the model")
    return found[0] if found else None


def converted_root() -> Path:
    return models_dir() / "converted"


def converted_dir(sha256: str) -> Path:
    """Where the GGUF with this sha256 is (or will be) converted to a safetensors folder."""
    return converted_root() / sha256


def converted_marker(sha256: str) -> dict[str, Any] | None:
    """The finished conversion's record (`headlens-gguf.json`), or None when it is not (completely) there."""
    from ..store.safe_json import read_json

    got = read_json(converted_dir(sha256) / MARKER, max_bytes=1 << 16, max_depth=4)
    return got if isinstance(got, dict) else None
