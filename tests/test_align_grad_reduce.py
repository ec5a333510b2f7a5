"""Megatron's aligned launch of gradient reductions (``parallel.align_grad_reduce``).

Truth used: Megatron-Core's ``forward_backward_pipelining_without_interleaving`` (with ``grad_sync_func``, set by
``align_grad_reduce``: only the first stage enables grad sync for its last backward, "other pipeline stages do
grad reduction during pipeline bubble", launched after the cool-down) and ``..._with_interleaving``
(``backward_step_helper_postprocess``: chunk ``c``'s ``grad_sync_func`` runs after backward iteration
``j + r``, ``j`` the iteration of the chunk's last micro-batch, ``r`` the pipeline rank; the chunks left after
the loop). Worked by hand for p = 2, m = 4 below; and the bytes reduced do not depend on when they are.
"""

import sys
from pathlib import Path

import pytest

from simulator.experiment import experiment_from_dict, run_experiment

sys.path.insert(0, str(Path(__file__).parent))
from test_training import uniform_model  # noqa: E402

MOE = {"name": "moe-small", "layers": 4, "hidden": 256, "heads": 4, "kv_heads": 4, "ffn_hidden": 1024,
       "vocab": 32000, "gated_mlp": True, "tied_embeddings": False, "experts": 4, "top_k": 2,
       "moe_ffn_hidden": 512, "max_seq_len": 4096}


def _doc(align: bool, schedule: str = "1f1b", chunks: int = 1, pp: int = 2, **parallel) -> dict:
    return {"cluster": {"preset": "dgx-h100", "nodes": 1, "gpus_per_node": 2 * pp},
            "model": uniform_model(4 * pp),
            "parallel": {"pp": pp, "dp": 2, "micro_batch": 1, "global_batch": 8, "schedule": schedule,
                         "virtual_stages": chunks, "grad_bucket_bytes": 200_000, "align_grad_reduce": align,
                         "placement": ["tp", "dp", "pp"], **parallel},
            "training": {"seq_len": 512}, "options": {"embedding_and_loss": False}}


def _run(align: bool, schedule: str = "1f1b", chunks: int = 1, pp: int = 2, **parallel):
    return run_experiment(experiment_from_dict(_doc(align, schedule, chunks, pp, **parallel)), force=True,
                          fidelity="full")


def _grads(ops, rank):
    mine = ops[(ops["rank"] == rank) & (ops["kind"] == "collective") & ops["name"].str.startswith("grad_")
               & ops["traffic_class"].isin(["dp", "edp"])]  # (not the gradient norm's all-reduce)
    return mine.sort_values("start_s")


def _end_of(ops, rank, prefix):
    mine = ops[(ops["rank"] == rank) & (ops["kind"] == "compute") & ops["name"].str.startswith(prefix)]
    return mine["end_s"].max()


def _last_backward_end(ops, rank):
    mine = ops[(ops["rank"] == rank) & (ops["kind"] == "compute") & ops["name"].str.match(r"B\d")]
    return mine["end_s"].max()


def test_non_interleaved_first_stage_overlaps_the_others_reduce_after_their_last_backward():
    aligned, free = _run(True).ops, _run(False).ops
    # ranks 0, 1: stage 0 (placement dp innermost); ranks 2, 3: stage 1
    for rank in (0, 1):  # the first stage reduces buckets during its last backward either way
        for ops in (aligned, free):
            assert _grads(ops, rank)["start_s"].iloc[0] < _last_backward_end(ops, rank)
    for rank in (2, 3):  # stage 1 is not bucketed (Megatron: bucket_size None for pp_rank > 0): one reduction
        for ops in (aligned, free):  # once its gradients are all ready, after its last backward, either way
            assert _grads(ops, rank)["start_s"].iloc[0] >= _last_backward_end(ops, rank)
            assert len(_grads(ops, rank)) == 1


def test_non_interleaved_the_flag_does_not_move_the_step():
    # Without interleaving the aligned launch and Megatron's unbucketed stages agree: stage 0 reduces its
    # buckets as they fill, every other stage everything after its last backward.
    aligned, free = _run(True), _run(False)
    assert aligned.step_time == free.step_time
    for rank in range(4):
        assert _grads(aligned.ops, rank)["start_s"].tolist() == _grads(free.ops, rank)["start_s"].tolist()


def test_every_stage_after_the_first_waits_and_reduces_each_chunk_whole():
    # p = 3: stages 1 and 2 both defer (not only the last), and Megatron turns their bucketing off (one
    # collective per chunk); stage 0 keeps its buckets (grad_bucket_bytes 200 kB: several per layer).
    for result in (_run(True, pp=3), _run(False, pp=3)):
        ops = result.ops
        for rank in range(6):  # ranks 2 s, 2 s + 1: stage s
            grads = _grads(ops, rank)
            if rank < 2:
                assert grads["start_s"].iloc[0] < _last_backward_end(ops, rank) and len(grads) > 1
            else:
                assert grads["start_s"].iloc[0] >= _last_backward_end(ops, rank) and len(grads) == 1


def test_interleaved_chunks_launch_stage_iterations_after_their_last_micro_batch():
    # p = 2, v = 2, m = 4: forward table (0,0) (1,0) (0,1) (1,1) (2,0) (3,0) (2,1) (3,1); backward iteration k
    # runs the entry's micro-batch on chunk 1 - chunk. Micro-batch 3 is at j = 5 (backward chunk 1, "B3.c1") and
    # j = 7 (backward chunk 0, "B3.c0", the last backward). Stage 0 (r = 0) launches chunk 1 right after B3.c1,
    # chunk 0 after B3.c0; stage 1 (r = 1) chunk 1 after iteration 6 ("B2.c0") and chunk 0 after the loop.
    # Unaligned, every chunk Megatron leaves unbucketed (all but stage 0's chunk 0) is reduced once its last
    # backward ("B3.c1": the chunk's last micro-batch) is done.
    aligned, free = _run(True, "interleaved", 2).ops, _run(False, "interleaved", 2).ops
    for ops in (aligned, free):
        first = _grads(ops, 0)["start_s"].iloc[0]
        assert first == _end_of(ops, 0, "B3.c1") < _last_backward_end(ops, 0)
    first = _grads(aligned, 2)["start_s"].iloc[0]
    assert _end_of(aligned, 2, "B2.c0") <= first < _last_backward_end(aligned, 2)
    assert _grads(free, 2)["start_s"].iloc[0] == _end_of(free, 2, "B3.c1") < _end_of(free, 2, "B2.c0")


@pytest.mark.parametrize("align", [False, True])
def test_megatron_buckets_only_the_first_stages_first_chunk(align):
    # megatron/training/training.py per_chunk_bucket_sizes: None for chunk > 0 or pp_rank > 0. With 200 kB
    # buckets every layer spans several, so a bucketed chunk is reduced in several collectives (bucket count
    # coarsened by `count`) and an unbucketed one in exactly one, of all the chunk's fp32 gradients (Megatron's
    # buffer under bf16). Hand count: a layer 4h^2 + 2hf + 2h parameters, 2 layers per chunk; the embedding
    # (V h) on virtual stage 0 (stage 0, chunk 0), the output layer (V h) and final norm (h) on the last
    # (stage 1, chunk 1).
    h, f, V = 256, 1024, 512
    layer, table = 4 * h * h + 2 * h * f + 2 * h, V * h
    chunks = {0: [2 * layer + table, 2 * layer], 1: [2 * layer, 2 * layer + table + h]}  # stage -> chunk params
    graph = _run(align, "interleaved", 2).record.graph
    for rank in range(4):
        stage = rank // 2
        grads = [op for op in graph.ops if op.rank == rank and op.kind == "collective"
                 and op.name.startswith("grad_") and op.traffic_class == "dp"]
        assert sum(op.nbytes * op.count for op in grads) == 4 * sum(chunks[stage])
        whole = sorted(op.nbytes for op in grads if op.count == 1)
        if stage == 0:  # chunk 1 whole, chunk 0 in buckets
            assert 4 * chunks[0][1] in whole and sum(op.count for op in grads) > 3
        else:  # both chunks whole
            assert whole == sorted(4 * c for c in chunks[1]) and len(grads) == 2


@pytest.mark.parametrize("parallel", [{"zero": 1, "zero_impl": "deepspeed"}, {"schedule": "gpipe"},
                                      {"schedule": "zb-h1"}])
def test_other_frameworks_and_schedules_bucket_every_stage(parallel):
    # DeepSpeed's ZeRO-1 (and PyTorch DDP) bucket every stage alike, and so does this model outside Megatron's
    # pipeline schedules: stage 1 reduces buckets during its last gradient pass (zb-h1: its weight passes).
    ops = _run(False, **parallel).ops
    for rank in (2, 3):
        grad_passes = ops[(ops["rank"] == rank) & (ops["kind"] == "compute") & ops["name"].str.match(r"[BW]\d")]
        assert len(_grads(ops, rank)) > 1
        assert _grads(ops, rank)["start_s"].iloc[0] < grad_passes["end_s"].max()


def _reduced(result, rank: int, traffic_class: str = "dp") -> float:
    return sum(op.nbytes * op.count for op in result.record.graph.ops
               if op.rank == rank and op.kind == "collective" and op.traffic_class == traffic_class
               and op.name.startswith("grad_"))


@pytest.mark.parametrize("schedule, chunks", [("1f1b", 1), ("interleaved", 2)])
def test_the_same_bytes_are_reduced(schedule, chunks):
    aligned, free = _run(True, schedule, chunks), _run(False, schedule, chunks)
    for rank in range(4):
        assert _reduced(free, rank) > 0
        assert _reduced(aligned, rank) == pytest.approx(_reduced(free, rank))


@pytest.mark.parametrize("schedule, chunks", [("1f1b", 1), ("interleaved", 2)])
def test_expert_gradients_are_reduced_too(schedule, chunks):
    def run(align: bool):
        doc = _doc(align, schedule, chunks, pp=2, ep=2)
        doc["cluster"]["gpus_per_node"] = 8
        doc["parallel"].update(dp=4, global_batch=16)
        doc["model"] = MOE
        return run_experiment(experiment_from_dict(doc), force=True, fidelity="full")

    aligned, free = run(True), run(False)
    for rank in range(8):
        for cls in ("dp", "edp"):
            assert _reduced(free, rank, cls) > 0
            assert _reduced(aligned, rank, cls) == pytest.approx(_reduced(free, rank, cls))


@pytest.mark.parametrize("parallel", [{"schedule": "gpipe"}, {"schedule": "zb-h1"}, {"zero": 2},
                                      {"zero": 1, "zero_impl": "deepspeed"}, {"overlap_grad_reduce": False}])
def test_outside_megatrons_pipelines_and_ddp_the_flag_changes_nothing(parallel):
    def graph(align: bool):
        ops = run_experiment(experiment_from_dict(_doc(align, **parallel)), force=True,
                             fidelity="full").record.graph.ops
        return [(op.rank, op.kind, op.name, op.deps) for op in ops]

    assert graph(True) == graph(False)
