"""Faults QA hunt: a sweep path into the faults list, and an Experiment given faults after loading."""

from __future__ import annotations

import dataclasses

import pytest

from simulator.experiment import experiment_from_dict, run_experiment
from simulator.sweeps import apply_overrides, set_path
from simulator.sweeps.grid import check_fields
from workloads.errors import ConfigError

DOC = {"cluster": {"preset": "dgx-h100", "nodes": 1, "gpus_per_node": 4},
       "model": {"preset": "gpt2-small", "layers": 2},
       "parallel": {"dp": 4, "global_batch": 8}, "training": {"seq_len": 512}}
STRAGGLER = {"kind": "straggler", "gpu": 3, "factor": 2}


def test_a_grid_path_into_the_faults_list_is_a_one_line_error_not_an_attribute_error():
    # --grid faults.0.factor=1,2 crashed as "internal error: AttributeError: 'list' object has no attribute 'get'"
    base = {**DOC, "faults": [STRAGGLER]}
    with pytest.raises(ValueError, match=r"faults\.0\.factor: faults is not a section"):
        set_path(dict(base), "faults.0.factor", 1.5)
    with pytest.raises(ValueError, match=r"^grid: faults\.0\.factor: faults is not a section"):
        check_fields(base, {"faults.0.factor": [1, 2]})
    assert apply_overrides(base, {"faults": []})["faults"] == []  # (the whole list is swept as before)


def test_an_experiment_given_only_stragglers_after_loading_runs_against_its_own_cluster():
    # healthy_cluster is None on an Experiment loaded without faults: the healthy run crashed with
    # "cluster: must be a Cluster ..., got NoneType None"; stragglers leave the fabric as it is
    loaded = run_experiment(experiment_from_dict({**DOC, "faults": [STRAGGLER]}))
    edited = run_experiment(dataclasses.replace(experiment_from_dict(DOC), faults=[STRAGGLER]))
    assert edited.step_time == pytest.approx(loaded.step_time, rel=1e-12)
    assert edited.summary["fault_slowdown"] == pytest.approx(loaded.summary["fault_slowdown"], rel=1e-12)
    assert edited.summary["healthy_step_time_s"] == pytest.approx(loaded.summary["healthy_step_time_s"], rel=1e-12)


@pytest.mark.parametrize("fault, words", [
    ({"kind": "switch_down", "switch": "nvswitch:0"}, ["faults:", "switch_down", "not", "applied"]),
    ({"kind": "straggler", "gpu": 3, "factor": 0.5}, ["faults[0].factor"]),
    ({"kind": "straggler", "gpu": 9, "factor": 2}, ["faults[0].gpu"]),
])
def test_an_experiment_given_faults_after_loading_is_refused_in_one_line(fault, words):
    exp = dataclasses.replace(experiment_from_dict(DOC), faults=[fault])
    with pytest.raises(ConfigError) as info:
        run_experiment(exp)
    message = str(info.value)
    assert "\n" not in message and all(w in message for w in words), message
