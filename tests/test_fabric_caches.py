"""The fabric's caches (issue 15: 131,072 GPUs) give what a fresh computation gives, faults included."""

from __future__ import annotations

import numpy as np
import pytest
import simpy

from simulator.collectives import Plan, plan_collective
from simulator.fabric import _SHAPE_HOPS, Fabric, NetworkConfig
from topologies import fat_tree, leaf_spine
from topologies.faults import apply_faults

KINDS = [("all_gather", 2**28), ("all_reduce", 2**30), ("all_reduce", 4096), ("reduce_scatter", 2**20)]


def _sick_cluster():
    """4 servers x 4 GPUs on 2 leaves; server 1's GPU 2 has a half-rate NVLink, one spine uplink is degraded."""
    c = leaf_spine("H100-SXM", servers=4, gpus_per_server=4, servers_per_leaf=2, spines=2)
    return apply_faults(c, [{"kind": "degraded_link", "link": ["gpu:1:2", "nvswitch:1"], "fraction": 0.5},
                            {"kind": "degraded_link", "link": ["leaf:1", "spine:0"], "fraction": 0.25}])


def _groups(c):
    per = c.gpus_per_server
    servers = c.num_gpus // per
    inside = [tuple(range(s * per, (s + 1) * per)) for s in range(servers)]  # TP-like groups, one per server
    across = [tuple(range(i, c.num_gpus, per)) for i in range(per)]  # DP-like groups, one per local index
    return inside + across


@pytest.mark.parametrize("build", [_sick_cluster, lambda: fat_tree("H100-SXM", servers=8, gpus_per_server=2,
                                                                      servers_per_leaf=2, leaves_per_pod=2,
                                                                      spines=2, cores=4)])
@pytest.mark.parametrize("config", [NetworkConfig(), NetworkConfig(routing="spray"),
                                    NetworkConfig(step_latency_s=5e-6)])
def test_cached_choices_equal_fresh_estimates(build, config):
    """Every group's choice through the shape cache equals the best of estimates computed from scratch on
    a fabric that has never seen another group; and isomorphic groups share one cache entry."""
    c = build()
    cached = Fabric(simpy.Environment(), c, config)
    for kind, nbytes in KINDS:
        for group in _groups(c):
            plan, protocol = cached.choose(kind, group, nbytes)
            fresh = Fabric(simpy.Environment(), c, config)
            best = None
            for a in ("ring", "tree") if kind == "all_reduce" else ("ring",):
                p = plan_collective(kind, group, nbytes, fresh.server_of, a, stagger=config.nccl_latency)
                for t, proto in zip(fresh._both_estimates(p, fresh.protocols(p))[0], fresh.protocols(p)):
                    if best is None or t < best[0]:
                        best = (t, a, proto)
            assert (plan.algorithm, protocol) == best[1:]
    groups = len(_groups(c)) * sum(2 if k == "all_reduce" else 1 for k, _ in KINDS)
    assert len(cached._estimate_cache) < groups  # the servers' groups share shapes


def test_a_degraded_link_has_its_own_shape_and_a_slower_estimate():
    """Server 1's group crosses a half-rate NVLink: its shape differs from server 0's and its estimate of
    a bandwidth-bound all-gather is larger; servers 0, 2 and 3 (healthy, isomorphic) share one shape."""
    c = _sick_cluster()
    f = Fabric(simpy.Environment(), c)
    plans = [plan_collective("all_gather", tuple(range(4 * s, 4 * s + 4)), 2**30, f.server_of, "ring")
             for s in range(4)]
    shapes = [f._plan_shape(p) for p in plans]
    assert shapes[0] == shapes[2] == shapes[3] != shapes[1]
    healthy, sick = f.estimate(plans[0]), f.estimate(plans[1])
    # the ring's bottleneck is the half-rate link: the bandwidth term doubles (latency terms are equal)
    assert sick > 1.9 * healthy


def _lanes_cluster():
    """8 servers x 4 GPUs on 4 leaves, 2 spines; server 5's GPU 1 has a half-rate NVLink, one leaf uplink is
    degraded: the lanes through them are not isomorphic to the others."""
    c = leaf_spine("H100-SXM", servers=8, gpus_per_server=4, servers_per_leaf=2, spines=2)
    return apply_faults(c, [{"kind": "degraded_link", "link": ["gpu:5:1", "nvswitch:5"], "fraction": 0.5},
                            {"kind": "degraded_link", "link": ["leaf:2", "spine:1"], "fraction": 0.25}])


def _lanes(c):
    """Lane sets as lockstep makes them: a group in every server (TP-like; once with the sick server
    first), pairs of GPUs four servers apart (cross-leaf, ECMP-hashed; DP-like)."""
    per, servers = c.gpus_per_server, c.num_gpus // c.gpus_per_server
    inside = [tuple(range(s * per, (s + 1) * per)) for s in range(servers)]
    sick_first = inside[5:] + inside[:5]
    across = [(r, r + c.num_gpus // 2) for r in range(c.num_gpus // 2)]
    halves = [tuple(range(s * per, s * per + 2)) for s in range(servers)]
    return [inside, sick_first, across, halves]


@pytest.mark.parametrize("build", [_lanes_cluster, lambda: fat_tree("H100-SXM", servers=16, gpus_per_server=2,
                                                                       servers_per_leaf=2, leaves_per_pod=2,
                                                                       spines=2, cores=4)])
@pytest.mark.parametrize("config", [NetworkConfig(), NetworkConfig(step_latency_s=5e-6)])
def test_relabelled_lanes_equal_every_group_planned_alone(build, config, monkeypatch):
    """replicated_phases plans the first lane and relabels it onto the isomorphic ones (Fabric._lane_phases):
    every flow (links, wire bytes, latency, payload, the GPU pairs it carries) equals what planning each
    group on its own gives on a fresh fabric, where lanes cross a degraded link too; and most lanes were
    relabelled, not planned."""
    c = build()
    fabric = Fabric(simpy.Environment(), c, config)
    planned = []
    original = Fabric.phases
    monkeypatch.setattr(Fabric, "phases", lambda self, kind, g, *a: planned.append(g) or original(self, kind, g, *a))
    lanes_total = 0
    for kind, nbytes in KINDS:
        for groups in _lanes(c):
            got = fabric.replicated_phases(kind, groups, nbytes)
            fresh = Fabric(simpy.Environment(), c, config)
            per_group = [original(fresh, kind, g, nbytes) for g in groups]
            assert all(len(p) == 1 for p in per_group) and got is not None
            want = [s for p in per_group for s in p[0]]
            assert len(got[0]) == len(want)
            for a, b in zip(got[0], want):
                assert a[0].tolist() == b[0].tolist() and a[1:] == b[1:]
                assert fabric.pairs_of(a[0]) == fresh.pairs_of(b[0])
            lanes_total += len(groups)
    assert len(planned) < lanes_total / 2


def _ring_of_servers(c):
    """A group of one GPU per server (8 servers, cross-leaf hops: routed by ECMP)."""
    return tuple(range(0, c.num_gpus, c.gpus_per_server))


@pytest.mark.parametrize("config", [NetworkConfig(), NetworkConfig(routing="spray")])
def test_hops_looked_up_together_are_what_hop_gives_one_by_one(config):
    """Fabric._hops (a plan's hops looked up in one pass, the uncached ones routed together) hands back, per
    key, exactly what Fabric._hop makes for that key on a fresh fabric (the same links and latency), and
    the very objects _hop finds cached afterwards; cached, uncached, repeated and few keys mixed."""
    c = fat_tree("H100-SXM", servers=16, gpus_per_server=2, servers_per_leaf=2, leaves_per_pod=2, spines=2, cores=4)
    fabric = Fabric(simpy.Environment(), c, config)
    pairs = [(s, d) for s in range(c.num_gpus) for d in range(c.num_gpus) if s != d]
    few = [(s, d, 1) for s, d in pairs[:5]]  # fewer than the bulk threshold: routed one by one
    assert fabric._hops(few) == [fabric._hop(*k) for k in few]
    keys = few + [(s, d, label) for label in (0, 3) for s, d in pairs[::7]] + few[:2]  # cached, new, repeated
    got = fabric._hops(keys)
    fresh = Fabric(simpy.Environment(), c, config)
    for k, (links, latency) in zip(keys, got):
        want_links, want_latency = fresh._hop(*k)
        assert links.tolist() == want_links.tolist() and latency == want_latency
        assert fabric._hop(*k)[0] is links
        assert fabric.pairs_of(links) == ((k[0], k[1]),)


def test_an_estimate_hands_each_phase_its_own_hops():
    """A plan of phases A, A, B (each over more than _SHAPE_HOPS hops, so their loads are kept per set of
    hops; B over a NIC degraded to a quarter that A does not cross): its estimate is the base latency
    plus A's bandwidth-and-step term twice plus B's, each from a one-phase plan on a fabric that has seen
    none of them. (Were B handed A's repeated hops, it would be priced at A's healthy rate.)"""
    c = apply_faults(leaf_spine("H100-SXM", servers=160, gpus_per_server=2, servers_per_leaf=16, spines=4),
                     [{"kind": "degraded_link", "link": ["gpu:3:1", "nic:3:1"], "fraction": 0.25}])
    f = Fabric(simpy.Environment(), c)
    ring_a = plan_collective("all_gather", tuple(range(0, c.num_gpus, 2)), 2**34, f.server_of, "ring", "full")
    ring_b = plan_collective("all_gather", tuple(range(1, c.num_gpus, 2)), 2**34, f.server_of, "ring", "full")
    a, b = ring_a.phases[0], ring_b.phases[0]
    assert sum(len(t.hops) for t in a) > _SHAPE_HOPS and a != b
    plan = Plan("all_gather", "ring", ring_a.group, 2**34, (a, a, b))
    got = f.estimate(plan)

    def alone(phase):
        fresh = Fabric(simpy.Environment(), c)
        one = Plan("all_gather", "ring", ring_a.group, 2**34, (phase,))
        return fresh.estimate(one), fresh._costs(one, "Simple")[0]

    (with_a, base), (with_b, _base) = alone(a), alone(b)
    assert with_b - base > 3 * (with_a - base)  # B's degraded NIC binds
    assert got == pytest.approx(base + 2 * (with_a - base) + (with_b - base), rel=1e-12)


def _spec_values(routed):
    """A routed collective's flows as plain values: per phase, (links, wire bytes, latency, payload)."""
    return [[(tuple(s[0].tolist()), s[1], s[2], s[3]) for s in phase] for phase in routed]


@pytest.mark.parametrize("config", [NetworkConfig(), NetworkConfig(routing="spray"), NetworkConfig(fidelity="full"),
                                    NetworkConfig(step_latency_s=5e-6)])
def test_a_size_planned_after_others_on_the_same_routes_equals_a_fresh_plan(config):
    """A collective whose size changes call by call (a MoE expert-TP all-gather follows the routed load)
    reuses its routes (``Fabric._skeleton``): its flows equal, to the bit, those a fabric that never saw the
    group gives; and the links arrays are the same objects from size to size (the network finds the route by
    identity), sizes of other channel counts included (a small all-reduce runs on fewer channels)."""
    c = _sick_cluster()
    warm = Fabric(simpy.Environment(), c, config)
    sizes = [2**20 + 4096 * k for k in range(5)] + [3e3, 5e5, 2**27 + 1.5]
    for kind in ("all_gather", "reduce_scatter", "all_reduce"):
        for group in _groups(c):
            first, alike = None, 0
            for nbytes in sizes:
                routed = warm.phases(kind, group, nbytes)
                fresh = Fabric(simpy.Environment(), c, config)
                assert _spec_values(routed) == _spec_values(fresh.phases(kind, group, nbytes))
                assert warm.channel_limit(kind, group, nbytes) == fresh.channel_limit(kind, group, nbytes)
                first = first or routed
                if len(routed[0]) == len(first[0]):  # (the same channels: one route per transfer, every size)
                    assert all(a[0] is b[0] for a, b in zip(first[0], routed[0]))
                    alike += 1
                if config.routing == "ecmp" and config.fidelity == "fast":  # each flow over its hops' own routes
                    plan, _protocol = warm.choose(kind, group, nbytes)
                    for phase, specs in zip(plan.phases, routed):
                        for t, spec in zip(phase, specs):
                            hops = [warm.route(a, b, t.label) for a, b in t.hops]
                            assert spec[0].tolist() == np.concatenate(hops).tolist()
            assert alike >= 5  # (the first five sizes run on the same channels)
