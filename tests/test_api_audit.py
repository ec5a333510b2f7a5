"""A helper's hunt over the Python API (2026-12-04): a result keeps the graph as it ran; the frames a result
hands out are copies; an empty graph has an empty breakdown; an edited Experiment's world size is checked;
numpy numbers and GPU names are taken where the experiment dict path takes them."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from simulator import simulate
from simulator.compute import ComputeModel
from simulator.experiment import experiment_from_dict, run_experiment
from simulator.fabric import NetworkConfig
from topologies import build_cluster, leaf_spine, single_server
from workloads.errors import ConfigError
from workloads.ops import OpGraph

TINY = {"cluster": {"preset": "dgx-h100", "nodes": 1}, "model": {"preset": "tiny"},
        "parallel": {"tp": 2, "pp": 2, "dp": 2, "global_batch": 4}, "training": {"seq_len": 128}}


def test_a_result_keeps_the_graph_as_it_ran():
    # Before: adding ops to the graph for the next run broke the first result's summary and frames.
    cluster, g = single_server("H100", 8), OpGraph(8)
    g.collective("all_reduce", range(8), 2**30)
    first = simulate(g, cluster)
    g.collective("all_reduce", range(8), 2**30)
    second = simulate(g, cluster)
    assert second.step_time == pytest.approx(2 * first.step_time)
    assert len(first.ops) == 8 and first.summary["step_time_s"] == first.step_time
    assert first.time_breakdown().drop(columns="replicas").sum(axis=1).tolist() == pytest.approx([first.step_time] * 8)


def test_tier_timeseries_and_stages_are_the_users_to_edit(tmp_path):
    # Before: both returned the result's own frame, which its trace, plots and summary read.
    result = run_experiment(experiment_from_dict(TINY))
    peak = result.tier_timeseries["nvlink"].max()
    edited = result.tier_timeseries
    edited["nvlink"] /= 1e9
    assert result.tier_timeseries["nvlink"].max() == peak
    stages = result.stages
    stages.loc[0, "busy_s"] = 123.0
    assert result.stages.loc[0, "busy_s"] != 123.0 and result.stage_records()[0]["busy_s"] != 123.0


def test_an_empty_graph_has_an_empty_breakdown():
    result = simulate(OpGraph(8), single_server("H100", 8))
    assert result.step_time == 0.0 and len(result.time_breakdown()) == 0


def test_an_edited_experiment_must_still_fill_its_cluster():
    exp = experiment_from_dict(TINY)
    half = dataclasses.replace(exp, parallel=dataclasses.replace(exp.parallel, dp=1))
    with pytest.raises(ConfigError, match=r"parallel: tp x cp x pp x dp = 4 but cluster .* has 8 GPUs"):
        run_experiment(half)


def test_numpy_numbers_and_gpu_names_in_the_constructors():
    n = np.arange(10)
    assert single_server("H100", np.int64(8)).num_gpus == 8
    assert leaf_spine("H100", servers=n[4], servers_per_leaf=n[2], spines=n[2]).num_gpus == 32
    assert build_cluster({"preset": "dgx-h100", "nodes": np.int64(2)}).num_gpus == 16
    assert NetworkConfig(bandwidth_efficiency=np.float32(0.9)).bandwidth_efficiency == pytest.approx(0.9)
    model = ComputeModel("H100", comm_sms=np.int64(20), matmul_efficiency=np.float64(0.7))
    assert model.gpu.name == "H100-SXM" and model.comm_sms == 20
    with pytest.raises(ValueError, match="compute.comm_sms"):
        ComputeModel("H100", comm_sms=np.float64(20.5))
    # (op_overhead_s and gemm_k_overhead too: np.float32 and np.int64 were refused; booleans still are)
    ComputeModel("H100", op_overhead_s=np.float32(1e-6), gemm_k_overhead=np.int64(128))
    with pytest.raises(ValueError, match="compute.gemm_k_overhead"):
        ComputeModel("H100", gemm_k_overhead=True)
    with pytest.raises(ValueError, match="compute.op_overhead_s"):
        ComputeModel("H100", op_overhead_s=True)
