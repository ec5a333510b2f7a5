"""``clustersim topology``: describe and check any cluster's fabric, and export it as YAML or GraphML.

Kept apart from :mod:`simulator.cli` (which registers it) so the command list there stays short.
"""

from __future__ import annotations

import argparse
from collections import Counter

from topologies import format_bandwidth
from topologies.cluster import NODE_KINDS, TIERS, Cluster
from topologies.export import write_topology

__all__ = ["configure", "run", "describe_fabric"]


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("cluster", help="preset name, PRESET:NODES, cluster or experiment YAML, topology file (.yaml) "
                                   "or .graphml")
    p.add_argument("-o", "--output", action="append", default=[], metavar="FILE",
                   help="write the fabric to FILE: .yaml (a topology file, see README 'Custom fabrics') or "
                        ".graphml; repeatable")


def describe_fabric(cluster: Cluster) -> list[str]:
    """Lines saying what the fabric holds: GPUs and servers, nodes per kind, links and their rates per tier."""
    g = cluster.graph
    servers = cluster.num_gpus // cluster.gpus_per_server
    kinds = Counter(k for _n, k in g.nodes(data="kind"))
    lines = [cluster.name,
             f"  {cluster.num_gpus} {cluster.gpu.name} GPUs in {servers} server(s) of {cluster.gpus_per_server}",
             "  nodes: " + ", ".join(f"{kinds[k]} {k}" for k in NODE_KINDS if kinds[k])]
    rates: dict[str, list[float]] = {}
    for _u, _v, data in g.edges(data=True):
        rates.setdefault(data["tier"], []).append(data["bandwidth"])
    parts = []
    for tier in TIERS:
        bw = rates.get(tier)
        if bw:
            lo, hi = min(bw), max(bw)
            rate = format_bandwidth(lo) if lo == hi else f"{format_bandwidth(lo)} to {format_bandwidth(hi)}"
            parts.append(f"{tier} {len(bw) // 2} x {rate}")
    lines.append("  links (full duplex, per direction): " + "; ".join(parts))
    return lines


def run(args: argparse.Namespace) -> int:
    from .cli import check_writable, resolve_cluster

    for out in args.output:
        check_writable(out, "--output")
        if not out.lower().endswith((".yaml", ".yml", ".graphml")):
            raise ValueError(f"--output: {out!r}: name the file .yaml, .yml (topology file) or .graphml")
    cluster = resolve_cluster(args.cluster, 1, field="cluster")
    print("\n".join(describe_fabric(cluster)))
    for out in args.output:
        try:
            write_topology(cluster, out)
        except OSError as exc:  # (a full disk: found only as the file is written)
            raise ValueError(f"--output: cannot write {out}: {exc.strerror or exc}") from None
        print(f"wrote {out}")
    return 0
