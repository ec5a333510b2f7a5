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
``ok`` rows carry :data:`CAPACITY_COLUMNS` too (``fabric_cost_usd``,
``fabric_power_kw``, ``bisection_bytes_s``; :mod:`topologies.capacity`),
computed once per distinct cluster per worker, so step time can be traded
against fabric cost.

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

Fidelity
--------
Points run at the file's ``fidelity`` (default ``fast``) or at the sweep's
``fidelity`` argument (``--fidelity``), which is part of each point's key.
``screen`` prices a layout in closed form (:mod:`simulator.screen`,
milliseconds instead of seconds; no ``bytes_<tier>`` columns) for ranking;
``refine=K`` then simulates the best ``K`` in ``fast`` and puts them first.
Every row says in ``fidelity`` which fidelity produced it.

Execution
---------
``jobs=1`` runs in this process; otherwise a process pool of ``jobs`` workers
(default: all cores; ``fork`` on Linux while the caller is single-threaded,
``forkserver`` when it has threads (Jupyter, a Dask client), ``spawn``
elsewhere; scripts run with ``spawn``/``forkserver`` need the usual
``if __name__ == "__main__":`` guard). Workers ignore SIGINT: on Ctrl-C the
parent writes the finished rows and terminates them.
``scheduler="tcp://host:port"`` submits the points to an existing
Dask distributed cluster (install the ``dask`` extra on the client and on
every worker). The simulator is deterministic, so every executor gives the
same table except ``sim_wall_s``.

Modules
-------
========== ==================================================================
columns    column names and statuses of a sweep table; metric check
paths      dotted paths into an experiment document (get, set, override)
grid       ``--grid`` arguments, ``sweep:`` sections, grid checks
points     grid expansion into keyed points (``layout``/micro-batch ``auto``)
worker     one point: resolve and simulate into a result dict
execute    executors: in-process, local process pool, Dask
table      rows, column order, dtypes and ranking
report     status counts and the top-k text table
store      CSV/Parquet read and atomic write; rows reused on resume
errors     :class:`SweepInterrupted` and one-line error text
driver     :func:`sweep`: load, expand, resume, run, checkpoint
========== ==================================================================
"""

from .columns import (
    CAPACITY_COLUMNS,
    FIDELITIES,
    FIDELITY_COLUMN,
    HIGHER_IS_BETTER,
    KEY_COLUMN,
    LAYOUT_COLUMNS,
    METRIC_COLUMNS,
    SCREEN,
    STATUSES,
)
from .driver import CHECKPOINT_S, sweep
from .errors import SweepInterrupted
from .grid import AUTO, AUTO_KEYS, LAYOUT, SWEEP_FIELDS, Grid, check_fields, merge_grids, parse_grid_arg, sweep_settings
from .paths import apply_overrides, get_path, set_path
from .points import Point, expand_grid, layouts, point_key
from .report import batch_note, counts_line, reasons_lines, status_counts, top_table
from .store import OUTPUT_FORMATS, REUSABLE, read_table, write_table
from .table import rank_table
from .worker import run_point

__all__ = [
    "sweep", "run_point", "expand_grid", "parse_grid_arg", "check_fields", "sweep_settings", "merge_grids",
    "rank_table", "status_counts", "counts_line", "reasons_lines", "top_table", "batch_note", "read_table",
    "write_table", "Point",
    "SweepInterrupted",
    "STATUSES", "HIGHER_IS_BETTER", "METRIC_COLUMNS", "CAPACITY_COLUMNS", "LAYOUT", "AUTO",
    "point_key", "layouts", "get_path", "set_path", "apply_overrides", "Grid",
    "AUTO_KEYS", "LAYOUT_COLUMNS", "KEY_COLUMN", "CHECKPOINT_S", "SWEEP_FIELDS", "OUTPUT_FORMATS", "REUSABLE",
    "FIDELITIES", "FIDELITY_COLUMN", "SCREEN",
]
