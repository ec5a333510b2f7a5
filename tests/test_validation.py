"""``simulator.validation`` and ``clustersim validate``: the table of published runs is well-formed.

Fast checks only. No accuracy threshold is asserted: the validation reports how far
the first-principles model lands from published numbers (docs/VALIDATION.md), it is
not a target the model is tuned to.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from simulator.experiment import experiment_from_dict, read_experiment_file
from simulator.validation import COLUMNS, ENTRIES, METRICS, VALIDATION_DIR, get_entry, validate_against_published
from workloads.parallel import layers_per_stage

ROOT = Path(__file__).resolve().parents[1]
SMALLEST = min(ENTRIES, key=lambda e: e.gpus)


def test_names_unique_and_every_file_listed():
    names = [e.name for e in ENTRIES]
    assert len(names) == len(set(names))
    on_disk = {p.name for p in VALIDATION_DIR.glob("*.yaml")}
    assert on_disk == {e.file for e in ENTRIES}, "every simulator/validation_runs file has exactly one entry"


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
def test_entry_file_loads_and_matches_published_setup(entry):
    text = entry.path.read_text()
    assert text.startswith("#") and "Source:" in text and "Published:" in text, "header cites source and number"
    exp = experiment_from_dict(read_experiment_file(entry.path))
    assert exp.cluster.num_gpus == entry.gpus == exp.parallel.world_size
    assert sum(layers_per_stage(exp.model.layers, exp.parallel)) == exp.model.layers


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
def test_published_numbers_well_formed(entry):
    assert entry.metric in METRICS
    assert isinstance(entry.published, float) and math.isfinite(entry.published) and entry.published > 0
    if entry.metric == "mfu":
        assert entry.published < 1, "MFU is a fraction of peak"
    elif entry.metric == "tokens_per_gpu_s":
        assert 10 < entry.published < 1e6, "tokens/s per GPU"
    else:
        assert 10 < entry.published < 5000, "TFLOP/s per GPU"
    assert entry.source and any(y in entry.source for y in ("2021", "2022", "2023", "2024", "SC'21", "arXiv"))


def test_unknown_entry_is_a_clear_error():
    with pytest.raises(ValueError, match="valid: korthikanti22-22b"):
        get_entry("nope")


def test_validate_python_api_on_smallest_entry():
    table = validate_against_published([SMALLEST.name])
    assert list(table.columns) == list(COLUMNS)
    row = table.iloc[0]
    assert row["name"] == SMALLEST.name and row["published"] == SMALLEST.published
    assert row["simulated"] > 0 and row["ratio"] == pytest.approx(row["simulated"] / row["published"])
    assert row["error_pct"] == pytest.approx(100 * (row["ratio"] - 1))
    assert validate_against_published(max_gpus=SMALLEST.gpus - 1).empty


def test_parallel_jobs_keep_entry_order_and_values():
    two = sorted(ENTRIES, key=lambda e: e.gpus)[:2]
    names = [e.name for e in reversed(two)]
    serial = validate_against_published(names)
    parallel = validate_against_published(names, jobs=2)
    assert list(parallel["name"]) == names
    assert list(parallel["simulated"]) == pytest.approx(list(serial["simulated"]), rel=1e-12)
    with pytest.raises(ValueError, match="jobs"):
        validate_against_published(names, jobs=0)


def test_cli_validate_only_smallest_json():
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-m", "simulator.cli", "validate", "--only", SMALLEST.name, "--json"],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert len(rows) == 1
    assert rows[0]["name"] == SMALLEST.name
    assert rows[0]["published"] == SMALLEST.published and rows[0]["simulated"] > 0
    assert rows[0]["metric"] == SMALLEST.metric


@pytest.mark.skipif(shutil.which("clustersim") is None, reason="console script not installed")
def test_installed_console_script_finds_its_validation_files(tmp_path):
    # Run as a user of `pip install .` would: the installed script, outside the source tree, so the
    # experiment files must come with the package (package data), not from a checkout.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(["clustersim", "validate", "--only", SMALLEST.name, "--json"], capture_output=True,
                          text=True, cwd=tmp_path, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)[0]["simulated"] > 0


def test_cli_validate_unknown_entry_exits_2():
    from simulator.cli import main
    assert main(["validate", "--only", "no-such-entry"]) == 2


@pytest.fixture
def a_slow_entry(monkeypatch):
    """The entries with the largest marked slow, as DeepSeek-V3 was until its file ran it in lockstep (no entry
    is slow today; the mechanism stays for the next one that is)."""
    import dataclasses

    import simulator.validation as validation
    largest = max(ENTRIES, key=lambda e: e.gpus)
    marked = tuple(dataclasses.replace(e, slow="a test's slow entry") if e is largest else e for e in ENTRIES)
    monkeypatch.setattr(validation, "ENTRIES", marked)
    return marked


def test_no_entry_is_slow_and_deepseek_runs_at_its_files_fidelity():
    assert not any(e.slow for e in ENTRIES)
    deepseek = read_experiment_file(os.path.join(VALIDATION_DIR, "deepseek-v3-2048-h800.yaml"))
    assert deepseek["fidelity"] == "lockstep"
    assert all("fidelity" not in read_experiment_file(os.path.join(VALIDATION_DIR, e.file))
               for e in ENTRIES if e.name != "deepseek-v3-2048-h800")


def test_slow_entries_run_only_when_asked_for(a_slow_entry):
    from simulator.validation import select_entries
    ENTRIES = a_slow_entry
    slow = [e for e in ENTRIES if e.slow]
    assert len(slow) == 1
    default = select_entries()
    assert [e.name for e in default] == [e.name for e in ENTRIES if not e.slow]  # order kept
    assert [e.name for e in select_entries(include_slow=True)] == [e.name for e in ENTRIES]
    assert [e.name for e in select_entries([slow[0].name])] == [slow[0].name]  # asked for by name
    twice = [ENTRIES[1].name, ENTRIES[0].name, ENTRIES[1].name]  # a name given twice runs once, in given order
    assert [e.name for e in select_entries(twice)] == [ENTRIES[1].name, ENTRIES[0].name]
    assert all(e.gpus <= 512 for e in select_entries(max_gpus=512, include_slow=True))


def test_cli_validate_all_with_only_is_an_error(capsys):
    from simulator.cli import main
    assert main(["validate", "--all", "--only", SMALLEST.name]) == 2
    assert "--all" in capsys.readouterr().err


def test_cli_validate_list_marks_slow_entries(capsys, a_slow_entry):
    from simulator.cli import main
    assert main(["validate", "--list"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    slow = next(e for e in a_slow_entry if e.slow)
    assert "[slow:" in lines[slow.name] and "[slow:" not in lines[SMALLEST.name]


def test_cli_validate_list_keeps_what_only_and_max_gpus_keep_and_speaks_json(capsys):
    from simulator.cli import main
    assert main(["validate", "--list", "--max-gpus", "8", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == [e.name for e in ENTRIES if e.gpus <= 8]
    assert all(r["gpus"] <= 8 for r in rows) and rows[0]["source"]
    big = max(ENTRIES, key=lambda e: e.gpus)
    assert main(["validate", "--list", "--only", SMALLEST.name, big.name]) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()] == [SMALLEST.name, big.name]


def test_cli_validate_says_when_max_gpus_leaves_out_an_entry_asked_for_by_name(capsys):
    from simulator.cli import main
    big = max(ENTRIES, key=lambda e: e.gpus)
    # every named entry left out: an error naming --max-gpus and the entry (was: an empty table, exit 0)
    assert main(["validate", "--only", big.name, "--max-gpus", "64"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--max-gpus" in err and big.name in err
    # some left out: the others listed, a note for each one left out
    assert main(["validate", "--list", "--only", SMALLEST.name, big.name, "--max-gpus", "64"]) == 0
    captured = capsys.readouterr()
    assert [line.split()[0] for line in captured.out.splitlines()] == [SMALLEST.name]
    assert f"skipped {big.name}" in captured.err and "--max-gpus 64" in captured.err


def test_several_entries_run_each_in_a_fresh_process_in_entry_order(monkeypatch):
    # A default run in one process piled the entries' peaks up (14.6 GB; each alone peaks at 7.2 GB at most):
    # each entry now gets a fresh worker (max_tasks_per_child=1), also with one job, in entry order.
    import concurrent.futures

    from simulator import validation
    made, submitted = [], []

    class Recording:
        def __init__(self, **kwargs):
            made.append(kwargs)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def submit(self, fn, name, fidelity):
            submitted.append(name)
            done = concurrent.futures.Future()
            done.set_result({"name": name, "simulated": 1.0})
            return done

    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", Recording)
    monkeypatch.setattr(validation.pd, "DataFrame", lambda rows, columns: rows)
    names = [ENTRIES[2].name, ENTRIES[0].name, ENTRIES[1].name]
    seen = []
    rows = validate_against_published(names, progress=lambda row: seen.append(row["name"]))
    assert made == [{"max_workers": 1, "max_tasks_per_child": 1}]
    assert submitted == seen == [r["name"] for r in rows] == names
