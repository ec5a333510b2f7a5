"""A helper's hunt over fabrics and capacity plans (2026-12-04), each case against a hand count: a single
partial rail-optimized pod is sized for the servers it holds; the plan reports the ratio a full leaf sees; a fat
tree's core ratio is in its title and summary; spine switches beyond 2,048 ports are three-tier Clos; a lost
NIC never adds bisection; a GraphML edge to an undeclared node is refused."""

from __future__ import annotations

import math

import pytest

from simulator.experiment import describe_setup, experiment_from_dict
from topologies import build_cluster, fat_tree, leaf_spine, rail_optimized
from topologies import capacity as cap
from topologies.bisection import bisection_bandwidth, oversubscription_by_tier
from topologies.cluster import TopologyError
from topologies.custom import load_topology
from topologies.export import cluster_to_graphml
from topologies.faults import apply_faults

NIC = 50e9  # bytes/s: a DGX H100 NIC's 400 Gb/s


def test_a_single_partial_rail_pod_is_sized_for_its_servers():
    # 4 servers of a 16-server pod: 8 rail leaves of 4 NIC ports each. At 1:1 each needs 4 NIC ports of uplink,
    # i.e. 4 spines of one port each, as nodes_per_leaf: 4 builds it; before, 16 spines (0.25:1, 1.85x the cost).
    four = rail_optimized("H100", servers=4)
    same = rail_optimized("H100", servers=4, servers_per_leaf=4)
    assert four.params["spines"] == 4 and four.params["uplink_bandwidth"] == NIC
    assert oversubscription_by_tier(four, worst=True) == {"leaf": 1.0}
    plan, hand = cap.plan_summary(four), cap.plan_summary(same)
    assert plan["switches"] == hand["switches"] == 8 + 4 and plan["cables"] == hand["cables"] == 32 + 8 * 4
    assert plan["fabric_cost_usd"] == hand["fabric_cost_usd"]
    # oversubscription now acts on it (before: 4:1 measured 1:1 and cost the same as 1:1): one spine, one port
    # up per rail leaf for its 4 NIC ports
    thin = rail_optimized("H100", servers=4, oversubscription=4)
    assert oversubscription_by_tier(thin, worst=True) == {"leaf": 4.0}
    assert thin.params["spines"] == 1 and thin.params["uplink_bandwidth"] == NIC
    assert cap.plan_summary(thin)["cables"] == 32 + 8 and cap.plan_summary(thin)["fabric_cost_usd"] < plan[
        "fabric_cost_usd"]
    # a full pod at 4:1: 4 spines, one port each from every rail leaf (16 NIC ports down, 4 up)
    assert rail_optimized("H100", servers=32, oversubscription=4).params["spines"] == 4
    # a ratio that does not divide the pod: floor(16 / 3) = 5 spines, each link 16 x 50 / 15 = 53.3 GB/s, at
    # least one port (the review: ceil gave 6 links of 44.4 GB/s, thinner than a port, and the narrow-link note
    # then fired on a default file)
    odd = rail_optimized("H100", servers=32, oversubscription=3)
    assert odd.params["spines"] == 5 and odd.params["uplink_bandwidth"] == pytest.approx(16 * NIC / 15)
    assert rail_optimized("H100", servers=4, oversubscription=3).params["spines"] == 1
    # full pods are as they were: spines = servers per pod, one NIC port per link at 1:1
    full = rail_optimized("H100", servers=32)
    assert full.params["spines"] == 16 and full.params["uplink_bandwidth"] == NIC


@pytest.mark.parametrize("build, ratios", [
    (lambda: leaf_spine("H100", servers=17, oversubscription=2), {"leaf": 2.0}),  # 16 + 1 servers
    (lambda: rail_optimized("H100", servers=20), {"leaf": 1.0}),  # a full pod and a 4-server one
    (lambda: fat_tree("H100", servers=20, servers_per_leaf=2, leaves_per_pod=4), {"leaf": 1.0, "spine": 1.0}),
])
def test_the_plan_reports_the_ratio_a_full_switch_sees(build, ratios):
    # The partial last leaf (pod) keeps a full one's uplinks; their sum read as a lower ratio than the one built
    # (17 servers at 2:1 read 1.0625:1).
    assert cap.plan_summary(build())["oversubscription"] == ratios


def test_a_fat_trees_core_ratio_is_in_its_title_and_summary():
    section = {"preset": "dgx-h100", "nodes": 4, "fabric": "fat_tree", "nodes_per_leaf": 1, "leaves_per_pod": 2,
               "spines": 2, "core_oversubscription": 4}
    cluster = build_cluster(section)
    assert cluster.name.endswith("fat_tree 1:1, core 4:1")
    assert cap.plan_summary(cluster)["oversubscription"] == {"leaf": 1.0, "spine": 4.0}
    exp = experiment_from_dict({"cluster": section, "model": {"preset": "tiny"},
                                "parallel": {"tp": 4, "pp": 1, "dp": 8}, "training": {"seq_len": 128}})
    text = describe_setup(exp)["fabric"]
    assert "non-blocking" not in text and "core 4:1 oversubscribed" in text and "2 spines per pod" in text
    one_to_one = build_cluster({**section, "core_oversubscription": 1})
    assert one_to_one.name.endswith("fat_tree 1:1")


@pytest.mark.parametrize("ports, boxes, cables, levels", [
    (64, 1, 0, 1),
    (2048, 64 + 32, 2048, 2),  # k^2/2 ports: 64 lower boxes, 32 upper, 64 x 32 cables
    (4096, 128 + 32 * (4 + 2), 128 * 32 + 32 * (4 * 32), 3),  # 128 lower, 32 spines of 128 ports (4 + 2 boxes)
    (65536, 5 * 64 ** 2 // 4, 2 * 64 ** 3 // 4, 3),  # k^3/4 ports: the 3-level fat tree's 5k^2/4 boxes, 2 x k^3/4
])
def test_switches_beyond_two_tiers_are_priced_as_three_tier_clos(ports, boxes, cables, levels):
    # Before: 4,096 ports read as 192 boxes of a two-tier Clos that cannot exist (upper boxes with 128 links).
    model, b, c, n = cap._model(ports, "infiniband", 400)
    assert (model.ports, b, c, n) == (64, boxes, cables, levels)


def test_the_plan_names_a_three_tier_clos():
    # 2,048 servers on leaves of 2: 1,024 leaves, each 16 NIC ports down and 16 up to one spine of 16,384 ports
    bom = cap.bill_of_materials(leaf_spine("H100", servers=2048, servers_per_leaf=2, spines=1))
    spine = bom[bom["item"] == "spine switch"]
    # by hand: 16,384 / 32 = 512 lower boxes, each up to 32 spines of 512 ports; a 512-port spine is itself
    # 16 lower boxes + 8 upper (a two-tier Clos): 512 + 32 x 24 = 1,280 boxes
    assert list(spine["spec"]) == ["64x400G, in three-tier Clos"] and list(spine["count"]) == [1280]


@pytest.mark.parametrize("down", [[0], [0, 8], [0, 2, 4, 6, 8, 10, 12, 14], list(range(7))])
def test_a_lost_nic_never_adds_bisection(down):
    # With PCIe slower than the NIC, the borrowed path ran at NVLink rate past the peer's PCIe link: 8 NICs
    # down read 200 GB/s against 128 healthy.
    base = build_cluster({"preset": "dgx-h100", "nodes": 2, "pcie_bandwidth": "16GB/s"})
    healthy = bisection_bandwidth(base)
    assert healthy == pytest.approx(8 * 16e9)
    sick = apply_faults(base, [{"kind": "nic_down", "gpu": g} for g in down])
    assert bisection_bandwidth(sick) <= healthy * (1 + 1e-12)


def test_a_graphml_edge_to_an_undeclared_node_is_refused(tmp_path):
    # networkx adds an edge's end as a node: a typo (spine:7) made a switch of its own and halved the bisection.
    path = tmp_path / "g.graphml"
    cluster_to_graphml(leaf_spine("H100", servers=2, servers_per_leaf=1, spines=2), path)
    assert math.isclose(bisection_bandwidth(load_topology(path)), 8 * NIC)
    text = path.read_text()
    typo = text.replace('source="leaf:1" target="spine:1"', 'source="leaf:1" target="spine:7"') \
               .replace('source="spine:1" target="leaf:1"', 'source="spine:7" target="leaf:1"')
    assert typo != text
    path.write_text(typo)
    with pytest.raises(TopologyError, match=r"names node 'spine:7', which no <node> declares"):
        load_topology(path)


def test_a_clos_of_boxes_too_small_to_shrink_is_refused():
    with pytest.raises(ValueError, match="at least 4 ports"):
        cap._clos(5, 2)


def test_default_rail_spines_draw_no_narrow_link_note():
    from simulator.experiment import experiment_from_dict, unused_settings
    base = {"model": {"preset": "gpt2-small", "layers": 2}, "training": {"seq_len": 256},
            "parallel": {"tp": 2, "pp": 2, "micro_batch": 1}}  # (global batch: dp, one micro-batch each)
    for nodes, ratio in ((32, 3), (4, 3), (8, 4)):
        doc = {**base, "cluster": {"preset": "dgx-h100", "nodes": nodes, "fabric": "rail_optimized",
                                   "oversubscription": ratio}}
        assert not any(n.startswith("cluster.spines") for n in unused_settings(experiment_from_dict(doc)))
    # and where spines are given too many for one partial pod, the advice counts the pod's servers
    doc = {**base, "cluster": {"preset": "dgx-h100", "nodes": 4, "fabric": "rail_optimized", "oversubscription": 3,
                               "spines": 5}}
    notes = [n for n in unused_settings(experiment_from_dict(doc)) if n.startswith("cluster.spines")]
    assert len(notes) == 1 and notes[0].endswith("spines: 1 or fewer keeps each link at least one port")
