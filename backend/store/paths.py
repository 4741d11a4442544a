"""Where things live on disk: the repository root, the embedded default model, the cache folder, the folder of
pulled and converted models.

Pure path logic, no imports beyond the standard library, so every layer may use it.
"""
from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODEL_DIR = REPO_ROOT / "models" / "headlens-tiny"
DEFAULT_MODEL_NAMES = ("default", "headlens-tiny")
"""The names that load the embedded default model."""


def log_file() -> Path:
    """Where `launch` writes both servers' output (their tracebacks included): HEADLENS_LOG, else
    `<repo>/logs/headlens.log`."""
    return Path(os.environ.get("HEADLENS_LOG") or REPO_ROOT / "logs" / "headlens.log")


def cache_dir() -> Path:
    """The result cache folder: HEADLENS_CACHE_DIR, else `<repo>/cache`. Uploads and locks live under it."""
    return Path(os.environ.get("HEADLENS_CACHE_DIR") or REPO_ROOT / "cache")


def models_dir() -> Path:
    """Pulled presets and converted GGUF files: HEADLENS_MODELS_DIR, else `<repo>/models/pulled` (ignored by git).

    Apart from the result cache on purpose: clearing the cache (or a test's own HEADLENS_CACHE_DIR) must not
    throw away a 100 MB download and its conversion."""
    return Path(os.environ.get("HEADLENS_MODELS_DIR") or REPO_ROOT / "models" / "pulled").expanduser()
