"""A uniform all-to-all over many ranks as a handful of flows, built with numpy (``all_to_all: bulk``).

An all-to-all over ``n`` ranks is ``n(n-1)`` point-to-point transfers: 16.7 million at 4,096 GPUs. Planning
them one by one (a :class:`~simulator.collectives.Transfer` each) and simulating NCCL's staggered waves as
flows (``all_to_all: grouped``: ``~2(n-1)`` flows over ``~n`` links each, no two waves alike once ECMP
collisions bind on the spine) costs minutes at 1,024 GPUs. This module plans the same transfers with
array passes — offsets in blocks, routes by :meth:`~simulator.routing.Router.route_blocks`, link loads by
``bincount`` — and runs them as at most four flows:

* per class (NVLink: both ends in one server; network: the others), a **body** flow: every transfer of the
  class but each member's last one, as one flow over the links they cross, each link weighted by the
  transfers crossing it; it starts at the earliest of their NCCL latencies;
* per class a **tail** flow: each member's last transfer of the class to start (its last remote round in
  NCCL's order, :func:`~simulator.collectives.remote_rounds`), at the latest latency of the class.

Every transfer moves the same bytes (``S/n``), so the body's flow moves ``S/n`` at one rate ``r`` and loads
link ``l`` with ``w_l · r``: bytes per link and per GPU pair are exact. What is approximated is time
inside the collective: the body's transfers all start with the first and finish together at the rate of
the most loaded link (the bottleneck link of the whole all-to-all, which bounds its time anyway: a link
carrying ``w`` transfers of ``S/n`` needs ``w·S/(n·c)`` seconds), while NCCL's proxy posts the messages
to other servers one after another. The tail keeps the latency-bound end right: an all-to-all of small messages takes
its last transfer's latency, one of large messages the first latency plus the bottleneck's bytes. The
whole collective therefore takes about ``max(L_first + bottleneck, L_last + S/(n·c))``, as the staggered
waves do. Measured against ``grouped`` in docs/DESIGN.md ("Bulk all-to-all").
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Sequence

import numpy as np

from .collectives import offset_peers, remote_rounds
from .nccl import BANDWIDTH_FACTOR, p2p_protocol, step_latencies

BULK_OFFSETS_PER_BLOCK = 1 << 22  # transfers routed per array pass (bounds the memory of one pass)
BULK_CACHED_RANKS = 256  # groups up to this size keep their routed pairs (_routed) and alltoallv layout
BULK_CACHED_FILLS = 4096  # alltoallv sizes weighed per layout shape kept (then forgotten at once) ...
BULK_CACHED_FILL_BYTES = 1 << 28  # ... or once their sizes' keys hold this many bytes (they grow as ranks²)
BULK_CACHED_SHAPES = 1024  # alltoallv layout shapes given an id (then forgotten; ids are never reused)
# Cluster graph -> what depends only on it, the routing seed and the group, kept as long as the graph lives
# (a sweep over message sizes builds a new fabric per size): ("routes", seed, pxn, group) -> routed pairs
# (_routed); ("plan", seed, pxn, group, latency model) -> a uniform plan (_fill of a _layout); ("layout", seed,
# pxn, group, latency model) -> the last alltoallv layout of the group and the pairs it was made for;
# ("one switch", group) -> under_one_switch; ("group", group) -> its arrays (_group_arrays); "shapes" ->
# {alltoallv layout shape: id} (_layout_shape; "next shape" the last id); "fills" -> {(layout shape id,
# sizes): _weigh per flow} ("fill bytes": what their sizes' keys hold);
# "sizes" -> (matrix, ranks, sizes, largest, senders, sizes' bytes, whether the matrix is tuples) of the last
# alltoallv.
# Under a graph, one such dict per rank -> GPU mapping (cluster.gpus: two jobs' views of one cluster share
# its graph, and their rank numbers name different GPUs), by the mapping's identity (the tuple is held).
# The routes, plans and layouts also depend on network.pxn, which their keys carry.
_BY_GRAPH: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _cache_of(cluster) -> dict:
    """What is kept for ``cluster``'s graph and rank numbering (see ``_BY_GRAPH``)."""
    views = _BY_GRAPH.setdefault(cluster.graph, {})
    entry = views.get(id(cluster.gpus))
    if entry is None or entry[0] is not cluster.gpus:
        entry = views[id(cluster.gpus)] = (cluster.gpus, {})
    return entry[1]


class AllToAllPairs(Sequence):
    """The ``(src rank, dst rank)`` pairs one bulk flow carries, made on demand (16.7 million at 4,096 GPUs
    are not kept as tuples): member ``i`` of ``group`` to member ``(i + k) % n`` for the offsets ``k`` of
    ``mask`` (a boolean ``(n, n)`` array over ``(i, k)``; ``k = 0`` is never set)."""

    def __init__(self, group: np.ndarray, mask: np.ndarray) -> None:
        self._group = group
        self._mask = mask
        self._len = int(mask.sum())

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """``(src ranks, dst ranks)`` as integer arrays, in iteration order (member-major)."""
        n = len(self._group)
        i, k = np.nonzero(self._mask)
        return self._group[i], self._group[(i + k) % n]

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[tuple[int, int]]:
        src, dst = self.arrays()
        return zip(src.tolist(), dst.tolist())

    def __getitem__(self, index):  # type: ignore[override]
        src, dst = self.arrays()
        if isinstance(index, slice):
            return list(zip(src[index].tolist(), dst[index].tolist()))
        return int(src[index]), int(dst[index])


def bulk_flows(fabric, group: tuple[int, ...], nbytes: float, count: int = 1,
               matrix: tuple[tuple[float, ...], ...] | None = None) -> tuple[tuple, ...]:
    """The flow specs ``(links, wire bytes, latency_s, payload_bytes)`` of one all_to_all over ``group``,
    repeated ``count`` times back to back, as the body and tail flows of the module docstring (at most
    four; fewer when a class is empty). Uniform: ``nbytes`` is ``S`` and every member sends ``S/n`` to
    every other. Alltoallv: ``matrix[i][j]`` bytes from member ``i`` to member ``j`` (pairs of 0 bytes
    send nothing); a flow then moves its largest member's bytes and weights each member's links by its
    bytes over that largest, so every member moves its own bytes and all finish together (as
    ``proportional`` waves do). Latencies follow :meth:`simulator.fabric.Fabric._latency` for the staggered direct
    plan (:func:`simulator.collectives.plan_direct` with ``stagger``): the base latency once, then one step
    for a transfer inside a server and, for the transfer to the ``r``-th peer on another server, a network
    step and ``r - 1`` intra-server steps (the proxy posts network messages one after another), each step
    at least its route's own link latency. The links arrays are registered with the fabric's
    network (:meth:`~simulator.network.FlowNetwork.declare`: weights and member counts) and its
    ``pairs_of`` (an :class:`AllToAllPairs`)."""
    n = len(group)
    cache = _cache_of(fabric.cluster)
    members, peer, offsets, servers, spans = _group_arrays(fabric, cache, group)
    # sizes[i, k]: bytes member i sends to its k-th peer, or None when all are S/n
    sizes = None
    if matrix is not None:
        # (the replicas of one alltoallv share its matrix: the last one's sizes are kept, read only)
        last = cache.get("sizes")
        if last is not None and last[0] is matrix and last[1] == n and last[6]:
            sizes, largest, sends, sizes_key = last[2:6]
        else:
            sizes = np.asarray(matrix, dtype=float)[offsets[:, None], peer]
            sizes[:, 0] = 0.0
            largest, sends, sizes_key = float(sizes.max()), sizes > 0, sizes.tobytes()
            sizes.flags.writeable = sends.flags.writeable = False
            frozen = type(matrix) is tuple and all(type(row) is tuple for row in matrix)  # (never changes)
            cache["sizes"] = (matrix, n, sizes, largest, sends, sizes_key, frozen)
    chunk = nbytes / n if sizes is None else largest
    nccl = fabric.config.nccl_latency
    protocol = p2p_protocol(chunk, spans) if nccl else "Simple"
    if nccl:
        base, intra, inter = step_latencies("direct", protocol, spans)
    else:
        base, intra, inter = 0.0, fabric.config.step_latency_s, fabric.config.step_latency_s
    factor = BANDWIDTH_FACTOR[protocol]

    if sizes is None:
        sends = offsets > 0
    key = ("plan" if sizes is None else "layout", fabric.config.seed, fabric.config.pxn, group, nccl, base, intra,
           inter)
    if sizes is None:  # a uniform plan depends only on the fabric, the group and the latency constants
        plan = cache.get(key)
        if plan is None:
            plan = cache[key] = _fill(_layout(fabric, group, members, peer, sends, servers, nccl, intra, inter))
    else:
        # An alltoallv's layout depends on its sizes only through which pairs send anything: kept (the last
        # one per group, for groups whose routes are kept) and weighted by each call's sizes.
        mask_key = sends.tobytes()
        kept = cache.get(key)
        if kept is not None and kept[0] == mask_key:
            layout, shape = kept[1], kept[2]
        else:
            layout = _layout(fabric, group, members, peer, sends, servers, nccl, intra, inter, keep=True)
            shape = None
            if n <= BULK_CACHED_RANKS:
                shape = _layout_shape(cache, layout)
                cache[key] = (mask_key, layout, shape)
        # What the sizes make of the layout's flows is a function of the layout's shape and the sizes: kept
        # per (shape, sizes) (the same routing matrix recurs over the EP groups of every replica and stage).
        weighed = None
        if shape is not None:
            fills = cache.setdefault("fills", {})
            fill_key = (shape, sizes_key)
            weighed = fills.get(fill_key)
        if weighed is None:
            weighed = [_weigh(values, moved, flow_max) for _links, values, _lat, _pairs, moved, flow_max
                       in _fill(layout, sizes)]  # (flow_max: the flow's largest transfer, not the matrix's)
            if shape is not None:
                held = cache.get("fill bytes", 0) + len(sizes_key)
                if len(fills) >= BULK_CACHED_FILLS or held > BULK_CACHED_FILL_BYTES:
                    fills.clear()
                    held = len(sizes_key)
                cache["fill bytes"] = held
                fills[fill_key] = weighed
        # a fresh links array per flow: the network keys a flow's weights by the array (FlowNetwork.declare)
        plan = [(f.links.copy(), *w, f.latency, f.pairs) for f, w in zip(layout, weighed)]
    network = fabric.network
    a2a = fabric.all_to_all_factor  # the network class's flows: wire bytes over this too
    specs = []
    if sizes is None:
        for links, values, latency, pairs, _moved, _largest in plan:
            payload = chunk * len(pairs)
            fabric._pairs[id(links)] = (links, pairs)
            network.declare(links, len(pairs), values)
            f = factor * a2a if a2a != 1.0 and _crosses(pairs, servers) else factor
            specs.append((links, count * chunk / f, count * (base + latency), count * payload))
    else:
        for links, weights, largest, payload, shares, latency, pairs in plan:
            fabric._pairs[id(links)] = (links, pairs, shares)
            network.declare(links, len(pairs), weights)
            f = factor * a2a if a2a != 1.0 and _crosses(pairs, servers) else factor
            specs.append((links, count * largest / f, count * (base + latency), count * payload))
    return tuple(specs)


def _crosses(pairs: AllToAllPairs, servers: np.ndarray) -> bool:
    """Whether a flow's transfers are of the network class (their ends on different servers; every transfer
    of a flow is of one class): its first transfer's."""
    member, offset = np.argwhere(pairs._mask)[0]
    return bool(servers[member] != servers[(member + offset) % len(servers)])


def _weigh(values: np.ndarray, moved: np.ndarray, largest: float) -> tuple:
    """``(link weights, largest transfer, payload, each transfer's share of the payload)`` of one alltoallv
    flow from its links' ``values`` (bytes), its transfers' bytes ``moved`` and the ``largest`` of them (the
    arrays read only: they are shared by every flow of that shape and sizes)."""
    payload = float(moved.sum())
    weights, shares = values / largest, moved / payload
    weights.flags.writeable = shares.flags.writeable = False
    return weights, largest, payload, shares


def _layout_shape(cache: dict, layout: list) -> int:
    """An id of what :func:`_fill` reads of an alltoallv ``layout`` besides the sizes (per flow: dense or not,
    its links' count, its transfers and the positions of their crossings): layouts of one id weigh equal
    sizes into equal flows. Ids are kept in ``cache``."""
    parts = []
    for f in layout:
        parts += [f.dense, len(f.links), f.mask.shape, f.mask.tobytes(), len(f.blocks)]
        for idx, local, width in f.blocks:
            parts += [idx.dtype.str, idx.tobytes(), local.dtype.str, local.tobytes(),
                      np.asarray(width).dtype.str, np.asarray(width).tobytes()]
    shapes = cache.setdefault("shapes", {})
    key = tuple(parts)
    found = shapes.get(key)
    if found is None:
        if len(shapes) >= BULK_CACHED_SHAPES:
            shapes.clear()  # (ids come from a counter: a layout holding an old id never meets a new shape's)
        found = shapes[key] = cache["next shape"] = cache.get("next shape", -1) + 1
    return found


def _group_arrays(fabric, cache: dict, group: tuple[int, ...]) -> tuple:
    """``(members, peer, offsets, servers, spans)`` of ``group``: its ranks (int64), :func:`offset_peers`, the
    offsets ``0 .. n-1`` (int32), each member's server (int32) and whether they span servers; kept per group of
    at most ``BULK_CACHED_RANKS`` ranks in ``cache`` (the cluster graph's), read only."""
    key = ("group", group)
    out = cache.get(key)
    if out is None:
        n = len(group)
        members = np.asarray(group, dtype=np.int64)
        servers = np.asarray(fabric._servers, dtype=np.int32)[members]
        out = (members, offset_peers(n), np.arange(n, dtype=np.int32), servers, bool((servers != servers[0]).any()))
        if n <= BULK_CACHED_RANKS:
            for a in out[:4]:
                a.flags.writeable = False
            cache[key] = out
    return out


class _Flow:
    """One flow of a bulk all-to-all before sizes: its transfers (``mask`` over ``(member, offset)``, as
    ``pairs``), the links they cross (sorted ids), how many of them cross each (``counts``), and the step
    latency it starts after (s, without the base latency). With ``blocks`` (an alltoallv's layout), per
    routed block the flat ``member * n + offset`` index of each transfer, the position in ``links`` of each
    crossing and the crossings per transfer, to weight the links by each call's sizes."""

    __slots__ = ("links", "counts", "latency", "mask", "pairs", "blocks", "dense")

    def __init__(self, links: np.ndarray, counts: np.ndarray, latency: float, mask: np.ndarray,
                 pairs: AllToAllPairs, blocks: list | None, dense: bool) -> None:
        self.links, self.counts, self.latency, self.mask, self.pairs = links, counts, latency, mask, pairs
        self.blocks, self.dense = blocks, dense


def _layout(fabric, group: tuple[int, ...], members: np.ndarray, peer: np.ndarray, sends: np.ndarray,
            servers: np.ndarray, nccl: bool, intra: float, inter: float, keep: bool = False) -> list[_Flow]:
    """The flows of :func:`bulk_flows` before sizes and counts, per (class, part) that moves anything: the
    transfers of ``sends`` (a boolean ``(member, offset)`` array, or one row for all members) split into
    the classes and parts of the module docstring, the links they cross and the earliest (body) or latest
    (tail) step latency of their transfers. ``keep`` keeps each flow's crossings per transfer
    (:attr:`_Flow.blocks`) for :func:`_fill` to weight by sizes."""
    n = len(group)
    offsets = np.arange(n, dtype=np.int32)
    num_links = len(fabric.capacity)

    # cross[i, k]: member i's k-th peer sits on another server; remote[i, k]: that transfer's place among i's
    # transfers to other servers in NCCL's order of rounds
    remote = remote_rounds(servers, peer)
    cross = remote > 0
    # tail[i, k]: the transfer is member i's last of its class to start: its last remote peer in NCCL's order
    # of rounds (the largest place), or its peer in the server at the largest offset (they start together)
    rows = np.arange(n)
    tail = np.zeros((n, n), dtype=bool)
    for of_class, order in ((cross, remote), (~cross, offsets)):
        keys = np.where(of_class & sends, order, -1)
        lastk = keys.argmax(axis=1)
        has = keys[rows, lastk] > 0
        tail[rows[has], lastk[has]] = True

    # per (class, part): transfers crossing each link, as one dense array per link id when the transfers
    # outnumber the links, else as the link ids of every crossing, counted at the end; and the latency range
    keys = [(c, p) for c in (False, True) for p in ("body", "tail")]
    dense = n * n > num_links
    loads = {key: np.zeros(num_links) if dense else [] for key in keys}
    kept: dict = {key: [] for key in keys}  # per routed block: (flat transfer index, link ids, width)
    first = dict.fromkeys(keys, np.inf)
    last = dict.fromkeys(keys, -np.inf)
    for wi, wk, block, phys in _routed(fabric, group, members, peer, sends):
        is_net = cross[wi, wk]
        if nccl:  # a peer in the server: one step; the r-th remote peer: r - 1 steps and a network step
            lat = np.where(is_net, (remote[wi, wk] - 1) * np.maximum(intra, phys) + np.maximum(inter, phys),
                           np.maximum(intra, phys))
        else:
            lat = intra + phys
        is_tail = tail[wi, wk]
        for c in (False, True):
            for part, sel in (("body", ~is_tail), ("tail", is_tail)):
                chosen = np.flatnonzero((is_net == c) & sel)
                if not len(chosen):
                    continue
                key = (c, part)
                ids = block[chosen].ravel()
                if keep:
                    kept[key].append((wi[chosen].astype(np.int64) * n + wk[chosen], ids, block.shape[1]))
                if dense:
                    loads[key] += np.bincount(ids, minlength=num_links)
                else:
                    loads[key].append(ids)
                first[key] = min(first[key], float(lat[chosen].min()))
                last[key] = max(last[key], float(lat[chosen].max()))

    flows = []
    for key in keys:
        c, part = key
        if dense:
            links = np.flatnonzero(loads[key])
            counts = loads[key][links]
            blocks = [(idx, np.searchsorted(links, ids), w) for idx, ids, w in kept[key]]
        elif loads[key]:
            links, inverse = np.unique(np.concatenate(loads[key]), return_inverse=True)
            inverse = inverse.ravel()
            counts = np.bincount(inverse).astype(float)
            blocks = [(np.concatenate([b[0] for b in kept[key]]), inverse,
                       np.concatenate([np.full(len(b[0]), b[2]) for b in kept[key]]))] if keep else []
        else:
            continue
        if not len(links):
            continue
        mask = (cross == c) & (tail if part == "tail" else ~tail) & sends
        flows.append(_Flow(links, counts, first[key] if part == "body" else last[key], mask,
                           AllToAllPairs(members, mask), blocks if keep else None, dense))
    return flows


def _fill(layout: list[_Flow], sizes: np.ndarray | None = None) -> list[tuple]:
    """:func:`bulk_flows`' plan from a layout: per flow ``(links, loads, latency_s, pairs, bytes per pair or
    None, largest transfer or None)`` — ``loads`` the transfers crossing each link (uniform) or their bytes
    (alltoallv: ``sizes[i, k]`` bytes from member ``i`` to its ``k``-th peer), summed in the order the
    transfers were routed."""
    if sizes is None:
        return [(f.links, f.counts, f.latency, f.pairs, None, None) for f in layout]
    flat = sizes.ravel()
    plan = []
    for f in layout:
        moved = [flat[b[0]] for b in f.blocks]
        if f.dense:  # summed per routed block, as the dense counts were
            values = np.zeros(len(f.links))
            for (_idx, local, width), m in zip(f.blocks, moved):
                values += np.bincount(local, np.repeat(m, width), minlength=len(f.links))
        else:
            (_idx, inverse, widths), = f.blocks
            values = np.bincount(inverse, np.repeat(moved[0], widths)).astype(float)
        plan.append((f.links, values, f.latency, f.pairs, sizes[f.mask], max(float(m.max()) for m in moved)))
    return plan


def _routed(fabric, group: tuple[int, ...], members: np.ndarray, peer: np.ndarray, sends: np.ndarray):
    """Yield ``(i, k, routes, route latencies)`` blocks covering every transfer ``(i, k)`` with ``sends``:
    ``routes[j]`` is the link ids from member ``i[j]`` to its ``k[j]``-th peer (ECMP's pick, label 0) and
    ``route latencies[j]`` their summed link latencies (s). Routed with
    :meth:`~simulator.routing.Router.route_blocks`, ``BULK_OFFSETS_PER_BLOCK`` transfers at a time. The
    routes of every pair of a group of at most ``BULK_CACHED_RANKS`` ranks are kept per group (an EP
    group's dispatch and combine, every layer and micro-batch, with other sizes)."""
    n = len(group)
    cache = _cache_of(fabric.cluster)
    key = ("routes", fabric.config.seed, fabric.config.pxn, group)
    blocks = cache.get(key)
    if blocks is None:
        cached = n <= BULK_CACHED_RANKS
        wanted = np.broadcast_to(np.arange(n) > 0, (n, n)) if cached else np.broadcast_to(sends, (n, n))
        blocks = []
        per_block = max(1, BULK_OFFSETS_PER_BLOCK // n)
        for r0 in range(0, n, per_block):
            i, k = np.nonzero(wanted[r0:r0 + per_block])
            i += r0
            src, dst = members[i], members[peer[i, k]]
            for where, block in fabric.router.route_blocks(fabric.cluster.gpus, src, dst,
                                                           np.zeros(len(src), dtype=np.int64)):
                entry = (i[where], k[where], block, fabric.latency[block].sum(axis=1))
                if not cached:
                    yield entry
                else:
                    blocks.append(entry)
        if not cached:
            return
        cache[key] = blocks
    for i, k, block, phys in blocks:
        keep = sends[i, k] if sends.ndim == 2 else sends[k]
        if keep.all():
            yield i, k, block, phys
        elif keep.any():
            yield i[keep], k[keep], block[keep], phys[keep]


SLOW_ALLTOALLV_RANKS = 32
"""EP groups from this size make ``grouped`` alltoallvs slow: one flow per GPU pair (992 per exchange at 32
ranks, 4,032 at 64; a 64-rank Zipf alltoallv takes ~20 s of CPU, a DeepSeek-style EP64 step over 1,024 GPUs
did not finish in 10 minutes)."""


def slow_alltoallv_note(ep: int, mode: str, routing: str, is_moe: bool, one_switch: bool = False) -> str | None:
    """A one-line note for a user about to simulate MoE exchanges that will take long (EP groups of at least
    :data:`SLOW_ALLTOALLV_RANKS` ranks, routing that makes their sizes unequal, a network mode that runs one
    flow per GPU pair for them: not ``auto`` with the group under one switch, ``one_switch``), naming the
    knob that makes them fast and its cost; None otherwise."""
    if not is_moe or ep < SLOW_ALLTOALLV_RANKS or routing == "balanced" or mode == "bulk":
        return None
    if mode == "auto" and one_switch:
        return None
    return (f"EP-{ep} all-to-alls of unequal sizes across switches run as one flow per GPU pair "
            f"({ep * (ep - 1):,} per exchange, network.all_to_all: {mode}), which can take many minutes; "
            f"network.all_to_all: bulk runs each as at most 4 flows (optimistic where EP groups share "
            f"oversubscribed uplinks, by up to 20% per exchange; docs/DESIGN.md, 'Bulk all-to-all')")


def under_one_switch(cluster, ranks) -> bool:
    """Whether every transfer between GPUs ``ranks`` of ``cluster`` that leaves a server goes NIC → one switch
    → NIC: the GPUs' NICs all hang off one switch (or the GPUs share one server). Then no switch-to-switch
    link carries their all-to-all, only each GPU's own NIC and NVLink ports can bind, and a bulk all-to-all
    takes what one flow per GPU pair takes (measured equal to rounding, docs/DESIGN.md, "Bulk all-to-all"),
    alltoallv included. A GPU without a NIC counts as sharing its server's. Kept per cluster graph and
    group, with the bulk plans."""
    ranks = tuple(ranks)
    cache = _cache_of(cluster)
    key = ("one switch", ranks)
    out = cache.get(key)
    if out is None:
        out = cache[key] = _under_one_switch(cluster, ranks)
    return out


def _under_one_switch(cluster, ranks: tuple[int, ...]) -> bool:
    if len({cluster.server_of(r) for r in ranks}) <= 1:  # NVLink only
        return True
    graph = cluster.graph
    switches: set = set()
    for rank in ranks:
        for nic in graph.successors(cluster.gpus[rank]):
            if isinstance(nic, tuple) and nic and nic[0] == "nic":
                switches.update(n for n in graph.successors(nic) if isinstance(n, tuple) and n
                                and n[0] in ("leaf", "spine", "core"))
        if len(switches) > 1:
            return False
    return True
