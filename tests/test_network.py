"""Contention on shared links and deterministic ECMP, from first principles."""

import numpy as np
import pytest
import simpy

from simulator.engine import run
from simulator.fabric import Fabric, NetworkConfig
from simulator.routing import Router, shortest_paths
from topologies import fat_tree, leaf_spine, rail_optimized, single_server
from workloads.ops import OpGraph

STEP = 2e-6
IDEAL_NET = NetworkConfig(step_latency_s=STEP, bandwidth_efficiency=1.0)


def two_rings(c, groups, size):
    g = OpGraph(c.num_gpus)
    for grp in groups:
        g.collective("all_reduce", grp, size, algorithm="ring")
    return run(g, c, network=IDEAL_NET).step_time_s


def test_two_collectives_sharing_an_oversubscribed_spine():
    # 4 servers x 8 GPUs, 2 servers per leaf, one spine, 4:1 oversubscribed:
    # each leaf->spine link carries 2*8*50/(1*4) = 200 GB/s per direction.
    c = leaf_spine("H100-SXM", servers=4, servers_per_leaf=2, spines=1, oversubscription=4)
    nic = c.gpu.nic_bandwidth
    uplink = 2 * 8 * nic / 4
    assert c.graph.edges[("leaf", 0), ("spine", 0)]["bandwidth"] == pytest.approx(uplink)
    a = list(range(0, 8)) + list(range(16, 24))      # servers 0 and 2: crosses the spine
    b = list(range(8, 16)) + list(range(24, 32))     # servers 1 and 3: crosses the spine too
    n, size = 16, 2**31
    # a step's route between servers: GPU -> NVSwitch -> GPU on the next server's rail (PXN: the ring leaves each
    # server through the NIC it entered by), PCIe, NIC -> leaf -> spine -> leaf -> NIC, PCIe
    lat = 2 * (n - 1) * (STEP + 2 * 0.25e-6 + 2 * 0.25e-6 + 4 * 0.5e-6)
    per_link_bytes = 2 * (n - 1) / n * size / 8          # 8 channels, one per rail
    alone_expected = lat + per_link_bytes / min(nic, uplink / 8)
    together_expected = lat + per_link_bytes / min(nic, uplink / 16)
    alone = two_rings(c, [a], size)
    together = two_rings(c, [a, b], size)
    assert alone == pytest.approx(alone_expected, rel=1e-6)
    assert together == pytest.approx(together_expected, rel=1e-6)
    assert together > 1.9 * alone


def test_collectives_on_disjoint_links_do_not_interact(two_leaves):
    a, b = list(range(0, 8)), list(range(8, 16))     # two servers' NVLink domains
    assert two_rings(two_leaves, [a, b], 2**30) == pytest.approx(two_rings(two_leaves, [a], 2**30), rel=1e-12)


def _sim_flows(cluster, flows, seed=0):
    env = simpy.Environment()
    fabric = Fabric(env, cluster, NetworkConfig(seed=seed, step_latency_s=STEP, bandwidth_efficiency=1.0))
    ends = {}
    for i, (src, dst, label, nbytes) in enumerate(flows):
        ev = fabric.send(src, dst, nbytes, "test", label=label)
        ev.callbacks.append(lambda _e, i=i: ends.__setitem__(i, env.now))
    env.run()
    return ends, fabric


def test_ecmp_collision_slows_a_flow():
    # 1 server per leaf, 2 GPUs per server, 2 spines: each leaf-spine link = one NIC's bandwidth.
    c = leaf_spine("H100-SXM", servers=2, gpus_per_server=2, servers_per_leaf=1, spines=2)
    nic = c.gpu.nic_bandwidth
    env = simpy.Environment()
    fabric = Fabric(env, c, IDEAL_NET)
    spine_of = {}
    for label in range(16):
        for src, dst in ((0, 2), (1, 3)):
            links = fabric.route(src, dst, label)
            spine_of[src, label] = [fabric.links[l] for l in links if fabric.tier[l] == "spine"][0][1]
    collide = next(l for l in range(16) if spine_of[0, l] == spine_of[1, l])
    spread = next(l for l in range(16) if spine_of[0, l] != spine_of[1, l])
    size = 1e9
    ends_c, _ = _sim_flows(c, [(0, 2, collide, size), (1, 3, collide, size)])
    ends_s, _ = _sim_flows(c, [(0, 2, spread, size), (1, 3, spread, size)])
    lat = STEP + 2 * 0.25e-6 + 4 * 0.5e-6
    assert ends_s[0] == pytest.approx(lat + size / nic, rel=1e-9)
    assert ends_c[0] == pytest.approx(lat + size / (nic / 2), rel=1e-9)   # two flows share one uplink


def test_ecmp_is_deterministic_and_seeded():
    c = leaf_spine("H100-SXM", servers=8, servers_per_leaf=2, spines=4, oversubscription=2)
    flows = [(s, (s + 17) % 64, s % 3, 1e8 * (1 + s % 5)) for s in range(64)]
    a, _ = _sim_flows(c, flows, seed=0)
    b, _ = _sim_flows(c, flows, seed=0)
    assert a == b
    choices = {seed: [tuple(Fabric(simpy.Environment(), c, NetworkConfig(seed=seed)).route(s, d, l))
                      for s, d, l, _ in flows] for seed in (0, 1)}
    assert choices[0] != choices[1]


def test_ecmp_spreads_over_all_spines():
    c = leaf_spine("H100-SXM", servers=4, servers_per_leaf=2, spines=4)
    env = simpy.Environment()
    fabric = Fabric(env, c)
    used = {}
    for src in range(16):
        for label in range(8):
            links = fabric.route(src, 16 + src, label)
            spine = [fabric.links[l][1] for l in links if fabric.tier[l] == "spine"][0]
            used[spine] = used.get(spine, 0) + 1
    assert len(used) == 4 and min(used.values()) > 0.15 * 128


def test_bytes_are_conserved_on_every_link(two_leaves):
    size = 3e8
    ends, fabric = _sim_flows(two_leaves, [(0, 20, 0, size), (5, 30, 1, size), (9, 10, 2, size)])
    ledger = fabric.network.ledger
    expected = np.zeros(len(fabric.links))
    for src, dst, label in ((0, 20, 0), (5, 30, 1), (9, 10, 2)):
        expected[fabric.route(src, dst, label)] += size
    np.testing.assert_allclose(ledger.bytes, expected)
    busy = ledger.busy_s[ledger.bytes > 0]
    assert np.all(busy > 0) and np.all(busy <= max(ends.values()) + 1e-15)


@pytest.mark.parametrize("build", [
    lambda: single_server("A100", 4),
    lambda: leaf_spine("H100-SXM", servers=6, gpus_per_server=4, servers_per_leaf=2, spines=3),
    lambda: rail_optimized("H100-SXM", servers=4, gpus_per_server=4, servers_per_leaf=2, spines=2),
    lambda: fat_tree("H100-SXM", servers=8, gpus_per_server=2, servers_per_leaf=2),
    lambda: leaf_spine("GB200", servers=4, gpus_per_server=6, servers_per_leaf=2, spines=2, nvlink_racks=2),
    lambda: single_server("GB200", 8, nvlink_racks=2),
])
def test_structured_routes_equal_breadth_first_search(build):
    c = build()
    link_index = {e: i for i, e in enumerate(c.graph.edges)}
    router = Router(c.graph, link_index)
    gpus = c.gpus
    for i, s in enumerate(gpus):
        for t in gpus[i + 1:: max(1, len(gpus) // 7)]:
            fast = sorted(tuple(p) for p in router.paths(s, t))
            ref = sorted(tuple(link_index[(p[j], p[j + 1])] for j in range(len(p) - 1))
                         for p in shortest_paths(c.graph, s, t))
            assert fast == ref


def _faulted_fat_tree():
    from topologies.faults import apply_faults
    c = fat_tree("H100-SXM", servers=8, gpus_per_server=2, servers_per_leaf=2, leaves_per_pod=2, spines=2, cores=4)
    return apply_faults(c, [{"kind": "link_down", "link": ["leaf:0", "spine:1"]},
                            {"kind": "switch_down", "switch": "core:2"},
                            {"kind": "degraded_link", "link": ["spine:3", "core:1"], "fraction": 0.5},
                            {"kind": "nic_down", "gpu": 5}])


ROUTED_FABRICS = [
    lambda: leaf_spine("H100-SXM", servers=6, gpus_per_server=4, servers_per_leaf=2, spines=3),
    lambda: fat_tree("H100-SXM", servers=8, gpus_per_server=2, servers_per_leaf=2, leaves_per_pod=2, spines=2,
                     cores=4),
    lambda: leaf_spine("GB200", servers=4, gpus_per_server=6, servers_per_leaf=2, spines=2, nvlink_racks=2),
    _faulted_fat_tree,
]
"""Fabrics whose every GPU pair the routing tests walk: two tiers, three, a two-rack NVLink domain, faults."""


@pytest.mark.parametrize("build", ROUTED_FABRICS)
def test_route_is_the_ecmp_pick_among_breadth_first_paths(build):
    """The route built leg by leg (only the picked one) is path ``hash % k`` of the whole-graph search's
    sorted equal-cost paths, for every GPU pair and a few labels, faulted fabrics included."""
    from simulator.routing import ecmp_hash
    c = build()
    link_index = {e: i for i, e in enumerate(c.graph.edges)}
    router = Router(c.graph, link_index, seed=3)
    node_id = {n: i for i, n in enumerate(c.graph.nodes)}
    asked, wanted = [], []
    for i, s in enumerate(c.gpus):
        for j, t in enumerate(c.gpus):
            if s == t:
                continue
            ref = [[link_index[(p[j], p[j + 1])] for j in range(len(p) - 1)] for p in shortest_paths(c.graph, s, t)]
            assert [list(p) for p in router.paths(s, t)] == ref  # same order: ECMP indices agree
            for label in (0, 1, 7):
                want = ref[ecmp_hash(node_id[s], node_id[t], label, 3) % len(ref)]
                assert router.route(s, t, label).tolist() == want
                asked.append((i, j, label))
                wanted.append(want)
    # every pair at once (the vectorised path Fabric uses for DP rings and sends), on a fresh router
    router = Router(c.graph, link_index, seed=3)
    src, dst, labels = (np.array(x) for x in zip(*asked))
    got = router.routes(c.gpus, src, dst, labels)
    assert [g.tolist() for g in got] == wanted
    assert all(g.dtype == np.int64 for g in got)


def test_ecmp_hash_array_equals_the_scalar_hash():
    """The vectorised hash (uint64 arithmetic) equals the Python one on keys spread over 64 bits, seeds
    negative and large included."""
    from simulator.routing import ecmp_hash, ecmp_hash_array
    rng = np.random.default_rng(0)
    a = rng.integers(0, 2**63, 300, dtype=np.int64)
    b = rng.integers(0, 2**20, 300, dtype=np.int64)
    for seed in (0, 3, -5, 2**64 - 1):
        h = ecmp_hash_array(a, b, 7, seed)
        assert [int(x) for x in h] == [ecmp_hash(int(x), int(y), 7, seed) for x, y in zip(a, b)]


@pytest.mark.parametrize("build", [
    lambda: leaf_spine("H100-SXM", servers=6, gpus_per_server=4, servers_per_leaf=2, spines=3),
    lambda: rail_optimized("H100-SXM", servers=4, gpus_per_server=4, servers_per_leaf=2, spines=2),
    lambda: fat_tree("H100-SXM", servers=16, gpus_per_server=1, servers_per_leaf=2, leaves_per_pod=2, spines=2,
                     cores=4),
    _faulted_fat_tree,
])
def test_bidirectional_switch_paths_equal_breadth_first_search(build):
    """Every switch pair: the bidirectional search gives the one-sided search's paths, in its order."""
    from simulator.routing import switch_paths
    g = build().graph
    switches = g.subgraph([n for n, k in g.nodes(data="kind") if k not in ("gpu", "nic", "nvswitch")]).copy()
    balls: dict = {}  # the router's search levels, kept across pairs (Router._mids)
    for a in switches:
        for b in switches:
            want = shortest_paths(switches, a, b)
            assert switch_paths(switches, a, b) == want
            assert switch_paths(switches, a, b, balls) == want
