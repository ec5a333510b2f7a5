"""`clustersim collective`: output format and one-line errors with non-zero exit."""

import json
import subprocess
import sys

import pytest

from simulator.bench import bus_factor


def cli(*args):
    return subprocess.run([sys.executable, "-m", "simulator.cli", *args], capture_output=True, text=True, timeout=120)


def test_json_rows_follow_nccl_tests_definitions():
    p = cli("collective", "--op", "all_reduce", "--gpus", "8", "--min-size", "1MiB", "--max-size", "4MiB", "--json")
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)
    assert [r["size_bytes"] for r in rows] == [2**20, 2**21, 2**22]
    for r in rows:
        assert r["algbw_Bps"] == pytest.approx(r["size_bytes"] / r["time_s"])
        assert r["busbw_Bps"] == pytest.approx(r["algbw_Bps"] * 2 * 7 / 8)
    assert bus_factor("all_gather", 8) == pytest.approx(7 / 8)


def test_table_output_has_one_row_per_size():
    p = cli("collective", "--op", "all_gather", "--gpus", "16", "--min-size", "1MiB", "--max-size", "8MiB")
    assert p.returncode == 0, p.stderr
    assert len([line for line in p.stdout.splitlines() if "MiB" in line]) == 4


@pytest.mark.parametrize("args,needle", [
    (["--op", "all_sum"], "--op"),
    (["--min-size", "0"], "--min-size"),
    (["--min-size=-5MiB"], "--min-size"),
    (["--min-size", "-5MiB"], "--min-size"),
    (["--max-size", "lots"], "--max-size"),
    (["--gpus", "64", "--cluster", "dgx-h100"], "--gpus"),
    (["--cluster", "dgx-h999"], "preset"),
    (["--algo", "butterfly"], "--algo"),
    (["--gpus", "10000000"], "--gpus"),                       # refused before any cluster is built
    (["--step-factor", "1.000000001"], "--step-factor"),      # billions of sizes: refused, not run
    (["--step-factor", "nan"], "--step-factor"),
])
def test_bad_inputs_exit_nonzero_with_one_line(args, needle):
    p = cli("collective", *args)
    assert p.returncode != 0
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in p.stderr


def test_malformed_cluster_yaml(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("cluster: {preset: dgx-h100, nodes: [1,\n")
    p = cli("collective", "--cluster", str(bad))
    assert p.returncode != 0
    assert len(p.stderr.strip().splitlines()) == 1 and "bad.yaml" in p.stderr
