"""The sweep table: rows from point results, column order, dtypes and ranking."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pandas as pd
import yaml

from .columns import (
    CAPACITY_COLUMNS,
    FIDELITY_COLUMN,
    HIGHER_IS_BETTER,
    KEY_COLUMN,
    METRIC_COLUMNS,
    RANK_COLUMNS,
    SCREEN,
)
from .points import Point

__all__ = ["cell", "result_row", "build_table", "rank_table", "merge_refined"]


def cell(value: Any) -> Any:
    """A parameter value as a table cell.

    Parameters
    ----------
    value : Any
        A grid value.

    Returns
    -------
    Any
        Scalars as they are; lists and mappings as one-line YAML flow text.

    Examples
    --------
    >>> cell(["tp", "dp", "pp"])
    '[tp, dp, pp]'
    """
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return yaml.safe_dump(value, default_flow_style=True, width=1 << 16).strip()


def result_row(point: Point, result: Mapping[str, Any], derived_dp: bool) -> dict[str, Any]:
    """One table row: the point's parameters, its result and its key.

    Parameters
    ----------
    point : Point
        The point that ran.
    result : Mapping
        :func:`~simulator.sweeps.worker.run_point`'s dict.
    derived_dp : bool
        Whether the table shows derived dps (:func:`~simulator.sweeps.grid.shows_dp`); then the resolved
        value becomes the ``parallel.dp`` column of a point whose dp is derived (not given, null or ``auto``),
        and a point's own dp stays (otherwise the resolved value is dropped).

    Returns
    -------
    dict
    """
    row = {k: cell(v) for k, v in point.params.items()}
    if derived_dp and point.params.get("parallel.dp", "auto") in ("auto", None):
        row["parallel.dp"] = result.get("parallel.dp")
    row.update({k: v for k, v in result.items() if k != "parallel.dp"})
    row[KEY_COLUMN] = point.key
    return row


def rank_table(df: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Sort ``ok`` rows by ``metric`` (best first, ties in point order), then the others; add ``rank``.

    Parameters
    ----------
    df : pandas.DataFrame
        A sweep table.
    metric : str
        Column to rank by; lower is better except for
        :data:`~simulator.sweeps.columns.HIGHER_IS_BETTER`.

    Returns
    -------
    pandas.DataFrame
        A new table; ``rank`` (``Int64``) is 1 for the best ``ok`` row and missing for the others.
    """
    df = df.reset_index(drop=True)
    ok = df["status"] == "ok"
    order = df[ok].sort_values(metric, ascending=metric not in HIGHER_IS_BETTER, kind="stable",
                               na_position="last")
    out = pd.concat([order, df[~ok]])
    out["rank"] = pd.array([*range(1, len(order) + 1), *[pd.NA] * int((~ok).sum())], dtype="Int64")
    return out.reset_index(drop=True)


def build_table(rows: Iterable[Mapping[str, Any]], param_columns: Sequence[str], metric: str) -> pd.DataFrame:
    """The sweep's DataFrame, ranked, with columns in their documented order.

    Parameters
    ----------
    rows : iterable of Mapping
        Rows from :func:`result_row` (or reused from an output file), in point order.
    param_columns : sequence of str
        The swept parameter columns, which come first.
    metric : str
        Ranking column.

    Returns
    -------
    pandas.DataFrame
        One row per point; class, tier and time-partition (``time_<category>_s``) columns are 0.0 for ``ok``
        rows that lack them (tier and partition columns stay missing on ``screen`` rows, which count no bytes
        and estimate only part of the partition).
    """
    df = pd.DataFrame(list(rows))
    if df.empty:
        df = pd.DataFrame(columns=[*param_columns, "status", "reason", KEY_COLUMN])
    # (a derived parameter, e.g. parallel.dp, is missing where no row resolved it: every point invalid, say)
    for col in ("reason", "sim_wall_s", "memory_per_gpu_bytes", *METRIC_COLUMNS, *CAPACITY_COLUMNS, metric,
                *param_columns):
        if col not in df.columns:
            df[col] = "" if col == "reason" else float("nan")
    _zero_fill(df)
    df["reason"] = df["reason"].fillna("").astype(str)
    _integer_columns(df, param_columns)
    df = rank_table(df, metric)
    return df[_ordered_columns(df, param_columns)]


def _zero_fill(df: pd.DataFrame) -> None:
    """Class, tier and time-partition columns of ``ok`` rows that lack them become 0.0 in place: a layout
    without a category spends no time in it (tier and partition columns not on ``screen`` rows: the screen
    counts no bytes and estimates only part of the partition)."""
    ok = df["status"] == "ok"
    screened = df[FIDELITY_COLUMN] == SCREEN if FIDELITY_COLUMN in df.columns else False
    for col in df.columns:
        partition = col.startswith("time_") and col.endswith("_s")
        if col.startswith(("bytes_", "exposed_")) or partition:
            df[col] = pd.to_numeric(df[col], errors="coerce").astype(float)
            fill = ok & ~screened if col.startswith("bytes_") or partition else ok
            df.loc[fill & df[col].isna(), col] = 0.0


def _ordered_columns(df: pd.DataFrame, param_columns: Sequence[str]) -> list[str]:
    fixed = ["rank", "status", "reason", *METRIC_COLUMNS, *CAPACITY_COLUMNS]
    if FIDELITY_COLUMN in df.columns and FIDELITY_COLUMN not in param_columns:  # a grid may sweep it too
        fixed.insert(2, FIDELITY_COLUMN)
    exposed = sorted(c for c in df.columns if c.startswith("exposed_") and c.endswith("_s") and c not in fixed)
    tiers = sorted(c for c in df.columns if c.startswith("bytes_"))
    tail = ["memory_per_gpu_bytes", "sim_wall_s", KEY_COLUMN]
    known = [*param_columns, *fixed, *exposed, *tiers, *tail]
    return known + [c for c in df.columns if c not in known]


def _integer_columns(df: pd.DataFrame, columns: Iterable[str]) -> None:
    """Numeric columns with gaps whose values are all integers (e.g. a derived dp) become ``Int64`` in place."""
    for col in columns:
        if col not in df.columns or df[col].dtype == bool or not pd.api.types.is_numeric_dtype(df[col]):
            continue
        values = df[col].dropna()
        if len(values) < len(df) and len(values) and (values == values.round()).all():
            df[col] = df[col].astype("Int64")


def with_other_rows(table: pd.DataFrame, others: pd.DataFrame) -> pd.DataFrame:
    """``table`` (this sweep's ranked rows) followed by ``others``, the rows of other sweeps an output file
    already held (:func:`~simulator.sweeps.store.previous_rows`), as the file is written.

    The others' ``rank`` and ``screen_rank`` cells are left empty (a rank belongs to the sweep that ranked it;
    kept, the file would list two rows of rank 1) and stay ``Int64`` (an object column of ``pd.NA`` made the
    ranks text in a Parquet file), and a column whose values are all integers stays integer where the other
    sweep has no value for it (``Int64``, not the floats a gap makes)."""
    if others.empty:
        return table
    others = others.assign(**{c: pd.array([pd.NA] * len(others), dtype="Int64")
                              for c in RANK_COLUMNS if c in others.columns})
    integral = [c for c in table.columns.union(others.columns)
                if any(c in f.columns and pd.api.types.is_integer_dtype(f[c].dtype) for f in (table, others))]
    out = pd.concat([table, others], ignore_index=True)
    _integer_columns(out, integral)
    return out


def merge_refined(screened: pd.DataFrame, refined: pd.DataFrame, fast_keys: Mapping[str, str],
                  metric: str) -> pd.DataFrame:
    """A screened sweep with its best points simulated again: one row per point, the simulated ones first.

    Parameters
    ----------
    screened : pandas.DataFrame
        The ranked table of the ``screen`` sweep.
    refined : pandas.DataFrame
        The table of the refined points (``fast`` rows, keyed by their own point keys).
    fast_keys : Mapping
        Screened point key -> the key of the same point in ``fast``.
    metric : str
        Ranking column.

    Returns
    -------
    pandas.DataFrame
        Refined rows replace their screened rows; ``ok`` refined rows rank first (by their simulated
        ``metric``), then the other ``ok`` rows in screened order, then the rest. Every ``ok`` row carries
        ``screen_<metric>`` and ``screen_rank`` (``Int64``): what the screen said.
    """
    col = f"screen_{metric}"
    s = screened.copy()
    ok = s["status"] == "ok"
    s[col] = s[metric].where(ok)
    s["screen_rank"] = s["rank"]
    back = {fast: key for key, fast in fast_keys.items()}
    by_key = s.set_index(KEY_COLUMN)
    r = refined.copy()
    screen_keys = [back.get(k) for k in r[KEY_COLUMN]]
    r[col] = [by_key[col].get(k, float("nan")) if k is not None else float("nan") for k in screen_keys]
    r["screen_rank"] = pd.array([by_key["screen_rank"].get(k, pd.NA) if k is not None else pd.NA
                                 for k in screen_keys], dtype="Int64")
    s = s[~s[KEY_COLUMN].isin([k for k in screen_keys if k is not None])]
    r_ok, s_ok = r[r["status"] == "ok"], s[s["status"] == "ok"]
    r_ok = r_ok.sort_values(metric, ascending=metric not in HIGHER_IS_BETTER, kind="stable", na_position="last")
    rest = pd.concat([r[r["status"] != "ok"], s[s["status"] != "ok"]])
    out = pd.concat([r_ok, s_ok, rest], ignore_index=True)
    n_ok = len(r_ok) + len(s_ok)
    out["rank"] = pd.array([*range(1, n_ok + 1), *[pd.NA] * (len(out) - n_ok)], dtype="Int64")
    _zero_fill(out)
    first = [c for c in screened.columns if c in out.columns]
    return out[first + [c for c in out.columns if c not in first]]
