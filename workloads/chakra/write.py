"""Write a clustersim op graph as a Chakra trace (see :mod:`workloads.chakra` for what goes where)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import warnings
import zlib
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from ..ops import Collective, Compute, Op, OpGraph, Recv, Send, is_size
from . import wire
from .read import ChakraWarning, scan
from .schema import (
    COLLECTIVE_COMM_TYPES,
    FORMAT,
    NODE_TYPES,
    PER_RANK_INPUT,
    PREFIX,
    SCHEMA_VERSION,
    TO_COMM,
    ChakraError,
    classes,
    frame,
)

_INT32_MAX = 2**31 - 1
ASTRA_SIM_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
"""The collectives ASTRA-sim's workload layer simulates (``Workload::issue_coll_comm``, astra-sim at 0383c20)."""


class DurationModel(Protocol):
    """Anything with ``duration(op) -> seconds`` for a compute op, e.g. :class:`simulator.compute.ComputeModel`."""

    def duration(self, op: Compute) -> float: ...


def check_trace_folder(folder: str | os.PathLike, world: int, prefix: str = "clustersim") -> None:
    """Refuse ``folder`` for a trace of ``world`` ranks: it is a file, or it holds rank files of a larger trace of
    ``prefix`` that the new one would not overwrite (a reader would take them for one trace). Called before a
    run that exports, as well as by :func:`write_chakra`."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ChakraError(f"{folder}: exists and is not a folder")
    if folder.is_dir():
        stale = [p.name for p, pre, r in sorted(scan(folder), key=lambda f: f[2]) if pre == prefix and r >= world]
        if stale:
            raise ChakraError(f"{folder}: already holds {', '.join(stale[:3])} from a larger trace of prefix "
                              f"{prefix!r}; remove them or choose another folder")


def write_chakra(graph: OpGraph, folder: str | Path, *, compute: DurationModel | None = None,
                 prefix: str = "clustersim") -> list[Path]:
    """Write ``graph`` as a Chakra trace: ``<folder>/<prefix>.<rank>.et`` for every rank, and
    ``<prefix>.comm_group.json`` (the process groups) when it has collectives (and removes an older trace's
    one when it has none).

    Parameters
    ----------
    graph : OpGraph
        A full graph (every rank's program: ``representatives=None`` in
        :func:`~workloads.training.training_step`); a graph of representatives
        is refused, since a Chakra trace holds one program per rank.
    folder : str or Path
        Created if missing. Files of this prefix already there are
        overwritten; ones for ranks the graph does not have are refused.
    compute : DurationModel, optional
        Gives every compute op a ``duration_micros`` (rounded to whole
        microseconds, Chakra's unit) so that ASTRA-sim's replay mode runs
        them for the time clustersim does. Without it only ops with a fixed
        ``duration_s`` get one; ASTRA-sim's roofline mode uses ``num_ops`` and
        ``tensor_size``.
    prefix : str
        File name prefix (ASTRA-sim's ``--workload-configuration=<folder>/<prefix>``).

    Returns
    -------
    list of Path
        The files written, rank files first.

    Examples
    --------
    >>> g = OpGraph(2)
    >>> a = g.compute(0, flops=1e12, name="fwd")
    >>> _ = g.send(0, peer=1, nbytes=1e6, deps=[a])
    >>> _ = g.recv(1, peer=0, nbytes=1e6)
    >>> [p.name for p in write_chakra(g, tmp)]  # doctest: +SKIP
    ['clustersim.0.et', 'clustersim.1.et']
    """
    if not isinstance(graph, OpGraph):
        raise TypeError(f"graph: must be an OpGraph (a step's graph, or one built by hand), got {type(graph).__name__}")
    if compute is not None and not callable(getattr(compute, "duration", None)):
        raise TypeError(f"compute: must have a duration(op) method (a ComputeModel), got {type(compute).__name__}")
    if not isinstance(folder, (str, os.PathLike)):
        raise TypeError(f"folder: must be a path (str or os.PathLike), got {type(folder).__name__}")
    classes()  # a one-line ChakraError if protobuf is missing
    if getattr(graph, "replicas", None) is not None:
        raise ChakraError("write_chakra: this graph has representatives (fidelity fast/lockstep) and a Chakra trace "
                          "needs every rank's program; build it with representatives=None (fidelity full)")
    if not prefix or "/" in prefix or "\\" in prefix or prefix.startswith("."):
        raise ChakraError(f"prefix: must be a plain file name prefix such as 'clustersim', got {prefix!r}")
    ops = graph.ops
    checked: set[int] = set()
    for op in ops:  # everything that can be refused is refused before a file is written
        for d in op.deps:
            if ops[d].rank != op.rank:
                raise ChakraError(f"rank {op.rank} op {op.id} {op.name!r} depends on op {d} of rank {ops[d].rank}; "
                                  f"a Chakra trace holds one program per rank and cannot say that")
        if isinstance(op, (Send, Recv)) and not 0 <= op.tag <= _INT32_MAX:
            raise ChakraError(f"rank {op.rank} op {op.id} {op.name!r}: tag {op.tag} does not fit Chakra's comm_tag "
                              f"(int32, 0..{_INT32_MAX})")
        _check_values(op, checked)
    others = sorted({op.collective for op in ops if isinstance(op, Collective)} - set(ASTRA_SIM_COLLECTIVES))
    if others:
        warnings.warn(ChakraWarning(
            f"write_chakra: the trace has {', '.join(TO_COMM[k] for k in others)} collectives, which ASTRA-sim's "
            f"workload layer does not simulate (it runs {', '.join(TO_COMM[k] for k in ASTRA_SIM_COLLECTIVES)}; "
            f"a BROADCAST takes its duration_micros, 0 here, and REDUCE / GATHER stop it); clustersim reads them "
            f"back as written"), stacklevel=2)
    folder = Path(folder)
    world = graph.world_size
    check_trace_folder(folder, world, prefix)
    folder.mkdir(parents=True, exist_ok=True)

    groups: dict[tuple[int, ...], str] = {}
    by_rank: list[list[Op]] = [[] for _ in range(world)]
    for op in graph.ops:
        by_rank[op.rank].append(op)
        if isinstance(op, Collective) and op.group not in groups:
            groups[op.group] = str(len(groups) + 1)  # ASTRA-sim reads "" and "0" as all ranks: start at 1
    writer = _Writer(graph, groups, compute)
    written: list[Path] = []
    try:  # every file under a temporary name first: a failure leaves no partial trace that reads as a smaller one
        for rank, ops in enumerate(by_rank):
            path = folder / f"{prefix}.{rank}.et"
            with open(_partial(path), "wb") as fh:  # one rank at a time: memory holds one rank's nodes
                written.append(path)
                writer.write_rank(rank, ops, fh)
        if groups:
            path = folder / f"{prefix}.comm_group.json"
            written.append(path)
            _partial(path).write_text(json.dumps({name: list(g) for g, name in groups.items()}, indent=1) + "\n")
    except BaseException:
        for path in written:
            _partial(path).unlink(missing_ok=True)
        raise
    # The old trace's files go first: a failure among the renames then leaves fewer rank files than the trace's
    # recorded world size, which the reader refuses, never a mix of the old trace and the new one.
    for path in written:
        path.unlink(missing_ok=True)
    if not groups:  # (an older trace's groups, left beside a trace without collectives, would be read with it)
        (folder / f"{prefix}.comm_group.json").unlink(missing_ok=True)
    try:
        for path in written:
            os.replace(_partial(path), path)
    except BaseException:
        for path in written:
            _partial(path).unlink(missing_ok=True)
        raise
    return written


def _partial(path: Path) -> Path:
    """Where ``path`` is written before every file of the trace is (a name no trace reader takes for a rank)."""
    return path.with_name("." + path.name + ".partial")


_INT64_MAX = 2**63 - 1
_UINT64_MAX = 2**64 - 1


def _check_values(op: Op, checked: set[int] | None = None) -> None:
    """Refuse, before any file is written, a value of ``op`` that Chakra's fields cannot hold: a negative or
    non-finite FLOP count, byte count or duration, or one beyond its integer field (``num_ops`` and
    ``comm_size`` are int64, ``tensor_size`` and ``duration_micros`` uint64).

    ``checked`` holds the ids of the kernel tuples (``parts``) and all-to-all splits already checked: generators
    share a few among many ops, whose values are then checked once, not once per op."""
    if isinstance(op, Compute):
        fields = [("flops", op.flops, "num_ops", _INT64_MAX, 1.0),
                  ("nbytes", op.nbytes, "tensor_size", _UINT64_MAX, 1.0)]
        if op.duration_s is not None:
            fields.append(("duration_s", op.duration_s, "duration_micros", _UINT64_MAX, 1e6))
        if _unchecked(op.parts, checked):
            for k, part in enumerate(op.parts):
                fields += [(f"parts[{k}].flops", part.flops, None, 0, 1.0),
                           (f"parts[{k}].nbytes", part.nbytes, None, 0, 1.0)]
    else:
        n = len(op.group) if isinstance(op, Collective) and op.collective in PER_RANK_INPUT else 1
        fields = [("nbytes", op.nbytes, "comm_size", _INT64_MAX * n, 1.0)]
        if isinstance(op, Collective) and _unchecked(op.split, checked):
            fields += [(f"split[{k}]", x, None, 0, 1.0) for k, x in enumerate(op.split)]
    for name, value, chakra_field, most, scale in fields:
        _check_value(op, name, value, chakra_field, most, scale)


def _unchecked(values: tuple | None, checked: set[int] | None) -> bool:
    """Whether ``values`` (a tuple, or None: nothing to check) is still to be checked; noted in ``checked``."""
    if values is None:
        return False
    if checked is None:
        return True
    if id(values) in checked:
        return False
    checked.add(id(values))
    return True


_FITS_ANY_FIELD = 1e12
"""A plain number in 0..this fits every field checked (times 1e6, the µs of a duration, it stays below 2**63)."""


def _check_value(op: Op, name: str, value: float, chakra_field: str | None, most: int, scale: float) -> None:
    """One value of :func:`_check_values`: finite, non-negative and, times ``scale``, at most ``most``."""
    if (type(value) is float or type(value) is int) and 0 <= value <= _FITS_ANY_FIELD:
        return  # (the usual case, decided without the checks below)
    if not is_size(value):  # (what the op graph's builders take)
        raise ChakraError(f"{_where(op, name)} = {value!r}: must be a finite non-negative number")
    value = float(value)  # (numpy scalars and fractions, as the op graph takes them)
    if chakra_field is not None and round(value * scale) > most:
        raise ChakraError(f"{_where(op, name)} = {value!r} does not fit Chakra's {chakra_field} (at most {most:,}"
                          f"{' µs' if scale != 1.0 else ''})")


def _where(op: Op, name: str) -> str:
    """How an error of :func:`_check_value` names the value: file-free, by rank, op and field."""
    return f"write_chakra: rank {op.rank} op {op.id} {op.name!r}: {name}"


_NAMES = {name: wire.name(name) for name in ("is_cpu_op", "num_ops", "tensor_size", "comm_type", "comm_size",
                                              "pg_name", "comm_src", "comm_dst", "comm_tag")} | {
    name: wire.name(PREFIX + name) for name in ("op", "stream", "traffic_class", "layer", "micro_batch", "stage",
                                                "stream_dep", "category", "flops", "nbytes", "shape", "duration_s",
                                                "parts", "algorithm", "split", "holds_sms", "count", "part")}
"""The ``name`` field of every node attribute written: Chakra's own names, and clustersim's under :data:`PREFIX`."""


def _attr(name: str, value: bytes) -> bytes:
    """``Node.attr`` entry ``name`` (a key of :data:`_NAMES`) holding ``value`` (:mod:`~workloads.chakra.wire`)."""
    return wire.attr(_NAMES[name], value)


_NOT_CPU = _attr("is_cpu_op", wire.bool_value(False))
_STREAM_DEP = _attr("stream_dep", wire.bool_value(True))
_HOLDS_SMS_0 = _attr("holds_sms", wire.int64_value(0))
_COMP, _SEND, _RECV, _COLL = (NODE_TYPES.index(t) for t in ("COMP_NODE", "COMM_SEND_NODE", "COMM_RECV_NODE",
                                                            "COMM_COLL_NODE"))


class _Writer:
    """Turns one rank's ops into Chakra nodes (ids count from 0 in each file) and writes them.

    A node's bytes are put together by :mod:`workloads.chakra.wire` (the bytes protobuf serializes for it),
    from pieces made once and reused: the attributes every op of a stream shares, a coarsened collective's
    ``count`` nodes that differ only in id, dependency and part index."""

    def __init__(self, graph: OpGraph, groups: dict[tuple[int, ...], str], compute: DurationModel | None) -> None:
        self.graph = graph
        self.groups = groups
        self.compute = compute
        self.C = classes()
        self.last_node: dict[int, int] = {}  # op id -> id of its (last) node
        self.durations: dict[tuple, float] = {}
        self.same_parts: dict[int, tuple] = {}  # id(parts) -> the first equal tuple seen (hashed once)
        self.first_parts: dict[tuple, tuple] = {}
        self.stream_attrs: dict[tuple, bytes] = {}  # (stream, class, layer, micro_batch, stage, stream_dep) -> bytes
        self.own: dict[tuple, Any] = {}  # an op's values (:func:`_exact`) -> the bytes of its own attributes
        self.part_attrs: list[bytes] = []  # k -> attribute clustersim.part = k

    def write_rank(self, rank: int, ops: list[Op], fh: BinaryIO) -> None:
        """The GlobalMetadata, the process groups ``rank`` is in (a METADATA_NODE), then one node per op.

        The nodes are put together in memory first: the GlobalMetadata, which comes first in the file, records
        a CRC-32 of their bytes (``clustersim.digest``), by which the reader tells a trace edited after it was
        written (its ``clustersim.*`` attributes then no longer describe its Chakra fields), and their number
        (``clustersim.nodes``), by which it tells a file cut short at a node's end from an edited one."""
        C = self.C
        meta = C["GlobalMetadata"](version=SCHEMA_VERSION)
        for name, value in (("format", FORMAT), ("world_size", self.graph.world_size), ("rank", rank)):
            meta.attr.add(name=PREFIX + name, int64_val=value)
        for name, value in _compute_settings(self.compute).items():
            meta.attr.add(name=PREFIX + name, string_val=value)
        # The kernels of fused compute ops, once per distinct tuple (generators share a few among many ops).
        self.parts_index: dict[int, int] = {}
        by_value: dict[tuple, int] = {}
        for op in ops:
            if isinstance(op, Compute) and op.parts is not None and id(op.parts) not in self.parts_index:
                k = by_value.get(op.parts)
                if k is None:
                    k = by_value[op.parts] = len(by_value)
                    _parts_table(meta, k, op.parts)
                self.parts_index[id(op.parts)] = k
        self.out: list[bytes] = []
        self.next_id = 0
        mine = sorted({op.group for op in ops if isinstance(op, Collective)}, key=lambda g: int(self.groups[g]))
        if mine:  # first: ASTRA-sim issues the ready nodes lowest id first, so the groups exist before they are used
            node = C["Node"](id=0, name="process_group:init", type=NODE_TYPES.index("METADATA_NODE"))
            pgs = [{"pg_name": self.groups[g], "ranks": list(g)} for g in mine]
            node.inputs.values = "['" + json.dumps(pgs, separators=(",", ":")) + "']"
            self.out.append(frame(node))
            self.next_id = 1
        last_on_stream: dict[str, int] = {}
        for op in ops:
            prev = last_on_stream.get(op.stream)
            last_on_stream[op.stream] = op.id
            self.add(op, prev)
        body = b"".join(self.out)
        self.out = []
        meta.attr.add(name=PREFIX + "digest", int64_val=zlib.crc32(body))
        meta.attr.add(name=PREFIX + "nodes", int64_val=self.next_id)  # (how many: a file cut short is told apart)
        fh.write(frame(meta))
        fh.write(body)

    def add(self, op: Op, prev: int | None) -> None:
        """Write the node(s) of ``op``; ``prev`` is the op before it on its stream."""
        deps = [self.last_node[d] for d in op.deps]
        stream_dep = prev is not None and prev not in op.deps
        if stream_dep:
            deps.append(self.last_node[prev])
        if isinstance(op, Collective):
            self._collective(op, deps, stream_dep)
            return
        node_id = self.next_id
        self.next_id += 1
        if isinstance(op, Compute):
            duration, attrs = self._compute(op)
            node_type = _COMP
        else:
            duration, attrs = b"", self._point_to_point(op)
            node_type = _SEND if isinstance(op, Send) else _RECV
        body = b"".join((wire.head(node_id, op.name, node_type), wire.deps(deps), duration,
                         self._common(op, stream_dep), attrs))
        self.out += (wire.varint(len(body)), body)
        self.last_node[op.id] = node_id

    def _common(self, op: Op, stream_dep: bool) -> bytes:
        """``is_cpu_op`` and the clustersim fields every op has, as ``Node.attr`` bytes."""
        key = (op.stream, op.traffic_class, op.layer, op.micro_batch, op.stage, stream_dep)
        tail = self.stream_attrs.get(key)
        if tail is None:
            parts = [_attr("stream", wire.string_value(op.stream)),
                     _attr("traffic_class", wire.string_value(op.traffic_class))]
            for name in ("layer", "micro_batch", "stage"):
                value = getattr(op, name)
                if value != -1:
                    parts.append(_attr(name, wire.int64_value(value)))
            if stream_dep:
                parts.append(_STREAM_DEP)
            tail = b"".join(parts)
            if type(op.layer) is int and type(op.micro_batch) is int and type(op.stage) is int:
                self.stream_attrs[key] = tail  # (OpGraph's builders make them ints; anything else: not kept)
        return _NOT_CPU + _attr("op", wire.int64_value(op.id)) + tail

    def _point_to_point(self, op: Send | Recv) -> bytes:
        """A send's or receive's own ``Node.attr`` bytes."""
        src, dst = (op.rank, op.peer) if isinstance(op, Send) else (op.peer, op.rank)
        key = ("point_to_point", _exact(src), _exact(dst), _exact(op.tag), _exact(op.nbytes))
        attrs = self.own.get(key)
        if attrs is None:
            attrs = self.own[key] = b"".join((
                _attr("comm_src", wire.int32_value(src)), _attr("comm_dst", wire.int32_value(dst)),
                _attr("comm_size", wire.int64_value(_whole(op.nbytes))), _attr("comm_tag", wire.int32_value(op.tag)),
                _attr("nbytes", wire.double_value(op.nbytes))))
        return attrs

    def _compute(self, op: Compute) -> tuple[bytes, bytes]:
        """A compute op's ``duration_micros`` field (empty without one) and its own ``Node.attr`` bytes: made
        once per distinct compute op (every rank of a stage runs the same kernels)."""
        shape = op.shape
        if shape is not None and not (type(shape) is tuple and all(type(x) is int for x in shape)):
            shape = ("object", id(shape))  # (a float or a bool: written, or refused, as protobuf does, each time)
        k = self.parts_index[id(op.parts)] if op.parts is not None else None
        key = ("compute", op.category, _exact(op.flops), _exact(op.nbytes), shape, _exact(op.duration_s),
               self._same_parts(op.parts), k)
        made = self.own.get(key)
        if made is None:
            made = self.own[key] = self._compute_fields(op, k)
        return made

    def _compute_fields(self, op: Compute, k: int | None) -> tuple[bytes, bytes]:
        """:meth:`_compute`'s bytes, made; ``k``: the index of the op's kernel table in this rank's file."""
        parts = [_attr("num_ops", wire.int64_value(_whole(op.flops))),
                 _attr("tensor_size", wire.uint64_value(_whole(op.nbytes))),
                 _attr("category", wire.string_value(op.category)),
                 _attr("flops", wire.double_value(op.flops)), _attr("nbytes", wire.double_value(op.nbytes))]
        if op.shape is not None:
            parts.append(_attr("shape", wire.int64_list(op.shape)))
        if op.duration_s is not None:
            parts.append(_attr("duration_s", wire.double_value(op.duration_s)))
        if k is not None:
            parts.append(_attr("parts", wire.int64_value(k)))
        seconds = op.duration_s
        if seconds is None and self.compute is not None:
            key = (op.category, op.flops, op.nbytes, op.shape, self._same_parts(op.parts))
            seconds = self.durations.get(key)
            if seconds is None:
                seconds = self.durations[key] = self.compute.duration(op)
        duration = b""
        if seconds is not None:
            if op.duration_s is None:  # the duration model's: checked here, the op's own in _check_values
                _check_value(op, "duration (of the compute model)", seconds, "duration_micros", _UINT64_MAX, 1e6)
            duration = wire.duration(_whole(seconds * 1e6))
        return duration, b"".join(parts)

    def _same_parts(self, parts: tuple | None) -> int | None:
        """An id standing for ``parts``' value: the id of the first equal tuple seen (a generator shares a few
        tuples of a hundred kernels among many ops; hashing the tuple once per object, not once per op)."""
        if parts is None:
            return None
        first = self.same_parts.get(id(parts))
        if first is None:
            first = self.same_parts[id(parts)] = self.first_parts.setdefault(parts, parts)
        return id(first)

    def _collective(self, op: Collective, deps: list[int], stream_dep: bool) -> None:
        """The ``count`` chained nodes of a collective (one unless coarsened); parts 2, 3, ... differ from one
        another only in id, dependency (the part before) and ``clustersim.part``."""
        key = ("collective", op.collective, op.group, _exact(op.nbytes), op.algorithm,
               None if op.split is None else id(op.split), bool(op.holds_sms), _exact(op.count))
        own = self.own.get(key)
        if own is None:
            own = self.own[key] = self._collective_fields(op)
        first = self.next_id
        head = b"".join((wire.head(first, op.name, _COLL), wire.deps(deps), self._common(op, stream_dep), own))
        if op.count == 1:
            self.out += (wire.varint(len(head)), head)
        else:
            parts = self._parts(op.count)
            head += parts[0]
            self.out += (wire.varint(len(head)), head)
            rest = self._common(op, False) + own  # parts 2, 3, ...: no stream dependency
            self.out += wire.chain(first + 1, op.count - 1, wire.head(0, op.name, _COLL), rest, parts[1:op.count])
        self.next_id = first + op.count
        self.last_node[op.id] = self.next_id - 1

    def _parts(self, count: int) -> list[bytes]:
        """Attribute ``clustersim.part`` = k for k = 0 .. at least ``count - 1`` (a coarsened collective's
        nodes), each made once."""
        made = self.part_attrs
        while len(made) < count:
            made.append(_attr("part", wire.int64_value(len(made))))
        return made

    def _collective_fields(self, op: Collective) -> bytes:
        """A collective's own ``Node.attr`` bytes (every part's but ``clustersim.part``)."""
        n = len(op.group)
        size = _whole(op.nbytes / n if op.collective in PER_RANK_INPUT else op.nbytes)
        comm_type = COLLECTIVE_COMM_TYPES.index(TO_COMM[op.collective])
        attrs = [_attr("comm_type", wire.int64_value(comm_type)), _attr("comm_size", wire.int64_value(size)),
                 _attr("pg_name", wire.string_value(self.groups[op.group])),
                 _attr("nbytes", wire.double_value(op.nbytes))]
        if op.algorithm != "auto":
            attrs.append(_attr("algorithm", wire.string_value(op.algorithm)))
        if op.split is not None:
            attrs.append(_attr("split", wire.double_list(op.split)))
        if not op.holds_sms:  # (userbuffers: its SMs are priced in the GEMMs beside it)
            attrs.append(_HOLDS_SMS_0)
        if op.count > 1:
            attrs.append(_attr("count", wire.int64_value(op.count)))
        return b"".join(attrs)


def _exact(x: object) -> object:
    """A key standing for number ``x`` in the writer's caches, equal only where ``x`` is written alike: a
    float's bytes (0.0 and -0.0 differ), an int or None itself, anything else (a numpy scalar, a Fraction) by
    identity (the graph holds it)."""
    if type(x) is float:
        return wire.DOUBLE.pack(x)
    if type(x) is int or x is None:
        return x
    return ("object", id(x))



def _compute_settings(compute: DurationModel | None) -> dict[str, str]:
    """What the compute durations were modelled with, for the GlobalMetadata: ``gpu`` (its name) and
    ``compute`` (every other setting of a :class:`~simulator.compute.ComputeModel`, dtype included, as JSON),
    so that re-reading the trace without an experiment file times its kernels as written. Nothing for
    another duration model."""
    if compute is None or not dataclasses.is_dataclass(compute) or not hasattr(compute, "gpu"):
        return {}
    settings = {f.name: getattr(compute, f.name) for f in dataclasses.fields(compute)
                if f.name != "gpu" and getattr(compute, f.name) is not None}  # (None: the model's own choice)
    return {"gpu": str(compute.gpu.name), "compute": json.dumps(settings, sort_keys=True)}


def _parts_table(meta: Any, k: int, parts: tuple) -> None:
    """Kernel tuple ``k`` as five list attributes of the GlobalMetadata, ``clustersim.parts.<k>.<field>``
    (a kernel without a GEMM shape has shape -1, -1, -1), and a sixth, ``sm_reserved``, where a kernel runs
    beside communication that holds SMs."""
    add, name = meta.attr.add, f"{PREFIX}parts.{k}."
    add(name=name + "category").string_list.values.extend([p.category for p in parts])
    add(name=name + "flops").double_list.values.extend([p.flops for p in parts])
    add(name=name + "nbytes").double_list.values.extend([p.nbytes for p in parts])
    add(name=name + "shape").int64_list.values.extend([x for p in parts for x in (p.shape or (-1, -1, -1))])
    add(name=name + "batch").int64_list.values.extend([p.batch for p in parts])
    if any(p.sm_reserved for p in parts):  # only beside userbuffer communication (tp_comm_overlap)
        add(name=name + "sm_reserved").int64_list.values.extend([p.sm_reserved for p in parts])


def _whole(x: float) -> int:
    """A non-negative float as Chakra's integer (bytes, FLOPs, µs), rounded to nearest."""
    return int(round(x)) if math.isfinite(x) else 0
