"""Experiment documents: resolution, validation, memory, and invariants of whole runs.

Truths used: the ZeRO paper's model-state formula ``(2 + 2 + 12)·Ψ`` with the
optimizer (ZeRO-1), gradients (ZeRO-2) and parameters (ZeRO-3) divided by the
DP degree, with ``Ψ`` counted by hand per pipeline stage; a 1-trillion-parameter
model under ZeRO-3 on 1,024 GPUs needs ~16 TB of model states, ~15.6 GB per
GPU (Rajbhandari et al., SC'20, section 1); Megatron's vocabulary padding to a
multiple of 128; and physical invariants (more bandwidth is never slower, the
same inputs give the same result, 0 < MFU < 1).
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from simulator.experiment import (
    DEMO_EXPERIMENT,
    OutOfMemoryError,
    experiment_from_dict,
    load_experiment,
    run_experiment,
)
from topologies import TopologyError
from workloads.errors import ConfigError
from workloads.memory import memory_per_gpu

GB = 1e9
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

# h = 256, f = 1024, V = 512, no biases, RMSNorm, untied: hand-countable parameters.
SMALL = {"name": "small", "layers": 4, "hidden": 256, "heads": 8, "kv_heads": 8, "ffn_hidden": 1024, "vocab": 512,
         "gated_mlp": False, "tied_embeddings": False}


def small_params(stage: int, pp: int, t: int = 1) -> int:
    """Hand count of one TP rank's parameters on pipeline stage ``stage`` of ``SMALL``."""
    h, f, V, layers = 256, 1024, 512, 4
    n = layers // pp * (4 * h * h // t + 2 * h * f // t + 2 * h)
    if stage == 0:
        n += V * h // t                         # word embedding (rotary: no position table)
    if stage == pp - 1:
        n += h + V * h // t                     # final norm + untied output layer
    return n


def doc(**sections) -> dict:
    base = {"cluster": {"preset": "dgx-h100", "nodes": 1}, "model": dict(SMALL),
            "parallel": {"dp": 8}, "training": {"seq_len": 256}}
    base.update(sections)
    return base


# -------------------------------------------------------------- resolution
def test_dp_auto_and_presets_with_overrides():
    exp = experiment_from_dict({"cluster": "dgx-h100", "model": {"preset": "gpt2-small", "layers": 6},
                                "parallel": {"tp": 2, "pp": 2}, "training": {"seq_len": 1024}})
    assert exp.cluster.num_gpus == 32                    # the preset's 4 nodes of 8
    assert exp.parallel.dp == 8                          # 32 / (tp·pp)
    assert exp.model.layers == 6 and exp.model.hidden == 768
    assert exp.name == f"{exp.model.name} on {exp.cluster.name}"


def test_examples_load():
    demo = load_experiment(EXAMPLES / "demo.yaml")
    assert (demo.parallel.tp, demo.parallel.pp, demo.parallel.dp) == (2, 2, 4)
    builtin = experiment_from_dict(DEMO_EXPERIMENT)          # `clustersim demo` runs the same step
    assert (builtin.parallel, builtin.model, builtin.training) == (demo.parallel, demo.model, demo.training)
    assert demo.cluster.num_gpus == 16
    big = load_experiment(EXAMPLES / "gpt3-175b-1024-h100.yaml")
    assert big.cluster.num_gpus == 1024 and big.parallel.world_size == 1024
    assert big.memory().fits(80e9)


@pytest.mark.parametrize("bad, error, field", [
    ({"parallel": {"tp": 3}}, ConfigError, "parallel.dp"),                 # 3 does not divide 8 GPUs
    ({"parallel": {"dp": 4}}, ConfigError, "parallel"),                    # 4 != 8 GPUs
    ({"network": {"bandwidth": 1}}, ConfigError, "network.bandwidth"),
    ({"compute": {"matmul_eff": 0.5}}, ConfigError, "compute.matmul_eff"),
    ({"options": {"granularity": "op"}}, ConfigError, "options.granularity"),
    ({"options": {"coarse": True}}, ConfigError, "options.coarse"),
    ({"cluster": {"preset": "dgx-h900"}}, TopologyError, "cluster.preset"),
    ({"model": {"preset": "gpt5"}}, ConfigError, "model.preset"),
    ({"parallel": {"dp": 8, "schedul": "1f1b"}}, ConfigError, "parallel.schedul"),
    ({"extra": 1}, ConfigError, "extra"),
])
def test_invalid_documents_name_the_field(bad, error, field):
    with pytest.raises(error, match=field.replace(".", r"\.")):
        experiment_from_dict(doc(**bad))


def test_impossible_combinations_fail_at_load_time():
    # gpt2-small's learned position table has 1024 rows; tiny's 4 heads cannot split over tp = 8
    with pytest.raises(ConfigError, match=r"training\.seq_len: 2048 exceeds model\.max_seq_len=1024"):
        experiment_from_dict(doc(model="gpt2-small", training={"seq_len": 2048}))
    with pytest.raises(ConfigError, match=r"parallel\.tp: 8 does not divide model\.heads=4"):
        experiment_from_dict(doc(model="tiny", parallel={"tp": 8}))


def test_world_size_mismatch_suggests_dp():
    with pytest.raises(ConfigError, match="set dp to 8"):
        experiment_from_dict(doc(parallel={"dp": 4}))


# ----------------------------------------------------------------- memory
@pytest.mark.parametrize("zero", [0, 1, 2, 3])
@pytest.mark.parametrize("pp", [1, 2])
def test_model_states_follow_the_zero_formula(zero, pp):
    # Rajbhandari et al.'s (2 + 2 + 12)Ψ sharded by stage, with 16-bit gradients; ZeRO-3 (FSDP) also holds the
    # parameters it has gathered at its peak (two layers: the one running, the one prefetched, and its root
    # unit while it is gathered). ZeRO-2 here is DeepSpeed's (full 16-bit parameters on every rank).
    dp = 8 // pp
    impl = "fsdp" if zero == 3 else "auto"
    exp = experiment_from_dict(doc(parallel={"pp": pp, "dp": dp, "zero": zero, "global_batch": dp * pp,
                                             "zero_impl": impl}))
    for stage in range(pp):
        psi = small_params(stage, pp)
        m = memory_per_gpu(exp.model, exp.parallel, exp.training, stage=stage, grad_dtype_bytes=2)
        layer, per_stage = exp.model.params_per_layer(0), exp.model.layers // pp
        root = psi - layer * per_stage
        # The first stage holds its root (the embedding, used first forward and last backward) through the
        # layers: root + 2 layers. A later last stage releases its root (output layer) after that layer's
        # backward, which runs first: the larger of root + 1 layer (forward) and 2 layers (backward).
        live = (root + min(2, per_stage) * layer if stage == 0 else max(root + layer, 2 * layer)) if zero == 3 else 0
        assert m.parameters == pytest.approx(2 * psi / (dp if zero >= 3 else 1) + 2 * live, rel=1e-12)
        assert m.gradients == pytest.approx(2 * psi / (dp if zero >= 2 else 1), rel=1e-12)
        # Megatron (zero 0 and 1 here) keeps fp32 copies of 16-bit gradients besides the ZeRO paper's K = 12
        # (its distributed-optimizer docs: 20 bytes a parameter for 16-bit params and grads, 4 + 16/d sharded)
        k = 16 if exp.parallel.zero <= 1 else 12
        assert m.optimizer == pytest.approx(k * psi / (dp if zero >= 1 else 1), rel=1e-12)


def test_megatron_keeps_fp32_gradients_for_bf16():
    exp = experiment_from_dict(doc(parallel={"dp": 8, "zero": 1}))
    psi = small_params(0, 1)
    assert exp.memory().gradients == pytest.approx(4 * psi, rel=1e-12)   # grad_reduce_in_fp32


def test_summary_reports_the_memory_of_the_most_loaded_stage():
    exp = experiment_from_dict(doc(parallel={"dp": 8, "zero": 2}))   # DeepSpeed: 16-bit gradients, no gathers
    res = run_experiment(exp)
    mem = res.summary["memory_breakdown_bytes"]
    psi = small_params(0, 1)
    assert mem["parameters"] + mem["gradients"] + mem["optimizer"] == pytest.approx((2 + (2 + 12) / 8) * psi)
    assert res.summary["memory_per_gpu_bytes"] == pytest.approx(sum(mem.values()))  # bytes only
    assert set(mem) == {"parameters", "gradients", "optimizer", "activations"}
    assert res.summary["memory_stage"] in range(exp.parallel.pp)
    assert res.summary["fits_in_memory"] is True


def test_trillion_parameters_zero3_on_1024_gpus():
    # ZeRO paper, section 1: a 1T-parameter model needs ~16 TB of model states; ZeRO-3 over 1024 GPUs
    # brings that to ~15.6 GB per GPU. l = 128, h = 25472 (199 heads of 128), untied V = 51200.
    from workloads.sharding import zero_figures
    l, h, V = 128, 25472, 51200
    psi = l * (12 * h * h + 2 * h) + 2 * V * h + h            # = 0.9992e12
    exp = experiment_from_dict({
        "cluster": {"preset": "dgx-h100", "nodes": 128},
        "model": {"name": "1t", "layers": l, "hidden": h, "heads": 199, "kv_heads": 199, "ffn_hidden": 4 * h,
                  "vocab": V, "gated_mlp": False, "tied_embeddings": False},
        "parallel": {"dp": 1024, "zero": 3, "global_batch": 1024, "zero_impl": "fsdp"},
    })
    paper = zero_figures(exp.model.total_params(), 1024)[3]["model_states_bytes"]
    assert paper == pytest.approx(16 * psi / 1024, rel=1e-12)
    assert paper * 1024 == pytest.approx(16e12, rel=0.001)
    assert paper / GB == pytest.approx(15.6, abs=0.05)
    # FSDP also holds its gathered units at the peak: the root (embedding, output layer) and two layers.
    m = exp.memory()
    live = 2 * V * h + h + 2 * (12 * h * h + 2 * h)
    assert m.parameters + m.gradients + m.optimizer == pytest.approx(paper + 2 * live, rel=1e-9)


def test_out_of_memory_is_refused_unless_forced():
    exp = experiment_from_dict({"cluster": {"preset": "dgx-h100", "nodes": 1}, "model": "gpt3-175b",
                                "parallel": {"tp": 8}, "training": {"seq_len": 2048}})
    with pytest.raises(OutOfMemoryError, match="out of memory"):
        run_experiment(exp)
    res = run_experiment(exp, force=True)
    assert res.summary["fits_in_memory"] is False
    assert res.step_time > 0


# ------------------------------------------------------------- invariants
def test_deterministic():
    a = run_experiment(experiment_from_dict(DEMO_EXPERIMENT))
    b = run_experiment(experiment_from_dict(DEMO_EXPERIMENT))
    sa, sb = dict(a.summary), dict(b.summary)
    sa.pop("sim_wall_s"), sb.pop("sim_wall_s")
    assert sa == sb
    cols = ["rank", "name", "start_s", "end_s", "nbytes"]
    assert a.ops[cols].equals(b.ops[cols])
    assert a.links["bytes"].equals(b.links["bytes"])


def test_more_bandwidth_is_never_slower():
    times = []
    for nvlink, nic in [("450GB/s", "100Gbps"), ("450GB/s", "400Gbps"), ("900GB/s", "400Gbps"),
                        ("900GB/s", "800Gbps")]:
        d = copy.deepcopy(DEMO_EXPERIMENT)
        d["cluster"].update(nvlink_bandwidth=nvlink, nic_bandwidth=nic)
        times.append(run_experiment(experiment_from_dict(d)).step_time)
    assert times == sorted(times, reverse=True)
    assert times[0] > times[-1]


def test_mfu_and_throughput_are_consistent():
    exp = experiment_from_dict(DEMO_EXPERIMENT)
    res = run_experiment(exp)
    s = res.summary
    assert 0 < s["mfu"] < 1
    # MFU = model FLOPs / (step time · GPUs · peak); H100 SXM dense bf16 peak = 989.4 TFLOP/s
    assert s["mfu"] == pytest.approx(s["model_flops_per_step"] / (res.step_time * 16 * 989.4e12), rel=0.01)
    assert s["tflops_per_gpu"] == pytest.approx(s["model_flops_per_step"] / res.step_time / 16 / 1e12)
    # Narayanan et al. (SC'21): 72 B s l h² (1 + s/(6h) + V/(12 l h)) for GPT-2 small, B = 64, s = 1024
    B, s_, l, h, V = 64, 1024, 12, 768, 50257
    assert s["model_flops_per_step"] == pytest.approx(72 * B * s_ * l * h * h * (1 + s_ / (6 * h) + V / (12 * l * h)))
    assert s["hardware_flops_per_step"] >= s["model_flops_per_step"]
    assert s["tokens_per_s"] == pytest.approx(B * s_ / res.step_time)


def test_no_pipeline_no_bubble():
    res = run_experiment(experiment_from_dict(doc(parallel={"dp": 8, "global_batch": 16})))
    assert res.summary["bubble_fraction"] == pytest.approx(0.0, abs=1e-12)
    assert len(res.stages) == 1 and res.stages["ranks"].iloc[0] == 8


def test_tied_embedding_gradient_sync_uses_the_padded_vocabulary():
    # Megatron pads V = 500 to 512 (a multiple of 128); the tied embedding's gradient (fp32: Megatron's main
    # gradients of bf16 training) is all-reduced between the first and last stage: 2 ranks, ring payload
    # 2·(2-1)/2·S each.
    model = dict(SMALL, vocab=500, tied_embeddings=True)
    d = {"cluster": {"preset": "dgx-h100", "nodes": 1, "gpus_per_node": 2}, "model": model,
         "parallel": {"pp": 2, "dp": 1, "global_batch": 2}, "training": {"seq_len": 256}}
    res = run_experiment(experiment_from_dict(d))
    S = 512 * 256 * 4
    assert res.bytes_by_class["dp"] == pytest.approx(2 * S, rel=1e-12)


def test_yaml_reads_ratios_and_exponents_as_people_write_them(tmp_path):
    # YAML 1.1 reads `2:1` as the sexagesimal integer 121 and `5e7` as a string; experiment files use YAML 1.2's
    # reading: the ratio string (which oversubscription accepts) and a float.
    from simulator.experiment import load_experiment
    path = tmp_path / "exp.yaml"
    path.write_text("cluster: {preset: dgx-h100, nodes: 4, nodes_per_leaf: 2, spines: 1, oversubscription: 2:1}\n"
                    "model: {preset: tiny}\n"
                    "parallel: {dp: 32, zero: 3, zero_prefetch: 5e7}\ntraining: {seq_len: 128}\n")
    exp = load_experiment(path)
    assert exp.cluster.params["oversubscription"] == 2
    assert exp.parallel.zero_prefetch == 5e7


def test_version_is_reported():
    import subprocess
    import sys

    import simulator
    out = subprocess.run([sys.executable, "-m", "simulator.cli", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == f"clustersim {simulator.__version__}"


def test_summary_names_the_fidelity_that_ran_not_the_files():
    from simulator.experiment import DEMO_EXPERIMENT, experiment_from_dict, run_experiment
    exp = experiment_from_dict(DEMO_EXPERIMENT)
    assert exp.fidelity == "fast"
    result = run_experiment(exp, fidelity="lockstep")
    assert result.summary["setup"]["training"].endswith("fidelity lockstep")
    assert exp.fidelity == "fast"  # the experiment itself is untouched
