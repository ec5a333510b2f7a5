"""Pure functions that build a validated :class:`~topologies.cluster.Cluster`.

Every builder composes the same pieces:

* **server** ``s`` (one NVLink domain): GPUs ``("gpu", s, i)`` for local index
  ``i`` in ``range(gpus_per_server)``, each joined to the server's
  ``("nvswitch", s)`` by one full-duplex NVLink edge pair (kind ``nvlink``,
  tier ``nvlink``, bandwidth = the GPU's NVLink bandwidth per direction). The
  NVSwitch stands for the whole NVSwitch tray: any GPU pair inside a server is
  two hops apart and gets the full per-GPU NVLink bandwidth.
* **NICs** (scale-out fabrics only): one ``("nic", s, i)`` per GPU, joined to
  it by a PCIe edge pair (kind ``pcie``, tier ``pcie``).
* **fabric**: NIC -> leaf edges (kind ``ib``, tier ``leaf``, bandwidth = NIC
  rate), leaf -> spine (tier ``spine``) and spine -> core (tier ``core``)
  edges. Each leaf-spine or spine-core edge stands for all the cables between
  the two switches (one aggregated link per direction), sized so that
  ``oversubscription`` = a leaf's downlink : uplink bandwidth exactly.

Node attributes are ``kind`` and ``server`` (``-1`` for fabric switches); edge
attributes are ``bandwidth`` (bytes/s), ``latency`` (s), ``kind`` and
``tier``, as :mod:`topologies.cluster` specifies. Ranks are numbered server
by server: rank ``r`` is ``("gpu", r // gpus_per_server, r % gpus_per_server)``.

Bandwidths and latencies may be given as numbers (bytes/s, s) or strings with
units (``"400Gbps"``, ``"450GB/s"``, ``"1us"``).

Default per-hop latencies
-------------------------
These are hardware one-way latencies of the order public measurements give;
software overheads (NCCL kernel launch, protocol) belong to the collective
model, not to the wire.

* ``nvlink_latency`` = 0.25 us per GPU <-> NVSwitch hop, so ~0.5 us GPU to
  GPU through the switch (NVLink/NVSwitch small-message latency is reported
  in the sub-microsecond range).
* ``nic_latency`` = 0.25 us per GPU <-> NIC hop: one PCIe traversal (a PCIe
  Gen4/5 round trip is ~0.5-1 us) plus NIC processing is folded in here.
* ``switch_latency`` = 0.5 us per InfiniBand hop (NIC <-> leaf, leaf <-> spine,
  spine <-> core): an NDR/HDR switch's port-to-port latency is ~0.1-0.2 us;
  the rest covers cable propagation (~5 ns/m), serialisation and the NIC
  port. GPU to GPU across one leaf is then 2 * 0.25 + 2 * 0.5 = 1.5 us, near
  the ~1-2 us that ``ib_write_lat``-class benchmarks report through a switch.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Hashable, Mapping

import networkx as nx

from topologies.cluster import Cluster, GPUSpec, TopologyError
from topologies.gpus import PCIE_BANDWIDTH, get_gpu
from topologies.units import BARE_BANDWIDTH_MIN, parse_link_bandwidth, parse_link_latency
from topologies.validate import validate_cluster

__all__ = [
    "MAX_GPUS",
    "MAX_SWITCHES",
    "DEFAULT_NVLINK_LATENCY",
    "DEFAULT_NIC_LATENCY",
    "DEFAULT_SWITCH_LATENCY",
    "single_server",
    "leaf_spine",
    "rail_optimized",
    "fat_tree",
    "validate_cluster",
    "ratio_text",
]

MAX_SWITCHES = 65_536
"""The most switches (or servers per leaf) of one tier."""
MAX_TIER_LINKS = 1 << 24
"""The most links between two switch tiers (leaves x spines; a 131,072-GPU fat tree has ~10^5)."""
MAX_GPUS = 262_144
"""The largest cluster built (GPUs): twice a 16K-node, 131,072-GPU fabric. The graph and routes grow with it,
so a larger value (``nodes: 10**18``, ``leaf_spine("H100", 10**12)``) is refused before anything is allocated
(:func:`check_gpu_count`)."""
DEFAULT_NVLINK_LATENCY = 0.25e-6
"""Seconds per GPU <-> NVSwitch hop (see module docstring)."""
DEFAULT_NIC_LATENCY = 0.25e-6
"""Seconds per GPU <-> NIC (PCIe) hop."""
DEFAULT_SWITCH_LATENCY = 0.5e-6
"""Seconds per InfiniBand hop (NIC <-> leaf, leaf <-> spine, spine <-> core)."""


# --------------------------------------------------------------------------- helpers


def _positive_int(value: object, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:  # (numpy's too)
        raise TopologyError(f"{field}: {value!r} is not a positive integer")
    return int(value)


def _switch_count(value: object, field: str) -> int:
    """A positive number of switches (or servers per leaf) of one tier, at most :data:`MAX_SWITCHES`: checked
    before anything is built (``leaf_spine("H100", 2, spines=10**12)`` built switches until memory ran out)."""
    n = _positive_int(value, field)
    if n > MAX_SWITCHES:
        raise TopologyError(f"{field}: {n:,} exceeds the supported {MAX_SWITCHES:,}")
    return n


def check_gpu_count(servers: int, gpus_per_server: int, field: str = "servers", unit: str = "servers",
                    fewer: str | None = None) -> None:
    """Raise :class:`TopologyError`, naming ``field``, when ``servers`` x ``gpus_per_server`` exceeds
    :data:`MAX_GPUS`: checked before anything is built (the builders and :func:`topologies.build_cluster`, in one
    wording; ``unit``: what ``servers`` counts, ``fewer``: what to reduce, default ``unit``)."""
    total = servers * gpus_per_server
    if total > MAX_GPUS:
        raise TopologyError(f"{field}: {servers} {unit} x {gpus_per_server} GPUs = {total:,} GPUs exceeds the "
                            f"supported {MAX_GPUS:,}; use fewer {fewer or unit}")


def _oversubscription(value: object, field: str = "oversubscription") -> float:
    """A ratio >= 1 as a float: any real number (numpy's too), not a bool."""
    x = math.nan
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        try:
            x = float(value)  # (first: np.float32 compared with 1e300 overflowed with a warning)
        except OverflowError:  # an int beyond any float: refused below
            x = math.inf
    if not 1 <= x <= 1e300:
        raise TopologyError(f"{field}: {value!r} is not a number >= 1 (downlink:uplink, e.g. 1 for non-blocking, "
                            f"3 for 3:1)")
    return x


def _uplink_rate(rate: float, field: str, value: float) -> float:
    """A switch uplink's rate (bytes/s) derived from ``field`` = ``value``; TopologyError below the rate any link
    needs (:data:`~topologies.units.BARE_BANDWIDTH_MIN`), as a degraded link or a written bandwidth would be."""
    if not rate >= BARE_BANDWIDTH_MIN:
        raise TopologyError(f"{field}: {value:g} leaves each uplink {rate:g} bytes/s (the downlinks' bandwidth "
                            f"over switches x ratio), below the {BARE_BANDWIDTH_MIN:g} a link needs; use fewer "
                            f"spines or cores, faster NICs or a smaller ratio")
    return rate


def ratio_text(oversubscription: float) -> str:
    """``1.0 -> "1:1"``, ``3.0 -> "3:1"``, ``1.5 -> "1.5:1"``."""
    return f"{oversubscription:g}:1"


def core_ratio(params: Mapping) -> float:
    """A built fabric's core oversubscription, from its ``params``: a fat tree's with cores, else 1."""
    return params.get("core_oversubscription", 1.0) if params.get("cores") else 1.0


def default_spines(ports: int, oversubscription: float) -> int:
    """The most spines that keep each leaf-spine link of a leaf of ``ports`` NIC ports at ``oversubscription``
    at least one port's bandwidth (``floor(ports / ratio)``, at least 1): the rail-optimized builder's default
    spines, and the bound the experiment's note holds any fabric's spines to."""
    return max(1, math.floor(ports / oversubscription + 1e-9))


def ratios_text(oversubscription: float, core_oversubscription: float = 1.0) -> str:
    """A fabric's ratio for its title: the leaf's, and a fat tree's core ratio where it has cores and one is
    set (``"1:1"``, ``"2:1, core 4:1"``)."""
    text = ratio_text(oversubscription)
    return text if core_oversubscription == 1 else f"{text}, core {ratio_text(core_oversubscription)}"


def _link(g: nx.DiGraph, u: Hashable, v: Hashable, bandwidth: float, latency: float, kind: str, tier: str) -> None:
    """Add one full-duplex link: the edges ``u -> v`` and ``v -> u`` with equal attributes."""
    g.add_edge(u, v, bandwidth=bandwidth, latency=latency, kind=kind, tier=tier)
    g.add_edge(v, u, bandwidth=bandwidth, latency=latency, kind=kind, tier=tier)


def nvswitch_label(server: int, rack: int = 0) -> tuple:
    """Label of the NVSwitch of ``rack`` in NVLink domain ``server``: ``("nvswitch", server)`` for the first
    (every single-rack domain), ``("nvswitch", server, rack)`` for the others (NVL36x2)."""
    return ("nvswitch", server) if rack == 0 else ("nvswitch", server, rack)


def _add_server(g: nx.DiGraph, server: int, gpus_per_server: int, nvlink_bandwidth: float,
                nvlink_latency: float, racks: int = 1) -> list[tuple]:
    """One NVLink domain: GPUs in a star around the server's NVSwitch. Returns the GPU labels.

    ``racks`` > 1 splits the domain over that many racks (GB200 NVL36x2: two racks of 36 GPUs): GPU ``i``
    hangs off rack ``i // (gpus_per_server / racks)``'s NVSwitch, and the racks' switches are joined pairwise
    by NVLink cables carrying every GPU of a rack at full rate (NVL36x2 gives half of each switch tray's
    ports to the other rack: non-blocking), one switch hop further.
    """
    per_rack = gpus_per_server // racks
    switches = [nvswitch_label(server, k) for k in range(racks)]
    gpus = [("gpu", server, i) for i in range(gpus_per_server)]
    for gpu in gpus:
        g.add_node(gpu, kind="gpu", server=server)
    for switch in switches:
        g.add_node(switch, kind="nvswitch", server=server)
    for i, gpu in enumerate(gpus):
        _link(g, gpu, switches[i // per_rack], nvlink_bandwidth, nvlink_latency, "nvlink", "nvlink")
    for a in range(racks):
        for b in range(a + 1, racks):
            _link(g, switches[a], switches[b], per_rack * nvlink_bandwidth, nvlink_latency, "nvlink", "nvlink")
    return gpus


def _nvlink_racks(value: object, gpus_per_server: int) -> int:
    racks = _positive_int(value, "nvlink_racks")
    if gpus_per_server % racks:
        raise TopologyError(f"nvlink_racks: {racks} does not divide gpus_per_server ({gpus_per_server}); each rack "
                            f"of an NVLink domain holds the same number of GPUs")
    return racks


def _add_nics(g: nx.DiGraph, server: int, gpus_per_server: int, pcie_bandwidth: float,
              nic_latency: float) -> list[tuple]:
    """One NIC per GPU, joined by PCIe. Returns the NIC labels in local-GPU order."""
    nics = []
    for i in range(gpus_per_server):
        nic = ("nic", server, i)
        g.add_node(nic, kind="nic", server=server)
        _link(g, ("gpu", server, i), nic, pcie_bandwidth, nic_latency, "pcie", "pcie")
        nics.append(nic)
    return nics


class _ScaleOut:
    """Resolved, checked parameters shared by the scale-out builders."""

    def __init__(self, fabric: str, gpu: str | GPUSpec, servers: int, gpus_per_server: int, servers_per_leaf: int,
                 spines: int | None, nic_bandwidth: float | str | None, nvlink_bandwidth: float | str | None,
                 oversubscription: float, pcie_bandwidth: float | str | None, nvlink_latency: float | str,
                 nic_latency: float | str, switch_latency: float | str, nvlink_racks: int = 1) -> None:
        self.fabric = fabric
        self.gpu = get_gpu(gpu)
        self.servers = _positive_int(servers, "servers")
        self.gpus_per_server = _positive_int(gpus_per_server, "gpus_per_server")
        check_gpu_count(self.servers, self.gpus_per_server)
        self.servers_per_leaf = _switch_count(servers_per_leaf, "servers_per_leaf")
        self.spines = self.servers_per_leaf if spines is None else _switch_count(spines, "spines")
        self.leaves = math.ceil(self.servers / self.servers_per_leaf)
        leaves = self.leaves
        if leaves * self.spines > MAX_TIER_LINKS:  # (each tier's count capped alone still multiplies: 2.1e9 links)
            raise TopologyError(f"spines: {self.spines:,} spines x {leaves:,} leaves = {leaves * self.spines:,} "
                                f"leaf-spine links exceeds the supported {MAX_TIER_LINKS:,}; use fewer spines or "
                                f"more servers per leaf")
        self.nic_bandwidth = (self.gpu.nic_bandwidth if nic_bandwidth is None
                              else parse_link_bandwidth(nic_bandwidth, "nic_bandwidth"))
        self.nvlink_bandwidth = (self.gpu.nvlink_bandwidth if nvlink_bandwidth is None
                                 else parse_link_bandwidth(nvlink_bandwidth, "nvlink_bandwidth"))
        # Default PCIe: the GPU's generation x16, raised to the NIC rate when a
        # faster NIC is configured (a faster NIC comes with a matching PCIe gen).
        self.pcie_bandwidth = (max(PCIE_BANDWIDTH.get(self.gpu.name, 64e9), self.nic_bandwidth)
                               if pcie_bandwidth is None else parse_link_bandwidth(pcie_bandwidth, "pcie_bandwidth"))
        self.oversubscription = _oversubscription(oversubscription)
        self.nvlink_latency = parse_link_latency(nvlink_latency, "nvlink_latency")
        self.nic_latency = parse_link_latency(nic_latency, "nic_latency")
        self.switch_latency = parse_link_latency(switch_latency, "switch_latency")
        self.nvlink_racks = _nvlink_racks(nvlink_racks, self.gpus_per_server)

    def servers_and_nics(self) -> tuple[nx.DiGraph, list[tuple], list[list[tuple]]]:
        """Graph with every server and its NICs; GPU labels in rank order; NICs per server."""
        g = nx.DiGraph()
        gpus: list[tuple] = []
        nics: list[list[tuple]] = []
        for s in range(self.servers):
            gpus += _add_server(g, s, self.gpus_per_server, self.nvlink_bandwidth, self.nvlink_latency,
                                self.nvlink_racks)
            nics.append(_add_nics(g, s, self.gpus_per_server, self.pcie_bandwidth, self.nic_latency))
        return g, gpus, nics

    def attach(self, g: nx.DiGraph, nic: tuple, leaf: tuple) -> None:
        _link(g, nic, leaf, self.nic_bandwidth, self.switch_latency, "ib", "leaf")

    def params(self, **derived: object) -> dict:
        return {
            "fabric": self.fabric,
            "gpu": self.gpu.name,
            "servers": self.servers,
            "gpus_per_server": self.gpus_per_server,
            "servers_per_leaf": self.servers_per_leaf,
            "nvlink_bandwidth": self.nvlink_bandwidth,
            "nic_bandwidth": self.nic_bandwidth,
            "pcie_bandwidth": self.pcie_bandwidth,
            "oversubscription": self.oversubscription,
            "nvlink_latency": self.nvlink_latency,
            "nic_latency": self.nic_latency,
            "switch_latency": self.switch_latency,
            "nvlink_racks": self.nvlink_racks,
            **derived,
        }

    def name(self, core_oversubscription: float = 1.0) -> str:
        n = self.servers * self.gpus_per_server
        return (f"{self.servers}x {self.gpu.name} server ({n} GPUs), {self.fabric} "
                f"{ratios_text(self.oversubscription, core_oversubscription)}")

    def cluster(self, g: nx.DiGraph, gpus: list[tuple], params: dict) -> Cluster:
        name = self.name(core_ratio(params))
        return validate_cluster(Cluster(graph=g, gpu=self.gpu, gpus=tuple(gpus), gpus_per_server=self.gpus_per_server,
                                        name=name, params=params))


def _add_switches(g: nx.DiGraph, kind: str, count: int, start: int = 0) -> list[tuple]:
    nodes = [(kind, start + j) for j in range(count)]
    for n in nodes:
        g.add_node(n, kind=kind, server=-1)
    return nodes


# --------------------------------------------------------------------------- builders


def single_server(gpu: str | GPUSpec = "H100-SXM", gpus_per_server: int = 8,
                  nvlink_bandwidth: float | str | None = None,
                  nvlink_latency: float | str = DEFAULT_NVLINK_LATENCY, nvlink_racks: int = 1) -> Cluster:
    """One server: ``gpus_per_server`` GPUs around one NVSwitch, no NICs.

    There is no scale-out fabric, so there are no NIC nodes either: every GPU
    pair is ``gpu -> nvswitch -> gpu``.

    Parameters
    ----------
    gpu : str or GPUSpec
        GPU model name or alias (see :func:`topologies.get_gpu`).
    gpus_per_server : int
        GPUs in the NVLink domain, at most :data:`MAX_GPUS` (262,144).
    nvlink_bandwidth : float or str, optional
        Per GPU, per direction (bytes/s or e.g. ``"450GB/s"``); default: the
        GPU spec's.
    nvlink_latency : float or str
        Seconds per GPU <-> NVSwitch hop.
    nvlink_racks : int
        Racks the NVLink domain spans (see :func:`leaf_spine`).

    Returns
    -------
    Cluster
        Nodes ``("gpu", 0, i)`` and ``("nvswitch", 0)``; ``params["fabric"]``
        is ``"single_node"``.

    Examples
    --------
    >>> c = single_server("H100", 8)
    >>> c.num_gpus, c.graph.number_of_edges()
    (8, 16)
    """
    spec = get_gpu(gpu)
    gps = _positive_int(gpus_per_server, "gpus_per_server")
    check_gpu_count(1, gps, "gpus_per_server", "server", "GPUs per server")
    nvlink_bw = spec.nvlink_bandwidth if nvlink_bandwidth is None else parse_link_bandwidth(nvlink_bandwidth,
                                                                                       "nvlink_bandwidth")
    nvlink_lat = parse_link_latency(nvlink_latency, "nvlink_latency")
    g = nx.DiGraph()
    racks = _nvlink_racks(nvlink_racks, gps)
    gpus = _add_server(g, 0, gps, nvlink_bw, nvlink_lat, racks)
    params = {"fabric": "single_node", "gpu": spec.name, "servers": 1, "gpus_per_server": gps,
              "nvlink_bandwidth": nvlink_bw, "nvlink_latency": nvlink_lat, "nvlink_racks": racks}
    return validate_cluster(Cluster(graph=g, gpu=spec, gpus=tuple(gpus), gpus_per_server=gps,
                                    name=f"1x {spec.name} server ({gps} GPUs), single_node", params=params))


def leaf_spine(gpu: str | GPUSpec, servers: int, gpus_per_server: int = 8, servers_per_leaf: int = 16,
               spines: int | None = None, nic_bandwidth: float | str | None = None,
               nvlink_bandwidth: float | str | None = None, oversubscription: float = 1.0,
               pcie_bandwidth: float | str | None = None,
               nvlink_latency: float | str = DEFAULT_NVLINK_LATENCY,
               nic_latency: float | str = DEFAULT_NIC_LATENCY,
               switch_latency: float | str = DEFAULT_SWITCH_LATENCY, nvlink_racks: int = 1) -> Cluster:
    """Two-tier leaf-spine (folded Clos): all NICs of a server on one leaf.

    Server ``s`` hangs off leaf ``("leaf", s // servers_per_leaf)``; there are
    ``ceil(servers / servers_per_leaf)`` leaves. With one leaf there is no
    spine. Otherwise every leaf connects to every spine ``("spine", j)`` by
    one aggregated link per direction of bandwidth
    ``servers_per_leaf * gpus_per_server * nic_bandwidth / (spines * oversubscription)``,
    so a full leaf's downlink : uplink bandwidth is exactly
    ``oversubscription`` (a partially filled last leaf keeps the same uplinks,
    as its switch ports would). GPUs on different leaves have ``spines``
    equal-cost paths.

    Parameters
    ----------
    gpu : str or GPUSpec
        GPU model name or alias.
    servers : int
        Number of servers (NVLink domains); ``servers * gpus_per_server`` is
        at most :data:`MAX_GPUS` (262,144), checked before anything is built.
    gpus_per_server : int
        GPUs (and NICs) per server.
    servers_per_leaf : int
        Servers per leaf switch.
    spines : int, optional
        Spine switches. Default: ``servers_per_leaf``, so at 1:1 each
        leaf-spine link carries one server's worth (``gpus_per_server``
        NIC ports) of bandwidth.
    nic_bandwidth, nvlink_bandwidth : float or str, optional
        Per GPU, per direction; default: the GPU spec's.
    oversubscription : float
        Leaf downlink : uplink bandwidth, >= 1 (any real number, numpy's too).
    pcie_bandwidth : float or str, optional
        GPU <-> NIC per direction. Default: PCIe Gen5 x16 (64 GB/s; Gen4 x16,
        32 GB/s, for A100), never below the NIC rate.
    nvlink_latency, nic_latency, switch_latency : float or str
        Seconds per hop; see the module docstring.
    nvlink_racks : int
        Racks one NVLink domain spans (1; 2 for GB200 NVL36x2): each rack's
        GPUs hang off its own NVSwitch, the racks' switches are joined
        non-blocking (:func:`_add_server`).

    Returns
    -------
    Cluster
        ``params`` holds the resolved inputs (SI units) plus ``leaves``,
        ``spines`` (0 with one leaf) and ``uplink_bandwidth`` (bytes/s per
        leaf-spine link per direction; 0 without spines).

    Examples
    --------
    >>> c = leaf_spine("H100", servers=32, servers_per_leaf=16, spines=4)
    >>> c.params["leaves"], c.params["spines"], c.num_gpus
    (2, 4, 256)
    """
    p = _ScaleOut("leaf_spine", gpu, servers, gpus_per_server, servers_per_leaf, spines, nic_bandwidth,
                  nvlink_bandwidth, oversubscription, pcie_bandwidth, nvlink_latency, nic_latency, switch_latency,
                  nvlink_racks)
    g, gpus, nics = p.servers_and_nics()
    n_leaves = p.leaves
    leaves = _add_switches(g, "leaf", n_leaves)
    for s, server_nics in enumerate(nics):
        for nic in server_nics:
            p.attach(g, nic, leaves[s // p.servers_per_leaf])
    n_spines, uplink = 0, 0.0
    if n_leaves > 1:
        n_spines = p.spines
        downlink = p.servers_per_leaf * p.gpus_per_server * p.nic_bandwidth
        uplink = _uplink_rate(downlink / (n_spines * p.oversubscription), "oversubscription", p.oversubscription)
        for spine in _add_switches(g, "spine", n_spines):
            for leaf in leaves:
                _link(g, leaf, spine, uplink, p.switch_latency, "ib", "spine")
    return p.cluster(g, gpus, p.params(leaves=n_leaves, spines=n_spines, uplink_bandwidth=uplink))


def rail_pod(servers: int, servers_per_leaf: int) -> int:
    """Servers in a rail-optimized pod as :func:`rail_optimized` sizes it: ``servers_per_leaf``, or all the
    servers when there are fewer (one partial pod is sized for what it holds)."""
    return min(servers_per_leaf, servers)


def rail_optimized(gpu: str | GPUSpec, servers: int, gpus_per_server: int = 8, servers_per_leaf: int = 16,
                   spines: int | None = None, nic_bandwidth: float | str | None = None,
                   nvlink_bandwidth: float | str | None = None, oversubscription: float = 1.0,
                   pcie_bandwidth: float | str | None = None,
                   nvlink_latency: float | str = DEFAULT_NVLINK_LATENCY,
                   nic_latency: float | str = DEFAULT_NIC_LATENCY,
                   switch_latency: float | str = DEFAULT_SWITCH_LATENCY, nvlink_racks: int = 1) -> Cluster:
    """Rail-optimized two-tier fabric (as in DGX SuperPOD): one leaf per rail per pod.

    Servers are grouped into pods of ``servers_per_leaf`` servers (the last
    pod may be partial). Each pod ``p`` has one leaf per rail (local GPU
    index) ``i``, labelled ``("leaf", p * gpus_per_server + i)``; NIC ``i`` of
    every server in the pod attaches to it, so same-rail GPUs in a pod are
    ``gpu -> nic -> leaf -> nic -> gpu`` (4 edges, one switch). Every leaf
    connects to every spine with one aggregated link per direction of
    ``pod * nic_bandwidth / (spines * oversubscription)``, ``pod`` being
    ``servers_per_leaf``, or the number of servers when there are fewer (one
    partial pod is sized for what it holds; a partial last pod among full ones
    keeps a full pod's uplinks, as a partial last leaf of :func:`leaf_spine`
    does). There are always spines (cross-rail traffic between servers needs
    them).

    Parameters
    ----------
    gpu, servers, gpus_per_server, nic_bandwidth, nvlink_bandwidth, oversubscription, pcie_bandwidth,
    nvlink_latency, nic_latency, switch_latency, nvlink_racks
        As in :func:`leaf_spine`.
    servers_per_leaf : int
        Servers per pod (= NIC ports per rail leaf).
    spines : int, optional
        Default: ``floor(pod / oversubscription)`` (``pod``: ``servers_per_leaf``,
        or the servers when fewer; at least 1), so each leaf-spine link carries
        at least one NIC port's bandwidth (exactly one where the ratio divides
        the pod).

    Returns
    -------
    Cluster
        ``params`` as for :func:`leaf_spine` plus ``pods``.

    Examples
    --------
    >>> c = rail_optimized("H100", servers=4, servers_per_leaf=2, spines=2)
    >>> c.params["pods"], c.params["leaves"]
    (2, 16)
    """
    p = _ScaleOut("rail_optimized", gpu, servers, gpus_per_server, servers_per_leaf, spines, nic_bandwidth,
                  nvlink_bandwidth, oversubscription, pcie_bandwidth, nvlink_latency, nic_latency, switch_latency,
                  nvlink_racks)
    g, gpus, nics = p.servers_and_nics()
    pods = math.ceil(p.servers / p.servers_per_leaf)
    leaves = _add_switches(g, "leaf", pods * p.gpus_per_server)
    for s, server_nics in enumerate(nics):
        pod = s // p.servers_per_leaf
        for rail, nic in enumerate(server_nics):
            p.attach(g, nic, leaves[pod * p.gpus_per_server + rail])
    # A pod holds at most the cluster's servers: a single partial pod (4 servers of 16) is sized, and gets its
    # default spines, for the servers it has, not for a full pod's ports it would never fill. The default spines
    # give each leaf-spine link at least one NIC port's bandwidth (exactly one where the ratio divides the pod),
    # so an oversubscribed pod has fewer spines, not more links each thinner than a port.
    pod_size = rail_pod(p.servers, p.servers_per_leaf)
    n_spines = default_spines(pod_size, p.oversubscription) if spines is None else p.spines
    uplink = _uplink_rate(pod_size * p.nic_bandwidth / (n_spines * p.oversubscription),
                          "oversubscription", p.oversubscription)
    for spine in _add_switches(g, "spine", n_spines):
        for leaf in leaves:
            _link(g, leaf, spine, uplink, p.switch_latency, "ib", "spine")
    return p.cluster(g, gpus, p.params(pods=pods, leaves=len(leaves), spines=n_spines, uplink_bandwidth=uplink))


def fat_tree(gpu: str | GPUSpec, servers: int, gpus_per_server: int = 8, servers_per_leaf: int = 16,
             leaves_per_pod: int = 8, spines: int | None = None, cores: int | None = None,
             nic_bandwidth: float | str | None = None, nvlink_bandwidth: float | str | None = None,
             oversubscription: float = 1.0, core_oversubscription: float = 1.0,
             pcie_bandwidth: float | str | None = None,
             nvlink_latency: float | str = DEFAULT_NVLINK_LATENCY,
             nic_latency: float | str = DEFAULT_NIC_LATENCY,
             switch_latency: float | str = DEFAULT_SWITCH_LATENCY, nvlink_racks: int = 1) -> Cluster:
    """Three-tier fat tree: leaf -> spine (per pod) -> core.

    Leaves are assigned servers as in :func:`leaf_spine` (leaf
    ``s // servers_per_leaf``) and grouped into pods of ``leaves_per_pod``
    leaves (leaf ``l`` is in pod ``l // leaves_per_pod``). Each pod has
    ``spines`` spines, ``("spine", pod * spines + j)``, each linked to every
    leaf of its pod with ``servers_per_leaf * gpus_per_server * nic_bandwidth
    / (spines * oversubscription)`` per direction. The ``cores`` core
    switches form ``spines`` planes: core ``k`` is in plane ``k % spines`` and
    links to spine ``j`` of every pod, so GPUs in different pods have
    ``spines * cores / spines = cores`` equal-cost paths. A spine's core
    uplinks total its leaf downlinks divided by ``core_oversubscription``.

    Tiers are only built where needed: one leaf has no spines; one pod has
    no cores.

    Parameters
    ----------
    gpu, servers, gpus_per_server, servers_per_leaf, nic_bandwidth, nvlink_bandwidth, pcie_bandwidth,
    nvlink_latency, nic_latency, switch_latency, nvlink_racks
        As in :func:`leaf_spine`.
    leaves_per_pod : int
        Leaves per pod.
    spines : int, optional
        Spines *per pod*; default ``servers_per_leaf``.
    cores : int, optional
        Core switches in total, a multiple of ``spines``; default ``spines``
        (one core per plane).
    oversubscription : float
        Leaf downlink : uplink, >= 1.
    core_oversubscription : float
        Spine downlink : uplink, >= 1.

    Returns
    -------
    Cluster
        ``params`` as for :func:`leaf_spine` (``spines`` per pod) plus
        ``pods``, ``leaves_per_pod``, ``cores``, ``core_oversubscription`` and
        ``core_uplink_bandwidth`` (bytes/s per spine-core link per direction).

    Examples
    --------
    >>> c = fat_tree("H100", servers=8, servers_per_leaf=2, leaves_per_pod=2, spines=2, cores=4)
    >>> c.params["pods"], c.params["cores"]
    (2, 4)
    """
    p = _ScaleOut("fat_tree", gpu, servers, gpus_per_server, servers_per_leaf, spines, nic_bandwidth,
                  nvlink_bandwidth, oversubscription, pcie_bandwidth, nvlink_latency, nic_latency, switch_latency,
                  nvlink_racks)
    lpp = _switch_count(leaves_per_pod, "leaves_per_pod")
    core_ratio = _oversubscription(core_oversubscription, "core_oversubscription")
    n_cores = p.spines if cores is None else _switch_count(cores, "cores")
    if n_cores % p.spines:
        raise TopologyError(f"cores: {n_cores} is not a multiple of spines ({p.spines}); each spine plane needs "
                            f"the same number of cores")
    g, gpus, nics = p.servers_and_nics()
    n_leaves = p.leaves
    pods = math.ceil(n_leaves / lpp)
    leaves = _add_switches(g, "leaf", n_leaves)
    for s, server_nics in enumerate(nics):
        for nic in server_nics:
            p.attach(g, nic, leaves[s // p.servers_per_leaf])
    n_spines, uplink, core_uplink = 0, 0.0, 0.0
    if n_leaves > 1:
        n_spines = p.spines
        uplink = _uplink_rate(p.servers_per_leaf * p.gpus_per_server * p.nic_bandwidth
                              / (n_spines * p.oversubscription), "oversubscription", p.oversubscription)
        pod_spines = []
        for pod in range(pods):
            spines_here = _add_switches(g, "spine", n_spines, start=pod * n_spines)
            pod_spines.append(spines_here)
            for spine in spines_here:
                for leaf in leaves[pod * lpp:(pod + 1) * lpp]:
                    _link(g, leaf, spine, uplink, p.switch_latency, "ib", "spine")
        if pods > 1:
            per_plane = n_cores // n_spines
            core_uplink = _uplink_rate(lpp * uplink / (per_plane * core_ratio), "core_oversubscription",
                                       core_ratio)
            for core in _add_switches(g, "core", n_cores):
                plane = core[1] % n_spines
                for spines_here in pod_spines:
                    _link(g, spines_here[plane], core, core_uplink, p.switch_latency, "ib", "core")
    params = p.params(leaves=n_leaves, pods=pods, leaves_per_pod=lpp, spines=n_spines,
                      cores=n_cores if pods > 1 else 0, uplink_bandwidth=uplink,
                      core_oversubscription=core_ratio, core_uplink_bandwidth=core_uplink)
    return p.cluster(g, gpus, params)
