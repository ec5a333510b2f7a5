"""Bulk all-to-alls (``network.all_to_all: bulk``, and ``auto`` from 256 ranks) against one flow per GPU pair.

A bulk all-to-all is at most four flows (per class, NVLink or network: every transfer but each member's last
from the first latency, the last ones from the latest). Its bytes per link and per GPU pair must be the
transfers' own, exactly; its time is bounded by hand (the bottleneck link's bytes after the first latency,
and no later than if everything started at the last one) and measured against ``per_pair`` within a stated
tolerance.
"""

import numpy as np
import pytest
from test_grouped_alltoall import _graph, _run, _same_traffic, _zipf_matrix

import simulator.fabric
from simulator.bulk_alltoall import AllToAllPairs
from simulator.engine import Engine
from simulator.fabric import NetworkConfig
from simulator.nccl import ALL_TO_ALL_NET_EFFICIENCY, NIC_EFFICIENCY, p2p_protocol, step_latencies
from topologies import leaf_spine

BULK_TOLERANCE = 0.01
"""Bulk vs per-pair, uniform sizes, 32 GPUs (measured: one leaf equal to rounding; 2 servers per leaf at 2:1
+0.03% / +0.27% / +0.02% at 64 KiB / 16 MiB / 256 MiB; bulk was never faster than per-pair but by rounding)."""

ONE_LEAF = dict(servers=4, gpus_per_server=8, servers_per_leaf=4)
TWO_PER_LEAF = dict(servers=4, gpus_per_server=8, servers_per_leaf=2, spines=2, oversubscription=2)


@pytest.mark.parametrize("fabric", [ONE_LEAF, TWO_PER_LEAF])
@pytest.mark.parametrize("size", [2**16, 2**24, 2**28])
def test_bulk_moves_every_transfer_and_stays_within_tolerance_of_per_pair(fabric, size):
    cluster = leaf_spine("H100", **fabric)
    per_pair, _ = _run(cluster, _graph(32, size), "per_pair")
    bulk, b_fabric = _run(cluster, _graph(32, size), "bulk")
    _same_traffic(bulk, per_pair)
    assert b_fabric.network.flows_started <= 4
    assert per_pair.step_time_s * (1 - 1e-12) <= bulk.step_time_s <= per_pair.step_time_s * (1 + BULK_TOLERANCE)


@pytest.mark.parametrize("size", [2**12, 2**20, 2**28])
def test_bulk_time_lies_between_hand_bounds(size):
    # 16 GPUs, two servers on one leaf: each GPU's NIC carries its 8 remote chunks of S/16 each way.
    n, cluster = 16, leaf_spine("H100", servers=2, gpus_per_server=8, servers_per_leaf=2)
    record, fabric = _run(cluster, _graph(n, size), "bulk")
    chunk = size / n
    nic = float(fabric.usable_capacity[fabric.route(0, 8)].min())  # the NIC at NIC_EFFICIENCY of its rate
    assert nic == pytest.approx(50e9 * NIC_EFFICIENCY)  # 400 Gb/s
    protocol = p2p_protocol(chunk, network=True)
    assert protocol == "Simple"  # NCCL has no LL buffers for network send/recv
    base, intra, inter = step_latencies("direct", protocol, True)
    factor = ALL_TO_ALL_NET_EFFICIENCY / NIC_EFFICIENCY  # an all-to-all's network transfers reach 0.85 of line
    # Every member's first remote peer pays one network step; the 8th (member 0 reaches server 1's GPUs at
    # offsets 8..15) seven intra-server steps more, as the proxy posts one message after another; every step
    # costs at least its route's own link latency (NCCL's figures are end to end).
    phys = float(fabric.latency[fabric.route(0, 8)].sum())
    first, last = base + max(inter, phys), base + 7 * max(intra, phys) + max(inter, phys)
    wire = 8 * chunk / factor / nic
    assert first + wire * (1 - 1e-9) <= record.step_time_s <= last + wire * (1 + 1e-9)


def test_auto_is_grouped_below_the_threshold_and_bulk_from_it(monkeypatch):
    cluster = leaf_spine("H100", **TWO_PER_LEAF)
    grouped, _ = _run(cluster, _graph(32, 2**24), "grouped")
    bulk, _ = _run(cluster, _graph(32, 2**24), "bulk")
    assert grouped.step_time_s != bulk.step_time_s  # the premise: the two models differ here
    auto, _ = _run(cluster, _graph(32, 2**24), "auto")
    assert auto.step_time_s == grouped.step_time_s
    monkeypatch.setattr(simulator.fabric, "BULK_ALL_TO_ALL_RANKS", 32)
    auto, _ = _run(cluster, _graph(32, 2**24), "auto")
    assert auto.step_time_s == bulk.step_time_s


def test_spray_routing_keeps_grouped_waves():
    cluster = leaf_spine("H100", **TWO_PER_LEAF)
    out = []
    for mode in ("grouped", "bulk"):
        engine = Engine(_graph(32, 2**24), cluster, network=NetworkConfig(all_to_all=mode, routing="spray"))
        out.append((engine.run().step_time_s, engine.fabric.network.flows_started))
    assert out[0] == out[1]


def test_pairs_are_enumerated_member_major_over_the_mask():
    group = np.array([5, 9, 2])
    mask = np.array([[False, True, False], [False, True, True], [False, False, True]])
    pairs = AllToAllPairs(group, mask)
    # member i sends to member (i + k) % 3 for each set offset k
    assert list(pairs) == [(5, 9), (9, 2), (9, 5), (2, 9)]
    assert len(pairs) == 4 and pairs[0] == (5, 9) and pairs[-1] == (2, 9)


def test_bulk_over_1024_gpus_is_bounded_by_its_nics():
    # 1 GiB over 1,024 GPUs of the CLI's default cluster: each NIC sends 1,016 remote chunks of 1 MiB.
    from topologies import build_cluster
    from workloads.ops import OpGraph

    cluster = build_cluster({"preset": "dgx-h100", "nodes": 128})
    g = OpGraph(1024)
    g.collective("all_to_all", list(range(1024)), float(2**30), traffic_class="ep")
    engine = Engine(g, cluster)
    record = engine.run()
    network = engine.fabric.network
    assert network.flows_started <= 4 and network.ledger.flows_completed == 1024 * 1023
    nic = float(engine.fabric.usable_capacity[engine.fabric.route(0, 8)].min())
    assert record.step_time_s >= 1016 * 2**20 / nic
    assert record.step_time_s <= 1016 * 2**20 / nic * 1.2  # a 1:1 leaf-spine: ECMP collisions cost < 20%


@pytest.mark.parametrize("fabric", [ONE_LEAF, TWO_PER_LEAF])
@pytest.mark.parametrize("zipf_s", [0.3, 1.0])
def test_bulk_alltoallv_moves_every_pair_its_bytes_no_faster_than_its_bottleneck(fabric, zipf_s):
    cluster = leaf_spine("H100", **fabric)
    matrix = _zipf_matrix(32, 256, zipf_s)
    per_pair, _ = _run(cluster, _graph(32, matrix=matrix), "per_pair")
    bulk, b_fabric = _run(cluster, _graph(32, matrix=matrix), "bulk")
    _same_traffic(bulk, per_pair)
    assert b_fabric.network.flows_started <= 4
    # No schedule beats the busiest link's bytes at its usable rate, after the base latency.
    base = step_latencies("direct", p2p_protocol(float(matrix.max())), True)[0]
    busiest = float((b_fabric.network.ledger.bytes / b_fabric.usable_capacity).max())
    assert bulk.step_time_s >= base + busiest * (1 - 1e-9)
    # Members of a flow finish together at the rate of its busiest link: never slower than per-pair here
    # (measured -0.1% to -20%; docs/DESIGN.md, "Bulk all-to-all").
    assert bulk.step_time_s <= per_pair.step_time_s * (1 + 1e-9)


def test_auto_runs_an_alltoallv_in_bulk_under_one_switch_and_grouped_across_switches():
    from simulator.bulk_alltoall import under_one_switch

    cluster = leaf_spine("H100", **TWO_PER_LEAF)  # 4 servers, 2 per leaf
    assert under_one_switch(cluster, range(16)) and not under_one_switch(cluster, range(32))
    assert under_one_switch(cluster, range(8))  # one server
    # rail-optimised: a server's 8 NICs hang off 8 rail leaves
    from topologies.builders import rail_optimized
    rails = rail_optimized("H100", servers=4, servers_per_leaf=2, spines=2)
    assert under_one_switch(rails, range(8)) and not under_one_switch(rails, range(16))
    assert under_one_switch(rails, [0, 8])  # rail 0 of servers 0 and 1: one rail leaf
    assert not under_one_switch(rails, [0, 8, 16, 24])  # rail 0 of all four: two rail leaves (2 servers each)
    # Under one leaf only the GPUs' own ports bind: bulk takes what one flow per pair takes, and auto uses it.
    matrix = _zipf_matrix(16, 256, 1.0)
    per_pair, _ = _run(cluster, _graph(16, matrix=matrix), "per_pair")
    auto, a_fabric = _run(cluster, _graph(16, matrix=matrix), "auto")
    assert a_fabric.network.flows_started <= 4
    assert auto.step_time_s == pytest.approx(per_pair.step_time_s, rel=1e-9)
    _same_traffic(auto, per_pair)
    # Across leaves (shared 2:1 uplinks) auto keeps the waves.
    matrix = _zipf_matrix(32, 256, 1.0)
    grouped, _ = _run(cluster, _graph(32, matrix=matrix), "grouped")
    auto, _ = _run(cluster, _graph(32, matrix=matrix), "auto")
    assert auto.step_time_s == grouped.step_time_s


def test_an_all_to_all_over_too_many_ranks_is_refused_in_one_line(monkeypatch):
    # n(n-1) transfers: memory grows as ranks squared, so past the limit it is an error, not an OOM or a hang.
    monkeypatch.setattr(simulator.fabric, "MAX_ALL_TO_ALL_RANKS", 16)
    cluster = leaf_spine("H100", **ONE_LEAF)
    with pytest.raises(ValueError, match=r"^all_to_all: 32 ranks make 992 transfers; the most .* is 16 ranks"):
        _run(cluster, _graph(32, 2**20), "auto")


def test_a_size_sweep_plans_a_uniform_all_to_all_once_per_protocol(monkeypatch):
    # `clustersim collective` builds a fabric per size; the plan depends on sizes only through the protocol.
    import simulator.bulk_alltoall as bulk

    planned = []
    layout = bulk._layout
    monkeypatch.setattr(bulk, "_layout", lambda *args, **kw: planned.append(1) or layout(*args, **kw))
    cluster = leaf_spine("H100", **TWO_PER_LEAF)
    times = [_run(cluster, _graph(32, size), "bulk")[0].step_time_s for size in (2**24, 2**26, 2**28)]
    assert len(planned) == 1  # Simple protocol throughout (chunks > 16 KiB)
    fresh = [_run(leaf_spine("H100", **TWO_PER_LEAF), _graph(32, size), "bulk")[0].step_time_s
             for size in (2**24, 2**26, 2**28)]
    assert times == fresh and len(planned) == 4  # a new cluster (graph) is planned afresh



def test_an_alltoallv_layout_is_kept_per_group_and_weighted_by_each_calls_sizes(monkeypatch):
    # Two alltoallvs over one group, one after the other in one step, with the same senders but other sizes:
    # laid out once, and each moves its own bytes and takes its own time, as each does alone on a fresh cluster.
    import simulator.bulk_alltoall as bulk
    from workloads.ops import OpGraph

    laid_out = []
    layout = bulk._layout
    monkeypatch.setattr(bulk, "_layout", lambda *args, **kw: laid_out.append(1) or layout(*args, **kw))
    a, b = _zipf_matrix(16, 256, 1.0, seed=1), _zipf_matrix(16, 256, 0.3, seed=2)
    assert (a > 0).all() and (b > 0).all() and not np.array_equal(a, b)  # premise: same senders
    g = OpGraph(16)
    for m in (a, b):
        for i in range(16):
            g.collective_op(i, "all_to_all", list(range(16)), 0, split=tuple(m[i]), traffic_class="ep")
    both, fabric = _run(leaf_spine("H100", **TWO_PER_LEAF), g, "bulk")
    assert len(laid_out) == 1
    alone = [_run(leaf_spine("H100", **TWO_PER_LEAF), _graph(16, matrix=m), "bulk") for m in (a, b)]
    assert both.step_time_s == pytest.approx(alone[0][0].step_time_s + alone[1][0].step_time_s, rel=1e-12)
    expected = alone[0][1].network.ledger.bytes + alone[1][1].network.ledger.bytes
    assert fabric.network.ledger.bytes == pytest.approx(expected, rel=1e-12, abs=1e-3)


@pytest.mark.parametrize("ep, mode, routing, moe, one_switch, noted", [
    (64, "auto", "zipf", True, False, True), (32, "grouped", "uniform", True, False, True),
    (64, "per_pair", "zipf", True, True, True),    # asked for one flow per pair
    (64, "auto", "zipf", True, True, False),       # auto runs it in bulk, exactly, under one switch
    (16, "auto", "zipf", True, False, False),      # small EP groups: one flow per pair is cheap
    (64, "bulk", "zipf", True, False, False),      # already at most 4 flows per exchange
    (64, "auto", "balanced", True, False, False),  # equal sizes: grouped merges them into waves
    (64, "auto", "zipf", False, False, False)])
def test_a_note_names_the_knob_when_moe_exchanges_will_take_long(ep, mode, routing, moe, one_switch, noted):
    from simulator.bulk_alltoall import slow_alltoallv_note

    note = slow_alltoallv_note(ep, mode, routing, moe, one_switch)
    assert (note is not None) == noted
    if noted:
        assert f"{ep * (ep - 1):,} per exchange" in note and "network.all_to_all: bulk" in note and "\n" not in note


def test_clustersim_run_prints_the_note_on_stderr_before_simulating(tmp_path, monkeypatch, capsys):
    import simulator.bulk_alltoall as bulk
    from simulator.cli import main

    monkeypatch.setattr(bulk, "SLOW_ALLTOALLV_RANKS", 4)  # so that a 4-GPU EP group counts
    path = tmp_path / "moe.yaml"
    path.write_text("""
cluster: {preset: dgx-h100, nodes: 1, gpus_per_node: 4}
model: {name: tiny-moe, layers: 2, hidden: 256, heads: 4, kv_heads: 4, ffn_hidden: 1024, vocab: 1000,
        gated_mlp: true, tied_embeddings: false, experts: 4, top_k: 2, moe_ffn_hidden: 256, max_seq_len: 256}
parallel: {tp: 1, pp: 1, dp: 4, ep: 4, micro_batch: 1, global_batch: 4}
training: {seq_len: 256}
moe: {routing: zipf}
network: {all_to_all: grouped}
""")
    assert main(["run", str(path)]) == 0
    err = capsys.readouterr().err
    assert err.count("clustersim: note: EP-4 all-to-alls") == 1 and "12 per exchange" in err


def test_one_alltoallv_matrix_over_isomorphic_groups_is_weighed_once_and_each_group_moves_its_own(monkeypatch):
    # Two EP groups laid out alike (two servers each, under one leaf) exchange the same matrix at once (as the
    # replicas of one EP group do): the sizes are weighed once and shared, and each group moves what it moves
    # alone on a fresh cluster (their links are disjoint, so bytes and time are exactly the lone group's).
    import simulator.bulk_alltoall as bulk
    from workloads.ops import OpGraph

    filled = []
    fill = bulk._fill
    monkeypatch.setattr(bulk, "_fill", lambda *args, **kw: filled.append(1) or fill(*args, **kw))
    m = _zipf_matrix(8, 256, 1.0, seed=3)
    groups = [(0, 1, 2, 3, 8, 9, 10, 11), (16, 17, 18, 19, 24, 25, 26, 27)]

    def graph(chosen):
        g = OpGraph(32)
        for group in chosen:
            for i, rank in enumerate(group):
                g.collective_op(rank, "all_to_all", list(group), 0, split=tuple(m[i]), traffic_class="ep")
        return g

    both, fabric = _run(leaf_spine("H100", **ONE_LEAF), graph(groups), "bulk")
    assert len(filled) == 1
    weights = [[fabric.network.weights_of(links) for links, *_ in fabric.phases(
        "all_to_all", g, 0, "auto", 1, tuple(tuple(row) for row in m))[0]] for g in groups]
    assert all(a is b and a is not None for a, b in zip(*weights)) and len(weights[0]) >= 2
    alone = [_run(leaf_spine("H100", **ONE_LEAF), graph([g]), "bulk") for g in groups]
    assert both.step_time_s == alone[0][0].step_time_s == alone[1][0].step_time_s
    expected = alone[0][1].network.ledger.bytes + alone[1][1].network.ledger.bytes
    assert (fabric.network.ledger.bytes == expected).all()
