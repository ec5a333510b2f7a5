"""Routes on the fabric: equal-cost shortest paths and deterministic ECMP.

Routes are sequences of directed links between two GPUs. GPUs are never
transit nodes (no GPU forwards another GPU's traffic). Where several paths of
equal hop count exist (a leaf-spine fabric offers one per spine), a flow picks
one by a deterministic hash of ``(source, destination, label, seed)`` — like a
switch hashing a flow's 5-tuple — so collisions of two flows on one uplink are
simulated rather than averaged away. Nodes enter the hash by their position in the
graph's node list, so a topology file listing the same fabric's non-GPU nodes in
another order hashes as another seed would (a determinism hunt saw +26% on one
4-node fabric, the spread seeds give); the builders list them in one order.

The fabrics built by :mod:`topologies` have a regular structure
(GPU - NVSwitch - GPU inside a server, GPU - NIC - leaf - ... - leaf - NIC - GPU
across servers); :class:`Router` uses it to route in O(1) per pair after
caching the switch-to-switch paths — a route is a GPU's up leg, a cached
switch path and the peer's down leg, and only the route ECMP picks is built —
and falls back to a breadth-first search for any other graph. Both give the
same path sets (tested).

**PXN** (``pxn=True``; NCCL's default since 2.12, ``NCCL_PXN_DISABLE=0``): a
transfer to a GPU on another server leaves through the NIC of the GPU of its
own server that has the *destination's* local index, reached over NVLink, so
it stays on the destination's rail (NCCL ``src/graph/search.cc``,
``ncclTopoGetNetDev``: under ``NCCL_P2P_PXN_LEVEL=2``, the default, a send uses
"the local NIC close to" the GPU with the peer's device index; rings search
``NET n -> GPU a -> ... -> GPU x -> NET n``, in and out through one NIC, and
reach it from ``GPU x`` over NVLink). On a rail-optimized fabric this keeps a
ring's hop between servers, and every all-to-all transfer between two servers
of one pod, on one rail leaf instead of the spines. The ECMP hash stays that of
the true pair. PXN applies where the fabric is regular and the proxy is in the
source's NVLink domain, on its NVSwitch or on one linked to it (NVL36x2's other
rack: one more NVSwitch hop; NCCL asks only for an NVLink path inside the host,
which a domain is here), and owns its NIC (GPUs sharing a NIC after a ``nic_down``
fault route as without PXN); elsewhere a transfer leaves through the source's own
NIC.
The local index is the device index ``i`` of a GPU labelled ``("gpu", server, i)``
(else its place among its server's GPUs in the graph). Left out: NCCL only
proxies through a GPU of the same communicator, which routes here (per GPU pair,
not per group) do not know; in Megatron-style layouts every group has the same
local indices on each of its servers, so the proxy is always a member.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable

import networkx as nx
import numpy as np

_MASK64 = (1 << 64) - 1


def ecmp_hash(*keys: int) -> int:
    """Deterministic 64-bit mix of integer ``keys`` (splitmix64 rounds).

    Python's built-in ``hash`` is salted per process for strings, so it is
    never used for routing decisions.
    """
    h = 0x9E3779B97F4A7C15
    for k in keys:
        h = (h ^ (k & _MASK64)) & _MASK64
        h = (h + 0x9E3779B97F4A7C15) & _MASK64
        z = h
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        h = z ^ (z >> 31)
    return h


_U64 = np.uint64


def ecmp_hash_array(*keys: np.ndarray | int) -> np.ndarray:
    """:func:`ecmp_hash` of many key tuples at once: ``keys`` are arrays of equal length (or ints, broadcast)
    of non-negative integers; the same splitmix64 rounds in ``uint64`` arithmetic, which wraps modulo 2^64 as
    the masked Python version does, so every element equals the scalar hash (tested)."""
    golden, m1, m2 = _U64(0x9E3779B97F4A7C15), _U64(0xBF58476D1CE4E5B9), _U64(0x94D049BB133111EB)
    s30, s27, s31 = _U64(30), _U64(27), _U64(31)
    h = None
    for k in keys:
        k = np.asarray(k & _MASK64 if isinstance(k, int) else k).astype(np.uint64)
        h = (golden ^ k) if h is None else (h ^ k)
        h = h + golden
        z = (h ^ (h >> s30)) * m1
        z = (z ^ (z >> s27)) * m2
        h = z ^ (z >> s31)
    return h


def shortest_paths(graph: nx.DiGraph, source: Hashable, target: Hashable) -> list[list[Hashable]]:
    """All equal-hop shortest paths from ``source`` to ``target``, never transiting a GPU.

    Paths are returned in a deterministic order (sorted by their node labels'
    ``repr``), so path indices — and hence ECMP choices — never depend on
    insertion order.
    """
    if source == target:
        return [[source]]
    kind = graph.nodes
    # BFS backwards from the target over predecessors; GPUs other than the
    # source and target are dead ends.
    dist = {target: 0}
    queue = deque([target])
    while queue:
        v = queue.popleft()
        if v == source:
            continue
        for u in graph.predecessors(v):
            if u in dist:
                continue
            if kind[u]["kind"] == "gpu" and u != source:
                continue
            dist[u] = dist[v] + 1
            queue.append(u)
    if source not in dist:
        raise ValueError(f"no route from {source} to {target}")
    paths: list[list[Hashable]] = []
    stack = [[source]]
    while stack:
        path = stack.pop()
        v = path[-1]
        if v == target:
            paths.append(path)
            continue
        d = dist[v]
        for w in graph.successors(v):
            if dist.get(w) == d - 1:
                stack.append(path + [w])
    # A NIC joins a GPU to the fabric; a path in at one GPU and out at another (two GPUs sharing a NIC after a
    # nic_down fault) would move GPU-to-GPU traffic over the NIC's PCIe link: dropped where another path of
    # the same length remains (an NVSwitch joins the two), kept only when it is the sole way.
    direct = [p for p in paths if not any(kind[p[i]]["kind"] == "nic" and kind[p[i - 1]]["kind"] == "gpu"
                                          and kind[p[i + 1]]["kind"] == "gpu" for i in range(1, len(p) - 1))]
    if direct:
        paths = direct
    paths.sort(key=lambda p: [repr(n) for n in p])
    return paths


def _grow(front: list, neighbours, dist: dict, other: dict, k: int) -> tuple[list, bool]:
    """One level of a breadth-first search: the unseen ``neighbours`` of ``front`` get distance ``k`` in
    ``dist``; returns the new front and whether it touched the other search's ball ``other``."""
    nxt, meet = [], False
    for v in front:
        for w in neighbours(v):
            if w not in dist:
                dist[w] = k
                nxt.append(w)
                if w in other:
                    meet = True
    return nxt, meet


class _Ball:
    """The breadth-first levels around one switch in one direction, grown on demand and kept: ``fronts[k]``
    the switches at distance ``k``, ``dist`` every switch found so far with its distance, ``children[v]``
    the neighbours of ``v`` one level further out (once that level is grown)."""

    __slots__ = ("fronts", "dist", "children")

    def __init__(self, node: Hashable) -> None:
        self.fronts = [[node]]
        self.dist = {node: 0}
        self.children: dict[Hashable, list] = {}

    def front(self, k: int, neighbours: dict) -> list:
        """The switches at distance ``k`` (``neighbours``: a plain dict of each switch's neighbours in
        this ball's direction); what :func:`_grow` finds, level by level."""
        fronts, dist, children = self.fronts, self.dist, self.children
        while len(fronts) <= k:
            level = len(fronts)
            nxt = []
            for v in fronts[-1]:
                kids = children[v] = []
                for w in neighbours[v]:
                    d = dist.get(w)
                    if d is None:
                        dist[w] = level
                        nxt.append(w)
                        kids.append(w)
                    elif d == level:
                        kids.append(w)
            fronts.append(nxt)
        return fronts[k]


def switch_paths(graph: nx.DiGraph, source: Hashable, target: Hashable,
                 balls: dict | None = None) -> list[list[Hashable]]:
    """:func:`shortest_paths` on a graph without GPUs (a fabric's switches), by a bidirectional search.

    Breadth-first levels grow from both ends, the smaller frontier first, until they meet: on a
    three-tier fat tree two leaves in different pods are found two levels from each end instead of
    after a search of every switch. Then the paths are enumerated through nodes whose distances from
    both ends add up to the shortest distance. Same paths, same order as :func:`shortest_paths`
    (tested on every switch pair of the builders' fabrics)."""
    if source == target:
        return [[source]]
    if balls is not None:  # levels kept per switch and direction: the dicts may know deeper levels too
        kf, kb = _meet_cached(graph, source, target, balls)
        fb, bb = balls[(source, True)], balls[(target, False)]
        fwd, bwd = fb.dist, bb.dist
        succ = balls["succ"]
    else:
        fwd = {source: 0}
        bwd = {target: 0}
        front_f, front_b = [source], [target]
        kf = kb = 0
        meet = False
        while not meet:
            if not front_f or not front_b:
                raise ValueError(f"no route from {source} to {target}")
            if len(front_f) <= len(front_b):
                kf += 1
                front_f, meet = _grow(front_f, graph.successors, fwd, bwd, kf)
            else:
                kb += 1
                front_b, meet = _grow(front_b, graph.predecessors, bwd, fwd, kb)
    total = kf + kb  # the levels first met: no shorter route exists (the balls one level smaller were disjoint)

    def on_path(w: Hashable, j: int) -> bool:
        # w at position j of a shortest route: checked against every distance the two balls know (a
        # cached ball's deeper levels change nothing: a switch at distance j <= kf has that distance)
        if j <= kf and fwd.get(w) != j:
            return False
        return not (total - j <= kb and bwd.get(w) != total - j)

    paths: list[list[Hashable]] = []
    stack = [[source]]
    while stack:
        path = stack.pop()
        v = path[-1]
        if v == target:
            paths.append(path)
            continue
        j = len(path)
        ahead = total - j
        if balls is None:
            nexts = graph.successors(v)
        elif j <= kf:
            nexts = fb.children[v]  # v's neighbours at distance j from the source: the only candidates
        elif ahead <= kb and len(bb.fronts[ahead]) < len(succ[v]):
            # the switches at distance ``ahead`` from the target are fewer than v's neighbours (a spine
            # above 128 leaves, one of them the target): look for those among v's neighbours instead
            succ_v = succ[v]
            nexts = [w for w in bb.fronts[ahead] if w in succ_v]
        else:
            nexts = succ[v]
        for w in nexts:
            if on_path(w, j):
                stack.append(path + [w])
    names: dict = {}  # each switch's repr once (the paths share most of their switches)
    paths.sort(key=lambda p: [names[n] if n in names else names.setdefault(n, repr(n)) for n in p])
    return paths


def _meet_cached(graph: nx.DiGraph, source: Hashable, target: Hashable, balls: dict) -> tuple[int, int]:
    """The levels ``(kf, kb)`` at which :func:`switch_paths`' two searches first meet, with the levels of
    each end read from (and added to) ``balls``: the same alternation (the smaller front grows) and the
    same meeting test (a new switch already within the other ball's levels), so the same ``kf, kb``.
    ``balls`` also keeps the graph's adjacency as plain dicts (``"succ"``, ``"pred"``): one graph per
    ``balls``."""
    if "succ" not in balls:  # the graph's adjacency as plain dicts, read once
        balls["succ"] = dict(graph.adjacency())  # switch -> {successor: edge data}
        balls["pred"] = {v: list(graph.predecessors(v)) for v in graph}
    fb = balls.get((source, True))
    if fb is None:
        fb = balls[(source, True)] = _Ball(source)
    bb = balls.get((target, False))
    if bb is None:
        bb = balls[(target, False)] = _Ball(target)
    kf = kb = 0
    front_f, front_b = fb.fronts[0], bb.fronts[0]
    while True:
        if not front_f or not front_b:
            raise ValueError(f"no route from {source} to {target}")
        if len(front_f) <= len(front_b):
            kf += 1
            front_f = fb.front(kf, balls["succ"])
            other, k = bb.dist, kb
        else:
            kb += 1
            front_b = bb.front(kb, balls["pred"])
            other, k = fb.dist, kf
        new = front_f if other is bb.dist else front_b
        if any(other.get(w, k + 1) <= k for w in new):
            return kf, kb


def _device_indices(gpus: list[Hashable]) -> list[int]:
    """The local (device) index of each GPU of one server: ``i`` of labels ``("gpu", server, i)`` (what NCCL
    matches, the peer's device index), or, where a server's labels are not all of that form with distinct
    ``i``, the GPUs' order in the graph."""
    found = [g[2] if isinstance(g, tuple) and len(g) == 3 and g[0] == "gpu" and isinstance(g[2], int) else None
             for g in gpus]
    if None in found or len(set(found)) != len(found):
        return list(range(len(gpus)))
    return found  # type: ignore[return-value]


class Router:
    """Maps a GPU pair and a flow label to the link ids of one route.

    Parameters
    ----------
    graph : networkx.DiGraph
        The cluster fabric.
    link_index : dict
        ``(u, v) -> link id`` for every directed edge.
    seed : int
        Mixed into every ECMP hash; a different seed is a different (but
        equally deterministic) hash function.
    pxn : bool
        Route transfers between servers through the NIC on the destination's rail (module docstring).
        False (default here: the plain shortest paths) leaves every transfer through its source's own NIC;
        :class:`~simulator.fabric.Fabric` passes ``network.pxn`` (default True, as NCCL).
    """

    def __init__(self, graph: nx.DiGraph, link_index: dict[tuple, int], seed: int = 0, pxn: bool = False) -> None:
        self.graph = graph
        self.link_index = link_index
        self.seed = int(seed)
        self.pxn = bool(pxn)
        self.node_id = {n: i for i, n in enumerate(graph.nodes)}
        self._pair_paths: dict[tuple, list[np.ndarray]] = {}
        self._switch_paths: dict[tuple, list[list[Hashable]]] = {}
        # (switch, forward?) -> its search levels, and "succ"/"pred": the switch graph's adjacency (switch_paths)
        self._balls: dict = {}
        self._switch_graph: nx.DiGraph | None = None
        # Regular fabrics (see _structural): link ids of each GPU's up and down legs, of each switch path.
        self._up: dict[Hashable, list[int]] = {}
        self._down: dict[Hashable, list[int]] = {}
        self._mid_links: dict[tuple, list[list[int]]] = {}
        self._mid_arrays: dict[tuple, np.ndarray] = {}  # the same as (paths, links) arrays (routes)
        self._table: tuple | None = None  # (gpus, per-GPU arrays): see _gpu_table
        self._switch_nodes: list = []
        self._nvswitch_nodes: list = []
        self._mid_by_code: dict[int, tuple[np.ndarray, int, int]] = {}  # route_blocks: switch pair code ->
        # (its _mid_array, paths, links per path)
        # Plain dicts of the graph (one pass each): the checks below touch every GPU, NIC and NVSwitch.
        self._kind = dict(graph.nodes(data="kind"))
        self._succ = dict(graph.adjacency())
        regular = self._regular()
        self._attach = {n: self._attachment(n) if regular else None for n, k in self._kind.items() if k == "gpu"}
        # PXN: each GPU's server and local (device) index, and the GPU at each (server, local index)
        self._server = dict(graph.nodes(data="server"))
        self._local: dict[Hashable, int] = {}
        self._rail_gpu: dict[tuple, Hashable] = {}
        if self.pxn:
            by_server: dict = {}
            for n, k in self._kind.items():
                if k == "gpu":
                    by_server.setdefault(self._server.get(n), []).append(n)
            for srv, members in by_server.items():
                for n, i in zip(members, _device_indices(members)):
                    self._local[n] = i
                    self._rail_gpu[(srv, i)] = n

    def _regular(self) -> bool:
        """Whether the fast path's shortcuts hold: NVSwitches link only GPUs (and, in a domain over several
        racks, every other NVSwitch of their domain), and a NIC links GPUs and at most one fabric switch, so no
        route between two GPUs of different domains can transit an NVSwitch or a NIC.

        A custom fabric may break this (NICs cabled back to back, NVSwitches linked to each other or to
        a leaf); then every pair takes the breadth-first search, which finds every shortest path."""
        kind, succ = self._kind, self._succ
        server = dict(self.graph.nodes(data="server"))
        domain_switches: dict[int, list] = {}
        for n, k in kind.items():
            if k == "nvswitch":
                domain_switches.setdefault(server[n], []).append(n)
        for n, k in kind.items():
            if k == "nvswitch":
                # An NVLink domain over several racks (NVL36x2) stays regular: its switches are linked
                # pairwise and to nothing else but GPUs, so a GPU pair in it is one or two switches apart.
                peers = domain_switches[server[n]]
                for w in succ[n]:
                    if kind[w] == "gpu":
                        continue
                    if kind[w] != "nvswitch" or server[w] != server[n]:
                        return False
                if len(peers) > 1 and any(p != n and p not in succ[n] for p in peers):
                    return False
            elif k == "nic":
                others = [kind[w] for w in succ[n] if kind[w] != "gpu"]
                if len(others) > 1 or any(x in ("nic", "nvswitch") for x in others):
                    return False
        return True

    def _attachment(self, gpu: Hashable) -> tuple | None:
        """(nvswitch, nic, first switch) of a GPU on a regular fabric, or None."""
        kinds, succ = self._kind, self._succ
        nvswitch = nic = None
        for w in succ[gpu]:
            kind = kinds[w]
            if kind == "nvswitch":
                nvswitch = w
            elif kind == "nic":
                if nic is not None:
                    return None
                nic = w
            else:
                return None
        if nic is None:
            return (nvswitch, None, None)
        switches = [w for w in succ[nic] if w != gpu]
        if len(switches) != 1 or kinds[switches[0]] == "gpu":
            return None
        return (nvswitch, nic, switches[0])

    def _switches(self) -> nx.DiGraph:
        """The fabric without GPUs, NICs and NVSwitches (built once).

        On a regular fabric a route between two first-hop switches never
        transits a GPU (forbidden), a NIC (one switch port each) or an NVSwitch
        (GPUs only), so searching this small graph gives the same equal-cost
        paths as searching the whole cluster, at a fraction of the cost.
        """
        if self._switch_graph is None:
            keep = [n for n, k in self.graph.nodes(data="kind") if k not in ("gpu", "nic", "nvswitch")]
            self._switch_graph = self.graph.subgraph(keep).copy()
        return self._switch_graph

    def _node_paths(self, src: Hashable, dst: Hashable) -> list[list[Hashable]]:
        a, b = self._attach.get(src), self._attach.get(dst)
        if a is None or b is None:
            return shortest_paths(self.graph, src, dst)
        if a[0] is not None and a[0] == b[0]:
            return [[src, a[0], dst]]
        if a[0] is not None and b[0] is not None and self.graph.has_edge(a[0], b[0]):
            return [[src, a[0], b[0], dst]]  # one NVLink domain over two racks' switches (NVL36x2)
        if a[1] is None or b[1] is None:
            return shortest_paths(self.graph, src, dst)
        return [[src, a[1], *mid, b[1], dst] for mid in self._mids(a[2], b[2])]

    def _mids(self, first: Hashable, last: Hashable) -> list[list[Hashable]]:
        """Equal-cost switch paths from first-hop switch ``first`` to ``last`` (cached per switch pair)."""
        key = (first, last)
        mids = self._switch_paths.get(key)
        if mids is None:
            mids = self._switch_paths[key] = switch_paths(self._switches(), first, last, self._balls)
        return mids

    def _owns_nic(self, gpu: Hashable) -> bool:
        """Whether ``gpu`` has a regular NIC of its own, not one lent over NVLink after a ``nic_down`` fault.
        (A lent NIC serves two GPUs, whose attachment is then irregular: both route by the general search,
        through their own or borrowed NIC, neither proxies nor is proxied; left out, as NCCL's behaviour
        with a failed NIC is not the model's anyway.)"""
        a = self._attach.get(gpu)
        return a is not None and a[1] is not None and self.graph.edges[gpu, a[1]].get("tier") != "nvlink"

    def proxy(self, src: Hashable, dst: Hashable) -> Hashable | None:
        """The GPU whose NIC a transfer from ``src`` to ``dst`` on another server leaves through under PXN
        (the GPU of ``src``'s server with ``dst``'s local index, on ``src``'s NVSwitch or one linked to it,
        owning its NIC), or None where the transfer leaves through ``src``'s own NIC: PXN off, the same local
        index, a pair inside one NVLink domain, or a proxy that does not qualify."""
        if not self.pxn:
            return None
        a, b = self._attach.get(src), self._attach.get(dst)
        if a is None or b is None or a[0] is None or a[1] is None or b[1] is None:
            return None
        if a[0] == b[0] or (b[0] is not None and b[0] in self._succ[a[0]]):
            return None
        p = self._rail_gpu.get((self._server.get(src), self._local.get(dst)))
        if p is None or p == src or not self._owns_nic(p):
            return None
        switch = self._attach[p][0]
        return p if switch == a[0] or (switch is not None and switch in self._succ[a[0]]) else None

    def _up_leg(self, gpu: Hashable) -> list[int]:
        """Link ids GPU -> its NIC -> first switch (cached per GPU)."""
        up = self._up.get(gpu)
        if up is None:
            a, li = self._attach[gpu], self.link_index
            up = self._up[gpu] = [li[(gpu, a[1])], li[(a[1], a[2])]]
        return up

    def _structural(self, src: Hashable, dst: Hashable) -> tuple[list[int], list[list[int]], list[int]] | None:
        """``(up, middles, down)`` link ids of a GPU pair on different domains of a regular fabric: every
        equal-cost route is ``up + middles[k] + down`` (GPU -> NIC -> first switch, the ``k``-th switch path
        in :meth:`_mids` order, last switch -> NIC -> GPU; under PXN ``up`` starts GPU -> NVSwitch -> proxy),
        or None when the pair needs the general search.

        The up and down legs are per GPU and the middles per switch pair, so a route costs a few list
        concatenations instead of a path search (131,072 GPUs: ~10^6 pairs, ~10^3 switch pairs)."""
        a, b = self._attach.get(src), self._attach.get(dst)
        if a is None or b is None or a[1] is None or b[1] is None:
            return None
        if a[0] is not None and (a[0] == b[0] or (b[0] is not None and b[0] in self._succ[a[0]])):
            return None
        p = self.proxy(src, dst)
        if p is None:
            up = self._up_leg(src)
        else:
            li = self.link_index
            switch = self._attach[p][0]  # (the proxy's NVSwitch: src's, or one linked to it)
            hops = [a[0], p] if switch == a[0] else [a[0], switch, p]
            up = [li[(src, a[0])], *(li[(x, y)] for x, y in zip(hops, hops[1:])), *self._up_leg(p)]
            a = self._attach[p]
        down = self._down.get(dst)
        if down is None:
            li = self.link_index
            down = self._down[dst] = [li[(b[2], b[1])], li[(b[1], dst)]]
        key = (a[2], b[2])
        middles = self._mid_links.get(key)
        if middles is None:
            li = self.link_index
            middles = self._mid_links[key] = [[li[(m[i], m[i + 1])] for i in range(len(m) - 1)]
                                              for m in self._mids(a[2], b[2])]
        return up, middles, down

    def _gpu_table(self, gpus: list) -> dict[str, np.ndarray]:
        """Per GPU of ``gpus`` (by position), what :meth:`routes` reads: node id, whether it has the regular
        attachment with a NIC (``ok``), its NVLink domain (the server of its NVSwitch, -1 without one; on a
        regular fabric two NVSwitches are linked exactly when they share a server), its NVSwitch, first
        switch (an index into ``self._switch_nodes``) and the link ids of its up and down legs and NVSwitch
        links. Built once per GPU list (one pass; 131,072 GPUs: ~0.3 s)."""
        if self._table is not None and self._table[0] is gpus:
            return self._table[1]
        li, attach, node_id = self.link_index, self._attach, self.node_id
        server = self.graph.nodes
        sw_index: dict[Hashable, int] = {}
        nvs_index: dict[Hashable, int] = {}
        cols = {c: [-1] * len(gpus) for c in ("dom", "nvs", "sw", "up0", "up1", "dn0", "dn1", "g2n", "n2g")}
        ok = [False] * len(gpus)
        for i, g in enumerate(gpus):
            a = attach.get(g)
            if a is None:
                continue
            nvswitch, nic, first = a
            if nvswitch is not None:
                cols["nvs"][i] = nvs_index.setdefault(nvswitch, len(nvs_index))
                cols["dom"][i] = server[nvswitch]["server"]
                cols["g2n"][i] = li.get((g, nvswitch), -1)
                cols["n2g"][i] = li.get((nvswitch, g), -1)
            if nic is None:
                continue
            legs = (li.get((g, nic)), li.get((nic, first)), li.get((first, nic)), li.get((nic, g)))
            if None in legs:
                continue
            ok[i] = True
            cols["sw"][i] = sw_index.setdefault(first, len(sw_index))
            cols["up0"][i], cols["up1"][i], cols["dn0"][i], cols["dn1"][i] = legs
        table = {c: np.array(v, dtype=np.int64) for c, v in cols.items()}
        table["ok"] = np.array(ok, dtype=bool)
        table["nid"] = np.array([node_id[g] for g in gpus], dtype=np.int64)
        if self.pxn:  # (proxy): rail[server, local index] = position of that GPU; who may proxy
            where = {g: i for i, g in enumerate(gpus)}
            servers: dict = {}
            srv = [servers.setdefault(self._server.get(g), len(servers)) for g in gpus]
            loc = [self._local[g] for g in gpus]
            # (-2: that GPU exists but is not in ``gpus``: such pairs take route(), which may use it)
            rail = np.full((len(servers), max(self._local.values(), default=0) + 1), -1, dtype=np.int64)
            for (s, i), g in self._rail_gpu.items():
                if s in servers:
                    rail[servers[s], i] = where.get(g, -2)
            table["srv"], table["loc"], table["rail"] = np.array(srv), np.array(loc), rail
            table["pxok"] = (table["ok"] & (table["nvs"] >= 0) & (table["n2g"] >= 0)
                             & np.array([self._owns_nic(g) for g in gpus], dtype=bool))
        self._switch_nodes = list(sw_index)
        self._nvswitch_nodes = list(nvs_index)  # (the NVSwitch of each "nvs" number of this table)
        self._mid_by_code = {}  # (codes are of this table's switch numbering)
        self._table = (gpus, table)
        return table

    def routes(self, gpus: list, src: np.ndarray, dst: np.ndarray, labels: np.ndarray) -> list[np.ndarray]:
        """:meth:`route` of every ``(gpus[src[i]], gpus[dst[i]], labels[i])``, the same link ids, computed
        together (:meth:`route_blocks`); the arrays are rows of a few shared blocks."""
        out: list = [None] * len(src)
        for where, block in self.route_blocks(gpus, src, dst, labels):
            for j, i in enumerate(where.tolist()):
                out[i] = block[j]
        return out

    def route_blocks(self, gpus: list, src: np.ndarray, dst: np.ndarray, labels: np.ndarray
                     ) -> list[tuple[np.ndarray, np.ndarray]]:
        """:meth:`route` of every ``(gpus[src[i]], gpus[dst[i]], labels[i])`` as ``(positions, block)``
        pairs: row ``j`` of ``block`` is the route of pair ``positions[j]``; every pair is in one block.

        On a regular fabric the up and down legs are read from a per-GPU table, the switch paths per
        distinct switch pair and the ECMP hashes in one array pass (:func:`ecmp_hash_array`); pairs
        inside one NVSwitch are two table reads; any other pair takes :meth:`route` (a block of one row).
        131,072 GPUs: 10^6 routes in seconds instead of ~20 s one by one."""
        n = len(src)
        if n == 0:
            return []
        src = np.asarray(src, dtype=np.int64)
        dst = np.asarray(dst, dtype=np.int64)
        labels = np.asarray(labels, dtype=np.int64)
        t = self._gpu_table(gpus)
        out: list[tuple[np.ndarray, np.ndarray]] = []
        done = np.zeros(n, dtype=bool)
        ok = t["ok"][src] & t["ok"][dst] & (src != dst)
        dom_s = t["dom"][src]
        same_domain = (dom_s >= 0) & (dom_s == t["dom"][dst])
        intra = np.flatnonzero(ok & same_domain & (t["nvs"][src] == t["nvs"][dst])
                               & (t["g2n"][src] >= 0) & (t["n2g"][dst] >= 0))
        if len(intra):
            out.append((intra, np.stack([t["g2n"][src[intra]], t["n2g"][dst[intra]]], axis=1)))
            done[intra] = True
        struct = np.flatnonzero(ok & ~same_domain)
        if self.pxn and len(struct):
            # each pair's would-be proxy (proxy()); -2: not in ``gpus``, so the pair takes route() below
            e = t["rail"][t["srv"][src[struct]], t["loc"][dst[struct]]]
            struct, e = struct[e != -2], e[e != -2]
        if len(struct):
            s, d = src[struct], dst[struct]
            # under PXN the transfer leaves through the NIC of GPU exits (s where PXN does not apply; see proxy())
            if self.pxn:
                at = np.maximum(e, 0)
                # (a proxy on another NVSwitch of the domain: one more hop, over the NVSwitches' link)
                via = (e >= 0) & (e != s) & (t["g2n"][s] >= 0) & t["pxok"][at] & (t["dom"][at] == t["dom"][s])
                across = via & (t["nvs"][at] != t["nvs"][s])
                if across.any():  # (a regular fabric links a domain's NVSwitches pairwise, _regular())
                    switches, li = self._nvswitch_nodes, self.link_index
                    n = len(switches)
                    codes, inverse = np.unique(t["nvs"][s[across]] * n + t["nvs"][at[across]], return_inverse=True)
                    bridge = np.full(len(s), -1, dtype=np.int64)
                    bridge[across] = np.array([li[(switches[c // n], switches[c % n])] for c in codes.tolist()],
                                              dtype=np.int64)[inverse]
                exits = np.where(via, e, s)
            else:
                exits, via = s, np.zeros(len(s), dtype=bool)
                across = np.zeros(len(s), dtype=bool)
            a, b = t["sw"][exits], t["sw"][d]
            nsw = len(self._switch_nodes)
            upairs, inv = np.unique(a * nsw + b, return_inverse=True)
            by_code = self._mid_by_code
            found = [by_code.get(u) for u in upairs.tolist()]
            if None in found:
                for i, u in enumerate(upairs.tolist()):
                    if found[i] is None:
                        m = self._mid_array(self._switch_nodes[u // nsw], self._switch_nodes[u % nsw])
                        found[i] = by_code[u] = (m, len(m), m.shape[1])
            mids = [f[0] for f in found]
            k = np.fromiter((f[1] for f in found), dtype=np.int64, count=len(found))
            width = np.fromiter((f[2] for f in found), dtype=np.int64, count=len(found))
            h = ecmp_hash_array(t["nid"][s], t["nid"][d], labels[struct], self.seed)
            pick = (h % k[inv].astype(np.uint64)).astype(np.int64)
            for m in np.unique(width).tolist():
                chosen = np.flatnonzero(width == m)
                table = np.concatenate([mids[c] for c in chosen.tolist()])
                offset = np.zeros(len(upairs), dtype=np.int64)
                offset[chosen] = np.cumsum(k[chosen]) - k[chosen]
                for lead in (0, 2, 3):  # no proxy; GPU -> NVSwitch -> proxy; GPU -> NVSwitch -> NVSwitch -> proxy
                    kind = ~via if lead == 0 else (via & ~across if lead == 2 else across)
                    rows = np.flatnonzero((width[inv] == m) & kind)
                    if not len(rows):
                        continue
                    block = np.empty((len(rows), m + 4 + lead), dtype=np.int64)
                    ru, rd = exits[rows], d[rows]
                    if lead:
                        block[:, 0] = t["g2n"][s[rows]]
                        if lead == 3:
                            block[:, 1] = bridge[rows]
                        block[:, lead - 1] = t["n2g"][ru]
                    block[:, lead] = t["up0"][ru]
                    block[:, lead + 1] = t["up1"][ru]
                    block[:, lead + 2:lead + m + 2] = table[offset[inv[rows]] + pick[rows]]
                    block[:, lead + m + 2] = t["dn0"][rd]
                    block[:, lead + m + 3] = t["dn1"][rd]
                    out.append((struct[rows], block))
            done[struct] = True
        for i in np.flatnonzero(~done).tolist():
            links = self.route(gpus[int(src[i])], gpus[int(dst[i])], int(labels[i]))
            out.append((np.array([i]), links[None, :]))
        return out

    def _mid_array(self, first: Hashable, last: Hashable) -> np.ndarray:
        """The link ids of the equal-cost switch paths from ``first`` to ``last`` as a ``(paths, links)``
        array (:meth:`_mids` order; cached per switch pair)."""
        key = (first, last)
        arr = self._mid_arrays.get(key)
        if arr is None:
            middles = self._mid_links.get(key)
            if middles is None:
                li = self.link_index
                middles = self._mid_links[key] = [[li[(m[i], m[i + 1])] for i in range(len(m) - 1)]
                                                  for m in self._mids(first, last)]
            arr = self._mid_arrays[key] = np.array(middles, dtype=np.int64).reshape(len(middles), -1)
        return arr

    def paths(self, src: Hashable, dst: Hashable) -> list[np.ndarray]:
        """All equal-cost routes from ``src`` to ``dst`` as arrays of link ids (cached per pair)."""
        key = (src, dst)
        cached = self._pair_paths.get(key)
        if cached is None:
            legs = self._structural(src, dst)
            if legs is not None:
                up, middles, down = legs
                cached = [np.array(up + m + down, dtype=np.int64) for m in middles]
            else:
                li = self.link_index
                cached = [np.array([li[(p[i], p[i + 1])] for i in range(len(p) - 1)], dtype=np.int64)
                          for p in self._node_paths(src, dst)]
            self._pair_paths[key] = cached
        return cached

    def route(self, src: Hashable, dst: Hashable, label: int = 0) -> np.ndarray:
        """The link ids of the route a flow labelled ``label`` takes from ``src`` to ``dst``.

        On a regular fabric only the chosen route is built (a fresh array; callers cache it), never the
        other equal-cost ones, and nothing is kept per pair here: the pick is the same as
        ``paths(src, dst)[hash % len(paths)]`` (tested)."""
        legs = self._structural(src, dst)
        if legs is None:
            a, b = self._attach.get(src), self._attach.get(dst)
            if a is not None and b is not None and a[0] is not None and a[0] == b[0] and src != dst:
                li = self.link_index  # inside one NVSwitch domain: the one route through its switch
                return np.array([li[(src, a[0])], li[(a[0], dst)]], dtype=np.int64)
            options = self.paths(src, dst)
            if len(options) == 1:
                return options[0]
            return options[ecmp_hash(self.node_id[src], self.node_id[dst], label, self.seed) % len(options)]
        up, middles, down = legs
        if len(middles) == 1:
            mid = middles[0]
        else:
            mid = middles[ecmp_hash(self.node_id[src], self.node_id[dst], label, self.seed) % len(middles)]
        return np.array(up + mid + down, dtype=np.int64)
