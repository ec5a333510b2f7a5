"""Fixes from the twenty-first session's QA hunts (each test fails on the session's start, ``65437d4``).

Sweeps: the ``cluster: PRESET:NODES`` shorthand under a swept cluster field and in the screen; ranks of other
sweeps' rows kept as ``Int64`` in Parquet (they became text, ``'<NA>'`` included); a screen's rank and value
not carried into a later sweep that reuses a refined row.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from simulator.cli import main
from simulator.experiment import experiment_from_dict, run_experiment
from simulator.sweeps import sweep

SHORT = {"cluster": "dgx-h100:1", "model": {"preset": "tiny"},
         "parallel": {"tp": 2, "pp": 2, "dp": 2, "micro_batch": 1, "global_batch": 8}, "training": {"seq_len": 128}}
LONG = {**SHORT, "cluster": {"preset": "dgx-h100", "nodes": 1}}


def _step_times(df: pd.DataFrame) -> dict:
    ok = df[df["status"] == "ok"]
    return dict(zip(ok["point"], ok["step_time_s"]))


@pytest.mark.parametrize("grid,fidelity", [
    ({"cluster.nodes": [1, 2], "parallel.tp": [2]}, None),   # the dp follows the nodes
    ({"layout": ["2x2x2", "1x2x4"]}, "screen"),
])
def test_the_cluster_shorthand_sweeps_as_its_fields(grid, fidelity):
    short = sweep(SHORT, grid, jobs=1, progress=False, fidelity=fidelity)
    long = sweep(LONG, grid, jobs=1, progress=False, fidelity=fidelity)
    assert (short["status"] == "ok").all(), short["reason"].tolist()
    assert sorted(_step_times(short).values()) == sorted(_step_times(long).values())
    # and the two-node point is the run of the same file with two nodes
    if "cluster.nodes" in grid:
        two = run_experiment(experiment_from_dict({**SHORT, "cluster": "dgx-h100:2",
                                                   "parallel": {**SHORT["parallel"], "dp": 4}}))
        assert two.step_time in set(_step_times(short).values())


def test_other_sweeps_ranks_stay_integers_in_parquet(tmp_path):
    pytest.importorskip("pyarrow")
    out = tmp_path / "q.parquet"
    sweep(LONG, {"parallel.micro_batch": [1, 2]}, jobs=1, progress=False, output=out)
    sweep(LONG, {"parallel.tp": [1, 2]}, jobs=1, progress=False, output=out)
    df = pd.read_parquet(out)
    assert pd.api.types.is_integer_dtype(df["rank"].dtype), df["rank"].dtype
    assert df["rank"].isna().sum() >= 1 and (df["rank"] == 1).sum() == 1
    assert sorted(df["rank"].dropna().tolist()) == list(range(1, df["rank"].notna().sum() + 1))


def test_a_plain_sweep_reusing_refined_rows_carries_no_screen_columns(tmp_path):
    out = tmp_path / "r.csv"
    grid = {"layout": ["2x2x2", "1x2x4", "2x1x4", "1x1x8"]}
    sweep(LONG, grid, jobs=1, progress=False, output=out, fidelity="screen", refine=2)
    plain = sweep(LONG, grid, jobs=1, progress=False, output=out)
    for col in [c for c in plain.columns if c.startswith("screen_")]:
        assert plain[col].isna().all(), (col, plain[col].tolist())
    ranks = plain["rank"].dropna().tolist()
    assert sorted(ranks) == list(range(1, len(ranks) + 1))
    # the file holds this sweep's rows once each, ranked by this sweep alone
    written = pd.read_csv(out)
    assert written["rank"].dropna().tolist() == ranks


def test_the_cli_sweeps_a_shorthand_file(tmp_path, capsys):
    path = tmp_path / "short.yaml"
    path.write_text("cluster: dgx-h100:1\nmodel: {preset: tiny}\nparallel: {tp: 2, pp: 2, dp: 2, micro_batch: 1, "
                    "global_batch: 8}\ntraining: {seq_len: 128}\n")
    argv = ["sweep", str(path), "--grid", "cluster.nodes=1,2", "--grid", "parallel.tp=2", "--jobs", "1",
            "--no-progress"]
    assert main(argv) == 0
    assert "2 points: 2 ok, 0 invalid" in capsys.readouterr().out


# ------------------------------------------------------------------ plan: NICs cabled back to back
def _back_to_back(rate: str, switch: bool = False):
    from topologies.custom import cluster_from_dict
    nodes = ["gpu:0:0", "nic:0:0", "gpu:1:0", "nic:1:0"] + (["leaf:0"] if switch else [])
    links = [{"a": "gpu:0:0", "b": "nic:0:0", "bandwidth": "64GB/s", "latency": "0.25us"},
             {"a": "gpu:1:0", "b": "nic:1:0", "bandwidth": "64GB/s", "latency": "0.25us"},
             {"a": "nic:0:0", "b": "nic:1:0", "bandwidth": rate, "latency": "0.5us", "kind": "ib", "tier": "leaf"}]
    if switch:  # both servers on a leaf as well: the direct cable is a second path
        links += [{"a": f"nic:{s}:0", "b": "leaf:0", "bandwidth": rate, "latency": "0.5us"} for s in (0, 1)]
    return cluster_from_dict({"gpu": "H100-SXM", "nodes": nodes, "links": links})


@pytest.mark.parametrize("rate,gbps,nic", [("400Gbps", 400, "ConnectX-7"), ("800Gbps", 800, "ConnectX-8")])
@pytest.mark.parametrize("switch", [False, True])
def test_a_nic_to_nic_cable_is_a_cable_and_sets_the_nic_model(rate, gbps, nic, switch):
    from topologies.capacity import bill_of_materials
    bom = bill_of_materials(_back_to_back(rate, switch))
    nics = bom[bom["item"] == "NIC"]
    assert nics["component"].tolist() == [nic] and nics["count"].tolist() == [2]
    # one cable between the NICs (+ two NIC-leaf cables with the switch), each optical with a transceiver per end
    fibers = int(bom.loc[bom["item"] == "fiber", "count"].sum())
    assert fibers == 1 + 2 * switch
    assert int(bom.loc[bom["item"] == "transceiver", "count"].sum()) == 2 * fibers
    assert set(bom.loc[bom["item"] == "transceiver", "component"]) == {f"transceiver-{gbps}G"}


# ------------------------------------------------------------------ Chakra traces
TINY_RUN = """\
cluster: {preset: dgx-h100, nodes: 1}
model: {preset: tiny}
parallel: {tp: 2, pp: 1, dp: 4, micro_batch: 1, global_batch: 8}
training: {seq_len: 128, dtype: DTYPE}
compute: {attention_kernel: KERNEL}
"""


def _export(tmp_path, dtype="bf16", kernel="fa3"):
    path = tmp_path / "run.yaml"
    path.write_text(TINY_RUN.replace("DTYPE", dtype).replace("KERNEL", kernel))
    folder = tmp_path / f"et-{dtype}-{kernel}"
    assert main(["run", str(path), "--export-chakra", str(folder), "--no-progress"]) == 0
    return folder


def test_a_trace_cut_at_a_nodes_end_is_refused_as_truncated(tmp_path, capsys):
    from workloads.chakra import ChakraError, read_chakra
    from workloads.chakra.schema import iter_frames
    folder = _export(tmp_path)
    capsys.readouterr()
    rank_file = sorted(folder.glob("*.3.et"))[0]
    data = rank_file.read_bytes()
    frames = list(iter_frames(data, rank_file))
    rank_file.write_bytes(data[:frames[-1][0]])  # the last node dropped exactly at its length prefix
    with pytest.raises(ChakraError, match=rf"truncated: {len(frames) - 2:,} of the {len(frames) - 1:,} nodes"):
        read_chakra(folder)
    assert main(["run", "--chakra", str(folder), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "truncated" in err[0]


def test_a_trace_with_a_gap_in_its_node_ids_is_still_read_by_its_chakra_fields(tmp_path):
    # fewer nodes than written but a gap in the ids clustersim numbers 0, 1, ... is an edit, not a cut
    from workloads.chakra import read_chakra
    from workloads.chakra.read import TraceEditedWarning
    from workloads.chakra.schema import iter_frames
    folder = _export(tmp_path)
    from workloads.chakra.schema import classes, frame
    rank_file = sorted(folder.glob("*.0.et"))[0]
    data = rank_file.read_bytes()
    frames = list(iter_frames(data, rank_file))
    # the last node dropped and the one before renumbered, leaving a gap in the ids (as an editor that dropped a
    # node and kept the others' ids would): fewer nodes than written, but not a cut
    node_cls = classes()["Node"]
    nodes = []
    for _offset, body in frames[1:]:
        node = node_cls()
        node.ParseFromString(bytes(body))
        nodes.append(node)
    nodes[-2].id = nodes[-1].id + 5  # a gap, as an editor that dropped a node and kept the ids would leave
    rank_file.write_bytes(data[:frames[1][0]] + b"".join(frame(n) for n in nodes[:-1]))
    with pytest.warns(TraceEditedWarning):
        read_chakra(folder)


def test_an_fp8_trace_on_a_gpu_without_fp8_is_refused_naming_the_trace(tmp_path, capsys):
    folder = _export(tmp_path, dtype="fp8")
    capsys.readouterr()
    bf16 = tmp_path / "bf16.yaml"
    bf16.write_text("training: {dtype: bf16}\n")
    for argv in ([], [str(bf16)]):
        assert main(["run", *argv, "--chakra", str(folder), "--cluster", "dgx-a100", "--no-progress"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith("clustersim: error: --chakra: the trace holds FP8 GEMMs"), err
        assert "A100-80GB-SXM cannot run: training.dtype: fp8 needs FP8 tensor cores" in err[-1]


def test_a_trace_s_hopper_kernel_setting_falls_back_on_an_a100_with_a_note(tmp_path, capsys):
    folder = _export(tmp_path, dtype="bf16", kernel="fa3")
    capsys.readouterr()
    assert main(["run", "--chakra", str(folder), "--cluster", "dgx-a100", "--no-progress", "--json"]) == 0
    out, err = capsys.readouterr()
    assert "the trace's recorded compute settings cannot time kernels on A100-80GB-SXM" in err
    assert "training.dtype and" not in err  # its dtype (bf16) was kept
    # the same step as a file that sets the default kernel itself
    fa2 = tmp_path / "fa2.yaml"
    fa2.write_text("compute: {attention_kernel: fa2}\n")
    assert main(["run", str(fa2), "--chakra", str(folder), "--cluster", "dgx-a100", "--no-progress", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["step_time_s"] == json.loads(out)["step_time_s"]


# ------------------------------------------------------------------ the Python API
DEMO_FILE = "examples/demo.yaml"


def test_experiments_clusters_and_catalogue_entries_pickle_and_deep_copy():
    import copy
    import pickle
    from types import MappingProxyType

    from simulator.experiment import load_experiment
    exp = load_experiment(DEMO_FILE)
    again = pickle.loads(pickle.dumps(exp))
    assert run_experiment(again).summary["step_time_s"] == run_experiment(exp).summary["step_time_s"]
    for obj in (exp.cluster.gpu, exp.plan):
        for twin in (pickle.loads(pickle.dumps(obj)), copy.deepcopy(obj)):
            assert twin == obj
    gpu = copy.deepcopy(exp.cluster).gpu
    assert isinstance(gpu.peak_flops, MappingProxyType)  # still read-only
    with pytest.raises(TypeError):
        gpu.peak_flops["bf16"] = 1.0


def test_a_result_refuses_pickling_in_one_clear_line_and_copies_shallowly():
    import copy
    import pickle

    from simulator.experiment import load_experiment
    r = run_experiment(load_experiment(DEMO_FILE))
    for deep in (pickle.dumps, copy.deepcopy):
        with pytest.raises(TypeError, match="a Result does not pickle or deep-copy.*pickle the Experiment"):
            deep(r)
    assert copy.copy(r).summary == r.summary


@pytest.mark.parametrize("fidelity", ["full", "fast", "lockstep"])
def test_timeline_and_trace_give_every_rank_its_own_stage(fidelity, tmp_path):
    # the demo: TP2 PP2 DP4, ranks 0-7 on stage 0 and 8-15 on stage 1 (the ops frame says so in every fidelity)
    from simulator.experiment import load_experiment
    r = run_experiment(load_experiment(DEMO_FILE), fidelity=fidelity)
    ops = r.ops
    truth = ops[ops["stage"] >= 0].groupby("rank")["stage"].min().to_dict()
    assert truth == {k: k // 8 for k in range(16)}
    ranks = sorted(set(r.rep_ops["rank"]))
    shown = r.timeline(ranks).groupby("rank")["stage"].first().to_dict()
    assert shown == {k: truth[k] for k in ranks}
    path = tmp_path / "t.json"
    r.to_chrome_trace(path, ranks=[1, 3, 9, 13])
    events = json.loads(path.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    names = [e["args"]["name"] for e in events if e.get("name") == "process_name" and e["pid"] != "fabric"]
    assert [n for n in names if n.startswith("rank")] == [
        "rank 1 (stage 0)", "rank 3 (stage 0)", "rank 9 (stage 1)", "rank 13 (stage 1)"]


def test_save_plots_of_a_run_without_ops_skips_the_timeline(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    from simulator import simulate
    from topologies import single_server
    from workloads.ops import OpGraph
    written = simulate(OpGraph(4), single_server("H100", 4)).save_plots(str(tmp_path))
    assert written and not any(p.endswith("timeline.png") for p in written)


# ------------------------------------------------------------------ ZeRO-3 without overlap
@pytest.mark.parametrize("impl", ["fsdp", "fsdp2", "deepspeed"])
def test_zero_overlap_off_splits_gathers_per_tensor_only_under_deepspeed(impl):
    # FSDP gathers a unit's one flat parameter in one collective whether it prefetches or not; DeepSpeed <= 0.5
    # fetched every parameter tensor on its own (what zero_overlap: false reproduces)
    from simulator.experiment import build_step

    def calls(overlap):
        exp = experiment_from_dict({"cluster": {"preset": "dgx-h100", "nodes": 1}, "model": {"preset": "gpt2-small"},
                                    "parallel": {"tp": 1, "pp": 1, "dp": 8, "global_batch": 8, "zero": 3,
                                                 "zero_impl": impl, "zero_overlap": overlap},
                                    "training": {"seq_len": 1024}})
        ops = [op for op in build_step(exp, None).graph.ops if op.rank == 0 and op.name == "zero_gather"]
        return sum(op.count for op in ops), sum(op.nbytes * op.count for op in ops), {op.stream for op in ops}

    (n_on, bytes_on, streams_on), (n_off, bytes_off, streams_off) = calls(True), calls(False)
    assert bytes_off == pytest.approx(bytes_on, rel=1e-12)
    assert streams_off == {"compute"} and "compute" not in streams_on
    if impl == "deepspeed":
        assert n_off > 5 * n_on  # a dozen tensors per layer, against DeepSpeed's coalesced prefetches
    else:
        assert n_off == n_on  # one per unit (and the root unit) either way


def _forged(folder, name, value_field, value):
    """Rank 0's first node holding attribute ``name`` (else its first collective) given ``value`` (as
    ``value_field``), the file's digest recomputed to match (a tool that writes clustersim.* attributes itself)."""
    import zlib

    from workloads.chakra.schema import frame, iter_frames, parse, read_file_bytes
    path = sorted(folder.glob("*.0.et"))[0]
    data = read_file_bytes(path)
    frames = list(iter_frames(data, path))
    meta = parse("GlobalMetadata", frames[0][1], path, 0)
    nodes = [parse("Node", body, path, offset) for offset, body in frames[1:]]
    found = [a for n in nodes for a in n.attr if a.name == name]
    if found:
        attr = found[0]
        attr.Clear()
        attr.name = name
    else:  # (an attribute written only where it is not the default: on the first collective)
        attr = next(n for n in nodes if any(a.name == "comm_type" for a in n.attr)).attr.add(name=name)
    setattr(attr, value_field, value)
    body = b"".join(frame(n) for n in nodes)
    next(a for a in meta.attr if a.name == "clustersim.digest").int64_val = zlib.crc32(body)
    path.write_bytes(frame(meta) + body)


@pytest.mark.parametrize("name,field,value,words", [
    ("clustersim.traffic_class", "int64_val", 1, "'clustersim.traffic_class' must be a string, got 1"),
    ("clustersim.stream", "int64_val", 5, "'clustersim.stream' must be a string, got 5"),
    ("clustersim.layer", "string_val", "x", "'clustersim.layer' must be an integer, got 'x'"),
    ("clustersim.algorithm", "string_val", "tree", "algorithm 'auto' does not match"),
])
def test_a_forged_clustersim_attribute_is_one_clear_line(tmp_path, capsys, name, field, value, words):
    folder = _export(tmp_path)
    _forged(folder, name, field, value)
    capsys.readouterr()
    assert main(["run", "--chakra", str(folder), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0] and "internal error" not in err[0], err


def test_members_of_a_collective_must_agree_on_its_algorithm():
    from simulator import simulate
    from topologies import single_server
    from workloads.ops import OpGraph, OpGraphError
    g = OpGraph(2)
    g.collective_op(0, "all_reduce", (0, 1), 1e6, algorithm="ring")
    g.collective_op(1, "all_reduce", (0, 1), 1e6, algorithm="tree")
    with pytest.raises(OpGraphError, match="algorithm 'tree' does not match .*'ring'"):
        simulate(g, single_server("H100", 2))


# ------------------------------------------------------------------ latency-bound flows of separate calls
def _fan_out(size, peers=7):
    from workloads.ops import OpGraph
    g = OpGraph(peers + 1)
    for p in range(1, peers + 1):  # rank 0 sends to each peer at once, each send a call of its own
        g.send(0, p, size, stream=f"s{p}")
        g.recv(p, 0, size, stream=f"s{p}")
    return g


def test_concurrent_sub_microsecond_sends_share_their_link():
    # 7 x 400 kB from one H100 over its one 450 GB/s NVLink port: each alone is latency-bound (0.89 us), but
    # together they need 7 x 0.89 us of the port, which max-min sharing would give them too; the links'
    # latencies are 2 x 0.25 us (GPU -> NVSwitch -> GPU)
    from simulator import NetworkConfig, simulate
    from topologies import single_server
    net = NetworkConfig(step_latency_s=0.0, bandwidth_efficiency=1.0)
    r = simulate(_fan_out(4e5), single_server("H100", 8), network=net)
    assert r.step_time == pytest.approx(0.5e-6 + 7 * 4e5 / 450e9, rel=1e-9)  # was 1.39 us: 7x the port
    assert r.link_timeseries(top=1)["utilization"].max() <= 1 + 1e-9


def test_the_step_grows_smoothly_with_bytes_across_the_latency_bound_threshold():
    # 3% more bytes used to add 6 us (the sends turned from latency-bound, each at the full rate, to shared)
    from simulator import simulate
    from topologies import single_server
    cluster = single_server("H100", 8)
    small, large = (simulate(_fan_out(s), cluster).step_time for s in (3.6e5, 3.7e5))
    assert 0 < large - small < 1e-6


# ------------------------------------------------------------------ sweeps on an address that is not Dask's
@pytest.mark.parametrize("mode,words", [
    ("silent", "accepted a connection but no Dask scheduler answered within 3 s"),  # (the dashboard's port, say)
    ("garbage", "is not a Dask scheduler"),                                          # (an HTTP server)
])
def test_a_scheduler_address_that_is_not_dask_is_one_line(monkeypatch, mode, words):
    pytest.importorskip("distributed")
    import socket
    import threading

    from simulator.sweeps import execute
    monkeypatch.setattr(execute, "DASK_CONNECT_S", 1)
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(5)
    conns = []

    def serve():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conns.append(conn)
            if mode == "garbage":
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n" * 4)

    threading.Thread(target=serve, daemon=True).start()
    address = f"tcp://127.0.0.1:{server.getsockname()[1]}"
    try:
        with pytest.raises(ValueError, match=f"--scheduler: .*{words}"):
            sweep(LONG, {"parallel.micro_batch": [1, 2]}, scheduler=address, progress=False)
    finally:
        server.close()
        for conn in conns:
            conn.close()


def test_a_trace_that_cannot_be_written_names_the_option(capsys):
    import os
    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full (a device that is always full)")
    assert main(["run", DEMO_FILE, "--trace", "/dev/full", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "clustersim: error: --trace: cannot write /dev/full: No space left on device"


def test_a_node_limit_that_cannot_bind_changes_nothing():
    # routing that leaves half the nodes without load: every token's experts already lie on the two loaded
    # nodes, so a limit of 2 or 3 nodes per token is no limit (was 0.75 each for M = 2: 12% fewer DeepEP bytes)
    import numpy as np

    from workloads.moe import node_limited_shares
    p = np.array([0.5, 0.5, 0.0, 0.0])
    for m in (2, 3, 4):
        assert node_limited_shares(p, m).tolist() == p.tolist()
    # with three loaded nodes and M = 2 the formula runs over those three: p / (p + (1 - p) / 2)
    q = np.array([0.5, 0.25, 0.25, 0.0])
    assert node_limited_shares(q, 2) == pytest.approx([0.5 / 0.75, 0.25 / 0.625, 0.25 / 0.625, 0.0])
