"""Megatron's interleaved schedule with blocking, batched point-to-point transfers (``options.p2p: blocking``).

Truths used: the exchange points of ``forward_backward_pipelining_with_interleaving`` (megatron/core/
pipeline_parallel/schedules.py, without ``overlap_p2p_comm``) and the timeline they give, both worked by hand
for 2 ranks, 2 chunks and 4 micro-batches; the counting invariant that every transfer a rank sends is
received once; and that waiting for transfers can only delay a step.
"""

import sys
from pathlib import Path

import pytest

from simulator.experiment import experiment_from_dict, run_experiment
from workloads.schedules import Exchange, interleaved_exchanges, pipeline_schedule

sys.path.insert(0, str(Path(__file__).parent))
from test_training import free_cluster, uniform_model  # noqa: E402


def _posts(r):
    return {i: [(e.sends, e.recv_act, e.recv_grad) for e in post]
            for i, post in enumerate(interleaved_exchanges(2, 4, 2, r)) if post}


def test_exchange_points_are_megatrons_worked_by_hand():
    # Rank 0 (4 warm-up forwards, F0.c0 F1.c0 F0.c1 F1.c1): it starts the forward chain, so it receives
    # nothing after its first forward and, after iteration k >= 1, what rank 1 sent at iteration k - 1
    # unless that was a last-chunk forward; the last warm-up exchange also receives the first gradient.
    # Steady state: one exchange per forward-backward pair; the backwards of chunk 0 send nothing.
    assert _posts(0) == {
        1: [((0,), False, False)], 2: [((1,), True, False)], 3: [((2,), True, False)], 4: [((3,), False, True)],
        6: [((4, 5), False, True)], 8: [((6, 7), True, True)], 10: [((8,), True, True)],
        12: [((10,), False, True)], 13: [((12,), False, True)], 14: [((13,), False, True)],
        15: [((), False, True)]}
    # Rank 1 (2 warm-up forwards): receives its first input before computing; it starts the backward chain,
    # so its forwards of chunk 1 send nothing and it receives gradients only from its third pair on, and
    # only for the pairs whose aligned rank-0 backward was of chunk 1.
    assert _posts(1) == {
        0: [((), True, False)], 1: [((0,), True, False)], 2: [((1,), True, False)], 4: [((3,), True, False)],
        6: [((5,), True, True)], 8: [((6, 7), True, True)], 10: [((8, 9), True, False)],
        12: [((11,), True, False)], 14: [((13,), False, True)], 15: [((14,), False, True)],
        16: [((15,), False, False)]}


@pytest.mark.parametrize("p, m, v", [(2, 2, 2), (2, 4, 2), (3, 9, 3), (4, 4, 3), (4, 8, 2), (4, 12, 4),
                                     (8, 16, 2)])
def test_every_transfer_is_sent_and_received_once(p, m, v):
    s = pipeline_schedule("interleaved", p, m, v)
    last = p * v - 1
    for r in range(p):
        posts = interleaved_exchanges(p, m, v, r)
        assert len(posts) == len(s[r]) + 1
        ex = [e for post in posts for e in post]
        assert all(isinstance(e, Exchange) for e in ex)
        sent = sorted(i for e in ex for i in e.sends)
        assert sent == [i for i, a in enumerate(s[r]) if (a.phase == "F" and a.chunk * p + r < last)
                        or (a.phase == "B" and a.chunk * p + r > 0)]
        assert sum(e.recv_act for e in ex) == sum(a.phase == "F" and a.chunk * p + r > 0 for a in s[r])
        assert sum(e.recv_grad for e in ex) == sum(a.phase == "B" and a.chunk * p + r < last for a in s[r])


def _run(p2p, p=2, v=2, m=4, free=True):
    doc = {"cluster": free_cluster(p) if free else {"preset": "dgx-h100", "nodes": 1, "gpus_per_node": p},
           "model": uniform_model(p * v),
           "parallel": {"pp": p, "dp": 1, "micro_batch": 1, "global_batch": m, "schedule": "interleaved",
                        "virtual_stages": v},
           "training": {"seq_len": 128}, "network": {"step_latency": 0},
           "options": {"embedding_and_loss": False, "p2p": p2p}}
    return run_experiment(experiment_from_dict(doc), force=True, fidelity="full")


def _passes(result):
    ops = result.ops
    return ops[(ops["stream"] == "compute") & ops["name"].str.match(r"[FB]\d")]


def test_blocking_timeline_is_the_hand_worked_one():
    # p = 2, v = 2, m = 4, free transfers; a forward takes a, a backward b (every chunk alike). A rank
    # waits at each exchange until its peer has posted the matching operations (rendezvous), so the
    # ranks move in lockstep from the first backward on: rank 1's pair F(c1,mb0) B(c1,mb0) ends at 4a+b,
    # where rank 0's exchange after its last warm-up forward finally gets its gradient, and so on.
    res = _run("blocking")
    comp = _passes(res)
    a = comp[comp["name"] == "F0.c0.L0"]["duration_s"].iloc[0]
    b = comp[comp["name"] == "B0.c0.L0"]["duration_s"].iloc[0]
    hand = {
        0: [(0, 0), (1, 0), (2, 0), (3, 0), (4, 1), (5, 1), (5, 2), (6, 2), (6, 3), (7, 3), (7, 4), (8, 4),
            (8, 5), (9, 6), (9, 7), (9, 8)],
        1: [(1, 0), (2, 0), (3, 0), (4, 0), (4, 1), (5, 1), (5, 2), (6, 2), (6, 3), (7, 3), (7, 4), (8, 4),
            (8, 5), (9, 5), (9, 6), (9, 7)],
    }
    for rank, starts in hand.items():
        got = comp[comp["rank"] == rank].sort_values("start_s")["start_s"].tolist()
        assert got == pytest.approx([i * a + j * b for i, j in starts], rel=1e-6, abs=1e-12)
    assert comp["end_s"].max() == pytest.approx(9 * a + 9 * b, rel=1e-6)
    # the same order without waiting: rank 0 runs its fifth forward at 4a, not 4a + b
    free = _passes(_run("async"))
    f2 = free[(free["rank"] == 0) & (free["name"] == "F2.c0.L0")]["start_s"].iloc[0]
    assert f2 == pytest.approx(4 * a, rel=1e-6)
    assert free["end_s"].max() <= comp["end_s"].max() * (1 + 1e-9)


@pytest.mark.parametrize("p, v, m", [(2, 2, 4), (4, 2, 8), (4, 3, 4)])
def test_blocking_is_never_faster_and_slower_with_real_links(p, v, m):
    assert _run("blocking", p, v, m, free=False).step_time > _run("async", p, v, m, free=False).step_time
    assert _run("blocking", p, v, m).step_time >= _run("async", p, v, m).step_time * (1 - 1e-9)


@pytest.mark.parametrize("fidelity", ["fast", "lockstep"])
def test_representatives_agree_with_full(fidelity):
    doc = {"cluster": {"preset": "dgx-h100", "nodes": 2}, "model": {"preset": "gpt2-small"},
           "parallel": {"tp": 2, "pp": 2, "dp": 4, "zero": 1, "global_batch": 16, "schedule": "interleaved",
                        "virtual_stages": 2, "sequence_parallel": True},
           "training": {"seq_len": 1024}, "options": {"p2p": "blocking"}}
    exp = experiment_from_dict(doc)
    full = run_experiment(exp, force=True, fidelity="full")
    rep = run_experiment(exp, force=True, fidelity=fidelity)
    assert rep.step_time == pytest.approx(full.step_time, rel=0.02)
    for cls, nbytes in full.bytes_by_class.items():
        assert rep.bytes_by_class[cls] == pytest.approx(nbytes, rel=1e-9)
