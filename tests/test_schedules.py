"""Tests for workloads.schedules against independent truths.

Truths used: each rank runs every (phase, micro-batch, chunk) once with B after
F; activation peaks of GPipe (m) and 1F1B (min(p - i, m)); the bubble closed
forms (p-1)/(m+p-1) of the step for GPipe/1F1B and (p-1)/(v*m) of the ideal
time for interleaved 1F1B (Narayanan et al., SC'21); hand-derived orders.
"""

from __future__ import annotations

import itertools

import pytest

from workloads.schedules import (
    PipeAction,
    max_in_flight,
    pipeline_schedule,
    simulate_unit_times,
)

F, B = "F", "B"

PM_CASES = [(1, 1), (1, 5), (2, 1), (2, 2), (2, 7), (4, 1), (4, 2), (4, 3), (4, 4),
            (4, 8), (4, 13), (8, 3), (8, 8), (8, 32)]
PMV_CASES = [(2, 2, 2), (2, 4, 2), (2, 6, 3), (4, 4, 2), (4, 8, 2), (4, 8, 3),
             (4, 12, 4), (4, 16, 2), (8, 8, 2), (8, 16, 2), (8, 24, 3), (3, 9, 2),
             (1, 3, 2), (4, 8, 1)]


def all_cases():
    for p, m in PM_CASES:
        yield "gpipe", p, m, 1
        yield "1f1b", p, m, 1
    for p, m, v in PMV_CASES:
        yield "interleaved", p, m, v


@pytest.mark.parametrize("kind,p,m,v", list(all_cases()))
def test_every_action_once_and_backward_after_forward(kind, p, m, v):
    sched = pipeline_schedule(kind, p, m, v)
    assert len(sched) == p
    expected = {(ph, i, c) for ph in (F, B) for i in range(m) for c in range(v)}
    for acts in sched:
        keys = [(a.phase, a.micro_batch, a.chunk) for a in acts]
        assert len(keys) == len(set(keys)) == 2 * m * v
        assert set(keys) == expected
        index = {k: n for n, k in enumerate(keys)}
        for i, c in itertools.product(range(m), range(v)):
            assert index[(B, i, c)] > index[(F, i, c)]
        assert all(isinstance(a, PipeAction) for a in acts)


@pytest.mark.parametrize("p,m", PM_CASES)
def test_max_in_flight_1f1b_and_gpipe(p, m):
    one = pipeline_schedule("1f1b", p, m)
    gp = pipeline_schedule("gpipe", p, m)
    for i in range(p):
        assert max_in_flight(one[i]) == min(p - i, m)
        assert max_in_flight(gp[i]) == m


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", PM_CASES)
@pytest.mark.parametrize("tf,tb", [(1.0, 2.0), (0.3, 0.7)])
def test_bubble_gpipe_1f1b_closed_form(kind, p, m, tf, tb):
    step, busy = simulate_unit_times(pipeline_schedule(kind, p, m), tf, tb)
    assert step == pytest.approx((m + p - 1) * (tf + tb), rel=1e-9, abs=1e-9)
    for b in busy:
        assert b == pytest.approx(m * (tf + tb), rel=1e-12)
        assert 1.0 - b / step == pytest.approx((p - 1) / (m + p - 1), abs=1e-9)


@pytest.mark.parametrize("p,m,v", PMV_CASES)
def test_bubble_interleaved_closed_form(p, m, v):
    tf, tb = 1.0, 2.0  # whole-stage times; each chunk runs 1/v of them
    step, busy = simulate_unit_times(
        pipeline_schedule("interleaved", p, m, v), tf / v, tb / v
    )
    ideal = m * (tf + tb)
    assert step == pytest.approx(ideal + (p - 1) * (tf + tb) / v, rel=1e-9, abs=1e-9)
    assert (step - ideal) / ideal == pytest.approx((p - 1) / (v * m), abs=1e-9)
    for b in busy:
        assert b == pytest.approx(ideal, rel=1e-9)


def test_interleaved_beats_1f1b():
    p, m = 4, 8
    s1, _ = simulate_unit_times(pipeline_schedule("1f1b", p, m), 1.0, 2.0)
    s2, _ = simulate_unit_times(pipeline_schedule("interleaved", p, m, 2), 0.5, 1.0)
    assert s2 < s1


def test_1f1b_order_by_hand():
    # p=4, m=6, stage 1: warm-up 2 forwards, then 1F1B, then cool-down.
    got = [(a.phase, a.micro_batch) for a in pipeline_schedule("1f1b", 4, 6)[1]]
    assert got == [(F, 0), (F, 1), (F, 2), (B, 0), (F, 3), (B, 1), (F, 4), (B, 2),
                   (F, 5), (B, 3), (B, 4), (B, 5)]
    last = [(a.phase, a.micro_batch) for a in pipeline_schedule("1f1b", 4, 3)[3]]
    assert last == [(F, 0), (B, 0), (F, 1), (B, 1), (F, 2), (B, 2)]


def test_interleaved_order_by_hand():
    # p=2, m=4, v=2 rank 0: warm-up (2-0-1)*2 + (2-1)*2 = 4 forwards; forwards
    # go p micro-batches per chunk, backwards visit chunks in reverse.
    got = [(a.phase, a.micro_batch, a.chunk)
           for a in pipeline_schedule("interleaved", 2, 4, 2)[0]]
    assert got == [
        (F, 0, 0), (F, 1, 0), (F, 0, 1), (F, 1, 1),
        (F, 2, 0), (B, 0, 1), (F, 3, 0), (B, 1, 1),
        (F, 2, 1), (B, 0, 0), (F, 3, 1), (B, 1, 0),
        (B, 2, 1), (B, 3, 1), (B, 2, 0), (B, 3, 0),
    ]
    # rank 1 warm-up: 0*2 + 1*2 = 2 forwards
    r1 = pipeline_schedule("interleaved", 2, 4, 2)[1]
    assert [a.phase for a in r1[:4]] == [F, F, F, B]
    assert max_in_flight(r1) == 3


def test_interleaved_all_forwards_first_where_the_warm_up_reaches_them():
    # Megatron-Core (get_pp_rank_microbatches): warm-up 2 (p - r - 1) + (v - 1) p, and a rank whose warm-up
    # is at least its m v forwards runs them all before any backward. p = m = 4, v = 3: warm-ups 14, 12, 10, 8
    # of 12, so ranks 0 and 1 run every forward first, ranks 2 and 3 start 1F1B after 10 and 8. (Megatron-LM
    # 2021 ran every forward first on every rank when m == p.)
    for r, acts in enumerate(pipeline_schedule("interleaved", 4, 4, 3)):
        phases = [a.phase for a in acts]
        warm_up = min(2 * (4 - r - 1) + (3 - 1) * 4, 12)
        assert phases[:warm_up] == [F] * warm_up
        assert phases[warm_up:warm_up + 2] == ([F, B] if warm_up < 12 else [B, B])
        assert phases.count(F) == phases.count(B) == 12


def test_interleaved_in_flight_is_warmup_plus_one():
    p, m, v = 4, 16, 2
    for r, acts in enumerate(pipeline_schedule("interleaved", p, m, v)):
        assert max_in_flight(acts) == (p - r - 1) * 2 + (v - 1) * p + 1


def test_gpipe_with_comm_closed_form():
    # Critical path: p-1 forward hops and p-1 backward hops, each +comm.
    p, m, c = 4, 8, 0.25
    step, _ = simulate_unit_times(pipeline_schedule("gpipe", p, m), 1.0, 2.0, c)
    assert step == pytest.approx((m + p - 1) * 3.0 + 2 * (p - 1) * c, abs=1e-9)


def test_gpipe_with_per_boundary_comm_closed_form():
    # The fill chain crosses each boundary once forward, the drain chain once backward: each boundary's own
    # transfer twice, whatever the others cost.
    p, m, comm = 4, 8, [0.1, 0.7, 0.25]
    step, _ = simulate_unit_times(pipeline_schedule("gpipe", p, m), 1.0, 2.0, comm)
    assert step == pytest.approx((m + p - 1) * 3.0 + 2 * sum(comm), abs=1e-9)


@pytest.mark.parametrize("kind, v", [("1f1b", 1), ("interleaved", 2), ("zb-h1", 1)])
def test_equal_boundaries_are_the_scalar_comm(kind, v):
    p, m, c = 4, 8, 0.3
    sched = pipeline_schedule(kind, p, m, v)
    tw = 0.5 if kind == "zb-h1" else 0.0
    assert simulate_unit_times(sched, 1.0, 2.0, [c] * (p * v - 1), tw) == simulate_unit_times(sched, 1.0, 2.0, c, tw)


@pytest.mark.parametrize("kind, v", [("1f1b", 1), ("interleaved", 2)])
def test_a_slower_boundary_lengthens_the_step_twice_over(kind, v):
    """The first micro-batch's forward crosses every boundary, chunk after chunk (the interleaved chain's wrap
    from the last rank back to the first included), and the last one's backward crosses them all again: each
    boundary's extra seconds count at least twice."""
    sched = pipeline_schedule(kind, 4, 8, v)
    n = 4 * v - 1
    base, _ = simulate_unit_times(sched, 1.0, 2.0, [0.2] * n)
    for j in range(n):
        comm = [0.2] * n
        comm[j] = 0.9
        assert simulate_unit_times(sched, 1.0, 2.0, comm)[0] >= base + 2 * 0.7 - 1e-9


@pytest.mark.parametrize("comm, message", [([0.1, 0.2], "3 entries"), ([0.1, -0.2, 0.1], ">= 0"), (-1.0, ">= 0")])
def test_bad_comm_is_refused(comm, message):
    with pytest.raises(ValueError, match=message):
        simulate_unit_times(pipeline_schedule("1f1b", 4, 8), 1.0, 2.0, comm)


def test_warm_up_transfers_priced_apart_hand_worked():
    """1F1B, p = 2, m = 2, F = 1, B = 2. Rank 0 runs F0, F1 before its first backward: both warm-up sends
    (0.5 s); everything else costs ``comm``. Rank 1: F0 at 1.5-2.5, B0 2.5-4.5, F1 (arrived at 2.5) 4.5-5.5,
    B1 5.5-7.5. Rank 0: B0 from 4.5 + c, B1 from 7.5 + c, ending at 9.5 + c = (m + p - 1)(F + B) + 0.5 + c."""
    sched = pipeline_schedule("1f1b", 2, 2)
    for comm in (0.0, 0.25):
        ends: dict = {}
        step, busy = simulate_unit_times(sched, 1.0, 2.0, comm, warmup_comm=0.5, finish=ends)
        assert step == pytest.approx(9.5 + comm, abs=1e-12)
        assert busy == [6.0, 6.0]
        assert ends == pytest.approx({("F", 0, 0): 1.0, ("F", 1, 0): 2.0, ("F", 0, 1): 2.5, ("B", 0, 1): 4.5,
                                      ("F", 1, 1): 5.5, ("B", 1, 1): 7.5, ("B", 0, 0): 6.5 + comm,
                                      ("B", 1, 0): 9.5 + comm}, abs=1e-12)


def test_only_forwards_before_the_first_backward_are_warm_up():
    """1F1B, p = 2, m = 4, free transfers but 0.5 s for the warm-up ones: rank 0's F0 and F1 (before its first
    backward) pay it, its F2 and F3 (after it) do not; only F0 is on the critical path, so the step is the free
    one plus 0.5."""
    sched = pipeline_schedule("1f1b", 2, 4)
    free, _ = simulate_unit_times(sched, 1.0, 2.0, 0.0)
    assert simulate_unit_times(sched, 1.0, 2.0, 0.0, warmup_comm=0.5)[0] == pytest.approx(free + 0.5, abs=1e-12)


def test_a_forwards_input_waits_for_the_senders_price():
    """Interleaved, p = 2, m = 4, v = 2: every forward starts no earlier than its input's arrival, the send priced
    by whether the *sending* forward ran before its rank's first backward (the warm-up set, read here from the
    schedule's lists), and some forward starts exactly then."""
    p, m, v, warm = 2, 4, 2, [2.0, 0.0, 0.0]
    sched = pipeline_schedule("interleaved", p, m, v)
    warm_up = set()
    for r, acts in enumerate(sched):
        for a in acts:
            if a.phase == "B":
                break
            warm_up.add((a.micro_batch, a.chunk * p + r))
    ends: dict = {}
    simulate_unit_times(sched, 1.0, 0.5, 0.0, warmup_comm=warm, finish=ends)
    tight = 0
    for (phase, mb, j), end in ends.items():
        if phase != "F" or j == 0 or (j - 1) % p == j % p:
            continue
        arrival = ends[("F", mb, j - 1)] + (warm[j - 1] if (mb, j - 1) in warm_up else 0.0)
        assert end - 1.0 >= arrival - 1e-12, (mb, j)
        tight += abs(end - 1.0 - arrival) < 1e-12 and (mb, j - 1) in warm_up
    assert tight


def test_finish_must_be_a_dict():
    with pytest.raises(TypeError, match="finish must be a dict"):
        simulate_unit_times(pipeline_schedule("1f1b", 2, 2), 1.0, 2.0, 0.1, finish=[])


def test_gpipe_warm_up_is_every_forward():
    """GPipe runs every forward before any backward: the fill chain pays the warm-up prices, the drain chain
    ``comm``, each boundary once."""
    p, m, comm, warm = 4, 8, [0.1, 0.7, 0.25], [0.3, 0.2, 0.9]
    step, _ = simulate_unit_times(pipeline_schedule("gpipe", p, m), 1.0, 2.0, comm, warmup_comm=warm)
    assert step == pytest.approx((m + p - 1) * 3.0 + sum(comm) + sum(warm), abs=1e-9)


@pytest.mark.parametrize("kind, v", [("1f1b", 1), ("interleaved", 2), ("zb-h1", 1)])
def test_warm_up_price_defaults_to_comm_and_never_shortens_the_step(kind, v):
    sched = pipeline_schedule(kind, 4, 8, v)
    tw = 0.5 if kind == "zb-h1" else 0.0
    comm = [0.2, 0.1, 0.4, 0.3, 0.2, 0.1, 0.3][:4 * v - 1]
    plain = simulate_unit_times(sched, 1.0, 2.0, comm, tw)
    assert simulate_unit_times(sched, 1.0, 2.0, comm, tw, warmup_comm=comm) == plain
    assert simulate_unit_times(sched, 1.0, 2.0, comm, tw, warmup_comm=[2 * c for c in comm])[0] > plain[0]


@pytest.mark.parametrize("warm, message", [([0.1, 0.2], "warmup_comm must be a scalar or have 3 entries"),
                                           (-0.5, "warmup_comm must be >= 0")])
def test_bad_warm_up_price_is_refused(warm, message):
    with pytest.raises(ValueError, match=message):
        simulate_unit_times(pipeline_schedule("1f1b", 4, 8), 1.0, 2.0, 0.1, warmup_comm=warm)


def test_simulate_detects_deadlock():
    bad = [[PipeAction(B, 0, 0), PipeAction(F, 0, 0)],
           [PipeAction(F, 0, 0), PipeAction(B, 0, 0)]]
    with pytest.raises(RuntimeError, match="deadlock"):
        simulate_unit_times(bad)


def test_max_in_flight_rejects_backward_before_forward():
    with pytest.raises(ValueError):
        max_in_flight([PipeAction(B, 0, 0)])


@pytest.mark.parametrize(
    "args,field",
    [
        (("pipedream", 4, 8, 1), "parallel.schedule"),
        (("1f1b", 0, 8, 1), "stages"),
        (("1f1b", 4, 0, 1), "micro_batches"),
        (("interleaved", 4, 8, 0), "virtual_stages"),
        (("gpipe", -1, 8, 1), "stages"),
        (("interleaved", 4, 6, 2), "micro_batches"),
        (("1f1b", 4, 8, 2), "virtual_stages"),
    ],
)
def test_invalid_inputs(args, field):
    with pytest.raises(ValueError, match=field):
        pipeline_schedule(*args)


def test_unknown_kind_lists_valid_kinds():
    with pytest.raises(ValueError) as exc:
        pipeline_schedule("zb", 2, 2)
    for k in ("gpipe", "1f1b", "interleaved"):
        assert k in str(exc.value)
