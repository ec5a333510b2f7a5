"""The op-graph contract between ``workloads`` and ``simulator``.

A training step is a set of per-rank programs of operations with explicit
dependencies, in the spirit of MLCommons Chakra execution traces. The
generators in this package build an :class:`OpGraph`; the simulator executes
it. Nothing here knows about hardware: compute speaks FLOPs and bytes,
communication speaks bytes.

Semantics the engine relies on
------------------------------
* Every op has a globally unique integer ``id`` (its index in
  :attr:`OpGraph.ops`) and the ids of the ops it waits for (``deps``), which
  may live on other ranks.
* Ops on the same ``(rank, stream)`` run in program order, like a CUDA
  stream: an op also waits for the previous op of its stream.
* Collectives are matched as NCCL matches them: the k-th collective a rank
  issues on a given ``group`` joins the k-th collective of every other member
  on that group. Send/recv are matched the same way per ``(src, dst)`` pair.
  All members must agree on kind and size.
* ``nbytes`` of a collective follows nccl-tests: the full buffer size ``S``
  (all_reduce/broadcast/reduce: the tensor; all_gather: the gathered output;
  reduce_scatter: the input; all_to_all/gather: each rank's total send or
  receive buffer).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from numbers import Integral, Real

COLLECTIVE_KINDS = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "broadcast",
    "reduce",
    "gather",
)
COMPUTE_CATEGORIES = ("gemm", "gemm_fp8", "gemm_fp8_wgrad", "attention", "attention_bwd", "elementwise",
                      "activation", "fp8_cast", "scores", "optimizer", "fixed", "attention_nomask",
                      "attention_nomask_bwd")
"""Kernel kinds the hardware model times (:class:`simulator.compute.ComputeModel`): ``gemm_fp8`` is a GEMM on
FP8 operands (at the GPU's FP8 rate), ``gemm_fp8_wgrad`` the weight-gradient GEMM of blockwise FP8 scaling
(``training.fp8_recipe: blockwise``, at its own measured ceiling), ``fp8_cast`` a memory-bound FP8 cast /
transpose / scale update, ``activation`` an MLP's fused activation (GeLU, SwiGLU), memory-bound at a measured rate
of its own; ``attention`` / ``attention_bwd`` a fused attention kernel with a causal mask, ``attention_nomask`` /
``attention_nomask_bwd`` one without a mask (ring attention's off-diagonal steps)."""
GEMM_CATEGORIES = ("gemm", "gemm_fp8", "gemm_fp8_wgrad")
"""The :data:`COMPUTE_CATEGORIES` that are GEMMs (timed by :mod:`simulator.gemm`'s wave/tile model)."""
FP8_GEMM_CATEGORIES = ("gemm_fp8", "gemm_fp8_wgrad")
"""The GEMMs on FP8 operands."""


@dataclass(frozen=True, slots=True)
class Kernel:
    """One kernel of a coarsened compute op: ``flops`` FLOPs over ``nbytes`` of HBM traffic.

    ``flops`` are the FLOPs the kernel executes (a causal FlashAttention
    kernel: the unmasked half). ``shape`` is a GEMM's ``(m, n, k)`` or a fused
    attention kernel's ``(s_q, s_kv, head_dim)``, run ``batch`` times in one
    launch (a batched GEMM; the heads of an attention kernel).
    ``sm_reserved`` SMs are held by a communication kernel running beside it
    (Transformer Engine's userbuffers); a GEMM then runs on the others.
    """

    category: str
    flops: float
    nbytes: float
    shape: tuple[int, int, int] | None = None
    batch: int = 1
    sm_reserved: int = 0


@dataclass(slots=True, eq=False)
class Op:
    """Fields common to every operation.

    ``traffic_class`` says which parallel dimension caused the op (``dp``,
    ``tp``, ``pp``, ``ep``, ``zero``, ``compute`` ...); ``layer``,
    ``micro_batch`` and ``stage`` are -1 where they do not apply.
    """

    id: int
    rank: int
    stream: str
    deps: tuple[int, ...]
    name: str
    traffic_class: str
    layer: int
    micro_batch: int
    stage: int

    kind = "op"


@dataclass(slots=True, eq=False)
class Compute(Op):
    """Work on one GPU: ``flops`` floating-point operations touching ``nbytes`` of HBM.

    ``category`` selects the efficiency model (``gemm``, ``attention``,
    ``elementwise``, ``optimizer``); ``shape`` is the GEMM ``(m, n, k)`` where
    known (for wave quantisation); ``duration_s`` fixes the time outright
    (category ``fixed``), for tests and measured traces.

    A coarsened op stands for a fused sequence of kernels: ``parts`` holds one
    :class:`Kernel` each, its time is the sum of theirs, and ``flops`` /
    ``nbytes`` are their totals.

    ``members`` (with ``parts``) is every member's kernels, for a graph whose
    representative computes on behalf of ranks whose work differs
    (``graph.replicas``; ``lockstep``'s skewed MoE stages: each EP rank's
    experts at its own load), in the order of the representative's EP group;
    each member tuple stands for an equal share of the representative's
    replicas. The op takes the longest member's time (the members' next
    exchange waits for the slowest of them); ``parts`` is that member's
    kernels, and the others' shortfall is their wait (``moe_wait``).
    """

    flops: float = 0.0
    nbytes: float = 0.0
    category: str = "gemm"
    shape: tuple[int, int, int] | None = None
    duration_s: float | None = None
    parts: tuple[Kernel, ...] | None = None
    members: tuple[tuple[Kernel, ...], ...] | None = None
    kind = "compute"

    @property
    def mean_flops(self) -> float:
        """FLOPs one rank the op stands for executes, on average: ``flops``, or the mean over ``members``."""
        if self.members is None:
            return self.flops
        return sum(sum(k.flops for k in member) for member in self.members) / len(self.members)


@dataclass(slots=True, eq=False)
class Collective(Op):
    """One rank's part of a collective over ``group`` (ranks, in ring order).

    ``count`` > 1 makes it a coarsened op: ``count`` back-to-back collectives
    of ``nbytes`` each (e.g. the two TP all-reduces of each of 12 layers),
    which pay the per-step latency ``count`` times.

    ``split`` (all_to_all only) makes it a variable-size exchange, like MPI's
    ``alltoallv``: the bytes this rank sends to each member of ``group``, in
    group order; ``nbytes`` is then their sum. Members may send different
    amounts, so only kind, group and count must match.

    ``rows`` (with ``split``) is every member's split, in group order, for a
    graph whose representative issues the exchange on behalf of members it
    stands for (``graph.replicas``): those members issue no op, so the
    representative carries the whole matrix. ``rows[i]`` is what the i-th
    member sends; the issuing rank's own row equals ``split``.

    ``lane_bytes`` (a representative's collective that runs once per lane,
    :func:`simulator.engine.lanes`): each lane's bytes, in lane order, where
    the members a representative stands for move different amounts (the
    expert-TP all-gather of each EP member's own load, when one rank issues
    for its whole EP group); ``nbytes`` is then their mean.

    ``holds_sms`` False: its kernel takes no SMs from compute beside it that
    the engine should account for (the engine's "compute beside communication"),
    because the generator priced them itself: Transformer Engine's userbuffers,
    whose pipelined and bulk overlaps run their GEMMs on the SMs they leave
    (``sm_reserved``) and whose ring exchange runs on the copy engines.
    """

    collective: str = "all_reduce"
    group: tuple[int, ...] = ()
    nbytes: float = 0.0
    algorithm: str = "auto"
    count: int = 1
    split: tuple[float, ...] | None = None
    rows: tuple[tuple[float, ...], ...] | None = None
    holds_sms: bool = True
    lane_bytes: tuple[float, ...] | None = None
    kind = "collective"


@dataclass(slots=True, eq=False)
class Send(Op):
    """Send ``nbytes`` to ``peer``; completes when the matching recv has the data.

    ``tag`` separates independent message streams between the same pair
    (e.g. activations and gradients); matching is per ``(src, dst, tag)``.
    """

    peer: int = -1
    nbytes: float = 0.0
    tag: int = 0
    kind = "send"


@dataclass(slots=True, eq=False)
class Recv(Op):
    """Receive ``nbytes`` from ``peer`` (matched per ``(src, dst, tag)``)."""

    peer: int = -1
    nbytes: float = 0.0
    tag: int = 0
    kind = "recv"


class OpGraphError(ValueError):
    """An op graph that is malformed (unknown dependency, bad rank, bad size)."""


_INF = math.inf


def is_size(x: object) -> bool:
    """Whether ``x`` is a finite real number >= 0 (a FLOP count, a byte count, seconds): NaN compares false,
    infinity is not below ``_INF``, and a string or None is no number (they made the network loop forever or
    the step time NaN)."""
    try:
        return not isinstance(x, bool) and 0 <= x < _INF
    except TypeError:
        return False


def _check_shape(shape: object, what: str) -> None:
    """A GEMM's ``(m, n, k)`` or an attention kernel's ``(s_q, s_kv, head_dim)``: three positive finite numbers
    (whole in practice; a scaled count may be a float), as a tuple. A zero or negative one divided by zero in the
    wave model, long after the op was built."""
    if (not isinstance(shape, tuple) or len(shape) != 3
            or not all(isinstance(x, Real) and not isinstance(x, bool) and 0 < x < _INF for x in shape)):
        raise OpGraphError(f"{what}: shape must be three positive numbers (m, n, k), got {shape!r:.60}")


def _tag(tag: object) -> int:
    """A message tag as an int; a tag that is not a whole number is an error (``int(1.2)`` and ``int(1.9)``
    were both 1, so two streams meant to be apart matched each other)."""
    if type(tag) is int:
        return tag
    if isinstance(tag, bool) or not isinstance(tag, Integral):
        raise OpGraphError(f"tag: must be an integer (it separates message streams), got {tag!r:.60}")
    return int(tag)


def _labels(layer: object, micro_batch: object, stage: object) -> tuple[int, int, int]:
    """``(layer, micro_batch, stage)`` as ints (-1: none); anything but a whole number is refused here, where it
    was taken and then broke the result's frames (``int('a')`` in ``Result.ops``, long after the build)."""
    out = []
    for name, value in (("layer", layer), ("micro_batch", micro_batch), ("stage", stage)):
        if isinstance(value, bool) or not isinstance(value, Integral):
            raise OpGraphError(f"{name}: must be an integer (-1 for none), got {value!r:.60}")
        out.append(int(value))
    return out[0], out[1], out[2]


def _names(stream: object, traffic_class: object) -> tuple[str, str]:
    """``(stream, traffic_class)`` as plain strs (a str subclass such as ``np.str_`` taken); a builder's call
    with either not a non-empty string is refused there: a ``None`` or int class simulated, then broke
    ``Result.summary`` and ``time_breakdown`` (a sort of None with str, ``"exposed_" + 5``)."""
    if not isinstance(traffic_class, str) or not traffic_class:
        raise OpGraphError(f"traffic_class: must be a non-empty string (dp, tp, pp, ep, cp, zero, compute, or a "
                           f"name of your own), got {traffic_class!r:.60}")
    if not isinstance(stream, str) or not stream:
        raise OpGraphError(f"stream: must be a non-empty string (ops on one rank and stream run in order: compute, "
                           f"comm, or a name of your own), got {stream!r:.60}")
    return str(stream), str(traffic_class)


class OpGraph:
    """Per-rank programs of operations for one training step.

    Build it with the helper methods, which assign ids and validate eagerly::

        g = OpGraph(world_size=2)
        a = g.compute(0, flops=1e12, name="fwd")
        g.send(0, peer=1, nbytes=1e6, deps=[a], traffic_class="pp")
        g.recv(1, peer=0, nbytes=1e6, traffic_class="pp")
    """

    def __init__(self, world_size: int) -> None:
        if isinstance(world_size, bool) or not isinstance(world_size, Integral) or world_size < 1:
            raise OpGraphError(f"world_size: must be an integer >= 1, got {world_size!r}")
        world_size = int(world_size)
        self.world_size = world_size
        self.ops: list[Op] = []
        self._valid_groups: set[tuple[int, ...]] = set()  # groups already checked (distinct, in range)
        # (id(group tuple), rank) -> that tuple: a group object already checked with that rank in it (the tuple
        # kept in the value so that its id cannot be reused while cached); the alltoallv builder's fast path
        self._members: dict[tuple[int, int], tuple[int, ...]] = {}
        # the last group object checked and its ranks as a set: the ops of one collective's members (collective(),
        # a generator's loop over a group) look themselves up in O(1), where the tuple's hash and a membership
        # scan cost O(n) per member (a 262,144-rank collective took minutes to build, before any check ran)
        self._last_group: tuple[tuple[int, ...], frozenset[int]] | None = None
        # id(split tuple given) -> (that tuple, as floats, its sum): alltoallv rows already checked
        self._valid_splits: dict[int, tuple[tuple, tuple[float, ...], float]] = {}
        self._valid_rows: dict[int, tuple[tuple, tuple[tuple[float, ...], ...]]] = {}  # the same, for rows
        # Totals of kernel tuples already seen, by identity (generators share one tuple across many ops);
        # the tuple is kept in the value so that its id cannot be reused while cached.
        self._part_totals: dict[int, tuple[tuple[Kernel, ...], float, float]] = {}
        self.replicas: dict[int, tuple[int, ...]] | None = None
        """Optional: ``{representative rank: the ranks it stands for}`` (itself included, in replica
        order). When set, only representatives have ops; every rank a representative stands for runs the
        same program with its peers and groups relabelled replica by replica (the k-th replica of a
        representative talks to the k-th replicas of its peers; a group inside one replica set runs once
        per translate that tiles the set). See :func:`simulator.engine.group_shape`."""

    # ------------------------------------------------------------------ helpers
    def _check_rank(self, rank: int, field: str = "rank") -> None:
        if isinstance(rank, bool) or not isinstance(rank, Integral):
            raise OpGraphError(f"{field}: must be an integer rank in 0..{self.world_size - 1}, got {rank!r}")
        if not 0 <= rank < self.world_size:
            raise OpGraphError(f"{field}: {rank} is outside 0..{self.world_size - 1}")

    def _deps(self, deps: Iterable[int], n: int | None = None) -> tuple[int, ...]:
        """``deps`` as a tuple (a tuple given is kept), every id that of an op so far (``n`` of them: the
        graph's, unless given)."""
        try:
            out = tuple(deps)
        except TypeError:
            raise OpGraphError(f"deps: must be op ids (a list or tuple of integers), got {deps!r:.60}") from None
        if n is None:
            n = len(self.ops)
        for d in out:
            if type(d) is not int and (isinstance(d, bool) or not isinstance(d, Integral)):
                raise OpGraphError(f"deps: op ids are integers (what the builders return), got {d!r:.60}")
            if not 0 <= d < n:
                raise OpGraphError(f"deps: op id {d} does not exist (ops so far: {n})")
        return out

    # --------------------------------------------------------------- builders
    def compute(
        self,
        rank: int,
        flops: float = 0.0,
        nbytes: float = 0.0,
        *,
        name: str = "compute",
        deps: Iterable[int] = (),
        stream: str = "compute",
        category: str = "gemm",
        shape: tuple[int, int, int] | None = None,
        duration_s: float | None = None,
        parts: Sequence[Kernel] | None = None,
        traffic_class: str = "compute",
        layer: int = -1,
        micro_batch: int = -1,
        stage: int = -1,
    ) -> int:
        """Append a :class:`Compute` op on ``rank``; return its id. ``stream`` and ``traffic_class`` are non-empty
        strings."""
        if type(rank) is not int or not 0 <= rank < self.world_size:
            self._check_rank(rank)
        if type(traffic_class) is not str or type(stream) is not str or not (traffic_class and stream):
            stream, traffic_class = _names(stream, traffic_class)
        if type(layer) is not int or type(micro_batch) is not int or type(stage) is not int:
            layer, micro_batch, stage = _labels(layer, micro_batch, stage)
        if not (is_size(flops) and is_size(nbytes)):
            raise OpGraphError(f"compute {name!r}: flops and nbytes must be finite numbers >= 0, got {flops!r}, "
                               f"{nbytes!r}")
        if category not in COMPUTE_CATEGORIES:
            raise OpGraphError(f"category: {category!r} unknown; valid: {', '.join(COMPUTE_CATEGORIES)}")
        if duration_s is not None and not is_size(duration_s):
            raise OpGraphError(f"duration_s: must be a finite number of seconds >= 0, got {duration_s!r}")
        if category == "fixed" and duration_s is None:
            raise OpGraphError(f"compute {name!r}: category 'fixed' takes its time from duration_s; give it")
        if shape is not None:
            _check_shape(shape, f"compute {name!r}")
        if parts is not None:
            parts = parts if isinstance(parts, tuple) else tuple(parts)
            flops, nbytes = self._part_sums(parts, name)
        ops = self.ops
        n = len(ops)
        # positional, in field order (Op's, then Compute's): the builders run once per op of every rank
        ops.append(Compute(n, rank, stream, self._deps(deps), name, traffic_class, layer, micro_batch, stage,
                           float(flops), float(nbytes), category, shape, duration_s, parts))
        return n

    def collective_op(
        self,
        rank: int,
        collective: str,
        group: Sequence[int],
        nbytes: float,
        *,
        name: str = "",
        deps: Iterable[int] = (),
        stream: str = "comm",
        algorithm: str = "auto",
        count: int = 1,
        split: Sequence[float] | None = None,
        rows: Sequence[Sequence[float]] | None = None,
        traffic_class: str = "dp",
        layer: int = -1,
        micro_batch: int = -1,
        stage: int = -1,
        holds_sms: bool = True,
        lane_bytes: Sequence[float] | None = None,
    ) -> int:
        """Append one member's :class:`Collective` op; return its id. ``stream`` and ``traffic_class`` are
        non-empty strings; ``lane_bytes`` (see :class:`Collective`) sets ``nbytes`` to their mean."""
        if type(rank) is not int or not 0 <= rank < self.world_size:
            self._check_rank(rank)
        if type(traffic_class) is not str or type(stream) is not str or not (traffic_class and stream):
            stream, traffic_class = _names(stream, traffic_class)
        if type(layer) is not int or type(micro_batch) is not int or type(stage) is not int:
            layer, micro_batch, stage = _labels(layer, micro_batch, stage)
        if collective not in COLLECTIVE_KINDS:
            raise OpGraphError(f"collective: {collective!r} unknown; valid: {', '.join(COLLECTIVE_KINDS)}")
        # (exact types first: the abstract-class checks cost more than the rest of the call)
        grp = self._checked_group(rank, group if type(group) is tuple else
                                  tuple(group) if isinstance(group, Iterable) else (group,))
        if not is_size(nbytes):
            raise OpGraphError(f"nbytes: must be a finite number of bytes >= 0, got {nbytes!r}")
        if (type(count) is not int and (isinstance(count, bool) or not isinstance(count, Integral))) or count < 1:
            raise OpGraphError(f"count: must be an integer >= 1, got {count!r}")
        if split is not None:
            if collective != "all_to_all":
                raise OpGraphError(f"split: only an all_to_all can have per-peer sizes, not {collective}")
            split, nbytes = self._checked_split(split, grp)
        if rows is not None:
            rows = self._checked_rows(rows, grp, rank, split)
        if type(holds_sms) is not bool:
            raise OpGraphError(f"holds_sms: must be True or False, got {holds_sms!r}")
        if lane_bytes is not None:
            lane_bytes = tuple(lane_bytes) if isinstance(lane_bytes, Iterable) else (lane_bytes,)
            if collective == "all_to_all" or not lane_bytes or not all(map(is_size, lane_bytes)):
                raise OpGraphError(f"lane_bytes: must be one finite size >= 0 per lane, of a collective other than "
                                   f"all_to_all, got {lane_bytes!r}")
            lane_bytes = tuple(map(float, lane_bytes))
            nbytes = sum(lane_bytes) / len(lane_bytes)
        ops = self.ops
        n = len(ops)
        ops.append(Collective(n, rank, stream, self._deps(deps), name or collective, traffic_class, layer,
                              micro_batch, stage, collective, grp, float(nbytes), algorithm, int(count), split,
                              rows, holds_sms, lane_bytes))
        return n

    def _part_sums(self, parts: tuple[Kernel, ...], name: str) -> tuple[float, float]:
        """FLOPs and bytes of a coarsened op's kernels, checked and summed once per tuple object (a generator
        hands one cached tuple to many ops): every kernel's FLOPs and bytes finite and non-negative."""
        cached = self._part_totals.get(id(parts))
        if cached is None or cached[0] is not parts:
            for k in parts:
                if not (isinstance(k, Kernel) and is_size(k.flops) and is_size(k.nbytes)):
                    raise OpGraphError(f"compute {name!r}: parts must be Kernels of finite, non-negative flops "
                                       f"and nbytes, got {k!r}")
                if k.category not in COMPUTE_CATEGORIES or k.category == "fixed":
                    raise OpGraphError(f"compute {name!r}: kernel category {k.category!r} unknown; valid: "
                                       f"{', '.join(c for c in COMPUTE_CATEGORIES if c != 'fixed')} (a fixed time "
                                       f"is an op's duration_s)")
                if k.shape is not None:
                    _check_shape(k.shape, f"compute {name!r}")
                if isinstance(k.batch, bool) or not isinstance(k.batch, Integral) or k.batch < 1:
                    raise OpGraphError(f"compute {name!r}: kernel batch must be an integer >= 1, got {k.batch!r}")
            cached = self._part_totals[id(parts)] = (parts, sum(k.flops for k in parts), sum(k.nbytes for k in parts))
        return cached[1], cached[2]

    def _known_parts(self, parts: tuple[Kernel, ...], flops: float, nbytes: float) -> None:
        """Record ``parts`` as checked kernels (:meth:`_part_sums`) whose totals are ``flops`` and ``nbytes``, as
        a generator made them: Kernels of finite non-negative FLOPs and bytes, the totals Python's ``sum`` of
        theirs in order. The ops using them then skip the per-kernel check."""
        self._part_totals[id(parts)] = (parts, flops, nbytes)

    def _joined_parts(self, pieces: tuple[tuple[Kernel, ...], ...], name: str) -> tuple[Kernel, ...]:
        """The concatenation of ``pieces`` (kernel tuples), recorded as checked: each piece is checked once by
        identity (:meth:`_part_sums`, which most generators' pieces have passed already), so the joined tuple
        skips the per-kernel check; its totals are still ``sum`` over its own kernels in order, as
        :meth:`_part_sums` would add them. For a generator that makes many tuples out of a few checked ones
        (a recomputed MoE forward: the kernels before the experts, the experts at a rank's load, the rest)."""
        # (the totals are one ``sum`` over the joined kernels, not the pieces' sums carried on: from Python 3.12
        # ``sum`` compensates its float additions within one call, so a carried sum can differ in the last bit)
        parts = ()
        for piece in pieces:
            self._part_sums(piece, name)
            parts += piece
        self._known_parts(parts, sum([k.flops for k in parts]), sum([k.nbytes for k in parts]))
        return parts

    def _checked_group(self, rank: int, grp: tuple[int, ...]) -> tuple[int, ...]:
        """``grp``, checked (once per distinct group): non-empty distinct ranks of this graph, ``rank`` among them.
        The same tuple object again (the next member's op of one collective) is looked up by identity."""
        last = self._last_group
        if last is not None and last[0] is grp:
            members: tuple[int, ...] | frozenset[int] = last[1]
        else:
            if grp not in self._valid_groups:
                if len(set(grp)) != len(grp) or not grp or not all(isinstance(r, Integral) for r in grp):
                    raise OpGraphError(f"group: must be a non-empty list of distinct ranks, got {grp}")
                for r in grp:
                    self._check_rank(r, "group")
                self._valid_groups.add(grp)
            members = grp
            if len(grp) > 64:  # (a small group's scan costs less than a set)
                members = frozenset(grp)
                self._last_group = (grp, members)
        if rank not in members:
            raise OpGraphError(f"group: rank {rank} issues a collective on a group it is not in: {grp}")
        return grp

    def _checked_split(self, split: Sequence[float], grp: tuple[int, ...]) -> tuple[tuple[float, ...], float]:
        """``split`` of an alltoallv as a tuple of floats and its sum, checked once per tuple object (a
        generator hands the same cached row to many ops): one non-negative size per member of ``grp``."""
        checked = self._valid_splits.get(id(split))
        if checked is not None and checked[0] is split and len(split) == len(grp):
            return checked[1], checked[2]  # the same tuple again (a generator's cached row)
        given = split
        try:
            split = tuple(map(float, split))
        except (TypeError, ValueError):
            split = None
        # (0.0).__gt__ is ``x < 0`` per size, run in C: MoE steps check tens of thousands of rows
        if split is None or len(split) != len(grp) or any(map((0.0).__gt__, split)) \
                or not all(map(math.isfinite, split)):
            raise OpGraphError(f"split: need {len(grp)} finite non-negative sizes (one per group member), "
                               f"got {given!r}")
        nbytes = sum(split)
        if isinstance(given, tuple):
            self._valid_splits[id(given)] = (given, split, nbytes)
        return split, nbytes

    def _known_splits(self, rows: Iterable[tuple[float, ...]]) -> None:
        """Record ``rows`` as checked alltoallv splits (:meth:`_checked_split`): tuples of Python floats, each
        size non-negative, as a generator made them (``tolist`` of a non-negative float64 array), so that the
        ops using them skip the per-size check. Their length is still checked against each op's group."""
        valid = self._valid_splits
        for row in rows:
            valid[id(row)] = (row, row, sum(row))

    def _alltoallv(self, rank: int, group: tuple[int, ...], split: tuple[float, ...],
                   rows: tuple[tuple[float, ...], ...] | None, name: str, deps: Iterable[int], stream: str,
                   layer: int, micro_batch: int, stage: int) -> int:
        """:meth:`collective_op` of an ``all_to_all`` with per-peer sizes (``split``, and ``rows`` when the rank
        issues for its group) of traffic class ``ep``, positionally: the hot path of the MoE generators (two
        exchanges per layer pass of every rank). The same checks, the same op."""
        if not 0 <= rank < self.world_size:
            self._check_rank(rank)
        grp = self._members.get((id(group), rank))
        if grp is not group:  # not this group object with this rank before: check it (a generator's EP group
            # is one cached tuple, whose 64-member hash and membership scan would otherwise be paid per op)
            grp = self._checked_group(rank, group if type(group) is tuple else tuple(group))
            if grp is group:
                self._members[(id(group), rank)] = grp
        checked = self._valid_splits.get(id(split))  # _checked_split's first step, inline (its common case)
        if checked is not None and checked[0] is split and len(split) == len(grp):
            split, nbytes = checked[1], checked[2]
        else:
            split, nbytes = self._checked_split(split, grp)
        if rows is not None:
            rows = self._checked_rows(rows, grp, rank, split)
        ops = self.ops
        n = len(ops)
        ops.append(Collective(n, rank, stream, self._deps(deps, n), name, "ep", layer, micro_batch, stage,
                              "all_to_all", grp, float(nbytes), "auto", 1, split, rows))
        return n

    def _compute_parts(self, rank: int, parts: tuple[Kernel, ...], name: str, deps: Iterable[int], category: str,
                       layer: int, micro_batch: int, stage: int, stream: str,
                       members: tuple[tuple[Kernel, ...], ...] | None = None) -> int:
        """:meth:`compute` of a coarsened op (``parts`` a tuple of kernels; no shape, no ``duration_s``, traffic
        class ``compute``), positionally: the hot path of the MoE generators (three compute ops per layer pass
        of every rank). The same checks, the same op. ``members``: every member's kernels (:class:`Compute`),
        ``parts`` among them; each tuple checked as ``parts`` is."""
        if not 0 <= rank < self.world_size:
            self._check_rank(rank)
        if category not in COMPUTE_CATEGORIES:
            raise OpGraphError(f"category: {category!r} unknown; valid: {', '.join(COMPUTE_CATEGORIES)}")
        cached = self._part_totals.get(id(parts))  # _part_sums' first step, inline (its common case)
        if cached is not None and cached[0] is parts:
            flops, nbytes = cached[1], cached[2]
        else:
            flops, nbytes = self._part_sums(parts, name)
        if members is not None:
            if not (type(members) is tuple and members and any(m is parts for m in members)):
                raise OpGraphError(f"compute {name!r}: members must be a non-empty tuple of kernel tuples holding "
                                   f"the op's parts")
            for member in members:
                self._part_sums(member, name)
        ops = self.ops
        n = len(ops)
        ops.append(Compute(n, rank, stream, self._deps(deps, n), name, "compute", layer, micro_batch, stage,
                           float(flops), float(nbytes), category, None, None, parts, members))
        return n

    def _checked_rows(self, rows: Sequence[Sequence[float]], grp: tuple[int, ...], rank: int,
                      split: tuple[float, ...] | None) -> tuple[tuple[float, ...], ...]:
        """``rows`` of an alltoallv (bytes each member sends to each member) as a tuple of float tuples, checked
        once per rows object (a generator hands the same matrix to every micro-batch of a draw): one row of
        ``len(grp)`` finite non-negative sizes per member, the issuing rank's own row equal to its ``split``."""
        if split is None:
            raise OpGraphError("rows: only an alltoallv (an all_to_all with split) carries its members' rows")
        checked = self._valid_rows.get(id(rows))
        known = checked is not None and checked[0] is rows
        if known:
            out = checked[1]
        else:
            try:
                out = tuple(tuple(map(float, row)) for row in rows)
            except (TypeError, ValueError):
                raise OpGraphError(f"rows: need {len(grp)} rows of {len(grp)} sizes in bytes (one row per group "
                                   f"member), got {rows!r:.80}") from None
        if len(out) != len(grp):
            raise OpGraphError(f"rows: need {len(grp)} rows (one per group member), got {len(out)}")
        if not known:
            valid = self._valid_splits  # rows a generator handed over as checked splits need no scan
            for i, row in enumerate(out):
                seen = valid.get(id(rows[i]))
                if seen is not None and seen[0] is rows[i] and seen[1] == row and len(row) == len(grp):
                    continue
                if len(row) != len(grp) or not all(0.0 <= x < float("inf") for x in row):
                    raise OpGraphError(f"rows: row {i} needs {len(grp)} finite non-negative sizes, got {row}")
            if isinstance(rows, tuple):
                self._valid_rows[id(rows)] = (rows, out)
        if out[grp.index(rank)] != split:
            raise OpGraphError(f"rows: row {grp.index(rank)} (rank {rank}'s own) differs from its split")
        return out

    def collective(
        self,
        collective: str,
        group: Sequence[int],
        nbytes: float,
        *,
        deps: Mapping[int, Iterable[int]] | None = None,
        **kwargs,
    ) -> dict[int, int]:
        """Append the op of every member of ``group``; return ``{rank: op id}``.

        ``deps`` maps a member rank to the ids that member waits for.
        """
        if not isinstance(group, Iterable) or isinstance(group, (str, bytes)):
            raise OpGraphError(f"group: must be a non-empty list of distinct ranks, got {group!r:.60}")
        group = tuple(group)
        if not group:
            raise OpGraphError("group: must be a non-empty list of distinct ranks, got an empty one")
        deps = {} if deps is None else deps
        if not isinstance(deps, Mapping):
            raise OpGraphError(f"deps: maps a member rank to the op ids it waits for, e.g. {{{group[0]}: [0]}}; "
                               f"got {type(deps).__name__}")
        strangers = [r for r in deps if r not in group]
        if strangers:
            raise OpGraphError(f"deps: rank {strangers[0]!r} is not a member of the group {group!r:.60}")
        return {r: self.collective_op(r, collective, group, nbytes, deps=deps.get(r, ()), **kwargs)
                for r in group}

    def _p2p(self, cls, rank, peer, nbytes, name, deps, stream, traffic_class, layer, micro_batch, stage,
             tag) -> int:
        ws = self.world_size
        if type(rank) is not int or not 0 <= rank < ws:
            self._check_rank(rank)
        if type(peer) is not int or not 0 <= peer < ws:
            self._check_rank(peer, "peer")
        if peer == rank:
            raise OpGraphError(f"peer: rank {rank} cannot {cls.kind} to itself")
        if type(traffic_class) is not str or type(stream) is not str or not (traffic_class and stream):
            stream, traffic_class = _names(stream, traffic_class)
        if type(layer) is not int or type(micro_batch) is not int or type(stage) is not int:
            layer, micro_batch, stage = _labels(layer, micro_batch, stage)
        if not is_size(nbytes):
            raise OpGraphError(f"nbytes: must be a finite number of bytes >= 0, got {nbytes!r}")
        ops = self.ops
        n = len(ops)
        ops.append(cls(n, rank, stream, self._deps(deps), name or cls.kind, traffic_class, layer, micro_batch, stage,
                       peer, float(nbytes), _tag(tag)))
        return n

    def send(self, rank: int, peer: int, nbytes: float, *, name: str = "", deps: Iterable[int] = (),
             stream: str = "comm", traffic_class: str = "pp", layer: int = -1, micro_batch: int = -1,
             stage: int = -1, tag: int = 0) -> int:
        """Append a :class:`Send` of ``nbytes`` from ``rank`` to ``peer``; return its id. ``stream`` and
        ``traffic_class`` are non-empty strings."""
        return self._p2p(Send, rank, peer, nbytes, name, deps, stream, traffic_class, layer, micro_batch, stage,
                         tag)

    def recv(self, rank: int, peer: int, nbytes: float, *, name: str = "", deps: Iterable[int] = (),
             stream: str = "comm", traffic_class: str = "pp", layer: int = -1, micro_batch: int = -1,
             stage: int = -1, tag: int = 0) -> int:
        """Append a :class:`Recv` on ``rank`` of ``nbytes`` from ``peer``; return its id. ``stream`` and
        ``traffic_class`` are non-empty strings."""
        return self._p2p(Recv, rank, peer, nbytes, name, deps, stream, traffic_class, layer, micro_batch, stage,
                         tag)

    # ------------------------------------------------------------------ views
    def __len__(self) -> int:
        return len(self.ops)

    def program(self, rank: int) -> list[Op]:
        """The ops of ``rank`` in program order."""
        return [op for op in self.ops if op.rank == rank]


def merge_graphs(parts: Sequence[tuple[OpGraph, int]], world_size: int | None = None) -> OpGraph:
    """One graph running several graphs side by side: ``parts`` are ``(graph, rank offset)`` pairs.

    Each part's ops are appended in order with their ids, deps, ranks, peers
    and groups shifted (rank ``r`` of a part becomes ``r + offset``), so
    parts on disjoint ranks run concurrently, as jobs sharing one fabric do.
    The same graph listed twice at one offset runs twice in a row: its
    second copy's ops follow the first's on every ``(rank, stream)`` and its
    collectives match as the next ones on their groups (consecutive training
    steps). A part's ops on a rank that an earlier part also uses start only once
    every op the earlier parts put on that rank has ended (the first op of each of
    its streams there waits for the last op of each of theirs): a training step does
    not begin before the previous one has finished on that GPU (its optimizer, the
    parameter all-gather the next forward reads, ...), where stream order alone
    let the next step's forward run beside the previous step's gathers.
    ``replicas`` are shifted too; a part without them stands for
    itself rank by rank. ``world_size`` defaults to the highest rank + 1.
    """
    parts = list(parts) if isinstance(parts, Iterable) else parts
    if not isinstance(parts, list) or not parts:
        raise OpGraphError(f"parts: must be a non-empty list of (OpGraph, rank offset) pairs, got {parts!r:.60}")
    for i, part in enumerate(parts):
        if (not isinstance(part, (tuple, list)) or len(part) != 2 or not isinstance(part[0], OpGraph)
                or isinstance(part[1], bool) or not isinstance(part[1], Integral)):
            raise OpGraphError(f"parts[{i}]: must be an (OpGraph, rank offset) pair, got {part!r:.60}")
    size = max(off + g.world_size for g, off in parts) if world_size is None else world_size
    out = OpGraph(size)
    ops = out.ops
    any_replicas = any(g.replicas is not None for g, _ in parts)
    replicas: dict[int, tuple[int, ...]] = {}
    last: dict[int, dict[str, int]] = {}  # rank -> stream -> id of the last op the parts so far put there
    for graph, off in parts:
        if off < 0 or off + graph.world_size > size:
            raise OpGraphError(f"offset: ranks {off}..{off + graph.world_size - 1} fall outside 0..{size - 1}")
        base = len(ops)
        before = {r: tuple(s.values()) for r, s in last.items()}  # the earlier parts' last ops, per rank
        started: set[tuple[int, str]] = set()
        for op in graph.ops:
            rank = op.rank + off
            deps = tuple(d + base for d in op.deps)
            if (rank, op.stream) not in started:
                started.add((rank, op.stream))
                deps += tuple(d for d in before.get(rank, ()) if d not in deps)
            changes: dict = {"id": op.id + base, "rank": rank, "deps": deps}
            if isinstance(op, Collective):
                changes["group"] = tuple(r + off for r in op.group)
            elif isinstance(op, (Send, Recv)):
                changes["peer"] = op.peer + off
            ops.append(replace(op, **changes))
            last.setdefault(rank, {})[op.stream] = op.id + base
        if any_replicas:
            if graph.replicas is None:
                replicas.update({r + off: (r + off,) for r in {op.rank for op in graph.ops}})
            else:
                replicas.update({r + off: tuple(x + off for x in xs) for r, xs in graph.replicas.items()})
    out.replicas = replicas if any_replicas else None
    return out
