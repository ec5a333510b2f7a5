"""Memory per GPU against the ZeRO paper and Korthikanti et al.'s activation formulas."""

import dataclasses

import pytest

from workloads.errors import ConfigError
from workloads.memory import (
    MemoryBreakdown,
    activation_bytes_per_layer,
    memory_per_gpu,
    micro_batches_in_flight,
    model_state_bytes,
)
from workloads.models import get_preset, model_from_dict
from workloads.parallel import ParallelConfig, TrainingSpec

GB = 1e9


# ------------------------------------------------------------ model states
@pytest.mark.parametrize("zero, paper_gb", [(0, 120), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_paper_figure1(zero, paper_gb):
    # Rajbhandari et al. SC'20, Figure 1: Psi = 7.5B, N_d = 64, K = 12.
    total = sum(model_state_bytes(7.5e9, dp=64, zero=zero))
    assert total / GB == pytest.approx(paper_gb, abs=0.05)


def test_zero3_trillion_parameters_on_1024_gpus():
    # ZeRO paper, section 1: 1T parameters need ~16 TB of model states; ZeRO-3 on 1024 GPUs: ~16 GB each.
    per_gpu = sum(model_state_bytes(1e12, dp=1024, zero=3))
    assert per_gpu * 1024 == pytest.approx(16e12)
    assert per_gpu / GB == pytest.approx(15.6, abs=0.05)


def test_fp32_has_no_master_copy():
    assert model_state_bytes(1.0, dtype_bytes=4) == (4.0, 4.0, 8.0)


def test_memory_per_gpu_model_states_unsharded_and_zero3():
    tiny = get_preset("tiny")       # tied embeddings, vocab 512 (a multiple of 128: no padding)
    psi = tiny.total_params()
    train = TrainingSpec(seq_len=128)
    m = memory_per_gpu(tiny, ParallelConfig(), train, grad_dtype_bytes=2)
    # (Megatron with 16-bit gradients: + their fp32 copies, 4 bytes a parameter; 20 in all, as its docs say)
    assert (m.parameters, m.gradients, m.optimizer) == (2 * psi, 2 * psi, 16 * psi)
    z3 = memory_per_gpu(tiny, ParallelConfig(dp=4, zero=3, zero_impl="fsdp"), train)
    live = psi - tiny.params_per_layer(0) * (tiny.layers - 2)       # root unit + two layers gathered at the peak
    assert (z3.parameters, z3.gradients, z3.optimizer) == (2 * psi / 4 + 2 * live, 2 * psi / 4, 12 * psi / 4)
    assert z3.activations == m.activations


def test_expert_states_shard_over_expert_dp():
    # Mixtral with ep = dp = 8: each GPU holds one of the 8 experts of every layer.
    mix = get_preset("mixtral-8x7b")
    one_expert = 3 * 4096 * 14336
    held = mix.total_params() - 32 * 7 * one_expert
    m = memory_per_gpu(mix, ParallelConfig(dp=8, ep=8), TrainingSpec(seq_len=1024))
    assert m.parameters == 2 * held
    # ZeRO-1: dense optimizer state split 8 ways, each expert's over its expert-DP group of 1
    z1 = memory_per_gpu(mix, ParallelConfig(dp=8, ep=8, zero=1), TrainingSpec(seq_len=1024))
    experts = 32 * one_expert
    assert z1.optimizer == pytest.approx(12 * (held - experts) / 8 + 12 * experts)


def test_tp_pp_split_the_model():
    # GPT-3 on TP8 x PP8: a middle stage holds 12 layers of 12h^2/8 (+ small replicated terms).
    gpt3 = get_preset("gpt3-175b")
    p = ParallelConfig(tp=8, pp=8, dp=16, global_batch=1536)
    mid = memory_per_gpu(gpt3, p, TrainingSpec(), stage=3)
    assert mid.parameters / 2 == pytest.approx(12 * 12 * 12288**2 / 8, rel=0.001)
    first = memory_per_gpu(gpt3, p, TrainingSpec(), stage=0)
    assert first.parameters / 2 - mid.parameters / 2 == pytest.approx((51200 / 8 + 2048) * 12288, rel=1e-9)


# -------------------------------------------------------------- activations
# A small GPT-shaped model: h = 1024, a = 16, ffn = 4h, kv = heads.
SMALL = model_from_dict({"name": "small", "layers": 8, "hidden": 1024, "heads": 16, "kv_heads": 16,
                         "ffn_hidden": 4096, "vocab": 1024, "gated_mlp": False, "tied_embeddings": True})
s, b, h, a, t = 512, 2, 1024, 16, 4
sbh = s * b * h


@pytest.mark.parametrize("sp, recompute, korthikanti", [
    (False, "none", sbh * (10 + 24 / t + 5 * a * s / (h * t))),
    (True, "none", sbh / t * (34 + 5 * a * s / h)),
    (False, "selective", sbh * (10 + 24 / t)),
    (True, "selective", 34 * sbh / t),
    (False, "full", 2 * sbh),
    (True, "full", 2 * sbh / t),
])
def test_activation_table2(sp, recompute, korthikanti):
    # Korthikanti et al. 2022, Table 2 (bytes per layer, 16-bit activations).
    got = activation_bytes_per_layer(SMALL, 0, b, s, t, sequence_parallel=sp, recompute=recompute)
    assert got == pytest.approx(korthikanti, rel=1e-12)


def test_activation_no_tp_is_34_plus_5as_over_h():
    got = activation_bytes_per_layer(SMALL, 0, b, s, 1)
    assert got == pytest.approx(sbh * (34 + 5 * a * s / h), rel=1e-12)
    flash = activation_bytes_per_layer(SMALL, 0, b, s, 1, flash_attention=True)
    assert flash == pytest.approx(34 * sbh, rel=1e-12)


def test_in_flight_counts():
    one = ParallelConfig(pp=4, global_batch=16)               # m = 16
    assert [micro_batches_in_flight(one, i) for i in range(4)] == [4, 3, 2, 1]
    few = ParallelConfig(pp=4, global_batch=2)                # m < p
    assert micro_batches_in_flight(few, 0) == 2
    gpipe = ParallelConfig(pp=4, global_batch=16, schedule="gpipe")
    assert [micro_batches_in_flight(gpipe, i) for i in range(4)] == [16] * 4
    inter = ParallelConfig(pp=4, global_batch=16, schedule="interleaved", virtual_stages=2)
    # Narayanan et al.: first stage holds (1 + (p-1)/(p v)) times 1F1B's p micro-batches
    assert micro_batches_in_flight(inter, 0) == pytest.approx(4 * (1 + 3 / 8))
    assert micro_batches_in_flight(inter, 0) > micro_batches_in_flight(one, 0)


def test_schedule_drives_activation_memory():
    train = TrainingSpec(seq_len=s)
    per_layer = 34 * sbh / t                                  # selective + SP, Table 2
    layers_per_stage = 8 // 4

    def first_stage(schedule):
        p = ParallelConfig(tp=t, pp=4, global_batch=16 * b, micro_batch=b, schedule=schedule,
                           sequence_parallel=True, recompute="selective")
        return memory_per_gpu(SMALL, p, train, stage=0).activations

    assert first_stage("1f1b") == pytest.approx(4 * layers_per_stage * per_layer)      # p in flight
    assert first_stage("gpipe") == pytest.approx(16 * layers_per_stage * per_layer)    # m in flight


def test_default_stage_is_most_loaded_and_reporting():
    gpt3 = get_preset("gpt3-175b")
    p = ParallelConfig(tp=8, pp=8, dp=16, global_batch=1536, sequence_parallel=True,
                       recompute="selective", zero=1)
    worst = memory_per_gpu(gpt3, p, TrainingSpec())
    assert worst.total == max(memory_per_gpu(gpt3, p, TrainingSpec(), stage=i).total for i in range(8))
    assert worst.fits(80e9) and not worst.fits(worst.total - 1)
    assert worst.describe().startswith(f"stage {worst.stage}: params")
    mb = MemoryBreakdown(1.0, 2.0, 3.0, 4.0)
    assert mb.total == 10.0


def test_invalid_config_is_rejected():
    with pytest.raises(ConfigError, match="parallel.tp"):
        memory_per_gpu(get_preset("gpt3-175b"), ParallelConfig(tp=5), TrainingSpec())
    with pytest.raises(ConfigError, match="stage: 8"):
        memory_per_gpu(get_preset("gpt3-175b"), ParallelConfig(pp=8, global_batch=8), TrainingSpec(), stage=8)


@pytest.mark.parametrize("flash", [False, True])
def test_full_recompute_adds_the_recomputed_layers_activations(flash):
    # Korthikanti et al. Table 2 count 2 s b h per layer under full recompute (the checkpointed inputs); the
    # layer being recomputed then holds its whole activations for its backward (one micro-batch, one layer),
    # whose first term is its own checkpoint (the first norm's input, 2 s b h / t), counted once:
    # GPT-3 175B, s 2048, b 1, t 8 with SP, 1F1B on 8 stages, stage 0 (8 micro-batches in flight, 12 layers):
    # 8 * 12 * 2 s b h / t + s b h / t (34 + 5 a s / h) - 2 s b h / t (without flash; 34 with), no logits on
    # stage 0. (Until 2026-12-04 the recomputed layer's checkpoint was counted twice.)
    model = get_preset("gpt3-175b")
    s, b, h, t, a = 2048, 1, model.hidden, 8, model.heads
    par = ParallelConfig(tp=t, pp=8, global_batch=64, sequence_parallel=True, recompute="full")
    acts = memory_per_gpu(model, par, TrainingSpec(seq_len=s), stage=0, flash_attention=flash).activations
    sbh = s * b * h
    layer = sbh / t * (34 + (0 if flash else 5 * a * s / h))
    assert acts == pytest.approx(8 * 12 * 2 * sbh / t + layer - 2 * sbh / t, rel=1e-12)


@pytest.mark.parametrize("flash, recompute, expanded", [(False, "none", True), (True, "none", False),
                                                        (False, "selective", False)])
def test_unfused_gqa_attention_keeps_expanded_keys_and_values(flash, recompute, expanded):
    # Megatron-Core's unfused DotProductAttention repeat_interleaves K and V to every query head before its
    # batched GEMMs, which save the expanded copies: K and V at the query width. A fused kernel, or a core
    # checkpointed by selective recompute, keeps them at the grouped width. Llama 3 8B: 32 query heads, 8 groups.
    gqa = get_preset("llama3-8b")
    mha = dataclasses.replace(gqa, name="mha", kv_heads=gqa.heads)
    s, d = 4096, 2
    diff = (activation_bytes_per_layer(mha, 0, 1, s, recompute=recompute, flash_attention=flash)
            - activation_bytes_per_layer(gqa, 0, 1, s, recompute=recompute, flash_attention=flash))
    assert diff == pytest.approx(0.0 if expanded else 2 * d * s * (gqa.q_hidden - gqa.kv_hidden), abs=1e-6)
