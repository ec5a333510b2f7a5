"""Faults and what-ifs: each kind against a first-principles bound, plus the errors a sick fabric can raise.

Truths: a bandwidth-bound cross-leaf collective through half the spines takes
twice as long; a link at a fraction of its rate moves a lone flow that much
slower; extra latency on a tier adds it once per crossing per algorithm step;
a straggler slows the step by at most its factor and at least enough to cover
its own slowed compute; a failed NIC's traffic leaves through a neighbour's.
"""

from __future__ import annotations

import pytest

from simulator import NetworkConfig, simulate
from simulator.cli import main
from simulator.experiment import experiment_from_dict, run_experiment
from topologies import TopologyError, leaf_spine
from topologies.faults import apply_faults
from workloads.ops import OpGraph

IDEAL = NetworkConfig(step_latency_s=2e-6, bandwidth_efficiency=1.0)


def two_leaves():
    """4 servers of 8 GPUs, 2 per leaf, 2 spines, non-blocking: each leaf has 800 GB/s up, 400 per spine."""
    return leaf_spine("H100-SXM", servers=4, servers_per_leaf=2, spines=2)


def ring_across_leaves(cluster, nbytes=2**32):
    g = OpGraph(cluster.num_gpus)
    g.collective("all_reduce", list(range(cluster.num_gpus)), nbytes, algorithm="ring")
    return g


def test_one_of_two_spines_down_doubles_cross_leaf_transfers_at_full_load():
    # Every GPU of leaf 0 exchanges 1 GB with a GPU of leaf 1: 16 flows each way fill the leaf's 800 GB/s of
    # uplinks (2 spines x 400). At full load the balanced time is S / 50 GB/s (ECMP collisions can only make
    # the healthy fabric slower); through one spine the 16 flows share 400 GB/s: exactly twice the balanced time.
    c = two_leaves()
    sick = apply_faults(c, [{"kind": "switch_down", "switch": "spine:0"}])
    assert sick.graph.number_of_nodes() == c.graph.number_of_nodes() - 1

    def exchange(cluster, nbytes=1e9):
        g = OpGraph(cluster.num_gpus)
        for i in range(16):
            for a, b in ((i, i + 16), (i + 16, i)):
                g.send(a, b, nbytes, stream="out")
                g.recv(b, a, nbytes, stream="in")
        return simulate(g, cluster, network=IDEAL).step_time

    lat = 2e-6 + 2 * 0.25e-6 + 4 * 0.5e-6   # software α + NIC hops + switch hops (builder defaults)
    balanced = lat + 1e9 / c.gpu.nic_bandwidth
    healthy, faulty = exchange(c), exchange(sick)
    assert healthy >= balanced * (1 - 1e-9)
    assert faulty == pytest.approx(lat + 1e9 / (400e9 / 16), rel=1e-6)
    assert (faulty - lat) / (balanced - lat) == pytest.approx(2.0, rel=1e-6)
    assert faulty > healthy


def test_a_link_down_is_routed_around_and_carries_nothing():
    c = two_leaves()
    sick = apply_faults(c, [{"kind": "link_down", "link": ["leaf:0", "spine:0"]}])
    res = simulate(ring_across_leaves(sick, 2**28), sick, network=IDEAL)
    links = res.links
    assert not ((links["src"] == "('leaf', 0)") & (links["dst"] == "('spine', 0)")).any()
    up = links[(links["src"] == "('leaf', 0)") & (links["dst"] == "('spine', 1)")]
    assert float(up["bytes"].iloc[0]) > 0


def test_a_degraded_link_slows_a_lone_flow_by_its_fraction():
    c = leaf_spine("H100-SXM", servers=2, gpus_per_server=1, servers_per_leaf=1, spines=1)
    sick = apply_faults(c, [{"kind": "degraded_link", "link": ["leaf:0", "spine:0"], "fraction": 0.25}])

    def one_send(cluster):
        g = OpGraph(2)
        g.send(0, 1, 1e9)
        g.recv(1, 0, 1e9)
        return simulate(g, cluster, network=IDEAL).step_time

    lat = 2e-6 + 2 * 0.25e-6 + 4 * 0.5e-6      # software α + NIC hops + switch hops (builder defaults)
    nic = c.gpu.nic_bandwidth
    assert one_send(c) == pytest.approx(lat + 1e9 / nic, rel=1e-6)
    assert one_send(sick) == pytest.approx(lat + 1e9 / (0.25 * nic), rel=1e-6)


def test_extra_latency_on_a_tier_is_paid_per_crossing_per_step():
    c = leaf_spine("H100-SXM", servers=2, gpus_per_server=1, servers_per_leaf=1, spines=1)
    extra = 10e-6
    sick = apply_faults(c, [{"kind": "latency", "tier": "spine", "extra": "10us"}])
    g = OpGraph(2)
    g.collective("all_reduce", [0, 1], 1e3, algorithm="ring")
    base = simulate(g, c, network=IDEAL).step_time
    slow = simulate(g, sick, network=IDEAL).step_time
    # a ring all-reduce over 2 ranks: 2 steps, each crossing leaf->spine->leaf (2 spine-tier links)
    assert slow - base == pytest.approx(2 * 2 * extra, rel=1e-6)


def test_a_failed_nic_sends_through_the_next_gpus_nic():
    c = two_leaves()
    sick = apply_faults(c, [{"kind": "nic_down", "gpu": 3}])
    assert ("nic", 0, 3) not in sick.graph and sick.graph.has_edge(("gpu", 0, 3), ("nic", 0, 4))
    res = simulate(ring_across_leaves(sick, 2**28), sick, network=IDEAL)
    links = res.links
    out = links[links["src"] == "('nic', 0, 4)"]
    assert float(out["bytes"].sum()) > 0


@pytest.mark.parametrize("lender_and_borrower", [(4, 3), (0, 7)])
def test_gpus_sharing_a_nic_after_a_failure_talk_over_nvlink_not_through_the_nic(lender_and_borrower):
    # The borrower reaches the lender's NIC over NVLink; GPU-to-GPU traffic between the two must still go
    # through the NVSwitch, never in and out of the NIC's PCIe link (a path of the same length).
    c = two_leaves()
    lender, borrower = lender_and_borrower
    sick = apply_faults(c, [{"kind": "nic_down", "gpu": borrower}])
    graph = OpGraph(c.num_gpus)
    graph.collective("all_gather", list(range(8)), 2**28, algorithm="ring", traffic_class="tp")
    res = simulate(graph, sick, network=IDEAL)
    healthy = simulate(graph, c, network=IDEAL)
    links = res.links
    assert float(links.loc[links["tier"] == "pcie", "bytes"].sum()) == 0.0
    assert res.step_time == pytest.approx(healthy.step_time, rel=1e-12)


def test_a_borrowed_nic_is_as_far_as_the_path_it_stands_for():
    # GPU 3 of server 0 sends through GPU 4's NIC: over NVLink to GPU 4 (GPU 3 -> NVSwitch -> GPU 4), then
    # GPU 4's PCIe link. The edge standing for that path has that path's latency, each way; it had none, so
    # a step with the NIC down could run faster than the healthy one (0.5 us on a 15 ms step, a QA hunt).
    c = two_leaves()
    g = c.graph
    sick = apply_faults(c, [{"kind": "nic_down", "gpu": 3}]).graph
    gpu, peer, nic = ("gpu", 0, 3), ("gpu", 0, 4), ("nic", 0, 4)
    switches = [w for w in g.successors(gpu) if g.nodes[w]["kind"] == "nvswitch" and g.has_edge(w, peer)]
    out = min(g.edges[gpu, w]["latency"] + g.edges[w, peer]["latency"] for w in switches)
    back = min(g.edges[peer, w]["latency"] + g.edges[w, gpu]["latency"] for w in switches)
    assert sick.edges[gpu, nic]["latency"] == pytest.approx(out + g.edges[peer, nic]["latency"], rel=1e-12)
    assert sick.edges[nic, gpu]["latency"] == pytest.approx(back + g.edges[nic, peer]["latency"], rel=1e-12)
    assert sick.edges[gpu, nic]["latency"] > g.edges[gpu, ("nic", 0, 3)]["latency"]  # never nearer than its own


def test_a_failed_nic_never_makes_the_step_faster():
    doc = {"cluster": {"preset": "dgx-a100", "nodes": 2, "gpus_per_node": 2, "nodes_per_leaf": 1, "spines": 1,
                       "oversubscription": 4},
           "model": {"preset": "gpt2-small", "layers": 2},
           "parallel": {"tp": 2, "pp": 2, "micro_batch": 2, "global_batch": 8}, "training": {"seq_len": 128},
           "faults": [{"kind": "nic_down", "gpu": 0}]}
    summary = run_experiment(experiment_from_dict(doc), force=True).summary
    assert summary["step_time_s"] >= summary["healthy_step_time_s"]  # was 0.99997 of it
    # ... with extra latency on a tier too: the borrowed edge takes the extras of the path it stands for (the
    # extras were applied after borrowing, to the borrowed edge's own tier only: 0.99884 of the step with pcie)
    for tier in ("pcie", "nvlink"):
        latency = {"kind": "latency", "tier": tier, "extra": "5us"}
        alone = run_experiment(experiment_from_dict({**doc, "faults": [latency]}), force=True).step_time
        both = run_experiment(experiment_from_dict({**doc, "faults": [latency, *doc["faults"]]}), force=True)
        assert both.step_time >= alone, tier


def test_a_borrowed_edge_carries_the_latency_extras_of_its_path():
    c = two_leaves()
    extra = 1e-6
    for tier, hops in (("pcie", 1), ("nvlink", 2)):  # the path: GPU -> NVSwitch -> lender (2 NVLink), its PCIe
        plain = apply_faults(c, [{"kind": "nic_down", "gpu": 3}]).graph
        slow = apply_faults(c, [{"kind": "latency", "tier": tier, "extra": "1us"},
                                {"kind": "nic_down", "gpu": 3}]).graph
        edge = (("gpu", 0, 3), ("nic", 0, 4))
        assert slow.edges[edge]["latency"] == pytest.approx(plain.edges[edge]["latency"] + hops * extra, rel=1e-12)


def _dp_experiment(faults=None):
    doc = {"cluster": {"preset": "dgx-h100", "nodes": 1}, "model": {"preset": "gpt2-small"},
           "parallel": {"dp": 8, "global_batch": 32}, "training": {"seq_len": 1024}}
    if faults is not None:
        doc["faults"] = faults
    return experiment_from_dict(doc)


def test_a_run_with_a_spine_down_reports_the_bisection_left_and_the_cost_of_the_fabric_bought():
    # 4 DGX H100 on 2 leaves (2 per leaf), 2 spines, 1:1: the first two servers send 16 x 50 GB/s over the
    # leaf's two uplinks of 400 GB/s each; with one spine down only one uplink is left: half.
    doc = {"cluster": {"preset": "dgx-h100", "nodes": 4, "nodes_per_leaf": 2, "spines": 2},
           "model": {"preset": "gpt2-small"}, "parallel": {"dp": 32, "global_batch": 32},
           "training": {"seq_len": 1024}}
    healthy = run_experiment(experiment_from_dict(doc)).summary
    sick = run_experiment(experiment_from_dict({**doc, "faults": [{"kind": "switch_down", "switch": "spine:0"}]}))
    assert healthy["bisection_bytes_s"] == pytest.approx(16 * 50e9)
    assert sick.summary["bisection_bytes_s"] == pytest.approx(8 * 50e9)
    assert sick.summary["fabric_cost_usd"] == healthy["fabric_cost_usd"]  # the spine is still paid for


def test_a_2x_straggler_slows_the_step_by_at_most_2x_and_at_least_its_own_compute():
    healthy = run_experiment(_dp_experiment())
    res = run_experiment(_dp_experiment([{"kind": "straggler", "gpu": 5, "factor": 2.0}]))
    ops = healthy.ops
    compute_5 = float(ops[(ops["rank"] == 5) & (ops["kind"] == "compute")]["duration_s"].sum())
    assert res.summary["healthy_step_time_s"] == pytest.approx(healthy.step_time, rel=1e-12)
    assert res.step_time <= 2.0 * healthy.step_time
    assert res.step_time >= 2.0 * compute_5            # its doubled compute is on the critical path
    assert res.summary["fault_slowdown"] == pytest.approx(res.step_time / healthy.step_time)


def test_a_straggler_slows_its_whole_tp_group_under_representatives():
    # fast fidelity runs one program per TP group: a straggling member holds the group back
    doc = {"cluster": {"preset": "dgx-h100", "nodes": 1}, "model": {"preset": "gpt2-small"},
           "parallel": {"tp": 2, "dp": 4, "global_batch": 16}, "training": {"seq_len": 1024}}
    full = run_experiment(experiment_from_dict({**doc, "fidelity": "full",
                                                "faults": [{"kind": "straggler", "gpu": 1, "factor": 1.5}]}))
    fast = run_experiment(experiment_from_dict({**doc, "faults": [{"kind": "straggler", "gpu": 1,
                                                                   "factor": 1.5}]}))
    assert fast.step_time == pytest.approx(full.step_time, rel=0.02)


@pytest.mark.parametrize("faults, words", [
    ([{"kind": "switch_down", "switch": "spine:0"}, {"kind": "switch_down", "switch": "spine:1"}],
     ["partitioned", "remove a fault or keep a path"]),
    # a NIC's cable is its GPU's only way in: the message points to nic_down, which models that
    ([{"kind": "link_down", "link": ["nic:0:3", "leaf:0"]}], ["partitioned", "nic_down", "RANK"]),
    ([{"kind": "switch_down", "switch": "spine:9"}], ["faults[0].switch", "spine:9"]),
    ([{"kind": "meteor"}], ["faults[0].kind", "link_down"]),
    ([{"kind": "straggler", "gpu": 99, "factor": 2}], ["faults[0].gpu"]),
    ([{"kind": "straggler", "gpu": 1, "factor": 0.5}], ["faults[0].factor"]),
    ([{"kind": "degraded_link", "link": ["leaf:0", "spine:0"], "fraction": 2}], ["faults[0].fraction"]),
    ([{"kind": "link_down", "link": ["leaf:0", "leaf:1"]}], ["faults[0].link", "no cable"]),
    ([{"kind": "latency", "tier": "warp", "extra": "1us"}], ["faults[0].tier"]),
    ([{"kind": "nic_down"}], ["faults[0].gpu", "required"]),
    ({"kind": "nic_down", "gpu": 0}, ["faults: must be a list"]),
])
def test_bad_or_partitioning_faults_are_one_line_errors(tmp_path, capsys, faults, words):
    import yaml
    doc = {"cluster": {"preset": "dgx-h100", "nodes": 4, "nodes_per_leaf": 2, "spines": 2},
           "model": {"preset": "tiny"}, "training": {"seq_len": 128}, "faults": faults}
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and all(w in err[0] for w in words), err


def test_topology_faults_need_no_experiment():
    with pytest.raises(TopologyError, match="partitioned"):
        apply_faults(two_leaves(), [{"kind": "switch_down", "switch": "spine:0"},
                                    {"kind": "switch_down", "switch": "spine:1"}])


def test_sweeps_grid_over_faults():
    import simulator
    from simulator.sweeps import parse_grid_arg
    doc = {"cluster": {"preset": "dgx-h100", "nodes": 1}, "model": {"preset": "gpt2-small"},
           "parallel": {"dp": 8, "global_batch": 32}, "training": {"seq_len": 1024}}
    grid = dict([parse_grid_arg("faults=[],[{kind: straggler, gpu: 0, factor: 2}]")])
    table = simulator.sweep(doc, grid, jobs=1, progress=False)
    assert set(table["status"]) == {"ok"} and len(table) == 2
    slowed = table.dropna(subset=["fault_slowdown"])
    assert len(slowed) == 1 and 1.0 < float(slowed["fault_slowdown"].iloc[0]) <= 2.0
