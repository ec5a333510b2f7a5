"""Faults audit 2: what the faults list refused, did silently or crashed on, against independent truths.

Truths: a latency fault needs links of its tier; one entry per cable, switch,
NIC, tier and straggler (and none on a cable another entry takes down); a
server whose every NIC is gone is cut off; every GPU must reach every other
without transiting a GPU (checked here by brute force on a hand-built graph);
the order of the list does not matter; the title and the fabric line count
faults alike; a cable keeps at least a millionth of its rate.
"""

from __future__ import annotations

import copy
import itertools
import random

import networkx as nx
import pytest
import yaml

from simulator import NetworkConfig, simulate
from simulator.cli import main
from simulator.experiment import describe_setup, experiment_from_dict
from topologies import TopologyError, leaf_spine
from topologies.faults import apply_faults
from workloads.ops import OpGraph

IDEAL = NetworkConfig(step_latency_s=2e-6, bandwidth_efficiency=1.0)


def _doc(nodes=2, gpus_per_node=2, faults=(), **cluster):
    return {"cluster": {"preset": "dgx-h100", "nodes": nodes, "gpus_per_node": gpus_per_node, **cluster},
            "model": {"preset": "tiny"}, "training": {"seq_len": 128},
            "parallel": {"dp": nodes * gpus_per_node, "global_batch": nodes * gpus_per_node},
            "faults": [copy.deepcopy(f) for f in faults]}  # (no YAML aliases)


def _cli_error(tmp_path, capsys, doc) -> str:
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["run", str(path), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "Traceback" not in err[0] and "internal error" not in err[0], err
    return err[0]


def _edges(cluster):
    return sorted((repr(u), repr(v), d["bandwidth"], d["latency"], d["tier"])
                  for u, v, d in cluster.graph.edges(data=True))


def _ring_time(cluster, nbytes=2**26):
    g = OpGraph(cluster.num_gpus)
    g.collective("all_reduce", list(range(cluster.num_gpus)), nbytes, algorithm="ring")
    return simulate(g, cluster, network=IDEAL).step_time


def _cut_pair(graph, gpus):
    """Brute force: the first (a, b) with no path from a to b through switches and NICs only, else None."""
    for a, b in itertools.permutations(gpus, 2):
        others = set(gpus) - {a, b}
        if not nx.has_path(graph.subgraph([n for n in graph if n not in others]), a, b):
            return a, b
    return None


# ---------------------------------------------------------------- (a) latency on a tier the fabric lacks
@pytest.mark.parametrize("cluster, tier, tiers", [
    ({"nodes": 2}, "spine", "nvlink, pcie, leaf"),                                   # one leaf, no spines
    ({"nodes": 4, "nodes_per_leaf": 2, "spines": 2}, "core", "nvlink, pcie, leaf, spine"),
])
def test_latency_on_a_tier_the_cluster_lacks_is_refused(tmp_path, capsys, cluster, tier, tiers):
    doc = _doc(gpus_per_node=2, faults=[{"kind": "latency", "tier": tier, "extra": "1ms"}], **cluster)
    err = _cli_error(tmp_path, capsys, doc)
    assert f"faults[0].tier: this cluster has no {tier} links; its tiers: {tiers}" in err


def test_latency_on_a_tier_the_cluster_has_still_applies():
    c = leaf_spine("H100-SXM", servers=2, gpus_per_server=1, servers_per_leaf=1, spines=1)
    sick = apply_faults(c, [{"kind": "latency", "tier": "leaf", "extra": "3us"}])
    leaf = [(u, v) for u, v, t in c.graph.edges(data="tier") if t == "leaf"]
    assert leaf and all(sick.graph.edges[e]["latency"] == pytest.approx(c.graph.edges[e]["latency"] + 3e-6)
                        for e in leaf)


# ---------------------------------------------------------------- (b), (c) repeated and conflicting entries
SPINE_CABLE = {"kind": "link_down", "link": ["leaf:0", "spine:0"]}


@pytest.mark.parametrize("faults, message", [
    ([{"kind": "straggler", "gpu": 3, "factor": 2}, {"kind": "switch_down", "switch": "spine:1"},
      {"kind": "straggler", "gpu": 3, "factor": 3}],
     "faults[2]: gpu 3 already has a straggler factor (faults[0]); give one entry per GPU"),
    ([{"kind": "switch_down", "switch": "nvswitch:0"}, {"kind": "switch_down", "switch": "nvswitch:0"}],
     "faults[1].switch: nvswitch:0 is already down (faults[0])"),
    ([{"kind": "switch_down", "switch": "spine:0"}, {"kind": "switch_down", "switch": "spine:0"}],
     "faults[1].switch: spine:0 is already down (faults[0])"),
    ([SPINE_CABLE, {"kind": "degraded_link", "link": ["spine:0", "leaf:0"], "fraction": 0.5}],
     "faults[1].link: the cable [spine:0, leaf:0] is already down (faults[0])"),
    ([SPINE_CABLE, SPINE_CABLE], "faults[1].link: the cable [leaf:0, spine:0] is already down (faults[0])"),
    ([{"kind": "degraded_link", "link": ["leaf:0", "spine:0"], "fraction": 0.5},
      {"kind": "degraded_link", "link": ["leaf:0", "spine:0"], "fraction": 0.5}],
     "faults[1].link: the cable [leaf:0, spine:0] is already degraded (faults[0])"),
    ([{"kind": "switch_down", "switch": "spine:0"}, SPINE_CABLE],
     "faults[1].link: the cable [leaf:0, spine:0] is already down with spine:0 (faults[0])"),
    ([SPINE_CABLE, {"kind": "switch_down", "switch": "spine:0"}],
     "faults[1].switch: taking spine:0 down takes the cable [leaf:0, spine:0] that faults[0] already names"),
    ([{"kind": "nic_down", "gpu": 0}, {"kind": "nic_down", "gpu": 0}],
     "faults[1].gpu: rank 0's NIC is already down (faults[0]); give one entry per GPU"),
    ([{"kind": "nic_down", "gpu": 0}, {"kind": "link_down", "link": ["nic:0:0", "leaf:0"]}],
     "faults[1].link: the cable [nic:0:0, leaf:0] is already down with nic:0:0 (faults[0])"),
    ([{"kind": "latency", "tier": "spine", "extra": "1us"}, {"kind": "latency", "tier": "spine", "extra": "2us"}],
     "faults[1].tier: the spine links already have extra latency (faults[0]); give one entry per tier"),
])
def test_repeated_or_conflicting_faults_are_one_line_errors(tmp_path, capsys, faults, message):
    doc = _doc(nodes=4, gpus_per_node=2, nodes_per_leaf=2, spines=2, faults=faults)
    assert message in _cli_error(tmp_path, capsys, doc)


def test_a_duplicate_switch_down_in_a_sweep_fails_with_the_reason_not_networkx():
    import simulator
    from simulator.sweeps import parse_grid_arg
    doc = _doc(nodes=4, gpus_per_node=2, nodes_per_leaf=2, spines=2)
    del doc["faults"]
    grid = dict([parse_grid_arg("faults=[{kind: switch_down, switch: 'spine:0'},"
                                "{kind: switch_down, switch: 'spine:0'}]")])
    table = simulator.sweep(doc, grid, jobs=1, progress=False)
    reason = str(table["reason"].iloc[0])
    assert table["status"].iloc[0] != "ok" and "already down" in reason and "NetworkX" not in reason, reason


# ---------------------------------------------------------------- (d) a 1-GPU server's NIC
def test_nic_down_on_a_one_gpu_server_is_a_partition(tmp_path, capsys):
    err = _cli_error(tmp_path, capsys, _doc(nodes=2, gpus_per_node=1, faults=[{"kind": "nic_down", "gpu": 0}]))
    assert "faults[0].gpu: rank 0 (gpu:0:0) loses its NIC and is its server's only GPU" in err
    assert "partitioned" in err and "gpu:1:0" in err
    c = leaf_spine("H100-SXM", servers=3, gpus_per_server=1, servers_per_leaf=3, spines=1)
    with pytest.raises(TopologyError, match=r"faults\[0\]\.gpu: rank 2 .*only GPU.*partitioned"):
        apply_faults(c, [{"kind": "nic_down", "gpu": 2}])


def test_nic_down_on_a_one_server_cluster_needs_no_nic():
    c = leaf_spine("H100-SXM", servers=1, gpus_per_server=2, servers_per_leaf=1, spines=1)
    sick = apply_faults(c, [{"kind": "nic_down", "gpu": 0}, {"kind": "nic_down", "gpu": 1}])
    assert _cut_pair(sick.graph, list(sick.gpus)) is None and _ring_time(sick) == _ring_time(c)


# ---------------------------------------------------------------- (e) every pair, not pairs with rank 0
@pytest.mark.parametrize("cable, cut", [(["gpu:0:1", "nic:0:1"], "gpu:0:1 (rank 1)"),
                                        (["nic:0:1", "leaf:0"], "gpu:0:1 (rank 1)")])
def test_a_gpu_other_than_rank_0_cut_off_is_refused_before_simulating(cable, cut):
    doc = _doc(nodes=2, gpus_per_node=2, faults=[{"kind": "link_down", "link": cable}])
    with pytest.raises(TopologyError) as err:
        experiment_from_dict(doc)       # refused while loading: nothing is simulated
    assert str(err.value).startswith("faults[0]: the fabric is partitioned: ")
    assert f"{cut} can no longer reach gpu:1:0 (rank 2)" in str(err.value)


def test_partition_check_agrees_with_brute_force_on_random_cuts():
    c = leaf_spine("H100-SXM", servers=4, gpus_per_server=2, servers_per_leaf=2, spines=2)
    cables = sorted({tuple(sorted((u, v), key=repr)) for u, v in c.graph.edges()}, key=repr)
    rng = random.Random(7)
    refused = accepted = 0
    for _ in range(60):
        cut = rng.sample(cables, rng.randint(1, 4))
        truth = c.graph.copy()
        truth.remove_edges_from([e for a, b in cut for e in ((a, b), (b, a))])
        faults = [{"kind": "link_down", "link": [":".join(map(str, a)), ":".join(map(str, b))]} for a, b in cut]
        pair = _cut_pair(truth, list(c.gpus))
        if pair is None:
            accepted += 1
            assert _edges(apply_faults(c, faults)) == sorted(
                (repr(u), repr(v), d["bandwidth"], d["latency"], d["tier"]) for u, v, d in truth.edges(data=True))
        else:
            refused += 1
            with pytest.raises(TopologyError, match="partitioned"):
                apply_faults(c, faults)
    assert refused and accepted          # both outcomes exercised


# ---------------------------------------------------------------- (f) order does not matter
def test_nic_down_gives_the_same_fabric_in_every_order():
    c = leaf_spine("H100-SXM", servers=2, gpus_per_server=4, servers_per_leaf=2, spines=1)
    for ranks in ([0, 1], [0, 1, 2], [1, 2, 5]):
        fabrics = {tuple(_edges(apply_faults(c, [{"kind": "nic_down", "gpu": r} for r in order])))
                   for order in itertools.permutations(ranks)}
        assert len(fabrics) == 1, ranks
    a = apply_faults(c, [{"kind": "nic_down", "gpu": 0}, {"kind": "nic_down", "gpu": 1}])
    b = apply_faults(c, [{"kind": "nic_down", "gpu": 1}, {"kind": "nic_down", "gpu": 0}])
    assert _ring_time(a) == _ring_time(b)
    # each failed GPU borrows a NIC whose own GPU's NIC is up (here GPU 2's, the first healthy one)
    for r in (0, 1):
        nics = [w for w in a.graph.successors(("gpu", 0, r)) if w[0] == "nic"]
        assert nics == [("nic", 0, 2)]
    # every NIC of a server down: refused in every order
    for order in itertools.permutations(range(4)):
        with pytest.raises(TopologyError, match="partitioned"):
            apply_faults(c, [{"kind": "nic_down", "gpu": r} for r in order])


def test_a_single_nic_down_still_borrows_the_next_gpus_nic():
    c = leaf_spine("H100-SXM", servers=2, gpus_per_server=4, servers_per_leaf=2, spines=1)
    sick = apply_faults(c, [{"kind": "nic_down", "gpu": 1}])
    assert [w for w in sick.graph.successors(("gpu", 0, 1)) if w[0] == "nic"] == [("nic", 0, 2)]


def test_mixed_faults_give_the_same_fabric_in_every_order():
    c = leaf_spine("H100-SXM", servers=4, gpus_per_server=2, servers_per_leaf=2, spines=2)
    faults = [{"kind": "nic_down", "gpu": 1}, {"kind": "degraded_link", "link": ["leaf:0", "spine:1"], "fraction": 0.3},
              {"kind": "switch_down", "switch": "spine:0"}, {"kind": "latency", "tier": "nvlink", "extra": "1us"}]
    fabrics = {tuple(_edges(apply_faults(c, list(order)))) for order in itertools.permutations(faults)}
    assert len(fabrics) == 1


# ---------------------------------------------------------------- (g) the title and the fabric line agree
@pytest.mark.parametrize("faults, words", [
    ([{"kind": "straggler", "gpu": 1, "factor": 2}], "1 straggler(s)"),
    ([{"kind": "straggler", "gpu": 1, "factor": 2}, {"kind": "switch_down", "switch": "nvswitch:0"}],
     "1 fault(s), 1 straggler(s)"),
    ([{"kind": "switch_down", "switch": "nvswitch:0"}], "1 fault(s)"),
])
def test_title_and_fabric_line_count_faults_alike(faults, words):
    exp = experiment_from_dict(_doc(faults=faults))
    assert exp.name.endswith(f", {words}") and "0 fault(s)" not in exp.name
    assert describe_setup(exp)["fabric"].endswith(f", {words}")


# ---------------------------------------------------------------- (h) a sane floor for fractions
@pytest.mark.parametrize("fraction", [1e-300, 5e-7, 0])
def test_a_vanishing_fraction_is_refused(tmp_path, capsys, fraction):
    doc = _doc(nodes=4, gpus_per_node=2, nodes_per_leaf=2, spines=2,
               faults=[{"kind": "degraded_link", "link": ["leaf:0", "spine:0"], "fraction": fraction}])
    assert "faults[0].fraction: must be a number in [1e-06, 1]" in _cli_error(tmp_path, capsys, doc)


@pytest.mark.parametrize("fraction", [1e-3, 0.25, 1])  # (1e-6 of this 50 GB/s cable is under the 1 MB/s floor)
def test_fractions_in_range_still_scale_the_cable(fraction):
    c = leaf_spine("H100-SXM", servers=2, gpus_per_server=1, servers_per_leaf=1, spines=1)
    sick = apply_faults(c, [{"kind": "degraded_link", "link": ["leaf:0", "spine:0"], "fraction": fraction}])
    for e in ((("leaf", 0), ("spine", 0)), (("spine", 0), ("leaf", 0))):
        assert sick.graph.edges[e]["bandwidth"] == c.graph.edges[e]["bandwidth"] * fraction
