"""Fixes from a new-user walk of the CLI (seventeenth session).

Commands that read only part of an experiment file (the cluster, network and faults of ``collective``,
``topology`` and ``plan``; the cluster of ``run --chakra``) refuse a misspelled section as ``run`` does, instead
of running on the section's defaults without a word. A sweep's out-of-memory rows do not suggest ``--force``,
which ``sweep`` does not have; ``collective``'s sizes are whole bytes."""

from pathlib import Path

import numpy as np
import pytest

from simulator.bench import size_ladder
from simulator.cli import main

EXPERIMENT = """\
cluster: {preset: dgx-h100, nodes: 2}
netwrk: {step_latency: 50us}
"""


@pytest.mark.parametrize("argv", [
    ["collective", "--cluster", "{f}", "--gpus", "16", "--max-size", "1MiB"],
    ["plan", "{f}"],
    ["topology", "{f}"],
])
def test_a_misspelled_section_is_refused_where_the_cluster_is_read(tmp_path, capsys, argv):
    path = tmp_path / "typo.yaml"
    path.write_text(EXPERIMENT)
    assert main([a.format(f=path) for a in argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "netwrk: unknown section; valid sections: name, cluster," in err[0]
    assert str(path) in err[0]


def test_the_network_section_spelled_right_is_read(tmp_path, capsys):
    # the same file with network: is accepted, and its latency shows in the collective's time
    times = {}
    for key in ("network", None):
        path = tmp_path / f"{key}.yaml"
        path.write_text("cluster: {preset: dgx-h100, nodes: 2}\n" + (f"{key}: {{step_latency: 50us}}\n" if key else ""))
        assert main(["collective", "--cluster", str(path), "--gpus", "16", "--max-size", "1MiB", "--json"]) == 0
        times[key] = capsys.readouterr().out
    assert times["network"] != times[None]


def test_plan_says_it_ignores_faults(tmp_path, capsys):
    path = tmp_path / "faults.yaml"
    path.write_text("cluster: {preset: dgx-h100, nodes: 2}\nfaults: [{kind: nic_down, gpu: 3}]\n")
    assert main(["plan", str(path)]) == 0
    assert "faults: section is not applied here" in capsys.readouterr().err


def test_a_cluster_file_without_a_cluster_section_is_left_to_the_builder(tmp_path, capsys):
    # no cluster: section: a cluster or topology file, whose fields the builder checks (not the sections)
    path = tmp_path / "cluster.yaml"
    path.write_text("preset: dgx-h100\nnodes: 2\n")
    assert main(["plan", str(path)]) == 0
    assert main(["collective", "--cluster", str(path), "--gpus", "16", "--max-size", "1MiB"]) == 0


def test_a_trace_run_refuses_a_misspelled_section_of_its_file(tmp_path, capsys):
    pytest.importorskip("google.protobuf")
    exp = tmp_path / "exp.yaml"
    exp.write_text("cluster: {preset: dgx-h100, nodes: 1}\nmodel: {preset: tiny}\n"
                   "parallel: {tp: 2, dp: 4, micro_batch: 1, global_batch: 4}\ntraining: {seq_len: 128}\n")
    trace = tmp_path / "trace"
    assert main(["run", str(exp), "--fidelity", "full", "--export-chakra", str(trace)]) == 0
    capsys.readouterr()
    typo = tmp_path / "typo.yaml"
    typo.write_text(EXPERIMENT)
    assert main(["run", "--chakra", str(trace), str(typo)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("netwrk: unknown section; valid sections: name, cluster, model, parallel, training, moe, "
                        "network, compute, options, sweep, fidelity, faults, plan") and str(typo) in err


def test_a_sweeps_out_of_memory_rows_do_not_suggest_force(tmp_path, capsys):
    exp = tmp_path / "oom.yaml"
    exp.write_text("cluster: {preset: dgx-h100, nodes: 2}\nmodel: {preset: llama3-70b}\n"
                   "parallel: {tp: 2, pp: 2, dp: 4, micro_batch: 1, global_batch: 64, sequence_parallel: true}\n"
                   "training: {seq_len: 1024}\n")
    out = tmp_path / "s.csv"
    assert main(["sweep", str(exp), "--grid", "parallel.micro_batch=1,2", "-o", str(out), "--jobs", "1"]) == 0
    err = capsys.readouterr().err
    assert err.count("out of memory") == 2 and "--force" not in err and "--force" not in out.read_text()
    assert main(["run", str(exp)]) == 2  # run has --force, and says so
    assert "(or use --force to simulate anyway)" in capsys.readouterr().err


def test_collective_sizes_are_whole_bytes_each_once():
    assert size_ladder(3, 100, 1.5) == [3.0, 4.0, 7.0, 10.0, 15.0, 23.0, 34.0, 51.0, 77.0]
    assert size_ladder(1, 8, 1.01) == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
    assert size_ladder(1 << 20, 1 << 30) == [float(1 << k) for k in range(20, 31)]


@pytest.mark.parametrize("argv, message", [
    (["plan", "{dir}"], "is a folder, not a preset; give a preset"),
    (["collective", "--cluster", "{dir}", "--gpus", "8"], "is a folder, not a preset; give a preset"),
    (["collective", "--cluster", "dgx-h100:-2", "--gpus", "8"], "'dgx-h100:-2': NODES must be >= 1"),
    (["plan", "dgx-h100:0"], "'dgx-h100:0': NODES must be >= 1"),
])
def test_a_folder_or_a_node_count_below_one_is_named_as_such(tmp_path, capsys, argv, message):
    assert main([a.format(dir=tmp_path) for a in argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_a_folder_named_like_a_preset_does_not_hide_the_preset(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dgx-h100").mkdir()
    assert main(["collective", "--cluster", "dgx-h100", "--gpus", "8", "--max-size", "1MiB"]) == 0


def test_a_jobs_file_and_valid_yaml_shapes_are_accepted_where_the_cluster_is_read(tmp_path, capsys):
    # a review of the section check: a jobs file (its own sections), a flow mapping or a quoted scalar that goes
    # on at column 0 are fine; a misspelled section of a jobs file, a quoted misspelled key and a BOM are caught
    jobs = str(Path(__file__).resolve().parent.parent / "examples" / "two-jobs.yaml")
    for argv in (["topology", jobs], ["plan", jobs], ["collective", "--cluster", jobs, "--gpus", "16",
                                                      "--max-size", "1MiB"]):
        assert main(argv) == 0, argv
    ok = tmp_path / "flow.yaml"
    ok.write_text('name: "a\nnote: b"\ncluster: {preset: dgx-h100,\nnodes: 2}\n')
    assert main(["topology", str(ok)]) == 0
    capsys.readouterr()
    for text, bad in (('cluster: {preset: dgx-h100, nodes: 2}\n"netwrk": {}\n', "netwrk"),
                      ("\ufeffcluster: {preset: dgx-h100, nodes: 2}\nnetwrk: {}\n", "netwrk"),
                      ("cluster: {preset: dgx-h100, nodes: 2}\njobs: []\nplacment: packed\n", "placment")):
        path = tmp_path / "bad.yaml"
        path.write_text(text, encoding="utf-8")
        assert main(["topology", str(path)]) == 2
        assert f"{bad}: unknown section" in capsys.readouterr().err


def test_node_counts_and_sizes_that_are_not_whole_are_one_line_errors(capsys):
    assert main(["plan", "dgx-h100:--2"]) == 2
    assert "NODES must be an integer" in capsys.readouterr().err
    with pytest.raises(ValueError, match="whole numbers of bytes"):
        size_ladder(2.5, 10)


def test_numpy_integers_from_a_notebook_are_plain_integers():
    # a layout read off a DataFrame or a grid from an array: accepted at load and run as ints (the run failed
    # with "must be an integer, got np.int64(2)"; the sweep's row with a YAML error)
    from simulator import sweep
    from simulator.experiment import DEMO_EXPERIMENT, experiment_from_dict, run_experiment
    doc = {**DEMO_EXPERIMENT, "parallel": {**DEMO_EXPERIMENT["parallel"], "tp": np.int64(2), "dp": np.int64(4)}}
    exp = experiment_from_dict(doc)
    assert type(exp.parallel.tp) is int and type(exp.parallel.dp) is int
    assert run_experiment(exp).step_time == run_experiment(experiment_from_dict(DEMO_EXPERIMENT)).step_time
    table = sweep(DEMO_EXPERIMENT, {"parallel.tp": np.array([1, 2])}, jobs=1, progress=False)
    assert table["status"].tolist() == ["ok", "ok"] and table["parallel.tp"].tolist() in ([1, 2], [2, 1])
