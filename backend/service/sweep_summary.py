"""Sweep summaries from the results of a sweep's jobs (`summarize`): one row per (model, task), means over seeds:
accuracy and zero-shot accuracy, the relative depth (layer / (layers - 1)) of the top TR and TL heads and their
overlap (Jaccard) with the top induction heads (from `scores`), the ICL accuracy at the most shots (`icl`), the
accuracy lost when the top heads of each order are ablated (`ablation_curves`); and per model, the same over tasks
plus the depth distribution of the top TR and TL heads (5 bins). Only result fields, no architecture knowledge.
`compact` keeps what the summary needs of one result."""
from __future__ import annotations

from typing import Any, Protocol

DEPTH_BINS = 5


class Cell(Protocol):
    """What the summary reads of one job of a sweep (`sweeps.Cell` is one)."""

    model: str | None
    task: str | None
    seed: int | None
    status: str
    summary: dict[str, Any] | None


def dedupe(items: list[Any]) -> list[Any]:
    return list(dict.fromkeys(items))


def _depths(heads: list[Any], n_layers: int) -> list[float]:
    return [float(l) / (n_layers - 1) if n_layers > 1 else 0.0 for l, _ in heads]


def compact(kind: str, r: dict[str, Any]) -> dict[str, Any]:
    """What the summary needs of one result (kept per job instead of the result)."""
    from ..analysis.kinds import KINDS

    kind = KINDS.resolve(kind) or kind  # a sweep recorded before the kinds were renamed
    try:
        if kind == "head_scores":
            L, ov = int(r["n_layers"]), r.get("overlap") or {}
            return {"accuracy": r["icl"]["accuracy"], "label_accuracy": r["icl"]["label_accuracy"],
                    "zero_shot_accuracy": (r.get("zero_shot") or {}).get("accuracy"),
                    "tr_depths": _depths(r["top_tr"], L), "tl_depths": _depths(r["top_tl"], L),
                    "tr_induction": (ov.get("tr_induction") or {}).get("jaccard"),
                    "tl_induction": (ov.get("tl_induction") or {}).get("jaccard"),
                    "tr_tl": (ov.get("tr_tl") or {}).get("jaccard"), "n_layers": L, "n_heads": int(r["n_heads"])}
        if kind == "icl_curve":
            acc = r["accuracy"]
            return {"icl_accuracy": acc[-1], "icl_gain": acc[-1] - acc[0], "icl_shots": r["shots"][-1]}
        if kind == "ablation_curves":
            return {f"ablation_drop_{order}": c["accuracy"][0] - c["accuracy"][-1]
                    for order, c in (r.get("curves") or {}).items() if c.get("accuracy")}
    except (KeyError, IndexError, TypeError, ValueError):
        return {}
    return {k: r[k] for k in ("accuracy", "label_accuracy") if isinstance(r.get(k), (int, float))}


SCALARS = ("accuracy", "zero_shot_accuracy", "tr_depth", "tl_depth", "tr_induction", "tl_induction", "tr_tl",
           "icl_accuracy", "icl_gain")


def _mean(xs: list[Any]) -> float | None:
    xs = [float(x) for x in xs if isinstance(x, (int, float))]
    return sum(xs) / len(xs) if xs else None


def _hist(depths: list[float]) -> list[float]:
    counts = [0] * DEPTH_BINS
    for d in depths:
        counts[min(int(d * DEPTH_BINS), DEPTH_BINS - 1)] += 1
    n = sum(counts)
    return [c / n for c in counts] if n else counts


def summarize(cells: list[Cell]) -> dict[str, Any]:
    """{"rows": one per (model, task), "models": one per model} from the finished jobs' compact results."""
    groups: dict[tuple[Any, Any], list[Cell]] = {}
    for c in cells:
        if c.status == "done" and c.summary is not None:
            groups.setdefault((c.model, c.task), []).append(c)
    rows, pooled = [], {}
    for (m, t), cs in groups.items():
        vals: dict[str, list[Any]] = {}
        for c in cs:
            s = dict(c.summary or {})
            for d in ("tr", "tl"):
                if f"{d}_depths" in s:
                    pooled.setdefault(m, {"tr": [], "tl": []})[d].extend(s[f"{d}_depths"])
                    s[f"{d}_depth"] = _mean(s.pop(f"{d}_depths"))
            for k, v in s.items():
                vals.setdefault(k, []).append(v)
        row: dict[str, Any] = {"model": m, "task": t, "jobs": len(cs),
                               "seeds": sorted({c.seed for c in cs if c.seed is not None})}
        for k, v in vals.items():
            if k in ("n_layers", "n_heads"):
                row[k] = v[0]
            elif all(isinstance(x, (int, float)) or x is None for x in v):
                row[k] = _mean(v)
        rows.append(row)
    models = []
    for m in dedupe([r["model"] for r in rows]):
        mine = [r for r in rows if r["model"] == m]
        entry: dict[str, Any] = {"model": m, "tasks": len(mine)}
        for k in dedupe([k for r in mine for k in r if k not in ("model", "task", "jobs", "seeds")]):
            entry[k] = (next((r[k] for r in mine if k in r), None) if k in ("n_layers", "n_heads")  # rows of
                        else _mean([r.get(k) for r in mine]))  # other kinds lack them (a sweep still running)
        depths = pooled.get(m)
        if depths:
            entry["tr_depth_hist"], entry["tl_depth_hist"] = _hist(depths["tr"]), _hist(depths["tl"])
        models.append(entry)
    return {"rows": rows, "models": models, "depth_bins": DEPTH_BINS}


def placement(cells: list[Any]) -> dict[str, Any]:
    """Where a sweep's jobs ran: jobs per node (by IP; `service` for a cached result the service answered, `local`
    for the service's own runner) and the retried jobs (each with the nodes its lost attempts ran on)."""
    hosts: dict[str, int] = {}
    retried = []
    for c in cells:
        r = c.ran_on or {}
        if c.status == "done":
            where = r.get("node_ip") or ("local" if r.get("runner") == "local" else "service" if c.cache_hit or
                                         c.served or not r else "?")
            hosts[where] = hosts.get(where, 0) + 1
        if r.get("lost"):
            retried.append({"job_id": c.job_id, "model": c.model, "task": c.task, "kind": c.kind, "seed": c.seed,
                            "lost_on": [x.get("node_ip") or "?" for x in r["lost"]], "ran_on": r.get("node_ip"),
                            "status": c.status})
    return {"hosts": hosts, "retried": retried}
