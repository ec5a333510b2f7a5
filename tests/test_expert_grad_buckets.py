"""Routed experts' gradients in the distributed optimizer: their own buckets, and their parameters gathered back.

Truth used (Megatron-Core ``DistributedDataParallel``): expert parameters live in buffers of their own
(``expert_parallel_buffers``) with the same bucket size as the dense ones and their own bucket groups, reduced
over the expert-DP group as each bucket fills during the last backward; the distributed optimizer shards them
over that group, so after its step it all-gathers the updated 16-bit expert parameters over it (half the bytes of
the fp32 gradients Megatron reduces under bf16), as it does the dense ones over the DP group.
"""

import sys
from pathlib import Path

import pytest

from simulator.experiment import experiment_from_dict, run_experiment

sys.path.insert(0, str(Path(__file__).parent))
from test_align_grad_reduce import MOE, _doc, _last_backward_end  # noqa: E402


def _moe_run(overlap: bool = True, **parallel):
    doc = _doc(False, "1f1b", 1, pp=2, ep=2, zero=1, **parallel)
    doc["cluster"]["gpus_per_node"] = 8
    doc["parallel"].update(dp=4, global_batch=16, overlap_grad_reduce=overlap)
    doc["model"] = MOE
    return run_experiment(experiment_from_dict(doc), force=True, fidelity="full")


def _bytes(result, rank: int, name: str, group_size: int) -> float:
    return sum(op.nbytes * op.count for op in result.record.graph.ops
               if op.rank == rank and op.kind == "collective" and op.name == name and len(op.group) == group_size)


@pytest.mark.parametrize("overlap", [True, False])
def test_expert_parameters_are_gathered_over_the_expert_dp_group(overlap):
    result = _moe_run(overlap)
    for rank in range(8):  # dp 4 (dense group of 4), ep 2: expert-DP groups of 2
        expert_grads = _bytes(result, rank, "grad_reduce_scatter", 2)
        dense_grads = _bytes(result, rank, "grad_reduce_scatter", 4)
        assert expert_grads > 0 and dense_grads > 0
        assert _bytes(result, rank, "param_all_gather", 2) == pytest.approx(expert_grads / 2)
        assert _bytes(result, rank, "param_all_gather", 4) == pytest.approx(dense_grads / 2)


def test_stage_zero_reduces_expert_buckets_during_its_last_backward():
    # Stage 0 (ranks 0-3 with dp innermost) is the stage Megatron buckets; 200 kB buckets, a layer's experts
    # span several.
    ops = _moe_run().ops
    for rank in range(8):
        mine = ops[(ops["rank"] == rank) & (ops["kind"] == "collective") & (ops["traffic_class"] == "edp")
                   & ops["name"].str.startswith("grad_")]
        if rank < 4:
            assert len(mine) > 1
            assert mine["start_s"].min() < _last_backward_end(ops, rank)
        else:  # stage 1: Megatron does not bucket it, the experts' buffer neither: one reduction at the end
            assert len(mine) == 1 and mine["start_s"].min() >= _last_backward_end(ops, rank)


def test_each_gather_runs_over_the_group_that_reduced_its_bytes():
    graph = _moe_run().record.graph
    for rank in range(8):
        reduced = {op.group for op in graph.ops if op.rank == rank and op.name.startswith("grad_")
                   and op.traffic_class in ("dp", "edp")}
        gathers = [op for op in graph.ops if op.rank == rank and op.name == "param_all_gather"]
        assert {op.group for op in gathers} == reduced and len(reduced) == 2
        assert {op.traffic_class for op in gathers} == {"zero"}


def test_expert_and_dense_collectives_run_on_streams_of_their_own():
    # Megatron-Core reduces and gathers the two buffers over different process groups (NCCL communicators, each
    # with its own CUDA stream): the experts' on stream edp, the dense ones' on dp, side by side. After the
    # optimizer step both gathers depend on the same op: they start together instead of one after the other.
    result = _moe_run(False)
    start = result.ops.set_index("id")["start_s"]
    for rank in range(8):
        mine = [op for op in result.record.graph.ops if op.rank == rank and op.kind == "collective"
                and op.name in ("grad_reduce_scatter", "param_all_gather")]
        assert {op.stream for op in mine if len(op.group) == 2} == {"edp"}  # expert-DP groups of 2
        assert {op.stream for op in mine if len(op.group) == 4} == {"dp"}
        gathers = {}
        for op in mine:  # the first gather of each buffer
            if op.name == "param_all_gather":
                gathers.setdefault(len(op.group), op)
        assert gathers[2].deps == gathers[4].deps
        assert start[gathers[2].id] == start[gathers[4].id]
        # the optimizer step waits for every reduction of both streams (not only the last one emitted)
        norm = next(op for op in result.record.graph.ops if op.rank == rank and op.name == "grad_norm")
        reductions = [op.id for op in mine if op.name == "grad_reduce_scatter"]
        assert start[norm.id] >= max(result.ops.set_index("id")["end_s"][reductions])


def test_with_overlapped_gathers_the_expert_parameters_are_gathered_all_the_same():
    # overlap_param_gather moves the gathers of both buffers into the next forward: the same bytes either way.
    plain, overlapped = _moe_run(), _moe_run(overlap_param_gather=True)
    for rank in range(8):
        for size in (2, 4):
            assert _bytes(overlapped, rank, "param_all_gather", size) == \
                pytest.approx(_bytes(plain, rank, "param_all_gather", size))


def _overlapped_graph(model: dict, schedule: str = "1f1b", chunks: int = 1):
    """The op graph (``full``) of ``model`` on pp 2 x dp 4 with EP 2 (expert-DP groups of 2), ZeRO-1 with both
    of Megatron's overlaps on."""
    doc = _doc(False, schedule, chunks, pp=2, ep=2, zero=1, overlap_param_gather=True)
    doc["cluster"]["gpus_per_node"] = 8
    doc["parallel"].update(dp=4, global_batch=16, overlap_grad_reduce=True)
    doc["model"] = model
    return run_experiment(experiment_from_dict(doc), force=True, fidelity="full").record.graph


@pytest.mark.parametrize("first_dense_layers", [0, 1, 3])
def test_overlapped_expert_gathers_run_in_the_forward_on_a_chain_of_their_own(first_dense_layers):
    # Megatron-Core chains the expert buffers' bucket groups apart from the dense ones
    # (``next_param_gather_bucket_group`` is set per list). The forward pre-hook of a piece that needs an expert
    # bucket finds it undispatched (bucket 0: the first MoE layer's) and dispatches it, waits for the buckets
    # it needs, and the first piece of bucket b dispatches bucket b + 1. Nothing is gathered after the optimizer
    # step. Checked on the graph's dependencies, worked from the bucket sizes: every MoE layer holds the same
    # expert parameters, and buckets are consecutive in forward order.
    graph = _overlapped_graph(dict(MOE, first_dense_layers=first_dense_layers))
    for rank in range(8):
        mine = [op for op in graph.ops if op.rank == rank]
        optimizer = next(op.id for op in mine if op.name == "optimizer")
        gathers = [op for op in mine if op.name == "param_all_gather"]
        experts = [op for op in gathers if len(op.group) == 2]  # expert-DP groups of 2 (the dense DP group: 4)
        assert all(optimizer not in op.deps for op in gathers)
        stage = rank // 4  # placement tp, dp, pp: dp innermost; 2 layers per stage
        layers = [x for x in range(2 * stage, 2 * stage + 2) if x >= first_dense_layers]
        if not layers:
            assert not experts
            continue
        # 200 kB buckets on stage 0 (a MoE layer's experts fill several); Megatron does not bucket stage 1
        assert len(experts) > 1 if stage == 0 else len(experts) == 1
        per_layer = sum(op.nbytes for op in experts) / len(layers)
        edges = [0.0]  # where each bucket starts and ends, in bytes of the stage's experts in forward order
        for op in experts:
            edges.append(edges[-1] + op.nbytes)
        forward = [op for op in mine if op.name.startswith("F0.c0.")]
        first = {}  # layer -> its first piece's first op
        for op in forward:
            if op.kind == "compute" and op.name.startswith("F0.c0.L"):
                first.setdefault(int(op.name.split(".")[2][1:]), op)
        for k, layer in enumerate(layers):  # each MoE layer waits for the last expert bucket it needs
            last = next(b for b in range(len(experts)) if edges[b + 1] >= (k + 1) * per_layer * (1 - 1e-12))
            assert experts[last].id in first[layer].deps, (rank, layer)
        # lazily, by the first MoE layer; bucket b by the first piece of bucket b - 1
        assert set(experts[0].deps) == _dispatched_at(first[layers[0]], forward, gathers)
        for b in range(1, len(experts)):
            layer = layers[int(edges[b - 1] / per_layer * (1 + 1e-12))]
            assert set(experts[b].deps) == _dispatched_at(first[layer], forward, gathers)


def _dispatched_at(piece, forward: list, gathers: list) -> set[int]:
    """What a forward pre-hook at ``piece`` (a piece's first op) follows: the op before it in the forward, or,
    for the first piece, the forward's own inputs."""
    earlier = [op.id for op in forward if op.id < piece.id]
    return {earlier[-1]} if earlier else set(piece.deps) - {op.id for op in gathers}


def test_fp8_expert_parameters_are_gathered_in_fp8():
    # fp8_param_gather: the routed experts are all FP8 GEMM weights (1 byte each, a quarter of their fp32
    # gradients); the dense stage mixes FP8 weights and 16-bit norms, between a quarter and a half.
    doc = _doc(False, "1f1b", 1, pp=2, ep=2, zero=1)
    doc["cluster"]["gpus_per_node"] = 8
    doc["parallel"].update(dp=4, global_batch=16)
    doc["model"] = MOE
    doc["training"].update(dtype="fp8", fp8_param_gather=True)
    result = run_experiment(experiment_from_dict(doc), force=True, fidelity="full")
    for rank in range(8):
        expert = _bytes(result, rank, "param_all_gather", 2) / _bytes(result, rank, "grad_reduce_scatter", 2)
        dense = _bytes(result, rank, "param_all_gather", 4) / _bytes(result, rank, "grad_reduce_scatter", 4)
        assert expert == pytest.approx(0.25) and 0.25 < dense < 0.5


@pytest.mark.parametrize("overlap", [False, True])
def test_experts_are_gathered_when_the_dense_weights_have_no_dp(overlap):
    # TP 4 with expert TP 1 and EP 2 on 4 GPUs per stage: dense DP 1, expert DP 2 (the experts' optimizer
    # shards over 2 ranks, so their parameters come back over 2), nothing dense to reduce or gather. With
    # overlap_param_gather the experts' chain runs in the forward all the same (Megatron-Core chains their
    # bucket groups whatever the dense ones do).
    doc = _doc(False, "1f1b", 1, pp=2, tp=4, etp=1, ep=2, zero=1, sequence_parallel=True,
               overlap_grad_reduce=overlap, overlap_param_gather=overlap)
    doc["cluster"]["gpus_per_node"] = 8
    doc["parallel"].update(dp=1, global_batch=4)
    doc["model"] = MOE
    result = run_experiment(experiment_from_dict(doc), force=True, fidelity="full")
    graph = result.record.graph
    for rank in range(8):
        assert _bytes(result, rank, "grad_reduce_scatter", 2) > 0
        assert _bytes(result, rank, "param_all_gather", 2) == \
            pytest.approx(_bytes(result, rank, "grad_reduce_scatter", 2) / 2)
        optimizer = next(op.id for op in graph.ops if op.rank == rank and op.name == "optimizer")
        gathers = [op for op in graph.ops if op.rank == rank and op.name == "param_all_gather"]
        assert bool([op for op in gathers if optimizer in op.deps]) is not overlap
        waited = {d for op in graph.ops if op.rank == rank and op.name.startswith("F0.") for d in op.deps}
        assert bool(waited & {op.id for op in gathers}) is overlap  # the forward waits for them


def test_aligned_dispatch_sends_both_buffers_buckets_before_the_first_forward():
    # Interleaved, align_param_gather (Megatron's default): model_chunk.start_param_sync dispatches every bucket
    # group of chunks 0 and 1, dense and expert, before the first forward. 4 MoE layers on pp 2 x 2 chunks: one
    # layer per chunk, stage s holds layers s and s + 2.
    graph = _overlapped_graph(MOE, "interleaved", 2)
    for rank in range(8):
        gathers = [op for op in graph.ops if op.rank == rank and op.name == "param_all_gather"]
        stage = rank // 4
        for size in (2, 4):  # the expert-DP group and the dense DP group
            mine = [op for op in gathers if len(op.group) == size]
            assert mine and all(not op.deps for op in mine)
            assert {op.layer for op in mine} == {stage, stage + 2}


@pytest.mark.parametrize("zero_impl", ["auto", "deepspeed"])
def test_gradients_reduced_every_micro_batch_are_gathered_back_once(zero_impl):
    # ZeRO-2 (DeepSpeed's: gradients reduced after every micro-batch's backward, 4 here) gathers each updated
    # 16-bit parameter once per step. Hand count of stage 0 (4 layers of 4h^2 + 2hf + 2h and the V x h
    # embedding; h = 256, f = 1024, V = 512), 2 bytes each.
    doc = _doc(False, "1f1b", 1, pp=2, zero=2, zero_impl=zero_impl)
    result = run_experiment(experiment_from_dict(doc), force=True, fidelity="full")
    h, f, V = 256, 1024, 512
    params = 4 * (4 * h * h + 2 * h * f + 2 * h) + V * h
    for rank in (0, 1):
        assert _bytes(result, rank, "grad_reduce_scatter", 2) == pytest.approx(4 * 2 * params)  # 4 rounds
        assert _bytes(result, rank, "param_all_gather", 2) == pytest.approx(2 * params)
