"""Custom fabrics: any cluster written out node by node and link by link (YAML), or read from GraphML.

A topology file lists the fabric's nodes and its full-duplex links::

    gpu: H100-SXM                      # a GPU of topologies.GPU_SPECS (aliases work)
    name: two racks                    # optional
    nodes:                             # GPU rank order = the order GPUs are listed (or rank: on every GPU)
      - gpu:0:0                        # kind:server:local -> kind gpu, server 0 (read from the id)
      - {id: nvs0, kind: nvswitch, server: 0}   # any other id names kind (and server) explicitly
      - leaf:0                         # kind:index -> a fabric switch, server -1
    links:                             # one full-duplex cable each; bandwidth per direction
      - {a: gpu:0:0, b: nvs0, bandwidth: 450GB/s, latency: 0.25us}
      - {a: leaf:0, b: leaf:1, bandwidth: 100GB/s, latency: 0.5us, kind: ib, tier: spine}

Node entries
------------
An entry is an id, or a mapping with ``id`` and optional ``kind``, ``server``
and ``rank``. Ids are strings or integers. An id written ``name:int[:int...]``
is the tuple label the builders use (``"gpu:0:3"`` is ``("gpu", 0, 3)``,
``"leaf:2"`` is ``("leaf", 2)``; a digits-only id is an integer), so exported
clusters come back with their exact labels and the ``faults:`` list names the
same nodes; any other string is kept as it is. When ``name`` is a node kind it
gives the default ``kind``, and the server: the first index for ``gpu``,
``nic`` and ``nvswitch`` (``nic:5:2`` is in server 5), ``-1`` for ``leaf``,
``spine`` and ``core``. Other ids must say ``kind`` (one of
:data:`~topologies.cluster.NODE_KINDS`) and, for ``gpu``, ``nic`` and
``nvswitch``, ``server`` (an integer >= 0: the NVLink domain). Fabric switches
are in no server (``server`` -1). Every server must hold the same number of
GPUs (that number is ``Cluster.gpus_per_server``). Ranks: GPUs in the order
listed, or ``rank:`` on every GPU (a permutation of ``0..n-1``).

Link entries
------------
``a`` and ``b`` (node ids), ``bandwidth`` (per direction: ``"400Gbps"``,
``"50GB/s"``, or a number of bytes/s) and ``latency`` (``"0.5us"``, or seconds)
are required. ``kind`` (:data:`~topologies.cluster.LINK_KINDS`) and ``tier``
(:data:`~topologies.cluster.TIERS`, which results break bytes down by) default
by the kinds of the two ends, as the builders wire them (:data:`LINK_DEFAULTS`:
GPU-NVSwitch, GPU-GPU and NVSwitch-NVSwitch ``nvlink``, GPU-NIC ``pcie``, NIC-leaf ``ib``/``leaf``,
leaf-spine ``ib``/``spine``, spine-core ``ib``/``core``); any other pair must
give both. ``bandwidth_reverse`` and ``latency_reverse`` make the ``b -> a``
direction differ. At most one link per pair of nodes (merge parallel cables
into one link of their total bandwidth).

Checks
------
Every error is one :class:`~topologies.cluster.TopologyError` line naming the
file, the entry (``links[3].bandwidth``) and what is valid: unknown fields,
kinds or tiers, a duplicate id or link, a link to an unknown node or to
itself, a bandwidth that is not positive and finite, a negative latency, a GPU
with no links, a fabric in several pieces, a GPU pair that can only reach each
other through a third GPU (routes never transit GPUs), servers of unequal size.

GraphML
-------
:func:`load_topology` also reads GraphML (``.graphml``) as
:func:`topologies.export.cluster_to_graphml` writes it: graph attributes
``gpu`` (required) and ``name``; node attributes ``kind``, ``server``, ``rank``
as above; one GraphML edge per direction with ``bandwidth``, ``latency``,
``kind`` and ``tier`` (defaults as above), and optionally ``order`` (edges
are added by it, else in document order). An undirected graph (from another
tool) makes every edge a full-duplex link. Other attributes (layout, labels)
are ignored.
"""

from __future__ import annotations

import math
import numbers
import os
import re
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from xml.etree import ElementTree
from xml.etree.ElementTree import ParseError

import networkx as nx
import yaml

from topologies.cluster import LINK_KINDS, NODE_KINDS, TIERS, Cluster, GPUSpec, TopologyError
from topologies.gpus import get_gpu
from topologies.units import parse_link_bandwidth, parse_link_latency
from topologies.validate import validate_cluster
from topologies.yamlio import load_large_yaml, malformed

__all__ = [
    "FILE_FIELDS",
    "NODE_FIELDS",
    "LINK_FIELDS",
    "LINK_DEFAULTS",
    "SERVER_KINDS",
    "node_label",
    "node_id",
    "is_topology_document",
    "cluster_from_dict",
    "load_topology",
]

FILE_FIELDS = ("gpu", "name", "nodes", "links")
"""Every key of a topology file (or of an inline ``cluster:`` section holding one)."""
NODE_FIELDS = ("id", "kind", "server", "rank")
LINK_FIELDS = ("a", "b", "bandwidth", "latency", "kind", "tier", "bandwidth_reverse", "latency_reverse")
SERVER_KINDS = ("gpu", "nic", "nvswitch")
"""Node kinds that sit in a server (NVLink domain); the others are fabric switches (server -1)."""

LINK_DEFAULTS: Mapping[tuple[str, str], tuple[str, str]] = {
    ("gpu", "nvswitch"): ("nvlink", "nvlink"),
    ("gpu", "gpu"): ("nvlink", "nvlink"),
    ("nvswitch", "nvswitch"): ("nvlink", "nvlink"),
    ("gpu", "nic"): ("pcie", "pcie"),
    ("leaf", "nic"): ("ib", "leaf"),
    ("leaf", "spine"): ("ib", "spine"),
    ("core", "spine"): ("ib", "core"),
}
"""``(kind, tier)`` of a link by the sorted kinds of its two ends, as the builders wire them."""

_NAME = r"[A-Za-z_][A-Za-z0-9_.-]*"
_TUPLE_ID = re.compile(rf"^({_NAME})((?::[+-]?[0-9]+)+)$")
_INT_ID = re.compile(r"^[+-]?[0-9]+$")
_NAME_ONLY = re.compile(rf"^{_NAME}$")
GRAPHML_SUFFIXES = (".graphml",)


# ------------------------------------------------------------------ ids <-> labels
def node_label(node_id: object) -> Hashable | None:
    """The graph label a file id stands for, or ``None`` if it is no valid id.

    ``"gpu:0:3"`` -> ``("gpu", 0, 3)``; ``"7"`` or ``7`` -> ``7``; any other
    non-empty string is kept as it is.

    Examples
    --------
    >>> node_label("gpu:0:3"), node_label("leaf:2"), node_label("tor-a"), node_label(5)
    (('gpu', 0, 3), ('leaf', 2), 'tor-a', 5)
    """
    if isinstance(node_id, bool):
        return None
    if isinstance(node_id, int):
        return node_id
    if not isinstance(node_id, str) or not node_id:
        return None
    if _INT_ID.match(node_id):
        return int(node_id)
    m = _TUPLE_ID.match(node_id)
    if m:
        return (m.group(1), *(int(x) for x in m.group(2)[1:].split(":")))
    return node_id


def node_id(label: Hashable) -> str | int:
    """The file id of a graph label: the inverse of :func:`node_label`.

    Raises
    ------
    TopologyError
        For a label no id reads back as: not an int, a string or a tuple
        ``(name, int, ...)``; or a string that reads back as a tuple or an
        integer (``"gpu:0:3"``, ``"7"``).

    Examples
    --------
    >>> node_id(("gpu", 0, 3)), node_id(("leaf", 2)), node_id("tor-a"), node_id(5)
    ('gpu:0:3', 'leaf:2', 'tor-a', 5)
    """
    if isinstance(label, int) and not isinstance(label, bool):
        return label
    if isinstance(label, str) and label:
        if node_label(label) != label:
            raise TopologyError(f"node {label!r}: a string label of the form name:int or digits would read back as "
                                f"{node_label(label)!r}; rename the node")
        return label
    if (isinstance(label, tuple) and len(label) >= 2 and isinstance(label[0], str) and _NAME_ONLY.match(label[0])
            and all(isinstance(x, int) and not isinstance(x, bool) for x in label[1:])):
        return ":".join(str(x) for x in label)
    raise TopologyError(f"node {label!r}: cannot be written to a topology file; labels must be strings, integers or "
                        f"tuples (name, int, ...) such as ('gpu', 0, 3)")


def _show(label: Hashable) -> str:
    """A label as a file id, for messages."""
    try:
        return repr(node_id(label))
    except TopologyError:
        return repr(label)


def implied_by_id(label: Hashable) -> tuple[str | None, int | None]:
    """``(kind, server)`` an id implies: ``gpu:0:3`` -> ``("gpu", 0)``, ``leaf:2`` -> ``("leaf", -1)``."""
    if isinstance(label, tuple) and label[0] in NODE_KINDS:
        return label[0], (label[1] if label[0] in SERVER_KINDS else -1)
    return None, None


def link_defaults(kind_a: str, kind_b: str) -> tuple[str, str] | None:
    """``(kind, tier)`` of a link between nodes of these kinds, if :data:`LINK_DEFAULTS` has one."""
    return LINK_DEFAULTS.get((kind_a, kind_b) if kind_a <= kind_b else (kind_b, kind_a))


# ------------------------------------------------------------------ entries
def _int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _parse_node(entry: object, field: str, *, strict: bool = True) -> tuple[Hashable, str, int, int | None]:
    """``(label, kind, server, rank)`` of one node entry (an id, or a mapping with ``id``)."""
    if isinstance(entry, Mapping):
        fields = entry
        if strict:
            for key in fields:
                if key not in NODE_FIELDS:
                    raise TopologyError(f"{field}.{key}: unknown field; valid: {', '.join(NODE_FIELDS)}")
        if "id" not in fields:
            raise TopologyError(f"{field}.id: required (e.g. {{id: gpu:0:0}} or {{id: tor1, kind: leaf}})")
        raw = fields["id"]
    elif isinstance(entry, (str, int)) and not isinstance(entry, bool):
        fields, raw = {}, entry
    else:
        raise TopologyError(f"{field}: must be an id (gpu:0:0, leaf:1) or a mapping with id, kind, server, rank; "
                            f"got {entry!r}")
    label = node_label(raw)
    if label is None:
        raise TopologyError(f"{field}.id: {raw!r} is not an id; use a non-empty string or an integer")
    implied_kind, implied_server = implied_by_id(label)
    kind = fields.get("kind", implied_kind)
    if kind is None:
        raise TopologyError(f"{field}.kind: required: id {raw!r} does not name a kind; valid: {', '.join(NODE_KINDS)}")
    if kind not in NODE_KINDS:
        raise TopologyError(f"{field}.kind: {kind!r} is not a node kind; valid: {', '.join(NODE_KINDS)}")
    if "server" in fields:
        server = fields["server"]
    elif kind == implied_kind:
        server = implied_server
    else:
        server = None if kind in SERVER_KINDS else -1
    if kind in SERVER_KINDS:
        if server is None:
            raise TopologyError(f"{field}.server: required for a {kind} node: the index (>= 0) of its server "
                                f"(NVLink domain)")
        if not _int(server) or server < 0:
            raise TopologyError(f"{field}.server: {server!r} is not a server index (an integer >= 0)")
    elif server != -1:
        raise TopologyError(f"{field}.server: {server!r}: a {kind} switch is in no server; omit server (or write -1)")
    rank = fields.get("rank")
    if rank is not None:
        if kind != "gpu":
            raise TopologyError(f"{field}.rank: only gpu nodes have a rank; this node is a {kind}")
        if not _int(rank) or rank < 0:
            raise TopologyError(f"{field}.rank: {rank!r} is not a rank (an integer >= 0)")
    return label, kind, server, rank  # type: ignore[return-value]


def _edge_attrs(fields: Mapping, kinds: tuple[str, str], field: str, reverse: bool = False) -> dict:
    """``bandwidth, latency, kind, tier`` of one direction of a link entry, parsed and checked."""
    suffix = "_reverse" if reverse else ""
    attrs = {}
    for key, parse in (("bandwidth", parse_link_bandwidth), ("latency", parse_link_latency)):
        name = key + suffix
        value = fields.get(name, fields.get(key))
        if value is None:
            example = "400Gbps, 50GB/s" if key == "bandwidth" else "0.5us"
            raise TopologyError(f"{field}.{key}: required (e.g. {example})")
        attrs[key] = parse(value, f"{field}.{name}")
    default = link_defaults(*kinds)
    for i, (key, valid) in enumerate((("kind", LINK_KINDS), ("tier", TIERS))):
        value = fields.get(key, default[i] if default else None)
        if value is None:
            raise TopologyError(f"{field}.{key}: required for a link between a {kinds[0]} and a {kinds[1]} "
                                f"(no default); valid: {', '.join(valid)}")
        if value not in valid:
            raise TopologyError(f"{field}.{key}: {value!r} is not a link {key}; valid: {', '.join(valid)}")
        attrs[key] = value
    return attrs


# ------------------------------------------------------------------ whole-fabric checks
def server_size(graph: nx.DiGraph, gpus: Sequence[Hashable], field: str) -> tuple[int, int]:
    """``(servers, gpus_per_server)``; every server must hold the same number of GPUs."""
    per = Counter(graph.nodes[g]["server"] for g in gpus)
    sizes = sorted(set(per.values()))
    if len(sizes) > 1:
        big = next(s for s, n in per.items() if n == sizes[-1])
        small = next(s for s, n in per.items() if n == sizes[0])
        raise TopologyError(f"{field}: servers hold different numbers of GPUs (server {big}: {sizes[-1]}, server "
                            f"{small}: {sizes[0]}); every server (NVLink domain) must hold the same number")
    return len(per), sizes[0]


def check_reachable(graph: nx.DiGraph, gpus: Sequence[Hashable], field: str = "links") -> None:
    """Raise unless the fabric is connected and every GPU reaches every other without transiting a GPU.

    Links are full duplex, so reachability is undirected. GPUs reach each
    other directly or through a connected piece of the non-GPU fabric that
    both touch; a pair joined only through a third GPU is unreachable,
    because routes never transit GPUs.
    """
    for g in gpus:
        if graph.degree(g) == 0:
            raise TopologyError(f"{field}: GPU {_show(g)} has no links")
    if not nx.is_weakly_connected(graph):
        home = nx.node_connected_component(graph.to_undirected(as_view=True), gpus[0])
        stray = next(n for n in graph if n not in home)
        parts = nx.number_weakly_connected_components(graph)
        raise TopologyError(f"{field}: the fabric is not connected: {_show(stray)} cannot reach {_show(gpus[0])} "
                            f"({parts} separate pieces)")
    fabric = graph.subgraph([n for n, k in graph.nodes(data="kind") if k != "gpu"]).to_undirected(as_view=True)
    piece: dict[Hashable, int] = {}
    for i, comp in enumerate(nx.connected_components(fabric)):
        for n in comp:
            piece[n] = i
    touches = [{piece[w] for w in graph.successors(g) if w in piece} for g in gpus]
    if set.intersection(*touches):
        return  # one piece of switches reaches every GPU (every fabric the builders make)
    for i, a in enumerate(gpus):
        for j in range(i + 1, len(gpus)):
            b = gpus[j]
            if not touches[i] & touches[j] and not graph.has_edge(a, b):
                raise TopologyError(f"{field}: GPU {_show(a)} cannot reach GPU {_show(b)} without passing through "
                                    f"another GPU (routes never transit GPUs); link them directly or through a switch")


def _params(graph: nx.DiGraph, gpus: Sequence[Hashable], gpu: GPUSpec, servers: int, per_server: int,
            source: str | None) -> dict:
    """What :func:`simulator.experiment.describe_setup` reports: switch counts and per-GPU rates when uniform."""
    kinds = Counter(k for _n, k in graph.nodes(data="kind"))
    params: dict[str, object] = {"fabric": "custom", "topology": source, "gpu": gpu.name, "nodes": servers,
                                 "gpus_per_node": per_server, "leaves": kinds["leaf"], "spines": kinds["spine"],
                                 "cores": kinds["core"]}
    nvlink = {sum(d["bandwidth"] for _g, _w, d in graph.out_edges(g, data=True) if d["kind"] == "nvlink")
              for g in gpus}
    if len(nvlink) == 1 and min(nvlink) > 0:
        params["nvlink_bandwidth"] = nvlink.pop()
    nics = [n for n, k in graph.nodes(data="kind") if k == "nic"]
    nic = {sum(d["bandwidth"] for _n, w, d in graph.out_edges(n, data=True) if graph.nodes[w]["kind"] != "gpu")
           for n in nics}
    if len(nic) == 1 and min(nic) > 0 and len(nics) == len(gpus):
        params["nic_bandwidth"] = nic.pop()
    return params


def _finish(graph: nx.DiGraph, gpus: list[Hashable], gpu: GPUSpec, name: object, source: str | None,
            where: str) -> Cluster:
    if not gpus:
        raise TopologyError(f"{where}nodes: lists no GPU (kind: gpu)")
    check_reachable(graph, gpus, f"{where}links")
    servers, per_server = server_size(graph, gpus, f"{where}nodes")
    if name is None:
        name = f"custom fabric ({len(gpus)} {gpu.name} GPUs, {servers} servers of {per_server})"
    elif not isinstance(name, str):
        raise TopologyError(f"{where}name: {name!r} is not a string")
    cluster = Cluster(graph=graph, gpu=gpu, gpus=tuple(gpus), gpus_per_server=per_server, name=name,
                      params=_params(graph, gpus, gpu, servers, per_server, source))
    return validate_cluster(cluster)


def _rank_order(gpus: list[Hashable], ranks: list[int | None], where: str) -> list[Hashable]:
    """GPUs in rank order: as listed, or by ``rank:`` (all or none, a permutation of 0..n-1)."""
    given = [r for r in ranks if r is not None]
    if not given:
        return gpus
    if len(given) != len(gpus):
        missing = next(g for g, r in zip(gpus, ranks) if r is None)
        raise TopologyError(f"{where}nodes: GPU {_show(missing)} has no rank while others do; give every GPU a "
                            f"rank or none (then ranks follow the order listed)")
    seen: dict[int, Hashable] = {}
    for g, r in zip(gpus, ranks):
        if r in seen:
            raise TopologyError(f"{where}nodes: rank {r} is given to both {_show(seen[r])} and {_show(g)}")
        if r >= len(gpus):  # type: ignore[operator]
            raise TopologyError(f"{where}nodes: rank {r} of {_show(g)} is out of range; {len(gpus)} GPUs take "
                                f"ranks 0..{len(gpus) - 1}")
        seen[r] = g  # type: ignore[index]
    return [seen[r] for r in range(len(gpus))]


# ------------------------------------------------------------------ YAML documents
def is_topology_document(doc: object) -> bool:
    """Whether a parsed YAML mapping is a topology file (it has ``links``, or a list of ``nodes``)."""
    return isinstance(doc, Mapping) and ("links" in doc or isinstance(doc.get("nodes"), list))


def cluster_from_dict(doc: Mapping, where: str = "", source: str | None = None) -> Cluster:
    """Build the cluster a topology document describes (see the module docstring).

    Parameters
    ----------
    doc : Mapping
        ``gpu``, optional ``name``, ``nodes`` and ``links``, as parsed from YAML.
    where : str
        Prefix of field names in messages, e.g. ``"cluster."`` for an inline
        ``cluster:`` section.
    source : str, optional
        The file it came from, kept in ``params["topology"]``.

    Returns
    -------
    Cluster
        Nodes in the order listed, each link as two directed edges (``a -> b``
        then ``b -> a``) in the order listed; ``params["fabric"]`` is
        ``"custom"``.

    Raises
    ------
    TopologyError
        One line naming the field (``links[3].bandwidth``) and what is valid.

    Examples
    --------
    >>> nvlink = {"bandwidth": "450GB/s", "latency": "0.25us"}
    >>> c = cluster_from_dict({"gpu": "H100", "nodes": ["gpu:0:0", "gpu:0:1", "nvswitch:0"],
    ...                        "links": [{"a": "gpu:0:0", "b": "nvswitch:0", **nvlink},
    ...                                  {"a": "gpu:0:1", "b": "nvswitch:0", **nvlink}]})
    >>> c.gpus, c.gpus_per_server, c.graph.edges[("gpu", 0, 0), ("nvswitch", 0)]["tier"]
    ((('gpu', 0, 0), ('gpu', 0, 1)), 2, 'nvlink')
    """
    if not isinstance(doc, Mapping):
        raise TopologyError(f"{where or 'topology'}: expected a mapping with gpu, nodes and links, "
                            f"got {type(doc).__name__}")
    for key in doc:
        if key not in FILE_FIELDS:
            raise TopologyError(f"{where}{key}: unknown field of a topology; valid: {', '.join(FILE_FIELDS)}")
    if doc.get("gpu") is None:
        raise TopologyError(f"{where}gpu: required: the GPU model of every gpu node (e.g. H100-SXM)")
    gpu = get_gpu(doc["gpu"], f"{where}gpu")  # type: ignore[arg-type]
    nodes, links = doc.get("nodes"), doc.get("links")
    if not isinstance(nodes, list) or not nodes:
        raise TopologyError(f"{where}nodes: must be a non-empty list of nodes (e.g. [gpu:0:0, nvswitch:0])")
    if not isinstance(links, list):
        raise TopologyError(f"{where}links: must be a list of links (e.g. [{{a: gpu:0:0, b: nvswitch:0, "
                            f"bandwidth: 450GB/s, latency: 0.25us}}])")

    graph = nx.DiGraph()
    first: dict[Hashable, int] = {}
    gpus: list[Hashable] = []
    ranks: list[int | None] = []
    for i, entry in enumerate(nodes):
        field = f"{where}nodes[{i}]"
        label, kind, server, rank = _parse_node(entry, field)
        if label in first:
            raise TopologyError(f"{field}.id: duplicate id {_show(label)} (first at nodes[{first[label]}])")
        first[label] = i
        graph.add_node(label, kind=kind, server=server)
        if kind == "gpu":
            gpus.append(label)
            ranks.append(rank)

    seen: dict[frozenset, int] = {}
    for i, entry in enumerate(links):
        field = f"{where}links[{i}]"
        if not isinstance(entry, Mapping):
            raise TopologyError(f"{field}: must be a mapping with a, b, bandwidth, latency (e.g. {{a: gpu:0:0, "
                                f"b: nvswitch:0, bandwidth: 450GB/s, latency: 0.25us}}), got {entry!r}")
        for key in entry:
            if key not in LINK_FIELDS:
                raise TopologyError(f"{field}.{key}: unknown field; valid: {', '.join(LINK_FIELDS)}")
        ends = []
        for end in ("a", "b"):
            if end not in entry:
                raise TopologyError(f"{field}.{end}: required: the id of one end of the link")
            label = node_label(entry[end])
            if label not in first:
                raise TopologyError(f"{field}.{end}: {entry[end]!r} is not a node; ids are listed under nodes")
            ends.append(label)
        a, b = ends
        if a == b:
            raise TopologyError(f"{field}: links {_show(a)} to itself")
        pair = frozenset(ends)
        if pair in seen:
            raise TopologyError(f"{field}: a second link between {_show(a)} and {_show(b)} (first at "
                                f"links[{seen[pair]}]); merge parallel cables into one link of their total bandwidth")
        seen[pair] = i
        kinds = (graph.nodes[a]["kind"], graph.nodes[b]["kind"])
        graph.add_edge(a, b, **_edge_attrs(entry, kinds, field))
        graph.add_edge(b, a, **_edge_attrs(entry, kinds, field, reverse=True))
    for g in gpus:
        if graph.degree(g) == 0:
            raise TopologyError(f"{where}nodes[{first[g]}]: GPU {_show(g)} has no links")
    return _finish(graph, _rank_order(gpus, ranks, where), gpu, doc.get("name"), source, where)


# ------------------------------------------------------------------ GraphML
def _graphml_value(value: object, field: str) -> object:
    """GraphML attributes come back typed when declared so; accept integer strings for ints too."""
    if isinstance(value, str) and _INT_ID.match(value.strip()):
        return int(value)
    if isinstance(value, float) and value.is_integer() and math.isfinite(value):
        return int(value)
    return value


def cluster_from_graph(h: nx.Graph, source: str | None = None) -> Cluster:
    """Build a cluster from a graph read from GraphML (string node ids, attributes as in the module docstring)."""
    if h.is_multigraph():
        raise TopologyError("graph: has parallel edges; merge parallel cables into one edge of their total bandwidth")
    if not h.is_directed():
        h = h.to_directed()
    attrs = h.graph
    if attrs.get("gpu") is None:
        raise TopologyError("graph.gpu: required graph attribute: the GPU model (e.g. H100-SXM)")
    gpu = get_gpu(attrs["gpu"], "graph.gpu")  # type: ignore[arg-type]
    graph = nx.DiGraph()
    labels: dict[Hashable, Hashable] = {}
    gpus: list[Hashable] = []
    ranks: list[int | None] = []
    for raw, data in h.nodes(data=True):
        entry = {k: _graphml_value(data[k], k) for k in ("kind", "server", "rank") if k in data}
        label, kind, server, rank = _parse_node({"id": raw, **entry}, f"node {raw!r}", strict=False)
        if label in graph:
            raise TopologyError(f"node {raw!r}: reads back as {_show(label)}, the id of another node")
        labels[raw] = label
        graph.add_node(label, kind=kind, server=server)
        if kind == "gpu":
            gpus.append(label)
            ranks.append(rank)
    edges = list(h.edges(data=True))
    if edges and all(_int(_graphml_value(d.get("order"), "order")) for _u, _v, d in edges):
        edges.sort(key=lambda e: _graphml_value(e[2]["order"], "order"))  # type: ignore[arg-type, return-value]
    for u, v, data in edges:
        a, b = labels[u], labels[v]
        if a == b:
            raise TopologyError(f"edge {u!r} -> {v!r}: links a node to itself")
        if not h.has_edge(v, u):
            raise TopologyError(f"edge {u!r} -> {v!r}: has no reverse edge {v!r} -> {u!r} (links are full duplex)")
        kinds = (graph.nodes[a]["kind"], graph.nodes[b]["kind"])
        latency = data.get("latency")
        if isinstance(latency, numbers.Real) and not isinstance(latency, bool):  # GraphML's numbers are seconds
            data = {**data, "latency": f"{float(latency)!r}s"}
        graph.add_edge(a, b, **_edge_attrs(data, kinds, f"edge {u!r} -> {v!r}"))
    cluster = _finish(graph, _rank_order(gpus, ranks, ""), gpu, attrs.get("name"), source, "")
    stated = attrs.get("gpus_per_server")
    if stated is not None and _graphml_value(stated, "gpus_per_server") != cluster.gpus_per_server:
        raise TopologyError(f"graph.gpus_per_server: {stated!r}, but the nodes put {cluster.gpus_per_server} GPUs in "
                            f"each server")
    return cluster


def _undeclared_nodes(path: str, h: nx.Graph) -> list[Hashable]:
    """Nodes of ``h`` (read from GraphML file ``path``) that no ``<node>`` element declares: networkx adds the
    end of an edge as a node without a word, so a mistyped edge end would be a switch or GPU of its own."""
    declared = {el.get("id") for el in ElementTree.parse(path).iter() if el.tag.rsplit("}", 1)[-1] == "node"}
    return [x for x in h.nodes if x not in declared]


def _text_in_numeric_data(path: str) -> str:
    """``": node 'gpu:0:0' server 'abc'"``: the first ``<data>`` of GraphML file ``path`` whose text is no number
    though its ``<key>`` declares it one (int, long, float, double), for the message networkx's own conversion
    error lacks (it names neither the element nor the attribute); ``""`` if none is found."""
    local = lambda el: el.tag.rsplit("}", 1)[-1]  # noqa: E731 - the tag without its XML namespace
    try:
        root = ElementTree.parse(path).getroot()
    except (OSError, ParseError):
        return ""
    keys = {el.get("id"): (el.get("attr.name"), el.get("attr.type")) for el in root.iter() if local(el) == "key"}
    convert = {"int": int, "long": int, "float": float, "double": float}
    for owner in root.iter():
        kind = local(owner)
        if kind not in ("graph", "node", "edge"):
            continue
        for data in (el for el in owner if local(el) == "data"):
            name, typ = keys.get(data.get("key"), (None, None))
            try:
                if typ in convert:
                    convert[typ]((data.text or "").strip())
            except ValueError:
                where = {"graph": "graph", "node": f"node {owner.get('id')!r}",
                         "edge": f"edge {owner.get('source')!r} -> {owner.get('target')!r}"}[kind]
                return f": {where} {name} {data.text!r} (declared {typ})"
    return ""


# ------------------------------------------------------------------ files
def load_topology(path: str | os.PathLike[str]) -> Cluster:
    """Read a topology file: YAML (``nodes`` and ``links``) or GraphML (by its ``.graphml`` suffix).

    Raises
    ------
    TopologyError
        One line naming the file and the entry: unreadable, malformed,
        not a topology, or failing a check of the module docstring.
    """
    where = os.fspath(path)
    if where.lower().endswith(GRAPHML_SUFFIXES):
        try:
            h = nx.read_graphml(where)
        except OSError as e:
            raise TopologyError(f"{where}: cannot read topology file ({e.strerror or e})") from None
        except (ParseError, nx.NetworkXError, ValueError, KeyError, TypeError) as e:
            # networkx converts a <data> value by its <key>'s attr.type and names neither the element nor the key
            numeric = isinstance(e, ValueError) and str(e).startswith(("could not convert", "invalid literal for"))
            hint = (f"; an attribute its <key> declares numeric (bandwidth in bytes/s, latency in s, server, rank, "
                    f"order, gpus_per_server) holds text here{_text_in_numeric_data(where)}" if numeric else "")
            raise TopologyError(f"{where}: malformed GraphML: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
                                f"{hint}") from None
        undeclared = _undeclared_nodes(where, h)
        if undeclared:
            x = undeclared[0]
            u, v = next((u, v) for u, v in h.edges() if x in (u, v))
            raise TopologyError(f"{where}: edge {u!r} -> {v!r} names node {x!r}, which no <node> declares (a typo? "
                                f"networkx would make it a node of its own)")
        try:
            return cluster_from_graph(h, where)
        except TopologyError as e:
            raise TopologyError(f"{where}: {e}") from None
    try:
        with open(where, encoding="utf-8") as f:
            doc = load_large_yaml(f.read())
    except OSError as e:
        raise TopologyError(f"{where}: cannot read topology file ({e.strerror or e})") from None
    except yaml.YAMLError as e:
        raise TopologyError(f"{where}: {malformed(e)}") from None
    if not is_topology_document(doc):
        raise TopologyError(f"{where}: not a topology file: expected a mapping with gpu, nodes (a list) and links")
    try:
        return cluster_from_dict(doc, source=where)  # type: ignore[arg-type]
    except TopologyError as e:
        raise TopologyError(f"{where}: {e}") from None
