"""Audit fixes of input messages: a file that is not UTF-8, an empty cluster file, --nodes with a topology file,
``validate``'s own options, a port speed no transceiver has. Each is one line naming what is wrong, exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator.cli import main


def one_line(err: str) -> str:
    assert "Traceback" not in err and "internal error" not in err, err
    assert err.startswith("clustersim: error: ") and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("argv", [["run", "{f}"], ["plan", "{f}"], ["topology", "{f}"], ["jobs", "{f}"],
                                  ["collective", "--cluster", "{f}"], ["sweep", "{f}", "--grid", "parallel.tp=1,2"],
                                  ["run", "{ref}"]])
@pytest.mark.parametrize("data", [b"\xff\xfecluster: x\n", b"cluster: {preset: dgx-h100}\n# caf\xc3(\n"])
def test_a_file_that_is_not_utf8_is_named(tmp_path: Path, capsys, argv, data):
    f = tmp_path / "latin.yaml"
    f.write_bytes(data)
    ref = tmp_path / "ref.yaml"  # an experiment whose topology file is not UTF-8
    ref.write_text("cluster: {topology: latin.yaml}\nmodel: {preset: tiny}\n")
    assert main([a.format(f=f, ref=ref) for a in argv]) == 2
    err = one_line(capsys.readouterr().err)
    assert "latin.yaml" in err and "not UTF-8 text" in err, err


@pytest.mark.parametrize("argv", [["collective", "--cluster", "{f}"], ["topology", "{f}"]])
@pytest.mark.parametrize("text", ["", "# only a comment\n"])
def test_an_empty_cluster_file_is_called_empty(tmp_path: Path, capsys, argv, text):
    f = tmp_path / "empty.yaml"
    f.write_text(text)
    assert main([a.format(f=f) for a in argv]) == 2
    err = one_line(capsys.readouterr().err)
    assert "empty.yaml: the file is empty" in err and "NoneType" not in err, err


@pytest.mark.parametrize("spec", ["examples/fabrics/two-racks.yaml", "examples/custom-fabric.yaml"])
def test_plan_nodes_with_a_topology_file_says_so(capsys, spec):
    root = Path(__file__).resolve().parents[1]
    assert main(["plan", str(root / spec), "--nodes", "64"]) == 2
    err = one_line(capsys.readouterr().err)
    assert "--nodes: cannot be used with a topology file" in err and "non-empty list" not in err, err


def test_plan_nodes_still_resizes_a_preset(capsys):
    assert main(["plan", "dgx-h100", "--nodes", "4", "--json"]) == 0
    assert "4x dgx-h100" in capsys.readouterr().out


@pytest.mark.parametrize("argv,words", [(["--only", "nope"], ["--only: 'nope'", "korthikanti22-22b"]),
                                        (["--jobs", "0"], ["--jobs: must be an integer >= 1, got 0"]),
                                        (["--only", "korthikanti22-22b", "--jobs", "-1"], ["--jobs", "got -1"])])
def test_validate_options_are_checked_before_the_table_header(capsys, argv, words):
    assert main(["validate", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == "", captured.out
    err = one_line(captured.err)
    for w in words:
        assert w in err, err


@pytest.mark.parametrize("plan", ["{port_speed: 1600Gbps}", "{port_speed: 801Gbps, family: ethernet}",
                                  "{port_speed: 1.6Tbps, family: infiniband}",
                                  # between catalogued speeds: refused since 2026-12-03 (it was rounded up)
                                  "{port_speed: 7Gbps}", "{port_speed: 300Gbps}"])
def test_plan_port_speed_above_every_switch_port_is_refused(tmp_path: Path, capsys, plan):
    f = tmp_path / "p.yaml"
    f.write_text(f"cluster: {{preset: dgx-h100, nodes: 4}}\nplan: {plan}\n")
    assert main(["plan", str(f)]) == 2
    err = one_line(capsys.readouterr().err)
    assert "plan.port_speed" in err and "200Gbps, 400Gbps, 800Gbps" in err, err


@pytest.mark.parametrize("speed,priced", [("200Gbps", 200), ("400Gbps", 400), ("800Gbps", 800), ("50GB/s", 400)])
def test_plan_port_speeds_of_the_catalogue_are_priced_as_given(tmp_path: Path, capsys, speed, priced):
    import json
    f = tmp_path / "p.yaml"
    f.write_text(f"cluster: {{preset: dgx-h100, nodes: 4}}\nplan: {{port_speed: {speed}}}\n")
    assert main(["plan", str(f), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["summary"]["port_speed_Gbps"] == priced


@pytest.mark.parametrize("dp", ["dp: null, ", "dp: , ", ""])
def test_dp_null_is_derived_from_the_cluster_as_when_left_out(tmp_path: Path, dp):
    # 16 GPUs, tp 2 x pp 2: dp 4. ``dp: null`` was "must be a positive integer, got None" (the README says dp
    # may be left out), and it hid a real error in tp behind it.
    from simulator.experiment import load_experiment
    f = tmp_path / "e.yaml"
    f.write_text("cluster: {preset: dgx-h100, nodes: 2}\nmodel: {preset: gpt2-small}\n"
                 f"parallel: {{tp: 2, pp: 2, {dp}micro_batch: 4, global_batch: 64}}\ntraining: {{seq_len: 1024}}\n")
    assert load_experiment(f).parallel.dp == 4


def test_dp_null_does_not_hide_an_impossible_tp(tmp_path: Path, capsys):
    f = tmp_path / "e.yaml"
    f.write_text("cluster: {preset: dgx-h100, nodes: 2}\nmodel: {preset: gpt2-small}\n"
                 "parallel: {tp: 5, dp: null, micro_batch: 1, global_batch: 16}\ntraining: {seq_len: 1024}\n")
    assert main(["run", str(f)]) == 2
    err = one_line(capsys.readouterr().err)
    assert "tp" in err and "None" not in err


def test_cluster_preset_colon_nodes_in_a_file_is_the_command_lines_form(tmp_path: Path):
    # `cluster: dgx-h100:2` was "unknown preset 'dgx-h100:2'" although the command line takes PRESET:NODES
    from simulator.experiment import load_experiment
    short, long = tmp_path / "short.yaml", tmp_path / "long.yaml"
    rest = "model: {preset: gpt2-small}\nparallel: {tp: 2, pp: 1}\ntraining: {seq_len: 1024}\n"
    short.write_text("cluster: dgx-h100:2\n" + rest)
    long.write_text("cluster: {preset: dgx-h100, nodes: 2}\n" + rest)
    assert load_experiment(short).cluster.num_gpus == load_experiment(long).cluster.num_gpus == 16
    bad = tmp_path / "bad.yaml"
    bad.write_text("cluster: dgx-h100:two\n" + rest)
    with pytest.raises(ValueError, match=r"cluster: 'dgx-h100:two': NODES must be an integer, as in dgx-h100:4$"):
        load_experiment(bad)


@pytest.mark.parametrize("argv, words", [
    (["collective", "--min-size", "-1MiB"], ["--min-size", "'-1MiB' is not a positive byte size"]),
    (["zero", "--params", "-5B"], ["--params", "'-5B'"]),
    (["collective", "--gpus", "-8"], ["--gpus", "got -8"]),
])
def test_a_negative_value_after_a_space_gets_its_options_own_message(capsys, argv, words):
    # argparse took '-1MiB' for an option: "argument --min-size: expected one argument"
    assert main(argv) == 2
    err = one_line(capsys.readouterr().err)
    assert all(w in err for w in words), err
