"""The cluster as the engine sees it: link arrays, routes, a network backend.

:class:`Fabric` maps ranks to GPUs, plans collectives (resolving ``auto``),
turns each planned transfer into a set of physical links and hands it to the
network backend. It is the only place where logical ranks meet physical
routes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from itertools import chain, islice, repeat
from numbers import Integral, Real

import numpy as np
import simpy
from simpy.events import Event

from topologies.cluster import Cluster
from topologies.units import LINK_LATENCY_MAX

from .bulk_alltoall import bulk_flows, under_one_switch
from .collectives import AUTO_CANDIDATES, COLLECTIVE_ALGORITHMS, CollectiveError, Plan, Transfer, plan_collective
from .compute import MIN_EFFICIENCY, is_fraction
from .nccl import (
    ALL_TO_ALL_NET_EFFICIENCY,
    BANDWIDTH_FACTOR,
    NIC_EFFICIENCY,
    PROTOCOLS,
    bandwidth_factor,
    collective_channels,
    p2p_protocol,
    ring_plateau,
    step_latencies,
    tree_correction,
)
from .network import AnalyticNetwork, FlowNetwork
from .routing import Router

NETWORK_MODELS = ("flow", "analytic")
ROUTINGS = ("ecmp", "spray")
ALL_TO_ALL_FLOWS = ("auto", "grouped", "proportional", "per_pair", "bulk")
REPLICA_SENDS = ("merged", "each")
CHANNEL_COUNTS = ("nccl", "every_rail")


TIER_NAMES = ("nvlink", "pcie", "leaf", "spine", "core")
_BULK_HOPS = 32  # at least this many new hops are routed together (Fabric._route_hops)
_LANES_MIN = 8  # replicated collectives over at least this many groups are planned once and relabelled
_LANE_RANKS = 64  # ... when their groups have at most this many ranks (Fabric._lane_phases)
MAX_ALL_TO_ALL_RANKS = 8192  # one all_to_all over more ranks is refused: n(n-1) transfers (67 M here: ~35 s, ~3 GB)
BULK_ALL_TO_ALL_RANKS = 256  # all_to_all "auto": uniform all-to-alls over at least this many ranks run in bulk
_IDENTITY_ENTRIES = 4096  # collectives remembered by identity of their groups and matrix (Fabric._by_identity)
_UNSET = object()  # (a cached plan may be None: several phases per replica)
_SHAPE_HOPS = 128  # plans with at most this many hops have their estimates cached per shape (Fabric._plan_shape;
# a TP-8 tree on one server is 112: 8 channels of 14)
_SKELETONS = 100_000  # small plans' routes kept per hops and labels (Fabric._skeleton; then forgotten at once)


@dataclass(frozen=True)
class NetworkConfig:
    """Knobs of the communication model.

    Attributes
    ----------
    model : str
        ``"flow"`` (max-min fair sharing, default) or ``"analytic"`` (no contention).
    step_latency_s : float or None
        ``None`` (default): NCCL's own latency model (:mod:`simulator.nccl`) —
        a base latency per collective plus a latency per algorithm step that
        depends on the protocol (LL, LL128, Simple, chosen per collective as
        NCCL's tuner does) and on whether the step crosses NVLink or the
        network. A number: the older uniform model, that many seconds of
        software latency per algorithm step, Simple protocol only (the α of
        the α-β closed forms). Link latencies of the route are added per step
        either way.
    fidelity : str
        ``"fast"``: one pipelined transfer per ring; ``"full"``: every ring step.
    seed : int
        ECMP hash seed.
    routing : str
        How a flow uses equal-cost paths. ``"ecmp"`` (default): each flow
        takes one path, picked by a deterministic hash of its endpoints and
        connection label, so two flows may collide on one uplink while another
        idles, as on a switch hashing 5-tuples. ``"spray"``: idealised packet
        spraying / adaptive routing: every flow is split evenly over all its
        equal-cost paths (each path carries 1/k of its bytes at 1/k of its
        rate), so no hash collision ever happens; the gap between the two is
        what hashing costs.
    all_to_all : str
        How many flows an all-to-all is. ``"auto"`` (default): ``"bulk"`` for
        a uniform all-to-all over ``BULK_ALL_TO_ALL_RANKS`` (256) ranks or
        more and for an alltoallv whose ranks' NICs hang off one switch,
        or, under ``pxn``, over one pod of a rail-optimized fabric (no
        switch-to-switch link carries it: exact there), ``"grouped"`` otherwise. ``"grouped"``: the
        transfers of one all-to-all that start at the same instant and move
        the same bytes (a *wave* of NCCL's send/recv: the transfers inside
        the servers, or one round of remote peers, :func:`~simulator.collectives.remote_rounds`),
        and the same transfer of every replica a representative stands for,
        run as one flow over all their links: a uniform all-to-all over ``n``
        GPUs on ``s`` servers is ``n - n/s + 1`` flows (25 at 32 GPUs) instead
        of ``n(n-1)``. Exact where the members see symmetric contention;
        otherwise every member runs at the rate of the most constrained
        (measured: within 0.7% of ``per_pair``, docs/DESIGN.md).
        ``"proportional"``: waves of an alltoallv share one flow even when
        sizes differ, each member at a rate in proportion to its bytes so
        that all finish together (measured: 0 on one leaf, within 1.3% with
        two servers per leaf, up to 20% with strong skew across
        oversubscribed uplinks). ``"per_pair"``: one flow per GPU pair (the reference).
        ``"bulk"``: an all-to-all as at most four flows planned with numpy
        (:mod:`simulator.bulk_alltoall`): per class (NVLink, network) one
        flow for every transfer but each member's last, from the first
        latency, and one for the last transfers, from the latest; bytes per
        link and GPU pair exact. Uniform: measured within 2.7% of
        ``grouped`` at 64–512 GPUs, 64 KiB – 1 GiB, at most +5.1% against
        ``per_pair`` (docs/DESIGN.md); 1 GiB over 4,096 GPUs in seconds.
        Alltoallv (opt-in only): members of a flow finish together, which
        is optimistic — measured −0.1% to −20% against ``per_pair`` on
        32 GPUs (the most with strong skew on an oversubscribed fabric),
        −0.11% on a DeepSeek-style step at 100× the speed. Needs ECMP
        routing (under spray: grouped).
    replica_sends : str
        How the sends of a representative rank (``fidelity: fast`` or
        ``lockstep``) run: a representative's send stands for one send per
        replica (its TP members; in ``lockstep`` its DP × TP block), all
        started at the same instant, and the representative goes on when the
        last has arrived. ``"merged"`` (default, flow model only): those of
        equal wire bytes and latency (every pair across servers, say) run as
        one flow over all their routes (a link crossed by ``j`` of them
        carries ``j`` times its rate), at the pace of the most constrained: equal to ``"each"``
        where the replicas see the same contention (a symmetric fabric);
        where they do not, the representative still waits for the slowest
        but the faster replicas' sends hold their links longer at a lower
        rate instead of finishing early, which other flows on those links
        feel and which shows in those links' busy time and rate series
        (bytes per link and per GPU pair are exact either way). Measured:
        DeepSeek-V3 on 2,048 GPUs in ``lockstep`` +0.048% step time at a
        third of the CPU time, GPT-3 175B on 1,024 GPUs in ``fast`` −0.004%
        at −20% (docs/DESIGN.md, "Round eleven: replica sends as one
        flow"). ``"each"``: one flow per replica pair (the reference).
    pxn : bool
        NCCL's PXN (PCI × NVLink; on by default since NCCL 2.12,
        ``NCCL_PXN_DISABLE=0``). True (default): a transfer to a GPU on
        another server moves over NVLink to the GPU of its own server with the
        destination's local index and leaves through that GPU's NIC, so it
        stays on the destination's rail; a ring's channel enters and leaves a
        server through one NIC. On a rail-optimized fabric this keeps rings'
        and all-to-alls' traffic between servers of a pod off the spines.
        False (``NCCL_PXN_DISABLE=1``): every transfer leaves through its
        source GPU's own NIC (:mod:`simulator.routing`).
    channels : str
        How many channels a ring or tree collective runs on. A collective
        across servers runs one channel per GPU of a server, each entering
        and leaving through its own NIC. ``"nccl"`` (default): as NCCL does,
        fewer for small sizes, where a channel's threads would get under
        their threshold (a Simple ring 32 KiB a channel, LL128 5 KiB, an LL
        ring 4 KiB per rank; :func:`~simulator.nccl.collective_channels`), so a
        gradient norm's 4-byte all-reduce crosses one NIC of each server, not
        all of them. Only with NCCL's latency model (``step_latency: nccl``).
        ``"every_rail"``: every channel at every size (the model before).
    all_to_all_efficiency : float or None
        Fraction of a NIC's line rate the transfers of an all-to-all or
        alltoallv (NCCL's, DeepEP's network hop) between servers reach:
        ``None`` (default) :data:`~simulator.nccl.ALL_TO_ALL_NET_EFFICIENCY`
        (0.85, read off nccl-tests ``alltoall_perf`` and DeepEP's published
        bandwidths), below the 0.95 of rings. Such a transfer carries its
        bytes over this fraction of the NIC tier's (``leaf``) efficiency more
        wire bytes (as a protocol's factor does), at most none. Only with
        NCCL's latency model (``step_latency: nccl``); pipeline sends and
        every other collective keep the tier's efficiency.
    """

    model: str = "flow"
    step_latency_s: float | None = None
    fidelity: str = "fast"
    seed: int = 0
    bandwidth_efficiency: float | Mapping[str, float] | None = None
    routing: str = "ecmp"
    all_to_all: str = "auto"
    replica_sends: str = "merged"
    pxn: bool = True
    channels: str = "nccl"
    all_to_all_efficiency: float | None = None

    def __post_init__(self) -> None:
        if isinstance(self.seed, bool) or not isinstance(self.seed, Integral):
            raise ValueError(f"network.seed: must be an integer (the ECMP hash seed), got {self.seed!r}")
        if not isinstance(self.pxn, bool):
            raise ValueError(f"network.pxn: must be true or false, got {self.pxn!r}")
        if self.model not in NETWORK_MODELS:
            raise ValueError(f"network.model: {self.model!r} unknown; valid: {', '.join(NETWORK_MODELS)}")
        if self.routing not in ROUTINGS:
            raise ValueError(f"network.routing: {self.routing!r} unknown; valid: {', '.join(ROUTINGS)}")
        if self.all_to_all not in ALL_TO_ALL_FLOWS:
            raise ValueError(f"network.all_to_all: {self.all_to_all!r} unknown; valid: {', '.join(ALL_TO_ALL_FLOWS)}")
        if self.replica_sends not in REPLICA_SENDS:
            raise ValueError(f"network.replica_sends: {self.replica_sends!r} unknown; "
                             f"valid: {', '.join(REPLICA_SENDS)}")
        if self.channels not in CHANNEL_COUNTS:
            raise ValueError(f"network.channels: {self.channels!r} unknown; valid: {', '.join(CHANNEL_COUNTS)}")
        if self.step_latency_s is not None and not (isinstance(self.step_latency_s, Real)
                                                    and 0 <= self.step_latency_s < LINK_LATENCY_MAX):
            raise ValueError(f"network.step_latency: must be 'nccl' or a time in [0, {LINK_LATENCY_MAX:g} s), "
                             f"got {self.step_latency_s!r}")
        if self.fidelity not in ("fast", "full"):
            raise ValueError(f"network.fidelity: {self.fidelity!r} unknown; valid: fast, full")
        a2a = self.all_to_all_efficiency
        if a2a is not None and not is_fraction(a2a):
            raise ValueError(f"network.all_to_all_efficiency: must be a fraction of the NIC's line rate in "
                             f"[{MIN_EFFICIENCY:g}, 1], got {a2a!r}")
        eff = self.bandwidth_efficiency
        values = eff.items() if isinstance(eff, Mapping) else ([("", eff)] if eff is not None else [])
        for tier, v in values:
            if tier and tier not in TIER_NAMES:
                raise ValueError(f"network.bandwidth_efficiency.{tier}: unknown tier; valid: {', '.join(TIER_NAMES)}")
            if not is_fraction(v):
                name = f"network.bandwidth_efficiency{'.' + tier if tier else ''}"
                raise ValueError(f"{name}: must be a fraction of the link rate in [{MIN_EFFICIENCY:g}, 1], got {v!r}")

    @property
    def nccl_latency(self) -> bool:
        """Whether collectives use NCCL's protocol and latency model (``step_latency_s`` is None)."""
        return self.step_latency_s is None

    def tier_efficiency(self, tier: str, gpu_nvlink_efficiency: float) -> float:
        """The fraction of a ``tier`` link's rate transfers can use."""
        eff = self.bandwidth_efficiency
        if isinstance(eff, Mapping) and tier in eff:
            return float(eff[tier])
        if eff is not None and not isinstance(eff, Mapping):
            return float(eff)
        return gpu_nvlink_efficiency if tier == "nvlink" else NIC_EFFICIENCY

    def all_to_all_factor(self) -> float:
        """The share of the NIC tier's usable rate an all-to-all's transfer between servers reaches: its wire
        bytes are its payload over this (and its protocol's factor). ``all_to_all_efficiency`` (default
        :data:`~simulator.nccl.ALL_TO_ALL_NET_EFFICIENCY`) over the ``leaf`` tier's efficiency, at most 1; 1
        under the uniform latency model (``step_latency_s`` given: no NCCL protocol factors either).

        >>> round(NetworkConfig().all_to_all_factor(), 4), NetworkConfig(step_latency_s=1e-6).all_to_all_factor()
        (0.8947, 1.0)
        """
        if not self.nccl_latency:
            return 1.0
        a2a = ALL_TO_ALL_NET_EFFICIENCY if self.all_to_all_efficiency is None else float(self.all_to_all_efficiency)
        return min(1.0, a2a / self.tier_efficiency("leaf", 1.0))


def _priced(kind: str, algorithm: str, nccl: bool = True) -> tuple[str, ...]:
    """The algorithms :meth:`Fabric.choose` plans and prices for ``algorithm``: ``auto``'s candidates, else the
    one given, with the ring before a forced tree all-reduce under NCCL's model (``nccl``), whose protocols
    NCCL's tuner prices off the ring's bandwidth (``NCCL_ALGO=Tree`` narrows the algorithms, not the pricing;
    the uniform latency model has one protocol, nothing to price)."""
    if algorithm == "auto":
        return AUTO_CANDIDATES[kind]
    return ("ring", algorithm) if algorithm == "tree" and kind == "all_reduce" and nccl else (algorithm,)


class Fabric:
    """Ranks, routes and a network backend for one simulation run."""

    def __init__(self, env: simpy.Environment, cluster: Cluster, config: NetworkConfig | None = None) -> None:
        self.env = env
        self.cluster = cluster
        self.config = config or NetworkConfig()
        graph = cluster.graph
        self.links: list[tuple] = []
        bandwidth: list[float] = []
        latency: list[float] = []
        tier: list[str] = []
        self.kinds: list[str | None] = []  # each link's kind (Result.links)
        for u, v, data in graph.edges(data=True):  # one pass (131,072 GPUs: ~10^6 links)
            self.links.append((u, v))
            bandwidth.append(data["bandwidth"])
            latency.append(data["latency"])
            tier.append(data["tier"])
            self.kinds.append(data.get("kind"))
        self.link_index = {e: i for i, e in enumerate(self.links)}
        self.capacity = np.array(bandwidth, dtype=float)
        self.latency = np.array(latency, dtype=float)
        self._latency_of = self.latency.tolist()
        # each link's latency as a small code (equal latencies, equal codes), and how many codes: a row of a
        # routed block is then one integer (see _route_hops)
        self._latency_levels, self._latency_code = np.unique(self.latency, return_inverse=True)
        self._latency_sums: dict[tuple[float, ...], float] = {}  # a route's link latencies -> their sum (s)
        self.tier = np.array(tier)
        self.router = Router(graph, self.link_index, self.config.seed, pxn=self.config.pxn)
        backend = FlowNetwork if self.config.model == "flow" else AnalyticNetwork
        # What transfers can use; ``capacity`` stays the physical rate that results report against.
        nvlink_eff = getattr(cluster.gpu, "nvlink_efficiency", 1.0)
        efficiency = {t: self.config.tier_efficiency(t, nvlink_eff) for t in set(self.tier.tolist())}
        self.usable_capacity = self.capacity * np.array([efficiency[t] for t in self.tier], dtype=float)
        self.network = backend(env, self.usable_capacity)
        self._servers = [graph.nodes[g]["server"] for g in cluster.gpus]
        # an all-to-all's transfers between servers: wire bytes over this too (NetworkConfig.all_to_all_factor)
        self.all_to_all_factor = self.config.all_to_all_factor()
        self._auto_cache: dict[tuple, str] = {}
        self._channel_limits: dict[tuple, int | None] = {}  # (kind, group, nbytes, algorithm) -> channel_limit
        self._estimate_cache: dict[tuple, list[float]] = {}  # plan shape (see _plan_shape) -> estimates
        self._route_latency: dict[tuple, tuple[np.ndarray, float]] = {}
        self._phases_cache: dict[tuple, tuple] = {}
        # The same lookups by identity of the group list and matrix, in front of _phases_cache: hashing an
        # alltoallv's matrix (64 x 64 sizes at EP 64) costs more than planning a cached collective, and a
        # representative hands the same rows object for every layer and micro-batch. key -> (groups or group,
        # matrix, result), kept once _phases_cache has found the same one again (a matrix made afresh per
        # call, as an alltoallv of every rank's splits is, never gets here); forgotten past _IDENTITY_ENTRIES.
        self._by_identity: dict[tuple, tuple] = {}
        self._server_array: np.ndarray | None = None  # rank -> server, made for _lane_phases
        self._last_choice: tuple | None = None  # (key, plan, protocol) of the latest choose()
        # (phases, their routed hops in order) of the latest plan _both_estimates routed whole (_route_plan)
        self._last_routed: tuple | None = None
        # a phase's transfers ((hops, label) each) -> their bottlenecks (s/B) and route latencies (_both_estimates)
        self._phase_loads: dict[tuple, tuple[list[float], list[float]]] = {}
        # a small plan's transfers ((hops, label) each, phase by phase) -> what its routes alone give: their links
        # relabelled with the usable capacities (_plan_shape), and each transfer's links array, spread and largest
        # hop latency (_route_plan). A collective whose size follows the routed load (a MoE layer's expert-TP
        # all-gather) is planned anew for every size, over the same routes.
        self._skeletons: dict[tuple, list] = {}
        # Isomorphic groups (_group_class): (kind, group, algorithm) -> class id or None; the classes' signatures
        # -> id; per id, the candidates' hops by member positions -> column; per (class id, size) NCCL's channel
        # cut, per (class id, size, count) the routed plan as a template (_class_phases): a MoE layer's expert-TP
        # collectives come in one size per routing draw, and each TP group's was chosen and routed afresh.
        self._group_classes: dict[tuple, int | None] = {}
        self._class_ids: dict[tuple, int] = {}
        self._class_columns: list[dict[tuple[int, int, int], int]] = []
        self._class_limits: dict[tuple, int | None] = {}
        self._class_templates: dict[tuple, tuple | None] = {}
        self._last_skeleton: tuple | None = None  # (phases of the latest plan looked up, its skeleton)
        # id(links array) -> (the array, the (src rank, dst rank) hops it carries, one equal payload each):
        # how the traffic matrix attributes a route's payload to GPU pairs.
        self._pairs: dict[int, tuple[np.ndarray, tuple[tuple[int, int], ...]]] = {}
        # id(the array routed rows view) -> [(that array, the routed block, the block's keys row by row)]: the
        # pairs of a hop routed in bulk, found from its row when first asked (_pair_entry), not stored per hop
        self._row_blocks: dict[int, list[tuple[np.ndarray, np.ndarray, list]]] = {}
        self._spray = self.config.routing == "spray"
        # id(links array) -> (the array, the equal-cost paths it spreads a flow over): only where more than one (spread)
        self._spread: dict[int, tuple[np.ndarray, int]] = {}
        self.collectives_run = 0
        self._one_switch_groups: dict[tuple[int, ...], bool] = {}  # group -> _one_switch
        self._between_switches: np.ndarray | None = None  # per link: joins two switches (made by _one_switch)

    # ------------------------------------------------------------------ ranks
    def server_of(self, rank: int) -> int:
        return self._servers[rank]

    def route(self, src: int, dst: int, label: int = 0) -> np.ndarray:
        """Link ids from rank ``src``'s GPU to rank ``dst``'s GPU for connection ``label`` (ECMP's pick)."""
        gpus = self.cluster.gpus
        return self.router.route(gpus[src], gpus[dst], label)

    def _hop(self, src: int, dst: int, label: int) -> tuple[np.ndarray, float]:
        """``(links, latency_s)`` of one hop. Under ``spray`` routing ``links`` concatenates all ``k``
        equal-cost paths (a link on ``j`` of them appears ``j`` times) and :meth:`spread` is ``k``: a flow of
        ``nbytes / k`` over that array loads each link exactly as ``nbytes`` split evenly over the paths."""
        spray = self._spray
        key = (src, dst, 0 if spray else label)
        hop = self._route_latency.get(key)
        if hop is None:
            if spray:
                gpus = self.cluster.gpus
                paths = self.router.paths(gpus[src], gpus[dst])
                links = paths[0] if len(paths) == 1 else np.concatenate(paths)
                if len(paths) > 1:
                    # one flow of the whole payload, a 1/k share of its rate on each path's entries: max-min
                    # fairness then shares a link by flows' rates, not by paths (a flow sprayed over k paths
                    # used to claim k shares of its own NIC beside a flow of one path)
                    self._spread[id(links)] = (links, len(paths))
                    self.network.declare(links, 1, np.full(len(links), 1.0 / len(paths)))
                latency = max(float(self.latency[p].sum()) for p in paths)
            else:
                links = self.route(src, dst, label)
                # Routes of one kind cross links of the same latencies: sum each sequence once (the same numpy
                # sum of the same values, so the same float)
                values = tuple([self._latency_of[x] for x in links.tolist()])
                latency = self._latency_sums.get(values)
                if latency is None:
                    latency = self._latency_sums[values] = float(self.latency[links].sum())
            hop = self._route_latency[key] = (links, latency)
            self._pairs[id(links)] = (links, ((src, dst),))
        return hop

    def _route_hops(self, keys: list[tuple[int, int, int]]) -> None:
        """Route the ``(src, dst, label)`` hops of ``keys``, none of them cached yet (repeats allowed),
        together (:meth:`Router.route_blocks`) when there are at least ``_BULK_HOPS`` distinct ones under ECMP:
        the same arrays and latencies :meth:`_hop` would make one by one (a DP ring over 1,024 servers, a
        send between two stages' 8,192 replicas)."""
        if self._spray or len(keys) < _BULK_HOPS:
            return
        cache = self._route_latency
        missing = list(dict.fromkeys(keys))
        if len(missing) < _BULK_HOPS:
            return
        arr = np.fromiter(chain.from_iterable(missing), dtype=np.int64, count=3 * len(missing)).reshape(-1, 3)
        sums = self._latency_sums
        levels = len(self._latency_levels)
        for where, block in self.router.route_blocks(self.cluster.gpus, arr[:, 0], arr[:, 1], arr[:, 2]):
            # a route's latency is looked up by its links' latencies, as _hop does: once per distinct row (rows
            # told apart by their latency codes in one integer when that fits, else compared whole)
            if levels ** block.shape[1] < 2 ** 62:
                codes = self._latency_code[block] @ (levels ** np.arange(block.shape[1], dtype=np.int64))
                _values, firsts, inverse = np.unique(codes, return_index=True, return_inverse=True)
            else:
                _values, firsts, inverse = np.unique(self.latency[block], axis=0, return_index=True,
                                                     return_inverse=True)
            known = []
            for first in firsts.tolist():
                row = self.latency[block[first]]
                values = tuple(row.tolist())
                latency = sums.get(values)
                if latency is None:
                    latency = sums[values] = float(row.sum())
                known.append(latency)
            latencies = [known[j] for j in inverse.ravel().tolist()]
            # key -> (links, latency) for every row, in a C loop; the rows' pairs are found when asked for
            routed = [missing[i] for i in where.tolist()]
            rows = list(block)
            cache.update(zip(routed, zip(rows, latencies)))
            if rows and block.strides[0]:
                base = rows[0].base  # (what numpy says the row views view: the same for every row)
                self._row_blocks.setdefault(id(base), []).append((base, block, routed))
            else:  # (rows over the same memory, a broadcast block: told apart by identity only)
                self._pairs.update(zip(map(id, rows), zip(rows, [((s, d),) for s, d, _label in routed])))

    def _hops(self, keys: list[tuple[int, int, int]]) -> list[tuple[np.ndarray, float]]:
        """:meth:`_hop` of every ``(src, dst, label)`` of ``keys``, in order: the cached ones looked up
        directly, the others routed together (:meth:`_route_hops`). The same objects one call of
        :meth:`_hop` per key gives, without a method call per key (a 131,072-GPU step looks up ~10^7)."""
        if self._spray:  # (cached under label 0: _hop maps the key)
            hop = self._hop
            return [hop(*k) for k in keys]
        get = self._route_latency.get
        found = list(map(get, keys))
        if None in found:
            self._route_hops(keys if found.count(None) == len(found) else
                             [k for k, f in zip(keys, found) if f is None])
            found = list(map(get, keys))
            if None in found:  # (too few to route together: one by one)
                hop = self._hop
                found = [hop(*k) if f is None else f for k, f in zip(keys, found)]
        return found

    def spread(self, links: np.ndarray) -> int:
        """Equal-cost paths a routed links array spreads one flow over (1 under ECMP): a hop's ``k``; for a
        transfer's array over several hops (:meth:`_transfer_links`), the lcm of its hops' spreads."""
        entry = self._spread.get(id(links))
        return entry[1] if entry is not None and entry[0] is links else 1

    def _transfer_links(self, hops: list[tuple[np.ndarray, float]]) -> np.ndarray:
        """One transfer's links over all its ``hops`` (a pipelined ring is one flow over every hop). Under spray a
        hop over ``k`` paths is declared to the network with each entry weighted ``1 / k`` (:meth:`_hop`), and the
        transfer's concatenation with its hops' weights (its :meth:`spread` the lcm of theirs), so one flow of the
        transfer's whole bytes loads every hop as its own split would and competes as one flow."""
        if len(hops) == 1:
            return hops[0][0]
        spreads = [self.spread(h[0]) for h in hops]
        links = np.concatenate([h[0] for h in hops])
        if max(spreads) == 1:
            return links
        weights_of = self.network.weights_of
        weights = np.concatenate([np.ones(len(h[0])) if k == 1 else weights_of(h[0]) for h, k in zip(hops, spreads)])
        self.network.declare(links, 1, weights)
        self._spread[id(links)] = (links, int(np.lcm.reduce(spreads)))
        return links

    def _transfer(self, hops: list[tuple[np.ndarray, float]], pairs: tuple[tuple[int, int], ...]
                  ) -> tuple[np.ndarray, float, int]:
        """One transfer's ``(links, its hops' largest route latency, its hop count)`` from its routed ``hops``
        (:meth:`_transfer_links`); a transfer over several hops is kept by its ``(src, dst)`` rank ``pairs`` for the
        traffic matrix (:meth:`pairs_of`)."""
        links = self._transfer_links(hops)
        if len(hops) > 1:
            self._pairs[id(links)] = (links, pairs)
        return links, max([h[1] for h in hops]), len(hops)

    def _pair_entry(self, links: np.ndarray) -> tuple:
        """``(links, hops, [shares])`` of a routed links array (see :meth:`pairs_of`). A hop routed in bulk
        (:meth:`_route_hops`) is a row of its block, found by the row's offset in it, and then kept."""
        entry = self._pairs.get(id(links))
        if entry is not None and entry[0] is links:
            return entry
        base = getattr(links, "base", None)
        for owner, block, routed in self._row_blocks.get(id(base), ()) if base is not None else ():
            if owner is not base or links.shape != block.shape[1:] or links.dtype != block.dtype:
                continue
            row, rest = divmod(links.ctypes.data - block.ctypes.data, block.strides[0])
            if rest == 0 and 0 <= row < len(block):
                key = routed[row]
                if self._route_latency.get(key, (None,))[0] is links:
                    entry = self._pairs[id(links)] = (links, ((key[0], key[1]),))
                    return entry
        raise KeyError("links array was not routed by this fabric")

    def pairs_of(self, links: np.ndarray) -> tuple[tuple[int, int], ...]:
        """The ``(src rank, dst rank)`` hops a routed links array carries (each carries an equal share of
        its payload, unless :meth:`shares_of` says otherwise: a pipelined ring's transfer is one array over
        every hop of the ring)."""
        return self._pair_entry(links)[1]

    def shares_of(self, links: np.ndarray) -> tuple[float, ...] | None:
        """The fraction of a routed links array's payload each of its hops (:meth:`pairs_of`) carries, or
        None when they carry equal shares (a grouped alltoallv's members move their own sizes)."""
        entry = self._pair_entry(links)
        return entry[2] if len(entry) > 2 else None

    # ------------------------------------------------------------------ plans
    def _spans_servers(self, group: tuple[int, ...]) -> bool:
        first = self._servers[group[0]]
        return any(self._servers[r] != first for r in group)

    def _latency(self, t: Transfer, costs: tuple[float, float, float]) -> float:
        """Step latencies of transfer ``t`` (no base latency).

        NCCL's per-step latencies are measured end to end, hardware included: a step costs the larger of
        NCCL's figure and the route's own link latencies (which only a slower-than-usual fabric exceeds).
        The uniform model (``step_latency_s`` set) adds the link latencies to its software α.
        """
        return self._step_latency(t, costs, max(self._hop(s, d, t.label)[1] for s, d in t.hops))

    def _step_latency(self, t: Transfer, costs: tuple[float, float, float], phys: float) -> float:
        """:meth:`_latency` given ``phys``, the largest route latency of ``t``'s hops (seconds)."""
        _base, intra, inter = costs
        if self.config.nccl_latency:
            return (t.steps - t.net_steps) * max(intra, phys) + t.net_steps * max(inter, phys)
        return t.steps * (intra + phys)

    def _costs(self, plan: Plan, protocol: str, spans: bool | None = None) -> tuple[float, float, float]:
        """``(base, intra-server step, inter-server step)`` latencies of ``plan`` under ``protocol``
        (``spans``: whether its group spans servers, if already known)."""
        if not self.config.nccl_latency:
            alpha = self.config.step_latency_s
            return 0.0, alpha, alpha
        spans = self._spans_servers(plan.group) if spans is None else spans
        costs = step_latencies(plan.algorithm, protocol, spans)
        if spans and protocol == "Simple" and plan.algorithm == "ring" and plan.kind == "all_reduce":
            plateau = ring_plateau(plan.nbytes, len(plan.group))
            if plateau != 1.0:
                costs = (costs[0] * plateau, costs[1] * plateau, costs[2] * plateau)
        return costs

    def protocols(self, plan: Plan) -> tuple[str, ...]:
        """Protocols the plan may run: NCCL's three for collectives; point-to-point patterns
        (``direct``, ``parameter_server``) by NCCL's LL threshold on their largest transfer, Simple if
        they cross servers (:func:`~simulator.nccl.p2p_protocol`)."""
        if not self.config.nccl_latency:
            return ("Simple",)
        if plan.algorithm in ("direct", "parameter_server"):
            largest = max((t.nbytes for p in plan.phases for t in p), default=0.0)
            return (p2p_protocol(largest, self._spans_servers(plan.group)),)
        return PROTOCOLS

    def plan(self, kind: str, group: tuple[int, ...], nbytes: float, algorithm: str = "auto") -> Plan:
        """Plan a collective; ``auto`` picks the algorithm with the lowest contention-free estimate."""
        return self.choose(kind, group, nbytes, algorithm)[0]

    def choose(self, kind: str, group: tuple[int, ...], nbytes: float, algorithm: str = "auto"
               ) -> tuple[Plan, str]:
        """The plan (config fidelity) and protocol with the lowest contention-free estimate, as NCCL's
        tuner picks them; ``algorithm`` other than ``auto`` fixes the algorithm."""
        if algorithm != "auto" and algorithm not in COLLECTIVE_ALGORITHMS:
            raise CollectiveError(f"algorithm: {algorithm!r} unknown; valid: {', '.join(COLLECTIVE_ALGORITHMS)}")
        key = (kind, group, nbytes, algorithm)
        last = self._last_choice
        if last is not None and last[0] == key:
            return last[1], last[2]
        choice = self._auto_cache.get(key)
        planned: dict[str, Plan] = {}  # the candidates' plans (fidelity "fast")
        if choice is None:
            candidates = AUTO_CANDIDATES[kind] if algorithm == "auto" else (algorithm,)
            best = None
            ring_bandwidth: list[float] | None = None  # (ring vs tree: see below)
            for a in _priced(kind, algorithm, self.config.nccl_latency):
                plan = planned[a] = plan_collective(kind, group, nbytes, self.server_of, a,
                                                    stagger=self.config.nccl_latency)
                protocols = self.protocols(plan)
                if len(candidates) == 1 and len(protocols) == 1 and a in candidates:  # nothing to choose
                    best = (0.0, a, protocols[0])
                    break
                if a == "tree" and ring_bandwidth is not None and len(group) > 1:
                    # NCCL's tuner prices a tree all-reduce at the ring's bandwidth (the same graphs' bus
                    # bandwidth, x0.92 and its protocol factors, algorithm bandwidth busBw/2 against the ring's
                    # busBw·n/(2(n-1))) plus the tree's own latency, and picks what it prices lowest. A tree
                    # may move fewer bytes per NIC than that (two servers: one edge), which the simulation
                    # then runs, but NCCL does not choose by it.
                    n = len(group)
                    latency = self._cached_estimates(plan)[1]
                    one_node = not self._spans_servers(group)
                    estimates = [lat + ring * n / (n - 1) * BANDWIDTH_FACTOR[p]
                                 / bandwidth_factor(a, kind, p, one_node, nbytes)
                                 for lat, ring, p in zip(latency, ring_bandwidth, protocols)]
                else:
                    estimates, idle = self._cached_estimates(plan)
                    if a == "ring" and "tree" in candidates and kind == "all_reduce":
                        ring_bandwidth = [t - lat for t, lat in zip(estimates, idle)]
                if a not in candidates:  # priced only (a forced tree's protocols are priced off the ring)
                    continue
                for t, protocol in zip(estimates, protocols):
                    if best is None or t < best[0]:
                        best = (t, a, protocol)
            choice = self._auto_cache[key] = (best[1], best[2])
        # NCCL prices and picks with every channel, then runs fewer for a small size (collective_channels)
        limit = (collective_channels(choice[0], choice[1], nbytes, len(group))
                 if self.config.channels == "nccl" and self.config.nccl_latency else None)
        plan = planned.get(choice[0]) if self.config.fidelity == "fast" else None  # the same call's plan
        if plan is not None and limit is not None and plan.phases and limit < len(plan.phases[0]):
            plan = None  # (a fast ring or tree plan's one phase holds a transfer per channel)
        if plan is None:
            plan = plan_collective(kind, group, nbytes, self.server_of, choice[0], self.config.fidelity,
                                   stagger=self.config.nccl_latency, channels=limit)
        self._last_choice = (key, plan, choice[1])
        return plan, choice[1]

    def channel_limit(self, kind: str, group: tuple[int, ...], nbytes: float, algorithm: str = "auto"
                      ) -> int | None:
        """NCCL's channel count for this collective where it cuts channels for the size (``channels: nccl``,
        :func:`~simulator.nccl.collective_channels`), else None. NCCL launches one CTA per channel, so a
        collective cut to ``c`` channels holds at most ``c`` SMs beside compute (:mod:`simulator.engine`).
        A bulk all-to-all or an alltoallv is never cut (None)."""
        key = (kind, group, nbytes, algorithm)
        found = self._channel_limits.get(key, False)
        if found is False:
            found = None
            if (self.config.channels == "nccl" and self.config.nccl_latency and len(group) > 1
                    and not self._bulk(kind, group, nbytes, algorithm, None)):
                # (one count per class of isomorphic groups and size: see _group_class)
                cls = self._group_class(kind, group, nbytes, algorithm)
                class_key = (cls, nbytes) if cls is not None else None
                found = self._class_limits.get(class_key, _UNSET) if cls is not None else _UNSET
                if found is _UNSET:
                    plan, protocol = self.choose(kind, group, nbytes, algorithm)
                    found = collective_channels(plan.algorithm, protocol, nbytes, len(group))
                    if class_key is not None:
                        self._class_limits[class_key] = found
            self._channel_limits[key] = found
        return found

    def _group_class(self, kind: str, group: tuple[int, ...], nbytes: float, algorithm: str) -> int | None:
        """The class id of ``group`` for collectives ``kind`` under ``algorithm``: groups of one class id get the
        same tuner choice and, at equal sizes, the same flows over their own routes (:meth:`_class_phases`); or
        None (planned group by group: an all_to_all, spray routing, a group of one rank, of repeated ranks or of
        more than ``_LANE_RANKS``, plans of more than ``_SHAPE_HOPS`` hops, a size of 0, an algorithm that does
        not plan the kind). The class's *columns* (``_class_columns``) number the hops ``(src position, dst
        position, label)`` of every candidate plan :meth:`choose` prices (the ring's and the tree's of an
        all-reduce). Kept per ``(kind, group, algorithm)``.

        Why equal ids give equal answers, bit for bit. The class id stands for the signature: kind,
        algorithm, the members' server pattern (each member's server numbered in order of first appearance
        in the group), the columns, and the columns' routes concatenated in column order: their lengths,
        their links relabelled in order of first appearance, each entry's usable capacity (the link's rate
        times its tier's efficiency: NVLink, PCIe, NIC tiers all fold in here), each column's route latency.
        (1) Plans: every planner (:mod:`~simulator.collectives`, all_to_all left out) walks the group in
        order and reads of the cluster only whether two members share a server (rings and trees by server
        in order of first appearance, ``net_steps`` by crossings, the root at position 0), and never a
        size-dependent hop; so for two groups ``g0``, ``g`` of one pattern, every plan of ``g`` (a
        candidate, a channel cut, ``full`` fidelity) is ``g0``'s with ``g0[i]`` replaced by ``g[i]``,
        hops and labels at the same columns. (2) The tuner (:meth:`choose`, :meth:`_both_estimates`,
        :meth:`_plan_shape`) reads of those plans: the transfers' bytes, steps and network steps (equal by
        (1)); whether the group spans servers and its size (the pattern); each hop's route as links
        relabelled in first appearance over the plan, their usable capacities and the hop's latency (a
        plan's hops, in its own order and with repeats, are a sequence of columns: two links of one
        concatenation are equal exactly where they are in the other's, so the relabellings, capacities and
        latencies over any such sequence are equal); spreads, 1 under ECMP (spray is left out). So every
        candidate's estimates are equal, and the choice of algorithm and protocol, NCCL's channel count
        (:func:`~simulator.nccl.collective_channels`: algorithm, protocol, size, ranks) and the chosen
        plan (substituted) are. (3) :meth:`_route_plan` then gives every flow the same wire bytes, latency
        (base and step latencies by pattern and protocol, the hops' largest route latency) and payload
        (hops per transfer), over the transfer's own routes. Nothing else of the cluster enters: faults are
        edits of the graph before the fabric is made (a degraded or removed link, a borrowed NIC), custom
        fabrics and unlike servers are graphs too, and all of them show in the routes, capacities and
        latencies compared, so a group through a degraded link or on a server of other GPUs has a
        signature, and a class, of its own (tested). Where the signature cannot be formed (the cases above)
        the group takes the path every group took before.
        """
        key = (kind, group, algorithm)
        entry = self._group_classes.get(key, _UNSET)
        if entry is _UNSET:
            if nbytes <= 0:  # (no hops to classify by; the group may come again with a size)
                return None
            entry = self._group_classes[key] = self._classify(kind, group, nbytes, algorithm)
        return entry

    def _classify(self, kind: str, group: tuple[int, ...], nbytes: float, algorithm: str) -> int | None:
        """:meth:`_group_class` worked out (``nbytes`` > 0: the size the candidates are planned at; their hops
        do not depend on it)."""
        n = len(group)
        if (kind == "all_to_all" or self._spray or n < 2 or n > _LANE_RANKS or len(set(group)) != n
                or (algorithm != "auto" and algorithm not in COLLECTIVE_ALGORITHMS)):
            return None
        try:
            columns = self._hop_columns(kind, group, nbytes, algorithm)
        except (CollectiveError, KeyError):  # (planned as before, which raises its own error)
            return None
        if columns is None:
            return None
        hops = self._hops([(group[i], group[j], label) for i, j, label in columns])
        servers = self._servers
        numbered: dict[int, int] = {}
        pattern = tuple([numbered.setdefault(servers[r], len(numbered)) for r in group])
        flat = [x for links, _latency in hops for x in links.tolist()]
        relabel: dict[int, int] = {}
        signature = (kind, algorithm, pattern, tuple(columns), tuple([len(h[0]) for h in hops]),
                     tuple([relabel.setdefault(x, len(relabel)) for x in flat]),
                     tuple(self.usable_capacity[flat].tolist()), tuple([h[1] for h in hops]))
        cid = self._class_ids.get(signature)
        if cid is None:
            cid = self._class_ids[signature] = len(self._class_columns)
            self._class_columns.append(columns)
        return cid

    def _hop_columns(self, kind: str, group: tuple[int, ...], nbytes: float, algorithm: str
                     ) -> dict[tuple[int, int, int], int] | None:
        """The hops of every candidate plan :meth:`choose` prices for ``group`` (the ring's and the tree's of an
        all-reduce), numbered in order of first appearance by ``(src position, dst position, label)``: the
        columns of a class of isomorphic groups (:meth:`_group_class`, :meth:`_lane_phases`). None where a plan
        has more than ``_SHAPE_HOPS`` hops (estimates are not cached per shape there: see :meth:`choose`) or no
        plan has any. Raises what :func:`~simulator.collectives.plan_collective` raises."""
        nccl = self.config.nccl_latency
        plans = [plan_collective(kind, group, nbytes, self.server_of, a, stagger=nccl)
                 for a in _priced(kind, algorithm, nccl)]
        if any(sum(len(t.hops) for p in plan.phases for t in p) > _SHAPE_HOPS for plan in plans):
            return None
        position = {r: i for i, r in enumerate(group)}
        columns: dict[tuple[int, int, int], int] = {}
        for plan in plans:
            for phase in plan.phases:
                for t in phase:
                    for a, b in t.hops:
                        columns.setdefault((position[a], position[b], t.label), len(columns))
        return columns or None

    def _class_phases(self, kind: str, group: tuple[int, ...], nbytes: float, algorithm: str, count: int
                      ) -> tuple[tuple[tuple, ...], ...] | None:
        """:meth:`phases` of a collective that is not an all_to_all, from its class of isomorphic groups
        (:meth:`_group_class`): the first group of the class to come at this size and count is chosen and
        routed as before, and its flows kept as a template (each transfer's columns and what its flow
        carries besides links); every other group of the class gets the template's flows over its own
        routes, each transfer's links as :meth:`_route_plan` makes them (kept in the same skeleton, so the
        same array objects). None where the group has no class or the template could not be made (a hop
        of the chosen plan outside the columns): then :meth:`phases` plans the group itself."""
        if nbytes <= 0:
            return None
        cls = self._group_class(kind, group, nbytes, algorithm)
        if cls is None:
            return None
        key = (cls, nbytes, count)
        template = self._class_templates.get(key, _UNSET)
        if template is _UNSET:
            plan, protocol = self.choose(kind, group, nbytes, algorithm)
            routed = self._route_plan(plan, protocol, count)
            self._class_templates[key] = _template(plan, routed, self._class_columns[cls])
            return routed
        if template is None:
            return None
        # the plan's transfers ((hops, label) each, phase by phase): its skeleton's key, as _skeleton makes it
        plan_hops = tuple([tuple([(tuple([(group[i], group[j]) for i, j in where]), label) for where, label, _rest
                                  in phase]) for phase in template])
        skeleton = self._skeleton_of(plan_hops)
        transfers = skeleton[1]
        if transfers is None:  # (as _route_plan fills it)
            transfers = skeleton[1] = [self._transfer(self._hops([(a, b, label) for a, b in hops]), hops)
                                       for phase in plan_hops for hops, label in phase]
        routes = iter(transfers)
        return tuple([tuple([(next(routes)[0], *rest) for _where, _label, rest in phase]) for phase in template])

    def _cached_estimates(self, plan: Plan) -> tuple[list[float], list[float]]:
        """:meth:`estimates` of ``plan`` and their latency terms alone (:meth:`_both_estimates`), kept per plan
        shape for plans of at most ``_SHAPE_HOPS`` hops (a large group's shape costs about what its estimate
        does, and rarely recurs: ECMP)."""
        if sum(len(t.hops) for p in plan.phases for t in p) > _SHAPE_HOPS:
            return self._both_estimates(plan, self.protocols(plan))
        shape = self._plan_shape(plan)
        both = self._estimate_cache.get(shape)
        if both is None:
            both = self._estimate_cache[shape] = self._both_estimates(plan, self.protocols(plan))
        return both

    def _plan_shape(self, plan: Plan) -> tuple:
        """Everything :meth:`estimates` reads of ``plan``, with link ids relabelled in order of first
        appearance: equal shapes, equal estimates (bit for bit: the same numbers in the same order).

        The same collective on isomorphic positions — a TP group's all-gather in every server, whose
        routes cross the same number of equally fast links — has one shape, so the tuner's choice is
        estimated once per shape, not once per group. A degraded or faulted link changes the capacities
        or routes and so the shape."""
        skeleton = self._skeleton(plan)
        relabelled = skeleton[0]
        if relabelled is None:
            relabel: dict[int, int] = {}
            hop = self._hop
            spread = self.spread
            hop_shapes = []
            for phase in plan.phases:
                for t in phase:
                    hops = []
                    for s, d in t.hops:
                        links, lat = hop(s, d, t.label)
                        hops.append((tuple([relabel.setdefault(x, len(relabel)) for x in links.tolist()]), lat,
                                     spread(links)))
                    hop_shapes.append(tuple(hops))
            usable = self.usable_capacity[list(relabel)].tolist() if relabel else []
            relabelled = skeleton[0] = (hop_shapes, tuple(usable))
        hop_shapes, usable = relabelled
        shapes = iter(hop_shapes)
        phases = tuple([tuple([(t.nbytes, t.steps, t.net_steps, next(shapes)) for t in phase])
                        for phase in plan.phases])
        spans = self._spans_servers(plan.group) if self.config.nccl_latency else None
        # (a ring's plateau and a tree's correction depend on the all-reduce's size, not its transfers' alone)
        size = plan.nbytes if plan.kind == "all_reduce" and plan.algorithm in ("ring", "tree") else None
        return (plan.algorithm, plan.kind, spans, self.protocols(plan), phases, usable, size)

    def _skeleton(self, plan: Plan) -> list:
        """``[relabelled, routed]`` kept for ``plan``'s transfers' hops and labels (``_skeletons``): what
        :meth:`_plan_shape` and :meth:`_route_plan` read of its routes alone, None until one of them has worked
        it out. Plans of more than ``_SHAPE_HOPS`` hops are not kept (a fresh ``[None, None]``)."""
        last = self._last_skeleton  # (the plan the tuner just priced is the one phases() routes next)
        if last is not None and last[0] is plan.phases:
            return last[1]
        if sum([len(t.hops) for phase in plan.phases for t in phase]) > _SHAPE_HOPS:
            return [None, None]
        skeleton = self._skeleton_of(tuple([tuple([(t.hops, t.label) for t in phase]) for phase in plan.phases]))
        self._last_skeleton = (plan.phases, skeleton)
        return skeleton

    def _skeleton_of(self, key: tuple) -> list:
        """The ``[relabelled, routed]`` kept for a plan whose transfers' ``(hops, label)`` are ``key``, phase by
        phase (see :meth:`_skeleton`), made empty if none is kept."""
        skeleton = self._skeletons.get(key)
        if skeleton is None:
            if len(self._skeletons) >= _SKELETONS:
                self._skeletons.clear()
            skeleton = self._skeletons[key] = [None, None]
        return skeleton

    def estimate(self, plan: Plan, protocol: str = "Simple") -> float:
        """Contention-free time of ``plan`` under ``protocol`` in seconds: NCCL's latency terms (a multi-node
        ring all-reduce's with NCCL's plateau) plus bytes over the shared bottleneck of every phase (link sharing
        inside a phase counted; a tree all-reduce's at its correction, :meth:`_tree_correction`)."""
        return self._both_estimates(plan, (protocol,))[0][0]

    def estimates(self, plan: Plan) -> list[float]:
        """:meth:`estimate` under each of :meth:`protocols`, routing the plan once."""
        return self._both_estimates(plan, self.protocols(plan))[0]

    def _both_estimates(self, plan: Plan, protocols: tuple[str, ...]) -> tuple[list[float], list[float]]:
        """:meth:`estimate` under each of ``protocols``, and the same with the latency terms alone, one array
        pass per phase: the load of every link (hops crossing it, each counted once per crossing, ``1 /
        spread`` of a hop under spray) and each transfer's largest load over usable capacity (its bottleneck
        seconds per byte). Both in one pass: the tuner prices a tree all-reduce by the ring's bandwidth term,
        its estimate less its latency, and each pass routes and loads every hop of the plan (a DP ring over
        1,024 ranks: 37% of the 131,072-GPU step's CPU went to such passes)."""
        spans = self._spans_servers(plan.group) if self.config.nccl_latency else None
        costs = [self._costs(plan, p, spans) for p in protocols]
        factors = [BANDWIDTH_FACTOR[p] * self._tree_correction(plan, p) for p in protocols]
        a2a = self.all_to_all_factor if plan.kind == "all_to_all" else 1.0
        servers = self._servers
        totals = [c[0] if plan.phases else 0.0 for c in costs]
        latencies = list(totals)
        # What a phase's loads read is only its transfers' hops and labels (routes, capacities): a large phase's
        # result is kept for the same ring with other bytes (a DP group's all-gather, reduce-scatter and
        # all-reduce, every bucket size). The hops of the phases not kept are routed together first.
        phases = [phase for phase in plan.phases if phase]
        keys = [tuple([(t.hops, t.label) for t in phase]) if sum(len(t.hops) for t in phase) > _SHAPE_HOPS else None
                for phase in phases]
        kept = self._phase_loads
        new = [key is None or key not in kept for key in keys]  # (a phase kept by an earlier one is loaded anew)
        hops = self._hops([(s, d, t.label) for phase, fresh in zip(phases, new) if fresh
                           for t in phase for s, d in t.hops])
        if all(new):  # every hop of the plan, in order: what _route_plan looks up if this plan is chosen
            self._last_routed = (plan.phases, hops)
        routed = iter(hops)
        for phase, loads_key, fresh in zip(phases, keys, new):
            if fresh:
                loads = self._phase_load(phase, routed)
                if loads_key is not None:
                    kept[loads_key] = loads
            else:
                loads = kept[loads_key]
            per_bytes, physs = loads
            worst = [0.0] * len(protocols)
            idle = [0.0] * len(protocols)
            for t, phys, per_byte in zip(phase, physs, per_bytes):
                if a2a != 1.0 and servers[t.hops[0][0]] != servers[t.hops[0][1]]:
                    per_byte /= a2a  # (an all-to-all's transfer between servers: all_to_all_factor)
                for i, (c, f) in enumerate(zip(costs, factors)):
                    latency = self._step_latency(t, c, phys)
                    worst[i] = max(worst[i], latency + t.nbytes / f * per_byte)
                    idle[i] = max(idle[i], latency)
            totals = [x + w for x, w in zip(totals, worst)]
            latencies = [x + w for x, w in zip(latencies, idle)]
        return totals, latencies

    def _phase_load(self, phase: tuple[Transfer, ...], phase_hops: Iterator[tuple[np.ndarray, float]]
                    ) -> tuple[list[float], list[float]]:
        """Each transfer's bottleneck seconds per byte (its largest link load over usable capacity, hops
        of the phase sharing links counted) and largest route latency (s), in transfer order. ``phase_hops``
        yields the phase's routed hops (:meth:`_hop`) in order, transfer by transfer."""
        usable = self.usable_capacity
        routed = [list(islice(phase_hops, len(t.hops))) for t in phase]
        arrays = [h[0] for hops in routed for h in hops]
        entries = np.concatenate(arrays) if len(arrays) > 1 else arrays[0]
        ids, local = np.unique(entries, return_inverse=True)
        if self._spray:
            weights = np.concatenate([np.full(len(a), 1.0 / self.spread(a)) for a in arrays])
            load = np.bincount(local, weights, minlength=len(ids))
        else:
            load = np.bincount(local, minlength=len(ids)).astype(float)
        ratio = load[local] / usable[entries]
        sizes = [sum(len(h[0]) for h in hops) for hops in routed]
        starts = np.cumsum([0] + sizes[:-1])
        per_bytes = np.maximum.reduceat(ratio, starts).tolist() if len(sizes) > 1 else [float(ratio.max())]
        return per_bytes, [max(h[1] for h in hops) for hops in routed]

    # -------------------------------------------------------------- execution
    def phases(self, kind: str, group: tuple[int, ...], nbytes: float, algorithm: str = "auto",
               count: int = 1, matrix: tuple[tuple[float, ...], ...] | None = None
               ) -> tuple[tuple[tuple, ...], ...]:
        """The routed flows of a collective: per phase, ``(links, nbytes, latency_s, payload_bytes)`` specs.

        ``matrix`` gives an all_to_all per-pair sizes (alltoallv, always ``direct``).
        Cached per ``(kind, group, nbytes, algorithm, count, matrix)``: plans and routes are pure functions of them.
        """
        if matrix is not None:  # (an alltoallv: see _by_identity)
            ident = (kind, group, nbytes, algorithm, count, id(matrix))
            hit = self._by_identity.get(ident)
            if hit is not None and hit[1] is matrix:
                return hit[2]
        key = (kind, group, nbytes, algorithm, count, matrix)
        routed = self._phases_cache.get(key)
        if routed is not None:
            if matrix is not None:
                self._remember(ident, group, matrix, routed)
        else:
            if kind == "all_to_all" and len(group) > MAX_ALL_TO_ALL_RANKS:
                n = len(group)
                raise CollectiveError(f"all_to_all: {n:,} ranks make {n * (n - 1):,} transfers; the most one "
                                      f"all_to_all may span is {MAX_ALL_TO_ALL_RANKS:,} ranks (memory grows as "
                                      f"ranks squared)")
            if self._bulk(kind, group, nbytes, algorithm, matrix):
                routed = self._phases_cache[key] = (bulk_flows(self, group, nbytes, count, matrix),)
            else:
                if matrix is not None:
                    plan = plan_collective(kind, group, nbytes, self.server_of, "direct", self.config.fidelity,
                                           matrix, stagger=self.config.nccl_latency)
                    routed = self._route_plan(plan, self.protocols(plan)[0], count)
                else:
                    routed = self._class_phases(kind, group, nbytes, algorithm, count)
                    if routed is None:
                        plan, protocol = self.choose(kind, group, nbytes, algorithm)
                        routed = self._route_plan(plan, protocol, count)
                self._phases_cache[key] = routed
        return routed

    def _remember(self, ident: tuple, groups: object, matrix: object, routed: object) -> None:
        """Keep ``routed`` under ``ident`` for lookups by identity (see ``_by_identity``)."""
        if len(self._by_identity) >= _IDENTITY_ENTRIES:
            self._by_identity.clear()
        self._by_identity[ident] = (groups, matrix, routed)

    def _bulk(self, kind: str, group: tuple[int, ...], nbytes: float, algorithm: str,
              matrix: tuple | None) -> bool:
        """Whether this collective runs as a bulk all-to-all (:mod:`simulator.bulk_alltoall`): an all_to_all
        under ECMP routing over at least two ranks with ``all_to_all: bulk`` (alltoallv too), or with ``auto``
        a uniform one over at least ``BULK_ALL_TO_ALL_RANKS`` ranks or an alltoallv whose ranks' NICs hang off
        one switch (:func:`~simulator.bulk_alltoall.under_one_switch`: exact there)."""
        mode = self.config.all_to_all
        if kind != "all_to_all" or self._spray or len(group) < 2 or algorithm not in ("auto", "direct"):
            return False
        if matrix is not None:
            chosen = mode == "bulk" or (mode == "auto" and self._one_switch(group))
            return chosen and any(any(row) for row in matrix)
        return nbytes > 0 and (mode == "bulk" or (mode == "auto" and len(group) >= BULK_ALL_TO_ALL_RANKS))

    def _one_switch(self, group: tuple[int, ...]) -> bool:
        """Whether no route between two members of ``group`` crosses a switch-to-switch link: their NICs hang
        off one switch (:func:`~simulator.bulk_alltoall.under_one_switch`), or, under PXN, every transfer
        keeps to the destination's rail and its rail leaf joins both servers (a pod of a rail-optimized
        fabric). Then only NIC and NVLink ports bind and bulk takes what one flow per pair takes (tested on a
        rail pod, skewed and uniform). Kept per group."""
        out = self._one_switch_groups.get(group)
        if out is None:
            out = under_one_switch(self.cluster, group)
            if not out and self.router.pxn:
                between = self._between_switches
                if between is None:  # (links whose two ends are switches: neither GPU, NIC nor NVSwitch)
                    kind = self.cluster.graph.nodes
                    ends = ("gpu", "nic", "nvswitch")
                    between = self._between_switches = np.array(
                        [kind[u]["kind"] not in ends and kind[v]["kind"] not in ends for u, v in self.links])
                members = np.asarray(group, dtype=np.int64)
                src, dst = np.repeat(members, len(members)), np.tile(members, len(members))
                keep = src != dst
                blocks = self.router.route_blocks(self.cluster.gpus, src[keep], dst[keep],
                                                  np.zeros(int(keep.sum()), dtype=np.int64))
                out = not any(between[block].any() for _where, block in blocks)
            self._one_switch_groups[group] = out
        return out

    def _tree_correction(self, plan: Plan, protocol: str) -> float:
        """:func:`~simulator.nccl.tree_correction` of ``plan`` if it is a tree all-reduce under NCCL's model, else
        1: the fraction of its bandwidth it reaches."""
        if plan.algorithm != "tree" or plan.kind != "all_reduce" or not self.config.nccl_latency:
            return 1.0
        return tree_correction(protocol, plan.nbytes)

    def _route_plan(self, plan: Plan, protocol: str, count: int = 1) -> tuple[tuple[tuple, ...], ...]:
        """Flow specs of ``plan``: wire bytes are the payload over the protocol's bandwidth factor (an LL
        line carries 4 data bytes in 8); the base latency is paid once, by the first phase. A tree
        all-reduce that reaches only a fraction ``c`` of its bandwidth (:meth:`_tree_correction`) pays the
        time its bytes lose to that, ``(1 - c)`` of its contention-free bandwidth term over ``c``, with its
        base latency: its flows carry their own bytes (the links' byte counts stay true), and uncontended it
        takes :meth:`estimate` exactly. Priced without contention, the extra time does not stretch when the
        tree's links are shared (8 concurrent trees at ``c`` 0.8 read 1.10x the uncorrected bandwidth term, 1
        alone 1.25x): a flow's rate cap would be exact there, which the flow network has not."""
        costs = self._costs(plan, protocol)
        factor = BANDWIDTH_FACTOR[protocol]
        correction = self._tree_correction(plan, protocol)
        if correction != 1.0:
            totals, idle = self._cached_estimates(plan)
            i = self.protocols(plan).index(protocol)
            costs = (costs[0] + (totals[i] - idle[i]) * (1.0 - correction), costs[1], costs[2])
        grouped = self.config.all_to_all != "per_pair" and plan.kind == "all_to_all"
        a2a = self.all_to_all_factor if plan.kind == "all_to_all" else 1.0
        servers = self._servers
        # each transfer's (links, largest hop latency, hops): kept per skeleton unless grouped (a wave declares its
        # merged links to the network afresh)
        skeleton = self._skeleton(plan) if not grouped else [None, None]
        transfers = skeleton[1]
        if transfers is None:
            last = self._last_routed
            routed = iter(last[1] if last is not None and last[0] is plan.phases else
                          self._hops([(s, d, t.label) for phase in plan.phases for t in phase for s, d in t.hops]))
            transfers = skeleton[1] = [self._transfer(list(islice(routed, len(t.hops))), tuple(t.hops))
                                       for phase in plan.phases for t in phase]
        step_latency = self._step_latency
        routes = iter(transfers)
        out = []
        for i, phase in enumerate(plan.phases):
            base = count * costs[0] if i == 0 else 0.0
            specs = []
            for t in phase:
                links, phys, n_hops = next(routes)
                # (what _latency gives, from the hops looked up once rather than looked up again)
                latency = base + count * step_latency(t, costs, phys)
                f = factor * a2a if a2a != 1.0 and servers[t.hops[0][0]] != servers[t.hops[0][1]] else factor
                specs.append((links, count * t.nbytes / f, latency, count * t.nbytes * n_hops))
            if grouped:
                # A wave: the transfers that start at one instant (equal latency), NVLink and network apart;
                # "grouped" also needs equal sizes, "proportional" lets members of unequal sizes share.
                equal = self.config.all_to_all != "proportional"  # bulk: as grouped where it does not apply
                # (and, under spray, the same number of paths: members share one rate)
                spread = self.spread
                specs = self.group(specs, [((s[1], s[3]) if equal else None, s[2],
                                            servers[t.hops[0][0]] != servers[t.hops[0][1]], spread(s[0]))
                                           for s, t in zip(specs, phase)])
            out.append(tuple(specs))
        return tuple(out)

    def group(self, specs: list[tuple], keys: list) -> list[tuple]:
        """Flow specs with equal ``keys`` merged into one flow each (see :class:`NetworkConfig`
        ``all_to_all``): over the concatenation of the members' links, moving the largest member's bytes,
        each member's links weighted by its bytes over that largest (so every member moves its own bytes
        and all finish together), after the latest member's latency, carrying the members' payload."""
        groups: dict = {}
        for spec, key in zip(specs, keys):
            members = groups.get(key)
            if members is None:
                groups[key] = [spec]
            else:
                members.append(spec)
        out = []
        network, pairs = self.network, self._pairs
        weights_of, members_of = network.weights_of, network.members_of
        for members in groups.values():
            if len(members) == 1:
                out.append(members[0])
                continue
            # (lists, not generators: the same values in the same order, so the same max and sum)
            wire = max([m[1] for m in members])
            latency = max([m[2] for m in members])
            payload = sum([m[3] for m in members])
            arrays = [m[0] for m in members]
            links = np.concatenate(arrays)
            inner = list(map(weights_of, arrays))
            hops: list = []
            shares: list = []
            for m in members:
                entry = self._pair_entry(m[0])
                member_hops = entry[1]
                member_shares = entry[2] if len(entry) > 2 else None
                hops.extend(member_hops)
                part = m[3] / payload if payload > 0 else 1.0 / len(members)
                if member_shares is None:
                    shares.extend([part / len(member_hops)] * len(member_hops))
                else:
                    shares.extend(part * x for x in member_shares)
            weights = None
            if any(m[1] != wire for m in members) or any(w is not None for w in inner):
                weights = np.concatenate([np.full(len(m[0]), m[1] / wire) if w is None else w * (m[1] / wire)
                                          for m, w in zip(members, inner)])
            network.declare(links, sum(map(members_of, arrays)), weights)
            pairs[id(links)] = (links, tuple(hops), tuple(shares))
            out.append((links, wire, latency, payload))
        return out

    def replicated_phases(self, kind: str, groups: list[tuple[int, ...]], nbytes: float | tuple[float, ...],
                          algorithm: str = "auto", count: int = 1, matrix: tuple[tuple[float, ...], ...] | None = None
                          ) -> tuple[tuple[tuple, ...], ...] | None:
        """The flows of one collective run at once over every group of ``groups`` (the replicas of a
        representative's collective): one phase of every replica's flows, or None when some replica's
        plan has several phases (then each runs its own :meth:`phases`). ``nbytes``: every group's size, or
        one size per group (not an all_to_all: a representative's lanes of unequal sizes,
        ``Collective.lane_bytes``; each group planned at its own).

        Grouped all-to-alls (``all_to_all: grouped``) also merge the replicas' corresponding flows (equal
        position, bytes and latency: the same wave of every replica) into one flow each, on the flow model
        only (the contention-free model keeps them apart, as :meth:`replica_send_specs` does). Cached.
        """
        ident = ("replicated", kind, id(groups), nbytes, algorithm, count, id(matrix))
        hit = self._by_identity.get(ident)
        if hit is not None and hit[0] is groups and hit[1] is matrix:
            return hit[2]
        key = ("replicated", kind, tuple(groups), nbytes, algorithm, count, matrix)
        routed = self._phases_cache.get(key, _UNSET)
        if routed is not _UNSET:
            self._remember(ident, groups, matrix, routed)
            return routed
        plans = None
        sizes = nbytes if isinstance(nbytes, tuple) else None
        if (sizes is None and matrix is None and kind != "all_to_all" and not self._spray
                and len(groups) >= _LANES_MIN):
            plans = self._lane_phases(kind, groups, nbytes, algorithm, count)
        if plans is None:
            plans = [self.phases(kind, g, size, algorithm, count, matrix)
                     for g, size in zip(groups, sizes or repeat(nbytes))]
        if not all(len(p) == 1 for p in plans):
            routed = None
        else:
            specs = [s for p in plans for s in p[0]]
            if (kind == "all_to_all" and self.config.all_to_all != "per_pair" and len(plans) > 1
                    and self.config.model == "flow" and not self._bulk(kind, groups[0], nbytes, algorithm, matrix)):
                spread = self.spread
                specs = self.group(specs, [(i, s[1], s[2], spread(s[0])) for p in plans for i, s in enumerate(p[0])])
            routed = (tuple(specs),)
        self._phases_cache[key] = routed
        return routed

    def _lane_phases(self, kind: str, groups: list[tuple[int, ...]], nbytes: float, algorithm: str,
                     count: int) -> list[tuple[tuple[tuple, ...], ...]] | None:
        """:meth:`phases` of every group of ``groups`` (the lanes of one collective: a representative's TP
        group in each of its 1,024 DP replicas), each class of isomorphic groups planned and estimated
        once, on its first group, and relabelled onto the others; or None (groups too large to be worth
        it, or plans of many hops), and then the caller plans every group itself.

        Two groups are isomorphic when their ranks share servers in the same pattern as the first
        group's (every candidate algorithm's plan is then the first group's with ranks substituted: an
        algorithm reads only which members share a server) and the routes of all those plans' hops,
        concatenated in one fixed order, have the same lengths, repeat links at the same positions and
        cross links of the same usable capacity and latency, entry by entry. Then every candidate's shape
        (:meth:`_plan_shape`) is the same, so :meth:`choose` picks the same algorithm and protocol, and
        every flow has the same bytes, latency and payload over the substituted routes: exact. A group
        in a class of its own (a degraded link, another server pattern) is planned by :meth:`phases`.
        """
        n = len(groups[0])
        if n < 2 or n > _LANE_RANKS or any(len(g) != n for g in groups):
            return None
        hop_ids = self._hop_columns(kind, groups[0], nbytes, algorithm)  # (src position, dst position, label) -> column
        if hop_ids is None:
            return None
        ps, pd, lab = (np.array(c, dtype=np.int64) for c in zip(*hop_ids))
        G = np.array(groups, dtype=np.int64)
        src, dst = G[:, ps], G[:, pd]
        keys = list(zip(src.ravel().tolist(), dst.ravel().tolist(), np.broadcast_to(lab, src.shape).ravel().tolist()))
        arrays = [h[0] for h in self._hops(keys)]
        lanes, width = G.shape[0], len(hop_ids)
        lengths = np.fromiter(map(len, arrays), dtype=np.int64, count=len(arrays)).reshape(lanes, width)
        if self._server_array is None:
            self._server_array = np.array(self._servers, dtype=np.int64)
        S = self._server_array[G]
        pattern = ((S[:, :, None] == S[:, None, :]) == (S[0][:, None] == S[0][None, :])).all(axis=(1, 2))
        # classes: equal route lengths, then equal link repetitions, capacities and latencies
        by_lengths: dict[bytes, list[int]] = {}
        for j in np.flatnonzero(pattern).tolist():
            by_lengths.setdefault(lengths[j].tobytes(), []).append(j)
        classes: dict[bytes, list[int]] = {}
        for prefix, members in by_lengths.items():
            E = np.concatenate([arrays[j * width + c] for j in members for c in range(width)]).reshape(len(members), -1)
            sig = np.concatenate([_first_occurrence(E).view(np.uint8), self.usable_capacity[E].view(np.uint8),
                                  self.latency[E].view(np.uint8)], axis=1)
            for j, row in zip(members, sig):
                classes.setdefault(prefix + row.tobytes(), []).append(j)
        out: list = [None] * lanes
        pairs, phases_cache, auto = self._pairs, self._phases_cache, self._auto_cache
        src_l, dst_l = src.tolist(), dst.tolist()
        for members in classes.values():
            t0 = members[0]
            gt = groups[t0]
            routed = out[t0] = self.phases(kind, gt, nbytes, algorithm, count)
            if len(routed) != 1:
                continue
            plan, _protocol = self.choose(kind, gt, nbytes, algorithm)
            where = {r: i for i, r in enumerate(gt)}
            template = []
            for t, spec in zip(plan.phases[0], routed[0]):
                cols = [hop_ids.get((where[a], where[b], t.label)) for a, b in t.hops]
                if None in cols:  # a hop of no candidate's plan: plan the class group by group
                    template = None
                    break
                template.append((cols, spec[1:]))
            if template is None:
                continue
            choice = auto.get((kind, gt, nbytes, algorithm))
            for j in members[1:]:
                row = arrays[j * width:(j + 1) * width]
                srow, drow = src_l[j], dst_l[j]
                specs = []
                for cols, rest in template:
                    if len(cols) == 1:
                        links = row[cols[0]]
                    else:
                        links = np.concatenate([row[c] for c in cols])
                        pairs[id(links)] = (links, tuple([(srow[c], drow[c]) for c in cols]))
                    specs.append((links, *rest))
                g = groups[j]
                routed = out[j] = (tuple(specs),)
                phases_cache[(kind, g, nbytes, algorithm, count, None)] = routed
                if choice is not None:
                    auto[(kind, g, nbytes, algorithm)] = choice
        for j, g in enumerate(groups):
            if out[j] is None:
                out[j] = self.phases(kind, g, nbytes, algorithm, count)
        return out

    def run_phases(self, phases: tuple[tuple[tuple, ...], ...], traffic_class: str,
                   on_done: Callable[[], None]) -> None:
        """Run routed ``phases`` (see :meth:`phases`) one after another; call ``on_done()`` after the last."""
        if not phases:
            self.env.timeout(0).callbacks.append(lambda _ev: on_done())
            return
        if len(phases) == 1:  # (what a _PlanRun does for one phase: its end is the plan's)
            self.network.start_flows(phases[0], traffic_class, on_done)
            return
        _PlanRun(self.network, phases, traffic_class, on_done).next()

    def _p2p_latency(self, src: int, dst: int, nbytes: float) -> tuple[float, float]:
        """``(software latency, bandwidth factor)`` of a point-to-point transfer (NCCL send/recv)."""
        if not self.config.nccl_latency:
            return self.config.step_latency_s, 1.0
        cross = self._servers[src] != self._servers[dst]
        protocol = p2p_protocol(nbytes, cross)
        base, intra, inter = step_latencies("direct", protocol, cross)
        return base + (inter if cross else intra), BANDWIDTH_FACTOR[protocol]

    def send(self, src: int, dst: int, nbytes: float, traffic_class: str, label: int = 0) -> Event:
        """Point-to-point transfer from rank ``src`` to rank ``dst``."""
        links, nbytes_wire, latency, payload = self.send_spec(src, dst, nbytes, label)
        return self.network.transfer(links, nbytes_wire, latency, traffic_class, payload)

    def send_spec(self, src: int, dst: int, nbytes: float, label: int = 0) -> tuple:
        """The ``(links, nbytes, latency_s, payload_bytes)`` flow of a point-to-point transfer."""
        links, lat = self._hop(src, dst, label)
        sw, factor = self._p2p_latency(src, dst, nbytes)
        latency = max(sw, lat) if self.config.nccl_latency else sw + lat
        return (links, nbytes / factor, latency, nbytes)

    def send_specs(self, srcs: tuple[int, ...], dsts: tuple[int, ...], nbytes: float, label: int = 0
                   ) -> tuple[tuple, ...]:
        """:meth:`send_spec` of every pair ``(srcs[i], dsts[i])`` (the replicas of one send), as a tuple.

        The software latency and protocol of a send depend only on its size and whether it leaves its
        server, so they are looked up twice at most, not once per pair."""
        servers = self._servers
        nccl = self.config.nccl_latency
        costs: dict[bool, tuple[float, float]] = {}
        out = []
        routed = self._hops([(src, dst, label) for src, dst in zip(srcs, dsts)])
        for src, dst, (links, lat) in zip(srcs, dsts, routed):
            cross = servers[src] != servers[dst]
            cost = costs.get(cross)
            if cost is None:
                cost = costs[cross] = self._p2p_latency(src, dst, nbytes)
            sw, factor = cost
            latency = (sw if sw >= lat else lat) if nccl else sw + lat
            out.append((links, nbytes / factor, latency, nbytes))
        return tuple(out)

    def replica_send_specs(self, srcs: tuple[int, ...], dsts: tuple[int, ...], nbytes: float) -> tuple[tuple, ...]:
        """The flows of a representative's send that stands for the sends ``(srcs[i], dsts[i])`` of its
        replicas, ``nbytes`` of payload each (connection label 0, as every pipeline send): :meth:`send_specs`,
        those with equal wire bytes and latency merged into one flow under ``replica_sends: merged`` on the flow
        model (:meth:`group`: every replica's links, each moving its own ``nbytes``, all at one rate; see
        :class:`NetworkConfig`). The contention-free model keeps them apart: a merged flow would make the
        replicas share links that the analytic model lets each of them use in full."""
        specs = self.send_specs(srcs, dsts, nbytes)
        if len(specs) > 1 and self.config.replica_sends == "merged" and self.config.model == "flow":
            # replicas of equal wire bytes and latency only (a pair on NVLink and one across servers, or under
            # spray pairs of unlike path counts, would otherwise share a flow at unlike weights)
            spread = self.spread
            return tuple(self.group(list(specs), [(s[1], s[2], spread(s[0])) for s in specs]))
        return specs


def _template(plan: Plan, routed: tuple[tuple[tuple, ...], ...], columns: dict[tuple[int, int, int], int]
              ) -> tuple | None:
    """``routed`` (:meth:`Fabric._route_plan` of ``plan``) as a template for the groups of ``plan.group``'s class
    (:meth:`Fabric._class_phases`): per phase, per transfer, ``(its hops as (src position, dst position), its
    label, its flow but the links)``; None if a hop of the plan is not among the class's ``columns``."""
    where = {r: i for i, r in enumerate(plan.group)}
    out = []
    for phase, specs in zip(plan.phases, routed):
        transfers = []
        for t, spec in zip(phase, specs):
            hops = tuple([(where[a], where[b]) for a, b in t.hops])
            if any((i, j, t.label) not in columns for i, j in hops):
                return None
            transfers.append((hops, t.label, spec[1:]))
        out.append(tuple(transfers))
    return tuple(out)


def _first_occurrence(rows: np.ndarray) -> np.ndarray:
    """For every entry of every row, the position of the first entry of its row equal to it: two rows
    with equal results repeat values at the same positions (relabelled in order of first appearance,
    they are the same sequence)."""
    width = rows.shape[1]
    order = np.argsort(rows, axis=1, kind="stable")
    ordered = np.take_along_axis(rows, order, axis=1)
    start = np.ones(ordered.shape, dtype=bool)
    start[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    # stable: each run of equal values begins with its smallest original position
    run_start = np.maximum.accumulate(np.where(start, np.arange(width), 0), axis=1)
    out = np.empty_like(order)
    np.put_along_axis(out, order, np.take_along_axis(order, run_start, axis=1), axis=1)
    return out


class _PlanRun:
    """Runs the phases of one routed plan back to back (no SimPy event of its own)."""

    __slots__ = ("network", "phases", "i", "traffic_class", "on_done")

    def __init__(self, network, phases: tuple, traffic_class: str, on_done: Callable[[], None]) -> None:
        self.network = network
        self.phases = phases
        self.i = 0
        self.traffic_class = traffic_class
        self.on_done = on_done

    def next(self) -> None:
        i = self.i
        if i == len(self.phases):
            self.on_done()
            return
        self.i = i + 1
        self.network.start_flows(self.phases[i], self.traffic_class, self.next)
