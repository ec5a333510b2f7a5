"""Megatron-Core's micro-batch group size of the interleaved schedule (``parallel.microbatch_group_size``).

Truths used: the two orders worked out in Megatron-Core's own docstring of
``microbatch_group_size_per_vp_stage`` (megatron/core/model_parallel_config.py: PP 2, VP 2, N 2, M 4 runs
``0 1 0 1 2 3 2 3``; N 3, M 5 runs ``0 1 2 0 1 2 3 4 3 4``); its warm-up count
``2 (p - r - 1) + (v - 1) N`` (``get_pp_rank_microbatches``) and its bounds (``p <= N <= m``, ``m mod N`` 0 or at
least ``p``: ``forward_backward_pipelining_with_interleaving``); the interleaved bubble ``(p - 1)(t_f + t_b)``
per chunk with free transfers (Narayanan et al. 2021), which does not depend on N; and that every transfer a
rank sends is received once.
"""

import re
import sys
from pathlib import Path

import pytest

from simulator.experiment import experiment_from_dict, run_experiment
from workloads.errors import ConfigError
from workloads.memory import memory_per_gpu, micro_batches_in_flight
from workloads.models import model_from_dict
from workloads.parallel import ParallelConfig, parallel_from_dict, training_from_dict
from workloads.schedules import interleaved_exchanges, max_in_flight, pipeline_schedule, simulate_unit_times

sys.path.insert(0, str(Path(__file__).parent))
from test_training import free_cluster, uniform_model  # noqa: E402

# (p, v, m, N): N = p, N = m (breadth-first), m a multiple of N, and m not a multiple of p
LAYOUTS = [(2, 2, 4, 2), (2, 2, 5, 3), (4, 2, 8, 8), (4, 2, 9, 5), (4, 3, 10, 5), (4, 2, 12, 6), (8, 2, 24, 12),
           (4, 4, 16, 16)]


def _forwards(acts):
    return [(a.micro_batch, a.chunk) for a in acts if a.phase == "F"]


def test_orders_of_megatron_cores_docstring():
    # "for PP=2 VP=2, when microbatch_group_size_per_vp_stage=2, num_microbatches = 4, we have
    #  rank 0 | 0 1 0 1 2 3 2 3";  "=3, num_microbatches = 5: rank 0 | 0 1 2 0 1 2 3 4 3 4"
    assert _forwards(pipeline_schedule("interleaved", 2, 4, 2, 2)[0]) == [
        (0, 0), (1, 0), (0, 1), (1, 1), (2, 0), (3, 0), (2, 1), (3, 1)]
    assert _forwards(pipeline_schedule("interleaved", 2, 5, 2, 3)[0]) == [
        (0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1), (3, 0), (4, 0), (3, 1), (4, 1)]
    # the backward runs the same table with the chunks reversed
    acts = pipeline_schedule("interleaved", 2, 5, 2, 3)[1]
    assert [(a.micro_batch, a.chunk) for a in acts if a.phase == "B"] == [
        (0, 1), (1, 1), (2, 1), (0, 0), (1, 0), (2, 0), (3, 1), (4, 1), (3, 0), (4, 0)]


@pytest.mark.parametrize("p, v, m, n", LAYOUTS)
def test_warmup_is_megatrons_and_every_pass_runs_once(p, v, m, n):
    for r, acts in enumerate(pipeline_schedule("interleaved", p, m, v, n)):
        assert sorted((a.phase, a.micro_batch, a.chunk) for a in acts) == sorted(
            (ph, i, c) for ph in "FB" for i in range(m) for c in range(v))
        warmup = min(2 * (p - r - 1) + (v - 1) * n, m * v)
        assert [a.phase for a in acts[:warmup]] == ["F"] * warmup
        assert max_in_flight(acts) == min(warmup + 1, m * v)


@pytest.mark.parametrize("p, v, m, n", LAYOUTS)
def test_bubble_does_not_depend_on_the_group_size(p, v, m, n):
    tf, tb = 1.0, 2.0  # per chunk
    step, _busy = simulate_unit_times(pipeline_schedule("interleaved", p, m, v, n), tf, tb)
    assert step == pytest.approx(m * v * (tf + tb) + (p - 1) * (tf + tb))


@pytest.mark.parametrize("p, v, m, n", LAYOUTS)
def test_every_transfer_is_sent_and_received_once(p, v, m, n):
    s = pipeline_schedule("interleaved", p, m, v, n)
    last = p * v - 1
    for r in range(p):
        ex = [e for post in interleaved_exchanges(p, m, v, r, n) for e in post]
        assert sorted(i for e in ex for i in e.sends) == [
            i for i, a in enumerate(s[r]) if (a.phase == "F" and a.chunk * p + r < last)
            or (a.phase == "B" and a.chunk * p + r > 0)]
        assert sum(e.recv_act for e in ex) == sum(a.phase == "F" and a.chunk * p + r > 0 for a in s[r])
        assert sum(e.recv_grad for e in ex) == sum(a.phase == "B" and a.chunk * p + r < last for a in s[r])


def test_group_size_pp_is_narayanans_order():
    # N = pp is Megatron's default: forward iteration k runs micro-batch (k // pv) p + k mod p on chunk
    # (k mod pv) // p (Narayanan et al. 2021, as Megatron-LM computed it before the schedule table); the backward
    # the same micro-batch on chunk v - 1 - that. Given explicitly, or left to its default.
    for p, v, m in [(2, 2, 4), (4, 2, 8), (4, 3, 12), (8, 2, 16)]:
        order = [((k // (p * v)) * p + k % p, (k % (p * v)) // p) for k in range(m * v)]
        for n in (p, None):
            for acts in pipeline_schedule("interleaved", p, m, v, n):
                assert _forwards(acts) == order
                assert [(a.micro_batch, a.chunk) for a in acts if a.phase == "B"] == [(i, v - 1 - c) for i, c in order]
        assert all(interleaved_exchanges(p, m, v, r, p) == interleaved_exchanges(p, m, v, r) for r in range(p))


def _run(p2p, p, v, m, n, free=True):
    par = {"pp": p, "dp": 1, "micro_batch": 1, "global_batch": m, "schedule": "interleaved", "virtual_stages": v,
           "microbatch_group_size": n}
    doc = {"cluster": free_cluster(p) if free else {"preset": "dgx-h100", "nodes": 1, "gpus_per_node": p},
           "model": uniform_model(p * v), "parallel": par, "training": {"seq_len": 128},
           "network": {"step_latency": 0}, "options": {"embedding_and_loss": False, "p2p": p2p}}
    return run_experiment(experiment_from_dict(doc), force=True, fidelity="full")


@pytest.mark.parametrize("p, v, m, n", [(2, 2, 5, 3), (4, 2, 9, 5), (4, 3, 10, 5)])
def test_simulated_steps_finish_and_waiting_only_delays(p, v, m, n):
    # m is not a multiple of p: only a group size makes these layouts valid. Blocking transfers (Megatron's
    # batched exchanges) and asynchronous ones both finish; with free transfers they take the same time, over
    # NVLink waiting at the exchanges can only add to it.
    free_async, free_blocking = _run("async", p, v, m, n).step_time, _run("blocking", p, v, m, n).step_time
    assert free_blocking == pytest.approx(free_async, rel=1e-6)  # (transfers of ~1e-12 s each)
    assert _run("blocking", p, v, m, n, free=False).step_time >= _run("async", p, v, m, n, free=False).step_time


def test_activations_in_flight_grow_with_the_group_size():
    base = {"pp": 4, "dp": 1, "global_batch": 16, "schedule": "interleaved", "virtual_stages": 2}
    for n in (None, 4, 8, 16):
        par = ParallelConfig(**base, microbatch_group_size=n)
        w = 2 * 3 + (2 - 1) * (n or 4)
        assert micro_batches_in_flight(par, 0) == pytest.approx(min(w + 1, 32) / 2)


def test_first_and_last_ranks_hold_the_early_receipts():
    # Rank 0 receives the last rank's chunk outputs N - pp iterations before their forward, the last rank rank 0's
    # gradients N - pp iterations before their backward (Megatron-Core: fwd_recv_buffer_size = N - pp + 1, one of
    # which every rank holds for its next pass): N - pp tensors of b s h / t elements more than the chunks in
    # flight on those two stages; the middle stages hold only their chunks in flight.
    model, training = model_from_dict({"preset": "llama3-8b"}), training_from_dict({"seq_len": 4096})
    tensor = 1 * 4096 * model.hidden * 2 / 2  # micro_batch 1, bf16, tp 2 with sequence parallelism
    base = {"tp": 2, "pp": 4, "dp": 1, "global_batch": 32, "schedule": "interleaved", "virtual_stages": 2,
            "sequence_parallel": True, "recompute": "full"}

    def acts(stage: int, n: int | None) -> float:
        return memory_per_gpu(model, ParallelConfig(**base, microbatch_group_size=n), training, stage).activations

    def chunks(stage: int, n: int) -> float:  # the chunk-forwards in flight, each of half the stage's layers
        return min(2 * (4 - stage - 1) + n + 1, 64)

    per_chunk = (acts(1, 8) - acts(1, 4)) / (chunks(1, 8) - chunks(1, 4))  # stage 1: chunks only
    for stage in (0, 3):
        for n in (8, 16, 32):
            grown = acts(stage, n) - acts(stage, 4)
            assert grown == pytest.approx((chunks(stage, n) - chunks(stage, 4)) * per_chunk + (n - 4) * tensor)
    assert acts(0, 4) == acts(0, None)


@pytest.mark.parametrize("fields, match", [
    ({"microbatch_group_size": 3}, r"parallel\.microbatch_group_size: 3 must be in pp=4"),
    ({"microbatch_group_size": 17}, r"must be in pp=4 \.\. the number of micro-batches \(16\)"),
    ({"microbatch_group_size": 7}, r"leaves a last group of 2 of the 16 micro-batches, fewer than pp=4"),
    ({"global_batch": 18}, r"multiple of pp=4.*or set parallel\.microbatch_group_size \(Megatron-Core; valid: "
                           r"6, 7, 9, 10, 11, 12, 13, 14, 18\)"),
    ({"global_batch": 2}, r"multiple of pp=4 \(Megatron-LM\)$"),  # (no group size can help: fewer than pp)
    ({"schedule": "1f1b", "virtual_stages": 1, "microbatch_group_size": 4}, r"needs schedule: interleaved"),
    ({"microbatch_group_size": 0}, r"parallel\.microbatch_group_size"),
])
def test_invalid_group_sizes_are_refused_naming_the_field(fields, match):
    doc = {"cluster": free_cluster(4), "model": uniform_model(8),
           "parallel": {"pp": 4, "dp": 1, "global_batch": 16, "schedule": "interleaved", "virtual_stages": 2,
                        **fields},
           "training": {"seq_len": 128}}
    with pytest.raises(ConfigError, match=match):
        experiment_from_dict(doc)


def test_a_last_group_of_at_least_pp_is_valid():
    # 16 micro-batches in groups of 6: 6, 6 and 4 >= pp = 4 (Megatron-Core accepts it); the whole step runs
    par = {"pp": 4, "dp": 1, "global_batch": 16, "schedule": "interleaved", "virtual_stages": 2,
           "microbatch_group_size": 6}
    doc = {"cluster": free_cluster(4), "model": uniform_model(8), "parallel": par, "training": {"seq_len": 128}}
    result = run_experiment(experiment_from_dict(doc), force=True, fidelity="full")
    passes: dict[int, set] = {}
    for op in result.record.graph.ops:
        found = re.match(r"F(\d+)\.c(\d+)", op.name)
        if found and op.kind == "compute":
            passes.setdefault(op.rank, set()).add((int(found[1]), int(found[2])))
    assert passes == {r: {(i, c) for i in range(16) for c in range(2)} for r in range(4)}


def test_yaml_field_round_trips():
    assert parallel_from_dict({"pp": 2, "schedule": "interleaved", "virtual_stages": 2,
                               "microbatch_group_size": 3}).microbatch_group_size == 3
