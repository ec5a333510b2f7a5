"""Flow-level networks behind one narrow interface.

``network.transfer(links, nbytes, latency_s, traffic_class)`` starts a
transfer and returns a SimPy event that fires when its last byte arrives.
Two backends stand behind it:

:class:`FlowNetwork`
    Congestion-aware. After ``latency_s`` the flow joins the fabric; its rate
    is its max-min fair share of every link it crosses (progressive filling,
    :mod:`simulator.maxmin`), recomputed only when a flow starts or ends and
    at most once per instant (all same-time starts and ends are batched).
    Event count grows with flows, never with bytes.

:class:`AnalyticNetwork`
    Contention-free closed form: ``latency + nbytes / bottleneck``. Used as an
    independent reference in tests and for quick estimates.

Both record bytes and busy time per directed link, and bytes per traffic
class per link, so results can say where on the fabric every byte went.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import simpy
from simpy.events import Event

from .maxmin import max_min_rates

_LATE_PRIORITY = 2  # after every NORMAL (1) event of the same instant
_REL_TIME_EPS = 1e-12


class _LateEvent(Event):
    """An event that fires at the current instant after all NORMAL events.

    # NOTE: initialisation inlined as in simpy.events.Timeout, with a lower
    # priority so that every flow start and end of one instant is batched
    # into a single rate recomputation.
    """

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self.callbacks = []
        self._value = None
        self._ok = True
        env.schedule(self, _LATE_PRIORITY, 0)


@dataclass(slots=True, eq=False)
class Flow:
    """A transfer in its bandwidth phase. ``links`` may repeat a link id (crossed twice)."""

    links: np.ndarray
    nbytes: float
    traffic_class: str
    done: Event
    start_s: float


class LinkLedger:
    """Per-link accounting shared by both backends: bytes, busy time, bytes per class."""

    def __init__(self, num_links: int) -> None:
        self.num_links = num_links
        self.bytes = np.zeros(num_links)
        self.busy_s = np.zeros(num_links)
        self.bytes_by_class: dict[str, np.ndarray] = {}
        self.flows_completed = 0
        self.payload_bytes_by_class: dict[str, float] = {}

    def record(self, flow: Flow, payload_bytes: float) -> None:
        np.add.at(self.bytes, flow.links, flow.nbytes)
        per_class = self.bytes_by_class.get(flow.traffic_class)
        if per_class is None:
            per_class = self.bytes_by_class[flow.traffic_class] = np.zeros(self.num_links)
        np.add.at(per_class, flow.links, flow.nbytes)
        self.payload_bytes_by_class[flow.traffic_class] = (
            self.payload_bytes_by_class.get(flow.traffic_class, 0.0) + payload_bytes)
        self.flows_completed += 1


class FlowNetwork:
    """Congestion-aware flow-level network with max-min fair sharing.

    Parameters
    ----------
    env : simpy.Environment
    capacity : numpy.ndarray
        Bytes/s of every directed link id.
    """

    def __init__(self, env: simpy.Environment, capacity: np.ndarray) -> None:
        self.env = env
        self.capacity = np.asarray(capacity, dtype=float)
        self.ledger = LinkLedger(len(self.capacity))
        self._flows: list[Flow] = []
        self._payload: list[float] = []
        self._remaining = np.zeros(0)
        self._rate = np.zeros(0)
        self._finish = np.zeros(0)
        self._loaded_links = np.zeros(0, dtype=np.int64)
        self._arrivals: list[tuple[Flow, float]] = []
        self._t_last = 0.0
        self._update_pending = False
        self._wakeup_version = 0
        self.rate_solves = 0

    # ----------------------------------------------------------- interface
    def transfer(self, links: np.ndarray, nbytes: float, latency_s: float, traffic_class: str,
                 payload_bytes: float | None = None) -> Event:
        """Move ``nbytes`` over every link in ``links`` at one common rate.

        ``links`` is an array of link ids (a repeated id means the flow crosses
        that link more than once). ``payload_bytes`` is what the flow counts as
        sent by GPUs (default ``nbytes``). Returns an event that succeeds at the
        arrival of the last byte.
        """
        done = Event(self.env)
        flow = Flow(links, float(nbytes), traffic_class, done, self.env.now)
        payload = float(nbytes) if payload_bytes is None else float(payload_bytes)
        if latency_s > 0:
            self.env.timeout(latency_s).callbacks.append(lambda _ev: self._arrive(flow, payload))
        else:
            self._arrive(flow, payload)
        return done

    # ------------------------------------------------------------ internals
    def _arrive(self, flow: Flow, payload: float) -> None:
        if flow.nbytes <= 0 or len(flow.links) == 0:
            self.ledger.record(flow, payload)
            flow.done.succeed()
            return
        self._arrivals.append((flow, payload))
        self._request_update()

    def _request_update(self) -> None:
        if not self._update_pending:
            self._update_pending = True
            _LateEvent(self.env).callbacks.append(self._update)

    def _wakeup(self, version: int) -> None:
        if version == self._wakeup_version:
            self._request_update()

    def _update(self, _event: Event | None = None) -> None:
        """Advance every flow to now, retire finished ones, admit arrivals, re-rate."""
        self._update_pending = False
        now = self.env.now
        dt = now - self._t_last
        self._t_last = now
        changed = bool(self._arrivals)
        if self._flows:
            if dt > 0:
                self.ledger.busy_s[self._loaded_links] += dt
                self._remaining = self._remaining - self._rate * dt
            done = self._finish <= now * (1 + _REL_TIME_EPS) + 1e-18
            if done.any():
                changed = True
                keep = ~done
                for i in np.flatnonzero(done):
                    flow = self._flows[i]
                    self.ledger.record(flow, self._payload[i])
                    flow.done.succeed()
                self._flows = [f for f, k in zip(self._flows, keep) if k]
                self._payload = [p for p, k in zip(self._payload, keep) if k]
                self._remaining = self._remaining[keep]
        if not changed:
            return
        if self._arrivals:
            self._flows.extend(f for f, _ in self._arrivals)
            self._payload.extend(p for _, p in self._arrivals)
            self._remaining = np.concatenate([self._remaining, [f.nbytes for f, _ in self._arrivals]])
            self._arrivals = []
        self._rerate(now)

    def _rerate(self, now: float) -> None:
        flows = self._flows
        self._wakeup_version += 1
        if not flows:
            self._rate = np.zeros(0)
            self._finish = np.zeros(0)
            self._loaded_links = np.zeros(0, dtype=np.int64)
            return
        entry_link = np.concatenate([f.links for f in flows])
        entry_flow = np.repeat(np.arange(len(flows)), [len(f.links) for f in flows])
        self._rate = max_min_rates(entry_flow, entry_link, self.capacity, len(flows))
        self.rate_solves += 1
        self._loaded_links = np.unique(entry_link)
        self._finish = now + self._remaining / self._rate
        version = self._wakeup_version
        delay = max(float(self._finish.min()) - now, 0.0)
        self.env.timeout(delay).callbacks.append(lambda _ev: self._wakeup(version))


class AnalyticNetwork:
    """Contention-free reference: each transfer takes ``latency + nbytes / bottleneck``.

    The bottleneck of a flow that crosses link ``l`` ``k`` times is
    ``min_l capacity[l] / k``. Flows never slow each other down.
    """

    def __init__(self, env: simpy.Environment, capacity: np.ndarray) -> None:
        self.env = env
        self.capacity = np.asarray(capacity, dtype=float)
        self.ledger = LinkLedger(len(self.capacity))
        self.rate_solves = 0

    def transfer(self, links: np.ndarray, nbytes: float, latency_s: float, traffic_class: str,
                 payload_bytes: float | None = None) -> Event:
        """Same contract as :meth:`FlowNetwork.transfer`."""
        done = Event(self.env)
        flow = Flow(links, float(nbytes), traffic_class, done, self.env.now)
        if len(links) and nbytes > 0:
            ids, mult = np.unique(links, return_counts=True)
            rate = float((self.capacity[ids] / mult).min())
            duration = latency_s + nbytes / rate
            self.ledger.busy_s[ids] += nbytes / rate
        else:
            duration = latency_s
        payload = float(nbytes) if payload_bytes is None else float(payload_bytes)

        def finish(_ev: Event) -> None:
            self.ledger.record(flow, payload)
            done.succeed()

        self.env.timeout(duration).callbacks.append(finish)
        return done
