"""A helper's hunt over the memory model (2026-12-04), each case against an independent count: the tokens
entering the routed experts under TP + SP are the rows the experts' GEMMs run (gathered over the expert-TP
group), not a 1/t share."""

from __future__ import annotations

import pytest

from workloads.flops import layer_ops
from workloads.memory import activation_bytes_per_layer
from workloads.models import get_preset


@pytest.mark.parametrize("preset, t", [("qwen3-235b-a22b", 4), ("mixtral-8x7b", 8), ("mixtral-8x7b", 2)])
def test_the_routed_experts_saved_input_is_the_rows_their_gemms_run(preset, t):
    # Under TP with sequence parallelism a rank holds s b / t tokens; Megatron-Core's dispatcher all-gathers the
    # routed tokens over the expert-TP group (etp = t by default), so the experts' fc1 runs (and saves the input
    # of) s b k rows: the m of its GEMM (flops.py). The model divided it by t: Qwen3 at s 4096, t 4 saved 64 MiB
    # of a 256 MiB input (2 bytes x 32,768 rows x 4,096).
    model, s = get_preset(preset), 4096
    up = next(op for op in layer_ops(model, 1, s, t, sequence_parallel=True).forward if op.name == "experts_up")
    rows, hidden = up.shape[0], model.hidden
    assert rows == s * model.top_k  # (the GEMM side: b s k rows on every expert-TP rank)
    saved = rows * hidden * 2  # bf16
    whole = activation_bytes_per_layer(model, 0, 1, s, t, sequence_parallel=True, recompute="selective")
    share = activation_bytes_per_layer(model, 0, 1, s, t, sequence_parallel=True, recompute="selective", etp=1)
    # etp = 1 under TP: no gather, this rank's 1/t of the tokens (the expert grid); the difference is the rest
    assert whole - share == pytest.approx(saved * (t - 1) / t)
    assert whole == activation_bytes_per_layer(model, 0, 1, s, t, sequence_parallel=True, recompute="selective",
                                               etp=t)


@pytest.mark.parametrize("dtype, zero, per_param", [
    # Megatron-LM's distributed-optimizer docs: bytes per parameter, non-distributed / distributed over d
    ("fp16", 0, 20.0), ("fp16", 1, 4 + 16 / 8),  # fp16 params, fp16 grads (+ their fp32 main-grad copy)
    ("bf16", 0, 18.0), ("bf16", 1, 6 + 12 / 8),  # bf16 params, fp32 grads
    ("fp32", 0, 16.0), ("fp32", 1, 8 + 8 / 8),  # fp32 params and grads
])
def test_megatron_model_states_per_parameter_are_its_documented_table(dtype, zero, per_param):
    # Before: fp16 read 16 and 5.5 (the fp32 copies of the fp16 gradients left out).
    from workloads.memory import memory_per_gpu, stage_params
    from workloads.parallel import ParallelConfig, TrainingSpec
    model = get_preset("gpt3-13b")
    par = ParallelConfig(tp=8, pp=1, dp=8, global_batch=8, zero=zero)
    mem = memory_per_gpu(model, par, TrainingSpec(dtype=dtype), 0)
    n = sum(stage_params(model, par, 0))
    assert (mem.parameters + mem.gradients + mem.optimizer) / n == pytest.approx(per_param)


def test_fp16_gradients_are_copied_to_fp32_before_the_optimizer_reads_them():
    from workloads.flops import optimizer_step_ops
    before, after = optimizer_step_ops(100.0, 800.0, 2, 2, fp32_main_grads=True)
    assert [(op.name, op.nbytes) for op in before] == [("grad_copy", 600.0), ("grad_norm", 400.0)]
    assert [(op.name, op.nbytes) for op in after] == [("optimizer", 2800.0), ("param_copy", 600.0),
                                                      ("zero_grad", 1600.0)]
    plain, _ = optimizer_step_ops(100.0, 800.0, 4, 2)  # bf16: the fp32 buffer is read in place
    assert [(op.name, op.nbytes) for op in plain] == [("grad_norm", 400.0)]


FP8_70B = {"cluster": {"preset": "dgx-h100", "nodes": 8}, "model": {"preset": "llama3-70b"},
           "parallel": {"tp": 8, "pp": 4, "dp": 2, "micro_batch": 3, "global_batch": 24, "schedule": "interleaved",
                        "virtual_stages": 5, "zero": 1, "sequence_parallel": True, "recompute": "selective"},
           "training": {"seq_len": 8192, "dtype": "fp8", "fp8_param_gather": True}}


def test_fp8_layernorm_and_moe_act_recompute_are_noted_and_offered_with_the_caveat():
    # Megatron-Core (transformer_config.py): "Delayed scaling does not support moe_act and layernorm recompute
    # for fp8" (other recipes, and DeepSeek-V3's fine-grained FP8, do). Before, the out-of-memory message offered
    # layernorm recompute first without a word.
    from simulator.experiment import experiment_from_dict, memory_remedies, unused_settings
    offered = [what for what, _ in memory_remedies(experiment_from_dict(FP8_70B))]
    assert offered[0] == ("parallel.recompute: selective, parallel.recompute_modules: [core_attn, layernorm] (under "
                          "FP8, Megatron-Core recomputes layernorm only with a recipe other than delayed scaling)")
    bf16 = experiment_from_dict({**FP8_70B, "training": {"seq_len": 8192}, "cluster": {"preset": "dgx-h200",
                                                                                        "nodes": 8}})
    assert not any("delayed scaling" in what for what, _ in memory_remedies(bf16))
    chosen = experiment_from_dict({**FP8_70B, "parallel": {**FP8_70B["parallel"],
                                                            "recompute_modules": ["core_attn", "layernorm"]}})
    assert any(n.startswith("parallel.recompute_modules: layernorm with dtype fp8: Megatron-Core refuses it under "
                            "its delayed-scaling FP8 recipe") for n in unused_settings(chosen))


def test_deepspeed_zero_2_3_under_pipeline_parallelism_is_noted_and_not_offered():
    # DeepSpeed's PipelineEngine: assert zero_optimization_stage() < 2, "ZeRO-2 and ZeRO-3 are incompatible with
    # pipeline parallelism". Before, pp 4 with zero 3 ran silently and an out-of-memory step was told zero 2 / 3.
    from simulator.experiment import experiment_from_dict, memory_remedies, unused_settings
    doc = {"cluster": {"preset": "dgx-h100", "nodes": 4}, "model": {"preset": "gpt3-13b"},
           "parallel": {"tp": 1, "pp": 4, "dp": 8, "micro_batch": 2, "global_batch": 64, "zero": 0},
           "training": {"seq_len": 2048}, "options": {"flash_attention": True}}
    offered = [what for what, _ in memory_remedies(experiment_from_dict(doc))]
    assert "parallel.zero: 1" in offered and not any(w in offered for w in ("parallel.zero: 2", "parallel.zero: 3"))
    three = {**doc, "parallel": {**doc["parallel"], "zero": 3}}
    assert any(n.startswith("parallel.zero: 3 with pp 4 and zero_impl deepspeed: DeepSpeed's pipeline engine "
                            "refuses ZeRO-2/3") for n in unused_settings(experiment_from_dict(three)))
    flat = {**three, "parallel": {**three["parallel"], "pp": 1, "dp": 32}}
    assert not any("pipeline engine" in n for n in unused_settings(experiment_from_dict(flat)))
