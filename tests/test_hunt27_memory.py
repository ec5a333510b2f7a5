"""Memory-model defects found by the memory QA hunt (hunt 27)."""

import pytest

from workloads.memory import memory_per_gpu, stage_params
from workloads.models import get_preset
from workloads.parallel import ParallelConfig, TrainingSpec


@pytest.mark.parametrize("impl, zero", [("deepspeed", 3), ("fsdp", 2), ("fsdp", 3), ("fsdp2", 2)])
def test_gathered_parameters_do_not_count_unsharded_experts_twice(impl, zero):
    """ep == dp: the expert-DP group is one rank, which holds its experts whole and gathers none of them (the
    generator issues no all-gather over a one-rank group). The 16-bit parameters of a gathering ZeRO stage
    (ZeRO-3, FSDP's ZeRO-2) are then at most the dense shard, the whole experts and every dense parameter
    gathered at once: 2 (D/dp + R + D) bytes; and at least the shard and the experts, 2 (D/dp + R)."""
    model = get_preset("mixtral-8x7b")
    training = TrainingSpec(seq_len=4096)
    par = ParallelConfig(tp=8, dp=8, ep=8, zero=zero, zero_impl=impl, global_batch=16, sequence_parallel=True)
    dense, routed = stage_params(model, par, 0)
    assert par.size("expert_dp") == 1
    m = memory_per_gpu(model, par, training, flash_attention=True)
    assert 2 * (dense / 8 + routed) <= m.parameters <= 2 * (dense / 8 + routed + dense)


def test_deepspeed_zero3_parameters_not_above_zero2_with_whole_experts():
    """Monotonicity: with nothing to gather for the experts, ZeRO-3 holds no more 16-bit parameters than
    ZeRO-2 (whole weights, nothing gathered)."""
    model = get_preset("mixtral-8x7b")
    training = TrainingSpec(seq_len=4096)
    mem = {z: memory_per_gpu(model, ParallelConfig(tp=8, dp=8, ep=8, zero=z, zero_impl="deepspeed", global_batch=16,
                                                   sequence_parallel=True), training, flash_attention=True)
           for z in (2, 3)}
    assert mem[3].parameters <= mem[2].parameters


@pytest.mark.parametrize("impl, zero", [("fsdp", 2), ("fsdp", 3), ("fsdp2", 2)])
def test_fsdp_gathered_parameters_do_not_grow_with_whole_experts(impl, zero):
    """What FSDP gathers beyond the shard and the whole experts, 2 (D/dp + R), is dense weights: doubling the
    routed experts (still one rank per expert-DP group) leaves it as it was, but for the router's few more
    columns. Counting the experts among the gathered units made it grow with them (176 -> 265 MB)."""
    import dataclasses

    training = TrainingSpec(seq_len=4096)
    par = ParallelConfig(tp=8, dp=8, ep=8, zero=zero, zero_impl=impl, global_batch=16, sequence_parallel=True)
    gathered = []
    for experts in (8, 16):
        model = dataclasses.replace(get_preset("mixtral-8x7b"), experts=experts)
        dense, routed = stage_params(model, par, 0)
        gathered.append(memory_per_gpu(model, par, training, flash_attention=True).parameters
                        - 2 * (dense / 8 + routed))
    assert gathered[0] > 0 and gathered[1] == pytest.approx(gathered[0], rel=0.01)
