"""Wide routes (a bulk all-to-all flow crosses ~170 links) through FlowNetwork's long-route paths.

A route of at least ``_LONG_ROUTE`` distinct links keeps numpy copies of its links; its arrival skips the
intrusion loop when numpy finds none of them held by another session. Wide routes whose faster links are
dominated (never tight) must give the finish times of the global max-min re-solve at every event
(``test_flow_network.reference_finish_times``), busy time as the union of the flows' spans per link, and
with replays cut short by intruders, what the network without replays gives.
"""

import numpy as np
import pytest
import simpy
from test_flow_network import _replays_match, network_finish_times, reference_finish_times

from simulator.network import _LONG_ROUTE, FlowNetwork


def _paired_route(rng, num_pairs, lo, hi):
    """Links of a wide route: ``k`` random pairs (slow NIC-like link ``i``, then its 4x faster link
    ``num_pairs + i``), always crossed together, so every fast link is dominated by its slow one."""
    pairs = np.sort(rng.choice(num_pairs, size=int(rng.integers(lo, hi)), replace=False))
    return [int(x) for i in pairs for x in (i, num_pairs + i)]


def _union_length(spans):
    total, end = 0.0, -np.inf
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("weighted", [False, True])
def test_wide_routes_with_dominated_links_give_the_global_resolve(seed, weighted):
    rng = np.random.default_rng(300 + seed)
    num_pairs = 40
    slow = rng.choice([5.0, 10.0], size=num_pairs)
    capacity = np.concatenate([slow, 4 * slow])
    flows = [(float(rng.choice([0.0, 1.0, 2.0, 3.5])), _paired_route(rng, num_pairs, 25, 40),
              float(rng.integers(1, 6)) * 10.0) for _ in range(12)]
    weights = None
    if weighted:  # a pair's two links at one weight (the slow one still dominates)
        weights = []
        for _, links, _ in flows:
            w = rng.choice([0.25, 0.5, 1.0], size=len(links) // 2)
            weights.append([float(x) for x in np.repeat(w, 2)])
    expected = reference_finish_times(flows, capacity, weights)
    finish, net = network_finish_times(flows, capacity, weights, with_network=True)
    assert finish == pytest.approx(expected, rel=1e-9, abs=1e-9)
    # The long-route paths were taken, and with links that can never be tight on them.
    assert all(len(r.ulinks) >= _LONG_ROUTE for r in net.routes)
    assert sum(t == np.inf for t in net._tight_at[num_pairs:]) == num_pairs
    # Busy time: the union of the spans of the flows on each link; bytes: each flow's bytes times its weight.
    busy = np.zeros(len(capacity))
    wire = np.zeros(len(capacity))
    for i, (_start, links, nbytes) in enumerate(flows):
        for k, link in enumerate(links):
            wire[link] += nbytes * (1.0 if weights is None else weights[i][k])
    for link in range(len(capacity)):
        busy[link] = _union_length([(s, f) for (s, links, _), f in zip(flows, finish) if link in links])
    assert net.ledger.busy_s == pytest.approx(busy, rel=1e-9, abs=1e-9)
    assert net.ledger.bytes == pytest.approx(wire, rel=1e-9)


def test_one_wide_flow_alone_by_hand():
    # 30 pairs (5 B/s and 20 B/s): alone, the flow runs at 5 B/s; 100 B take 20 s after 1 s of latency.
    # Every link it crosses is busy those 20 s and carries its 100 B; the others stay idle.
    num_pairs = 40
    capacity = np.array([5.0] * num_pairs + [20.0] * num_pairs)
    links = np.array([x for i in range(5, 35) for x in (i, num_pairs + i)])
    env = simpy.Environment()
    net = FlowNetwork(env, capacity)
    ends = []

    def go():
        yield net.transfer(links, 100.0, 1.0, "x")
        ends.append(env.now)

    env.process(go())
    env.run()
    assert ends == [pytest.approx(21.0)]
    on = np.isin(np.arange(2 * num_pairs), links)
    assert net.ledger.busy_s[on] == pytest.approx(np.full(60, 20.0))
    assert not net.ledger.busy_s[~on].any()
    assert net.ledger.bytes[on] == pytest.approx(np.full(60, 100.0))


@pytest.mark.parametrize("seed", range(3))
def test_wide_calls_replayed_and_cut_short_finish_as_simulated(seed):
    # A call of three wide flows repeated every 100 s is recorded once and replayed; wide single flows
    # thrown into some repeats cut those replays short (the intrusion check of a long route finds them).
    rng = np.random.default_rng(400 + seed)
    num_pairs = 40
    slow = rng.choice([5.0, 10.0], size=num_pairs)
    capacity = np.concatenate([slow, 4 * slow])
    call = tuple((np.array(_paired_route(rng, num_pairs, 25, 35)), float(rng.integers(1, 6)) * 10.0,
                  float(rng.choice([0.0, 0.5])), 1.0) for _ in range(3))
    calls = [(100.0 * k, call) for k in range(8)]
    for k in rng.choice(8, size=3, replace=False):
        spec = (np.array(_paired_route(rng, num_pairs, 25, 35)), float(rng.integers(1, 4)) * 10.0, 0.0, 1.0)
        calls.append((100.0 * k + float(rng.uniform(0, 5)), (spec,)))
    for foresee in (False, True):  # (wide calls are too long to join a replay: they make it real)
        net, _ref = _replays_match(calls, capacity, foresee=foresee)
        assert net.replays >= 3 and net.materialized >= 1 and net.joined_replays == 0
