"""The cluster as the engine sees it: link arrays, routes, a network backend.

:class:`Fabric` maps ranks to GPUs, plans collectives (resolving ``auto``),
turns each planned transfer into a set of physical links and hands it to the
network backend. It is the only place where logical ranks meet physical
routes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import simpy
from simpy.events import Event

from topologies.cluster import Cluster

from .collectives import AUTO_CANDIDATES, COLLECTIVE_ALGORITHMS, CollectiveError, Plan, plan_collective
from .network import AnalyticNetwork, FlowNetwork
from .routing import Router

NETWORK_MODELS = ("flow", "analytic")


@dataclass(frozen=True)
class NetworkConfig:
    """Knobs of the communication model.

    Attributes
    ----------
    model : str
        ``"flow"`` (max-min fair sharing, default) or ``"analytic"`` (no contention).
    step_latency_s : float
        Software/protocol latency paid once per algorithm step on top of the
        route's link latencies (seconds). Default 2 µs: the order of NCCL's
        per-step base latency for the Simple protocol on NVLink/IB.
    fidelity : str
        ``"fast"``: one pipelined transfer per ring; ``"full"``: every ring step.
    seed : int
        ECMP hash seed.
    bandwidth_efficiency : float
        Fraction of every link's bandwidth that transfers can use, in (0, 1].
        Default 1: collectives run at link rate, the α-β closed forms exactly.
        NCCL's protocols and channel limits leave part of a link idle: nccl-tests
        busbw of large all-reduces on one DGX node is typically ~75–85 % of the
        NVLink rate, so 0.8 is a reasonable value to study; it is a knob, not a
        default, until it is measured per fabric.
    """

    model: str = "flow"
    step_latency_s: float = 2e-6
    fidelity: str = "fast"
    seed: int = 0
    bandwidth_efficiency: float = 1.0

    def __post_init__(self) -> None:
        if self.model not in NETWORK_MODELS:
            raise ValueError(f"network.model: {self.model!r} unknown; valid: {', '.join(NETWORK_MODELS)}")
        if not self.step_latency_s >= 0:
            raise ValueError(f"network.step_latency_s: must be >= 0, got {self.step_latency_s}")
        if self.fidelity not in ("fast", "full"):
            raise ValueError(f"fidelity: {self.fidelity!r} unknown; valid: fast, full")
        if not 0 < self.bandwidth_efficiency <= 1:
            raise ValueError(f"network.bandwidth_efficiency: must be in (0, 1], got {self.bandwidth_efficiency}")


class Fabric:
    """Ranks, routes and a network backend for one simulation run."""

    def __init__(self, env: simpy.Environment, cluster: Cluster, config: NetworkConfig | None = None) -> None:
        self.env = env
        self.cluster = cluster
        self.config = config or NetworkConfig()
        graph = cluster.graph
        self.links: list[tuple] = list(graph.edges)
        self.link_index = {e: i for i, e in enumerate(self.links)}
        self.capacity = np.array([graph.edges[e]["bandwidth"] for e in self.links], dtype=float)
        self.latency = np.array([graph.edges[e]["latency"] for e in self.links], dtype=float)
        self.tier = np.array([graph.edges[e]["tier"] for e in self.links])
        self.router = Router(graph, self.link_index, self.config.seed)
        backend = FlowNetwork if self.config.model == "flow" else AnalyticNetwork
        # What transfers can use; ``capacity`` stays the physical rate that results report against.
        self.usable_capacity = self.capacity * self.config.bandwidth_efficiency
        self.network = backend(env, self.usable_capacity)
        self._servers = [graph.nodes[g]["server"] for g in cluster.gpus]
        self._auto_cache: dict[tuple, str] = {}
        self._route_latency: dict[tuple, tuple[np.ndarray, float]] = {}
        self._phases_cache: dict[tuple, tuple] = {}
        self.collectives_run = 0

    # ------------------------------------------------------------------ ranks
    def server_of(self, rank: int) -> int:
        return self._servers[rank]

    def route(self, src: int, dst: int, label: int = 0) -> np.ndarray:
        """Link ids from rank ``src``'s GPU to rank ``dst``'s GPU for connection ``label``."""
        gpus = self.cluster.gpus
        return self.router.route(gpus[src], gpus[dst], label)

    def _hop(self, src: int, dst: int, label: int) -> tuple[np.ndarray, float]:
        key = (src, dst, label)
        hop = self._route_latency.get(key)
        if hop is None:
            links = self.route(src, dst, label)
            hop = self._route_latency[key] = (links, float(self.latency[links].sum()))
        return hop

    # ------------------------------------------------------------------ plans
    def plan(self, kind: str, group: tuple[int, ...], nbytes: float, algorithm: str = "auto") -> Plan:
        """Plan a collective; ``auto`` picks the algorithm with the lowest contention-free estimate."""
        if algorithm == "auto":
            key = (kind, group, nbytes)
            algorithm = self._auto_cache.get(key)
            if algorithm is None:
                algorithm = min(AUTO_CANDIDATES[kind],
                                key=lambda a: self.estimate(plan_collective(kind, group, nbytes, self.server_of, a)))
                self._auto_cache[key] = algorithm
        elif algorithm not in COLLECTIVE_ALGORITHMS:
            raise CollectiveError(f"algorithm: {algorithm!r} unknown; valid: {', '.join(COLLECTIVE_ALGORITHMS)}")
        return plan_collective(kind, group, nbytes, self.server_of, algorithm, self.config.fidelity)

    def estimate(self, plan: Plan) -> float:
        """Contention-free α-β time of ``plan`` in seconds, counting link sharing inside each phase."""
        total = 0.0
        alpha = self.config.step_latency_s
        for phase in plan.phases:
            routed = [[self._hop(s, d, t.label) for s, d in t.hops] for t in phase]
            load = np.zeros(len(self.capacity))
            for hops in routed:
                for links, _ in hops:
                    np.add.at(load, links, 1.0)
            worst = 0.0
            for t, hops in zip(phase, routed):
                links = np.concatenate([h[0] for h in hops])
                per_byte = float((load[links] / self.usable_capacity[links]).max())
                lat = t.steps * (alpha + max(h[1] for h in hops))
                worst = max(worst, lat + t.nbytes * per_byte)
            total += worst
        return total

    # -------------------------------------------------------------- execution
    def phases(self, kind: str, group: tuple[int, ...], nbytes: float, algorithm: str = "auto",
               count: int = 1, matrix: tuple[tuple[float, ...], ...] | None = None
               ) -> tuple[tuple[tuple, ...], ...]:
        """The routed flows of a collective: per phase, ``(links, nbytes, latency_s, payload_bytes)`` specs.

        ``matrix`` gives an all_to_all per-pair sizes (alltoallv, always ``direct``).
        Cached per ``(kind, group, nbytes, algorithm, count, matrix)``: plans and routes are pure functions of them.
        """
        key = (kind, group, nbytes, algorithm, count, matrix)
        routed = self._phases_cache.get(key)
        if routed is None:
            plan = (plan_collective(kind, group, nbytes, self.server_of, "direct", self.config.fidelity, matrix)
                    if matrix is not None else self.plan(kind, group, nbytes, algorithm))
            routed = self._phases_cache[key] = self._route_plan(plan, count)
        return routed

    def _route_plan(self, plan: Plan, count: int = 1) -> tuple[tuple[tuple, ...], ...]:
        alpha = self.config.step_latency_s
        out = []
        for phase in plan.phases:
            specs = []
            for t in phase:
                hops = [self._hop(s, d, t.label) for s, d in t.hops]
                links = hops[0][0] if len(hops) == 1 else np.concatenate([h[0] for h in hops])
                latency = count * t.steps * (alpha + max(h[1] for h in hops))
                specs.append((links, count * t.nbytes, latency, count * t.nbytes * len(hops)))
            out.append(tuple(specs))
        return tuple(out)

    def run_phases(self, phases: tuple[tuple[tuple, ...], ...], traffic_class: str,
                   on_done: Callable[[], None]) -> None:
        """Run routed ``phases`` (see :meth:`phases`) one after another; call ``on_done()`` after the last."""
        if not phases:
            self.env.timeout(0).callbacks.append(lambda _ev: on_done())
            return
        _PlanRun(self.network, phases, traffic_class, on_done).next()

    def send(self, src: int, dst: int, nbytes: float, traffic_class: str, label: int = 0) -> Event:
        """Point-to-point transfer from rank ``src`` to rank ``dst``."""
        links, lat = self._hop(src, dst, label)
        return self.network.transfer(links, nbytes, self.config.step_latency_s + lat, traffic_class)

    def send_spec(self, src: int, dst: int, nbytes: float, label: int = 0) -> tuple:
        """The ``(links, nbytes, latency_s, payload_bytes)`` flow of a point-to-point transfer."""
        links, lat = self._hop(src, dst, label)
        return (links, nbytes, self.config.step_latency_s + lat, nbytes)


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
