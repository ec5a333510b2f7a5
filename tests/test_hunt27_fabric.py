"""Regression tests of a network architect's hunt (twenty-seventh round, fabrics): each against a hand-worked
truth, each failing on the code before its fix.

Under ``routing: spray`` a flow over ``k`` equal-cost paths was one flow of ``S/k`` bytes over the ``k`` paths'
links, so max-min fairness shared links by *paths*: at a link every path crosses (its own NIC) a sprayed flow
claimed ``k`` shares beside a flow of one path, and in a ring whose channels had unlike path counts (a cable
down) the channels with more paths took more of the NVLink all channels share. Now a sprayed hop is one flow of
its whole bytes, each path's entries weighted ``1/k``: links still carry exactly the even split, and a flow
competes as one flow.
"""

import pytest
import simpy

from simulator import simulate
from simulator.fabric import Fabric, NetworkConfig
from topologies import leaf_spine, rail_optimized
from topologies.faults import apply_faults
from workloads.ops import OpGraph


def _ends(cluster, flows, **config):
    env = simpy.Environment()
    fabric = Fabric(env, cluster, NetworkConfig(**config))
    ends = {}
    for i, (src, dst, nbytes) in enumerate(flows):
        ev = fabric.send(src, dst, nbytes, "t")
        ev.callbacks.append(lambda _e, i=i: ends.__setitem__(i, env.now))
    env.run()
    return ends, fabric


@pytest.mark.parametrize("routing", ["ecmp", "spray"])
def test_a_sprayed_flow_takes_one_share_of_its_own_nic(routing):
    # Three servers, two per leaf, two spines. Rank 0 sends 1 GB to rank 8 (same leaf: one path) and 1 GB to
    # rank 16 (other leaf: two paths under spray), both through NIC 0 (PXN off). The NIC (50 GB/s) is the only
    # shared link: max-min gives each flow 25 GB/s and both end at 2 GB / 50 GB/s = 40 ms (plus their route
    # latencies). Before, the sprayed flow claimed two shares: 33.3 GB/s, ending at 30 ms, the other at 40.
    c = leaf_spine("H100-SXM", servers=3, servers_per_leaf=2, spines=2)
    nic = c.gpu.nic_bandwidth
    size = 1e9
    ends, fabric = _ends(c, [(0, 8, size), (0, 16, size)], routing=routing, step_latency_s=0.0,
                         bandwidth_efficiency=1.0, pxn=False)
    # Each flow starts after its route's latency: near (gpu-nic, nic-leaf, leaf-nic, nic-gpu) 1.5 us, far (and
    # leaf-spine, spine-leaf) 2.5 us. The near flow runs alone at the NIC's rate until the far one starts, then
    # both at half of it; the NIC never idles from the near flow's start until the far flow's end.
    near = 2 * 0.25e-6 + 2 * 0.5e-6
    far = near + 2 * 0.5e-6
    assert ends[0] == pytest.approx(far + (size - nic * (far - near)) / (nic / 2), rel=1e-9)
    assert ends[1] == pytest.approx(near + 2 * size / nic, rel=1e-9)
    # what each link carried is still the even split: half of the far flow on each uplink
    moved = fabric.network.ledger.bytes
    ups = [fabric.link_index[(("leaf", 0), ("spine", j))] for j in range(2)]
    expected = [size / 2] * 2 if routing == "spray" else sorted([0.0, size])
    assert sorted(moved[ups]) == pytest.approx(expected)


def test_a_cable_down_costs_no_more_than_its_whole_spine_down_under_spray():
    # 8 DGX-H100 servers in two rail pods of 4, 2 spines: each leaf-spine link carries 4 x 50 / 2 = 100 GB/s.
    # A ring all-reduce over all 64 GPUs (PXN: every channel keeps to its rail) crosses the spines with one
    # channel per rail leaf each way, at most a NIC's rate (47.5 GB/s usable): one spine is enough, so neither
    # spine 0 down nor the cable leaf 0 - spine 0 down (a subset of it) may slow the ring at all. Before, the
    # cable down left rail 0's channel on one path and the others on two, and the others' flows took twice its
    # share of the NVLink every channel crosses: 1.2165x the healthy ring.
    c = rail_optimized("H100-SXM", servers=8, servers_per_leaf=4, spines=2)
    net = NetworkConfig(routing="spray")

    def ring(cluster):
        g = OpGraph(64)
        g.collective("all_reduce", list(range(64)), 2**28, algorithm="ring", traffic_class="bench")
        return simulate(g, cluster, network=net)

    healthy = ring(c).step_time
    spine = ring(apply_faults(c, [{"kind": "switch_down", "switch": "spine:0"}])).step_time
    cable = ring(apply_faults(c, [{"kind": "link_down", "link": ["leaf:0", "spine:0"]}]))
    assert spine == pytest.approx(healthy, rel=1e-9)
    assert cable.step_time == pytest.approx(healthy, rel=1e-9)
    # the cable's traffic went to the other spine whole; the other rails still split theirs
    links = cable.links
    up = links[(links.src == "('leaf', 0)") & (links.dst == "('spine', 1)")]["bytes"].iloc[0]
    other = links[(links.src == "('leaf', 1)") & (links.dst == "('spine', 1)")]["bytes"].iloc[0]
    assert up == pytest.approx(2 * other, rel=1e-9)
