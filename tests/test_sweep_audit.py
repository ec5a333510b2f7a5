"""A helper's hunt over sweeps (2026-12-04): the screen refuses the contention-free network model it cannot
price; ``layout=auto`` factors the GPUs context parallelism leaves; a screen cannot rank by per-tier bytes it
does not have."""

from __future__ import annotations

import csv
from pathlib import Path

from simulator.cli import main

DEMO = str(Path(__file__).parent.parent / "examples" / "demo.yaml")


def _rows(path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_the_screen_refuses_the_analytic_network_model(tmp_path):
    # Before: analytic points were screened as flow ones (21% off fast on the demo, and ranked wrongly).
    out = tmp_path / "a.csv"
    main(["sweep", DEMO, "--fidelity", "screen", "--grid", "network.model=flow,analytic", "--no-progress",
          "--out", str(out)])
    rows = {r["network.model"]: r for r in _rows(out)}
    assert rows["flow"]["status"] == "ok"
    assert rows["analytic"]["status"] == "invalid" and "network.model: analytic" in rows["analytic"]["reason"]


def test_layout_auto_factors_the_gpus_context_parallelism_leaves(tmp_path):
    # Before: every (tp, pp, dp) of all 16 GPUs, so with cp 2 every point was invalid (32 GPUs asked).
    out = tmp_path / "cp.csv"
    main(["sweep", DEMO, "--grid", "parallel.cp=2", "--grid", "layout=auto", "--no-progress", "--out", str(out)])
    rows = _rows(out)
    assert rows and all(int(r["parallel.tp"]) * int(r["parallel.pp"]) * int(r["parallel.dp"]) == 8 for r in rows)
    assert any(r["status"] == "ok" for r in rows)


def test_a_screen_cannot_rank_by_bytes_it_does_not_price(tmp_path, capsys):
    # Before: every screened row's bytes_spine was empty, so the ranks (and --refine's winners) were grid order.
    assert main(["sweep", DEMO, "--fidelity", "screen", "--refine", "2", "--metric", "bytes_spine", "--grid",
                 "layout=auto", "--no-progress", "--out", str(tmp_path / "m.csv")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("clustersim: error: metric: bytes_spine is not a column of screened rows")


def test_a_grid_path_into_a_value_is_refused_naming_the_field(tmp_path, capsys):
    # Before: parallel.placement.0 made a mapping of the list (every point invalid, exit 2 after running them);
    # parallel.tp.x printed "# 2 points" first.
    assert main(["sweep", DEMO, "--grid", "parallel.placement.0=tp,dp", "--no-progress", "--out",
                 str(tmp_path / "p.csv")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("clustersim: error: grid: parallel.placement.0: parallel.placement is a field, not a "
                          "section") and err.count("\n") == 1
    assert main(["sweep", DEMO, "--grid", "parallel.tp.x=1,2", "--no-progress", "--out",
                 str(tmp_path / "q.csv")]) == 2
    out = capsys.readouterr()
    assert "points" not in out.out and "parallel.tp is not a section of fields" in out.err
    assert not (tmp_path / "p.csv").exists() and not (tmp_path / "q.csv").exists()
    # a path into a mapping that is a field's value is still a sweep (bandwidth efficiency per tier)
    assert main(["sweep", DEMO, "--grid", "network.bandwidth_efficiency.leaf=0.8,0.9", "--no-progress", "--out",
                 str(tmp_path / "ok.csv")]) == 0


def test_a_sweeps_invalid_layout_is_told_to_resize_cluster_nodes(tmp_path, capsys):
    # Before: the worker's cached cluster made every point read as a job of a shared fabric ("give the job other
    # nodes (its nodes: field)"), a field a sweep has not.
    main(["sweep", DEMO, "--fidelity", "screen", "--grid", "layout=2x2x2", "--no-progress", "--out",
          str(tmp_path / "i.csv")])
    reason = _rows(tmp_path / "i.csv")[0]["reason"]
    assert reason.endswith("set dp to 4 or resize cluster.nodes") and "job" not in reason
