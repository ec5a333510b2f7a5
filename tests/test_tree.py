"""NCCL's tree all-reduce: a tree per channel, two mirrored binary trees, chosen by NCCL's tuner rule.

Truth: the byte counts of the double binary tree worked by hand, NCCL's ``tuning.cc`` (the tree priced at the
ring's bus bandwidth x0.92 plus its own latency; the tree runs all-reduce only), and the published 2 x 8 A100
all-reduce (188.2 GB/s bus bandwidth at 4 GiB, tests/test_compute_grounding.py: NCCL picks the ring there).
"""

import pytest
import simpy

from simulator.collectives import AUTO_CANDIDATES, plan_collective
from simulator.engine import Engine
from simulator.fabric import Fabric, NetworkConfig
from simulator.nccl import BANDWIDTH_FACTOR, bandwidth_factor
from topologies import build_cluster, leaf_spine
from workloads.ops import OpGraph

IDEAL = NetworkConfig(step_latency_s=2e-6, bandwidth_efficiency=1.0)


WIRE = 1 / BANDWIDTH_FACTOR["Simple"]
"""Wire bytes per payload byte of a large all-reduce (Simple): the tuner's x0.92 for the tree prices the
choice, it is not bytes on the wire."""


def _nic_bytes_out(cluster, n, size):
    """Payload bytes each GPU's NIC sends into the fabric during one tree all-reduce over ranks 0..n-1."""
    graph = OpGraph(n)
    graph.collective("all_reduce", list(range(n)), size, algorithm="tree", traffic_class="dp")
    record = Engine(graph, cluster, network=IDEAL).run()
    fabric = record.fabric
    moved = fabric.network.ledger.bytes
    out = {}
    for i, (u, v) in enumerate(fabric.links):
        if u[0] == "nic" and v[0] == "leaf":
            out[u] = float(moved[i]) / WIRE
    return out


def test_the_tree_runs_a_channel_per_member_and_uses_every_nic():
    # 2 servers of 8 GPUs: channel c joins the servers through member c, so all 8 NICs carry S/8 each way
    # (reduce up, broadcast down over the one edge between the servers).
    c = leaf_spine("H100", servers=2, servers_per_leaf=2)
    size = 2**30
    out = _nic_bytes_out(c, 16, size)
    assert len(out) == 16 and all(b == pytest.approx(size / 8) for b in out.values())


def test_two_mirrored_trees_load_no_nic_with_more_than_twice_the_data():
    # 8 servers of one GPU: each channel's bytes S split over two binary trees of S/2 (heap order, and the
    # servers reversed behind the root). A node sends its share up to its parent and down to each child:
    # worked by hand, server 0 (root of both: 2 + 2 children), 1 (3 in one, a leaf in the other), 7 (a leaf,
    # then 3) send 4 x S/2; server 3 sends 3 x S/2; server 4 (a leaf in both) S. One tree alone would make
    # its interior servers send 3 x S.
    c = leaf_spine("H100", servers=8, gpus_per_server=1, servers_per_leaf=8)
    size = 2**30
    out = _nic_bytes_out(c, 8, size)
    by_server = {nic[1]: b for nic, b in out.items()}
    assert by_server[0] == pytest.approx(2 * size)
    assert by_server[1] == pytest.approx(2 * size) and by_server[7] == pytest.approx(2 * size)
    assert by_server[3] == pytest.approx(1.5 * size)
    assert by_server[4] == pytest.approx(size)
    assert max(by_server.values()) == pytest.approx(2 * size)


def test_the_tuner_prices_the_tree_at_nccls_factors():
    assert bandwidth_factor("tree", "all_reduce", "Simple") == pytest.approx(0.92)
    assert bandwidth_factor("tree", "all_reduce", "LL") == pytest.approx(0.92 / 3.8)
    assert bandwidth_factor("tree", "all_reduce", "LL128") == pytest.approx(0.92 * 120 / 128)
    assert bandwidth_factor("tree", "all_reduce", "LL128", one_node=True) == pytest.approx(0.92 * 7 / 9)
    assert bandwidth_factor("ring", "all_reduce", "LL") == pytest.approx(0.5)
    assert bandwidth_factor("tree", "broadcast", "Simple") == 1.0


def test_a_one_rank_all_reduce_is_free_under_auto():
    fabric = Fabric(simpy.Environment(), build_cluster({"preset": "dgx-h100", "nodes": 1}))
    plan, _protocol = fabric.choose("all_reduce", (0,), 1024.0)
    assert plan.algorithm == "ring"
    graph = OpGraph(2)
    graph.collective("all_reduce", [0], 2**20, traffic_class="dp")
    assert Engine(graph, build_cluster({"preset": "dgx-h100", "nodes": 1})).run().step_time_s == 0.0


def test_only_all_reduce_has_the_tree_among_auto_candidates():
    assert AUTO_CANDIDATES["all_reduce"] == ("ring", "tree")
    assert AUTO_CANDIDATES["broadcast"] == ("ring",) and AUTO_CANDIDATES["reduce"] == ("ring",)


def test_auto_picks_the_tree_for_small_all_reduces_across_servers_and_the_ring_on_two_nodes_at_4_gib():
    c = build_cluster({"preset": "dgx-h100", "nodes": 8})
    fabric = Fabric(simpy.Environment(), c)
    group = tuple(range(64))
    assert fabric.choose("all_reduce", group, 8192.0)[0].algorithm == "tree"  # log-depth latency
    two = build_cluster({"preset": "dgx-a100", "nodes": 2})
    fabric = Fabric(simpy.Environment(), two)
    # one edge between two servers moves S/k per NIC, half the ring's bytes, but NCCL's tuner prices the tree
    # at the ring's bandwidth (x0.92) and runs the ring: the published 188.2 GB/s is a ring's
    plan, _protocol = fabric.choose("all_reduce", tuple(range(16)), float(2**32))
    assert plan.algorithm == "ring"


def test_the_tree_rule_for_auto_is_the_tree_latency_plus_the_rings_bandwidth_term():
    c = build_cluster({"preset": "dgx-h100", "nodes": 4})
    fabric = Fabric(simpy.Environment(), c)
    group, nbytes = tuple(range(32)), float(2**24)
    ring = plan_collective("all_reduce", group, nbytes, fabric.server_of, "ring", stagger=True)
    tree = plan_collective("all_reduce", group, nbytes, fabric.server_of, "tree", stagger=True)
    protocols = fabric.protocols(ring)
    ring_total, ring_latency = fabric._both_estimates(ring, protocols)
    tree_latency = fabric._both_estimates(tree, protocols)[1]
    n = len(group)
    priced = {("ring", p): t for p, t in zip(protocols, ring_total)}
    for p, lat, total, rlat in zip(protocols, tree_latency, ring_total, ring_latency):
        priced[("tree", p)] = lat + (total - rlat) * n / (n - 1) * bandwidth_factor("ring", "all_reduce", p) \
            / bandwidth_factor("tree", "all_reduce", p, one_node=False)
    best = min(priced, key=priced.get)
    plan, protocol = fabric.choose("all_reduce", group, nbytes)
    assert (plan.algorithm, protocol) == best
