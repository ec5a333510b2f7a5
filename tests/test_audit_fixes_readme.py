"""The README's quoted figures of two examples are what the commands print now (the DualPipe example's
out-of-memory sums, the two-jobs table)."""

from __future__ import annotations

import re
from pathlib import Path

from simulator.cli import main

ROOT = Path(__file__).resolve().parents[1]
README = " ".join((ROOT / "README.md").read_text().split())  # one space between words: lines wrap anywhere


def test_dualpipe_memory_figures_are_the_out_of_memory_message(capsys):
    assert main(["run", str(ROOT / "examples" / "deepseek-v3-dualpipe-h800.yaml")]) == 2
    err = capsys.readouterr().err
    m = re.search(r"(stage \d+): .*activations ([\d.]+ GB) = ([\d.]+ GB) per GPU", err)
    assert m, err
    stage, activations, total = m.groups()
    assert f"counts {total} per GPU on the busiest stage ({stage}), {activations} of it activations" in README


def test_two_jobs_table_is_what_the_command_prints(capsys):
    assert main(["jobs", str(ROOT / "examples" / "two-jobs.yaml")]) == 0
    out = capsys.readouterr().out
    for job in ("llama3-8b", "gpt3-13b"):
        row = next(line for line in out.splitlines() if line.strip().startswith(job))
        assert " ".join(row.split()) in README, row
