"""GPU-to-GPU variability of compute speed (``faults: [{kind: variability, spread, seed}]``).

Each GPU's compute time is multiplied by ``exp(spread * z)``, ``z`` the GPU's draw of
``numpy.random.default_rng(seed).standard_normal(num_gpus)`` (:func:`topologies.faults.compute_slowdown`). The
checks: a lone GPU's step scales by its own factor exactly (nothing else in its step), a data-parallel step
waits for its slowest GPU (the same step as that GPU alone straggling by its factor), the draws have the
documented law, a zero spread changes nothing, the seed fixes the result, and bad entries are one-line errors.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import yaml

from simulator.cli import main
from simulator.experiment import experiment_from_dict, run_experiment
from topologies.faults import compute_slowdown, fault_counts


def _doc(faults: list | None = None, **parallel) -> dict:
    doc = {"cluster": {"preset": "dgx-h100", "nodes": 1}, "model": {"preset": "gpt2-small"},
           "parallel": {"dp": 8, "global_batch": 16, "overlap_grad_reduce": False, **parallel},
           "training": {"seq_len": 1024}}
    if faults is not None:
        doc["faults"] = faults
    return doc


def _draws(spread: float, seed: int, n: int) -> np.ndarray:
    """The documented law, written out here: ``exp(spread * z)`` per GPU."""
    return np.exp(spread * np.random.default_rng(seed).standard_normal(n))


def test_a_lone_gpu_runs_its_step_at_its_own_factor():
    # One GPU, no communication: the whole step is compute, so it scales by the GPU's factor and nothing else.
    doc = {"cluster": {"preset": "dgx-h100", "nodes": 1, "gpus_per_node": 1}, "model": {"preset": "gpt2-small"},
           "parallel": {"dp": 1, "global_batch": 2}, "training": {"seq_len": 1024}}
    healthy = run_experiment(experiment_from_dict(doc))
    varied = run_experiment(experiment_from_dict({**doc, "faults": [{"kind": "variability", "spread": 0.05,
                                                                     "seed": 0}]}))
    factor = float(_draws(0.05, 0, 1)[0])
    assert factor != pytest.approx(1.0, abs=1e-3)  # (the case tests something)
    assert varied.step_time == pytest.approx(factor * healthy.step_time, rel=1e-9)
    assert varied.summary["healthy_step_time_s"] == pytest.approx(healthy.step_time, rel=1e-12)


def test_data_parallel_ranks_wait_for_the_slowest_gpu():
    # DP 8 with the gradient all-reduce after the backward: every rank's compute ends at its own factor, the
    # all-reduce starts when the slowest arrives. So the step is that of the slowest GPU alone straggling by its
    # factor (the faster GPUs only wait longer), and above the healthy step by (max factor - 1) x its compute.
    spread, seed = 0.03, 11
    draws = _draws(spread, seed, 8)
    slowest = int(draws.argmax())
    varied = run_experiment(experiment_from_dict(_doc([{"kind": "variability", "spread": spread, "seed": seed}])))
    alone = run_experiment(experiment_from_dict(_doc([{"kind": "straggler", "gpu": slowest,
                                                       "factor": float(draws[slowest])}])))
    healthy = run_experiment(experiment_from_dict(_doc()))
    ops = healthy.ops
    compute = float(ops[(ops["rank"] == slowest) & (ops["kind"] == "compute")]["duration_s"].sum())
    assert varied.step_time == pytest.approx(alone.step_time, rel=1e-9)
    assert varied.step_time - healthy.step_time == pytest.approx((draws.max() - 1) * compute, rel=1e-6)


def test_a_zero_spread_changes_nothing_and_the_seed_fixes_the_step():
    healthy = run_experiment(experiment_from_dict(_doc())).step_time
    zero = run_experiment(experiment_from_dict(_doc([{"kind": "variability", "spread": 0, "seed": 3}])))
    assert zero.step_time == healthy
    runs = [run_experiment(experiment_from_dict(_doc([{"kind": "variability", "spread": 0.02, "seed": s}]))).step_time
            for s in (1, 1, 2)]
    assert runs[0] == runs[1] and runs[0] != runs[2]


def test_the_draws_follow_the_documented_law():
    # 16,384 GPUs at 1.5%: log factors with mean 0 (within 4 standard errors) and standard deviation 0.015 (within
    # 3%), each GPU's factor its own draw; a straggler's factor multiplies its GPU's draw.
    n, spread = 16384, 0.015
    factors = compute_slowdown([{"kind": "variability", "spread": spread, "seed": 0}], n)
    logs = np.log([factors.get(r, 1.0) for r in range(n)])
    assert abs(logs.mean()) < 4 * spread / math.sqrt(n)
    assert logs.std() == pytest.approx(spread, rel=0.03)
    both = compute_slowdown([{"kind": "straggler", "gpu": 3, "factor": 2.0},
                             {"kind": "variability", "spread": spread, "seed": 0}], n)
    assert both[3] == pytest.approx(2.0 * factors[3], rel=1e-15)
    assert compute_slowdown([{"kind": "variability", "spread": 0.0, "seed": 0}], n) == {}


def test_the_run_names_the_spread():
    assert fault_counts([{"kind": "variability", "spread": 0.015, "seed": 0}]) == "GPU variability 1.5%"
    assert fault_counts([{"kind": "straggler", "gpu": 0, "factor": 2}, {"kind": "link_down", "link": []},
                         {"kind": "variability", "spread": 0.02, "seed": 0}]) == \
        "1 fault(s), 1 straggler(s), GPU variability 2%"


@pytest.mark.parametrize("faults, words", [
    ([{"kind": "variability", "spread": -0.01, "seed": 0}], ["faults[0].spread", "[0, 0.5]"]),
    ([{"kind": "variability", "spread": 0.6, "seed": 0}], ["faults[0].spread"]),
    ([{"kind": "variability", "spread": "2%", "seed": 0}], ["faults[0].spread"]),
    ([{"kind": "variability", "spread": True, "seed": 0}], ["faults[0].spread"]),
    ([{"kind": "variability", "spread": float("nan"), "seed": 0}], ["faults[0].spread"]),
    ([{"kind": "variability", "spread": 0.01, "seed": -1}], ["faults[0].seed", "integer >= 0"]),
    ([{"kind": "variability", "spread": 0.01, "seed": 1.5}], ["faults[0].seed"]),
    ([{"kind": "variability", "spread": 0.01}], ["faults[0].seed", "required"]),
    ([{"kind": "variability", "spread": 0.01, "seed": 0, "gpu": 1}], ["faults[0].gpu", "unknown field"]),
    ([{"kind": "variability", "spread": 0.01, "seed": 0}, {"kind": "variability", "spread": 0.02, "seed": 1}],
     ["faults[1]", "already have a variability"]),
])
def test_bad_variability_entries_are_one_line_errors(tmp_path, capsys, faults, words):
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump({**_doc(), "faults": faults}))
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0] and all(w in err[0] for w in words), err


def test_the_fidelities_agree_under_variability():
    # fast holds a TP group at its slowest member (they meet at every TP collective), lockstep a stage's block at
    # its slowest: synchronous training runs at its slowest GPU's pace either way, so both stay within the 2% that
    # fast keeps of full on a healthy fabric (README, "Speed").
    doc = {"cluster": {"preset": "dgx-h100", "nodes": 2}, "model": {"preset": "gpt2-small"},
           "parallel": {"tp": 2, "pp": 2, "dp": 4, "micro_batch": 2, "global_batch": 64, "sequence_parallel": True},
           "training": {"seq_len": 1024}, "faults": [{"kind": "variability", "spread": 0.04, "seed": 5}]}
    steps = {f: run_experiment(experiment_from_dict({**doc, "fidelity": f})) for f in ("full", "fast", "lockstep")}
    assert steps["full"].summary["fault_slowdown"] > 1.01  # (the spread shows)
    assert steps["fast"].step_time == pytest.approx(steps["full"].step_time, rel=0.02)
    assert steps["lockstep"].step_time == pytest.approx(steps["full"].step_time, rel=0.02)
