"""Check a :class:`~topologies.cluster.Cluster` against the contract's schema.

Builders call :func:`validate_cluster` once on what they return; anyone who
builds or edits a graph by hand should call it too. A missing attribute is an
error, never a default.
"""

from __future__ import annotations

import math
from numbers import Real

import networkx as nx

from topologies.cluster import LINK_KINDS, NODE_KINDS, TIERS, Cluster, TopologyError, check_cluster, node_name

__all__ = ["validate_cluster"]


def _is_number(x: object) -> bool:
    t = type(x)
    if t is float or t is int:  # the common case, without the abstract-base-class check (10^6 edges)
        return True
    return isinstance(x, Real) and not isinstance(x, bool)


def _bad_edge(u: object, v: object, data: dict) -> None:
    """Raise the error that edge ``u -> v`` deserves (the first failed check, in the documented order)."""
    where = f"edge {node_name(u)} -> {node_name(v)}"
    for attr in ("bandwidth", "latency", "kind", "tier"):
        if attr not in data:
            raise TopologyError(f"{where}: missing attribute {attr!r}")
    bw, lat = data["bandwidth"], data["latency"]
    if not _is_number(bw) or not math.isfinite(bw) or bw <= 0:
        raise TopologyError(f"{where}: bandwidth {bw!r} is not a positive, finite number of bytes/s")
    if not _is_number(lat) or not math.isfinite(lat) or lat < 0:
        raise TopologyError(f"{where}: latency {lat!r} is not a non-negative, finite number of seconds")
    if data["kind"] not in LINK_KINDS:
        raise TopologyError(f"{where}: kind {data['kind']!r} is not one of {', '.join(LINK_KINDS)}")
    raise TopologyError(f"{where}: tier {data['tier']!r} is not one of {', '.join(TIERS)}")


def validate_cluster(cluster: Cluster) -> Cluster:
    """Raise :class:`TopologyError` unless ``cluster`` satisfies the contract.

    Checks, in order:

    * ``cluster`` is a :class:`Cluster` (else a one-line ``TypeError``; :func:`~topologies.export.cluster_to_dict`
      and :func:`~topologies.export.cluster_to_yaml` check through here);
    * ``graph`` is a ``networkx.DiGraph`` with at least one node;
    * every node has ``kind`` in :data:`NODE_KINDS` and an integer ``server``;
    * every edge has a positive, finite ``bandwidth`` (bytes/s), a
      non-negative, finite ``latency`` (s), ``kind`` in :data:`LINK_KINDS` and
      ``tier`` in :data:`TIERS`;
    * every edge ``(u, v)`` has its reverse ``(v, u)`` (links are full duplex);
    * every ``nvlink`` edge joins two nodes of one ``server`` (a server is one NVLink domain);
    * ``gpus`` is non-empty, without duplicates, and lists nodes of kind
      ``gpu``; ``gpus_per_server`` is a positive integer;
    * the graph is weakly connected.

    Parameters
    ----------
    cluster : Cluster

    Returns
    -------
    Cluster
        The same object, for chaining.

    Raises
    ------
    TopologyError
        Naming the first offending node or edge and attribute.
    TypeError
        ``cluster`` is not a :class:`Cluster` (``None``, a preset name).
    """
    check_cluster(cluster)
    g = cluster.graph
    if not isinstance(g, nx.DiGraph) or g.is_multigraph():
        raise TopologyError(f"cluster.graph: expected a networkx.DiGraph, got {type(g).__name__}")
    if g.number_of_nodes() == 0:
        raise TopologyError("cluster.graph: has no nodes")

    for n, data in g.nodes(data=True):
        if "kind" not in data:
            raise TopologyError(f"node {node_name(n)}: missing attribute 'kind'")
        if data["kind"] not in NODE_KINDS:
            raise TopologyError(f"node {node_name(n)}: kind {data['kind']!r} is not one of {', '.join(NODE_KINDS)}")
        if "server" not in data:
            raise TopologyError(f"node {node_name(n)}: missing attribute 'server'")
        if not isinstance(data["server"], int) or isinstance(data["server"], bool):
            raise TopologyError(f"node {node_name(n)}: server {data['server']!r} is not an integer")

    adj = g.adj
    for u, nbrs in g.adjacency():
        for v, data in nbrs.items():
            bw, lat = data.get("bandwidth"), data.get("latency")
            if (not _is_number(bw) or not _is_number(lat) or not 0 < bw < math.inf or not 0 <= lat < math.inf
                    or data.get("kind") not in LINK_KINDS or data.get("tier") not in TIERS):
                _bad_edge(u, v, data)
            if u not in adj[v]:
                a, z = node_name(u), node_name(v)
                raise TopologyError(f"edge {a} -> {z}: has no reverse edge {z} -> {a} (links are full duplex)")
            if data["tier"] == "nvlink" and g.nodes[u]["server"] != g.nodes[v]["server"]:
                # A server is one NVLink domain: the planners (hierarchical stages, PXN, NCCL's intra-node
                # latencies) and the node-level traffic views read "same server" as "joined by NVLink".
                raise TopologyError(f"edge {node_name(u)} -> {node_name(v)}: an NVLink link joins server "
                                    f"{g.nodes[u]['server']} and server {g.nodes[v]['server']}; an NVLink domain is "
                                    f"one server (give both ends the same server, or cable them through NICs)")

    if not cluster.gpus:
        raise TopologyError("cluster.gpus: is empty")
    if len(set(cluster.gpus)) != len(cluster.gpus):
        raise TopologyError("cluster.gpus: lists a GPU more than once")
    for n in cluster.gpus:
        if n not in g:
            raise TopologyError(f"cluster.gpus: {n!r} is not a node of the graph")
        if g.nodes[n]["kind"] != "gpu":
            raise TopologyError(f"cluster.gpus: {n!r} has kind {g.nodes[n]['kind']!r}, not 'gpu'")
    gps = cluster.gpus_per_server
    if not isinstance(gps, int) or isinstance(gps, bool) or gps < 1:
        raise TopologyError(f"cluster.gpus_per_server: {gps!r} is not a positive integer")

    if not nx.is_weakly_connected(g):
        parts = nx.number_weakly_connected_components(g)
        raise TopologyError(f"cluster.graph: is not connected ({parts} separate components)")
    return cluster
