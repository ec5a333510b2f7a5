"""Node-limited routing (DeepSeek-V3 section 2.1.2: each token's experts on at most M nodes) under DeepEP's
node-aggregated dispatch, against hand-worked expectations."""

import numpy as np
import pytest
from test_moe_details import MOE, D, H, doc, step_of

from simulator.experiment import experiment_from_dict, run_experiment
from workloads.errors import ConfigError
from workloads.moe import RoutingModel, deepep_matrices, node_limited_shares, route_layer, routing_from_dict


def _first_hop(max_nodes, routing="balanced"):
    moe = {"routing": routing, "dispatch": "deepep", "max_nodes": max_nodes}
    st = step_of(doc(ep=16, dp=16, nodes=2, moe=moe, model={"experts": 16}))
    ops = {o.name.split(".")[-1]: o for o in st.graph.ops if o.rank == 0 and o.name.startswith("F0.c0.L0.")}
    return ops["ep_dispatch"].split, ops["ep_forward"].split


def test_one_node_per_token_crosses_the_network_at_most_once():
    # 2 nodes x 8 GPUs, EP 16 over 16 experts, top-2, balanced: rank 0 routes T = 1024 tokens, 128 choices to
    # every EP rank. With max_nodes 1 both choices of a token lie on one node: the other node for half the
    # tokens, so 512 tokens cross (T (N - 1) / N). On the chosen node a token's 2 distinct experts are 2 of
    # its 8 GPUs (one expert each): a GPU is reached with probability 2/8, 512 x 1/4 = 128 tokens per GPU,
    # directly on the own node and forwarded over NVLink on the other (120 = 512 x (1 - (7/8)^2) until
    # 2026-12-05, while a token's choices were independent draws).
    per_token = H * D
    first, fwd = _first_hop(1)
    assert first[8] == pytest.approx(512 * per_token) and sum(first[9:]) == 0
    assert first[1:8] == pytest.approx([128 * per_token] * 7)
    assert fwd[1:8] == pytest.approx([128 * per_token] * 7) and sum(fwd[8:]) == 0
    r = run_experiment(experiment_from_dict(doc(ep=16, dp=16, nodes=2, model={"experts": 16},
                                                moe={"routing": "balanced", "dispatch": "deepep", "max_nodes": 1})))
    m = r.traffic_matrix(level="node", traffic_class="ep").to_numpy()
    # 2 layers x 4 all-to-alls (dispatch, combine and their gradients) x 16 ranks x 512 tokens
    assert float(m.sum() - np.trace(m)) == pytest.approx(MOE["layers"] * 4 * 16 * 512 * per_token, rel=1e-9)


@pytest.mark.parametrize("routing", ["uniform", "balanced"])
def test_as_many_nodes_as_the_group_is_unlimited(routing):
    assert _first_hop(2, routing) == _first_hop(None, routing) == _first_hop(64, routing)


def test_inter_node_copies_under_uniform_routing():
    # EP 32 on 4 nodes of 8, 64 experts, top-8, 4096 tokens per rank, drawn uniformly; at most M = 2 nodes.
    # Hand expectation: a token's 2 nodes are a uniform pair, its 8 choices spread evenly over them, so it
    # reaches M (1 - (1 - 1/M)^k) = 2 (1 - 2^-8) nodes, (N - 1) / N of them remote: 1.494 inter-node copies
    # per token, a fraction 1.494 / 3 of the (token, remote node) pairs (unlimited: 3 (1 - (3/4)^8) = 2.70).
    ep, k, tokens, nodes_n, m = 32, 8, 4096, 4, 2
    r = route_layer(64, k, tokens, ep, RoutingModel("uniform"))
    node_of = [j // 8 for j in range(ep)]
    first, _fwd = deepep_matrices(r.rank_matrix(), np.full(ep, 1 / ep), k, node_of, m)
    remote = sum(first[i, j] for i in range(ep) for j in range(ep) if node_of[i] != node_of[j])
    expected = (nodes_n - 1) / nodes_n * m * (1 - (1 - 1 / m) ** k)
    assert remote / (ep * tokens) == pytest.approx(expected, rel=0.01)
    assert remote / (ep * tokens * (nodes_n - 1)) == pytest.approx(expected / 3, rel=0.01)
    unlimited, _ = deepep_matrices(r.rank_matrix(), np.full(ep, 1 / ep), k, node_of)
    remote_unlimited = sum(unlimited[i, j] for i in range(ep) for j in range(ep) if node_of[i] != node_of[j])
    assert remote_unlimited / (ep * tokens) == pytest.approx(3 / 4 * 4 * (1 - (3 / 4) ** k), rel=0.01)


def test_shares_select_m_nodes_on_average():
    # A node is among a token's M nodes with probability p_n / share_n; these sum to M for any node
    # probabilities, and none exceeds 1.
    p = 1 / np.arange(1, 9) ** 1.2
    p /= p.sum()
    for m in (1, 2, 4, 7):
        chosen = p / node_limited_shares(p, m)
        assert chosen.sum() == pytest.approx(m) and chosen.max() <= 1 + 1e-12
    assert node_limited_shares(p, 8).tolist() == p.tolist()
    assert node_limited_shares(np.full(8, 1 / 8), 4).tolist() == [0.25] * 8


@pytest.mark.parametrize("value", [0, -1, 2.5, "4", True, 1 << 21])
def test_bad_max_nodes_one_line(value):
    with pytest.raises(ConfigError) as e:
        routing_from_dict({"max_nodes": value})
    assert str(e.value).startswith("moe.max_nodes") and "\n" not in str(e.value)


def test_max_nodes_listed_and_defaults_unlimited():
    assert routing_from_dict({}).max_nodes is None and routing_from_dict({"max_nodes": 4}).max_nodes == 4
    with pytest.raises(ConfigError, match="max_nodes"):
        routing_from_dict({"max_node": 4})


def test_deepep_ep64_bandwidth_with_the_node_limit():
    # DeepEP's V1 table (docs/legacy.md; H800, one CX7 400 Gb/s NIC per GPU) was measured with at most 4 nodes
    # per token: 51 GB/s RDMA bottleneck bandwidth at EP 64 (8 nodes), 4096 tokens per rank, top-8, FP8
    # (7168 bytes per token). DeepEP counts tokens x distinct destination nodes (own node included) over the
    # dispatch time; under the limit a token reaches M (1 - (1 - 1/M)^k) nodes (uniform routing).
    from simulator.engine import Engine
    from topologies import build_cluster
    from workloads.ops import OpGraph
    ep, tokens, k, nbytes, m = 64, 4096, 8, 7168.0, 4
    first, fwd = deepep_matrices(np.full((ep, ep), tokens * k / ep), np.full(ep, 1 / ep), k,
                                 [r // 8 for r in range(ep)], m)
    g = OpGraph(ep)
    for i in range(ep):
        g.collective_op(i, "all_to_all", list(range(ep)), 0, split=tuple(first[i] * nbytes), traffic_class="ep")
        g.collective_op(i, "all_to_all", list(range(ep)), 0, split=tuple(fwd[i] * nbytes), traffic_class="ep",
                        stream="ep_forward")
    t = Engine(g, build_cluster({"preset": "dgx-h800", "nodes": ep // 8})).run().step_time_s
    bandwidth = tokens * m * (1 - (1 - 1 / m) ** k) * nbytes / t / 1e9
    assert bandwidth == pytest.approx(51.0, rel=0.1)   # simulated: 53.7 GB/s (51.1 when written, 2026-12-02)
