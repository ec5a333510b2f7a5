"""Audit fixes of ``clustersim sweep``: a bad ``sweep:`` section or metric is one line and exit 2, before any point."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator.cli import main
from simulator.sweeps import sweep

OK = """\
cluster: {preset: dgx-h100, nodes: 2}
model: {preset: gpt2-small}
parallel: {tp: 2, pp: 2, dp: 4, micro_batch: 4, global_batch: 64}
training: {seq_len: 1024}
"""


def one_line(err: str) -> str:
    assert "Traceback" not in err and "internal error" not in err, err
    assert err.startswith("clustersim: error: ") and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("section,words", [
    ("{grid: {parallel.tp: [1, 2]}, metric: 5}", ["sweep.metric", "5 unknown", "step_time_s"]),
    ("{grid: {parallel.tp: [1, 2]}, metric: [mfu]}", ["sweep.metric", "['mfu']", "valid"]),
    ("{grid: {parallel.tp: [1, 2]}, metric: exposed_foo_s}", ["sweep.metric", "exposed_foo_s", "exposed_tp_s"]),
    ("{grid: {parallel.tp: [1, 2]}, metric: bytes_warp}", ["sweep.metric", "bytes_warp", "bytes_nvlink"]),
    ("{grid: {layout: auto}, max_tp: abc}", ["sweep.max_tp", "integer >= 1", "'abc'"]),
    ("{grid: {layout: auto}, max_tp: -1}", ["sweep.max_tp", "got -1"]),
    ("{grid: {layout: auto}, max_tp: 0}", ["sweep.max_tp", "got 0"]),
    ("{grid: {layout: auto}, max_tp: 2.5}", ["sweep.max_tp", "got 2.5"]),
    ("{grid: {layout: auto}, max_tp: true}", ["sweep.max_tp", "got True"]),
    ("x", ["sweep: must be a mapping", "grid"]),
    ("{grid: {parallel.tp: [1, 2]}, metrik: mfu}", ["sweep.metrik", "unknown field"]),
    ("{grid: [parallel.tp]}", ["sweep.grid", "must map"]),
])
@pytest.mark.parametrize("argv", [["sweep", "{f}", "--jobs", "1", "--no-progress"], ["run", "{f}"]])
def test_bad_sweep_section_is_one_line_exit_2(tmp_path: Path, capsys, section, words, argv):
    # (`run` reads no sweep: section, but took a malformed one silently while `sweep` refused the same file)
    f = tmp_path / "sw.yaml"
    f.write_text(OK + f"sweep: {section}\n")
    assert main([a.format(f=f) for a in argv]) == 2
    captured = capsys.readouterr()
    err = one_line(captured.err)
    assert "points" not in err and captured.out == ""
    for w in words:
        assert w in err, err


@pytest.mark.parametrize("metric", ["exposed_foo_s", "bytes_warp", "exposed_s", "time_forward_s"])
def test_unknown_metric_on_the_command_line_lists_the_valid_ones(tmp_path: Path, capsys, metric):
    f = tmp_path / "ok.yaml"
    f.write_text(OK)
    assert main(["sweep", str(f), "--grid", "parallel.tp=1,2", "--metric", metric, "--jobs", "1",
                 "--no-progress"]) == 2
    err = one_line(capsys.readouterr().err)
    assert metric in err and "exposed_dp_s" in err and "bytes_spine" in err
    assert err.startswith(f"clustersim: error: --metric: {metric!r} unknown")  # the flag, as the user typed it


@pytest.mark.parametrize("max_tp", [0, -1, 2.5])
def test_the_api_checks_max_tp_as_the_cli_does(tmp_path: Path, max_tp):
    f = tmp_path / "ok.yaml"
    f.write_text(OK)
    with pytest.raises(ValueError, match=r"max_tp: must be an integer >= 1"):
        sweep(str(f), {"layout": "auto"}, jobs=1, progress=False, max_tp=max_tp)


def test_a_grid_path_given_twice_is_an_error_not_the_last_one_silently(tmp_path: Path, capsys):
    f = tmp_path / "ok.yaml"
    f.write_text(OK)
    assert main(["sweep", str(f), "--grid", "parallel.tp=1,2", "--grid", "parallel.tp=4", "--jobs", "1",
                 "--no-progress"]) == 2
    line = one_line(capsys.readouterr().err)
    assert "--grid" in line and "parallel.tp given twice" in line and "parallel.tp=1,2,4" in line
