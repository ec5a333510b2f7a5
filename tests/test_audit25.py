"""Defects found by the twenty-fifth session's hunts (2026-12-05), each with the test that fails on the old code."""

from __future__ import annotations

import copy

import pytest

from simulator.experiment import experiment_from_dict, representatives_for, run_experiment
from workloads.ops import OpGraph

ZB_H1 = {
    "cluster": {"preset": "dgx-h100", "nodes": 4, "nodes_per_leaf": 2, "spines": 2, "oversubscription": 2},
    "model": {"preset": "gpt2-small", "heads": 16, "kv_heads": 16, "hidden": 1024, "layers": 4},
    "parallel": {"tp": 2, "pp": 4, "dp": 4, "micro_batch": 1, "global_batch": 16, "schedule": "zb-h1", "zero": 1,
                 "sequence_parallel": True},
    "training": {"seq_len": 512},
}
"""32 GPUs under a split backward, where a straggler makes every fidelity simulate every rank."""


def test_a_straggler_of_factor_one_changes_nothing():
    """A factor of 1 slows nothing: the step is the healthy one to the bit, in the healthy step's fidelity
    (it used to make every fidelity simulate every rank under a split backward: `fast` moved by +0.066%)."""
    doc = copy.deepcopy(ZB_H1)
    healthy = experiment_from_dict(doc)
    doc["faults"] = [{"kind": "straggler", "gpu": 3, "factor": 1.0}]
    idle = experiment_from_dict(doc)
    assert representatives_for(idle, "fast") == representatives_for(healthy, "fast")
    assert run_experiment(idle, fidelity="fast").step_time == run_experiment(healthy, fidelity="fast").step_time


def test_a_sweep_says_why_points_did_not_run_even_when_others_did(tmp_path, capsys):
    """A typo in a grid value is an ``invalid`` row beside feasible ones: its reason is on stderr, not only in
    the table's reason column (it used to be printed only when no point at all was feasible)."""
    import yaml

    from simulator.cli import main

    doc = {"cluster": {"preset": "dgx-h100", "nodes": 1}, "model": {"preset": "tiny"},
           "parallel": {"tp": 1, "pp": 1, "micro_batch": 1, "global_batch": 8}, "training": {"seq_len": 128}}
    path = tmp_path / "base.yaml"
    path.write_text(yaml.safe_dump(doc))
    rc = main(["sweep", str(path), "--grid", "parallel.tp=1,x", "--jobs", "1", "--no-progress"])
    captured = capsys.readouterr()
    assert rc == 0
    assert "2 points: 1 ok, 1 invalid" in captured.out
    assert "# 1 invalid: parallel.tp: must be a positive integer, got 'x'" in captured.err


def test_fp8_mfu_says_what_peak_it_is_of(tmp_path, capsys):
    """FP8 training's MFU is of the dense bf16 peak (989 TFLOP/s on an H100 SXM, NVIDIA's datasheet), which FP8
    GEMMs run above, so it can pass 100%: the run says so (a hunt read "MFU 104.5 %" with nothing beside it)."""
    import yaml

    from simulator.cli import main

    doc = {"cluster": {"preset": "dgx-h100", "nodes": 1}, "model": {"preset": "tiny"},
           "parallel": {"tp": 1, "pp": 1, "micro_batch": 1, "global_batch": 8}, "training": {"seq_len": 128}}
    for dtype in ("fp8", "bf16"):
        doc["training"]["dtype"] = dtype
        path = tmp_path / f"{dtype}.yaml"
        path.write_text(yaml.safe_dump(doc))
        assert main(["run", str(path), "--no-progress"]) == 0
        line = next(x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("MFU"))
        assert ("MFU is of the dense bf16 peak, 989 TFLOP/s" in line) == (dtype == "fp8"), line
    exp = experiment_from_dict(doc)
    assert run_experiment(exp).summary["mfu_peak_tflops"] == pytest.approx(989, rel=1e-3)


def test_plan_of_one_gpu_has_no_bisection_to_print(tmp_path, capsys):
    """One GPU has no half to cut: the text says n/a instead of ``nan B/s per GPU``."""
    from simulator.cli import main

    path = tmp_path / "one.yaml"
    path.write_text("cluster: {preset: dgx-h100, nodes: 1, gpus_per_node: 1}\n")
    assert main(["plan", str(path)]) == 0
    out = capsys.readouterr().out
    assert "nan" not in out and "bisection     n/a (one GPU)" in out


def test_a_capacity_that_drops_nothing_routes_as_dropless_under_tp():
    """Under TP each router draws its own share (test_audit22); the shares are now a split of the dropless
    draw, so a capacity no expert reaches leaves the routing, and the step, as dropless (a hunt: capacity 1000
    at TP 2 moved layer 0's expert loads from [1668, 6157, ...] to [1788, 6203, ...] with nothing dropped)."""
    import numpy as np

    from workloads.moe import RoutingModel, route_layer

    for routers in (2, 4):
        free = route_layer(8, 2, 4096, 4, RoutingModel("zipf", zipf_s=1.0), 3, routers=routers)
        capped = route_layer(8, 2, 4096, 4, RoutingModel("zipf", zipf_s=1.0, capacity_factor=1000.0), 3,
                             routers=routers)
        assert capped.dropped == 0
        assert np.array_equal(free.choices, capped.choices) and np.array_equal(free.kept, capped.kept)
    doc = {"cluster": {"preset": "dgx-h100", "nodes": 1},
           "model": {"preset": "mixtral-8x7b", "layers": 2, "hidden": 1024, "heads": 8, "kv_heads": 8,
                     "ffn_hidden": 2048, "moe_ffn_hidden": 2048, "vocab": 32000},
           "parallel": {"tp": 2, "dp": 4, "ep": 4, "micro_batch": 1, "global_batch": 8, "sequence_parallel": True},
           "training": {"seq_len": 1024}, "moe": {"routing": "zipf", "zipf_s": 1.0}}
    dropless = run_experiment(experiment_from_dict(doc)).step_time
    doc["moe"]["capacity_factor"] = 1000
    assert run_experiment(experiment_from_dict(doc)).step_time == dropless


def test_expert_load_table_reconciles_with_the_rank_loads_under_padding():
    """Under ``pad_to_capacity`` every source sends its capacity, ceil(T·k / E · c) = ceil(256 · 2 / 8 · 1) = 64
    slots, to every expert: 4 sources x 64 = 256 slots per expert, whatever was kept; the table's ``slots`` say
    so and sum per EP rank to the summary's ``rank_load_tokens`` (the table had only the kept tokens)."""
    doc = {"cluster": {"preset": "dgx-h100", "nodes": 1},
           "model": {"preset": "mixtral-8x7b", "layers": 2, "hidden": 1024, "heads": 8, "kv_heads": 8,
                     "ffn_hidden": 2048, "moe_ffn_hidden": 2048, "vocab": 32000},
           "parallel": {"tp": 1, "dp": 8, "ep": 4, "micro_batch": 1, "global_batch": 8},
           "training": {"seq_len": 256},
           "moe": {"routing": "zipf", "zipf_s": 1.0, "capacity_factor": 1.0, "pad_to_capacity": True}}
    res = run_experiment(experiment_from_dict(doc))
    table = res.expert_load
    assert (table["slots"] == 4 * 64).all()
    assert (table["tokens_kept"] <= table["slots"]).all() and (table["tokens_kept"] < table["slots"]).any()
    per_rank = table.groupby("ep_rank")["slots"].sum().tolist()
    assert per_rank == res.summary["moe"]["rank_load_tokens"]


def test_too_few_loaded_experts_is_refused_with_the_files_name(tmp_path, capsys):
    """A custom expert load with fewer loaded experts than top_k is refused when the file is read, named with
    the file as every other field's error (it was found when the step was built, without the file)."""
    from simulator.cli import main

    path = tmp_path / "load.yaml"
    path.write_text("cluster: {preset: dgx-h100, nodes: 1}\nmodel: {preset: tiny, experts: 8, top_k: 2}\n"
                    "parallel: {tp: 1, pp: 1, ep: 4, micro_batch: 1, global_batch: 8}\ntraining: {seq_len: 128}\n"
                    "moe: {routing: custom, expert_load: [1, 0, 0, 0, 0, 0, 0, 0]}\n")
    assert main(["run", str(path), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"clustersim: error: {path}: moe.expert_load: 1 experts with a load, but every token picks "
                   f"top_k = 2 distinct experts; give at least 2 a positive load")


def test_an_unknown_preset_given_as_an_option_names_the_option(capsys):
    from simulator.cli import main

    assert main(["collective", "--cluster", "foo", "--op", "all_reduce"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("clustersim: error: --cluster: unknown preset 'foo'; valid: dgx-a100")


def test_max_tp_without_an_auto_layout_is_refused(tmp_path, capsys):
    """``--max-tp`` bounds ``layout: auto``; on a grid without it, it was silently ignored."""
    from simulator.cli import main

    rc = main(["sweep", "examples/demo.yaml", "--grid", "parallel.tp=1,2", "--max-tp", "4", "--no-progress",
               "-o", str(tmp_path / "out.csv")])
    assert rc == 2
    assert capsys.readouterr().err.strip() == ("clustersim: error: max_tp: 4 bounds tp in layout: auto, which this "
                                               "grid does not sweep; give --grid layout=auto, or list parallel.tp "
                                               "values")


def test_a_job_out_of_memory_is_named_with_its_file_and_what_to_lower(tmp_path, capsys):
    """``clustersim jobs``' out-of-memory error starts with the file, as ``run``'s does, and says what to lower
    (it had neither)."""
    from simulator.cli import main

    path = tmp_path / "jobs.yaml"
    path.write_text("cluster: {preset: dgx-h100, nodes: 2}\njobs:\n"
                    "  - {name: a, nodes: 1, model: {preset: llama3-8b}, training: {seq_len: 8192},\n"
                    "     parallel: {tp: 1, pp: 1, zero: 0, micro_batch: 8, global_batch: 64}}\n"
                    "  - {name: b, nodes: 1, model: {preset: tiny}, training: {seq_len: 128},\n"
                    "     parallel: {tp: 1, pp: 1, micro_batch: 1, global_batch: 8}}\n")
    assert main(["jobs", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"clustersim: error: {path}: job 'a': out of memory: stage 0: ")
    assert "parallel.recompute: full" in err and err.endswith("(or use --force to simulate anyway)")


def test_a_sweeps_progress_bar_stays_off_a_redirected_stderr():
    """Like ``clustersim run``'s, the sweep's text bar is drawn on a terminal only (a hunt found it written into
    a redirected stderr); here stderr is pytest's capture, not a terminal."""
    import sys

    from simulator.sweeps.driver import _progress

    assert not sys.stderr.isatty()
    bar = _progress(10, True)
    assert bar.disable
    bar.close()


def test_a_long_run_without_a_bar_says_how_long_once(capsys):
    """Without a progress bar (``--no-progress``, or stderr not a terminal) a step of millions of ops said
    nothing for minutes; 3 M ops at 30 µs an op (workloads.op_budget) is 90 s of CPU: one note, at the start."""
    from simulator.cli import _ops_bar

    with _ops_bar(False) as progress:
        progress(0, 3_000_000)
        progress(1_500_000, 3_000_000)
    with _ops_bar(False) as progress:
        progress(0, 1_000)  # a second of CPU: nothing to say
    assert capsys.readouterr().err == ("clustersim: note: 3.0 M ops to simulate, about 2 min of CPU on a 2-core "
                                       "machine\n")


# ------------------------------------------------------------------ Chakra traces (a hunt's findings)
def _chakra_helpers():
    import test_chakra  # (its trace-writing helpers: tests/ is on the path under pytest)

    return test_chakra


def test_a_trace_error_found_while_simulating_names_the_file_and_node(tmp_path, capsys):
    """Ranks whose all-reduces disagree are found when the trace runs, not when it is read: the error named
    clustersim's own op ids (``rank 1 op 5``), which no trace holds; it names the rank file and node now."""
    from simulator.cli import main

    tc = _chakra_helpers()
    programs = [[tc.node(0, tc.COMP, "gemm", duration_us=10), tc.coll(1, tc.ALL_REDUCE, 1 << 20, deps=[0], name="ar")]
                for _ in range(2)]
    programs[1][1] = tc.coll(1, tc.ALL_REDUCE, 1000, deps=[0], name="ar")
    folder = tc.write_trace(tmp_path / "trace", programs)
    assert main(["run", "--chakra", str(folder), "--cluster", "dgx-h100:1", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"clustersim: error: --chakra: {folder}: t.1.et node 1 collective 'ar': all_reduce of "
                          f"1000 B does not match t.0.et node 1 collective 'ar'"), err


def test_a_trace_without_collectives_does_not_keep_an_older_traces_groups(tmp_path):
    """``write_chakra`` into a folder holding an older trace's ``comm_group.json`` left it there, and the new
    trace (with no collectives of its own) was then read with the old groups."""
    from workloads.chakra import read_chakra, write_chakra

    folder = tmp_path / "trace"
    with_groups = OpGraph(4)
    with_groups.collective("all_reduce", (0, 1, 2, 3), 1e6)
    write_chakra(with_groups, folder)
    assert (folder / "clustersim.comm_group.json").exists()
    for rank in (2, 3):
        (folder / f"clustersim.{rank}.et").unlink()
    sends = OpGraph(2)
    sends.send(0, 1, 1e6)
    sends.recv(1, 0, 1e6)
    write_chakra(sends, folder)
    assert not (folder / "clustersim.comm_group.json").exists()
    assert len(read_chakra(folder).ops) == 2


def test_a_newer_schemas_node_type_is_named(tmp_path):
    """mlcommons/chakra's et_def.proto (6dc63e1) added STORAGE_NODE = 8, BATCH_NODE = 9, CHECKPOINT_NODE = 10;
    a trace with one read "unknown node type 8"."""
    from workloads.chakra import ChakraError, read_chakra

    tc = _chakra_helpers()
    folder = tc.write_trace(tmp_path / "trace", [[tc.node(0, tc.COMP, "gemm", duration_us=10),
                                                   tc.node(1, 8, "ckpt_read", deps=[0])]])
    with pytest.raises(ChakraError, match=r"t\.0\.et: node 1 \('ckpt_read'\) is a STORAGE_NODE \(node type 8, "
                                          r"from a newer Chakra schema\), which clustersim does not model"):
        read_chakra(folder)


# ------------------------------------------------------------------ the Python API (a hunt's findings)
def test_flags_take_true_or_false_only(tmp_path):
    """``force="no"`` is truthy: it skipped the out-of-memory check; a flag is True or False."""
    from simulator import sweep
    from simulator.experiment import DEMO_EXPERIMENT

    exp = experiment_from_dict(DEMO_EXPERIMENT)
    with pytest.raises(ValueError, match="force: must be true or false, got 'no'"):
        run_experiment(exp, force="no")
    with pytest.raises(ValueError, match="progress: must be true or false, got 'no'"):
        sweep(DEMO_EXPERIMENT, {"parallel.tp": [1, 2]}, progress="no")
    with pytest.raises(ValueError, match="counters: must be true or false, got 'no'"):
        run_experiment(exp).to_chrome_trace(tmp_path / "t.json", counters="no")


def test_an_op_graphs_labels_are_integers_checked_when_built():
    """``stage="a"`` was taken and broke ``Result.ops`` after the run (``int('a')``); numpy integers are ints."""
    import numpy as np

    from workloads.ops import OpGraphError

    g = OpGraph(2)
    for field, value in (("stage", "a"), ("micro_batch", None), ("layer", 1.5), ("layer", True)):
        with pytest.raises(OpGraphError, match=f"{field}: must be an integer"):
            g.compute(0, flops=1e9, **{field: value})
    with pytest.raises(OpGraphError, match="stage: must be an integer"):
        g.send(0, 1, 10.0, stage="q")
    with pytest.raises(OpGraphError, match="micro_batch: must be an integer"):
        g.collective("all_reduce", [0, 1], 10.0, micro_batch="m")
    g.compute(0, flops=1e9, layer=np.int64(3))
    assert type(g.ops[-1].layer) is int and g.ops[-1].layer == 3


def test_a_bytes_plot_with_no_link_bytes_says_so():
    import matplotlib

    matplotlib.use("Agg")
    from simulator import simulate
    from topologies import single_server

    g = OpGraph(2)
    g.compute(0, flops=1e12)
    with pytest.raises(ValueError, match="no link carried bytes, nothing to draw"):
        simulate(g, single_server("H100", 2)).plot_bytes_by_class_and_tier()


def test_the_collective_benchmark_functions_check_their_arguments():
    """Called from Python: a zero size divided by zero, a string rank count compared with an int, an unknown
    op's bus factor read 1.0."""
    from simulator.bench import bus_factor, collective_sweep, collective_time
    from topologies import single_server

    cluster = single_server("H100", 8)
    with pytest.raises(ValueError, match="sizes: each must be a number of bytes > 0, got 0"):
        collective_sweep(cluster, "all_reduce", 8, [0])
    with pytest.raises(ValueError, match="sizes: must be a list"):
        collective_sweep(cluster, "all_reduce", 8, 1024)
    with pytest.raises(ValueError, match="gpus: need 2..8 for this cluster, got '4'"):
        collective_time(cluster, "all_reduce", "4", 2**20)
    with pytest.raises(TypeError, match="cluster: must be a Cluster"):
        collective_time(None, "all_reduce", 8, 1)
    with pytest.raises(ValueError, match="op: 'bogus' unknown"):
        bus_factor("bogus", 8)
    with pytest.raises(ValueError, match="n: must be a number of ranks >= 1"):
        bus_factor("all_reduce", 0)
    assert bus_factor("all_reduce", 8) == 2 * 7 / 8  # nccl-tests' PERFORMANCE.md


def test_write_chakra_names_a_wrong_argument(tmp_path):
    from workloads.chakra import write_chakra

    g = OpGraph(2)
    g.compute(0, flops=1e9)
    with pytest.raises(TypeError, match="graph: must be an OpGraph"):
        write_chakra("not a graph", tmp_path)
    with pytest.raises(TypeError, match="compute: must have a duration"):
        write_chakra(g, tmp_path, compute={})
    with pytest.raises(TypeError, match="folder: must be a path"):
        write_chakra(g, None)


def test_the_plotting_functions_name_a_wrong_frame():
    """The notebook's ``simulator.plotting`` functions given the Result for its frame, or another frame, failed
    inside (AttributeError, KeyError); ``bins`` was unbounded (a links x bins grid of floats)."""
    import matplotlib

    matplotlib.use("Agg")
    from simulator import plotting
    from simulator.experiment import DEMO_EXPERIMENT

    r = run_experiment(experiment_from_dict(DEMO_EXPERIMENT))
    with pytest.raises(TypeError, match="bars: must be result.timeline"):
        plotting.plot_timeline(r)
    with pytest.raises(ValueError, match="tiers: has no column 'time_s'; pass result.tier_timeseries"):
        plotting.plot_tier_bandwidth(r.links)
    with pytest.raises(ValueError, match="series: has no column 'link'"):
        plotting.plot_link_heatmap(r.ops)
    with pytest.raises(ValueError, match="matrix: must be a square frame of bytes"):
        plotting.plot_traffic_matrix(r.links)
    with pytest.raises(ValueError, match="stages: has no column 'busy_s'"):
        plotting.plot_stages(r.ops)
    with pytest.raises(ValueError, match="bins: at most 100,000 time windows"):
        plotting.plot_link_heatmap(r.link_timeseries(), bins=10**7)
    with pytest.raises(ValueError, match="end_s: must be a time in seconds > 0"):
        plotting.plot_link_heatmap(r.link_timeseries(), end_s=-1)
    plotting.plot_link_heatmap(r.link_timeseries(), bins=10)  # (the right frames still draw)
    plotting.plot_traffic_matrix(r.traffic_matrix("node"))


def test_a_sweeps_output_in_a_missing_folder_is_named(tmp_path):
    """From Python, a missing folder was reported as its hidden lock file (``.x.csv.lock``) not found."""
    from simulator import sweep
    from simulator.experiment import DEMO_EXPERIMENT

    with pytest.raises(ValueError, match="output: folder '.*missing' does not exist"):
        sweep(DEMO_EXPERIMENT, {"parallel.tp": [1, 2]}, output=tmp_path / "missing" / "x.csv", progress=False)
    with pytest.raises(ValueError, match="output: must be a file path ending in .csv or .parquet, got 3"):
        sweep(DEMO_EXPERIMENT, {"parallel.tp": [1, 2]}, output=3, progress=False)


def test_helpers_name_a_wrong_argument():
    """``unused_settings`` given the file's dict failed with an AttributeError and took any fidelity;
    ``apply_faults`` given one fault (a dict) iterated its keys ("faults[0] ... got 'kind'")."""
    from simulator.experiment import DEMO_EXPERIMENT, unused_settings
    from topologies import TopologyError, build_cluster
    from topologies.faults import apply_faults

    with pytest.raises(TypeError, match="exp: must be an Experiment"):
        unused_settings(dict(DEMO_EXPERIMENT))
    with pytest.raises(ValueError, match="fidelity: 'bogus' unknown"):
        unused_settings(experiment_from_dict(DEMO_EXPERIMENT), "bogus")
    cluster = build_cluster({"preset": "dgx-h100", "nodes": 2})
    with pytest.raises(TopologyError, match="faults: must be a list of faults"):
        apply_faults(cluster, {"kind": "switch_down", "switch": "leaf:0"})
    with pytest.raises(TopologyError, match="faults: must be a list of faults"):
        apply_faults(cluster, None)
