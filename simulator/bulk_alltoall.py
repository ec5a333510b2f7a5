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
* per class a **tail** flow: each member's last transfer of the class (the peer it reaches last in NCCL's
  offset order), at the latest latency of the class.

Every transfer moves the same bytes (``S/n``), so the body's flow moves ``S/n`` at one rate ``r`` and loads
link ``l`` with ``w_l · r``: bytes per link and per GPU pair are exact. What is approximated is time
inside the collective: the body's transfers all start with the first and finish together at the rate of
the most loaded link (the bottleneck link of the whole all-to-all, which bounds its time anyway: a link
carrying ``w`` transfers of ``S/n`` needs ``w·S/(n·c)`` seconds), while NCCL staggers their starts by a
step latency each. The tail keeps the latency-bound end right: an all-to-all of small messages takes
its last transfer's latency, one of large messages the first latency plus the bottleneck's bytes. The
whole collective therefore takes about ``max(L_first + bottleneck, L_last + S/(n·c))``, as the staggered
waves do. Measured against ``grouped`` in docs/DESIGN.md ("Bulk all-to-all").
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

BULK_OFFSETS_PER_BLOCK = 1 << 22  # transfers routed per array pass (bounds the memory of one pass)


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


def bulk_flows(fabric, group: tuple[int, ...], nbytes: float, count: int = 1) -> tuple[tuple, ...]:
    """The flow specs ``(links, wire bytes, latency_s, payload_bytes)`` of one uniform all_to_all of
    ``nbytes`` (``S``: every member sends ``S/n`` to every other) over ``group``, repeated ``count``
    times back to back, as the body and tail flows of the module docstring (at most four; fewer when a
    class is empty). Latencies follow :meth:`simulator.fabric.Fabric._latency` for the staggered direct
    plan (:func:`simulator.collectives.plan_direct` with ``stagger``): the base latency once, then for the
    transfer to the ``k``-th peer ``k`` steps, those crossing servers at the network's step latency, each
    step at least its route's own link latency. The links arrays are registered with the fabric's
    network (:meth:`~simulator.network.FlowNetwork.declare`: weights and member counts) and its
    ``pairs_of`` (an :class:`AllToAllPairs`)."""
    from .nccl import BANDWIDTH_FACTOR, p2p_protocol, step_latencies

    n = len(group)
    chunk = nbytes / n
    members = np.asarray(group, dtype=np.int64)
    servers = np.asarray(fabric._servers, dtype=np.int64)[members]
    nccl = fabric.config.nccl_latency
    protocol = p2p_protocol(chunk) if nccl else "Simple"
    if nccl:
        base, intra, inter = step_latencies("direct", protocol, bool((servers != servers[0]).any()))
    else:
        base, intra, inter = 0.0, fabric.config.step_latency_s, fabric.config.step_latency_s
    factor = BANDWIDTH_FACTOR[protocol]
    num_links = len(fabric.capacity)
    latency_of = fabric.latency
    gpus = fabric.cluster.gpus

    # cross[i, k]: member i's k-th peer (in NCCL's offset order) sits on another server; remote[i, k]: how
    # many of its first k peers do. ``n x n`` arrays: 16 MiB (bool) and 64 MiB (int32) at 4,096 ranks.
    offsets = np.arange(n, dtype=np.int32)
    peer_server = np.empty((n, n), dtype=servers.dtype)
    for i in range(n):
        peer_server[i] = np.roll(servers, -i)
    cross = peer_server != servers[:, None]
    del peer_server
    remote = np.cumsum(cross, axis=1, dtype=np.int32)
    # tail[i, k]: the transfer is member i's last of its class (the largest offset k >= 1 of that class)
    rows = np.arange(n)
    tail = np.zeros((n, n), dtype=bool)
    for of_class in (cross, ~cross):
        lastk = np.where(of_class & (offsets > 0), offsets, -1).max(axis=1)
        has = lastk > 0
        tail[rows[has], lastk[has]] = True

    # per (class, part): link loads (transfers crossing each link) and the latency range
    loads = {(c, p): np.zeros(num_links) for c in (False, True) for p in ("body", "tail")}
    first = dict.fromkeys(loads, np.inf)
    last = dict.fromkeys(loads, -np.inf)
    per_block = max(1, BULK_OFFSETS_PER_BLOCK // max(n, 1))
    for r0 in range(0, n, per_block):
        i, k = np.nonzero(np.broadcast_to(offsets[None, :] > 0, (min(per_block, n - r0), n)))
        i += r0
        src, dst = members[i], members[(i + k) % n]
        for where, block in fabric.router.route_blocks(gpus, src, dst, np.zeros(len(src), dtype=np.int64)):
            wi, wk = i[where], k[where]
            phys = latency_of[block].sum(axis=1)
            if nccl:
                nets = remote[wi, wk]
                lat = (wk - nets) * np.maximum(intra, phys) + nets * np.maximum(inter, phys)
            else:
                lat = intra + phys
            is_net = cross[wi, wk]
            is_tail = tail[wi, wk]
            for c in (False, True):
                for part, sel in (("body", ~is_tail), ("tail", is_tail)):
                    chosen = np.flatnonzero((is_net == c) & sel)
                    if not len(chosen):
                        continue
                    key = (c, part)
                    loads[key] += np.bincount(block[chosen].ravel(), minlength=num_links)
                    first[key] = min(first[key], float(lat[chosen].min()))
                    last[key] = max(last[key], float(lat[chosen].max()))

    network = fabric.network
    specs = []
    for c in (False, True):
        for part in ("body", "tail"):
            key = (c, part)
            load = loads[key]
            links = np.flatnonzero(load)
            if not len(links):
                continue
            mask = (cross == c) & (tail if part == "tail" else ~tail)
            mask[:, 0] = False
            pairs = AllToAllPairs(members, mask)
            latency = count * (base + (first[key] if part == "body" else last[key]))
            network.declare(links, len(pairs), load[links])
            fabric._pairs[id(links)] = (links, pairs)
            specs.append((links, count * chunk / factor, latency, count * chunk * len(pairs)))
    return tuple(specs)
