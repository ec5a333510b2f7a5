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

from .engine import RunRecord
from .intervals import exposed, union


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
    def ops(self) -> pd.DataFrame:
        """One row per executed op: rank, kind, class, tags, issue/start/end (s), bytes, FLOPs."""
        ops = self.record.graph.ops
        df = pd.DataFrame({
            "id": [o.id for o in ops],
            "rank": [o.rank for o in ops],
            "kind": [o.kind for o in ops],
            "name": [o.name for o in ops],
            "stream": [o.stream for o in ops],
            "traffic_class": [o.traffic_class for o in ops],
            "collective": [getattr(o, "collective", "") for o in ops],
            "layer": [o.layer for o in ops],
            "micro_batch": [o.micro_batch for o in ops],
            "stage": [o.stage for o in ops],
            "nbytes": [o.nbytes for o in ops],
            "flops": [getattr(o, "flops", 0.0) for o in ops],
            "issue_s": self.record.issue_s,
            "start_s": self.record.start_s,
            "end_s": self.record.end_s,
        })
        df["duration_s"] = df["end_s"] - df["start_s"]
        return df

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
        return df

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
        """Mean over ranks of the communication time not hidden behind compute, per class and ``total``."""
        df = self.ops
        world = self.record.graph.world_size
        totals: dict[str, float] = {}
        for _rank, rows in df.groupby("rank"):
            comp = rows[rows["kind"] == "compute"]
            comm = rows[rows["kind"] != "compute"]
            if comm.empty:
                continue
            cu = union(comp["start_s"].to_numpy(), comp["end_s"].to_numpy())
            totals["total"] = totals.get("total", 0.0) + exposed(
                union(comm["start_s"].to_numpy(), comm["end_s"].to_numpy()), cu)
            for cls, crow in comm.groupby("traffic_class"):
                totals[cls] = totals.get(cls, 0.0) + exposed(
                    union(crow["start_s"].to_numpy(), crow["end_s"].to_numpy()), cu)
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
