"""Defects found by the twenty-fifth session's hunts (2026-12-05), each with the test that fails on the old code."""

from __future__ import annotations

import copy

import pytest

from simulator.experiment import experiment_from_dict, representatives_for, run_experiment

ZB_H1 = {
    "cluster": {"preset": "dgx-h100", "nodes": 4, "nodes_per_leaf": 2, "spines": 2, "oversubscription": 2},
    "model": {"preset": "gpt2-small", "heads": 16, "kv_heads": 16, "hidden": 1024, "layers": 4},
    "parallel": {"tp": 2, "pp": 4, "dp": 4, "micro_batch": 1, "global_batch": 16, "schedule": "zb-h1", "zero": 1,
                 "sequence_parallel": True},
    "training": {"seq_len": 512},
}
"""32 GPUs under a split backward, where a straggler makes every fidelity simulate every rank."""


@pytest.mark.parametrize("schedule", ["zb-h1", "1f1b"])
def test_a_straggler_of_factor_one_changes_nothing(schedule):
    """A factor of 1 slows nothing: the step is the healthy one to the bit, in the healthy step's fidelity
    (it used to make every fidelity simulate every rank under a split backward: `fast` moved by +0.066%)."""
    doc = copy.deepcopy(ZB_H1)
    doc["parallel"]["schedule"] = schedule
    healthy = experiment_from_dict(doc)
    doc["faults"] = [{"kind": "straggler", "gpu": 3, "factor": 1.0}]
    idle = experiment_from_dict(doc)
    assert representatives_for(idle, "fast") == representatives_for(healthy, "fast")
    assert run_experiment(idle, fidelity="fast").step_time == run_experiment(healthy, fidelity="fast").step_time
