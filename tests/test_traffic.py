"""Traffic matrices and link bandwidth over time, against closed forms and conservation.

* A ring all-reduce of S bytes over n ranks sends and receives ``2(n-1)/n·S``
  per rank; an all-gather ``(n-1)/n·S``; a send its size (NCCL's algorithms, the
  textbook byte counts). The traffic matrix's row and column sums must be
  those figures.
* The time integral of each link's bandwidth series is its byte total; a
  link never runs above its usable rate (max-min never oversubscribes); a lone
  flow's series is the hand-worked step ``0 → rate → 0``.
"""

import numpy as np
import pytest

from simulator import simulate
from simulator.experiment import DEMO_EXPERIMENT, experiment_from_dict, run_experiment
from simulator.fabric import NetworkConfig
from simulator.traffic import integral, window_means
from topologies import build_cluster, single_server
from workloads.ops import OpGraph


@pytest.fixture(scope="module")
def two_nodes():
    return build_cluster({"preset": "dgx-h100", "nodes": 2})


@pytest.fixture(scope="module")
def demo():
    return run_experiment(experiment_from_dict(DEMO_EXPERIMENT))


def hand_graph(S=64e6, A=16e6, P=5e6):
    """Ring all-reduce of S over all 16 ranks, ring all-gather of A over ranks 0..7, rank 3 sends P to 12."""
    g = OpGraph(16)
    g.collective("all_reduce", range(16), S, algorithm="ring", traffic_class="dp")
    g.collective("all_gather", range(8), A, algorithm="ring", traffic_class="tp")
    g.send(3, 12, P, traffic_class="pp")
    g.recv(12, 3, P, traffic_class="pp")
    return g


@pytest.mark.parametrize("fidelity", ["fast", "full"])
def test_traffic_matrix_row_and_column_sums_are_per_gpu_sent_and_received_bytes(two_nodes, fidelity):
    S, A, P = 64e6, 16e6, 5e6
    result = simulate(hand_graph(S, A, P), two_nodes, network=NetworkConfig(fidelity=fidelity))
    m = result.traffic_matrix()
    sent = np.full(16, 2 * 15 / 16 * S)
    sent[:8] += 7 / 8 * A
    received = sent.copy()
    sent[3] += P
    received[12] += P
    np.testing.assert_allclose(m.sum(axis=1).to_numpy(), sent, rtol=1e-12)
    np.testing.assert_allclose(m.sum(axis=0).to_numpy(), received, rtol=1e-12)
    assert np.all(np.diag(m.to_numpy()) == 0)  # nobody sends to itself
    # per class
    pp = result.traffic_matrix(traffic_class="pp")
    assert pp.loc["gpu3", "gpu12"] == P and pp.to_numpy().sum() == P
    tp = result.traffic_matrix(traffic_class="tp").to_numpy()
    assert tp[8:].sum() == 0 and tp[:, 8:].sum() == 0
    assert tp.sum() == pytest.approx(8 * 7 / 8 * A, rel=1e-12)
    # the GPU×GPU totals are what GPUs put on the wire
    assert m.to_numpy().sum() == pytest.approx(sum(result.bytes_by_class.values()), rel=1e-12)


def test_node_and_leaf_matrices_aggregate_the_gpu_matrix(two_nodes):
    result = simulate(hand_graph(), two_nodes)
    gpu = result.traffic_matrix("gpu").to_numpy()
    node = result.traffic_matrix("node")
    assert list(node.index) == ["node0", "node1"]
    expected = np.array([[gpu[:8, :8].sum(), gpu[:8, 8:].sum()], [gpu[8:, :8].sum(), gpu[8:, 8:].sum()]])
    np.testing.assert_allclose(node.to_numpy(), expected, rtol=1e-12)
    # a 16-rank ring crosses from node 0 to node 1 on one hop per ring (and the send): never zero
    assert node.loc["node0", "node1"] > 5e6 and node.loc["node1", "node0"] > 0
    leaf = result.traffic_matrix("leaf")
    assert leaf.to_numpy().sum() == pytest.approx(gpu.sum(), rel=1e-12)


def test_leaf_level_needs_a_fabric():
    result = simulate(hand_graph_single(), single_server())
    with pytest.raises(ValueError, match="level: 'leaf'"):
        result.traffic_matrix("leaf")
    with pytest.raises(ValueError, match="level: 'rack' unknown"):
        result.traffic_matrix("rack")


def hand_graph_single():
    g = OpGraph(8)
    g.collective("all_reduce", range(8), 1e6, algorithm="ring")
    return g


def test_training_step_matrix_matches_send_ops_and_class_totals(demo):
    """PP sends: the pp matrix's row sums are the ranks' send op sizes in ``result.ops``."""
    ops = demo.ops
    sends = ops[ops["kind"] == "send"].groupby("rank")["nbytes"].sum()
    pp_collectives = ops[(ops["kind"] == "collective") & (ops["traffic_class"] == "pp")]
    assert pp_collectives.empty  # the demo's pipeline traffic is point-to-point only
    pp = demo.traffic_matrix(traffic_class="pp").sum(axis=1)
    np.testing.assert_allclose(pp.to_numpy(), sends.reindex(range(16), fill_value=0.0).to_numpy(), rtol=1e-12)
    for cls, total in demo.bytes_by_class.items():
        assert demo.traffic_matrix(traffic_class=cls).to_numpy().sum() == pytest.approx(total, rel=1e-12)
    # TP groups live inside a node: TP traffic is all on the node matrix's diagonal
    tp = demo.traffic_matrix("node", traffic_class="tp").to_numpy()
    assert tp.sum() > 0 and tp.sum() == pytest.approx(np.trace(tp), rel=1e-12)


def test_fidelities_carry_the_same_traffic():
    exp = experiment_from_dict(DEMO_EXPERIMENT)
    full = run_experiment(exp, fidelity="full").traffic_matrix().to_numpy()
    for fidelity in ("fast", "lockstep"):
        np.testing.assert_allclose(run_experiment(exp, fidelity=fidelity).traffic_matrix().to_numpy(), full,
                                   rtol=1e-9)


# ------------------------------------------------------------- time series
@pytest.mark.parametrize("model", ["flow", "analytic"])
def test_every_link_series_integrates_to_its_bytes(demo, model):
    result = demo if model == "flow" else run_experiment(
        experiment_from_dict({**DEMO_EXPERIMENT, "network": {"model": "analytic"}}))
    links = result.links
    used = list(links.index[links["bytes"] > 0])
    series = result.link_timeseries(links=used)
    for lid, s in series.groupby("link"):
        assert integral(s["time_s"].to_numpy(), s["rate_Bps"].to_numpy()) == pytest.approx(
            links.loc[lid, "bytes"], rel=1e-9)
        assert s["rate_Bps"].iloc[-1] == 0.0 and s["time_s"].is_monotonic_increasing
    tiers = result.tier_timeseries
    for tier, total in result.bytes_by_tier.items():
        assert integral(tiers["time_s"].to_numpy(), tiers[tier].to_numpy()) == pytest.approx(total, rel=1e-9)


def test_links_never_run_above_their_usable_rate(demo):
    fabric = demo.record.fabric
    series = demo.link_timeseries(links=list(range(len(demo.links))))
    usable = fabric.usable_capacity[series["link"].to_numpy()]
    assert np.all(series["rate_Bps"].to_numpy() <= usable * (1 + 1e-9))
    assert np.all(series["rate_Bps"].to_numpy() >= 0)


def test_a_lone_flow_is_a_step(two_nodes):
    """One send across the fabric: rate 0 until its latency has passed, its bottleneck rate until the
    last byte, then 0 — on every link of its route."""
    g = OpGraph(16)
    g.send(0, 8, 100e6)
    g.recv(8, 0, 100e6)
    result = simulate(g, two_nodes)
    used = result.links[result.links["bytes"] > 0]
    series = result.link_timeseries(links=list(used.index))
    end = result.step_time
    for _lid, s in series.groupby("link"):
        times, rates = s["time_s"].to_numpy(), s["rate_Bps"].to_numpy()
        assert len(times) == 3 and times[0] == 0 and rates[0] == 0 and rates[2] == 0
        assert times[2] == pytest.approx(end, rel=1e-12)
        assert rates[1] * (times[2] - times[1]) == pytest.approx(100e6, rel=1e-9)
    assert series.groupby("link")["rate_Bps"].max().nunique() == 1  # one rate on every link of the route


def test_top_links_and_window_means(demo):
    top = demo.busiest_links(3)
    assert list(top["bytes"]) == sorted(demo.links["bytes"], reverse=True)[:3]
    series = demo.link_timeseries(top=3)
    assert sorted(series["link"].unique()) == sorted(top.index)
    s = series[series["link"] == top.index[0]]
    edges = np.linspace(0, demo.step_time, 11)
    means = window_means(s["time_s"].to_numpy(), s["rate_Bps"].to_numpy(), edges)
    assert np.sum(means * np.diff(edges)) == pytest.approx(top["bytes"].iloc[0], rel=1e-9)
    with pytest.raises(ValueError, match="links: .* is not a link id"):
        demo.link_timeseries(links=[10**9])


def test_link_series_of_an_all_to_all_with_aggregates_integrate_to_bytes():
    # A 1 GiB all-to-all over 256 GPUs on two leaves of a 1:1 leaf-spine, as staggered waves: they are folded
    # into aggregates (simulator.network._Agg), whose members log no rate changes of their own; the rate log
    # expanded from the aggregates' histories and members' spans must still give every link's bytes and never
    # exceed its rate.
    g = OpGraph(256)
    g.collective("all_to_all", range(256), float(2**30), traffic_class="ep")
    cluster = build_cluster({"preset": "dgx-h100", "nodes": 32})
    result = simulate(g, cluster, network=NetworkConfig(all_to_all="grouped"))
    assert result.record.fabric.network.aggregated > 100
    links = result.links
    used = list(links.index[links["bytes"] > 0])
    sample = used[:: max(1, len(used) // 96)]  # a hundred links or so, from every tier that carried bytes
    assert set(links.loc[sample, "tier"]) == set(links.loc[used, "tier"])
    used = sample
    series = result.link_timeseries(links=used)
    capacity = result.record.fabric.network.capacity
    for lid, s in series.groupby("link"):
        rates = s["rate_Bps"].to_numpy()
        assert integral(s["time_s"].to_numpy(), rates) == pytest.approx(links.loc[lid, "bytes"], rel=1e-9)
        assert rates.max() <= capacity[lid] * (1 + 1e-9)
    tiers = result.tier_timeseries
    for tier, total in result.bytes_by_tier.items():
        assert integral(tiers["time_s"].to_numpy(), tiers[tier].to_numpy()) == pytest.approx(total, rel=1e-9)
