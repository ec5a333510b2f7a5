"""Progress of a simulation (``Engine(progress=...)``, ``run_experiment(progress=...)``, the bar of
``clustersim run`` on a terminal): it reports the ops finished, ends at the op count, and observes only."""

import io

import numpy as np
import pytest

from simulator import cli
from simulator.engine import _PROGRESS_STEPS, Engine
from simulator.experiment import DEMO_EXPERIMENT, experiment_from_dict, run_experiment
from workloads.training import training_step


def _demo_step():
    exp = experiment_from_dict(DEMO_EXPERIMENT)
    return exp, training_step(exp.model, exp.parallel, exp.training, exp.options, exp.routing)


def test_reports_are_increasing_end_at_the_op_count_and_change_nothing():
    exp, step = _demo_step()
    n = len(step.graph.ops)
    calls = []
    with_bar = Engine(step.graph, exp.cluster, exp.compute_model(), exp.network,
                      progress=lambda done, total: calls.append((done, total))).run()
    without = Engine(step.graph, exp.cluster, exp.compute_model(), exp.network).run()
    done = [d for d, _ in calls]
    assert {t for _, t in calls} == {n}
    assert done == sorted(set(done)) and done[-1] == n  # strictly increasing, the last one at n
    assert _PROGRESS_STEPS // 4 <= len(calls) <= _PROGRESS_STEPS + 1  # often enough, never more than asked
    for name in ("issue_s", "start_s", "end_s"):
        assert np.array_equal(getattr(with_bar, name), getattr(without, name), equal_nan=True)
    assert with_bar.step_time_s == without.step_time_s and with_bar.events == without.events


def test_run_experiment_passes_progress_on():
    calls = []
    r = run_experiment(experiment_from_dict(DEMO_EXPERIMENT), progress=lambda d, t: calls.append((d, t)))
    assert calls[-1] == (len(r.record.graph.ops),) * 2


def test_a_progress_that_is_not_callable_is_refused():
    exp, step = _demo_step()
    with pytest.raises(TypeError, match="progress: must be a callable"):
        Engine(step.graph, exp.cluster, progress=5)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_cli_bar_draws_on_a_terminal_only(monkeypatch):
    terminal = _Terminal()
    monkeypatch.setattr(cli.sys, "stderr", terminal)
    with cli._ops_bar(True) as progress:
        for done in range(0, 101, 20):
            progress(done, 100)
    assert "simulating" in terminal.getvalue() and "op" in terminal.getvalue()
    drawn = terminal.getvalue()
    with cli._ops_bar(False) as progress:  # --no-progress: no bar (a short step's note says nothing either)
        progress(0, 100)
    assert terminal.getvalue() == drawn
    pipe = io.StringIO()
    monkeypatch.setattr(cli.sys, "stderr", pipe)  # a pipe or a file: nothing to draw
    with cli._ops_bar(True) as progress:
        progress(0, 100)
        progress(100, 100)
    assert pipe.getvalue() == ""


def test_run_without_a_terminal_prints_no_bar(capsys):
    path = "examples/demo.yaml"
    assert cli.main(["run", path, "--json"]) == 0
    assert cli.main(["run", path, "--json", "--no-progress"]) == 0
    captured = capsys.readouterr()
    assert "simulating" not in captured.err
    first, second = captured.out.strip().splitlines()
    assert first.split('"sim_wall_s"')[0] == second.split('"sim_wall_s"')[0]
