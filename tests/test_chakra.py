"""MLCommons Chakra execution traces in and out (``workloads.chakra``, ``clustersim run --chakra/--export-chakra``).

Independent truths used here: the published ``et_def.proto`` (``tests/data``, field by field), the bytes of a
trace file ASTRA-sim ships, the α-β closed form of a small hand-built trace on one server, and the original
op graph and simulation for the round trip.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pytest

from simulator import simulate
from simulator.cli import main
from simulator.experiment import experiment_from_dict
from simulator.fabric import NetworkConfig
from topologies import single_server
from workloads.chakra import ChakraError, read_chakra, write_chakra
from workloads.chakra.schema import classes, encode_messages
from workloads.ops import OpGraph, OpGraphError
from workloads.training import training_step

DATA = Path(__file__).parent / "data"
STEP = 2e-6
IDEAL = NetworkConfig(step_latency_s=STEP, bandwidth_efficiency=1.0)

COMP, SEND, RECV, COLL, MEM_LOAD, METADATA = 4, 5, 6, 7, 2, 1  # NodeType values of et_def.proto
ALL_REDUCE, ALL_GATHER, SCATTER, ALL_TO_ALL = 0, 2, 4, 6  # CollectiveCommType values


# ------------------------------------------------------------------ helpers
def A(name, kind, value):
    """An AttributeProto with ``<kind>_val = value``."""
    a = classes()["AttributeProto"](name=name)
    setattr(a, f"{kind}_val", value)
    return a


def node(id, type, name="n", deps=(), ctrl=(), duration_us=0, **attrs):
    """A Chakra Node; ``attrs`` as ``name=(kind, value)``."""
    n = classes()["Node"](id=id, name=name, type=type, data_deps=list(deps), ctrl_deps=list(ctrl),
                          duration_micros=duration_us)
    n.attr.extend(A(k, kind, v) for k, (kind, v) in attrs.items())
    return n


def write_trace(folder: Path, programs: list[list], prefix: str = "t", version: str = "0.0.4") -> Path:
    """One ``<prefix>.<rank>.et`` per program: a GlobalMetadata, then the nodes (protolib's framing)."""
    folder.mkdir(parents=True, exist_ok=True)
    for rank, nodes in enumerate(programs):
        meta = classes()["GlobalMetadata"](version=version)
        (folder / f"{prefix}.{rank}.et").write_bytes(encode_messages([meta, *nodes]))
    return folder


def coll(id, comm_type, size, deps=(), pg=None, name="coll"):
    attrs = {"is_cpu_op": ("bool", False), "comm_type": ("int64", comm_type), "comm_size": ("int64", size)}
    if pg is not None:
        attrs["pg_name"] = ("string", pg)
    return node(id, COLL, name, deps, **attrs)


def p2p(id, send, src, dst, size, deps=(), tag=0):
    return node(id, SEND if send else RECV, "send" if send else "recv", deps, comm_src=("int32", src),
                comm_dst=("int32", dst), comm_size=("int64", size), comm_tag=("int32", tag))


def pg_metadata(id, groups: dict[str, list[int]]):
    """PyTorch's process_group:init node, in the form the Chakra converter writes and ASTRA-sim parses."""
    n = node(id, METADATA, "process_group:init")
    n.inputs.values = str([json.dumps([{"pg_name": k, "ranks": v} for k, v in groups.items()])])
    return n


def one_line(exc: pytest.ExceptionInfo) -> str:
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def same_ops(a: OpGraph, b: OpGraph) -> None:
    assert a.world_size == b.world_size and len(a.ops) == len(b.ops)
    for x, y in zip(a.ops, b.ops):
        assert type(x) is type(y) and dataclasses.astuple(x) == dataclasses.astuple(y), (x, y)


# ------------------------------------------------------------------ schema
def _published_schema() -> dict:
    """{message: {field: (number, type, repeated, oneof)}} and {enum: {name: value}} parsed from the .proto text."""
    text = re.sub(r"//[^\n]*", "", (DATA / "chakra_et_def.proto").read_text())
    messages, enums = {}, {}
    for kind, name, body in re.findall(r"\b(message|enum)\s+(\w+)\s*\{((?:[^{}]|\{[^{}]*\})*)\}", text):
        if kind == "enum":
            enums[name] = {k: int(v) for k, v in re.findall(r"(\w+)\s*=\s*(\d+)\s*;", body)}
            continue
        fields = {}
        oneofs = {m.group(1): m.group(2) for m in re.finditer(r"oneof\s+(\w+)\s*\{([^}]*)\}", body)}
        for rep, ftype, fname, number in re.findall(r"(repeated\s+)?(\w+)\s+(\w+)\s*=\s*(\d+)\s*;", body):
            oneof = next((o for o, b in oneofs.items() if re.search(rf"\b{fname}\s*=", b)), None)
            fields[fname] = (int(number), ftype, bool(rep), oneof)
        messages[name] = fields
    return {"messages": messages, "enums": enums}


def test_message_classes_match_the_published_schema_field_by_field():
    from google.protobuf.descriptor import FieldDescriptor as FD

    published = _published_schema()
    scalar = {getattr(FD, f"TYPE_{t.upper()}"): t for t in
              ("double", "float", "int32", "int64", "uint32", "uint64", "sint32", "sint64", "fixed32", "fixed64",
               "sfixed32", "sfixed64", "bool", "string", "bytes")}
    cls = classes()
    assert set(cls) == set(published["messages"])  # 20 messages, no more, no less
    for name, fields in published["messages"].items():
        desc = cls[name].DESCRIPTOR
        assert set(desc.fields_by_name) == set(fields), name
        for fname, (number, ftype, repeated, oneof) in fields.items():
            f = desc.fields_by_name[fname]
            ours = (f.message_type.name if f.type == FD.TYPE_MESSAGE else
                    f.enum_type.name if f.type == FD.TYPE_ENUM else scalar[f.type])
            is_repeated = f.is_repeated if hasattr(f, "is_repeated") else f.label == FD.LABEL_REPEATED  # protobuf 4/7
            assert (f.number, ours, is_repeated) == (number, ftype, repeated), (name, fname)
            assert (f.containing_oneof.name if f.containing_oneof else None) == oneof, (name, fname)
    enums = cls["Node"].DESCRIPTOR.file.enum_types_by_name
    for name, values in published["enums"].items():
        assert {v.name: v.number for v in enums[name].values} == values
    assert cls["Node"].DESCRIPTOR.file.package == "ChakraProtoMsg"


# The first rank files of ASTRA-sim's examples/workload/microbenchmarks/all_gather/4npus_1MB (astra-sim commit
# cb9c7d30), written by its generator script with MLCommons' generated classes: rank r holds node id r.
ASTRA_ALL_GATHER_1 = bytes.fromhex(
    "070a05302e302e344a08011214616c6c5f6761746865725f346e7075735f314d421807520e0a0969735f6370755f6f70d80100520d0a09"
    "636f6d6d5f747970654802520f0a09636f6d6d5f73697a6548808040")


def astra_all_gather(rank: int):
    return node(rank, COLL, "all_gather_4npus_1MB", is_cpu_op=("bool", False), comm_type=("int64", ALL_GATHER),
                comm_size=("int64", 2**20))


def test_bytes_equal_a_trace_file_astra_sim_ships(tmp_path):
    write_trace(tmp_path, [[astra_all_gather(r)] for r in range(4)], prefix="all_gather")
    assert (tmp_path / "all_gather.1.et").read_bytes() == ASTRA_ALL_GATHER_1


def test_reads_astra_sim_microbenchmark_with_its_all_gather_size_convention(tmp_path):
    write_trace(tmp_path, [[astra_all_gather(r)] for r in range(4)], prefix="all_gather")
    (tmp_path / "all_gather.1.et").write_bytes(ASTRA_ALL_GATHER_1)  # the shipped bytes themselves
    g = read_chakra(tmp_path)
    assert g.world_size == 4 and len(g.ops) == 4
    for rank, op in enumerate(g.ops):
        # No pg_name: every rank. comm_size is each NPU's input (ASTRA-sim's ring: final size = n x comm_size),
        # so clustersim's all_gather (nbytes = the gathered output) moves 4 x 1 MiB.
        assert (op.rank, op.collective, op.group, op.nbytes) == (rank, "all_gather", (0, 1, 2, 3), 4 * 2**20)


# ------------------------------------------------------------------ hand-built trace, closed form
def hand_trace(folder: Path) -> Path:
    """4 ranks: 100 us compute; all-reduce (world, no pg_name) of S1; all-to-all of S2 on group "1" (defined by a
    process_group:init node); send/recv 0->1 and 2->3 of M (tag 7); 50 us compute."""
    programs = []
    for r in range(4):
        peer = r ^ 1
        programs.append([
            pg_metadata(0, {"1": [0, 1, 2, 3]}),
            node(1, COMP, "fwd", duration_us=100, is_cpu_op=("bool", False)),
            coll(2, ALL_REDUCE, S1, deps=[1], name="grad_ar"),
            coll(3, ALL_TO_ALL, S2, deps=[2], pg="1", name="dispatch"),
            p2p(4, r % 2 == 0, min(r, peer), max(r, peer), M, deps=[3], tag=7),
            node(5, COMP, "bwd", deps=[4], duration_us=50),
        ])
    return write_trace(folder, programs)


S1, S2, M = 90_000_000, 36_000_000, 8_000_000


def test_hand_built_trace_runs_in_its_closed_form_time(tmp_path, node8):
    g = read_chakra(hand_trace(tmp_path))
    kinds = sorted({(op.kind, getattr(op, "collective", "")) for op in g.ops})
    assert kinds == [("collective", "all_reduce"), ("collective", "all_to_all"), ("compute", ""), ("recv", ""),
                     ("send", "")]
    edges = node8.graph.edges
    alpha = STEP + edges[("gpu", 0, 0), ("nvswitch", 0)]["latency"] + edges[("nvswitch", 0), ("gpu", 0, 1)]["latency"]
    B, n = node8.gpu.nvlink_bandwidth, 4
    expected = (100e-6
                + 2 * (n - 1) * alpha + 2 * (n - 1) / n * S1 / B  # ring all-reduce
                + alpha + (n - 1) / n * S2 / B                      # all-to-all: S2/n to each of n-1 peers
                + alpha + M / B                                     # 0->1 and 2->3 on their own NVLink ports
                + 50e-6)
    result = simulate(g, node8, network=IDEAL)
    assert result.step_time == pytest.approx(expected, rel=1e-9)
    # Payload: ring all-reduce 2(n-1)/n S1 per rank, all-to-all (n-1)/n S2 per rank, two messages of M.
    assert sum(result.bytes_by_class.values()) == pytest.approx(n * (2 * 3 / 4 * S1 + 3 / 4 * S2) + 2 * M)


def test_ctrl_deps_are_honoured_and_metadata_nodes_pass_dependencies_through(tmp_path, node8):
    # Rank 0 only: a 30 us op, a metadata node that depends on it, and a 20 us op that waits for the metadata
    # node (through ctrl_deps): they must run one after the other, 50 us.
    write_trace(tmp_path, [[node(7, COMP, "a", duration_us=30), node(3, METADATA, "m", deps=[7]),
                            node(1, COMP, "b", ctrl=[3], duration_us=20, is_cpu_op=("bool", True))]])
    g = read_chakra(tmp_path)
    assert [op.name for op in g.ops] == ["a", "b"] and g.ops[1].deps == (0,)
    assert simulate(g, node8).step_time == pytest.approx(50e-6)


# ------------------------------------------------------------------ round trip
def _tiny_3d():
    exp = experiment_from_dict({
        "cluster": {"preset": "dgx-h100", "nodes": 2}, "model": {"preset": "tiny"},
        "parallel": {"tp": 2, "pp": 2, "dp": 4, "micro_batch": 1, "global_batch": 8, "schedule": "1f1b",
                     "zero": 1, "sequence_parallel": True},
        "training": {"seq_len": 128}})
    return exp, training_step(exp.model, exp.parallel, exp.training, exp.options, exp.routing).graph


def _tp_overlap():
    """TP communication overlap: kernels beside userbuffer communication hold SMs (``Kernel.sm_reserved``)."""
    exp = experiment_from_dict({
        "cluster": {"preset": "dgx-h100", "nodes": 1}, "model": {"preset": "tiny"},
        "parallel": {"tp": 4, "pp": 2, "micro_batch": 1, "global_batch": 4, "sequence_parallel": True,
                     "tp_comm_overlap": True},
        "training": {"seq_len": 128}})
    return exp, training_step(exp.model, exp.parallel, exp.training, exp.options, exp.routing).graph


def _small_moe():
    moe = {"name": "moe-small", "layers": 2, "hidden": 1024, "heads": 8, "kv_heads": 8, "ffn_hidden": 4096,
           "vocab": 32000, "gated_mlp": True, "tied_embeddings": False, "experts": 8, "top_k": 2,
           "moe_ffn_hidden": 4096, "max_seq_len": 4096}
    exp = experiment_from_dict({
        "cluster": {"preset": "dgx-h100", "nodes": 1}, "model": moe,
        "parallel": {"tp": 1, "pp": 1, "dp": 8, "ep": 8, "micro_batch": 1, "global_batch": 8},
        "training": {"seq_len": 1024}, "moe": {"routing": "zipf", "seed": 3}})
    return exp, training_step(exp.model, exp.parallel, exp.training, exp.options, exp.routing).graph


@pytest.mark.parametrize("build", [_tiny_3d, _small_moe, _tp_overlap],
                         ids=["tp2-pp2-dp4-2-nodes", "moe-ep8-alltoallv", "tp4-pp2-tp-comm-overlap"])
def test_round_trip_gives_the_same_graph_step_time_and_link_bytes(tmp_path, build):
    exp, graph = build()
    files = write_chakra(graph, tmp_path, compute=exp.compute_model())
    assert [f.name for f in files] == [f"clustersim.{r}.et" for r in range(graph.world_size)] + [
        "clustersim.comm_group.json"]
    back = read_chakra(tmp_path)
    same_ops(graph, back)
    before = simulate(graph, exp.cluster, exp.compute_model(), exp.network)
    after = simulate(back, exp.cluster, exp.compute_model(), exp.network)
    assert after.step_time == before.step_time
    assert np.array_equal(after.links["bytes"].to_numpy(), before.links["bytes"].to_numpy())
    assert before.links["bytes"].sum() > 0


def test_the_trace_says_what_astra_sim_reads(tmp_path):
    """What the exported trace holds for a reader that knows only the Chakra attributes (clustersim.* ignored)."""
    exp, graph = _tiny_3d()
    write_chakra(graph, tmp_path, compute=exp.compute_model())
    cm = exp.compute_model()
    groups = json.loads((tmp_path / "clustersim.comm_group.json").read_text())
    coll_nodes = []
    for rank in range(graph.world_size):
        data = (tmp_path / f"clustersim.{rank}.et").read_bytes()
        from workloads.chakra.schema import iter_frames, parse
        frames = list(iter_frames(data, tmp_path))
        meta = parse("GlobalMetadata", frames[0][1], tmp_path, 0)
        assert meta.version == "0.0.4"
        nodes = [parse("Node", b, tmp_path, o) for o, b in frames[1:]]
        ops = [op for op in graph.ops if op.rank == rank]
        pgs = json.loads(nodes[0].inputs.values[2:-2])  # ASTRA-sim's substr(2, size - 4)
        mine = {op.group for op in ops if op.kind == "collective"}  # the groups this rank is in, named as in json
        assert {p["pg_name"]: p["ranks"] for p in pgs} == {k: v for k, v in groups.items() if tuple(v) in mine}
        assert "0" not in groups  # ASTRA-sim reads pg "0" as every rank
        comps = [n for n in nodes if n.type == COMP]
        for n, op in zip(comps, [op for op in ops if op.kind == "compute"]):
            a = {x.name: x for x in n.attr}
            assert a["num_ops"].int64_val == round(op.flops) and a["tensor_size"].uint64_val == round(op.nbytes)
            assert n.duration_micros == round(cm.duration(op) * 1e6)
            assert a["is_cpu_op"].WhichOneof("value") == "bool_val" and not a["is_cpu_op"].bool_val
        coll_nodes += [n for n in nodes if n.type == COLL]
        for n in nodes:
            assert all(d < n.id for d in n.data_deps)  # ids count up in dependency order
    # A coarsened collective (count k) is k Chakra collectives: ASTRA-sim pays the latency k times too.
    assert len(coll_nodes) == sum(op.count for op in graph.ops if op.kind == "collective")
    # Read as ASTRA-sim would: same ranks, same bytes on the wire to rounding, no clustersim extras needed.
    plain = read_chakra(tmp_path, clustersim_attrs=False)
    r0 = simulate(graph, exp.cluster, cm, exp.network)
    r1 = simulate(plain, exp.cluster, cm, exp.network)
    assert sum(r1.bytes_by_class.values()) == pytest.approx(sum(r0.bytes_by_class.values()), rel=1e-9)


# ------------------------------------------------------------------ export refusals
def test_export_refuses_graphs_it_cannot_write(tmp_path):
    exp, _ = _tiny_3d()
    fast = training_step(exp.model, exp.parallel, exp.training, exp.options, exp.routing, representatives="tp")
    with pytest.raises(ChakraError, match="representatives") as e:
        write_chakra(fast.graph, tmp_path)
    one_line(e)
    g = OpGraph(2)
    a = g.compute(0, 1e9)
    g.compute(1, 1e9, deps=[a])
    with pytest.raises(ChakraError, match="depends on op 0 of rank 0"):
        write_chakra(g, tmp_path)
    g = OpGraph(2)
    g.send(0, 1, 10, tag=2**31)
    g.recv(1, 0, 10, tag=2**31)
    with pytest.raises(ChakraError, match="comm_tag"):
        write_chakra(g, tmp_path)
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "clustersim.5.et").write_bytes(b"")
    g = OpGraph(2)
    g.compute(0, 1.0)
    with pytest.raises(ChakraError, match="clustersim.5.et"):
        write_chakra(g, tmp_path / "old")


# ------------------------------------------------------------------ malformed and unsupported traces
def good(rank):
    return [node(0, COMP, "c", duration_us=1)]


MALFORMED = [
    # (id, files {name: bytes | node lists}, words the message must contain)
    ("missing-rank", {"t.0.et": [], "t.2.et": []}, ["missing rank file", "t.1.et"]),
    ("two-prefixes", {"a.0.et": [], "b.0.et": []}, ["several prefixes", "a, b"]),
    ("truncated-varint", {"t.0.et": b"\x07\x0a\x05" + b"0.0.4"[:2] + b"\x80"}, ["truncated"]),
    ("truncated-message", {"t.0.et": b"\x07\x0a\x050.0"}, ["truncated message", "7 bytes"]),
    ("runaway-varint", {"t.0.et": b"\xff\xff\xff\xff\xff\xff"}, ["length prefix"]),
    ("empty-file", {"t.0.et": b""}, ["empty file"]),
    ("json", {"t.0.et": b'{"schema": "1.0.3-chakra.0.0.4", "nodes": []}'}, ["JSON", "chakra_converter"]),
    ("not-metadata", {"t.0.et": b"\x02\x20\x01"}, ["not a Chakra GlobalMetadata"]),
    ("garbage", {"t.0.et": b"\x03\xff\xff\xff"}, ["not a valid Chakra GlobalMetadata"]),
    ("unknown-dep", {"t.0.et": [node(0, COMP, "c", deps=[42])]}, ["node 0", "depends on node 42"]),
    ("cycle", {"t.0.et": [node(0, COMP, "a", deps=[1]), node(1, COMP, "b", deps=[0]), node(2, COMP, "c")]},
     ["dependency cycle", "0, 1"]),
    ("cycle-through-metadata", {"t.0.et": [node(0, METADATA, "m", deps=[1]), node(1, COMP, "b", deps=[0])]},
     ["dependency cycle"]),
    ("duplicate-id", {"t.0.et": [node(3, COMP), node(3, COMP)]}, ["node id 3 appears twice"]),
    ("mem-load", {"t.0.et": good(0) + [node(9, MEM_LOAD, "load", tensor_size=("uint64", 4))]},
     ["node 9", "'load'", "MEM_LOAD_NODE", "t.0.et"]),
    ("unknown-type", {"t.0.et": [node(5, 12)]}, ["node 5", "unknown node type 12"]),
    ("scatter", {"t.0.et": [coll(4, SCATTER, 8)]}, ["node 4", "SCATTER is not modelled"]),
    ("bad-comm-type", {"t.0.et": [coll(4, 99, 8)]}, ["comm_type 99"]),
    ("no-comm-size", {"t.0.et": [node(4, COLL, "ar", comm_type=("int64", ALL_REDUCE))]}, ["comm_size"]),
    ("no-comm-type", {"t.0.et": [node(4, COLL, "ar", comm_size=("int64", 8))]}, ["comm_type"]),
    ("undefined-pg", {"t.0.et": [coll(4, ALL_REDUCE, 8, pg="7")]}, ["pg_name '7'", "not a defined process group"]),
    ("pg-out-of-range", {"t.0.et": [pg_metadata(0, {"1": [0, 5]})]}, ["process group '1'", "0..0"]),
    ("send-from-other-rank", {"t.0.et": [p2p(0, True, 1, 0, 8)], "t.1.et": []}, ["comm_src 1", "rank (0)"]),
    ("recv-without-src", {"t.0.et": [node(0, RECV, "r", comm_size=("int64", 8))]}, ["comm_src"]),
]


@pytest.mark.parametrize("case,files,words", MALFORMED, ids=[c[0] for c in MALFORMED])
def test_malformed_or_unsupported_traces_fail_with_one_line(tmp_path, case, files, words):
    for name, content in files.items():
        if isinstance(content, bytes):
            (tmp_path / name).write_bytes(content)
        else:
            meta = classes()["GlobalMetadata"](version="0.0.4")
            (tmp_path / name).write_bytes(encode_messages([meta, *content]))
    with pytest.raises(ChakraError) as e:
        read_chakra(tmp_path)
    msg = one_line(e)
    for w in words:
        assert w in msg, msg


def test_a_trailing_zero_byte_is_named_as_an_empty_record(tmp_path):
    """A zero byte after the last node is a zero-length message: named as such, not read as a second node 0."""
    meta = classes()["GlobalMetadata"](version="0.0.4")
    (tmp_path / "t.0.et").write_bytes(encode_messages([meta, *good(0)]) + b"\x00")
    with pytest.raises(ChakraError) as e:
        read_chakra(tmp_path)
    msg = one_line(e)
    assert "empty" in msg and "zero-length" in msg and "t.0.et" in msg, msg
    assert "appears twice" not in msg


def test_folder_errors_and_prefix_choice(tmp_path):
    with pytest.raises(ChakraError, match="no such folder"):
        read_chakra(tmp_path / "nope")
    with pytest.raises(ChakraError, match="no Chakra trace files"):
        read_chakra(tmp_path)
    write_trace(tmp_path, [good(0), good(1)], prefix="a")
    write_trace(tmp_path, [good(0)], prefix="b")
    assert read_chakra(tmp_path, prefix="a").world_size == 2
    assert read_chakra(tmp_path / "b").world_size == 1  # ASTRA-sim's <folder>/<prefix> form
    with pytest.raises(ChakraError, match="no trace files c.<rank>.et; it has a, b"):
        read_chakra(tmp_path, prefix="c")


def test_without_protobuf_the_error_says_what_to_install(tmp_path, monkeypatch):
    import importlib.util

    from workloads.chakra import schema
    real = importlib.util.find_spec
    monkeypatch.setattr(schema, "_CLASSES", None)
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name.startswith("google.protobuf") else real(name, *a))
    for call in (lambda: read_chakra(tmp_path), lambda: write_chakra(OpGraph(1), tmp_path)):
        with pytest.raises(ChakraError, match=r"pip install '\.\[chakra\]' in the checkout"):
            call()


def test_gzipped_rank_files_are_read(tmp_path):
    import gzip
    write_trace(tmp_path, [good(0)])
    p = tmp_path / "t.0.et"
    p.write_bytes(gzip.compress(p.read_bytes()))
    assert read_chakra(tmp_path).ops[0].duration_s == pytest.approx(1e-6)


# ------------------------------------------------------------------ CLI
TINY_YAML = """\
name: tiny 3D
cluster: {preset: dgx-h100, nodes: 2}
model: {preset: tiny}
parallel: {tp: 2, pp: 2, dp: 4, micro_batch: 1, global_batch: 8, schedule: 1f1b, zero: 1}
training: {seq_len: 128}
"""


def test_cli_export_then_run_the_trace_gives_the_full_fidelity_step(tmp_path, capsys):
    exp_file = tmp_path / "exp.yaml"
    exp_file.write_text(TINY_YAML)
    out = tmp_path / "trace"
    assert main(["run", str(exp_file), "--fidelity", "full", "--json", "--export-chakra", str(out)]) == 0
    full = json.loads(capsys.readouterr().out)
    assert sorted(p.name for p in out.iterdir())[:2] == ["clustersim.0.et", "clustersim.1.et"]
    assert len(list(out.glob("*.et"))) == 16
    assert main(["run", "--chakra", str(out), "--cluster", "dgx-h100", "--json"]) == 0
    traced = json.loads(capsys.readouterr().out)
    assert traced["step_time_s"] == full["step_time_s"] and traced["bytes_by_tier"] == full["bytes_by_tier"]
    assert main(["run", str(exp_file), "--chakra", str(out)]) == 0  # the file's cluster section
    text = capsys.readouterr().out
    assert "Chakra trace" in text and "16 ranks" in text and "step time" in text and "tokens/s" not in text


# A straggler, and GPU variability (the draws are per GPU of the cluster, not per op graph, so a replay runs every
# rank at the factor the exporting run gave it).
@pytest.mark.parametrize("faults", ["[{kind: straggler, gpu: 0, factor: 1.5}]",
                                    "[{kind: variability, spread: 0.05, seed: 2}]"], ids=["straggler", "variability"])
def test_cli_trace_with_faults_reports_their_cost_as_a_generated_run_does(tmp_path, capsys, faults):
    exp_file = tmp_path / "exp.yaml"
    exp_file.write_text(TINY_YAML + f"faults: {faults}\n")
    out = tmp_path / "trace"
    assert main(["run", str(exp_file), "--fidelity", "full", "--json", "--export-chakra", str(out)]) == 0
    full = json.loads(capsys.readouterr().out)
    assert main(["run", str(exp_file), "--chakra", str(out), "--json"]) == 0
    traced = json.loads(capsys.readouterr().out)
    for key in ("step_time_s", "healthy_step_time_s", "fault_slowdown", "faults"):
        assert traced[key] == full[key], key
    assert traced["fault_slowdown"] > 1


@pytest.mark.parametrize("argv,words", [
    (["run"], ["FILE", "--chakra DIR"]),
    (["run", "--chakra", "{trace}", "--fidelity", "fast"], ["--fidelity"]),
    (["run", "{yaml}", "--cluster", "dgx-h100"], ["--cluster", "only with --chakra"]),
    (["run", "--chakra", "{trace}", "--cluster", "dgx-h100:x"], ["--cluster", "NODES"]),
    (["run", "--chakra", "{trace}", "--cluster", "nope"], ["--cluster", "unknown preset"]),
    (["run", "--chakra", "{trace}", "--cluster", "dgx-h100:0"], ["--cluster"]),
    (["run", "--chakra", "{bad}"], ["MEM_LOAD_NODE"]),
    (["run", "--chakra", "{tmp}/nope"], ["no such folder"]),
    (["run", "{yaml}", "--export-chakra", "{yaml}"], ["--export-chakra", "not a folder"]),
])
def test_cli_errors_are_one_line_exit_2(tmp_path, capsys, argv, words):
    trace = hand_trace(tmp_path / "trace")
    bad = write_trace(tmp_path / "bad", [[node(0, MEM_LOAD, "load")]])
    yaml = tmp_path / "exp.yaml"
    yaml.write_text(TINY_YAML)
    argv = [a.format(trace=trace, bad=bad, yaml=yaml, tmp=tmp_path) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("clustersim: error: ") and err.count("\n") == 1 and "Traceback" not in err
    for w in words:
        assert w in err, err


def test_cli_trace_that_deadlocks_exits_3(tmp_path, capsys):
    # Each rank waits to receive before it sends: no order of issue can finish.
    write_trace(tmp_path, [[p2p(0, False, 1, 0, 8), p2p(1, True, 0, 1, 8, deps=[0])],
                           [p2p(0, False, 0, 1, 8), p2p(1, True, 1, 0, 8, deps=[0])]])
    assert main(["run", "--chakra", str(tmp_path)]) == 3
    assert "deadlock" in capsys.readouterr().err


def test_uneven_all_to_alls_read_without_clustersim_attributes(tmp_path):
    # Chakra's comm_size is each rank's own input (ASTRA-sim reads it per node): a skewed MoE's exchanges have
    # unequal sizes across their members. Read as ASTRA-sim would, each becomes an exchange in which every rank
    # spreads its input evenly; exchanges whose members agree stay uniform all-to-alls.
    exp, graph = _small_moe()
    write_chakra(graph, tmp_path)
    plain = read_chakra(tmp_path, clustersim_attrs=False)
    a2a = [op for op in plain.ops if op.kind == "collective" and op.collective == "all_to_all"]
    written = [op for op in graph.ops if op.kind == "collective" and op.collective == "all_to_all"]
    assert len(a2a) == sum(op.count for op in written) and any(op.split is not None for op in a2a)
    for op in a2a:
        if op.split is not None:
            n = len(op.group)
            assert op.split == pytest.approx((op.nbytes / n,) * n)
    result = simulate(plain, exp.cluster)
    assert result.step_time > 0
    # every rank sends (n - 1)/n of its input to its peers
    sent = sum(op.nbytes * (len(op.group) - 1) / len(op.group) for op in a2a)
    assert result.bytes_by_class["all_to_all"] == pytest.approx(sent, rel=1e-9)


def test_uneven_all_to_alls_are_matched_as_the_engine_matches_exchanges(tmp_path):
    # Two names for one group ("" and "0": every rank), issued in different orders: the engine pairs the
    # collectives by group and position, and so does the reader when it decides which exchanges are uneven.
    write_trace(tmp_path, [[coll(0, ALL_TO_ALL, 100, pg=""), coll(1, ALL_TO_ALL, 50, pg="0")],
                           [coll(0, ALL_TO_ALL, 50, pg="0"), coll(1, ALL_TO_ALL, 300, pg="")]])
    graph = read_chakra(tmp_path)
    assert all(op.split == (op.nbytes / 2,) * 2 for op in graph.ops if op.kind == "collective")
    result = simulate(graph, single_server("H100", 2))
    assert result.bytes_by_class["all_to_all"] == pytest.approx((100 + 50 + 50 + 300) / 2)
    # members that agree stay a uniform all-to-all
    write_trace(tmp_path, [[coll(0, ALL_TO_ALL, 64, pg="0")], [coll(0, ALL_TO_ALL, 64, pg="0")]])
    assert [op.split for op in read_chakra(tmp_path).ops] == [None, None]


def test_an_exchange_of_split_and_unsplit_members_is_refused_in_one_line():
    g = OpGraph(2)
    g.collective_op(0, "all_to_all", (0, 1), 100.0, split=(50.0, 50.0))
    g.collective_op(1, "all_to_all", (0, 1), 100.0)
    with pytest.raises(OpGraphError, match=r"an all_to_all but .* of the same exchange is an alltoallv"):
        simulate(g, single_server("H100", 2))


def test_cli_refuses_an_export_folder_of_a_larger_trace_before_simulating(tmp_path, capsys, monkeypatch):
    # found by a new-user walk: the folder was checked only after the whole run, whose results were then lost
    exp_file = tmp_path / "exp.yaml"
    exp_file.write_text(TINY_YAML)
    out = tmp_path / "trace"
    out.mkdir()
    for rank in range(120):  # a 120-rank trace; this run has 16 ranks
        (out / f"clustersim.{rank}.et").write_bytes(b"")

    def never(*_a, **_k):
        raise AssertionError("simulated before refusing the export folder")

    monkeypatch.setattr("simulator.experiment.run_experiment", never)
    assert main(["run", str(exp_file), "--fidelity", "full", "--export-chakra", str(out)]) == 2
    err = capsys.readouterr().err
    assert "already holds clustersim.16.et, clustersim.17.et, clustersim.18.et from a larger trace" in err
