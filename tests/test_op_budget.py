"""The op budget (workloads/op_budget.py): a step whose graph would outgrow the machine is refused early, in one
line, with how large it would be; ``--force`` (``max_ops=None``) builds it anyway.

Truth: the graph actually built (``len(graph.ops)``) for the projection; wall-clock-free checks for "early"
(how many ops were built when the refusal came)."""

import dataclasses

import pytest

import simulator.experiment as experiment
from simulator.cli import main
from simulator.experiment import experiment_from_dict, run_experiment
from workloads.models import get_preset
from workloads.op_budget import OpBudget, StepTooLargeError
from workloads.ops import OpGraph
from workloads.parallel import ParallelConfig, TrainingSpec
from workloads.training import training_step

DEMO = {"cluster": {"preset": "dgx-h100", "nodes": 2}, "model": {"preset": "gpt2-small"},
        "parallel": {"tp": 2, "pp": 2, "dp": 4, "micro_batch": 4, "global_batch": 64, "sequence_parallel": True},
        "training": {"seq_len": 1024}}

CONFIGS = [  # (model changes, parallel, representatives)
    ({}, ParallelConfig(tp=2, pp=2, dp=4, micro_batch=1, global_batch=64, sequence_parallel=True), "tp"),
    ({"layers": 24}, ParallelConfig(tp=1, pp=4, dp=2, micro_batch=1, global_batch=32, schedule="interleaved",
                                    virtual_stages=2), None),
    ({}, ParallelConfig(tp=2, pp=1, dp=4, global_batch=16, zero=3), "tp"),
    ({}, ParallelConfig(tp=2, pp=4, dp=2, micro_batch=1, global_batch=64, sequence_parallel=True), "stage"),
]


def _step(changes, parallel, representatives, max_ops):
    model = dataclasses.replace(get_preset("gpt2-small"), **changes)
    return training_step(model, parallel, TrainingSpec(seq_len=1024), representatives=representatives,
                         max_ops=max_ops)


@pytest.mark.parametrize("changes,parallel,representatives", CONFIGS)
def test_the_projection_is_close_to_the_graph_built(changes, parallel, representatives):
    built = len(_step(changes, parallel, representatives, None).graph.ops)
    with pytest.raises(StepTooLargeError) as info:
        _step(changes, parallel, representatives, built // 4)  # a limit the projection passes early
    assert info.value.limit == built // 4
    # refused early, on a projection of the right order (the actions so far; the gradient reductions and the
    # optimizer after a rank's last action are not in it yet); that it passed the limit is the refusal itself
    assert info.value.ops <= 1.25 * built, (info.value.ops, built)


@pytest.mark.parametrize("changes,parallel,representatives", CONFIGS)
def test_the_ops_built_are_held_to_the_limit(changes, parallel, representatives):
    # one op under the graph's size: refused, though the last ops (a rank's last action, its reductions and
    # optimizer) come after the last projection (they were let through: a 168-op graph under a limit of 148)
    built = len(_step(changes, parallel, representatives, None).graph.ops)
    with pytest.raises(StepTooLargeError):
        _step(changes, parallel, representatives, built - 1)
    # the graph's own size is never refused: no projection along the way overshoots it by more than the quarter
    # of slack (the builder's one-off ops of a first forward)
    assert len(_step(changes, parallel, representatives, built).graph.ops) == built


def test_refused_before_the_graph_is_built(monkeypatch):
    # gpt2-small with SP over 4 x 1,024 micro-batches: ~10^5 ops per rank; the budget of 5,000 stops the builder
    # within the first rank's first few actions, not at the end
    seen = []
    check = OpBudget.check

    def watched(self, action, actions):
        seen.append(len(self.graph.ops))
        check(self, action, actions)

    monkeypatch.setattr(OpBudget, "check", watched)
    with pytest.raises(StepTooLargeError):
        _step({}, ParallelConfig(tp=2, pp=2, dp=4, micro_batch=1, global_batch=4096, sequence_parallel=True),
              "tp", 5_000)
    assert seen and seen[-1] < 5_000


def test_the_budget_counts_every_rank_it_was_given():
    graph = OpGraph(4)
    budget = OpBudget(100, 4, graph)
    for rank in range(2):  # two ranks of 30 ops: the four will be ~120
        for _ in range(30):
            graph.compute(rank, duration_s=1e-6, category="fixed", name="c")
        budget.rank_done()
    assert budget.projected(0, 10) == (120.0, 30.0)
    budget.check(0, 10)  # a projection up to a quarter over the limit passes (its first actions' one-off ops)
    budget.limit = 90
    with pytest.raises(StepTooLargeError, match=r"~120 ops \(4 simulated ranks x ~30\), over the limit of 90"):
        budget.check(0, 10)  # 120 > 1.25 x 90
    with pytest.raises(StepTooLargeError):
        OpBudget(50, 4, graph).check(0, 10)  # the 60 ops built are over 50, projected or not
    OpBudget(None, 4, graph).check(0, 10)  # no limit: never raises


def test_run_refuses_in_one_line_and_force_runs_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(experiment, "MAX_OPS", 100)
    path = tmp_path / "demo.yaml"
    path.write_text(f"{DEMO}\n".replace("'", ""))
    assert main(["run", str(path), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"clustersim: error: {path}: the step would have ~")
    assert "over the limit of 100" in err[0] and err[0].endswith("(or use --force to simulate anyway)")
    assert main(["run", str(path), "--no-progress", "--force"]) == 0


def test_a_sweep_row_says_why_without_offering_force(tmp_path, monkeypatch):
    from simulator.sweeps.worker import run_point
    monkeypatch.setattr(experiment, "MAX_OPS", 100)
    row = run_point(DEMO)
    assert row["status"] == "invalid" and "over the limit of 100" in row["reason"]
    assert "--force" not in row["reason"]


def test_run_experiment_force_builds_any_size(monkeypatch):
    monkeypatch.setattr(experiment, "MAX_OPS", 100)
    exp = experiment_from_dict(DEMO)
    with pytest.raises(StepTooLargeError):
        run_experiment(exp)
    assert run_experiment(exp, force=True).step_time > 0


def test_jobs_name_the_job_too_large(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(experiment, "MAX_OPS", 100)
    path = tmp_path / "jobs.yaml"
    path.write_text("cluster: {preset: dgx-h100, nodes: 4}\njobs:\n"
                    "  - {name: big, nodes: 2, model: {preset: gpt2-small}, parallel: {tp: 2, pp: 2, dp: 4, "
                    "micro_batch: 4, global_batch: 64, sequence_parallel: true}, training: {seq_len: 1024}}\n")
    assert main(["jobs", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "job 'big': the step would have ~" in err[0] and err[0].endswith("anyway)")
    assert main(["jobs", str(path), "--force"]) == 0
