"""Executes an op graph on a fabric with SimPy.

Each op waits for its explicit dependencies and for the previous op of its
``(rank, stream)``. When ready it is *issued*:

* compute runs for :meth:`ComputeModel.duration` seconds;
* a collective waits until every member of its group has issued the matching
  op (NCCL's rendezvous: the k-th collective on a group matches the k-th of
  every other member), then the fabric runs its plan;
* a send and its matching recv (k-th send from a to b ↔ k-th recv at b from a)
  wait for each other, then one flow moves the bytes.

Compute beside communication: an NCCL kernel holds SMs while its data moves
(one CTA per channel: :attr:`ComputeModel.comm_sms` for a collective, or
the channels NCCL cuts a small one to when fewer, :meth:`Fabric.channel_limit`;
``p2p_sms`` for a send or receive), and a compute kernel that runs meanwhile on
another stream of the same rank gets only the SMs left. From the instant a
rank's collective or transfer starts moving data until it ends, every compute
op running on that rank progresses at ``(S - held) / S`` of its speed (``S``
the GPU's SMs, ``held`` the SMs of all its running communication kernels, at
most ``S - 1``); an op already timed on fewer SMs (a kernel with
``sm_reserved``: Transformer Engine's overlapped GEMMs, DualPipe's pairs)
keeps its own time, whose reservation stands for the communication beside it.
This is the SM share only: what the kernels' HBM traffic takes from memory-bound
kernels is not modelled, nor the tail a wave of CTAs that no longer fits adds,
both of which published measurements show to be larger (docs/DESIGN.md).

The engine knows nothing of DP/TP/PP: it only runs typed ops and carries their
tags into the records. Ops that can never run are reported, never left
hanging: unmatched collectives and send/recv pairs are found before the run
(:func:`match_ops`), and anything still pending when the event queue drains
(cyclic waits across ranks) raises :class:`DeadlockError` naming the ops.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from heapq import heappush
from itertools import repeat
from numbers import Real

import numpy as np
import simpy
from simpy.events import NORMAL

from topologies.cluster import Cluster
from workloads.errors import is_int
from workloads.ops import Op, OpGraph, OpGraphError

from .compute import ComputeModel, op_durations
from .fabric import Fabric, NetworkConfig


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """Pause Python's cyclic garbage collector inside the block (restored after, even on error).

    Building and running a step allocates millions of long-lived objects (ops,
    flows, events) and no reference cycles per op, so the collector's periodic
    scans of them are pure overhead: about 10 % of the wall time of a 1,024-GPU
    step, with the same peak memory (measured; docs/DESIGN.md, "Speed").
    Plain reference counting still frees everything as it is dropped.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            if not gc.get_freeze_count():  # (nobody else's frozen objects to unfreeze)
                # What the block made and kept is long-lived (graph, network, record): move it to the oldest
                # generation at once (freeze then unfreeze: two list splices, no scan) instead of letting the
                # first young collection after the block scan all of it (~0.15 µs per object: ~5 s after a
                # 131,072-GPU step). Cycles among it are still found by the next full collection.
                gc.freeze()
                gc.unfreeze()
            gc.enable()


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
    compute_beside_comm_s: float = 0.0
    """Seconds of compute time per rank (the mean over the world's ranks) that the SMs communication held
    beside it added (module docstring, "Compute beside communication")."""
    member_busy: dict[int, float] = field(default_factory=dict)
    """Op id -> the share of the op its members compute, on average, for each compute op with ``members``
    (:func:`simulator.compute.op_durations`); the rest of the op they wait for its slowest member."""


def _describe(op: Op) -> str:
    return f"rank {op.rank} op {op.id} {op.kind} {op.name!r}"


def _listed(items: Sequence[int], most: int = 8) -> str:
    """``items`` as a list, its middle elided past ``most`` (a deadlocked collective over 512 ranks listed every
    absent rank: a 5,000-character line)."""
    items = list(items)
    if len(items) <= most:
        return str(items)
    head = ", ".join(map(str, items[:most - 2]))
    return f"[{head}, ..., {items[-1]}] ({len(items):,})"


def _replicas(graph: OpGraph) -> dict[int, tuple[int, ...]] | None:
    """``graph.replicas`` (representative rank -> the ranks it stands for), or None for a full graph."""
    return getattr(graph, "replicas", None)


def _check_replicas(graph: OpGraph) -> None:
    """``graph.replicas``, if set: a mapping of representative ranks to the distinct ranks each stands for (itself
    among them), no rank stood for twice, every rank one of the graph's (a mapping that broke these gave an
    IndexError deep in the fabric, or a step of two ranks each standing for the other)."""
    replicas = _replicas(graph)
    if replicas is None:
        return
    ws = graph.world_size
    if not isinstance(replicas, Mapping):
        raise OpGraphError(f"replicas: must map a representative rank to the ranks it stands for, got "
                           f"{type(replicas).__name__}")
    seen: set[int] = set()
    for rep, ranks in replicas.items():
        if not isinstance(ranks, tuple) or rep not in ranks or len(set(ranks)) != len(ranks):
            raise OpGraphError(f"replicas[{rep!r}]: must be a tuple of distinct ranks holding {rep!r} itself, "
                               f"got {ranks!r:.60}")
        bad = [r for r in ranks if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < ws]
        if bad:
            raise OpGraphError(f"replicas[{rep}]: {bad[0]!r} is not a rank of this graph (0..{ws - 1})")
        twice = seen.intersection(ranks)
        if twice:
            raise OpGraphError(f"replicas[{rep}]: rank {min(twice)} is stood for by two representatives")
        seen.update(ranks)


def group_shape(group: tuple[int, ...], replicas: dict[int, tuple[int, ...]] | None) -> tuple[str, list[int]]:
    """How a collective on ``group`` runs in a graph with representatives.

    Returns ``(shape, members)`` where ``members`` are the representatives in
    ``group`` (the ranks that issue the op) and ``shape`` is

    ``"internal"``
        the group is exactly the union of its members' replica sets (e.g. a
        TP group whose representative stands for all of it): the collective
        runs once over ``group``;
    ``"replicated"``
        every rank of the group is a representative: the collective runs once
        per replica index ``k`` over ``[replicas[r][k] for r in group]``;
    ``"lanes"``
        the group lies inside its members' replica sets without covering them
        (e.g. the TP or DP group of a representative that stands for a DP × TP
        block): the collective runs once per translate of the group that tiles
        those sets (:func:`lanes`).

    In a full graph (``replicas`` None) every group is internal.
    """
    if replicas is None:
        return "internal", list(group)
    members = [r for r in group if r in replicas]
    if len(members) == len(group):
        if all(len(replicas[r]) == 1 for r in group):
            return "internal", members
        if len({len(replicas[r]) for r in group}) > 1:
            raise OpGraphError(f"group {list(group)}: its representatives stand for unequal numbers of ranks "
                               f"({', '.join(f'{r}: {len(replicas[r])}' for r in group)}); a collective between "
                               f"representatives runs once per replica index, so each needs as many")
        return "replicated", members
    covered = sorted(x for r in members for x in replicas[r])
    if covered == sorted(group):
        return "internal", members
    if members and set(group) <= set(covered):
        lanes(group, *(replicas[r] for r in members))  # raises if the group does not tile the sets
        return "lanes", members
    raise OpGraphError(f"group {list(group)}: mixes representative ranks {members} with ranks they do not "
                       f"stand for; a graph with representatives needs groups that are whole replica sets, "
                       f"made of representatives only, or tiles of their replica sets")


def lanes(group: tuple[int, ...], *replica_sets: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Translates of ``group`` that tile ``replica_sets`` (which hold all its ranks), member by member.

    Positions are indices into a rank's own replica set; a translate shifts
    every member's position by one offset. Every set must hold the same
    pattern of positions. With representatives standing for DP × TP blocks
    listed DP-major, a TP group (a row) tiles into every DP replica's TP group
    and a DP group (a column, possibly spread over several representatives'
    blocks) into every TP index's. The first lane is ``group`` itself. Raises
    :class:`OpGraphError` if the translates do not tile the sets exactly.
    """
    where = {r: (k, i) for k, rs in enumerate(replica_sets) for i, r in enumerate(rs)}
    size = len(replica_sets[0])
    places = [where[r] for r in group]
    patterns = {k: sorted(i for kk, i in places if kk == k) for k in range(len(replica_sets))}
    pattern = patterns[0]
    if any(len(rs) != size for rs in replica_sets) or any(p != pattern for p in patterns.values()):
        raise OpGraphError(f"group {list(group)} does not tile the replica sets {[list(rs) for rs in replica_sets]}")
    base = pattern[0]
    used: set[int] = set()
    out: list[tuple[int, ...]] = []
    for start in range(size):
        if start in used:
            continue
        idx = [p - base + start for p in pattern]
        if any(i >= size or i in used for i in idx):
            raise OpGraphError(f"group {list(group)} does not tile the replica sets "
                               f"{[list(rs) for rs in replica_sets]}")
        used.update(idx)
        out.append(tuple(replica_sets[k][i - base + start] for k, i in places))
    return out


def _check_lane_bytes(op: Op, group: tuple[int, ...], shape: str, replicas: dict[int, tuple[int, ...]] | None,
                      counts: dict[tuple[int, ...], int]) -> None:
    """A collective with ``lane_bytes`` must run once per lane (:func:`group_shape` ``"lanes"``), with one size per
    lane (``counts``: the lanes of each group seen so far)."""
    if shape != "lanes":
        raise OpGraphError(f"{_describe(op)}: lane_bytes on group {_listed(group)}, which is {shape}, not run once "
                           f"per lane of its representatives' replica sets")
    n = counts.get(group)
    if n is None:
        n = counts[group] = len(lanes(group, *(replicas[r] for r in group if r in replicas)))
    if len(op.lane_bytes) != n:
        raise OpGraphError(f"{_describe(op)}: lane_bytes has {len(op.lane_bytes)} sizes for the {n} lanes of group "
                           f"{_listed(group)}")


def match_ops(graph: OpGraph) -> dict[int, tuple]:
    """Rendezvous key of every collective/send/recv op; raise if one can never match.

    Collectives: ``("c", group, k)`` for the k-th collective a rank issues on
    ``group``. Point-to-point: ``("p", src, dst, k)`` for the k-th transfer
    from ``src`` to ``dst``. Members of one key must agree on kind, bytes and algorithm.
    In a graph with representatives (``graph.replicas``) only the
    representatives of a group issue its collectives (:func:`group_shape`).
    """
    return _match(graph)[0]


def _match(graph: OpGraph) -> tuple[dict[int, tuple], dict[tuple, list[Op]], dict[tuple, tuple[str, list[int]]]]:
    """:func:`match_ops`'s keys, every key's ops in order of first appearance (checked as it says), and every
    collective group's :func:`group_shape`."""
    replicas = _replicas(graph)
    counters: dict[tuple, int] = {}
    keys: dict[int, tuple] = {}
    # A group is a tuple of up to thousands of ranks, and Python does not cache a tuple's hash: each group
    # object is looked up once by identity (generators share a few objects among many ops) and numbered,
    # and the per-op dicts below are keyed by that number. ``keyed``: (number, k) or a point-to-point key
    # -> (the public key, its ops), in order of first appearance.
    group_ids: dict[int, tuple[tuple[int, ...], int]] = {}  # id(group object) -> (that object, its number)
    numbers: dict[tuple[int, ...], int] = {}  # group -> its number
    keyed: dict[tuple, tuple[tuple, list[Op]]] = {}
    for op in graph.ops:
        kind = op.kind
        if kind == "compute":
            continue
        if kind == "collective":
            group = op.group
            hit = group_ids.get(id(group))
            if hit is None or hit[0] is not group:
                hit = group_ids[id(group)] = (group, numbers.setdefault(group, len(numbers)))
            c = (op.rank, hit[1])
            k = counters.get(c, 0)
            counters[c] = k + 1
            inner = (hit[1], k)
            entry = keyed.get(inner)
            if entry is None:
                entry = keyed[inner] = (("c", group, k), [])
        elif kind == "send" or kind == "recv":
            src, dst = (op.rank, op.peer) if kind == "send" else (op.peer, op.rank)
            c = (kind, src, dst, op.tag)
            k = counters.get(c, 0)
            counters[c] = k + 1
            inner = ("p", src, dst, k, op.tag)
            entry = keyed.get(inner)
            if entry is None:
                entry = keyed[inner] = (inner, [])
        else:
            continue
        keys[op.id] = entry[0]
        entry[1].append(op)
    members: dict[tuple, list[Op]] = dict(keyed.values())
    problems = []
    shapes: dict[tuple, tuple[str, list[int]]] = {}
    lane_counts: dict[tuple[int, ...], int] = {}
    for key, ops in members.items():
        first = ops[0]
        if key[0] == "c":
            shape = shapes.get(key[1])
            if shape is None:
                shape = shapes[key[1]] = group_shape(key[1], replicas)
            need = shape[1]
            if first.split is not None:
                _check_rows(ops, key[1], len(need) < len(key[1]))
            if first.lane_bytes is not None:
                _check_lane_bytes(first, key[1], shape[0], replicas, lane_counts)
            if len(ops) == 1 == len(need):  # (most keys of a graph of representatives: one issuer)
                missing = [] if first.rank == need[0] else need
            else:
                present = {o.rank for o in ops}
                missing = [r for r in need if r not in present]
            if missing:
                problems.append(f"{_describe(first)} (collective #{key[2]} on group {_listed(key[1])}) "
                                f"never joined by rank(s) {_listed(missing)}")
            # alltoallv members send different amounts: only kind and count must agree.
            size = None if first.split is not None else first.nbytes
            for o in ops[1:]:
                if (o.split is None) != (size is not None):
                    raise OpGraphError(f"{_describe(o)}: {'an all_to_all' if o.split is None else 'an alltoallv'} "
                                       f"but {_describe(first)} of the same exchange is "
                                       f"{'an alltoallv' if o.split is None else 'an all_to_all'} (every member "
                                       f"gives a split, or none)")
                if (o.collective, None if size is None else o.nbytes, o.count) != (first.collective, size,
                                                                                   first.count):
                    raise OpGraphError(f"{_describe(o)}: {o.collective} of {o.nbytes:g} B does not match "
                                       f"{_describe(first)}: {first.collective} of {first.nbytes:g} B")
                if o.algorithm != first.algorithm:  # (one member's would be run for all: the others' ignored)
                    raise OpGraphError(f"{_describe(o)}: algorithm {o.algorithm!r} does not match "
                                       f"{_describe(first)}: {first.algorithm!r}")
        else:
            kinds = sorted(o.kind for o in ops)
            if kinds != ["recv", "send"]:
                other = "recv" if first.kind == "send" else "send"
                problems.append(f"{_describe(first)} (#{key[3]} from rank {key[1]} to rank {key[2]}) "
                                f"has no matching {other}")
            elif ops[0].nbytes != ops[1].nbytes:
                raise OpGraphError(f"{_describe(ops[0])} and {_describe(ops[1])}: sizes differ "
                                   f"({ops[0].nbytes:g} vs {ops[1].nbytes:g} B)")
            elif replicas is not None and len(replicas[key[1]]) != len(replicas[key[2]]):
                raise OpGraphError(f"{_describe(first)}: ranks {key[1]} and {key[2]} stand for different "
                                   f"numbers of replicas")
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise DeadlockError("deadlock: " + "; ".join(problems[:5]) + more)
    return keys, members, shapes


def _check_rows(ops: list[Op], group: tuple[int, ...], absent: bool) -> None:
    """Raise :class:`OpGraphError` unless the alltoallv ``ops`` (one key's members) give one matrix: the ops that
    carry ``rows`` carry the same rows, every op's split is its row there, and when members are ``absent``
    (represented, issuing nothing) the rows are given, since their sizes are known from nowhere else."""
    rows = next((o.rows for o in ops if o.rows is not None), None)
    if rows is None:
        if absent:
            raise OpGraphError(f"{_describe(ops[0])}: alltoallv on group {list(group)} is issued by "
                               f"representative(s) {sorted(o.rank for o in ops)} only; it must carry every "
                               f"member's row (rows=)")
        return
    for o in ops:
        if (o.rows is not None and o.rows != rows) or o.split != rows[group.index(o.rank)]:
            raise OpGraphError(f"{_describe(o)}: rows of the alltoallv on group {list(group)} disagree with "
                               f"another member's rows or split")


def _slots(members: dict[tuple, list[Op]], shapes: dict[tuple, tuple[str, list[int]]], n: int
           ) -> tuple[list[int], list[tuple], list[int], list[str]]:
    """Number the rendezvous keys of :func:`_match` (``members``: key -> its ops, in order of first
    appearance; ``shapes``: group -> :func:`group_shape`): returns per op id its slot (-1: a compute op), per
    slot its key, how many ops meet there (a collective's issuing members, 2 for a send and its recv) and, for
    a collective, how it runs (:func:`group_shape`'s first item; "" for point-to-point)."""
    slot = [-1] * n
    need: list[int] = []
    shape_of: list[str] = []
    for s, (key, ops) in enumerate(members.items()):
        for op in ops:
            slot[op.id] = s
        if key[0] == "c":
            kind, issuers = shapes[key[1]]
            shape_of.append(kind)
            need.append(len(issuers))
        else:
            shape_of.append("")
            need.append(2)
    return slot, list(members), need, shape_of


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
    slowdown : Mapping[int, float], optional
        Rank (any integer, numpy's too) -> factor on every compute op of that rank (a straggler GPU). In a
        graph of representatives a representative runs at the slowest factor of
        the ranks it stands for (they proceed together).
    rank_compute : Mapping[int, ComputeModel], optional
        Rank (as in ``slowdown``) -> the compute model of that rank's ops, where it is not
        ``compute`` (several jobs, each with its own dtype and knobs, sharing
        one fabric: :mod:`simulator.jobs`).
    progress : callable, optional
        ``progress(done, total)``: called with the ops finished so far and the
        graph's op count each time another ~0.5% of the ops has finished, and
        once more at the end if every op finished (a progress bar for a step
        that simulates for a minute). It observes only: the simulation is the
        same with or without it.
    """

    share_compute_ends: bool = True
    """Compute ends due at one instant and scheduled back to back share one SimPy event (:class:`_ComputeEnd`;
    the same run, fewer events). False gives one event per end: the reference the tests compare with."""

    def __init__(self, graph: OpGraph, cluster: Cluster, compute: ComputeModel | None = None,
                 network: NetworkConfig | None = None, slowdown: Mapping[int, float] | None = None,
                 rank_compute: Mapping[int, ComputeModel] | None = None,
                 progress: Callable[[int, int], None] | None = None) -> None:
        for name, value, kind, how in (("graph", graph, OpGraph, "an OpGraph (workloads.ops)"),
                                       ("cluster", cluster, Cluster, "a Cluster (topologies.build_cluster)")):
            if not isinstance(value, kind):
                raise TypeError(f"{name}: must be {how}, got {type(value).__name__} {value!r:.60}")
        if graph.world_size > cluster.num_gpus:
            raise ValueError(f"world size {graph.world_size} exceeds the cluster's {cluster.num_gpus} GPUs")
        if compute is not None and not isinstance(compute, ComputeModel):
            raise TypeError(f"compute: must be a ComputeModel (simulator.compute), got {type(compute).__name__}")
        if network is not None and not isinstance(network, NetworkConfig):
            raise TypeError(f"network: must be a NetworkConfig (simulator.fabric), got {type(network).__name__}")
        self.graph = graph
        self.cluster = cluster
        self.compute = compute or ComputeModel(cluster.gpu)
        # (ranks: any integer, numpy's too, kept as int; a compute end is scheduled unchecked: no negative delay)
        self.slowdown = dict(slowdown or {})
        for rank, factor in self.slowdown.items():
            if not is_int(rank) or not 0 <= rank < graph.world_size:
                raise ValueError(f"slowdown: {rank!r} is not a rank of this graph (0..{graph.world_size - 1})")
            if isinstance(factor, bool) or not isinstance(factor, Real) or not 0 < factor < math.inf:
                raise ValueError(f"slowdown[{rank}]: must be a finite factor > 0, got {factor!r}")
        self.slowdown = {int(rank): factor for rank, factor in self.slowdown.items()}
        self.rank_compute = dict(rank_compute or {})
        for rank, model in self.rank_compute.items():
            if not is_int(rank) or not 0 <= rank < graph.world_size:
                raise ValueError(f"rank_compute: {rank!r} is not a rank of this graph (0..{graph.world_size - 1})")
            if not isinstance(model, ComputeModel):
                raise TypeError(f"rank_compute[{rank}]: must be a ComputeModel, got {type(model).__name__}")
        self.rank_compute = {int(rank): model for rank, model in self.rank_compute.items()}
        _check_replicas(graph)
        self._ran = False
        if progress is not None and not callable(progress):
            raise TypeError(f"progress: must be a callable progress(done, total), got {type(progress).__name__}")
        self.progress = progress
        self.env = simpy.Environment()
        self.fabric = Fabric(self.env, cluster, network)

    def run(self) -> RunRecord:
        """Run to completion; raise :class:`DeadlockError` if any op can never finish. An engine runs once:
        its clock, fabric and counters keep the first run's state (a second run read twice the step)."""
        if self._ran:
            raise RuntimeError("Engine.run: this engine has run; make a new Engine to simulate the graph again")
        self._ran = True
        with paused_gc():
            return self._run()

    def _run(self) -> RunRecord:
        graph = self.graph
        ops = graph.ops
        n = len(ops)
        replicas = _replicas(graph)
        if replicas is not None:
            for op in ops:
                if op.rank not in replicas:
                    raise OpGraphError(f"{_describe(op)}: rank {op.rank} is not a representative of this graph")
        # Every rendezvous key as a small int (its slot) and what it waits for, found once here: the hot path
        # below then hashes no tuples (a collective's key holds its group).
        slot, slot_keys, need, shape_of = _slots(*_match(graph)[1:], n)
        env, fabric, compute = self.env, self.fabric, self.compute
        network = fabric.network

        dependents: list[list[int]] = [[] for _ in range(n)]
        waiting: list[int] = [0] * n
        last_on_stream: dict[str, list[int]] = {}  # stream -> per rank, its last op so far (-1: none)
        for op in ops:
            i = op.id
            deps = op.deps
            last = last_on_stream.get(op.stream)
            if last is None:
                last = last_on_stream[op.stream] = [-1] * graph.world_size
            prev = last[op.rank]
            last[op.rank] = i
            if prev >= 0 and prev not in deps:
                deps = (*deps, prev)
            if len(deps) > 1 and len(set(deps)) != len(deps):
                deps = tuple(dict.fromkeys(deps))
            for d in deps:
                dependents[d].append(i)
            waiting[i] = len(deps)
        del last_on_stream

        # Compute durations, once per distinct op shape (coarsened ops often share their kernel tuple).
        nan = float("nan")
        member_busy: dict[int, float] = {}
        duration = op_durations(ops, compute, self.rank_compute, member_busy)
        if self.slowdown:
            factor = {r: max(self.slowdown.get(x, 1.0) for x in (replicas or {}).get(r, (r,)))
                      for r in {op.rank for op in ops}}
            for op in ops:
                f = factor[op.rank]
                if op.kind == "compute" and f != 1.0:
                    duration[op.id] *= f

        # Compute beside communication (module docstring): per rank the SMs its running communication holds
        # (``held``) and its running compute ops (``running``: op id -> entry, described at on_tracked).
        sms_of = self._comm_sms()
        kinds = {op.kind for op in ops}
        interfere = any(c or p for _s, c, p in sms_of.values()) and "compute" in kinds and len(kinds) > 1
        held: dict[int, int] = dict.fromkeys(sms_of, 0)
        running: dict[int, dict[int, list]] = {r: {} for r in sms_of}
        exempt = _reserved_ops(ops) if interfere else frozenset()

        issue_s: list[float] = [nan] * n
        start_s: list[float] = [nan] * n
        end_s: list[float] = [nan] * n
        arrived: dict[int, list[Op]] = {}  # slot -> the members that have issued it so far
        clone_groups: dict[tuple, list[tuple[int, ...]]] = {}
        # (kind, group, bytes, algorithm, count) of a collective without splits -> (its channel limit when the SMs
        # it holds matter, else None; its routed phases if its group is internal, else None): see issue()
        plain: dict[tuple, tuple] = {}
        p2p_specs: dict[tuple, tuple] = {}  # (src, dst, bytes) -> the flow specs of that send (all replicas)
        completed = 0
        progress = self.progress
        every = max(1, -(-n // _PROGRESS_STEPS))  # ops between reports: ceil(n / steps)
        report_at = every if progress is not None else math.inf  # ops finished at the next progress report
        reported = 0  # ops finished at the last one

        def finish(op_ids: list[int]) -> None:
            nonlocal completed, report_at, reported
            now = env.now
            completed += len(op_ids)
            if completed >= report_at:
                report_at = (completed // every + 1) * every
                reported = completed
                progress(completed, n)
            for i in op_ids:
                end_s[i] = now
                for d in dependents[i]:
                    w = waiting[d] - 1
                    waiting[d] = w
                    if w == 0:
                        issue(ops[d])

        def on_compute(event) -> None:
            finish(event._value)

        compute_done = (on_compute,)  # every compute end's callbacks (SimPy sets each event's to None after)
        queue, next_eid = env._queue, env._eid.__next__

        # A running compute op's entry: [work left in seconds at full speed as of ``since``, since, its speed
        # then, the event of its scheduled end, its end at that speed (``due``), the time that event runs at].
        def on_tracked(event) -> None:  # compute ends, some of whose speed the ranks' communication set
            done = []
            for i in event._value:
                mine = running[ops[i].rank]
                entry = mine.get(i)
                if entry is not None:
                    if entry[4] > entry[5]:  # slowed since this end was scheduled: it comes later
                        later = _ComputeEnd(tracked_done, [i])
                        heappush(queue, (entry[4], NORMAL, next_eid(), later))
                        entry[3], entry[5] = later, entry[4]
                        continue
                    del mine[i]
                done.append(i)
            finish(done)

        tracked_done = (on_tracked,)
        ends = tracked_done if interfere else compute_done

        def speed(rank: int) -> float:
            total, taken = sms_of[rank][0], held[rank]
            return 1.0 if not taken else (total - min(taken, total - 1)) / total

        def retime(rank: int) -> None:
            """The rank's communication changed: its running compute ops go on at the new speed. An op whose
            end moves later keeps its end event, which finds it unfinished when it runs (:func:`on_tracked`)
            and schedules it again; one whose end moves earlier than its event gets a new one now."""
            now = env.now
            rate = speed(rank)
            for i, entry in running[rank].items():
                left, since, old, event, due, at = entry
                if old == rate or due == now:  # (an op that ends now ends now: no rounding residue)
                    continue
                left -= (now - since) * old
                if left < 0.0:
                    left = 0.0
                due = now + left / rate
                if due < at:
                    event._value.remove(i)  # (an event left with no op ends nothing)
                    event = _ComputeEnd(tracked_done, [i])
                    heappush(queue, (due, NORMAL, next_eid(), event))
                    at = due
                entry[:] = (left, now, rate, event, due, at)

        # SMs each communication op holds while its data moves (0 for compute, and for every op when off)
        taken_by = [0 if op.kind == "compute" or not getattr(op, "holds_sms", True)
                    else sms_of[op.rank][1 if op.kind == "collective" else 2] for op in ops] if interfere else None

        def occupy(ids: list[int], sign: int) -> None:
            """Members ``ids`` of one collective or transfer start (``sign`` 1) or end (-1) moving data."""
            for j in ids:
                taken = taken_by[j]
                if taken:
                    r = ops[j].rank
                    held[r] += sign * taken
                    if running[r]:
                        retime(r)

        def comm_done(ids: list[int]) -> None:
            occupy(ids, -1)
            finish(ids)

        comm_finish = comm_done if interfere else finish
        # The compute end scheduled last (see _ComputeEnd: ends due at one instant, scheduled back to back,
        # share one event), its time and SimPy insertion id; ``merged``: ends that joined an earlier one's event.
        batch: _ComputeEnd | None = None
        batch_t, batch_eid, merged = nan, -2, 0
        share = self.share_compute_ends

        def clones(group: tuple[int, ...], shape: str) -> list[tuple[int, ...]]:
            out = clone_groups.get(group)
            if out is None:
                if shape == "lanes":
                    out = lanes(group, *(replicas[r] for r in group if r in replicas))
                else:
                    reps = [replicas[r] for r in group]
                    out = [tuple(rs[k] for rs in reps) for k in range(len(reps[0]))]
                clone_groups[group] = out
            return out

        def issue(op: Op) -> None:
            nonlocal batch, batch_t, batch_eid, merged
            i = op.id
            now = env.now
            issue_s[i] = now
            if op.kind == "compute":
                start_s[i] = now
                track = interfere and i not in exempt
                if track:
                    rate = speed(op.rank)
                    t = now + duration[i] / rate
                else:
                    t = now + duration[i]
                eid = next_eid()
                if eid == batch_eid + 1 and t == batch_t and share and batch.callbacks is not None:
                    batch._value.append(i)  # nothing scheduled since the batch's last end, due at the same time
                    merged += 1
                else:
                    batch = _ComputeEnd(ends, [i])
                    heappush(queue, (t, NORMAL, eid, batch))
                    batch_t = t
                batch_eid = eid
                if track:
                    running[op.rank][i] = [duration[i], now, rate, batch, t, t]
                return
            s = slot[i]
            group = arrived.get(s)
            if group is None:
                group = arrived[s] = [op]
            else:
                group.append(op)
            if len(group) < need[s]:
                return
            del arrived[s]
            ids = [o.id for o in group]
            for j in ids:
                start_s[j] = now
            known = None
            if op.kind == "collective" and op.split is None:
                # The same collective recurs (every micro-batch's TP collectives): what the fabric gives for it
                # (its channel limit and, for an internal group, its routed phases) looked up once per issue
                # under one key instead of under two (the fabric's caches hand out the same objects).
                ckey = (op.collective, op.group, op.nbytes, op.algorithm, op.count)
                known = plain.get(ckey)
                if known is None:
                    limit = (fabric.channel_limit(op.collective, op.group, op.nbytes, op.algorithm) if interfere
                             else None)
                    routed = (fabric.phases(op.collective, op.group, op.nbytes, op.algorithm, op.count)
                              if shape_of[s] == "internal" else None)
                    known = plain[ckey] = (limit, routed)
            if interfere:
                if known is not None:
                    # NCCL runs one CTA per channel: a collective cut to c channels for its size holds <= c SMs
                    limit = known[0]
                    if limit is not None:
                        for j in ids:
                            if taken_by[j] > limit:
                                taken_by[j] = limit
                occupy(ids, 1)
            if op.kind == "collective":
                shape = shape_of[s]
                fabric.collectives_run += 1
                done = _Countdown(1, comm_finish, ids)
                matrix = None
                rows = next((o.rows for o in group if o.rows is not None), None) if op.split is not None else None
                if rows is not None:  # a representative issuing for members it stands for: every row (one matrix)
                    matrix = rows
                elif op.split is not None:  # alltoallv: row i = what the i-th member of the group sends
                    position = {r: k for k, r in enumerate(op.group)}
                    matrix = tuple(o.split for o in sorted(group, key=lambda o: position[o.rank]))
                if shape == "internal":
                    routed = known[1] if known is not None else fabric.phases(op.collective, op.group, op.nbytes,
                                                                              op.algorithm, op.count, matrix)
                    fabric.run_phases(routed, op.traffic_class, done.tick)
                else:
                    groups = clones(op.group, shape)
                    sizes = op.lane_bytes or op.nbytes  # (lanes of unequal sizes: one each)
                    together = fabric.replicated_phases(op.collective, groups, sizes, op.algorithm, op.count, matrix)
                    if together is not None:
                        # Single-phase plans (pipelined rings, direct): start every replica's flows at once.
                        network.start_flows(together[0], op.traffic_class, done.tick)
                    else:
                        plans = [fabric.phases(op.collective, g, size, op.algorithm, op.count, matrix) for g, size
                                 in zip(groups, op.lane_bytes or repeat(op.nbytes))]
                        done.left = len(plans)
                        for p in plans:
                            fabric.run_phases(p, op.traffic_class, done.tick)
                return
            send = group[0] if group[0].kind == "send" else group[1]
            # The same send (every micro-batch's activations between two stages) recurs: its flows, one per
            # replica pair, are built once; handing the network the same tuple lets it find the call's shape
            # by identity too.
            p2p_key = (send.rank, send.peer, send.nbytes)
            specs = p2p_specs.get(p2p_key)
            if specs is None:
                if replicas is None:
                    specs = (fabric.send_spec(send.rank, send.peer, send.nbytes),)
                else:
                    specs = fabric.replica_send_specs(replicas[send.rank], replicas[send.peer], send.nbytes)
                p2p_specs[p2p_key] = specs
            network.start_flows(specs, send.traffic_class, _Countdown(1, comm_finish, ids).tick)

        for op in ops:
            if waiting[op.id] == 0:
                issue(op)
        env.run()
        if progress is not None and completed == n != reported:  # the last report, unless finish() made it
            progress(n, n)
        issue_a, start_a, end_a = np.array(issue_s), np.array(start_s), np.array(end_s)
        if completed < n:
            raise DeadlockError(self._deadlock_report({slot_keys[s]: g for s, g in arrived.items()}, issue_a, end_a))
        step = float(np.max(end_a)) if n else 0.0
        stretch = 0.0
        if interfere:  # compute time the SMs held beside it added, per rank of the world on average
            ids = np.array([op.id for op in ops if op.kind == "compute" and op.id not in exempt], dtype=np.int64)
            if len(ids):
                extra = end_a[ids] - start_a[ids] - np.asarray(duration, dtype=float)[ids]
                # an op never slowed ends at start + duration up to the rounding of the sums: a few ulps of its
                # end, not time its SMs lost (examples/custom-fabric.yaml read 1.4e-18 s per rank)
                extra[extra <= 4 * np.spacing(end_a[ids])] = 0.0
                # (an op with members: its faster members' ops are shorter, taken as stretched in proportion)
                weight = np.array([len(replicas[ops[i].rank]) * member_busy.get(i, 1.0) if replicas else 1
                                   for i in ids.tolist()], dtype=float)
                stretch = float(extra @ weight) / graph.world_size
        # the record keeps the graph as it ran: a graph built on afterwards (a notebook adding ops for the next
        # run) leaves this run's result as it was (its frames are read off the op list lazily)
        ran = copy.copy(graph)
        ran.ops = list(ops)
        return RunRecord(ran, fabric, issue_a, start_a, end_a, _event_count(env) - merged, step, stretch,
                         member_busy)

    def _comm_sms(self) -> dict[int, tuple[int, int, int]]:
        """Per rank with ops: ``(its GPU's SMs, SMs a collective holds, SMs a send or receive holds)`` from its
        compute model (:attr:`ComputeModel.comm_sms`, ``p2p_sms``)."""
        out = {}
        for rank in {op.rank for op in self.graph.ops}:
            model = self.rank_compute.get(rank, self.compute)
            out[rank] = (model.gpu.sm_count, model.comm_sms, model.p2p_sms)
        return out

    def _deadlock_report(self, arrived: dict, issue_s: np.ndarray, end_s: np.ndarray) -> str:
        ops = self.graph.ops
        lines = []
        for key, present in arrived.items():
            op = present[0]
            have = {o.rank for o in present}
            need = (group_shape(op.group, _replicas(self.graph))[1] if op.kind == "collective"
                    else (key[1], key[2]))
            missing = [r for r in need if r not in have]
            lines.append(f"{_describe(op)} waits for rank(s) {_listed(missing)} to reach it")
        blocked = [op for op in ops if np.isnan(issue_s[op.id])]
        if blocked:
            op = blocked[0]
            waits = [d for d in op.deps if np.isnan(end_s[d])]
            # the op before it on its stream, which the engine makes it wait for too (the stream's order)
            before = next((o for o in reversed(ops[:op.id]) if o.rank == op.rank and o.stream == op.stream), None)
            behind = (f" and, on its stream {op.stream!r}, behind {_describe(before)}"
                      if before is not None and np.isnan(end_s[before.id]) and before.id not in waits else "")
            lines.append(f"{len(blocked)} op(s) never became ready, e.g. {_describe(op)} "
                         f"waiting on op(s) {_listed(waits)}{behind}")
        unfinished = int(np.isnan(end_s).sum())
        return f"deadlock: {unfinished} op(s) can never finish: " + "; ".join(lines[:6])


def _reserved_ops(ops: list[Op]) -> frozenset[int]:
    """Ids of the compute ops with a kernel timed on fewer SMs (``sm_reserved``): their time already leaves the
    communication beside them its SMs, so the engine does not slow them again."""
    out = []
    seen: dict[int, bool] = {}  # id(kernel tuple) -> whether one of its kernels holds SMs back
    for op in ops:
        parts = op.parts if op.kind == "compute" else None
        if parts is None:  # (only kernels carry sm_reserved)
            continue
        found = seen.get(id(parts))
        if found is None:
            found = seen[id(parts)] = any(k.sm_reserved for k in parts)
        if found:
            out.append(op.id)
    return frozenset(out)


_PROGRESS_STEPS = 200
"""Progress reports per run (:class:`Engine`'s ``progress``): one per ~0.5% of the ops."""


class _ComputeEnd:
    """The SimPy event of the end of one or more compute ops: what ``env.timeout(duration, op_id)`` schedules,
    without a :class:`simpy.Timeout` (its construction was a tenth of the engine's own time per compute op).

    :meth:`simpy.Environment.step` reads only ``callbacks`` (set to None once run), ``_ok`` and ``_value`` (here
    the op ids). The engine pushes it as :meth:`simpy.Environment.schedule` would (``now + delay``, NORMAL
    priority, the next insertion id), so events run in the same order at the same times. Ends due at the same
    instant whose scheduling nothing came between (every rank of a stage starting the same kernels when an
    all-to-all completes) share one event: their insertion ids were consecutive, so they ran back to back,
    and whatever one's successors schedule for that instant gets a later id and ran after all of them, as it
    does after the shared event. The step, every op's times and the order of everything else are those of
    one event per end; only the events SimPy processes are fewer."""

    __slots__ = ("callbacks", "_value")
    _ok = True

    def __init__(self, callbacks: tuple, op_ids: list[int]) -> None:
        self.callbacks = callbacks
        self._value = op_ids


class _Countdown:
    """Calls ``finish(ids)`` after ``left`` ticks (the flows or clone plans of one op)."""

    __slots__ = ("left", "finish", "ids")

    def __init__(self, left: int, finish: Callable[[list[int]], None], ids: list[int]) -> None:
        self.left = left
        self.finish = finish
        self.ids = ids

    def tick(self) -> None:
        self.left -= 1
        if self.left == 0:
            self.finish(self.ids)


def _event_count(env: simpy.Environment) -> int:
    """Events processed so far (SimPy's insertion counter)."""
    # NOTE: reads the id counter SimPy uses to order simultaneous events.
    return next(env._eid)


def run(graph: OpGraph, cluster: Cluster, compute: ComputeModel | None = None,
        network: NetworkConfig | None = None) -> RunRecord:
    """Simulate ``graph`` on ``cluster``; see :class:`Engine`."""
    return Engine(graph, cluster, compute, network).run()
