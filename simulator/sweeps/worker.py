"""Run one sweep point: resolve and simulate an experiment document into a result dict (never raises)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from ..experiment import OutOfMemoryError, experiment_from_dict, run_experiment
from .columns import CAPACITY_COLUMNS, METRIC_COLUMNS
from .errors import failed_reason, one_line

__all__ = ["run_point"]


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
        ``fabric_power_kw``, ``bisection_bytes_s``) when ``status == "ok"``.
    """
    t0 = time.perf_counter()
    out: dict[str, Any] = {"status": "ok", "reason": ""}
    try:
        exp = experiment_from_dict(doc)
        out["parallel.dp"] = exp.parallel.dp
        out["memory_per_gpu_bytes"] = float(exp.memory().total)
        out.update(_metrics(run_experiment(exp).summary))
    except OutOfMemoryError as exc:
        out.update(status="oom", reason=one_line(exc))
    except ValueError as exc:
        out.update(status="invalid", reason=one_line(exc))
    except Exception as exc:  # noqa: BLE001 - a failed point is a row, not a crash of the sweep
        out.update(status="failed", reason=failed_reason(exc))
    out["sim_wall_s"] = time.perf_counter() - t0
    return out
