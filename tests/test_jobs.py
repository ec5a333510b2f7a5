"""Many jobs on one fabric: placement, independence, conservation and the slowdown bound.

Truth: a job alone on its nodes is the same run as the single-job experiment on a cluster of those nodes
(independent code path: ``run_experiment``); jobs that share no link cannot slow each other (max-min
sharing only couples flows through common links); every wire byte on the fabric belongs to exactly one job;
and a job's slowdown is at least 1 and at most what the other jobs' bytes on its links can hold it back
(issue 16's acceptance).
"""

import copy
import subprocess
import sys

import numpy as np
import pytest

from simulator.experiment import experiment_from_dict, run_experiment
from simulator.jobs import jobs_from_dict, run_jobs
from workloads.errors import ConfigError
from workloads.ops import OpGraph, merge_graphs

SMALL = {"model": {"preset": "gpt2-small", "layers": 4}, "training": {"seq_len": 512}}


def job(name, nodes, **parallel):
    return {"name": name, "nodes": nodes, **copy.deepcopy(SMALL),
            "parallel": {"micro_batch": 2, "global_batch": 32, **parallel}}


def two_jobs(placement="scattered", oversubscription=2, seed=0):
    # 4 leaves of 2 DGX-H100 nodes, 2 spines.
    return {"cluster": {"preset": "dgx-h100", "nodes": 8, "nodes_per_leaf": 2, "spines": 2,
                        "oversubscription": oversubscription},
            "placement": placement, "placement_seed": seed,
            "jobs": [job("a", 4, tp=4), job("b", 4, tp=2, pp=2)]}


@pytest.fixture(scope="module")
def shared_run():
    return run_jobs(jobs_from_dict(two_jobs()))


def test_two_jobs_on_a_2_to_1_fabric_slow_down_within_the_shared_link_bound(shared_run):
    jobs = shared_run.jobs
    assert len(shared_run.shared_links) > 0  # scattered: the jobs meet on the uplinks
    assert (jobs["slowdown"] >= 1 - 1e-9).all()
    assert (jobs["slowdown"] <= jobs["slowdown_bound"]).all()
    assert (jobs["slowdown"] > 1 + 1e-6).any()  # and it costs one of them something


def test_every_wire_byte_belongs_to_exactly_one_job(shared_run):
    from simulator.jobs import _link_bytes_by_job
    record = shared_run.together.record
    sizes = shared_run.jobs["gpus"].tolist()
    offsets = shared_run.jobs["rank_offset"].tolist()
    by_job = _link_bytes_by_job(record, offsets, sizes)
    np.testing.assert_allclose(by_job.sum(axis=0), record.fabric.network.ledger.bytes, rtol=1e-12)
    shared = shared_run.shared_links
    for name in ("a", "b"):
        assert (shared[f"bytes_{name}"] > 0).all()


def test_jobs_on_their_own_leaves_share_no_link_and_do_not_slow_each_other():
    result = run_jobs(jobs_from_dict(two_jobs("contiguous")))
    assert len(result.shared_links) == 0
    assert result.jobs["slowdown"].tolist() == pytest.approx([1.0, 1.0], rel=1e-12)


def test_a_job_alone_is_the_single_job_experiment_on_its_nodes():
    spec = jobs_from_dict({"cluster": {"preset": "dgx-h100", "nodes": 4, "nodes_per_leaf": 2, "spines": 2},
                           "placement": "contiguous", "steps": 1, "jobs": [job("a", 2, tp=4), job("b", 2, tp=2)]})
    result = run_jobs(spec)
    for name, tp in (("a", 4), ("b", 2)):
        exp = experiment_from_dict({**SMALL, "cluster": {"preset": "dgx-h100", "nodes": 2},
                                    "parallel": {"tp": tp, "micro_batch": 2, "global_batch": 32}})
        alone = run_experiment(exp).step_time
        row = result.jobs.set_index("job").loc[name]
        assert row["alone_step_time_s"] == pytest.approx(alone, rel=1e-12)
        assert row["step_time_s"] == pytest.approx(alone, rel=1e-12)  # own leaf, no shared link


def test_each_job_keeps_its_own_compute_model():
    slow = job("slow", 2, tp=4)
    slow["compute"] = {"matmul_efficiency": 0.4}
    spec = jobs_from_dict({"cluster": {"preset": "dgx-h100", "nodes": 4, "nodes_per_leaf": 2, "spines": 2},
                           "placement": "contiguous", "steps": 1, "jobs": [job("fast", 2, tp=4), slow]})
    rows = run_jobs(spec).jobs.set_index("job")
    exp = experiment_from_dict({**SMALL, "cluster": {"preset": "dgx-h100", "nodes": 2},
                                "compute": {"matmul_efficiency": 0.4},
                                "parallel": {"tp": 4, "micro_batch": 2, "global_batch": 32}})
    assert rows.loc["slow", "step_time_s"] == pytest.approx(run_experiment(exp).step_time, rel=1e-12)
    assert rows.loc["slow", "step_time_s"] > rows.loc["fast", "step_time_s"]


def test_auto_steps_cover_the_longest_job_and_times_are_per_step():
    doc = two_jobs("contiguous")
    doc["jobs"][0] = job("short", 4, tp=4)
    doc["jobs"][1] = {**job("long", 4, tp=4), "model": {"preset": "gpt2-small", "layers": 12}}
    rows = run_jobs(jobs_from_dict(doc)).jobs.set_index("job")
    assert rows.loc["long", "steps"] == 1
    ratio = rows.loc["long", "alone_step_time_s"] / rows.loc["short", "alone_step_time_s"]
    assert rows.loc["short", "steps"] == max(1, round(ratio))
    assert rows.loc["short", "steps"] >= 2
    # Consecutive identical steps alone: per-step time within 1% of one step's.
    single = run_jobs(jobs_from_dict({**doc, "steps": 1})).jobs.set_index("job")
    assert rows.loc["short", "alone_step_time_s"] == pytest.approx(single.loc["short", "alone_step_time_s"],
                                                                   rel=0.01)


# ------------------------------------------------------------------ placement
def test_placements():
    spec = jobs_from_dict(two_jobs("contiguous"))
    assert [j.nodes for j in spec.jobs] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    a = jobs_from_dict(two_jobs("scattered", seed=3))
    b = jobs_from_dict(two_jobs("scattered", seed=3))
    assert [j.nodes for j in a.jobs] == [j.nodes for j in b.jobs]  # deterministic
    assert sorted(n for j in a.jobs for n in j.nodes) == list(range(8))
    doc = two_jobs()
    doc["jobs"][0]["nodes"] = [7, 5, 3, 1]
    spec = jobs_from_dict(doc)
    assert spec.jobs[0].nodes == (7, 5, 3, 1)
    assert sorted(spec.jobs[1].nodes) == [0, 2, 4, 6]
    # Rank order follows the listed nodes.
    assert spec.jobs[0].experiment.cluster.gpus[0] == ("gpu", 7, 0)


@pytest.mark.parametrize("change,message", [
    (lambda d: d["jobs"][1].update(nodes=5), "the jobs need 9 nodes but the cluster has 8"),
    (lambda d: d["jobs"][0].update(nodes=[0, 0]), r"jobs\[0\].nodes: node 0 is listed twice; each node once"),
    (lambda d: (d["jobs"][0].update(nodes=[0, 1]), d["jobs"][1].update(nodes=[1, 2])),
     r"jobs\[1\].nodes: node 1 is already held by job 'a'"),
    (lambda d: d["jobs"][0].update(nodes=[9]), r"jobs\[0\].nodes: 9 is not a node index in 0..7"),
    (lambda d: d["jobs"][0].update(nodes=0), r"jobs\[0\].nodes: must be a positive integer"),
    (lambda d: d["jobs"][1].update(name="a"), r"jobs\[1\].name: 'a' is used twice"),
    (lambda d: d["jobs"][0].update(cluster={}), r"jobs\[0\].cluster: unknown field"),
    (lambda d: d.update(placement="random"), "placement: 'random' unknown; valid: contiguous, scattered"),
    (lambda d: d.update(steps=0), "steps: must be a positive integer"),
    (lambda d: d.update(jobs=[]), "jobs: must be a non-empty list"),
    (lambda d: d.update(faults=[]), "faults: unknown section of a jobs file"),
    (lambda d: d["jobs"][0]["parallel"].update(tp=5), r"jobs\[0\] \(a\): parallel.dp: cannot derive dp"),
])
def test_bad_jobs_files_get_one_line_errors(change, message):
    doc = two_jobs()
    change(doc)
    with pytest.raises(ConfigError, match=message):
        jobs_from_dict(doc)


def test_a_jobs_file_given_to_run_says_which_command_runs_it():
    with pytest.raises(ConfigError, match="clustersim jobs FILE"):
        experiment_from_dict(two_jobs())


def test_cli_jobs(tmp_path):
    import yaml
    path = tmp_path / "jobs.yaml"
    path.write_text(yaml.safe_dump(two_jobs()))
    out = subprocess.run([sys.executable, "-m", "simulator.cli", "jobs", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "slowdown" in out.stdout and "links used by several jobs" in out.stdout
    bad = two_jobs()
    bad["jobs"][0]["nodes"] = 99
    path.write_text(yaml.safe_dump(bad))
    out = subprocess.run([sys.executable, "-m", "simulator.cli", "jobs", str(path)], capture_output=True, text=True)
    assert out.returncode == 2 and "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1


# ------------------------------------------------------------------ merging op graphs
def test_merge_graphs_shifts_ranks_ids_groups_and_peers():
    g = OpGraph(2)
    a = g.compute(0, flops=1.0)
    g.send(0, 1, 10.0, deps=[a], traffic_class="pp")
    g.recv(1, 0, 10.0, traffic_class="pp")
    g.collective("all_reduce", [0, 1], 8.0)
    m = merge_graphs([(g, 0), (g, 2), (g, 2)])
    assert m.world_size == 4 and len(m.ops) == 3 * len(g.ops)
    assert [op.id for op in m.ops] == list(range(len(m.ops)))
    second = m.ops[len(g.ops):2 * len(g.ops)]
    assert [op.rank for op in second] == [op.rank + 2 for op in g.ops]
    assert second[1].peer == 3 and second[1].deps == (second[0].id,)
    assert {op.group for op in second if op.kind == "collective"} == {(2, 3)}


@pytest.mark.parametrize("placement", ["scattered", "contiguous"])
def test_a_negative_placement_seed_is_refused_naming_it(placement):
    # scattered fell on numpy's "expected non-negative integer"; contiguous took it silently
    with pytest.raises(ValueError, match=r"^placement_seed: must be an integer >= 0, got -1$"):
        jobs_from_dict(two_jobs(placement, seed=-1))
