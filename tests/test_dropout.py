"""``model.dropout``: at 0 (Llama 3, Mixtral, DeepSeek-V3, Qwen3) no dropout mask is stored and unfused
attention runs no dropout kernel (PyTorch's dropout returns its input at p = 0); at Megatron-LM's default 0.1
(GPT-3) Korthikanti et al.'s table holds. Hand counts from the table's terms."""

import dataclasses

import pytest

from workloads.errors import ConfigError
from workloads.flops import layer_ops
from workloads.memory import activation_bytes_per_layer
from workloads.models import get_preset, model_from_dict

GPT = dict(name="g", layers=2, hidden=1024, heads=8, kv_heads=8, ffn_hidden=4096, vocab=1024, gated_mlp=False,
           tied_embeddings=False)
S, B, T, H, A = 2048, 1, 8, 1024, 8


@pytest.mark.parametrize("dropout, sp_selective, plain", [
    (0.1, 34, (10, 24, 5)),   # Korthikanti Table 2: s b h (10 + 24/t + 5 a s / (h t)); SP + selective 34 s b h / t
    (0.0, 32, (8, 24, 2)),    # without the two 1-byte masks (2 s b h), the score mask and dropout output (3 a s^2 b)
])
def test_activations_by_hand(dropout, sp_selective, plain):
    m = model_from_dict({**GPT, "dropout": dropout})
    got = activation_bytes_per_layer(m, 0, B, S, T, sequence_parallel=True, recompute="selective")
    assert got == sp_selective * S * B * H / T
    replicated, split, scores = plain
    got = activation_bytes_per_layer(m, 0, B, S, T)
    assert got == pytest.approx(S * B * H * (replicated + split / T + scores * A * S / (H * T)), rel=1e-15)


def test_unfused_attention_without_dropout_has_no_dropout_kernel():
    with_ = layer_ops(model_from_dict({**GPT, "dropout": 0.1}), 1, 512, 2, flash_attention=False)
    without = layer_ops(model_from_dict({**GPT, "dropout": 0.0}), 1, 512, 2, flash_attention=False)
    names = [o.name for o in with_.forward + with_.backward if "dropout" in o.name]
    assert names == ["attention_dropout", "attention_dropout.bwd"]
    assert not [o for o in without.forward + without.backward if "dropout" in o.name]
    assert without.flops == with_.flops  # an element-wise kernel: bytes, not FLOPs
    dropout_bytes = sum(o.nbytes for o in with_.forward + with_.backward if "dropout" in o.name)
    assert sum(o.nbytes for o in with_.forward + with_.backward) \
        - sum(o.nbytes for o in without.forward + without.backward) == dropout_bytes


def test_presets_of_models_trained_without_dropout():
    for name in ("llama3-8b", "llama3-70b", "llama3-405b", "mixtral-8x7b", "deepseek-v3", "qwen3-235b-a22b"):
        assert get_preset(name).dropout == 0.0, name
    for name in ("tiny", "gpt2-small", "gpt3-13b", "gpt3-175b"):
        assert get_preset(name).dropout == 0.1, name


@pytest.mark.parametrize("value", [1, 1.5, -0.1, "high", True])
def test_bad_dropout_one_line_error(value):
    with pytest.raises(ConfigError, match="model.dropout") as err:
        dataclasses.replace(get_preset("tiny"), dropout=value)
    assert "\n" not in str(err.value)
