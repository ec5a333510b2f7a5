"""What a sick cluster looks like: link, switch and NIC failures, degraded links, extra latency.

:func:`apply_faults` returns a copy of a :class:`~topologies.cluster.Cluster`
with the faults applied; the simulator then routes around them (routes are
shortest paths on the graph it is given). Faults are written as they appear
in the experiment file's ``faults:`` list; nodes are named ``kind:index``
(``spine:1``, ``leaf:0``, ``core:2``, ``nvswitch:3``) or ``kind:server:local``
(``nic:5:2``, ``gpu:5:2``):

==================  ===========================================================
fault               effect
==================  ===========================================================
``link_down``       ``{kind: link_down, link: [leaf:0, spine:1]}`` — the cable,
                    both directions, is gone
``switch_down``     ``{kind: switch_down, switch: spine:1}`` — the switch and
                    every cable to it are gone
``degraded_link``   ``{kind: degraded_link, link: [...], fraction: 0.5}`` — the
                    cable runs at ``fraction`` of its rate, both directions
``nic_down``        ``{kind: nic_down, gpu: 17}`` — rank 17's NIC is gone; its
                    traffic leaves through the NIC of the next GPU of its server
                    whose own NIC works, over NVLink (NCCL's PXN), sharing it
``latency``         ``{kind: latency, tier: spine, extra: 2us}`` — every link of
                    the tier takes ``extra`` longer
``straggler``       ``{kind: straggler, gpu: 5, factor: 1.3}`` — rank 5's compute
                    takes 1.3x as long
``variability``     ``{kind: variability, spread: 0.015, seed: 0}`` — every GPU's
                    compute time is multiplied by its own ``exp(spread · z)``,
                    ``z`` drawn from a standard normal per GPU with ``seed``
                    (:func:`compute_slowdown`)
==================  ===========================================================

The order of the list does not matter. Each cable, switch, NIC, latency tier
and straggler GPU is named by one entry at most (and no cable by an entry
when another takes its switch or NIC down); a latency tier must have links in
the cluster; a ``fraction`` is at least :data:`MIN_FRACTION`. A set of faults
that leaves some GPU unable to reach another (every pair is checked; a server
whose GPUs all lost their NICs is cut off) is refused
(:class:`~topologies.cluster.TopologyError`, naming both and the entry that
cuts them apart), never simulated into a hang. Stragglers and variability
are compute faults (:data:`COMPUTE_FAULTS`): the fabric keeps them out, and
:func:`compute_slowdown` turns them into each GPU's compute factor for the
simulator; one ``variability`` entry at most.

``variability`` is the GPU-to-GPU spread of sustained speed that identical
GPUs show under power management: Sinha et al., "Not All GPUs Are Created
Equal", SC'22 (arXiv:2208.11035), measured it on over 90% of the GPUs of five
large clusters (Summit, Sierra-class Vortex, Frontera, Longhorn: V100; Corona:
MI60): "8% (max 22%) average performance variation" between GPUs of one SKU,
"outliers up to 1.5X slower than the median GPU". Synchronous training runs at
its slowest GPU's pace (TP collectives every layer, the pipeline at its slowest
stage, DP at the step's end), so the expected cost grows with the job like the
expected maximum of its GPUs' draws: with ``spread`` = 0.015 about
``0.015 x 2.97`` = +4.5% at 512 GPUs and ``0.015 x 3.89`` = +6% at 16,384 (the
expected maximum of N standard normals). ``spread`` is the standard deviation
of ``log`` of a GPU's compute time. It is off unless a file gives it: how the
paper's "variation" (a spread across thousands of GPUs) maps onto a per-GPU
standard deviation is an assumption (as the range of a box plot's whiskers,
about 5.4 standard deviations, 8% is 1.5%), and clusters that screen out slow
GPUs spread less. The step with it against the step without (``run``'s "cost
of the faults") is what the spread costs that layout.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Hashable, Mapping, Sequence
from typing import NoReturn

import networkx as nx
import numpy as np

from topologies.cluster import TIERS, Cluster, TopologyError, node_name
from topologies.custom import node_label
from topologies.units import BARE_BANDWIDTH_MIN, parse_link_latency

__all__ = ["COMPUTE_FAULTS", "FAULT_KINDS", "MIN_FRACTION", "TOPOLOGY_FAULTS", "apply_faults", "compute_slowdown",
           "fault_counts", "node_name", "parse_node"]

TOPOLOGY_FAULTS = ("link_down", "switch_down", "degraded_link", "nic_down", "latency")
COMPUTE_FAULTS = ("straggler", "variability")
"""Fault kinds that slow GPUs' compute, not the fabric (applied by the simulator: :func:`compute_slowdown`)."""
FAULT_KINDS = TOPOLOGY_FAULTS + COMPUTE_FAULTS
"""Every fault kind of the ``faults:`` list."""
_FIELDS = {"link_down": ("link",), "switch_down": ("switch",), "degraded_link": ("link", "fraction"),
           "nic_down": ("gpu",), "latency": ("tier", "extra"), "straggler": ("gpu", "factor"),
           "variability": ("spread", "seed")}
MAX_SPREAD = 0.5
"""The largest ``variability`` spread accepted (a standard deviation of 50% in log time is far past any measured
cluster: Sinha et al.'s worst cluster averaged 22% between its fastest and slowest GPUs)."""
MIN_FRACTION = 1e-6
"""The smallest ``degraded_link`` fraction: below it a cable is as good as down (use ``link_down``)."""


def parse_node(text: object, cluster: Cluster, field: str) -> Hashable:
    """The graph node named ``kind:index`` or ``kind:server:local`` (or a custom fabric's id, see
    :func:`topologies.custom.node_label`); TopologyError naming ``field`` if none."""
    node = node_label(text.strip() if isinstance(text, str) else text)
    if node is None or node not in cluster.graph:
        kinds = sorted({k for _n, k in cluster.graph.nodes(data="kind")})
        raise TopologyError(f"{field}: {text!r} is not a node of this cluster; name one as kind:index "
                            f"(e.g. spine:0, leaf:1) or kind:server:local (nic:0:3), or by its topology file id; "
                            f"kinds here: {', '.join(kinds)}")
    return node


def _link(value: object, cluster: Cluster, field: str) -> tuple[Hashable, Hashable]:
    if isinstance(value, str) or not isinstance(value, Sequence) or len(value) != 2:
        raise TopologyError(f"{field}: must be a pair of nodes such as [leaf:0, spine:1], got {value!r}")
    a, b = (parse_node(v, cluster, field) for v in value)
    if not cluster.graph.has_edge(a, b):
        raise TopologyError(f"{field}: there is no cable between {node_name(a)} and {node_name(b)}")
    return a, b


def _gpu_rank(value: object, cluster: Cluster, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < cluster.num_gpus:
        raise TopologyError(f"{field}: must be a rank in 0..{cluster.num_gpus - 1}, got {value!r}")
    return value


def check_fault(fault: object, index: int) -> dict:
    """The fault as a dict with a known ``kind`` and exactly its fields; TopologyError otherwise."""
    field = f"faults[{index}]"
    if not isinstance(fault, Mapping) or "kind" not in fault:
        raise TopologyError(f"{field}: must be a mapping with a kind ({', '.join(FAULT_KINDS)}), got {fault!r}")
    kind = fault["kind"]
    if kind not in FAULT_KINDS:
        raise TopologyError(f"{field}.kind: {kind!r} unknown; valid: {', '.join(FAULT_KINDS)}")
    want = set(_FIELDS[kind])
    unknown = sorted(set(fault) - want - {"kind"}, key=str)
    if unknown:
        raise TopologyError(f"{field}.{unknown[0]}: unknown field of a {kind} fault; valid: {', '.join(sorted(want))}")
    missing = sorted(want - set(fault))
    if missing:
        raise TopologyError(f"{field}.{missing[0]}: required by a {kind} fault")
    return dict(fault)


def fault_counts(faults: Sequence[Mapping]) -> str:
    """``"2 fault(s)"``, ``"1 fault(s), 1 straggler(s)"``, ``"1 straggler(s)"`` or ``"GPU variability 1.5%"``: what
    a run's title and its fabric line say of ``faults`` (topology faults, compute stragglers and the GPUs' spread
    apart)."""
    kinds = [f.get("kind") if isinstance(f, Mapping) else None for f in faults]
    stragglers = kinds.count("straggler")
    spread = [f.get("spread") for f in faults if isinstance(f, Mapping) and f.get("kind") == "variability"]
    topology = len(faults) - stragglers - len(spread)
    parts = [f"{topology} fault(s)"] if topology or not (stragglers or spread) else []
    parts += [f"{stragglers} straggler(s)"] if stragglers else []
    return ", ".join(parts + [f"GPU variability {_percent(s)}" for s in spread])


def _percent(spread: object) -> str:
    """``0.015`` -> ``"1.5%"`` (a spread as written, for the run's title)."""
    return f"{spread * 100:g}%" if isinstance(spread, (int, float)) and not isinstance(spread, bool) else repr(spread)


def check_variability(fault: Mapping, field: str) -> tuple[float, int]:
    """``(spread, seed)`` of a ``variability`` fault: a spread in [0, :data:`MAX_SPREAD`] and a seed >= 0;
    TopologyError naming ``field`` otherwise."""
    spread, seed = fault["spread"], fault["seed"]
    if (isinstance(spread, bool) or not isinstance(spread, (int, float)) or not math.isfinite(spread)
            or not 0 <= spread <= MAX_SPREAD):
        raise TopologyError(f"{field}.spread: must be the standard deviation of log compute time, a number in "
                            f"[0, {MAX_SPREAD}] (e.g. 0.015 for 1.5%), got {spread!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise TopologyError(f"{field}.seed: must be an integer >= 0, got {seed!r}")
    return float(spread), seed


def compute_slowdown(faults: Sequence[Mapping], num_gpus: int) -> dict[int, float]:
    """Rank -> factor on that GPU's compute time, from the compute faults of ``faults`` (checked entries, as
    :func:`check_fault` returns them; ranks below ``num_gpus``): a straggler's ``factor``, times under
    ``variability`` every GPU's ``exp(spread · z)`` with ``z`` the rank's draw of
    ``numpy.random.default_rng(seed).standard_normal(num_gpus)``. Factors of exactly 1 are left out (they slow
    nothing, and a rank left out of the simulator's slowdown runs at the model's speed)."""
    factor = {f["gpu"]: float(f["factor"]) for f in faults if f.get("kind") == "straggler"}
    for i, f in enumerate(faults):
        if f.get("kind") == "variability":
            spread, seed = check_variability(f, f"faults[{i}]")
            if spread:
                draws = np.exp(spread * np.random.default_rng(seed).standard_normal(num_gpus))
                factor = {rank: factor.get(rank, 1.0) * float(d) for rank, d in enumerate(draws)}
    return {rank: f for rank, f in factor.items() if f != 1}


def apply_faults(cluster: Cluster, faults: Sequence[Mapping]) -> Cluster:
    """A copy of ``cluster`` with the topology faults of ``faults`` applied (:data:`COMPUTE_FAULTS` are checked and
    skipped).

    The result does not depend on the order of the list: cables and switches
    go first, then every failed NIC's GPU borrows the NIC of a server
    neighbour whose own NIC still works, then extra latency is added.

    Raises
    ------
    TopologyError
        A malformed fault (field named ``faults[i].<field>``), a node, cable
        or tier that does not exist, two entries for the same cable, switch,
        NIC, tier or straggler (or one for a cable another takes down), or
        faults that partition the GPUs.
    """
    graph, stranded = _faulty_graph(cluster, faults)
    pair = _unreachable_pair(graph, cluster.gpus)
    if pair is not None:
        _refuse_partition(cluster, faults, pair, stranded, graph)
    out = copy.copy(cluster)
    out.graph = graph
    out.name = f"{cluster.name}, {fault_counts(faults)}"
    return out


def _cable(a: Hashable, b: Hashable) -> str:
    return f"[{node_name(a)}, {node_name(b)}]"


def _faulty_graph(cluster: Cluster, faults: Sequence[Mapping]) -> tuple[nx.DiGraph, dict[Hashable, int]]:
    """The cluster's graph with ``faults`` applied, and the GPUs whose NIC is down with none to borrow
    (-> their entry). Every entry is checked first, so no edit can fail half-way."""
    if not isinstance(cluster, Cluster):
        raise TopologyError(f"cluster: must be a Cluster (topologies.build_cluster), got {type(cluster).__name__}")
    if isinstance(faults, (str, bytes, Mapping)) or not isinstance(faults, Sequence):
        raise TopologyError(f"faults: must be a list of faults such as [{{'kind': 'switch_down', 'switch': "
                            f"'spine:0'}}], got {faults!r:.80}")
    g0 = cluster.graph
    checked = [check_fault(raw, i) for i, raw in enumerate(faults)]
    down: dict[Hashable, int] = {}                  # switch or NIC taken down -> its entry
    cables: dict[frozenset, int] = {}               # cable named by link_down or degraded_link -> its entry
    cables_at: dict[Hashable, list[tuple[Hashable, Hashable, int]]] = {}
    failed_nic: dict[Hashable, int] = {}            # GPU whose NIC is down -> its entry
    tiers: dict[str, int] = {}
    stragglers: dict[int, int] = {}
    variability: int | None = None                  # the variability entry
    edits: list[tuple] = []                         # (kind, what...) in the order of the list
    present: list[str] | None = None                # the tiers that have links

    def what(j: int) -> str:
        return "down" if checked[j]["kind"] in ("link_down", "switch_down", "nic_down") else "degraded"

    def take_down(node: Hashable, i: int, field: str) -> None:
        if node in down:
            raise TopologyError(f"{field}: {node_name(node)} is already down (faults[{down[node]}])")
        if node in cables_at:
            a, b, j = cables_at[node][0]
            raise TopologyError(f"{field}: taking {node_name(node)} down takes the cable {_cable(a, b)} that "
                                f"faults[{j}] already names ({checked[j]['kind']}); keep one of the two entries")
        down[node] = i

    for i, fault in enumerate(checked):
        kind, field = fault["kind"], f"faults[{i}]"
        if kind in ("link_down", "degraded_link"):
            a, b = _link(fault["link"], cluster, f"{field}.link")
            key = frozenset((a, b))
            if key in cables:
                j = cables[key]
                raise TopologyError(f"{field}.link: the cable {_cable(a, b)} is already {what(j)} (faults[{j}]); "
                                    f"give one entry per cable")
            for n in (a, b):
                if n in down:
                    raise TopologyError(f"{field}.link: the cable {_cable(a, b)} is already down with "
                                        f"{node_name(n)} (faults[{down[n]}])")
            if kind == "degraded_link":
                frac = fault["fraction"]
                if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not MIN_FRACTION <= frac <= 1:
                    raise TopologyError(f"{field}.fraction: must be a number in [{MIN_FRACTION:g}, 1] (the share "
                                        f"of the cable's rate left; link_down for none), got {frac!r}")
                slowest = min(g0.edges[e]["bandwidth"] for e in ((a, b), (b, a)) if g0.has_edge(*e))
                if slowest * frac < BARE_BANDWIDTH_MIN:  # (the one floor of a link's rate: units.parse_link_bandwidth)
                    raise TopologyError(f"{field}.fraction: {frac!r} leaves the cable {_cable(a, b)} at "
                                        f"{slowest * frac:g} bytes/s, below the {BARE_BANDWIDTH_MIN:g} a link needs; "
                                        f"use link_down for a cable that is as good as gone")
                edits.append(("degraded_link", a, b, frac))
            else:
                edits.append(("link_down", a, b))
            cables[key] = i
            for n in (a, b):
                cables_at.setdefault(n, []).append((a, b, i))
        elif kind == "switch_down":
            node = parse_node(fault["switch"], cluster, f"{field}.switch")
            if g0.nodes[node]["kind"] in ("gpu", "nic"):
                raise TopologyError(f"{field}.switch: {node_name(node)} is not a switch (use nic_down for a NIC)")
            take_down(node, i, f"{field}.switch")
            edits.append(("switch_down", node))
        elif kind == "nic_down":
            rank = _gpu_rank(fault["gpu"], cluster, f"{field}.gpu")
            gpu = cluster.gpus[rank]
            if gpu in failed_nic:
                raise TopologyError(f"{field}.gpu: rank {rank}'s NIC is already down (faults[{failed_nic[gpu]}]); "
                                    f"give one entry per GPU")
            nics = [w for w in g0.successors(gpu) if g0.nodes[w]["kind"] == "nic"]
            if not nics:
                raise TopologyError(f"{field}.gpu: rank {rank} ({node_name(gpu)}) has no NIC to take down")
            for nic in nics:
                take_down(nic, i, f"{field}.gpu")
            failed_nic[gpu] = i
        elif kind == "latency":
            tier = fault["tier"]
            if tier not in TIERS:
                raise TopologyError(f"{field}.tier: {tier!r} unknown; valid: {', '.join(TIERS)}")
            if present is None:  # (one pass over the cables, only for a latency fault)
                have = {t for _u, _v, t in g0.edges(data="tier")}
                present = [t for t in TIERS if t in have]
            if tier not in present:
                raise TopologyError(f"{field}.tier: this cluster has no {tier} links; its tiers: {', '.join(present)}")
            if tier in tiers:
                raise TopologyError(f"{field}.tier: the {tier} links already have extra latency "
                                    f"(faults[{tiers[tier]}]); give one entry per tier")
            tiers[tier] = i
            edits.append(("latency", tier, parse_link_latency(fault["extra"], f"{field}.extra")))
        elif kind == "variability":  # applied by the simulator; one entry per list
            check_variability(fault, field)
            if variability is not None:
                raise TopologyError(f"{field}: the GPUs already have a variability (faults[{variability}]); give "
                                    f"one entry")
            variability = i
        else:  # straggler: applied by the simulator; one factor per GPU
            rank = _gpu_rank(fault["gpu"], cluster, f"{field}.gpu")
            if rank in stragglers:
                raise TopologyError(f"{field}: gpu {rank} already has a straggler factor (faults[{stragglers[rank]}]); "
                                    f"give one entry per GPU")
            stragglers[rank] = i

    # Cables and switches first, then latency, then failed NICs (a borrowed edge takes the latency of the path it
    # stands for, extras included): no order of the list matters.
    graph = g0.copy()
    for edit in edits:
        if edit[0] == "link_down":
            graph.remove_edges_from([edit[1:], edit[2:0:-1]])
        elif edit[0] == "degraded_link":
            _k, a, b, frac = edit
            for e in ((a, b), (b, a)):
                if graph.has_edge(*e):
                    graph.edges[e]["bandwidth"] *= frac
        elif edit[0] == "switch_down":
            graph.remove_node(edit[1])
    for edit in edits:
        if edit[0] == "latency":
            for _u, _v, data in graph.edges(data=True):
                if data["tier"] == edit[1]:
                    data["latency"] += edit[2]
    graph.remove_nodes_from([n for n in down if g0.nodes[n]["kind"] == "nic"])
    # in rank order, not the list's: a borrowed NIC's edges join its adjacency in this order, which numbers links
    borrowed = {gpu: _borrow_nic(graph, cluster, gpu) for gpu in sorted(failed_nic, key=cluster.gpus.index)}
    stranded = {gpu: i for gpu, i in failed_nic.items() if not borrowed[gpu]}
    return graph, stranded


def _nvswitches(graph: nx.DiGraph, gpu: Hashable) -> list[Hashable]:
    return [w for w in graph.successors(gpu) if graph.nodes[w]["kind"] == "nvswitch"]


def _borrow_nic(graph: nx.DiGraph, cluster: Cluster, gpu: Hashable) -> bool:
    """Attach ``gpu`` (its NIC gone) over NVLink to the NIC of the next GPU of its server whose NIC still
    works (is there and has a cable into the fabric) and that it still reaches over NVLink (an NVSwitch of both
    is up, where the server has NVSwitches); False if no GPU of its server qualifies."""
    server = graph.nodes[gpu]["server"]
    mates = [g for g in cluster.gpus if graph.nodes[g]["server"] == server]
    local = mates.index(gpu)  # (its place in its server: peers[local] is the GPU after it)
    peers = mates[:local] + mates[local + 1:]
    start = local % len(peers) if peers else 0
    switched = bool(_nvswitches(cluster.graph, gpu))  # (its NVLink runs through NVSwitches, which may be down)
    mine = _nvswitches(graph, gpu)
    for peer in peers[start:] + peers[:start]:  # the next GPU of the server
        peer_nics = [w for w in graph.successors(peer) if graph.nodes[w]["kind"] == "nic"
                     and cluster.graph.has_edge(peer, w)  # its own NIC, not one it borrowed itself
                     and any(graph.nodes[x]["kind"] != "gpu" for x in graph.successors(w))]
        shared = [w for w in mine if graph.has_edge(w, peer)]
        if peer_nics and (shared or not switched):
            nvlink = [graph.edges[gpu, w]["bandwidth"] for w in shared]
            nic = peer_nics[0]
            # no faster than either leg: NVLink to the peer, then the peer's own (PCIe) link to its NIC. (The two
            # GPUs' traffic shares the NIC's cable but not that PCIe link here: each gets its rate, so a fault
            # never adds capacity, though two GPUs behind a PCIe link slower than the NIC read up to 2x it.)
            bw = min(min(nvlink) if nvlink else cluster.gpu.nvlink_bandwidth,
                     graph.edges[peer, nic]["bandwidth"], graph.edges[nic, peer]["bandwidth"])
            # as long as the path it stands for: over NVLink to the peer (through an NVSwitch, or the direct
            # link), then the peer's own link to its NIC; one way and back
            for a, b, hops in ((gpu, nic, [(gpu, w, peer) for w in shared] or [(gpu, peer)]),
                               (nic, gpu, [(peer, w, gpu) for w in shared] or [(peer, gpu)])):
                nv = min((sum(graph.edges[x, y]["latency"] for x, y in zip(h, h[1:]) if graph.has_edge(x, y))
                          for h in hops), default=0.0)
                last = (peer, nic) if a == gpu else (nic, peer)
                graph.add_edge(a, b, bandwidth=bw, latency=nv + graph.edges[last]["latency"], kind="nvlink",
                               tier="nvlink")
            return True
    return False


def _unreachable_pair(graph: nx.DiGraph, gpus: Sequence[Hashable]) -> tuple[Hashable, Hashable] | None:
    """A pair of GPUs ``(a, b)`` where ``a`` cannot reach ``b`` without transiting a GPU (routes never do),
    or None: every ordered pair is checked.

    As :func:`topologies.custom.check_reachable` does: GPUs reach each other through a strongly connected
    piece of the non-GPU fabric that one sends into and the other receives from, or by a direct cable.
    GPUs touching the same pieces are checked together, so a healthy fabric costs one pass.
    """
    if len(gpus) < 2:
        return None
    fabric = graph.subgraph([n for n, k in graph.nodes(data="kind") if k != "gpu"])
    piece: dict[Hashable, int] = {}
    for i, comp in enumerate(nx.strongly_connected_components(fabric)):
        for n in comp:
            piece[n] = i
    groups: dict[tuple[frozenset, frozenset], list[Hashable]] = {}
    for gpu in gpus:
        outs = frozenset(piece[w] for w in graph.successors(gpu) if w in piece)
        ins = frozenset(piece[w] for w in graph.predecessors(gpu) if w in piece)
        groups.setdefault((outs, ins), []).append(gpu)
    items = list(groups.items())
    for (outs, _ins), senders in items:
        for (_outs, ins), receivers in items:
            if outs & ins:
                continue
            for a in senders:
                for b in receivers:
                    if a != b and not graph.has_edge(a, b):
                        return a, b
    return None


def _refuse_partition(cluster: Cluster, faults: Sequence[Mapping], pair: tuple[Hashable, Hashable],
                      stranded: dict[Hashable, int], faulty: nx.DiGraph) -> NoReturn:
    """Raise the one-line TopologyError for faults that leave ``pair[0]`` unable to reach ``pair[1]``,
    naming the entry that cuts the fabric."""
    rank = {g: r for r, g in enumerate(cluster.gpus)}

    def show(gpu: Hashable) -> str:
        return f"{node_name(gpu)} (rank {rank[gpu]})"

    for gpu, other in (pair, pair[::-1]):
        if gpu in stranded:
            server = cluster.graph.nodes[gpu]["server"]
            alone = not any(g != gpu and cluster.graph.nodes[g]["server"] == server for g in cluster.gpus)
            switches = _nvswitches(cluster.graph, gpu)
            if not alone and switches and not any(n in faulty for n in switches):  # (its NVLink is gone too)
                raise TopologyError(f"faults[{stranded[gpu]}].gpu: rank {rank[gpu]} ({node_name(gpu)}) loses its NIC "
                                    f"and its NVSwitch is down, so it reaches no neighbour's NIC over NVLink: the "
                                    f"fabric is partitioned ({node_name(gpu)} can no longer reach {show(other)}); "
                                    f"remove one of the two faults")
            why = ("is its server's only GPU, with no neighbour's NIC to borrow" if alone else
                   "no other GPU of its server has a working NIC to borrow")
            raise TopologyError(f"faults[{stranded[gpu]}].gpu: rank {rank[gpu]} ({node_name(gpu)}) loses its NIC and "
                                f"{why}, so its server is cut off: the fabric is partitioned ({node_name(gpu)} can "
                                f"no longer reach {show(other)}); remove the fault or keep a NIC of that server")
    # The first entry from which on the GPUs are cut apart: a binary search over the list's prefixes (a longer
    # prefix removes more, so once cut stays cut; one graph per step, not one per entry: 31 entries at 8,192 GPUs
    # took 28 s one by one).
    lo, hi, found = 0, len(faults) - 1, pair  # (the whole list cuts pair apart)
    while lo < hi:
        mid = (lo + hi) // 2
        cut = _unreachable_pair(_faulty_graph(cluster, faults[:mid + 1])[0], cluster.gpus)
        if cut is None:
            lo = mid + 1
        else:
            hi, found = mid, cut
    k = lo  # (= hi: found is prefix k's pair, set when hi last moved, or the whole list's)
    a, b = found
    hint = "remove a fault or keep a path"
    entry = faults[k]
    if entry.get("kind") == "link_down" and any(isinstance(n, str) and n.startswith("nic:")
                                                for n in entry.get("link") or ()):
        # A NIC's cable is its GPU's only way out: what the GPU loses is its NIC's way in, which nic_down
        # models (its traffic borrows a neighbour's NIC over NVLink, as NCCL does)
        hint = ("to model a GPU that loses its NIC's way into the fabric, give it a nic_down entry "
                "({kind: nic_down, gpu: RANK}: its traffic borrows a neighbour's NIC over NVLink)")
    raise TopologyError(f"faults[{k}]: the fabric is partitioned{' (with the faults before it)' if k else ''}: "
                        f"{show(a)} can no longer reach {show(b)}; {hint}")

