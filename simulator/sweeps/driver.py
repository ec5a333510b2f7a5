"""The :func:`sweep` entry point: load the base, expand the grid, reuse finished rows, run the rest, checkpoint."""

from __future__ import annotations

import contextlib
import copy
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pandas as pd

from topologies.loader import resolve_topology_path
from workloads.errors import check_bool, is_int, with_prefix

from ..experiment import check_not_jobs, read_experiment_file
from ..output_paths import check_writable
from .columns import SCREEN, check_fidelity, check_max_tp, check_metric
from .errors import SweepInterrupted
from .execute import executor
from .grid import Grid, check_fields, merge_grids, normalise_grid, param_columns, shows_dp, sweep_settings
from .paths import apply_overrides
from .points import Point, expand_grid, point_key
from .store import output_format, output_lock, previous_rows, write_table
from .table import build_table, cell, merge_refined, result_row, with_other_rows

__all__ = ["CHECKPOINT_S", "sweep"]

CHECKPOINT_S = 30.0
"""Seconds between rewrites of the output file while a sweep runs."""


def sweep(base: Mapping | str | os.PathLike, grid: Grid | None = None, *, metric: str | None = None,
          jobs: int | None = None, scheduler: str | None = None, output: str | os.PathLike | None = None,
          progress: bool = True, max_tp: int | None = None,
          on_start: Callable[[int, int], None] | None = None, fidelity: str | None = None,
          refine: int | None = None, on_refine: Callable[[int, int], None] | None = None,
          checkpoint_s: float = CHECKPOINT_S) -> pd.DataFrame:
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
        ``step_time_s``); lower is better except for
        :data:`~simulator.sweeps.columns.HIGHER_IS_BETTER`.
    jobs : int, optional
        Local worker processes (default all cores; 1 runs in this process); any
        integer >= 1, numpy's too (``np.int64``), not a bool.
    scheduler : str, optional
        Address of a Dask distributed scheduler, e.g. ``tcp://10.0.0.1:8786``;
        overrides ``jobs``.
    output : path, optional
        ``.csv`` or ``.parquet`` file; rows already there are reused (resume).
        Rewritten every ``checkpoint_s`` seconds (30 s) and at the end.
    progress : bool, default True
        Show a tqdm progress bar (rate and ETA).
    max_tp : int, optional
        Largest tp of ``layout: auto`` (default: GPUs per server).
    on_start : callable, optional
        Called as ``on_start(points, reused)`` before the first point runs.
    fidelity : str, optional
        Every point's fidelity: ``fast``, ``full``, ``lockstep`` (the
        simulator's) or ``screen`` (:mod:`simulator.screen`: a closed-form
        estimate in milliseconds, for ranking). Default: the file's
        ``fidelity`` field, else ``fast``. Part of each point's key, so a
        screened row is never reused as a simulated one. Not with a grid
        that sweeps ``fidelity`` (which sets every point's): a ValueError.
    refine : int, optional
        With ``fidelity="screen"``: simulate the best ``refine`` feasible
        points again in ``fast``. Their rows then hold the ``fast`` results
        (``fidelity`` column ``fast``) and come first, ranked by ``fast``;
        the other rows follow in screened order. Every ``ok`` row also carries
        ``screen_<metric>`` and ``screen_rank``, the screen's value and rank.
        Not with a grid that sweeps ``fidelity`` (a ValueError).
    on_refine : callable, optional
        Called as ``on_refine(points, reused)`` before the refined points run.
    checkpoint_s : float, default :data:`CHECKPOINT_S`
        Seconds between rewrites of ``output`` while the sweep runs (> 0).

    Returns
    -------
    pandas.DataFrame
        One row per point, ``ok`` rows first in rank order; times in seconds
        (``*_s``), sizes in bytes (``memory_per_gpu_bytes``, ``bytes_<tier>``).

    Raises
    ------
    ValueError
        A malformed grid, metric or output path (bad points are rows instead).
    SweepInterrupted
        On Ctrl-C, after writing the finished rows; ``.table`` holds them.

    Every row carries ``fidelity``, the fidelity that produced it.

    Examples
    --------
    >>> df = sweep("examples/demo.yaml", {"parallel.tp": [1, 2, 4]}, jobs=1, progress=False)  # doctest: +SKIP
    >>> df[["parallel.tp", "parallel.dp", "status", "step_time_s"]]                            # doctest: +SKIP
    """
    check_bool("progress", progress)
    if isinstance(checkpoint_s, bool) or not isinstance(checkpoint_s, (int, float)) or not checkpoint_s > 0:
        raise ValueError(f"checkpoint_s: must be a number of seconds > 0, got {checkpoint_s!r}")
    if jobs is not None and (not is_int(jobs) or jobs < 1):  # (numpy's integers too, as an int)
        raise ValueError(f"jobs: must be an integer >= 1 (worker processes; None: one per core), got {jobs!r}")
    jobs = None if jobs is None else int(jobs)
    if grid is not None and not isinstance(grid, Mapping):
        raise ValueError(f"grid: must map dotted paths to lists of values, e.g. {{'parallel.tp': [1, 2, 4]}}; "
                         f"got {type(grid).__name__}")
    for name, hook in (("on_start", on_start), ("on_refine", on_refine)):
        if hook is not None and not callable(hook):
            raise ValueError(f"{name}: must be a callable {name}(points, reused), got {type(hook).__name__}")
    doc = _load_base(base)
    settings = sweep_settings(doc)
    base_doc = {k: v for k, v in doc.items() if k != "sweep"}
    if fidelity is not None:
        check_fidelity(fidelity)
        if fidelity != base_doc.get("fidelity", "fast"):  # the file's own fidelity keeps the keys it had
            base_doc["fidelity"] = fidelity
    screening = base_doc.get("fidelity") == SCREEN
    if refine is not None:
        if isinstance(refine, bool) or not isinstance(refine, int) or refine < 1:
            raise ValueError(f"refine: must be an integer >= 1 (points to simulate again in fast), got {refine!r}")
    # The refined points: the same overrides on the base without a fidelity (``fast``, the default).
    fast_base = {k: v for k, v in base_doc.items() if k != "fidelity"}
    # Topology files named in the grid: the file's own sweep: grid relative to the file (as its cluster:
    # section is), a grid given here relative to the working directory (a path typed in a shell).
    here = os.path.dirname(os.fspath(base)) if isinstance(base, (str, os.PathLike)) else os.getcwd()
    full_grid = normalise_grid(merge_grids(_topology_paths(settings["grid"], here),
                                           _topology_paths(grid, os.getcwd())))
    if not full_grid:
        raise ValueError("grid: nothing to sweep; give --grid PATH=V1,V2 or a sweep: {grid: {...}} section")
    if "fidelity" in full_grid:  # (it set every point's fidelity, silently winning over these)
        swept = ", ".join(map(str, full_grid["fidelity"]))
        if fidelity is not None:
            raise ValueError(f"fidelity: {fidelity!r} given, but the grid sweeps fidelity ({swept}), which sets "
                             f"every point's; give one of them")
        if refine is not None:
            raise ValueError(f"refine: re-simulates the best screened points, but the grid sweeps fidelity "
                             f"({swept}), so the points are not all screened; drop fidelity from the grid and "
                             f"screen (fidelity screen)")
    if refine is not None and not screening:
        raise ValueError("refine: re-simulates the best screened points; it needs fidelity screen "
                         "(--fidelity screen)")
    check_fields(fast_base if screening else base_doc, full_grid)  # the loader refuses fidelity: screen
    metric = metric or settings["metric"] or "step_time_s"
    check_metric(metric)
    if screening and metric.startswith("bytes_"):  # (a screened row has no per-tier bytes: every rank alike)
        raise ValueError(f"metric: {metric} is not a column of screened rows (the screen prices no links' bytes); "
                         f"rank a screen by step_time_s, mfu, tokens_per_s or a cost, or sweep with --fidelity fast")
    if output is not None:
        output_format(output)
        # (before the lock file, a name the user never gave, is what is not found)
        check_writable(os.fspath(output), "output")
    if max_tp is not None:
        check_max_tp(max_tp)
    points = expand_grid(base_doc, full_grid, max_tp=settings["max_tp"] if max_tp is None else max_tp)
    fast_points = {p.key: Point(p.params, p.overrides, point_key(fast_base, p.overrides)) for p in points} \
        if refine else {}
    with output_lock(output):
        keys = {p.key for p in points} | {p.key for p in fast_points.values()}
        rows, foreign = previous_rows(output, keys)
        derived = shows_dp(full_grid, base_doc)
        for p in [*points, *fast_points.values()]:  # reused rows show this sweep's parameter values
            if p.key in rows:  # (and keep the dp they resolved where this sweep derives it)
                rows[p.key].update({k: cell(v) for k, v in p.params.items()
                                    if not (derived and k == "parallel.dp" and v in ("auto", None)
                                            and rows[p.key].get(k) not in ("auto", None))})
        todo = [p for p in points if p.key not in rows]
        if on_start is not None:
            on_start(len(points), len(points) - len(todo))
        columns = param_columns(full_grid, derived)
        # A refine's simulated rows already in the file stay in it while the screen runs (as rows of other
        # sweeps: an interrupted screen must not drop them); those it does not refine stay after it.
        simulated = [rows[p.key] for p in fast_points.values() if p.key in rows]
        recorder = _Recorder(points, columns, metric, derived, output, rows, _with_rows(foreign, simulated),
                             checkpoint_s)
        _run(todo, base_doc, recorder, jobs, scheduler, progress)
        table = recorder.write()
        table.attrs["other_rows"] = len(foreign)
        if not refine:
            return table
        winners = [fast_points[k] for k in table.loc[table["status"] == "ok", "point"].head(refine)]
        # The file's simulated rows of this grid that are not among the winners now (an earlier fast sweep, or
        # an earlier refine of more points) stay in it as rows of other sweeps.
        chosen = {p.key for p in winners}
        foreign = _with_rows(foreign, [rows[p.key] for p in fast_points.values()
                                       if p.key in rows and p.key not in chosen])
        todo = [p for p in winners if p.key not in rows]
        if on_refine is not None:
            on_refine(len(winners), len(winners) - len(todo))
        # Checkpoints of the refinement keep the screened rows in the file (as rows of their own keys).
        keep = with_other_rows(table, foreign)
        fast = _Recorder(winners, columns, metric, derived, output, rows, keep, checkpoint_s)
        _run(todo, fast_base, fast, jobs, scheduler, progress)
        refined = build_table([rows[p.key] for p in winners if p.key in rows], columns, metric)
        final = merge_refined(table, refined, {p.key: fast_points[p.key].key for p in points}, metric)
        final.attrs["metric"] = metric
        final.attrs["other_rows"] = len(foreign)
        if output is not None:
            write_table(with_other_rows(final, foreign), output)
        return final


def _with_rows(others: pd.DataFrame, rows: list[dict]) -> pd.DataFrame:
    """``rows`` (reused row dicts) before ``others`` (an output file's rows of other sweeps), as one frame."""
    if not rows:
        return others
    return pd.concat([pd.DataFrame(rows), others], ignore_index=True) if len(others) else pd.DataFrame(rows)


def _topology_paths(grid: Grid | None, base_dir: str) -> Grid | None:
    """``grid`` with its relative topology file paths (``cluster.topology``, ``cluster.fabric`` naming a file,
    or whole ``cluster`` sections naming one) made absolute against ``base_dir``
    (:func:`topologies.loader.resolve_topology_path`, which leaves anything else as it is)."""
    if not isinstance(grid, Mapping):
        return grid
    out = dict(grid)
    for path, values in grid.items():
        if path in ("cluster", "cluster.topology", "cluster.fabric"):
            listed = isinstance(values, (list, tuple))
            resolved = [_resolved(path, v, base_dir) for v in (values if listed else [values])]
            out[path] = resolved if listed else resolved[0]
    return out


def _resolved(path: str, value: Any, base_dir: str) -> Any:
    """One grid value of ``path`` (a cluster section, or one field of it) with a relative topology path resolved."""
    if path == "cluster":
        return resolve_topology_path(value, base_dir)
    field = path.removeprefix("cluster.")
    return resolve_topology_path({field: value}, base_dir)[field]


def _load_base(base: Mapping | str | os.PathLike) -> dict:
    """The sweep's base document; a jobs file is refused here, once (no override makes it one experiment: every
    point would be invalid for the same reason)."""
    if isinstance(base, (str, os.PathLike)):
        doc = read_experiment_file(base)
        try:
            check_not_jobs(doc)
        except ValueError as exc:
            raise with_prefix(exc, os.fspath(base)) from None
        return doc
    if not isinstance(base, Mapping):
        raise ValueError(f"base: must be an experiment dict or a YAML path, got {type(base).__name__}")
    check_not_jobs(base)
    return copy.deepcopy(dict(base))


class _Recorder:
    """Collects rows, rewrites the output file on checkpoints and at the end."""

    def __init__(self, points: Sequence[Point], param_columns: Sequence[str], metric: str, derived_dp: bool,
                 output: str | os.PathLike | None, rows: dict[str, dict], foreign: pd.DataFrame,
                 checkpoint_s: float) -> None:
        self.points, self.param_columns, self.metric = points, param_columns, metric
        self.derived_dp, self.output, self.rows, self.foreign = derived_dp, output, rows, foreign
        self.checkpoint_s = checkpoint_s
        self.last_write = time.monotonic()

    def add(self, point: Point, result: Mapping[str, Any]) -> None:
        self.rows[point.key] = result_row(point, result, self.derived_dp)
        if self.output is not None and time.monotonic() - self.last_write > self.checkpoint_s:
            self.write()

    def write(self) -> pd.DataFrame:
        """This sweep's ranked table (rows in point order before ranking), also written to ``output``."""
        table = build_table([self.rows[p.key] for p in self.points if p.key in self.rows], self.param_columns,
                            self.metric)
        table.attrs["metric"] = self.metric
        if self.output is not None:
            write_table(with_other_rows(table, self.foreign), self.output)
        self.last_write = time.monotonic()
        return table


def _progress(total: int, enabled: bool):
    """The sweep's progress bar: a notebook widget in a notebook, a text bar on a terminal, none when stderr
    goes to a file or a pipe (as ``clustersim run``'s bar), or when not ``enabled``."""
    if enabled:
        from tqdm.auto import tqdm  # a notebook widget where there is one
        widget = "notebook" in tqdm.__module__  # (tqdm.auto is tqdm.notebook's class in a notebook)
        enabled = widget or sys.stderr.isatty()
    else:
        from tqdm import tqdm  # disabled: no notebook detection (it warns without ipywidgets)
    # No monitor thread: a thread left running would make the next sweep's pool fork a threaded process
    # (or fall back to forkserver, which cannot import a script's __main__).
    tqdm.monitor_interval = 0
    return tqdm(total=total, disable=not enabled or total == 0, unit="pt", desc="sweep", dynamic_ncols=True)


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """SIGTERM (a job scheduler, ``kill``) stops a sweep like Ctrl-C: rows written, workers stopped."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(_signum, _frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run(todo: Sequence[Point], base: Mapping, recorder: _Recorder, jobs: int | None, scheduler: str | None,
         progress: bool) -> None:
    """Run ``todo`` on the chosen executor, feeding ``recorder``; Ctrl-C writes and raises SweepInterrupted."""
    if not todo:
        return
    docs = [apply_overrides(base, p.overrides) for p in todo]
    bar = None
    try:
        with _sigterm_as_interrupt(), executor(docs, jobs, scheduler) as results:
            bar = _progress(len(todo), progress)  # after the pool forked: tqdm starts a monitor thread
            for i, result in results:
                recorder.add(todo[i], result)
                bar.update(1)
    except KeyboardInterrupt:
        raise SweepInterrupted(recorder.write(), recorder.output) from None
    finally:
        if bar is not None:
            bar.close()
