"""``network.replica_sends``: a representative's send, which stands for one send per replica, as one flow.

A representative rank (``fidelity: fast`` or ``lockstep``) issues one send for the sends of all the ranks it
stands for; they start together and it goes on when the last has arrived. ``merged`` (default) runs them as
one flow over all their routes at the pace of the most constrained; ``each`` as one flow per replica pair.
The expected times below are worked by hand from the time one send takes alone on the same fabric.
"""

import pytest
import simpy

from simulator.engine import Engine
from simulator.experiment import ConfigError, experiment_from_dict, run_experiment, unused_settings
from simulator.fabric import Fabric, NetworkConfig
from topologies.builders import leaf_spine
from workloads.ops import OpGraph

S = 2.0**28  # 256 MiB: one protocol (Simple) and one latency for every send here


@pytest.fixture
def one_leaf():
    """Three 8-GPU H100 servers on one leaf: every GPU's NIC port is a link of its own each way."""
    return leaf_spine("H100-SXM", servers=3, servers_per_leaf=3)


def _flows(cluster, replica_sends: str, pairs: dict[str, tuple[tuple[int, ...], tuple[int, ...]]],
           nbytes: float = S, routing: str = "ecmp", sizes: dict[str, float] | None = None) -> dict[str, float]:
    """Start the sends ``name -> (srcs, dsts)`` together (one representative's send per name: its replicas'
    pairs ``(srcs[i], dsts[i])``, ``nbytes`` each unless ``sizes`` says) and return when each ended, in
    seconds."""
    env = simpy.Environment()
    fabric = Fabric(env, cluster, NetworkConfig(replica_sends=replica_sends, routing=routing))
    ends: dict[str, float] = {}
    for name, (srcs, dsts) in pairs.items():
        specs = fabric.replica_send_specs(srcs, dsts, (sizes or {}).get(name, nbytes))
        fabric.network.start_flows(specs, "pp", lambda name=name: ends.__setitem__(name, env.now))
    env.run()
    return ends


def _alone(cluster) -> tuple[float, float]:
    """``(latency, seconds per S)`` of one send between servers, alone: from sends of S and 2S."""
    one = _flows(cluster, "each", {"a": ((0,), (8,))})["a"]
    two = _flows(cluster, "each", {"a": ((0,), (8,))}, 2 * S)["a"]
    return one - (two - one), two - one


def test_merged_is_one_flow_over_every_replica_route(one_leaf):
    fabric = Fabric(simpy.Environment(), one_leaf)
    specs = fabric.replica_send_specs((0, 1, 2), (8, 9, 10), S)
    each = fabric.send_specs((0, 1, 2), (8, 9, 10), S)
    assert len(specs) == 1 and len(each) == 3
    links, wire, latency, payload = specs[0]
    assert sorted(links.tolist()) == sorted(x for s in each for x in s[0].tolist())
    assert wire == each[0][1] and latency == max(s[2] for s in each)
    assert payload == 3 * S  # every replica's bytes


def test_symmetric_replicas_finish_as_each_would(one_leaf):
    # Three replica sends on disjoint ports, nothing else: each runs as it would alone.
    latency, t = _alone(one_leaf)
    pairs = {"rep": ((0, 1, 2), (8, 9, 10))}
    assert _flows(one_leaf, "merged", pairs)["rep"] == pytest.approx(latency + t, rel=1e-12)
    assert _flows(one_leaf, "each", pairs)["rep"] == pytest.approx(latency + t, rel=1e-12)


def test_asymmetric_contention_paces_the_merged_flow_by_the_slowest_replica(one_leaf):
    # The representative stands for 0 -> 8 and 1 -> 9. Two other sends enter GPU 8's port (16 -> 8,
    # 17 -> 8) and one enters GPU 9's (18 -> 9), all S bytes at once.
    # each: port 8 shares three ways (c/3): 0 -> 8 ends after 3t; port 9 two ways: 1 -> 9 and y after 2t.
    #       The representative waits for 0 -> 8: 3t.
    # merged: the merged flow is capped at c/3 by port 8, so on port 9 it uses c/3 and y gets 2c/3 (1.5t);
    #       the representative still ends after 3t.
    latency, t = _alone(one_leaf)
    pairs = {"rep": ((0, 1), (8, 9)), "x1": ((16,), (8,)), "x2": ((17,), (8,)), "y": ((18,), (9,))}
    each = _flows(one_leaf, "each", pairs)
    merged = _flows(one_leaf, "merged", pairs)
    assert each["rep"] == pytest.approx(latency + 3 * t, rel=1e-9)
    assert merged["rep"] == pytest.approx(latency + 3 * t, rel=1e-9)
    assert each["y"] == pytest.approx(latency + 2 * t, rel=1e-9)
    assert merged["y"] == pytest.approx(latency + 1.5 * t, rel=1e-9)  # the documented deviation
    for name in ("x1", "x2"):
        assert each[name] == merged[name] == pytest.approx(latency + 3 * t, rel=1e-9)


def test_replicas_of_unlike_routes_are_merged_by_kind():
    # Four servers, two per leaf: 0 -> 8 stays under its leaf, 1 -> 16 crosses the spines. Under spray the
    # second splits over 2 paths (its wire bytes are half the first's); merged with the first at unequal
    # weights it would compete for the spine-side links as one path where its competitor (9 -> 16, 2S)
    # competes as two. Merged, each kind runs as its own flow: exactly what one flow per pair gives.
    cluster = leaf_spine("H100-SXM", servers=4, servers_per_leaf=2, spines=2)
    pairs = {"rep": ((0, 1), (8, 16)), "comp": ((9,), (16,))}
    for routing in ("ecmp", "spray"):
        each = _flows(cluster, "each", pairs, routing=routing, sizes={"comp": 2 * S})
        merged = _flows(cluster, "merged", pairs, routing=routing, sizes={"comp": 2 * S})
        assert merged == pytest.approx(each, rel=1e-12), routing
    fabric = Fabric(simpy.Environment(), cluster, NetworkConfig(routing="spray"))
    assert len(fabric.replica_send_specs((0, 1, 2, 3), (8, 16, 9, 17), S)) == 2  # one flow per kind


def test_replicas_inside_a_server_and_across_servers_keep_their_own_latency(one_leaf):
    fabric = Fabric(simpy.Environment(), one_leaf)
    specs = fabric.replica_send_specs((0, 1, 2), (3, 9, 10), S)  # 0 -> 3 over NVLink, the others over NICs
    each = fabric.send_specs((0, 1, 2), (3, 9, 10), S)
    assert len(specs) == 2
    assert sorted(s[2] for s in specs) == sorted({s[2] for s in each})
    pairs = {"rep": ((0, 1, 2), (3, 9, 10))}
    assert _flows(one_leaf, "merged", pairs) == pytest.approx(_flows(one_leaf, "each", pairs), rel=1e-12)


def test_analytic_model_keeps_replica_sends_apart(one_leaf):
    fabric = Fabric(simpy.Environment(), one_leaf, NetworkConfig(model="analytic"))
    assert len(fabric.replica_send_specs((0, 1), (8, 9), S)) == 2


def test_a_lockstep_step_moves_the_same_bytes_either_way():
    # 4 stages on 4 servers, DP 8: a representative per stage stands for 8 ranks; its sends cross servers.
    doc = {"cluster": {"preset": "dgx-h100", "nodes": 4}, "model": {"preset": "gpt2-small"},
           "parallel": {"tp": 1, "pp": 4, "dp": 8, "micro_batch": 1, "global_batch": 32},
           "training": {"seq_len": 1024}}
    runs = {}
    for mode in ("merged", "each"):
        exp = experiment_from_dict({**doc, "network": {"replica_sends": mode}})
        runs[mode] = run_experiment(exp, fidelity="lockstep")
    full = run_experiment(experiment_from_dict(doc), fidelity="full")
    merged, each = runs["merged"], runs["each"]
    assert merged.record.fabric.network.flows_started < each.record.fabric.network.flows_started  # it merged
    assert merged.summary["flows"] == each.summary["flows"] == full.summary["flows"]
    for cls, b in full.bytes_by_class.items():
        assert merged.bytes_by_class[cls] == pytest.approx(b, rel=1e-12)
    # every GPU pair and every link carries its own bytes in the merged flow
    for level in ("gpu", "node"):
        assert (merged.traffic_matrix(level) - full.traffic_matrix(level)).abs().to_numpy().max() <= \
            1e-9 * full.traffic_matrix(level).to_numpy().max()
    link_bytes = {(u, v): b for u, v, b in zip(full.links["src"], full.links["dst"], full.links["bytes"])}
    for u, v, b in zip(merged.links["src"], merged.links["dst"], merged.links["bytes"]):
        assert b == pytest.approx(link_bytes[u, v], rel=1e-12, abs=1e-6)
    # symmetric: every stage's replicas cross their own NIC ports under one leaf
    assert merged.step_time == pytest.approx(each.step_time, rel=1e-12)
    assert merged.step_time == pytest.approx(full.step_time, rel=1e-9)


def test_unknown_value_is_a_one_line_error():
    with pytest.raises(ValueError, match=r"network.replica_sends: 'both' unknown; valid: merged, each"):
        NetworkConfig(replica_sends="both")
    with pytest.raises((ConfigError, ValueError), match="network.replica_sends"):
        experiment_from_dict({"cluster": {"preset": "dgx-h100", "nodes": 1}, "model": {"preset": "gpt2-small"},
                              "training": {"seq_len": 1024}, "network": {"replica_sends": 3}})


def test_without_representatives_the_setting_is_reported_unused():
    doc = {"cluster": {"preset": "dgx-h100", "nodes": 1}, "model": {"preset": "gpt2-small"},
           "training": {"seq_len": 1024}, "network": {"replica_sends": "each"}, "fidelity": "full"}
    exp = experiment_from_dict(doc)
    assert any("network.replica_sends has no effect" in n for n in unused_settings(exp))
    assert not any("replica_sends" in n for n in unused_settings(exp, "lockstep"))  # run --fidelity lockstep
    doc["fidelity"] = "lockstep"
    exp = experiment_from_dict(doc)
    assert not any("replica_sends" in n for n in unused_settings(exp))
    assert any("replica_sends" in n for n in unused_settings(exp, "full"))
    # fast stands a representative for its TP members only: at TP 1 there are no replicas to send for
    doc["fidelity"] = "fast"
    doc["parallel"] = {"tp": 1, "dp": 8}
    notes = [n for n in unused_settings(experiment_from_dict(doc)) if "replica_sends" in n]
    assert len(notes) == 1 and "fidelity fast at tp 1" in notes[0]
    # lockstep's representative stands for its stage's DP x CP x TP block: with CP alone it has replicas
    cp_only = {**doc, "cluster": {"preset": "dgx-h100", "nodes": 1, "gpus_per_node": 4},
               "parallel": {"tp": 1, "cp": 2, "pp": 2, "dp": 1}}
    assert not any("replica_sends" in n for n in unused_settings(experiment_from_dict(cp_only), "lockstep"))
    one_gpu = {**doc, "cluster": {"preset": "dgx-h100", "nodes": 1, "gpus_per_node": 1}, "parallel": {"dp": 1}}
    assert any("replica_sends" in n for n in unused_settings(experiment_from_dict(one_gpu), "lockstep"))
    doc["parallel"] = {"tp": 2, "dp": 4}
    assert not any("replica_sends" in n for n in unused_settings(experiment_from_dict(doc)))


def test_engine_uses_the_merged_flow(one_leaf):
    # A representative graph: rank 0 stands for ranks 0-7, rank 8 for 8-15 (a send between servers).
    g = OpGraph(24)
    g.replicas = {0: tuple(range(8)), 8: tuple(range(8, 16))}
    g.send(0, peer=8, nbytes=S)
    g.recv(8, peer=0, nbytes=S)
    merged = Engine(g, one_leaf).run()
    each = Engine(g, one_leaf, network=NetworkConfig(replica_sends="each")).run()
    assert merged.fabric.network.flows_started == 1 and each.fabric.network.flows_started == 8
    assert merged.step_time_s == pytest.approx(each.step_time_s, rel=1e-12)
