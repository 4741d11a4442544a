"""One path through the house (issue 32, item 1): a head toggle is one HTTP call (POST /jobs), one admission, one
validation of its params, one cost plan, one cache key, one lock and one intervention block; a cached result is
answered by the same call, with no job run. Counted by wrapping the functions, as the review counted them (before
this: 3 round trips, 3 admissions, 5 validations, 4 plans, 2 keys, 2 locks for 1 intervention block)."""
from __future__ import annotations

import sys
from collections import Counter

import pytest
from starlette.testclient import TestClient

from hang import wait_until

COMMON = {"model": "default", "task": "syn-antonym", "shots": 2, "prompts": 6}
TOGGLE = {"kind": "ablate", **COMMON, "heads": [[0, 0]], "positions": "last", "start": "if_short"}


def _count(monkeypatch, counts: Counter) -> None:
    """Wrap what a job goes through: admission, the params' validation and plan, the cache key, the kernel's lock,
    the intervention blocks (in every module that imported `intervene`)."""
    from backend.analysis import kernel
    from backend.analysis.tsla.ablation import AblateParams
    from backend.model import interventions
    from backend.service import admit, app

    def wrap(owner, name, label):
        real = getattr(owner, name)

        def counted(*a, **k):
            counts[label] += 1
            return real(*a, **k)
        monkeypatch.setattr(owner, name, counted)

    wrap(app, "admit", "admissions")
    wrap(kernel, "cache_key", "keys")
    wrap(admit, "cache_key", "keys") if hasattr(admit, "cache_key") else None
    real_validate, real_work = AblateParams.model_validate.__func__, AblateParams.work
    monkeypatch.setattr(AblateParams, "model_validate",
                        classmethod(lambda cls, *a, **k: counts.update(["validations"]) or real_validate(cls, *a, **k)))
    monkeypatch.setattr(AblateParams, "work", lambda self, *a: counts.update(["plans"]) or real_work(self, *a))
    real_hold = kernel.LOCKS.hold
    monkeypatch.setattr(kernel.LOCKS, "hold", lambda *a, **k: counts.update(["locks"]) or real_hold(*a, **k))
    real_intervene = interventions.intervene
    for mod in list(sys.modules.values()):
        if getattr(mod, "intervene", None) is real_intervene and mod.__name__.startswith("backend."):
            wrap(mod, "intervene", "intervention blocks")


def test_a_toggle_is_one_admission_validation_plan_key_lock_and_intervention_block(monkeypatch):
    from backend.analysis.primitives.prefix_store import STORE
    from backend.service.app import create_app

    STORE.clear()
    with TestClient(create_app()) as c:
        for body in ({"kind": "head_scores", **COMMON}, {**TOGGLE, "heads": [[1, 1]]}):  # the Head map (the prefix
            first = c.post("/jobs", json=body).json()  # is kept) and a first toggle (the threads are probed once)
            wait_until(lambda: c.get(f"/jobs/{first['id']}").json()["status"] == "done", body["kind"])
        counts: Counter = Counter()
        _count(monkeypatch, counts)
        job = c.post("/jobs", json=TOGGLE).json()
        counts["http calls"] += 1
        done = wait_until(lambda: (j := c.get(f"/jobs/{job['id']}").json())["status"] not in ("queued", "running")
                          and j, "the toggle")
        assert done["status"] == "done" and done["lane"] == "live", done
        assert dict(counts) == {"http calls": 1, "admissions": 1, "validations": 1, "plans": 1, "keys": 1,
                                "locks": 1, "intervention blocks": 1}, counts

        counts.clear()
        again = c.post("/jobs", json=TOGGLE).json()  # the same toggle again: its result, from the same call
        assert again["status"] == "done" and again["result"]["after"] == done["result"]["after"]
        assert counts["intervention blocks"] == 0 and counts["locks"] == 0 and counts["admissions"] == 1
    STORE.clear()


def test_a_long_job_asked_if_short_is_held_with_its_estimate_and_never_runs(monkeypatch):
    from backend.service import jobs as J
    from backend.service.app import create_app

    monkeypatch.setattr(J, "HOLD_OVER_S", 0.0)
    body = {"kind": "icl_curve", **COMMON, "shots": [0, 2]}
    with TestClient(create_app()) as c:
        held = c.post("/jobs", json={**body, "start": "if_short"}).json()
        assert held["status"] == "held" and held["estimate"]["seconds"] > 0 and "text" in held["estimate"]
        assert c.get("/jobs").json() == []  # no job was made
        ran = c.post("/jobs", json={**body, "start": "always"}).json()
        assert ran["status"] in ("queued", "running", "done") and ran["estimate"]["seconds"] == held["estimate"]["seconds"]
