"""The sweep table: rows from point results, column order, dtypes and ranking."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pandas as pd
import yaml

from .columns import CAPACITY_COLUMNS, HIGHER_IS_BETTER, KEY_COLUMN, METRIC_COLUMNS
from .points import Point

__all__ = ["cell", "result_row", "build_table", "rank_table"]


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
        Whether the grid derives ``parallel.dp``; then the resolved value
        becomes the ``parallel.dp`` column (otherwise it is dropped).

    Returns
    -------
    dict
    """
    row = {k: cell(v) for k, v in point.params.items()}
    if derived_dp:
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
        One row per point; class and tier columns are 0.0 for ``ok`` rows that lack them.
    """
    df = pd.DataFrame(list(rows))
    if df.empty:
        df = pd.DataFrame(columns=[*param_columns, "status", "reason", KEY_COLUMN])
    for col in ("reason", "sim_wall_s", "memory_per_gpu_bytes", *METRIC_COLUMNS, *CAPACITY_COLUMNS, metric):
        if col not in df.columns:
            df[col] = "" if col == "reason" else float("nan")
    ok = df["status"] == "ok"
    for col in df.columns:
        if col.startswith(("bytes_", "exposed_")):
            df[col] = pd.to_numeric(df[col], errors="coerce").astype(float)
            df.loc[ok & df[col].isna(), col] = 0.0
    df["reason"] = df["reason"].fillna("").astype(str)
    _integer_columns(df, param_columns)
    df = rank_table(df, metric)
    return df[_ordered_columns(df, param_columns)]


def _ordered_columns(df: pd.DataFrame, param_columns: Sequence[str]) -> list[str]:
    fixed = ["rank", "status", "reason", *METRIC_COLUMNS, *CAPACITY_COLUMNS]
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
