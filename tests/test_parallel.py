"""Parallel configuration: loading, validation of impossible combinations, rank placement."""

import itertools

import pytest

from workloads.errors import ConfigError
from workloads.models import get_preset, model_from_dict
from workloads.parallel import (
    ParallelConfig,
    RankLayout,
    TrainingSpec,
    num_micro_batches,
    padded_vocab,
    parallel_from_dict,
    stage_layers,
    training_from_dict,
    validate,
)

GPT3 = get_preset("gpt3-175b")
TRAIN = TrainingSpec()


# ------------------------------------------------------------------ loading
def test_defaults():
    p = ParallelConfig(dp=4, micro_batch=2)
    assert p.global_batch == 8                       # one micro-batch per replica
    assert p.grad_bucket_bytes is None               # the implementation's (workloads.sharding)
    assert p.zero_impl == "auto" and p.zero_overlap
    assert p.placement == ("tp", "dp", "pp")         # Megatron: TP innermost (CP follows TP)
    assert (TRAIN.seq_len, TRAIN.dtype, TRAIN.dtype_bytes) == (2048, "bf16", 2)


def test_from_dict_design_example():
    p = parallel_from_dict({"tp": 8, "pp": 8, "dp": 16, "dp_sync": "allreduce", "ep": 1, "micro_batch": 1,
                            "global_batch": 1536, "schedule": "1f1b", "virtual_stages": 1, "zero": 1,
                            "sequence_parallel": True, "recompute": "selective",
                            "placement": ["tp", "dp", "pp"]})
    assert p.world_size == 1024 and p.placement == ("tp", "dp", "pp")
    assert num_micro_batches(p) == p.num_micro_batches == 96
    validate(GPT3, p, training_from_dict({"seq_len": 2048, "dtype": "bf16"}), world_size=1024)


@pytest.mark.parametrize("section, match", [
    ({"tp": 8, "tensor": 2}, r"parallel\.tensor: unknown field; valid fields: tp, pp, dp"),
    ({"tp": 0}, r"parallel\.tp: must be a positive integer"),
    ({"schedule": "zb"}, r"parallel\.schedule: 'zb' is not valid; valid: 1f1b, gpipe, interleaved"),
    ({"zero": 4}, r"parallel\.zero: 4 is not valid; valid: 0, 1, 2, 3"),
    ({"recompute": "some"}, r"parallel\.recompute: .*none, selective, full"),
    ({"dp_sync": "ring"}, r"parallel\.dp_sync: .*allreduce, parameter_server"),
    ({"placement": ["tp", "dp"]}, r"parallel\.placement: .*permutation of \[tp, dp, pp\]"),
    ({"placement": ["tp", "ep", "pp"]}, r"parallel\.placement"),
    ({"placement": "tp,dp,pp"}, r"parallel\.placement: must be a list"),
    ({"sequence_parallel": 1}, r"parallel\.sequence_parallel: must be true or false"),
])
def test_parallel_from_dict_errors(section, match):
    with pytest.raises(ConfigError, match=match):
        parallel_from_dict(section)


@pytest.mark.parametrize("section, match", [
    ({"seq_len": 2048, "dtype": "fp64"}, r"training\.dtype: 'fp64' is not valid; valid: bf16, fp16, fp32"),
    ({"seq": 2048}, r"training\.seq: unknown field; valid fields: seq_len, dtype"),
    ({"seq_len": -1}, r"training\.seq_len"),
])
def test_training_from_dict_errors(section, match):
    with pytest.raises(ConfigError, match=match):
        training_from_dict(section)


# --------------------------------------------------------------- validation
MIXTRAL = get_preset("mixtral-8x7b")
TINY_LEARNED = model_from_dict({"preset": "tiny"})  # learned positions, max_seq_len 128


@pytest.mark.parametrize("model, kwargs, training, world, match", [
    (GPT3, dict(tp=8, pp=8, dp=16), TRAIN, 512,
     r"parallel: tp\*pp\*dp = 8\*8\*16 = 1024 does not equal the cluster's 512 GPUs; dp=8 would fit"),
    (GPT3, dict(tp=5), TRAIN, None,
     r"parallel\.tp: 5 does not divide model\.heads=96; valid tp values: 1, 2, 3, 4, 6, 8"),
    (get_preset("llama3-70b"), dict(tp=16), TRAIN, None,
     r"parallel\.tp: 16 does not divide model\.kv_heads=8; valid tp values: 1, 2, 4, 8$"),
    (model_from_dict({"preset": "tiny", "ffn_hidden": 250}), dict(tp=4), TrainingSpec(seq_len=128),
     None, r"parallel\.tp: 4 does not divide model\.ffn_hidden=250"),
    (GPT3, dict(pp=7), TRAIN, None,
     r"parallel\.pp: model\.layers=96 cannot be split into pp\*virtual_stages=7\*1 .*valid pp values"),
    (GPT3, dict(pp=8, virtual_stages=5, schedule="interleaved", global_batch=8), TRAIN, None,
     r"parallel\.virtual_stages: 5 does not divide model\.layers=96, so no pp splits it .*valid virtual_stages: "
     r"1, 2, 3, 4, 6, 8, 12"),
    (GPT3, dict(dp=16, micro_batch=2, global_batch=100), TRAIN, None,
     r"parallel\.global_batch: 100 is not a multiple of micro_batch\*dp=2\*16=32"),
    (GPT3, dict(pp=8, schedule="interleaved", global_batch=16), TRAIN, None,
     r"parallel\.virtual_stages: the interleaved schedule needs virtual_stages >= 2"),
    (GPT3, dict(pp=8, virtual_stages=2, global_batch=16), TRAIN, None,
     r"parallel\.virtual_stages: 2 needs schedule: interleaved"),
    (GPT3, dict(pp=8, virtual_stages=2, schedule="interleaved", global_batch=12), TRAIN, None,
     r"parallel\.global_batch: the interleaved schedule needs the number of micro-batches \(12\) "
     r"to be a multiple of pp=8"),
    (GPT3, dict(dp=4, zero=1, dp_sync="parameter_server"), TRAIN, None,
     r"parallel\.zero: 1 cannot shard state under dp_sync: parameter_server"),
    (GPT3, dict(tp=8, sequence_parallel=True), TrainingSpec(seq_len=2044), None,
     r"training\.seq_len: 2044 is not a multiple of parallel\.tp=8"),
    (MIXTRAL, dict(dp=6, ep=3), TRAIN, None, r"parallel\.ep: 3 does not divide model\.experts=8"),
    (MIXTRAL, dict(dp=4, ep=8), TRAIN, None,
     r"parallel\.ep: 8 does not divide parallel\.dp=4 .*valid ep values: 1, 2, 4$"),
    (GPT3, dict(dp=8, ep=2), TRAIN, None, r"parallel\.ep: 2 needs a mixture-of-experts model"),
    (TINY_LEARNED, dict(), TrainingSpec(seq_len=256), None,
     r"training\.seq_len: 256 exceeds model\.max_seq_len=128"),
])
def test_validate_rejects(model, kwargs, training, world, match):
    with pytest.raises(ConfigError, match=match):
        validate(model, ParallelConfig(**kwargs), training, world_size=world)


def test_validate_accepts_megatron_configs():
    validate(GPT3, ParallelConfig(tp=8, pp=8, dp=16, global_batch=1536, schedule="interleaved",
                                  virtual_stages=3, zero=1, sequence_parallel=True), TRAIN, world_size=1024)
    validate(MIXTRAL, ParallelConfig(tp=2, pp=4, dp=8, ep=8, global_batch=64, sequence_parallel=True), TRAIN,
             world_size=64)
    # sequence_parallel with tp=1 is a no-op, not an error (Megatron turns it off)
    p = ParallelConfig(sequence_parallel=True)
    validate(GPT3, p, TrainingSpec(seq_len=2047))
    assert not p.sp


def test_padded_vocab_megatron():
    assert padded_vocab(50257, 1) == 50304   # GPT-2 vocab padded to a multiple of 128
    assert padded_vocab(50257, 8) == 51200   # ... of 128 * 8
    assert padded_vocab(51200, 8) == 51200


def test_stage_layers_partition_and_interleave():
    p = ParallelConfig(pp=4)
    blocks = [stage_layers(96, p, i) for i in range(4)]
    assert blocks[1] == list(range(24, 48))
    q = ParallelConfig(pp=2, virtual_stages=2, schedule="interleaved", global_batch=2)
    assert stage_layers(8, q, 0) == [0, 1, 4, 5] and stage_layers(8, q, 1) == [2, 3, 6, 7]
    with pytest.raises(ConfigError, match="stage: 4"):
        stage_layers(96, p, 4)


# ---------------------------------------------------------------- placement
def _assert_partition(groups, world, size):
    flat = sorted(itertools.chain.from_iterable(groups))
    assert flat == list(range(world))
    assert all(len(g) == size for g in groups)


@pytest.mark.parametrize("placement", list(itertools.permutations(("tp", "dp", "pp"))))
def test_groups_partition_the_world(placement):
    p = ParallelConfig(tp=2, pp=3, dp=4, ep=2, placement=placement)
    lay = RankLayout(p)
    for dim, size in (("tp", 2), ("dp", 4), ("pp", 3), ("ep", 2), ("expert_dp", 2)):
        _assert_partition(lay.all_groups(dim), 24, size)
    for r in range(24):
        c = lay.coords(r)
        assert lay.rank(tp=c.tp, dp=c.dp, pp=c.pp) == r
        assert r in lay.tp_group(r) and r in lay.dp_group(r) and r in lay.pp_group(r)
        # one member of each TP group per DP/PP coordinate, groups are orthogonal
        assert set(lay.tp_group(r)) & set(lay.dp_group(r)) == {r}
        assert [lay.coords(x).pp for x in lay.pp_group(r)] == [0, 1, 2]  # ordered by stage


def test_megatron_docstring_example():
    # Megatron-LM initialize_model_parallel docstring: 16 GPUs, tp=2, pp=4 (dp=2):
    # TP groups [g0,g1],[g2,g3],...; DP groups [g0,g2],[g1,g3],[g4,g6],...; PP groups [g0,g4,g8,g12],...
    lay = RankLayout(ParallelConfig(tp=2, pp=4, dp=2))
    assert lay.all_groups("tp")[:2] == [(0, 1), (2, 3)]
    assert lay.all_groups("dp")[:3] == [(0, 2), (1, 3), (4, 6)]
    assert lay.all_groups("pp")[:2] == [(0, 4, 8, 12), (1, 5, 9, 13)]


def test_placement_changes_adjacency():
    default = RankLayout(ParallelConfig(tp=4, dp=8, pp=2))
    assert default.tp_group(0) == (0, 1, 2, 3)             # TP on neighbouring GPUs
    dp_first = RankLayout(ParallelConfig(tp=4, dp=8, pp=2, placement=("dp", "tp", "pp")))
    assert dp_first.tp_group(0) == (0, 8, 16, 24)          # TP members dp=8 apart
    assert dp_first.dp_group(0) == tuple(range(8))
    pp_first = RankLayout(ParallelConfig(tp=4, dp=8, pp=2, placement=("pp", "tp", "dp")))
    assert pp_first.pp_group(0) == (0, 1)


def test_expert_groups_inside_dp():
    lay = RankLayout(ParallelConfig(tp=2, dp=8, ep=4))
    dp = lay.dp_group(0)                                   # (0, 2, 4, ..., 14)
    assert lay.ep_group(0) == dp[:4] and lay.ep_group(10) == dp[4:]   # contiguous blocks
    assert lay.expert_dp_group(0) == (dp[0], dp[4])        # same EP index
    assert lay.expert_dp_group(6) == (dp[3], dp[7])
    with pytest.raises(ConfigError, match="rank: 16"):
        lay.coords(16)
