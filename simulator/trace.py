"""Chrome / Perfetto traces (the Trace Event Format) of a simulated step.

What goes in, and why it stays small at scale:

* **ranks**: by default one representative rank per pipeline stage (the
  members of a TP group, and DP replicas, run near-identical programs: a
  trace of all 1,024 ranks repeats each timeline hundreds of times). Any list
  of ranks can be asked for; with ``fidelity`` fast/lockstep a rank that a
  representative stands for gets its representative's events, relabelled.
* one process per rank, one thread per stream (``compute``, ``dp``,
  ``pp_send_act``, ...); ``X`` (complete) events in microseconds, ``args``
  with kind, layer, micro-batch, bytes and FLOPs;
* **flow arrows** (``s``/``f`` events) from each point-to-point send to its
  matching receive when both ranks are in the trace;
* **counter tracks**: total bandwidth per fabric tier (GB/s), exact change
  points of :attr:`Result.tier_timeseries`, or exact window means over
  ``max_counter_points`` windows when there are more change points;
* ``.gz`` paths are written gzip-compressed (Perfetto and chrome://tracing
  read them as is).

Format reference: "Trace Event Format", Google (docs.google.com/document/d/
1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU), the format Perfetto imports.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Sequence

import numpy as np
import pandas as pd

from workloads.ops import Recv, Send

from .timeline import stage_of_each_rank, stage_ranks
from .traffic import check_ids, window_means

FABRIC_PID = 1 << 30
"""Process id of the fabric's counter tracks (above any rank)."""


RANK_CHOICES = ("stages", "all")
"""The named rank selections of a trace (as ``clustersim run --trace-ranks``): one rank per pipeline stage (the
default), every rank."""


def trace_ranks(ranks: Sequence[int] | str | None, world_size: int, stage_reps: Sequence[int], present: list[int]
                ) -> list[int]:
    """The ranks a trace shows: ``None``/``"stages"`` one per pipeline stage (``stage_reps``, in stage order;
    ``present``, the simulated ranks, without stages), ``"all"`` every rank, else a non-empty list of ranks in
    ``0..world_size-1`` (no bools); ``ValueError`` naming ``trace ranks`` otherwise."""
    if isinstance(ranks, str):
        if ranks not in RANK_CHOICES:
            raise ValueError(f"trace ranks: {ranks!r} unknown; valid: {', '.join(map(repr, RANK_CHOICES))} or a "
                             f"list of ranks in 0..{world_size - 1}")
        if ranks == "all":
            return list(range(world_size))
        ranks = None
    if ranks is None:
        return list(stage_reps) if stage_reps else present
    return check_ids(ranks, "trace ranks", "rank", world_size)


def trace_events(result, ranks: Sequence[int] | str | None = None, *, counters: bool = True, flows: bool = True,
                 max_counter_points: int = 20_000) -> list[dict]:
    """The trace's events (see the module docstring); ``ranks`` as :func:`trace_ranks`."""
    rep_ops = result._rep_frame()  # (not the frame handed to users, which they may have edited)
    graph = result.record.graph
    replicas = getattr(graph, "replicas", None) or {}
    rep_of = {x: r for r, xs in replicas.items() for x in xs}
    first_of_stages = stage_ranks(rep_ops, result.rank_groups)  # (the default ranks: one per stage, in order)
    ranks = trace_ranks(ranks, graph.world_size, list(first_of_stages), sorted(rep_ops["rank"].unique().tolist()))
    needed = rep_ops[rep_ops["rank"].isin({rep_of.get(r, r) for r in ranks})]
    stage = stage_of_each_rank(needed)
    streams = {s: i for i, s in enumerate(sorted(rep_ops["stream"].unique()))}
    events: list[dict] = []
    by_rank = {r: part for r, part in needed.groupby("rank", sort=False)}
    placed: dict[int, pd.DataFrame] = {}
    for rank in ranks:
        rep = rep_of.get(rank, rank)
        df = by_rank.get(rep)
        if df is None:
            continue
        placed[rank] = df
        label = f"rank {rank}" + (f" (stage {stage[rep]})" if rep in stage else "")
        events.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": label}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}})
        for s in sorted(set(df["stream"])):
            events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": streams[s], "args": {"name": s}})
        start, dur = df["start_s"].to_numpy() * 1e6, np.maximum(df["duration_s"].to_numpy(), 0.0) * 1e6
        for row, ts, d in zip(df.itertuples(index=False), start.tolist(), dur.tolist()):
            events.append({
                "ph": "X", "name": row.name, "cat": row.traffic_class, "pid": rank, "tid": streams[row.stream],
                "ts": ts, "dur": d,
                "args": {"kind": row.kind, "layer": int(row.layer), "micro_batch": int(row.micro_batch),
                         "bytes": float(row.nbytes), "flops": float(row.flops)},
            })
    if flows:
        events += _flow_events(result, placed, streams, rep_of)
    if counters:
        events += _counter_events(result, max_counter_points)
    return events


def write_trace(result, path: str | os.PathLike, ranks: Sequence[int] | str | None = None, **options) -> int:
    """Write the trace to ``path`` (a str or ``os.PathLike``; gzip-compressed if it ends in ``.gz``); return the
    number of events."""
    if not isinstance(path, (str, os.PathLike)):  # (open() would take an int as a file descriptor)
        raise TypeError(f"path: need a file path (str or os.PathLike), got {type(path).__name__} {path!r}")
    events = trace_events(result, ranks, **options)
    doc = {"traceEvents": events, "displayTimeUnit": "ms",
           "otherData": {"generator": "clustersim", "step_time_s": result.step_time}}
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wt") as fh:
        json.dump(doc, fh, separators=(",", ":"))
    return len(events)


def _flow_events(result, placed: dict[int, pd.DataFrame], streams: dict[str, int], rep_of: dict[int, int]
                 ) -> list[dict]:
    """An arrow from each send (at its start) to its matching receive (at its end), both ranks traced."""
    if len(placed) < 2:
        return []
    ops = result.record.graph.ops
    start, end = result.record.start_s, result.record.end_s
    rank_of_rep: dict[int, list[int]] = {}
    for rank in placed:
        rank_of_rep.setdefault(rep_of.get(rank, rank), []).append(rank)
    sends: dict[tuple, list[int]] = {}
    recvs: dict[tuple, list[int]] = {}
    for op in ops:
        if isinstance(op, Send) and op.rank in rank_of_rep:
            sends.setdefault((op.rank, op.peer, op.tag), []).append(op.id)
        elif isinstance(op, Recv) and op.rank in rank_of_rep:
            recvs.setdefault((op.peer, op.rank, op.tag), []).append(op.id)
    out: list[dict] = []
    flow_id = 0
    for key, send_ids in sends.items():
        recv_ids = recvs.get(key)
        if not recv_ids:
            continue
        for rank in rank_of_rep[key[0]]:
            peer = _peer_rank(rank, key[0], key[1], result, placed)
            if peer is None:
                continue
            for s_id, r_id in zip(send_ids, recv_ids):
                flow_id += 1
                s_op, r_op = ops[s_id], ops[r_id]
                out.append({"ph": "s", "name": "p2p", "cat": s_op.traffic_class, "id": flow_id, "pid": rank,
                            "tid": streams[s_op.stream], "ts": float(start[s_id]) * 1e6})
                out.append({"ph": "f", "bp": "e", "name": "p2p", "cat": s_op.traffic_class, "id": flow_id,
                            "pid": peer, "tid": streams[r_op.stream], "ts": float(end[r_id]) * 1e6})
    return out


def _peer_rank(rank: int, rep: int, peer_rep: int, result, placed: dict[int, pd.DataFrame]) -> int | None:
    """The traced rank that ``rank`` (standing under representative ``rep``) sends to when ``rep`` sends to
    ``peer_rep``: the k-th replica talks to the k-th replica."""
    replicas = getattr(result.record.graph, "replicas", None)
    if not replicas:
        return peer_rep if peer_rep in placed else None
    k = replicas[rep].index(rank)
    peer = replicas[peer_rep][k]
    return peer if peer in placed else None


def _counter_events(result, max_points: int) -> list[dict]:
    """Tier bandwidth counters (GB/s) on the fabric's own track."""
    tiers = result._tier_series  # (not the copy handed to users, which they may have edited)
    cols = [c for c in tiers.columns if c != "time_s" and tiers[c].abs().max() > 0]
    if not cols:
        return []
    times = tiers["time_s"].to_numpy()
    values = {c: tiers[c].to_numpy() for c in cols}
    if len(times) > max_points:
        end = max(float(times[-1]), result.step_time)
        edges = np.linspace(0.0, end, max_points + 1)
        values = {c: np.r_[window_means(np.r_[times, end], np.r_[v, 0.0], edges), 0.0] for c, v in values.items()}
        times = edges
    out = [{"ph": "M", "name": "process_name", "pid": FABRIC_PID, "tid": 0, "args": {"name": "fabric"}},
           {"ph": "M", "name": "process_sort_index", "pid": FABRIC_PID, "tid": 0, "args": {"sort_index": -1}}]
    scaled = {c: (v / 1e9).round(6).tolist() for c, v in values.items()}
    for i, t in enumerate(times.tolist()):
        out.append({"ph": "C", "name": "bandwidth by tier (GB/s)", "pid": FABRIC_PID, "tid": 0, "ts": t * 1e6,
                    "args": {c: scaled[c][i] for c in cols}})
    return out
