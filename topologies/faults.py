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
                    over NVLink (NCCL's PXN), sharing that NIC
``latency``         ``{kind: latency, tier: spine, extra: 2us}`` — every link of
                    the tier takes ``extra`` longer
==================  ===========================================================

A set of faults that leaves some GPU unable to reach another is refused
(:class:`~topologies.cluster.TopologyError`, naming both), never simulated
into a hang. GPU stragglers are compute faults: :mod:`simulator.experiment`
reads them from the same list.
"""

from __future__ import annotations

import copy
from collections.abc import Hashable, Mapping, Sequence

import networkx as nx

from topologies.cluster import TIERS, Cluster, TopologyError
from topologies.custom import node_label
from topologies.units import parse_time

__all__ = ["FAULT_KINDS", "TOPOLOGY_FAULTS", "apply_faults", "node_name", "parse_node"]

TOPOLOGY_FAULTS = ("link_down", "switch_down", "degraded_link", "nic_down", "latency")
FAULT_KINDS = TOPOLOGY_FAULTS + ("straggler",)
"""Every fault kind of the ``faults:`` list (``straggler`` is applied by the simulator)."""
_FIELDS = {"link_down": ("link",), "switch_down": ("switch",), "degraded_link": ("link", "fraction"),
           "nic_down": ("gpu",), "latency": ("tier", "extra"), "straggler": ("gpu", "factor")}


def node_name(node: Hashable) -> str:
    """``("spine", 1)`` -> ``"spine:1"``."""
    return ":".join(str(x) for x in node) if isinstance(node, tuple) else str(node)


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
    unknown = sorted(set(fault) - want - {"kind"})
    if unknown:
        raise TopologyError(f"{field}.{unknown[0]}: unknown field of a {kind} fault; valid: {', '.join(sorted(want))}")
    missing = sorted(want - set(fault))
    if missing:
        raise TopologyError(f"{field}.{missing[0]}: required by a {kind} fault")
    return dict(fault)


def apply_faults(cluster: Cluster, faults: Sequence[Mapping]) -> Cluster:
    """A copy of ``cluster`` with the topology faults of ``faults`` applied (``straggler`` ones are skipped).

    Raises
    ------
    TopologyError
        A malformed fault (field named ``faults[i].<field>``), a node or cable
        that does not exist, or faults that partition the GPUs.
    """
    graph = cluster.graph.copy()
    for i, raw in enumerate(faults):
        fault = check_fault(raw, i)
        kind, field = fault["kind"], f"faults[{i}]"
        if kind == "link_down":
            a, b = _link(fault["link"], cluster, f"{field}.link")
            graph.remove_edges_from([(a, b), (b, a)])
        elif kind == "switch_down":
            node = parse_node(fault["switch"], cluster, f"{field}.switch")
            if cluster.graph.nodes[node]["kind"] in ("gpu", "nic"):
                raise TopologyError(f"{field}.switch: {node_name(node)} is not a switch (use nic_down for a NIC)")
            graph.remove_node(node)
        elif kind == "degraded_link":
            a, b = _link(fault["link"], cluster, f"{field}.link")
            frac = fault["fraction"]
            if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0 < frac <= 1:
                raise TopologyError(f"{field}.fraction: must be a number in (0, 1], got {frac!r}")
            for e in ((a, b), (b, a)):
                if graph.has_edge(*e):
                    graph.edges[e]["bandwidth"] *= frac
        elif kind == "nic_down":
            _nic_down(graph, cluster, _gpu_rank(fault["gpu"], cluster, f"{field}.gpu"), f"{field}.gpu")
        elif kind == "latency":
            tier = fault["tier"]
            if tier not in TIERS:
                raise TopologyError(f"{field}.tier: {tier!r} unknown; valid: {', '.join(TIERS)}")
            extra = parse_time(fault["extra"], f"{field}.extra")
            for _u, _v, data in graph.edges(data=True):
                if data["tier"] == tier:
                    data["latency"] += extra
    out = copy.copy(cluster)
    out.graph = graph
    out.name = f"{cluster.name}, {len([f for f in faults if f.get('kind') != 'straggler'])} fault(s)"
    _check_connected(out)
    return out


def _nic_down(graph: nx.DiGraph, cluster: Cluster, rank: int, field: str) -> None:
    gpu = cluster.gpus[rank]
    nics = [w for w in graph.successors(gpu) if graph.nodes[w]["kind"] == "nic"]
    if not nics:
        raise TopologyError(f"{field}: rank {rank} ({node_name(gpu)}) has no NIC left to take down")
    server = graph.nodes[gpu]["server"]
    peers = [g for g in cluster.gpus if g != gpu and graph.nodes[g]["server"] == server]
    graph.remove_nodes_from(nics)
    for peer in peers[rank % len(peers):] + peers[:rank % len(peers)]:  # the next GPU of the server
        peer_nics = [w for w in graph.successors(peer) if graph.nodes[w]["kind"] == "nic"]
        if peer_nics:
            nvlink = [graph.edges[gpu, w]["bandwidth"] for w in graph.successors(gpu)
                      if graph.nodes[w]["kind"] == "nvswitch"]
            bw = min(nvlink) if nvlink else cluster.gpu.nvlink_bandwidth
            for a, b in ((gpu, peer_nics[0]), (peer_nics[0], gpu)):
                graph.add_edge(a, b, bandwidth=bw, latency=0.0, kind="nvlink", tier="nvlink")
            return


def _check_connected(cluster: Cluster) -> None:
    """Every GPU must reach every other GPU without transiting a GPU (routes never do)."""
    g = cluster.graph
    gpus = list(cluster.gpus)
    if len(gpus) < 2:
        return
    fabric = g.subgraph([n for n, k in g.nodes(data="kind") if k != "gpu"])
    comp_of: dict[Hashable, int] = {}
    for i, comp in enumerate(nx.strongly_connected_components(fabric)):
        for n in comp:
            comp_of[n] = i
    reach = {}
    for gpu in gpus:
        outs = {comp_of[w] for w in g.successors(gpu) if w in comp_of}
        ins = {comp_of[w] for w in g.predecessors(gpu) if w in comp_of}
        reach[gpu] = (outs, ins)
    first = gpus[0]
    for gpu in gpus[1:]:
        for a, b in ((first, gpu), (gpu, first)):
            if not reach[a][0] & reach[b][1]:
                raise TopologyError(f"faults: the fabric is partitioned: {node_name(a)} can no longer reach "
                                    f"{node_name(b)}; remove a fault or keep a path")
