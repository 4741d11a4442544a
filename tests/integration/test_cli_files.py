"""The files the command line writes (issue 24, items 1 and 2): each is written under a temporary name and renamed
only when whole, so a full disk leaves no partial file (and an older file as it was); a place where no file can go
is refused before any model is loaded or any work is done, in one sentence naming the folder as it was given."""
from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

import backend.store.atomic_dirs as ad
import backend.cli as cli
from backend.cli import main
from tiny_models import tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, gpt2_tokenizer):
    d = tmp_path_factory.mktemp("models") / "tiny-gpt2"
    tiny_model("gpt2").save_pretrained(d)
    gpt2_tokenizer.save_pretrained(d)
    return str(d)


def _errors(err: str) -> list[str]:
    return [line for line in err.replace("\r", "\n").splitlines() if line.startswith("error")]


def _leftovers(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if p.name.startswith(ad.PREFIX)]


@pytest.fixture
def disk_full(monkeypatch):
    """A disk that takes the probe block and then half of the next file before ENOSPC (os.write's failure)."""
    real = ad._write_fd

    def write(fd: int, data: bytes) -> None:
        if len(data) == ad.PROBE_BYTES and not any(data):  # check_file_target's probe: the disk has a block free
            return real(fd, data)
        os.write(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(ad, "_write_fd", write)


# == 1. whole or nothing ===============================================================================================
def test_a_full_disk_leaves_no_partial_json_and_keeps_the_older_file(model_dir, tmp_path, capsys, disk_full):
    out = tmp_path / "s.json"
    out.write_text('{"older": true}')
    code = main(["scores", "--model", model_dir, "--task", "sentiment", "--prompts", "3", "--json", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and _errors(err) == [f"error: --json {out}: cannot write it (No space left on device); "
                                          f"nothing was written"], err
    assert "[Errno" not in err and "Traceback" not in err
    assert json.loads(out.read_text()) == {"older": True} and _leftovers(tmp_path) == []
    fresh = tmp_path / "new.json"
    assert main(["scores", "--model", model_dir, "--task", "sentiment", "--prompts", "3", "--json", str(fresh)]) == 2
    assert not fresh.exists() and _leftovers(tmp_path) == []


def test_a_full_disk_leaves_no_partial_report(tmp_path, monkeypatch, capsys, disk_full):
    import backend.report.findings_html as fh

    monkeypatch.setattr(cli, "compute_kind", lambda name, a: "measured")
    monkeypatch.setattr(fh, "report_html", lambda r: "<!DOCTYPE html>" + "x" * 100_000)
    out = tmp_path / "x.html"
    assert main(["report", "--model", "default", "--tasks", "syn-sentiment", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert _errors(err) == [f"error: --out {out}: cannot write it (No space left on device); nothing was written"]
    assert not out.exists() and _leftovers(tmp_path) == []


def test_outputs_are_whole_files_through_links_and_devices(model_dir, tmp_path, monkeypatch, capsys):
    import backend.report.findings_html as fh

    monkeypatch.setattr(cli, "compute_kind", lambda name, a: "measured")
    monkeypatch.setattr(fh, "report_html", lambda r: "<!DOCTYPE html><p>report</p>")
    real = tmp_path / "real.html"
    real.write_text("old")
    os.chmod(real, 0o640)
    link = tmp_path / "link.html"
    link.symlink_to(real)
    assert main(["report", "--model", "default", "--tasks", "syn-sentiment", "--out", str(link)]) == 0
    assert link.is_symlink() and real.read_text() == "<!DOCTYPE html><p>report</p>"  # written through the link
    assert real.stat().st_mode & 0o777 == 0o640 and _leftovers(tmp_path) == []  # its permissions kept
    assert main(["report", "--model", "default", "--tasks", "syn-sentiment", "--out", os.devnull]) == 0
    assert Path(os.devnull).exists() and not Path(os.devnull).is_file()  # a device is written, never replaced


def test_write_file_is_atomic_and_says_why_without_a_path(tmp_path, monkeypatch):
    target = tmp_path / "f.bin"
    ad.write_file(target, b"abc")
    assert target.read_bytes() == b"abc"

    def broken_replace(src, dst):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(src))

    monkeypatch.setattr(ad.os, "replace", broken_replace)
    with pytest.raises(ad.WriteError) as e:
        ad.write_file(target, b"defg")
    assert str(e.value) == "Read-only file system" and str(tmp_path) not in str(e.value)
    assert target.read_bytes() == b"abc" and _leftovers(tmp_path) == []


# == 2. refused before any work ========================================================================================
def _no_work(monkeypatch) -> None:
    """Every way a command could start its work fails the test."""
    import backend.model.loading as models
    import backend.service.sweep_cli as sweep_cli
    import backend.service.warm as warm

    def boom(*a, **k):
        pytest.fail("work started before the output file was checked")

    for mod, name in ((cli, "compute_kind"), (cli, "load_model_from"), (models, "load_model"), (sweep_cli, "run"),
                      (warm, "warm")):
        monkeypatch.setattr(mod, name, boom)


COMMANDS = {
    "report": (["report", "--model", "default", "--tasks", "syn-sentiment", "--out"], "--out"),
    "scores": (["scores", "--model", "default", "--task", "syn-sentiment", "--prompts", "3", "--json"], "--json"),
    "sweep": (["sweep", "--models", "default", "--tasks", "syn-sentiment", "--kinds", "scores", "--json"], "--json"),
    "warm": (["warm", "--model", "default", "--json"], "--json"),
}
PLACES = {  # the path given -> the end of the one error line
    "a missing folder": ("nope/x.out", "cannot write in the folder nope (it does not exist)"),
    "a file as the folder": ("afile/x.out", "cannot write in the folder afile (it is not a folder)"),
    "/proc": ("/proc/headlens.html", "cannot write in the folder /proc (no file can be created there)"),
    "a read-only folder": ("ro/x.out", "cannot write in the folder ro (Read-only file system)"),
    "a full disk": ("full/x.out", "cannot write in the folder full (No space left on device)"),
    "a folder as the file": ("adir", "is a directory; give a file path"),
}
CASES = [(c, p) for c in COMMANDS for p in PLACES]


@pytest.mark.parametrize("command,place", CASES, ids=[f"{c}, {p}" for c, p in CASES])
def test_an_unwritable_output_is_refused_before_any_work(command, place, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("")
    for d in ("ro", "full", "adir"):
        (tmp_path / d).mkdir()
    real_open = os.open

    def faulty_open(path, flags, *a):  # as root a chmod'ed folder is writable: the fault is injected instead
        name = os.fspath(path)
        if flags & os.O_CREAT and name.startswith(("ro/", "full/")):
            code = errno.EROFS if name.startswith("ro/") else errno.ENOSPC
            raise OSError(code, os.strerror(code), name)
        return real_open(path, flags, *a)

    monkeypatch.setattr(ad.os, "open", faulty_open)
    _no_work(monkeypatch)
    args, flag = COMMANDS[command]
    path, message = PLACES[place]
    code = main([*args, path])
    err = capsys.readouterr().err
    assert code == 2 and _errors(err) == [f"error: {flag} {path}: {message}"], err
    assert "[Errno" not in err and str(tmp_path) not in err
    assert all(_leftovers(tmp_path / d) == [] for d in ("ro", "full", "adir"))


def test_the_report_s_default_file_is_checked_too(tmp_path, monkeypatch, capsys):
    (tmp_path / "findings-default.html").mkdir()  # where the default name would go
    monkeypatch.chdir(tmp_path)
    _no_work(monkeypatch)
    assert main(["report", "--model", "default", "--tasks", "syn-sentiment"]) == 2
    assert "error: --out findings-default.html: is a directory" in capsys.readouterr().err


# == train-default: a model folder, whole or not at all ================================================================
def test_train_default_checks_its_folder_before_training(tmp_path, monkeypatch, capsys):
    import backend.analysis.general.train_default as td

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(td, "train", lambda *a, **k: pytest.fail("trained before the folder was checked"))
    (tmp_path / "afile").write_text("")
    for out, message in (("nope/model", "--out nope/model: cannot write in the folder nope (it does not exist)"),
                         ("afile", "--out afile: is a file; give a folder"),
                         ("afile/model", "--out afile/model: cannot write in the folder afile (it is not a folder)"),
                         ("model", "--out model: no trained model folder (it holds no metrics.json)")):
        args = ["train-default", "--config", "tiny", "--out", out] + (["--eval-only"] if out == "model" else [])
        assert main(args) == 2
        assert _errors(capsys.readouterr().err) == [f"error: {message}"]


def test_train_default_rewrites_its_card_whole_or_not_at_all(model_dir, tmp_path, monkeypatch, capsys):
    import shutil

    import backend.store.atomic_dirs as atomic_dirs

    folder = tmp_path / "trained"
    shutil.copytree(model_dir, folder)
    from backend.store.paths import DEFAULT_MODEL_DIR

    metrics = json.loads((DEFAULT_MODEL_DIR / "metrics.json").read_text())  # a real card's record
    metrics["command"] = "python -m backend.train_default"
    (folder / "metrics.json").write_text(json.dumps(metrics))
    before = (folder / "metrics.json").read_bytes()
    real = atomic_dirs._write_fd

    def full(fd: int, data: bytes) -> None:
        if len(data) == ad.PROBE_BYTES and not any(data):
            return real(fd, data)
        os.write(fd, data[:10])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(ad, "_write_fd", full)
    args = ["train-default", "--out", str(folder), "--eval-only", "--eval-prompts", "0"]
    assert main(args) == 2
    assert _errors(capsys.readouterr().err) == [f"error: --out {folder}: cannot write its card (No space left on "
                                                f"device); the files are as they were"]
    assert (folder / "metrics.json").read_bytes() == before and _leftovers(folder) == []
    monkeypatch.setattr(ad, "_write_fd", real)
    assert main(args) == 0
    assert json.loads((folder / "metrics.json").read_text())["command"] == "python -m backend train-default"
    assert (folder / "README.md").is_file() and _leftovers(folder) == []
