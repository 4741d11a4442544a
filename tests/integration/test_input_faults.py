"""Hardening against bad input, load and faults (GitHub issue 14): each test reproduces one probe.

1 no code from the cache, 2 damaged upload records, 3 deeply nested JSON, 4 model names too long for
the filesystem, 5 bounded request bodies and clipped echoes, 6 uploads released (memory LRU, disk
quota), 7 lock files cleaned up, 8 DELETE of a shared job, 9 unknown hub ids while offline.
"""
from __future__ import annotations

from plain_job import submit

import json
import os
import pickle
import socket
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from hang import HANG_S, returns, wait_until

REPO = Path(__file__).resolve().parents[2]
MARK = "headlens-pwned"


class Evil:
    """Unpickling this creates the file `path`: the payload of a planted pickle row."""

    def __init__(self, path: str, pad: int = 0):
        self.path, self.pad = path, pad

    def __reduce__(self):
        return (open, (self.path, "w"))


def _client(**kw):
    from starlette.testclient import TestClient

    from backend.service.app import create_app

    return TestClient(create_app(**kw))


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    for var in ("HEADLENS_TOKEN", "HEADLENS_MODEL_ROOT", "HEADLENS_ALLOW_HUB", "HEADLENS_MAX_BODY_KB",
                "HEADLENS_MAX_UPLOAD_MB", "HEADLENS_UPLOAD_QUOTA_MB", "HEADLENS_UPLOAD_CACHE", "HF_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)


# -- 1. no code from the cache ---------------------------------------------------------------------------
def _recompute(cache, key):
    """What the kernel does with an entry: use it (a hit), or compute and write it (a miss)."""
    calls = []
    value = cache.get(key)
    if value is None:
        calls.append(1)
        value = {"fresh": True}
        cache.put(key, value)
        return value, False, len(calls)
    return value, True, len(calls)


def test_cache_never_unpickles_a_planted_row(tmp_path):
    """A pickle-mode row written by a stock diskcache.Cache into the same folder: the payload must not run,
    the entry is dropped and recomputed."""
    import diskcache

    from backend.store.cache import ResultCache

    target = tmp_path / MARK
    folder = tmp_path / "cache"
    stock = diskcache.Cache(str(folder))
    stock.set("scores:planted", Evil(str(target)))  # small: a MODE_PICKLE row inside cache.db
    stock.close()
    with sqlite3.connect(folder / "cache.db") as con:
        assert con.execute("SELECT mode, filename FROM Cache WHERE key = 'scores:planted'").fetchone() == (4, None)
    cache = ResultCache(folder)
    assert cache.get("scores:planted") is None
    assert not target.exists()
    value, hit, calls = _recompute(cache, "scores:planted")
    assert value == {"fresh": True} and hit is False and calls == 1 and not target.exists()
    assert cache.get("scores:planted") == {"fresh": True}  # the recomputed entry reads back


def test_cache_never_unpickles_a_pickle_file_or_reads_value_files(tmp_path):
    """Large values live in files outside the db (MODE_PICKLE / MODE_BINARY files): refused, unopened,
    and their files removed; a planted row whose filename points outside the folder deletes nothing."""
    import diskcache

    from backend.store.cache import ResultCache

    target = tmp_path / MARK
    folder = tmp_path / "cache"
    outside = tmp_path / "precious.txt"
    outside.write_text("keep me")
    stock = diskcache.Cache(str(folder), disk_min_file_size=0)  # every value to a file
    stock.set("k:pickle-file", [Evil(str(target)), "x" * 100_000])
    stock.set("k:binary-file", json.dumps({"a": 1}).encode())
    stock.close()
    with sqlite3.connect(folder / "cache.db") as con:
        rows = dict(con.execute("SELECT key, mode FROM Cache").fetchall())
        files = [f for (f,) in con.execute("SELECT filename FROM Cache")]
        assert rows == {"k:pickle-file": 4, "k:binary-file": 2} and all(files)
    cache = ResultCache(folder)
    for key in ("k:pickle-file", "k:binary-file"):
        assert cache.get(key) is None
    assert not target.exists()
    assert not any((folder / f).exists() for f in files)  # the value files went with their rows
    # values written now stay in the database, whatever their size (no value files to plant)
    cache.put("k:big", {"x": "y" * 200_000})
    assert cache.get("k:big")["x"] == "y" * 200_000
    assert sorted(p.name for p in folder.iterdir()) <= ["cache.db", "cache.db-shm", "cache.db-wal"]
    # a row edited by hand: pickle bytes in MODE_PICKLE, and a value file "outside" the cache folder
    cache.put("k:edited", {"ok": 1})
    cache.put("k:escape", {"ok": 2})
    cache.close()
    with sqlite3.connect(folder / "cache.db") as con:
        con.execute("UPDATE Cache SET mode = 4, value = ? WHERE key = 'k:edited'",
                    (pickle.dumps(Evil(str(target))),))
        con.execute("UPDATE Cache SET mode = 2, value = NULL, filename = '../precious.txt' WHERE key = 'k:escape'")
        con.execute("INSERT OR REPLACE INTO Settings VALUES ('sqlite_foo', 'bar')")
    cache = ResultCache(folder)
    assert cache.get("k:edited") is None and cache.get("k:escape") is None
    assert not target.exists() and outside.read_text() == "keep me"
    assert _recompute(cache, "k:edited")[2] == 1


def test_cache_refuses_to_store_anything_but_raw_values(tmp_path):
    from backend.store.cache import ResultCache

    cache = ResultCache(tmp_path)
    with pytest.raises(TypeError):
        cache.dc.set("k", {"a": "dict would be pickled"})
    cache.dc.set("k", 12345)  # a raw number: stored, but not a JSON object -> dropped on read
    assert cache.get("k") is None and cache.dc.get("k") is None


# -- 2. damaged upload records -------------------------------------------------------------------------
TEXT = "input,output\n" + "".join(f"w{i},{'pos' if i % 2 else 'neg'}\n" for i in range(20))


@pytest.mark.parametrize("damage", ["truncated", "wrong-keys", "wrong-types", "not-an-object", "edited", "binary"])
def test_damaged_upload_record_is_a_clear_4xx(tmp_path, damage, caplog):
    from backend.service.errors import BadRequest, NotFound
    from backend.service.task_store import TaskStore

    task_id, _ = TaskStore(tmp_path).add("mine.csv", TEXT.encode())
    record = tmp_path / f"{task_id.split(':')[1]}.json"
    good = json.loads(record.read_text())
    record.write_bytes({
        "truncated": record.read_bytes()[:40],
        "wrong-keys": b'{"nope": 1}',
        "wrong-types": json.dumps({"filename": 3, "content": ["x"], "kind": None}).encode(),
        "not-an-object": b"[1, 2]",
        "edited": json.dumps({**good, "content": good["content"] + "w99,pos\n"}).encode(),
        "binary": b"\xff\xfe\x00garbage",
    }[damage])
    fresh = TaskStore(tmp_path)  # a restarted service: nothing in memory
    with pytest.raises(BadRequest) as e:
        fresh.get(task_id)
    assert e.value.status == 422 and e.value.message == f"upload {task_id} is damaged; upload it again"
    assert "damaged" in caplog.text
    with pytest.raises(NotFound, match="upload the file again"):  # the damaged record is gone
        fresh.get(task_id)
    assert fresh.add("mine.csv", TEXT.encode())[0] == task_id  # uploading again repairs it
    assert TaskStore(tmp_path).get(task_id).name == "mine"


def test_upload_record_on_a_full_disk_leaves_no_file(tmp_path, monkeypatch):
    """An upload whose record cannot be written (a full disk) lives in memory; no partial or temporary file stays."""
    import errno

    import backend.store.atomic_dirs as ad
    from backend.service.task_store import TaskStore

    real_write = os.write

    def full(fd, data):
        real_write(fd, bytes(data)[:5])  # a few bytes land, then the disk is full
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(ad.os, "write", full)
    store = TaskStore(tmp_path)
    task_id, task = store.add("mine.csv", TEXT.encode())
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []
    assert store.get(task_id).name == task.name == "mine"


def test_damaged_upload_record_through_the_service(shared_cache, monkeypatch):
    monkeypatch.setenv("HEADLENS_CACHE_DIR", str(shared_cache))
    with _client() as c:
        up = c.post("/tasks/upload", json={"filename": "mine.csv", "content": TEXT}).json()
    (shared_cache / "uploads" / f"{up['id'].split(':')[1]}.json").write_text('{"filename": "mine.csv", "cont')
    with _client() as c:
        r = c.post("/jobs", json={"kind": "scores", "task": up["id"]})
        assert r.status_code == 422, r.text
        assert r.json()["detail"] == f"upload {up['id']} is damaged; upload it again"
        assert c.post("/jobs", json={"kind": "scores", "task": up["id"]}).status_code == 404


# -- 3. deeply nested JSON ----------------------------------------------------------------------------------
DEEP = "[" * 100_000 + "]" * 100_000
REC = '{"input": "a", "output": "b"}'


@pytest.mark.parametrize("name,text,where", [
    ("deep.json", DEEP, "record 1 (line 1)"),
    ("deep.json", f"[{REC},\n{REC[:-1]}, \"x\": {DEEP}}}]", "record 2 (line 2)"),
    ("deep.json", f'{{"examples": [{REC}, {DEEP}]}}', "record 2"),
    ("deep.json", "[" * 70 + "]" * 70, "record 1"),  # under the recursion limit, over MAX_DEPTH
    ("deep.jsonl", f"{REC}\n\n{DEEP}\n", "record 2 (line 3)"),
])
def test_deeply_nested_json_is_a_task_error(tmp_path, name, text, where):
    from backend.tasks.base import TaskError
    from backend.tasks.files import load_prompts_file, load_task_file, parse_task_text

    with pytest.raises(TaskError, match="nested too deeply") as e:
        parse_task_text(text, name)
    assert f"{name}: {where}" in str(e.value)
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(TaskError, match=f"{name}: .*nested too deeply"):
        load_task_file(path)
    prompts = tmp_path / f"prompts{path.suffix}"  # bring-your-own prompts files: the same guard
    prompts.write_text(DEEP)
    with pytest.raises(TaskError, match=f"prompts{path.suffix}: record 1 .*nested too deeply"):
        load_prompts_file(prompts)


def test_nesting_within_the_limit_still_parses():
    from backend.tasks.files import parse_task_text

    task = parse_task_text(json.dumps([{"input": "a", "output": "b", "meta": [[[[1]]]]}, {"input": "c", "output": "d"}]),
                           "ok.json")
    assert task.examples == [("a", "b"), ("c", "d")]


def test_deeply_nested_upload_is_a_4xx():
    with _client() as c:
        r = c.post("/tasks/upload", files={"file": ("deep.json", DEEP.encode())})
        assert r.status_code == 422 and "deep.json: record 1" in r.json()["detail"], r.text
        assert "nested too deeply" in r.json()["detail"]
        r = c.post("/tasks/upload", json={"filename": "deep.jsonl", "content": f"{REC}\n{DEEP}"})
        assert r.status_code == 422 and "deep.jsonl: record 2 (line 2): nested too deeply" in r.json()["detail"]
        r = c.post("/jobs", content=DEEP[:100_000].encode() + b"]" * 10, headers={"content-type": "application/json"})
        assert 400 <= r.status_code < 500


# -- 4. model names too long for the filesystem -------------------------------------------------------
@pytest.mark.parametrize("name", ["a" * 100_000, "org/" + "b" * 300, "/tmp/" + "c" * 256 + "/model",
                                  "~nosuchuser" + "x" * 20 + "/m", "bad\x00name"])
def test_model_names_the_filesystem_refuses_are_a_422(name):
    from backend.model.loading import ModelLoadError, resolve_name
    from backend.service.errors import BadRequest
    from backend.service.model_pool import ModelPool

    with pytest.raises(BadRequest) as e:
        ModelPool(allow_hub=True).check(name)
    assert e.value.status == 422 and e.value.message.startswith("model:")
    assert len(e.value.message) < 400
    if "\x00" not in name and "~" not in name:
        with pytest.raises(ModelLoadError, match="^model:") as e2:
            resolve_name(name)
        assert len(str(e2.value)) < 400


def test_one_name_rule_for_every_floor():
    """The model-name rule is written once (backend.text) and used by the loader and the service alike."""
    from backend import text
    from backend.model import loading as models
    from backend.service import model_pool

    assert models.model_name_problem is text.model_name_problem is model_pool.model_name_problem
    names = ["default", "org/m", "a" * 1024, "a" * 1025, "org/" + "b" * 255, "org/" + "b" * 256, "é" * 128,
             "é" * 127 + "/x", "x\\" + "y" * 256, "bad\x00name", "tab\tname", "/tmp/" + "c" * 300]
    verdicts = [text.model_name_problem(n) for n in names]
    assert [v is None for v in verdicts] == [True, True, False, False, True, False, False, True, False, False, False,
                                             False]
    assert all(len(v) < 400 for v in verdicts if v)


def test_long_model_names_through_the_service():
    with _client() as c:
        for name in ("org/" + "b" * 300, "x" * 5000):
            r = c.post("/jobs", json={"kind": "model_info", "model": name})
            assert r.status_code == 422, r.text
            assert "model" in r.json()["detail"] and len(r.text) < 600


# -- 5. bounded bodies, clipped echoes -----------------------------------------------------------------------
def test_oversized_bodies_are_413_before_reading():
    with _client() as c:
        r = c.post("/jobs", content=b'{"kind": "scores", "task": "' + b"x" * (300 << 10) + b'"}',
                   headers={"content-type": "application/json"})
        assert r.status_code == 413 and "HEADLENS_MAX_BODY_KB" in r.json()["detail"] and len(r.text) < 300

        sent = []

        def chunks():  # no Content-Length: counted as it arrives
            for _ in range(1000):
                sent.append(1)
                yield b"x" * 10_000

        r = c.post("/jobs", content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413 and "HEADLENS_MAX_BODY_KB" in r.json()["detail"]
        r = c.post("/tasks/upload", files={"file": ("big.jsonl", b'{"input": "a", "output": "b"}\n' * 400_000)})
        assert r.status_code == 413 and "HEADLENS_MAX_UPLOAD_MB" in r.json()["detail"]
        # small bodies still pass, and a 1 MB upload (over the JSON limit) still goes to its own route
        assert c.post("/jobs", json={"kind": "nope"}).status_code == 422
        lines = "".join(f'{{"input": "word{i}", "output": "{i % 3}"}}\n' for i in range(30_000))
        assert len(lines) > 1 << 20
        r = c.post("/tasks/upload", files={"file": ("ok.jsonl", lines.encode())})
        assert r.status_code == 200, r.text


def test_body_limit_from_the_environment(monkeypatch):
    monkeypatch.setenv("HEADLENS_MAX_BODY_KB", "1")
    with _client() as c:
        r = c.post("/jobs", json={"kind": "scores", "task": "t" * 2000})
        assert r.status_code == 413 and "limit of 1 KB" in r.json()["detail"]
        assert c.get("/capabilities").json()["limits"]["max_body_bytes"] == 1024


@pytest.mark.parametrize("body", [
    {"kind": "k" * 100_000},
    {"kind": "scores", "task": "t" * 100_000},
    {"kind": "scores", "task": "t" * 1000},
    {"kind": "scores", "task": "sentiment", "model": "m" * 1000},
    {"kind": "scores", "task": "sentiment", "f" * 100_000: 1},
    {"kind": "scores", "task": "sentiment", "shots": "s" * 100_000},
])
def test_errors_echo_at_most_200_characters_of_input(body):
    with _client() as c:
        r = c.post("/jobs", json=body)
        assert 400 <= r.status_code < 500, r.text[:300]
        detail = r.json()["detail"]
        assert len(detail) < 1300
        for ch in "ktmfs":
            assert ch * 201 not in detail, detail
        r = c.get("/jobs/" + "j" * 5000)
        assert r.status_code == 404 and "j" * 201 not in r.text


def test_clip():
    from backend.service.errors import clip

    assert clip("abc") == "abc" and clip("x" * 300).startswith("x" * 200 + "...")
    assert len(clip("x" * 10**6)) < 240 and clip(12, 1) == "1...[1 more characters]"


# -- 6. uploads are released ------------------------------------------------------------------------------------
def _task_text(i: int, n: int = 200) -> bytes:
    return ("input,output\n" + "".join(f"u{i}-{j},{'pos' if j % 2 else 'neg'}\n" for j in range(n))).encode()


def test_uploads_memory_lru_and_disk_quota(tmp_path):
    from backend.service.errors import NotFound
    from backend.service.task_store import TaskStore

    size = len(_task_text(0))
    store = TaskStore(tmp_path, memory_items=3, quota_bytes=int(4.5 * (size + 100)))
    ids = []
    for i in range(10):
        ids.append(store.add(f"t{i}.csv", _task_text(i))[0])
        time.sleep(0.01)  # distinct mtimes
    assert len(store._uploads) == 3 and list(store._uploads) == ids[-3:]  # memory: the 3 latest
    on_disk = sorted(tmp_path.glob("*.json"))
    assert len(on_disk) == 4 and sum(p.stat().st_size for p in on_disk) <= store.quota_bytes
    # evicted from memory, still on disk: re-read on demand
    assert store.get(ids[6]).name == "t6" and ids[6] in store._uploads and len(store._uploads) == 3
    # evicted from disk: a clear 404
    with pytest.raises(NotFound, match="upload the file again") as e:
        store.get(ids[0])
    assert e.value.status == 404
    # a read is a use: the record read last survives the next evictions
    store.add("t10.csv", _task_text(10))
    store.add("t11.csv", _task_text(11))
    assert (tmp_path / f"{ids[6].split(':')[1]}.json").exists()
    assert not (tmp_path / f"{ids[7].split(':')[1]}.json").exists()


def test_uploads_byte_budget_in_memory(tmp_path):
    from backend.service.task_store import TaskStore

    store = TaskStore(tmp_path, memory_items=100, quota_bytes=1 << 30, memory_bytes=3 * len(_task_text(0)))
    for i in range(8):
        store.add(f"t{i}.csv", _task_text(i))
    assert len(store._uploads) == 3


def test_upload_quota_from_the_environment(monkeypatch, tmp_path):
    from backend.service.task_store import TaskStore

    monkeypatch.setenv("HEADLENS_UPLOAD_QUOTA_MB", "0.01")
    monkeypatch.setenv("HEADLENS_UPLOAD_CACHE", "2")
    store = TaskStore(tmp_path)
    assert store.quota_bytes == int(0.01 * 2**20) and store.memory_items == 2
    for i in range(10):
        store.add(f"t{i}.csv", _task_text(i))
    assert sum(p.stat().st_size for p in tmp_path.glob("*.json")) <= 0.01 * 2**20


# -- 7. lock files ---------------------------------------------------------------------------------------------
def test_lock_files_do_not_pile_up(tmp_path):
    from backend.store.locks import KeyLocks

    locks = KeyLocks(tmp_path)
    for i in range(300):
        with locks.hold(f"key-{i}"):
            assert locks.path(f"key-{i}").exists()
    assert list(tmp_path.iterdir()) == []
    # threads on one key: still exclusive, and nothing left behind
    inside, worst = [0], [0]

    def work() -> None:
        for _ in range(20):
            with locks.hold("shared"):
                inside[0] += 1
                worst[0] = max(worst[0], inside[0])
                time.sleep(0.001)
                inside[0] -= 1

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert worst[0] == 1 and list(tmp_path.iterdir()) == []


def test_stale_lock_files_are_pruned(tmp_path):
    from backend.store.locks import KeyLocks

    for i in range(5):  # left by processes killed while holding a lock
        (tmp_path / f"{i:032x}.lock").touch()
    with KeyLocks(tmp_path).hold("k"):
        pass
    assert list(tmp_path.iterdir()) == []


_WORKER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {repo!r})
    from backend.store.locks import KeyLocks
    locks, counter = KeyLocks({folder!r}, poll=0.001), {counter!r}
    for _ in range({n}):
        with locks.hold("one-key"):
            v = int(open(counter).read())   # read, pause, write: lost updates if two processes overlap
            time.sleep(0.002)
            open(counter, "w").write(str(v + 1))
""")


def test_processes_on_one_key_still_serialize(tmp_path):
    """The flock/unlink race: with files unlinked on release, 4 processes x 40 rounds of an unprotected
    read-modify-write on one key must lose no update."""
    folder, counter = tmp_path / "locks", tmp_path / "counter"
    counter.write_text("0")
    code = _WORKER.format(repo=str(REPO), folder=str(folder), counter=str(counter), n=40)
    procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(4)]
    assert all(p.wait(HANG_S) == 0 for p in procs)
    assert int(counter.read_text()) == 160
    assert list(folder.iterdir()) == []


# -- 8. DELETE of a shared job --------------------------------------------------------------------------------
def _runner():
    from backend.service.jobs import LocalJobRunner
    from backend.service.limits import Limits

    started = threading.Event()

    def execute(job, progress):
        kind, params = job.kind, job.params
        started.set()
        for i in range(2000):
            progress(i / 2000, "working")
            time.sleep(0.005)
        return {"n": params["n"]}

    return LocalJobRunner(execute, limits=Limits()), started


def _until(runner, jid, states):
    return wait_until(lambda: (j := runner.get(jid)).status in states and j, f"job {jid} reaching {states}",
                      poll_s=0.01)


def test_delete_cancels_a_shared_job_only_when_the_last_submitter_withdraws():
    runner, started = _runner()
    try:
        a = submit(runner, "count", {"n": 1}, "key-1")  # client A
        b = submit(runner, "count", {"n": 1}, "key-1")  # client B: the same job (deduplicated)
        queued = submit(runner, "count", {"n": 2}, "key-2")
        queued_too = submit(runner, "count", {"n": 2}, "key-2")
        assert a.id == b.id and queued.id == queued_too.id
        assert started.wait(HANG_S)
        r = runner.cancel(b.id)  # B withdraws: A's job keeps running
        assert r.status == "running" and r.message.startswith("withdrawn: 1 other submitter still waits")
        time.sleep(0.1)
        assert runner.get(a.id).status == "running"
        r = runner.cancel(queued.id)
        assert r.status == "queued" and "withdrawn" in r.message
        assert runner.cancel(queued.id).status == "cancelled"  # the last submitter of the queued job
        assert runner.cancel(a.id).status in ("running", "cancelled")  # A withdraws too: now it ends
        assert _until(runner, a.id, ("cancelled",)).status == "cancelled"
        assert runner.cancel(a.id).status == "cancelled"  # more DELETEs change nothing
        # after a cancel, the same request starts a new job with one submitter
        c = submit(runner, "count", {"n": 1}, "key-1")
        assert c.id != a.id and runner.cancel(c.id).status in ("queued", "running", "cancelled")
        assert _until(runner, c.id, ("cancelled",)).status == "cancelled"
    finally:
        runner.close()


def test_a_finished_job_is_not_counted_or_cancelled():
    from backend.service.jobs import LocalJobRunner
    from backend.service.limits import Limits

    runner = LocalJobRunner(lambda job, progress: {"ok": True}, limits=Limits())
    try:
        j = submit(runner, "quick", {}, "key-q")
        assert _until(runner, j.id, ("done",)).status == "done"
        again = submit(runner, "quick", {}, "key-q")
        assert again.id == j.id and again.status == "done"
        assert runner.cancel(j.id).status == "done" and runner.get(j.id).result == {"ok": True}
    finally:
        runner.close()


# -- 9. unknown hub ids while offline --------------------------------------------------------------------------
def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("how", ["flag", "unreachable"])
def test_unknown_hub_id_offline_fails_at_once(monkeypatch, how):
    from backend.model import loading as models
    from backend.model.loading import ModelLoadError, load_model

    models._hub_probe.clear()
    if how == "flag":
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    else:
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    with pytest.raises(ModelLoadError, match="is not cached locally and the Hugging Face hub is unreachable"):
        returns(lambda: load_model("nobody-knows/made-up-model-7f3a"), "loading an unknown id offline")
    models._hub_probe.clear()


def test_hub_probe_gives_up_on_a_silent_endpoint(monkeypatch):
    """An endpoint that accepts the connection and never answers (a listening socket nobody serves): the
    probe gives up (after ~1.5 s, HUB_PROBE_TIMEOUT) and says unreachable, and the answer is reused without a new
    request; one that answers, even 404, is reachable."""
    import http.server
    import urllib.request

    from backend.model import loading as models

    models._hub_probe.clear()
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{silent.getsockname()[1]}")
        assert returns(models.hub_reachable, "the hub probe of a silent endpoint") is False
        with monkeypatch.context() as m:
            asked: list = []
            m.setattr(urllib.request, "urlopen", lambda *a, **k: asked.append(a))
            assert models.hub_reachable() is False and asked == []  # cached: not asked again
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)  # answers 501
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_port}")
        assert models.hub_reachable() is True
    finally:
        server.shutdown()
        server.server_close()
        models._hub_probe.clear()


def test_a_cached_hub_id_still_loads_offline(tmp_path):
    """An id in the local Hugging Face cache loads with the hub off (flag) or unreachable (probe)."""
    from backend.store.paths import DEFAULT_MODEL_DIR

    if not DEFAULT_MODEL_DIR.is_dir():
        pytest.skip("the embedded default model is absent")
    rev = "0" * 40
    snap = tmp_path / "hub" / "models--someorg--tiny" / "snapshots" / rev
    snap.mkdir(parents=True)
    for f in DEFAULT_MODEL_DIR.iterdir():
        if f.is_file():
            (snap / f.name).symlink_to(f)
    (tmp_path / "hub" / "models--someorg--tiny" / "refs").mkdir()
    (tmp_path / "hub" / "models--someorg--tiny" / "refs" / "main").write_text(rev)
    code = "from backend.model.loading import load_model; print(load_model('someorg/tiny').n_layers)"
    base = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_ENDPOINT")}
    for extra in ({"HF_HUB_OFFLINE": "1"}, {"HF_ENDPOINT": f"http://127.0.0.1:{_closed_port()}"}):
        env = {**base, "HF_HUB_CACHE": str(tmp_path / "hub"), **extra}
        out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                             timeout=HANG_S)
        assert out.returncode == 0, out.stderr[-2000:]
        assert int(out.stdout.split()[-1]) > 0


# -- bounded work (issue 14): an estimate per kind, refused over HEADLENS_MAX_WORK; a per-job time limit --------
def test_work_estimates_refuse_huge_jobs(monkeypatch):
    from backend.analysis.tsla.ablation import AblationCurvesParams
    from backend.service.limits import Limits

    from backend.analysis.kinds import get_kind
    from backend.service.timing import estimate
    from backend.tasks.registry import load_task

    probe = AblationCurvesParams(prompts=500, ks=list(range(33)), random_seeds=list(range(16)))
    e = estimate(get_kind("ablation_curves"), probe, "default", load_task("syn-sentiment"))[0]
    assert "19 rankings x 32 values of k" in e.how and e.passes > 2000  # the task has 20 queries: 20 prompts
    monkeypatch.setenv("HEADLENS_MAX_WORK", "2000")
    with _client() as c:
        r = c.post("/jobs", json={"kind": "ablation_curves", "task": "syn-sentiment", "prompts": 500,
                                  "ks": list(range(33)), "random_seeds": list(range(16))})
        assert r.status_code == 422 and "HEADLENS_MAX_WORK" in r.json()["detail"], r.text
        assert f"{e.passes:,.0f} prompt passes" in r.json()["detail"]
    monkeypatch.setenv("HEADLENS_MAX_WORK", "10")
    small = estimate(get_kind("ablation_curves"), AblationCurvesParams(prompts=5), "default",
                     load_task("syn-sentiment"))[0]
    with pytest.raises(Exception, match="over this server's limit of 10"):
        Limits.from_env().check_work(small)
    for bad, why in (("lots", "must be a number, not .lots."), ("nan", "must be at least 1"), ("0", "must be at least 1")):
        monkeypatch.setenv("HEADLENS_MAX_WORK", bad)  # a bad setting names its variable, never a bare int() error
        with pytest.raises(ValueError, match=f"HEADLENS_MAX_WORK {why}"):
            Limits.from_env()


def test_sweep_settings_are_limits_checked_at_start_up(monkeypatch):
    """HEADLENS_MAX_SWEEP_JOBS and HEADLENS_SWEEP_WINDOW are read with the other limits: a bad value fails
    Limits.from_env() (start-up), naming the variable, instead of every POST /sweeps."""
    from backend.service.limits import Limits
    from backend.service.sweeps import SweepManager

    for var in ("HEADLENS_MAX_SWEEP_JOBS", "HEADLENS_SWEEP_WINDOW", "HEADLENS_MAX_QUEUE"):
        monkeypatch.delenv(var, raising=False)
    d = Limits.from_env()
    assert d.max_sweep_jobs == 10000 and d.sweep_window is None
    assert d.to_json()["max_sweep_jobs"] == 10000 and d.to_json()["sweep_window"] is None
    assert SweepManager(object(), d).window == 32  # max(32, 2 x 1 worker), under half of 64
    monkeypatch.setenv("HEADLENS_MAX_SWEEP_JOBS", "7")
    monkeypatch.setenv("HEADLENS_SWEEP_WINDOW", "5")
    lim = Limits.from_env()
    assert lim.max_sweep_jobs == 7 and lim.sweep_window == 5 and SweepManager(object(), lim).window == 5
    for var in ("HEADLENS_MAX_SWEEP_JOBS", "HEADLENS_SWEEP_WINDOW"):
        for bad, why in (("lots", "must be a number, not .lots."), ("nan", "must be at least 1"),
                         ("0", "must be at least 1")):
            monkeypatch.setenv(var, bad)
            with pytest.raises(ValueError, match=f"{var} {why}"):
                Limits.from_env()
        monkeypatch.setenv(var, "3")


def test_a_job_past_the_time_limit_fails_clearly(monkeypatch):
    from backend.analysis.kinds import Kind, register, unregister
    from backend.analysis.params import Params
    from backend.analysis.results import Result

    class SlowParams(Params):
        steps: int = 50

    register(Kind("slow", SlowParams, Result, "test_input_faults:_slow", "sleeps", api="slow", uses_task=False,
                  uses_model=False, cached=False), replace=True)
    monkeypatch.setenv("HEADLENS_JOB_TIMEOUT_S", "1")
    try:
        with _client() as c:
            jid = c.post("/jobs", json={"kind": "slow"}).json()["id"]
            j = wait_until(lambda: (j := c.get(f"/jobs/{jid}").json())["status"] not in ("queued", "running") and j,
                           "the job stopping at its time limit")
        assert j["status"] == "error" and "HEADLENS_JOB_TIMEOUT_S" in j["error"], j
    finally:
        unregister("slow")


def _slow(ctx, p):
    import time as _time

    for i in range(p.steps):
        ctx.progress(i / p.steps, "sleeping")
        _time.sleep(0.1)
    return {}
