"""Hardening, second round, part A (issue 18): one row per case of the probe, in tables, so each stays fixed.

1 `load` reads no file but the service's own: ids only, never a path; symlinks, FIFOs and folders under an id
  refused like an absent id; no fingerprint in a refusal; the upload route and its limits.
2 results tied to the content: a hit whose tensor is gone, changed or truncated is recomputed.
3 malformed vectors: one sentence for each, as a 422 (upload), a job's error, or exit 2 (CLI).
4 a finished training is never lost to a disk fault: 507 before training; after it, the tensors inline.
7 no absolute server path in a result or /capabilities.
8 Ray: tensors come back to the service, which checks and writes them (the cluster rows: tests/integration/test_ray.py).
Quota: uploads over HEADLENS_TENSOR_QUOTA_MB go least recently used first, never one a job refers to.

All on the embedded default model (4 layers x 8 heads, d_model 128) with tiny trainings (under a second each).
"""
from __future__ import annotations

import base64
import errno
import json
import os
import struct
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import pytest
import torch

from backend.analysis.primitives.saved import decode, encode, inspect
from backend.store.tensor_store import TensorMissing, TensorStore, TensorWriteError, missing, tensor_id
from hang import HANG_S

REPO = Path(__file__).resolve().parents[2]
TASK = "syn-antonym"
BASE = {"model": "default", "task": TASK}
LTV_TRAIN = dict(epochs=1, train_prompts=4, val_prompts=2, batch_size=4)
LTV = dict(LTV_TRAIN, prompts=2, shots=1, mechanism=False)
SITE = dict(m=2, shots=1, prompts=2, steps=2, val_every=2, val_prompts=1, max_new_tokens=2, compare=[], patching=[],
            budget=[], correlations=[])
FIELDS = {"ltv_train": LTV_TRAIN, "ltv": LTV, "site": SITE}
CLEAN_ENV = ("HEADLENS_TOKEN", "HEADLENS_MODEL_ROOT", "HEADLENS_ALLOW_HUB", "HEADLENS_TENSOR_QUOTA_MB")


# -- what the service opens: an audit hook, recording while a row asks -------------------------------------------
_OPENED: list[str] = []
_RECORDING = threading.Event()


def _hook(event: str, args: tuple) -> None:
    if event == "open" and _RECORDING.is_set() and args and isinstance(args[0], (str, bytes, os.PathLike)):
        _OPENED.append(os.fsdecode(args[0]))


sys.addaudithook(_hook)  # process-wide and permanent; it records only inside `opened()`


@contextmanager
def opened():
    _OPENED.clear()
    _RECORDING.set()
    try:
        yield _OPENED
    finally:
        _RECORDING.clear()


def outside(paths: list[str], cache: Path) -> list[str]:
    """The opened paths (as asked for: `..` resolved, links not followed) outside the cache folder and the code (the
    repository, the Python installation)."""
    roots = {f(p) for p in (cache, REPO, sys.prefix, sys.base_prefix, *sys.path) if p
             for f in (os.path.realpath, os.path.abspath)}
    return [p for p in paths if not any(os.path.abspath(p) == r or os.path.abspath(p).startswith(r + os.sep)
                                        for r in roots)]


# -- the service ----------------------------------------------------------------------------------------------------
def wait(c: Any, job_id: str, timeout: float = HANG_S) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        j = c.get(f"/jobs/{job_id}").json()
        if j["status"] not in ("queued", "running"):
            return j
        time.sleep(0.02)
    raise AssertionError(f"job {job_id} did not finish")


def job(c: Any, kind: str, **fields: Any) -> dict[str, Any]:
    r = c.post("/jobs", json={"kind": kind, **BASE, **FIELDS.get(kind, {}), **fields})
    assert r.status_code == 202, r.text
    return wait(c, r.json()["id"])


def result(c: Any, kind: str, **fields: Any) -> dict[str, Any]:
    j = job(c, kind, **fields)
    assert j["status"] == "done", j["error"]
    return j["result"]


@contextmanager
def service(cache: Path, pool: Any = None, **env: str):
    from starlette.testclient import TestClient

    from backend.service.app import create_app
    from backend.service.model_pool import ModelPool

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HEADLENS_CACHE_DIR", str(cache))
        for var in CLEAN_ENV:
            mp.delenv(var, raising=False)
        for k, v in env.items():
            mp.setenv(k, v)
        pool = pool or ModelPool()
        with TestClient(create_app(pool=pool), raise_server_exceptions=False) as c:
            yield c, pool


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tensor-cache")


@pytest.fixture(autouse=True)
def _env(monkeypatch, cache):
    monkeypatch.setenv("HEADLENS_CACHE_DIR", str(cache))
    for var in CLEAN_ENV:
        monkeypatch.delenv(var, raising=False)


@pytest.fixture(scope="module")
def svc(cache):
    """The service on the module's cache (uploads at most 0.25 MB), with one trained LTV (two seeds) and SITE."""
    with service(cache, HEADLENS_MAX_TENSOR_MB="0.25") as (c, pool):
        ltv, ltv_b, site = (result(c, "ltv_train"), result(c, "ltv_train", seed=1), result(c, "site"))
        store = TensorStore(cache / "tensors")
        yield SimpleNamespace(c=c, pool=pool, lm=pool.get("default"), cache=cache, store=store, ltv=ltv["tensor"],
                              ltv_b=ltv_b["tensor"], site=site["tensor"], results={"ltv_train": ltv, "site": site})


def file_of(svc: Any, kind: str) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    return decode(svc.store.get(svc.ltv if kind == "ltv" else svc.site), "x")


def refusal(detail: str) -> str:
    """A 422's sentence without the echoed input."""
    return detail.split(" (got ")[0]


# == 1. security: `load` reads no file but the service's own ========================================================
PATHS = [  # (case, the `load` value; {cache}, {file} and {id} are filled in)
    ("an absolute path outside the cache", "/etc/passwd"),
    ("a path that does not exist", "/no/such/dir/v.safetensors"),
    ("../ out of the working folder", "../../../../../etc/passwd"),
    ("<cache>/tensors/../../ out of the cache", "{cache}/tensors/../../../../../../etc/passwd"),
    ("/proc/self/environ", "/proc/self/environ"),
    ("the path of a real saved tensor", "{file}"),
    ("an id followed by a path", "{id}/../../../etc/passwd"),
    ("a 300-character name", "a" * 300 + ".safetensors"),
]


@pytest.mark.parametrize("kind", ["site", "ltv"])
@pytest.mark.parametrize("case,value", PATHS, ids=[p[0] for p in PATHS])
def test_1_load_is_never_a_path(svc, kind, case, value):
    tid = svc.site if kind == "site" else svc.ltv
    value = value.format(cache=svc.cache, file=svc.store.path(tid), id=tid)
    with opened() as seen:
        r = svc.c.post("/jobs", json={"kind": kind, **BASE, "load": value})
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert "a path is not accepted" in detail and len(detail) < 700
    with opened():
        same = svc.c.post("/jobs", json={"kind": kind, **BASE, "load": "/no/such/file"}).json()["detail"]
    assert refusal(detail) == refusal(same)  # one sentence whatever the path, existing or not
    assert not outside(seen, svc.cache) and not [p for p in seen if "passwd" in p or "environ" in p]


SERVICE_PATH_CASES = ["a sweep's params", "a sweep's per-kind params", "HEADLENS_MODEL_ROOT set", "POST /jobs/cached"]


@pytest.mark.parametrize("case", SERVICE_PATH_CASES)
def test_1_load_is_never_a_path_on_any_route(svc, tmp_path, case):
    body = {"models": ["default"], "tasks": [TASK], "kinds": ["site"]}
    with opened() as seen:
        if case == "a sweep's params":
            r = svc.c.post("/sweeps", json={**body, "params": {"load": "/etc/passwd"}})
        elif case == "a sweep's per-kind params":
            r = svc.c.post("/sweeps", json={**body, "params": {"site.load": "../../etc/passwd"}})
        elif case == "POST /jobs/cached":
            r = svc.c.post("/jobs/cached", json={"kind": "site", **BASE, "load": "/etc/passwd"})
        else:
            (tmp_path / "root").mkdir()
            with service(svc.cache, HEADLENS_MODEL_ROOT=str(tmp_path / "root")) as (c, _):
                r = c.post("/jobs", json={"kind": "site", **BASE, "load": "/etc/passwd"})
    assert r.status_code == 422 and "a path is not accepted" in r.json()["detail"], r.text
    assert not [p for p in seen if "passwd" in p]


def _plant(svc: Any, how: str, tmp_path: Path) -> str:
    """An id under which the tensors folder holds something that is not a stored tensor; returns the id."""
    folder = svc.cache / "tensors"
    if how == "a symlink to an intact copy outside the cache":
        tensors, meta = file_of(svc, "site")
        data = encode(tensors, {**meta, "task": "copy"})
        tid = tensor_id("site", data)
        (tmp_path / "outside.safetensors").write_bytes(data)
        (folder / f"{tid}.safetensors").symlink_to(tmp_path / "outside.safetensors")
        return tid
    tid = tensor_id("site", how.encode())
    where = folder / f"{tid}.safetensors"
    if how == "a symlink to /etc/passwd":
        where.symlink_to("/etc/passwd")
    elif how == "a FIFO":
        os.mkfifo(where)
    elif how == "a folder":
        where.mkdir()
    return tid


STORE_CASES = ["nothing under the id", "a symlink to an intact copy outside the cache", "a symlink to /etc/passwd",
               "a FIFO", "a folder"]


@pytest.mark.parametrize("how", STORE_CASES)
def test_1_what_is_not_a_stored_tensor_reads_as_absent(svc, tmp_path, how):
    tid = _plant(svc, how, tmp_path)
    with opened() as seen:
        r = svc.c.post("/jobs", json={"kind": "site", **BASE, **SITE, "load": tid})
        got = svc.c.get(f"/tensors/{tid}")
    expected = str(missing(tid))  # the one sentence of an id that names no stored tensor
    assert (r.status_code, r.json()["detail"]) == (404, expected)
    assert (got.status_code, got.json()["detail"]) == (404, expected)
    assert not outside(seen, svc.cache) and not [p for p in seen if "passwd" in p or "outside" in p]


def test_1_a_refusal_never_prints_a_fingerprint(svc):
    tensors, meta = file_of(svc, "site")
    other = "f" * 64
    up = svc.c.post("/tensors", content=encode(tensors, {**meta, "fingerprint": other, "model": "another-model"}))
    assert up.status_code == 200, up.text
    j = job(svc.c, "site", load=up.json()["id"])
    assert j["status"] == "error" and "trained for another model (another-model), not default" in j["error"]
    assert other not in j["error"] and svc.lm.fingerprint not in j["error"]


def _multipart(data: bytes) -> dict[str, Any]:
    return {"files": {"file": ("v.safetensors", data)}}


UPLOADS = [  # (case, body: bytes or a callable of svc, how it is sent, status, a fragment of the answer)
    ("a site file as raw bytes", lambda s: s.store.get(s.site), "raw", 200, None),
    ("an ltv file as a multipart form", lambda s: s.store.get(s.ltv), "multipart", 200, None),
    ("a body over HEADLENS_MAX_TENSOR_MB", lambda s: b"\0" * (300 << 10), "raw", 413, "HEADLENS_MAX_TENSOR_MB"),
    ("a multipart file over the limit", lambda s: b"\0" * (300 << 10), "multipart", 413, "HEADLENS_MAX_TENSOR_MB"),
    ("a header over 64 KiB", lambda s: struct.pack("<Q", 70_000) + b" " * 70_000, "raw", 422, "over the limit"),
    ("not a tensor file", lambda s: b"root:x:0:0:root:/root:/bin/bash\n", "raw", 422, "not a readable headlens"),
    ("an empty body", lambda s: b"", "raw", 422, "not a readable headlens"),
    ("a multipart form without a file", lambda s: None, "form", 422, "needs a `file` field"),
]


@pytest.mark.parametrize("case,body,how,status,fragment", UPLOADS, ids=[u[0] for u in UPLOADS])
def test_1_upload_route(svc, case, body, how, status, fragment):
    data = body(svc)
    if how == "raw":
        r = svc.c.post("/tensors", content=data, headers={"content-type": "application/octet-stream"})
    elif how == "multipart":
        r = svc.c.post("/tensors", **_multipart(data))
    else:
        r = svc.c.post("/tensors", data={"x": "1"}, files={"other": ("a", b"b")})
    assert r.status_code == status, r.text
    if status == 200:
        info = r.json()
        assert info["id"] == tensor_id(info["kind"], data) and info["d_model"] == 128 and "fingerprint" not in info
        got = svc.c.get(f"/tensors/{info['id']}")
        assert got.status_code == 200 and got.content == data
    else:
        assert fragment in r.json()["detail"]


@pytest.mark.parametrize("name", ["site-" + "0" * 32, "..%2F..%2Fetc%2Fpasswd", "ltv-xyz", "a" * 300])
def test_1_download_of_an_unknown_id_is_the_same_404(svc, name):
    with opened() as seen:
        r = svc.c.get(f"/tensors/{name}")
    detail = r.json()["detail"]  # the route's refusal, or no route at all for a name with slashes
    assert r.status_code == 404 and (detail.startswith("no tensor ") or detail == "Not Found") and len(detail) < 300
    assert not [p for p in seen if "passwd" in p]


def test_1_the_ui_client_uploads_and_downloads_tensors(svc):
    from ui.client import ClientError, HeadlensClient

    client = HeadlensClient("http://testserver")
    client._http = svc.c  # the module's service, in process
    data = svc.store.get(svc.ltv)
    assert client.upload_tensor(data)["id"] == svc.ltv and client.tensor(svc.ltv) == data
    with pytest.raises(ClientError, match="no tensor") as e:
        client.tensor("ltv-" + "e" * 32)
    assert e.value.status == 404
    with pytest.raises(ClientError, match="NaN or infinite"):
        t, m = file_of(svc, "ltv")
        t["theta"][0, 0] = float("nan")
        client.upload_tensor(encode(t, m))


# == 2. results tied to the content ==================================================================================
def _analyze(svc: Any, kind: str, **fields: Any) -> Any:
    from backend.analysis.kernel import analyze
    from backend.tasks.registry import load_task

    return analyze(kind, svc.lm, load_task(TASK), {**FIELDS[kind], **fields})


def _file(svc: Any, tid: str) -> Path:
    return svc.cache / "tensors" / f"{tid}.safetensors"


def case_2_another_vector_copied_over(svc, restart: bool = False) -> None:
    a, b = (_analyze(svc, "ltv_train", seed=s + 2 * restart) for s in (11, 12))
    first = _analyze(svc, "ltv", load=a.tensor)
    assert _analyze(svc, "ltv", load=a.tensor).cache_hit
    _file(svc, a.tensor).write_bytes(_file(svc, b.tensor).read_bytes())
    if restart:  # the result cache and the tensor store read afresh, as after a restart
        from backend.analysis.kernel import analyze
        from backend.store.cache import ResultCache
        from backend.tasks.registry import load_task

        with pytest.raises(TensorMissing, match="no tensor"):
            analyze("ltv", svc.lm, load_task(TASK), {**LTV, "load": a.tensor}, cache=ResultCache(svc.cache),
                    tensors=TensorStore(svc.cache / "tensors"))
    else:
        with pytest.raises(TensorMissing, match="no tensor"):
            _analyze(svc, "ltv", load=a.tensor)
    assert not _file(svc, a.tensor).exists() and first.tensor == a.tensor  # the changed file is removed


def case_2_loaded_file_deleted(svc) -> None:
    s = _analyze(svc, "site", seed=13)
    assert _analyze(svc, "site", seed=13, load=s.tensor).cache_hit is False
    assert _analyze(svc, "site", seed=13, load=s.tensor).cache_hit
    _file(svc, s.tensor).unlink()
    with pytest.raises(TensorMissing):
        _analyze(svc, "site", seed=13, load=s.tensor)
    r = svc.c.post("/jobs/cached", json={"kind": "site", **BASE, **SITE, "seed": 13, "load": s.tensor})
    assert r.status_code == 404  # the finished result is no longer served


def case_2_truncated_ltv_file(svc) -> None:
    a = _analyze(svc, "ltv_train", seed=17)
    data = _file(svc, a.tensor).read_bytes()
    _file(svc, a.tensor).write_bytes(data[: len(data) // 2])
    again = _analyze(svc, "ltv_train", seed=17)
    assert not again.cache_hit and again.tensor == a.tensor and _file(svc, a.tensor).read_bytes() == data


def case_2_truncated_site_file(svc) -> None:
    s = _analyze(svc, "site", seed=15)
    data = _file(svc, s.tensor).read_bytes()
    _file(svc, s.tensor).write_bytes(data[:100])
    again = _analyze(svc, "site", seed=15)
    assert not again.cache_hit and again.tensor == s.tensor and _file(svc, s.tensor).read_bytes() == data


def case_2_deleted_vector_under_a_cached_ltv(svc) -> None:
    r = _analyze(svc, "ltv", seed=16)
    _file(svc, r.tensor).unlink()
    again = _analyze(svc, "ltv", seed=16)
    assert not again.cache_hit and again.tensor == r.tensor and _file(svc, r.tensor).is_file()


def case_2_the_key_holds_the_content(svc) -> None:
    from backend.service.admit import admit

    app_state = svc.c.app.state
    keys = {admit({"kind": "ltv", **BASE, **LTV, "load": t}, app_state.pool, app_state.tasks, app_state.limits).key
            for t in (svc.ltv, svc.ltv_b)}
    a, b = (_analyze(svc, "ltv", load=t) for t in (svc.ltv, svc.ltv_b))
    assert len(keys) == 2 and not torch.equal(torch.as_tensor(a.per_layer[0].training.theta),
                                              torch.as_tensor(b.per_layer[0].training.theta))


CONTENT = [
    ("another vector copied over the loaded file", case_2_another_vector_copied_over),
    ("the same after a restart", lambda svc: case_2_another_vector_copied_over(svc, restart=True)),
    ("the loaded file deleted", case_2_loaded_file_deleted),
    ("a cached ltv_train's file truncated", case_2_truncated_ltv_file),
    ("a cached site's file truncated", case_2_truncated_site_file),
    ("the vector under a cached ltv deleted", case_2_deleted_vector_under_a_cached_ltv),
    ("two files, two keys", case_2_the_key_holds_the_content),
]


@pytest.mark.parametrize("case,check", CONTENT, ids=[c[0] for c in CONTENT])
def test_2_results_are_tied_to_the_content(svc, case, check):
    check(svc)


# == 3. non-finite or malformed vectors ==============================================================================
def _set(name: str, index: tuple, value: float) -> Callable:
    def tamper(t: dict, m: dict) -> None:
        t[name][index] = value
    return tamper


def _widen(t: dict, m: dict) -> None:
    t["theta"] = torch.cat([t["theta"], torch.zeros(t["theta"].shape[0], 1)], 1)


def _raw(meta: dict, entries: dict[str, tuple[str, list[int], bytes]]) -> bytes:
    header: dict[str, Any] = {"__metadata__": meta}
    body, at = b"", 0
    for name, (dtype, shape, data) in entries.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [at, at + len(data)]}
        body, at = body + data, at + len(data)
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + body


def _int_alpha(svc: Any) -> bytes:
    t, m = file_of(svc, "site")
    return _raw(m, {"alpha": ("I32", [4, 8], b"\0" * 128),
                    "task_embedding": ("F32", [4, 8, 32], t["task_embedding"].numpy().tobytes())})


MALFORMED = [  # (kind, case, the file: a tamper of the trained one, or bytes from svc; a fragment of the refusal)
    ("ltv", "theta with a NaN", _set("theta", (0, 0), float("nan")), "NaN or infinite"),
    ("ltv", "theta with an inf", _set("theta", (0, 3), float("inf")), "NaN or infinite"),
    ("ltv", "theta with 1e38", _set("theta", (0, 5), 1e38), "over 1e+05"),
    ("ltv", "theta 129 wide where the metadata says 128", _widen, "129 wide, but its metadata says d_model 128"),
    ("ltv", "a recipe without layers", lambda t, m: m.update(recipe="{}"), "names no layers"),
    ("ltv", "two vectors for a one-layer recipe", lambda t, m: t.update(theta=t["theta"].repeat(2, 1)),
     "holds 2 vector(s) for the 1 layer(s)"),
    ("ltv", "metadata of another format", lambda t, m: m.update(format="other"), "not a headlens tensor file"),
    ("ltv", "a header over 64 KiB", lambda s: struct.pack("<Q", 70_000) + b" " * 70_000, "over the limit"),
    ("site", "alpha = NaN", _set("alpha", (1, 2), float("nan")), "NaN or infinite"),
    ("site", "alpha = 5.0", _set("alpha", (0, 0), 5.0), "an alpha is a sigmoid, in [0, 1]"),
    ("site", "alpha = -3.0", _set("alpha", (3, 7), -3.0), "an alpha is a sigmoid, in [0, 1]"),
    ("site", "an embedding of +inf", _set("task_embedding", (0, 0, 0), float("inf")), "NaN or infinite"),
    ("site", "alpha that is not the sigmoid of its logits", _set("alpha", (0, 1), 0.999), "not the sigmoid"),
    ("site", "an embedding of another head_dim",
     lambda t, m: t.update(task_embedding=t["task_embedding"][..., :31].contiguous()), "not the 4 x 8 heads"),
    ("site", "an extra tensor", lambda t, m: t.update(theta=torch.zeros(3)), "a site file holds"),
    ("site", "an integer tensor", _int_alpha, "not of dtype"),
    ("site", "a truncated file", lambda s: s.store.get(s.site)[:-10], "truncated"),
]
MALFORMED_IDS = [f"{k}: {c}" for k, c, _, _ in MALFORMED]


def malformed(svc: Any, kind: str, make: Callable) -> bytes:
    if make.__code__.co_argcount == 1:  # bytes from svc
        return make(svc)
    t, m = file_of(svc, kind)  # a tamper of the trained file
    make(t, m)
    return encode(t, m)


@pytest.mark.parametrize("kind,case,make,fragment", MALFORMED, ids=MALFORMED_IDS)
def test_3_malformed_upload_is_one_sentence(svc, kind, case, make, fragment):
    r = svc.c.post("/tensors", content=malformed(svc, kind, make))
    assert r.status_code == 422 and fragment in r.json()["detail"], r.text
    assert "\n" not in r.json()["detail"] and len(r.json()["detail"]) < 400


@pytest.mark.parametrize("kind,case,make,fragment", MALFORMED, ids=MALFORMED_IDS)
def test_3_malformed_stored_file_is_refused_at_submission(svc, kind, case, make, fragment):
    """The same file planted in the store (bypassing the upload's check): checked again when a job names it, at
    submission (issue 24: a 422 from POST /jobs and POST /jobs/estimate alike, never a job that fails)."""
    data = malformed(svc, kind, make)
    tid = tensor_id(kind, data)
    svc.store.put(tid, data)
    body = {"kind": kind, **BASE, **FIELDS.get(kind, {}), "load": tid}
    for route in ("/jobs", "/jobs/estimate"):
        r = svc.c.post(route, json=body)
        detail = r.json()["detail"]
        assert r.status_code == 422 and fragment in detail, (route, r.text)
        assert "\n" not in detail and len(detail) < 400 and not detail.startswith("internal error")


@pytest.mark.parametrize("kind,case,make,fragment", MALFORMED, ids=MALFORMED_IDS)
def test_3_malformed_local_file_is_exit_2_in_the_cli(svc, tmp_path, capsys, kind, case, make, fragment):
    from backend.cli import main

    path = tmp_path / "v.safetensors"
    path.write_bytes(malformed(svc, kind, make))
    assert main([kind, "--model", "default", "--task", TASK, "--load", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --load:") and fragment in err and "\n" not in err, err


def test_3_a_vector_as_wide_as_its_metadata_but_not_the_model(svc, tmp_path, capsys):
    from backend.cli import main

    t, m = file_of(svc, "ltv")
    _widen(t, m)
    data = encode(t, {**m, "d_model": "129"})
    up = svc.c.post("/tensors", content=data)
    assert up.status_code == 200  # consistent in itself
    r = svc.c.post("/jobs", json={"kind": "ltv", **BASE, **FIELDS.get("ltv", {}), "load": up.json()["id"]})
    assert r.status_code == 422  # refused at submission, from the file's metadata and the model's config
    assert "trained for d_model 129" in r.json()["detail"] and "default has d_model 128" in r.json()["detail"]
    (tmp_path / "wide.safetensors").write_bytes(data)
    assert main(["ltv", "--model", "default", "--task", TASK, "--load", str(tmp_path / "wide.safetensors"),
                 "--prompts", "2", "--shots", "1", "--no-mechanism"]) == 2
    assert "trained for d_model 129" in capsys.readouterr().err


@pytest.mark.parametrize("where", ["cli", "http"])
def test_3_a_300_character_name_is_clipped(svc, tmp_path, capsys, where):
    from backend.cli import main

    name = "v" * 300 + ".safetensors"
    if where == "cli":
        assert main(["site", "--model", "default", "--task", TASK, "--load", str(tmp_path / name)]) == 2
        err = capsys.readouterr().err
    else:
        err = svc.c.post("/jobs", json={"kind": "site", **BASE, "load": name}).json()["detail"]
    assert "v" * 40 in err and "v" * 250 not in err and len(err) < 600


def test_3_the_cli_and_python_take_a_local_file_through_the_store(svc, tmp_path, capsys):
    import backend
    from backend.cli import main

    path = tmp_path / "mine.safetensors"
    path.write_bytes(svc.store.get(svc.site))
    out = tmp_path / "r.json"
    assert main(["site", "--model", "default", "--task", TASK, "--load", str(path), "--json", str(out),
                 *[x for k, v in SITE.items() if k not in ("compare", "patching", "budget", "correlations")
                   for x in (f"--{k.replace('_', '-')}", str(v))],
                 "--compare", "", "--patching", "", "--budget", "", "--correlations", ""]) == 0, capsys.readouterr()
    cli = json.loads(out.read_text())
    api = backend.train_site(svc.lm, backend.load_task(TASK), load=str(path), **SITE)
    assert cli["tensor"] == api.tensor == svc.site and cli["loaded"] and cli["site"] == api.site.model_dump(mode="json")  # JSON: intervals as lists


# == 4. a finished training lost to a disk fault =====================================================================
class FaultyOS:
    """`os` for backend.store.tensor_store with one fault: `error` when creating (`at`="create") or writing (`at`="write") a
    file whose name holds `names` (".probe-": the check before training; ".tmp-": the save after it)."""

    def __init__(self, error: int, at: str, names: str):
        self._real, self.error, self.at, self.names = os, error, at, names
        self._fds: set[int] = set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def _fail(self) -> None:
        raise OSError(self.error, os.strerror(self.error))

    def open(self, path: Any, flags: int, *a: Any) -> int:
        hit = bool(flags & os.O_CREAT) and self.names in os.fspath(path)
        if hit and self.at == "create":
            self._fail()
        fd = self._real.open(path, flags, *a)
        if hit:
            self._fds.add(fd)
        return fd

    def write(self, fd: int, data: Any) -> int:
        if fd in self._fds and self.at == "write":
            self._fail()
        return self._real.write(fd, data)


def _fault(monkeypatch: Any, tmp_path: Path, fault: str, names: str) -> None:
    import backend.store.atomic_dirs as ad  # the store writes its files through atomic_dirs.write_file
    import backend.store.tensor_store as ts

    if fault == "a file where tensors/ should be":
        (tmp_path / "tensors").write_text("not a folder")
        return
    faulty = FaultyOS(errno.EROFS, "create", names) if fault == "a read-only folder" else \
        FaultyOS(errno.ENOSPC, "write", names)  # a full disk
    monkeypatch.setattr(ts, "os", faulty)
    monkeypatch.setattr(ad, "os", faulty)


REASON = {"a file where tensors/ should be": "not a folder", "a read-only folder": "Read-only file system",
          "a full disk": "No space left on device"}
BEFORE = [(k, f) for k in ("ltv_train", "site", "ltv") for f in REASON]


@pytest.mark.parametrize("kind,fault", BEFORE, ids=[f"{k}, {f}" for k, f in BEFORE])
def test_4_a_folder_that_cannot_take_a_tensor_is_refused_before_training(svc, tmp_path, monkeypatch, kind, fault):
    from backend.analysis.kernel import analyze
    from backend.tasks.registry import load_task

    monkeypatch.setenv("HEADLENS_CACHE_DIR", str(tmp_path))
    _fault(monkeypatch, tmp_path, fault, ".probe-")
    with service(tmp_path, svc.pool) as (c, _):
        r = c.post("/jobs", json={"kind": kind, **BASE, **FIELDS[kind], "seed": 21})
        assert r.status_code == 507 and REASON[fault] in r.json()["detail"], r.text
        assert c.get("/jobs").json() == []  # no job, no training
    steps: list[str] = []  # the CLI's and a Ray worker's way in: the analysis itself refuses before training
    with pytest.raises(TensorWriteError, match="nothing was trained"):
        analyze(kind, svc.lm, load_task(TASK), {**FIELDS[kind], "seed": 21}, progress=lambda f, m="": steps.append(m))
    assert not [s for s in steps if "epoch" in s or "training" in s]


AFTER = [(k, f) for k in ("ltv_train", "site", "ltv") for f in ("a read-only folder", "a full disk")]


@pytest.mark.parametrize("kind,fault", AFTER, ids=[f"{k}, {f}" for k, f in AFTER])
def test_4_a_save_that_fails_after_training_returns_the_tensors_inline(svc, tmp_path, monkeypatch, kind, fault):
    monkeypatch.setenv("HEADLENS_CACHE_DIR", str(tmp_path))
    _fault(monkeypatch, tmp_path, fault, ".tmp-")
    with service(tmp_path, svc.pool) as (c, _):
        j = job(c, kind, seed=22)
        assert j["status"] == "done", j["error"]
        res = j["result"]
        tid = res["tensor"]
        assert [w for w in res["warnings"] if w.startswith(f"could not save tensor {tid} ({REASON[fault]})")]
        data = base64.b64decode(res["unsaved_tensors"][tid])
        assert inspect(data, "inline")[0] == tid  # the whole file, as it would have been saved
        assert os.listdir(tmp_path / "tensors") == []  # no partial file, no temporary one
        cached = c.post("/jobs/cached", json={"kind": kind, **BASE, **FIELDS[kind], "seed": 22})
        assert cached.status_code == 404  # not cached: the next request trains (and saves) again
        import backend.store.atomic_dirs as ad
        import backend.store.tensor_store as ts

        monkeypatch.setattr(ts, "os", os)  # the disk is back
        monkeypatch.setattr(ad, "os", os)
        up = c.post("/tensors", content=data)
        assert up.status_code == 200 and up.json()["id"] == tid
        loaded = job(c, "site" if kind == "site" else "ltv", load=tid)
        assert loaded["status"] == "done" and loaded["result"]["loaded" if kind == "site" else "tensor"]


def test_4_ray_the_service_keeps_what_it_could_not_write_inline(svc, tmp_path):
    """The Ray runner writes a worker's tensors; one it cannot write (or whose bytes do not match its id) comes back
    inline with a warning, and the results that refer to it are not written."""
    from backend.service.ray_runner import RayJobRunner

    good, bad = svc.store.get(svc.site), svc.store.get(svc.ltv)
    written: list = []

    class Full(TensorStore):
        def put(self, tid: str, data: bytes, *, upload: bool = False) -> None:
            if tid == svc.ltv:
                raise TensorWriteError("No space left on device")
            super().put(tid, data, upload=upload)

    stub = SimpleNamespace(tensors=Full(tmp_path / "tensors"), _write=written.extend)
    forged = "site-" + "1" * 32
    out = {"result": {"tensor": svc.ltv, "warnings": []}, "tensors": {svc.site: good, svc.ltv: bad, forged: good},
           "puts": [("a", {"tensor": svc.ltv}), ("b", {"tensor": svc.site}), ("c", {"tensor": forged})]}
    res = RayJobRunner._write_outputs(stub, out)
    assert [k for k, _ in written] == ["b"] and (tmp_path / "tensors" / f"{svc.site}.safetensors").is_file()
    assert set(res["unsaved_tensors"]) == {svc.ltv, forged} and base64.b64decode(res["unsaved_tensors"][svc.ltv]) == bad
    assert any(w.startswith(f"could not save tensor {svc.ltv} (No space left") for w in res["warnings"])


# == 7. no absolute server paths =====================================================================================
def _strings(v: Any) -> list[str]:
    if isinstance(v, dict):
        return [s for x in v.values() for s in _strings(x)] + [k for k in v if isinstance(k, str)]
    if isinstance(v, list):
        return [s for x in v for s in _strings(x)]
    return [v] if isinstance(v, str) else []


@pytest.mark.parametrize("what", ["ltv_train", "site", "ltv", "/capabilities", "/models"])
def test_7_no_absolute_server_path_in_an_answer(svc, what):
    if what.startswith("/"):
        answer = svc.c.get(what).json()
    elif what == "ltv":
        answer = result(svc.c, "ltv", load=svc.ltv)
    else:
        answer = svc.results[what]
    paths = [s for s in _strings(answer) if s.startswith("/") or str(svc.cache) in s or str(REPO) in s]
    assert paths == []
    if what == "/capabilities":
        assert answer["model_root"] is False and all("path" not in p for p in answer["presets"])


# == 8. Ray workers keep no files ====================================================================================
def test_8_a_workers_private_folder_goes_with_it(tmp_path, monkeypatch):
    """A worker's own folder (its lock files) is removed when it exits; those of this host's dead workers when the
    next one starts (Ray kills actors without running their exit handlers)."""
    import subprocess
    import tempfile

    from backend.service.ray_worker import private_folder

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / f"headlens-worker-{dead.pid}-abc").mkdir()
    (tmp_path / f"headlens-worker-{os.getpid()}-live").mkdir()
    mine = private_folder()
    left = sorted(p.name for p in tmp_path.iterdir())
    assert f"headlens-worker-{dead.pid}-abc" not in left and f"headlens-worker-{os.getpid()}-live" in left
    assert Path(mine).parent == tmp_path and Path(mine).is_dir()


# == the uploads' quota ==============================================================================================
def test_quota_removes_the_least_recently_used_upload_never_a_pinned_or_trained_one(svc, tmp_path):
    store = TensorStore(tmp_path / "tensors", quota_bytes=3 * len(svc.store.get(svc.site)))
    t, m = file_of(svc, "site")
    files = [encode(t, {**m, "task": f"t{i}"}) for i in range(5)]
    ids = [tensor_id("site", f) for f in files]
    store.put(ids[0], files[0])  # trained: never counted, never removed
    held = threading.Event()
    held.set()
    store.put(ids[1], files[1], upload=True)
    store.pin(ids[1], held.is_set)  # a queued job refers to it
    for tid, f in zip(ids[2:], files[2:]):
        time.sleep(0.01)
        store.put(tid, f, upload=True)
    assert [store.has(t) for t in ids] == [True, True, False, True, True]  # ids[2] went, the oldest unpinned
    held.clear()  # the job finished
    store.put(ids[2], files[2], upload=True)
    assert not store.has(ids[1]) and store.has(ids[0]) and store.has(ids[2])


def test_quota_pins_what_an_admitted_job_reads(svc):
    t, m = file_of(svc, "site")
    tid = svc.c.post("/tensors", content=encode(t, {**m, "task": "pinned"})).json()["id"]
    assert svc.c.app.state.tensor_store().pinned(tid) is False
    r = svc.c.post("/jobs", json={"kind": "site", **BASE, **SITE, "load": tid, "seed": 31})
    assert r.status_code == 202 and svc.c.app.state.tensor_store().pinned(tid)
    wait(svc.c, r.json()["id"])
