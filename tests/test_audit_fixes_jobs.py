"""Audit fixes of ``clustersim jobs``: an explicit ``steps:`` is capped like ``steps: auto`` (one line, exit 2)."""

from __future__ import annotations

import pytest
import yaml
from test_jobs import two_jobs

from simulator.cli import main
from simulator.jobs import MAX_AUTO_STEPS, jobs_from_dict


@pytest.mark.parametrize("steps", [MAX_AUTO_STEPS + 1, 100000])
def test_steps_beyond_the_cap_is_one_line_exit_2_before_simulating(tmp_path, capsys, steps):
    doc = two_jobs()
    doc["steps"] = steps
    f = tmp_path / "jobs.yaml"
    f.write_text(yaml.safe_dump(doc))
    assert main(["jobs", str(f)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert f"steps: {steps} is more than {MAX_AUTO_STEPS}" in err and "auto" in err, err


def test_steps_at_the_cap_is_accepted():
    doc = two_jobs()
    doc["steps"] = MAX_AUTO_STEPS
    assert jobs_from_dict(doc).steps == MAX_AUTO_STEPS
