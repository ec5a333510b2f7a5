"""Model presets and parameter counts against published numbers."""

from dataclasses import FrozenInstanceError

import pytest

from workloads.errors import ConfigError
from workloads.models import ModelSpec, get_preset, model_from_dict, preset_names


@pytest.mark.parametrize("name, published, rel", [
    ("gpt3-175b", 174.6e9, 0.01),     # Narayanan et al. 2021, Table 1 (vocab 51200)
    ("llama3-8b", 8.03e9, 0.01),      # HF model card: 8,030,261,248
    ("llama3-70b", 70.6e9, 0.01),     # HF model card: 70,553,706,496
    ("llama3-405b", 405.9e9, 0.01),   # HF model card: 405,853,388,800
    ("mixtral-8x7b", 46.7e9, 0.02),   # Mistral AI: 46.7B total
    ("deepseek-v3", 671e9, 0.001),    # DeepSeek-V3 report: 671B main model (MTP's 14B excluded)
])
def test_total_params_match_published(name, published, rel):
    assert get_preset(name).total_params() == pytest.approx(published, rel=rel)


@pytest.mark.parametrize("name, published", [
    ("llama2-70b", 68_976_648_192),      # HF meta-llama/Llama-2-70b-hf: sum of parameter numels
    # HF bigscience/bloom: 176,247,271,424, less the embedding LayerNorm (2 x 14336) the preset leaves out
    ("bloom-176b", 176_247_271_424 - 2 * 14336),
])
def test_total_params_exact(name, published):
    assert get_preset(name).total_params() == published


@pytest.mark.parametrize("name, embedding, non_embedding", [
    ("nemotron4-15b", 3.2e9, 12.5e9),    # arXiv:2402.16819, Table 1
    ("nemotron4-340b", 9.4e9, 331.6e9),  # arXiv:2406.11704, Table 1
])
def test_nemotron4_split_matches_published(name, embedding, non_embedding):
    m = get_preset(name)
    assert m.embedding_params() == pytest.approx(embedding, rel=0.02)
    assert m.total_params() - m.embedding_params() == pytest.approx(non_embedding, rel=0.005)


@pytest.mark.parametrize("name, total, active, rel", [
    ("mixtral-8x22b", 141e9, 39e9, 0.01),      # mistral.ai/news/mixtral-8x22b: 141B total, 39B active
    ("opt-175b", 175e9, 175e9, 0.01),          # Zhang et al. 2022, Table 1
    ("mt-nlg-530b", 530e9, 530e9, 0.005),      # Smith et al. 2022: 530B
])
def test_published_run_presets_match(name, total, active, rel):
    m = get_preset(name)
    assert m.total_params() == pytest.approx(total, rel=rel)
    assert m.active_params() == pytest.approx(active, rel=rel)


def test_gpt2_small_is_exact():
    # HF `gpt2`: sum(p.numel() for p in model.parameters()) == 124,439,808
    assert get_preset("gpt2-small").total_params() == 124_439_808


def test_gpt3_matches_narayanan_closed_form():
    # Narayanan et al. 2021, eq. (2): P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h)),
    # i.e. 12 l h^2 + 13 l h + (V + s) h; plus the final LayerNorm (2h) it leaves out.
    m = get_preset("gpt3-175b")
    l, h, V, s = 96, 12288, 51200, 2048
    assert m.total_params() == 12 * l * h**2 + 13 * l * h + (V + s) * h + 2 * h


@pytest.mark.parametrize("name, active, rel", [
    ("mixtral-8x7b", 12.9e9, 0.02),   # Mistral AI: 12.9B active per token
    ("deepseek-v3", 37e9, 0.02),      # DeepSeek: 37B activated (both embedding matrices counted: 37.55B)
])
def test_active_params_match_published(name, active, rel):
    assert get_preset(name).active_params() == pytest.approx(active, rel=rel)


def test_shapes():
    m = get_preset("llama3-70b")
    assert (m.head_dim, m.kv_hidden) == (128, 1024)
    assert get_preset("gpt3-175b").kv_hidden == 12288


def test_deepseek_first_three_layers_dense():
    m = get_preset("deepseek-v3")
    assert [m.is_moe_layer(i) for i in range(5)] == [False, False, False, True, True]
    assert sum(m.is_moe_layer(i) for i in range(m.layers)) == 58


def test_tp_shards_sum_to_whole_layer():
    # Without biases only the two RMSNorms are replicated over TP.
    m = get_preset("llama3-70b")
    for t in (1, 2, 4, 8):
        assert t * (m.params_per_layer(0, tp=t) - m.norm_params()) == m.params_per_layer(0) - m.norm_params()


def test_expert_parallel_shards_routed_experts():
    m = get_preset("mixtral-8x7b")
    one_expert = 3 * 4096 * 14336
    assert m.routed_expert_params(0) == 8 * one_expert
    assert m.params_per_layer(0) - m.params_per_layer(0, ep=8) == 7 * one_expert


def test_presets_listed_and_frozen():
    names = preset_names()
    for n in ("gpt3-175b", "llama3-8b", "llama3-70b", "llama3-405b", "mixtral-8x7b", "deepseek-v3", "tiny"):
        assert n in names
    with pytest.raises(FrozenInstanceError):
        get_preset("tiny").layers = 3  # type: ignore[misc]


def test_from_dict_preset_with_override():
    m = model_from_dict({"preset": "gpt3-175b", "layers": 48})
    assert (m.layers, m.hidden, m.vocab) == (48, 12288, 51200)


def test_from_dict_without_preset():
    m = model_from_dict({"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn_hidden": 128,
                         "vocab": 100, "gated_mlp": True, "tied_embeddings": False})
    assert m.name == "custom" and m.kv_hidden == 32


@pytest.mark.parametrize("section, match", [
    ({"preset": "gpt3-175b", "layer": 3}, r"model\.layer: unknown field; valid fields: preset, name, layers"),
    ({"preset": "gpt5"}, r"model\.preset: unknown preset 'gpt5'; valid presets: .*gpt3-175b"),
    ({"preset": "tiny", "layers": 0}, r"model\.layers: must be a positive integer"),
    ({"preset": "tiny", "layers": 2.5}, r"model\.layers"),
    ({"preset": "tiny", "hidden": "64"}, r"model\.hidden"),
    ({"preset": "tiny", "layers": True}, r"model\.layers"),
    ({"preset": "tiny", "kv_heads": 3}, r"model\.kv_heads: 3 does not divide model\.heads=4"),
    ({"preset": "tiny", "heads": 5, "kv_heads": 5}, r"model\.heads: 5 does not divide model\.hidden=64"),
    ({"preset": "tiny", "gated_mlp": "yes"}, r"model\.gated_mlp: must be true or false"),
    ({"preset": "tiny", "top_k": 2}, r"model\.top_k: needs model\.experts"),
    ({"preset": "mixtral-8x7b", "top_k": 9}, r"model\.top_k: must be in 1\.\.8"),
    ({"layers": 2}, r"model\.\w+: required when no model\.preset"),
    ("gpt3", r"model: must be a mapping"),
])
def test_from_dict_errors(section, match):
    with pytest.raises(ConfigError, match=match):
        model_from_dict(section)


def test_config_error_is_value_error():
    with pytest.raises(ValueError):
        ModelSpec("x", 1, 64, 4, 4, 256, 100, gated_mlp=False, tied_embeddings=True, experts=-1)
