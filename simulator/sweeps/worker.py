"""Run one sweep point: resolve and simulate (or screen) an experiment document into a result dict (never raises)."""

from __future__ import annotations

import gc
import json
import time
from collections.abc import Mapping
from typing import Any

from topologies import build_cluster
from topologies.cluster import Cluster

from ..experiment import OutOfMemoryError, experiment_from_dict, run_experiment, without_force
from .columns import CAPACITY_COLUMNS, FIDELITY_COLUMN, METRIC_COLUMNS, SCREEN
from .errors import failed_reason, one_line
from .points import topology_digest

__all__ = ["run_point", "point_fidelity"]

_CLUSTERS: dict[str, Cluster] = {}
_MAX_CLUSTERS = 16
"""Clusters built by screened points of this process, per ``cluster:`` section: building a 1,024-GPU fabric
costs about as much as screening a layout, and a layout sweep screens many layouts on one cluster."""


def point_fidelity(doc: Mapping) -> str:
    """The fidelity a point document runs at: its ``fidelity`` field, default ``fast``."""
    value = doc.get("fidelity")
    return "fast" if value is None else str(value)


def _screen_experiment(doc: Mapping):
    """Resolve a ``fidelity: screen`` document (the field removed) on a cluster built once per process."""
    doc = {k: v for k, v in doc.items() if k != "fidelity"}
    section = doc.get("cluster")
    # (and the bytes of the topology file it names: a file edited since the last screen in this process, a
    # notebook's, builds a new cluster, as the point's key says it is a new point)
    key = json.dumps([section, topology_digest(doc, {})], sort_keys=True, default=str)
    cluster = _CLUSTERS.get(key)
    if cluster is None and section:
        cluster = build_cluster(section)  # (a string is PRESET or PRESET:NODES, as in an experiment file)
        if len(_CLUSTERS) >= _MAX_CLUSTERS:
            _CLUSTERS.pop(next(iter(_CLUSTERS)))
        _CLUSTERS[key] = cluster
    if cluster is None:
        return experiment_from_dict(doc)  # the loader's own message for a missing cluster
    return experiment_from_dict({k: v for k, v in doc.items() if k != "cluster"}, cluster=cluster, job=False)


def _metrics(summary: Mapping[str, Any]) -> dict[str, Any]:
    """Flatten a run's summary into the numeric columns of a row."""
    row = {k: summary.get(k) for k in (*METRIC_COLUMNS, *CAPACITY_COLUMNS)}
    row.update({f"exposed_{cls}_s": v for cls, v in summary.get("exposed_comm_by_class_s", {}).items()})
    row.update({f"bytes_{tier}": v for tier, v in summary.get("bytes_by_tier", {}).items()})
    row.update({f"time_{cat}_s": v for cat, v in summary.get("time_breakdown_s", {}).items()})
    row["memory_per_gpu_bytes"] = summary.get("memory_per_gpu_bytes")
    if "fault_slowdown" in summary:  # a point with faults: what they cost against the healthy fabric
        row["healthy_step_time_s"] = summary["healthy_step_time_s"]
        row["fault_slowdown"] = summary["fault_slowdown"]
    return row


def run_point(doc: Mapping) -> dict[str, Any]:
    """Resolve and simulate one experiment document; never raises for a bad point.

    Parameters
    ----------
    doc : Mapping
        A complete experiment document.

    Returns
    -------
    dict
        ``status`` (``ok``, ``invalid``, ``oom`` or ``failed``), ``reason``
        (one line, empty when ``ok``), ``sim_wall_s`` (seconds of wall time
        spent on the point), the resolved ``parallel.dp`` when the document
        resolved, ``memory_per_gpu_bytes`` (bytes) when it was computed, and
        the metric columns (``step_time_s`` ..., ``exposed_<class>_s``,
        ``bytes_<tier>``) and the capacity columns (``fabric_cost_usd``,
        ``fabric_power_kw``, ``bisection_bytes_s``) when ``status == "ok"``,
        and ``fidelity``: the document's (default ``fast``). A document with
        ``fidelity: screen`` is priced by :func:`simulator.screen.screen_experiment`
        (no ``bytes_<tier>`` columns) instead of simulated.
    """
    t0 = time.perf_counter()
    fidelity = point_fidelity(doc)
    out: dict[str, Any] = {"status": "ok", "reason": "", FIDELITY_COLUMN: fidelity}
    try:
        if fidelity == SCREEN:
            from ..screen import screen_experiment  # imported on use: run-only sweeps never load it
            exp = _screen_experiment(doc)
            out["parallel.dp"] = exp.parallel.dp
            out["memory_per_gpu_bytes"] = float(exp.memory().total)
            out.update(_metrics(screen_experiment(exp)))
        else:
            exp = experiment_from_dict(doc)
            out["parallel.dp"] = exp.parallel.dp
            out["memory_per_gpu_bytes"] = float(exp.memory().total)
            out.update(_metrics(run_experiment(exp).summary))
            # The run's objects are freed as it returns, but its reference cycles (thousands a step) were moved to
            # the oldest generation (engine.paused_gc), which a sweep process seldom collects in full: without this
            # a long sweep grew by megabytes a point (13 GB over ~2,600 points in one process). Here nothing of
            # the point is kept, so a full collection scans only what the process holds anyway.
            gc.collect()
    except OutOfMemoryError as exc:
        out.update(status="oom", reason=without_force(one_line(exc)))
    except ValueError as exc:
        out.update(status="invalid", reason=without_force(one_line(exc)))
    except Exception as exc:  # noqa: BLE001 - a failed point is a row, not a crash of the sweep
        out.update(status="failed", reason=failed_reason(exc))
    out["sim_wall_s"] = time.perf_counter() - t0
    return out
