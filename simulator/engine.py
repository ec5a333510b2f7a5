"""Executes an op graph on a fabric with SimPy.

Each op waits for its explicit dependencies and for the previous op of its
``(rank, stream)``. When ready it is *issued*:

* compute runs for :meth:`ComputeModel.duration` seconds;
* a collective waits until every member of its group has issued the matching
  op (NCCL's rendezvous: the k-th collective on a group matches the k-th of
  every other member), then the fabric runs its plan;
* a send and its matching recv (k-th send from a to b ↔ k-th recv at b from a)
  wait for each other, then one flow moves the bytes.

The engine knows nothing of DP/TP/PP: it only runs typed ops and carries their
tags into the records. Ops that can never run are reported, never left
hanging: unmatched collectives and send/recv pairs are found before the run
(:func:`match_ops`), and anything still pending when the event queue drains
(cyclic waits across ranks) raises :class:`DeadlockError` naming the ops.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import simpy

from topologies.cluster import Cluster
from workloads.ops import Collective, Op, OpGraph, OpGraphError, Recv, Send

from .compute import ComputeModel
from .fabric import Fabric, NetworkConfig


class DeadlockError(RuntimeError):
    """The op graph can never finish; the message names the ops involved."""


@dataclass
class RunRecord:
    """Raw output of one engine run (DataFrames are built by :mod:`simulator.result`)."""

    graph: OpGraph
    fabric: Fabric
    issue_s: np.ndarray
    start_s: np.ndarray
    end_s: np.ndarray
    events: int
    step_time_s: float


def _describe(op: Op) -> str:
    return f"rank {op.rank} op {op.id} {op.kind} {op.name!r}"


def match_ops(graph: OpGraph) -> dict[int, tuple]:
    """Rendezvous key of every collective/send/recv op; raise if one can never match.

    Collectives: ``("c", group, k)`` for the k-th collective a rank issues on
    ``group``. Point-to-point: ``("p", src, dst, k)`` for the k-th transfer
    from ``src`` to ``dst``. Members of one key must agree on kind and bytes.
    """
    counters: dict[tuple, int] = {}
    keys: dict[int, tuple] = {}
    members: dict[tuple, list[Op]] = {}
    for op in graph.ops:
        if isinstance(op, Collective):
            c = (op.rank, op.group)
            k = counters.get(c, 0)
            counters[c] = k + 1
            key = ("c", op.group, k)
        elif isinstance(op, (Send, Recv)):
            src, dst = (op.rank, op.peer) if isinstance(op, Send) else (op.peer, op.rank)
            c = (op.kind, src, dst, op.tag)
            k = counters.get(c, 0)
            counters[c] = k + 1
            key = ("p", src, dst, k, op.tag)
        else:
            continue
        keys[op.id] = key
        members.setdefault(key, []).append(op)
    problems = []
    for key, ops in members.items():
        first = ops[0]
        if key[0] == "c":
            present = {o.rank for o in ops}
            missing = [r for r in key[1] if r not in present]
            if missing:
                problems.append(f"{_describe(first)} (collective #{key[2]} on group {list(key[1])}) "
                                f"never joined by rank(s) {missing}")
            for o in ops[1:]:
                if (o.collective, o.nbytes, o.count) != (first.collective, first.nbytes, first.count):
                    raise OpGraphError(f"{_describe(o)}: {o.collective} of {o.nbytes:g} B does not match "
                                       f"{_describe(first)}: {first.collective} of {first.nbytes:g} B")
        else:
            kinds = sorted(o.kind for o in ops)
            if kinds != ["recv", "send"]:
                other = "recv" if first.kind == "send" else "send"
                problems.append(f"{_describe(first)} (#{key[3]} from rank {key[1]} to rank {key[2]}) "
                                f"has no matching {other}")
            elif ops[0].nbytes != ops[1].nbytes:
                raise OpGraphError(f"{_describe(ops[0])} and {_describe(ops[1])}: sizes differ "
                                   f"({ops[0].nbytes:g} vs {ops[1].nbytes:g} B)")
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise DeadlockError("deadlock: " + "; ".join(problems[:5]) + more)
    return keys


class Engine:
    """One simulation of ``graph`` on ``cluster``.

    Parameters
    ----------
    graph : OpGraph
    cluster : Cluster
        ``graph.world_size`` must not exceed ``cluster.num_gpus``; rank i runs on
        ``cluster.gpus[i]``.
    compute : ComputeModel, optional
        Defaults to the cluster's GPU in bf16.
    network : NetworkConfig, optional
    """

    def __init__(self, graph: OpGraph, cluster: Cluster, compute: ComputeModel | None = None,
                 network: NetworkConfig | None = None) -> None:
        if graph.world_size > cluster.num_gpus:
            raise ValueError(f"world size {graph.world_size} exceeds the cluster's {cluster.num_gpus} GPUs")
        self.graph = graph
        self.cluster = cluster
        self.compute = compute or ComputeModel(cluster.gpu)
        self.env = simpy.Environment()
        self.fabric = Fabric(self.env, cluster, network)

    def run(self) -> RunRecord:
        """Run to completion; raise :class:`DeadlockError` if any op can never finish."""
        ops = self.graph.ops
        n = len(ops)
        keys = match_ops(self.graph)
        env, fabric, compute = self.env, self.fabric, self.compute

        dependents: list[list[int]] = [[] for _ in range(n)]
        waiting = np.zeros(n, dtype=np.int64)
        last_on_stream: dict[tuple, int] = {}
        for op in ops:
            deps = set(op.deps)
            prev = last_on_stream.get((op.rank, op.stream))
            if prev is not None:
                deps.add(prev)
            last_on_stream[(op.rank, op.stream)] = op.id
            for d in deps:
                dependents[d].append(op.id)
            waiting[op.id] = len(deps)
        waiting_list = waiting.tolist()

        issue_s = np.full(n, np.nan)
        start_s = np.full(n, np.nan)
        end_s = np.full(n, np.nan)
        arrived: dict[tuple, list[Op]] = {}
        durations: dict[tuple, float] = {}
        completed = 0

        def complete(op_ids: list[int]) -> None:
            nonlocal completed
            now = env.now
            for i in op_ids:
                end_s[i] = now
                completed += 1
                for d in dependents[i]:
                    waiting_list[d] -= 1
                    if waiting_list[d] == 0:
                        issue(ops[d])

        def on_done(op_ids: list[int]) -> Callable:
            return lambda _ev: complete(op_ids)

        def issue(op: Op) -> None:
            now = env.now
            issue_s[op.id] = now
            if op.kind == "compute":
                start_s[op.id] = now
                key = (op.category, op.flops, op.nbytes, op.shape, op.duration_s, op.parts)
                d = durations.get(key)
                if d is None:
                    d = durations[key] = compute.duration(op)
                env.timeout(d).callbacks.append(on_done([op.id]))
                return
            key = keys[op.id]
            group = arrived.setdefault(key, [])
            group.append(op)
            expected = len(op.group) if op.kind == "collective" else 2
            if len(group) < expected:
                return
            del arrived[key]
            ids = [o.id for o in group]
            start_s[ids] = now
            if op.kind == "collective":
                plan = fabric.plan(op.collective, op.group, op.nbytes, op.algorithm)
                ev = fabric.run_plan(plan, op.traffic_class, op.count)
            else:
                send = group[0] if group[0].kind == "send" else group[1]
                ev = fabric.send(send.rank, send.peer, send.nbytes, send.traffic_class)
            ev.callbacks.append(on_done(ids))

        for op in ops:
            if waiting_list[op.id] == 0:
                issue(op)
        env.run()
        if completed < n:
            raise DeadlockError(self._deadlock_report(arrived, issue_s, end_s))
        step = float(np.max(end_s)) if n else 0.0
        return RunRecord(self.graph, fabric, issue_s, start_s, end_s, _event_count(env), step)

    def _deadlock_report(self, arrived: dict, issue_s: np.ndarray, end_s: np.ndarray) -> str:
        ops = self.graph.ops
        lines = []
        for key, present in arrived.items():
            op = present[0]
            have = {o.rank for o in present}
            need = op.group if op.kind == "collective" else (key[1], key[2])
            missing = [r for r in need if r not in have]
            lines.append(f"{_describe(op)} waits for rank(s) {missing} to reach it")
        blocked = [op for op in ops if np.isnan(issue_s[op.id])]
        if blocked:
            op = blocked[0]
            lines.append(f"{len(blocked)} op(s) never became ready, e.g. {_describe(op)} "
                         f"waiting on op(s) {[d for d in op.deps if np.isnan(end_s[d])]}")
        unfinished = int(np.isnan(end_s).sum())
        return f"deadlock: {unfinished} op(s) can never finish: " + "; ".join(lines[:6])


def _event_count(env: simpy.Environment) -> int:
    """Events processed so far (SimPy's insertion counter)."""
    # NOTE: reads the id counter SimPy uses to order simultaneous events.
    return next(env._eid)


def run(graph: OpGraph, cluster: Cluster, compute: ComputeModel | None = None,
        network: NetworkConfig | None = None) -> RunRecord:
    """Simulate ``graph`` on ``cluster``; see :class:`Engine`."""
    return Engine(graph, cluster, compute, network).run()
