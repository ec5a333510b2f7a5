"""New-user reliability hunt (session 41): a cluster file named without a YAML or GraphML suffix, a jobs file
read from a pipe, a --max-gpus that leaves nothing to validate, output paths on a full disk or a device.

* ``plan``, ``topology``, ``collective --cluster`` and ``run --chakra --cluster`` tell a file from a preset by its
  suffix; an existing file named ``cluster.txt`` (or ``/dev/fd/63``, bash's ``<(...)``) was reported as an
  "unknown preset", as if the user had misspelled a preset name. It is now named as a file, with the suffixes
  that are read, as a folder already is.
* ``clustersim jobs`` read its file twice (to resolve the jobs, then for the notes): from a pipe the second read
  found nothing and the command failed with "the file is empty" for a file that was not.
* ``validate --max-gpus N`` below every entry's GPU count printed an empty table (or list) and exit 0; it is
  refused as it already was with ``--only``.
* A full disk when ``plan --csv``, ``topology -o`` or a sweep's ``-o`` is written was a bare "[Errno 28] No space
  left on device"; it names the option and the file, as ``run --trace`` does.
* ``sweep -o`` naming an existing device or pipe (a ``rows.csv`` link to ``/dev/zero``) was read as a table to
  resume: zeros until the machine ran out of memory (killed), or a hang; it is refused first.
"""

import json
import os
from pathlib import Path

import pytest

from simulator.cli import main

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

JOBS = """\
cluster: {preset: dgx-h100, nodes: 2}
jobs:
  - {name: a, nodes: 1, model: {preset: tiny}, parallel: {tp: 4, micro_batch: 1, global_batch: 2},
     training: {seq_len: 128}}
"""


@pytest.mark.parametrize("argv", [
    ["plan", "{f}"],
    ["topology", "{f}"],
    ["collective", "--cluster", "{f}", "--gpus", "8", "--max-size", "1MiB"],
])
def test_a_cluster_file_without_a_yaml_suffix_is_named_as_a_file(tmp_path, capsys, argv):
    path = tmp_path / "cluster.txt"
    path.write_text("cluster: {preset: dgx-h100, nodes: 1}\n")
    assert main([a.format(f=path) for a in argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "is a file, not a preset" in err[0] and ".yaml" in err[0] and ".graphml" in err[0], err[0]
    assert "unknown preset" not in err[0]


def test_a_preset_name_still_wins_over_a_file_of_that_name(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dgx-h100").write_text("not a cluster\n")
    assert main(["plan", "dgx-h100"]) == 0
    assert main(["plan", "nosuch"]) == 2  # neither a preset nor a file: still an unknown preset
    assert "unknown preset 'nosuch'" in capsys.readouterr().err


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="pipes opened by path (Linux /proc/self/fd)")
def test_jobs_reads_its_file_once_so_a_pipe_works(capsys):
    # what bash's process substitution hands over (clustersim jobs <(...)): a pipe named by path, whose text can
    # be read once; a second open of the path finds it drained (old: "the file is empty")
    text = (EXAMPLES / "two-jobs.yaml").read_text()
    assert main(["jobs", str(EXAMPLES / "two-jobs.yaml"), "--json"]) == 0
    expected = json.loads(capsys.readouterr().out)
    r, w = os.pipe()
    try:
        os.write(w, text.encode())  # (well under a pipe's 64 KiB buffer)
        os.close(w)
        assert main(["jobs", f"/proc/self/fd/{r}", "--json"]) == 0, capsys.readouterr().err
    finally:
        os.close(r)
    got = json.loads(capsys.readouterr().out)
    assert got["jobs"] == expected["jobs"]  # the same jobs, simulated the same (only the wall time differs)


def test_jobs_notes_still_come_from_the_file(tmp_path, capsys):
    path = tmp_path / "jobs.yaml"
    path.write_text(JOBS.replace("nodes: 2}", "nodes: 2, cores: 2}"))
    assert main(["jobs", str(path)]) == 0
    assert "clustersim: note: cluster.cores has no effect" in capsys.readouterr().err


@pytest.mark.parametrize("extra", [[], ["--list"], ["--json"], ["--list", "--json"]])
def test_validate_max_gpus_that_leaves_out_every_entry_is_an_error(capsys, extra):
    # --only with such a --max-gpus was already refused; without --only it printed an empty table (or list), exit 0
    from simulator.validation import ENTRIES
    fewest = min(e.gpus for e in ENTRIES)
    assert main(["validate", "--max-gpus", str(fewest - 1), *extra]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and "--max-gpus" in err[0] and "leaves out every entry" in err[0], err
    assert f"on {fewest} GPUs" in err[0]


DEMO = EXAMPLES / "demo.yaml"
needs_dev_full = pytest.mark.skipif(not os.path.exists("/dev/full"), reason="/dev/full (Linux): a full disk")


@needs_dev_full
@pytest.mark.parametrize("argv, flag", [
    (["plan", "dgx-h100:1", "--csv", "/dev/full"], "--csv"),
    (["topology", "dgx-h100:1", "-o", "{link}.yaml"], "--output"),
    (["topology", "dgx-h100:1", "-o", "{link}.graphml"], "--output"),
])
def test_a_full_disk_is_named_by_the_option_that_writes(tmp_path, capsys, argv, flag):
    # old: "clustersim: error: [Errno 28] No space left on device", naming neither the option nor the file
    link = tmp_path / "out"
    for suffix in (".yaml", ".graphml"):
        (tmp_path / f"out{suffix}").symlink_to("/dev/full")
    assert main([a.format(link=link) for a in argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"clustersim: error: {flag}: cannot write "), err
    assert "No space left on device" in err[0]


def test_a_sweep_output_that_is_a_device_is_refused_before_it_is_read(tmp_path, capsys):
    # the resume step read the existing output: a .csv link to /dev/zero (or /dev/full) read zeros until the
    # machine ran out of memory, a FIFO hung; /dev/null stands for them here (old: "cannot be read ... EmptyDataError")
    out = tmp_path / "rows.csv"
    out.symlink_to(os.devnull)
    assert main(["sweep", str(DEMO), "--grid", "parallel.tp=1,2", "-o", str(out), "--jobs", "1",
                 "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "output:" in err[0] and "is not a regular file" in err[0], err


def test_a_sweep_output_that_cannot_be_written_is_named(tmp_path, capsys, monkeypatch):
    # a full disk found when the table is written (at the end or a checkpoint); old: a bare "[Errno 28] ..."
    import errno

    import pandas as pd

    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(pd.DataFrame, "to_csv", full)
    out = tmp_path / "rows.csv"
    assert main(["sweep", str(DEMO), "--grid", "parallel.micro_batch=4", "-o", str(out), "--jobs", "1",
                 "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"clustersim: error: output: cannot write {str(out)!r}: {os.strerror(errno.ENOSPC)}", err
    assert not list(tmp_path.glob(".rows.csv.*.tmp"))  # (the temporary file is removed)


def test_a_sweep_output_that_is_a_link_keeps_the_link(tmp_path, capsys):
    # The table is written to a temporary file and renamed onto the output; onto a symbolic link that rename
    # replaced the link by a regular file, leaving the file the link named as it was.
    target = tmp_path / "store" / "rows.csv"  # (not there yet: the link names where the table should go)
    target.parent.mkdir()
    link = tmp_path / "rows.csv"
    link.symlink_to(target)
    assert main(["sweep", str(DEMO), "--grid", "parallel.micro_batch=1,2", "-o", str(link), "--jobs", "1"]) == 0
    capsys.readouterr()
    assert link.is_symlink() and os.path.samefile(link, target)
    assert "micro_batch" in target.read_text()


def test_a_sweep_point_leaves_no_cyclic_garbage_behind():
    # A simulated point's reference cycles sat in the oldest generation (engine.paused_gc moves a run's objects
    # there), which a long sweep in one process seldom collected: memory grew by megabytes a point. The point now
    # collects them itself, so a collection right after it finds next to nothing (the demo left ~7,000).
    import gc

    from simulator.experiment import DEMO_EXPERIMENT
    from simulator.sweeps.worker import run_point
    gc.collect()
    assert run_point(dict(DEMO_EXPERIMENT))["status"] == "ok"
    assert gc.collect() < 100


def test_a_sweep_of_a_jobs_file_is_one_error_up_front(tmp_path, capsys):
    # Every point of it was "invalid" for the same reason (a jobs file runs with `clustersim jobs`), exit 0 and a
    # table of invalid rows; no override makes it one experiment, so the sweep refuses it before any point.
    out = tmp_path / "rows.csv"
    assert main(["sweep", str(EXAMPLES / "two-jobs.yaml"), "--grid", "parallel.tp=1,2", "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "two-jobs.yaml" in err[0] and "clustersim jobs FILE" in err[0], err
    assert not out.exists()
