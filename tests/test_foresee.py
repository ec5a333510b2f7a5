"""Calls alone on idle links worked out ahead (``FlowNetwork(foresee=True)``, the default) against the event loop.

A call whose links are idle and whose shape has no recording (an alltoallv of an EP group: its sizes are its
own) used to be simulated event by event; now its trajectory is worked out when it starts and replayed, made
real only if another flow comes onto its links first; a call that starts on links one replay alone holds is
worked out together with it (``FlowNetwork._join_replay``). The truth is the network that simulates every flow
(``replay=False``), and hand-worked times.
"""

import numpy as np
import pytest
from test_flow_network import _calls_finish_times
from test_moe_training import MOE

import simulator.fabric
from simulator.experiment import experiment_from_dict, run_experiment
from simulator.maxmin import max_min_rates_dense, max_min_rates_small
from simulator.network import FlowNetwork


def test_a_call_alone_by_hand_takes_no_solve_of_the_event_loop():
    # Link 0 (10 B/s) is shared: flow A, 20 B over links 0 and 1, starts at once; flow B, 20 B over links 0
    # and 2, after 1 s of latency. A alone moves 10 B by t = 1; then 5 B/s each: A is done at 3, B has 10 B
    # left and alone again at 10 B/s is done at 4. Busy: link 0 for 4 s, link 1 for 3 (0-3), link 2 for 3 (1-4).
    capacity = np.array([10.0, 10.0, 10.0])
    call = ((np.array([0, 1]), 20.0, 0.0, 20.0), (np.array([0, 2]), 20.0, 1.0, 20.0))
    finish, net = _calls_finish_times([(0.0, call)], capacity, replay=True)
    assert finish == [pytest.approx(4.0, rel=1e-12)]
    assert net.foreseen == 1 and net.rate_solves == 0
    assert net.ledger.bytes.tolist() == pytest.approx([40.0, 20.0, 20.0], rel=1e-12)
    assert net.ledger.busy_s.tolist() == pytest.approx([4.0, 3.0, 3.0], rel=1e-12)
    from simulator.traffic import link_series
    times, rates = link_series(net.ledger, net.routes, [0])[0]
    assert rates[:-1] == pytest.approx([10.0] * (len(rates) - 1), rel=1e-12)  # link 0 full until t = 4
    assert times[-1] == pytest.approx(4.0, rel=1e-12)


@pytest.mark.parametrize("seed", range(8))
def test_calls_of_their_own_sizes_finish_as_simulated_even_when_cut_short(seed):
    # Calls of up to five flows with latencies and repeated links (a flow crossing a link twice), each with
    # sizes of its own (no shape repeats: nothing recorded could be replayed), every 20 s, a few overlapping
    # the next; single flows soon after some of them start cut them short. Every finish time, every link's
    # bytes and busy time must be those of the network that simulates every flow.
    rng = np.random.default_rng(300 + seed)
    num_links = 10
    capacity = rng.choice([10.0, 20.0, 40.0], size=num_links)
    calls = []
    for k in range(24):
        specs = []
        for _ in range(int(rng.integers(1, 6))):
            links = rng.choice(num_links, size=rng.integers(1, 4), replace=False)
            if rng.random() < 0.3:
                links = np.concatenate([links, links[:1]])  # crossed twice
            specs.append((links, float(rng.uniform(5, 40)), float(rng.choice([0.0, 0.5, 1.5])), 1.0))
        calls.append((20.0 * k + float(rng.uniform(0, 2)), tuple(specs)))
    for k in rng.choice(24, size=8, replace=False):
        links = rng.choice(num_links, size=rng.integers(1, 3), replace=False)
        calls.append((20.0 * k + float(rng.uniform(0.5, 4)), ((links, float(rng.uniform(5, 50)), 0.0, 1.0),)))
    got, net = _calls_finish_times(calls, capacity, replay=True)
    ref, ref_net = _calls_finish_times(calls, capacity, replay=False)
    assert got == pytest.approx(ref, rel=1e-9, abs=1e-9)
    assert net.ledger.bytes == pytest.approx(ref_net.ledger.bytes, rel=1e-12)
    assert net.ledger.busy_s == pytest.approx(ref_net.ledger.busy_s, rel=1e-9, abs=1e-9)
    assert net.ledger.flows_completed == ref_net.ledger.flows_completed
    assert net.foreseen >= 10 and net.joined_replays >= 1 and ref_net.foreseen == 0
    assert net.rate_solves < ref_net.rate_solves


def _ab(later=()):
    """Call A (20 B over links 0 and 1, at once) at t = 0 and call B (10 B over links 0 and 2, 0.5 s of
    latency) at t = 1, then ``later`` calls; every link 10 B/s."""
    a = ((np.array([0, 1]), 20.0, 0.0, 20.0),)
    b = ((np.array([0, 2]), 10.0, 0.5, 10.0),)
    return [(0.0, a), (1.0, b)] + list(later)


def test_a_call_onto_a_replays_links_joins_it_by_hand():
    # A alone at 10 B/s has 5 B left at 1.5, when B arrives: 5 B/s each, A done at 2.5; B then has 5 B left,
    # alone at 10 B/s: done at 3. B starts on links A's replay holds (link 2 idle), so the two are worked out
    # together from t = 1: no solve of the event loop, nothing made real.
    capacity = np.array([10.0, 10.0, 10.0])
    finish, net = _calls_finish_times(_ab(), capacity, replay=True)
    assert finish == [pytest.approx(2.5, rel=1e-12), pytest.approx(3.0, rel=1e-12)]
    assert net.foreseen == 1 and net.joined_replays == 1 and net.rate_solves == 0 and net.materialized == 0
    assert net.ledger.bytes.tolist() == pytest.approx([30.0, 20.0, 10.0], rel=1e-12)
    assert net.ledger.busy_s.tolist() == pytest.approx([3.0, 2.5, 1.5], rel=1e-12)


def test_a_joined_replay_cut_short_is_made_real_in_its_state_by_hand():
    # As above, plus F (100 B over link 3, alone: a replay of its own) at t = 0 and E (10 B over links 2 and
    # 3, at once) at t = 2. E's links are held by two replays, so it joins neither: it makes both real when it
    # arrives. At t = 2: A has 2.5 B left, B 7.5, F 80; links 0 (A, B), 2 (B, E) and 3 (F, E) bind at 5 B/s
    # each, so A is done at 2.5; then links 2 and 3 keep B, E and F at 5: B is done at 3.5 (5 B left at 2.5);
    # then E and F at 5 (link 3): E is done at 4 (2.5 B left at 3.5); F then at 10 with 70 B left: done at 11.
    capacity = np.array([10.0] * 4)
    calls = _ab([(0.0, ((np.array([3]), 100.0, 0.0, 100.0),)), (2.0, ((np.array([2, 3]), 10.0, 0.0, 10.0),))])
    finish, net = _calls_finish_times(calls, capacity, replay=True)
    assert finish == pytest.approx([2.5, 3.5, 11.0, 4.0], rel=1e-12)
    assert net.joined_replays == 1 and net.materialized == 2
    ref, ref_net = _calls_finish_times(calls, capacity, replay=False)
    assert ref == pytest.approx(finish, rel=1e-12)
    assert net.ledger.bytes.tolist() == pytest.approx(ref_net.ledger.bytes.tolist(), rel=1e-12)
    assert net.ledger.busy_s.tolist() == pytest.approx(ref_net.ledger.busy_s.tolist(), rel=1e-12)


def test_a_chain_of_overlapping_calls_joins_one_replay_after_another():
    # Twelve calls of one flow (4 B over link 0 and link 1 or 2, 0.1 s of latency) every 0.3 s: each starts
    # while calls before it still run, on links only their replay holds. Each joins it; calls already done
    # leave it, so the chain never holds more than a few live calls and never falls back to the event loop.
    capacity = np.array([10.0, 10.0, 10.0])
    calls = [(0.3 * k, ((np.array([0, 1 + k % 2]), 4.0, 0.1, 4.0),)) for k in range(12)]
    got, net = _calls_finish_times(calls, capacity, replay=True)
    ref, ref_net = _calls_finish_times(calls, capacity, replay=False)
    assert got == pytest.approx(ref, rel=1e-12)
    assert net.ledger.bytes.tolist() == pytest.approx(ref_net.ledger.bytes.tolist(), rel=1e-12)
    assert net.ledger.busy_s.tolist() == pytest.approx(ref_net.ledger.busy_s.tolist(), rel=1e-12)
    assert net.joined_replays == 11 and net.rate_solves == 0 and net.materialized == 0
    # By hand, the first: alone from 0.1 at 10 B/s, it has 1 B left when call 1 arrives at 0.4; then 5 B/s.
    assert got[0] == pytest.approx(0.6, rel=1e-12)


def test_off_it_is_the_event_loop():
    capacity = np.array([10.0, 10.0, 10.0])
    call = ((np.array([0, 1]), 20.0, 0.0, 20.0), (np.array([0, 2]), 20.0, 1.0, 20.0))
    finish, net = _calls_finish_times([(0.0, call)], capacity, replay=True, foresee=False)
    assert finish == [pytest.approx(4.0, rel=1e-12)]
    assert net.foreseen == 0 and net.rate_solves >= 2


@pytest.mark.parametrize("seed", range(20))
def test_dense_progressive_filling_is_the_sparse_one(seed):
    # A few flows over many links at unlike weights (bulk all-to-all flows), each capped on its own.
    rng = np.random.default_rng(seed)
    links, flows = int(rng.integers(1, 200)), int(rng.integers(1, 7))
    crossings = rng.choice([0.0, 0.0, 1.0, 2.0, 0.25, 1.7], size=(links, flows))
    capacity = rng.uniform(1.0, 10.0, size=links)
    caps = rng.uniform(0.5, 30.0, size=flows)
    dense = max_min_rates_dense(crossings, capacity, caps)
    rows = [[j for j in range(links) if crossings[j, f]] for f in range(flows)]
    mults = [[crossings[j, f] for j in rows[f]] for f in range(flows)]
    sparse = max_min_rates_small(rows, mults, capacity.tolist(), caps.tolist())
    assert dense.tolist() == pytest.approx(sparse, rel=1e-12)
    assert (crossings @ dense <= capacity * (1 + 1e-9)).all() and (dense <= caps * (1 + 1e-12)).all()


def test_dense_progressive_filling_by_hand():
    # Link 0 (12 B/s) carries flow 0 once and flow 1 twice; link 1 (10 B/s) flows 1 and 2; flow 2 capped at
    # 1 B/s. Filling: flow 2 stops at 1; link 0 binds at 3r = 12: r = 4 for flows 0 and 1 (link 1: 4 + 1 <= 10).
    rates = max_min_rates_dense(np.array([[1.0, 2.0, 0.0], [0.0, 1.0, 1.0]]), np.array([12.0, 10.0]),
                                np.array([100.0, 100.0, 1.0]))
    assert rates.tolist() == pytest.approx([4.0, 4.0, 1.0], rel=1e-12)


@pytest.mark.parametrize("fidelity", ["fast", "lockstep"])
def test_a_skewed_moe_step_is_the_event_loops(monkeypatch, fidelity):
    # TP 2, EP 8 over 4 DGX H100 (each EP group spans two servers: its alltoallvs cross the fabric), Zipf
    # routing: every exchange has sizes of its own, so each one alone on its links is worked out ahead.
    doc = {"cluster": {"preset": "dgx-h100", "nodes": 4}, "model": dict(MOE),
           "parallel": {"tp": 2, "pp": 2, "dp": 8, "ep": 8, "micro_batch": 1, "global_batch": 32,
                        "sequence_parallel": True},
           "training": {"seq_len": 2048}, "moe": {"routing": "zipf", "zipf_s": 1.0, "seed": 3}}
    nets = []

    def run(foresee):
        def make(env, cap):
            nets.append(FlowNetwork(env, cap, foresee=foresee))
            return nets[-1]
        monkeypatch.setattr(simulator.fabric, "FlowNetwork", make)
        return run_experiment(experiment_from_dict(doc), fidelity=fidelity), nets[-1]

    got, net = run(True)
    ref, ref_net = run(False)
    assert got.step_time == pytest.approx(ref.step_time, rel=1e-9)
    assert np.allclose(got.record.end_s, ref.record.end_s, rtol=1e-9, atol=1e-12)
    assert net.ledger.bytes == pytest.approx(ref_net.ledger.bytes, rel=1e-9)
    assert net.ledger.busy_s == pytest.approx(ref_net.ledger.busy_s, rel=1e-6, abs=1e-9)
    assert net.foreseen > 0 and net.rate_solves < ref_net.rate_solves
