"""Sweep grids: parse ``--grid`` arguments and ``sweep:`` sections, check and normalise a grid."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from topologies.yamlio import load_yaml
from workloads.errors import ConfigError, is_int, plain_values, unknown_keys

from ..experiment import SECTIONS, experiment_from_dict
from .columns import LAYOUT_COLUMNS, check_max_tp, check_metric
from .errors import one_line
from .paths import apply_overrides

__all__ = ["LAYOUT", "AUTO", "AUTO_KEYS", "SWEEP_FIELDS", "Grid", "parse_grid_arg", "normalise_grid", "check_fields",
           "merge_grids", "sweep_settings", "derives_dp", "shows_dp", "param_columns"]

LAYOUT = "layout"
"""Grid key sweeping ``(tp, pp, dp)`` together: ``auto`` or a list of ``TPxPPxDP`` strings."""
AUTO = "auto"
"""Value of an :data:`AUTO_KEYS` grid entry that expands per point."""
AUTO_KEYS = (LAYOUT, "parallel.micro_batch")
"""Grid keys whose value ``auto`` expands per point."""
SWEEP_FIELDS = ("grid", "metric", "max_tp")
"""Fields of an experiment file's ``sweep:`` section."""

Grid = Mapping[str, Any]


def _check_path(path: str) -> None:
    """Raise ``ValueError`` unless ``path`` names a field of an experiment file (or ``layout``)."""
    if not isinstance(path, str) or not path or any(not part for part in path.split(".")):
        raise ValueError(f"grid: {path!r} is not a dotted path such as parallel.tp")
    top = path.split(".")[0]
    valid = [s for s in SECTIONS if s != "sweep"]
    if path != LAYOUT and top not in valid:
        raise ValueError(f"grid: {path!r}: unknown section {top!r}; valid: {', '.join(valid)}, or layout")
    if top == "name" and path != "name":
        raise ValueError(f"grid: {path!r}: name is a plain field, not a section")


def parse_grid_arg(text: str) -> tuple[str, list]:
    """Parse one ``--grid PATH=V1,V2,...`` argument.

    Values are read as a YAML flow sequence, so ``1`` is an int, ``true`` a
    bool, ``null`` None (``moe.capacity_factor=null,1.25``), ``400Gbps`` a string and ``[tp,dp,pp]`` a list.

    Parameters
    ----------
    text : str
        The argument, ``PATH=V1,V2,...``.

    Returns
    -------
    tuple of (str, list)
        The dotted path and its values.

    Raises
    ------
    ValueError
        One line, for a malformed argument or an unknown section.

    Examples
    --------
    >>> parse_grid_arg("parallel.tp=1,2,4")
    ('parallel.tp', [1, 2, 4])
    >>> parse_grid_arg("cluster.nic_bandwidth=400Gbps,800Gbps")
    ('cluster.nic_bandwidth', ['400Gbps', '800Gbps'])
    """
    path, sep, rhs = text.partition("=")
    path = path.strip()
    if not sep or not path or not rhs.strip():
        raise ValueError(f"--grid: {text!r} is not PATH=V1,V2,... (e.g. parallel.tp=1,2,4,8 or layout=auto)")
    try:
        values = load_yaml(f"[{rhs}]")  # 2:1 stays "2:1" (YAML 1.1 would read sexagesimal 121)
    except yaml.YAMLError:
        raise ValueError(f"--grid: {text!r}: cannot parse the values {rhs!r} as a comma-separated list") from None
    # (an empty item, 1,,2, does not parse; null is a value: moe.capacity_factor=null,1.25 sweeps dropless MoE
    # against a capacity, as a sweep: grid's [null, 1.25] does)
    if not values:
        raise ValueError(f"--grid: {text!r}: empty value in the list")
    _check_path(path)
    return path, values


def _is_auto(key: str, values: Any) -> bool:
    return key in AUTO_KEYS and (values == AUTO or (isinstance(values, list) and values == [AUTO]))


def _parse_layout(value: Any) -> tuple[int, int, int]:
    """``"8x8x16"`` or ``[8, 8, 16]`` -> ``(tp, pp, dp)``."""
    parts = value.lower().split("x") if isinstance(value, str) else value
    try:
        # Whole numbers only: int() would truncate 2.9, read True as 1 and "2_0" as 20.
        tp, pp, dp = (int(p) if (p.strip().isdecimal() if isinstance(p, str) else is_int(p)) else None
                      for p in parts)
        if None in (tp, pp, dp):
            raise ValueError
    except (TypeError, ValueError):
        raise ValueError(f"grid: layout: {value!r} is not auto or TPxPPxDP such as 8x8x16") from None
    return tp, pp, dp


def normalise_grid(grid: Grid) -> dict[str, Any]:
    """Check a grid's keys and values and put them in one shape.

    Parameters
    ----------
    grid : Mapping
        Dotted path -> list of values (a scalar is one value), or ``"auto"``
        for :data:`AUTO_KEYS`.

    Returns
    -------
    dict
        Dotted path -> list of values, or ``"auto"``; ``layout`` values become
        ``(tp, pp, dp)`` tuples.

    Raises
    ------
    ValueError
        One line, for a bad path, an empty list, a malformed layout, or
        ``layout`` swept together with one of its columns.
    """
    out: dict[str, Any] = {}
    for key, values in grid.items():
        _check_path(key)
        if _is_auto(key, values):
            out[key] = AUTO
            continue
        if isinstance(values, (str, bytes)) or not isinstance(values, Iterable) or isinstance(values, Mapping):
            values = [values]
        # numpy scalars (a grid from an array or a DataFrame column) as the Python values a YAML grid gives
        values = plain_values(list(values))
        if not values:
            raise ValueError(f"grid: {key}: empty list of values")
        if key in AUTO_KEYS and AUTO in values:
            raise ValueError(f"grid: {key}: auto stands for every valid value and cannot be mixed with others; "
                             f"sweep {key}=auto alone, or list the values")
        out[key] = [_parse_layout(v) for v in values] if key == LAYOUT else values
    if LAYOUT in out and any(k in out for k in LAYOUT_COLUMNS):
        raise ValueError(f"grid: {LAYOUT} sets {', '.join(LAYOUT_COLUMNS)}; do not sweep them as well")
    return out


def check_fields(base: Mapping, grid: Grid) -> None:
    """Raise ``ValueError`` (one line) if a grid path names no field of the experiment file.

    Each path is tried once with its first value on ``base``; only the
    experiment loader's "unknown field" error counts here, every other problem
    belongs to the points (invalid rows).

    Parameters
    ----------
    base : Mapping
        The experiment document, without its ``sweep`` section.
    grid : Mapping
        A grid as returned by :func:`normalise_grid`.
    """
    for key, values in grid.items():
        if key == LAYOUT or values == AUTO:
            continue
        parts = key.split(".")
        prefixes = tuple(".".join(parts[:i]) + ": unknown field" for i in range(1, len(parts) + 1))
        # a field above the path's end (parallel.placement of parallel.placement.0): the path goes into a value
        fields = tuple(".".join(parts[:i]) + ":" for i in range(2, len(parts)))
        try:
            doc = apply_overrides(base, {key: values[0]})
        except ValueError as exc:  # (a parent that holds a plain value)
            raise ValueError(f"grid: {one_line(exc)}; sweep the field itself, not a part of it") from None
        try:
            experiment_from_dict(doc)
        except ValueError as exc:
            if str(exc).startswith(prefixes):
                raise ValueError(f"grid: {one_line(exc)}") from None
            if str(exc).startswith(fields):
                field = str(exc).split(":", 1)[0]
                raise ValueError(f"grid: {key}: {field} is a field, not a section; sweep {field} itself (e.g. "
                                 f"--grid '{field}=...' with whole values)") from None


def merge_grids(*grids: Grid | None) -> dict[str, Any]:
    """Merge grids left to right: a later grid replaces an earlier one's key and appends new keys.

    Parameters
    ----------
    *grids : Mapping or None
        Grids in increasing precedence; ``None`` is an empty grid.

    Returns
    -------
    dict
        The merged grid.

    Examples
    --------
    >>> merge_grids({"parallel.tp": [1, 2]}, None, {"parallel.tp": [4], "parallel.pp": [1]})
    {'parallel.tp': [4], 'parallel.pp': [1]}
    """
    out: dict[str, Any] = {}
    for grid in grids:
        out.update(grid or {})
    return out


def sweep_settings(doc: Mapping) -> dict[str, Any]:
    """The ``sweep:`` section of an experiment document.

    Parameters
    ----------
    doc : Mapping
        An experiment document.

    Returns
    -------
    dict
        ``grid`` (a dict, empty when absent), ``metric`` and ``max_tp`` (``None`` when absent).

    Raises
    ------
    ConfigError
        A section that is not a mapping, has an unknown field, or a ``grid`` that is not a mapping.
    """
    section = doc.get("sweep")
    section = {} if section is None else section  # (only null is absent: 0, false, '' and [] are malformed)
    if not isinstance(section, Mapping):
        raise ConfigError(f"sweep: must be a mapping with fields {', '.join(SWEEP_FIELDS)}")
    unknown = unknown_keys(section, SWEEP_FIELDS)
    if unknown:
        raise ConfigError(f"sweep.{unknown[0]}: unknown field; valid fields: {', '.join(SWEEP_FIELDS)}")
    grid = section.get("grid")
    grid = {} if grid is None else grid
    if not isinstance(grid, Mapping):
        raise ConfigError("sweep.grid: must map dotted paths to lists of values, e.g. {parallel.tp: [1, 2, 4, 8]}")
    for name, check in (("metric", check_metric), ("max_tp", check_max_tp)):
        if section.get(name) is not None:
            try:
                check(section[name], f"sweep.{name}")
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
    return {"grid": dict(grid), "metric": section.get("metric"), "max_tp": section.get("max_tp")}


def derives_dp(grid: Grid) -> bool:
    """True when points must derive ``parallel.dp`` from the cluster size (tp or pp swept, dp and layout not).

    Parameters
    ----------
    grid : Mapping
        A grid (its keys are what counts).

    Returns
    -------
    bool
    """
    return (("parallel.tp" in grid or "parallel.pp" in grid)
            and "parallel.dp" not in grid and LAYOUT not in grid)


def _feeds_dp(key: str) -> bool:
    """Whether grid key ``key`` can change a derived dp (the cluster's GPU count, or tp, pp, cp: dp fills the
    GPUs with ``tp·cp·pp``-GPU replicas; ep is carved out of dp and leaves it as it is)."""
    return key in ("cluster", "parallel", "parallel.tp", "parallel.pp", "parallel.cp") or key.startswith("cluster.")


def shows_dp(grid: Grid, base: Mapping) -> bool:
    """True when the table's ``parallel.dp`` column shows each point's resolved dp rather than the grid's value.

    That is when dp is derived per point: :func:`derives_dp`; a grid listing ``auto`` (or null) among
    ``parallel.dp``'s values; or a ``base`` whose dp is derived (absent, null or ``auto``) under a grid that
    sweeps what it is derived from (the cluster, tp, pp or cp; a whole ``parallel`` section that leaves dp
    out or ``auto``).

    Parameters
    ----------
    grid : Mapping
        A normalised grid (:func:`normalise_grid`).
    base : Mapping
        The experiment document the grid's overrides apply to.

    Returns
    -------
    bool
    """
    if derives_dp(grid):
        return True
    if LAYOUT in grid:  # (every layout names its dp)
        return False
    if "parallel.dp" in grid:
        values = grid["parallel.dp"]
        return isinstance(values, list) and any(v is None or v == AUTO for v in values)
    if "parallel" in grid and isinstance(grid["parallel"], list) and any(
            isinstance(v, Mapping) and v.get("dp", AUTO) in (AUTO, None) for v in grid["parallel"]):
        return True
    section = base.get("parallel")
    dp = section.get("dp", AUTO) if isinstance(section, Mapping) else AUTO
    return dp in (AUTO, None) and any(_feeds_dp(key) for key in grid)


def param_columns(grid: Grid, resolved_dp: bool = False) -> list[str]:
    """The table's parameter columns for ``grid``, in grid order.

    ``layout`` contributes :data:`~simulator.sweeps.columns.LAYOUT_COLUMNS`;
    a derived ``parallel.dp`` follows the last of ``parallel.tp`` / ``parallel.pp``.

    Parameters
    ----------
    grid : Mapping
        A grid (its keys are what counts).
    resolved_dp : bool, default False
        Whether the table shows each point's resolved dp (:func:`shows_dp`): a grid that does not sweep dp then
        gets a ``parallel.dp`` column after the last key it is derived from.

    Returns
    -------
    list of str
    """
    cols: list[str] = []
    for key in grid:
        cols.extend(LAYOUT_COLUMNS if key == LAYOUT else [key])
    if derives_dp(grid):
        last = max(i for i, c in enumerate(cols) if c in ("parallel.tp", "parallel.pp"))
        cols.insert(last + 1, "parallel.dp")
    elif resolved_dp and "parallel.dp" not in cols:
        last = max((i for i, c in enumerate(cols) if _feeds_dp(c)), default=len(cols) - 1)
        cols.insert(last + 1, "parallel.dp")
    return cols
