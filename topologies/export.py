"""Write any cluster as a topology file (YAML) or as GraphML, so that it loads back as the same simulation.

:func:`cluster_to_yaml` writes the format :mod:`topologies.custom` reads;
:func:`cluster_to_graphml` writes GraphML that networkx, Gephi or yEd open and
that :func:`topologies.custom.load_topology` reads back. Either way the
cluster comes back with the same node labels in the same order, the same
directed edges in the same order with the same attributes, the same GPU,
rank order, server size and name, so a simulation on it is identical (same
routes, same ECMP choices, same link numbering). ``params`` is not carried:
the loaded cluster says ``fabric: custom``.

YAML numbers are written with units (``450GB/s``, ``0.25us``) in the fewest
digits that parse back to the very same float; GraphML keeps SI floats.

Examples
--------
>>> from topologies import leaf_spine
>>> from topologies.custom import cluster_from_dict
>>> c = leaf_spine("H100", servers=2, gpus_per_server=2, servers_per_leaf=1, spines=2)
>>> d = cluster_to_dict(c)
>>> d["nodes"][:3], d["links"][0]
(['gpu:0:0', 'gpu:0:1', 'nvswitch:0'], {'a': 'gpu:0:0', 'b': 'nvswitch:0', 'bandwidth': '450GB/s', 'latency': '0.25us'})
>>> back = cluster_from_dict(d)
>>> list(back.graph.edges(data=True)) == list(c.graph.edges(data=True))
True
"""

from __future__ import annotations

import heapq
import os
import re
from collections.abc import Hashable

import networkx as nx
import yaml

from topologies.cluster import Cluster, TopologyError
from topologies.custom import (
    GRAPHML_SUFFIXES,
    SERVER_KINDS,
    check_reachable,
    implied_by_id,
    link_defaults,
    node_id,
    server_size,
)
from topologies.gpus import GPU_SPECS
from topologies.units import parse_bandwidth, parse_time
from topologies.validate import validate_cluster
from topologies.yamlio import load_yaml

__all__ = ["cluster_to_dict", "cluster_to_yaml", "cluster_to_graphml", "write_topology", "link_order", "edge_order"]

YAML_SUFFIXES = (".yaml", ".yml")

# Units tried in order of preference; the first that writes the value exactly in few digits wins.
_BANDWIDTH_UNITS = ((1e9, "GB/s"), (1e12, "TB/s"), (1e6, "MB/s"), (1e3, "KB/s"))
_TIME_UNITS = ((1e6, "us"), (1e9, "ns"), (1e3, "ms"), (1.0, "s"), (1e12, "ps"))


def _exact(x: float, units: tuple[tuple[float, str], ...], parse, fallback: str, cache: dict) -> str:
    """The shortest ``<number><unit>`` text that ``parse`` reads back as exactly ``x``."""
    text = cache.get(x)
    if text is not None:
        return text
    text = f"{x!r}{fallback}"  # always exact: the unit's factor is 1
    if x == 0:
        text = f"0{units[0][1]}"
    else:
        for i, (factor, unit) in enumerate(units):
            value = x / factor if parse is parse_bandwidth else x * factor
            if not (0.01 if i == 0 else 1.0) <= value < 1e5:
                continue
            for digits in range(1, 18):
                candidate = f"{value:.{digits}g}"
                if "e" not in candidate and parse(candidate + unit) == x:
                    text = candidate + unit
                    break
            else:
                continue
            break
    cache[x] = text
    return text


# ------------------------------------------------------------------ checks
def _check(cluster: Cluster) -> None:
    """Refuse, in one line, a cluster that a topology file cannot bring back identically."""
    validate_cluster(cluster)
    g = cluster.graph
    gpu_nodes = [n for n, k in g.nodes(data="kind") if k == "gpu"]
    if len(gpu_nodes) != len(cluster.gpus):
        raise TopologyError(f"cluster.gpus: lists {len(cluster.gpus)} of the graph's {len(gpu_nodes)} GPUs; a "
                            f"topology file makes every GPU a rank")
    if GPU_SPECS.get(cluster.gpu.name) != cluster.gpu:
        raise TopologyError(f"cluster.gpu: {cluster.gpu.name!r} is a custom GPUSpec, not topologies.GPU_SPECS' entry; "
                            f"a topology file names a catalogue GPU")
    for n, data in g.nodes(data=True):
        node_id(n)
        kind, server = data["kind"], data["server"]
        if (kind in SERVER_KINDS and server < 0) or (kind not in SERVER_KINDS and server != -1):
            raise TopologyError(f"node {n!r}: a {kind} with server {server}; gpu, nic and nvswitch nodes sit in a "
                                f"server (>= 0), switches in none (-1)")
    for u, v, data in g.edges(data=True):
        back = g.edges[v, u]
        for key in ("kind", "tier"):
            if data[key] != back[key]:
                raise TopologyError(f"edge {u!r} -> {v!r}: {key} {data[key]!r} but {back[key]!r} the other way; "
                                    f"a link has one {key}")
    check_reachable(g, cluster.gpus, "cluster.graph")
    _count, per_server = server_size(g, cluster.gpus, "cluster.graph")
    if per_server != cluster.gpus_per_server:
        raise TopologyError(f"cluster.gpus_per_server: {cluster.gpus_per_server}, but the graph puts {per_server} "
                            f"GPUs in each server")


def _topological(count: int, chains: list[list[int]]) -> tuple[list[int], bool]:
    """Items ``0..count-1`` ordered so that each chain's items come in the chain's order, smallest first
    where free; ``(order, True)``, or ``(an order that breaks some chain, False)`` if the chains cycle."""
    after: list[list[int]] = [[] for _ in range(count)]
    waiting = [0] * count
    for chain in chains:
        for x, y in zip(chain, chain[1:]):
            after[x].append(y)
            waiting[y] += 1
    ready = [i for i, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    done = [False] * count
    out: list[int] = []
    exact, scan = True, 0
    while len(out) < count:
        if not ready:  # the chains cycle: take the earliest item left
            exact = False
            while done[scan]:
                scan += 1
            ready.append(scan)
        i = heapq.heappop(ready)
        if done[i]:
            continue
        done[i] = True
        out.append(i)
        for j in after[i]:
            waiting[j] -= 1
            if waiting[j] == 0 and not done[j]:
                heapq.heappush(ready, j)
    return out, exact


def edge_order(graph: nx.DiGraph) -> list[tuple[Hashable, Hashable]]:
    """The directed edges in an order that, added one by one, rebuilds every node's successor and
    predecessor order (a networkx graph's neighbour orders are those of edge insertion, so one always
    exists); ``graph.edges`` order where that does."""
    edges = list(graph.edges)
    index = {e: i for i, e in enumerate(edges)}
    chains = [[index[u, v] for v in graph.successors(u)] for u in graph]
    chains += [[index[u, v] for u in graph.predecessors(v)] for v in graph]
    order, _exact = _topological(len(edges), chains)
    return [edges[i] for i in order]


def link_order(graph: nx.DiGraph) -> list[tuple[Hashable, Hashable]]:
    """The full-duplex links ``(a, b)`` in an order that rebuilds every node's neighbour orders.

    Loading a link adds ``a -> b`` then ``b -> a``, appending each end to the
    other's successors and predecessors, so the links must come in an order
    consistent with every node's neighbour orders: a topological order of
    "link x before link y" constraints, smallest-first-seen where free. For
    graphs built link by link (every builder) that is the order they were
    built in. ``a`` is the end listed first among the nodes.

    If the successor and predecessor orders conflict (a graph edited edge by
    edge), successor orders alone are kept (they fix ``graph.edges`` order,
    hence link numbering; routes never depend on either); if those conflict
    too, the earliest link breaks each cycle.
    """
    pos = {n: i for i, n in enumerate(graph.nodes)}
    index: dict[tuple, int] = {}
    links: list[tuple[Hashable, Hashable]] = []

    def key(u: Hashable, v: Hashable) -> tuple:
        return (u, v) if pos[u] < pos[v] else (v, u)

    for u, v in graph.edges:
        k = key(u, v)
        if k not in index:
            index[k] = len(links)
            links.append(k)
    succ = [[index[key(u, v)] for v in graph.successors(u)] for u in graph]
    pred = [[index[key(u, v)] for u in graph.predecessors(v)] for v in graph]
    order, exact = _topological(len(links), succ + pred)
    if not exact:
        order, exact = _topological(len(links), succ)
    return [links[i] for i in order]


# ------------------------------------------------------------------ YAML
def cluster_to_dict(cluster: Cluster) -> dict:
    """The topology document of ``cluster``: what :func:`topologies.custom.cluster_from_dict` reads back.

    Nodes whose id says their kind and server are written as bare ids; GPUs
    get ``rank:`` only when rank order differs from node order; links omit
    ``kind``/``tier`` where :data:`~topologies.custom.LINK_DEFAULTS` gives
    them and add ``bandwidth_reverse``/``latency_reverse`` where the two
    directions differ.

    Raises
    ------
    TopologyError
        For a cluster no file brings back identically: a node label that is
        not a string, integer or ``(name, int, ...)`` tuple, a custom
        :class:`~topologies.cluster.GPUSpec`, GPUs that are not ranks, a link
        whose directions differ in kind or tier, an invalid graph.
    """
    _check(cluster)
    g = cluster.graph
    listed = tuple(n for n, k in g.nodes(data="kind") if k == "gpu")
    rank = {n: r for r, n in enumerate(cluster.gpus)} if listed != cluster.gpus else {}
    nodes: list[object] = []
    for n, data in g.nodes(data=True):
        ident = node_id(n)
        if (data["kind"], data["server"]) == implied_by_id(n) and n not in rank:
            nodes.append(ident)
            continue
        entry: dict[str, object] = {"id": ident, "kind": data["kind"]}
        if data["kind"] in SERVER_KINDS:
            entry["server"] = data["server"]
        if n in rank:
            entry["rank"] = rank[n]
        nodes.append(entry)
    bw_text: dict[float, str] = {}
    time_text: dict[float, str] = {}
    links = []
    for a, b in link_order(g):
        fwd, back = g.edges[a, b], g.edges[b, a]
        entry = {"a": node_id(a), "b": node_id(b),
                 "bandwidth": _exact(fwd["bandwidth"], _BANDWIDTH_UNITS, parse_bandwidth, "B/s", bw_text),
                 "latency": _exact(fwd["latency"], _TIME_UNITS, parse_time, "s", time_text)}
        if (fwd["kind"], fwd["tier"]) != link_defaults(g.nodes[a]["kind"], g.nodes[b]["kind"]):
            entry["kind"], entry["tier"] = fwd["kind"], fwd["tier"]
        if back["bandwidth"] != fwd["bandwidth"]:
            entry["bandwidth_reverse"] = _exact(back["bandwidth"], _BANDWIDTH_UNITS, parse_bandwidth, "B/s", bw_text)
        if back["latency"] != fwd["latency"]:
            entry["latency_reverse"] = _exact(back["latency"], _TIME_UNITS, parse_time, "s", time_text)
        links.append(entry)
    doc: dict[str, object] = {"gpu": cluster.gpu.name}
    if cluster.name:
        doc["name"] = cluster.name
    doc["nodes"] = nodes
    doc["links"] = links
    return doc


_PLAIN = re.compile(r"^[A-Za-z_][A-Za-z0-9_./-]*(?::[+-]?[0-9]+)*$")
_WITH_UNIT = re.compile(r"^[0-9][0-9.]*(?:[eE][+-]?[0-9]+)?[A-Za-z/]+$")
_RESERVED = {"true", "false", "yes", "no", "on", "off", "null", "y", "n"}


def _scalar(value: object, cache: dict[str, str]) -> str:
    """``value`` as a YAML flow scalar that :func:`topologies.yamlio.load_yaml` reads back unchanged."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    text = str(value)
    if (_PLAIN.match(text) and text.lower() not in _RESERVED) or _WITH_UNIT.match(text):
        return text
    if text not in cache:
        quoted = yaml.safe_dump(text, default_style='"', allow_unicode=True, width=2**31).strip()
        quoted = quoted.removesuffix("...").strip()
        if load_yaml(f"k: {quoted}") != {"k": text}:  # pragma: no cover - PyYAML quotes what it reads
            raise TopologyError(f"cannot write {text!r} as a YAML scalar")
        cache[text] = quoted
    return cache[text]


def _flow(entry: object, cache: dict[str, str]) -> str:
    if isinstance(entry, dict):
        return "{" + ", ".join(f"{k}: {_scalar(v, cache)}" for k, v in entry.items()) + "}"
    return _scalar(entry, cache)


def cluster_to_yaml(cluster: Cluster, path: str | os.PathLike[str] | None = None) -> str:
    """``cluster`` as a topology file (one node or link per line); written to ``path`` if given.

    Returns
    -------
    str
        The YAML text.

    Raises
    ------
    TopologyError
        As :func:`cluster_to_dict`.
    """
    doc = cluster_to_dict(cluster)
    cache: dict[str, str] = {}
    lines = [f"# clustersim topology: {cluster.num_gpus} GPUs, {len(doc['nodes'])} nodes, {len(doc['links'])} "
             f"full-duplex links (bandwidth per direction); topologies.custom describes the format",
             f"gpu: {_scalar(doc['gpu'], cache)}"]
    if "name" in doc:
        lines.append(f"name: {_scalar(doc['name'], cache)}")
    lines.append("nodes:")
    lines += [f"  - {_flow(e, cache)}" for e in doc["nodes"]]  # type: ignore[attr-defined]
    lines.append("links:")
    lines += [f"  - {_flow(e, cache)}" for e in doc["links"]]  # type: ignore[attr-defined]
    text = "\n".join(lines) + "\n"
    if path is not None:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    return text


# ------------------------------------------------------------------ GraphML
def cluster_to_graphml(cluster: Cluster, path: str | os.PathLike[str]) -> None:
    """Write ``cluster`` as GraphML: one node per graph node, one edge per direction, SI floats.

    Graph attributes ``gpu``, ``name``, ``gpus_per_server``; node attributes
    ``kind``, ``server`` and (GPUs) ``rank``; edge attributes ``bandwidth``
    (bytes/s), ``latency`` (s), ``kind``, ``tier`` and ``order`` (the
    edge's place in an insertion order that rebuilds every node's neighbour
    orders, :func:`edge_order`). Node ids are the file ids of
    :func:`topologies.custom.node_id` (``"gpu:0:3"``).

    Raises
    ------
    TopologyError
        As :func:`cluster_to_dict`.
    """
    _check(cluster)
    g = cluster.graph
    rank = {n: r for r, n in enumerate(cluster.gpus)}
    h = nx.DiGraph(gpu=cluster.gpu.name, name=cluster.name, gpus_per_server=cluster.gpus_per_server)
    for n, data in g.nodes(data=True):
        attrs: dict[str, object] = {"kind": data["kind"], "server": int(data["server"])}
        if n in rank:
            attrs["rank"] = rank[n]
        h.add_node(str(node_id(n)), **attrs)
    for i, (u, v) in enumerate(edge_order(g)):
        data = g.edges[u, v]
        h.add_edge(str(node_id(u)), str(node_id(v)), bandwidth=float(data["bandwidth"]),
                   latency=float(data["latency"]), kind=data["kind"], tier=data["tier"], order=i)
    nx.write_graphml(h, os.fspath(path))


def write_topology(cluster: Cluster, path: str | os.PathLike[str]) -> None:
    """Write ``cluster`` to ``path`` as YAML (``.yaml``, ``.yml``) or GraphML (``.graphml``), by its suffix."""
    where = os.fspath(path)
    if where.lower().endswith(YAML_SUFFIXES):
        cluster_to_yaml(cluster, where)
    elif where.lower().endswith(GRAPHML_SUFFIXES):
        cluster_to_graphml(cluster, where)
    else:
        raise TopologyError(f"{where}: unknown topology format; name the file .yaml, .yml or .graphml")
