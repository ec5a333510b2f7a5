"""Compute beside communication: the SMs NCCL kernels hold slow the compute running meanwhile on their rank.

Truths used (simulator/engine.py, "Compute beside communication"): an H100 has S = 132 SMs; while a rank's
collectives hold ``comm_sms`` SMs each (default 24) and its sends / receives ``p2p_sms`` each (default 0), a
compute op running on that rank (another stream) progresses at ``(S - held) / S`` of its speed, ``held`` at most
``S - 1``. So a compute op of ``d`` seconds alone that overlaps ``T`` seconds of one collective ends
``T * held / S`` late. The collectives' own times are read from the run (they do not depend on compute); every
expected time below is worked from those by hand.
"""

import copy

import pytest

from simulator.compute import ComputeModel
from simulator.engine import Engine
from simulator.experiment import experiment_from_dict, run_experiment
from topologies import get_gpu
from workloads.errors import ConfigError
from workloads.ops import Kernel, OpGraph
from workloads.training import training_step

S = 132  # SMs of an H100 SXM
H100 = get_gpu("H100-SXM")
D = 10e-3  # seconds of the long compute op


def _run(graph, cluster, **knobs):
    return Engine(graph, cluster, ComputeModel(H100, **knobs)).run()


def _overlapped(late_start: bool):
    """Rank 0 computes ``D`` on its compute stream while an all-reduce of ranks 0 and 1 runs on stream ``dp``;
    the all-reduce starts at once, or when rank 1 has computed 2 ms (``late_start``)."""
    g = OpGraph(2)
    a = g.compute(0, duration_s=D, category="fixed", name="a")
    before = [g.compute(1, duration_s=2e-3, category="fixed", name="b")] if late_start else []
    ids = g.collective("all_reduce", [0, 1], 256e6, algorithm="ring", stream="dp", deps={1: before})
    return g, a, ids[0]


def test_the_op_knobs_off_runs_at_its_own_speed(node8):
    g, a, _ = _overlapped(False)
    r = _run(g, node8, comm_sms=0, p2p_sms=0)
    assert r.end_s[a] == D


@pytest.mark.parametrize("sms", [24, 66])
def test_a_collective_from_the_start_slows_the_compute_by_its_sm_share(node8, sms):
    g, a, ar = _overlapped(False)
    r = _run(g, node8, comm_sms=sms)
    t = r.end_s[ar] - r.start_s[ar]
    assert r.start_s[ar] == 0.0 and 0 < t < D / 2  # (the premise: the all-reduce ends inside the compute)
    # [0, t] at (S - sms) / S, then full speed: D - t (S - sms) / S left after t
    assert r.end_s[a] == pytest.approx(t + D - t * (S - sms) / S, rel=1e-12)
    assert r.end_s[a] == pytest.approx(D + t * sms / S, rel=1e-12)


def test_the_record_says_how_much_compute_the_sms_added(node8):
    # rank 0's op runs t * 24 / S longer; over the world's two ranks that is half of it per rank
    g, a, ar = _overlapped(False)
    r = _run(g, node8)
    t = r.end_s[ar] - r.start_s[ar]
    assert r.compute_beside_comm_s == pytest.approx(t * 24 / S / 2, rel=1e-9)
    assert _run(g, node8, comm_sms=0).compute_beside_comm_s == 0.0


def test_a_collective_starting_mid_op_slows_only_what_it_overlaps(node8):
    g, a, ar = _overlapped(True)
    r = _run(g, node8)  # the defaults: 24 SMs per collective
    t0, t1 = r.start_s[ar], r.end_s[ar]
    assert t0 == pytest.approx(2e-3, rel=1e-9)  # it waits for rank 1's 2 ms of compute (rank 1 is not slowed:
    # its compute ended before the all-reduce started)
    assert r.end_s[a] == pytest.approx(D + (t1 - t0) * 24 / S, rel=1e-12)


def test_a_long_collective_slows_the_whole_op(node8):
    # The all-reduce outlasts the compute: D of work at (S - 24) / S takes D S / (S - 24).
    g = OpGraph(2)
    a = g.compute(0, duration_s=1e-4, category="fixed", name="a")
    g.collective("all_reduce", [0, 1], 1e9, algorithm="ring", stream="dp")
    r = _run(g, node8)
    assert r.end_s[a] == pytest.approx(1e-4 * S / (S - 24), rel=1e-12)


def test_sends_hold_their_p2p_sms_and_shares_add_up(node8):
    # Rank 0 sends to rank 1 on stream pp and all-reduces with rank 2 on stream dp while computing: 2 + 24 SMs
    # held while both move data.
    g = OpGraph(3)
    a = g.compute(0, duration_s=D, category="fixed", name="a")
    s = g.send(0, 1, 64e6, stream="pp")
    g.recv(1, 0, 64e6, stream="pp")
    ar = g.collective("all_reduce", [0, 2], 256e6, algorithm="ring", stream="dp")[0]
    r = _run(g, node8, p2p_sms=2)
    ends = sorted([(r.end_s[s], 2), (r.end_s[ar], 24)])
    assert r.start_s[s] == r.start_s[ar] == 0.0 and ends[-1][0] < D
    # [0, e1] both held, [e1, e2] the longer one's SMs only
    (e1, _first), (e2, second) = ends
    work = e1 * (S - 26) / S + (e2 - e1) * (S - second) / S
    assert r.end_s[a] == pytest.approx(e2 + D - work, rel=1e-12)


def test_held_sms_leave_at_least_one(node8):
    g = OpGraph(3)
    a = g.compute(0, duration_s=1e-5, category="fixed", name="a")
    x = g.collective("all_reduce", [0, 1], 1e9, algorithm="ring", stream="x")[0]
    y = g.collective("all_reduce", [0, 2], 1e9, algorithm="ring", stream="y")[0]
    r = _run(g, node8, comm_sms=100)  # 200 SMs asked for: one is left
    assert r.end_s[a] == pytest.approx(1e-5 * S, rel=1e-12)
    assert r.end_s[a] < min(r.end_s[x], r.end_s[y])  # (the premise: both held it all along)


def test_kernels_timed_on_reserved_sms_are_not_slowed_twice(node8):
    # A GEMM that already runs on the SMs a communication kernel leaves it (sm_reserved: TE's userbuffers,
    # DualPipe's pairs) keeps the compute model's time.
    g = OpGraph(2)
    k = Kernel("gemm", 2 * 8192 ** 3, 3 * 2 * 8192 ** 2, (8192, 8192, 8192), 1, 16)
    a = g.compute(0, name="held", parts=[k])
    g.collective("all_reduce", [0, 1], 1e9, algorithm="ring", stream="dp")
    r = _run(g, node8)
    model = ComputeModel(H100)
    assert r.end_s[a] == pytest.approx(model.duration(g.ops[a]), rel=1e-12)


def _once(graph, cluster, **knobs):
    """Run ``graph``, counting op ends through the engine's progress reports (every op, this small); the
    record and the most ops ever reported finished (more than the graph holds: an op finished twice)."""
    most = [0]
    engine = Engine(graph, cluster, ComputeModel(H100, **knobs), progress=lambda done, n: most.__setitem__(
        0, max(most[0], done)))
    record = engine.run()
    return record, most[0]


def test_an_op_started_inside_a_collective_speeds_up_when_it_ends(node8):
    # Rank 0's op starts 1 ms into the all-reduce (after a 1 ms op on its compute stream), so its end is
    # first scheduled at the slowed speed and comes earlier when the all-reduce ends: finished once, at
    # 1 ms + the slowed stretch + the rest at full speed.
    g = OpGraph(2)
    first = g.compute(0, duration_s=1e-3, category="fixed", name="first")
    a = g.compute(0, duration_s=D, category="fixed", name="a", deps=[first])
    ar = g.collective("all_reduce", [0, 1], 2e9, algorithm="ring", stream="dp")[0]
    r, most = _once(g, node8)
    t0, t1 = r.start_s[ar], r.end_s[ar]
    assert t0 == 0.0 and r.end_s[first] == pytest.approx(1e-3 * S / (S - 24), rel=1e-12)
    start = r.end_s[first]
    assert start < t1 < r.end_s[a]  # (the premise)
    slowed = (t1 - start) * (S - 24) / S
    assert r.end_s[a] == pytest.approx(t1 + D - slowed, rel=1e-12)
    assert most == len(g.ops)  # every op finished once


def test_an_op_slowed_past_its_end_then_sped_up_ends_once(node8):
    # The all-reduce (T seconds) outlasts the op's own time D = 0.9 T but not its slowed time D S / (S - 24):
    # the op's first end event finds it unfinished and schedules the slowed end, which the all-reduce's end
    # then brings forward. It ends once, at T + (D - T (S - 24) / S).
    probe = OpGraph(2)
    probe.collective("all_reduce", [0, 1], 2e9, algorithm="ring", stream="dp")
    t = _run(probe, node8).end_s[0]
    g = OpGraph(2)
    d = 0.9 * t
    a = g.compute(0, duration_s=d, category="fixed", name="a")
    ar = g.collective("all_reduce", [0, 1], 2e9, algorithm="ring", stream="dp")[0]
    g.compute(0, duration_s=1e-3, category="fixed", name="after", deps=[a])
    r, most = _once(g, node8)
    assert r.end_s[ar] == t and d < t < d * S / (S - 24)  # (the premise)
    assert r.end_s[a] == pytest.approx(t + d - t * (S - 24) / S, rel=1e-12)
    assert most == len(g.ops)


def test_a_receiving_rank_is_slowed_by_its_receive(node8):
    g = OpGraph(2)
    g.send(0, 1, 64e6, stream="pp")
    rv = g.recv(1, 0, 64e6, stream="pp")
    b = g.compute(1, duration_s=D, category="fixed", name="b")
    r = _run(g, node8, p2p_sms=4)
    t = r.end_s[rv] - r.start_s[rv]
    assert r.start_s[rv] == 0.0 and t < D
    assert r.end_s[b] == pytest.approx(D + t * 4 / S, rel=1e-12)


def test_each_rank_takes_its_own_compute_models_sms(node8):
    # rank_compute (several jobs on one fabric): rank 1's model holds 66 SMs per collective, rank 0's 24.
    g = OpGraph(2)
    a0 = g.compute(0, duration_s=D, category="fixed", name="a0")
    a1 = g.compute(1, duration_s=D, category="fixed", name="a1")
    ar = g.collective("all_reduce", [0, 1], 256e6, algorithm="ring", stream="dp")[0]
    r = Engine(g, node8, ComputeModel(H100), rank_compute={1: ComputeModel(H100, comm_sms=66)}).run()
    t = r.end_s[ar] - r.start_s[ar]
    assert r.end_s[a0] == pytest.approx(D + t * 24 / S, rel=1e-12)
    assert r.end_s[a1] == pytest.approx(D + t * 66 / S, rel=1e-12)


def test_a_collective_that_holds_no_sms_slows_nothing(node8):
    # holds_sms=False: communication whose SMs the generator priced itself (TE's userbuffers)
    g = OpGraph(2)
    a = g.compute(0, duration_s=D, category="fixed", name="a")
    g.collective("all_reduce", [0, 1], 256e6, algorithm="ring", stream="dp", holds_sms=False)
    assert _run(g, node8).end_s[a] == D


def test_an_op_ending_as_a_collective_starts_ends_on_time(node8):
    # Rank 1's 2 ms op releases the all-reduce at the instant rank 0's own 2 ms op is due: rank 0's op ends
    # at 2 ms exactly (no rounding residue, no extra event), with shared ends or one event per end alike.
    # (b first: its end runs first at that instant, so the all-reduce starts while a is still running)
    g = OpGraph(2)
    b = g.compute(1, duration_s=2e-3, category="fixed", name="b")
    a = g.compute(0, duration_s=2e-3, category="fixed", name="a")
    g.collective("all_reduce", [0, 1], 256e6, algorithm="ring", stream="dp", deps={1: [b]})
    records = []
    for share in (True, False):
        engine = Engine(g, node8, ComputeModel(H100))
        engine.share_compute_ends = share
        records.append(engine.run())
    assert records[0].end_s[a] == records[1].end_s[a] == 2e-3
    assert list(records[0].end_s) == list(records[1].end_s)


def test_userbuffers_collectives_hold_no_sms():
    # TE's userbuffers price their SMs in the GEMMs beside them (sm_reserved) or use the copy engines
    doc = copy.deepcopy(STEP)
    doc["parallel"].update(tp=4, pp=1, dp=4, tp_comm_overlap=True)
    exp = experiment_from_dict(doc)
    step = training_step(exp.model, exp.parallel, exp.training, exp.options, exp.routing)
    ub = [op for op in step.graph.ops if op.kind == "collective" and op.stream == "tp_overlap"]
    assert ub and not any(op.holds_sms for op in ub)
    assert all(op.holds_sms for op in step.graph.ops if op.kind == "collective" and op.stream != "tp_overlap")


def test_ranks_without_communication_are_not_slowed(node8):
    g = OpGraph(3)
    c = g.compute(2, duration_s=D, category="fixed", name="alone")
    g.collective("all_reduce", [0, 1], 1e9, algorithm="ring", stream="dp")
    assert _run(g, node8).end_s[c] == D


# ---------------------------------------------------------------------------------------- whole steps
STEP = {"cluster": {"preset": "dgx-h100", "nodes": 2},
        "model": {"preset": "gpt2-small", "layers": 8},
        "parallel": {"tp": 2, "pp": 2, "dp": 4, "micro_batch": 1, "global_batch": 16, "zero": 1,
                     "sequence_parallel": True},
        "training": {"seq_len": 1024}}


def _step(fidelity="fast", **knobs):
    doc = copy.deepcopy(STEP)
    doc["compute"] = knobs
    return run_experiment(experiment_from_dict(doc), fidelity=fidelity, force=True)


def test_more_sms_held_is_never_faster_and_moves_the_same_bytes():
    # (on this dense step; through contention a slower compute op can shorten a step elsewhere: DESIGN.md)
    runs = [_step(comm_sms=c, p2p_sms=p) for c, p in ((0, 0), (8, 1), (24, 2), (64, 8))]
    steps = [r.step_time for r in runs]
    assert steps == sorted(steps) and steps[0] < steps[-1]
    lost = [r.summary["compute_beside_comm_s"] for r in runs]
    assert lost[0] == 0.0 and lost == sorted(lost) and lost[-1] > 0
    for r in runs[1:]:
        assert r.bytes_by_class == pytest.approx(runs[0].bytes_by_class, rel=1e-12)


@pytest.mark.parametrize("fidelity", ["fast", "lockstep"])
def test_representatives_agree_with_full(fidelity):
    full, rep = _step("full"), _step(fidelity)
    assert rep.step_time == pytest.approx(full.step_time, rel=1e-9)
    assert rep.summary["compute_beside_comm_s"] == pytest.approx(full.summary["compute_beside_comm_s"], rel=1e-6)


# ---------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("knobs, message", [
    ({"comm_sms": -1}, r"compute.comm_sms: must be an integer number of SMs in 0..131"),
    ({"comm_sms": 132}, r"compute.comm_sms: .*H100-SXM has 132"),
    ({"p2p_sms": 1.5}, r"compute.p2p_sms: must be an integer"),
    ({"p2p_sms": True}, r"compute.p2p_sms: must be"),
])
def test_bad_sm_counts_name_the_field(knobs, message):
    with pytest.raises((ValueError, ConfigError), match=message):
        ComputeModel(H100, **knobs)
    doc = copy.deepcopy(STEP)
    doc["compute"] = knobs
    with pytest.raises((ValueError, ConfigError), match=message):
        run_experiment(experiment_from_dict(doc), force=True)
