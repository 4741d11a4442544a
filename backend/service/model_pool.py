"""Loaded models, kept resident and reused, at most `max_models` of them (least recently used goes first).

Which names a request may use (what each means: backend/weights/model_sources.py):
- `default` (the embedded model) always, and a preset (`smollm2-135m`, `gemma3-270m`) once it is pulled (404
  naming the pull command before);
- a local folder or a .gguf file (or a folder holding one): anywhere, or only under `HEADLENS_MODEL_ROOT` when
  that is set (a relative name is looked up under the root first); a path outside the root is a 403;
- a Hugging Face id, unless `HEADLENS_ALLOW_HUB=0` (403).
`HEADLENS_DEVICE` (cpu, cuda, cuda:1 ...) and `HEADLENS_DTYPE` (fp32, bf16, fp16) pick where models load; a request's
`precision` (float32, bfloat16) loads the model in that dtype instead, resident beside the default one.
A name longer than MAX_NAME_CHARS (1024) characters, with a path part over MAX_PART_BYTES (255) bytes, or
with control characters is a 422 naming the field `model`, before the filesystem sees it.

`require_loadable` (admission, after `check`) refuses what could not load, before any job is queued or estimated:
a hub id that is not in the local Hugging Face cache while the hub is off (HF_HUB_OFFLINE, TRANSFORMERS_OFFLINE)
or unreachable (404), one the hub says does not exist or is gated (404 / 403; its config.json is fetched, which
also gives the estimate its real shape), and a model whose config.json names an architecture the adapter table
lacks (422).

The command line applies the same two rules through `check_access` (the same sentences), so HEADLENS_MODEL_ROOT and
HEADLENS_ALLOW_HUB bind `python -m backend ...` as they bind the service.
"""
from __future__ import annotations

import gc
import os
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ..store.paths import DEFAULT_MODEL_NAMES
from ..text import model_name_problem
from .errors import BadRequest, Forbidden, NotFound, ServiceError, clip

if TYPE_CHECKING:
    from ..analysis.kernel import ModelRef
    from ..model.loading import LoadedModel


def _env_flag(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    return raw.strip().lower() not in ("0", "false", "no", "off")


class ModelPool:
    """Resident models by canonical name, LRU-limited; `check` applies the access rules without loading."""

    def __init__(self, max_models: int = 2, root: str | Path | None = None, allow_hub: bool | None = None,
                 device: str | None = None, dtype: str | None = None,
                 loader: Callable[..., "LoadedModel"] | None = None):
        root = root if root is not None else os.environ.get("HEADLENS_MODEL_ROOT") or None
        self.root = Path(root).expanduser().resolve() if root else None
        self.allow_hub = _env_flag("HEADLENS_ALLOW_HUB", True) if allow_hub is None else allow_hub
        self.max_models = max(1, int(max_models))
        self.device = device or os.environ.get("HEADLENS_DEVICE") or None
        self.dtype = dtype or os.environ.get("HEADLENS_DTYPE") or None
        self._loader = loader
        self._models: OrderedDict[str, "LoadedModel"] = OrderedDict()
        self._lock = threading.RLock()  # the resident models (held briefly)
        self._load_lock = threading.Lock()  # one load at a time; peek, loaded and check never wait for it
        self._hub_verdicts: dict[tuple[str, str], tuple[float, ServiceError | None]] = {}

    # -- access rules -------------------------------------------------------------------------------
    def check(self, name: str) -> str:
        """The canonical name to load `name` by (`default`, a preset, an absolute folder or .gguf file, or a hub id).

        Raises Forbidden (403) for a path outside the root or a hub id when the hub is off, NotFound (404) for a
        missing path, a missing embedded model or a preset not pulled yet, BadRequest (422) for a path that is no
        model (no config.json, not GGUF, a GGUF architecture the adapter table lacks).
        """
        name = (name or "").strip()
        if not name:
            raise BadRequest("model must not be empty; give `default`, a preset, a model folder, a .gguf file or a "
                             "Hugging Face id")
        problem = model_name_problem(name)
        if problem:
            raise BadRequest(problem)
        try:
            return self._check(name)
        except (OSError, RuntimeError, ValueError) as e:  # refused by the filesystem; `~nobody` (no such home)
            why = e.strerror if isinstance(e, OSError) and e.strerror else clip(str(e), 100)
            raise BadRequest(f"model: {clip(name)!r} is not a usable name ({type(e).__name__}: {why})") from None

    def _check(self, name: str) -> str:
        from ..weights import model_sources as ms
        from ..weights.presets import PRESETS

        with self._lock:
            if name in self._models:  # made resident with put()
                return name
        try:
            if name in DEFAULT_MODEL_NAMES or name in PRESETS:  # the server's own models: no root applies
                return ms.resolve(name).name
            path = Path(name).expanduser()
            if self.root is not None and not path.is_absolute() and (self.root / path).exists():
                path = self.root / path
            if path.exists():
                self._check_root(name, path.resolve())
                src = ms.local(path, name)
                self._check_root(name, Path(src.name))  # a folder's one .gguf file: a symlink may leave the root
                return src.name
            if ms.looks_like_path(name):
                self._check_root(name, path.resolve())
                what = "GGUF file" if name.lower().endswith(".gguf") else "model folder"
                raise NotFound(f"{what} {clip(name)!r} does not exist on the server")
        except ms.SourceError as e:
            raise (BadRequest(str(e)) if e.reason == "invalid" else NotFound(str(e))) from None
        if not self.allow_hub:
            where = "a folder under the server's model folder (HEADLENS_MODEL_ROOT)" if self.root else \
                "a local model folder"
            raise Forbidden(f"Hugging Face hub ids such as {clip(name)!r} are disabled on this server "
                            f"(HEADLENS_ALLOW_HUB=0); use `default`, a pulled preset or {where}")
        return name

    def require_loadable(self, canonical: str, precision: str = "float32") -> None:
        """Refuse (a ServiceError) a model, by its canonical name from `check`, that could not be loaded now (see
        the module docstring), or that would not fit this machine's memory in `precision` (`memory_fit`, 507); a
        resident model, and any model of a pool with its own `loader`, pass."""
        with self._lock:
            if canonical in self._models:
                return
        if self._loader is not None:
            return
        from .model_shape import model_type

        if _is_hub_id(canonical):
            self._require_on_hub(canonical)
        kind = model_type(canonical)
        if kind is not None:
            from ..model.adapters import UnsupportedArchitecture, spec_for

            try:
                spec_for(kind)
            except UnsupportedArchitecture as e:
                raise BadRequest(f"model {clip(canonical, 100)!r} cannot be analysed: {e}") from None
        from .memory_fit import memory_problem
        from .model_shape import model_config

        problem = memory_problem(clip(canonical, 100), model_config(canonical), precision)
        if problem:
            raise ServiceError(problem, status=507)

    def _require_on_hub(self, name: str) -> None:
        from ..model.loading import HUB_PROBE_TTL, cached_on_hub_cache, hub_endpoint

        if cached_on_hub_cache(name):
            return
        key = (hub_endpoint(), name)
        with self._lock:
            hit = self._hub_verdicts.get(key)
        if hit is not None and (hit[1] is None or time.monotonic() - hit[0] < HUB_PROBE_TTL):
            if hit[1] is not None:
                raise hit[1]
            return
        verdict = _hub_verdict(name)
        with self._lock:
            self._hub_verdicts[key] = (time.monotonic(), verdict)
        if verdict is not None:
            raise verdict

    def _check_root(self, name: str, resolved: Path) -> None:
        if self.root is not None and not resolved.is_relative_to(self.root):
            raise Forbidden(f"model path {clip(name)!r} is outside the server's model folder (HEADLENS_MODEL_ROOT); "
                            f"local models must live under it (a name relative to it works)")

    # -- precisions -------------------------------------------------------------------------------
    @property
    def precision(self) -> str:
        """The precision models load in by default, by name (`float32` on CPU, `bfloat16` on CUDA, or HEADLENS_DTYPE)."""
        return PRECISION_NAMES.get(self.device_info()[1], self.device_info()[1])

    def other_precision(self, precision: str | None) -> str | None:
        """`precision` (float32, bfloat16) when it is not the default, else None; anything else is a 422."""
        if precision is None:
            return None
        if precision not in ("float32", "bfloat16", "float32-onednn"):
            raise BadRequest(f"precision must be float32, bfloat16 or float32-onednn, not {clip(str(precision), 40)!r}")
        return None if precision == self.precision else precision

    def _slot(self, key: str, precision: str | None) -> str:
        """Where a model is resident: its canonical name, with ` @ <precision>` for a precision not the default."""
        other = self.other_precision(precision)
        return f"{key} @ {other}" if other else key

    # -- resident models --------------------------------------------------------------------------
    def get(self, name: str, precision: str | None = None) -> "LoadedModel":
        """The loaded model for `name` (in `precision`, default the pool's), loading it (and evicting the least
        recently used) when needed."""
        name = self.check(name)
        key = self._slot(name, precision)
        with self._lock:
            if key in self._models:
                self._models.move_to_end(key)
                return self._models[key]
        with self._load_lock:  # loads one at a time, without holding the pool (capabilities list it meanwhile)
            with self._lock:
                if key in self._models:  # loaded by the request this one waited for
                    self._models.move_to_end(key)
                    return self._models[key]
            lm = self._load(name, self.other_precision(precision))
            self._remember(name, lm, self.other_precision(precision))
            with self._lock:
                self._models[key] = lm
                old = []
                while len(self._models) > self.max_models:
                    old.append(self._models.popitem(last=False)[1])
            for m in old:
                self._free(m)
            return lm

    def _load(self, key: str, precision: str | None = None) -> "LoadedModel":
        if self._loader is not None:
            return self._loader(key, precision=precision) if precision else self._loader(key)
        from ..model.loading import load_model

        return load_model(key, device=self.device, **({"precision": precision} if precision else {"dtype": self.dtype}))

    @staticmethod
    def _free(lm: "LoadedModel") -> None:
        with lm.lock:  # wait for any forward pass on it to finish
            pass
        del lm
        gc.collect()
        try:
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        except Exception:
            pass

    def identity(self, canonical: str, precision: str | None = None) -> "ModelRef | None":
        """The model's name and fingerprint (in `precision`) without loading it: the resident model's, else those
        recorded when the same files were last loaded in that precision with this cache folder (under their
        `model_signature`), else None."""
        from ..analysis.kernel import ModelRef

        other = self.other_precision(precision)
        with self._lock:
            lm = self._models.get(self._slot(canonical, other))
        if lm is not None:
            return ModelRef(lm.name, lm.fingerprint)
        sig = model_signature(canonical, other or self.dtype)
        got = _store().get(sig) if sig and self._loader is None else None
        ok = isinstance(got, dict) and all(isinstance(got.get(k), str) and 0 < len(got[k]) < 4096
                                           for k in ("name", "fingerprint"))
        return ModelRef(got["name"], got["fingerprint"]) if ok else None

    def _remember(self, canonical: str, lm: "LoadedModel", precision: str | None = None) -> None:
        sig = model_signature(canonical, precision or self.dtype) if self._loader is None else None
        if sig:
            try:
                _store().put(sig, {"name": lm.name, "fingerprint": lm.fingerprint})
            except Exception:  # noqa: BLE001 - an unwritable cache: the next start loads the model to know it
                pass

    def peek(self, name: str, precision: str | None = None) -> "LoadedModel | None":
        """The resident model for `name` (in `precision`, default the pool's), or None; never loads, never
        reorders."""
        try:
            key = self._slot(self.check(name), precision)
        except Exception:
            return None
        with self._lock:
            return self._models.get(key)

    def loaded(self) -> list[dict[str, Any]]:
        """`info()` of the resident models, most recently used last."""
        with self._lock:
            return [lm.info() for lm in self._models.values()]

    def put(self, key: str, lm: "LoadedModel") -> None:
        """Make an already built model resident under `key` (tests, notebooks)."""
        with self._lock:
            self._models[key] = lm
            self._models.move_to_end(key)
            while len(self._models) > self.max_models:
                self._free(self._models.popitem(last=False)[1])

    def device_info(self) -> tuple[str, str]:
        """(device, dtype) new models load with."""
        from ..model.loading import default_device

        device = self.device or default_device()
        dtype = self.dtype or ("bf16" if device.startswith("cuda") else "fp32")
        return device, dtype


PRECISION_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
"""HEADLENS_DTYPE's short names by the precision names requests use."""


def _store() -> Any:
    from ..store.cache import default_cache

    return default_cache()


def model_signature(canonical: str, dtype: str | None = None) -> str | None:
    """What identifies a model's files without reading them: a folder's config and weight files (name, size,
    mtime), or a hub id's cached snapshot (its revision), and the dtype it loads in; None when unknown."""
    from ..store.cache import make_key
    from ..weights.model_sources import weights_folder

    folder = weights_folder(canonical) or Path(canonical)  # a preset or GGUF file: its converted folder
    try:
        if folder.is_dir():
            files = sorted(p for p in folder.iterdir() if p.suffix in (".safetensors", ".bin", ".pt", ".json"))
            parts = [f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in files]
        else:
            from huggingface_hub import try_to_load_from_cache

            cfg = try_to_load_from_cache(canonical, "config.json")
            if not isinstance(cfg, str):
                return None
            parts = [str(Path(cfg).parent)]  # .../snapshots/<revision>
    except Exception:
        return None
    return make_key("fingerprint", model=canonical, files=parts, **({"dtype": dtype} if dtype else {})) \
        if parts else None


HUB_FETCH_TIMEOUT = 6.0  # seconds to fetch a hub id's config.json at admission before refusing it


def _is_hub_id(canonical: str) -> bool:
    """Whether a canonical name (`ModelPool.check`) is a Hugging Face hub id: not the embedded model, a preset or an
    absolute path."""
    from ..weights.presets import PRESETS

    return not (canonical in DEFAULT_MODEL_NAMES or canonical in PRESETS or os.path.isabs(canonical))


def _hub_verdict(name: str) -> ServiceError | None:
    """None when hub id `name` (not in the local cache) can be fetched now: its config.json is downloaded into the
    local cache within HUB_FETCH_TIMEOUT s (the shape the estimate reads); else the refusal, one sentence."""
    from ..model.loading import HUB_PROBE_TIMEOUT, hub_endpoint, hub_offline_flag, hub_reachable
    from .model_shape import forget

    flag = hub_offline_flag()
    if flag is not None or not hub_reachable():
        why = f"{flag} is set" if flag else f"no answer from the hub within {HUB_PROBE_TIMEOUT:g} s"
        return NotFound(f"model {clip(name)!r} is not in this server's Hugging Face cache and the hub is unreachable "
                        f"(offline: {why}), so it cannot be loaded; use `default`, a pulled preset, a local model "
                        f"folder or an id already in the cache")
    got: list[BaseException | None] = []

    def fetch() -> None:
        try:
            from huggingface_hub import hf_hub_download

            hf_hub_download(name, "config.json", endpoint=hub_endpoint(), etag_timeout=HUB_FETCH_TIMEOUT)
            got.append(None)
        except BaseException as e:  # noqa: BLE001 - reported below as one sentence
            got.append(e)

    t = threading.Thread(target=fetch, name="headlens-hub-config", daemon=True)
    t.start()
    t.join(HUB_FETCH_TIMEOUT + 0.5)
    if got and got[0] is None:
        forget(name)  # a shape memoised before (assumed) is read again from the config now cached
        return None
    if not got:
        return NotFound(f"model {clip(name)!r}: the Hugging Face hub did not send its config.json within "
                        f"{HUB_FETCH_TIMEOUT:g} s, so it cannot be loaded now; try again later")
    e = got[0]
    kind = type(e).__name__
    if kind == "GatedRepoError":
        return Forbidden(f"model {clip(name)!r} is gated on the Hugging Face hub: this server has no access to it")
    if kind in ("RepositoryNotFoundError", "RevisionNotFoundError", "EntryNotFoundError",
                "RemoteEntryNotFoundError", "HFValidationError") or getattr(
                    getattr(e, "response", None), "status_code", None) in (401, 404):
        return NotFound(f"no model {clip(name)!r} on the Hugging Face hub (or no config.json in it); give a model "
                        f"id as `org/name`, `default`, a pulled preset or a local model folder")
    return NotFound(f"model {clip(name)!r}: its config.json could not be fetched from the Hugging Face hub "
                    f"({kind}), so it cannot be loaded now")

def check_access(name: str) -> str | None:
    """HEADLENS_MODEL_ROOT and HEADLENS_ALLOW_HUB applied to `name` exactly as the service applies them (for the
    command line, before anything is loaded or downloaded): the canonical name to load (a relative name under the
    root becomes its path there), or None when `name` names nothing usable (the loader then says why in its own
    words). Raises Forbidden, the service's sentence, for a path outside the root or a hub id with the hub off."""
    try:
        return ModelPool(max_models=1).check(name)
    except Forbidden:
        raise
    except ServiceError:
        return None
