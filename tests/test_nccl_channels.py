"""NCCL runs a small ring or tree collective on fewer channels (``network.channels: nccl``).

Truth: NCCL's own loop (``topoGetAlgoInfo``, ``src/enqueue.cc``, NCCL 2.30), transcribed below as it is written
(``while (nBytes < nc * nt * threadThreshold) nc--``) with its constants (``NCCL_*_MAX_NTHREADS``,
``NCCL_*_THREAD_THRESHOLD``, the ring's LL threshold times the ranks: ``src/graph/tuning.cc``); the channels of
NCCL's double binary tree (``connectTrees``: the first half of the channels runs one tree, the second half
the mirror); and bytes per NIC worked by hand.
"""

from dataclasses import replace

import pytest
import simpy

from simulator.collectives import plan_collective
from simulator.compute import ComputeModel
from simulator.engine import Engine
from simulator.experiment import experiment_from_dict, unused_settings
from simulator.fabric import Fabric, NetworkConfig
from simulator.nccl import collective_channels
from topologies import leaf_spine
from workloads.ops import OpGraph

NT = {"LL": 512, "LL128": 640, "Simple": 512}  # NCCL_LL_MAX_NTHREADS, NCCL_LL128_MAX_NTHREADS, NCCL_SIMPLE_...
THRESHOLD = {"LL": 8, "LL128": 8, "Simple": 64}  # NCCL_LL_THREAD_THRESHOLD, ..._LL128_..., ..._SIMPLE_...


def nccl_loop(algorithm, protocol, nbytes, ranks, comm_channels):
    """``topoGetAlgoInfo``'s ring/tree branch, line by line (integer bytes, as NCCL's size_t)."""
    nc = comm_channels
    nt = NT[protocol]
    threshold = THRESHOLD[protocol] * (ranks if algorithm == "ring" and protocol == "LL" else 1)
    while nbytes < nc * nt * threshold:
        if nc >= 2:
            nc -= 1
        else:
            break
    return nc


@pytest.mark.parametrize("algorithm", ["ring", "tree"])
@pytest.mark.parametrize("protocol", ["LL", "LL128", "Simple"])
@pytest.mark.parametrize("ranks", [2, 16, 1024])
def test_the_channel_count_is_nccls_loop(algorithm, protocol, ranks):
    sizes = [1, 4, 4095, 4096, 5119, 5120, 32767, 32768, 65536, 98303, 262144, 1 << 20, 3 << 22, 1 << 30]
    sizes += [k * NT[protocol] * THRESHOLD[protocol] * ranks + d for k in (1, 3, 16) for d in (-1, 0, 1)]
    for nbytes in sizes:
        for width in (1, 8, 16, 32):  # the communicator's channels cap NCCL's loop; the caller applies the cap
            assert min(width, collective_channels(algorithm, protocol, nbytes, ranks)) == \
                nccl_loop(algorithm, protocol, nbytes, ranks, width), (nbytes, width)


def test_other_algorithms_keep_their_channels():
    assert collective_channels("direct", "Simple", 4, 8) is None
    assert collective_channels("hierarchical", "LL", 4, 8) is None


def _servers(n_servers, per_server):
    return lambda r: r // per_server


def test_a_small_ring_keeps_nccls_first_channels_and_conserves_bytes():
    # 4 servers of 4: four rings, one entering each server at member c. 64 KiB under Simple -> 2 channels.
    server_of = _servers(4, 4)
    group = tuple(range(16))
    full = plan_collective("all_reduce", group, 65536.0, server_of, "ring")
    cut = plan_collective("all_reduce", group, 65536.0, server_of, "ring", channels=2)
    assert [t.label for t in full.phases[0]] == [0, 1, 2, 3]
    assert [t.label for t in cut.phases[0]] == [0, 1]
    assert cut.phases[0] == tuple(replace(t, nbytes=t.nbytes * 2) for t in full.phases[0][:2])
    assert sum(t.nbytes for t in cut.phases[0]) == pytest.approx(sum(t.nbytes for t in full.phases[0]))
    # every ring step of the cut plan (fidelity full) moves S/(n·2), over the two rings only
    steps = plan_collective("all_reduce", group, 65536.0, server_of, "ring", "full", channels=2)
    assert len(steps.phases) == 2 * 15 and all(len(p) == 2 * 16 for p in steps.phases)
    assert {t.nbytes for p in steps.phases for t in p} == {65536.0 / 16 / 2}


def test_a_small_tree_takes_the_first_tree_of_the_pair_first():
    # 4 servers of 4: rails 0..3, two mirrored trees; the full plan's transfer c is (rail c // 2, tree c % 2).
    server_of = _servers(4, 4)
    group = tuple(range(16))
    full = plan_collective("all_reduce", group, 1 << 20, server_of, "tree")
    assert [t.label for t in full.phases[0]] == list(range(8))
    by_label = {t.label: t for t in full.phases[0]}
    for channels, labels in ((1, [0]), (2, [0, 2]), (4, [0, 2, 4, 6]), (5, [0, 1, 2, 4, 6]), (8, list(range(8)))):
        cut = plan_collective("all_reduce", group, 1 << 20, server_of, "tree", channels=channels)
        assert [t.label for t in cut.phases[0]] == labels
        for t in cut.phases[0]:  # the same tree as the full plan's, carrying S / channels
            assert t.hops == by_label[t.label].hops and t.nbytes == (1 << 20) / channels


def _nic_bytes_out(cluster, n, size, channels, algorithm="ring"):
    graph = OpGraph(n)
    graph.collective("all_reduce", list(range(n)), size, algorithm=algorithm, traffic_class="dp")
    record = Engine(graph, cluster, network=NetworkConfig(channels=channels)).run()
    fabric = record.fabric
    moved = fabric.network.ledger.bytes
    out = {u: float(moved[i]) for i, (u, v) in enumerate(fabric.links) if u[0] == "nic" and v[0] == "leaf"}
    return out, record.step_time_s


def test_a_gradient_norm_all_reduce_leaves_each_server_through_one_nic():
    # 4 servers of 8 H100s, a 4-byte all-reduce (fp32 norm): one channel -> one NIC per server carries it.
    c = leaf_spine("H100", servers=4, servers_per_leaf=2)
    nccl, t_nccl = _nic_bytes_out(c, 32, 4.0, "nccl")
    every, t_every = _nic_bytes_out(c, 32, 4.0, "every_rail")
    busy = sorted(nic for nic, b in nccl.items() if b > 0)
    assert busy == [("nic", s, 0) for s in range(4)]  # ("nic", server, rail): rail 0 of each of the 4 servers
    assert sum(b > 0 for b in every.values()) == 32
    assert sum(nccl.values()) == pytest.approx(sum(every.values()))  # the same bytes, on fewer NICs
    # latency-bound: the same time to well under a percent, and never faster on fewer channels
    assert t_every <= t_nccl <= t_every * 1.01


def test_large_collectives_are_unchanged():
    c = leaf_spine("H100", servers=4, servers_per_leaf=2)
    for algorithm in ("ring", "tree"):
        nccl, t_nccl = _nic_bytes_out(c, 32, float(1 << 26), "nccl", algorithm)
        every, t_every = _nic_bytes_out(c, 32, float(1 << 26), "every_rail", algorithm)
        assert nccl == every and t_nccl == t_every


def _beside_small_all_reduce(size, channels, comm_sms=24):
    """Rank 0 computes 10 ms while a ``size``-byte ring all-reduce over two servers' 16 GPUs runs beside it."""
    c = leaf_spine("H100", servers=2, servers_per_leaf=2)
    graph = OpGraph(16)
    a = graph.compute(0, duration_s=10e-3, category="fixed", name="a")
    ar = graph.collective("all_reduce", list(range(16)), size, algorithm="ring", stream="dp")[0]
    r = Engine(graph, c, ComputeModel(c.gpu, comm_sms=comm_sms), NetworkConfig(channels=channels)).run()
    return r.end_s[a], r.end_s[ar] - r.start_s[ar]


@pytest.mark.parametrize("size, held", [(4.0, 1), (256 * 1024, 4), (1 << 20, 16), (2 << 20, 24)])
def test_a_cut_collective_holds_one_sm_per_channel_beside_compute(size, held):
    # NCCL launches one CTA per channel. An LL ring over 16 ranks needs 512 threads x 8 B x 16 = 64 KiB a
    # channel: 4 B runs 1 channel, 256 KiB 4, 1 MiB 16, 2 MiB 32 -- more SMs than comm_sms = 24, so 24.
    # A 10 ms op overlapping T s of a collective holding h SMs of S = 132 ends at 10 ms + T h / S.
    c = leaf_spine("H100", servers=2, servers_per_leaf=2)
    _plan, protocol = Fabric(simpy.Environment(), c, NetworkConfig()).choose("all_reduce", tuple(range(16)),
                                                                               size, "ring")
    assert protocol == "LL"  # (the premise: the tuner's pick at these sizes)
    end, t = _beside_small_all_reduce(size, "nccl")
    assert 0 < t < 10e-3
    assert end == pytest.approx(10e-3 + t * held / 132, rel=1e-12)
    old_end, old_t = _beside_small_all_reduce(size, "every_rail")  # every rail: the whole comm_sms, as before
    assert old_end == pytest.approx(10e-3 + old_t * 24 / 132, rel=1e-12)
    assert _beside_small_all_reduce(size, "nccl", comm_sms=0)[0] == 10e-3


def test_every_rail_is_the_old_plan_and_the_knob_is_checked():
    c = leaf_spine("H100", servers=2, servers_per_leaf=2)
    group = tuple(range(16))
    cut = Fabric(simpy.Environment(), c, NetworkConfig()).plan("all_reduce", group, 4.0, "ring")
    old = Fabric(simpy.Environment(), c, NetworkConfig(channels="every_rail")).plan("all_reduce", group, 4.0, "ring")
    assert len(cut.phases[0]) == 1 and len(old.phases[0]) == 8
    assert old == plan_collective("all_reduce", group, 4.0, c.server_of, "ring")
    with pytest.raises(ValueError, match=r"network\.channels: 'some' unknown; valid: nccl, every_rail"):
        NetworkConfig(channels="some")


def test_the_experiment_file_reads_channels_and_names_a_bad_value():
    doc = {"cluster": {"preset": "dgx-h100", "nodes": 2}, "model": {"preset": "gpt2-small"},
           "parallel": {"tp": 4, "pp": 1, "dp": 4, "micro_batch": 1, "global_batch": 4},
           "training": {"seq_len": 1024}}
    assert experiment_from_dict(doc).network.channels == "nccl"
    assert experiment_from_dict({**doc, "network": {"channels": "every_rail"}}).network.channels == "every_rail"
    with pytest.raises(ValueError, match=r"^network\.channels: 'all' unknown; valid: nccl, every_rail$"):
        experiment_from_dict({**doc, "network": {"channels": "all"}})
    timed = experiment_from_dict({**doc, "network": {"channels": "nccl", "step_latency": "2us"}})
    assert any(n.startswith("network.channels has no effect") for n in unused_settings(timed))
    assert not any("channels" in n for n in unused_settings(experiment_from_dict({**doc, "network": {
        "channels": "every_rail"}})))
