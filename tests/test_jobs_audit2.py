"""A helper's hunt over ``clustersim jobs`` (2026-12-04): a short job that stops before the joint run is half
through is said, not hidden behind slowdowns of 1.000; the notes ``run`` prints for one experiment are printed
per job; a jobs file that is a list is told the jobs file's sections; a default name that clashes is named as
such."""

from __future__ import annotations

import json

import pytest
import yaml

from simulator.cli import main
from simulator.experiment import run_experiment
from simulator.jobs import MAX_AUTO_STEPS, jobs_from_dict, run_jobs

CLUSTER = {"preset": "dgx-h100", "nodes": 4, "nodes_per_leaf": 2, "spines": 2, "oversubscription": 4}


def _job(name, layers, global_batch, seq_len, **parallel):
    return {"name": name, "nodes": 2, "model": {"preset": "gpt2-small", "layers": layers},
            "parallel": {"tp": 1, "micro_batch": 1, "global_batch": global_batch, **parallel},
            "training": {"seq_len": seq_len}}


def test_a_short_job_that_stops_early_is_noted_with_its_span():
    # tiny's step is far under 1/16 of long's: auto runs it 16 steps, which end a fraction into long's step;
    # long's gradient sync then runs alone and both slowdowns read ~1 (the helper's case read 1.000 and 1.000).
    spec = jobs_from_dict({"cluster": CLUSTER, "placement": "scattered", "jobs": [
        _job("tiny", 1, 16, 128), _job("long", 12, 1024, 1024, micro_batch=4)]})
    result = run_jobs(spec)
    rows = result.jobs.set_index("job")
    assert rows.loc["tiny", "steps"] == MAX_AUTO_STEPS
    assert rows.loc["long", "span"] == 1.0 and rows.loc["tiny", "span"] < 2 / 3
    end_tiny = rows.loc["tiny", "step_time_s"] * MAX_AUTO_STEPS  # when its last step ended, together
    assert rows.loc["tiny", "span"] * rows.loc["long", "step_time_s"] == pytest.approx(end_tiny)
    assert len(result.notes) == 1 and result.notes[0].startswith(
        f"job 'tiny' ({MAX_AUTO_STEPS} steps, the most steps: auto runs) ends at ")
    assert result.summary["notes"] == result.notes


def test_jobs_that_overlap_throughout_get_no_note():
    spec = jobs_from_dict({"cluster": CLUSTER, "placement": "scattered", "jobs": [
        _job("a", 2, 16, 256), _job("b", 2, 16, 256)]})
    result = run_jobs(spec)
    assert result.notes == [] and (result.jobs["span"] > 0.9).all()


def test_cli_jobs_prints_each_jobs_unused_settings(tmp_path, capsys):
    job = _job("a", 2, 16, 256)
    job["moe"] = {"routing": "zipf"}
    job["parallel"]["cp_comm_type"] = "a2a"
    (tmp_path / "j.yaml").write_text(yaml.safe_dump({"cluster": CLUSTER, "jobs": [job, _job("b", 2, 16, 256)]}))
    assert main(["jobs", str(tmp_path / "j.yaml")]) == 0
    err = capsys.readouterr().err
    assert "clustersim: note: job 'a': moe: has no effect: model gpt2-small has no experts" in err
    assert "clustersim: note: job 'a': parallel.cp_comm_type has no effect without context parallelism" in err
    assert "job 'b'" not in err


def test_a_jobs_file_that_is_a_list_is_told_the_jobs_sections(tmp_path, capsys):
    (tmp_path / "l.yaml").write_text("- 1\n- 2\n")
    assert main(["jobs", str(tmp_path / "l.yaml")]) == 2
    err = capsys.readouterr().err
    assert "must hold a mapping of sections (name, cluster, network, fidelity, placement, placement_seed, steps, " \
           "jobs)" in err and "parallel" not in err


def test_a_default_name_taken_by_another_job_is_named_as_a_default(tmp_path, capsys):
    first, second = _job("job1", 2, 16, 256), _job("x", 2, 16, 256)
    del second["name"]  # its default name is job1
    (tmp_path / "d.yaml").write_text(yaml.safe_dump({"cluster": CLUSTER, "jobs": [first, second]}))
    assert main(["jobs", str(tmp_path / "d.yaml")]) == 2
    assert "jobs[1]: its default name 'job1' is another job's name; name this job (name:)" in capsys.readouterr().err


def test_the_joint_runs_breakdown_timeline_and_trace_keep_each_jobs_pipeline(tmp_path):
    # Two jobs on their own leaves (nothing shared: each runs as alone). Before, the joint run's one pipeline
    # window read the short job's gradient sync and optimizer as bubble (optimizer 0, exposed dp 0) and its
    # timeline and trace showed one "stage 0" for both jobs (job long's stage 0, rank 16, missing).
    def job(name, layers, **par):
        return {"name": name, "nodes": 2, "model": {"preset": "gpt2-small", "layers": layers},
                "training": {"seq_len": 512}, "parallel": {"micro_batch": 2, "global_batch": 32, **par}}
    spec = jobs_from_dict({"cluster": {"preset": "dgx-h100", "nodes": 4, "nodes_per_leaf": 2},
                           "placement": "contiguous", "steps": 1,
                           "jobs": [job("short", 4, tp=4), job("long", 12, tp=2, pp=2)]})
    result = run_jobs(spec)
    assert (result.jobs["shared_links"] == 0).all() and (result.jobs["slowdown"] == 1.0).all()
    together = result.together
    assert together.rank_groups == [(0, 16), (16, 32)]
    alone = run_experiment(spec.jobs[0].experiment).time_breakdown().loc[0]
    joint = together.time_breakdown().loc[0]
    for category in alone.index.drop("idle", errors="ignore"):
        assert joint[category] == pytest.approx(alone[category], rel=1e-9, abs=1e-15), category
    assert alone["optimizer"] > 0 and alone["exposed_dp"] > 0
    # its GPUs idle from its own end to the joint run's: every row still sums to the step time
    assert joint["idle"] == pytest.approx(alone.get("idle", 0.0) + together.step_time
                                          - result.jobs["step_time_s"][0])
    assert together.time_breakdown().drop(columns="replicas").sum(axis=1).to_numpy() == pytest.approx(
        together.step_time)
    stages = together.timeline().groupby("rank")["stage"].first().to_dict()
    assert stages == {0: 0, 16: 0, 24: 1}
    together.to_chrome_trace(str(tmp_path / "t.json"))
    events = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    assert [e["args"]["name"] for e in events if e.get("name") == "process_name"] == [
        "rank 0 (stage 0)", "rank 16 (stage 0)", "rank 24 (stage 1)", "fabric"]


def test_shared_sections_are_noted_once_and_judged_against_the_jobs_file(tmp_path, capsys):
    # The review: per-job notes repeated the cluster's note for every job and called a given spines "the default"
    # (a job's own document holds no cluster section).
    doc = {"cluster": {"preset": "dgx-h100", "nodes": 8, "nodes_per_leaf": 4, "fabric": "rail_optimized",
                       "oversubscription": 4, "spines": 4}, "steps": 1,
           "jobs": [{**_job(name, 2, 16, 256, tp=2, pp=2), "nodes": 4} for name in ("a", "b")]}
    (tmp_path / "j.yaml").write_text(yaml.safe_dump(doc))
    assert main(["jobs", str(tmp_path / "j.yaml")]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("clustersim: note:")]
    assert len(notes) == 1 and notes[0].startswith("clustersim: note: cluster.spines: 4 at 4:1 gives")
