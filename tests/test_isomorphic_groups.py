"""Collectives planned once per class of isomorphic groups (Fabric._group_class, Fabric._class_phases): a MoE
layer's expert-TP all-gathers come in one size per routing draw on every TP pair, and each pair's tuner choice
used to be worked out again. What a group gets from its class must be what planning it alone gives."""

from __future__ import annotations

import pytest
import simpy

from simulator.fabric import Fabric, NetworkConfig
from simulator.nccl import BANDWIDTH_FACTOR
from topologies import fat_tree, leaf_spine
from topologies.faults import apply_faults


def _cluster():
    """4 servers x 4 GPUs on 2 leaves (every server the same)."""
    return leaf_spine("H100-SXM", servers=4, gpus_per_server=4, servers_per_leaf=2, spines=2)


def _sick_cluster():
    """The same with GPU 2 of server 0 on a half-rate NVLink and one spine uplink at a quarter."""
    return apply_faults(_cluster(), [{"kind": "degraded_link", "link": ["gpu:0:2", "nvswitch:0"], "fraction": 0.5},
                                     {"kind": "degraded_link", "link": ["leaf:1", "spine:0"], "fraction": 0.25}])


def _pairs(c):
    """Two-rank TP groups, two in every server (the expert-TP pairs of an EP layout)."""
    return [(r, r + 1) for r in range(0, c.num_gpus, 2)]


def _count_choices(monkeypatch) -> list:
    """Record every call of Fabric.choose (the tuner: candidates planned and priced)."""
    calls: list = []
    original = Fabric.choose
    monkeypatch.setattr(Fabric, "choose", lambda self, kind, group, *a: calls.append(group)
                        or original(self, kind, group, *a))
    return calls


def test_isomorphic_pairs_share_one_tuner_choice_and_get_their_own_routes(monkeypatch):
    """Eight TP pairs on four identical servers, one all-gather size: the tuner runs for the first pair
    only (it ran for each of the eight); every pair's flow is the ring over its own two NVLink routes, hand-worked: the
    ring a->b->a as one transfer of S/2 (n-1 = 1 step of S/n), wire bytes S/2 over the chosen protocol's
    factor, payload S/2 on each of its 2 hops."""
    c = _cluster()
    fabric = Fabric(simpy.Environment(), c)
    calls = _count_choices(monkeypatch)
    size = 3 * 2**20
    got = {g: (fabric.channel_limit("all_gather", g, size), fabric.phases("all_gather", g, size)) for g in _pairs(c)}
    assert set(calls) == {(0, 1)}  # (channel_limit's and phases': the second is the first's, kept)
    _plan, protocol = fabric.choose("all_gather", (0, 1), size)
    for (a, b), (_limit, phases) in got.items():
        ((links, wire, _latency, payload),), = phases
        assert links.tolist() == fabric.route(a, b).tolist() + fabric.route(b, a).tolist()
        assert fabric.pairs_of(links) == ((a, b), (b, a))
        assert wire == size / 2 / BANDWIDTH_FACTOR[protocol] and payload == size / 2 * 2
    assert len({limit for limit, _phases in got.values()}) == 1
    assert len({phases[0][0][1:] for _limit, phases in got.values()}) == 1  # bytes and latency shared


def test_a_pair_through_a_degraded_nvlink_is_chosen_for_alone(monkeypatch):
    """On the faulted cluster the pair (2, 3) crosses the half-rate NVLink: its signature differs, so it is
    a class of its own and the tuner runs for it too (twice in all, not once); the healthy pairs share."""
    c = _sick_cluster()
    fabric = Fabric(simpy.Environment(), c)
    calls = _count_choices(monkeypatch)
    size = 3 * 2**20
    for g in _pairs(c):
        fabric.channel_limit("all_gather", g, size)
        fabric.phases("all_gather", g, size)
    assert sorted(set(calls)) == [(0, 1), (2, 3)]
    ids = {g: fabric._group_class("all_gather", g, size, "auto") for g in _pairs(c)}
    assert ids[(2, 3)] != ids[(0, 1)] and len({ids[g] for g in _pairs(c) if g != (2, 3)}) == 1


def _groups(c):
    per = c.gpus_per_server
    inside = [tuple(range(s * per, (s + 1) * per)) for s in range(c.num_gpus // per)]
    across = [tuple(range(i, c.num_gpus, per)) for i in range(per)]
    return _pairs(c) + inside + across + [(5, 4), (1, 6, 11)]


SIZES = [("all_gather", 2**28), ("all_gather", 5000), ("all_reduce", 2**30), ("all_reduce", 4096),
         ("all_reduce", 3 * 2**17), ("reduce_scatter", 2**20), ("broadcast", 2**16), ("reduce", 2**22)]


def _nic_down_cluster():
    """GPU 5 (server 1) has lost its NIC and borrows GPU 6's over NVLink: its pairs' routes between servers
    differ from the others'."""
    return apply_faults(_cluster(), [{"kind": "nic_down", "gpu": 5}])


@pytest.mark.parametrize("build", [_cluster, _sick_cluster, _nic_down_cluster,
                                   lambda: fat_tree("H100-SXM", servers=8, gpus_per_server=2, servers_per_leaf=2,
                                                    leaves_per_pod=2, spines=2, cores=4)])
@pytest.mark.parametrize("config", [NetworkConfig(), NetworkConfig(fidelity="full"), NetworkConfig(step_latency_s=5e-6),
                                    NetworkConfig(channels="every_rail")])
@pytest.mark.parametrize("algorithm", ["auto", "tree"])
def test_every_group_gets_what_planning_it_alone_gives(build, config, algorithm):
    """Every group's channel count and flows (links, wire bytes, latency, payload, the GPU pairs a flow
    carries), through one fabric that has seen the other groups first, equal those of a fresh fabric that
    plans that group alone (no class to share): healthy, faulted (a degraded NVLink and uplink; a NIC down)
    and fat-tree clusters, both fidelities,
    both latency models, forced trees, channel cuts, count 2."""
    c = build()
    shared = Fabric(simpy.Environment(), c, config)
    for kind, nbytes in SIZES:
        if algorithm == "tree" and kind not in ("all_reduce", "broadcast", "reduce"):
            continue
        for group in _groups(c):
            for count in (1, 2):
                fresh = Fabric(simpy.Environment(), c, config)
                assert shared.channel_limit(kind, group, nbytes, algorithm) == fresh.channel_limit(kind, group, nbytes,
                                                                                                   algorithm)
                got = shared.phases(kind, group, nbytes, algorithm, count)
                want = fresh.phases(kind, group, nbytes, algorithm, count)
                assert len(got) == len(want)
                for p, q in zip(got, want):
                    assert len(p) == len(q)
                    for a, b in zip(p, q):
                        assert a[0].tolist() == b[0].tolist() and a[1:] == b[1:]
                        assert shared.pairs_of(a[0]) == fresh.pairs_of(b[0])
    assert len(shared._class_ids) < len(shared._group_classes)  # classes were shared
