"""Fabrics people build: rack-scale NVLink domains (GB200/GB300 NVL72, NVL36x2) and packet spraying.

Truth here is the datasheets (rack totals divided by 72, re-derived in the tests) and the α-β closed forms on
an idealised network (uniform software latency per step, links at full rate), as in ``test_collectives.py``;
for all-to-all over an oversubscribed leaf-spine, the bytes that must cross each leaf's uplinks over their
capacity.
"""

import numpy as np
import pytest

from simulator.bench import collective_time
from simulator.engine import Engine
from simulator.fabric import NetworkConfig
from topologies import TopologyError, build_cluster, get_gpu, leaf_spine
from workloads.ops import OpGraph

STEP = 2e-6
IDEAL = {"step_latency_s": STEP, "bandwidth_efficiency": 1.0}


# ------------------------------------------------------------------ GPU specs and presets
@pytest.mark.parametrize("name,hbm_gb,nic_gbps", [("GB200", 13.4e3 / 72, 400), ("GB300", 20.1e3 / 72, 800)])
def test_grace_blackwell_specs_are_rack_datasheet_totals_over_72(name, hbm_gb, nic_gbps):
    g = get_gpu(name)
    # NVL72 datasheets: BF16 360 PF and FP8 720 PF with sparsity, over 72 GPUs; dense is half.
    assert g.peak("bf16") == pytest.approx(360e15 / 2 / 72)
    assert g.peak("fp8") == pytest.approx(720e15 / 2 / 72)
    assert g.hbm_bytes == pytest.approx(hbm_gb * 1e9, rel=0.01)
    assert g.nvlink_bandwidth == pytest.approx(130e12 / 72 / 2, rel=0.02)  # 130 TB/s, both directions
    assert g.nic_bandwidth == nic_gbps * 1e9 / 8


@pytest.mark.parametrize("preset", ["gb200-nvl72", "gb300-nvl72", "gb200-nvl36x2"])
def test_nvl72_presets_put_72_gpus_in_one_nvlink_domain(preset):
    c = build_cluster({"preset": preset, "nodes": 2})
    assert c.num_gpus == 144 and c.gpus_per_server == 72
    assert {c.server_of(r) for r in range(72)} == {0} and {c.server_of(r) for r in range(72, 144)} == {1}
    switches = [n for n, k in c.graph.nodes(data="kind") if k == "nvswitch"]
    assert len(switches) == (4 if preset.endswith("x2") else 2)


def test_nvlink_racks_must_divide_the_domain():
    with pytest.raises(TopologyError, match="cluster.nvlink_racks: 5 does not divide gpus_per_node"):
        build_cluster({"preset": "gb200-nvl36x2", "nvlink_racks": 5})
    with pytest.raises(TopologyError, match="nvlink_racks"):
        leaf_spine("GB200", servers=2, gpus_per_server=72, nvlink_racks=0)


def _path_latency(c, *nodes):
    return sum(c.graph.edges[nodes[i], nodes[i + 1]]["latency"] for i in range(len(nodes) - 1))


@pytest.mark.parametrize("size", [2**20, 2**33])
def test_all_reduce_over_an_nvl72_domain_is_the_ring_closed_form(size):
    c = build_cluster({"preset": "gb200-nvl72", "nodes": 1, "fabric": "single_node"})
    n, B = 72, 900e9
    alpha = STEP + _path_latency(c, ("gpu", 0, 0), ("nvswitch", 0), ("gpu", 0, 1))
    expected = 2 * (n - 1) * alpha + 2 * (n - 1) / n * size / B
    t = collective_time(c, "all_reduce", n, size, "ring", NetworkConfig(**IDEAL))
    assert t == pytest.approx(expected, rel=1e-6)


def test_nvl36x2_costs_one_switch_hop_more_and_its_rack_links_carry_two_ring_hops():
    c = build_cluster({"preset": "gb200-nvl36x2", "nodes": 1, "fabric": "single_node"})
    a, b = ("nvswitch", 0), ("nvswitch", 0, 1)
    assert c.graph.edges[a, b]["bandwidth"] == 36 * 900e9  # non-blocking between the racks
    n, size = 72, 2**33
    # A ring step's latency is its slowest hop's: the cross-rack hop gpu -> switch -> switch -> gpu.
    alpha = STEP + _path_latency(c, ("gpu", 0, 35), a, b, ("gpu", 0, 36))
    graph = OpGraph(n)
    graph.collective("all_reduce", list(range(n)), size, algorithm="ring", traffic_class="tp")
    record = Engine(graph, c, network=NetworkConfig(**IDEAL)).run()
    assert record.step_time_s == pytest.approx(2 * (n - 1) * alpha + 2 * (n - 1) / n * size / 900e9, rel=1e-6)
    fabric = record.fabric
    moved = fabric.network.ledger.bytes
    # The ring 0..71 crosses between the racks once each way (35 -> 36 and 71 -> 0), each hop moving
    # 2(n-1)/n of the buffer.
    for edge in ((a, b), (b, a)):
        assert moved[fabric.link_index[edge]] == pytest.approx(2 * (n - 1) / n * size, rel=1e-9)


# ------------------------------------------------------------------ ECMP vs packet spraying
def _oversubscribed():
    # 4 leaves of 2 servers x 8 GPUs (16 NICs at 50 GB/s per leaf), 4 spines, 2:1.
    return leaf_spine("H100", servers=8, gpus_per_server=8, servers_per_leaf=2, spines=4, oversubscription=2)


def test_routing_is_validated():
    with pytest.raises(ValueError, match="network.routing: 'adaptive' unknown; valid: ecmp, spray"):
        NetworkConfig(routing="adaptive")


def test_spraying_an_all_to_all_meets_the_leaf_uplink_bound_and_ecmp_is_no_faster():
    # 4 leaves of one 4-GPU server each, 4 spines, 2:1.
    c = leaf_spine("H100", servers=4, gpus_per_server=4, servers_per_leaf=1, spines=4, oversubscription=2)
    S = 2**30  # each rank's send buffer; S/16 to every rank
    # Each leaf's 4 GPUs send 12/16 of S to GPUs on other leaves, through uplinks of
    # 4 x 50 GB/s / 2 = 100 GB/s, which an all-to-all's transfers between servers use at 0.85 (the NIC
    # tier's 0.95 times all_to_all_factor: simulator.nccl.ALL_TO_ALL_NET_EFFICIENCY).
    bound = 4 * (12 / 16) * S / (4 * 50e9 / 2 * 0.85)
    spray = collective_time(c, "all_to_all", 16, S, network=NetworkConfig(routing="spray"))
    ecmp = collective_time(c, "all_to_all", 16, S, network=NetworkConfig(routing="ecmp"))
    assert bound <= spray <= 1.01 * bound
    assert ecmp >= spray


def test_spraying_splits_each_flow_evenly_over_the_spines():
    c = _oversubscribed()
    # One 1 GB transfer from leaf 0 to leaf 1: a quarter of it on each of the 4 uplinks.
    graph = OpGraph(64)
    graph.send(0, 16, 1e9, traffic_class="pp")
    graph.recv(16, 0, 1e9, traffic_class="pp")
    record = Engine(graph, c, network=NetworkConfig(routing="spray", **IDEAL)).run()
    fab = record.fabric
    moved = fab.network.ledger.bytes
    ups = [fab.link_index[(("leaf", 0), ("spine", j))] for j in range(4)]
    assert moved[ups] == pytest.approx([0.25e9] * 4)
    nic = fab.link_index[(("nic", 0, 0), ("leaf", 0))]
    assert moved[nic] == pytest.approx(1e9)
    # Rate: the NIC (50 GB/s) binds, not the 100 GB/s uplinks each carrying a quarter.
    hops = _path_latency(c, ("gpu", 0, 0), ("nic", 0, 0), ("leaf", 0), ("spine", 0), ("leaf", 1), ("nic", 2, 0),
                         ("gpu", 2, 0))
    assert record.step_time_s == pytest.approx(STEP + hops + 1e9 / 50e9, rel=1e-9)
    assert record.fabric.network.ledger.payload_bytes_by_class["pp"] == pytest.approx(1e9)


def test_ecmp_collisions_cost_ring_all_reduce_what_spraying_recovers():
    c = _oversubscribed()
    cfg = dict(bandwidth_efficiency=1.0)
    ecmp = collective_time(c, "all_reduce", 64, 2**30, "ring", NetworkConfig(routing="ecmp", **cfg))
    spray = collective_time(c, "all_reduce", 64, 2**30, "ring", NetworkConfig(routing="spray", **cfg))
    analytic = collective_time(c, "all_reduce", 64, 2**30, "ring", NetworkConfig(model="analytic", **cfg))
    # Spraying leaves no uplink busier than its fair share: the contention-free time; hashing does worse.
    assert spray == pytest.approx(analytic, rel=1e-3)
    assert ecmp > 1.2 * spray


def test_spray_routing_keeps_bytes_and_payload_conserved_in_a_training_step():
    from simulator.experiment import experiment_from_dict, run_experiment
    doc = {"cluster": {"preset": "dgx-h100", "nodes": 4, "nodes_per_leaf": 2, "spines": 2, "oversubscription": 2},
           "model": {"preset": "gpt2-small", "layers": 4},
           "parallel": {"tp": 2, "pp": 2, "micro_batch": 2, "global_batch": 32},
           "training": {"seq_len": 512}}
    results = {}
    for routing in ("ecmp", "spray"):
        results[routing] = run_experiment(experiment_from_dict({**doc, "network": {"routing": routing}}))
    a, b = results["ecmp"], results["spray"]
    assert a.bytes_by_class == pytest.approx(b.bytes_by_class)  # what GPUs send does not depend on routing
    tiers_a, tiers_b = a.bytes_by_tier, b.bytes_by_tier
    for tier in ("nvlink", "pcie", "leaf", "spine"):  # nor what each tier carries in total (shortest paths)
        assert tiers_a.get(tier, 0.0) == pytest.approx(tiers_b.get(tier, 0.0), rel=1e-9)
    assert b.step_time <= a.step_time * (1 + 1e-9)
    spine = a.links[a.links["tier"] == "spine"]["bytes"].to_numpy()
    spine_spray = b.links[b.links["tier"] == "spine"]["bytes"].to_numpy()
    assert np.std(spine_spray) <= np.std(spine) + 1e-6  # spraying evens out the uplinks


# ------------------------------------------------------------------ rail-optimized vs leaf-spine
def _tier_bytes(cluster, algorithm, n, size=2**28):
    graph = OpGraph(n)
    graph.collective("all_reduce", list(range(n)), size, algorithm=algorithm, traffic_class="dp")
    record = Engine(graph, cluster, network=NetworkConfig(**IDEAL)).run()
    fabric = record.fabric
    moved = fabric.network.ledger.bytes
    return {t: float(moved[fabric.tier == t].sum()) for t in ("nvlink", "pcie", "leaf", "spine")}


def test_hierarchical_all_reduce_puts_no_byte_on_the_spine_of_a_rail_fabric():
    from topologies import rail_optimized
    # 4 servers x 4 GPUs in one pod: GPU i of every server hangs off rail leaf i. The hierarchical
    # all-reduce's inter-node phase only joins GPU i to GPU i elsewhere: same rail, same leaf.
    rail = rail_optimized("H100", servers=4, gpus_per_server=4, servers_per_leaf=4, spines=2)
    # The same servers on a leaf-spine of two leaves: GPU i's peers on the other leaf are across the spine.
    spine = leaf_spine("H100", servers=4, gpus_per_server=4, servers_per_leaf=2, spines=2)
    on_rail = _tier_bytes(rail, "hierarchical", 16)
    on_spine = _tier_bytes(spine, "hierarchical", 16)
    assert on_rail["spine"] == 0.0 and on_rail["leaf"] > 0
    assert on_spine["spine"] > 0
    # Both move the same bytes through NICs and over NVLink (the same phases between the same GPUs).
    assert on_rail["pcie"] == pytest.approx(on_spine["pcie"]) and on_rail["pcie"] > 0
    assert on_rail["nvlink"] == pytest.approx(on_spine["nvlink"])
