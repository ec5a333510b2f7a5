"""``write_chakra`` puts its nodes' bytes together by hand (``workloads.chakra.wire``), not through a protobuf
``Node`` per node (which took minutes for a 1,024-GPU step): the bytes must stay those the reference codec
serializes.

Independent truth: the ``protobuf`` package's own ``SerializeToString`` of the same fields (the reference
codec, which wrote every node until 2026-12-05), and the limits of Chakra's integer fields (int64, uint64).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workloads.chakra import ChakraError, read_chakra, write_chakra
from workloads.chakra.schema import classes, frame, iter_frames, parse
from workloads.ops import Kernel, OpGraph

COMP, COLL = 4, 7  # NodeType values of et_def.proto


def reference(node_id: int, name: str, node_type: int, deps: list[int], micros: int,
              attrs: list[tuple[str, str, object]]) -> bytes:
    """The bytes protobuf serializes for a Node of these fields; ``attrs``: ``(name, field, value)``."""
    return _node(node_id, name, node_type, deps, micros, attrs).SerializeToString()


def _node(node_id: int, name: str, node_type: int, deps: list[int], micros: int,
          attrs: list[tuple[str, str, object]]):
    """The protobuf Node message of these fields (:func:`reference`)."""
    node = classes()["Node"](id=node_id, name=name, type=node_type, duration_micros=micros)
    node.data_deps.extend(deps)
    for attr_name, field, value in attrs:
        a = node.attr.add(name=attr_name)
        if field.endswith("_list"):
            getattr(a, field).values.extend(value)
        else:
            setattr(a, field, value)
    return node


def by_hand(node_id: int, name: str, node_type: int, deps: list[int], micros: int,
            attrs: list[tuple[str, str, object]]) -> bytes:
    """The same Node by :mod:`workloads.chakra.wire`."""
    from workloads.chakra import wire
    encode = {"int64_val": wire.int64_value, "int32_val": wire.int32_value, "uint64_val": wire.uint64_value,
              "bool_val": wire.bool_value, "double_val": wire.double_value, "string_val": wire.string_value,
              "int64_list": wire.int64_list, "double_list": wire.double_list}
    return (wire.head(node_id, name, node_type) + wire.deps(deps) + wire.duration(micros)
            + b"".join(wire.attr(wire.name(n), encode[f](v)) for n, f, v in attrs))


NODES = [
    (0, "", COMP, [], 0, []),  # every field that proto3 leaves out when zero or empty
    (1, "fwd", COMP, [0], 7, [("is_cpu_op", "bool_val", False), ("x", "bool_val", True)]),
    (127, "é ü 中", COLL, [126, 5], 0, [("n", "int64_val", 0), ("m", "int64_val", -1),
                                        ("lo", "int64_val", -(2**63)), ("hi", "int64_val", 2**63 - 1)]),
    (128, "b", COMP, [127, 16383, 16384, 2**21 - 1, 2**21, 2**40], 2**64 - 1,
     [("s", "int32_val", -5), ("t", "int32_val", 2**31 - 1), ("u", "uint64_val", 2**64 - 1),
      ("np", "int64_val", np.int64(300))]),
    (16384, "c", COLL, [16383], 16384, [("d0", "double_val", 0.0), ("d1", "double_val", -0.0),
                                        ("d2", "double_val", 1e300), ("d3", "double_val", 5e-324),
                                        ("d4", "double_val", 3), ("d5", "double_val", np.float32(0.1))]),
    (2**35, "d", COMP, [], 1, [("e", "string_val", ""), ("f", "string_val", "clustersim.é"),
                               ("g", "int64_list", []), ("h", "int64_list", [-1, 0, 300, 2**62]),
                               ("i", "double_list", []), ("j", "double_list", [0.5, -0.0, 1e-9])]),
]


@pytest.mark.parametrize("fields", NODES, ids=range(len(NODES)))
def test_a_node_by_hand_is_the_bytes_protobuf_serializes(fields):
    assert by_hand(*fields) == reference(*fields)


@pytest.mark.parametrize("field, value", [("int64_val", 1.0), ("int64_val", True), ("int32_val", 2.5),
                                          ("int64_list", [1.0])])
def test_what_protobuf_refuses_in_an_integer_field_is_refused_by_hand(field, value):
    """A float (even a whole one) or a bool in an integer field: protobuf raises TypeError, and so does wire."""
    fields = (1, "n", COMP, [], 0, [("a", field, value)])
    with pytest.raises(TypeError):
        reference(*fields)
    with pytest.raises(TypeError):
        by_hand(*fields)


def test_what_protobuf_refuses_in_an_unsigned_field_is_refused_by_hand():
    """A negative value in a uint64 field (``uint64_val``, ``duration_micros``): ValueError from both."""
    for fields in [(1, "n", COMP, [], 0, [("a", "uint64_val", -1)]), (1, "n", COMP, [], -1, [])]:
        with pytest.raises(ValueError):
            reference(*fields)
        with pytest.raises(ValueError):
            by_hand(*fields)


@pytest.mark.parametrize("first, count", [(2, 5), (120, 300), (16370, 40), (2**21 - 3, 6)])
def test_a_chain_of_parts_across_varint_lengths_is_protobufs(first, count):
    """A coarsened collective's later parts (id, the part before as its dependency, its index) where the ids
    and the part index change varint length inside the chain."""
    from workloads.chakra import wire
    rest = wire.attr(wire.name("comm_type"), wire.int64_value(0))
    tails = [wire.attr(wire.name("clustersim.part"), wire.int64_value(k)) for k in range(1, count + 1)]
    got = b"".join(wire.chain(first, count, wire.head(0, "ar", COLL), rest, tails))
    want = b"".join(frame(_node(first + k, "ar", COLL, [first + k - 1], 0,
                                [("comm_type", "int64_val", 0), ("clustersim.part", "int64_val", k + 1)]))
                    for k in range(count))
    assert got == want


def odd_graph() -> OpGraph:
    """Two ranks with what the writer puts together from parts: coarsened all-reduces of 600 parts (part
    indices of two varint bytes, ids crossing 127 and 16,383), more than 16,384 nodes, fused kernels shared
    by ops, an all-to-all-v, numpy and negative-zero sizes, a userbuffers collective, sends and receives."""
    g = OpGraph(2)
    kernels = (Kernel("gemm", 2e9, 1e6, (64, 64, 64)), Kernel("elementwise", 0.0, 3e5))
    prev = {0: [], 1: []}
    for step in range(60):
        for r in (0, 1):
            c = g.compute(r, name=f"f{step}", parts=kernels, layer=step, stage=0)
            d = g.compute(r, flops=-0.0 if step % 2 else 0.0, nbytes=np.float64(12.5), name="z", deps=[c],
                          micro_batch=step, duration_s=1e-6 * step if step % 3 else None)
            prev[r] = [d]
        ids = g.collective("all_reduce", (0, 1), 1e6 + step, count=600 if step % 2 == 0 else 1 + step % 4,
                           deps=prev, name="ar", traffic_class="tp", holds_sms=step % 5 != 0,
                           algorithm="ring" if step % 7 == 0 else "auto")
        prev = {r: [i] for r, i in ids.items()}
        ids = g.collective("all_to_all", (0, 1), 3.0, split=(1.0, 2.0), deps=prev, name="a2a", traffic_class="ep")
        prev = {r: [i] for r, i in ids.items()}
        g.send(0, peer=1, nbytes=np.int64(4096), tag=step, deps=prev[0], stream="pp")
        g.recv(1, peer=0, nbytes=4096, tag=step, stream="pp")
    return g


def test_every_written_node_is_protobufs_serialization(tmp_path):
    """Each node of a trace written by hand parses and serializes back to the same bytes (protobuf's canonical
    form, the bytes it wrote these nodes as), the parts of a coarsened collective chained one after another,
    and the whole trace reads back as the graph written."""
    from simulator.compute import ComputeModel
    from topologies.gpus import get_gpu
    g = odd_graph()
    write_chakra(g, tmp_path, compute=ComputeModel(get_gpu("h100")))
    for rank in (0, 1):
        path = tmp_path / f"clustersim.{rank}.et"
        frames = list(iter_frames(path.read_bytes(), path))
        assert len(frames) > 16384 + 1
        nodes = [parse("Node", body, path, at) for at, body in frames[1:]]
        assert [n.SerializeToString() for n in nodes] == [body for _, body in frames[1:]]
        assert [n.id for n in nodes] == list(range(len(nodes)))
        parts = [n for n in nodes if any(a.name == "clustersim.part" for a in n.attr)]
        assert max(a.int64_val for n in parts for a in n.attr if a.name == "clustersim.part") == 599
        assert all(list(n.data_deps) == [n.id - 1] for n in parts if n.attr[-1].int64_val > 0)
    back = read_chakra(tmp_path)
    assert [(o.kind, o.rank, o.name, o.nbytes if o.kind != "compute" else o.flops) for o in back.ops] == \
        [(o.kind, o.rank, o.name, o.nbytes if o.kind != "compute" else o.flops) for o in g.ops]
    signs = [[math.copysign(1.0, o.flops) for o in graph.ops if o.name == "z"] for graph in (g, back)]
    assert signs[0] == signs[1] and set(signs[0]) == {1.0, -1.0}  # (0.0 and -0.0 FLOPs, each as written)


def test_no_protobuf_node_is_made_per_op(tmp_path, monkeypatch):
    """The writer makes at most one ``Node`` message a file (the process groups' METADATA_NODE): the thousands
    of op nodes are put together as bytes. (Before: one message a node, ~15 µs each, minutes for 1,024 GPUs.)"""
    made = []
    real = classes()["Node"]

    def counting(*args, **kwargs):
        made.append(1)
        return real(*args, **kwargs)

    monkeypatch.setitem(classes(), "Node", counting)
    g = odd_graph()
    write_chakra(g, tmp_path)
    assert len(made) <= g.world_size


def test_a_kernel_table_shared_by_ops_is_checked_and_refused_at_its_first_op(tmp_path):
    """A value Chakra cannot hold, in a kernel tuple many ops share, is refused naming the first op that has it
    (the one the check met first when it looked at every op's kernels), before any file is written."""
    g = OpGraph(1)
    good = (Kernel("gemm", 1e9, 1e6),)
    bad = (Kernel("gemm", 1e9, 1e6), Kernel("elementwise", 0.0, 1e3))
    g.compute(0, name="a", parts=good)
    g.compute(0, name="b", parts=bad)
    g.compute(0, name="c", parts=bad)
    object.__setattr__(bad[1], "nbytes", -1.0)  # (a Kernel is frozen; made bad after the graph took it)
    with pytest.raises(ChakraError, match=r"rank 0 op 1 'b': parts\[1\]\.nbytes = -1\.0: must be a finite"):
        write_chakra(g, tmp_path)
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("field, value, message", [
    ("flops", 2.0**63, r"flops = 9\.223372036854776e\+18 does not fit Chakra's num_ops \(at most "
                       r"9,223,372,036,854,775,807\)"),
    ("nbytes", math.nan, r"nbytes = nan: must be a finite non-negative number"),
    ("duration_s", 2.0**64 / 1e6, r"duration_s = .* does not fit Chakra's duration_micros \(at most "
                                  r"18,446,744,073,709,551,615 µs\)"),
])
def test_values_beyond_chakras_fields_are_refused(tmp_path, field, value, message):
    """int64 holds 2**63 - 1 at most (2**63 FLOPs do not fit num_ops), uint64 2**64 - 1 (2**64 µs do not fit
    duration_micros), and NaN is no size: refused, the op named, where the quick path for plain values in range
    must not let them through."""
    g = OpGraph(1)
    g.compute(0, flops=1e9, nbytes=1e6, name="k", duration_s=1e-3)
    setattr(g.ops[0], field, value)
    with pytest.raises(ChakraError, match=rf"rank 0 op 0 'k': {message}"):
        write_chakra(g, tmp_path)


def test_the_largest_int64_flops_that_round_in_range_are_written(tmp_path):
    """2**62 FLOPs (well beyond the quick path's range) fit num_ops and are written exactly."""
    g = OpGraph(1)
    g.compute(0, flops=2.0**62, nbytes=1e6, name="k")
    write_chakra(g, tmp_path)
    path = tmp_path / "clustersim.0.et"
    node = parse("Node", list(iter_frames(path.read_bytes(), path))[1][1], path, 0)
    assert {a.name: a.int64_val for a in node.attr}["num_ops"] == 2**62


# Every value each field takes, its range's ends and a step beyond them: protobuf serializes the ones in range and
# refuses the others with ValueError (uint64 below 0 or from 2**64; int64 outside -2**63 .. 2**63 - 1; int32
# outside -2**31 .. 2**31 - 1), and so must wire (it wrote an 11-byte "varint" for 2**64 in an int64 field, and
# 2**63 as -2**63, both of which write_chakra then put in a trace).
_U64 = st.integers(0, 2**64 - 1) | st.sampled_from([-1, 2**64, 2**70])
_I64 = st.integers(-(2**63), 2**63 - 1) | st.sampled_from([-(2**63) - 1, 2**63, 2**64, 2**64 + 5])
_I32 = st.integers(-(2**31), 2**31 - 1) | st.sampled_from([-(2**31) - 1, 2**31, 2**63])
_DOUBLE_VALUES = st.floats(allow_nan=True, allow_infinity=True) | st.integers(-(2**53), 2**53)
_TEXT = st.text(max_size=8)  # (any code point but surrogates: non-ASCII UTF-8 of 2-4 bytes)
_ATTRS = st.lists(st.tuples(_TEXT, st.sampled_from([
    ("int64_val", _I64), ("int32_val", _I32), ("uint64_val", _U64), ("bool_val", st.booleans()),
    ("double_val", _DOUBLE_VALUES), ("string_val", _TEXT), ("int64_list", st.lists(_I64, max_size=4)),
    ("double_list", st.lists(_DOUBLE_VALUES, max_size=4))])).flatmap(
    lambda named: st.tuples(st.just(named[0]), st.just(named[1][0]), named[1][1])), max_size=5)


def _same_bytes_or_refused_alike(fields: tuple) -> None:
    """``by_hand(*fields)`` gives protobuf's bytes, or raises ValueError where protobuf does."""
    try:
        want = reference(*fields)
    except ValueError:
        with pytest.raises(ValueError):
            by_hand(*fields)
        return
    assert by_hand(*fields) == want


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**64 - 1), _TEXT, st.integers(0, 10), st.lists(st.integers(0, 2**64 - 1), max_size=4),
       _U64, _ATTRS)
def test_random_nodes_by_hand_are_protobufs_bytes_or_refused_alike(node_id, name, node_type, deps, micros, attrs):
    """Random Nodes (ids, names, types, dependencies, durations and attributes of every field wire writes, each
    over its whole range and a step beyond it, NaN and infinities, non-ASCII and empty text, empty lists, a oneof
    holding its default): the bytes protobuf's ``SerializeToString`` makes, or protobuf's ValueError refused by
    both."""
    fields = (node_id, name, node_type, deps, micros, [(n, f, v) for n, f, v in attrs])
    _same_bytes_or_refused_alike(fields)


@pytest.mark.parametrize("field, value", [("shape", (2**64, 1, 1)), ("shape", (2**63, 1, 1)), ("layer", 2**63),
                                          ("stage", 2**64)])
def test_an_integer_beyond_int64_is_refused_not_written(tmp_path, field, value):
    """A GEMM dimension or a label beyond int64 (the op graph takes any positive int): protobuf refused it
    (ValueError) and the by-hand bytes must too, before a trace is left behind. Written, 2**63 read back as
    -2**63 and 2**64 as another value (an 11-byte varint)."""
    g = OpGraph(1)
    g.compute(0, flops=1e9, nbytes=1e6, name="k", **{field: value})
    with pytest.raises(ValueError):
        write_chakra(g, tmp_path)
    assert not any(tmp_path.iterdir())


def _fields(op) -> tuple:
    """What a trace says of an op, by name (the reader's op against the one written)."""
    names = ("kind", "rank", "name", "stream", "traffic_class", "layer", "micro_batch", "stage", "deps", "peer", "tag",
             "nbytes", "flops", "category", "shape", "duration_s", "collective", "group", "algorithm", "count",
             "split", "holds_sms")
    return tuple((n, getattr(op, n, None)) for n in names)


def test_ops_differing_in_one_value_each_read_back_as_written(tmp_path):
    """The writer keeps the bytes of the ops' attributes per value (``_Writer.own``, ``stream_attrs``): ops equal
    in every value but one — a send's tag or peer, a compute op's category, GEMM shape or fixed duration, a
    collective's algorithm, count or userbuffers flag, a stream dependency or not — each read back with its own
    value, never a neighbour's cached bytes; a coarsened collective's later parts depend on the part before only
    (no ``clustersim.stream_dep``, which its first part carries after another op of its stream). Truth: the ops
    themselves."""
    g = OpGraph(3)
    for tag in (0, 1, 0):
        g.send(0, peer=1, nbytes=64.0, tag=tag, stream="pp")
        g.send(0, peer=2, nbytes=64.0, tag=tag, stream="pp")
        g.recv(1, peer=0, nbytes=64.0, tag=tag, stream="pp")
        g.recv(2, peer=0, nbytes=64.0, tag=tag, stream="pp")
    for r in range(3):
        for category, shape in (("gemm", (64, 64, 64)), ("gemm", (64, 64, 128)), ("gemm", None),
                                ("elementwise", None), ("gemm", (64, 64, 64))):
            g.compute(r, flops=1e6, nbytes=1e3, name="k", category=category, shape=shape, stream="s")
        for seconds in (1e-3, 2e-3, 1e-3):
            g.compute(r, flops=1e6, nbytes=1e3, name="f", category="fixed", duration_s=seconds, stream="s")
    for algorithm, count, holds in (("auto", 1, True), ("ring", 1, True), ("auto", 3, True), ("auto", 1, False),
                                    ("auto", 2, True), ("tree", 1, True)):
        g.collective("all_reduce", (0, 1, 2), 96.0, algorithm=algorithm, count=count, holds_sms=holds,
                     stream="dp")
    write_chakra(g, tmp_path)
    back = read_chakra(tmp_path)
    assert [_fields(o) for o in back.ops] == [_fields(o) for o in g.ops]
    for rank in range(3):
        path = tmp_path / f"clustersim.{rank}.et"
        nodes = [parse("Node", body, path, at) for at, body in list(iter_frames(path.read_bytes(), path))[1:]]
        attrs = [{a.name: a for a in n.attr} for n in nodes]
        later = [a for a in attrs if "clustersim.part" in a and a["clustersim.part"].int64_val > 0]
        assert len(later) == 2 + 1  # (counts 3 and 2)
        assert not any("clustersim.stream_dep" in a for a in later)
        firsts = [a for a in attrs if a.get("clustersim.stream") and a["clustersim.stream"].string_val == "dp"
                  and ("clustersim.part" not in a or a["clustersim.part"].int64_val == 0)]
        assert ["clustersim.stream_dep" in a for a in firsts] == [False] + [True] * 5


@pytest.mark.parametrize("field, value", [(f, v) for f, ends in (
    ("int32_val", (-(2**31), 2**31 - 1)), ("int64_val", (-(2**63), 2**63 - 1)), ("uint64_val", (0, 2**64 - 1)))
    for end in ends for v in (end - 1, end, end + 1)])
def test_each_integer_fields_ends_and_one_beyond_as_protobuf(field, value):
    """Each integer field at its range's ends and one step either side: protobuf's bytes inside, its ValueError
    outside (the random test above may miss an end by one)."""
    fields = (1, "n", COMP, [], 0, [("a", field, value)])
    _same_bytes_or_refused_alike(fields)
