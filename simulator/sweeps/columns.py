"""Column names and statuses of a sweep table, and the check of a ranking metric."""

from __future__ import annotations

from topologies.cluster import TIERS

__all__ = ["STATUSES", "METRIC_COLUMNS", "CAPACITY_COLUMNS", "HIGHER_IS_BETTER", "KEY_COLUMN", "LAYOUT_COLUMNS",
           "FIDELITY_COLUMN", "FIDELITIES", "SCREEN", "TRAFFIC_CLASSES", "check_metric",
           "check_fidelity", "check_max_tp", "is_result_column"]

STATUSES = ("ok", "invalid", "oom", "failed")
"""Every row's ``status``, in reporting order."""
METRIC_COLUMNS = ("step_time_s", "mfu", "tflops_per_gpu", "bubble_fraction", "exposed_comm_s", "tokens_per_s")
"""Headline numbers of an ``ok`` row (before the per-class and per-tier columns)."""
CAPACITY_COLUMNS = ("fabric_cost_usd", "fabric_power_kw", "bisection_bytes_s")
"""What the point's fabric costs (USD, every part but the GPUs), draws (kW) and carries across its rank halves
(bytes/s): :func:`topologies.capacity.plan_columns`, computed once per distinct cluster."""
HIGHER_IS_BETTER = frozenset({"mfu", "tflops_per_gpu", "tokens_per_s", "bisection_bytes_s"})
"""Metrics ranked in decreasing order; every other metric ranks in increasing order."""
RESULT_PREFIXES = ("exposed_", "bytes_", "time_")
"""Prefixes of the per-class, per-tier and per-category numbers of a row (``worker._metrics``)."""


def is_result_column(name: str) -> bool:
    """Whether column ``name`` holds a number a point's run produced (seconds, bytes, fractions, USD...), as
    opposed to a swept parameter (a dotted path), the key, the status or the reason."""
    return (name in METRIC_COLUMNS or name in CAPACITY_COLUMNS
            or name in ("memory_per_gpu_bytes", "sim_wall_s", "healthy_step_time_s", "fault_slowdown")
            or ("." not in name and name.startswith(RESULT_PREFIXES)))


KEY_COLUMN = "point"
"""Column holding each row's stable point key (see :func:`simulator.sweeps.points.point_key`)."""
RANK_COLUMNS = ("rank", "screen_rank")
"""Ranks a sweep gives its rows (``screen_rank``: the screen's, under ``--refine``): they belong to the sweep that
ranked them, so rows reused or kept from another sweep's file lose them."""
LAYOUT_COLUMNS = ("parallel.tp", "parallel.pp", "parallel.dp")
"""Columns written by a ``layout`` grid entry, in ``TPxPPxDP`` order."""
FIDELITY_COLUMN = "fidelity"
"""Column saying which fidelity produced a row (``fast``, ``full``, ``lockstep`` or ``screen``)."""
SCREEN = "screen"
"""The closed-form screening fidelity (:mod:`simulator.screen`); sweeps only."""
FIDELITIES = ("fast", "full", "lockstep", SCREEN)
"""Fidelities a sweep can run its points at: the simulator's (:data:`simulator.experiment.FIDELITIES`) and
``screen``."""


def check_fidelity(fidelity: str) -> None:
    """Raise ``ValueError`` (one line) unless ``fidelity`` is one of :data:`FIDELITIES`."""
    if fidelity not in FIDELITIES:
        raise ValueError(f"fidelity: {fidelity!r} unknown; valid: {', '.join(FIDELITIES)}")


TRAFFIC_CLASSES = ("tp", "pp", "dp", "ep", "edp", "cp", "zero", "sync")
"""Traffic classes of a training step's communication (``traffic_class`` of its ops): the ``exposed_<class>_s``
columns a sweep row can have (``edp``: a MoE model's expert-data-parallel gradient reductions)."""


def check_metric(metric: object, field: str = "metric") -> None:
    """Raise ``ValueError`` unless ``metric`` names a numeric column of an ``ok`` row.

    Parameters
    ----------
    metric : str
        One of :data:`METRIC_COLUMNS` or :data:`CAPACITY_COLUMNS`, ``memory_per_gpu_bytes`` (bytes),
        ``exposed_<class>_s`` (seconds; a class of :data:`TRAFFIC_CLASSES`) or ``bytes_<tier>`` (bytes; a tier
        of :data:`topologies.cluster.TIERS`).
    field : str
        What the message calls it (``metric``, ``sweep.metric``).

    Raises
    ------
    ValueError
        One line naming the valid choices (a column no row has would rank every point alike).
    """
    valid = (*METRIC_COLUMNS, *CAPACITY_COLUMNS, "memory_per_gpu_bytes",
             *(f"exposed_{c}_s" for c in TRAFFIC_CLASSES), *(f"bytes_{t}" for t in TIERS))
    if isinstance(metric, str) and metric in valid:
        return
    raise ValueError(f"{field}: {metric!r} unknown; valid: {', '.join(valid)}")


def check_max_tp(max_tp: object, field: str = "max_tp") -> None:
    """Raise ``ValueError`` (one line) unless ``max_tp`` (the largest tp of ``layout: auto``) is an integer >= 1."""
    if isinstance(max_tp, bool) or not isinstance(max_tp, int) or max_tp < 1:
        raise ValueError(f"{field}: must be an integer >= 1 (the largest tp of layout: auto), got {max_tp!r}")
