"""FP8 training (``training.dtype: fp8``, Transformer Engine under Megatron-Core): kernels, memory, op graph.

Every expectation is a hand count from the rules in :mod:`workloads.flops` (a
cast-transpose reads 2 and writes 1 + 1 bytes per element; FP8 GEMM operands
are 1 byte, outputs bf16), Transformer Engine's delayed scaling (3 forward and
2 backward fp32 amaxes per FP8 GEMM, all-reduced over the stage) and Megatron's
``--fp8-param-gather``.
"""

import pytest

from simulator.experiment import experiment_from_dict, run_experiment
from workloads.errors import ConfigError
from workloads.flops import fp8_weight_params, layer_ops
from workloads.memory import activation_bytes_per_layer, memory_per_gpu
from workloads.models import get_preset, model_from_dict
from workloads.parallel import ParallelConfig, TrainingSpec, validate
from workloads.training import training_step

# A small GPT-shaped dense model: h = 256, 4 heads, MLP 4h, no biases (so weights are exactly the GEMMs').
H, F, V = 256, 1024, 1024
DENSE = model_from_dict({"name": "d", "layers": 4, "hidden": H, "heads": 4, "kv_heads": 4, "ffn_hidden": F,
                         "vocab": V, "gated_mlp": False, "tied_embeddings": False})


def _by_name(ops):
    return {o.name: o for o in ops}


# ------------------------------------------------------------------ kernels
def test_fp8_runs_exactly_the_four_linear_gemms_in_fp8_and_keeps_the_flops():
    bf16 = layer_ops(DENSE, 1, 512)
    fp8 = layer_ops(DENSE, 1, 512, fp8=True)
    assert fp8.flops == bf16.flops
    fp8_gemms = {o.name for o in fp8.forward if o.category == "gemm_fp8"}
    assert fp8_gemms == {"qkv", "attn_out", "mlp_up", "mlp_down"}
    assert {o.category for o in fp8.forward if o.name == "attention"} == {"attention"}  # bf16 core
    back = {o.name for o in fp8.backward if o.category == "gemm_fp8"}
    assert back == {f"{g}.{x}" for g in fp8_gemms for x in ("dgrad", "wgrad")}


@pytest.mark.parametrize("sp", [False, True])
def test_cast_bytes_hand_count(sp):
    m, t = 512, 2
    ops = layer_ops(DENSE, 1, m, t, sequence_parallel=sp, fp8=True)
    casts = {o.name: o.nbytes for o in ops.forward if o.category == "fp8_cast"}
    norm_fused = 1 if not sp else 4  # TE LayerNormLinear writes FP8 from the norm only without SP
    assert casts == {"qkv.fp8_cast": norm_fused * m * H, "attn_out.fp8_cast": 4 * m * H // t,
                     "mlp_up.fp8_cast": norm_fused * m * H, "mlp_down.fp8_cast": 4 * m * F // t}
    grads = {o.name: o.nbytes for o in ops.backward if o.category == "fp8_cast"}
    assert grads == {"qkv.fp8_cast_grad": 4 * m * 3 * H // t, "attn_out.fp8_cast_grad": 4 * m * H,
                     "mlp_up.fp8_cast_grad": 4 * m * F // t, "mlp_down.fp8_cast_grad": 4 * m * H}


def test_fp8_gemm_bytes_are_one_byte_operands_and_a_bf16_output():
    m = 512
    ops = layer_ops(DENSE, 1, m, fp8=True)
    fwd, bwd = _by_name(ops.forward), _by_name(ops.backward)
    # mlp_up: Y[m, F] = X[m, H] W[H, F]
    assert fwd["mlp_up"].nbytes == m * H + H * F + 2 * m * F
    assert bwd["mlp_up.dgrad"].nbytes == m * F + F * H + 2 * m * H   # dX = dY Wᵀ
    # wgrad accumulates into the fp32 main_grad in place (gradient_accumulation_fusion) in the generator;
    # here it writes the bf16 dW
    assert bwd["mlp_up.wgrad"].nbytes == H * m + m * F + 2 * H * F


def test_fp8_weight_params_are_the_gemm_matrices():
    assert fp8_weight_params(DENSE, 0, tp=2) == ((4 * H * H + 2 * H * F) // 2, 0)
    moe = get_preset("deepseek-v3")
    dense, routed = fp8_weight_params(moe, 3, tp=1, ep=8)
    one = 3 * moe.hidden * moe.expert_ffn_hidden
    # MLA's five projections (config.json widths: q_down, q_up, kv_down, kv_up, output)
    mla = 7168 * 1536 + 1536 * 128 * 192 + 7168 * (512 + 64) + 512 * 128 * (128 + 128) + 128 * 128 * 7168
    assert routed == 256 // 8 * one and dense == mla + one  # + 1 shared expert; router and norms stay bf16


# ------------------------------------------------------------------- memory
def test_memory_adds_the_fp8_weight_copy_and_transpose_unless_params_are_fp8():
    par = ParallelConfig(tp=2, pp=2, dp=2, zero=1, global_batch=8)
    bf16 = memory_per_gpu(DENSE, par, TrainingSpec(seq_len=512), stage=1)
    fp8 = memory_per_gpu(DENSE, par, TrainingSpec(seq_len=512, dtype="fp8"), stage=1)
    gathered = memory_per_gpu(DENSE, par, TrainingSpec(seq_len=512, dtype="fp8", fp8_param_gather=True), stage=1)
    weights = 2 * (4 * H * H + 2 * H * F) // 2  # two layers on the stage, one TP half each
    assert fp8.parameters - bf16.parameters == 2 * weights  # FP8 copy + FP8 transpose
    assert (fp8.gradients, fp8.optimizer) == (bf16.gradients, bf16.optimizer)
    assert gathered.parameters == bf16.parameters  # 1-byte weight + 1-byte transpose = a bf16 weight
    assert gathered.activations == fp8.activations


def test_fp8_keeps_the_fp8_gemms_inputs_in_one_byte_by_hand():
    """Transformer Engine saves an FP8 GEMM's input as its FP8 copy: per layer and micro-batch the QKV and MLP
    inputs (``s b h`` each, replicated over TP without SP) and the projection and fc2 inputs (``s b h / t`` and
    ``s b f / t``) take 1 byte instead of 2. The last of 2 stages holds 2 layers of 1 micro-batch (1F1B)."""
    s, b, t = 512, 1, 2
    par = ParallelConfig(tp=2, pp=2, dp=2, zero=1, global_batch=8)
    bf16 = memory_per_gpu(DENSE, par, TrainingSpec(seq_len=s), stage=1)
    fp8 = memory_per_gpu(DENSE, par, TrainingSpec(seq_len=s, dtype="fp8"), stage=1)
    per_layer = 2 * s * b * H + s * b * (H + F) // t  # elements, one byte saved each
    assert bf16.activations - fp8.activations == 2 * 1 * per_layer


def test_fp8_activations_of_a_gpt_layer_with_sp_and_selective_recompute_are_27_sbh_over_t():
    """Korthikanti et al.'s ``34 s b h / t`` (SP + selective) under FP8: the QKV and MLP inputs (1 sbh each),
    the projection input (1) and the fc2 input (4) of its 34 go from 2 bytes to 1: ``27 s b h / t``."""
    s, b, t = 2048, 1, 8
    gpt = model_from_dict({"name": "g", "layers": 2, "hidden": 1024, "heads": 8, "kv_heads": 8,
                           "ffn_hidden": 4096, "vocab": 1024, "gated_mlp": False, "tied_embeddings": False})
    got = activation_bytes_per_layer(gpt, 0, b, s, t, sequence_parallel=True, recompute="selective", fp8=True)
    assert got == 27 * s * b * 1024 / t
    assert activation_bytes_per_layer(gpt, 0, b, s, t, sequence_parallel=True, recompute="selective") \
        == 34 * s * b * 1024 / t


@pytest.mark.parametrize("shared", [0, 1])
def test_fp8_activations_of_a_moe_layer_by_hand(shared):
    """A MoE layer under FP8 saves one byte per element of: the QKV input (``s b h``), the routed copies
    entering the experts (``k s b h``), the projection input (``s b q / t``) and the experts' fc2 inputs
    (``s b f_e (k + shared) / t``). Its MLP input stays bf16 for the router (a bf16 GEMM); a shared expert
    adds its own FP8 copy of it (one byte more)."""
    from dataclasses import replace

    from workloads.models import get_preset

    m = replace(get_preset("mixtral-8x7b"), shared_experts=shared)
    s, b, t = 1024, 2, 2
    h, k = m.hidden, m.top_k
    kw = dict(sequence_parallel=False, recompute="selective")
    bf16 = activation_bytes_per_layer(m, 0, b, s, t, **kw)
    fp8 = activation_bytes_per_layer(m, 0, b, s, t, fp8=True, **kw)
    saved = s * b * h * (1 + k - shared) + s * b * (m.q_hidden + m.expert_ffn_hidden * (k + shared)) / t
    assert bf16 - fp8 == saved


# -------------------------------------------------------------- op graph
def _step(dtype="fp8", gather=False, **par):
    cfg = {"tp": 2, "pp": 2, "dp": 2, "zero": 1, "global_batch": 8, **par}
    return training_step(DENSE, ParallelConfig(**cfg), TrainingSpec(seq_len=512, dtype=dtype,
                                                                     fp8_param_gather=gather))


def test_amax_reductions_one_per_chunk_pass_over_the_stage_with_te_entry_counts():
    step = _step()
    m = step.num_micro_batches
    amax = [op for op in step.graph.ops if op.rank == 0 and op.name.endswith("fp8_amax")]
    assert len(amax) == 2 * m  # forward and backward of each micro-batch (one chunk)
    stage0 = tuple(sorted(r for r in range(8) if step.layout.coords(r).pp == 0))
    assert all(tuple(sorted(op.group)) == stage0 and op.collective == "all_reduce" for op in amax)
    gemms = 2 * 4  # two layers of four FP8 GEMMs on the stage
    assert sorted({op.nbytes for op in amax}) == [4 * 2 * gemms, 4 * 3 * gemms]


def test_weights_are_cast_once_per_step_per_chunk():
    for gather, per_weight in ((False, 4), (True, 2)):
        step = _step(gather=gather, schedule="interleaved", virtual_stages=2, pp=2)
        casts = [op for op in step.graph.ops if op.rank == 0 and op.name.endswith("fp8_weight_cast")]
        assert len(casts) == 2  # one per chunk (each chunk: one layer)
        assert {op.nbytes for op in casts} == {per_weight * (4 * H * H + 2 * H * F) // 2}


def test_fp8_param_gather_all_gathers_one_byte_per_fp8_weight():
    def gathered(step):
        return sum(op.nbytes * op.count for op in step.graph.ops
                   if op.rank == 2 and op.kind == "collective" and op.name == "param_all_gather")
    # rank 2: tp 0, dp 1, pp 0 (placement tp, dp, pp): two layers and the embedding
    bf16, fp8 = gathered(_step(dtype="bf16")), gathered(_step(gather=True))
    weights = 2 * (4 * H * H + 2 * H * F) // 2
    assert bf16 - fp8 == pytest.approx(weights)  # 2 bytes -> 1 byte per FP8 weight, the rest unchanged


def test_bad_fp8_configurations_are_one_line_errors():
    with pytest.raises(ConfigError, match="training.fp8_param_gather"):
        TrainingSpec(fp8_param_gather=True)
    with pytest.raises(ConfigError, match="training.dtype: fp8"):
        validate(DENSE, ParallelConfig(dp=2, zero=3), TrainingSpec(dtype="fp8"))
    with pytest.raises(ConfigError, match="parallel.zero: 1"):
        validate(DENSE, ParallelConfig(dp=2, zero=0), TrainingSpec(dtype="fp8", fp8_param_gather=True))
    doc = {"cluster": {"preset": "dgx-a100", "nodes": 1}, "model": {"preset": "gpt2-small"},
           "parallel": {"tp": 4}, "training": {"dtype": "fp8", "seq_len": 1024}}
    with pytest.raises(ValueError, match="fp8"):
        experiment_from_dict(doc)


# ----------------------------------------------------------- end to end
def _doc(dtype, **par):
    return {"cluster": {"preset": "dgx-h100", "nodes": 2}, "model": {"preset": "gpt3-13b"},
            "parallel": {"tp": 4, "pp": 2, "dp": 2, "global_batch": 8, "sequence_parallel": True, "zero": 1,
                         **par},
            "training": {"seq_len": 2048, "dtype": dtype}}


def test_fp8_step_is_faster_but_not_twice_as_fast_and_mfu_counts_the_bf16_peak():
    bf16 = run_experiment(experiment_from_dict(_doc("bf16")))
    fp8 = run_experiment(experiment_from_dict(_doc("fp8")))
    assert bf16.step_time / 2 < fp8.step_time < bf16.step_time  # attention, norms, comm stay bf16
    # same model FLOPs over the same (bf16) peak: MFU scales with the inverse step time
    assert fp8.summary["mfu"] / bf16.summary["mfu"] == pytest.approx(bf16.step_time / fp8.step_time)


@pytest.mark.parametrize("fidelity", ["fast", "lockstep"])
def test_fp8_representatives_agree_with_full(fidelity):
    exp = experiment_from_dict(_doc("fp8", zero=1))
    full = run_experiment(exp, fidelity="full")
    rep = run_experiment(exp, fidelity=fidelity)
    assert rep.step_time == pytest.approx(full.step_time, rel=0.02)
    assert rep.bytes_by_class["sync"] == pytest.approx(full.bytes_by_class["sync"])


def test_the_fp8_example_loads_and_fits():
    from pathlib import Path

    from simulator.experiment import load_experiment
    exp = load_experiment(Path(__file__).resolve().parents[1] / "examples" / "llama3-70b-fp8-h100.yaml")
    assert exp.training.fp8 and exp.training.fp8_param_gather and exp.cluster.num_gpus == 64
    assert exp.memory().fits(80e9)


def test_the_mlperf_style_gpt3_example_loads_and_fits():
    from pathlib import Path

    from simulator.experiment import load_experiment
    exp = load_experiment(Path(__file__).resolve().parents[1] / "examples" / "gpt3-175b-mlperf-fp8-h100.yaml")
    par = exp.parallel
    assert (par.tp, par.pp, par.virtual_stages, exp.training.dtype) == (4, 8, 4, "fp8")
    assert exp.memory().fits(80e9)


def test_fp8_activations_of_an_mla_moe_layer_by_hand():
    """DeepSeek-V3's MLA MoE layer: besides the MoE terms (above, one shared expert), the latents' up
    projection inputs (``s b (q_lora + kv_lora)``, the latent norms' outputs) are FP8; the down projections'
    input is the QKV input (the input norm's output). The projection input (width ``o``) stays bf16: the fused
    attention core keeps it for its own backward and the projection reuses it (recomputing the core, below,
    leaves only the projection's FP8 copy)."""
    from workloads.models import get_preset

    m = get_preset("deepseek-v3")
    s, b, t = 4096, 1, 1
    layer = 5
    assert m.is_moe_layer(layer) and m.shared_experts == 1
    _q, _k, _v, ow = m.attention_widths
    bf16 = activation_bytes_per_layer(m, layer, b, s, t, flash_attention=True)
    fp8 = activation_bytes_per_layer(m, layer, b, s, t, flash_attention=True, fp8=True)
    saved = (s * b * m.hidden * m.top_k + s * b * (m.q_lora_rank + m.kv_lora_rank)
             + s * b * m.expert_ffn_hidden * (m.top_k + 1))
    assert bf16 - fp8 == saved
    kw = dict(flash_attention=True, recompute="selective", recompute_modules=("core_attn",))
    assert activation_bytes_per_layer(m, layer, b, s, t, **kw) - activation_bytes_per_layer(m, layer, b, s, t,
                                                                                             fp8=True, **kw) \
        == saved + s * b * ow
