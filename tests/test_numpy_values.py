"""A document built in a notebook carries numpy scalars (``np.arange``, a DataFrame row): ``isinstance(np.int64(2),
int)`` is false, so such a document was refused field by field ("cluster.nodes: must be a positive integer, got
np.int64(2)") where the same document from a YAML file ran. The entry points take numpy scalars as the Python values
a file gives (:func:`workloads.errors.plain_values`); the results are those of the plain document."""

import copy

import numpy as np
import pandas as pd
import pytest

from simulator.experiment import DEMO_EXPERIMENT, experiment_from_dict, run_experiment
from simulator.jobs import jobs_from_dict
from workloads.errors import plain_values


def _with_numpy(doc):
    """``doc`` with every int as ``np.int64`` and every float as ``np.float64`` (bools and strings kept)."""
    if isinstance(doc, dict):
        return {k: _with_numpy(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_with_numpy(v) for v in doc]
    if isinstance(doc, bool) or not isinstance(doc, (int, float)):
        return doc
    return np.int64(doc) if isinstance(doc, int) else np.float64(doc)


def test_plain_values_turn_numpy_scalars_into_a_files_values_and_keep_the_callers_document():
    doc = {"a": [np.int64(3), (np.float32(0.5), np.bool_(True))], np.int64(1): {"b": np.arange(3)}, "c": "x",
           "d": pd.Series([np.int64(1), np.int64(2)]), "e": np.str_("y")}
    out = plain_values(doc)
    assert out["a"] == [3, (0.5, True)] and type(out["a"][0]) is int and type(out["a"][1][1]) is bool
    assert type(next(k for k in out if k not in ("a", "c", "d", "e"))) is int
    assert out[1]["b"] == [0, 1, 2] and all(type(x) is int for x in out[1]["b"])  # an array as a list
    assert out["d"] == [1, 2] and type(out["d"][0]) is int and type(out["e"]) is str
    row = pd.DataFrame({"n0": [0], "n1": [2], "name": ["a"]}).iloc[0][["n0", "n1"]]  # a mixed frame's row: objects
    assert plain_values(row) == [0, 2] and all(type(x) is int for x in plain_values(row))
    assert type(doc["a"][0]) is np.int64 and isinstance(doc[1]["b"], np.ndarray)  # the caller's document unchanged


def test_an_experiment_of_numpy_scalars_runs_as_the_plain_one():
    plain = copy.deepcopy(DEMO_EXPERIMENT)
    numpyish = _with_numpy(copy.deepcopy(DEMO_EXPERIMENT))
    assert type(numpyish["cluster"]["nodes"]) is np.int64
    assert run_experiment(experiment_from_dict(numpyish)).step_time == \
        run_experiment(experiment_from_dict(plain)).step_time


def test_a_jobs_document_of_numpy_scalars_resolves_as_the_plain_one():
    doc = {"cluster": {"preset": "dgx-h100", "nodes": 4}, "placement": "scattered", "placement_seed": 3,
           "jobs": [{"name": "a", "nodes": np.array([0, 2]), "model": {"preset": "gpt2-small"},
                     "parallel": {"tp": 4, "micro_batch": 1, "global_batch": 8}, "training": {"seq_len": 1024}},
                    {"name": "b", "nodes": 1, "model": {"preset": "gpt2-small"},
                     "parallel": {"tp": 4, "micro_batch": 1, "global_batch": 8}, "training": {"seq_len": 1024}}]}
    want = jobs_from_dict({**copy.deepcopy(doc), "jobs": [{**doc["jobs"][0], "nodes": [0, 2]}, doc["jobs"][1]]})
    got = jobs_from_dict(_with_numpy(doc))
    assert [j.nodes for j in got.jobs] == [j.nodes for j in want.jobs]


@pytest.mark.parametrize("dpi", [np.int64(50), np.float64(60.0)])
def test_save_plots_take_a_numpy_dpi(tmp_path, dpi):
    result = run_experiment(experiment_from_dict(copy.deepcopy(DEMO_EXPERIMENT)))
    assert result.save_plots(str(tmp_path), dpi=dpi)
