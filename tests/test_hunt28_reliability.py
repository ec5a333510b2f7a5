"""Five reliability defects (hunt 3): a Chakra BARRIER that took no time, ``--export-chakra`` / ``--plots``
refusing a folder whose parent is missing (the API creates it), a grid's fidelity silently winning over
``--fidelity``/``--refine``, a derived dp shown as ``auto`` (or not at all) in a sweep's table, and the README's
``slowdown_bound`` dividing by the link rate where the code divides by the usable rate."""

from __future__ import annotations

import copy
import time
from pathlib import Path

import numpy as np
import pytest
from test_cli_run import one_line_error

from simulator import simulate
from simulator.cli import main
from simulator.experiment import DEMO_EXPERIMENT
from simulator.sweeps import sweep

ROOT = Path(__file__).resolve().parents[1]
DEMO_YAML = str(ROOT / "examples" / "demo.yaml")
BARRIER = 9  # CollectiveCommType value of BARRIER (et_def.proto)




# ------------------------------------------------------------------ 1. zero-byte collectives
@pytest.fixture
def chakra():
    pytest.importorskip("google.protobuf")
    import test_chakra
    return test_chakra


def _trace_time(tmp_path, chakra, comm_type, size, ranks, cluster, network=None):
    folder = tmp_path / f"t{comm_type}_{size}_{ranks}"
    chakra.write_trace(folder, [[chakra.coll(1, comm_type, size)] for _ in range(ranks)])
    from workloads.chakra import read_chakra
    graph = read_chakra(folder)
    return graph, simulate(graph, cluster, network=network).step_time


def test_a_barrier_pays_the_latency_of_a_one_element_all_reduce(tmp_path, chakra, node8):
    # Before: BARRIER read as a 0-byte all-reduce, which plans no phase and completes at once (0 us). On NCCL,
    # torch.distributed.barrier all-reduces one float32 (ProcessGroupNCCL::barrier): 4 bytes, a ring's 2(n-1)
    # steps of latency. Closed form on one NVSwitch server under the uniform latency model, as test_chakra's.
    graph, t = _trace_time(tmp_path, chakra, BARRIER, 0, 4, node8, chakra.IDEAL)
    assert {(op.collective, op.nbytes) for op in graph.ops} == {("all_reduce", 4.0)}
    edges = node8.graph.edges
    alpha = (chakra.STEP + edges[("gpu", 0, 0), ("nvswitch", 0)]["latency"]
             + edges[("nvswitch", 0), ("gpu", 0, 1)]["latency"])
    n, B = 4, node8.gpu.nvlink_bandwidth
    assert t == pytest.approx(2 * (n - 1) * alpha + 2 * (n - 1) / n * 4 / B, rel=1e-9)
    # Under NCCL's latency model (the default) it is exactly a traced 4-byte all-reduce, micro-seconds long.
    _, nccl = _trace_time(tmp_path, chakra, BARRIER, 0, 4, node8)
    _, four = _trace_time(tmp_path, chakra, chakra.ALL_REDUCE, 4, 4, node8)
    assert nccl == four and 1e-6 < nccl < 1e-4


def test_zero_byte_collectives_and_one_rank_barriers_stay_free(tmp_path, chakra, node8):
    # Kept on purpose: NCCL discards a collective of count 0 before launching anything (taskAppend: "Empty
    # collectives can be discarded"), and a one-rank group moves nothing.
    assert _trace_time(tmp_path, chakra, chakra.ALL_REDUCE, 0, 4, node8)[1] == 0.0
    assert _trace_time(tmp_path, chakra, BARRIER, 0, 1, node8)[1] == 0.0


# ------------------------------------------------------------------ 2. output folders with missing parents
def test_export_chakra_and_plots_create_missing_parent_folders_as_the_api_does(tmp_path, capsys):
    # Before: "--export-chakra: folder '.../a' does not exist" (exit 2), though write_chakra (and save_plots for
    # --plots) create the folder with its parents.
    pytest.importorskip("google.protobuf")
    chakra_dir, plots_dir = tmp_path / "a" / "b" / "trace", tmp_path / "c" / "d" / "plots"
    assert main(["run", DEMO_YAML, "--no-progress", "--export-chakra", str(chakra_dir),
                 "--plots", str(plots_dir)]) == 0
    capsys.readouterr()
    assert len(list(chakra_dir.glob("clustersim.*.et"))) == 16
    assert list(plots_dir.glob("*.png"))
    # A regular file on the way is still refused in one line, before any work.
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    t0 = time.perf_counter()
    assert main(["run", DEMO_YAML, "--no-progress", "--export-chakra", str(a_file / "sub" / "deeper")]) == 2
    assert time.perf_counter() - t0 < 1.0
    line = one_line_error(capsys.readouterr().err)
    assert "--export-chakra" in line and "is a file, not a folder" in line and str(a_file) in line


# ------------------------------------------------------------------ 3. a grid's fidelity and --fidelity/--refine
@pytest.mark.parametrize("extra, flag", [
    (["--fidelity", "screen", "--refine", "1"], "--fidelity"),
    (["--fidelity", "full"], "--fidelity"),
    (["--refine", "1"], "--refine"),
])
def test_a_grid_over_fidelity_with_fidelity_or_refine_isone_line_error(capsys, extra, flag):
    # Before: every point ran at the grid's fidelity (fast, full), "refining" rows that were never screened, exit 0.
    t0 = time.perf_counter()
    assert main(["sweep", DEMO_YAML, "--grid", "parallel.micro_batch=1,2", "--grid", "fidelity=fast,full",
                 "--no-progress", "--jobs", "1", *extra]) == 2
    assert time.perf_counter() - t0 < 2.0  # refused before any point runs
    line = one_line_error(capsys.readouterr().err)
    assert line.startswith(f"clustersim: error: {flag}:") and "--grid fidelity=fast,full" in line, line


def test_the_api_refuses_a_grid_over_fidelity_with_fidelity_or_refine():
    grid = {"parallel.micro_batch": [1, 2], "fidelity": ["fast", "full"]}
    with pytest.raises(ValueError, match=r"^fidelity: 'screen' given, but the grid sweeps fidelity \(fast, full\)"):
        sweep(DEMO_EXPERIMENT, grid, fidelity="screen", refine=1, jobs=1, progress=False)
    screened = {**copy.deepcopy(DEMO_EXPERIMENT), "fidelity": "screen"}  # (the file's fidelity: the grid's wins)
    with pytest.raises(ValueError, match=r"^refine: .*the grid sweeps fidelity \(fast, full\)"):
        sweep(screened, grid, refine=1, jobs=1, progress=False)


# ------------------------------------------------------------------ 4. a derived dp in the table
def _auto_dp_doc():
    doc = copy.deepcopy(DEMO_EXPERIMENT)
    doc["parallel"]["dp"] = "auto"
    return doc


@pytest.mark.parametrize("grid, expected", [
    # Before: no dp column at all (the dp that changed with the node count was not shown) ...
    ({"cluster.nodes": [1, 2]}, {1: 2, 2: 4}),
    ({"parallel.cp": [1, 2]}, {1: 4, 2: 2}),
    # ... and "auto" where the grid listed it.
    ({"cluster.nodes": [1, 2], "parallel.dp": ["auto"]}, {1: 2, 2: 4}),
], ids=["nodes", "cp", "grid-dp-auto"])
def test_a_derived_dp_shows_as_the_integer_it_resolved_to(grid, expected):
    df = sweep(_auto_dp_doc(), grid, jobs=1, progress=False, fidelity="screen" if "parallel.cp" not in grid
               else None)
    key = next(iter(grid))
    assert (df["status"] == "ok").all()
    assert dict(zip(df[key], df["parallel.dp"])) == expected
    assert all(isinstance(v, (int, np.integer)) for v in df["parallel.dp"])
    columns = list(df.columns)
    assert columns.index("parallel.dp") == columns.index(key) + 1 or "parallel.dp" in grid


def test_an_explicit_dp_beside_auto_keeps_its_own_value():
    df = sweep(_auto_dp_doc(), {"cluster.nodes": [1, 2], "parallel.dp": ["auto", 2]}, jobs=1, progress=False,
               fidelity="screen")
    rows = {(n, s): dp for n, s, dp in zip(df["cluster.nodes"], df["status"], df["parallel.dp"])}
    # nodes 1: auto -> 2 and 2 -> 2 (ok); nodes 2: auto -> 4 (ok), an explicit 2 is invalid and still reads 2
    assert sorted(rows.items()) == [((1, "ok"), 2), ((2, "invalid"), 2), ((2, "ok"), 4)]


def test_a_resumed_sweep_keeps_the_resolved_dp(tmp_path):
    # (reused rows take this sweep's parameter values: the grid's "auto" must not overwrite the dp they resolved)
    grid, out = {"cluster.nodes": [1, 2], "parallel.dp": ["auto"]}, tmp_path / "s.csv"
    first = sweep(_auto_dp_doc(), grid, jobs=1, progress=False, fidelity="screen", output=out)
    again = sweep(_auto_dp_doc(), grid, jobs=1, progress=False, fidelity="screen", output=out)
    assert dict(zip(again["cluster.nodes"], again["parallel.dp"])) == {1: 2, 2: 4}
    assert again["step_time_s"].tolist() == first["step_time_s"].tolist()


def test_a_sweep_that_does_not_change_dp_gets_no_dp_column():
    df = sweep(_auto_dp_doc(), {"parallel.micro_batch": [1, 2]}, jobs=1, progress=False, fidelity="screen")
    assert "parallel.dp" not in df.columns


# ------------------------------------------------------------------ 5. slowdown_bound's definition
def test_slowdown_bound_divides_by_the_usable_rate_as_the_readme_says():
    from simulator.jobs import jobs_from_dict, run_jobs

    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "/ (link rate) /" not in readme  # (before: the link rate)
    assert "/ (the link's usable rate) / (its time alone)" in readme
    assert "times its tier's `network.bandwidth_efficiency`" in readme
    small = {"model": {"preset": "gpt2-small", "layers": 2}, "training": {"seq_len": 512}}
    doc = {"cluster": {"preset": "dgx-h100", "nodes": 4, "nodes_per_leaf": 2, "spines": 2},
           "network": {"bandwidth_efficiency": 0.5},  # (every tier at half its rate)
           "jobs": [{"name": n, "nodes": nodes, **copy.deepcopy(small),  # (both jobs on both leaves)
                     "parallel": {"tp": 4, "micro_batch": 2, "global_batch": 8}}
                    for n, nodes in (("a", [0, 2]), ("b", [1, 3]))]}
    result = run_jobs(jobs_from_dict(doc))
    links = result.shared_links
    assert len(links)
    for row in result.jobs.itertuples():
        others = sum(links[f"bytes_{o}"] for o in ("a", "b") if o != row.job)
        alone = row.alone_step_time_s * row.steps
        usable = 1 + float((others / (links["capacity_Bps"] * 0.5)).sum()) / alone
        assert row.slowdown_bound == pytest.approx(usable, rel=1e-12)
        assert row.slowdown_bound != pytest.approx(1 + float((others / links["capacity_Bps"]).sum()) / alone)


# (review, hunt 6) a grid of whole parallel sections that leave dp out derives it per point
def test_a_grid_of_parallel_sections_without_dp_shows_each_resolved_dp():
    sections = [{"tp": tp, "pp": 2, "micro_batch": 4, "global_batch": 64, "sequence_parallel": True}
                for tp in (2, 4)]
    doc = _auto_dp_doc()
    doc["parallel"]["dp"] = 4  # (the base's own dp: the sections replace it, leaving dp to be derived)
    df = sweep(doc, {"parallel": sections}, jobs=1, progress=False, fidelity="screen")
    assert (df["status"] == "ok").all()
    assert sorted(df["parallel.dp"].tolist()) == [2, 4]  # 16 GPUs / (tp x pp 2)


def test_a_one_stage_layout_names_no_pipeline_schedule():
    # With pp 1 there is no pipeline: the micro-batches accumulate gradients one after another, whatever
    # parallel.schedule says (the summary read "1f1b" for OPT's FSDP + TP 8 layout).
    from simulator.experiment import describe_setup, experiment_from_dict
    doc = {"cluster": {"preset": "dgx-h100", "nodes": 1}, "model": {"preset": "gpt2-small"},
           "parallel": {"tp": 2, "dp": 4, "global_batch": 8}, "training": {"seq_len": 128}}
    assert describe_setup(experiment_from_dict(doc))["layout"].startswith(
        "TP 2 x PP 1 x DP 4, micro-batch 1 x 2 per pipeline")
    doc["parallel"] = {"tp": 2, "pp": 2, "dp": 2, "global_batch": 8}
    assert ", 1f1b, " in describe_setup(experiment_from_dict(doc))["layout"]
