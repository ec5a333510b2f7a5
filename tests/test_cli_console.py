"""The ``clustersim`` script's entry (:func:`simulator.cli.console`): main's exit status, then no final
garbage collection at exit (the step's objects are frozen out of its sight)."""

from __future__ import annotations

import subprocess
import sys

CHILD = """
import gc, sys
from simulator.cli import console
sys.argv = ["clustersim", *sys.argv[1:]]
status = console()
print("frozen", gc.get_freeze_count(), file=sys.stderr)
sys.exit(status)
"""


def _console(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CHILD, *args], capture_output=True, text=True, timeout=300)


def test_a_run_exits_0_with_its_summary_and_a_frozen_heap() -> None:
    done = _console("run", "examples/demo.yaml", "--no-progress")
    assert done.returncode == 0, done.stderr
    assert "step time" in done.stdout
    assert int(done.stderr.split("frozen")[-1]) > 0  # (main alone freezes nothing: the tests call it in-process)


def test_an_error_keeps_its_status() -> None:
    done = _console("run", "no-such-file.yaml")
    assert done.returncode == 2
    assert "clustersim: error:" in done.stderr
