"""Sweep points: expand a grid over a base experiment into keyed points (``layout`` and micro-batch ``auto``)."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from topologies import build_cluster
from topologies.loader import topology_key
from workloads.errors import divisors

from ..experiment import derived_dp
from .columns import LAYOUT_COLUMNS
from .grid import AUTO, LAYOUT, Grid, derives_dp, normalise_grid
from .paths import apply_overrides, get_path

__all__ = ["Point", "point_key", "layouts", "expand_grid", "topology_digest"]


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


def point_key(base: Mapping, overrides: Mapping[str, Any]) -> str:
    """Stable hash of a base experiment and a point's overrides, and of the topology file the point's cluster
    reads, if any (so that a resumed sweep re-simulates the points of a fabric file edited since).

    Parameters
    ----------
    base : Mapping
        The experiment document, without its ``sweep`` section.
    overrides : Mapping
        Dotted path -> value; their order does not matter.

    Returns
    -------
    str
        16 hex digits (the start of a SHA-256).
    """
    content = {"base": base, "overrides": overrides}
    digest = topology_digest(base, overrides)
    if digest is not None:  # (only then: the keys of every other sweep stay what they were)
        content["topology_sha256"] = digest
    text = json.dumps(content, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


_DIGESTS: dict[tuple[str, int, int], str] = {}  # (path, mtime ns, size) -> SHA-256 of the file's bytes


def topology_digest(base: Mapping, overrides: Mapping[str, Any]) -> str | None:
    """SHA-256 of the topology file the point's ``cluster:`` section names, or None (none named, or no such
    file: the point is then invalid and says so)."""
    cluster = {k: v for k, v in overrides.items() if k.startswith("cluster.")}
    try:
        section = get_path(apply_overrides({"cluster": base.get("cluster")}, cluster), "cluster")
    except (ValueError, TypeError):  # (a malformed cluster section: the point is invalid and its run says why)
        return None
    if not isinstance(section, Mapping):
        return None
    key = topology_key(section)
    path = section.get(key) if key else None
    if not isinstance(path, str):
        return None
    path = os.path.expanduser(path.strip())
    try:
        stat = os.stat(path)
        memo = (os.path.abspath(path), stat.st_mtime_ns, stat.st_size)
        if memo not in _DIGESTS:
            with open(path, "rb") as f:
                _DIGESTS[memo] = hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None
    return _DIGESTS[memo]


def layouts(num_gpus: int, max_tp: int) -> list[tuple[int, int, int]]:
    """Every ``(tp, pp, dp)`` with ``tp * pp * dp == num_gpus`` and ``tp <= max_tp``.

    Parameters
    ----------
    num_gpus : int
        GPUs in the cluster.
    max_tp : int
        Largest tensor-parallel degree (usually the GPUs per NVLink domain).

    Returns
    -------
    list of (int, int, int)
        In increasing ``tp``, then ``pp``.

    Examples
    --------
    >>> layouts(4, 2)
    [(1, 1, 4), (1, 2, 2), (1, 4, 1), (2, 1, 2), (2, 2, 1)]
    """
    return [(tp, pp, num_gpus // (tp * pp)) for tp in divisors(num_gpus) if tp <= max_tp
            for pp in divisors(num_gpus // tp)]


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


def _auto_layouts(doc: Mapping, clusters: _ClusterCache, max_tp: int | None) -> list[dict[str, Any]]:
    """The layout columns of every ``(tp, pp, dp)`` of the point's cluster."""
    sizes = clusters.sizes(doc)
    if sizes is None:
        return [{}]  # the point resolves to an invalid row with the cluster's own message
    num_gpus, per_server = sizes
    cp = get_path(doc, "parallel.cp", 1)  # (context parallelism takes its share of the GPUs first)
    if isinstance(cp, bool) or not isinstance(cp, int) or cp < 1 or num_gpus % cp:
        return [{}]  # the point resolves to an invalid row with the layout's own message
    return [dict(zip(LAYOUT_COLUMNS, lay)) for lay in layouts(num_gpus // cp, max_tp or per_server)]


def _point_dp(doc: Mapping, clusters: _ClusterCache) -> int | None:
    """The point's dp: explicit, or derived from the cluster size as :func:`experiment_from_dict` does."""
    dp = get_path(doc, "parallel.dp", AUTO)
    if dp != AUTO:
        return dp if isinstance(dp, int) else None
    tp, pp, cp = (get_path(doc, f"parallel.{k}", 1) for k in ("tp", "pp", "cp"))
    sizes = clusters.sizes(doc)
    if sizes is None or not all(isinstance(v, int) and v > 0 for v in (tp, pp, cp)):
        return None
    return derived_dp(sizes[0], tp * cp, pp)


def _auto_micro_batches(doc: Mapping, clusters: _ClusterCache) -> list[dict[str, Any]]:
    """Every micro-batch size dividing ``global_batch / dp``; the base value when that is not defined."""
    dp = _point_dp(doc, clusters)
    gb = get_path(doc, "parallel.global_batch")
    if dp and isinstance(gb, int) and gb > 0 and gb % dp == 0:
        sizes = divisors(gb // dp)
    else:
        sizes = [get_path(doc, "parallel.micro_batch", 1)]
    return [{"parallel.micro_batch": mb} for mb in sizes]


def _combos(grid: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Cartesian product of the non-auto grid entries, first key outermost; a layout becomes its columns."""
    keys = [k for k, v in grid.items() if v != AUTO]
    for values in itertools.product(*(grid[k] for k in keys)):
        combo = dict(zip(keys, values))
        layout = combo.pop(LAYOUT, None)
        yield combo if layout is None else {**combo, **dict(zip(LAYOUT_COLUMNS, layout))}


def expand_grid(base: Mapping, grid: Grid, *, max_tp: int | None = None) -> list[Point]:
    """All points of ``grid`` over ``base`` (a base without its ``sweep`` section), in a stable order.

    Parameters
    ----------
    base : Mapping
        The experiment document the overrides apply to.
    grid : Mapping
        Dotted path -> list of values, or ``"auto"`` for ``layout`` and
        ``parallel.micro_batch`` (see :mod:`simulator.sweeps`).
    max_tp : int, optional
        Largest tp of ``layout: auto`` (default: the cluster's NVLink domain).

    Returns
    -------
    list of Point
        Duplicate points (same overrides) appear once.
    """
    grid = normalise_grid(grid)
    clusters = _ClusterCache()
    derived = {"parallel.dp": AUTO} if derives_dp(grid) else {}
    autos: list[Callable[[Mapping], list[dict[str, Any]]]] = []  # expansion order: layout, then micro-batch
    if grid.get(LAYOUT) == AUTO:
        autos.append(lambda doc: _auto_layouts(doc, clusters, max_tp))
    elif max_tp is not None:  # (it would be silently ignored)
        raise ValueError(f"max_tp: {max_tp} bounds tp in layout: auto, which this grid does not sweep; give "
                         f"--grid layout=auto, or list parallel.tp values")
    if grid.get("parallel.micro_batch") == AUTO:
        autos.append(lambda doc: _auto_micro_batches(doc, clusters))
    points: dict[str, Point] = {}
    for combo in _combos(grid):
        expanded = [combo]
        for auto in autos:  # each sees the cluster and batch of its own point
            expanded = [{**params, **extra} for params in expanded
                        for extra in auto(apply_overrides(base, {**derived, **params}))]
        for params in expanded:
            overrides = {**derived, **params}
            key = point_key(base, overrides)
            points.setdefault(key, Point(params, overrides, key))
    return list(points.values())
