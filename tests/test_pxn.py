"""PXN (NCCL's PCI × NVLink): a transfer to another server leaves through the NIC on the destination's rail.

Truth here is NCCL's own routing rule (``src/graph/search.cc``: ``ncclTopoGetNetDev`` sends to a peer through
the local NIC of the GPU with the peer's device index under ``NCCL_P2P_PXN_LEVEL=2``, the default; a ring is
searched as ``NET n -> GPU a -> ... -> GPU x -> NET n``, closing through the NIC it entered by, and NCCL
raises the NVLink bandwidth it asks of non-ring patterns by ``ndevs / (ndevs - 1)`` because only rings
carry that extra NVLink hop), hand-built routes, and the α-β closed form of a ring on an idealised network.
"""

import numpy as np
import pytest
from test_network import ROUTED_FABRICS

from simulator.engine import Engine
from simulator.experiment import load_experiment
from simulator.fabric import NetworkConfig
from simulator.routing import Router, ecmp_hash
from topologies import leaf_spine, rail_optimized
from topologies.faults import apply_faults
from workloads.errors import ConfigError
from workloads.ops import OpGraph

STEP = 2e-6
IDEAL = {"step_latency_s": STEP, "bandwidth_efficiency": 1.0}


def _router(cluster, pxn=True, seed=0):
    index = {e: i for i, e in enumerate(cluster.graph.edges)}
    return Router(cluster.graph, index, seed=seed, pxn=pxn), index


def _nodes(index, links):
    """The node path of a route given as link ids."""
    edges = {i: e for e, i in index.items()}
    path = [edges[int(x)] for x in links]
    return [path[0][0]] + [v for _u, v in path]


def test_a_cross_rail_transfer_on_a_rail_fabric_stays_on_the_destination_rail():
    # 4 servers of 4 GPUs in one pod: rail leaf i joins NIC i of every server.
    c = rail_optimized("H100", servers=4, gpus_per_server=4, servers_per_leaf=4, spines=2)
    router, index = _router(c)
    src, dst = ("gpu", 0, 1), ("gpu", 2, 3)
    path = _nodes(index, router.route(src, dst, 0))
    # over NVLink to GPU 3 of server 0, out through its NIC, rail leaf 3, into the destination's NIC
    assert path == [src, ("nvswitch", 0), ("gpu", 0, 3), ("nic", 0, 3), ("leaf", 3), ("nic", 2, 3), dst]
    assert router.proxy(src, dst) == ("gpu", 0, 3)
    # without PXN the same pair leaves through its own NIC, rail leaf 1, and must cross a spine
    plain, _ = _router(c, pxn=False)
    assert any(n[0] == "spine" for n in _nodes(index, plain.route(src, dst, 0)))


def test_a_same_rail_transfer_and_a_transfer_inside_a_server_do_not_move():
    c = rail_optimized("H100", servers=4, gpus_per_server=4, servers_per_leaf=2, spines=2)
    router, _ = _router(c)
    plain, _ = _router(c, pxn=False)
    for src, dst in ((("gpu", 0, 2), ("gpu", 3, 2)), (("gpu", 1, 0), ("gpu", 1, 3))):
        assert router.proxy(src, dst) is None
        for label in (0, 5):
            assert router.route(src, dst, label).tolist() == plain.route(src, dst, label).tolist()


def test_the_proxy_route_is_the_ecmp_pick_from_the_proxy_with_the_true_pairs_hash():
    # Across pods the proxy's NIC reaches the destination's rail leaf over equal-cost spines; the pick hashes
    # the true (source, destination, label), so PXN moves where a flow leaves, not which spine it hashes to.
    c = rail_optimized("H100", servers=4, gpus_per_server=4, servers_per_leaf=2, spines=3)
    router, index = _router(c, seed=7)
    plain, _ = _router(c, pxn=False, seed=7)
    node_id = {n: i for i, n in enumerate(c.graph.nodes)}
    src, dst = ("gpu", 0, 1), ("gpu", 3, 2)
    proxy = ("gpu", 0, 2)
    lead = [index[(src, ("nvswitch", 0))], index[(("nvswitch", 0), proxy)]]
    options = plain.paths(proxy, dst)
    assert len(options) == 3
    for label in range(6):
        pick = options[ecmp_hash(node_id[src], node_id[dst], label, 7) % 3]
        assert router.route(src, dst, label).tolist() == lead + pick.tolist()
    assert [p.tolist() for p in router.paths(src, dst)] == [lead + p.tolist() for p in options]


@pytest.mark.parametrize("build", ROUTED_FABRICS + [
    lambda: rail_optimized("H100-SXM", servers=4, gpus_per_server=4, servers_per_leaf=2, spines=2)])
def test_routes_in_bulk_equal_routes_one_by_one_under_pxn(build):
    c = build()
    router, _ = _router(c, seed=3)
    asked, wanted = [], []
    for i, s in enumerate(c.gpus):
        for j, t in enumerate(c.gpus):
            if s != t:
                for label in (0, 1, 7):
                    asked.append((i, j, label))
                    wanted.append(router.route(s, t, label).tolist())
    fresh, _ = _router(c, seed=3)
    got = fresh.routes(c.gpus, *(np.array(x) for x in zip(*asked)))
    assert [g.tolist() for g in got] == wanted


def test_a_borrowed_nic_is_not_a_proxy_and_a_gpu_without_its_nic_borrows_as_before():
    c = apply_faults(rail_optimized("H100", servers=2, gpus_per_server=4, servers_per_leaf=2, spines=2),
                     [{"kind": "nic_down", "gpu": 2}])  # GPU 2 of server 0 now sends through GPU 3's NIC
    router, index = _router(c)
    # to rail 2: the proxy would be GPU (0, 2), whose NIC is gone: the transfer leaves through its own NIC
    assert router.proxy(("gpu", 0, 1), ("gpu", 1, 2)) is None
    assert _nodes(index, router.route(("gpu", 0, 1), ("gpu", 1, 2)))[1] == ("nic", 0, 1)
    # GPU 3's NIC now serves GPU 2 as well: the two route by the general search, without PXN
    assert router.proxy(("gpu", 0, 1), ("gpu", 1, 3)) is None
    assert router.proxy(("gpu", 0, 3), ("gpu", 1, 0)) is None
    # the GPU without a NIC still leaves through the NIC it borrowed
    assert _nodes(index, router.route(("gpu", 0, 2), ("gpu", 1, 0)))[1] == ("nic", 0, 3)


def _ring(cluster, pxn, n, size=2**30):
    graph = OpGraph(n)
    graph.collective("all_reduce", list(range(n)), size, algorithm="ring", traffic_class="dp")
    record = Engine(graph, cluster, network=NetworkConfig(**IDEAL, pxn=pxn)).run()
    fabric = record.fabric
    moved = fabric.network.ledger.bytes
    return record.step_time_s, {t: float(moved[fabric.tier == t].sum()) for t in ("nvlink", "pcie", "leaf", "spine")}


def test_a_ring_on_a_rail_fabric_keeps_off_the_spines_and_runs_at_the_nic_bound():
    # 4 servers x 4 GPUs in one pod; the ring has 4 channels, one per rail, each entering and leaving a
    # server through one NIC. Closed form (idealised network): 2(n-1) steps of the per-step latency plus
    # 2(n-1)/n * S/4 bytes per channel at the NIC's rate (NVLink carries 4 channels at 450/4 GB/s each: not
    # the bottleneck).
    c = rail_optimized("H100", servers=4, gpus_per_server=4, servers_per_leaf=4, spines=2)
    n, size = 16, 2**30
    step_time, tiers = _ring(c, True, n, size)
    # a step's longest route: GPU -> NVSwitch -> GPU (0.25 us each), PCIe (0.25), NIC -> leaf -> NIC (0.5 each),
    # PCIe (0.25)
    route = 4 * 0.25e-6 + 2 * 0.5e-6
    expected = 2 * (n - 1) * (STEP + route) + 2 * (n - 1) / n * size / 4 / c.gpu.nic_bandwidth
    assert step_time == pytest.approx(expected, rel=1e-6)
    assert tiers["spine"] == 0.0
    # without PXN every hop between servers joins two rails through a spine, and the ring is slower
    plain_time, plain = _ring(c, False, n, size)
    assert plain["spine"] > 0 and plain_time > step_time
    # the same NIC crossings either way; PXN adds one NVLink hop where a channel leaves a server
    assert tiers["pcie"] == pytest.approx(plain["pcie"])
    # (4 channels, each crossing 4 server boundaries; a crossing adds GPU -> NVSwitch and NVSwitch -> GPU, each
    # carrying the channel's 2(n-1)/n * S/4 bytes)
    per_channel = 2 * (n - 1) / n * size / 4
    assert tiers["nvlink"] - plain["nvlink"] == pytest.approx(4 * 4 * 2 * per_channel, rel=1e-9)


def test_a_ring_on_a_rail_fabric_is_as_fast_as_on_one_leaf():
    # One pod of rail leaves and one leaf joining every NIC offer each ring hop between servers one switch.
    rail = rail_optimized("H100", servers=4, gpus_per_server=4, servers_per_leaf=4, spines=2)
    leaf = leaf_spine("H100", servers=4, gpus_per_server=4, servers_per_leaf=4, spines=2)
    assert _ring(rail, True, 16)[0] == pytest.approx(_ring(leaf, True, 16)[0], rel=1e-12)


def test_network_pxn_is_read_from_the_experiment_file_and_checked(tmp_path):
    base = ("cluster: {preset: dgx-h100, nodes: 2}\nmodel: {preset: gpt3-175b, layers: 2}\n"
            "parallel: {tp: 8, pp: 1, micro_batch: 1, global_batch: 16}\ntraining: {seq_len: 2048}\n")
    path = tmp_path / "x.yaml"
    path.write_text(base)
    assert load_experiment(str(path)).network.pxn is True
    path.write_text(base + "network: {pxn: false}\n")
    assert load_experiment(str(path)).network.pxn is False
    path.write_text(base + "network: {pxn: sometimes}\n")
    with pytest.raises(ConfigError, match=r"network\.pxn: must be true or false, got 'sometimes'$"):
        load_experiment(str(path))


@pytest.mark.parametrize("zipf_s", [1.0, 2.0])
def test_auto_runs_an_alltoallv_over_a_rail_pod_in_bulk_as_exact_as_one_flow_per_pair(zipf_s):
    # Under PXN every transfer between servers of one pod keeps to the destination's rail leaf: no spine link
    # carries the exchange, only NIC and NVLink ports bind, as under one leaf (bulk_alltoall.under_one_switch).
    from test_grouped_alltoall import _graph, _run, _same_traffic, _zipf_matrix
    rails = rail_optimized("H100", servers=4, servers_per_leaf=4, spines=2)
    matrix = _zipf_matrix(32, 256, zipf_s)
    per_pair, _ = _run(rails, _graph(32, matrix=matrix), "per_pair")
    auto, fabric = _run(rails, _graph(32, matrix=matrix), "auto")
    assert fabric._one_switch(tuple(range(32)))
    assert fabric.network.flows_started <= 4
    assert auto.step_time_s == pytest.approx(per_pair.step_time_s, rel=1e-9)
    _same_traffic(auto, per_pair)
    # without PXN, or across two pods, the rails meet only at the spines: auto keeps the waves
    plain = Engine(_graph(32, matrix=matrix), rails, network=NetworkConfig(pxn=False))
    plain.run()
    assert not plain.fabric._one_switch(tuple(range(32))) and plain.fabric.network.flows_started > 4
    pods = rail_optimized("H100", servers=4, servers_per_leaf=2, spines=2)
    _auto, fabric = _run(pods, _graph(32, matrix=matrix), "auto")
    assert not fabric._one_switch(tuple(range(32)))


def _bulk_exchange(cluster, pxn=True, n=16):
    graph = OpGraph(n)
    graph.collective("all_to_all", list(range(n)), 2**26, traffic_class="ep")
    engine = Engine(graph, cluster, network=NetworkConfig(all_to_all="bulk", pxn=pxn))
    record = engine.run()
    moved = engine.fabric.network.ledger.bytes
    return record.step_time_s, moved, engine.fabric


def test_bulk_routes_kept_for_a_cluster_are_those_of_its_pxn_setting():
    # The bulk all-to-all keeps routes per cluster graph: a run without PXN after one with it on the same
    # cluster must not reuse the proxied routes (which keep off the spines).
    def rails():
        return rail_optimized("H100", servers=4, gpus_per_server=4, servers_per_leaf=4, spines=2)
    fresh_plain = _bulk_exchange(rails(), pxn=False)
    shared = rails()
    with_pxn = _bulk_exchange(shared, pxn=True)
    again_plain = _bulk_exchange(shared, pxn=False)
    spine = again_plain[2].tier == "spine"
    assert with_pxn[1][spine].sum() == 0 and again_plain[1][spine].sum() > 0
    assert again_plain[0] == fresh_plain[0]
    assert (again_plain[1] == fresh_plain[1]).all()


def test_bulk_routes_kept_for_a_graph_follow_each_views_rank_numbering():
    # Two jobs' views of one cluster share its graph; rank 0 of the second view is another GPU.
    import dataclasses

    def view(cluster):  # ranks 0-7 on servers 2-3
        return dataclasses.replace(cluster, gpus=cluster.gpus[8:] + cluster.gpus[:8], name="job B")

    def senders(fabric, moved):
        return sorted({fabric.links[i][0][1] for i in np.flatnonzero(moved) if fabric.links[i][0][0] == "gpu"})

    shared = leaf_spine("H100", servers=4, gpus_per_server=4, servers_per_leaf=2, spines=2)
    _t, moved, fabric = _bulk_exchange(shared, n=8)  # job A: servers 0-1
    assert senders(fabric, moved) == [0, 1]
    _t, moved, fabric = _bulk_exchange(view(shared), n=8)
    assert senders(fabric, moved) == [2, 3]


def test_the_proxy_is_chosen_by_device_index_not_by_the_order_gpus_are_listed():
    # A custom fabric file may list a server's GPUs in any order (ranks given apart): NCCL matches the peer's
    # device index, which a GPU id gpu:S:L carries as L.
    import copy

    from topologies.custom import cluster_from_dict
    from topologies.export import cluster_to_dict
    base = rail_optimized("H100", servers=4, gpus_per_server=4, servers_per_leaf=2, spines=2)
    doc = copy.deepcopy(cluster_to_dict(base))
    rank = {f"gpu:{g[1]}:{g[2]}": r for r, g in enumerate(base.gpus)}
    at = [i for i, n in enumerate(doc["nodes"]) if isinstance(n, str) and n.startswith("gpu:1:")]
    for i, n in zip(at, [doc["nodes"][i] for i in at][::-1]):
        doc["nodes"][i] = n
    doc["nodes"] = [{"id": n, "rank": rank[n]} if isinstance(n, str) and n.startswith("gpu:") else n
                    for n in doc["nodes"]]
    listed = cluster_from_dict(doc)
    router, _ = _router(listed)
    reference, _ = _router(base)
    assert router.proxy(("gpu", 0, 0), ("gpu", 1, 0)) is None
    for s in base.gpus:
        for t in base.gpus:
            if s != t:
                assert router.proxy(s, t) == reference.proxy(s, t)


def test_network_pxn_on_one_server_is_noted_as_without_effect():
    from simulator.experiment import experiment_from_dict, unused_settings
    doc = {"cluster": {"preset": "dgx-h100", "nodes": 1}, "model": {"preset": "gpt3-175b", "layers": 2},
           "parallel": {"tp": 8, "pp": 1, "micro_batch": 1, "global_batch": 8}, "training": {"seq_len": 2048},
           "network": {"pxn": False}}
    assert any(n.startswith("network.pxn has no effect on one server") for n in unused_settings(
        experiment_from_dict(doc)))
    doc["cluster"]["nodes"] = 2
    assert not any("pxn" in n for n in unused_settings(experiment_from_dict(doc)))


def test_the_collective_command_runs_with_and_without_pxn(tmp_path, capsys):
    # A 16-GPU ring on a rail fabric of two servers in one pod: without PXN its hops between servers join two
    # rails through a spine and it is slower.
    from simulator.cli import main
    fabric = tmp_path / "rails.yaml"
    fabric.write_text("preset: dgx-h100\nnodes: 2\nfabric: rail_optimized\nnodes_per_leaf: 2\n")
    times = {}
    for flag in ([], ["--no-pxn"]):
        capsys.readouterr()
        assert main(["collective", "--op", "all_reduce", "--cluster", str(fabric), "--gpus", "16", "--algo", "ring",
                     "--min-size", "256MiB", "--max-size", "256MiB", "--json", *flag]) == 0
        times[bool(flag)] = __import__("json").loads(capsys.readouterr().out)[0]["time_s"]
    assert times[True] > times[False]


def test_the_collective_command_reads_the_files_network_section(tmp_path, capsys):
    from simulator.cli import main
    base = "cluster: {preset: dgx-h100, nodes: 2, fabric: rail_optimized, nodes_per_leaf: 2}\n"
    args = ["collective", "--op", "all_reduce", "--gpus", "16", "--algo", "ring", "--min-size", "256MiB",
            "--max-size", "256MiB", "--json"]

    def time_of(text, *flags):
        path = tmp_path / "f.yaml"
        path.write_text(text)
        capsys.readouterr()
        assert main([*args, "--cluster", str(path), *flags]) == 0
        return __import__("json").loads(capsys.readouterr().out)[0]["time_s"]

    assert time_of(base + "network: {pxn: false}\n") == time_of(base, "--no-pxn") != time_of(base)
    # the file's fidelity holds unless --fidelity says otherwise
    assert time_of(base + "network: {fidelity: full}\n") == time_of(base, "--fidelity", "full")
    assert time_of(base + "network: {fidelity: full}\n", "--fidelity", "fast") == time_of(base)
    path = tmp_path / "bad.yaml"
    path.write_text(base + "network: {bogus: 1}\n")
    capsys.readouterr()
    assert main([*args, "--cluster", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bad.yaml: network.bogus: unknown field" in err[0]
