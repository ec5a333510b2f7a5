"""Parameter sweeps (simulator.sweep): grids, statuses, executors, resuming, CLI."""

from __future__ import annotations

import importlib

import pandas as pd
import pytest
import yaml

import simulator
from simulator.cli import main

sw = importlib.import_module("simulator.sweep")  # ``simulator.sweep`` the attribute is the function
worker = importlib.import_module("simulator.sweeps.worker")  # where points call run_experiment

BASE = {
    "name": "tiny sweep",
    "cluster": {"preset": "dgx-h100", "nodes": 1},
    "model": {"preset": "tiny"},
    "parallel": {"tp": 2, "pp": 2, "dp": 2, "micro_batch": 1, "global_batch": 8},
    "training": {"seq_len": 128},
}
"""8 GPUs, a 2-layer model: a point simulates in a few tens of milliseconds."""

MIXED = {"parallel.tp": [1, 2, 3], "model.preset": ["tiny", "gpt3-175b"]}
"""ok points, invalid ones (tp=3 divides neither 8 GPUs nor 4 heads) and oom ones (175B on 8 GPUs)."""


def _no_wall(df: pd.DataFrame) -> pd.DataFrame:
    return df.drop(columns=["sim_wall_s"]).reset_index(drop=True)


# --------------------------------------------------------------------- grids
def test_grid_values_are_yaml_scalars():
    assert sw.parse_grid_arg("parallel.tp=1,2,4") == ("parallel.tp", [1, 2, 4])
    assert sw.parse_grid_arg("parallel.sequence_parallel=true,false") == ("parallel.sequence_parallel",
                                                                           [True, False])
    assert sw.parse_grid_arg("cluster.nic_bandwidth=400Gbps") == ("cluster.nic_bandwidth", ["400Gbps"])
    assert sw.parse_grid_arg("parallel.placement=[tp,dp,pp],[dp,tp,pp]")[1] == [["tp", "dp", "pp"],
                                                                                 ["dp", "tp", "pp"]]


@pytest.mark.parametrize("text", ["parallel.tp", "=1,2", "parallel.tp=", "parallel.tp=[1,2", "parallel.tp=1,,2",
                                  "paralel.tp=1", "parallel..tp=1"])
def test_bad_grid_arguments_raise_one_line(text):
    with pytest.raises(ValueError) as info:
        sw.parse_grid_arg(text)
    assert "\n" not in str(info.value)


def test_layouts_are_all_factorisations_with_bounded_tp():
    assert sw.layouts(8, 8) == [(1, 1, 8), (1, 2, 4), (1, 4, 2), (1, 8, 1), (2, 1, 4), (2, 2, 2), (2, 4, 1),
                                (4, 1, 2), (4, 2, 1), (8, 1, 1)]
    assert all(tp <= 2 and tp * pp * dp == 16 for tp, pp, dp in sw.layouts(16, 2))


def test_layout_auto_uses_each_points_cluster():
    points = sw.expand_grid(BASE, {"cluster.nodes": [1, 2], "layout": "auto"})
    by_nodes = {n: [p for p in points if p.params["cluster.nodes"] == n] for n in (1, 2)}
    assert len(by_nodes[1]) == len(sw.layouts(8, 8)) and len(by_nodes[2]) == len(sw.layouts(16, 8))
    assert all(max(p.params["parallel.tp"] for p in pts) == 8 for pts in by_nodes.values())
    assert max(p.params["parallel.tp"] for p in sw.expand_grid(BASE, {"layout": "auto"}, max_tp=2)) == 2


def test_micro_batch_auto_divides_the_per_replica_batch():
    points = sw.expand_grid(BASE, {"layout": ["2x2x2", "1x1x8"], "parallel.micro_batch": "auto"})
    mbs = {(p.params["parallel.dp"], p.params["parallel.micro_batch"]) for p in points}
    assert mbs == {(2, 1), (2, 2), (2, 4), (8, 1)}  # global_batch 8: 8/2 = 4 -> 1, 2, 4; 8/8 = 1 -> 1


def test_sweeping_tp_derives_dp_and_reports_it():
    df = sw.sweep(BASE, {"parallel.tp": [1, 2, 4]}, jobs=1, progress=False)
    assert list(df.columns[:2]) == ["parallel.tp", "parallel.dp"]
    assert dict(zip(df["parallel.tp"], df["parallel.dp"])) == {1: 4, 2: 2, 4: 1}  # pp=2 from the base


def test_point_keys_are_stable_and_depend_on_the_base():
    a = sw.point_key(BASE, {"parallel.tp": 2, "cluster.nodes": 1})
    assert a == sw.point_key(BASE, {"cluster.nodes": 1, "parallel.tp": 2})
    assert a != sw.point_key({**BASE, "name": "other"}, {"parallel.tp": 2, "cluster.nodes": 1})
    assert [p.key for p in sw.expand_grid(BASE, MIXED)] == [p.key for p in sw.expand_grid(BASE, MIXED)]


# ------------------------------------------------------------------ statuses
def test_invalid_and_oom_points_are_rows_with_reasons(monkeypatch):
    real = worker.run_experiment

    def flaky(exp):
        if exp.parallel.tp == 2 and exp.model.name == "tiny":
            raise RuntimeError("boom\nsecond line")
        return real(exp)

    monkeypatch.setattr(worker, "run_experiment", flaky)
    df = simulator.sweep(BASE, MIXED, jobs=1, progress=False)
    assert sw.status_counts(df) == {"ok": 1, "invalid": 2, "oom": 2, "failed": 1}
    rows = df.set_index(["parallel.tp", "model.preset"])
    assert rows.loc[(3, "tiny"), "reason"].startswith("parallel.")
    assert rows.loc[(1, "gpt3-175b"), "reason"].startswith("out of memory")
    assert rows.loc[(1, "gpt3-175b"), "memory_per_gpu_bytes"] > 80e9
    assert rows.loc[(2, "tiny"), "reason"] == "RuntimeError: boom"
    ok = df[df["status"] == "ok"]
    assert ok["reason"].eq("").all() and ok["rank"].tolist() == [1] and ok["step_time_s"].gt(0).all()
    assert df.loc[df["status"] != "ok", "step_time_s"].isna().all()


def test_ranking_by_metric_direction():
    grid = {"parallel.tp": [1, 2, 4], "parallel.pp": [1, 2]}
    fast = sw.sweep(BASE, grid, jobs=1, progress=False)
    ok = fast[fast["status"] == "ok"]
    assert ok["step_time_s"].is_monotonic_increasing and ok["rank"].tolist() == list(range(1, len(ok) + 1))
    best_mfu = sw.rank_table(fast, "mfu")
    assert best_mfu[best_mfu["status"] == "ok"]["mfu"].is_monotonic_decreasing
    expected = {"parallel.tp", "parallel.pp", "parallel.dp", "status", "reason", "step_time_s", "mfu",
                "tflops_per_gpu", "bubble_fraction", "exposed_comm_s", "exposed_tp_s", "bytes_nvlink",
                "memory_per_gpu_bytes", "sim_wall_s"}
    assert expected <= set(fast.columns)


# ----------------------------------------------------------------- executors
def test_local_pool_and_dask_give_identical_tables(tmp_path):
    distributed = pytest.importorskip("distributed")
    grid = {"parallel.tp": [1, 2, 3], "parallel.pp": [1, 2]}
    inline = sw.sweep(BASE, grid, jobs=1, progress=False)
    pool = sw.sweep(BASE, grid, jobs=2, progress=False, output=tmp_path / "pool.csv")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=None) as cluster:
        dask = sw.sweep(BASE, grid, scheduler=cluster.scheduler_address, progress=False,
                        output=tmp_path / "dask.parquet")
    pd.testing.assert_frame_equal(_no_wall(pool), _no_wall(inline))
    pd.testing.assert_frame_equal(_no_wall(dask), _no_wall(inline))
    pd.testing.assert_frame_equal(_no_wall(sw.read_table(tmp_path / "dask.parquet")), _no_wall(inline))
    from_csv = sw.read_table(tmp_path / "pool.csv")
    assert from_csv["point"].tolist() == inline["point"].tolist()
    assert from_csv["status"].tolist() == inline["status"].tolist()


# ------------------------------------------------------------------ resuming
def _counting(monkeypatch, fail_on: int | None = None) -> list:
    """Patch the sweep's ``run_experiment`` to record calls (and raise Ctrl-C on call number ``fail_on``)."""
    calls: list = []
    real = worker.run_experiment

    def counted(exp):
        calls.append((exp.parallel.tp, exp.parallel.pp))
        if fail_on is not None and len(calls) == fail_on:
            raise KeyboardInterrupt
        return real(exp)

    monkeypatch.setattr(worker, "run_experiment", counted)
    return calls


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_interrupted_sweep_resumes_without_recomputing(tmp_path, monkeypatch, suffix):
    out = tmp_path / f"results{suffix}"
    grid = {"parallel.tp": [1, 2, 4], "parallel.pp": [1, 2]}  # 6 ok points
    _counting(monkeypatch, fail_on=3)
    with pytest.raises(sw.SweepInterrupted) as info:
        sw.sweep(BASE, grid, jobs=1, progress=False, output=out)
    assert len(info.value.table) == 2
    first = sw.read_table(out)
    assert len(first) == 2 and set(first["status"]) == {"ok"}

    calls = _counting(monkeypatch)
    df = sw.sweep(BASE, grid, jobs=1, progress=False, output=out)
    assert len(calls) == 4 and len(df) == 6 and set(df["status"]) == {"ok"}
    kept = df.set_index("point").loc[first["point"], "sim_wall_s"]
    assert kept.tolist() == first["sim_wall_s"].tolist()  # reused rows, not recomputed

    calls = _counting(monkeypatch)
    again = sw.sweep(BASE, grid, jobs=1, progress=False, output=out)
    assert calls == []
    pd.testing.assert_frame_equal(again, df, check_dtype=False)


def test_resume_keeps_other_rows_and_retries_failed(tmp_path, monkeypatch):
    out = tmp_path / "results.csv"
    monkeypatch.setattr(worker, "run_experiment", lambda exp: (_ for _ in ()).throw(RuntimeError("flaky")))
    sw.sweep(BASE, {"parallel.tp": [1, 2]}, jobs=1, progress=False, output=out)
    assert set(sw.read_table(out)["status"]) == {"failed"}
    monkeypatch.undo()
    sw.sweep(BASE, {"parallel.pp": [1]}, jobs=1, progress=False, output=out)  # another sweep, same file
    calls = _counting(monkeypatch)
    df = sw.sweep(BASE, {"parallel.tp": [1, 2]}, jobs=1, progress=False, output=out)
    assert len(calls) == 2 and set(df["status"]) == {"ok"}
    assert len(sw.read_table(out)) == 3  # the pp=1 sweep's row is kept


def test_other_sweeps_rows_keep_integers_and_leave_the_ranks_to_this_sweep(tmp_path, capsys):
    # Two sweeps of different grids into one file (the new-user audit's case): the file lists this sweep's
    # ranks 1..n once, the other sweep's rows unranked after them, and tp/dp stay integers despite the gaps.
    out = tmp_path / "mixed.csv"
    assert main(["sweep", _write(tmp_path, BASE), "--grid", "parallel.micro_batch=1,2", "-o", str(out),
                 "--jobs", "1", "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["sweep", _write(tmp_path, BASE), "--grid", "parallel.tp=1,2", "-o", str(out), "--jobs", "1",
                 "--no-progress"]) == 0
    assert "also keeps 2 rows of other sweeps" in capsys.readouterr().err
    text = out.read_text().splitlines()
    header = text[0].split(",")
    rows = [dict(zip(header, line.split(","))) for line in text[1:]]
    assert [r["rank"] for r in rows] == ["1", "2", "", ""]
    assert [r["parallel.tp"] for r in rows] == ["1", "2", "", ""] or [r["parallel.tp"] for r in rows] == \
        ["2", "1", "", ""]
    assert all(r["parallel.micro_batch"] in ("1", "2") for r in rows[2:])  # the other sweep's, as integers


# ----------------------------------------------------------------------- CLI
def _write(tmp_path, doc, name="exp.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def test_cli_sweep_section_ranks_and_prints_counts(tmp_path, capsys):
    doc = {**BASE, "sweep": {"grid": {"parallel.tp": [1, 3], "model.preset": ["tiny", "gpt3-175b"]},
                             "metric": "mfu"}}
    out = tmp_path / "r.parquet"
    rc = main(["sweep", _write(tmp_path, doc), "--grid", "parallel.tp=1,2,3", "-o", str(out), "--jobs", "1",
               "--top", "2", "--no-progress"])
    captured = capsys.readouterr()
    assert rc == 0
    assert "6 points: 2 ok, 2 invalid, 2 oom, 0 failed" in captured.out
    assert "rank" in captured.out and "mfu" in captured.out
    df = sw.read_table(out)
    assert sorted(df["parallel.tp"].unique()) == [1, 2, 3]  # --grid replaced the file's tp values
    ok = df[df["status"] == "ok"]
    assert ok["mfu"].is_monotonic_decreasing


@pytest.mark.parametrize("argv, message", [
    (["--grid", "parallel.tp"], "--grid"),
    (["--grid", "parallel.tp=[1,2"], "--grid"),
    (["--grid", "parallel.foo=1,2"], "parallel.foo: unknown field"),
    (["--grid", "paralel.tp=1"], "unknown section"),
    (["--grid", "layout=8x8"], "layout"),
    ([], "nothing to sweep"),
    (["--grid", "parallel.tp=1", "-o", "out.txt"], "output"),
    (["--grid", "parallel.tp=1", "--metric", "speed"], "metric"),
    (["--grid", "parallel.tp=1", "--jobs", "0"], "--jobs"),
])
def test_cli_bad_inputs_exit_nonzero_with_one_line(tmp_path, capsys, argv, message):
    rc = main(["sweep", _write(tmp_path, BASE), "--no-progress", *argv])
    err = capsys.readouterr().err
    assert rc != 0
    assert message in err and len(err.strip().splitlines()) == 1


def test_cli_sweep_without_a_runnable_point_says_why_and_fails(tmp_path, capsys):
    rc = main(["sweep", _write(tmp_path, BASE), "--grid", "parallel.tp=a,0", "--jobs", "1", "--no-progress"])
    captured = capsys.readouterr()
    assert rc == 2 and "2 points: 0 ok, 2 invalid" in captured.out
    reasons = [line for line in captured.err.splitlines() if line.startswith("clustersim: 1 invalid: parallel.tp:")]
    assert len(reasons) == 2 and any("'a'" in line for line in reasons)
    # every point out of memory: a result (exit 0), and the reason is printed
    rc = main(["sweep", _write(tmp_path, {**BASE, "model": {"preset": "gpt3-175b"}}), "--grid", "parallel.tp=1",
               "--jobs", "1", "--no-progress"])
    captured = capsys.readouterr()
    assert rc == 0 and "0 ok" in captured.out and "clustersim: 1 oom:" in captured.err


def test_example_acceptance_file_expands_to_all_layouts():
    doc = sw.read_experiment_file("examples/sweep-gpt3-1024.yaml")
    settings = sw.sweep_settings(doc)
    base = {k: v for k, v in doc.items() if k != "sweep"}
    points = sw.expand_grid(base, settings["grid"])
    assert len(points) == 3 * len(sw.layouts(1024, 8))
    assert settings["metric"] == "step_time_s"


# ------------------------------------------------------------ a safe store
def test_a_second_sweep_on_the_same_output_is_refused_while_the_first_runs(tmp_path):
    from simulator.sweeps.store import output_lock
    out = tmp_path / "x.csv"
    with output_lock(out):                       # another sweep holds the file
        with pytest.raises(ValueError, match="being written by another sweep"):
            simulator.sweep(BASE, {"parallel.tp": [1, 2]}, jobs=1, progress=False, output=out)
    assert len(simulator.sweep(BASE, {"parallel.tp": [1, 2]}, jobs=1, progress=False, output=out)) == 2


def test_writes_leave_no_temporary_files_and_use_private_names(tmp_path):
    out = tmp_path / "x.csv"
    simulator.sweep(BASE, {"parallel.tp": [1, 2]}, jobs=1, progress=False, output=out)
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")) == ["x.csv"]


def test_a_truncated_row_is_simulated_again_not_trusted(tmp_path, monkeypatch):
    out = tmp_path / "x.csv"
    simulator.sweep(BASE, {"parallel.tp": [1, 2]}, jobs=1, progress=False, output=out)
    lines = out.read_text().splitlines()
    cut = lines[-1][: len(lines[-1]) // 3]         # a writer killed in the middle of the last line
    out.write_text("\n".join(lines[:-1] + [cut]) + "\n")
    calls = []
    real = worker.run_experiment
    monkeypatch.setattr(worker, "run_experiment", lambda *a, **k: calls.append(1) or real(*a, **k))
    table = simulator.sweep(BASE, {"parallel.tp": [1, 2]}, jobs=1, progress=False, output=out)
    assert len(calls) == 1 and set(table["status"]) == {"ok"} and len(table) == 2


def test_an_unreadable_output_is_refused_with_one_line(tmp_path):
    out = tmp_path / "x.parquet"
    out.write_bytes(b"not parquet at all")
    pytest.importorskip("pyarrow")
    with pytest.raises(ValueError, match="cannot be read as a sweep table"):
        simulator.sweep(BASE, {"parallel.tp": [1, 2]}, jobs=1, progress=False, output=out)


def test_two_process_pool_sweeps_in_one_script_both_work():
    # The first sweep's progress bar must not leave a thread behind that breaks the second pool.
    for _ in range(2):
        table = simulator.sweep(BASE, {"parallel.tp": [1, 2]}, jobs=2, progress=True)
        assert set(table["status"]) == {"ok"}


def test_sigterm_writes_the_finished_rows_and_stops(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump({**BASE, "model": {"preset": "gpt2-small"}, "training": {"seq_len": 512}}))
    out = tmp_path / "x.csv"
    # Its own session, so that a failing assertion can still kill the sweep and its workers (no orphans).
    proc = subprocess.Popen([sys.executable, "-m", "simulator.cli", "sweep", str(base), "-o", str(out),
                             "--grid", "parallel.micro_batch=1,2,4,8", "--grid", "cluster.nic_bandwidth="
                             + ",".join(f"{100 + i}Gbps" for i in range(1000)), "--jobs", "2", "--no-progress",
                             "--checkpoint", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        # Interrupt once rows have certainly finished: the first checkpoint (every second here) writes the file.
        # A fixed sleep raced the start-up on a loaded machine; the default 30 s checkpoint let a fast machine
        # finish all 4,000 points first.
        deadline = time.monotonic() + 240
        while not out.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert proc.poll() is None, "the sweep finished before it could be interrupted"
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err
    assert "interrupted after" in err
    assert out.exists() and len(pd.read_csv(out)) >= 1


def test_checkpoint_interval_rewrites_the_output_while_the_sweep_runs(tmp_path, monkeypatch):
    """``checkpoint_s`` near zero: the file is rewritten after every finished point (3 here) and once at the end;
    at the 30 s default a sweep this short writes it only at the end."""
    writes = []
    driver = importlib.import_module("simulator.sweeps.driver")
    real_write = driver.write_table
    monkeypatch.setattr(driver, "write_table", lambda table, path: (writes.append(len(table)), real_write(table, path)))
    simulator.sweep(BASE, {"parallel.tp": [1, 2, 4]}, jobs=1, progress=False, output=tmp_path / "a.csv",
                    checkpoint_s=1e-9)
    assert writes == [1, 2, 3, 3]
    writes.clear()
    simulator.sweep(BASE, {"parallel.tp": [1, 2, 4]}, jobs=1, progress=False, output=tmp_path / "b.csv")
    assert writes == [3]


@pytest.mark.parametrize("value", [0, -1.0, float("nan"), True, "30"])
def test_bad_checkpoint_interval_is_one_line(value):
    with pytest.raises(ValueError, match="checkpoint_s: must be a number of seconds > 0") as info:
        simulator.sweep(BASE, {"parallel.tp": [1]}, jobs=1, progress=False, checkpoint_s=value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("value", ["0", "-5", "nan"])
def test_cli_bad_checkpoint_exits_2(tmp_path, capsys, value):
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump(BASE))
    assert main(["sweep", str(base), "--grid", "parallel.tp=1", "--no-progress", "--checkpoint", value]) == 2
    err = capsys.readouterr().err.strip()
    assert "--checkpoint: must be a number of seconds > 0" in err and "\n" not in err
