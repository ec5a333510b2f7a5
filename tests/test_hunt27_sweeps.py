"""Sweeps and multi-job runs as a capacity planner relies on them (hunt 27): every row is the run of its point."""

from __future__ import annotations

import copy

import pytest

from simulator.experiment import DEMO_EXPERIMENT, experiment_from_dict, run_experiment
from simulator.sweeps import sweep

DEMO = DEMO_EXPERIMENT  # (the built-in demo: read only, copied where changed)
CLUSTER = {"preset": "dgx-h100", "nodes": 2, "nodes_per_leaf": 1}


def _run_step(oversubscription: float) -> float:
    """The step time `clustersim run` gives the demo on two one-node leaves at ``oversubscription``."""
    doc = copy.deepcopy(DEMO)
    doc["cluster"] = {**CLUSTER, "oversubscription": oversubscription}
    return run_experiment(experiment_from_dict(doc)).step_time


@pytest.mark.parametrize("order", ["field_first", "section_first"])
def test_a_field_and_its_whole_section_in_one_grid_run_the_labelled_point(order):
    # Before: apply_overrides set the grid's section dict itself into each point's document and then set the
    # field inside it, so every point shared (and mutated) one dict: with the section first both rows ran at
    # the last oversubscription (4) and the row labelled 1 showed 4's step; with the field first, the whole
    # section set after it replaced the field, so the row labelled 4 ran at 1.
    section = dict(CLUSTER)
    grid = ({"cluster.oversubscription": [1, 4], "cluster": [section]} if order == "field_first"
            else {"cluster": [section], "cluster.oversubscription": [1, 4]})
    df = sweep(DEMO, grid, jobs=1, progress=False)
    assert section == CLUSTER  # the caller's grid value is not modified
    by_os = dict(zip(df["cluster.oversubscription"], df["step_time_s"]))
    for os_ in (1, 4):
        assert by_os[os_] == pytest.approx(_run_step(os_), rel=1e-9)
    assert by_os[4] > by_os[1] * 1.05  # (4:1 uplinks slow this step by ~18%: the rows are not one point)
    assert set(df["cluster"]) == {"{nodes: 2, nodes_per_leaf: 1, preset: dgx-h100}"}


MOE = {
    "name": "small moe",
    "cluster": {"preset": "dgx-h100", "nodes": 2},
    "model": {"preset": "mixtral-8x7b", "layers": 4},
    "parallel": {"tp": 2, "pp": 1, "dp": 8, "ep": 8, "micro_batch": 1, "global_batch": 16, "zero": 1,
                 "sequence_parallel": True},
    "training": {"seq_len": 1024},
    "moe": {"routing": "zipf", "zipf_s": 0.5, "seed": 0, "capacity_factor": 1.25},
}


def test_cli_grid_sweeps_null_as_the_sweep_section_does(tmp_path, capsys):
    # Before: --grid moe.capacity_factor=null,1.25 failed with "empty value in the list", though null is the
    # documented value of a dropless MoE (capacity_factor: null) and a sweep: grid's [null, 1.25] ran it.
    import yaml

    from simulator.cli import main
    from simulator.sweeps import parse_grid_arg, read_table

    assert parse_grid_arg("moe.capacity_factor=null,1.25") == ("moe.capacity_factor", [None, 1.25])
    base = tmp_path / "moe.yaml"
    base.write_text(yaml.safe_dump(MOE))
    out = tmp_path / "out.csv"
    assert main(["sweep", str(base), "--grid", "moe.capacity_factor=null,1.25", "-o", str(out), "--jobs", "1",
                 "--no-progress", "--top", "0"]) == 0
    df = read_table(out)
    assert list(df["status"]) == ["ok", "ok"]
    dropless = df[df["moe.capacity_factor"].isna()]["step_time_s"].item()
    truth = run_experiment(experiment_from_dict({**MOE, "moe": {**MOE["moe"], "capacity_factor": None}}))
    assert dropless == pytest.approx(truth.step_time, rel=1e-9)


@pytest.mark.parametrize("metric", ["exposed_tp_s", "exposed_dp_s", "bytes_spine", "bytes_nvlink"])
def test_batch_note_covers_every_per_step_metric(metric):
    # Before: only step_time_s and exposed_comm_s got the note; a class's exposed seconds or a tier's bytes
    # (parts of one step, as exposed_comm_s is their sum) ranked a 32k-token step against a 64k-token one
    # silently.
    import pandas as pd

    from simulator.sweeps import batch_note

    df = pd.DataFrame({"status": ["ok", "ok"], "step_time_s": [1.0, 2.0], "tokens_per_s": [32768.0, 32768.0],
                       metric: [1.0, 2.0]})
    note = batch_note(df, metric)
    assert note is not None and metric in note and "32,768 to 65,536 tokens" in note
    assert batch_note(df, "tokens_per_s") is None and batch_note(df, "memory_per_gpu_bytes") is None
    same = df.assign(tokens_per_s=[32768.0, 16384.0])  # every step 32,768 tokens: nothing to say
    assert batch_note(same, metric) is None


def test_node_held_twice_names_the_holder_by_its_job_name():
    # Before: "node 1 is already held by job '0'": an unnamed job is job0 everywhere else (its table row,
    # the errors naming it), and no job is called '0'.
    from simulator.jobs import jobs_from_dict

    job = {"model": {"preset": "gpt2-small"}, "parallel": {"tp": 2, "pp": 1, "micro_batch": 4, "global_batch": 64},
           "training": {"seq_len": 1024}}
    doc = {"cluster": {"preset": "dgx-h100", "nodes": 4}, "jobs": [{"nodes": [0, 1], **job}, {"nodes": [1, 2], **job}]}
    with pytest.raises(ValueError, match=r"jobs\[1\]\.nodes: node 1 is already held by job 'job0'$"):
        jobs_from_dict(doc)
    doc["jobs"][0]["name"] = "train"
    with pytest.raises(ValueError, match=r"already held by job 'train'$"):
        jobs_from_dict(doc)


def test_screen_in_one_process_sees_a_topology_file_edited_since(tmp_path):
    # Before: screened points built their cluster once per process per cluster: section, so a notebook that
    # screened a custom fabric, then edited its file (the one spine cable 800 -> 200 Gb/s) and screened again,
    # got the old fabric's step times, cost and bisection, under the new points' keys (kept on resume).
    import shutil
    from pathlib import Path

    from simulator.sweeps import worker
    from topologies import build_cluster
    from topologies.bisection import bisection_bandwidth

    root = Path(__file__).resolve().parents[1] / "examples"
    shutil.copy(root / "custom-fabric.yaml", tmp_path / "custom-fabric.yaml")
    shutil.copytree(root / "fabrics", tmp_path / "fabrics")
    fabric = tmp_path / "fabrics" / "two-racks.yaml"
    base, grid = str(tmp_path / "custom-fabric.yaml"), {"parallel.tp": [1, 2]}
    before = sweep(base, grid, jobs=1, progress=False, fidelity="screen").set_index("parallel.tp")
    text = fabric.read_text()
    assert text.count("bandwidth: 800Gbps") == 1
    fabric.write_text(text.replace("bandwidth: 800Gbps", "bandwidth: 200Gbps"))
    after = sweep(base, grid, jobs=1, progress=False, fidelity="screen").set_index("parallel.tp")
    truth = bisection_bandwidth(build_cluster({"topology": str(fabric)}))
    assert truth < before["bisection_bytes_s"].iloc[0]
    assert list(after["bisection_bytes_s"]) == pytest.approx([truth] * 2)
    worker._CLUSTERS.clear()  # a fresh process's screen of the edited fabric
    fresh = sweep(base, grid, jobs=1, progress=False, fidelity="screen").set_index("parallel.tp")
    for tp in (1, 2):
        assert after.loc[tp, "step_time_s"] == pytest.approx(fresh.loc[tp, "step_time_s"], rel=1e-12)
        assert after.loc[tp, "fabric_cost_usd"] == fresh.loc[tp, "fabric_cost_usd"]
        assert after.loc[tp, "step_time_s"] > before.loc[tp, "step_time_s"] * 1.2
