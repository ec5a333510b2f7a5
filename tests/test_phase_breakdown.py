"""benchmarks/phase_breakdown.py: its clocks must not change what is simulated, and every phase's share must be a
real (non-negative) part of the run, or the breakdowns it reports for the speed work would mislead."""

from __future__ import annotations

import csv
import importlib.util
import os

from simulator.experiment import load_experiment, run_experiment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "phase_breakdown.py")
DEMO = os.path.join(ROOT, "examples", "demo.yaml")


def _script():
    spec = importlib.util.spec_from_file_location("phase_breakdown", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_breakdown_simulates_the_same_step_and_its_phases_are_non_negative(tmp_path):
    script = _script()
    out = tmp_path / "breakdown.csv"
    assert script.main([DEMO, "--out", str(out)]) == 0  # (the clocks run in a child process: nothing patched here)
    with open(out) as fh:
        (row,) = list(csv.DictReader(fh))
    plain = run_experiment(load_experiment(DEMO), force=True)
    assert float(row["step_time_s"]) == plain.step_time
    assert int(row["events"]) == plain.events
    parts = {p: float(row[f"{p}_s"]) for p in script.PHASES}
    assert all(v >= 0 for v in parts.values()), parts  # (an inner call taken out of its caller twice would go < 0)
    assert parts["import"] > 0 and parts["generate"] > 0 and parts["network"] > 0
