"""Capacity planning: max-flow bisection against closed forms, hand-worked bills of materials, oversubscription
read off the graph, overrides and their one-line errors, the ``plan`` command and the run/sweep columns."""

from __future__ import annotations

import json
import math

import networkx as nx
import pytest

from simulator.cli import main
from topologies import capacity as cap
from topologies import fat_tree, leaf_spine, rail_optimized, single_server
from topologies.bisection import bisection_bandwidth, oversubscription_by_tier
from topologies.cluster import Cluster, TopologyError
from topologies.components import COMPONENTS, nvswitch_chips, plan_options
from topologies.gpus import get_gpu

B = 50e9  # H100 NIC rate, bytes/s (400 Gb/s)
NV = 450e9  # H100 NVLink per GPU per direction
GB = 1e9 / 8  # one Gb/s in bytes/s


# ------------------------------------------------------------------ closed forms
def two_tier(leaves: list[tuple[float, float]], nic: float, up: float) -> float:
    """Max flow A -> B through leaves under a full bipartite upper tier: each leaf holds ``a`` sending and ``b``
    receiving NIC ports (rate ``nic``) and ``up`` bytes/s to the tier above. Pairs on one leaf meet locally;
    the rest crosses the upper tier, each leaf limited by ``up``."""
    local = sum(min(a, b) for a, b in leaves) * nic
    out = sum(min(max(a - b, 0) * nic, up) for a, b in leaves)
    into = sum(min(max(b - a, 0) * nic, up) for a, b in leaves)
    return local + min(out, into)


def leaf_spine_closed_form(servers, spl, gps, r, spines=None):
    n = servers * gps
    half = n // 2
    leaves = []
    for first in range(0, servers, spl):
        ranks = range(first * gps, min(first + spl, servers) * gps)
        a = sum(1 for x in ranks if x < half)
        leaves.append((a, len(ranks) - a))
    up = spl * gps * B / r if len(leaves) > 1 else 0.0
    return two_tier(leaves, B, up)


def rail_closed_form(servers, spl, gps, r):
    half_servers = servers // 2  # servers even: the rank halves split no server
    leaves = []
    for first in range(0, servers, spl):
        in_pod = range(first, min(first + spl, servers))
        a = sum(1 for s in in_pod if s < half_servers)
        leaves += [(a, len(in_pod) - a)] * gps  # one leaf per rail, each with one NIC per server of the pod
    return two_tier(leaves, B, spl * B / r)


@pytest.mark.parametrize("gpus", [2, 4, 5, 8, 72])
def test_single_server_bisection_is_half_the_gpus_nvlink(gpus):
    assert bisection_bandwidth(single_server("H100", gpus)) == pytest.approx(gpus // 2 * NV, rel=1e-12)


@pytest.mark.parametrize("servers, spl, gps, spines, r", [
    (4, 2, 8, 2, 1), (4, 2, 8, 2, 2), (8, 2, 8, 4, 3), (8, 4, 4, 2, 1.5), (32, 4, 8, 4, 4), (16, 8, 2, 3, 2.5),
])
def test_leaf_spine_bisection_on_leaf_boundaries_is_half_n_b_over_r(servers, spl, gps, spines, r):
    c = leaf_spine("H100", servers=servers, gpus_per_server=gps, servers_per_leaf=spl, spines=spines,
                   oversubscription=r)
    assert bisection_bandwidth(c) == pytest.approx(servers * gps / 2 * B / r, rel=1e-9)


@pytest.mark.parametrize("servers, spl, gps, r", [
    (6, 4, 8, 1), (6, 4, 8, 3), (10, 4, 4, 2), (12, 8, 2, 1.5), (14, 4, 8, 4), (2, 4, 8, 2),  # partial last leaf
    (12, 4, 8, 2),  # three full leaves: the halves split the middle one
])
def test_leaf_spine_bisection_with_partial_and_split_leaves_matches_closed_form(servers, spl, gps, r):
    c = leaf_spine("H100", servers=servers, gpus_per_server=gps, servers_per_leaf=spl, oversubscription=r)
    assert bisection_bandwidth(c) == pytest.approx(leaf_spine_closed_form(servers, spl, gps, r), rel=1e-9)


@pytest.mark.parametrize("servers, spl, gps, spines, r", [
    (4, 2, 8, 2, 1), (4, 2, 8, 2, 2), (8, 2, 4, 4, 3), (16, 4, 8, 2, 1.5),
    (4, 4, 8, 4, 2),  # one pod: same-rail NICs meet on their leaf, no spine needed
])
def test_rail_optimized_bisection_matches_closed_form(servers, spl, gps, spines, r):
    c = rail_optimized("H100", servers=servers, gpus_per_server=gps, servers_per_leaf=spl, spines=spines,
                       oversubscription=r)
    expected = servers * gps / 2 * B / (r if servers > spl else 1)
    assert bisection_bandwidth(c) == pytest.approx(expected, rel=1e-9)
    assert bisection_bandwidth(c) == pytest.approx(rail_closed_form(servers, spl, gps, r), rel=1e-9)


@pytest.mark.parametrize("servers, r", [(6, 1), (10, 2), (6, 3)])
def test_rail_optimized_partial_last_pod_matches_closed_form(servers, r):
    c = rail_optimized("H100", servers=servers, gpus_per_server=4, servers_per_leaf=4, spines=2, oversubscription=r)
    assert bisection_bandwidth(c) == pytest.approx(rail_closed_form(servers, 4, 4, r), rel=1e-9)


@pytest.mark.parametrize("servers, spl, lpp, spines, cores, r, rc", [
    (8, 2, 2, 2, 2, 1, 1), (8, 2, 2, 2, 4, 2, 1.5), (16, 2, 2, 2, 2, 1, 3), (16, 4, 2, 4, 8, 1.5, 2),
    (8, 2, 4, 2, 2, 2, 4),  # one pod: no cores, only the leaf ratio counts
])
def test_fat_tree_bisection_is_half_n_b_over_both_ratios(servers, spl, lpp, spines, cores, r, rc):
    c = fat_tree("H100", servers=servers, gpus_per_server=8, servers_per_leaf=spl, leaves_per_pod=lpp,
                 spines=spines, cores=cores, oversubscription=r, core_oversubscription=rc)
    pods = math.ceil(servers / spl / lpp)
    assert bisection_bandwidth(c) == pytest.approx(servers * 8 / 2 * B / (r * (rc if pods > 1 else 1)), rel=1e-9)


def _raw_max_flow(cluster, sending):
    """networkx max-flow on the whole graph with a super source and sink: no contraction, no reduction."""
    g = nx.DiGraph()
    g.add_edges_from((u, v, {"capacity": d["bandwidth"]}) for u, v, d in cluster.graph.edges(data=True))
    for r, gpu in enumerate(cluster.gpus):
        if r in sending:
            g.add_edge("S", gpu)  # no capacity attribute: infinite
        else:
            g.add_edge(gpu, "T")
    return nx.maximum_flow_value(g, "S", "T")


def _dual_homed():
    """A custom fabric no builder makes: each NIC on two leaves, GPU pairs joined directly, uneven links."""
    g = nx.DiGraph()
    gpus = []

    def link(u, v, bw, kind, tier):
        g.add_edge(u, v, bandwidth=bw, latency=1e-6, kind=kind, tier=tier)
        g.add_edge(v, u, bandwidth=bw, latency=1e-6, kind=kind, tier=tier)

    for leaf in range(3):
        g.add_node(("leaf", leaf), kind="leaf", server=-1)
    for spine in range(2):
        g.add_node(("spine", spine), kind="spine", server=-1)
        for leaf in range(3):
            link(("leaf", leaf), ("spine", spine), (spine + 1) * 30e9 + leaf * 7e9, "ib", "spine")
    for s in range(3):
        for i in range(2):
            gpu, nic = ("gpu", s, i), ("nic", s, i)
            g.add_node(gpu, kind="gpu", server=s)
            g.add_node(nic, kind="nic", server=s)
            gpus.append(gpu)
            link(gpu, nic, 64e9, "pcie", "pcie")
            link(nic, ("leaf", (s + i) % 3), 50e9, "ib", "leaf")
            link(nic, ("leaf", (s + i + 1) % 3), 25e9, "ib", "leaf")
        link(("gpu", s, 0), ("gpu", s, 1), 100e9, "nvlink", "nvlink")
    return Cluster(graph=g, gpu=get_gpu("H100"), gpus=tuple(gpus), gpus_per_server=2, name="dual-homed")


@pytest.mark.parametrize("make", [
    lambda: leaf_spine("H100", servers=5, gpus_per_server=4, servers_per_leaf=2, spines=3, oversubscription=1.7),
    lambda: rail_optimized("H100", servers=5, gpus_per_server=2, servers_per_leaf=2, spines=2, oversubscription=2),
    lambda: fat_tree("H100", servers=9, gpus_per_server=2, servers_per_leaf=2, leaves_per_pod=2, spines=2, cores=4,
                     oversubscription=1.5, core_oversubscription=2),
    _dual_homed,
])
@pytest.mark.parametrize("sending", [None, (0, 3, 5)])
def test_reduced_max_flow_equals_max_flow_on_the_whole_graph(make, sending):
    c = make()
    if sending is None:  # the default: the GPUs of the first floor(S/2) servers (five or nine servers here: odd)
        servers = [c.graph.nodes[g]["server"] for g in c.gpus]
        first = set(list(dict.fromkeys(servers))[: len(set(servers)) // 2])
        half = {r for r, s in enumerate(servers) if s in first}
    else:
        half = set(sending)
    assert bisection_bandwidth(c, sending) == pytest.approx(_raw_max_flow(c, half), rel=1e-9)


@pytest.mark.parametrize("servers", [2, 3, 4, 5, 7])
def test_default_bisection_never_splits_a_server(servers):
    """Audit: 3 servers read 100 GB/s per GPU and 2 servers 25, because the first half of the ranks split a
    server and counted its NVLink. Non-blocking leaf-spine, 8 GPUs of 50 GB/s NICs per server: the first
    floor(S/2) servers send through their NICs, floor(S/2) * 8 * 50 GB/s."""
    c = leaf_spine("H100", servers=servers, servers_per_leaf=servers)
    assert bisection_bandwidth(c) == pytest.approx(servers // 2 * 8 * 50e9, rel=1e-12)
    # per GPU: half a NIC's rate for any server count (non-blocking), where dividing by every GPU read 16.7 GB/s
    # at 3 servers, as if oversubscribed 1.5:1 (found in review)
    assert cap.plan_summary(c)["bisection_per_gpu_bytes_s"] == pytest.approx(50e9 / 2, rel=1e-12)
    # one server: half its GPUs send to the other half through their NVLink ports (4 x 450 GB/s)
    assert bisection_bandwidth(single_server("H100", 8)) == pytest.approx(4 * 450e9, rel=1e-12)


def test_bisection_halves_must_be_ranks():
    c = leaf_spine("H100", servers=2, servers_per_leaf=2)
    with pytest.raises(TopologyError, match="halves: 16 is not a rank") as e:
        bisection_bandwidth(c, [0, 16])
    assert "\n" not in str(e.value)
    assert bisection_bandwidth(single_server("H100", 1)) == 0.0


# ------------------------------------------------------------- oversubscription
@pytest.mark.parametrize("r", [1, 1.5, 3, 8])
def test_oversubscription_per_tier_equals_the_builder_parameter(r):
    ls = leaf_spine("H100", servers=8, servers_per_leaf=4, spines=2, oversubscription=r)
    rail = rail_optimized("H100", servers=8, servers_per_leaf=4, spines=2, oversubscription=r)
    ft = fat_tree("H100", servers=8, servers_per_leaf=2, leaves_per_pod=2, spines=2, cores=4, oversubscription=r,
                  core_oversubscription=2 * r)
    assert oversubscription_by_tier(ls) == pytest.approx({"leaf": r})
    assert oversubscription_by_tier(rail) == pytest.approx({"leaf": r})
    assert oversubscription_by_tier(ft) == pytest.approx({"leaf": r, "spine": 2 * r})


def test_partial_last_leaf_lowers_the_sum_but_not_the_worst_leaf():
    c = leaf_spine("H100", servers=6, servers_per_leaf=4, spines=2, oversubscription=2)
    # leaves hold 4 and 2 servers with equal uplinks: (32 + 16) NIC ports over 2 x 16 ports' worth of uplinks
    assert oversubscription_by_tier(c) == pytest.approx({"leaf": 48 / 32})
    assert oversubscription_by_tier(c, worst=True) == pytest.approx({"leaf": 2.0})
    assert oversubscription_by_tier(single_server("H100", 8)) == {}


# ------------------------------------------------------------ bill of materials
def counts(bom):
    return {(r.item, r.tier, r.component): r.count for r in bom.itertuples()}


def total(parts, field):
    return sum(n * getattr(COMPONENTS[name], field) for name, n in parts.items())


def test_small_leaf_spine_bill_of_materials_is_hand_worked():
    # 4 servers x 8 GPUs, 2 per leaf, 2 spines, 1:1 at 400G: each leaf has 16 NIC ports and 2 x 400 GB/s = 2 x 8
    # ports up (32 of a 64-port QM9700); each spine 2 x 8 = 16 ports.
    bom = cap.bill_of_materials(leaf_spine("H100", servers=4, servers_per_leaf=2, spines=2))
    assert counts(bom) == {
        ("leaf switch", "leaf", "QM9700"): 2, ("spine switch", "spine", "QM9700"): 2,
        ("NIC", "nic", "ConnectX-7"): 32, ("NVSwitch chip", "nvlink", "NVSwitch-gen3"): 16,
        ("transceiver", "leaf", "transceiver-400G"): 64, ("fiber", "leaf", "fiber"): 32,
        ("transceiver", "spine", "transceiver-400G"): 64, ("fiber", "spine", "fiber"): 32,
        ("GPU", "gpu", "H100-SXM"): 32,
    }
    switches = bom[bom["item"].str.endswith("switch")].set_index("tier")
    assert switches["ports_used"].to_dict() == {"leaf": 64, "spine": 32}
    fabric = {"QM9700": 4, "ConnectX-7": 32, "NVSwitch-gen3": 16, "transceiver-400G": 128, "fiber": 64}
    s = cap.plan_summary(leaf_spine("H100", servers=4, servers_per_leaf=2, spines=2))
    assert s["fabric_power_kw"] == pytest.approx(total(fabric, "power_w") / 1e3)
    assert s["fabric_cost_usd"] == pytest.approx(total(fabric, "cost_usd"))
    assert s["gpu_power_kw"] == pytest.approx(32 * 0.7)
    assert (s["switches"], s["nics"], s["cables"], s["transceivers"], s["nvswitch_chips"]) == (4, 32, 64, 128, 16)
    assert s["switches_by_tier"] == {"leaf": 2, "spine": 2}
    assert s["bisection_per_gpu_bytes_s"] == pytest.approx(B / 2)


def test_oversubscribed_uplinks_round_up_to_whole_cables():
    # 3:1: each leaf-spine link carries 16 x 50 GB/s / (2 x 3) = 133 GB/s = 2.67 ports -> 3 cables per pair
    bom = cap.bill_of_materials(leaf_spine("H100", servers=4, servers_per_leaf=2, spines=2, oversubscription=3))
    assert counts(bom)[("fiber", "spine", "fiber")] == 2 * 2 * 3


def test_rail_optimized_bill_of_materials_is_hand_worked():
    # 2 pods x 8 rails = 16 leaves of 2 NIC ports + 2 x 50 GB/s (1 port) up; 2 spines of 16 ports each
    c = rail_optimized("H100", servers=4, servers_per_leaf=2, spines=2)
    bom = cap.bill_of_materials(c)
    assert counts(bom) == {
        ("leaf switch", "leaf", "QM9700"): 16, ("spine switch", "spine", "QM9700"): 2,
        ("NIC", "nic", "ConnectX-7"): 32, ("NVSwitch chip", "nvlink", "NVSwitch-gen3"): 16,
        ("transceiver", "leaf", "transceiver-400G"): 64, ("fiber", "leaf", "fiber"): 32,
        ("transceiver", "spine", "transceiver-400G"): 64, ("fiber", "spine", "fiber"): 32,
        ("GPU", "gpu", "H100-SXM"): 32,
    }


@pytest.mark.parametrize("make, tiers", [
    (lambda: leaf_spine("H100", servers=8, servers_per_leaf=2, spines=4, oversubscription=2), ("spine",)),
    (lambda: rail_optimized("H100", servers=8, servers_per_leaf=4, spines=4), ("spine",)),
    (lambda: fat_tree("H100", servers=16, servers_per_leaf=2, leaves_per_pod=2, spines=2, cores=4,
                      core_oversubscription=2), ("spine", "core")),
])
def test_switch_cables_are_aggregate_bandwidth_over_port_speed(make, tiers):
    c = make()
    bom = counts(cap.bill_of_materials(c))
    for tier in tiers:
        aggregate = sum(d["bandwidth"] for _, _, d in c.graph.edges(data=True) if d["tier"] == tier) / 2
        assert bom[("fiber", tier, "fiber")] == pytest.approx(aggregate / (400 * GB))
        assert bom[("transceiver", tier, "transceiver-400G")] == 2 * bom[("fiber", tier, "fiber")]


def test_a_logical_switch_bigger_than_any_box_is_priced_as_a_two_tier_clos():
    # 32 servers, 16 per leaf, 16 spines: each leaf has 128 NIC ports + 16 x 8 up = 256 ports. From 64-port
    # QM9700s: 256 / 32 = 8 lower boxes with 32 ports down and 32 up, 8 x 32 / 64 = 4 upper boxes, 256 inner cables.
    bom = counts(cap.bill_of_materials(leaf_spine("H100", servers=32, servers_per_leaf=16, spines=16)))
    assert bom[("leaf switch", "leaf", "QM9700")] == 2 * 12
    assert bom[("spine switch", "spine", "QM9700")] == 16  # 2 leaves x 8 ports each
    assert bom[("fiber", "leaf", "fiber")] == 256 + 2 * 256
    assert bom[("fiber", "spine", "fiber")] == 2 * 16 * 8


def test_port_speed_family_and_media_knobs():
    c = leaf_spine("H100", servers=4, servers_per_leaf=2, spines=2)
    fast = counts(cap.bill_of_materials(c, {"port_speed": "800Gbps"}))
    # a 400G NIC takes one 800G port; 400 GB/s per leaf-spine pair = 4 ports of 800G
    assert fast[("leaf switch", "leaf", "Q3400")] == 2
    assert fast[("fiber", "spine", "fiber")] == 2 * 2 * 4
    assert fast[("transceiver", "spine", "transceiver-800G")] == 2 * 2 * 2 * 4
    eth = counts(cap.bill_of_materials(c, {"family": "ethernet", "nic_media": "dac", "switch_media": "aoc"}))
    assert eth[("leaf switch", "leaf", "SN5600")] == 2
    assert eth[("dac cable", "leaf", "dac-400G")] == 32
    assert eth[("aoc cable", "spine", "aoc-400G")] == 32
    assert not any(k[0] == "transceiver" for k in eth)


@pytest.mark.parametrize("gpu, gpus, chips", [("A100", 8, 6), ("H100", 8, 4), ("B200", 8, 2), ("B200", 72, 18),
                                              ("H100", 1, 0), ("H100", 16, 8)])
def test_nvswitch_chips_per_domain(gpu, gpus, chips):
    # published: DGX A100 6, DGX H100 4, DGX B200 2, GB200 NVL72 9 trays x 2 = 18
    bom = counts(cap.bill_of_materials(single_server(gpu, gpus)))
    found = sum(n for (item, _, _), n in bom.items() if item == "NVSwitch chip")
    assert found == chips
    assert nvswitch_chips(gpus, get_gpu(gpu).arch)[1] == chips


def test_an_nvl72_domain_shows_its_switch_trays():
    bom = cap.bill_of_materials(single_server("B200", 72))
    assert "(9 trays)" in bom.loc[bom["item"] == "NVSwitch chip", "spec"].item()


@pytest.mark.parametrize("make", [
    lambda r: leaf_spine("H100", servers=16, servers_per_leaf=4, spines=4, oversubscription=r),
    lambda r: rail_optimized("H100", servers=16, servers_per_leaf=8, spines=2, oversubscription=r),
    lambda r: fat_tree("H100", servers=16, servers_per_leaf=2, leaves_per_pod=2, spines=2, cores=4,
                       oversubscription=r, core_oversubscription=r),
    lambda r: leaf_spine("A100", servers=48, servers_per_leaf=16, spines=8, oversubscription=r),  # Clos leaves
])
def test_more_oversubscription_never_costs_more(make):
    plans = [cap.plan_summary(make(r)) for r in (1, 1.25, 1.5, 2, 3, 4, 8)]
    for more, less in zip(plans[1:], plans):
        assert more["fabric_cost_usd"] <= less["fabric_cost_usd"]
        assert more["fabric_power_kw"] <= less["fabric_power_kw"]
        assert more["bisection_bytes_s"] <= less["bisection_bytes_s"] * (1 + 1e-12)
    assert plans[-1]["fabric_cost_usd"] < plans[0]["fabric_cost_usd"]  # each uplink bundle here is several ports


def test_an_uplink_narrower_than_a_port_still_takes_a_cable():
    # 4 servers per rail leaf over 4 spines: each leaf-spine link is 50 GB/s / r, under one 400G port at any r
    cost = {r: cap.plan_summary(rail_optimized("H100", servers=8, servers_per_leaf=4, spines=4, oversubscription=r))
            for r in (1, 4)}
    assert cost[4]["fabric_cost_usd"] == cost[1]["fabric_cost_usd"]
    assert cost[4]["bisection_bytes_s"] == pytest.approx(cost[1]["bisection_bytes_s"] / 4)


# ---------------------------------------------------------------------- overrides
def test_component_overrides_change_exactly_their_share():
    c = leaf_spine("H100", servers=4, servers_per_leaf=2, spines=2)
    base = cap.plan_summary(c)
    cheaper = cap.plan_summary(c, {"components": {"QM9700": {"cost_usd": 10_000}, "ConnectX-7": {"power_w": 0}}})
    assert base["fabric_cost_usd"] - cheaper["fabric_cost_usd"] == pytest.approx(4 * (30_000 - 10_000))
    assert base["fabric_power_kw"] - cheaper["fabric_power_kw"] == pytest.approx(32 * 25 / 1e3)
    bom = cap.bill_of_materials(c, {"components": {"QM9700": {"cost_usd": 10_000}}})
    row = bom[bom["component"] == "QM9700"].iloc[0]
    assert row["unit_cost_usd"] == 10_000 and "cost: override" in row["source"]


@pytest.mark.parametrize("section, field", [
    ({"components": {"QM9701": {"cost_usd": 1}}}, "plan.components.QM9701"),
    ({"components": {"QM9700": {"cost": 1}}}, "plan.components.QM9700.cost"),
    ({"components": {"QM9700": {"cost_usd": -1}}}, "plan.components.QM9700.cost_usd"),
    ({"components": {"QM9700": {"power_w": "lots"}}}, "plan.components.QM9700.power_w"),
    ({"components": {"QM9700": 5}}, "plan.components.QM9700"),
    ({"components": [1]}, "plan.components"),
    ({"port_speed": "fast"}, "plan.port_speed"),
    ({"port_speed": "1Mbps"}, "plan.port_speed"),
    ({"nic_media": "copper"}, "plan.nic_media"),
    ({"switch_media": 3}, "plan.switch_media"),
    ({"family": "omnipath"}, "plan.family"),
    ({"budget": 1}, "plan.budget"),
    ("cheap", "plan"),
])
def test_bad_plan_sections_raise_one_line_naming_the_field(section, field):
    with pytest.raises(ValueError) as e:
        plan_options(section)
    assert isinstance(e.value, TopologyError)
    assert str(e.value).startswith(field) and "\n" not in str(e.value)


def test_plans_are_cached_per_cluster(monkeypatch):
    calls = []
    real = cap._bom
    monkeypatch.setattr(cap, "_bom", lambda *a: calls.append(1) or real(*a))
    cap._CACHE.clear()
    for _ in range(3):  # a fresh but identical cluster each time, as every sweep point builds its own
        cap.plan_columns(leaf_spine("H100", servers=4, servers_per_leaf=2, spines=2))
    assert len(calls) == 1
    cap.plan_columns(leaf_spine("H100", servers=4, servers_per_leaf=2, spines=2, oversubscription=2))
    cap.plan_columns(leaf_spine("H100", servers=4, servers_per_leaf=2, spines=2), {"nic_media": "dac"})
    assert len(calls) == 3


# ------------------------------------------------------------------ run, sweep, CLI
def test_run_summary_and_sweep_rows_carry_the_capacity_columns(monkeypatch):
    from simulator.experiment import DEMO_EXPERIMENT, experiment_from_dict, run_experiment
    from simulator.sweeps import CAPACITY_COLUMNS, sweep

    exp = experiment_from_dict(DEMO_EXPERIMENT)
    summary = run_experiment(exp).summary
    expected = cap.plan_columns(exp.cluster)
    assert {k: summary[k] for k in CAPACITY_COLUMNS} == expected
    calls = []
    real = cap._bom
    monkeypatch.setattr(cap, "_bom", lambda *a: calls.append(1) or real(*a))
    cap._CACHE.clear()
    table = sweep(DEMO_EXPERIMENT, {"parallel.micro_batch": [2, 4], "cluster.oversubscription": [1, 2]}, jobs=1,
                  progress=False)
    assert (table["status"] == "ok").all()
    assert len(calls) == 2  # one per distinct cluster, not one per point
    by_ratio = table.groupby("cluster.oversubscription")["fabric_cost_usd"].agg(["min", "max"])
    assert (by_ratio["min"] == by_ratio["max"]).all()
    one = table[table["cluster.oversubscription"] == 1].iloc[0]
    assert one["fabric_cost_usd"] == pytest.approx(expected["fabric_cost_usd"])
    assert one["bisection_bytes_s"] == pytest.approx(expected["bisection_bytes_s"])


def test_plan_section_of_an_experiment_prices_the_run():
    from simulator.experiment import DEMO_EXPERIMENT, experiment_from_dict

    doc = {**DEMO_EXPERIMENT, "plan": {"components": {"QM9700": {"cost_usd": 0}}}}
    exp = experiment_from_dict(doc)
    assert cap.plan_columns(exp.cluster, exp.plan)["fabric_cost_usd"] == pytest.approx(
        cap.plan_columns(exp.cluster)["fabric_cost_usd"] - 30_000)
    with pytest.raises(ValueError, match=r"^plan\.nic_media"):
        experiment_from_dict({**DEMO_EXPERIMENT, "plan": {"nic_media": "string"}})


def test_cli_plan_prints_bill_and_totals(capsys, tmp_path):
    assert main(["plan", "dgx-h100", "--nodes", "4"]) == 0
    out = capsys.readouterr().out
    assert "QM9700" in out and "bisection" in out and "per GPU" in out
    csv = tmp_path / "bom.csv"
    assert main(["plan", "examples/demo.yaml", "--json", "--csv", str(csv)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["summary"]["gpus"] == 16 and doc["bom"][0]["item"] == "leaf switch"
    assert csv.read_text().startswith("item,tier,component")


@pytest.mark.parametrize("argv, message", [
    (["plan", "dgx-h10"], "cluster.preset"),
    (["plan", "dgx-h100", "--nodes", "0"], "--nodes"),
    (["plan", "missing.yaml"], "missing.yaml"),
    (["plan", "dgx-h100", "--csv", "/nonexistent/folder/x.csv"], "--csv"),
])
def test_cli_plan_errors_exit_2_with_one_line(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_cli_plan_reads_the_files_plan_section(capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("cluster: {preset: dgx-h100, nodes: 2}\nplan: {family: omnipath}\n")
    assert main(["plan", str(bad)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "plan.family" in err
    good = tmp_path / "good.yaml"  # a cluster file: its fields at top level, beside plan:
    good.write_text("preset: dgx-h100\nnodes: 2\nplan: {components: {QM9700: {cost_usd: 0}}}\n")
    assert main(["plan", str(good), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    switch = next(r for r in doc["bom"] if r["component"] == "QM9700")
    assert switch["cost_usd"] == 0
