"""Text summaries of a sweep table: status counts and the best points."""

from __future__ import annotations

import pandas as pd

from .columns import FIDELITY_COLUMN, KEY_COLUMN, METRIC_COLUMNS, STATUSES

__all__ = ["status_counts", "counts_line", "top_table", "batch_note"]


def status_counts(df: pd.DataFrame) -> dict[str, int]:
    """Rows per status, every status present (zero when absent).

    Parameters
    ----------
    df : pandas.DataFrame
        A sweep table.

    Returns
    -------
    dict
        Status -> number of rows, in :data:`~simulator.sweeps.columns.STATUSES` order.
    """
    counts = df["status"].value_counts() if len(df) else {}
    return {s: int(counts.get(s, 0)) for s in STATUSES}


def counts_line(df: pd.DataFrame) -> str:
    """One line: the number of points and of each status.

    Parameters
    ----------
    df : pandas.DataFrame
        A sweep table.

    Returns
    -------
    str
        E.g. ``12 points: 7 ok, 3 invalid, 2 oom, 0 failed``.
    """
    counts = status_counts(df)
    return f"{len(df)} points: " + ", ".join(f"{n} {s}" for s, n in counts.items())


def reasons_lines(df: pd.DataFrame, limit: int = 5) -> list[str]:
    """Why the points that did not run ended as they did: one line per distinct reason of the ``invalid``,
    ``failed`` and ``oom`` rows, most frequent first (at most ``limit``, then how many more), each with its
    status and count, e.g. ``2 invalid: parallel.tp: must be a positive integer, got 'a'``.

    Parameters
    ----------
    df : pandas.DataFrame
        A sweep table.
    limit : int
        Distinct reasons shown.

    Returns
    -------
    list of str
        Empty when every point is ``ok``.
    """
    rest = df[df["status"] != "ok"]
    if rest.empty:
        return []
    groups = rest.groupby(["status", rest["reason"].fillna("").astype(str)], sort=False).size()
    groups = groups.sort_values(ascending=False, kind="stable")
    lines = [f"{n} {status}: {reason or '(no reason recorded)'}" for (status, reason), n in groups.head(limit).items()]
    if len(groups) > limit:
        lines.append(f"... and {len(groups) - limit} more reasons (the table's reason column)")
    return lines


def top_table(df: pd.DataFrame, k: int, metric: str | None = None) -> str:
    """The best ``k`` feasible rows as a text table: rank, swept parameters and the headline metrics.

    Parameters
    ----------
    df : pandas.DataFrame
        A ranked sweep table (``ok`` rows first).
    k : int
        Rows to show.
    metric : str, optional
        Column shown first after the parameters; defaults to the one the
        sweep ranked by (``df.attrs["metric"]``), else ``step_time_s``.

    Returns
    -------
    str
        The table (memory per GPU in ``memory_GB``, 1e9 bytes), or ``"no feasible point"``. A refined
        screen (:func:`~simulator.sweeps.sweep` with ``refine``) also shows ``fidelity``,
        ``screen_<metric>`` and ``screen_rank``.
    """
    metric = metric or df.attrs.get("metric", "step_time_s")
    ok = df[df["status"] == "ok"].head(k)
    if ok.empty:
        return "no feasible point"
    skip = {"rank", "status", "reason", KEY_COLUMN, "sim_wall_s", "memory_per_gpu_bytes", FIDELITY_COLUMN}
    first = list(df.columns).index("rank")
    params = [c for c in df.columns[:first] if c not in skip]
    screened = [c for c in (f"screen_{metric}", "screen_rank") if c in df.columns]
    fidelity = [FIDELITY_COLUMN] if FIDELITY_COLUMN in df.columns and df[FIDELITY_COLUMN].nunique() > 1 else []
    shown = ["rank", *params, *fidelity, *dict.fromkeys([metric, *screened, *METRIC_COLUMNS[:5]])]
    table = ok[shown].copy()
    table["memory_GB"] = ok["memory_per_gpu_bytes"] / 1e9
    return table.to_string(index=False, float_format=lambda x: f"{x:.4g}")


PER_STEP_METRICS = ("step_time_s", "exposed_comm_s")
"""Metrics of one step whatever it holds: they rank unlike work when the points' steps hold unlike batches (so do
each class's ``exposed_<class>_s`` and each tier's ``bytes_<tier>``: :func:`per_step_metric`)."""


def per_step_metric(metric: str) -> bool:
    """Whether ``metric`` totals one step (time or bytes), rather than a rate, a fraction or a cost: the headline
    :data:`PER_STEP_METRICS`, a class's exposed seconds (``exposed_tp_s``) or a tier's bytes (``bytes_spine``)."""
    return (metric in PER_STEP_METRICS or metric.startswith("bytes_")
            or (metric.startswith("exposed_") and metric.endswith("_s")))


def batch_note(df: pd.DataFrame, metric: str | None = None) -> str | None:
    """A note when the feasible points' steps train different numbers of tokens and ``metric`` ranks whole steps.

    Without ``parallel.global_batch`` a step is ``micro_batch x dp`` sequences, so a layout sweep compares steps
    of different sizes by their time (a smaller DP trains fewer tokens, in less time). Per-token and per-GPU
    rates (``tokens_per_s``, ``mfu``) compare them fairly.

    Returns
    -------
    str or None
        The note, or None where every feasible step trains the same tokens (to 1e-9) or the metric is a rate.
    """
    metric = metric or df.attrs.get("metric", "step_time_s")
    if not per_step_metric(metric) or "tokens_per_s" not in df.columns:
        return None
    ok = df[df["status"] == "ok"]
    tokens = pd.to_numeric(ok["tokens_per_s"], errors="coerce") * pd.to_numeric(ok["step_time_s"], errors="coerce")
    tokens = tokens.dropna()
    if len(tokens) < 2 or tokens.max() <= tokens.min() * (1 + 1e-9):
        return None
    return (f"the feasible points' steps train from {tokens.min():,.0f} to {tokens.max():,.0f} tokens, so {metric} "
            f"ranks steps of unlike size: rank by --metric tokens_per_s, or give every point the same "
            f"parallel.global_batch and training.seq_len")
