"""Per-op FLOPs against the closed forms of Narayanan et al. (SC'21)."""

import pytest

from workloads.flops import (
    LayerOp,
    embedding_ops,
    hardware_flops_per_step,
    layer_ops,
    logits_ops,
    model_flops_per_step,
    narayanan_flops_per_step,
    optimizer_op,
)
from workloads.models import get_preset, model_from_dict

GPT3 = get_preset("gpt3-175b")
B, S = 1536, 2048
L, H, V = 96, 12288, 51200


def megatron_72(B, s, l, h, V):
    """Narayanan et al. 2021, eq. (3) without recomputation."""
    return 72 * B * s * l * h**2 * (1 + s / (6 * h) + V / (12 * l * h))


def megatron_96(B, s, l, h, V):
    """Narayanan et al. 2021, eq. (3): full activation recomputation."""
    return 96 * B * s * l * h**2 * (1 + s / (6 * h) + V / (16 * l * h))


def _flops(ops):
    return sum(op.flops for op in ops)


def _step_flops(model, tp, micro_batch, sequence_parallel=False, recompute_forward=False):
    """Sum the per-rank ops over every layer, TP rank and micro-batch of a GPT-3 step."""
    n_micro = B // micro_batch
    layer = layer_ops(model, micro_batch, S, tp, sequence_parallel=sequence_parallel)
    per_layer = layer.flops + (_flops(layer.forward) if recompute_forward else 0.0)
    logits = logits_ops(model, micro_batch, S, tp, sequence_parallel=sequence_parallel).flops
    embed = embedding_ops(model, micro_batch, S, tp).flops
    return (model.layers * per_layer + logits + embed) * tp * n_micro


@pytest.mark.parametrize("tp, micro_batch, sp", [(1, 1, False), (8, 1, False), (8, 2, True)])
def test_gpt3_step_equals_megatron_formula(tp, micro_batch, sp):
    got = _step_flops(GPT3, tp, micro_batch, sp)
    assert got == pytest.approx(megatron_72(B, S, L, H, V), rel=1e-9)


def test_gpt3_full_recompute_equals_megatron_formula():
    got = _step_flops(GPT3, 8, 1, recompute_forward=True)
    assert got == pytest.approx(megatron_96(B, S, L, H, V), rel=1e-9)


def test_step_totals_equal_closed_forms():
    assert narayanan_flops_per_step(GPT3, B, S) == pytest.approx(megatron_72(B, S, L, H, V), rel=1e-12)
    assert model_flops_per_step(GPT3, B, S) == pytest.approx(megatron_72(B, S, L, H, V), rel=1e-9)
    assert hardware_flops_per_step(GPT3, B, S, recompute="full") == pytest.approx(
        megatron_96(B, S, L, H, V), rel=1e-9)
    # selective recompute repeats only the attention core: 4 B s^2 l h more than model FLOPs
    extra = hardware_flops_per_step(GPT3, B, S, recompute="selective") - model_flops_per_step(GPT3, B, S)
    assert extra == pytest.approx(4 * B * S**2 * L * H, rel=1e-9)


@pytest.mark.parametrize("name", ["llama3-70b", "llama3-405b"])
def test_flops_per_token_about_6n(name):
    # Kaplan et al. 2020: training costs ~6N FLOPs per token (attention adds 12 l h s / 6N, ~4% here).
    m = get_preset(name)
    s, t = 2048, 8
    per_rank = m.layers * layer_ops(m, 1, s, t).flops + logits_ops(m, 1, s, t).flops
    per_token = per_rank * t / s
    assert per_token == pytest.approx(6 * m.total_params(), rel=0.10)


def test_gemm_shapes_llama_tp():
    m = get_preset("llama3-8b")   # h 4096, kv_hidden 1024, ffn 14336, gated
    b, s, t = 2, 4096, 4
    fwd = {op.name: op for op in layer_ops(m, b, s, t).forward}
    assert fwd["qkv"].shape == (b * s, (4096 + 2 * 1024) // t, 4096)
    assert fwd["attn_out"].shape == (b * s, 4096, 4096 // t)
    assert fwd["mlp_up"].shape == (b * s, 2 * 14336 // t, 4096)       # gate and up fused
    assert fwd["mlp_down"].shape == (b * s, 4096, 14336 // t)
    for op in fwd.values():
        if op.category == "gemm":
            mm, nn, kk = op.shape
            assert op.flops == 2 * mm * nn * kk
            assert op.nbytes == 2 * (mm * kk + kk * nn + mm * nn)  # bf16 A, B read, C written
    # attention core: 2 * 2 b s^2 h / t; FlashAttention bytes: read Q, K, V, write O
    assert fwd["attention"].flops == 4 * b * s * s * 4096 / t
    assert fwd["attention"].nbytes == 2 * b * s * (4096 + 1024 + 1024 + 4096) / t


def test_backward_rules():
    ops = layer_ops(get_preset("llama3-8b"), 1, 2048, 2)
    fwd = {op.name: op for op in ops.forward}
    bwd = {op.name: op for op in ops.backward}
    assert ops.backward[0].name == "mlp_residual.bwd"            # reverse order
    m, n, k = fwd["qkv"].shape
    assert bwd["qkv.dgrad"].shape == (m, k, n) and bwd["qkv.wgrad"].shape == (k, n, m)
    assert bwd["qkv.dgrad"].flops == bwd["qkv.wgrad"].flops == fwd["qkv"].flops
    assert bwd["attention.bwd"].flops == 2 * fwd["attention"].flops
    assert _flops(ops.backward) == pytest.approx(2 * _flops(ops.forward))
    assert bwd["input_norm.bwd"].nbytes == 1.5 * fwd["input_norm"].nbytes
    assert all(op.flops == 0 for op in ops.forward if op.category == "elementwise")


def test_causal_halves_attention_only():
    m = get_preset("llama3-8b")
    full = {op.name: op.flops for op in layer_ops(m, 1, 4096).forward}
    causal = {op.name: op.flops for op in layer_ops(m, 1, 4096, causal=True).forward}
    assert causal["attention"] == full["attention"] / 2
    assert {k: v for k, v in causal.items() if k != "attention"} == \
           {k: v for k, v in full.items() if k != "attention"}
    half = 2 * 1 * 4096**2 * 4096 * 3 * 32   # (4 b s^2 h / 2) x 3 (fwd+bwd) x layers
    assert model_flops_per_step(m, 1, 4096) - model_flops_per_step(m, 1, 4096, causal=True) == half


def test_sequence_parallel_splits_elementwise_bytes():
    t = 4
    plain = {op.name: op for op in layer_ops(GPT3, 1, 2048, t).forward}
    sp = {op.name: op for op in layer_ops(GPT3, 1, 2048, t, sequence_parallel=True).forward}
    assert plain["input_norm"].nbytes == 2 * 2 * 2048 * H           # read + write b s h, bf16
    assert sp["input_norm"].nbytes == plain["input_norm"].nbytes / t
    assert sp["qkv"] == plain["qkv"]


def test_single_expert_moe_equals_dense_plus_router():
    dense = model_from_dict({"preset": "llama3-8b"})
    moe = model_from_dict({"preset": "llama3-8b", "experts": 1, "top_k": 1})
    extra = _flops(layer_ops(moe, 1, 2048).forward) - _flops(layer_ops(dense, 1, 2048).forward)
    assert extra == 2 * 2048 * 4096 * 1                              # router GEMM, one expert


def test_mixtral_layer_uses_top2_experts():
    m = get_preset("mixtral-8x7b")
    tokens = 4096
    mlp = sum(op.flops for op in layer_ops(m, 1, tokens).forward if op.name.startswith("experts_"))
    assert mlp == 2 * tokens * 2 * 3 * 4096 * 14336                 # 2 experts x 3 matrices per token


def test_logits_and_optimizer():
    fwd = {op.name: op for op in logits_ops(GPT3, 1, 2048, 8).forward}
    assert fwd["logits"].shape == (2048, V // 8, H)
    llama = {op.name: op for op in logits_ops(get_preset("llama3-8b"), 1, 2048, 8).forward}
    assert llama["logits"].shape[1] * 8 == 129024      # 128256 padded to a multiple of 128 * 8
    assert _flops(embedding_ops(GPT3, 1, 2048).forward) == 0
    op = optimizer_op(1e9)
    assert isinstance(op, LayerOp) and op.category == "optimizer"
    assert op.nbytes >= 24e9    # Adam reads and writes fp32 master, momentum and variance: >= 24 B/param


def test_unfused_attention_same_flops_more_bytes_and_slower():
    from simulator.compute import ComputeModel
    from topologies import get_gpu
    from workloads.models import get_preset
    from workloads.ops import Kernel
    m = get_preset("gpt3-175b")
    fused = layer_ops(m, 1, 2048, 8, flash_attention=True)
    unfused = layer_ops(m, 1, 2048, 8, flash_attention=False)
    assert unfused.flops == pytest.approx(fused.flops, rel=1e-12)
    # The unfused kernels write and re-read the s x s scores of a/t heads: at least 4 passes of 2 bytes.
    scores = 96 // 8 * 2048 * 2048
    extra = sum(o.nbytes for o in unfused.forward) - sum(o.nbytes for o in fused.forward)
    assert extra >= 4 * 2 * scores
    cm = ComputeModel(get_gpu("A100"))
    def t(ops):
        return sum(cm.duration(Kernel(o.category, o.flops, o.nbytes, o.shape)) for o in ops)
    assert t(unfused.forward) > t(fused.forward)
