"""A new user's findings (hunt 27): settings a layout never reads must be noted (README, "The experiment file":
a known field this layout never reads ... `clustersim run` says so on stderr; unused_settings lists them)."""

import copy

import pytest

from simulator.experiment import experiment_from_dict, load_experiment, run_experiment, unused_settings

BASE = {"cluster": {"preset": "dgx-h100", "nodes": 1}, "model": {"preset": "tiny"},
        "parallel": {"tp": 1, "pp": 2, "micro_batch": 1, "global_batch": 16}, "training": {"seq_len": 128}}


def _doc(section, values, parallel=None):
    doc = copy.deepcopy(BASE)
    doc["parallel"].update(parallel or {})
    doc.setdefault(section, {}).update(values)
    return doc


@pytest.mark.parametrize("section, values, parallel, field", [
    ("training", {"fp8_recipe": "tensorwise"}, None, "training.fp8_recipe"),
    ("parallel", {"align_param_gather": False}, None, "parallel.align_param_gather"),
    ("parallel", {"align_param_gather": False}, {"zero": 1, "overlap_param_gather": True},
     "parallel.align_param_gather"),
    ("parallel", {"align_grad_reduce": True}, {"overlap_grad_reduce": False}, "parallel.align_grad_reduce"),
    ("parallel", {"align_grad_reduce": True}, {"pp": 1}, "parallel.align_grad_reduce"),
])
def test_a_setting_that_changes_nothing_is_noted(section, values, parallel, field):
    doc = _doc(section, values, parallel)
    without = copy.deepcopy(doc)
    del without[section][next(iter(values))]
    # independent truth: the setting does not move the simulated step at all
    assert run_experiment(experiment_from_dict(doc)).step_time == run_experiment(
        experiment_from_dict(without)).step_time
    notes = unused_settings(experiment_from_dict(doc))
    assert any(n.startswith(field + " has no effect") for n in notes), notes


def test_the_settings_are_not_noted_where_they_act():
    inter = {"schedule": "interleaved", "virtual_stages": 2, "zero": 1, "overlap_param_gather": True}
    doc = copy.deepcopy(BASE)
    doc["model"]["layers"] = 4
    doc["parallel"].update(inter, align_param_gather=False, align_grad_reduce=True)
    notes = unused_settings(experiment_from_dict(doc))
    assert not any("align_" in n for n in notes), notes
    fp8 = _doc("training", {"dtype": "fp8", "fp8_recipe": "blockwise"})
    fp8["cluster"]["preset"] = "dgx-h100"
    assert not any("fp8_recipe" in n for n in unused_settings(experiment_from_dict(fp8)))


def test_shipped_files_gain_no_note():
    for path in ("examples/deepseek-v3-dualpipe-h800.yaml", "simulator/validation_runs/deepseek-v3-2048-h800.yaml"):
        assert not any("fp8_recipe" in n or "align_" in n for n in unused_settings(load_experiment(path)))
