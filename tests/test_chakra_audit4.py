"""Audit 4 of the Chakra round trip (a helper's hunt, 2026-12-04): a trace re-read without its experiment file is
timed as it was written (dtype and compute settings recorded); a trace edited by another tool is read by its
Chakra fields, with a note; a node that depends on itself is a cycle; long chains of metadata nodes read; the
deadlock report names a stream's order; rank files are named as ASTRA-sim names them."""

from __future__ import annotations

import json
import shutil
import warnings

import pytest

from simulator.cli import main
from workloads.chakra import ChakraError, ChakraWarning, read_chakra, trace_settings
from workloads.chakra.schema import encode_messages, iter_frames, parse, read_file_bytes

pytest.importorskip("google.protobuf")

from test_chakra import COMP, METADATA, node, p2p, write_trace  # noqa: E402

FP32 = """\
name: fp32
cluster: {preset: dgx-h100, nodes: 1}
model: {preset: tiny}
parallel: {tp: 2, pp: 1, dp: 4, micro_batch: 1, global_batch: 8}
training: {seq_len: 128, dtype: fp32}
compute: {matmul_efficiency: 0.3}
"""


def _step(argv, capsys) -> tuple[float, str]:
    """The step time ``clustersim run ... --json`` prints, and what it wrote to stderr."""
    assert main([*argv, "--json"]) == 0
    out = capsys.readouterr()
    return json.loads(out.out)["step_time_s"], out.err


@pytest.fixture
def fp32_trace(tmp_path, capsys):
    """An fp32 step with a compute knob, exported: (its folder, the exported run's step time)."""
    (tmp_path / "fp32.yaml").write_text(FP32)
    step, _ = _step(["run", str(tmp_path / "fp32.yaml"), "--fidelity", "full", "--export-chakra",
                     str(tmp_path / "et")], capsys)
    return tmp_path / "et", step


def test_a_trace_read_without_its_file_is_timed_as_it_was_written(fp32_trace, capsys):
    # Before: the re-read timed fp32 kernels as bf16 with default efficiencies, 9x faster without a word.
    folder, exported = fp32_trace
    written = trace_settings(folder)
    assert written["gpu"] == "H100-SXM"
    assert written["compute"]["dtype"] == "fp32" and written["compute"]["matmul_efficiency"] == 0.3
    step, err = _step(["run", "--chakra", str(folder), "--cluster", "dgx-h100:1"], capsys)
    assert step == exported and "note" not in err


def test_a_file_or_cluster_that_re_times_the_trace_says_so(fp32_trace, tmp_path, capsys):
    folder, exported = fp32_trace
    (tmp_path / "bf16.yaml").write_text("training: {dtype: bf16}\n")
    step, err = _step(["run", str(tmp_path / "bf16.yaml"), "--chakra", str(folder), "--cluster", "dgx-h100:1"],
                      capsys)
    assert step < exported and "training.dtype bf16 re-times the trace's kernels, written for fp32" in err
    (tmp_path / "eff.yaml").write_text("compute: {matmul_efficiency: 0.6}\n")
    step, err = _step(["run", str(tmp_path / "eff.yaml"), "--chakra", str(folder), "--cluster", "dgx-h100:1"],
                      capsys)
    assert step < exported and "written with matmul_efficiency: 0.3" in err
    _, err = _step(["run", "--chakra", str(folder), "--cluster", "dgx-b200:1"], capsys)
    assert "timed for H100-SXM; its kernels are re-timed for this cluster's B200" in err


def test_the_files_cluster_replaced_by_cluster_is_noted(fp32_trace, tmp_path, capsys):
    folder, _ = fp32_trace
    _, err = _step(["run", str(tmp_path / "fp32.yaml"), "--chakra", str(folder), "--cluster", "dgx-b200:1"], capsys)
    assert "cluster: has no effect: --cluster dgx-b200:1 replaces the file's cluster section" in err


def _rewrite(src, dst, scale: int) -> None:
    """Copy trace ``src`` to ``dst`` re-encoding every file, each node's duration and comm_size times ``scale``
    (what another tool editing a trace does)."""
    shutil.copytree(src, dst)
    for p in sorted(dst.glob("*.et")):
        frames = list(iter_frames(read_file_bytes(p), p))
        nodes = [parse("Node", body, p, offset) for offset, body in frames[1:]]
        for n in nodes:
            n.duration_micros *= scale
            for a in n.attr:
                if a.name == "comm_size":
                    a.int64_val *= scale
        p.write_bytes(encode_messages([parse("GlobalMetadata", frames[0][1], p, 0), *nodes]))


def test_an_edited_trace_is_read_by_its_chakra_fields_with_a_note(fp32_trace, tmp_path, capsys):
    # Before: the clustersim.* attributes won, so durations and sizes edited into the trace changed nothing.
    folder, _ = fp32_trace
    _rewrite(folder, tmp_path / "same", 1)  # re-encoded, unchanged: still read losslessly, without a warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        same = read_chakra(tmp_path / "same")
    assert len(same.ops) == len(read_chakra(folder).ops) < len(read_chakra(folder, clustersim_attrs=False).ops)
    _rewrite(folder, tmp_path / "edited", 10)
    with pytest.warns(ChakraWarning, match="changed after clustersim wrote it"):
        edited = read_chakra(tmp_path / "edited")
    foreign = read_chakra(tmp_path / "edited", clustersim_attrs=False)
    assert [(o.kind, o.name, o.nbytes) for o in edited.ops] == [(o.kind, o.name, o.nbytes) for o in foreign.ops]
    plain, _ = _step(["run", "--chakra", str(folder), "--cluster", "dgx-h100:1"], capsys)
    step, err = _step(["run", "--chakra", str(tmp_path / "edited"), "--cluster", "dgx-h100:1"], capsys)
    assert "clustersim: note: --chakra:" in err and "reading the Chakra fields only" in err
    assert step > 5 * plain  # ten times every duration and size
    # its durations are fixed: another GPU re-times nothing, and no note says it does
    _, err = _step(["run", "--chakra", str(tmp_path / "edited"), "--cluster", "dgx-b200:1"], capsys)
    assert "re-timed" not in err and "reading the Chakra fields only" in err


def test_a_node_that_depends_on_itself_is_a_cycle(tmp_path):
    # Before: the self edge was dropped as "the previous part of a coarsened collective" and the trace ran.
    write_trace(tmp_path, [[node(0, COMP, "a", duration_us=5), node(1, COMP, "b", deps=[1], duration_us=5)]])
    with pytest.raises(ChakraError, match=r"dependency cycle: node 1 \('b'\) depends on itself"):
        read_chakra(tmp_path)


def test_a_long_chain_of_metadata_nodes_reads(tmp_path):
    # Before: a recursive walk through skipped nodes raised RecursionError from ~700 chained nodes.
    n = 3000
    chain = [node(0, COMP, "first", duration_us=5)]
    chain += [node(i, METADATA, f"m{i}", deps=[i - 1]) for i in range(1, n)]
    chain += [node(n, COMP, "last", deps=[n - 1], duration_us=5)]
    graph = read_chakra(write_trace(tmp_path, [chain]))
    assert [op.name for op in graph.ops] == ["first", "last"] and graph.ops[1].deps == (0,)
    cyclic = chain[:3] + [node(3, METADATA, "m3", deps=[4]), node(4, METADATA, "m4", deps=[3]),
                          node(5, COMP, "after", deps=[4], duration_us=5)]
    with pytest.raises(ChakraError, match="dependency cycle through node"):
        read_chakra(write_trace(tmp_path / "cyclic", [cyclic]))


def test_the_deadlock_report_names_the_stream_order_an_op_waits_in(tmp_path, capsys):
    # Crossed tags: rank 0 sends tag 1 then tag 2, rank 1 receives tag 2 first. Before, the second send read as
    # "waiting on op(s) []": it waits behind the first send on its stream.
    write_trace(tmp_path, [[p2p(0, True, 0, 1, 8, tag=1), p2p(1, True, 0, 1, 8, tag=2)],
                           [p2p(0, False, 0, 1, 8, tag=2), p2p(1, False, 0, 1, 8, tag=1)]])
    assert main(["run", "--chakra", str(tmp_path)]) == 3
    err = capsys.readouterr().err
    # (named by the trace's file and node since 2026-12-05: clustersim's op ids are in no trace)
    assert "t.0.et node 1 send 'send' waiting on op(s) [] and, on its stream 'comm', behind t.0.et node 0 send " \
           "'send'" in err, err


def test_rank_files_are_named_without_leading_zeros(tmp_path):
    # ASTRA-sim opens <prefix>.<to_string(rank)>.et: t.01.et is not rank 1's file.
    write_trace(tmp_path, [[node(0, COMP, "a", duration_us=5)]] * 2)
    (tmp_path / "t.1.et").rename(tmp_path / "t.01.et")
    assert read_chakra(tmp_path).world_size == 1


def test_writing_collectives_astra_sim_does_not_simulate_warns(tmp_path):
    # ASTRA-sim's Workload::issue_coll_comm (astra-sim 0383c20) simulates ALL_REDUCE, ALL_TO_ALL, ALL_GATHER and
    # REDUCE_SCATTER; it replays a BROADCAST from duration_micros and stops at REDUCE or GATHER.
    from workloads.chakra import write_chakra
    from workloads.ops import OpGraph
    g = OpGraph(2)
    g.collective("broadcast", [0, 1], 1e6)
    g.collective("gather", [0, 1], 1e6)
    with pytest.warns(ChakraWarning, match="BROADCAST, GATHER collectives, which ASTRA-sim's workload layer does "
                                           "not simulate"):
        write_chakra(g, tmp_path / "a")
    assert [op.collective for op in read_chakra(tmp_path / "a").ops] == ["broadcast", "broadcast", "gather",
                                                                         "gather"]
    plain = OpGraph(2)
    plain.collective("all_reduce", [0, 1], 1e6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        write_chakra(plain, tmp_path / "b")
