"""Parameter sweeps: run an experiment file over a grid of overrides and rank the results.

A sweep is a base experiment (a dict, or an experiment YAML file) and a grid
that maps *dotted paths* of the experiment file to lists of values, e.g.
``{"parallel.tp": [1, 2, 4, 8], "cluster.oversubscription": [1, 2, 4]}``.
Every combination is one *point*: the base with those fields overridden,
resolved and simulated by :mod:`simulator.experiment` (nothing here re-checks
a configuration). Each point becomes one row of a pandas DataFrame.

Grid semantics
--------------
* Any field can be swept: ``section.field`` (``parallel.zero``,
  ``cluster.nic_bandwidth``, ``network.seed``, ``compute.matmul_efficiency``),
  or a top-level field (``name``). A section given as a preset name
  (``cluster: dgx-h100``) becomes ``{preset: dgx-h100}`` before overriding.
* ``layout: auto`` expands to every ``(tp, pp, dp)`` factorisation of the
  cluster's GPU count with ``tp`` at most the NVLink domain size (the
  ``max_tp`` option lifts that limit); it writes ``parallel.tp``,
  ``parallel.pp`` and ``parallel.dp`` columns. ``layout`` may instead list
  explicit layouts, ``["8x8x16", "4x16x16"]`` (``TPxPPxDP``).
* ``parallel.micro_batch: auto`` expands to every micro-batch size that
  divides ``global_batch / dp`` of each point (needs ``parallel.global_batch``).
* When the grid sweeps ``parallel.tp`` or ``parallel.pp`` but neither
  ``parallel.dp`` nor ``layout``, every point derives ``dp`` from the cluster
  size (``parallel.dp: auto``; the base file's ``dp`` is ignored) and the
  resolved value is reported in a ``parallel.dp`` column.
* The expansion order is: plain grid values (cartesian product, in grid
  order), then ``layout``, then ``parallel.micro_batch``; so an ``auto`` always
  sees the cluster and batch of its own point.

Rows and statuses
-----------------
Infeasible points are results, not errors: ``status`` is ``ok``, ``invalid``
(any ``ValueError`` from resolving the point: bad field, impossible layout),
``oom`` (:class:`~simulator.experiment.OutOfMemoryError`) or ``failed``
(anything else: a simulator bug, a deadlock, a lost worker), and ``reason``
holds the one-line message. ``ok`` rows are ranked by ``metric`` (``rank``
column, 1 = best; lower is better except for :data:`HIGHER_IS_BETTER`).

Resuming
--------
Each point is keyed (``point`` column) by a stable hash of the base
experiment (without its ``sweep`` section) and the point's overrides. With an
``output`` file, rows already there whose status is ``ok``, ``invalid`` or
``oom`` are reused, not recomputed; ``failed`` rows are retried. Rows of
other sweeps in the same file are kept, after this sweep's rows. The file is
rewritten atomically every :data:`CHECKPOINT_S` seconds and when the sweep
ends or is interrupted (Ctrl-C raises :class:`SweepInterrupted`, which
carries the partial table).

Execution
---------
``jobs=1`` runs in this process; otherwise a process pool of ``jobs`` workers
(default: all cores; ``fork`` on Linux while the caller is single-threaded,
``forkserver`` when it has threads (Jupyter, a Dask client), ``spawn``
elsewhere; scripts run with ``spawn``/``forkserver`` need the usual
``if __name__ == "__main__":`` guard). Workers ignore SIGINT: on Ctrl-C the
parent writes the finished rows and terminates them.
``scheduler="tcp://host:port"`` submits the points to an existing
Dask distributed cluster (install ``clustersim[dask]`` on the client and on
every worker). The simulator is deterministic, so every executor gives the
same table except ``sim_wall_s``.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import copy
import hashlib
import importlib.util
import itertools
import json
import math
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from topologies import build_cluster
from workloads.errors import ConfigError, divisors

from .experiment import SECTIONS, OutOfMemoryError, experiment_from_dict, read_experiment_file, run_experiment

__all__ = [
    "sweep", "run_point", "expand_grid", "parse_grid_arg", "check_fields", "sweep_settings", "merge_grids",
    "rank_table", "status_counts", "counts_line", "top_table", "read_table", "write_table", "Point", "SweepInterrupted",
    "STATUSES", "HIGHER_IS_BETTER", "METRIC_COLUMNS", "LAYOUT", "AUTO",
]

STATUSES = ("ok", "invalid", "oom", "failed")
"""Every row's ``status``, in reporting order."""
REUSABLE = frozenset({"ok", "invalid", "oom"})
"""Statuses a resumed sweep keeps (deterministic outcomes); ``failed`` points are retried."""
METRIC_COLUMNS = ("step_time_s", "mfu", "tflops_per_gpu", "bubble_fraction", "exposed_comm_s", "tokens_per_s")
"""Headline numbers of an ``ok`` row (before the per-class and per-tier columns)."""
HIGHER_IS_BETTER = frozenset({"mfu", "tflops_per_gpu", "tokens_per_s"})
"""Metrics ranked in decreasing order; every other metric ranks in increasing order."""
LAYOUT = "layout"
AUTO = "auto"
AUTO_KEYS = (LAYOUT, "parallel.micro_batch")
"""Grid keys whose value ``auto`` expands per point."""
LAYOUT_COLUMNS = ("parallel.tp", "parallel.pp", "parallel.dp")
KEY_COLUMN = "point"
CHECKPOINT_S = 30.0
"""Seconds between rewrites of the output file while a sweep runs."""
SWEEP_FIELDS = ("grid", "metric", "max_tp")
"""Fields of an experiment file's ``sweep:`` section."""
OUTPUT_FORMATS = (".csv", ".parquet")

Grid = Mapping[str, Any]


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C during a sweep; ``table`` holds the rows finished so far (already written to ``output``)."""

    def __init__(self, table: pd.DataFrame, output: str | os.PathLike | None) -> None:
        super().__init__(f"sweep interrupted after {len(table)} points")
        self.table = table
        self.output = output


@dataclass(frozen=True)
class Point:
    """One point of a sweep.

    Attributes
    ----------
    params : dict
        Column values of the swept parameters (dotted name -> value).
    overrides : dict
        Dotted path -> value applied to the base experiment (``params`` plus
        any derived setting such as ``parallel.dp: auto``).
    key : str
        Stable hash of the base experiment and ``overrides``.
    """

    params: dict
    overrides: dict
    key: str


# ------------------------------------------------------------------ dotted paths
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


def get_path(doc: Mapping, path: str, default: Any = None) -> Any:
    """The value at dotted ``path`` of ``doc`` (``default`` when absent; a string section is its preset)."""
    node: Any = doc
    for part in path.split("."):
        if isinstance(node, str):
            node = {"preset": node}
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node


def set_path(doc: dict, path: str, value: Any) -> None:
    """Set dotted ``path`` of ``doc`` in place, creating sections (a string section becomes ``{preset: ...}``)."""
    parts = path.split(".")
    node = doc
    for part in parts[:-1]:
        child = node.get(part)
        if isinstance(child, str):
            child = {"preset": child}
        elif not isinstance(child, dict):
            child = {} if child is None else child
        node[part] = child
        node = child
    if not isinstance(node, dict):
        raise ValueError(f"{path}: {'.'.join(parts[:-1])} is not a section of fields")
    node[parts[-1]] = value


def apply_overrides(base: Mapping, overrides: Mapping[str, Any]) -> dict:
    """A deep copy of ``base`` with every dotted override set."""
    doc = copy.deepcopy(dict(base))
    for path, value in overrides.items():
        set_path(doc, path, value)
    return doc


# ------------------------------------------------------------------------ grids
def parse_grid_arg(text: str) -> tuple[str, list]:
    """Parse one ``--grid PATH=V1,V2,...`` argument.

    Values are read as a YAML flow sequence, so ``1`` is an int, ``true`` a
    bool, ``400Gbps`` a string and ``[tp,dp,pp]`` a list.

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
        values = yaml.safe_load(f"[{rhs}]")
    except yaml.YAMLError:
        raise ValueError(f"--grid: {text!r}: cannot parse the values {rhs!r} as a comma-separated list") from None
    if not values or any(v is None for v in values):
        raise ValueError(f"--grid: {text!r}: empty value in the list")
    _check_path(path)
    return path, values


def _is_auto(key: str, values: Any) -> bool:
    return key in AUTO_KEYS and (values == AUTO or (isinstance(values, list) and values == [AUTO]))


def _normalise_grid(grid: Grid) -> dict[str, Any]:
    """Check keys and values; a scalar becomes a one-value list, ``auto`` stays ``"auto"``."""
    out: dict[str, Any] = {}
    for key, values in grid.items():
        _check_path(key)
        if _is_auto(key, values):
            out[key] = AUTO
            continue
        if isinstance(values, (str, bytes)) or not isinstance(values, Iterable) or isinstance(values, Mapping):
            values = [values]
        values = list(values)
        if not values:
            raise ValueError(f"grid: {key}: empty list of values")
        out[key] = [_parse_layout(v) for v in values] if key == LAYOUT else values
    if LAYOUT in out and any(k in out for k in LAYOUT_COLUMNS):
        raise ValueError(f"grid: {LAYOUT} sets {', '.join(LAYOUT_COLUMNS)}; do not sweep them as well")
    return out


def _parse_layout(value: Any) -> tuple[int, int, int]:
    """``"8x8x16"`` or ``[8, 8, 16]`` -> ``(tp, pp, dp)``."""
    parts = value.lower().split("x") if isinstance(value, str) else value
    try:
        tp, pp, dp = (int(p) for p in parts)
    except (TypeError, ValueError):
        raise ValueError(f"grid: layout: {value!r} is not auto or TPxPPxDP such as 8x8x16") from None
    return tp, pp, dp


def check_fields(base: Mapping, grid: Grid) -> None:
    """Raise ``ValueError`` (one line) if a grid path names no field of the experiment file.

    Each path is tried once with its first value on ``base``; only the
    experiment loader's "unknown field" error counts here, every other problem
    belongs to the points (invalid rows).
    """
    for key, values in grid.items():
        if key == LAYOUT or values == AUTO:
            continue
        parts = key.split(".")
        prefixes = tuple(".".join(parts[:i]) + ": unknown field" for i in range(1, len(parts) + 1))
        try:
            experiment_from_dict(apply_overrides(base, {key: values[0]}))
        except ValueError as exc:
            if str(exc).startswith(prefixes):
                raise ValueError(f"grid: {_one_line(exc)}") from None


def merge_grids(*grids: Grid | None) -> dict[str, Any]:
    """Merge grids left to right: a later grid replaces an earlier one's key and appends new keys."""
    out: dict[str, Any] = {}
    for grid in grids:
        for key, values in (grid or {}).items():
            out[key] = values
    return out


def sweep_settings(doc: Mapping) -> dict[str, Any]:
    """The ``sweep:`` section of an experiment document: ``grid`` (a dict), ``metric``, ``max_tp``."""
    section = doc.get("sweep") or {}
    if not isinstance(section, Mapping):
        raise ConfigError(f"sweep: must be a mapping with fields {', '.join(SWEEP_FIELDS)}")
    unknown = sorted(set(section) - set(SWEEP_FIELDS))
    if unknown:
        raise ConfigError(f"sweep.{unknown[0]}: unknown field; valid fields: {', '.join(SWEEP_FIELDS)}")
    grid = section.get("grid") or {}
    if not isinstance(grid, Mapping):
        raise ConfigError("sweep.grid: must map dotted paths to lists of values, e.g. {parallel.tp: [1, 2, 4, 8]}")
    return {"grid": dict(grid), "metric": section.get("metric"), "max_tp": section.get("max_tp")}


# -------------------------------------------------------------------- expansion
class _ClusterCache:
    """GPU count and NVLink domain size per distinct ``cluster:`` section (built once each)."""

    def __init__(self) -> None:
        self._sizes: dict[str, tuple[int, int] | None] = {}

    def sizes(self, doc: Mapping) -> tuple[int, int] | None:
        """``(num_gpus, gpus_per_server)`` of ``doc``'s cluster, or ``None`` if it does not build."""
        section = doc.get("cluster") or {"preset": "dgx-h100"}
        key = json.dumps(section, sort_keys=True, default=str)
        if key not in self._sizes:
            try:
                cluster = build_cluster(section)
                self._sizes[key] = (cluster.num_gpus, cluster.gpus_per_server)
            except ValueError:
                self._sizes[key] = None
        return self._sizes[key]


def layouts(num_gpus: int, max_tp: int) -> list[tuple[int, int, int]]:
    """Every ``(tp, pp, dp)`` with ``tp * pp * dp == num_gpus`` and ``tp <= max_tp``.

    Examples
    --------
    >>> layouts(4, 2)
    [(1, 1, 4), (1, 2, 2), (1, 4, 1), (2, 1, 2), (2, 2, 1)]
    """
    return [(tp, pp, num_gpus // (tp * pp)) for tp in divisors(num_gpus) if tp <= max_tp
            for pp in divisors(num_gpus // tp)]


def _auto_layouts(doc: Mapping, clusters: _ClusterCache, max_tp: int | None) -> list[tuple[int, int, int] | None]:
    sizes = clusters.sizes(doc)
    if sizes is None:
        return [None]  # the point resolves to an invalid row with the cluster's own message
    num_gpus, per_server = sizes
    return layouts(num_gpus, max_tp or per_server)


def _point_dp(doc: Mapping, clusters: _ClusterCache) -> int | None:
    """The point's dp: explicit, or derived from the cluster size as :func:`experiment_from_dict` does."""
    dp = get_path(doc, "parallel.dp", AUTO)
    if dp != AUTO:
        return dp if isinstance(dp, int) else None
    tp, pp = get_path(doc, "parallel.tp", 1), get_path(doc, "parallel.pp", 1)
    sizes = clusters.sizes(doc)
    if sizes is None or not all(isinstance(v, int) and v > 0 for v in (tp, pp)) or sizes[0] % (tp * pp):
        return None
    return sizes[0] // (tp * pp)


def _auto_micro_batches(doc: Mapping, clusters: _ClusterCache) -> list[Any]:
    """Every micro-batch size dividing ``global_batch / dp``; the base value when that is not defined."""
    dp = _point_dp(doc, clusters)
    gb = get_path(doc, "parallel.global_batch")
    if dp and isinstance(gb, int) and gb > 0 and gb % dp == 0:
        return divisors(gb // dp)
    return [get_path(doc, "parallel.micro_batch", 1)]


def _combos(grid: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Cartesian product of the non-auto grid entries, first key outermost."""
    keys = [k for k, v in grid.items() if v != AUTO]
    for values in itertools.product(*(grid[k] for k in keys)):
        yield dict(zip(keys, values))


def _layout_params(layout: tuple[int, int, int] | None) -> dict[str, Any]:
    return {} if layout is None else dict(zip(LAYOUT_COLUMNS, layout))


def _derives_dp(grid: Mapping[str, Any]) -> bool:
    """True when points must derive ``parallel.dp`` (tp or pp swept, dp and layout not)."""
    return (("parallel.tp" in grid or "parallel.pp" in grid)
            and "parallel.dp" not in grid and LAYOUT not in grid)


def point_key(base: Mapping, overrides: Mapping[str, Any]) -> str:
    """Stable 16-hex-digit hash of a base experiment and a point's overrides."""
    text = json.dumps({"base": base, "overrides": overrides}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def expand_grid(base: Mapping, grid: Grid, *, max_tp: int | None = None) -> list[Point]:
    """All points of ``grid`` over ``base`` (a base without its ``sweep`` section), in a stable order.

    Parameters
    ----------
    base : Mapping
        The experiment document the overrides apply to.
    grid : Mapping
        Dotted path -> list of values, or ``"auto"`` for ``layout`` and
        ``parallel.micro_batch`` (see the module docstring).
    max_tp : int, optional
        Largest tp of ``layout: auto`` (default: the cluster's NVLink domain).

    Returns
    -------
    list of Point
        Duplicate points (same overrides) appear once.
    """
    grid = _normalise_grid(grid)
    clusters = _ClusterCache()
    derived = {"parallel.dp": AUTO} if _derives_dp(grid) else {}
    points: dict[str, Point] = {}
    for combo in _combos(grid):
        params = {k: v for k, v in combo.items() if k != LAYOUT}
        if LAYOUT in combo:
            params.update(_layout_params(combo[LAYOUT]))
        for params2 in _expand_layout(base, grid, params, derived, clusters, max_tp):
            for params3 in _expand_micro_batch(base, grid, params2, derived, clusters):
                overrides = {**derived, **params3}
                key = point_key(base, overrides)
                points.setdefault(key, Point(params3, overrides, key))
    return list(points.values())


def _expand_layout(base: Mapping, grid: Mapping, params: dict, derived: dict, clusters: _ClusterCache,
                   max_tp: int | None) -> list[dict]:
    if grid.get(LAYOUT) != AUTO:
        return [params]
    doc = apply_overrides(base, {**derived, **params})
    return [{**params, **_layout_params(lay)} for lay in _auto_layouts(doc, clusters, max_tp)]


def _expand_micro_batch(base: Mapping, grid: Mapping, params: dict, derived: dict,
                        clusters: _ClusterCache) -> list[dict]:
    if grid.get("parallel.micro_batch") != AUTO:
        return [params]
    doc = apply_overrides(base, {**derived, **params})
    return [{**params, "parallel.micro_batch": mb} for mb in _auto_micro_batches(doc, clusters)]


# ---------------------------------------------------------------------- workers
def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _metrics(summary: Mapping[str, Any]) -> dict[str, Any]:
    """Flatten a run's summary into the numeric columns of a row."""
    row = {k: summary.get(k) for k in METRIC_COLUMNS}
    row.update({f"exposed_{cls}_s": v for cls, v in summary.get("exposed_comm_by_class_s", {}).items()})
    row.update({f"bytes_{tier}": v for tier, v in summary.get("bytes_by_tier", {}).items()})
    row["memory_per_gpu_bytes"] = summary.get("memory_per_gpu_bytes")
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
        ``status``, ``reason``, ``sim_wall_s``, the resolved ``parallel.dp``
        when the document resolved, ``memory_per_gpu_bytes`` when it was
        computed, and the metrics of :func:`_metrics` when ``status == "ok"``.
    """
    t0 = time.perf_counter()
    out: dict[str, Any] = {"status": "ok", "reason": ""}
    try:
        exp = experiment_from_dict(doc)
        out["parallel.dp"] = exp.parallel.dp
        out["memory_per_gpu_bytes"] = float(exp.memory().total)
        out.update(_metrics(run_experiment(exp).summary))
    except OutOfMemoryError as exc:
        out.update(status="oom", reason=_one_line(exc))
    except ValueError as exc:
        out.update(status="invalid", reason=_one_line(exc))
    except Exception as exc:  # noqa: BLE001 - a failed point is a row, not a crash of the sweep
        out.update(status="failed", reason=f"{type(exc).__name__}: {_one_line(exc)}")
    out["sim_wall_s"] = time.perf_counter() - t0
    return out


def _ignore_sigint() -> None:
    """Pool-worker initializer: Ctrl-C is handled by the parent, which writes the rows and stops the pool."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@contextlib.contextmanager
def _inline(docs: Sequence[Mapping]) -> Iterator[Iterator[tuple[int, dict]]]:
    yield ((i, run_point(doc)) for i, doc in enumerate(docs))


def _mp_context() -> multiprocessing.context.BaseContext:
    """``fork`` on Linux while this process has a single thread (fast; no ``__main__`` guard needed),
    ``forkserver`` on Linux otherwise (fork is unsafe with threads: Jupyter, a Dask client), ``spawn`` elsewhere.
    """
    if not sys.platform.startswith("linux"):
        return multiprocessing.get_context("spawn")
    return multiprocessing.get_context("fork" if threading.active_count() == 1 else "forkserver")


@contextlib.contextmanager
def _process_pool(docs: Sequence[Mapping], jobs: int) -> Iterator[Iterator[tuple[int, dict]]]:
    pool = cf.ProcessPoolExecutor(max_workers=jobs, mp_context=_mp_context(), initializer=_ignore_sigint)
    futures = {pool.submit(run_point, doc): i for i, doc in enumerate(docs)}
    finished = False
    try:
        yield ((futures[f], _pool_result(f)) for f in cf.as_completed(futures))
        finished = True
    finally:
        workers = list((getattr(pool, "_processes", None) or {}).values())  # shutdown() forgets them
        pool.shutdown(wait=finished, cancel_futures=True)
        if not finished:
            _terminate(workers)


def _pool_result(future: cf.Future) -> dict:
    """A finished pool future's row; a crashed worker becomes a ``failed`` row."""
    try:
        return future.result()
    except Exception as exc:  # noqa: BLE001 - e.g. BrokenProcessPool
        return {"status": "failed", "reason": f"{type(exc).__name__}: {_one_line(exc)}", "sim_wall_s": float("nan")}


def _terminate(workers: Iterable[multiprocessing.process.BaseProcess]) -> None:
    """Stop the workers of an interrupted pool now rather than after their current point."""
    for proc in workers:
        with contextlib.suppress(Exception):
            proc.terminate()
    for proc in workers:
        with contextlib.suppress(Exception):
            proc.join(timeout=5)


@contextlib.contextmanager
def _dask(docs: Sequence[Mapping], address: str) -> Iterator[Iterator[tuple[int, dict]]]:
    try:
        from distributed import Client, as_completed
    except ImportError:
        raise ValueError("--scheduler needs dask.distributed: pip install 'clustersim[dask]'") from None
    try:
        client = Client(address, timeout="30s")
    except OSError as exc:
        raise ValueError(f"--scheduler: cannot connect to {address}: {_one_line(exc)}") from None
    futures = client.map(run_point, list(docs), pure=False)
    index = {f.key: i for i, f in enumerate(futures)}
    finished = False
    try:
        yield ((index[f.key], _dask_result(f)) for f in as_completed(futures))
        finished = True
    finally:
        if not finished:
            client.cancel(futures)
        client.close()


def _dask_result(future: Any) -> dict:
    """A finished Dask future's row; an error (e.g. a killed worker) becomes a ``failed`` row."""
    try:
        return future.result()
    except Exception as exc:  # noqa: BLE001
        return {"status": "failed", "reason": f"{type(exc).__name__}: {_one_line(exc)}", "sim_wall_s": float("nan")}


def _executor(docs: Sequence[Mapping], jobs: int | None, scheduler: str | None):
    """The context manager that runs ``docs`` and yields ``(index, result)`` pairs as they finish."""
    if scheduler:
        return _dask(docs, scheduler)
    jobs = min(jobs or os.cpu_count() or 1, len(docs))
    return _inline(docs) if jobs <= 1 else _process_pool(docs, jobs)


# ----------------------------------------------------------------------- tables
def _cell(value: Any) -> Any:
    """A parameter value as a table cell: scalars as they are, lists and mappings as YAML flow text."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return yaml.safe_dump(value, default_flow_style=True, width=1 << 16).strip()


def _row(point: Point, result: Mapping[str, Any], derived_dp: bool) -> dict[str, Any]:
    row = {k: _cell(v) for k, v in point.params.items()}
    if derived_dp:
        row["parallel.dp"] = result.get("parallel.dp")
    row.update({k: v for k, v in result.items() if k != "parallel.dp"})
    row[KEY_COLUMN] = point.key
    return row


def _ordered_columns(df: pd.DataFrame, param_columns: Sequence[str]) -> list[str]:
    fixed = ["rank", "status", "reason", *METRIC_COLUMNS]
    exposed = sorted(c for c in df.columns if c.startswith("exposed_") and c.endswith("_s") and c not in fixed)
    tiers = sorted(c for c in df.columns if c.startswith("bytes_"))
    tail = ["memory_per_gpu_bytes", "sim_wall_s", KEY_COLUMN]
    known = [*param_columns, *fixed, *exposed, *tiers, *tail]
    return known + [c for c in df.columns if c not in known]


def _check_metric(metric: str) -> None:
    if metric in METRIC_COLUMNS or metric == "memory_per_gpu_bytes" or metric.startswith("bytes_") or (
            metric.startswith("exposed_") and metric.endswith("_s")):
        return
    raise ValueError(f"metric: {metric!r} unknown; valid: {', '.join(METRIC_COLUMNS)}, memory_per_gpu_bytes, "
                     f"exposed_<class>_s, bytes_<tier>")


def rank_table(df: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Sort ``ok`` rows by ``metric`` (best first, ties in point order), then the others; add ``rank``."""
    df = df.reset_index(drop=True)
    ok = df["status"] == "ok"
    order = df[ok].sort_values(metric, ascending=metric not in HIGHER_IS_BETTER, kind="stable",
                               na_position="last")
    out = pd.concat([order, df[~ok]])
    out["rank"] = pd.array([*range(1, len(order) + 1), *[pd.NA] * int((~ok).sum())], dtype="Int64")
    return out.reset_index(drop=True)


def _table(rows: Iterable[Mapping[str, Any]], param_columns: Sequence[str], metric: str) -> pd.DataFrame:
    """The sweep's DataFrame: one row per point, class/tier columns 0.0 for ``ok`` rows that lack them."""
    df = pd.DataFrame(list(rows))
    if df.empty:
        df = pd.DataFrame(columns=[*param_columns, "status", "reason", KEY_COLUMN])
    for col in ("reason", "sim_wall_s", "memory_per_gpu_bytes", *METRIC_COLUMNS, metric):
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


def _integer_columns(df: pd.DataFrame, columns: Iterable[str]) -> None:
    """Numeric columns with gaps whose values are all integers (e.g. a derived dp) become ``Int64`` in place."""
    for col in columns:
        if col not in df.columns or df[col].dtype == bool or not pd.api.types.is_numeric_dtype(df[col]):
            continue
        values = df[col].dropna()
        if len(values) < len(df) and len(values) and (values == values.round()).all():
            df[col] = df[col].astype("Int64")


def status_counts(df: pd.DataFrame) -> dict[str, int]:
    """Rows per status, every status present (zero when absent)."""
    counts = df["status"].value_counts() if len(df) else {}
    return {s: int(counts.get(s, 0)) for s in STATUSES}


def counts_line(df: pd.DataFrame) -> str:
    """One line: the number of points and of each status, e.g. ``12 points: 7 ok, 3 invalid, 2 oom, 0 failed``."""
    counts = status_counts(df)
    return f"{len(df)} points: " + ", ".join(f"{n} {s}" for s, n in counts.items())


def top_table(df: pd.DataFrame, k: int, metric: str | None = None) -> str:
    """The best ``k`` feasible rows as a text table: rank, swept parameters and the headline metrics.

    ``metric`` defaults to the one the sweep ranked by (``df.attrs["metric"]``).
    """
    metric = metric or df.attrs.get("metric", "step_time_s")
    ok = df[df["status"] == "ok"].head(k)
    if ok.empty:
        return "no feasible point"
    skip = {"rank", "status", "reason", KEY_COLUMN, "sim_wall_s", "memory_per_gpu_bytes"}
    first = list(df.columns).index("rank")
    params = [c for c in df.columns[:first] if c not in skip]
    shown = ["rank", *params, *dict.fromkeys([metric, *METRIC_COLUMNS[:5]])]
    table = ok[shown].copy()
    table["memory_GB"] = ok["memory_per_gpu_bytes"] / 1e9
    return table.to_string(index=False, float_format=lambda x: f"{x:.4g}")


def _output_format(path: str | os.PathLike) -> str:
    """``.csv`` or ``.parquet``; a one-line ``ValueError`` for anything else or for Parquet without pyarrow."""
    suffix = Path(path).suffix.lower()
    if suffix not in OUTPUT_FORMATS:
        raise ValueError(f"output: {os.fspath(path)!r} must end in {' or '.join(OUTPUT_FORMATS)}")
    if suffix == ".parquet" and importlib.util.find_spec("pyarrow") is None:
        raise ValueError("output: .parquet needs pyarrow: pip install 'clustersim[parquet]' (or write .csv)")
    return suffix


def read_table(path: str | os.PathLike) -> pd.DataFrame:
    """Read a sweep table written by :func:`write_table` (CSV or Parquet by extension)."""
    if _output_format(path) == ".parquet":
        return pd.read_parquet(path)
    return pd.read_csv(path, keep_default_na=False, na_values=[""])


def _parquet_safe(df: pd.DataFrame) -> pd.DataFrame:
    """Object columns that mix types (e.g. ints and strings) become strings, which Arrow can store."""
    df = df.copy()
    for col in df.columns:
        values = df[col].dropna()
        if pd.api.types.is_object_dtype(df[col].dtype) and not values.map(lambda v: isinstance(v, str)).all():
            df[col] = df[col].map(lambda v: v if v is None or (isinstance(v, float) and math.isnan(v)) else str(v))
    return df


def write_table(df: pd.DataFrame, path: str | os.PathLike) -> None:
    """Write ``df`` to ``path`` (CSV or Parquet by extension) atomically: a temporary file, then a rename."""
    fmt = _output_format(path)
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    if fmt == ".parquet":
        _parquet_safe(df).to_parquet(tmp, index=False)
    else:
        df.to_csv(tmp, index=False)
    os.replace(tmp, path)


# ------------------------------------------------------------------------ sweep
def _load_base(base: Mapping | str | os.PathLike) -> dict:
    if isinstance(base, (str, os.PathLike)):
        return read_experiment_file(base)
    if not isinstance(base, Mapping):
        raise ValueError(f"base: must be an experiment dict or a YAML path, got {type(base).__name__}")
    return copy.deepcopy(dict(base))


def _previous_rows(output: str | os.PathLike | None, keys: set[str]) -> tuple[dict[str, dict], pd.DataFrame]:
    """Rows of ``output`` to reuse (by point key) and the rows of other sweeps to keep."""
    if output is None or not Path(output).exists():
        return {}, pd.DataFrame()
    old = read_table(output)
    if KEY_COLUMN not in old.columns or "status" not in old.columns:
        raise ValueError(f"output: {os.fspath(output)!r} exists but is not a sweep table; choose another file")
    mine = old[KEY_COLUMN].isin(keys)
    reuse = old[mine & old["status"].isin(REUSABLE)].drop(columns=["rank"], errors="ignore")
    rows = {r[KEY_COLUMN]: {k: v for k, v in r.items() if not _isna(v)} for r in reuse.to_dict("records")}
    return rows, old[~mine]


def _isna(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA


def _progress(total: int, enabled: bool):
    from tqdm.auto import tqdm
    return tqdm(total=total, disable=not enabled or total == 0, unit="pt", desc="sweep", dynamic_ncols=True)


class _Recorder:
    """Collects rows, rewrites the output file on checkpoints and at the end."""

    def __init__(self, points: Sequence[Point], param_columns: Sequence[str], metric: str, derived_dp: bool,
                 output: str | os.PathLike | None, rows: dict[str, dict], foreign: pd.DataFrame) -> None:
        self.points, self.param_columns, self.metric = points, param_columns, metric
        self.derived_dp, self.output, self.rows, self.foreign = derived_dp, output, rows, foreign
        self.last_write = time.monotonic()

    def add(self, point: Point, result: Mapping[str, Any]) -> None:
        self.rows[point.key] = _row(point, result, self.derived_dp)
        if self.output is not None and time.monotonic() - self.last_write > CHECKPOINT_S:
            self.write()

    def table(self) -> pd.DataFrame:
        """This sweep's rows, in point order before ranking."""
        return _table([self.rows[p.key] for p in self.points if p.key in self.rows], self.param_columns,
                      self.metric)

    def write(self) -> pd.DataFrame:
        table = self.table()
        table.attrs["metric"] = self.metric
        if self.output is not None:
            full = table if self.foreign.empty else pd.concat([table, self.foreign], ignore_index=True)
            write_table(full, self.output)
        self.last_write = time.monotonic()
        return table


def _param_columns(grid: Mapping[str, Any]) -> list[str]:
    cols: list[str] = []
    for key in grid:
        cols.extend(LAYOUT_COLUMNS if key == LAYOUT else [key])
    if _derives_dp(grid):
        last = max(i for i, c in enumerate(cols) if c in ("parallel.tp", "parallel.pp"))
        cols.insert(last + 1, "parallel.dp")
    return cols


def sweep(base: Mapping | str | os.PathLike, grid: Grid | None = None, *, metric: str | None = None,
          jobs: int | None = None, scheduler: str | None = None, output: str | os.PathLike | None = None,
          progress: bool = True, max_tp: int | None = None,
          on_start: Callable[[int, int], None] | None = None) -> pd.DataFrame:
    """Simulate every point of a grid over a base experiment and rank the feasible ones.

    Parameters
    ----------
    base : dict or path
        An experiment document or YAML file. Its ``sweep:`` section (``grid``,
        ``metric``, ``max_tp``) supplies defaults.
    grid : Mapping, optional
        Dotted path -> list of values (or ``"auto"`` for ``layout`` and
        ``parallel.micro_batch``); replaces the same keys of the file's grid
        and adds new ones.
    metric : str, optional
        Ranking column (default: the file's ``sweep.metric`` or
        ``step_time_s``); lower is better except for :data:`HIGHER_IS_BETTER`.
    jobs : int, optional
        Local worker processes (default all cores; 1 runs in this process).
    scheduler : str, optional
        Address of a Dask distributed scheduler, e.g. ``tcp://10.0.0.1:8786``;
        overrides ``jobs``.
    output : path, optional
        ``.csv`` or ``.parquet`` file; rows already there are reused (resume).
    progress : bool, default True
        Show a tqdm progress bar (rate and ETA).
    max_tp : int, optional
        Largest tp of ``layout: auto`` (default: GPUs per server).
    on_start : callable, optional
        Called as ``on_start(points, reused)`` before the first point runs.

    Returns
    -------
    pandas.DataFrame
        One row per point, ``ok`` rows first in rank order.

    Raises
    ------
    ValueError
        A malformed grid, metric or output path (bad points are rows instead).
    SweepInterrupted
        On Ctrl-C, after writing the finished rows; ``.table`` holds them.

    Examples
    --------
    >>> df = sweep("examples/demo.yaml", {"parallel.tp": [1, 2, 4]}, jobs=1, progress=False)  # doctest: +SKIP
    >>> df[["parallel.tp", "parallel.dp", "status", "step_time_s"]]                            # doctest: +SKIP
    """
    doc = _load_base(base)
    settings = sweep_settings(doc)
    base_doc = {k: v for k, v in doc.items() if k != "sweep"}
    full_grid = _normalise_grid(merge_grids(settings["grid"], grid))
    if not full_grid:
        raise ValueError("grid: nothing to sweep; give --grid PATH=V1,V2 or a sweep: {grid: {...}} section")
    check_fields(base_doc, full_grid)
    metric = metric or settings["metric"] or "step_time_s"
    _check_metric(metric)
    if output is not None:
        _output_format(output)
    points = expand_grid(base_doc, full_grid, max_tp=max_tp or settings["max_tp"])
    rows, foreign = _previous_rows(output, {p.key for p in points})
    for p in points:  # reused rows show this sweep's parameter values, not their CSV spelling
        if p.key in rows:
            rows[p.key].update({k: _cell(v) for k, v in p.params.items()})
    todo = [p for p in points if p.key not in rows]
    if on_start is not None:
        on_start(len(points), len(points) - len(todo))
    recorder = _Recorder(points, _param_columns(full_grid), metric, _derives_dp(full_grid), output, rows, foreign)
    _run(todo, base_doc, recorder, jobs, scheduler, progress)
    return recorder.write()


def _run(todo: Sequence[Point], base: Mapping, recorder: _Recorder, jobs: int | None, scheduler: str | None,
         progress: bool) -> None:
    """Run ``todo`` on the chosen executor, feeding ``recorder``; Ctrl-C writes and raises SweepInterrupted."""
    if not todo:
        return
    docs = [apply_overrides(base, p.overrides) for p in todo]
    bar = None
    try:
        with _executor(docs, jobs, scheduler) as results:
            bar = _progress(len(todo), progress)  # after the pool forked: tqdm starts a monitor thread
            for i, result in results:
                recorder.add(todo[i], result)
                bar.update(1)
    except KeyboardInterrupt:
        raise SweepInterrupted(recorder.write(), recorder.output) from None
    finally:
        if bar is not None:
            bar.close()
