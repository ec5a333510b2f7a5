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
    Bytes carried by each directed link; a payload byte that crosses a
    GPU→NIC→leaf→spine→leaf→NIC→GPU route is counted once per link, under
    that link's tier (nvlink, pcie, leaf, spine, core).
exposed communication
    Per rank, the time during which any communication op of a class is in
    flight and no compute op runs (``|comm \\ compute|``); reported as the
    mean over ranks.
"""

from __future__ import annotations

import json
from functools import cached_property

import numpy as np
import pandas as pd

from . import traffic as _traffic
from .engine import RunRecord
from .intervals import grouped_union_length as _grouped_union_length


class Result:
    """What a simulation produced. Build it with :func:`simulator.simulate` or from a :class:`RunRecord`."""

    def __init__(self, record: RunRecord, sim_wall_s: float = 0.0) -> None:
        self.record = record
        self.step_time = record.step_time_s
        self.sim_wall_s = sim_wall_s
        self.events = record.events
        self.extra_summary: dict = {}
        self.stages = pd.DataFrame()

    # ------------------------------------------------------------- frames
    @cached_property
    def rep_ops(self) -> pd.DataFrame:
        """Like :attr:`ops`, but for a graph of representatives (``fidelity="fast"``) only the
        representatives' rows (one per simulated op); the same frame as :attr:`ops` for a full graph."""
        ops = self.record.graph.ops
        df = pd.DataFrame({
            "id": np.fromiter((o.id for o in ops), dtype=np.int64, count=len(ops)),
            "rank": np.fromiter((o.rank for o in ops), dtype=np.int64, count=len(ops)),
            "kind": [o.kind for o in ops],
            "name": [o.name for o in ops],
            "stream": [o.stream for o in ops],
            "traffic_class": [o.traffic_class for o in ops],
            "collective": [getattr(o, "collective", "") for o in ops],
            "layer": np.fromiter((o.layer for o in ops), dtype=np.int64, count=len(ops)),
            "micro_batch": np.fromiter((o.micro_batch for o in ops), dtype=np.int64, count=len(ops)),
            "stage": np.fromiter((o.stage for o in ops), dtype=np.int64, count=len(ops)),
            "nbytes": np.fromiter((o.nbytes for o in ops), dtype=float, count=len(ops)),
            "flops": np.fromiter((getattr(o, "flops", 0.0) for o in ops), dtype=float, count=len(ops)),
            "issue_s": self.record.issue_s,
            "start_s": self.record.start_s,
            "end_s": self.record.end_s,
        })
        df["duration_s"] = df["end_s"] - df["start_s"]
        return df

    @cached_property
    def ops(self) -> pd.DataFrame:
        """One row per executed op: rank, kind, class, tags, issue/start/end (s), bytes, FLOPs.

        With ``fidelity="fast"`` (a graph of representatives) every rank a representative stands for
        gets a copy of the representative's rows (same ``id`` and times, its own ``rank``), so the
        frame has the rows of a full simulation.
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
        """One row per directed link: endpoints, kind, tier, bandwidth, bytes, busy time, utilisation,
        and ``bytes_<class>`` columns."""
        fabric = self.record.fabric
        ledger = fabric.network.ledger
        step = self.step_time if self.step_time > 0 else np.inf
        g = fabric.cluster.graph
        df = pd.DataFrame({
            "src": [str(u) for u, _ in fabric.links],
            "dst": [str(v) for _, v in fabric.links],
            "kind": [g.edges[e]["kind"] for e in fabric.links],
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
        """The ``n`` links that carried the most bytes (optionally of one ``tier``): rows of :attr:`links`,
        busiest first (ties by link id)."""
        df = self.links
        if tier is not None:
            df = df[df["tier"] == tier]
        return df[df["bytes"] > 0].sort_values("bytes", ascending=False, kind="stable").head(n)

    # ------------------------------------------------------------ traffic
    @cached_property
    def traffic(self) -> pd.DataFrame:
        """Payload bytes per ``(src, dst, traffic_class)`` rank pair over the step (long form; only pairs
        that exchanged bytes). Row sums per ``src`` are what each GPU sent."""
        fabric = self.record.fabric
        return _traffic.pair_bytes(fabric.network.ledger.payload_by_route(), fabric.pairs_of)

    def traffic_matrix(self, level: str = "gpu", traffic_class: str | list[str] | None = None) -> pd.DataFrame:
        """Payload bytes sent from each place to each place during the step: a square DataFrame, rows =
        source, columns = destination.

        ``level``: ``"gpu"`` (ranks), ``"node"`` (servers) or ``"leaf"`` (leaf switches; traffic is placed
        by the leaf each GPU's NIC plugs into). ``traffic_class``: one class (``"dp"``, ``"tp"``, ...) or a
        list; default all. Traffic inside a place (NVLink at node level) is on the diagonal.
        """
        labels = _traffic.rank_labels(self.record.fabric.cluster, level)
        return _traffic.traffic_matrix(self.traffic, labels, traffic_class)

    # --------------------------------------------------- bandwidth over time
    def link_timeseries(self, links: list[int] | None = None, top: int = 10, tier: str | None = None
                        ) -> pd.DataFrame:
        """Exact bandwidth of links over time (wire bytes/s, piecewise constant).

        ``links``: link ids (the index of :attr:`links`); default the ``top`` busiest (of ``tier``, if
        given). Long form, one row per change point: ``link, src, dst, tier, time_s, rate_Bps,
        utilization`` — the link carries ``rate_Bps`` from ``time_s`` until its next row; its last row
        has rate 0. The integral of a link's series is its ``bytes`` in :attr:`links`.
        """
        table = self.links
        ids = list(self.busiest_links(top, tier).index) if links is None else [int(x) for x in links]
        bad = [x for x in ids if not 0 <= x < len(table)]
        if bad:
            raise ValueError(f"links: {bad[0]} is not a link id; valid: 0..{len(table) - 1}")
        network = self.record.fabric.network
        series = _traffic.link_series(network.ledger, network.routes, ids)
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

    @cached_property
    def tier_timeseries(self) -> pd.DataFrame:
        """Exact total bandwidth of each tier over time: ``time_s`` and one column per tier in wire bytes/s
        (the sum over the tier's links), constant from one row's time to the next's."""
        fabric = self.record.fabric
        network = fabric.network
        return _traffic.tier_series(network.ledger, network.routes, fabric.tier)

    # ------------------------------------------------------------ metrics
    @property
    def bytes_by_class(self) -> dict[str, float]:
        """Payload bytes per traffic class (see module docstring)."""
        return dict(sorted(self.record.fabric.network.ledger.payload_bytes_by_class.items()))

    @property
    def bytes_by_tier(self) -> dict[str, float]:
        """Link bytes per tier."""
        df = self.links
        return {t: float(v) for t, v in df.groupby("tier")["bytes"].sum().items() if v > 0}

    def bytes_by_class_and_tier(self) -> pd.DataFrame:
        """Link bytes, rows = traffic class, columns = tier."""
        df = self.links
        cols = [c for c in df.columns if c.startswith("bytes_")]
        table = df.groupby("tier")[cols].sum().T
        table.index = [c[len("bytes_"):] for c in table.index]
        return table

    @cached_property
    def exposed_comm_by_class(self) -> dict[str, float]:
        """Mean over ranks of the communication time not hidden behind compute, per class and ``total``.

        Per rank, ``|comm \\ compute| = |comm ∪ compute| - |compute|`` (interval unions), computed for
        all ranks at once; a representative counts once per rank it stands for.
        """
        df = self.rep_ops
        world = self.record.graph.world_size
        replicas = getattr(self.record.graph, "replicas", None)
        if df.empty:
            return {}
        rank = df["rank"].to_numpy()
        ranks, rank_idx = np.unique(rank, return_inverse=True)
        weight = np.array([len(replicas[r]) if replicas else 1 for r in ranks.tolist()], dtype=float)
        s, e = df["start_s"].to_numpy(), df["end_s"].to_numpy()
        is_comp = (df["kind"] == "compute").to_numpy()
        comm = ~is_comp
        if not comm.any():
            return {}
        nr = len(ranks)
        comp_len = _grouped_union_length(rank_idx[is_comp], s[is_comp], e[is_comp], nr)
        has_comm = np.bincount(rank_idx[comm], minlength=nr) > 0
        totals = {"total": _exposed_sum(_grouped_union_length(rank_idx, s, e, nr) - comp_len, has_comm, weight)}
        classes = df["traffic_class"].to_numpy()
        for cls in sorted(set(classes[comm].tolist())):
            sel = is_comp | (comm & (classes == cls))
            in_cls = np.bincount(rank_idx[comm & (classes == cls)], minlength=nr) > 0
            totals[cls] = _exposed_sum(_grouped_union_length(rank_idx[sel], s[sel], e[sel], nr) - comp_len,
                                       in_cls, weight)
        return {k: v / world for k, v in sorted(totals.items())}

    @property
    def exposed_comm_s(self) -> float:
        return self.exposed_comm_by_class.get("total", 0.0)

    @property
    def summary(self) -> dict:
        """Headline numbers as a flat dict (JSON-ready)."""
        out = {
            "step_time_s": self.step_time,
            "exposed_comm_s": self.exposed_comm_s,
            "exposed_comm_by_class_s": {k: v for k, v in self.exposed_comm_by_class.items() if k != "total"},
            "bytes_by_class": self.bytes_by_class,
            "bytes_by_tier": self.bytes_by_tier,
            "events": self.events,
            "rate_solves": self.record.fabric.network.rate_solves,
            "flows": self.record.fabric.network.ledger.flows_completed,
            "sim_wall_s": self.sim_wall_s,
        }
        out.update(self.extra_summary)
        return out

    # ------------------------------------------------------------- export
    def to_chrome_trace(self, path: str) -> None:
        """Write a Chrome / Perfetto trace: one process per rank, one thread per stream (µs)."""
        df = self.ops
        streams = {s: i for i, s in enumerate(sorted(df["stream"].unique()))}
        events = []
        for rank in sorted(df["rank"].unique()):
            events.append({"ph": "M", "name": "process_name", "pid": int(rank), "args": {"name": f"rank {rank}"}})
            for s, tid in streams.items():
                events.append({"ph": "M", "name": "thread_name", "pid": int(rank), "tid": tid, "args": {"name": s}})
        for row in df.itertuples(index=False):
            events.append({
                "ph": "X", "name": row.name, "cat": row.traffic_class, "pid": int(row.rank),
                "tid": streams[row.stream], "ts": row.start_s * 1e6, "dur": max(row.duration_s, 0.0) * 1e6,
                "args": {"kind": row.kind, "layer": int(row.layer), "micro_batch": int(row.micro_batch),
                         "bytes": float(row.nbytes), "flops": float(row.flops)},
            })
        with open(path, "w") as fh:
            json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, fh)


def _exposed_sum(per_rank: np.ndarray, mask: np.ndarray, weight: np.ndarray) -> float:
    """Sum over ranks with communication of ``per_rank`` exposed time, each weighted by its replicas."""
    return float(np.sum(np.maximum(per_rank[mask], 0.0) * weight[mask]))
