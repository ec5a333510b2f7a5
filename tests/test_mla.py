"""Multi-head latent attention (DeepSeek-V2/V3) against hand arithmetic on DeepSeek-V3's config.json.

HF deepseek-ai/DeepSeek-V3 config.json: hidden 7168, 128 heads, q_lora_rank 1536, kv_lora_rank 512,
qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128; 61 layers (3 dense, MLP 18432), 256 routed +
1 shared expert of 2048, top-8, vocab 129280, untied embeddings.
"""

import pytest

from workloads.errors import ConfigError
from workloads.flops import layer_ops, model_flops_per_step
from workloads.memory import activation_bytes_per_layer
from workloads.models import get_preset, model_from_dict
from workloads.sharding import layer_units

H, A, RQ, RKV, NOPE, ROPE, V = 7168, 128, 1536, 512, 128, 64, 128
QK = NOPE + ROPE                       # 192: query/key head width
Q_DOWN, Q_UP = H * RQ, RQ * A * QK
KV_DOWN, KV_UP = H * (RKV + ROPE), RKV * A * (NOPE + V)
OUT = A * V * H
MLA_MATMUL = Q_DOWN + Q_UP + KV_DOWN + KV_UP + OUT
MLA_PARAMS = MLA_MATMUL + RQ + RKV    # + the two latent RMSNorms
EXPERT = 3 * H * 2048                  # one SwiGLU expert
DENSE_MLP = 3 * H * 18432


def test_deepseek_v3_mla_params_per_layer():
    m = get_preset("deepseek-v3")
    assert MLA_PARAMS == 187_107_328
    assert m.attention_params() == MLA_PARAMS
    # TP 8: the down projections and latent norms are replicated, the up and output projections split by heads
    assert m.attention_params(8) == Q_DOWN + KV_DOWN + RQ + RKV + (Q_UP + KV_UP + OUT) // 8


def test_deepseek_v3_total_and_activated_params():
    m = get_preset("deepseek-v3")
    layer = MLA_PARAMS + 2 * H                      # + the two RMSNorms
    ends = 2 * 129280 * H + H                       # embedding, output layer, final norm
    total = 61 * layer + 3 * DENSE_MLP + 58 * (H * 256 + 257 * EXPERT) + ends
    active = 61 * layer + 3 * DENSE_MLP + 58 * (H * 256 + 9 * EXPERT) + ends
    assert m.total_params() == total == 671_026_404_352   # the report's 671B main model (MTP's 14B apart)
    assert m.active_params() == active == 37_552_282_624  # the report's 37B activated
    assert active == pytest.approx(37e9, rel=0.02)


@pytest.mark.parametrize("sp", [False, True])
def test_attention_kernels_under_tp(sp):
    m = get_preset("deepseek-v3")
    b, s, t = 2, 4096, 8
    tokens = b * s
    rows = tokens // t if sp else tokens
    fwd = {op.name: op for op in layer_ops(m, b, s, t, sequence_parallel=sp).forward}
    assert "qkv" not in fwd
    assert fwd["q_down"].shape == (rows, RQ, H)             # replicated: the rank's own (SP) tokens
    assert fwd["kv_down"].shape == (rows, RKV + ROPE, H)
    assert fwd["q_up"].shape == (tokens, A * QK // t, RQ)   # column-parallel by heads
    assert fwd["kv_up"].shape == (tokens, A * (NOPE + V) // t, RKV)
    assert fwd["attn_out"].shape == (tokens, H, A * V // t)  # row-parallel
    assert fwd["q_norm"].nbytes == 2 * 2 * rows * RQ and fwd["kv_norm"].nbytes == 2 * 2 * rows * RKV
    att = fwd["attention"]
    # Q K^T at head width 192 plus P V at 128, full s^2, A / t heads
    assert att.flops == 2 * b * s * s * (A // t) * QK + 2 * b * s * s * (A // t) * V
    assert att.nbytes == 2 * tokens * (2 * A * QK + 2 * A * V) / t   # reads Q, K, V, writes O
    assert att.shape == (s, s, (QK + V) // 2) and att.batch == b * A // t
    gemm_flops = sum(op.flops for op in fwd.values() if op.category == "gemm")
    assert gemm_flops == 2 * rows * (Q_DOWN + KV_DOWN) + 2 * tokens * (Q_UP + KV_UP + OUT) // t + 2 * tokens * (
        DENSE_MLP // t)


def test_causal_flash_kernel_counts_half_executes_half():
    m = get_preset("deepseek-v3")
    att = next(op for op in layer_ops(m, 1, 2048, causal=True).forward if op.name == "attention")
    assert att.flops == 2048 * 2048 * A * (QK + V) and att.executed == 1.0


def test_unfused_attention_gemms_at_their_head_widths():
    m = get_preset("deepseek-v3")
    fwd = {op.name: op for op in layer_ops(m, 1, 1024, 2, flash_attention=False).forward}
    assert fwd["attention_scores"].shape == (1024, 1024, QK) and fwd["attention_scores"].batch == A // 2
    assert fwd["attention_values"].shape == (1024, V, 1024)
    assert fwd["attention_scores"].flops + fwd["attention_values"].flops == 2 * 1024**2 * (A // 2) * (QK + V)


def test_model_flops_per_step_by_hand():
    m = get_preset("deepseek-v3")
    B, s = 16, 4096
    T = B * s
    weights = 61 * MLA_MATMUL + 3 * DENSE_MLP + 58 * (H * 256 + 9 * EXPERT)   # matmul weights a token uses
    attention = 61 * 2 * s * A * (QK + V)                                      # Q K^T + P V per token, full s^2
    assert model_flops_per_step(m, B, s) == 3 * (2 * weights + attention) * T + 6 * H * 129280 * T
    causal = 3 * (2 * weights + attention // 2) * T + 6 * H * 129280 * T
    assert model_flops_per_step(m, B, s, causal=True) == causal


def test_activation_bytes_by_hand():
    m = get_preset("deepseek-v3")
    s, b, t = 4096, 1, 4
    sbh = s * b * H
    # replicated: 2 norm inputs, attention and MLP inputs (2 bytes), no dropout masks (DeepSeek-V3 trains
    # without dropout); the latents: q_down and kv_down outputs, the normed latents (up-projection inputs)
    # and the key's rotary part
    replicated = 4 * 2 * sbh + 2 * s * b * (2 * RQ + 2 * RKV + ROPE)
    split = 2 * s * b * (A * QK + A * QK + A * V + A * V) + 2 * s * b * 18432 * 3   # Q, K, V, O; MLP
    got = activation_bytes_per_layer(m, 0, b, s, t, flash_attention=True)
    assert got == replicated + split / t


def test_zero3_units_cover_the_layer():
    m = get_preset("deepseek-v3")
    for t in (1, 4):
        units = layer_units(m, 0, t, 1, "module")
        assert units["out"].params == OUT // t
        assert units["qkv"].params == Q_DOWN + KV_DOWN + RQ + RKV + (Q_UP + KV_UP) // t
        assert sum(u.total for u in units.values()) + 2 * H == m.params_per_layer(0, t)
        assert layer_units(m, 0, t, 1, "layer")["layer"].total == m.params_per_layer(0, t)


def test_without_query_latent_one_query_projection():
    m = model_from_dict({"preset": "deepseek-v3", "q_lora_rank": None})
    assert m.attention_params() == H * A * QK + KV_DOWN + RKV + KV_UP + OUT
    names = [op.name for op in layer_ops(m, 1, 1024).forward]
    assert "q_proj" in names and "q_down" not in names and "q_norm" not in names


@pytest.mark.parametrize("override, field", [
    ({"kv_lora_rank": 512}, "model.qk_nope_head_dim"),                                   # dims missing
    ({"q_lora_rank": 1536}, "model.q_lora_rank"),                                        # no kv latent
    ({"v_head_dim": 128}, "model.v_head_dim"),
    ({"kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 0}, "model.v_head_dim"),
    ({"kv_lora_rank": -1, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128}, "model.kv_lora_rank"),
    ({"kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "kv_heads": 8},
     "model.kv_heads"),
    ({"kv_lora_rank": 1 << 30, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128},
     "model.kv_lora_rank"),
])
def test_invalid_mla_fields_one_line_errors(override, field):
    with pytest.raises(ConfigError) as e:
        model_from_dict({"preset": "llama3-8b", "kv_heads": 32, **override})
    assert str(e.value).startswith(field) and "\n" not in str(e.value)


def test_standard_attention_unchanged_shape_helpers():
    m = get_preset("llama3-70b")
    assert not m.is_mla and m.mla_projections() == {} and m.mla_norm_params() == 0
    assert m.attention_widths == (m.q_hidden, m.kv_hidden, m.kv_hidden, m.q_hidden)
    assert m.attention_head_dim == m.head_dim == m.qk_head_dim == m.v_dim == 128


# MLA's TP collectives (its latents, not b s h) are tests/test_mla_tp.py's.
