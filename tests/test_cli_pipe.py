"""``clustersim ... | head``: a reader that closes the pipe early ends the run quietly with 128 + SIGPIPE."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from simulator.cli import SIGPIPE_EXIT


def test_closed_stdout_exits_quietly_with_sigpipe_status() -> None:
    # The read end is closed before the child has imported anything, so its first flush meets a closed pipe.
    child = subprocess.Popen(
        [sys.executable, "-m", "simulator.cli", "collective", "--op", "all_reduce", "--gpus", "8",
         "--min-size", "1MiB", "--max-size", "4MiB"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    child.stdout.close()
    stderr = child.stderr.read().decode()
    status = child.wait(timeout=120)
    assert status == SIGPIPE_EXIT == 141
    assert stderr == ""


def test_open_stdout_is_unaffected() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "simulator.cli", "collective", "--op", "all_reduce", "--gpus", "8",
         "--min-size", "1MiB", "--max-size", "1MiB"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "all_reduce over 8 GPUs" in done.stdout and "1 MiB" in done.stdout


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs Linux's /dev/full (every write: no space)")
def test_a_full_stdout_is_named_in_one_line() -> None:
    # ``> /dev/full``: the write error named nothing ("[Errno 28] No space left on device"); now it says it was
    # standard output, in one line, with status 2 and no traceback
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "simulator.cli", "collective", "--op", "all_reduce", "--gpus", "8",
             "--min-size", "1MiB", "--max-size", "1MiB"], stdout=full, stderr=subprocess.PIPE, text=True,
            timeout=120)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "standard output: No space left on device" in lines[0], done.stderr
