"""Results of a run (contract 3): step time and pandas DataFrames.

Metrics only observe: the engine and the network append plain arrays; the
DataFrames here are built once, lazily, at the end.

Vocabulary
----------
payload bytes (``bytes_by_class``)
    Bytes GPUs put on the wire, each counted once per hop of the collective
    algorithm (a ring all-reduce of S over n ranks sends ``2(n-1)/n·S`` per
    rank). This is the "traffic" a planner means.
link bytes (``bytes_by_tier``, ``links``)
    Wire bytes carried by each directed link; a byte that crosses a
    GPU→NIC→leaf→spine→leaf→NIC→GPU route is counted once per link, under
    that link's tier (nvlink, pcie, leaf, spine, core). Wire bytes are the
    payload in NCCL's protocol format: Simple sends the payload as it is,
    LL128 at 0.92 payload (NCCL's factor for its 120-in-128-byte lines), LL 4
    bytes in 8 (flags); so a small collective's link bytes are up to twice
    its payload (:data:`simulator.nccl.BANDWIDTH_FACTOR`).
link ids (the index of ``links``)
    Positions in this run's fabric. A run with faults has its removed links
    left out of the graph, so its ids differ from the healthy fabric's:
    compare two runs' links on ``(src, dst)``, not on the id.
exposed communication
    Per rank, the time during which any communication op of a class is in
    flight and no compute op runs (``|comm \\ compute|``); reported as the
    mean over ranks.
"""

from __future__ import annotations

import copy
import numbers
import os
from collections.abc import Callable, Sequence
from functools import cached_property
from operator import attrgetter
from typing import TYPE_CHECKING

import numpy as np

from topologies.cluster import TIERS
from workloads.errors import check_bool

from . import breakdown as _breakdown
from .engine import RunRecord

if TYPE_CHECKING:
    import pandas as pd


class Result:
    """What a simulation produced. Build it with :func:`simulator.simulate` or from a :class:`RunRecord`."""

    def __init__(self, record: RunRecord, sim_wall_s: float = 0.0,
                 rank_groups: Sequence[tuple[int, int]] | None = None,
                 group_steps: Sequence[int] | None = None) -> None:
        self.record = record
        # rank ranges [lo, hi) that each run a step of their own (the jobs of a joint run, simulator.jobs):
        # each has its own pipeline window in the breakdowns, and its own stages in timelines and traces;
        # group_steps: how many steps each runs, one after another (a window per step)
        self.rank_groups = [(int(lo), int(hi)) for lo, hi in rank_groups] if rank_groups else None
        self.group_steps = [int(k) for k in group_steps] if group_steps and rank_groups else None
        self.step_time = record.step_time_s
        self.sim_wall_s = sim_wall_s
        self.events = record.events
        self.extra_summary: dict = {}
        self._stages: pd.DataFrame | None = None
        self._stage_records: list[dict] | None = None  # the rows of a deferred ``stages`` (see defer)
        self._deferred: dict[str, Callable[[], object]] = {}

    def __reduce_ex__(self, protocol):
        raise TypeError("a Result does not pickle or deep-copy: it holds its simulation's live state (the fabric "
                        "and flow network its views read); keep its summary and frames (result.summary, "
                        "result.ops.to_parquet(...)), or pickle the Experiment and run it again")

    @property
    def stages(self) -> pd.DataFrame:
        """Where time went per pipeline stage (:func:`simulator.experiment.pipeline_stages`, set by
        :func:`~simulator.experiment.run_experiment`); an empty frame for a bare :func:`simulator.simulate`. A
        copy: the user's to edit (the summary and :meth:`plot_stages` read their own)."""
        return self._stage_frame().copy()

    def _stage_frame(self) -> pd.DataFrame:
        if self._stages is None:
            build = self._deferred.get("stages")
            self._stages = build() if build is not None else _pd().DataFrame()
            self._deferred.pop("stages", None)  # (only once built: a build that raises is tried again)
        return self._stages

    @stages.setter
    def stages(self, value: pd.DataFrame) -> None:
        self._deferred.pop("stages", None)
        self._stages = value
        self._stage_records = None

    def stage_records(self) -> list[dict]:
        """The rows of :attr:`stages` as dicts (column -> value, in column order): what a summary prints. Read
        from the rows the run deferred the frame with while it is not built, and none for a result without
        stages (a bare :func:`simulator.simulate`, a Chakra trace), without importing pandas (~0.2-0.6 s of a
        ``clustersim run``); else from the frame."""
        if self._stages is None:
            if self._stage_records is not None:
                return [dict(row) for row in self._stage_records]
            if "stages" not in self._deferred:
                return []
        return self._stage_frame().to_dict("records")

    @property
    def expert_load(self) -> pd.DataFrame:
        """Tokens per MoE layer and expert (:func:`simulator.experiment.expert_load_table`, set by
        :func:`~simulator.experiment.run_experiment` for a MoE model; no such attribute otherwise)."""
        if "expert_load" in self._deferred:
            self._expert_load = self._deferred["expert_load"]()
            del self._deferred["expert_load"]  # (only once built: a build that raises is tried again)
        try:
            return self._expert_load
        except AttributeError:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute 'expert_load' (a run of a "
                                 f"MoE model has it)") from None

    @expert_load.setter
    def expert_load(self, value: pd.DataFrame) -> None:
        self._deferred.pop("expert_load", None)
        self._expert_load = value

    _DEFERRABLE = ("stages", "expert_load")

    def __copy__(self) -> Result:
        """A shallow copy with its own table of deferred frames (shared, the first copy to read a frame would
        take its builder from the other)."""
        new = type(self).__new__(type(self))
        new.__dict__.update(self.__dict__)
        new._deferred = dict(self._deferred)
        return new

    def defer(self, name: str, build: Callable[[], pd.DataFrame], records: list[dict] | None = None) -> None:
        """Make attribute ``name`` (one of ``stages``, ``expert_load``) ``build()``, called when the attribute is
        first read: a run whose summary alone is read never builds the frame (nor imports pandas, ~0.6 s).
        ``records``: the frame's rows as dicts, for :meth:`stage_records` (``stages`` only)."""
        if name not in self._DEFERRABLE:
            raise ValueError(f"defer: {name!r} is not one of {', '.join(self._DEFERRABLE)}")
        if records is not None and name != "stages":
            raise ValueError(f"defer: records are kept for stages only, not {name!r}")
        self.__dict__.pop("_" + name, None)
        if name == "stages":
            self._stages = None
            self._stage_records = records
        self._deferred[name] = build

    # ------------------------------------------------------------- frames
    _OP_COLUMNS = ("id", "rank", "kind", "name", "stream", "traffic_class", "collective", "layer", "micro_batch",
                   "stage", "nbytes", "count", "flops", "issue_s", "start_s", "end_s")

    def _op_column(self, name: str) -> np.ndarray | list:
        """Column ``name`` of :attr:`rep_ops` read off the op graph (strings as a list), once: the metrics
        computed after every run (:attr:`pipeline_window_s`, :meth:`time_breakdown`,
        :attr:`exposed_comm_by_class`) read the few columns they need and no DataFrame is built."""
        cache = self.__dict__.setdefault("_op_column_cache", {})
        col = cache.get(name)
        if col is None:
            ops = self.record.graph.ops
            n = len(ops)
            if name in ("issue_s", "start_s", "end_s"):
                col = getattr(self.record, name)
            elif name in ("kind", "name", "stream", "traffic_class"):
                col = list(map(attrgetter(name), ops))
            elif name == "collective":
                col = [getattr(o, "collective", "") for o in ops]
            elif name == "nbytes":  # (a representative exchanging for members of unequal loads: their mean)
                means: dict[int, float] = {}  # id(rows) -> mean (a draw's rows serve every micro-batch's ops)

                def nbytes(op) -> float:
                    rows = getattr(op, "rows", None)
                    if not rows:
                        return op.nbytes
                    mean = means.get(id(rows))
                    if mean is None:
                        mean = means[id(rows)] = sum(map(sum, rows)) / len(rows)
                    return mean
                col = np.fromiter(map(nbytes, ops), dtype=float, count=n)
            elif name == "count":  # a coarsened collective runs count times back to back (nbytes each)
                col = np.fromiter((getattr(o, "count", 1) for o in ops), dtype=np.int64, count=n)
            elif name == "flops":  # (a representative computing for members of unequal loads: their mean)
                col = np.fromiter((o.mean_flops if o.kind == "compute" else getattr(o, "flops", 0.0) for o in ops),
                                  dtype=float, count=n)
            else:
                col = np.fromiter(map(attrgetter(name), ops), dtype=np.int64, count=n)
            cache[name] = col
        return col

    @cached_property
    def _op_arrays(self) -> dict[str, np.ndarray]:
        """What :mod:`simulator.breakdown` and :attr:`exposed_comm_by_class` read of :attr:`rep_ops`, as numpy
        arrays (strings as objects)."""
        out = {c: np.asarray(self._op_column(c), dtype=float) for c in ("issue_s", "start_s", "end_s")}
        out.update({c: self._op_column(c) for c in ("rank", "micro_batch", "stage")})
        n = len(out["rank"])  # (fromiter: the same object array as np.array's, a third quicker)
        out.update({c: np.fromiter(self._op_column(c), dtype=object, count=n)
                    for c in ("kind", "name", "stream", "traffic_class")})
        # ``member_wait_s``: seconds at the end of each op that a representative's members wait there for the
        # slowest of them (RunRecord.member_busy), where some op has members
        busy = getattr(self.record, "member_busy", None)
        if busy:
            ids = np.fromiter(busy, dtype=np.int64, count=len(busy))
            share = np.fromiter(busy.values(), dtype=float, count=len(busy))
            start, end = out["start_s"], out["end_s"]
            out["member_wait_s"] = np.zeros(len(start))
            out["member_wait_s"][ids] = (end[ids] - start[ids]) * (1.0 - share)
        return out

    def _rep_frame(self) -> pd.DataFrame:
        """A new frame of the representatives' ops (:attr:`rep_ops`), read off the op graph: what the timeline
        and the trace draw, whatever a user has done to the frames handed out."""
        df = _pd().DataFrame({c: self._op_column(c) for c in self._OP_COLUMNS})
        df["duration_s"] = df["end_s"] - df["start_s"]
        wait = self._op_arrays.get("member_wait_s")
        if wait is not None:  # (the timeline draws that wait as moe_wait, as the breakdown counts it)
            df["member_wait_s"] = wait.copy()
        return df

    @cached_property
    def rep_ops(self) -> pd.DataFrame:
        """Like :attr:`ops`, but for a graph of representatives (``fidelity="fast"``) only the
        representatives' rows (one per simulated op); the same frame as :attr:`ops` for a full graph.

        The frames a result hands out (:attr:`ops`, :attr:`links`, :attr:`traffic`, :attr:`summary`, ...) are
        the user's to edit: no other view of the result reads them."""
        return self._rep_frame()

    @cached_property
    def ops(self) -> pd.DataFrame:
        """One row per executed op: rank, kind, class, tags, issue/start/end (s), bytes, FLOPs. A collective's
        ``nbytes`` is one call's; ``count`` is how many calls the op runs back to back (a coarsened layer's or
        bucket run's), so its bytes are ``nbytes * count``; 1 for the other ops.

        With ``fidelity="fast"`` (a graph of representatives) every rank a representative stands for
        gets a copy of the representative's rows (same ``id`` and times, its own ``rank``), so the
        frame has the rows of a full simulation. Where a ``lockstep`` representative stands for members of
        unequal expert loads (skewed routing) its ``flops`` and its exchanges' ``nbytes`` are the members'
        mean, so that sums over ranks are exact; each member's own is in the op graph (``rows``).
        """
        df = self.rep_ops
        replicas = getattr(self.record.graph, "replicas", None)
        if not replicas:
            return df
        rank = df["rank"].to_numpy()
        order = np.argsort(rank, kind="stable")
        reps, first, counts = np.unique(rank[order], return_index=True, return_counts=True)
        slices = {int(r): order[f:f + c] for r, f, c in zip(reps, first, counts)}
        rep_of = sorted((x, r) for r, xs in replicas.items() for x in xs)
        empty = np.zeros(0, dtype=np.int64)
        parts = [slices.get(r, empty) for _, r in rep_of]
        rows = np.concatenate(parts) if parts else empty
        out = df.take(rows).reset_index(drop=True)
        out["rank"] = np.repeat(np.array([x for x, _ in rep_of], dtype=np.int64), [len(p) for p in parts])
        return out

    @cached_property
    def links(self) -> pd.DataFrame:
        """One row per directed link: endpoints, kind, tier, bandwidth, wire bytes, busy time, utilisation,
        and ``bytes_<class>`` columns. The index (``link``) is this run's link id: to compare runs whose
        fabrics differ (faults remove links), join on ``src`` and ``dst``."""
        return self._links.copy()

    @cached_property
    def _links(self) -> pd.DataFrame:
        """:attr:`links` as the result's own views read it (a user's edits of :attr:`links` do not reach them)."""
        fabric = self.record.fabric
        ledger = fabric.network.ledger
        step = self.step_time if self.step_time > 0 else np.inf
        df = _pd().DataFrame({
            "src": [str(u) for u, _ in fabric.links],
            "dst": [str(v) for _, v in fabric.links],
            "kind": fabric.kinds,
            "tier": fabric.tier,
            "bandwidth_Bps": fabric.capacity,
            "bytes": ledger.bytes,
            "busy_s": ledger.busy_s,
        })
        df["utilization"] = df["bytes"] / (df["bandwidth_Bps"] * step)
        df["busy_fraction"] = df["busy_s"] / step
        for cls, arr in sorted(ledger.bytes_by_class.items()):
            df[f"bytes_{cls}"] = arr
        df.index.name = "link"
        return df

    def busiest_links(self, n: int = 10, tier: str | None = None) -> pd.DataFrame:
        """The ``n`` links (a whole number >= 0) that carried the most bytes, optionally of one ``tier`` (one of
        :data:`topologies.cluster.TIERS`): rows of :attr:`links`, busiest first (ties by link id). Only links
        that carried bytes: a tier this cluster lacks, or whose links carried nothing, gives an empty frame."""
        n = _traffic().check_count(n, "n")
        _check_tier(tier)
        df = self._links
        if tier is not None:
            df = df[df["tier"] == tier]
        return df[df["bytes"] > 0].sort_values("bytes", ascending=False, kind="stable").head(n)

    # ------------------------------------------------------------ traffic
    @cached_property
    def traffic(self) -> pd.DataFrame:
        """Payload bytes per ``(src, dst, traffic_class)`` rank pair over the step (long form; only pairs
        that exchanged bytes). Row sums per ``src`` are what each GPU sent."""
        return self._traffic.copy()

    @cached_property
    def _traffic(self) -> pd.DataFrame:
        """:attr:`traffic` as :meth:`traffic_matrix` reads it."""
        fabric = self.record.fabric
        return _traffic().pair_bytes(fabric.network.ledger.payload_by_route(), fabric.pairs_of, fabric.shares_of)

    def traffic_matrix(self, level: str = "gpu", traffic_class: str | list[str] | None = None) -> pd.DataFrame:
        """Payload bytes sent from each place to each place during the step: a square DataFrame, rows =
        source, columns = destination.

        ``level``: ``"gpu"`` (ranks), ``"node"`` (servers) or ``"leaf"`` (leaf switches; traffic is placed
        by the leaf each GPU's NIC plugs into). ``traffic_class``: one class (``"dp"``, ``"tp"``, ...) or a
        list; default all. Traffic inside a place (NVLink at node level) is on the diagonal.

        A class is one of :func:`simulator.traffic.known_classes` (a training step's, or one this run's
        communication ops carry); a known class this run sent nothing of gives zeros, an unknown name (a typo)
        or an empty list raises ``ValueError``.
        """
        traffic = _traffic()
        labels = traffic.rank_labels(self.record.fabric.cluster, level)
        return traffic.traffic_matrix(self._traffic, labels, traffic_class, known=traffic.known_classes(
            self._comm_classes))

    @cached_property
    def _comm_classes(self) -> list[str]:
        """The traffic classes of this run's communication ops (every op but compute), sent bytes or not."""
        comm = {c for k, c in zip(self._op_column("kind"), self._op_column("traffic_class")) if k != "compute"}
        return sorted(comm | set(self.record.fabric.network.ledger.payload_bytes_by_class))

    # --------------------------------------------------- bandwidth over time
    def link_timeseries(self, links: list[int] | None = None, top: int = 10, tier: str | None = None
                        ) -> pd.DataFrame:
        """Exact bandwidth of links over time (wire bytes/s, piecewise constant), as the flow network ran them.
        Latency-bound flows (each under 1 µs on its bottleneck, :data:`simulator.network.TINY_FLOW_S`) run at
        their solo rate outside max-min sharing, so for well under a microsecond a link can read above its
        capacity (several flows of one call, or of calls that start together); their bytes are exact.

        ``links``: link ids (the index of :attr:`links`); default the ``top`` busiest (of ``tier``, if
        given; see :meth:`busiest_links`). Long form, one row per change point: ``link, src, dst, tier, time_s,
        rate_Bps, utilization`` — the link carries ``rate_Bps`` from ``time_s`` until its next row; its last
        row has rate 0. The integral of a link's series is its ``bytes`` in :attr:`links`.
        """
        table = self._links
        if links is None:
            ids = list(self.busiest_links(_traffic().check_count(top, "top"), tier).index)
        else:
            _check_tier(tier)
            if tier is not None:
                raise ValueError("tier: picks the busiest links when links is not given; with links given, leave "
                                 "tier out (or filter the frame by its tier column)")
            ids = _traffic().check_ids(links, "links", "link id", len(table), empty_ok=True)
        network = self.record.fabric.network
        pd = _pd()
        series = _traffic().link_series(network.ledger, network.routes, ids)
        parts = []
        for lid in ids:
            times, rates = series[lid]
            row = table.loc[lid]
            parts.append(pd.DataFrame({"link": lid, "src": row["src"], "dst": row["dst"], "tier": row["tier"],
                                       "time_s": times, "rate_Bps": rates,
                                       "utilization": rates / row["bandwidth_Bps"]}))
        if not parts:
            return pd.DataFrame(columns=["link", "src", "dst", "tier", "time_s", "rate_Bps", "utilization"])
        return pd.concat(parts, ignore_index=True)

    @property
    def tier_timeseries(self) -> pd.DataFrame:
        """Exact total bandwidth of each tier over time (sub-µs excursions above capacity as
        :meth:`link_timeseries` says): ``time_s`` and one column per tier in wire bytes/s
        (the sum over the tier's links), constant from one row's time to the next's. A copy: the user's to
        edit (traces and plots read their own)."""
        return self._tier_series.copy()

    @cached_property
    def _tier_series(self) -> pd.DataFrame:
        fabric = self.record.fabric
        network = fabric.network
        return _traffic().tier_series(network.ledger, network.routes, fabric.tier)

    # ------------------------------------------------------------ metrics
    @property
    def bytes_by_class(self) -> dict[str, float]:
        """Payload bytes per traffic class (see module docstring)."""
        return dict(sorted(self.record.fabric.network.ledger.payload_bytes_by_class.items()))

    @property
    def bytes_by_tier(self) -> dict[str, float]:
        """Link bytes per tier (the sums of ``links.groupby("tier")["bytes"].sum()``, without the frame)."""
        fabric = self.record.fabric
        sums = _kahan_sums(fabric.tier.tolist(), fabric.network.ledger.bytes.tolist())
        return {t: v for t, v in sorted(sums.items()) if v > 0}

    def bytes_by_class_and_tier(self) -> pd.DataFrame:
        """Link bytes, rows = traffic class, columns = tier."""
        df = self._links
        cols = [c for c in df.columns if c.startswith("bytes_")]
        table = df.groupby("tier")[cols].sum().T
        table.index = [c[len("bytes_"):] for c in table.index]
        return table

    @property
    def exposed_comm_by_class(self) -> dict[str, float]:
        """Mean over ranks of the communication time not hidden behind compute, per class and ``total``.

        Per rank, ``|comm \\ compute| = |comm ∪ compute| - |compute|`` (interval unions), computed for
        all ranks at once; a representative counts once per rank it stands for. (A new dict each time.)
        """
        return dict(self._exposed_comm)

    @cached_property
    def _exposed_comm(self) -> dict[str, float]:
        """:attr:`exposed_comm_by_class`, computed once."""
        cols = self._op_arrays
        world = self.record.graph.world_size
        replicas = getattr(self.record.graph, "replicas", None)
        rank = cols["rank"]
        if not len(rank):
            return {}
        ranks, rank_idx = np.unique(rank, return_inverse=True)
        weight = np.array([len(replicas[r]) if replicas else 1 for r in ranks.tolist()], dtype=float)
        s, e = cols["start_s"], cols["end_s"]
        is_comp = cols["kind"] == "compute"
        comm = ~is_comp
        if not comm.any():
            return {}
        nr = len(ranks)
        union = _intervals().GroupedIntervals(rank_idx, s, e).union_length  # sorted once for every union
        comp_len = union(is_comp, nr)
        has_comm = np.bincount(rank_idx[comm], minlength=nr) > 0
        totals = {"total": _exposed_sum(union(None, nr) - comp_len, has_comm, weight)}
        comm_classes = cols["traffic_class"][comm].tolist()
        index = {c: i for i, c in enumerate(dict.fromkeys(comm_classes))}
        code = np.full(len(rank), -1, dtype=np.int64)  # the class of each communication op, as an index
        code[comm] = np.fromiter(map(index.__getitem__, comm_classes), dtype=np.int64, count=len(comm_classes))
        for cls in sorted(index):
            mine = code == index[cls]
            sel = is_comp | mine
            in_cls = np.bincount(rank_idx[mine], minlength=nr) > 0
            totals[cls] = _exposed_sum(union(sel, nr) - comp_len, in_cls, weight)
        return {k: v / world for k, v in sorted(totals.items())}

    @property
    def exposed_comm_s(self) -> float:
        """Seconds per rank (mean over the world) that some communication is in flight while the rank computes
        nothing: the ``total`` of :attr:`exposed_comm_by_class`."""
        return self._exposed_comm.get("total", 0.0)

    @property
    def summary(self) -> dict:
        """Headline numbers as a dict (JSON-ready; a few values are dicts themselves: per class, tier,
        category). A new dict each time, the caller's to edit."""
        out = {
            "step_time_s": self.step_time,
            "exposed_comm_s": self.exposed_comm_s,
            "exposed_comm_by_class_s": {k: v for k, v in self._exposed_comm.items() if k != "total"},
            "bytes_by_class": self.bytes_by_class,
            "bytes_by_tier": self.bytes_by_tier,
            "events": self.events,
            "compute_beside_comm_s": self.record.compute_beside_comm_s,
            "rate_solves": self.record.fabric.network.rate_solves,
            "flows": self.record.fabric.network.ledger.flows_completed,
            "sim_wall_s": self.sim_wall_s,
        }
        out.update(copy.deepcopy(self.extra_summary))  # (nested dicts: the caller's to edit)
        return out

    # ----------------------------------------------------- time per rank
    @cached_property
    def pipeline_window_s(self) -> float:
        """End of the last micro-batch op on any rank (s): the pipeline part of the step."""
        return _breakdown.pipeline_window(self._op_arrays)

    def time_breakdown(self) -> pd.DataFrame:
        """Each simulated rank's step partitioned into compute by phase, exposed communication by class,
        waits, bubble and idle (seconds; rows sum to the step time; :mod:`simulator.breakdown`). With
        ``fidelity`` fast/lockstep the rows are the representatives (``replicas`` says how many ranks each
        stands for). A copy: computed once per result."""
        return self._time_breakdown.copy()

    def time_breakdown_arrays(self) -> tuple[np.ndarray, list[str], np.ndarray, np.ndarray]:
        """:meth:`time_breakdown` as arrays, without pandas: ``(ranks, categories, seconds, replicas)``, the
        simulated ranks, the categories (columns), seconds per rank and category (``len(ranks) x
        len(categories)``) and how many ranks each stands for. Read-only: computed once per result."""
        ranks, categories, seconds = self._breakdown_arrays
        replicas = getattr(self.record.graph, "replicas", None) or {}
        count = np.array([len(replicas.get(r, (r,))) for r in ranks.tolist()], dtype=np.int64)
        return ranks, list(categories), seconds, count

    @cached_property
    def breakdown_window(self) -> _breakdown.Window:
        """The pipeline window :meth:`time_breakdown` partitions by (:func:`simulator.breakdown.breakdown_window`):
        :attr:`pipeline_window_s` with a pipeline; each rank's own without one; each job's in a joint run."""
        return _breakdown.breakdown_window(self._op_arrays, self.rank_groups, self.group_steps)

    @cached_property
    def _breakdown_arrays(self) -> tuple[np.ndarray, list[str], np.ndarray]:
        window = self.breakdown_window
        ranks, categories, seconds = _breakdown.breakdown_arrays(self._op_arrays, window, self.step_time)
        ranks.flags.writeable = seconds.flags.writeable = False  # shared by every caller
        return ranks, categories, seconds

    @cached_property
    def _time_breakdown(self) -> pd.DataFrame:
        ranks, categories, seconds, replicas = self.time_breakdown_arrays()
        table = _breakdown.breakdown_frame(ranks, categories, seconds)
        table.insert(0, "replicas", replicas)
        return table

    def timeline(self, ranks: list[int] | None = None) -> pd.DataFrame:
        """Bars of the timeline (:func:`simulator.timeline.timeline_bars`) of ``ranks`` (a non-empty list of
        ranks in ``0..world-1``): by default one representative rank per pipeline stage. A rank that a
        representative stands for (fidelity fast or lockstep) shows its representative's bars under its own
        number, as the trace does."""
        if ranks is None:
            return _timeline().timeline_bars(self._rep_frame(), self.step_time, None, groups=self.rank_groups,
                                             steps=self.group_steps)
        ranks = _traffic().check_ids(ranks, "ranks", "rank", self.record.graph.world_size)
        replicas = getattr(self.record.graph, "replicas", None) or {}
        rep_of = {x: r for r, xs in replicas.items() for x in xs}
        reps = list(dict.fromkeys(rep_of.get(r, r) for r in ranks))
        bars = _timeline().timeline_bars(self._rep_frame(), self.step_time, reps, groups=self.rank_groups,
                                         steps=self.group_steps)
        if reps == ranks:
            return bars
        return _pd().concat([bars[bars["rank"] == rep_of.get(r, r)].assign(rank=r) for r in ranks],
                         ignore_index=True)

    def phases(self) -> list[tuple[str, float, float]]:
        """The step's phases as ``(name, start_s, end_s)``: the pipeline of micro-batches, then gradient
        synchronisation and the optimizer (when the step runs past the pipeline window)."""
        w, end = self.pipeline_window_s, self.step_time
        out = [("micro-batches", 0.0, w)] if w > 0 else []
        if end > w:
            out.append(("gradient sync + optimizer" if w > 0 else "step", w, end))
        return out

    # -------------------------------------------------------------- plots
    # (matplotlib is imported on first use: ``import simulator`` and the CLI stay quick to start)
    def plot_timeline(self, ranks: list[int] | None = None, ax=None):
        """Gantt chart of the ops of ``ranks`` (default one per pipeline stage) on their streams; returns the axes."""
        return _plotting().plot_timeline(self.timeline(ranks), ax=ax)

    def plot_stages(self, ax=None):
        """Where each pipeline stage's step time went (:attr:`stages`' partition), stacked seconds per category."""
        if self._stage_frame().empty:
            raise ValueError("plot_stages: this run has no stage table (a bare simulate of an op graph, or the "
                             "joint run of several jobs: run_experiment(job.experiment) has a job's), nothing to draw")
        return _plotting().plot_stages(self._stage_frame(), ax=ax)

    def plot_tier_bandwidth(self, ax=None):
        """Bandwidth each tier carries over the step (:attr:`tier_timeseries`, bytes/s) against its capacity."""
        capacity = self._links.groupby("tier")["bandwidth_Bps"].sum().to_dict()
        return _plotting().plot_tier_bandwidth(self._tier_series, self.phases(), ax=ax, capacity=capacity)

    def plot_link_heatmap(self, top: int = 20, tier: str | None = None, bins: int = 200, ax=None):
        """The ``top`` (>= 1) busiest links (of ``tier``, if given) over ``bins`` (>= 1) time windows."""
        series = self.link_timeseries(top=_traffic().check_count(top, "top", 1), tier=tier)
        if series.empty:
            used = ", ".join(sorted(self.bytes_by_tier)) or "none"
            raise ValueError(f"tier: no {tier!r} link carried bytes in this run, nothing to draw (tiers that did: "
                             f"{used})" if tier is not None else "plot_link_heatmap: no link carried bytes in "
                             "this run, nothing to draw")
        return _plotting().plot_link_heatmap(series, bins=bins, ax=ax, end_s=self.step_time)

    def plot_traffic_matrix(self, level: str = "node", traffic_class: str | list[str] | None = None, ax=None):
        """Heat map of :meth:`traffic_matrix` (payload bytes per step from row to column)."""
        matrix = self.traffic_matrix(level, traffic_class)
        title = f"payload bytes per step, {level} to {level}" + (f", {traffic_class}" if traffic_class else "")
        if not matrix.to_numpy().any():
            title += " (none sent in this run)"  # a known class this run has no bytes of: an empty picture
        return _plotting().plot_traffic_matrix(matrix, ax=ax, title=title)

    def plot_link_utilization(self, ax=None):
        """Distribution of the links' utilisation (bytes over bandwidth x step time) by tier."""
        return _plotting().plot_link_utilization(self._links, ax=ax)

    def plot_bytes_by_class_and_tier(self, ax=None):
        """Link bytes per traffic class and tier (:meth:`bytes_by_class_and_tier`), stacked bars."""
        return _plotting().plot_bytes_by_class_and_tier(self.bytes_by_class_and_tier(), ax=ax)

    def save_plots(self, folder: str, dpi: int = 120) -> list[str]:
        """Write every figure as a PNG in ``folder`` (created if missing); return the paths written.

        ``timeline``, ``stages`` (pipeline runs), ``tier_bandwidth``, ``link_heatmap`` (20 busiest links),
        ``traffic_<level>`` for node level with two nodes or more and leaf level with two leaves or more,
        ``link_utilization``,
        ``bytes_by_class_and_tier``; the timeline only for a run with bars to draw (not one whose ops all take no
        time), the link figures only where bytes crossed a link.
        """
        import matplotlib.pyplot as plt

        if isinstance(dpi, bool) or not isinstance(dpi, numbers.Real) or not 0 < dpi <= 2400:
            raise ValueError(f"dpi: must be a resolution in dots per inch, 0 < dpi <= 2400, got {dpi!r}")
        os.makedirs(folder, exist_ok=True)
        bars = self.timeline() if len(self.record.graph.ops) else None  # (no bars: every op took no time)
        figures: list[tuple[str, Callable]] = ([("timeline", lambda: _plotting().plot_timeline(bars))]
                                               if bars is not None and len(bars) else [])
        if len(self._stage_frame()):
            figures.append(("stages", self.plot_stages))
        figures += [("tier_bandwidth", self.plot_tier_bandwidth), ("link_heatmap", self.plot_link_heatmap)]
        for level in ("node", "leaf"):  # a matrix of one node or one leaf would be one cell of every byte
            try:
                places = set(_traffic().rank_labels(self.record.fabric.cluster, level))
            except ValueError:
                continue  # no leaf switches (or a GPU in several): node level says it all
            if len(places) > 1:
                figures.append((f"traffic_{level}", lambda level=level: self.plot_traffic_matrix(level)))
        figures += [("link_utilization", self.plot_link_utilization),
                    ("bytes_by_class_and_tier", self.plot_bytes_by_class_and_tier)]
        written = []
        for name, draw in figures:
            if name in ("link_heatmap", "link_utilization", "bytes_by_class_and_tier") and not (
                    self._links["bytes"] > 0).any():
                continue  # nothing crossed a link
            ax = draw()
            path = os.path.join(folder, f"{name}.png")
            ax.figure.savefig(path, dpi=dpi, bbox_inches="tight")
            plt.close(ax.figure)
            written.append(path)
        return written

    # ------------------------------------------------------------- export
    def to_chrome_trace(self, path: str | os.PathLike, ranks: list[int] | str | None = None, *, counters: bool = True,
                        flows: bool = True) -> int:
        """Write a Chrome / Perfetto trace (:mod:`simulator.trace`) to ``path`` (a str or ``os.PathLike``):
        one thread per stream, flow arrows for point-to-point transfers and tier-bandwidth counters;
        gzip-compressed when ``path`` ends in ``.gz``. ``ranks``: ``None`` or ``"stages"`` (one rank per
        pipeline stage), ``"all"``, or a list of ranks in ``0..world-1`` (as ``clustersim run --trace-ranks``).
        Returns the number of events written."""
        check_bool("counters", counters)
        check_bool("flows", flows)
        return _trace().write_trace(self, path, ranks, counters=counters, flows=flows)


def _check_tier(tier: str | None) -> None:
    """Refuse a ``tier`` that is not None nor one of :data:`topologies.cluster.TIERS` (a typo would select no
    link, silently)."""
    if tier is not None:
        _traffic().check_choice(tier, TIERS, "tier")


def _pd():
    """pandas, imported when a frame is first built (``import simulator`` and the CLI stay quick to start)."""
    import pandas
    return pandas


def _traffic():
    from . import traffic
    return traffic


def _timeline():
    from . import timeline
    return timeline


def _trace():
    from . import trace
    return trace


def _intervals():
    from . import intervals
    return intervals


def _plotting():
    """:mod:`simulator.plotting`, imported when first needed (it imports matplotlib)."""
    from . import plotting
    return plotting


def _kahan_sums(labels: list[str], values: list[float]) -> dict[str, float]:
    """Sum of ``values`` per label, as pandas' ``groupby(...).sum()`` adds floats: in order, with Kahan's
    compensation (the same operations on the same doubles, so the same result), NaNs skipped."""
    total: dict[str, float] = {}
    carry: dict[str, float] = {}
    for label, v in zip(labels, values):
        if v != v:
            continue
        s = total.get(label, 0.0)
        y = v - carry.get(label, 0.0)
        t = s + y
        c = (t - s) - y
        carry[label] = 0.0 if c != c else c  # an infinite value leaves NaN: pandas resets it
        total[label] = t
    return total


def _exposed_sum(per_rank: np.ndarray, mask: np.ndarray, weight: np.ndarray) -> float:
    """Sum over ranks with communication of ``per_rank`` exposed time, each weighted by its replicas."""
    return float(np.sum(np.maximum(per_rank[mask], 0.0) * weight[mask]))
