"""Capacity planning: bill of materials, power and cost of a cluster's fabric, with its bisection bandwidth.

Everything is read from the graph (the :class:`~topologies.cluster.Cluster`
contract), so it works for any fabric a builder or a topology file
produces; builder parameters are never needed.

How the graph becomes parts
---------------------------
* **Port speed.** One switch port and one cable carry ``port_speed``
  (``plan.port_speed``, one of the speeds the switch family offers: 200, 400
  or 800 Gb/s; default ``auto``, the fabric's most common NIC link rate
  rounded up to one of them).
  A NIC link of bandwidth ``b`` takes ``ceil(b / port_speed)`` switch ports
  and cables. A leaf-spine or spine-core edge of the graph stands for *all*
  the cables between the two switches, so it takes
  ``ceil(aggregate bandwidth / port_speed)`` ports at each end and as many
  cables (rounded up per switch pair, as real ports are).
* **Switches.** Each leaf, spine and core node is one logical switch whose
  radix is the ports it uses. It becomes the smallest configuration of
  :data:`~topologies.components.SWITCH_MODELS` (of the family, at the port
  speed) with at least that many ports. A logical switch larger than every
  model (the builders' default 16-server leaf has 256 ports) is priced as a
  non-blocking two-tier Clos of the largest model, as director switches are
  built inside: ``ceil(P / (k/2))`` lower boxes, enough upper boxes for their
  ``k/2`` uplinks each, and those internal links counted as cables. Two tiers
  of ``k``-port boxes reach ``k²/2`` ports (2,048 of 64); a larger one (the
  spines of 65,536 GPUs) is a three-tier Clos, whose upper tier is ``k/2``
  such Clos switches of ``ceil(P / (k/2))`` ports each (``_clos``).
* **NICs**: one per ``nic`` node, the slowest NIC model at least as fast as
  its link to the fabric. **NVSwitch chips**: per ``nvswitch`` node, from the
  number of GPUs around it and its NVLink links to other NVSwitch nodes (rule
  in :mod:`topologies.components`), summed per NVLink domain (server).
* **Cables**: NIC-to-switch links are built as ``plan.nic_media``,
  switch-to-switch links as ``plan.switch_media``: ``optics`` is a
  transceiver at each end plus a fibre, ``aoc`` one active optical cable,
  ``dac`` one passive copper cable. NVLink and PCIe are on the boards and are
  not cabled here (nor are NVL72 NVLink spine cartridges, management or
  storage networks).
* **Power and cost**: count x the per-unit figures of
  :data:`~topologies.components.COMPONENTS` (documented there, overridable
  with ``plan.components``). The **fabric** is every part but the GPUs;
  GPUs are listed apart (``fabric`` False) so the fabric can be traded
  against step time on its own.

Results are cached per cluster and plan (keyed by the cluster's name,
parameters, rank order, node and edge counts and total link bandwidth), so
a sweep that builds the same cluster for every point computes the max-flow
and the parts once per worker process.
"""

from __future__ import annotations

import json
import math
import threading
from collections import Counter, OrderedDict
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from operator import itemgetter
from typing import TYPE_CHECKING

import numpy as np

from topologies.bisection import SWITCH_LEVELS, bisection_bandwidth, default_half, oversubscription_by_tier
from topologies.cluster import Cluster, check_cluster
from topologies.components import (
    NIC_MODELS,
    NVSWITCH_GENERATIONS,
    SWITCH_MODELS,
    PlanOptions,
    SwitchModel,
    nvswitch_chips,
    plan_options,
)

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["BOM_COLUMNS", "CapacityPlan", "capacity_plan", "bill_of_materials", "plan_summary", "plan_columns",
           "PLAN_COLUMNS"]

_G = 1e9 / 8  # one Gb/s in bytes/s
_EPS = 1e-9
BOM_COLUMNS = ("item", "tier", "component", "spec", "count", "ports_used", "unit_power_w", "unit_cost_usd",
               "power_w", "cost_usd", "fabric", "source")
"""Columns of :func:`bill_of_materials`."""
PLAN_COLUMNS = ("fabric_cost_usd", "fabric_power_kw", "bisection_bytes_s")
"""What :func:`plan_columns` adds to a run's summary and to every sweep row."""


@dataclass(frozen=True)
class CapacityPlan:
    """A cluster's bill of materials (:data:`BOM_COLUMNS`) and headline numbers (see :func:`plan_summary`)."""

    rows: tuple[dict, ...] = field(repr=False)
    """The bill of materials, one dict per part (:data:`BOM_COLUMNS`)."""
    summary: dict

    def __post_init__(self) -> None:
        if not isinstance(self.rows, tuple):  # a frame (what this field held before 2026-12-02) or a list
            rows = self.rows.to_dict("records") if hasattr(self.rows, "to_dict") else list(self.rows)
            object.__setattr__(self, "rows", tuple(rows))

    @cached_property
    def bom(self) -> pd.DataFrame:
        """The bill of materials as a frame, built when first read (a run's :func:`plan_columns` needs only
        the summary, and pandas costs ~0.6 s to import)."""
        import pandas as pd

        return pd.DataFrame(list(self.rows), columns=list(BOM_COLUMNS))


def _units(bandwidth: float, port_Bps: float) -> int:
    """Ports (and cables) a link of ``bandwidth`` takes: at least one, rounded up."""
    return max(1, math.ceil(bandwidth / port_Bps - _EPS))


class _Adjacency:
    """A graph's node kinds and successor maps as plain dicts, read once: the passes below touch every
    node and edge, and networkx's views cost a few microseconds a lookup (10^6 edges at 131,072 GPUs)."""

    def __init__(self, g) -> None:
        self.kind = dict(g.nodes(data="kind"))
        self.succ = dict(g.adjacency())


def _family(g: _Adjacency, opts: PlanOptions) -> str:
    if opts.family != "auto":
        return opts.family
    kinds = Counter(d["kind"] for s, k in g.kind.items() if k in SWITCH_LEVELS for d in g.succ[s].values())
    return "ethernet" if kinds.get("eth", 0) > kinds.get("ib", 0) else "infiniband"


def _host_links(g: _Adjacency) -> Counter:
    """Bandwidth (bytes/s) of every host-to-switch link and NIC-to-NIC cable -> how many there are."""
    kind = g.kind
    links = Counter(d["bandwidth"] for s, k in kind.items() if k in SWITCH_LEVELS
                    for n, d in g.succ[s].items() if kind[n] not in SWITCH_LEVELS)
    links.update(_link_bandwidth(g, u, v) for u, v in _nic_cables(g))
    return links


def _nic_cables(g: _Adjacency) -> list[tuple[Hashable, Hashable]]:
    """The NIC pairs cabled to each other without a switch (servers back to back; a custom fabric's direct
    cable), one ``(u, v)`` per pair."""
    kind = g.kind
    nics = {n: i for i, n in enumerate(n for n, k in kind.items() if k == "nic")}
    return [(u, v) for u, i in nics.items() for v in g.succ[u] if v in nics and (nics[v] > i or u not in g.succ[v])]


def _port_speed(g: _Adjacency, family: str, opts: PlanOptions) -> int:
    """Gb/s of one port: the requested (or most common NIC link) rate rounded up to one the family offers."""
    links = _host_links(g)
    wanted = opts.port_speed_Bps or (links.most_common(1)[0][0] if links else 400 * _G)
    speeds = sorted({m.port_Gbps for m in SWITCH_MODELS if m.family == family})
    return next((s for s in speeds if s * _G >= wanted * (1 - _EPS)), speeds[-1])


_TIERS = {2: "two-", 3: "three-"}


def _model(ports: int, family: str, speed: int) -> tuple[SwitchModel, int, int, int]:
    """``(model, boxes, internal cables, levels)`` of a logical switch of ``ports`` ports (see the module
    docstring); ``levels`` is 1 for one box."""
    fits = sorted((m for m in SWITCH_MODELS if m.family == family and m.port_Gbps == speed), key=lambda m: m.ports)
    for m in fits:
        if m.ports >= ports:
            return m, 1, 0, 1
    big = fits[-1]
    return (big, *_clos(ports, big.ports))


def _clos(ports: int, k: int) -> tuple[int, int, int]:
    """``(boxes, internal cables, levels)`` of a non-blocking folded Clos of ``ports`` ports from ``k``-port
    boxes: ``L = ceil(ports / (k/2))`` lower boxes, each with ``k/2`` ports down and one up to each of ``k/2``
    spines of ``L`` ports. A spine of at most ``k`` ports is (a share of) one box, so two levels reach
    ``k²/2`` ports; a larger spine is itself such a Clos (three levels reach ``k³/4``, the fat tree)."""
    if ports <= k:
        return 1, 0, 1
    if k < 4:  # (two ports up and down at least, or the lower tier never shrinks)
        raise ValueError(f"a Clos of {ports} ports needs boxes of at least 4 ports, got {k}")
    half = k // 2
    lower = math.ceil(ports / half)
    if lower <= k:
        return lower + math.ceil(lower * half / k), lower * half, 2
    boxes, cables, levels = _clos(lower, k)
    return lower + half * boxes, lower * half + half * cables, levels + 1


def _link_bandwidth(g: _Adjacency, u: Hashable, v: Hashable) -> float:
    there = g.succ[u].get(v)
    back = g.succ[v].get(u)
    return max(there["bandwidth"] if there else 0.0, back["bandwidth"] if back else 0.0)


def _tier(g: _Adjacency, u: Hashable, v: Hashable) -> str:
    d = g.succ[u].get(v) or g.succ[v][u]
    return d["tier"]


def _nic_model(g: _Adjacency, nic: Hashable, fallback_Bps: float) -> tuple[tuple[str, int], int, float]:
    """``((component, Gb/s), count, rate)``: the NIC model with the rate of ``nic``'s fastest cable (to a switch
    or another NIC; ``fallback_Bps``, the GPU's NIC rate, when it has none; ``rate`` that rate in Gb/s), one of
    it; a rate no model reaches takes as many of the fastest as carry it (a 1.6 Tb/s NIC: two 800 Gb/s cards, as
    its switch ports and cables are counted; a 1 Tb/s one two as well, a whole card for the last 200 Gb/s)."""
    rates = [d["bandwidth"] for n, d in g.succ[nic].items() if g.kind[n] in SWITCH_LEVELS or g.kind[n] == "nic"]
    gbps = (max(rates) if rates else fallback_Bps) / _G
    model = next(((name, s) for s, name in NIC_MODELS if s >= gbps * (1 - _EPS)), None)
    if model is not None:
        return model, 1, gbps
    fastest, name = NIC_MODELS[-1]
    return (name, fastest), math.ceil(gbps / fastest - _EPS), gbps


def _nvswitch(g: _Adjacency, n: Hashable, pred, arch: str) -> tuple[str, int, int]:
    """``(component, chips, GPUs)`` of the NVSwitch node ``n``: its chips end the NVLink links of the GPUs
    around it and its links to other NVSwitch nodes (the racks of one NVL36x2 domain), counted in NVLink
    links of a GPU's rate (a GPU's link to it over the generation's links per GPU)."""
    gpu_links = []
    to_switches = 0.0
    for m in set(g.succ[n]) | set(pred[n]):
        if g.kind[m] == "gpu":
            gpu_links.append(_link_bandwidth(g, n, m))
        elif g.kind[m] == "nvswitch":
            to_switches += _link_bandwidth(g, n, m)
    links = 0
    if to_switches and gpu_links:
        per_link = max(gpu_links) / NVSWITCH_GENERATIONS.get(arch, NVSWITCH_GENERATIONS["sm90"]).links_per_gpu
        links = math.ceil(to_switches / per_link - _EPS)
    return (*nvswitch_chips(len(gpu_links), arch, links), len(gpu_links))


def _row(item: str, tier: str, component: str, spec: str, count: int, opts: PlanOptions, *,
         ports_used: float = math.nan, fabric: bool = True) -> dict:
    part = opts.components.get(component)
    power = part.power_w if part else math.nan
    cost = part.cost_usd if part else math.nan
    source = (f"power: {part.power_source}; cost: {part.cost_source}" if part else
              "not in the component table: no power or cost")
    return {"item": item, "tier": tier, "component": component, "spec": spec, "count": int(count),
            "ports_used": ports_used, "unit_power_w": power, "unit_cost_usd": cost, "power_w": power * count,
            "cost_usd": cost * count, "fabric": fabric, "source": source}


def _cable_rows(cables: Counter, speed: int, opts: PlanOptions) -> list[dict]:
    rows = []
    for (tier, media), n in sorted(cables.items()):
        if media == "optics":
            rows.append(_row("transceiver", tier, f"transceiver-{speed}G", f"{speed}G, one per cable end",
                             2 * n, opts))
            rows.append(_row("fiber", tier, "fiber", f"{speed}G optical cable", n, opts))
        else:
            rows.append(_row(f"{media} cable", tier, f"{media}-{speed}G", f"{speed}G", n, opts))
    return rows


def _bom(cluster: Cluster, opts: PlanOptions) -> tuple[list[dict], dict]:
    """The bill of materials' rows (:data:`BOM_COLUMNS`) and the port speed and switch family chosen."""
    graph = cluster.graph
    g = _Adjacency(graph)
    family = _family(g, opts)
    speed = _port_speed(g, family, opts)
    port = speed * _G
    order = {n: i for i, n in enumerate(graph)}
    switches: dict[tuple, list[int]] = {}  # (tier, model, built as a Clos) -> [boxes, ports used]
    cables: Counter = Counter()  # (tier, media) -> cables
    pred = graph.pred
    for s, kind in g.kind.items():
        if kind not in SWITCH_LEVELS:
            continue
        ports = 0
        for n in set(g.succ[s]) | set(pred[s]):
            k = _units(_link_bandwidth(g, s, n), port)
            ports += k
            if g.kind[n] not in SWITCH_LEVELS:
                cables[_tier(g, s, n), opts.nic_media] += k
            elif order[s] < order[n]:
                cables[_tier(g, s, n), opts.switch_media] += k
        model, boxes, internal, levels = _model(ports, family, speed)
        entry = switches.setdefault((kind, model, levels), [0, 0])
        entry[0] += boxes
        entry[1] += ports
        if internal:
            cables[kind, opts.switch_media] += internal
    for u, v in _nic_cables(g):
        cables[_tier(g, u, v), opts.nic_media] += _units(_link_bandwidth(g, u, v), port)
    rows = []
    for (kind, model, levels), (boxes, ports) in sorted(switches.items(),
                                                         key=lambda kv: (SWITCH_LEVELS[kv[0][0]], kv[0][2])):
        spec = model.spec + ("" if levels == 1 else f", in {_TIERS.get(levels, f'{levels}-')}tier Clos")
        rows.append(_row(f"{kind} switch", kind, model.component, spec, boxes, opts, ports_used=ports))
    nics: Counter = Counter()
    domains: dict[Hashable, list] = {}  # NVLink domain (server) -> [component, chips, GPUs]
    for n, kind in g.kind.items():
        if kind == "nic":
            model, count, gbps = _nic_model(g, n, cluster.gpu.nic_bandwidth)
            # (a rate no model reaches says so: "800G, 2 per 1000G NIC" was "800G" beside twice the NICs)
            nics[model, f", {count} per {gbps:g}G NIC" if count > 1 else ""] += count
        elif kind == "nvswitch":
            name, per, gpus = _nvswitch(g, n, pred, cluster.gpu.arch)
            domain = domains.setdefault(graph.nodes[n].get("server", n), [name, 0, 0])
            domain[1] += per
            domain[2] += gpus
    chips = Counter(tuple(d) for d in domains.values())  # (component, chips, GPUs) per domain -> domains
    rows += [_row("NIC", "nic", name, f"{gbps}G{cards}", n, opts) for ((name, gbps), cards), n in sorted(nics.items())]
    rows += [_row("NVSwitch chip", "nvlink", name, f"{per} per NVLink domain" + (
        f" ({math.ceil(per / 2)} trays)" if gpus > 8 else ""), per * count, opts)
             for (name, per, gpus), count in sorted(chips.items()) if per]
    rows += _cable_rows(cables, speed, opts)
    rows.append(_row("GPU", "gpu", cluster.gpu.name, f"{cluster.gpus_per_server} per NVLink domain",
                     cluster.num_gpus, opts, fabric=False))
    return rows, {"port_speed_Gbps": speed, "switch_family": family}


def _column_sum(rows: list[dict], column: str, keep: np.ndarray) -> float:
    """``frame[keep][column].sum()`` of the frame of ``rows``, as pandas adds: the column's dtype as pandas
    infers it of every row (numpy infers the same of ints and floats), NaNs as 0 (skipna), then numpy's sum
    of the kept values in order."""
    values = np.array([r[column] for r in rows])[keep]
    if values.dtype.kind == "f":
        values = np.where(np.isnan(values), 0.0, values)
    return values.sum()


def _count(rows: list[dict], items: tuple[str, ...]) -> int:
    return sum(r["count"] for r in rows if r["item"] in items)


def _summary(cluster: Cluster, rows: list[dict], extra: dict) -> dict:
    """Headline numbers of a bill of materials (:func:`plan_summary`), of its rows: no frame is built."""
    in_fabric = np.array([bool(r["fabric"]) for r in rows], dtype=bool)
    fabric = [r for r in rows if r["fabric"]]
    n = cluster.num_gpus
    bisection = bisection_bandwidth(cluster)
    half = len(default_half(cluster))
    per_tier: dict[str, int] = {}  # in order of first appearance, as groupby(sort=False)
    for r in fabric:
        if r["item"].endswith(" switch"):
            per_tier[r["tier"]] = per_tier.get(r["tier"], 0) + r["count"]
    cost = float(_column_sum(rows, "cost_usd", in_fabric))
    return {
        "gpus": n,
        **extra,
        "switches": int(sum(per_tier.values())),
        "switches_by_tier": {k: int(v) for k, v in per_tier.items()},
        "nics": _count(fabric, ("NIC",)),
        "nvswitch_chips": _count(fabric, ("NVSwitch chip",)),
        "cables": _count(fabric, ("fiber", "aoc cable", "dac cable")),
        "transceivers": _count(fabric, ("transceiver",)),
        "fabric_power_kw": float(_column_sum(rows, "power_w", in_fabric)) / 1e3,
        "fabric_cost_usd": cost,
        "fabric_cost_per_gpu_usd": cost / n if n else math.nan,
        "gpu_power_kw": float(_column_sum(rows, "power_w", ~in_fabric)) / 1e3,
        "gpu_cost_usd": float(_column_sum(rows, "cost_usd", ~in_fabric)),
        "bisection_bytes_s": bisection,
        # per GPU of the two halves (2x the smaller: n when they are equal, as for an even number of servers;
        # with an odd number the halves differ by a server and n would read as oversubscription)
        "bisection_per_gpu_bytes_s": bisection / (2 * min(half, n - half)) if 0 < half < n else math.nan,
        "oversubscription": _oversubscription(cluster),
    }


def _oversubscription(cluster: Cluster) -> dict[str, float]:
    """:func:`~topologies.bisection.oversubscription_by_tier`, and for a switch tier with hosts below it, no
    uplinks and links to switches of its own tier (a topology file's racks cabled ToR to ToR with no spine,
    ``examples/fabrics/two-racks.yaml``) the tier's host-facing : switch-to-switch bandwidth: what the hosts of a
    switch can send out of it. Links within a tier count as neither down- nor uplinks there, so such a fabric
    read as having no oversubscription ("one switch tier") however thin the cables between its switches."""
    out = oversubscription_by_tier(cluster, worst=True)  # (a full leaf's: a partial last one's spare uplinks
    g = cluster.graph                                     # would read as a lower ratio than the one built)
    down: dict[str, float] = {}
    side: dict[str, float] = {}
    for s, kind in g.nodes(data="kind"):
        if kind not in SWITCH_LEVELS or kind in out:
            continue
        for n, d in g.succ[s].items():
            other = g.nodes[n]["kind"]
            if other not in SWITCH_LEVELS:
                down[kind] = down.get(kind, 0.0) + d["bandwidth"]
            elif other == kind:
                side[kind] = side.get(kind, 0.0) + d["bandwidth"]
    for tier in SWITCH_LEVELS:
        if down.get(tier) and side.get(tier):
            out[tier] = down[tier] / side[tier]
    return {tier: out[tier] for tier in SWITCH_LEVELS if tier in out}


_CACHE: OrderedDict[tuple, CapacityPlan] = OrderedDict()
_CACHE_SIZE = 32
_CACHE_LOCK = threading.Lock()  # Dask workers run points in threads


def _fingerprint(cluster: Cluster) -> tuple:
    """What identifies a cluster for the cache: its name, parameters and GPU, and every node (with its kind)
    and edge (with its rate, kind and tier) — the wiring itself, not counts and totals: two fabrics of one name and one
    size wired differently (a custom file edited in a notebook session, a NIC moved between racks) differ in
    bisection and parts. Faults change the edge set or bandwidths, so they change the key too."""
    g = cluster.graph
    # What the plan reads of a link: its rate (ports), kind (switch family) and tier; per node its id, its
    # successors and their links' attributes, flat, from the adjacency dicts (~1-2 us per edge).
    try:
        link = itemgetter("bandwidth", "kind", "tier")
        wiring = hash(tuple((u, *out, *map(link, out.values())) for u, out in g.adjacency()))
    except KeyError:  # (a hand-built graph whose links lack kind: contract 2 requires only rate and tier)
        wiring = hash(tuple((u, *out, *((d["bandwidth"], d.get("kind"), d.get("tier")) for d in out.values()))
                            for u, out in g.adjacency()))
    return (cluster.name, json.dumps(cluster.params, sort_keys=True, default=str), cluster.gpu.name,
            cluster.gpu.arch, hash(cluster.gpus), g.number_of_nodes(), g.number_of_edges(),
            hash(tuple(g.nodes(data="kind"))), wiring)


def capacity_plan(cluster: Cluster, plan: Mapping[str, object] | PlanOptions | None = None) -> CapacityPlan:
    """The bill of materials and summary of ``cluster`` under ``plan`` (a ``plan:`` section, cached).

    Parameters
    ----------
    cluster : Cluster
    plan : Mapping or PlanOptions, optional
        The ``plan:`` section (:func:`topologies.components.plan_options`):
        port speed, cable media, switch family, component overrides.

    Returns
    -------
    CapacityPlan
        Do not modify its frame: it is shared by the cache (the public
        helpers below return copies).
    """
    check_cluster(cluster)
    opts = plan_options(plan)
    key = (_fingerprint(cluster), opts.key())
    with _CACHE_LOCK:
        hit = _CACHE.get(key)
        if hit is not None:
            _CACHE.move_to_end(key)
            return hit
    rows, extra = _bom(cluster, opts)
    result = CapacityPlan(tuple(rows), _summary(cluster, rows, extra))
    with _CACHE_LOCK:
        _CACHE[key] = result
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return result


def bill_of_materials(cluster: Cluster, plan: Mapping[str, object] | PlanOptions | None = None) -> pd.DataFrame:
    """Parts list of ``cluster``: switches by tier and radix, NICs, NVSwitch chips, optics and cables, GPUs.

    Parameters
    ----------
    cluster : Cluster
    plan : Mapping or PlanOptions, optional
        ``plan:`` section: ``port_speed``, ``nic_media``, ``switch_media``,
        ``family``, ``components`` (see :mod:`topologies.components`).

    Returns
    -------
    pandas.DataFrame
        One row per part and tier, columns :data:`BOM_COLUMNS`: ``item``,
        ``tier``, ``component`` (a name of
        :data:`~topologies.components.COMPONENTS`), ``spec`` (radix x port
        speed for switches), ``count``, ``ports_used`` (switch rows: ports in
        use over the tier), per-unit and total ``power_w`` (W) and
        ``cost_usd`` (USD), ``fabric`` (False for the GPU row) and ``source``
        of the unit figures.

    Examples
    --------
    >>> from topologies import leaf_spine
    >>> bom = bill_of_materials(leaf_spine("H100", servers=4, servers_per_leaf=2, spines=2))
    >>> bom.set_index(["item", "tier"])["count"].to_dict()  # doctest: +NORMALIZE_WHITESPACE
    {('leaf switch', 'leaf'): 2, ('spine switch', 'spine'): 2, ('NIC', 'nic'): 32,
     ('NVSwitch chip', 'nvlink'): 16, ('transceiver', 'leaf'): 64, ('fiber', 'leaf'): 32,
     ('transceiver', 'spine'): 64, ('fiber', 'spine'): 32, ('GPU', 'gpu'): 32}
    """
    return capacity_plan(cluster, plan).bom.copy()


def plan_summary(cluster: Cluster, plan: Mapping[str, object] | PlanOptions | None = None) -> dict:
    """Headline numbers of the plan.

    Returns
    -------
    dict
        ``gpus``; ``port_speed_Gbps`` and ``switch_family`` chosen;
        ``switches`` (boxes) and ``switches_by_tier``; ``nics``,
        ``nvswitch_chips``, ``cables``, ``transceivers``; ``fabric_power_kw``,
        ``fabric_cost_usd`` and ``fabric_cost_per_gpu_usd`` (every part but
        the GPUs); ``gpu_power_kw``, ``gpu_cost_usd`` (NaN for a GPU the table
        lacks); ``bisection_bytes_s`` (:func:`topologies.bisection.bisection_bandwidth`,
        one direction) and ``bisection_per_gpu_bytes_s``; ``oversubscription``
        (``{tier: downlink:uplink}``; for an edge tier with no uplinks whose
        switches are cabled to one another, host-facing : switch-to-switch).
    """
    out = dict(capacity_plan(cluster, plan).summary)
    out["switches_by_tier"] = dict(out["switches_by_tier"])
    out["oversubscription"] = dict(out["oversubscription"])
    return out


def plan_columns(cluster: Cluster, plan: Mapping[str, object] | PlanOptions | None = None) -> dict[str, float]:
    """``fabric_cost_usd`` (USD), ``fabric_power_kw`` (kW), ``bisection_bytes_s`` (bytes/s): a run's and a sweep
    row's capacity columns (:data:`PLAN_COLUMNS`), cached per cluster."""
    summary = capacity_plan(cluster, plan).summary
    return {k: summary[k] for k in PLAN_COLUMNS}
