"""Collective algorithms: plans of point-to-point transfers, on logical ranks.

An algorithm turns ``(kind, group, nbytes)`` into a :class:`Plan`: phases run
one after another; the transfers of a phase run concurrently and the phase
ends with its slowest transfer. A :class:`Transfer` moves ``nbytes`` over each
of its hops at one common rate — a pipelined ring (NCCL's ring is pipelined in
chunks, so every link of the ring runs at the ring's bottleneck rate) is one
transfer whose hops are all the ring's edges. ``steps`` is how many
algorithm steps the transfer stands for; each step costs the per-step latency
α once, so a contention-free ring all-reduce takes exactly
``2(n-1)·α + 2(n-1)/n · S/B``.

Algorithms only see ranks and the rank → server map; the network maps ranks
to physical routes. ``fidelity="full"`` expands rings into their individual
steps (one phase per step, one transfer per hop) for validation; ``"fast"``
keeps one pipelined transfer per ring. Without contention both give the same
time.

Registry (``ALGORITHMS``) and default
-------------------------------------
=================  ===================================================  =====================
algorithm          kinds                                                 shape
=================  ===================================================  =====================
ring               all_reduce, all_gather, reduce_scatter, broadcast,    NCCL multi-channel ring
                   reduce
tree               all_reduce, broadcast, reduce                         binary tree of servers,
                                                                          chains inside servers
hierarchical       all_reduce, all_gather, reduce_scatter                intra-server ring, inter-
                                                                          server rings rail by rail
direct             all_to_all, gather, broadcast, reduce                 pairwise / star
parameter_server   all_reduce                                            push to root, pull back
=================  ===================================================  =====================

The kinds column is :data:`ALGORITHM_KINDS`; asking an algorithm for another kind raises a
:class:`CollectiveError` that lists the algorithms valid for the kind (:func:`valid_algorithms`).

``auto`` (the default) does what NCCL's tuner does: among the algorithms NCCL
has for the collective (ring and tree for all-reduce, ring for all-gather and
reduce-scatter, ``direct`` for all_to_all and gather) it estimates each one's
contention-free time and picks the fastest. ``hierarchical`` is not an NCCL
algorithm; it runs only when asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

COLLECTIVE_ALGORITHMS = ("auto", "ring", "tree", "hierarchical", "direct", "parameter_server")

ALGORITHM_KINDS: dict[str, tuple[str, ...]] = {  # the kinds each planner implements (for every group)
    "ring": ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce"),
    "tree": ("all_reduce", "broadcast", "reduce"),
    "hierarchical": ("all_reduce", "all_gather", "reduce_scatter"),
    "direct": ("all_to_all", "gather", "broadcast", "reduce"),
    "parameter_server": ("all_reduce",),
}


class CollectiveError(ValueError):
    """A collective that cannot be planned (unknown algorithm, algorithm not valid for the kind)."""


def valid_algorithms(kind: str) -> tuple[str, ...]:
    """The algorithms that plan ``kind``, in :data:`COLLECTIVE_ALGORITHMS` order: ``auto`` (when it has
    candidates for the kind, :data:`AUTO_CANDIDATES`) and every algorithm of :data:`ALGORITHM_KINDS` that
    implements it."""
    return tuple(a for a in COLLECTIVE_ALGORITHMS
                 if (kind in AUTO_CANDIDATES if a == "auto" else kind in ALGORITHM_KINDS[a]))


def _not_implemented(algorithm: str, kind: str) -> CollectiveError:
    """The one-line error for ``algorithm`` asked to plan a ``kind`` it does not implement."""
    valid = valid_algorithms(kind)
    if not valid:
        return CollectiveError(f"kind: {kind!r} unknown; valid: {', '.join(AUTO_CANDIDATES)}")
    return CollectiveError(f"algorithm: {algorithm} does not implement {kind}; valid for {kind}: {', '.join(valid)}")


@dataclass(frozen=True, slots=True)
class Transfer:
    """``nbytes`` moved over each hop ``(src_rank, dst_rank)`` at one common rate.

    ``steps`` algorithm steps (each pays the per-step latency once), of which
    ``net_steps`` cross between servers (they pay the network's step latency,
    the others the NVLink's: :mod:`simulator.nccl`); ``label`` selects the
    ECMP path (a channel / connection id).
    """

    hops: tuple[tuple[int, int], ...]
    nbytes: float
    steps: int = 1
    label: int = 0
    net_steps: int = 0


@dataclass(frozen=True, slots=True)
class Plan:
    """Phases of concurrent transfers, run one after another."""

    kind: str
    algorithm: str
    group: tuple[int, ...]
    nbytes: float
    phases: tuple[tuple[Transfer, ...], ...]

    @property
    def num_transfers(self) -> int:
        return sum(len(p) for p in self.phases)


# ------------------------------------------------------------------ ring orders
def _by_server(group: Sequence[int], server_of: Callable[[int], int]) -> dict[int, list[int]]:
    servers: dict[int, list[int]] = {}
    for r in group:
        servers.setdefault(server_of(r), []).append(r)
    return servers


def ring_channels(group: Sequence[int], server_of: Callable[[int], int]) -> list[list[int]]:
    """Ring orders, one per channel, as NCCL builds them across servers.

    Inside one server (or with one member on some server) there is one ring in
    group order. When the group spans ``N`` servers holding ``k`` members or
    more each, there are ``k`` channels (the fewest members any server holds:
    NCCL keeps the fewest channels any rank's search found, and a server finds
    one per NIC its members have); channel ``c`` enters every server at its
    ``c``-th member and leaves at the one before, so each member's NIC is used
    at most once in each direction and with equal shares the ``k`` rings
    together use every rail. (Unequal shares ran on one ring until 2026-12-04:
    12 GPUs on 8 + 4 took 4x as long as 8 of them on 4 + 4.)
    """
    servers = _by_server(group, server_of)
    k = min(len(v) for v in servers.values())
    if len(servers) == 1 or k == 1:
        return [list(group)]
    order = list(servers.values())
    return [[m[(c + i) % len(m)] for m in order for i in range(len(m))] for c in range(k)]


def _ring_hops(ring: Sequence[int]) -> tuple[tuple[int, int], ...]:
    n = len(ring)
    return tuple((ring[i], ring[(i + 1) % n]) for i in range(n))


def _crosses(hop: tuple[int, int], server_of: Callable[[int], int]) -> bool:
    return server_of(hop[0]) != server_of(hop[1])


def _ring_transfers(rings: list[list[int]], nbytes: float, steps: int, per_step_fraction: float,
                    fidelity: str, server_of: Callable[[int], int],
                    label_base: int = 0) -> list[tuple[Transfer, ...]]:
    """Phases of a ring pass over every channel: ``steps`` steps of ``per_step_fraction·S/C`` each.

    A pass of ``n - 1`` steps around a ring through ``N`` servers crosses
    between servers ``N - 1`` times (NCCL's ``nInterSteps``).
    """
    c = len(rings)
    chunk = nbytes / c * per_step_fraction
    if fidelity == "fast":
        out = []
        for i, r in enumerate(rings):
            servers = len({server_of(x) for x in r})
            net = steps // (len(r) - 1) * (servers - 1) if servers > 1 else 0
            out.append(Transfer(_ring_hops(r), chunk * steps, steps, label_base + i, net))
        return [tuple(out)]
    phases = []
    for _ in range(steps):
        phases.append(tuple(Transfer((hop,), chunk, 1, label_base + i, int(_crosses(hop, server_of)))
                            for i, r in enumerate(rings) for hop in _ring_hops(r)))
    return phases


def _chain_transfers(rings: list[list[int]], root: int, nbytes: float, fidelity: str,
                     toward_root: bool, server_of: Callable[[int], int]) -> list[tuple[Transfer, ...]]:
    """Pipelined chain (broadcast from / reduce to ``root``) along each channel's ring."""
    c = len(rings)
    transfers = []
    for i, ring in enumerate(rings):
        j = ring.index(root)
        chain = ring[j:] + ring[:j]
        hops = tuple((chain[t], chain[t + 1]) for t in range(len(chain) - 1))
        if toward_root:
            hops = tuple((b, a) for a, b in reversed(hops))
        transfers.append(Transfer(hops, nbytes / c, len(hops), i, sum(_crosses(h, server_of) for h in hops)))
    return [tuple(transfers)]


# ----------------------------------------------------------------- algorithms
def plan_ring(kind: str, group: Sequence[int], nbytes: float, server_of: Callable[[int], int],
              fidelity: str = "fast", channels: int | None = None) -> list[tuple[Transfer, ...]]:
    """Ring channels (:func:`ring_channels`) passing ``nbytes`` around; ``channels`` (NCCL's count for the
    size, :func:`simulator.nccl.collective_channels`) keeps the first that many rings, each carrying
    ``S/channels``: NCCL's channels ``0..c-1`` enter a server through its first ``c`` NICs."""
    n = len(group)
    rings = ring_channels(group, server_of)
    if channels is not None:
        rings = rings[:max(1, channels)]
    if kind == "all_reduce":
        return _ring_transfers(rings, nbytes, 2 * (n - 1), 1 / n, fidelity, server_of)
    if kind in ("all_gather", "reduce_scatter"):
        return _ring_transfers(rings, nbytes, n - 1, 1 / n, fidelity, server_of)
    if kind == "broadcast":
        return _chain_transfers(rings, group[0], nbytes, fidelity, False, server_of)
    if kind == "reduce":
        return _chain_transfers(rings, group[0], nbytes, fidelity, True, server_of)
    raise _not_implemented("ring", kind)


def plan_tree(kind: str, group: Sequence[int], nbytes: float, server_of: Callable[[int], int],
              fidelity: str = "fast", channels: int | None = None) -> list[tuple[Transfer, ...]]:
    """Pipelined trees shaped as NCCL's: per channel, binary trees over servers and a chain through the
    members inside each server.

    As the ring, the tree runs ``k`` channels when every server holds ``k`` members, each carrying ``S/k``:
    channel ``c``'s chain starts at each server's ``c``-th member, which joins the trees between servers, so
    the channels use every NIC (NCCL searches a tree per channel, in and out through one NIC). Each channel's
    bytes are split over two trees, the second walking the servers in reverse, so a server interior in one
    is mostly a leaf in the other and every NIC carries about ``2·S/k``, as on a ring (NCCL's double binary
    tree; its tuner prices tree bandwidth as ring's, x0.92 for all-reduce: :func:`simulator.nccl.
    bandwidth_factor`). With unequal servers, as many channels as the smallest server holds members (as the
    ring: :func:`ring_channels`; one channel until 2026-12-04, while the tuner priced the tree at the ring's
    bandwidth over those channels).

    all_reduce reduces up and broadcasts down concurrently (pipelined), so
    every tree edge carries its share in each direction; latency is
    ``2·depth`` steps. Each tree is one pipelined transfer in both fidelities.

    Broadcast and reduce root every channel's tree at ``group[0]`` (NCCL runs them as rings only; this is
    the textbook pipelined tree).

    ``channels`` (NCCL's count for the size, :func:`simulator.nccl.collective_channels`) keeps that many of
    NCCL's channels, in its order: channel ``j`` runs the first tree from the server member ``j`` while
    ``j`` is under the members per server, the mirrored tree after (NCCL gives the first half of its
    channels one tree of the pair, the second half the other: ``connectTrees``, ``src/graph/connect.cc``);
    the bytes are split evenly over the channels kept. Each keeps its label in the full plan.
    """
    if kind not in ALGORITHM_KINDS["tree"]:
        raise _not_implemented("tree", kind)
    servers = list(_by_server(group, server_of).values())
    rails = min(len(m) for m in servers)
    trees = 2 if len(servers) > 2 else 1  # (one or two servers: the mirror is the same tree)
    levels = (len(servers)).bit_length() - 1  # inter-server levels of the binary tree
    depth = max(levels + max(len(m) for m in servers) - 1, 1)
    labels = range(rails * trees)
    if channels is not None and channels < len(labels):  # NCCL's channel j: rail j % rails, tree j // rails
        labels = sorted((j % rails) * trees + j // rails for j in range(max(1, channels)))
    transfers = []
    for c in labels:
        chains = [m[c // trees:] + m[:c // trees] for m in servers]
        # A broadcast's bytes start at (a reduce's end at) the root, group[0]: every channel's tree is rooted
        # there (a chain from another member moved bytes that member does not have: 2 GPUs ran at twice the
        # root's link rate). Channel c still leaves and enters the root's server through its own member
        # c // trees (the root itself for the root's rail), the root's chain going to that member first.
        via = c // trees if kind != "all_reduce" and len(servers[0]) > 1 and len(chains) > 1 else 0
        if kind != "all_reduce":
            m0 = servers[0]
            chains[0] = list(m0) if via == 0 else [m0[0]] + m0[via:] + m0[1:via]
        if c % trees:
            chains = chains[:1] + chains[:0:-1]  # (the root's server stays first)
        heads = [chain[0] for chain in chains]
        if via:
            heads[0] = chains[0][1]
        up = [(heads[i], heads[(i - 1) // 2]) for i in range(1, len(heads))]
        for chain in chains:
            up += [(chain[i], chain[i - 1]) for i in range(1, len(chain))]
        up_t = tuple(up)
        down = tuple((b, a) for a, b in up_t)
        if kind == "all_reduce":
            hops, steps, net = up_t + down, 2 * depth, 2 * levels
        elif kind == "broadcast":  # (from the root one NVLink hop to another head: a step more)
            hops, steps, net = down, depth + (via > 0), levels
        else:
            hops, steps, net = up_t, depth + (via > 0), levels
        transfers.append(Transfer(hops, nbytes / len(labels), steps, c, net))
    return [tuple(transfers)]


def plan_hierarchical(kind: str, group: Sequence[int], nbytes: float, server_of: Callable[[int], int],
                      fidelity: str = "fast") -> list[tuple[Transfer, ...]]:
    """Intra-server rings over NVLink, inter-server rings rail by rail over the NICs.

    all_reduce = intra reduce-scatter (S) → per-rail inter all-reduce (S/k) →
    intra all-gather (S). all_gather and reduce_scatter do the inter-server
    part on S/k and the intra-server part on S, in the data-flow order.
    Needs every server to hold the same number ``k`` of members; otherwise it
    falls back to the ring (for these three kinds only: the kinds it takes do
    not depend on the group).
    """
    if kind not in ALGORITHM_KINDS["hierarchical"]:
        raise _not_implemented("hierarchical", kind)
    servers = list(_by_server(group, server_of).values())
    k = len(servers[0])
    if len(servers) == 1 or any(len(s) != k for s in servers) or k == 1:
        return plan_ring(kind, group, nbytes, server_of, fidelity)
    big_n = len(servers)
    rails = [[s[i] for s in servers] for i in range(k)]

    def intra(steps_per_n: int) -> list[tuple[Transfer, ...]]:
        steps = steps_per_n * (k - 1)
        return _merge([_ring_transfers([s], nbytes, steps, 1 / k, fidelity, server_of, label_base=j)
                       for j, s in enumerate(servers)])

    def inter(steps_per_n: int) -> list[tuple[Transfer, ...]]:
        steps = steps_per_n * (big_n - 1)
        return _merge([_ring_transfers([r], nbytes / k, steps, 1 / big_n, fidelity, server_of, label_base=j)
                       for j, r in enumerate(rails)])

    if kind == "all_reduce":
        return intra(1) + inter(2) + intra(1)
    if kind == "all_gather":
        return inter(1) + intra(1)
    return intra(1) + inter(1)  # (reduce_scatter)


def _merge(parallel_plans: list[list[tuple[Transfer, ...]]]) -> list[tuple[Transfer, ...]]:
    """Run several equal-length phase lists side by side (phase i of each together)."""
    return [tuple(t for plan in parallel_plans for t in plan[i]) for i in range(len(parallel_plans[0]))]


def offset_peers(n: int) -> np.ndarray:
    """``peer[i, k] = (i + k) % n``: member ``i``'s ``k``-th peer in offset order (int32: 64 MiB at 4,096)."""
    offsets = np.arange(n, dtype=np.int32)
    peer = offsets[:, None] + offsets[None, :]
    peer[peer >= n] -= n
    return peer


def remote_rounds(servers: Sequence[int] | np.ndarray, peer: np.ndarray | None = None) -> np.ndarray:
    """``out[i, k]``: the place (1, 2, ...) of the transfer from member ``i`` to member ``peer[i, k] = (i + k)
    % n`` among ``i``'s transfers to other servers in NCCL's order of rounds, 0 for a peer on ``i``'s own
    server (so ``out > 0`` marks the transfers that leave their server); ``servers[i]`` is member ``i``'s
    server; ``peer`` is :func:`offset_peers` if already made (int32, ``n x n``).

    NCCL schedules a grouped send/recv in rounds of (node delta, local step): in round ``(d, s)`` the
    member with local index ``l`` on the group's ``x``-th server sends to local index ``(l + s) % m`` on
    server ``(x + d) % N`` (``ncclP2pSchedule``, ``src/init.cc``): every round is a permutation, so no NIC
    receives from two senders of one round. The remote rounds come in order of ``d`` then ``s``: the
    transfer's place is ``(d - 1) m + s + 1``. A group whose servers hold unequal numbers of its members
    falls back to the order of offsets (its ``r``-th transfer to another server in the order ``i+1, i+2,
    ...``)."""
    servers = np.asarray(servers)
    if peer is None:
        peer = offset_peers(len(servers))
    cross = servers[peer] != servers[:, None]
    _, node, counts = np.unique(servers, return_inverse=True, return_counts=True)
    if len(set(counts.tolist())) > 1:  # unequal servers: the order of offsets
        out = np.cumsum(cross, axis=1, dtype=np.int32)
        out[~cross] = 0
        return out
    m, nodes = int(counts[0]), len(counts)
    node = node.ravel().astype(np.int32)
    local = np.zeros(len(servers), dtype=np.int32)
    for x in range(nodes):
        where = np.flatnonzero(node == x)
        local[where] = np.arange(len(where), dtype=np.int32)
    out = node[peer] - node[:, None]
    out %= nodes
    out -= 1
    out *= m
    step = local[peer] - local[:, None]
    step %= m
    out += step
    out += 1
    out[~cross] = 0
    return out


def plan_direct(kind: str, group: Sequence[int], nbytes: float, server_of: Callable[[int], int],
                fidelity: str = "fast", matrix: Sequence[Sequence[float]] | None = None,
                stagger: bool = False) -> list[tuple[Transfer, ...]]:
    """Pairwise exchange (all_to_all), star to/from the root (gather, broadcast, reduce).

    ``matrix[i][j]`` (all_to_all only) is the bytes member ``i`` sends to
    member ``j`` (alltoallv); without it every pair exchanges ``S/n``.

    ``stagger`` (NCCL's latency model): NCCL runs an all-to-all as grouped
    send/recv. Its GPU side progresses up to 8 peers per channel at once and
    its channels side by side (``src/enqueue.cc``, ``src/device/sendrecv.h``),
    so a transfer to a peer in the same server pays one step; but every
    message to another server is posted by the network proxy, one after
    another, so the transfer to the ``r``-th remote peer in NCCL's order of
    rounds (:func:`remote_rounds`) pays one network step and ``r-1`` intra-server steps
    of a collective that spans servers (``Transfer.steps = r``,
    ``net_steps = 1``; that step is NCCL's per-message network post overhead
    or the NVLink step, whichever is larger: 3.4 µs under Simple on A100 and
    H100). Measured (mscclpp NDmv4 tables, 1 KiB, NCCL 2.17.1): 2x1 A100
    29.8 µs, 2x8 49.8 µs, i.e. ~2.8 µs per further remote peer; 1x8 9.3 µs
    (NVLink peers concurrent) — tests/test_compute_grounding.py.
    """
    n = len(group)
    root = group[0]
    # place[i][k]: where member i's transfer to its k-th peer comes among its transfers to other servers
    rounds = remote_rounds([server_of(r) for r in group]).tolist() if stagger and kind == "all_to_all" else None

    def hop(a: int, b: int, size: float, i: int = 0, j: int = 0) -> Transfer:
        remote = int(server_of(a) != server_of(b))
        if rounds is None or not remote:
            return Transfer(((a, b),), size, 1, 0, remote)
        return Transfer(((a, b),), size, rounds[i][(j - i) % n], 0, 1)

    if kind == "all_to_all":
        if matrix is not None:
            return [tuple(hop(a, b, float(matrix[i][j]), i, j) for i, a in enumerate(group)
                          for j, b in enumerate(group) if i != j and matrix[i][j] > 0)]
        chunk = nbytes / n
        return [tuple(hop(a, b, chunk, i, j) for i, a in enumerate(group) for j, b in enumerate(group) if a != b)]
    if kind == "gather":
        return [tuple(hop(a, root, nbytes / n) for a in group if a != root)]
    if kind == "broadcast":
        return [tuple(hop(root, b, nbytes) for b in group if b != root)]
    if kind == "reduce":
        return [tuple(hop(a, root, nbytes) for a in group if a != root)]
    raise _not_implemented("direct", kind)


def plan_parameter_server(kind: str, group: Sequence[int], nbytes: float, server_of: Callable[[int], int],
                          fidelity: str = "fast") -> list[tuple[Transfer, ...]]:
    """Every worker pushes ``S`` to the root (``group[0]``), which sums and sends ``S`` back.

    The root's links carry ``(n-1)·S`` each way: the bottleneck that ring
    all-reduce removes.
    """
    if kind not in ALGORITHM_KINDS["parameter_server"]:
        raise _not_implemented("parameter_server", kind)
    root = group[0]
    push = tuple(Transfer(((a, root),), nbytes, 1, 0, int(server_of(a) != server_of(root))) for a in group if a != root)
    pull = tuple(Transfer(((root, b),), nbytes, 1, 0, int(server_of(b) != server_of(root))) for b in group if b != root)
    return [push, pull]


ALGORITHMS: dict[str, Callable[..., list[tuple[Transfer, ...]]]] = {
    "ring": plan_ring,
    "tree": plan_tree,
    "hierarchical": plan_hierarchical,
    "direct": plan_direct,
    "parameter_server": plan_parameter_server,
}

AUTO_CANDIDATES = {  # what NCCL's tuner chooses among (no NVLS / CollNet / PAT); hierarchical is ours, on request
    "all_reduce": ("ring", "tree"),
    "all_gather": ("ring",),
    "reduce_scatter": ("ring",),
    "broadcast": ("ring",),  # (NCCL's tree runs all-reduce only: tuning.cc prices no other collective on it)
    "reduce": ("ring",),
    "all_to_all": ("direct",),
    "gather": ("direct",),
}


def plan_collective(kind: str, group: Sequence[int], nbytes: float, server_of: Callable[[int], int],
                    algorithm: str = "ring", fidelity: str = "fast",
                    matrix: Sequence[Sequence[float]] | None = None, stagger: bool = False,
                    channels: int | None = None) -> Plan:
    """Plan one collective with a named algorithm (not ``auto``; see :class:`simulator.fabric.Fabric`).

    ``matrix`` (all_to_all with per-pair sizes) forces the ``direct`` algorithm. ``channels``: the most of
    NCCL's channels a ring or tree runs on (:func:`simulator.nccl.collective_channels`); None, every rail's.
    """
    if algorithm not in ALGORITHMS:
        raise CollectiveError(f"algorithm: {algorithm!r} unknown; valid: {', '.join(COLLECTIVE_ALGORITHMS)}")
    if fidelity not in ("fast", "full"):
        raise CollectiveError(f"fidelity: {fidelity!r} unknown; valid: fast, full")
    group = tuple(group)
    if matrix is not None:
        if kind != "all_to_all":
            raise CollectiveError(f"matrix: only all_to_all takes per-pair sizes, not {kind}")
        total = sum(sum(row) for row in matrix)
        phases = plan_direct(kind, group, total, server_of, fidelity, matrix, stagger) if len(group) > 1 else []
        return Plan(kind, "direct", group, float(total), tuple(p for p in phases if p))
    if len(group) < 2 or nbytes <= 0:  # free: NCCL discards a collective of count 0 unlaunched (taskAppend)
        phases = []
    elif algorithm == "direct":
        phases = plan_direct(kind, group, nbytes, server_of, fidelity, stagger=stagger)
    else:
        if channels is not None and algorithm in ("ring", "tree"):
            phases = ALGORITHMS[algorithm](kind, group, nbytes, server_of, fidelity, channels)
        else:
            phases = ALGORITHMS[algorithm](kind, group, nbytes, server_of, fidelity)
    return Plan(kind, algorithm, group, float(nbytes), tuple(p for p in phases if p))
