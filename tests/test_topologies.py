"""Topology builders, GPU specs, presets and the loader: invariants, not edge lists."""

import subprocess
import sys
import textwrap
from collections import Counter

import networkx as nx
import pytest

import topologies as topo
from topologies import TopologyError

# --------------------------------------------------------------------------- helpers


def kinds(cluster):
    return Counter(kind for _, kind in cluster.graph.nodes(data="kind"))


def tier_bandwidth(cluster, src_kind, dst_kind):
    """Total bandwidth of edges from nodes of ``src_kind`` to nodes of ``dst_kind``."""
    g = cluster.graph
    return sum(d["bandwidth"] for u, v, d in g.edges(data=True)
               if g.nodes[u]["kind"] == src_kind and g.nodes[v]["kind"] == dst_kind)


def n_shortest_paths(cluster, a, b):
    return sum(1 for _ in nx.all_shortest_paths(cluster.graph, a, b))


def assert_contract(cluster):
    """Schema invariants every builder must satisfy (independently of validate_cluster)."""
    g = cluster.graph
    for u, v, d in g.edges(data=True):
        assert g.has_edge(v, u)
        assert g.edges[v, u] == d  # full duplex, symmetric
        assert d["bandwidth"] > 0 and d["latency"] >= 0
        assert d["kind"] in topo.LINK_KINDS and d["tier"] in topo.TIERS
    for _, d in g.nodes(data=True):
        assert d["kind"] in topo.NODE_KINDS and isinstance(d["server"], int)
        assert (d["server"] >= 0) == (d["kind"] in ("gpu", "nic", "nvswitch"))
    assert nx.is_weakly_connected(g)
    gps = cluster.gpus_per_server
    assert list(cluster.gpus) == [("gpu", r // gps, r % gps) for r in range(cluster.num_gpus)]
    assert all(cluster.server_of(r) == r // gps for r in range(cluster.num_gpus))
    topo.validate_cluster(cluster)


SCALE_OUT = [topo.leaf_spine, topo.rail_optimized, topo.fat_tree]

# --------------------------------------------------------------------------- GPU specs


def test_gpu_specs_are_consistent():
    for name, spec in topo.GPU_SPECS.items():
        assert spec.name == name and spec.source
        assert spec.peak("bf16") > spec.peak("tf32") > spec.peak("fp32") > 0
        assert spec.peak("fp16") == spec.peak("bf16")
        assert 0 < spec.matmul_efficiency <= 1
        assert spec.hbm_bytes > 40e9 and spec.hbm_bandwidth > 1e12
        assert spec.nvlink_bandwidth > spec.nic_bandwidth > 0
    assert "fp8" not in topo.GPU_SPECS["A100-80GB-SXM"].peak_flops
    assert topo.get_gpu("H100").peak("fp8") == pytest.approx(2 * topo.get_gpu("H100").peak("bf16"), rel=1e-3)
    assert topo.get_gpu("B200").nvlink_bandwidth == 900e9
    assert topo.get_gpu("a100").nic_bandwidth == 200e9 / 8
    assert [topo.get_gpu(n).sm_count for n in ("A100", "H100", "H200", "B200")] == [108, 132, 132, 148]


@pytest.mark.parametrize(("alias", "name"), [("H100", "H100-SXM"), ("h100-sxm5", "H100-SXM"), ("h100_sxm", "H100-SXM"),
                                             ("A100", "A100-80GB-SXM"), ("h200", "H200-SXM"), ("b200", "B200")])
def test_gpu_aliases(alias, name):
    assert topo.get_gpu(alias).name == name


def test_unknown_gpu_lists_valid_names():
    with pytest.raises(TopologyError, match=r"cluster\.gpu: unknown GPU 'V100'.*H100-SXM"):
        topo.get_gpu("V100", "cluster.gpu")


def test_a100_has_no_fp8():
    with pytest.raises(ValueError, match="bf16"):
        topo.get_gpu("A100").peak("fp8")

# --------------------------------------------------------------------------- builders


def test_single_server():
    c = topo.single_server("H100", 8)
    assert_contract(c)
    assert kinds(c) == {"gpu": 8, "nvswitch": 1}
    g = c.graph
    for gpu in c.gpus:
        assert g.out_degree(gpu) == g.in_degree(gpu) == 1
        assert g.edges[gpu, ("nvswitch", 0)]["bandwidth"] == 450e9
        assert g.edges[gpu, ("nvswitch", 0)]["kind"] == "nvlink"
    assert nx.shortest_path_length(g, c.gpus[0], c.gpus[7]) == 2


@pytest.mark.parametrize("builder", SCALE_OUT)
@pytest.mark.parametrize("servers", [1, 3, 32])
def test_scale_out_node_counts_and_degrees(builder, servers):
    c = builder("H100", servers, gpus_per_server=8, servers_per_leaf=4, spines=2)
    assert_contract(c)
    k = kinds(c)
    assert k["gpu"] == k["nic"] == 8 * servers and k["nvswitch"] == servers
    g = c.graph
    for gpu in c.gpus:
        # one NVLink to the server's NVSwitch, one PCIe link to its own NIC
        assert g.out_degree(gpu) == g.in_degree(gpu) == 2
        assert Counter(d["kind"] for _, _, d in g.out_edges(gpu, data=True)) == {"nvlink": 1, "pcie": 1}
    for nic in (n for n, kd in g.nodes(data="kind") if kd == "nic"):
        assert sorted(g.nodes[m]["kind"] for m in g.successors(nic)) == ["gpu", "leaf"]
        leaf_edge = next(d for m, d in g[nic].items() if g.nodes[m]["kind"] == "leaf")
        assert (leaf_edge["kind"], leaf_edge["tier"], leaf_edge["bandwidth"]) == ("ib", "leaf", 50e9)
        pcie = g.edges[nic, ("gpu", *nic[1:])]
        assert pcie["tier"] == "pcie" and pcie["bandwidth"] >= leaf_edge["bandwidth"]


def test_leaf_spine_counts():
    c = topo.leaf_spine("H100", servers=33, servers_per_leaf=16, spines=4)
    assert kinds(c)["leaf"] == 3 and kinds(c)["spine"] == 4
    assert "core" not in kinds(c)
    one_leaf = topo.leaf_spine("H100", servers=16, servers_per_leaf=16)
    assert kinds(one_leaf)["leaf"] == 1 and "spine" not in kinds(one_leaf)
    default = topo.leaf_spine("H100", servers=64, servers_per_leaf=16)
    assert default.params["spines"] == 16  # default spines = servers_per_leaf


@pytest.mark.parametrize("builder", SCALE_OUT)
@pytest.mark.parametrize("ratio", [1.0, 2.0, 3.0])
def test_oversubscription_is_downlink_over_uplink(builder, ratio):
    # full leaves (and full pods) so design capacity == attached capacity
    c = builder("H100", servers=16, gpus_per_server=4, servers_per_leaf=4, spines=3, oversubscription=ratio,
                **({"leaves_per_pod": 2} if builder is topo.fat_tree else {}))
    downlink = tier_bandwidth(c, "nic", "leaf")
    uplink = tier_bandwidth(c, "leaf", "spine")
    assert downlink / uplink == pytest.approx(ratio)
    assert tier_bandwidth(c, "spine", "leaf") == pytest.approx(uplink)  # full duplex
    assert c.params["oversubscription"] == ratio
    assert c.name.endswith(f"{ratio:g}:1")


@pytest.mark.parametrize("spines", [1, 2, 5])
def test_leaf_spine_ecmp_paths_equal_spines(spines):
    c = topo.leaf_spine("H100", servers=4, servers_per_leaf=2, spines=spines)
    a, b = ("gpu", 0, 3), ("gpu", 3, 5)  # leaves 0 and 1
    assert n_shortest_paths(c, a, b) == spines
    path = nx.shortest_path(c.graph, a, b)
    assert [c.graph.nodes[n]["kind"] for n in path] == ["gpu", "nic", "leaf", "spine", "leaf", "nic", "gpu"]
    # same leaf, different servers: one path through the leaf
    assert n_shortest_paths(c, ("gpu", 0, 0), ("gpu", 1, 7)) == 1
    # same server: through the NVSwitch
    assert nx.shortest_path(c.graph, ("gpu", 0, 0), ("gpu", 0, 7))[1] == ("nvswitch", 0)


def test_rail_optimized_structure():
    gps, spl = 4, 3
    c = topo.rail_optimized("H100", servers=7, gpus_per_server=gps, servers_per_leaf=spl, spines=2)
    pods = 3  # ceil(7 / 3)
    assert kinds(c)["leaf"] == pods * gps and kinds(c)["spine"] == 2
    g = c.graph
    # every leaf serves exactly one rail, within one pod
    for leaf in (n for n, kd in g.nodes(data="kind") if kd == "leaf"):
        nics = [m for m in g.successors(leaf) if g.nodes[m]["kind"] == "nic"]
        assert nics
        assert len({rail for _, _, rail in nics}) == 1
        assert len({server // spl for _, server, _ in nics}) == 1
    # same rail, same pod: gpu-nic-leaf-nic-gpu, 4 edges, one switch, one path
    a, b = ("gpu", 0, 2), ("gpu", 2, 2)
    assert nx.shortest_path_length(g, a, b) == 4
    assert n_shortest_paths(c, a, b) == 1
    # same rail, different pod, or different rail across servers: through a spine
    assert nx.shortest_path_length(g, ("gpu", 0, 2), ("gpu", 3, 2)) == 6
    assert n_shortest_paths(c, ("gpu", 0, 2), ("gpu", 3, 2)) == 2
    assert nx.shortest_path_length(g, ("gpu", 0, 1), ("gpu", 1, 2)) == 6


def test_fat_tree_tiers_and_paths():
    c = topo.fat_tree("H100", servers=8, gpus_per_server=2, servers_per_leaf=2, leaves_per_pod=2, spines=2, cores=6)
    k = kinds(c)
    assert (k["leaf"], k["spine"], k["core"]) == (4, 4, 6)
    g = c.graph
    for core in (n for n, kd in g.nodes(data="kind") if kd == "core"):
        assert g.out_degree(core) == 2  # one spine (its plane) per pod
    assert {d["tier"] for _, v, d in g.in_edges(("core", 0), data=True)} == {"core"}
    # different pods: leaf-spine-core-spine-leaf, one path per core
    assert n_shortest_paths(c, ("gpu", 0, 0), ("gpu", 7, 1)) == 6
    # same pod, different leaves: one path per pod spine
    assert n_shortest_paths(c, ("gpu", 0, 0), ("gpu", 2, 0)) == 2
    # spine downlink == spine uplink at core_oversubscription 1
    assert tier_bandwidth(c, "spine", "core") == pytest.approx(tier_bandwidth(c, "leaf", "spine"))
    one_pod = topo.fat_tree("H100", servers=4, servers_per_leaf=2, leaves_per_pod=2)
    assert "core" not in kinds(one_pod)
    with pytest.raises(TopologyError, match="cores"):
        topo.fat_tree("H100", servers=8, servers_per_leaf=2, leaves_per_pod=2, spines=2, cores=3)


def test_bandwidth_and_latency_overrides():
    c = topo.leaf_spine("H100", 2, servers_per_leaf=1, spines=1, nic_bandwidth="200Gbps",
                        nvlink_bandwidth="300GB/s", pcie_bandwidth="32GB/s", nvlink_latency="1us",
                        nic_latency="2us", switch_latency="3us")
    g = c.graph
    assert g.edges[("gpu", 0, 0), ("nvswitch", 0)]["bandwidth"] == 300e9
    assert g.edges[("gpu", 0, 0), ("nvswitch", 0)]["latency"] == pytest.approx(1e-6)
    assert g.edges[("gpu", 0, 0), ("nic", 0, 0)]["bandwidth"] == 32e9
    assert g.edges[("gpu", 0, 0), ("nic", 0, 0)]["latency"] == pytest.approx(2e-6)
    assert g.edges[("nic", 0, 0), ("leaf", 0)]["bandwidth"] == 25e9
    assert g.edges[("leaf", 0), ("spine", 0)]["latency"] == pytest.approx(3e-6)
    # default PCIe follows the NIC when the NIC is faster than the GPU's PCIe generation
    fast = topo.leaf_spine("A100", 1, nic_bandwidth="800Gbps")
    assert fast.graph.edges[("gpu", 0, 0), ("nic", 0, 0)]["bandwidth"] == 100e9


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"servers": 0}, "servers"),
        ({"servers": 2.5}, "servers"),
        ({"gpus_per_server": 0}, "gpus_per_server"),
        ({"servers_per_leaf": -1}, "servers_per_leaf"),
        ({"spines": 0}, "spines"),
        ({"oversubscription": 0.5}, "oversubscription"),
        ({"nic_bandwidth": "-400Gbps"}, "nic_bandwidth"),
        ({"nvlink_bandwidth": 0}, "nvlink_bandwidth"),
        ({"switch_latency": "-1us"}, "switch_latency"),
        ({"gpu": "TPUv5"}, "gpu"),
    ],
)
def test_builder_errors_name_the_parameter(kwargs, field):
    args = {"gpu": "H100", "servers": 4} | kwargs
    with pytest.raises(TopologyError, match=rf"^{field}: "):
        topo.leaf_spine(**args)

# --------------------------------------------------------------------------- validate_cluster


def _broken(mutate):
    c = topo.leaf_spine("H100", 2, servers_per_leaf=1, spines=1)
    mutate(c.graph)
    return c


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda g: g.nodes[("gpu", 0, 0)].pop("kind"), "node gpu:0:0: missing attribute 'kind'"),
        (lambda g: g.nodes[("leaf", 0)].pop("server"), "node leaf:0: missing attribute 'server'"),
        (lambda g: g.nodes[("leaf", 0)].update(kind="router"), "kind 'router'"),
        (lambda g: g.edges[("leaf", 0), ("spine", 0)].pop("bandwidth"), "missing attribute 'bandwidth'"),
        (lambda g: g.edges[("leaf", 0), ("spine", 0)].update(bandwidth=0.0), "bandwidth 0.0"),
        (lambda g: g.edges[("leaf", 0), ("spine", 0)].update(bandwidth=float("inf")), "bandwidth inf"),
        (lambda g: g.edges[("leaf", 0), ("spine", 0)].update(latency=-1e-6), "latency"),
        (lambda g: g.edges[("leaf", 0), ("spine", 0)].pop("tier"), "missing attribute 'tier'"),
        (lambda g: g.edges[("leaf", 0), ("spine", 0)].update(kind="wifi"), "kind 'wifi'"),
        (lambda g: g.edges[("leaf", 0), ("spine", 0)].update(tier="l7"), "tier 'l7'"),
        (lambda g: g.remove_edge(("spine", 0), ("leaf", 0)),
         "edge leaf:0 -> spine:0: has no reverse edge spine:0 -> leaf:0"),
        (lambda g: g.add_node(("leaf", 99), kind="leaf", server=-1), "not connected"),
    ],
)
def test_validate_cluster_names_node_or_edge(mutate, match):
    with pytest.raises(TopologyError, match=match):
        topo.validate_cluster(_broken(mutate))


def test_validate_cluster_gpu_list():
    c = topo.single_server("H100", 2)
    c.gpus = (("gpu", 0, 0), ("nvswitch", 0))
    with pytest.raises(TopologyError, match=r"cluster\.gpus: \('nvswitch', 0\) has kind 'nvswitch'"):
        topo.validate_cluster(c)

# --------------------------------------------------------------------------- presets and loader


@pytest.mark.parametrize("preset", topo.preset_names())
def test_presets_build(preset):
    c = topo.build_cluster({"preset": preset})
    assert_contract(c)
    # DGX presets: 4 nodes of 8 GPUs; rack-scale NVLink presets: 2 domains of 72.
    expected = (144, 72) if "nvl" in preset else (32, 8)
    assert (c.num_gpus, c.gpus_per_server) == expected
    assert c.params["preset"] == preset
    assert c.gpu.name == topo.PRESETS[preset]["gpu"]


def test_preset_names():
    assert topo.preset_names() == ["dgx-a100", "dgx-h100", "dgx-h800", "dgx-h200", "dgx-b200", "gb200-nvl72",
                                   "gb300-nvl72", "gb200-nvl36x2"]


def test_build_cluster_overrides_and_params():
    c = topo.build_cluster({"preset": "dgx-h100", "nodes": 32, "nic_bandwidth": "200Gbps", "spines": 8,
                            "oversubscription": "2:1", "switch_latency": "1us"})
    assert c.name == "32x dgx-h100 (256 H100-SXM), leaf_spine 2:1"
    p = c.params
    assert (p["nodes"], p["gpus_per_node"], p["nodes_per_leaf"], p["leaves"], p["spines"]) == (32, 8, 16, 2, 8)
    assert p["nic_bandwidth"] == 25e9 and p["nvlink_bandwidth"] == 450e9
    assert p["oversubscription"] == 2.0 and p["switch_latency"] == pytest.approx(1e-6)
    assert tier_bandwidth(c, "nic", "leaf") / tier_bandwidth(c, "leaf", "spine") == pytest.approx(2.0)


def test_build_cluster_gpu_override_follows_gpu():
    c = topo.build_cluster({"preset": "dgx-h100", "gpu": "B200", "nodes": 2})
    assert c.params["nvlink_bandwidth"] == 900e9
    assert "dgx-h100" not in c.name and "B200" in c.name


@pytest.mark.parametrize("fabric", ["leaf_spine", "rail_optimized", "fat_tree"])
def test_build_cluster_fabrics(fabric):
    c = topo.build_cluster({"gpu": "H100", "nodes": 8, "gpus_per_node": 4, "fabric": fabric, "nodes_per_leaf": 2,
                            "spines": 2, "leaves_per_pod": 2})
    assert_contract(c)
    assert c.params["fabric"] == fabric and fabric in c.name


def test_build_cluster_single_node_and_preset_shorthand():
    c = topo.build_cluster({"preset": "dgx-b200", "nodes": 1, "fabric": "single_node"})
    assert kinds(c) == {"gpu": 8, "nvswitch": 1}
    assert c.name == "1x dgx-b200 (8 B200), single_node"
    assert topo.build_cluster("dgx-a100").gpu.name == "A100-80GB-SXM"


@pytest.mark.parametrize(
    ("section", "match"),
    [
        ({"preset": "dgx-h100", "node": 4}, r"^cluster\.node: unknown field; valid fields: preset, gpu, nodes"),
        ({"preset": "dgx-z9"}, r"^cluster\.preset: unknown preset 'dgx-z9'; valid: dgx-a100, dgx-h100"),
        ({"nodes": 4}, r"^cluster\.gpu: required"),
        ({"gpu": "V100"}, r"^cluster\.gpu: unknown GPU 'V100'"),
        ({"preset": "dgx-h100", "nodes": 0}, r"^cluster\.nodes: 0 is not a positive integer"),
        ({"preset": "dgx-h100", "nodes": -4}, r"^cluster\.nodes: "),
        ({"preset": "dgx-h100", "nodes": 2.5}, r"^cluster\.nodes: 2\.5 is not a positive integer"),
        ({"preset": "dgx-h100", "nodes": "many"}, r"^cluster\.nodes: "),
        ({"preset": "dgx-h100", "nodes": "2"},
         r"^cluster\.nodes: '2' is text; write the number without quotes \(nodes: 2\)$"),
        ({"preset": "dgx-h100", "gpus_per_node": 0}, r"^cluster\.gpus_per_node: "),
        ({"preset": "dgx-h100", "nodes_per_leaf": 0}, r"^cluster\.nodes_per_leaf: "),
        ({"preset": "dgx-h100", "spines": -1}, r"^cluster\.spines: "),
        ({"preset": "dgx-h100", "oversubscription": 0.5}, r"^cluster\.oversubscription: 0\.5 is not a ratio >= 1"),
        ({"preset": "dgx-h100", "oversubscription": "1:3"}, r"^cluster\.oversubscription: "),
        ({"preset": "dgx-h100", "oversubscription": "lots"}, r"^cluster\.oversubscription: "),
        ({"preset": "dgx-h100", "nic_bandwidth": "-400Gbps"},
         r"^cluster\.nic_bandwidth: '-400Gbps' is not a positive bandwidth \(e\.g\. 400Gbps, 50GB/s\)$"),
        ({"preset": "dgx-h100", "nvlink_bandwidth": "450GB"}, r"^cluster\.nvlink_bandwidth: "),
        ({"preset": "dgx-h100", "pcie_bandwidth": 0}, r"^cluster\.pcie_bandwidth: "),
        ({"preset": "dgx-h100", "nvlink_latency": "-1us"}, r"^cluster\.nvlink_latency: "),
        ({"preset": "dgx-h100", "nic_latency": "soon"}, r"^cluster\.nic_latency: "),
        ({"preset": "dgx-h100", "switch_latency": None}, r"^cluster\.switch_latency: "),
        ({"preset": "dgx-h100", "fabric": "torus"}, r"^cluster\.fabric: 'torus' is not a fabric; valid: leaf_spine"),
        ({"preset": "dgx-h100", "fabric": "single_node"}, r"^cluster\.nodes: 4 with fabric single_node"),
        ({"preset": "dgx-h100", "fabric": "fat_tree", "spines": 4, "cores": 6}, r"^cluster\.cores: "),
        ({"preset": "dgx-h100", "fabric": "fat_tree", "leaves_per_pod": 0}, r"^cluster\.leaves_per_pod: "),
        ({"preset": "dgx-h100", "core_oversubscription": 0}, r"^cluster\.core_oversubscription: "),
        ([1, 2], r"^cluster: expected a mapping"),
    ],
)
def test_build_cluster_errors(section, match):
    with pytest.raises(TopologyError, match=match) as err:
        topo.build_cluster(section)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("fabric, nodes", [("leaf_spine", 2), ("fat_tree", 2), ("single_node", 1)])
def test_cluster_latencies_over_a_millisecond_with_their_unit(fabric, nodes):
    # A latency written with its unit is that time, however long below the 1 s ceiling (a bare number over 1 ms
    # reads as a missing unit; the section's parsed seconds must not be taken for one)
    c = topo.build_cluster({"preset": "dgx-h100", "nodes": nodes, "fabric": fabric, "nvlink_latency": "2ms",
                            **({} if fabric == "single_node" else {"nic_latency": "1.5ms", "switch_latency": "0.5s"})})
    assert c.params["nvlink_latency"] == 2e-3
    if fabric != "single_node":
        assert (c.params["nic_latency"], c.params["switch_latency"]) == (1.5e-3, 0.5)
    with pytest.raises(TopologyError, match=r"^cluster\.nic_latency: 0\.002 has no unit"):
        topo.build_cluster({"preset": "dgx-h100", "nodes": nodes, "nic_latency": 0.002})


def test_load_cluster_forms(tmp_path):
    experiment = tmp_path / "exp.yaml"
    experiment.write_text(textwrap.dedent("""\
        name: test
        cluster:
          preset: dgx-h100
          nodes: 16
          nic_bandwidth: 400Gbps
          oversubscription: 1
        model:
          preset: gpt3-175b
        """))
    c = topo.load_cluster(experiment)
    assert c.name == "16x dgx-h100 (128 H100-SXM), leaf_spine 1:1"
    top_level = tmp_path / "cluster.yml"
    top_level.write_text("gpu: A100\nnodes: 2\nfabric: rail_optimized\n")
    assert topo.load_cluster(str(top_level)).params["fabric"] == "rail_optimized"


@pytest.mark.parametrize(
    ("text", "match"),
    [
        (None, "cannot read cluster file"),
        ("cluster: [unclosed\n", "malformed YAML"),
        ("cluster:\n  nodes: 1\n   gpu: H100\n", "malformed YAML"),
        ("- just\n- a list\n", "expected a mapping"),
        ("", "expected a mapping"),
        ("cluster:\n  preset: dgx-h100\n  nodes: 0\n", r"cluster\.nodes: 0"),
        ("cluster: [1, 2]\n", "cluster: expected a mapping"),
    ],
)
def test_load_cluster_errors_name_the_file(tmp_path, text, match):
    path = tmp_path / "bad.yaml"
    if text is not None:
        path.write_text(text)
    with pytest.raises(TopologyError, match=match) as err:
        topo.load_cluster(path)
    msg = str(err.value)
    assert msg.startswith(str(path)) and "\n" not in msg

# --------------------------------------------------------------------------- packaging


def test_topologies_imports_no_engine_or_workloads():
    code = ("import sys, topologies; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('simpy', 'simulator', 'workloads')]; "
            "sys.exit(1 if bad else 0)")
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_public_api():
    for name in ("Cluster", "GPUSpec", "TopologyError", "get_gpu", "GPU_SPECS", "single_server", "leaf_spine",
                 "rail_optimized", "fat_tree", "build_cluster", "load_cluster", "preset_names", "parse_bytes",
                 "parse_bandwidth", "parse_time", "format_bytes", "format_bandwidth", "format_time"):
        assert name in topo.__all__ and hasattr(topo, name)
