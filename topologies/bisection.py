"""What the built fabric can carry: bisection bandwidth by max-flow, oversubscription per switch tier.

Both read the graph alone (the :class:`~topologies.cluster.Cluster`
contract), never the builder's parameters, so they hold for any fabric a
builder or a topology file produces.

Bisection bandwidth
-------------------
The true bisection bandwidth is the minimum, over every split of the GPUs
into two equal halves, of the bandwidth crossing the split; finding it is
NP-hard in general (minimum bisection). :func:`bisection_bandwidth` computes
instead the **maximum flow from one given half to the other**: by default
the GPUs of the first ``floor(S/2)`` of ``S`` servers against the rest (of one
server, its first ``floor(N/2)`` ranks). Ranks are numbered server by
server, leaf by leaf and pod by pod, so for the builders' fabrics this split
runs along server, leaf and pod boundaries (with an odd number of servers the
halves differ by one server rather than split one, whose NVLink is not network
bisection) and forces the most traffic through the upper tiers: it is the structured worst case, and with halves of
whole leaves (pods) it equals the closed forms (``N/2 * B / r`` for a leaf-spine
of NIC rate ``B`` and oversubscription ``r``; ``tests/test_capacity.py``).
For another split pass ``halves``. It is an upper bound on the true
bisection, exact for the cut it is given.

Speed: every GPU of a half is tied to the source (sink) by an
infinite-capacity edge, so every finite cut keeps it on the source (sink)
side; the GPUs of each half are therefore contracted into the source (sink)
exactly. Nodes left with two neighbours (the NICs, the NVSwitch of a server
that a half holds whole) are then removed by series reduction (a path
``u -> n -> v`` becomes ``u -> v`` with the smaller capacity), which is exact
too. Finally, nodes with identical neighbours and capacities (all the
spines of a leaf-spine, the leaves of one half) are merged into one, which
is exact as well (halving a merged node's flow gives back a flow of the
original). What remains is a handful of nodes, so max-flow takes
milliseconds; the contraction, one pass over the edges, dominates.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping

import networkx as nx

from topologies.cluster import Cluster, TopologyError, check_cluster

__all__ = ["SWITCH_LEVELS", "bisection_bandwidth", "default_half", "oversubscription_by_tier"]

SWITCH_LEVELS: Mapping[str, int] = {"leaf": 1, "spine": 2, "core": 3}
"""Height of each fabric switch kind; every other node kind (gpu, nic, nvswitch) is a host at height 0."""

_SOURCE, _SINK = ("__bisection_source__",), ("__bisection_sink__",)


def default_half(cluster: Cluster) -> set[int]:
    """Ranks of the default sending half: the first ``floor(S/2)`` of ``S`` servers when ranks are numbered
    server by server (an odd ``S`` too, so that the split never runs through a server's NVLink, which would
    count NVLink as network bisection: 3 servers read 4x 2 servers' figure per GPU); the first ``floor(N/2)``
    ranks of one server, or where ranks are not grouped by server."""
    n = cluster.num_gpus
    nodes = cluster.graph.nodes
    servers = [nodes[g].get("server") for g in cluster.gpus]
    starts = [r for r in range(n) if r == 0 or servers[r] != servers[r - 1]]  # where each run of a server begins
    if len(starts) < 2 or len(set(servers)) != len(starts) or None in servers:
        return set(range(n // 2))
    return set(range(starts[len(starts) // 2]))


def _halves(cluster: Cluster, halves: Iterable[int] | None) -> tuple[list[Hashable], list[Hashable]]:
    n = cluster.num_gpus
    if halves is None:
        a = default_half(cluster)
    else:
        a = set()
        for r in halves:
            if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < n:
                raise TopologyError(f"halves: {r!r} is not a rank of this cluster; valid: 0..{n - 1}")
            a.add(r)
    return [cluster.gpus[r] for r in sorted(a)], [cluster.gpus[r] for r in range(n) if r not in a]


def _contract(graph: nx.DiGraph, side: Mapping[Hashable, Hashable]) -> tuple[dict, dict]:
    """Capacities ``succ[u][v]`` (bytes/s, integers) with the halves merged into source and sink."""
    succ: dict[Hashable, dict[Hashable, int]] = {_SOURCE: {}, _SINK: {}}
    pred: dict[Hashable, dict[Hashable, int]] = {_SOURCE: {}, _SINK: {}}
    for u, nbrs in graph.adjacency():  # plain dicts: one pass over ~10^6 edges at 131,072 GPUs
        mu = side.get(u, u)
        if mu == _SINK:
            continue
        for v, data in nbrs.items():
            bw = data.get("bandwidth")
            mv = side.get(v, v)
            if mu == mv or mv == _SOURCE or not bw:
                continue
            cap = round(bw)  # whole bytes/s: max-flow on integers is exact
            out = succ.setdefault(mu, {})
            out[mv] = out.get(mv, 0) + cap
            into = pred.setdefault(mv, {})
            into[mu] = into.get(mu, 0) + cap
            succ.setdefault(mv, {})
            pred.setdefault(mu, {})
    return succ, pred


def _remove(n: Hashable, succ: dict, pred: dict) -> set:
    touched = set(succ[n]) | set(pred[n])
    for v in succ.pop(n):
        del pred[v][n]
    for u in pred.pop(n):
        del succ[u][n]
    return touched


def _add(u: Hashable, v: Hashable, cap: int, succ: dict, pred: dict) -> None:
    if cap <= 0 or u == v or v == _SOURCE or u == _SINK:
        return
    succ[u][v] = succ[u].get(v, 0) + cap
    pred[v][u] = pred[v].get(u, 0) + cap


def _reduce(succ: dict, pred: dict) -> None:
    """Remove dead ends and series nodes (exactly two neighbours) until none is left."""
    work = [n for n in succ if n not in (_SOURCE, _SINK)]
    while work:
        n = work.pop()
        if n not in succ:
            continue
        neighbours = set(succ[n]) | set(pred[n])
        if not succ[n] or not pred[n] or len(neighbours) < 2:
            work.extend(x for x in _remove(n, succ, pred) if x not in (_SOURCE, _SINK))
        elif len(neighbours) == 2:
            a, b = neighbours
            ab = min(pred[n].get(a, 0), succ[n].get(b, 0))
            ba = min(pred[n].get(b, 0), succ[n].get(a, 0))
            _remove(n, succ, pred)
            _add(a, b, ab, succ, pred)
            _add(b, a, ba, succ, pred)
            work.extend(x for x in (a, b) if x not in (_SOURCE, _SINK))


def _merge_twins(succ: dict, pred: dict) -> bool:
    """Merge nodes with identical out- and in-capacity maps into one (capacities add); True if any merged.

    Exact: a flow of the original graph is one of the merged graph, and halving a merged node's flow
    between its twins gives back a flow of the original within every capacity. (Twins are never
    adjacent: a node is not its own neighbour.)
    """
    groups: dict[tuple, list] = {}
    for n in succ:
        if n not in (_SOURCE, _SINK):
            groups.setdefault((frozenset(succ[n].items()), frozenset(pred[n].items())), []).append(n)
    merged = False
    for keep, *others in groups.values():
        for n in others:
            out, into = dict(succ[n]), dict(pred[n])
            _remove(n, succ, pred)
            for v, c in out.items():
                _add(keep, v, c, succ, pred)
            for u, c in into.items():
                _add(u, keep, c, succ, pred)
            merged = True
    return merged


def bisection_bandwidth(cluster: Cluster, halves: Iterable[int] | None = None) -> float:
    """Maximum flow (bytes/s, one direction) from one half of the GPUs to the other, on the built graph.

    Parameters
    ----------
    cluster : Cluster
        Any cluster obeying the contract; only ``graph``, ``gpus`` and each
        edge's ``bandwidth`` are read.
    halves : iterable of int, optional
        Ranks of the sending half; default the first ``floor(S/2)`` of the
        ``S`` servers (ranks are numbered server by server; the first
        ``floor(N/2)`` ranks of a single server), see the module docstring
        for why. The other ranks receive.

    Returns
    -------
    float
        Bytes/s that can cross from the sending half to the other at once
        (every GPU of a half may send to any GPU of the other; exact to 1 B/s).
        0 for a cluster of one GPU.

    Raises
    ------
    TopologyError
        If ``halves`` names a rank the cluster does not have.

    Examples
    --------
    >>> from topologies import leaf_spine
    >>> c = leaf_spine("H100", servers=4, servers_per_leaf=2, spines=2, oversubscription=2)
    >>> bisection_bandwidth(c) / 1e9   # 16 GPUs x 50 GB/s / 2
    400.0
    """
    check_cluster(cluster)
    sending, receiving = _halves(cluster, halves)
    if not sending or not receiving:
        return 0.0
    side = {g: _SOURCE for g in sending} | {g: _SINK for g in receiving}
    succ, pred = _contract(cluster.graph, side)
    _reduce(succ, pred)
    while _merge_twins(succ, pred):
        _reduce(succ, pred)
    flow = nx.DiGraph()
    flow.add_nodes_from((_SOURCE, _SINK))
    flow.add_edges_from((u, v, {"capacity": c}) for u, out in succ.items() for v, c in out.items())
    return float(nx.maximum_flow_value(flow, _SOURCE, _SINK))


def oversubscription_by_tier(cluster: Cluster, *, worst: bool = False) -> dict[str, float]:
    """Downlink : uplink bandwidth of each switch tier that has uplinks, measured on the graph.

    A switch's downlinks go to lower nodes (hosts below leaves, leaves below
    spines, spines below cores; :data:`SWITCH_LEVELS`), its uplinks to higher
    ones; links between switches of one tier count as neither.

    Parameters
    ----------
    cluster : Cluster
    worst : bool
        ``False`` (default): the tier's summed downlink bandwidth over its
        summed uplink bandwidth. ``True``: the largest ratio of any one
        switch of the tier (a partially filled last leaf lowers the sum's
        ratio but not the worst leaf's).

    Returns
    -------
    dict
        ``{tier: ratio}`` in ``leaf, spine, core`` order, e.g. ``{"leaf": 3.0}``
        for a 3:1 leaf-spine; the top tier (no uplinks) is absent.

    Examples
    --------
    >>> from topologies import fat_tree
    >>> c = fat_tree("H100", servers=8, servers_per_leaf=2, leaves_per_pod=2, spines=2, oversubscription=2,
    ...              core_oversubscription=1.5)
    >>> oversubscription_by_tier(c)
    {'leaf': 2.0, 'spine': 1.5}
    """
    g = cluster.graph
    down: dict[str, float] = {}
    up: dict[str, float] = {}
    worst_ratio: dict[str, float] = {}
    for s, kind in g.nodes(data="kind"):
        level = SWITCH_LEVELS.get(kind)
        if level is None:
            continue
        d = u = 0.0
        for n, bw in g.succ[s].items():
            other = SWITCH_LEVELS.get(g.nodes[n]["kind"], 0)
            if other < level:
                d += bw["bandwidth"]
            elif other > level:
                u += bw["bandwidth"]
        down[kind] = down.get(kind, 0.0) + d
        up[kind] = up.get(kind, 0.0) + u
        if u > 0:
            worst_ratio[kind] = max(worst_ratio.get(kind, 0.0), d / u)
    out = {}
    for tier in SWITCH_LEVELS:
        if up.get(tier):
            out[tier] = worst_ratio[tier] if worst else down[tier] / up[tier]
    return out
