"""A sweep's `placement` (backend/service/sweep_summary.py): jobs per host and the retried jobs, from the jobs'
`ran_on` records (the Ray runner's)."""
from __future__ import annotations

from types import SimpleNamespace

from backend.service.sweep_summary import placement


def cell(status, ran_on=None, cache_hit=None, served=False, job_id="j"):
    return SimpleNamespace(model="m", task="t", kind="head_scores", seed=0, job_id=job_id, status=status,
                           ran_on=ran_on, cache_hit=cache_hit, served=served)


def test_jobs_per_host_and_what_was_retried():
    a, b = {"node_ip": "10.0.0.11"}, {"node_ip": "10.0.0.12"}
    cells = [cell("done", {"runner": "ray", **a, "lost": []}, job_id="1"),
             cell("done", {"runner": "ray", **b, "lost": [a]}, job_id="2"),
             cell("done", None, cache_hit=True, job_id="3"),
             cell("done", {"runner": "local", "lost": []}, job_id="4"),
             cell("error", {"runner": "ray", "lost": [a, b]}, job_id="5"),
             cell("running", {"runner": "ray", **a, "lost": []}, job_id="6")]
    p = placement(cells)
    assert p["hosts"] == {"10.0.0.11": 1, "10.0.0.12": 1, "service": 1, "local": 1}  # finished jobs only
    assert [(r["job_id"], r["lost_on"], r["ran_on"], r["status"]) for r in p["retried"]] == [
        ("2", ["10.0.0.11"], "10.0.0.12", "done"), ("5", ["10.0.0.11", "10.0.0.12"], None, "error")]
