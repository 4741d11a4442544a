"""What a model name means, without torch: the one resolution the loader (backend/model/loading.py) and the service's
access rules (backend/service/model_pool.py) share.

| name | kind | canonical name |
|---|---|---|
| `default`, `headlens-tiny` | the embedded model | `default` |
| a preset (`smollm2-135m`, `gemma3-270m`; backend/weights/presets.py) | its pulled GGUF | the preset's name |
| an existing `.gguf` file, or a folder holding exactly one `.gguf` (and no config.json) | a GGUF file | the file's absolute path |
| an existing folder with config.json | a Hugging Face model folder | its absolute path |
| anything else without a path's look | a Hugging Face hub id | itself |

A preset name wins over a folder of the same name in the working directory (`./smollm2-135m` reaches the folder).
A GGUF file is checked here from its header alone: a file that is not GGUF, or of an architecture the adapter
table cannot read, is refused before anything is loaded.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from . import presets
from ..model.adapters import UnsupportedArchitecture, spec_for_gguf
from ..errors import BadInput, UserError
from .gguf_files import SUFFIX, GgufError, architecture, gguf_in_folder
from ..store.paths import DEFAULT_MODEL_DIR, DEFAULT_MODEL_NAMES
from ..text import clip

SourceKind = Literal["default", "preset", "gguf", "folder", "hub"]
Reason = Literal["missing", "invalid", "not_pulled"]


@dataclass(frozen=True)
class Source:
    kind: SourceKind
    name: str  # the canonical name
    path: Path | None  # the model folder, or the GGUF file (a preset's too); None for a hub id


class ModelLoadError(UserError, RuntimeError):
    """A model that cannot be loaded, with the reason in words (raised by backend/model/loading.py)."""


class SourceError(BadInput):
    """A name that names no usable model; `reason`: missing (404), invalid (422) or not_pulled (404)."""

    def __init__(self, message: str, reason: Reason):
        super().__init__(message)
        self.reason = reason


def looks_like_path(name: str) -> bool:
    return name.startswith((".", "/", "~", "\\")) or name.count("/") > 1 or Path(name).is_absolute() \
        or name.lower().endswith(SUFFIX)


def check_gguf(path: Path, shown: str) -> None:
    """A GGUF file whose header can be read and whose architecture the adapter table knows; else SourceError."""
    try:
        spec_for_gguf(architecture(path), clip(shown, 120))
    except (GgufError, UnsupportedArchitecture) as e:
        raise SourceError(str(e), "invalid") from None
    except OSError as e:
        raise SourceError(f"{clip(shown)}: cannot read the file ({e.strerror or type(e).__name__})", "invalid") from None


def local(path: Path, shown: str | None = None) -> Source:
    """An existing path: a .gguf file, a model folder with config.json, or a folder holding one .gguf file."""
    shown = shown if shown is not None else str(path)
    resolved = path.resolve()
    if resolved.is_file():
        if resolved.suffix.lower() != SUFFIX:
            raise SourceError(f"{clip(shown)} is a file, not a model: give a model folder (with config.json) or a "
                              f".gguf file", "invalid")
        check_gguf(resolved, shown)
        return Source("gguf", str(resolved), resolved)
    if (resolved / "config.json").is_file():
        return Source("folder", str(resolved), resolved)
    try:
        found = gguf_in_folder(resolved)
    except GgufError as e:
        raise SourceError(str(e), "invalid") from None
    except OSError as e:
        raise SourceError(f"{clip(shown)}: cannot list the folder ({e.strerror or type(e).__name__})", "invalid") \
            from None
    if found is None:
        raise SourceError(f"{clip(shown)} exists but holds no config.json (and no .gguf file): not a Hugging Face "
                          f"model folder", "invalid")
    check_gguf(found, str(found))
    return Source("gguf", str(found.resolve()), found.resolve())


def resolve(name: str) -> Source:
    """The source `name` stands for (see the module docstring); SourceError when there is none."""
    if name in DEFAULT_MODEL_NAMES:
        if not DEFAULT_MODEL_DIR.is_dir():
            raise SourceError(f"the embedded default model is missing at {DEFAULT_MODEL_DIR}; regenerate it with "
                              f"`python -m backend train-default`", "missing")
        return Source("default", "default", DEFAULT_MODEL_DIR)
    if name in presets.PRESETS:
        try:
            return Source("preset", name, presets.require_pulled(name))
        except presets.PresetError as e:
            raise SourceError(str(e), "not_pulled") from None
    path = Path(name).expanduser()
    if path.exists():
        return local(path, name)
    if looks_like_path(name):
        what = "GGUF file" if name.lower().endswith(SUFFIX) else "model folder"
        raise SourceError(f"{what} {clip(name)!r} does not exist", "missing")
    return Source("hub", name, None)


def weights_folder(canonical: str) -> Path | None:
    """The folder a canonical name's weights are loaded from, when it is on this disk: the embedded model's, a
    model folder, or a preset's / GGUF file's converted folder once it exists; None otherwise (a hub id, a GGUF
    not converted yet). For sizing and signatures; never converts."""
    from .gguf_files import converted_dir, converted_marker, sha256_file

    if canonical == "default":
        return DEFAULT_MODEL_DIR
    try:
        if canonical in presets.PRESETS:
            rec = presets.record(canonical)
            sha = rec["gguf_sha256"] if rec else None
        elif canonical.lower().endswith(SUFFIX) and Path(canonical).is_file():
            sha = sha256_file(canonical)
        else:
            folder = Path(canonical)
            return folder if folder.is_dir() else None
    except (OSError, ValueError):
        return None
    return converted_dir(sha) if sha and converted_marker(sha) is not None else None
