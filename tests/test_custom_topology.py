"""Custom topology files: any fabric in YAML or GraphML, validated, and a lossless round trip of every builder.

"Identical" is checked against the builder's own graph: the same node labels in the same order with the
same attributes, the same directed edges in the same order (so the same link numbering) with the same
attributes, the same neighbour orders, rank order, server size, GPU and name; and a 3D-parallel step
simulated on both gives the same step time and the same bytes on every link. Collective times on
hand-written fabrics are checked against the alpha-beta closed forms (as in ``tests/test_collectives.py``).
"""

import copy
import dataclasses
import math
import os
import re

import networkx as nx
import pandas as pd
import pytest

from simulator.bench import collective_time
from simulator.cli import main
from simulator.experiment import experiment_from_dict, load_experiment, run_experiment
from simulator.fabric import NetworkConfig
from simulator.routing import shortest_paths
from topologies import Cluster, TopologyError, build_cluster, get_gpu, load_cluster
from topologies.custom import cluster_from_dict, load_topology, node_id, node_label
from topologies.export import cluster_to_dict, cluster_to_graphml, cluster_to_yaml, link_order
from topologies.faults import apply_faults

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
STEP = 2e-6
IDEAL_NET = NetworkConfig(step_latency_s=STEP, bandwidth_efficiency=1.0)
SMALL = {"name": "small", "layers": 4, "hidden": 256, "heads": 8, "kv_heads": 8, "ffn_hidden": 1024, "vocab": 512,
         "gated_mlp": False, "tied_embeddings": False}

# Every builder, at 8 GPUs, with oversubscription where it has any (cluster: sections, as a user writes them).
SECTIONS = {
    "single_server": {"gpu": "H100", "nodes": 1, "gpus_per_node": 8, "fabric": "single_node"},
    "leaf_spine_3to1": {"gpu": "H100", "nodes": 4, "gpus_per_node": 2, "fabric": "leaf_spine", "nodes_per_leaf": 2,
                        "spines": 3, "oversubscription": 3},
    "rail_optimized_1.5to1": {"gpu": "A100", "nodes": 4, "gpus_per_node": 2, "fabric": "rail_optimized",
                              "nodes_per_leaf": 2, "spines": 2, "oversubscription": 1.5},
    "fat_tree_2to1_3to1": {"gpu": "H100", "nodes": 4, "gpus_per_node": 2, "fabric": "fat_tree", "nodes_per_leaf": 1,
                           "leaves_per_pod": 2, "spines": 2, "cores": 4, "oversubscription": 2,
                           "core_oversubscription": 3},
}


def assert_identical(a: Cluster, b: Cluster) -> None:
    ga, gb = a.graph, b.graph
    assert list(ga.nodes(data=True)) == list(gb.nodes(data=True))
    assert list(ga.edges(data=True)) == list(gb.edges(data=True))          # order = link numbering
    for n in ga:
        assert list(ga.succ[n]) == list(gb.succ[n]) and list(ga.pred[n]) == list(gb.pred[n])
    for _u, _v, data in gb.edges(data=True):                                # exact floats, not approximations
        assert type(data["bandwidth"]) is float and type(data["latency"]) is float
    assert (a.gpus, a.gpus_per_server, a.gpu, a.name) == (b.gpus, b.gpus_per_server, b.gpu, b.name)


def faulty() -> Cluster:
    """A leaf-spine after faults: a NIC down (a GPU reaches a neighbour's NIC over NVLink, 0 latency), a
    degraded cable, a switch gone, extra spine latency; and ranks in reverse order."""
    c = build_cluster(SECTIONS["leaf_spine_3to1"])
    c = apply_faults(c, [{"kind": "nic_down", "gpu": 1}, {"kind": "degraded_link", "link": ["leaf:0", "spine:1"],
                                                           "fraction": 0.3},
                         {"kind": "switch_down", "switch": "spine:2"}, {"kind": "latency", "tier": "spine",
                                                                        "extra": "1.5us"}])
    c.gpus = tuple(reversed(c.gpus))
    return c


def asymmetric() -> Cluster:
    """A cluster whose two directions of one cable differ (rate and latency)."""
    c = build_cluster(SECTIONS["leaf_spine_3to1"])
    c.graph.edges[("leaf", 1), ("spine", 0)]["bandwidth"] = 12.5e9
    c.graph.edges[("leaf", 1), ("spine", 0)]["latency"] = 3e-6
    return c


CLUSTERS = {name: (lambda s=s: build_cluster(s)) for name, s in SECTIONS.items()}
CLUSTERS["after_faults_reversed_ranks"] = faulty
CLUSTERS["asymmetric_cable"] = asymmetric


# ------------------------------------------------------------------ ids
def test_ids_map_to_the_builders_labels_and_back():
    cases = {"gpu:0:3": ("gpu", 0, 3), "leaf:12": ("leaf", 12), "nic:5:2": ("nic", 5, 2), "tor-a": "tor-a",
             "7": 7, "x:y": "x:y", "leaf:-1": ("leaf", -1)}
    for text, label in cases.items():
        assert node_label(text) == label
        assert node_label(node_id(label)) == label
    assert node_label(7) == 7 and node_label("") is None and node_label(True) is None and node_label(1.5) is None


@pytest.mark.parametrize("label, why", [("gpu:0:3", "would read back"), ("12", "would read back"),
                                        (1.5, "cannot be written"), (("gpu", "a"), "cannot be written"),
                                        (("a b", 1), "cannot be written")])
def test_labels_that_cannot_round_trip_are_refused(label, why):
    with pytest.raises(TopologyError, match=why):
        node_id(label)


# ------------------------------------------------------------------ round trips
@pytest.mark.parametrize("name", list(CLUSTERS))
def test_yaml_round_trip_is_identical(name, tmp_path):
    c = CLUSTERS[name]()
    path = tmp_path / "fabric.yaml"
    cluster_to_yaml(c, path)
    back = load_topology(path)
    assert_identical(c, back)
    assert back.params["fabric"] == "custom" and back.params["topology"] == str(path)
    assert_identical(c, cluster_from_dict(cluster_to_dict(c)))                # in memory too
    assert_identical(c, load_cluster(path))                                   # and through the cluster loader


@pytest.mark.parametrize("name", list(CLUSTERS))
def test_graphml_round_trip_is_identical(name, tmp_path):
    c = CLUSTERS[name]()
    path = tmp_path / "fabric.graphml"
    cluster_to_graphml(c, path)
    assert_identical(c, load_topology(path))
    assert nx.read_graphml(path).number_of_edges() == c.graph.number_of_edges()  # plain networkx reads it


def test_yaml_is_compact_where_ids_and_ends_say_it_all():
    c = build_cluster(SECTIONS["leaf_spine_3to1"])
    doc = cluster_to_dict(c)
    assert doc["nodes"][:3] == ["gpu:0:0", "gpu:0:1", "nvswitch:0"]            # kind and server from the id
    assert doc["links"][0] == {"a": "gpu:0:0", "b": "nvswitch:0", "bandwidth": "450GB/s", "latency": "0.25us"}
    # 3:1 over 3 spines: 2 servers x 2 GPUs x 50 GB/s down per leaf, / (3 spines x 3) per uplink
    uplink = next(e for e in doc["links"] if e["a"] == "leaf:0")
    assert float(uplink["bandwidth"].removesuffix("GB/s")) == pytest.approx(200 / 9)
    assert "kind" not in uplink and "rank" not in str(doc["nodes"])


@pytest.mark.parametrize("name", list(SECTIONS))
@pytest.mark.parametrize("fidelity", ["fast", "full"])
def test_round_trip_simulates_identically(name, fidelity, tmp_path):
    path = tmp_path / "fabric.yaml"
    cluster_to_yaml(build_cluster(SECTIONS[name]), path)
    doc = {"model": dict(SMALL), "parallel": {"tp": 2, "pp": 2, "dp": 2, "global_batch": 8, "micro_batch": 1},
           "training": {"seq_len": 256}, "fidelity": fidelity}
    built = run_experiment(experiment_from_dict({**copy.deepcopy(doc), "cluster": SECTIONS[name]}))
    loaded = run_experiment(experiment_from_dict({**copy.deepcopy(doc), "cluster": {"topology": str(path)}}))
    assert loaded.step_time == built.step_time
    pd.testing.assert_frame_equal(loaded.links, built.links, check_exact=True)
    assert built.links["bytes"].sum() > 0
    if name != "single_server":
        assert built.links.loc[built.links["tier"] == "spine", "bytes"].sum() > 0  # the fabric was crossed


def test_neighbour_orders_that_differ_from_node_order_come_back(tmp_path):
    # Links added in an order unrelated to node order: the star's centre meets its leaves 2, 0, 1.
    g = nx.DiGraph()
    for n in ("gpu:0:0", "gpu:0:1", "gpu:0:2"):
        g.add_node(node_label(n), kind="gpu", server=0)
    g.add_node(("nvswitch", 0), kind="nvswitch", server=0)
    for i in (2, 0, 1):
        for u, v in ((("nvswitch", 0), ("gpu", 0, i)), (("gpu", 0, i), ("nvswitch", 0))):
            g.add_edge(u, v, bandwidth=1e11 * (i + 1), latency=1e-7, kind="nvlink", tier="nvlink")
    c = Cluster(g, get_gpu("H100"), tuple(n for n in g if n[0] == "gpu"), 3, "star")
    assert [a for a, _b in link_order(g)] == [("gpu", 0, 2), ("gpu", 0, 0), ("gpu", 0, 1)]
    cluster_to_yaml(c, tmp_path / "star.yaml")
    assert_identical(c, load_topology(tmp_path / "star.yaml"))


# ------------------------------------------------------------------ hand-written fabrics, closed forms
def mesh(n: int, bandwidth: str = "100GB/s", latency: str = "1us") -> dict:
    """n GPUs of one server, every pair joined by a direct NVLink (no switch)."""
    gpus = [f"gpu:0:{i}" for i in range(n)]
    return {"gpu": "H100", "nodes": gpus,
            "links": [{"a": gpus[i], "b": gpus[j], "bandwidth": bandwidth, "latency": latency}
                      for i in range(n) for j in range(i + 1, n)]}


@pytest.mark.parametrize("fidelity", ["fast", "full"])
@pytest.mark.parametrize("size", [1e6, 2**30])
def test_ring_all_reduce_on_a_switchless_mesh_closed_form(fidelity, size):
    c = cluster_from_dict(mesh(4))
    n, B, hop = 4, 100e9, 1e-6                  # every ring hop is one direct link
    expected = 2 * (n - 1) * (STEP + hop) + 2 * (n - 1) / n * size / B
    t = collective_time(c, "all_reduce", n, size, "ring", NetworkConfig(step_latency_s=STEP, bandwidth_efficiency=1.0,
                                                                        fidelity=fidelity))
    assert t == pytest.approx(expected, rel=1e-9)


def test_two_servers_cabled_back_to_back_closed_form():
    # One GPU per server, NIC to NIC with no switch: GPU -PCIe- NIC =cable= NIC -PCIe- GPU.
    doc = {"gpu": "H100", "nodes": ["gpu:0:0", "nic:0:0", "gpu:1:0", "nic:1:0"],
           "links": [{"a": "gpu:0:0", "b": "nic:0:0", "bandwidth": "64GB/s", "latency": "0.25us"},
                     {"a": "gpu:1:0", "b": "nic:1:0", "bandwidth": "64GB/s", "latency": "0.25us"},
                     {"a": "nic:0:0", "b": "nic:1:0", "bandwidth": "200Gbps", "latency": "2us", "kind": "ib",
                      "tier": "leaf"}]}
    c = cluster_from_dict(doc)
    assert c.gpus_per_server == 1 and c.server_of(1) == 1
    size = 2**28
    alpha = STEP + 0.25e-6 + 2e-6 + 0.25e-6
    assert collective_time(c, "all_reduce", 2, size, "ring", IDEAL_NET) == pytest.approx(
        2 * alpha + size / 25e9, rel=1e-9)   # 2(n-1) steps of S/n at the 25 GB/s cable, n = 2


def test_a_ring_of_switches_offers_both_ways_round():
    # Four switches in a ring, one GPU behind each: opposite GPUs have two equal-hop routes.
    nodes = [f"gpu:{i}:0" for i in range(4)] + [f"nic:{i}:0" for i in range(4)] + \
        [{"id": f"sw{i}", "kind": "leaf"} for i in range(4)]
    link = {"bandwidth": "50GB/s", "latency": "0.5us"}
    links = [{"a": f"gpu:{i}:0", "b": f"nic:{i}:0", **link} for i in range(4)]
    links += [{"a": f"nic:{i}:0", "b": f"sw{i}", "kind": "ib", "tier": "leaf", **link} for i in range(4)]
    links += [{"a": f"sw{i}", "b": f"sw{(i + 1) % 4}", "kind": "ib", "tier": "spine", **link} for i in range(4)]
    c = cluster_from_dict({"gpu": "H100", "nodes": nodes, "links": links})
    ends = [("gpu", 0, 0), ("nic", 0, 0)], [("nic", 2, 0), ("gpu", 2, 0)]
    assert shortest_paths(c.graph, ("gpu", 0, 0), ("gpu", 2, 0)) == [
        [*ends[0], "sw0", "sw1", "sw2", *ends[1]], [*ends[0], "sw0", "sw3", "sw2", *ends[1]]]
    # sendrecv: rank i sends to i + 1 over GPU-NIC-switch-switch-NIC-GPU; no directed link carries two
    # of the four flows, so each runs alone at 50 GB/s behind 5 hops of 0.5 us.
    size = 2**28
    assert collective_time(c, "sendrecv", 4, size, "auto", IDEAL_NET) == pytest.approx(
        STEP + 5 * 0.5e-6 + size / 50e9, rel=1e-9)


# ------------------------------------------------------------------ validation
def small() -> dict:
    """Two GPUs on an NVSwitch: the smallest valid file."""
    link = {"bandwidth": "450GB/s", "latency": "0.25us"}
    return {"gpu": "H100", "nodes": ["gpu:0:0", "gpu:0:1", "nvswitch:0"],
            "links": [{"a": "gpu:0:0", "b": "nvswitch:0", **link}, {"a": "gpu:0:1", "b": "nvswitch:0", **link}]}


def change(**edits):
    def apply(d):
        for path, value in edits.items():
            *keys, last = path.split(".")
            target = d
            for k in keys:
                target = target[int(k)] if isinstance(target, list) else target[k]
            if isinstance(target, list):
                target[int(last)] = value
            elif value is ...:
                del target[last]
            else:
                target[last] = value
        return d
    return apply


def add_node(entry):
    return lambda d: d["nodes"].append(entry) or d


def add_link(**entry):
    return lambda d: d["links"].append({"bandwidth": "1GB/s", "latency": "1us", **entry}) or d


INVALID = {
    "unknown top field": (change(switches=3), r"^switches: unknown field of a topology; valid: gpu, name"),
    "no gpu": (change(gpu=...), r"^gpu: required"),
    "unknown gpu": (change(gpu="H900"), r"^gpu: unknown GPU 'H900'; valid: "),
    "nodes not a list": (change(nodes="gpu:0:0"), r"^nodes: must be a non-empty list"),
    "links missing": (change(links=...), r"^links: must be a list"),
    "node unknown field": (add_node({"id": "x", "kind": "leaf", "colour": 1}), r"^nodes\[3\]\.colour: unknown field"),
    "node not an id": (add_node(1.5), r"^nodes\[3\]: must be an id"),
    "node no id": (add_node({"kind": "leaf"}), r"^nodes\[3\]\.id: required"),
    "unknown node kind": (add_node({"id": "x", "kind": "router"}), r"^nodes\[3\]\.kind: 'router' is not a node kind;"
                                                                   r" valid: gpu, nvswitch, nic, leaf, spine, core"),
    "kind not implied": (add_node("tor1"), r"^nodes\[3\]\.kind: required: id 'tor1' does not name a kind"),
    "gpu without server": (add_node({"id": "g9", "kind": "gpu"}), r"^nodes\[3\]\.server: required for a gpu node"),
    "negative server": (add_node({"id": "g9", "kind": "gpu", "server": -2}), r"^nodes\[3\]\.server: -2 is not"),
    "switch in a server": (add_node({"id": "s", "kind": "spine", "server": 0}), r"^nodes\[3\]\.server: 0: a spine "
                                                                                r"switch is in no server"),
    "duplicate id": (add_node("gpu:0:1"), r"^nodes\[3\]\.id: duplicate id 'gpu:0:1' \(first at nodes\[1\]\)"),
    "rank on a switch": (change(**{"nodes.2": {"id": "nvswitch:0", "rank": 0}}), r"^nodes\[2\]\.rank: only gpu"),
    "some ranks": (change(**{"nodes.0": {"id": "gpu:0:0", "rank": 1}}), r"^nodes: GPU 'gpu:0:1' has no rank"),
    "rank twice": (change(**{"nodes.0": {"id": "gpu:0:0", "rank": 0}, "nodes.1": {"id": "gpu:0:1", "rank": 0}}),
                   r"^nodes: rank 0 is given to both 'gpu:0:0' and 'gpu:0:1'"),
    "rank out of range": (change(**{"nodes.0": {"id": "gpu:0:0", "rank": 0}, "nodes.1": {"id": "gpu:0:1",
                                                                                           "rank": 2}}),
                          r"^nodes: rank 2 of 'gpu:0:1' is out of range; 2 GPUs take ranks 0..1"),
    "no gpus": (lambda d: {**d, "nodes": ["leaf:0", "spine:0"], "links": [
        {"a": "leaf:0", "b": "spine:0", "bandwidth": "1GB/s", "latency": 0}]}, r"^nodes: lists no GPU"),
    "link not a mapping": (lambda d: d["links"].append("gpu:0:0-nvswitch:0") or d, r"^links\[2\]: must be a mapping"),
    "link unknown field": (add_link(a="gpu:0:0", b="gpu:0:1", speed=1), r"^links\[2\]\.speed: unknown field; valid: a"),
    "link without b": (add_link(a="gpu:0:0"), r"^links\[2\]\.b: required"),
    "link to unknown node": (add_link(a="gpu:0:0", b="nvs9"), r"^links\[2\]\.b: 'nvs9' is not a node"),
    "self loop": (add_link(a="gpu:0:0", b="gpu:0:0"), r"^links\[2\]: links 'gpu:0:0' to itself"),
    "parallel link": (add_link(a="nvswitch:0", b="gpu:0:1"), r"^links\[2\]: a second link between 'nvswitch:0' and "
                                                             r"'gpu:0:1' \(first at links\[1\]\)"),
    "zero bandwidth": (change(**{"links.0.bandwidth": "0GB/s"}), r"^links\[0\]\.bandwidth: '0GB/s' is not a positive"),
    "negative bandwidth": (change(**{"links.1.bandwidth": -5e10}), r"^links\[1\]\.bandwidth: -50000000000\.0 is not a "
                                                                   r"positive bandwidth"),
    "infinite bandwidth": (change(**{"links.0.bandwidth": math.inf}), r"^links\[0\]\.bandwidth: inf is not"),
    "bandwidth without unit": (change(**{"links.0.bandwidth": 400}), r"^links\[0\]\.bandwidth: 400 has no unit"),
    "zero reverse bandwidth": (change(**{"links.0.bandwidth_reverse": 0}), r"^links\[0\]\.bandwidth_reverse: 0 is "
                                                                           r"not a positive bandwidth"),
    "no bandwidth": (change(**{"links.0.bandwidth": ...}), r"^links\[0\]\.bandwidth: required"),
    "negative latency": (change(**{"links.0.latency": "-1us"}), r"^links\[0\]\.latency: '-1us' is not a non-negative"),
    "no latency": (change(**{"links.1.latency": ...}), r"^links\[1\]\.latency: required"),
    "unknown link kind": (change(**{"links.0.kind": "fiber"}), r"^links\[0\]\.kind: 'fiber' is not a link kind; "
                                                               r"valid: nvlink, pcie, ib, eth"),
    "unknown tier": (change(**{"links.0.tier": "rack"}), r"^links\[0\]\.tier: 'rack' is not a link tier; valid: "
                                                         r"nvlink, pcie, leaf, spine, core"),
    "no default kind": (lambda d: add_link(a="nvswitch:0", b="leaf:0")(add_node("leaf:0")(d)),
                        r"^links\[2\]\.kind: required for a link between a nvswitch and a leaf \(no default\)"),
    "gpu with no links": (add_node("gpu:0:2"), r"^nodes\[3\]: GPU 'gpu:0:2' has no links"),
    "not connected": (lambda d: add_link(a="leaf:0", b="spine:0")(add_node("spine:0")(add_node("leaf:0")(d))),
                      r"^links: the fabric is not connected: 'leaf:0' cannot reach 'gpu:0:0' \(2 separate pieces\)"),
    "unequal servers": (lambda d: add_link(a="gpu:1:0", b="nvswitch:0")(add_node("gpu:1:0")(d)),
                        r"^nodes: servers hold different numbers of GPUs \(server 0: 2, server 1: 1\)"),
}


@pytest.mark.parametrize("name", list(INVALID))
def test_every_invalid_file_is_one_line_naming_the_entry(name):
    edit, message = INVALID[name]
    doc = edit(small())
    with pytest.raises(TopologyError, match=message) as err:
        cluster_from_dict(doc)
    assert "\n" not in str(err.value)


def test_gpus_joined_only_through_another_gpu_cannot_talk():
    # A 4-GPU ring without switches: neighbours talk, but 0 and 2 only through 1 or 3, and routes never
    # transit GPUs. A triangle is a full mesh, so it is fine.
    ring = mesh(4)
    ring["links"] = [e for e in ring["links"] if {e["a"], e["b"]} not in ({"gpu:0:0", "gpu:0:2"},
                                                                          {"gpu:0:1", "gpu:0:3"})]
    with pytest.raises(TopologyError, match=r"^links: GPU 'gpu:0:0' cannot reach GPU 'gpu:0:2' without passing "
                                            r"through another GPU"):
        cluster_from_dict(ring)
    assert cluster_from_dict(mesh(3)).num_gpus == 3


def test_ranks_follow_the_listing_or_rank_fields():
    doc = small()
    assert cluster_from_dict(doc).gpus == (("gpu", 0, 0), ("gpu", 0, 1))
    doc["nodes"][:2] = [{"id": "gpu:0:0", "rank": 1}, {"id": "gpu:0:1", "rank": 0}]
    assert cluster_from_dict(doc).gpus == (("gpu", 0, 1), ("gpu", 0, 0))


@pytest.mark.parametrize("text, message", [
    (None, r"cannot read topology file"),
    ("nodes: [a\n", r"malformed YAML at line 2, column \d+: "),
    ("preset: dgx-h100\n", r"not a topology file"),
    ("gpu: H100\nnodes: [gpu:0:0]\nlinks: []\n", r"nodes\[0\]: GPU 'gpu:0:0' has no links"),
])
def test_file_errors_name_the_file(tmp_path, text, message):
    path = tmp_path / "f.yaml"
    if text is not None:
        path.write_text(text)
    with pytest.raises(TopologyError, match=rf"^{re.escape(str(path))}: {message}"):
        load_topology(path)


def test_graphml_errors(tmp_path):
    c = build_cluster(SECTIONS["leaf_spine_3to1"])
    one_way = nx.DiGraph(gpu="H100")
    for n in ("gpu:0:0", "nvswitch:0"):
        one_way.add_node(n, kind=node_label(n)[0], server=0)
    one_way.add_edge("gpu:0:0", "nvswitch:0", bandwidth=1e9, latency=0.0)
    nx.write_graphml(one_way, tmp_path / "one_way.graphml")
    with pytest.raises(TopologyError, match=r"one_way.graphml: edge 'gpu:0:0' -> 'nvswitch:0': has no reverse edge"):
        load_topology(tmp_path / "one_way.graphml")
    cluster_to_graphml(c, tmp_path / "ok.graphml")
    h = nx.read_graphml(tmp_path / "ok.graphml")
    del h.graph["gpu"]
    nx.write_graphml(h, tmp_path / "no_gpu.graphml")
    with pytest.raises(TopologyError, match=r"no_gpu.graphml: graph.gpu: required"):
        load_topology(tmp_path / "no_gpu.graphml")
    (tmp_path / "bad.graphml").write_text("<graphml><graph>")
    with pytest.raises(TopologyError, match=r"bad.graphml: malformed GraphML"):
        load_topology(tmp_path / "bad.graphml")


def test_undirected_graphml_from_another_tool_makes_full_duplex_links(tmp_path):
    h = nx.Graph(gpu="H100")
    for i in range(2):
        h.add_node(f"gpu:0:{i}", kind="gpu", server=0, x=1.0)          # layout attributes are ignored
        h.add_edge(f"gpu:0:{i}", "nvs", bandwidth="450GB/s", latency="0.25us")
    h.nodes["nvs"].update(kind="nvswitch", server=0)
    nx.write_graphml(h, tmp_path / "u.graphml")
    c = load_topology(tmp_path / "u.graphml")
    assert c.graph.number_of_edges() == 4 and c.graph.edges["nvs", ("gpu", 0, 1)]["bandwidth"] == 450e9


@pytest.mark.parametrize("edit, message", [
    (lambda c: setattr(c, "gpu", dataclasses.replace(get_gpu("H100"), sm_count=1)),
     r"cluster.gpu: 'H100-SXM' is a custom GPUSpec"),
    (lambda c: setattr(c, "gpus", c.gpus[:4]), r"cluster.gpus: lists 4 of the graph's 8 GPUs"),
    (lambda c: setattr(c, "gpus_per_server", 4), r"cluster.gpus_per_server: 4, but the graph puts 2"),
    (lambda c: nx.relabel_nodes(c.graph, {("leaf", 0): 0.5}, copy=False), r"node 0.5: cannot be written"),
    (lambda c: c.graph.edges[("leaf", 0), ("spine", 0)].update(tier="core"), r"tier 'core' but 'spine' the other"),
])
def test_clusters_no_file_can_bring_back_are_refused_on_export(edit, message):
    c = build_cluster(SECTIONS["leaf_spine_3to1"])
    edit(c)
    with pytest.raises(TopologyError, match=message):
        cluster_to_dict(c)


# ------------------------------------------------------------------ experiment files, CLI, example
def test_experiment_file_names_a_topology_relative_to_itself(tmp_path, monkeypatch):
    (tmp_path / "fabrics").mkdir()
    cluster_to_yaml(build_cluster(SECTIONS["fat_tree_2to1_3to1"]), tmp_path / "fabrics" / "ft.yaml")
    (tmp_path / "exp.yaml").write_text("cluster: {topology: fabrics/ft.yaml}\nmodel: {preset: tiny}\n"
                                       "parallel: {tp: 2, pp: 2}\ntraining: {seq_len: 128}\n")
    monkeypatch.chdir(os.path.dirname(EXAMPLES))                          # anywhere but tmp_path
    exp = load_experiment(tmp_path / "exp.yaml")
    assert exp.parallel.dp == 2 and exp.cluster.params["fabric"] == "custom"
    assert load_cluster(tmp_path / "exp.yaml").graph.number_of_nodes() == exp.cluster.graph.number_of_nodes()
    (tmp_path / "bad.yaml").write_text("cluster: {topology: fabrics/none.yaml}\nmodel: {preset: tiny}\n")
    with pytest.raises(TopologyError, match=r"bad.yaml: cluster.topology: .*fabrics/none.yaml: cannot read"):
        load_experiment(tmp_path / "bad.yaml")


@pytest.mark.parametrize("section, message", [
    ({"topology": "f.yaml", "nodes": 2}, r"^cluster.nodes: cannot be combined with cluster.topology"),
    ({"preset": "dgx-h100", "fabric": "f.graphml"}, r"^cluster.preset: cannot be combined with cluster.fabric"),
    ({"topology": 3}, r"^cluster.topology: 3 is not the path of a topology file"),
    ({"gpu": "H100", "nodes": ["gpu:0:0"], "links": [{"a": "gpu:0:0"}]}, r"^cluster.links\[0\].b: required"),
])
def test_cluster_section_errors(section, message):
    with pytest.raises(TopologyError, match=message):
        build_cluster(section)


def test_inline_topology_in_a_cluster_section():
    c = build_cluster(SECTIONS["rail_optimized_1.5to1"])
    assert_identical(c, build_cluster(cluster_to_dict(c)))


def test_cli_topology_describes_and_exports(tmp_path, capsys):
    out_yaml, out_graphml = tmp_path / "f.yaml", tmp_path / "f.graphml"
    assert main(["topology", "dgx-a100", "-o", str(out_yaml), "-o", str(out_graphml)]) == 0
    text = capsys.readouterr().out
    assert "32 A100-80GB-SXM GPUs in 4 server(s) of 8" in text and "nvlink 32 x 300 GB/s" in text
    preset = build_cluster("dgx-a100")
    assert_identical(preset, load_topology(out_yaml))
    assert_identical(preset, load_topology(out_graphml))
    assert main(["topology", str(out_graphml)]) == 0                     # a topology is a --cluster everywhere
    assert main(["collective", "--cluster", str(out_yaml), "--gpus", "16", "--max-size", "1MiB"]) == 0
    capsys.readouterr()
    assert main(["topology", "dgx-a100", "-o", str(tmp_path / "f.txt")]) == 2
    assert "--output" in capsys.readouterr().err


def test_example_fabric_and_experiment():
    c = load_topology(os.path.join(EXAMPLES, "fabrics", "two-racks.yaml"))
    assert (c.num_gpus, c.gpus_per_server) == (8, 2)
    racks = [(u, v) for u, v, t in c.graph.edges(data="tier") if t == "spine"]
    assert racks == [("rack-a", "rack-b"), ("rack-b", "rack-a")]            # one cable, both ways
    assert c.graph.edges["rack-a", "rack-b"]["bandwidth"] == 100e9          # 800 Gb/s
    exp = load_experiment(os.path.join(EXAMPLES, "custom-fabric.yaml"))
    assert exp.parallel.world_size == 8
    # Faults name a custom fabric's nodes by their ids; cutting the one cable splits the racks.
    halved = apply_faults(c, [{"kind": "degraded_link", "link": ["rack-a", "rack-b"], "fraction": 0.5}])
    assert halved.graph.edges["rack-b", "rack-a"]["bandwidth"] == 50e9
    with pytest.raises(TopologyError, match="partitioned"):
        apply_faults(c, [{"kind": "link_down", "link": ["rack-a", "rack-b"]}])


@pytest.mark.parametrize("extra", [
    # (An NVLink between the two servers' NVSwitches was the other case: a server is one NVLink domain, so such
    # a cable is refused now, tests/test_audit22.py; NVSwitch transit inside a server: the gb200-nvl36x2 preset.)
    {"a": "nic:0:0", "b": "nic:1:0", "bandwidth": "50GB/s", "latency": "0.5us", "kind": "ib", "tier": "leaf"},
])
def test_routes_on_irregular_fabrics_are_the_shortest(extra):
    # Two 2-GPU servers on one leaf, plus a shortcut the builders never make. Every route must be a
    # shortest path of the graph (the router's fast path assumes NVSwitches and NICs are never transit).
    from simulator.routing import Router
    doc = {"gpu": "H100", "nodes": [], "links": []}
    link = {"bandwidth": "50GB/s", "latency": "0.5us"}
    for s in range(2):
        doc["nodes"] += [f"gpu:{s}:0", f"gpu:{s}:1", f"nvswitch:{s}", f"nic:{s}:0", f"nic:{s}:1"]
        for i in range(2):
            doc["links"] += [{"a": f"gpu:{s}:{i}", "b": f"nvswitch:{s}", **link},
                             {"a": f"gpu:{s}:{i}", "b": f"nic:{s}:{i}", **link},
                             {"a": f"nic:{s}:{i}", "b": "leaf:0", **link}]
    doc["nodes"].append("leaf:0")
    doc["links"].append(extra)
    c = cluster_from_dict(doc)
    index = {e: i for i, e in enumerate(c.graph.edges)}
    router = Router(c.graph, index)
    for a in c.gpus:
        for b in c.gpus:
            if a != b:
                want = [[index[p[i], p[i + 1]] for i in range(len(p) - 1)] for p in shortest_paths(c.graph, a, b)]
                assert [list(r) for r in router.paths(a, b)] == want
    shortcut = shortest_paths(c.graph, ("gpu", 0, 0), ("gpu", 1, 0))
    assert len(shortcut) == 1 and len(shortcut[0]) == 4           # via the shortcut, not the 6-node leaf route


@pytest.mark.parametrize("text", ["a: 2:1\nb: 010\nc: 5e7\nd: [gpu:0:0, {id: x, kind: leaf}]\n",
                                  "{a: 1, a: 2}", "a: [1", "a: &x 1\nb: *x\n", "[" * 400])
def test_the_fast_yaml_reader_reads_and_refuses_exactly_as_the_strict_one(text):
    from topologies.yamlio import load_large_yaml, load_yaml

    def outcome(load):
        try:
            return load(text)
        except Exception as e:  # noqa: BLE001 - comparing whatever each raises
            return type(e), str(e)
    assert outcome(load_large_yaml) == outcome(load_yaml)
