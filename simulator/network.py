"""Flow-level networks behind one narrow interface.

``network.transfer(links, nbytes, latency_s, traffic_class)`` starts a
transfer and returns a SimPy event that fires when its last byte arrives;
``network.start_flows(specs, traffic_class, on_done)`` starts several at once
and calls ``on_done()`` when the last of them has arrived (no event per flow:
the engine's fast path). Two backends stand behind it:

:class:`FlowNetwork`
    Congestion-aware. After ``latency_s`` the flow joins the fabric; its rate
    is its max-min fair share of every link it crosses (progressive filling,
    :mod:`simulator.maxmin`), recomputed only when a flow starts or ends and
    at most once per instant (all same-time starts and ends are batched).
    Re-rating is *incremental* and *local*:

    * a link is *tight* when the flows on it could together ask for more than
      its capacity (each flow asks at most its solo rate, the min over its
      links of capacity / crossings); a slack link can never saturate, so it
      constrains nobody and couples nobody (tolerance: 1e-9 of capacity);
    * only the connected components (through tight links) of the flows that
      started, and of the flows that shared a tight link with a flow that
      ended, are re-solved — max-min rates of the other components cannot
      change, so the allocation is the one a global solve gives;
    * when flows end, only flows at or above the lowest departed rate can
      change (progressive filling below that level is untouched): lower flows
      are held fixed and the search does not pass through them;
    * each component is solved over its tight links, every flow capped by its
      solo rate; a flow alone gets its solo rate without a solve, and a
      component of a shape already solved (same crossings, capacities and
      caps: the replicas of one collective) reuses those rates.

    Constraints that cannot matter are left out of components and problems,
    all exactly (:meth:`FlowNetwork._new_route`, :meth:`FlowNetwork._rerate`):

    * *dominated* links: every route seen that crosses link ``l`` also crosses
      a slower link ``d`` at least as often (a GPU's PCIe link behind its NIC
      port), so ``d``'s constraint implies ``l``'s;
    * *twin* links: every route seen crosses them equally often (or not at
      all) and their capacities are equal — one constraint, kept once (the
      NIC ports at one position in every server, under grouped all-to-all
      waves), and one flow state, kept by the class's representative (flows
      come onto and leave only the links they keep); classes are refined as
      routes appear;
    * *lazy* links: tight links that the last large solve including them left
      with 2% of their capacity to spare (ECMP-hashed spine links under an
      all-to-all on a 1:1 fabric); each solution is checked against their
      loads (kept up to date as rates change) and redone with the ones it
      would overload.

    Flows may stand for several transfers (:meth:`_NetworkBase.declare`): a
    *grouped* all-to-all wave (the transfers of one all-to-all that start at
    the same instant and move the same bytes, :class:`simulator.fabric.Fabric`)
    is one flow over all its members' links, a *weighted* route loading each
    member's links in proportion to its bytes (``proportional`` waves).
    A call whose links are idle is recorded and later calls of its shape on
    idle links are *replayed* from the recording (:meth:`FlowNetwork.start_flows`),
    made real if another flow comes onto their links first.

    Flows whose rows in every max-min problem are equal (same links that may
    bind, same crossings, same solo rate) always move at one rate: in a large
    component they are folded into an *aggregate* (:class:`_Agg`), one entity
    with a virtual clock whose members finish in order of their service
    targets (processor sharing), re-rated once per event instead of once per
    member. An aggregate is dissolved when a link under it changes its role.

    One late SimPy event per instant admits the flows whose latency has
    passed and retires the finished ones. Completions come from a heap of
    finish times (stale entries skipped), so an instant costs work
    proportional to the flows it touches, not to all active flows. Event
    count grows with flows, never with bytes. ``tests/test_flow_network.py``
    checks all of this against a global re-solve at every event, and the
    networks without twins, lazy links or replays.

:class:`AnalyticNetwork`
    Contention-free closed form: ``latency + nbytes / bottleneck``. Used as an
    independent reference in tests and for quick estimates.

Both record bytes and busy time per directed link, bytes per traffic class
per link, payload per route (for traffic matrices) and a log of every flow
rate change (for exact link bandwidth over time, :mod:`simulator.traffic`),
so results can say where on the fabric every byte went, and when.
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Callable, Sequence
from itertools import chain, compress
from operator import attrgetter, gt, itemgetter, lt, not_, truediv

import numpy as np
import simpy
from numpy import count_nonzero
from simpy.events import Event

from .maxmin import max_min_rates, max_min_rates_dense, max_min_rates_small

_INF = float("inf")
_LATE_PRIORITY = 2  # after every NORMAL (1) event of the same instant
TINY_FLOW_S = 1e-6
"""A flow that its bottleneck link alone moves in under 1 µs, and that with its call's other such flows needs
under 1 µs of each link it crosses, is latency-bound: it completes at its solo time and never enters max-min
sharing (its effect on any rate is below that 1 µs; :func:`_latency_bound`)."""
_REL_TIME_EPS = 1e-12
_SMALL_COMPONENT = 64  # flows; below this the pure-Python solver beats numpy's per-call overhead
_SMALL_LINKS = 256  # tight links; above this (grouped all-to-all flows cross hundreds) numpy wins again
_SOLVED_CACHE_ENTRIES = 2_000_000  # flows, links and crossings over all component shapes remembered (then cleared:
# ~150 MB at most)
_LONG_ROUTE = 48  # distinct links; routes this long (grouped all-to-all flows) keep numpy copies of them
_LONG_ROW = 16  # links that may be tight; a component search reuses what it found on rows this long (equal links)
_MEMO_SHAPES = 100_000  # call shapes remembered (then forgotten at once, with their trajectories)
_MEMO_ENTRIES = 2_000_000  # flows and rate changes over all recorded trajectories (then forgotten: ~200 MB)
_MEMO_RATE_CHANGES = 20_000  # a call whose flows change rate more often than this is not recorded
_LAZY_MIN_FLOWS = 32  # components at least this large mark their slack tight links lazy (see FlowNetwork._lazy)
_LAZY_SLACK = 0.02  # ... when at least this fraction of the link's capacity is left over
_LAZY_STRIKES = 2  # a link found overloaded this often is never made lazy again
_AGG_MIN = 16  # components of at least this many flows fold flows of equal rows into aggregates (see _Agg)
_FEW_LINKS = 24  # calls over at most this many distinct links check and mark them in Python, not numpy
_JOINT_UNIONS = 4096  # pairs of (session, joining call) links whose union is kept (FlowNetwork._attach)
_FEW_ENTRIES = 32  # replays of at most this many rate-log entries and busy intervals book them in Python
_FORESEE_FLOWS = 64  # calls of at most this many flows alone on their links are worked out at once (_foresee)
_FILL_SMALL = 64  # crossings (flow x link) up to which _fill works in Python rather than numpy
_JOIN_FLOWS = 8  # flows (of calls not yet done) up to which a call joins a replay; more go to the event loop
_JOIN_PARTS = 8  # calls not yet done a replay and the calls joining it may hold (then a call onto it makes it real)

FlowSpec = tuple  # (links: np.ndarray, nbytes: float, latency_s: float, payload_bytes: float)


class _LateEvent(Event):
    """An event that fires ``delay`` seconds from now, after every NORMAL event of that instant.

    The network's only kind of SimPy event: arrivals and completions of one
    instant are handled by one late event, so all same-time starts and ends
    are batched into a single rate recomputation.

    # NOTE: initialisation inlined as in simpy.events.Timeout, with a lower
    # priority so that it sorts after NORMAL events of the same time.
    """

    def __init__(self, env: simpy.Environment, delay: float, value: float) -> None:
        self.env = env
        self.callbacks = []
        self._value = value
        self._ok = True
        env.schedule(self, _LATE_PRIORITY, delay)


class _Crossings(dict):
    """A long route's crossings by link (``_Route._mult_of``) before anything has looked them up.

    The routes of latency-bound flows never need them (a tree over hundreds of hops for a 4-byte
    all-reduce, one per DP replica at 131,072 GPUs: a dict of every link of each took 4% of that step and
    much of its memory), so the dict is made when first needed: when a flow over the route joins max-min
    sharing (:meth:`FlowNetwork._call` calls :meth:`build`), or at the first look-up. :meth:`build` hands
    the plain dict ``dict(zip(ulinks, mults))`` to every route holding this object (routes of equal content
    share it: :meth:`_Route.like`), so the hot loops read a plain dict. Until then only ``[]`` and ``get``
    are answered (both build); nothing iterates a route's crossings."""

    __slots__ = ("_pending", "_holders", "_plain")

    def __init__(self, ulinks: tuple[int, ...], mults: tuple, holder: _Route) -> None:
        super().__init__()
        self._pending: tuple | None = (ulinks, mults)
        self._holders = [holder]
        self._plain: dict | None = None

    def hold(self, route: _Route) -> None:
        """``route`` holds this object too (it gets the plain dict when it is built)."""
        if self._plain is None:
            self._holders.append(route)
        else:
            route._mult_of = self._plain

    def build(self) -> dict:
        """The plain dict of crossings by link, now every holder's ``_mult_of``."""
        plain = self._plain
        if plain is None:
            plain = self._plain = dict(zip(*self._pending))
            for route in self._holders:
                route._mult_of = plain
            self._holders, self._pending = [], None
        return plain

    def __missing__(self, link: int):
        return self.build()[link]

    def get(self, link: int, default=None):
        return self.build().get(link, default)


class _Route:
    """Links of one route with their distinct ids and multiplicities (cached per links array).

    ``weights`` (optional, one per entry of ``links``): how much of the flow's rate each entry carries,
    for a flow that stands for several transfers of unequal sizes moving at rates in proportion to their
    bytes (a grouped alltoallv, :meth:`simulator.fabric.Fabric.phases`); a link's multiplicity is then the
    sum of its entries' weights. ``None``: every entry carries the whole rate (an entry per crossing).
    """

    __slots__ = ("links", "ulinks", "mults", "solo_rate", "demand", "_mult_of", "idx", "weights", "arrays",
                 "members", "cpairs", "cepoch", "wpairs", "lpairs", "larrays", "wepoch", "clinks", "wlinks",
                 "ckeep", "wflags", "klinks", "kdemand", "kmults", "kepoch", "told")

    def __init__(self, links: np.ndarray, capacity: list[float], idx: int = 0,
                 weights: np.ndarray | None = None, members: int = 1, known: tuple | None = None,
                 capacity_array: np.ndarray | None = None) -> None:
        self.links = links
        self.idx = idx  # position in its network's route list (the rate log names routes by it)
        self.weights = weights
        self.members = members  # point-to-point transfers one flow on this route stands for
        self.cpairs: tuple = ()  # (link, crossings) of the links that may be tight, as of network epoch cepoch
        self.cepoch = -1
        self.wpairs: tuple = ()  # cpairs of the links not lazy (network._lazy), as of network stamp wepoch
        self.clinks: tuple = ()  # the links of cpairs
        self.wlinks: tuple = ()  # the links of wpairs
        self.ckeep: list | None = None  # which links cpairs keeps (None: all), as last derived
        self.wflags: list | None = None  # which of clinks were lazy when wpairs and lpairs were last derived
        self.lpairs: tuple = ()  # cpairs of the lazy links, as of wepoch
        self.larrays: tuple | None = None  # lpairs as (link ids, crossings) arrays, made when first needed
        self.wepoch = -1
        self.kepoch = -1  # klinks, kdemand, kmults: as of network stamp kepoch (FlowNetwork._keep)
        # [whether the network has been told of these links] (FlowNetwork._call), one list shared by the routes
        # of equal content (like)
        self.told = [False]
        if (capacity_array is not None and weights is None and isinstance(links, np.ndarray) and links.ndim == 1
                and len(links) >= _LONG_ROUTE):
            # A long unweighted route (a pipelined ring or tree over hundreds of hops): what the cases below
            # give, found by array passes. The same values: np.unique's ids are the sorted distinct links, a
            # float64 min is the least capacity exactly, ``c / m`` and ``solo * m`` in float64 are the float
            # operations on the converted integer, as Python's are.
            ids, counts = np.unique(links, return_counts=True)
            n = len(ids)
            self.ulinks = tuple(ids.tolist())
            caps = capacity_array[ids]
            if n == len(links):
                self.mults = (1,) * n
                self.arrays = (ids, np.ones(n)) if n >= _LONG_ROUTE else None
                self.solo_rate = 0.0 + float(caps.min())
                self.demand = (self.solo_rate,) * n
                self._mult_of = None
            else:
                self.mults = tuple(counts.tolist())
                self.arrays = (ids, counts.astype(float)) if n >= _LONG_ROUTE else None
                self.solo_rate = 0.0 + float((caps / counts).min())
                self.demand = tuple((self.solo_rate * counts).tolist())
                self._mult_of = _Crossings(self.ulinks, self.mults, self)
            return
        listed = links.tolist() if weights is None and isinstance(links, np.ndarray) else None
        if listed is not None and listed and len(set(listed)) == len(listed):
            # Every link distinct (the common case): what the general case below gives, without its cost
            # (a crossing of 1 divides and multiplies exactly).
            self.ulinks = tuple(sorted(listed))
            self.mults = (1,) * len(listed)
            self.arrays = ((np.asarray(self.ulinks, dtype=links.dtype), np.ones(len(listed)))
                           if len(listed) >= _LONG_ROUTE else None)
            self.solo_rate = 0.0 + min(map(capacity.__getitem__, self.ulinks))
            self.demand = (self.solo_rate,) * len(listed)
            self._mult_of = None
            return
        elif known is not None:
            # ``(ulinks, mults)`` of strictly increasing weighted links, as the general case below finds them
            # (given by _Routes.get, which keeps them per links and per weights array)
            self.ulinks, self.mults = known
            self.arrays = (links, weights + 0.0) if len(links) >= _LONG_ROUTE else None
        else:
            entries = (links.tolist() if weights is not None and isinstance(links, np.ndarray) and links.ndim == 1
                       and len(weights) == len(links) else None)
            if entries and all(map(lt, entries, entries[1:])):
                # Strictly increasing links (a bulk all-to-all flow's, np.unique's own output): np.unique gives
                # them back as they are and bincount each weight alone, 0.0 + w, which ``weights + 0.0`` is
                # exactly (-0.0 too).
                ids, counts = links, weights + 0.0
                self.ulinks = tuple(entries)
            else:
                if weights is None:
                    ids, counts = np.unique(links, return_counts=True)
                else:
                    ids, inverse = np.unique(links, return_inverse=True)
                    counts = np.bincount(inverse, weights=weights, minlength=len(ids))
                self.ulinks = tuple(ids.tolist())
            self.mults = tuple(counts.tolist())
            self.arrays = (ids, np.asarray(counts, dtype=float)) if len(ids) >= _LONG_ROUTE else None
        # Max-min rate when the flow is alone on its links: progressive filling's first increment.
        # (m is an int or a float: ``c / m`` divides by it as ``c / float(m)`` does, exactly)
        self.solo_rate = (0.0 + min(map(truediv, map(capacity.__getitem__, self.ulinks), self.mults))
                          if self.ulinks else float("inf"))
        # What the flow can ever ask of each link: it never runs faster than ``solo_rate``.
        self.demand = tuple(map(self.solo_rate.__mul__, self.mults))
        self._mult_of = None if self.mults.count(1) == len(self.mults) else dict(zip(self.ulinks, self.mults))

    def like(self, links: np.ndarray, idx: int) -> _Route:
        """A route over ``links``, an array equal to this route's (same entries, weights and members): what
        ``_Route(links, ...)`` makes, without deriving it again (its derived tuples are shared, read only)."""
        route = _Route.__new__(_Route)
        route.links, route.idx, route.weights, route.members = links, idx, self.weights, self.members
        route.cpairs, route.cepoch, route.wpairs, route.lpairs, route.larrays, route.wepoch = (), -1, (), (), None, -1
        route.clinks, route.wlinks, route.ckeep, route.wflags = (), (), None, None
        route.kepoch = -1
        route.told = self.told
        route.ulinks, route.mults, route.arrays = self.ulinks, self.mults, self.arrays
        route.solo_rate, route.demand, route._mult_of = self.solo_rate, self.demand, self._mult_of
        if type(self._mult_of) is _Crossings:
            self._mult_of.hold(route)
        return route

    def mult(self, link: int) -> float:
        """How many times the route crosses ``link`` (one of its links; a sum of weights if weighted)."""
        return 1 if self._mult_of is None else self._mult_of[link]


class _Join:
    """Counts down the flows of one :meth:`FlowNetwork.start_flows` call."""

    __slots__ = ("left", "on_done")

    def __init__(self, left: int, on_done: Callable[[], None]) -> None:
        self.left = left
        self.on_done = on_done


class Flow:
    """A transfer in its bandwidth phase: ``remaining`` bytes at ``rate`` bytes/s since time ``t0``.

    ``seq`` is the id of its live heap entry (-1 before its first rate, -2 once finished).
    """

    __slots__ = ("route", "nbytes", "payload", "traffic_class", "join", "remaining", "rate", "t0", "seq", "session",
                 "rec")

    def __init__(self, route: _Route, nbytes: float, payload: float, traffic_class: str, join: _Join,
                 t0: float) -> None:
        self.session: _Session | None = None  # the recording session it belongs to, if any
        self.rec: list | None = None  # while recording: [admitted at, finished at, [(time, rate), ...]]
        self.route = route
        self.nbytes = nbytes
        self.payload = payload
        self.traffic_class = traffic_class
        self.join = join
        self.remaining = nbytes
        self.rate = 0.0
        self.t0 = t0
        self.seq = -1


class _Agg:
    """Flows that always move at one rate, simulated as one: an *aggregate* (exact up to rounding).

    Flows whose rows in every max-min problem are the same — the same links that may bind (tight, not
    lazy, not dominated, each twin class by its representative) crossed equally often — and whose solo
    rates are equal get equal max-min rates whatever else runs (the allocation is unique and symmetric
    in them). The waves of a uniform all-to-all are such flows once the spine links are lazy: a row of
    their NIC classes. An aggregate is one entity in every component and problem (its row: the members'
    crossings times their number), re-rated once per event instead of once per member, and keeps a
    *virtual clock*: ``svc`` bytes moved by every member since it was made (as of time ``ts``); a member
    that joined when it stood at ``s`` with ``b`` bytes left finishes when it reaches ``s + b``
    (processor sharing). Members finish in order of that target, from a heap. Its rate history and the
    members' spans stand for the members' rate-log entries (:meth:`LinkLedger.rate_log`).

    It stands in for its members wherever flows are looked at: as its own route (``route`` is itself) it
    carries the attributes the max-min bookkeeping reads — ``wpairs`` (the members' row times their
    number), ``lpairs`` / ``larrays`` (crossings of lazy links summed over members), ``solo_rate``, and
    ``_mult_of`` (crossings of every link summed over members).
    """

    __slots__ = ("route", "id", "rate", "svc", "ts", "seq", "heap", "n", "rep", "_mult_of", "nlinks", "lsum",
                 "lcount", "lwepoch", "wpairs", "lpairs", "larrays", "wepoch", "solo_rate", "rec", "wlinks")

    def __init__(self, agg_id: int, rep: _Route, rate: float, now: float) -> None:
        self.route = self
        self.id = agg_id
        self.rate = rate
        self.svc = 0.0
        self.ts = now
        self.seq = -1
        self.heap: list[tuple[float, int, Flow]] = []  # (service target, tiebreak, member)
        self.n = 0  # members
        self.rep = rep  # a member's route: the members' common row is its wpairs
        self.solo_rate = rep.solo_rate
        self._mult_of: dict[int, float] = {}  # link -> crossings summed over members (every link they cross)
        self.nlinks: dict[int, int] = {}  # link -> members crossing it
        self.lsum: dict[int, float] = {}  # lazy link -> crossings summed over members, as of network stamp lwepoch
        self.lcount: dict[int, int] = {}  # lazy link -> members crossing it, as of lwepoch
        self.lwepoch = -1
        self.wpairs: tuple = ()
        self.wlinks: tuple = ()  # the links of wpairs
        self.lpairs: tuple = ()
        self.larrays: tuple | None = None
        self.wepoch = -1
        self.rec = None  # never recorded for replays (as a flow is while its call is)

    def clear(self) -> None:
        """Forget every member (they were folded elsewhere or dissolved): the aggregate is done."""
        self.heap, self.n, self.nlinks, self._mult_of, self.seq = [], 0, {}, {}, -2


class _Trajectory:
    """What the flows of one isolated :meth:`FlowNetwork.start_flows` call did, relative to its start.

    ``flows[i] = (admitted, finished, ((t, rate), ...))`` (seconds after the start) for the ``i``-th flow
    that joins max-min sharing; ``busy = (pos, a, b)`` the merged busy intervals ``[a, b)`` of the call's
    links as three arrays, link by link (``pos``: its position among the call's links, in the order of
    :meth:`FlowNetwork._session_key`), each link's in order of time; ``duration`` the last finish.

    Made from the recording: ``t0`` the call's start, ``recs`` each flow's ``[admitted, finished, [(time,
    rate), ...]]`` (absolute times), ``links`` the call's links (array), and the routes, starts and ends (s
    after ``t0``) of the flows that moved bytes. ``flows`` and ``busy`` are derived from them when first read
    (most trajectories are never replayed: a later recording of their shape replaces them first).
    """

    __slots__ = ("_flows", "_busy", "duration", "_made_of", "joint")

    def __init__(self, duration: float, t0: float, recs: list, links: np.ndarray, moved: list[_Route],
                 starts: list[float], ends: list[float], joint: tuple | None = None) -> None:
        self.duration = duration
        # Of a joint session (several calls started at one instant on shared links): per call, in order of
        # their start, ``(shape, links, flows, end)``: its shape id, where its links fall among the calls'
        # before it (:meth:`FlowNetwork._attach`; None for the first), how many of ``flows`` are its own and
        # its last finish (s after the start). None for one call on its own.
        self.joint = joint
        self._flows: list | None = None
        self._busy: tuple | None = None
        self._made_of = (t0, recs, links, moved, starts, ends)

    @property
    def flows(self) -> list:
        if self._flows is None:
            t0, recs = self._made_of[:2]
            self._flows = [(admitted - t0, finished - t0, tuple([(t - t0, r) for t, r in rates]))
                           for admitted, finished, rates in recs]
            if self._busy is not None:
                self._made_of = None  # both derived: the recording is no longer needed
        return self._flows

    @property
    def busy(self) -> tuple:
        if self._busy is None:
            _t0, _recs, links, moved, starts, ends = self._made_of
            self._busy = _busy_intervals(links, moved, starts, ends)
            if self._flows is not None:
                self._made_of = None
        return self._busy


def _latency_bound(specs: Sequence[FlowSpec], routes: list, capacity: list[float]) -> list[bool]:
    """Which of one call's flows are latency-bound (:meth:`FlowNetwork._tiny`): each moves its bytes in under
    ``TINY_FLOW_S`` on its bottleneck alone, *and* the call's flows that do so together need under
    ``TINY_FLOW_S`` on each link they cross. (Many sub-µs flows of one call on one link, an alltoall's on a
    4:1 uplink, say, can matter to each other; each alone cannot.) Flows of other calls are not summed here."""
    solo = [nbytes / route.solo_rate <= TINY_FLOW_S for route, (_links, nbytes, _lat, _pay) in zip(routes, specs)]
    if sum(solo) < 2:
        return solo
    load: dict[int, float] = {}  # link -> bytes the call's sub-µs flows put on it (crossings counted)
    get = load.get
    for route, (_links, nbytes, _lat, _pay), small in zip(routes, specs, solo):
        if small:
            for link, m in zip(route.ulinks, route.mults):
                load[link] = get(link, 0.0) + nbytes * m
    over = {link for link, b in load.items() if b / capacity[link] > TINY_FLOW_S}
    if not over:
        return solo
    return [small and over.isdisjoint(route.ulinks) for route, small in zip(routes, solo)]


class _Call:
    """What never changes about one spec tuple handed to :meth:`FlowNetwork.start_flows` (cached per tuple:
    the fabric hands out the same tuple for the same collective), so repeated calls skip re-deriving it.

    ``routes[i]``: the route of ``specs[i]``; ``tiny``: ``(route, nbytes, latency_s, payload)`` of the
    latency-bound specs (:meth:`FlowNetwork._tiny`); ``base``: id of the call's shape less the links'
    tightness thresholds, ``ids``: its links in order of first appearance; ``key``: the full shape id as of
    network epoch ``epoch``; ``books``: per trajectory, what a replay of it books (:meth:`FlowNetwork._new_book`).
    """

    __slots__ = ("specs", "routes", "tiny", "base", "ids", "epoch", "key", "books", "arr", "lead", "n", "moving",
                 "crossings", "is_tiny")

    def __init__(self, specs: Sequence[FlowSpec], routes: list, capacity: list[float]) -> None:
        self.specs = specs
        self.routes = routes
        # whether each spec is latency-bound: under TINY_FLOW_S on its bottleneck alone, and together with the
        # call's other such specs on every link it crosses (:func:`_latency_bound`)
        self.is_tiny = is_tiny = _latency_bound(specs, routes, capacity)
        self.tiny = [(route, nbytes, latency_s, payload)
                     for route, (_links, nbytes, latency_s, payload), t in zip(routes, specs, is_tiny) if t]
        # ``(route, nbytes, latency_s)`` of the flows that join max-min sharing, in order, and how many
        self.moving = [(route, nbytes, latency_s)
                       for route, (_links, nbytes, latency_s, _payload), t in zip(routes, specs, is_tiny) if not t]
        self.n = len(self.moving)
        self.crossings = sum([len(route.ulinks) for route in routes])  # links crossed, flow by flow
        # The least latency of its flows that join max-min sharing (inf: none do): when positive, none of
        # them is admitted at the instant the call starts (see FlowNetwork._host).
        self.lead = min([latency_s for _route, _nbytes, latency_s in self.moving], default=float("inf"))
        self.base = -1
        self.ids: tuple = ()
        self.arr: np.ndarray | None = None  # ids as an array (vectorised checks of the links' owners and use)
        self.epoch = -1
        self.key = -1
        self.books: dict[int, tuple] = {}


class _Session:
    """The flows of one :meth:`FlowNetwork.start_flows` call while they hold their links alone.

    Recording (``traj`` None): real flows; if nothing else touched their links until the last one
    finished, what they did is kept as a :class:`_Trajectory` under the call's shape ``key``.
    Replaying: no flows exist; one late event at ``t0 + duration`` books everything the recorded flows
    did, unless another flow comes onto one of the links first (then the flows are made real, in the
    state the trajectory says, and go on as any flow: :meth:`FlowNetwork._materialize`).
    Joint (``parts``): several calls started at its instant on its links, recorded and replayed together,
    each told at its own end (:meth:`FlowNetwork._attach`).
    """

    __slots__ = ("key", "t0", "left", "tainted", "flows", "traj", "specs", "traffic_class", "join", "done",
                 "budget", "call", "held", "sid", "arr", "ids", "parts", "open", "undecided", "matched")

    def __init__(self, key: tuple, t0: float, sid: int, arr: np.ndarray, ids: tuple) -> None:
        self.key = key
        self.sid = sid  # its id in the network's owner array (FlowNetwork._owner)
        self.arr = arr  # links as an array
        self.ids = ids  # ... and as a tuple
        self.t0 = t0
        self.left = 0
        self.tainted = False
        self.flows: list[Flow] = []
        self.traj: _Trajectory | None = None
        self.specs: list = []
        self.traffic_class = ""
        self.join: _Join | None = None
        self.done = False
        self.budget = _MEMO_RATE_CHANGES  # rate changes it may still record
        self.call: _Call | None = None  # the (first) call's cached facts
        self.held = False  # whether it still holds its links (all of them: they were free when it took them)
        # A joint session (several calls started at this instant on shared links): its calls (_Part),
        # whether no flow of it can have been admitted yet (another call starting now may still join it),
        # whether it waits for the end of the instant to replay or start its flows (undecided) and whether its
        # calls so far are the ones its trajectory recorded (matched).
        self.parts: list[_Part] | None = None
        self.open = False
        self.undecided = False
        self.matched = False


class _Part:
    """One call of a joint session: its cached facts, traffic class and join, where its flows start among
    the session's (``first``) and how many there are (``n``), its shape id and links' positions (``key``,
    ``sig``: see :attr:`_Trajectory.joint`), the pending-queue numbers reserved for its flows while the
    session is undecided (``seqs``: latency -> number), its last finish as recorded (``end``, s after the
    session's start), whether a replay has booked it (``done``) and when it started if later than the session
    (``start``: a call merged into a replay, :meth:`FlowNetwork._join_replay`)."""

    __slots__ = ("call", "traffic_class", "join", "first", "n", "key", "sig", "seqs", "end", "done", "start")

    def __init__(self, call: _Call, traffic_class: str, join: _Join, first: int, key: int,
                 sig: tuple | None, start: float | None = None) -> None:
        self.start = start  # when the call started, if after the session (FlowNetwork._join_replay); else None
        self.call = call
        self.traffic_class = traffic_class
        self.join = join
        self.first = first
        self.n = call.n
        self.key = key
        self.sig = sig
        self.seqs: dict[float, int] | None = None
        self.end = 0.0
        self.done = False


class LinkLedger:
    """Per-link accounting shared by both backends: bytes, busy time, bytes per class, and a rate log.

    Records are accumulated per (route, class) in plain Python and folded into
    the numpy arrays when they are read (``bytes``, ``busy_s``,
    ``bytes_by_class``), so the hot path never touches numpy.

    The *rate log* is what link bandwidth over time is rebuilt from, exactly:
    one entry ``(time_s, route idx, delta rate in bytes/s)`` each time a
    flow's rate changes (it starts, is re-rated, or ends). A link's rate at
    any instant is the sum of the deltas logged before it on the routes that
    cross it (times their crossings); it is piecewise constant and its
    integral over the run is the link's ``bytes``. Three flat arrays, 24
    bytes per entry.
    """

    def __init__(self, num_links: int) -> None:
        self.num_links = num_links
        self._bytes = np.zeros(num_links)
        self._busy_s = np.zeros(num_links)
        self._bytes_by_class: dict[str, np.ndarray] = {}
        # (route idx, class) -> row: one dict lookup per finished flow; kept for traffic matrices and per-job
        # bytes. Per row: (route, class), and in flat arrays of doubles the wire bytes not yet folded into the
        # arrays, the payload bytes and the wire bytes in all (Python float adds per flow; np.add.at where a
        # replay books many flows at once: the same additions in the same order).
        self._by_route: dict[tuple, int] = {}
        self._rows: list[tuple[_Route, str]] = []
        self._wire = array("d")
        self._payload = array("d")
        self._total = array("d")
        self._unfolded = False
        # Busy seconds not yet folded into busy_s: a flat array of doubles (one Python float add per link where
        # flows end) with a numpy view of it (np.add.at where a replay books many links at once: the same
        # additions in the same order).
        self._busy_acc = array("d", bytes(8 * num_links))
        self._busy_np = np.frombuffer(self._busy_acc, dtype=float)
        # Links whose busy time is another's (FlowNetwork: twins that mirror their class's representative):
        # a callable answering (link ids, the link each mirrors), applied before busy time is folded.
        self.mirrors: Callable[[], tuple[np.ndarray, np.ndarray]] | None = None
        self.flows_completed = 0  # point-to-point transfers finished (a grouped flow counts its members)
        self.rate_t = array("d")
        self.rate_route = array("q")
        self.rate_delta = array("d")
        # Flows that moved as members of an aggregate (FlowNetwork._Agg) log nothing per rate change: the
        # aggregate's rate history (per aggregate id: times, rates) and each member's span in it (aggregate
        # id, route idx, joined at, left at) stand for those entries; rate_log() expands them.
        self._agg_history: dict[int, tuple[array, array]] = {}
        self._span_agg = array("q")
        self._span_route = array("q")
        self._span_in = array("d")
        self._span_out = array("d")

    def log_rate(self, t: float, route: _Route, delta: float) -> None:
        """Log that the rate of one flow on ``route`` changed by ``delta`` bytes/s at time ``t`` (s)."""
        self.rate_t.append(t)
        self.rate_route.append(route.idx)
        self.rate_delta.append(delta)

    def log_aggregate_rate(self, agg_id: int, t: float, rate: float) -> None:
        """Log that every member of aggregate ``agg_id`` moves at ``rate`` bytes/s from time ``t`` (s)."""
        hist = self._agg_history.get(agg_id)
        if hist is None:
            hist = self._agg_history[agg_id] = (array("d"), array("d"))
        hist[0].append(t)
        hist[1].append(rate)

    def log_span(self, agg_id: int, route: _Route, t_in: float, t_out: float) -> None:
        """A flow on ``route`` moved at aggregate ``agg_id``'s rate from ``t_in`` to ``t_out`` (s)."""
        self._span_agg.append(agg_id)
        self._span_route.append(route.idx)
        self._span_in.append(t_in)
        self._span_out.append(t_out)

    def rate_log(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The whole rate log as arrays ``(times_s, route idx, delta rate in bytes/s)``: the entries logged
        one by one, then those of the aggregates' members, expanded from their spans and the aggregates'
        rate histories (a member starts at the rate in force just after it joined, follows every change
        strictly inside its span, and leaves at the rate in force just before it left)."""
        t = np.frombuffer(self.rate_t, dtype=float) if len(self.rate_t) else np.zeros(0)
        r = np.frombuffer(self.rate_route, dtype=np.int64) if len(self.rate_route) else np.zeros(0, np.int64)
        d = np.frombuffer(self.rate_delta, dtype=float) if len(self.rate_delta) else np.zeros(0)
        if not len(self._span_agg):
            return t, r, d
        aggs = np.frombuffer(self._span_agg, dtype=np.int64)
        routes = np.frombuffer(self._span_route, dtype=np.int64)
        t_in = np.frombuffer(self._span_in, dtype=float)
        t_out = np.frombuffer(self._span_out, dtype=float)
        parts_t, parts_r, parts_d = [t], [r], [d]
        order = np.argsort(aggs, kind="stable")
        bounds = np.flatnonzero(np.r_[True, aggs[order][1:] != aggs[order][:-1], True])
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            sel = order[lo:hi]
            times, rates = (np.frombuffer(x, dtype=float) for x in self._agg_history[int(aggs[sel[0]])])
            steps = np.r_[rates[0], np.diff(rates)]  # the change at each history entry
            first = np.searchsorted(times, t_in[sel], side="right") - 1  # in force just after joining
            last = np.searchsorted(times, t_out[sel], side="left") - 1  # in force just before leaving
            last = np.maximum(last, first)  # a span that began and ended at one instant adds nothing
            n = last - first  # changes strictly inside the span
            rs = routes[sel]
            total = int(n.sum())
            k = np.arange(total) - np.repeat(np.cumsum(n) - n, n) + np.repeat(first + 1, n)  # history indices
            parts_t += [t_in[sel], times[k], t_out[sel]]
            parts_r += [rs, np.repeat(rs, n), rs]
            parts_d += [rates[first], steps[k], -rates[last]]
        return np.concatenate(parts_t), np.concatenate(parts_r), np.concatenate(parts_d)

    def record_route(self, route: _Route, nbytes: float, traffic_class: str, payload_bytes: float) -> None:
        """A flow of ``nbytes`` per crossing (``payload_bytes`` sent by GPUs) finished on ``route``."""
        key = (route.idx, traffic_class)
        row = self._by_route.get(key)
        if row is None:
            self._by_route[key] = len(self._rows)
            self._rows.append((route, traffic_class))
            self._wire.append(nbytes)
            self._payload.append(payload_bytes)
            self._total.append(nbytes)
        else:
            self._wire[row] += nbytes
            self._payload[row] += payload_bytes
            self._total[row] += nbytes
        self._unfolded = True
        self.flows_completed += route.members

    @property
    def payload_bytes_by_class(self) -> dict[str, float]:
        """Payload bytes GPUs sent, per traffic class (in order of first appearance)."""
        if not self._rows:
            return {}
        classes = [cls for _route, cls in self._rows]
        index = {cls: i for i, cls in enumerate(dict.fromkeys(classes))}
        code = np.fromiter(map(index.__getitem__, classes), dtype=np.int64, count=len(classes))
        # a sum per class from 0.0 over the rows in order: the additions a loop of += makes (exact)
        sums = np.bincount(code, weights=np.frombuffer(self._payload, dtype=float), minlength=len(index))
        return {cls: float(sums[i]) for cls, i in index.items()}

    def payload_by_route(self) -> list[tuple[np.ndarray, str, float]]:
        """``(route links, traffic class, payload bytes)`` for every route and class that carried payload."""
        return [(route.links, cls, payload) for (route, cls), payload in zip(self._rows, self._payload)]

    def wire_by_route(self) -> list[tuple[np.ndarray, str, float | np.ndarray]]:
        """``(route links, traffic class, wire bytes per crossing)`` for every route and class used: each link
        of ``links`` carried that many bytes once per appearance in it (for a weighted route, an array: the
        bytes of each entry of ``links``)."""
        return [(route.links, cls, total if route.weights is None else total * route.weights)
                for (route, cls), total in zip(self._rows, self._total)]

    def add_busy(self, link: int, seconds: float) -> None:
        self._busy_acc[link] += seconds

    def _flush(self) -> None:
        if self._unfolded:
            # Every entry's bytes onto its links, entry by entry in order (and per class over its entries), in
            # chunks of about a million link entries: the same additions in the same order as one per entry.
            wire = np.frombuffer(self._wire, dtype=float)
            rows = np.flatnonzero(wire)
            if len(rows):
                entries = list(map(self._rows.__getitem__, rows.tolist()))
                routes, classes = list(map(itemgetter(0), entries)), list(map(itemgetter(1), entries))
                links = list(map(attrgetter("links"), routes))
                weights = list(map(attrgetter("weights"), routes))
                counts = np.fromiter(map(len, links), dtype=np.int64, count=len(links))
                cuts = (np.flatnonzero(np.diff(np.cumsum(counts) >> 20)) + 1).tolist()
                for lo, hi in zip([0, *cuts], [*cuts, len(rows)]):
                    self._fold(wire[rows[lo:hi]], links[lo:hi], weights[lo:hi], classes[lo:hi], counts[lo:hi])
                wire[rows] = 0.0
            del wire  # (a view of the array's buffer stops it growing)
            self._unfolded = False
        acc = self._busy_np
        if self.mirrors is not None:
            ids, source = self.mirrors()
            acc[ids] = acc[source]
        if acc.any():
            self._busy_s += acc
            acc[:] = 0.0

    @staticmethod
    def _add_in_order(target: np.ndarray, index: np.ndarray, values: np.ndarray) -> None:
        """``np.add.at(target, index, values)``: each value added onto its entry in order. Onto an all-zero
        ``target`` (a ledger's first fold) ``np.bincount``, which makes the very same additions from 0.0 in the
        same order, several times faster."""
        if target.any():
            np.add.at(target, index, values)
        else:
            target[:] = np.bincount(index, weights=values, minlength=len(target))

    def _fold(self, wire: np.ndarray, links: list, weights: list, classes: list, counts: np.ndarray) -> None:
        """Add the unfolded bytes of some rows onto ``_bytes`` and ``_bytes_by_class``: per row its ``wire``
        bytes per crossing, its route's ``links`` and entry ``weights`` (or None), its class, its link entries."""
        flat = np.concatenate(links)
        values = np.repeat(wire, counts)
        weighted = [i for i, w in enumerate(weights) if w is not None]
        if weighted:  # each entry of a weighted route carries its share
            starts = (np.cumsum(counts) - counts).tolist()
            for i in weighted:
                values[starts[i]:starts[i] + counts[i]] = wire[i] * weights[i]
        self._add_in_order(self._bytes, flat, values)
        index = {cls: i for i, cls in enumerate(dict.fromkeys(classes))}
        which = np.repeat(np.fromiter(map(index.__getitem__, classes), dtype=np.int64, count=len(classes)), counts)
        for cls, i in index.items():
            per_class = self._bytes_by_class.get(cls)
            if per_class is None:
                per_class = self._bytes_by_class[cls] = np.zeros(self.num_links)
            mine = which == i if len(index) > 1 else slice(None)
            self._add_in_order(per_class, flat[mine], values[mine])

    @property
    def bytes(self) -> np.ndarray:
        self._flush()
        return self._bytes

    @property
    def busy_s(self) -> np.ndarray:
        self._flush()
        return self._busy_s

    @property
    def bytes_by_class(self) -> dict[str, np.ndarray]:
        self._flush()
        return self._bytes_by_class


class _Routes:
    """Cache of :class:`_Route` per links array (keyed by identity; the cache keeps the arrays alive)."""

    def __init__(self, capacity: list[float], capacity_array: np.ndarray | None = None) -> None:
        self._by_id: dict[int, _Route] = {}
        self._capacity = capacity
        # the same floats as an array (long routes: _Route)
        self._capacity_array = np.array(capacity, dtype=float) if capacity_array is None else capacity_array
        self.all: list[_Route] = []  # every route made, by ``idx``
        # id(links) -> (links, entry weights or None, transfers a flow stands for): see declare
        self.declared: dict[int, tuple[np.ndarray, np.ndarray | None, int]] = {}
        # (dtype, entries, weights, members) -> the first route made over such links: an equal array (the same
        # hops routed for another call) gets a route of its own (its own idx) derived from it, sharing its
        # ``told`` (a route equal to one seen changes no dominated or twin link)
        self._by_content: dict[tuple, _Route] = {}
        # (dtype, entries) -> the entries as a tuple if strictly increasing, else (); id(weights) -> (weights,
        # their values as a tuple): what _Route derives of weighted links, kept (the links of a bulk alltoallv
        # flow recur with other weights, and its weights with other links)
        self._sorted: dict[tuple, tuple] = {}
        self._mults: dict[int, tuple] = {}

    def _increasing(self, key: tuple, links: np.ndarray, weights: np.ndarray) -> tuple | None:
        """``(ulinks, mults)`` of weighted ``links`` (keyed ``key``: dtype and bytes) if strictly increasing
        (:class:`_Route`'s fast case), else None."""
        ulinks = self._sorted.get(key)
        if ulinks is None:
            entries = links.tolist()
            ulinks = tuple(entries) if entries and all(map(lt, entries, entries[1:])) else ()
            if len(self._sorted) > _MEMO_SHAPES:
                self._sorted.clear()
            self._sorted[key] = ulinks
        if not ulinks:
            return None
        hit = self._mults.get(id(weights))
        if hit is None or hit[0] is not weights:
            # bincount gives each weight alone, 0.0 + w, which ``weights + 0.0`` is exactly (-0.0 too)
            hit = (weights, tuple((weights + 0.0).tolist()))
            if len(self._mults) > _MEMO_SHAPES:
                self._mults.clear()
            self._mults[id(weights)] = hit
        return ulinks, hit[1]

    def get(self, links: np.ndarray) -> _Route:
        route = self._by_id.get(id(links))
        if route is None or route.links is not links:
            d = self.declared.get(id(links))
            weights, members = (d[1], d[2]) if d is not None and d[0] is links else (None, 1)
            key = ((links.dtype.char, links.tobytes(), None if weights is None else weights.tobytes(), members)
                   if isinstance(links, np.ndarray) else None)
            seen = self._by_content.get(key) if key is not None else None
            if seen is not None:
                route = self._by_id[id(links)] = seen.like(links, len(self.all))
                self.all.append(route)
                return route
            known = None
            if weights is not None and key is not None and links.ndim == 1 and len(weights) == len(links):
                known = self._increasing(key[:2], links, weights)
            route = self._by_id[id(links)] = _Route(links, self._capacity, len(self.all), weights, members, known,
                                                    self._capacity_array)
            if key is not None:
                self._by_content[key] = route
            self.all.append(route)
        return route


class _NetworkBase:
    """State both backends share: the clock, link capacities (bytes/s), the ledger and cached routes."""

    def __init__(self, env: simpy.Environment, capacity: np.ndarray) -> None:
        self.env = env
        self.capacity = np.asarray(capacity, dtype=float)
        self._cap = self.capacity.tolist()
        self.ledger = LinkLedger(len(self.capacity))
        self._routes = _Routes(self._cap, self.capacity)

    @property
    def routes(self) -> list[_Route]:
        """Every route flows have used, indexed by ``route.idx`` (the rate log's route ids)."""
        return self._routes.all

    def weights_of(self, links: np.ndarray) -> np.ndarray | None:
        """The entry weights declared for ``links`` (:meth:`declare`), or None."""
        d = self._routes.declared.get(id(links))
        return d[1] if d is not None and d[0] is links else None

    def members_of(self, links: np.ndarray) -> int:
        """The point-to-point transfers a flow over ``links`` stands for (:meth:`declare`; default 1)."""
        d = self._routes.declared.get(id(links))
        return d[2] if d is not None and d[0] is links else 1

    def declare(self, links: np.ndarray, members: int, weights: np.ndarray | None = None) -> None:
        """Declare that a flow over ``links`` stands for ``members`` point-to-point transfers (counted in
        ``ledger.flows_completed``) and, if ``weights`` is given, loads entry ``i`` of ``links`` with
        ``weights[i]`` times its rate (moving ``weights[i]`` times its bytes there). Must precede the
        first flow over this very array. The weights are made read-only here: what a route derives from them
        is kept per weights object (:meth:`_Routes._increasing`), so they must not change after."""
        if weights is not None:
            weights = np.asarray(weights, dtype=float)
            weights.flags.writeable = False
        self._routes.declared[id(links)] = (links, weights, int(members))

    def transfer(self, links: np.ndarray, nbytes: float, latency_s: float, traffic_class: str,
                 payload_bytes: float | None = None) -> Event:
        """Move ``nbytes`` over every link in ``links`` at one common rate.

        ``links`` is an array of link ids (a repeated id means the flow crosses
        that link more than once). ``payload_bytes`` is what the flow counts as
        sent by GPUs (default ``nbytes``). Returns an event that succeeds at the
        arrival of the last byte.
        """
        done = Event(self.env)
        payload = float(nbytes) if payload_bytes is None else float(payload_bytes)
        self.start_flows([(links, float(nbytes), latency_s, payload)], traffic_class, done.succeed)
        return done

    def start_flows(self, specs: Sequence[FlowSpec], traffic_class: str, on_done: Callable[[], None]) -> None:
        """Start ``(links, nbytes, latency_s, payload_bytes)`` flows; ``on_done()`` after the last (per backend)."""
        raise NotImplementedError


class FlowNetwork(_NetworkBase):
    """Congestion-aware flow-level network with max-min fair sharing.

    Parameters
    ----------
    env : simpy.Environment
    capacity : numpy.ndarray
        Bytes/s of every directed link id.
    replay, twins, lazy, aggregate : bool
        Replays of isolated calls, twin links, lazy links and aggregates of flows of equal rows (all on by
        default; off only to check them against the network without them).
    foresee : bool
        Work out at once the trajectory of a call alone on idle links whose shape has no recording, and of
        a call joining the replay that alone holds its links, instead of simulating their flows event by
        event (:meth:`_foresee`, :meth:`_join_replay`; on by default, with ``replay``).
    """

    def __init__(self, env: simpy.Environment, capacity: np.ndarray, replay: bool = True, twins: bool = True,
                 lazy: bool = True, aggregate: bool = True, foresee: bool = True) -> None:
        _NetworkBase.__init__(self, env, capacity)
        # Active flows per link id, insertion-ordered (one persistent dict per link: no allocation per flow).
        self._on_link: list[dict[Flow, None]] = [{} for _ in self._cap]
        self._busy_since: list[float] = [0.0] * len(self._cap)
        # link -> (begin, end) of the latency-bound flows holding it from now on (_tiny), in the order placed
        self._tiny_busy: dict[int, list[tuple[float, float]]] = {}
        # Sum over active flows of what they can ever ask of a link. A link whose demand stays within its
        # capacity can never saturate, so it constrains nobody and couples nobody: only *tight* links
        # (demand above capacity) enter the max-min problem and its connected components.
        self._demand: list[float] = [0.0] * len(self._cap)
        # Tolerance: a link is slack while its demand is within 1e-9 of its capacity (so a flow alone on
        # its bottleneck is never "tight" through rounding); it can then be overloaded by at most 1e-9.
        self._tight_at: list[float] = [c * (1 + 1e-9) for c in self._cap]
        # Dominated links (see _dominance): -1 no route seen yet, -2 not dominated, else the dominating link.
        self._dominator: list[int] = [-1] * len(self._cap)
        self._dominated = np.zeros(len(self._cap), dtype=bool)  # dominator >= 0, as an array (_session_key)
        # Twin links (see _twins): class of each link (-1: no route seen yet), members and representative
        # of each class. Only a class's representative can be tight.
        self._twin_of: list[int] = [-1] * len(self._cap)
        self._twin_members: dict[int, set[int]] = {}
        self._twin_rep: dict[int, int] = {}
        self._next_twin = 0
        self._twin_alone = bytearray(len(self._cap))  # 1: the link's class is itself alone (it stays so)
        self.twins = twins
        # Which links keep their own flow state (1) and which mirror their twin class's representative (0):
        # twins carry the same flows at every instant, so a representative's flows, demand and busy time are
        # every member's. A member's state is taken from its representative when it becomes one itself
        # (_unmirror: classes only split), its busy time when busy time is read (LinkLedger.mirrors); flows
        # come onto and leave only the links they keep (_Route.klinks, made again when _kepoch moves on).
        self._kept = bytearray(b"\x01") * len(self._cap)
        self._kepoch = 0
        self._links_interned: dict[tuple, tuple] = {}  # see _interned
        if twins:
            self.ledger.mirrors = self._mirrors
        self.component_solves = 0  # max-min problems solved (not looked up in _solved)
        self._solved: dict[tuple, list[float]] = {}  # component shape -> its rates (see _solve)
        self._solved_flows = 0  # entries (flows, links, crossings) of the shapes in _solved
        self.shape_hits = 0  # components whose rates came from _solved
        self._heap: list[tuple[float, int, Flow]] = []
        self._seq = 0
        self._active = 0
        self._pending: list[tuple[float, int, list[Flow]]] = []  # (arrival time, seq, flows) not yet admitted
        self._pending_seq = 0
        self._wakes: list[float] = []  # instants with a late wake-up event pending (min-heap)
        self.rate_solves = 0  # instants at which some components were re-rated
        # Replays of isolated calls (see _Session): which session holds each link, the trajectories recorded
        # per call shape, and the shape of each cached spec tuple.
        self.replay = replay
        # Calls alone on idle links whose shape has no recording: their trajectory worked out at once (_foresee).
        self.foresee = foresee and replay
        self.foreseen = 0  # calls whose trajectory was worked out at once
        self.joined_replays = 0  # calls worked out together with the replay holding their links (_join_replay)
        # Id of the session holding each link (0: none; an array of int64 with a numpy view for whole calls)
        # and the holding sessions by id.
        self._owner = array("q", bytes(8 * len(self._cap)))
        self._owner_np = np.frombuffer(self._owner, dtype=np.int64)
        self._sessions: dict[int, _Session] = {}
        self._next_sid = 0
        # Per link, the calls with real flows (not replayed) that are not done yet and cross it: a superset of
        # the links in use, checked with numpy before the links' flows are (_occupy).
        self._occupied_acc = array("i", bytes(4 * len(self._cap)))  # (read per link in Python for small calls)
        self._occupied = np.frombuffer(self._occupied_acc, dtype=np.int32)
        self._memo: dict[int, _Trajectory] = {}
        self._memo_flows = 0  # entries (flows, rate changes) of the recorded trajectories
        self._shape_ids: dict[tuple, int] = {}  # (base shape id, dominated links as packed bits) -> shape id
        self._next_shape = 0
        self._base_ids: dict[tuple, int] = {}  # shape less the links' thresholds -> base shape id
        self._relabelled: dict[tuple, tuple] = {}  # routes' distinct links -> _relabel of them
        self._keys: dict[int, _Call] = {}  # id(spec tuple) -> its _Call
        self._epoch = 0  # bumped whenever a link's tightness threshold changes (dominance): shapes include it
        # Lazy links (see _rerate): tight links left out of components and max-min problems because the last
        # large solve that included them left them slack; every solution is checked against them.
        self.lazy = lazy
        self._lazy: list[bool] = [False] * len(self._cap)
        self._lazy_count = 0
        self._strikes: list[int] = [0] * len(self._cap)  # times a lazy link was found overloaded
        # Of a lazy link: sum of crossings x rate of the flows on it; a flat array of doubles (Python float adds
        # per link) with a numpy view of it (vectorised checks and np.add.at).
        self._lload_acc = array("d", bytes(8 * len(self._cap)))
        self._lload = np.frombuffer(self._lload_acc, dtype=float)
        self._pending_loads: tuple | None = None  # (link ids, load changes) the rates being set bring
        self._wepoch = 0  # bumped whenever _epoch or a link's laziness changes (routes' wpairs / lpairs)
        self.lazy_misses = 0  # re-solves because a solution overloaded a lazy link
        self.lazy_marked = 0  # times a link was made lazy
        self._slack_of: dict[int, tuple] = {}  # id(rates of _solved) -> (rates, [(local link, spare bytes/s)])
        self.flows_started = 0  # flows handed to the network (replayed ones included)
        self.calls = 0  # start_flows calls with at least one flow
        self.replays = 0  # calls whose flows were replayed from a recorded trajectory
        self.materialized = 0  # replays cut short by another flow (their flows made real)
        self._joins_done: list[_Join] = []  # calls completed by replays, told at the end of the update
        # Aggregates (see _Agg): flows of equal rows folded into one entity with a virtual clock.
        self.aggregate = aggregate
        self._next_agg = 0
        self._agg_tie = 0  # tiebreak of members' service targets
        self.aggregated = 0  # flows folded into aggregates (a flow counts each time it is folded)
        self.dissolved = 0  # aggregates dissolved (a link under them changed its role)
        self._replays_due: list[tuple[float, int, _Session]] = []  # (end, seq, replaying session)
        # Joint sessions (see _attach): the instant the last session was made (only a call starting then can
        # join one) and the sessions waiting for the end of this instant to replay or start their flows.
        self._fresh_t = -1.0
        self._undecided: list[_Session] = []
        # (id(session's links), id(joining call's links)) -> (those two tuples, the call's links' positions among
        # the session's, its new links as a tuple and an array, the union as a tuple and an array): _attach
        self._unions: dict[tuple[int, int], tuple] = {}

    # ----------------------------------------------------------- interface
    def start_flows(self, specs: Sequence[FlowSpec], traffic_class: str, on_done: Callable[[], None]) -> None:
        """Start every ``(links, nbytes, latency_s, payload_bytes)`` flow; call ``on_done()`` after the last.

        ``on_done`` runs inside the network's update at the instant the last
        byte arrives (never synchronously inside this call).

        When every link of the call is idle and no other call holds it, the call holds its links (a
        :class:`_Session`) until its last flow ends; if nothing else came onto them meanwhile, what its
        flows did is recorded per call *shape* (its links relabelled, their capacities, bytes and
        latencies). A later call of a recorded shape that finds its links idle is *replayed*: one event
        books the recorded trajectory, shifted in time, instead of simulating it again; if another
        flow comes onto one of its links first, its flows are made real in the recorded state at that
        instant and go on as if they had been simulated all along (:meth:`_materialize`). Exact: an
        isolated call's flows follow the same trajectory whenever it starts (up to the rounding of the
        time shift, ~1e-16 s). Calls started at one instant on shared links hold them as one session,
        recorded and replayed together (:meth:`_attach`).
        """
        env = self.env
        now = env.now
        join = _Join(len(specs), on_done)
        if not specs:
            env.timeout(0).callbacks.append(lambda _ev: on_done())
            return
        self.flows_started += len(specs)
        self.calls += 1
        session = None
        call = self._call(specs)
        if self.replay and len(specs) <= _MEMO_RATE_CHANGES:
            key, links = self._session_key(call)
            arr = call.arr
            # Every link idle and held by nobody. This check is made for every link of every call: numpy (or
            # Python, for a few links) looks at the owners and at the links of real calls still running (a
            # superset of the links in use); only if one of those is among the call's links are the links'
            # flows looked at (dicts are truthy only when not empty).
            if len(links) <= _FEW_LINKS:
                owner = self._owner
                taken = any(map(owner.__getitem__, links)) or (
                    any(map(self._occupied_acc.__getitem__, links)) and any(map(self._on_link.__getitem__, links)))
            else:
                taken = count_nonzero(self._owner_np[arr]) or (  # (count_nonzero: .any() at a third of the cost)
                    count_nonzero(self._occupied[arr]) and any(map(self._on_link.__getitem__, links)))
            if not taken:
                self._next_sid += 1
                session = _Session(key, now, self._next_sid, arr, links)
                session.held = True
                self._mark_owner(links, arr, session.sid)
                self._sessions[session.sid] = session
                self._fresh_t = now
                traj = self._memo.get(key)
                if traj is None and self.foresee:
                    traj = self._foresee(call, session)
                if traj is not None:
                    if traj.joint is None:
                        self._replay(session, traj, call, traffic_class, join)
                    else:
                        self._expect(session, traj, call, traffic_class, join)
                    return
                session.call, session.traffic_class, session.join = call, traffic_class, join
                session.open = call.lead > 0
            elif self._fresh_t == now and len(specs) > len(call.tiny):
                # Its links are taken: perhaps only by a session that started at this very instant, whose
                # flows are not admitted yet (DeepEP's NVLink forwarding beside its RDMA hop): then it joins it.
                host = self._host(call, now)
                if host is not None:
                    if self._attach(host, call, key, traffic_class, join):
                        return  # its flows wait for the end of the instant (a replay, or not yet decided)
                    session = host  # its flows start now, recorded with the host's
            elif self.foresee and call.n and self._join_replay(call, traffic_class, join):
                return  # it and the replay holding its links replay together
            self._occupy(arr, join)
        elif self.replay:  # too many flows to record, but its links are in use all the same
            self._occupy(np.unique(np.fromiter(chain.from_iterable(route.ulinks for route in call.routes),
                                               dtype=np.intp)), join)
        self._begin(call, traffic_class, join, session, None)

    def _begin(self, call: _Call, traffic_class: str, join: _Join, session: _Session | None,
               seqs: dict[float, int] | None) -> None:
        """Make a call's flows and queue them for admission after their latencies (recorded by ``session``
        if given). ``seqs``: the pending-queue numbers reserved for them when the call started (a joint
        session's call whose flows waited for the end of the instant, :meth:`_decide`; its latency-bound
        flows started then); None: numbered now."""
        now = self.env.now
        by_latency: dict[float, list[Flow]] = {}
        for route, (_links, nbytes, latency_s, payload), tiny in zip(call.routes, call.specs, call.is_tiny):
            flow = Flow(route, nbytes, payload, traffic_class, join, now)
            if tiny:
                if seqs is None:
                    self._tiny(flow, latency_s, nbytes / route.solo_rate)
                continue
            if session is not None:
                flow.session = session
                flow.rec = [now, now, []]
                session.flows.append(flow)
            group = by_latency.get(latency_s)
            if group is None:
                by_latency[latency_s] = [flow]
            else:
                group.append(flow)
        if session is not None:
            session.left = len(session.flows)
            if not session.flows:
                self._release(session)
        pending = self._pending
        for latency_s, flows in by_latency.items():
            if seqs is None:
                self._pending_seq += 1
                heapq.heappush(pending, (now + latency_s, self._pending_seq, flows))
                self._wake(now + latency_s)
            else:
                heapq.heappush(pending, (now + latency_s, seqs[latency_s], flows))
                self._wake(now + latency_s)

    def _occupy(self, arr: np.ndarray, join: _Join) -> None:
        """Count the links ``arr`` (distinct ids) as possibly in use until ``join``'s call is done (see
        ``_occupied``): its ``on_done`` first uncounts them."""
        occupied = self._occupied
        occupied[arr] += 1
        on_done = join.on_done

        def done() -> None:
            occupied[arr] -= 1
            on_done()

        join.on_done = done

    def _tiny(self, flow: Flow, latency_s: float, solo: float) -> None:
        """A latency-bound flow (a scalar all-reduce, an LL step): its bytes take under TINY_FLOW_S even at
        the bottleneck, so it cannot matter to a real flow's rate; it runs at its solo rate without joining the
        max-min problem (and without gluing its links' components together).

        Latency-bound flows on one link take turns there: a flow holds each of its links for its bytes over the
        link's capacity (its solo time on its bottleneck) and starts at the first instant from its own start
        (now + its latency) at which none of its links is held by another (``_tiny_busy``: the held spans, each
        link's in the order placed), so a flow placed later may go first where it starts first (one of a later
        call with a shorter latency, in the gap before an earlier call's). It ends when its bottleneck is
        through. Alone, it starts after its latency and ends at its solo time, as it always did. Seven sub-µs
        sends from one GPU to its peers, each a call of its own, all ran at the full rate of its one NVLink
        port before; now they cross it one after another, and the last ends when all their bytes could have.
        Not counted: their busy time (a link that carries only such flows reads none), which would need the
        real flows' busy spans (not to count an instant twice) and the twin links' mirroring."""
        now = self.env.now
        route = flow.route
        start = now + latency_s
        busy, cap = self._tiny_busy, self._cap
        rate, nbytes = route.solo_rate, flow.nbytes
        holds = []
        for link, m in zip(route.ulinks, route.mults):
            c = cap[link]
            holds.append((link, solo if rate * m >= c * (1 - 1e-9) else nbytes * m / c))  # (bottleneck: to its end)
        begin = start
        moved = True
        while moved:  # (the first instant from its start free on every link: each pass only moves it later)
            moved = False
            for link, held in holds:
                for a, b in busy.get(link, ()):
                    if a < begin + held and begin < b:
                        begin, moved = b, True
        end = begin + solo
        for link, held in holds:
            spans = busy.get(link)
            if spans is None:
                busy[link] = [(begin, begin + held)]
            else:
                spans[:] = [s for s in spans if s[1] > now]  # (spans over by now hold nothing from now on)
                spans.append((begin, begin + held))
        log = self.ledger.log_rate
        log(begin, route, rate)
        log(end, route, -rate)
        wait = latency_s + solo if begin == start else end - now  # (alone: the very sum it always waited)
        self.env.timeout(wait).callbacks.append(lambda _ev, f=flow: self._finish(f))

    # ------------------------------------------------------------ replays
    def _call(self, specs: Sequence[FlowSpec]) -> _Call:
        """The :class:`_Call` of ``specs`` (cached per spec tuple; made afresh for any other sequence)."""
        if isinstance(specs, tuple):
            call = self._keys.get(id(specs))
            if call is not None and call.specs is specs:
                return call  # (its routes were told when it was made: ``told`` is never reset)
            routes = self._routes
            call = _Call(specs, [routes.get(spec[0]) for spec in specs], self._cap)
            if len(self._keys) > _MEMO_SHAPES:
                self._keys.clear()
            self._keys[id(specs)] = call
        else:
            routes = self._routes
            call = _Call(specs, [routes.get(spec[0]) for spec in specs], self._cap)
        for route, _nbytes, _latency_s in call.moving:
            told = route.told
            if not told[0]:
                told[0] = True
                if type(route._mult_of) is _Crossings:  # (max-min reads it from now on: the plain dict)
                    route._mult_of.build()
                self._new_route(route)
        return call

    def _session_key(self, call: _Call) -> tuple[int, tuple[int, ...]]:
        """The shape of a call (an id: equal ids, equal dynamics when alone) and the links it crosses.

        The shape is every flow's distinct links relabelled in order of first appearance, their
        crossings, bytes and latency, with the capacity of every relabelled link and whether it is
        dominated. All but the last never change for a spec tuple (kept in ``call.base``); the last is
        looked at again whenever the network's epoch has moved on.
        """
        if call.epoch == self._epoch:
            return call.key, call.ids
        if call.base < 0:
            # As arrays: every route's links relabelled in order of first appearance, how many each has, their
            # crossings, every flow's bytes and latency, the relabelled links' capacities (the bytes of equal
            # arrays are equal exactly when the numbers are).
            routes = call.routes
            sizes = array("d", [spec[1] for spec in call.specs]).tobytes()
            latencies = array("d", [spec[2] for spec in call.specs]).tobytes()
            # What depends only on the routes' links: kept per sequence of links (calls over the same links
            # with other sizes or crossings, as the alltoallvs of one EP group are, look it up).
            ulinks = tuple([route.ulinks for route in routes])
            relabelled = self._relabelled.get(ulinks)
            if relabelled is None:
                relabelled = self._relabel(ulinks)
                if len(self._relabelled) > _MEMO_SHAPES:
                    self._relabelled.clear()
                self._relabelled[ulinks] = relabelled
            labels, counts, ids, caps, arr = relabelled
            mults = array("d", chain.from_iterable([route.mults for route in routes]))
            base_shape = (labels, counts, mults.tobytes(), sizes, latencies, caps)
            base = self._base_ids.get(base_shape)
            if base is None:
                base = self._base_ids[base_shape] = len(self._base_ids)
            call.base, call.ids, call.arr = base, ids, arr
        ids = call.ids
        # Thresholds as dominance sets them: which twin of a class represents it changes no rate (identical
        # constraints), so it stays out of the shape (replicas pick representatives at different places). The
        # base fixes the links' capacities, so which links are dominated (packed bits) fixes the thresholds:
        # infinite if dominated, else capacity (1 + 1e-9).
        shape = (call.base, np.packbits(self._dominated[call.arr]).tobytes())
        key = self._shape_ids.get(shape)
        if key is None:
            if len(self._shape_ids) > _MEMO_SHAPES:
                self._shape_ids.clear()
                self._memo.clear()
                self._memo_flows = 0  # entries (flows, rate changes) of the recorded trajectories
            key = self._shape_ids[shape] = self._next_shape
            self._next_shape += 1
        if isinstance(call.specs, tuple):
            call.epoch, call.key = self._epoch, key
            if len(self._keys) > _MEMO_SHAPES:
                self._keys.clear()
            self._keys[id(call.specs)] = call
        return key, ids

    def _relabel(self, ulinks: tuple[tuple[int, ...], ...]) -> tuple:
        """``(labels, counts, ids, capacities, arr)`` of routes over ``ulinks`` (each route's distinct links):
        every route's links relabelled in order of first appearance and how many each has (int64 bytes), the
        distinct links in that order (a tuple, and an intp array ``arr``, read only) and their capacities
        (float64 bytes)."""
        counts = array("q", map(len, ulinks)).tobytes()
        total = sum(map(len, ulinks))
        if total < _SMALL_LINKS:  # the same bytes, without numpy's overhead per call
            flat = list(chain.from_iterable(ulinks))
            ids = tuple(dict.fromkeys(flat))  # in order of first appearance
            relabel = dict(zip(ids, range(len(ids))))
            labels = array("q", map(relabel.__getitem__, flat)).tobytes()
            cap = self._cap
            caps = array("d", [cap[link] for link in ids]).tobytes()
            arr = np.array(ids, dtype=np.intp)
        else:
            flat = np.fromiter(chain.from_iterable(ulinks), dtype=np.intp, count=total)
            uniq, first, inverse = np.unique(flat, return_index=True, return_inverse=True)
            order = np.argsort(first)  # the distinct links in order of first appearance
            label = np.empty(len(uniq), dtype=np.int64)
            label[order] = np.arange(len(uniq))
            arr = uniq[order]
            ids = tuple(arr.tolist())
            labels = label[inverse].tobytes()
            caps = self.capacity[arr].tobytes()
        arr.flags.writeable = False
        return labels, counts, ids, caps, arr

    def _release(self, session: _Session) -> None:
        # Nobody else can have taken a link while the session held it: all are still its own (a joint
        # session's may have been given back call by call, _joint_done, and taken by another since).
        if session.held:
            session.held = False
            if session.parts is None:
                self._mark_owner(session.ids, session.arr, 0)
            else:
                owner, arr = self._owner_np, session.arr
                owner[arr[owner[arr] == session.sid]] = 0
            del self._sessions[session.sid]

    def _mark_owner(self, ids: tuple[int, ...], arr: np.ndarray, sid: int) -> None:
        """Mark links ``ids`` (``arr``: the same as an array) held by session ``sid`` (0: by nobody): one
        buffer, written in Python for a few links and by numpy for many."""
        if len(ids) <= _FEW_LINKS:
            owner = self._owner
            for link in ids:
                owner[link] = sid
        else:
            self._owner_np[arr] = sid

    def _stop_recording(self, session: _Session) -> None:
        """Give up recording a session (another flow came onto its links, or it changes rates too often to
        be worth remembering): its flows go on as any, its links are free for other sessions."""
        session.tainted = True
        self._release(session)
        for f in session.flows:
            f.rec = None

    def _end_session(self, session: _Session) -> None:
        """The last flow of a recording session ended: keep its trajectory unless something intruded."""
        self._release(session)
        if session.tainted or session.done:
            return
        session.done = True
        t0 = session.t0
        recs = []
        moved: list[_Route] = []  # routes of the flows that moved bytes, with their spans
        starts: list[float] = []
        ends: list[float] = []
        duration = 0.0
        size = 0
        for flow in session.flows:
            rec = flow.rec
            recs.append(rec)
            admitted, finished, rates = rec
            if finished - t0 > duration:
                duration = finished - t0
            if rates:
                moved.append(flow.route)
                starts.append(admitted - t0)
                ends.append(finished - t0)
            size += 1 + len(rates)
            flow.rec = None
        joint = None
        if session.parts is not None and len(session.parts) > 1:  # each call's shape, links, flows, last finish
            bounds = [part.first for part in session.parts[1:]] + [len(recs)]
            joint = tuple((part.key, part.sig, stop - part.first,
                           max([rec[1] for rec in recs[part.first:stop]], default=t0) - t0)
                          for part, stop in zip(session.parts, bounds))
        self._remember(session.key, _Trajectory(duration, t0, recs, session.arr, moved, starts, ends, joint), size)

    def _foresee(self, call: _Call, session: _Session) -> _Trajectory | None:
        """The trajectory ``call``'s flows follow alone on their links from now (``session``'s start), worked
        out here, outside the event loop, and kept as its shape's; None for calls of more than
        ``_FORESEE_FLOWS`` flows that join max-min sharing (they are simulated and recorded as they run).

        A call that finds its links idle (an alltoallv of an EP group, whose sizes are its own so that no
        recording of its shape exists) follows, until another flow comes onto its links, the trajectory of
        its flows alone: max-min rates among them, re-solved when one is admitted or finishes. Working it
        out at once and replaying it (:meth:`_replay`) takes one event instead of an update per admission
        and finish, each with its component search; a flow that comes onto the links before the end makes
        the flows real in the state the trajectory gives (:meth:`_materialize`), as for any replay. Worked
        out by :meth:`_fill`, at the event loop's instants and rates: equal to the recording of the simulated
        flows up to rounding (tested).
        """
        n = call.n
        if not n or n > _FORESEE_FLOWS:
            return None
        t0 = session.t0
        routes = [route for route, _nbytes, _latency_s in call.moving]
        arrivals = [(t0 + latency_s, i, nbytes) for i, (_route, nbytes, latency_s) in enumerate(call.moving)]
        recs: list = [None] * n
        if not self._fill(routes, recs, [0.0] * n, [0.0] * n, [0.0] * n, [], arrivals):
            return None
        self.foreseen += 1
        traj = _trajectory_of(t0, recs, session.arr, routes)
        self._remember(session.key, traj, sum(1 + len(rec[2]) for rec in recs))
        return traj

    def _fill(self, routes: list[_Route], recs: list, left: list[float], rate: list[float], since: list[float],
              active: list[int], arrivals: list[tuple[float, int, float]]) -> bool:
        """Run flows over ``routes`` alone on their links, as the event loop would, to the last finish: ``active``
        ones moving (``left`` bytes as of ``since`` at ``rate``, their ``recs`` open), and ``(time, index,
        bytes)`` ``arrivals``. Fills each flow's ``recs[i] = [admitted, finished, [(time, rate), ...]]``
        (absolute times). Returns False if some flow would get no rate (a link without capacity: left to
        the event loop).

        The instants and rates are the event loop's: admitted at its arrival, finished at ``since + left /
        rate``, both taken at an instant when within ``_REL_TIME_EPS`` of it; every flow capped by its solo
        rate and sharing only the links that the flows together could overload (no other can bind), by
        progressive filling (:func:`~simulator.maxmin.max_min_rates_small` over a few crossings,
        :func:`~simulator.maxmin.max_min_rates_dense` over many: bulk flows cross hundreds of links at unlike
        weights).
        """
        live = sorted(active + [i for _t, i, _b in arrivals])
        solo = [route.solo_rate for route in routes]
        if sum([len(routes[i].ulinks) for i in live]) <= _FILL_SMALL:  # a few crossings: in Python
            cap = self._cap
            demand: dict[int, float] = {}
            for i in live:
                for link, d in zip(routes[i].ulinks, routes[i].demand):
                    demand[link] = demand.get(link, 0.0) + d
            rows = [((), ())] * len(routes)
            for i in live:
                pairs = [(link, m) for link, m in zip(routes[i].ulinks, routes[i].mults)
                         if demand[link] > cap[link] * (1 + 1e-9)]
                rows[i] = (tuple([p[0] for p in pairs]), tuple([p[1] for p in pairs]))
            tight = any(rows[i][0] for i in live)

            def solve(active: list[int]) -> list[float]:
                return max_min_rates_small([rows[i][0] for i in active], [rows[i][1] for i in active], cap,
                                           [solo[i] for i in active])
        else:  # bulk flows cross hundreds of links at unlike weights: the tight ones as a link x flow matrix
            links, weights = [], []
            for i in live:
                route = routes[i]
                if route.arrays is None:
                    links.append(np.array(route.ulinks, dtype=np.intp))
                    weights.append(np.array(route.mults, dtype=float))
                else:
                    links.append(route.arrays[0])
                    weights.append(route.arrays[1])
            flat, mults = np.concatenate(links), np.concatenate(weights)
            flow = np.repeat(np.array(live), [len(ids) for ids in links])
            ids, inverse = np.unique(flat, return_inverse=True)
            demand_of = np.bincount(inverse, weights=np.array(solo)[flow] * mults, minlength=len(ids))
            is_tight = demand_of > self.capacity[ids] * (1 + 1e-9)
            tight = bool(is_tight.any())
            if tight:
                row = np.cumsum(is_tight) - 1
                on = is_tight[inverse]
                matrix = np.zeros((int(row[-1]) + 1, len(routes)))
                matrix[row[inverse[on]], flow[on]] = mults[on]
                capacity = self.capacity[ids[is_tight]]

            def solve(active: list[int]) -> list[float]:
                return max_min_rates_dense(matrix[:, active], capacity, np.array([solo[i] for i in active])).tolist()
        arrivals.sort(key=lambda a: a[0])  # (stable: equal times arrive in the order given)
        due = [_INF] * len(routes)
        for i in active:
            due[i] = since[i] + left[i] / rate[i]
        nxt, last = 0, len(arrivals)
        while nxt < last or active:
            now = min(arrivals[nxt][0] if nxt < last else _INF, min([due[i] for i in active], default=_INF))
            limit = now * (1 + _REL_TIME_EPS) + 1e-18
            if active:
                staying = []
                for i in active:
                    if due[i] <= limit:
                        recs[i][1] = now
                    else:
                        staying.append(i)
                active = staying
            while nxt < last and arrivals[nxt][0] <= limit:
                _at, i, nbytes = arrivals[nxt]
                nxt += 1
                recs[i] = [now, now, []]
                left[i] = nbytes
                rate[i] = 0.0
                since[i] = now
                active.append(i)
            if not active:
                continue
            if tight:
                rates = solve(active)
                if not min(rates) > 0.0:
                    return False
            else:
                rates = [solo[i] for i in active]
            for i, r in zip(active, rates):
                old = rate[i]
                if r != old:
                    if since[i] != now:
                        left[i] -= old * (now - since[i])
                        since[i] = now
                    rate[i] = r
                    recs[i][2].append((now, r))
                    due[i] = now + left[i] / r
        return True

    def _join_replay(self, call: _Call, traffic_class: str, join: _Join) -> bool:
        """``call`` starts on links a replay alone holds (a TP all-gather of the backward on its own stream
        beside the reduce-scatter on the compute stream), the rest idle: work out from now the trajectory of
        both, the replay's flows in the state its trajectory gives them and the call's arriving after their
        latencies, and let the session replay that, the call as a part of it told at its own end. Returns
        False (nothing done) where no replay holds the links alone, or it holds ``_JOIN_PARTS`` calls not yet
        done (each join works out all their flows again: a chain of pipeline sends onto a long exchange's
        links would cost its length squared), or the flows are more than ``_JOIN_FLOWS`` or cross more than
        ``_FILL_SMALL`` links in all (worked out with numpy, a join costs more than the event loop it saves);
        the call's flows then start and make the replay real when they arrive (:meth:`_materialize`). Calls
        already booked leave the session, their links' busy time booked up to now.
        Exact up to rounding as a joint session's replay is: until something else comes onto the links,
        these flows are alone on them.
        """
        if call.n > _JOIN_FLOWS or call.crossings > _FILL_SMALL:
            return False  # (the cheap refusals first: this is asked of every call that finds its links taken)
        session = self._sole_holder(call)
        if session is None or session.traj is None or session.undecided or session.done:
            return False
        if session.parts is None:
            parts = [_Part(session.call, session.traffic_class, session.join, 0, session.key, None)]
        else:  # the calls not booked yet (those booked are left out from now on)
            parts = [part for part in session.parts if not part.done]
        if (len(parts) >= _JOIN_PARTS or sum([part.n for part in parts]) + call.n > _JOIN_FLOWS
                or sum([part.call.crossings for part in parts]) + call.crossings > _FILL_SMALL):
            return False  # (worked out with numpy, a join costs more than the event loop it saves)
        now = self.env.now
        limit = now * (1 + _REL_TIME_EPS) + 1e-18
        t0, traj = session.t0, session.traj
        routes: list[_Route] = []
        recs: list = []
        left: list[float] = []
        rate: list[float] = []
        since: list[float] = []
        active: list[int] = []
        arrivals: list[tuple[float, int, float]] = []
        firsts = []
        joined = _Part(call, traffic_class, join, 0, -1, None, now)
        for part in parts + [joined]:
            i = part.first
            firsts.append(len(routes))
            start = t0 if part.start is None else part.start
            for route, nbytes, latency_s in part.call.moving:
                k = len(routes)
                routes.append(route)
                left.append(0.0)
                rate.append(0.0)
                since.append(now)
                if part is joined:
                    recs.append(None)
                    arrivals.append((now + latency_s, k, nbytes))
                    continue
                admitted, finished, steps = traj.flows[i]
                i += 1
                t_in = t0 + admitted
                if t_in > limit:  # not admitted yet
                    recs.append(None)
                    arrivals.append((start + latency_s, k, nbytes))
                    continue
                if t0 + finished <= limit:  # done by now (booked when its call's end comes)
                    recs.append([t_in, t0 + finished, [(t0 + off, r) for off, r in steps]])
                    continue
                reached, remaining, prev, t_prev = _replayed_until(t0, steps, t_in, nbytes, limit)
                recs.append([t_in, t_in, [(t0 + off, r) for off, r in steps[:reached]]])
                left[k], rate[k] = remaining - prev * (now - t_prev), prev
                active.append(k)
        if not self._fill(routes, recs, left, rate, since, active, arrivals):
            return False
        self._book_busy_before(session, now, limit)  # the new trajectory's busy time begins now
        parts.append(joined)
        for part, first in zip(parts, firsts):
            part.first = first
        session.parts = parts
        new = tuple([link for link in call.ids if self._owner[link] != session.sid])
        if new:
            added = np.array(new, dtype=np.intp)
            session.ids, session.arr = session.ids + new, np.concatenate([session.arr, added])
            session.arr.flags.writeable = False
            self._mark_owner(new, added, session.sid)
        session.traj = _trajectory_of(t0, recs, session.arr, routes, now)
        for part in parts:
            part.end = max([rec[1] for rec in recs[part.first:part.first + part.n]], default=now) - t0
            self._pending_seq += 1
            heapq.heappush(self._replays_due, (t0 + part.end, self._pending_seq, session))
            self._wake(max(t0 + part.end, now))
        self.replays += 1
        self.joined_replays += 1
        self._start_tiny(call, traffic_class, join)
        return True

    def _remember(self, key: int, traj: _Trajectory, size: int) -> None:
        """Keep ``traj`` as the trajectory of shape ``key`` (``size``: its flows and rate changes; all are
        forgotten at once past ``_MEMO_ENTRIES``)."""
        self._memo_flows += size
        if self._memo_flows > _MEMO_ENTRIES:
            self._memo.clear()
            self._memo_flows = size
        self._memo[key] = traj

    def _replay(self, session: _Session, traj: _Trajectory, call: _Call, traffic_class: str,
                join: _Join) -> None:
        """Book ``traj`` for this call at ``t0 + duration`` unless another flow comes first."""
        self._replaying(session, traj, call, traffic_class, join)
        self.replays += 1
        self._pending_seq += 1
        end = self.env.now + traj.duration
        heapq.heappush(self._replays_due, (end, self._pending_seq, session))
        self._wake(end)

    def _replaying(self, session: _Session, traj: _Trajectory, call: _Call, traffic_class: str,
                   join: _Join) -> None:
        """Make ``session`` replay ``traj`` for ``call`` (no flow of it exists, so a call starting now may
        still join it) and start the call's latency-bound flows, which are never recorded."""
        session.traj = traj
        session.call, session.specs, session.traffic_class, session.join = call, call.specs, traffic_class, join
        session.open = True
        if call.tiny:  # (most calls have none: a replay per TP collective makes this a hot path)
            self._start_tiny(call, traffic_class, join)

    def _start_tiny(self, call: _Call, traffic_class: str, join: _Join) -> None:
        """Start the latency-bound flows of a call whose other flows are replayed or wait (:meth:`_tiny`)."""
        now = self.env.now
        for route, nbytes, latency_s, payload in call.tiny:
            self._tiny(Flow(route, nbytes, payload, traffic_class, join, now), latency_s, nbytes / route.solo_rate)

    # ------------------------------------------------------ joint sessions
    # DeepEP starts its NVLink forwarding at the instant it starts the RDMA hop, over links the hop's flows
    # cross too: neither call finds its links free, so neither was recorded or replayed. A call that starts
    # at the instant a session started, whose links are taken by that session alone (the rest idle) and
    # none of whose flows is admitted yet, joins it instead: the session records (and later replays) the
    # calls together, each call told at its own end. Exact for the same reason one call's replay is: the
    # calls' flows, alone on their links, follow one trajectory whenever they start together.

    def _host(self, call: _Call, now: float) -> _Session | None:
        """The session ``call`` (starting at ``now``, its links taken) can join, or None: the one session
        holding any of its links, started at ``now`` and still ``open`` (no flow of it admitted: a recording
        session's flows all have positive latencies; a replaying or undecided one has no flows), its other
        links idle."""
        session = self._sole_holder(call)
        if session is None or not session.open or session.t0 != now:
            return None
        return session

    def _sole_holder(self, call: _Call) -> _Session | None:
        """The one session holding any of ``call``'s links when its other links are idle, else None."""
        arr = call.arr
        owners = self._owner_np[arr]
        held = owners != 0
        sids = owners[held]
        if not len(sids) or count_nonzero(sids != sids[0]):
            return None
        free = arr[~held]
        if len(free) and count_nonzero(self._occupied[free]) and any(map(self._on_link.__getitem__, free.tolist())):
            return None
        return self._sessions[int(sids[0])]

    def _attach(self, session: _Session, call: _Call, key: int, traffic_class: str, join: _Join) -> bool:
        """Make ``call`` (see :meth:`_host`) a part of ``session``: it takes its links too. Returns whether
        its flows wait for the end of the instant (the session replays, or is undecided: :meth:`_decide`);
        else they start now and are recorded with the session's (the session records)."""
        now = self.env.now
        parts = session.parts
        if parts is None:  # its own call becomes the first part
            parts = session.parts = [_Part(session.call, session.traffic_class, session.join, 0, session.key, None)]
        ids = session.ids
        union = self._unions.get((id(ids), id(call.ids)))  # (kept: the same two calls start together often)
        if union is None or union[0] is not ids or union[1] is not call.ids:
            where = dict(zip(ids, range(len(ids))))
            sig = tuple([where.get(link, -1) for link in call.ids])  # its links' positions: part of the shape
            new = tuple([link for link, pos in zip(call.ids, sig) if pos < 0])
            added = np.array(new, dtype=np.intp)
            arr = np.concatenate([session.arr, added])
            added.flags.writeable = arr.flags.writeable = False
            union = (ids, call.ids, sig, new, added, ids + new, arr)
            if len(self._unions) >= _JOINT_UNIONS:
                self._unions.clear()
            self._unions[(id(ids), id(call.ids))] = union
        sig, new, added = union[2:5]
        if new:
            session.ids, session.arr = union[5:]
            self._mark_owner(new, added, session.sid)
        last = parts[-1]
        part = _Part(call, traffic_class, join, last.first + last.n, key, sig)  # (its flows follow the last's)
        parts.append(part)
        if session.traj is None:  # recording: its flows start now (as they would have anyway)
            if call.lead <= 0:
                session.open = False  # admitted this instant: nobody joins after it
            return False
        if not session.undecided:  # a replay begun this instant: undone (this call is not in its trajectory)
            self.replays -= len(parts) - 1
            for earlier in parts[:-1]:
                if earlier.seqs is None:
                    self._reserve(earlier)
            session.undecided = True
            session.matched = False
            self._undecided.append(session)
            self._wake(now)
        elif session.matched:
            joint, i = session.traj.joint, len(parts) - 1
            session.matched = i < len(joint) and joint[i][0] == key and joint[i][1] == sig
        self._reserve(part)
        self._start_tiny(call, traffic_class, join)
        return True

    def _expect(self, session: _Session, traj: _Trajectory, call: _Call, traffic_class: str, join: _Join) -> None:
        """``call`` starts a session whose recorded trajectory is a joint one: it replays if the calls that
        join it by the end of the instant are the ones recorded (:meth:`_decide`)."""
        session.parts = [_Part(call, traffic_class, join, 0, session.key, None)]
        self._reserve(session.parts[0])
        self._replaying(session, traj, call, traffic_class, join)
        session.undecided = session.matched = True
        self._undecided.append(session)
        self._wake(self.env.now)

    def _reserve(self, part: _Part) -> None:
        """Number a waiting call's flows in the pending queue now, as :meth:`_begin` would have, so that
        when they are made at the end of the instant they are admitted in the same order."""
        seqs: dict[float, int] = {}
        for (_links, _nbytes, latency_s, _payload), tiny in zip(part.call.specs, part.call.is_tiny):
            if not tiny and latency_s not in seqs:
                self._pending_seq += 1
                seqs[latency_s] = self._pending_seq
        part.seqs = seqs

    def _decide(self, session: _Session) -> None:
        """At the end of a joint session's first instant: replay it if its calls are the recorded ones, in
        order and over links placed alike; else start their flows and record them together."""
        session.undecided = False
        parts = session.parts
        joint = session.traj.joint
        if session.matched and len(parts) == len(joint):
            t0 = session.t0
            for part, (_key, _sig, _n, end) in zip(parts, joint):
                part.end = end
                self._pending_seq += 1
                heapq.heappush(self._replays_due, (t0 + end, self._pending_seq, session))
                self._wake(t0 + end)
            self.replays += len(parts)
            return
        session.traj = None  # recorded anew, every call's flows made now
        session.open = all(part.call.lead > 0 for part in parts)
        for part in parts:
            self._occupy(part.call.arr, part.join)
            self._begin(part.call, part.traffic_class, part.join, session, part.seqs)

    def _joint_done(self, session: _Session) -> None:
        """Book the calls of a replaying joint session whose end has come; at the last, its links' busy time."""
        limit = self.env.now * (1 + _REL_TIME_EPS) + 1e-18
        t0, traj = session.t0, session.traj
        waiting = []
        booked = []
        for part in session.parts:
            if part.done:
                continue
            if t0 + part.end > limit:
                waiting.append(part.call.arr)
                continue
            part.done = True
            booked.append(part.call.arr)
            n = self._book(t0, part.call, part.traffic_class, traj, part.first)[1]
            join = part.join
            join.left -= n
            if join.left == 0:
                self._joins_done.append(join)
        if not waiting:
            session.done = True
            pos, a, b = traj.busy
            np.add.at(self.ledger._busy_np, session.arr[pos], b - a)  # in order (exact)
            self._release(session)
        elif booked:  # links only finished calls crossed are free again (a call that follows one may take them)
            # (what setdiff1d of the two gave, without its sorts: the session's links among the finished calls'
            # given back, then those the waiting calls cross taken again; duplicates set the same value)
            owner, sid = self._owner_np, session.sid
            freed, held = np.concatenate(booked), np.concatenate(waiting)
            held = held[owner[held] == sid]
            owner[freed[owner[freed] == sid]] = 0
            owner[held] = sid

    def _new_book(self, call: _Call, traj: _Trajectory, first: int) -> tuple:
        """What a whole replay of ``traj`` for ``call`` books, made once per (call, trajectory, first) and kept
        in ``call.books`` as ``(traj, book, {traffic class: its ledger rows, bytes, payloads and members})``
        (the last filled by :meth:`_book`); returns that entry. ``first``: where the call's flows start among
        the trajectory's (a joint session's call), or -1 for a call replayed on its own, whose book holds its
        links' busy time too. ``book``: ``(finished flows as (route, nbytes, payload), rate log times relative
        to the start, route ids, deltas, (links, busy seconds) or None, flows)``, in the order the flows would
        have booked them (times and busy seconds as lists of floats when there are a few, else arrays)."""
        done = []
        offs: list[float] = []
        ridx: list[int] = []
        deltas: list[float] = []
        i = start = max(first, 0)
        for route, (_links, nbytes, _latency_s, payload), tiny in zip(call.routes, call.specs, call.is_tiny):
            if tiny:
                continue
            _admitted, finished, rates = traj.flows[i]
            i += 1
            prev = 0.0
            for off, r in rates:
                offs.append(off)
                ridx.append(route.idx)
                deltas.append(r - prev)
                prev = r
            if rates:
                offs.append(finished)
                ridx.append(route.idx)
                deltas.append(-prev)
            done.append((route, nbytes, payload))
        pos, a, b = traj.busy if first < 0 else ((), None, None)
        if len(offs) <= _FEW_ENTRIES and len(pos) <= _FEW_ENTRIES:
            # a few entries: booked by Python floats (the same additions, one by one, as numpy's)
            busy = (call.arr[pos].tolist(), (b - a).tolist()) if first < 0 else None
            book = (done, offs, array("q", ridx).tobytes(), array("d", deltas).tobytes(), busy, i - start)
        else:
            busy = (call.arr[pos], b - a) if first < 0 else None
            book = (done, np.array(offs, dtype=float), array("q", ridx).tobytes(), array("d", deltas).tobytes(),
                    busy, i - start)
        if len(call.books) > 8:
            call.books.clear()
        entry = call.books[id(traj) if first < 0 else (id(traj), first)] = (traj, book, {})
        return entry

    def _replay_done(self, session: _Session) -> None:
        """Book a replay whose end has come (its call's ``on_done`` is told at the end of the update)."""
        if session.done or session.traj is None:
            return  # made real before its end (or a replay undone: _attach)
        if session.parts is not None:
            self._joint_done(session)
            return
        session.done = True
        ledger = self.ledger
        (busy_links, busy_s), n = self._book(session.t0, session.call, session.traffic_class, session.traj, -1)
        if type(busy_s) is list:
            busy = ledger._busy_acc
            for link, seconds in zip(busy_links, busy_s):
                busy[link] += seconds
        else:
            np.add.at(ledger._busy_np, busy_links, busy_s)  # in order, as a loop of += would (exact)
        self._release(session)
        join = session.join
        join.left -= n
        if join.left == 0:
            self._joins_done.append(join)

    def _book(self, t0: float, call: _Call, cls: str, traj: _Trajectory, first: int) -> tuple:
        """Book the rate log entries and the ledger rows of ``call``'s flows replayed from ``traj`` (started at
        ``t0``; ``first``: see :meth:`_new_book`); returns ``(busy, n)``: the busy time its book holds (``first``
        -1, else None) and how many of its flows were booked."""
        ledger = self.ledger
        hit = call.books.get(id(traj) if first < 0 else (id(traj), first))
        if hit is None or hit[0] is not traj:
            hit = self._new_book(call, traj, first)
        (done, offs, ridx, deltas, busy, n), per_class = hit[1], hit[2]
        # The same additions as the flows would have made, in the same order (t0 + offset per entry).
        if type(offs) is list:
            ledger.rate_t.extend([t0 + off for off in offs])
        else:
            ledger.rate_t.frombytes((t0 + offs).tobytes())
        ledger.rate_route.frombytes(ridx)
        ledger.rate_delta.frombytes(deltas)
        entries = per_class.get(cls)
        if entries is None:  # first replay of this trajectory in this class: the ledger's own bookkeeping
            record = ledger.record_route
            for route, nbytes, payload in done:
                record(route, nbytes, cls, payload)
            # ... after which every (route, class) row exists (the ledger never drops one): keep them.
            by_route = ledger._by_route
            rows = [by_route[(route.idx, cls)] for route, _nbytes, _payload in done]
            sizes = [nbytes for _route, nbytes, _payload in done]
            payloads = [payload for _route, _nbytes, payload in done]
            if len(rows) >= _SMALL_COMPONENT:  # as arrays, for np.add.at
                rows, sizes, payloads = (np.array(rows, dtype=np.intp), np.array(sizes, dtype=float),
                                         np.array(payloads, dtype=float))
            per_class[cls] = (rows, sizes, payloads, sum(route.members for route, _n, _p in done))
        else:  # the same additions record_route makes, in the same order
            rows, sizes, payloads, members = entries
            wire, paid, total = ledger._wire, ledger._payload, ledger._total
            if isinstance(rows, np.ndarray):
                np.add.at(np.frombuffer(wire, dtype=float), rows, sizes)
                np.add.at(np.frombuffer(paid, dtype=float), rows, payloads)
                np.add.at(np.frombuffer(total, dtype=float), rows, sizes)
            else:
                for row, nbytes, payload in zip(rows, sizes, payloads):
                    wire[row] += nbytes
                    paid[row] += payload
                    total[row] += nbytes
            if len(rows):
                ledger._unfolded = True
            ledger.flows_completed += members
        return busy, n

    def _book_busy_before(self, session: _Session, now: float, limit: float) -> None:
        """Book the busy time ``session``'s trajectory gives its links up to ``now`` (``limit``: ``now`` and the
        instants within ``_REL_TIME_EPS`` of it)."""
        t0 = session.t0
        pos, a, b = session.traj.busy
        begun = t0 + a < limit  # each link's intervals in order of time: those begun by now
        a, b = t0 + a[begun], t0 + b[begun]
        np.add.at(self.ledger._busy_np, session.arr[pos[begun]], np.minimum(b, now) - a)  # in order (exact)

    def _materialize(self, session: _Session) -> list[Flow]:
        """Make a replaying session's flows real at the current instant, in the state its trajectory gives
        them (admitted or not, finished or not, rate and bytes left); book what happened before. Returns
        the flows the trajectory admits at this very instant (they join the current update's arrivals)."""
        session.done = True
        self.materialized += 1
        self._release(session)
        if session.parts is None:
            calls = [(session.call, session.traffic_class, session.join, 0, session.t0)]
            self._occupy(session.arr, session.join)  # its flows are real from now on
        else:  # a joint session: its calls not booked yet
            calls = [(p.call, p.traffic_class, p.join, p.first, session.t0 if p.start is None else p.start)
                     for p in session.parts if not p.done]
            for call, _cls, join, _first, _start in calls:
                self._occupy(call.arr, join)
        env = self.env
        now = env.now
        limit = now * (1 + _REL_TIME_EPS) + 1e-18
        before = now * (1 - _REL_TIME_EPS) - 1e-18
        traj = session.traj
        t0 = session.t0
        ledger = self.ledger
        log_t, log_route, log_delta = ledger.rate_t.append, ledger.rate_route.append, ledger.rate_delta.append
        on_link, demand, busy_since = self._on_link, self._demand, self._busy_since
        now_arrivals: list[Flow] = []
        active: list[Flow] = []
        for call, cls, join, i, start in calls:
            for route, (_links, nbytes, latency_s, payload), tiny in zip(call.routes, call.specs, call.is_tiny):
                if tiny:
                    continue
                admitted, finished, rates = traj.flows[i]
                i += 1
                flow = Flow(route, nbytes, payload, cls, join, now)
                t_in = t0 + admitted
                if t_in > limit:  # not admitted yet
                    self._pending_seq += 1
                    at = start + latency_s
                    heapq.heappush(self._pending, (at, self._pending_seq, [flow]))
                    self._wake(at)
                    continue
                if t_in >= before:  # admitted at this very instant
                    now_arrivals.append(flow)
                    continue
                reached, remaining, prev, t_prev = _replayed_until(t0, rates, t_in, nbytes, limit)
                last = 0.0
                for off, r in rates[:reached]:
                    log_t(t0 + off)
                    log_route(route.idx)
                    log_delta(r - last)
                    last = r
                if t0 + finished <= limit:  # done by now
                    if rates:
                        log_t(t0 + finished)
                        log_route(route.idx)
                        log_delta(-prev)
                    flow.seq = -2
                    ledger.record_route(route, nbytes, cls, payload)
                    join.left -= 1
                    continue
                flow.remaining = remaining - prev * (now - t_prev)
                flow.rate = prev
                flow.t0 = now
                active.append(flow)
        self._book_busy_before(session, now, limit)
        kepoch = self._kepoch
        for flow in active:
            if self._lazy_count:
                self._track(flow, flow.rate)
            route = flow.route
            if route.kepoch != kepoch:
                self._keep(route)
            for link, d in zip(route.klinks, route.kdemand):
                flows = on_link[link]
                if flows:
                    demand[link] += d
                else:
                    busy_since[link] = now
                    demand[link] = d
                flows[flow] = None
            self._seq += 1
            flow.seq = self._seq
            heapq.heappush(self._heap, (now + flow.remaining / flow.rate, self._seq, flow))
        self._active += len(active)
        for _call, _cls, join, _first, _start in calls:
            if join.left == 0:  # every flow had finished by now (the replay's own end is due this instant)
                self._joins_done.append(join)
        return now_arrivals

    # ------------------------------------------------------------ internals
    def _dominance(self, route: _Route) -> list[int]:
        """Keep track of links whose constraint another link implies, and leave them out of max-min.

        Link ``l`` is *dominated* by link ``d`` when every route seen so far that crosses ``l`` also
        crosses ``d``, at least ``cap(d) / cap(l)`` times as often: then ``sum rate·crossings <= cap(d)``
        on ``d`` implies it on ``l``, so ``l`` can never be a bottleneck and never couples flows that
        ``d`` does not (exact). A GPU's PCIe link to its NIC is dominated by the NIC's port (every flow
        that enters the NIC leaves through it, and the port is slower). The candidate ``d`` is the
        slower neighbour of ``l`` on the first route that crosses it; a later route that crosses ``l``
        without ``d`` undoes it for good. A dominated link is never *tight* (its ``_tight_at`` is
        infinite, :meth:`_new_route`); demand, busy time and bytes are kept for it as for any link.
        Returns the links whose dominator changed.
        """
        dominator = self._dominator
        ulinks, mults = route.ulinks, route.mults
        marks = list(map(dominator.__getitem__, ulinks))
        if not ulinks or max(marks) == -2:
            return []  # every link not dominated for good already (-2 is the least mark): nothing can change
        cap = self._cap
        changed: list[int] = []
        where: dict[int, float] | None = None
        entries: list[int] | None = None
        first: dict[int, int] = {}
        # (the links not dominated for good picked in C; each link's mark is read before the loop sets it)
        for link, m, d in compress(zip(ulinks, mults, marks), map((-2).__ne__, marks)):
            if where is None:
                where = route._mult_of if route._mult_of is not None else dict(zip(ulinks, mults))
            if d == -1:
                if entries is None:
                    entries = route.links.tolist()
                    for i, x in enumerate(entries):
                        first.setdefault(x, i)
                i = first[link]
                best = -2
                for j in (i - 1, i + 1):
                    if 0 <= j < len(entries):
                        c = entries[j]
                        if c != link and cap[c] < cap[link] and where[c] * cap[link] >= m * cap[c]:
                            best = c
                            break
                dominator[link] = best
                if best >= 0:
                    changed.append(link)
                continue
            md = where.get(d)
            if md is None or md * cap[link] < m * cap[d]:
                dominator[link] = -2
                changed.append(link)
        return changed

    def _twins(self, route: _Route) -> list[int]:
        """Keep track of *twin* links, and leave all but one of each set out of max-min. Returns the links
        whose class changed.

        Links are twins when every route seen so far crosses all of them equally often (or none of them)
        and their capacities are equal: their constraints are then one and the same (same flows, same
        crossings, same capacity), so max-min needs only one of them — the class's *representative*; the
        others are never tight (exact: identical constraints saturate together and freeze the same
        flows). The NIC ports at one position in every server of a uniform all-to-all are twins (every
        grouped wave crosses all of them once, or none). Classes are refined (partition refinement) as
        routes appear: a route splits each class it crosses into the links it crosses ``m`` times, per
        ``m``, and the rest; a split never merges again. Demand, busy time and bytes are kept for every
        link as before.
        """
        ulinks = route.ulinks
        alone = self._twin_alone
        if all(map(alone.__getitem__, ulinks)):
            return []  # every link a class of its own already: no class to split (the common case, quickly)
        twin_of = self._twin_of
        members = self._twin_members
        rep = self._twin_rep
        groups: dict[tuple, list[int]] = {}
        get = groups.get
        for key, link in zip(zip(map(twin_of.__getitem__, ulinks), route.mults, map(self._cap.__getitem__, ulinks)),
                             ulinks):
            group = get(key)
            if group is None:
                groups[key] = [link]
            else:
                group.append(link)
        changed: list[int] = []
        for (old, _m, _c), links in groups.items():
            if old >= 0 and len(links) == len(members[old]):
                continue  # the whole class crosses the route equally often: still twins
            new = self._next_twin
            self._next_twin += 1
            moved = set(links)
            members[new] = moved
            for link in links:
                twin_of[link] = new
            changed += links
            if len(links) == 1:
                alone[links[0]] = 1
            if old < 0:
                rep[new] = links[0]
                if len(links) > 1:  # links no route crossed before (never under a flow): the others mirror it
                    kept = self._kept
                    for link in links[1:]:
                        kept[link] = 0
                    self._kepoch += 1
                continue
            rest = members[old]
            rest -= moved
            if len(rest) == 1:
                alone[next(iter(rest))] = 1
            if rep[old] in moved:
                rep[new] = rep[old]
                rep[old] = min(rest) if len(rest) < 64 else next(iter(rest))
                self._unmirror(rep[old], rep[new])
                changed.append(rep[old])
            else:
                rep[new] = links[0]
                self._unmirror(links[0], rep[old])
        return changed

    def _unmirror(self, link: int, source: int) -> None:
        """``link``, a twin that mirrored ``source`` (its class's representative until now, whose state is
        every member's), keeps its own state from now on: ``source``'s flows (in their order), demand, busy
        time, and each aggregate's count and crossings of it."""
        self._kept[link] = 1
        self._kepoch += 1
        flows = self._on_link[source]
        if flows:
            self._on_link[link].update(flows)
            self._busy_since[link] = self._busy_since[source]
            for e in flows:
                if type(e) is _Agg:
                    e.nlinks[link] = e.nlinks[source]
                    e._mult_of[link] = e._mult_of[source]
        self._demand[link] = self._demand[source]
        busy = self.ledger._busy_acc
        busy[link] = busy[source]

    def _mirrors(self) -> tuple[np.ndarray, np.ndarray]:
        """The links that mirror another (see ``_kept``) and the representative each mirrors."""
        ids = np.flatnonzero(np.frombuffer(self._kept, dtype=np.uint8) == 0)
        if not len(ids):
            return ids, ids
        reps = np.full(self._next_twin, -1, dtype=np.int64)
        reps[np.fromiter(self._twin_rep.keys(), dtype=np.int64)] = np.fromiter(self._twin_rep.values(), dtype=np.int64)
        classes = np.fromiter(map(self._twin_of.__getitem__, ids.tolist()), dtype=np.int64, count=len(ids))
        return ids, reps[classes]

    def _keep(self, route: _Route) -> None:
        """Bring a route's kept links (``klinks``, with their ``kdemand`` and ``kmults``) up to date."""
        ulinks = route.ulinks
        keep = bytes(map(self._kept.__getitem__, ulinks))
        if keep.count(0):
            route.klinks = tuple(compress(ulinks, keep))
            route.kdemand = tuple(compress(route.demand, keep))
            route.kmults = tuple(compress(route.mults, keep))
        else:
            route.klinks, route.kdemand, route.kmults = ulinks, route.demand, route.mults
        route.kepoch = self._kepoch

    def _new_route(self, route: _Route) -> None:
        """A flow over links not seen before will join max-min sharing: update dominated and twin links, and
        the tightness thresholds they imply (a link may be tight unless it is dominated or a twin other than
        its class's representative).

        Told once per route content (``_Route.told``), when a call first has a flow over it that is not
        latency-bound (:meth:`_call`): a latency-bound flow (:meth:`_tiny`) never joins a max-min problem,
        so its links cannot make a constraint matter. (Told of every route as it was made, a tree all-reduce
        of a few KB, whose flows cross NICs that no bulk flow crosses together, split twin classes and
        undid dominance for every bulk flow after it: the DeepSeek-V3 entry's component searches walked
        ~3x the links.)"""
        changed = self._dominance(route)
        if changed:
            dominated, dominator = self._dominated, self._dominator
            for link in changed:
                dominated[link] = dominator[link] >= 0
        if self.twins:
            changed += self._twins(route)
        if not changed:
            return
        tight_at, cap, dominator = self._tight_at, self._cap, self._dominator
        twin_of, rep = self._twin_of, self._twin_rep
        inf = float("inf")
        bumped = False
        for link in changed:
            c = twin_of[link]
            t = inf if dominator[link] >= 0 or (c >= 0 and rep[c] != link) else cap[link] * (1 + 1e-9)
            if t != tight_at[link]:
                tight_at[link] = t
                bumped = True
        if bumped:
            self._epoch += 1
            self._wepoch += 1
            if self._next_agg:  # (none to dissolve if none was ever made)
                self._dissolve_on(changed)  # members' rows may now differ

    def _finish(self, flow: Flow) -> None:
        session = flow.session
        if session is not None:
            session.left -= 1
            if session.left == 0:
                self._end_session(session)
        self.ledger.record_route(flow.route, flow.nbytes, flow.traffic_class, flow.payload)
        join = flow.join
        join.left -= 1
        if join.left == 0:
            join.on_done()

    def _wake(self, at: float) -> None:
        """Make sure an update runs at instant ``at`` or earlier (after that instant's NORMAL events).

        An update always schedules the wake-up for the next thing due, so one
        pending wake-up at or before ``at`` is enough.
        """
        wakes = self._wakes
        if not wakes or at < wakes[0]:
            heapq.heappush(wakes, at)
            _LateEvent(self.env, at - self.env.now, at).callbacks.append(self._on_wake)

    def _on_wake(self, event: Event) -> None:
        wakes = self._wakes
        while wakes and wakes[0] <= event._value:
            heapq.heappop(wakes)
        self._update()

    def _update(self) -> None:
        """Retire finished flows, admit arrivals, re-rate the touched components, schedule the next wake-up.

        Any late event at the current instant may run it: every NORMAL event of
        the instant has run, so whatever is due now is known.
        """
        now = self.env.now
        heap = self._heap
        seeds: dict[int, None] = {}  # tight links whose flows changed company
        seed_flows: list[Flow] = []
        finished: list[Flow] = []
        level = float("inf")  # lowest rate among finished flows that shared a tight link
        on_link = self._on_link
        busy_since = self._busy_since
        demand = self._demand
        tight_at = self._tight_at
        limit = now * (1 + _REL_TIME_EPS) + 1e-18
        ledger = self.ledger
        log_t, log_route, log_delta = ledger.rate_t.append, ledger.rate_route.append, ledger.rate_delta.append
        if self._undecided:  # joint sessions begun this instant: every call that could join them has
            undecided, self._undecided = self._undecided, []
            for session in undecided:
                self._decide(session)
        replays = self._replays_due
        while replays and replays[0][0] <= limit:
            self._replay_done(heapq.heappop(replays)[2])
        while heap and heap[0][0] <= limit:
            _, seq, flow = heapq.heappop(heap)
            if seq != flow.seq:
                continue  # stale entry: the flow was re-rated since
            if type(flow) is _Agg:
                if self._agg_due(flow, now, limit, finished, seeds) and flow.rate < level:
                    level = flow.rate
                continue
            flow.seq = -2
            finished.append(flow)
            if flow.rec is not None:
                flow.rec[1] = now
            log_t(now)
            log_route(flow.route.idx)
            log_delta(-flow.rate)
            if self._lazy_count:
                self._track(flow, -flow.rate)
            if self._depart(flow, None, now, seeds) and flow.rate < level:
                level = flow.rate
        self._active -= len(finished)
        pending = self._pending
        arrivals: list[Flow] = []
        while pending and pending[0][0] <= limit:
            for flow in heapq.heappop(pending)[2]:
                if flow.nbytes <= 0 or not flow.route.ulinks:
                    finished.append(flow)  # nothing to move: done on arrival
                else:
                    arrivals.append(flow)
        if arrivals and self.replay:
            arrivals += self._intrusions(arrivals)
        lonely: list[Flow] = []  # arrivals on slack links only: alone in their component (unless joined)
        if arrivals:
            kepoch = self._kepoch
            for flow in arrivals:
                flow.t0 = now
                if flow.rec is not None:
                    flow.rec[0] = now
                route = flow.route
                if route.kepoch != kepoch:
                    self._keep(route)
                coupled = False
                for link, d in zip(route.klinks, route.kdemand):
                    flows = on_link[link]
                    if flows:
                        dl = demand[link] = demand[link] + d
                        if dl > tight_at[link]:
                            coupled = True
                    else:
                        busy_since[link] = now
                        demand[link] = d
                    flows[flow] = None
                if coupled:
                    seed_flows.append(flow)
                else:
                    lonely.append(flow)
            self._active += len(arrivals)
        if seeds or seed_flows:
            self._rerate(now, seeds, seed_flows, lonely, 0.0 if seed_flows else level)
        elif lonely:
            self.rate_solves += 1
            self._solo(now, lonely)
        if len(heap) > 4 * self._active + 1024:
            self._heap = heap = [e for e in heap if e[1] == e[2].seq]
            heapq.heapify(heap)
        while heap and heap[0][1] != heap[0][2].seq:
            heapq.heappop(heap)  # stale entries of re-rated flows: never wake up for them
        if heap:
            self._wake(max(heap[0][0], now))
        if pending:
            self._wake(pending[0][0])
        if replays:
            self._wake(replays[0][0])
        for flow in finished:
            self._finish(flow)
        if self._joins_done:
            joins, self._joins_done = self._joins_done, []
            for join in joins:
                join.on_done()

    def _depart(self, flow: Flow, agg: _Agg | None, now: float, seeds: dict[int, None]) -> bool:
        """Take a finished ``flow`` (a member of ``agg``, or on its own) off its links: demand, busy time,
        and the tight links whose flows change company (into ``seeds``). Returns whether it shared a tight
        link with a flow that stays (then flows at or above its rate may change)."""
        on_link, demand, tight_at = self._on_link, self._demand, self._tight_at
        busy, busy_since = self.ledger._busy_acc, self._busy_since
        shared = False
        route = flow.route
        if route.kepoch != self._kepoch:
            self._keep(route)
        if agg is None:  # (the common case: a flow on its own, in a loop of its own)
            for link, d in zip(route.klinks, route.kdemand):
                flows = on_link[link]
                del flows[flow]
                if flows:
                    if demand[link] > tight_at[link]:  # (tight before it leaves)
                        seeds[link] = None
                        shared = True
                    demand[link] -= d
                else:
                    demand[link] = 0.0
                    if seeds:
                        seeds.pop(link, None)
                    busy[link] += now - busy_since[link]
            return shared
        nlinks, crossings = agg.nlinks, agg._mult_of
        for link, d, m in zip(route.klinks, route.kdemand, route.kmults):
            flows = on_link[link]
            c = nlinks[link] - 1
            if c:
                nlinks[link] = c
                crossings[link] -= m
            else:
                del nlinks[link], crossings[link], flows[agg]
            was_tight = demand[link] > tight_at[link]
            if flows:
                demand[link] -= d
                if was_tight:
                    seeds[link] = None
                    shared = True
            else:
                demand[link] = 0.0
                if seeds:
                    seeds.pop(link, None)
                busy[link] += now - busy_since[link]
        return shared

    # ---------------------------------------------------------- aggregates
    def _agg_due(self, agg: _Agg, now: float, limit: float, finished: list[Flow], seeds: dict[int, None]) -> bool:
        """Retire the members of ``agg`` whose service target is reached by ``limit``; schedule its next.
        Returns whether one shared a tight link with a flow that stays (see :meth:`_depart`)."""
        rate = agg.rate
        members = agg.heap
        shared = False
        lsum = agg.lwepoch == self._wepoch and self._lazy_count
        while members and agg.ts + (members[0][0] - agg.svc) / rate <= limit:
            flow = heapq.heappop(members)[2]
            flow.seq = -2
            finished.append(flow)
            agg.n -= 1
            self.ledger.log_span(agg.id, flow.route, flow.t0, now)
            if self._lazy_count:
                self._track(flow, -rate)
            if lsum:
                self._lazy_sums(agg, flow, -1)
            shared |= self._depart(flow, agg, now, seeds)
        agg.svc += rate * (now - agg.ts)
        agg.ts = now
        agg.wepoch = -1  # its row (the members' times their number) changed
        if members:
            self._seq += 1
            agg.seq = self._seq
            heapq.heappush(self._heap, (now + (members[0][0] - agg.svc) / rate, self._seq, agg))
        else:
            agg.seq = -2
        return shared

    def _lazy_sums(self, agg: _Agg, flow: Flow, sign: int) -> None:
        """Add (``sign`` 1) or take away (-1) a member's crossings of lazy links to/from ``agg``'s sums."""
        route = flow.route
        if route.wepoch != self._wepoch:
            self._refresh(route)
        lsum, lcount = agg.lsum, agg.lcount
        for link, m in route.lpairs:
            c = lcount.get(link, 0) + sign
            if c:
                lcount[link] = c
                lsum[link] = lsum.get(link, 0.0) + sign * m
            else:
                del lcount[link], lsum[link]

    def _refresh_agg(self, agg: _Agg) -> None:
        """:meth:`_refresh` for an aggregate: the members' common row times their number, and the lazy
        links' crossings summed over members (rebuilt when laziness changed since they were summed)."""
        # A member's route: the members' common row. (Not the first member's for good: once it has left,
        # a link only it crossed may change its role without dissolving the aggregate.)
        rep = agg.rep = agg.heap[0][2].route
        if rep.wepoch != self._wepoch:
            self._refresh(rep)
        n = agg.n
        agg.wpairs = tuple([(link, m * n) for link, m in rep.wpairs])
        agg.wlinks = rep.wlinks
        if self._lazy_count:
            if agg.lwepoch != self._wepoch:
                agg.lsum, agg.lcount = {}, {}
                agg.lwepoch = self._wepoch
                for member in agg.heap:
                    self._lazy_sums(agg, member[2], 1)
            agg.lpairs = tuple(agg.lsum.items())
        else:
            agg.lpairs = ()
        agg.larrays = None
        agg.wepoch = self._wepoch

    def _fold(self, now: float, entities: list) -> None:
        """Fold ``entities`` (flows and aggregates of one row and rate, see :class:`_Agg`) into one
        aggregate: the largest aggregate among them, or a new one."""
        aggs = [e for e in entities if type(e) is _Agg]
        if aggs:
            target = max(aggs, key=lambda a: a.n)
            target.svc += target.rate * (now - target.ts)
            target.ts = now
        else:
            first = entities[0]
            target = _Agg(self._next_agg, first.route, first.rate, now)
            self._next_agg += 1
            self.ledger.log_aggregate_rate(target.id, now, target.rate)
        on_link = self._on_link
        ledger = self.ledger
        for e in entities:
            if e is target:
                continue
            if type(e) is _Agg:
                e.svc += e.rate * (now - e.ts)
                for link in e.nlinks:
                    del on_link[link][e]
                for goal, _tie, flow in e.heap:
                    ledger.log_span(e.id, flow.route, flow.t0, now)
                    self._join(target, flow, goal - e.svc, now)
                e.clear()
            else:
                route = e.route
                if route.kepoch != self._kepoch:
                    self._keep(route)
                for link in route.klinks:
                    del on_link[link][e]
                ledger.log_rate(now, e.route, -e.rate)
                e.seq = -3  # its heap entry is stale: it finishes with the aggregate
                self._join(target, e, e.remaining - e.rate * (now - e.t0), now)
        target.wepoch = -1
        self._seq += 1
        target.seq = self._seq
        heapq.heappush(self._heap, (now + (target.heap[0][0] - target.svc) / target.rate, self._seq, target))

    def _join(self, agg: _Agg, flow: Flow, remaining: float, now: float) -> None:
        """Make ``flow`` (``remaining`` bytes left) a member of ``agg`` from ``now``."""
        flow.t0 = now  # a member's t0: when it joined
        self._agg_tie += 1
        heapq.heappush(agg.heap, (agg.svc + remaining, self._agg_tie, flow))
        agg.n += 1
        self.aggregated += 1
        nlinks, crossings, on_link = agg.nlinks, agg._mult_of, self._on_link
        route = flow.route
        if route.kepoch != self._kepoch:
            self._keep(route)
        for link, m in zip(route.klinks, route.kmults):
            c = nlinks.get(link)
            if c is None:
                nlinks[link] = 1
                crossings[link] = m
                on_link[link][agg] = None
            else:
                nlinks[link] = c + 1
                crossings[link] += m
        if agg.lwepoch == self._wepoch and self._lazy_count:
            self._lazy_sums(agg, flow, 1)

    def _dissolve(self, agg: _Agg, now: float) -> None:
        """Make every member of ``agg`` a flow on its own again (at the aggregate's rate, with the bytes it
        has left): a link under it changed its role, so the members' rows may differ from now on."""
        self.dissolved += 1
        agg.svc += agg.rate * (now - agg.ts)
        agg.ts = now
        on_link, ledger, rate = self._on_link, self.ledger, agg.rate
        for link in agg.nlinks:
            del on_link[link][agg]
        for goal, _tie, flow in agg.heap:
            ledger.log_span(agg.id, flow.route, flow.t0, now)
            ledger.log_rate(now, flow.route, rate)
            flow.rate = rate
            flow.remaining = goal - agg.svc
            flow.t0 = now
            route = flow.route
            if route.kepoch != self._kepoch:
                self._keep(route)
            for link in route.klinks:
                on_link[link][flow] = None
            self._seq += 1
            flow.seq = self._seq
            heapq.heappush(self._heap, (now + flow.remaining / rate, self._seq, flow))
        agg.clear()

    def _dissolve_on(self, links) -> None:
        """Dissolve the aggregates on any of ``links``."""
        on_link, now = self._on_link, self.env.now
        kept, twin_of, rep = self._kept, self._twin_of, self._twin_rep
        for link in links:
            held = link if kept[link] else rep[twin_of[link]]  # (a mirror's flows are on its representative)
            for e in [e for e in on_link[held] if type(e) is _Agg]:
                self._dissolve(e, now)

    def _merge(self, now: float, components: list) -> None:
        """Fold the flows and aggregates of equal rows, solo rates and rates in each large component."""
        for component in components:
            flows = component[0]
            if len(flows) < _AGG_MIN:
                continue
            # Grouped by rate first (a float: cheap to hash; most flows of a large component are alone at
            # theirs), then by row and solo rate within the groups of equal rates; the groups are folded in
            # order of their first member, as one grouping by (row, solo rate, rate) would give them.
            by_rate: dict[float, list] = {}
            for f in flows:
                if f.rec is not None:
                    continue  # being recorded for replays
                group = by_rate.get(f.rate)
                if group is None:
                    by_rate[f.rate] = [f]
                else:
                    group.append(f)
            folds = []
            for same_rate in by_rate.values():
                if len(same_rate) < 2:
                    continue
                groups: dict[tuple, list] = {}
                for f in same_rate:
                    route = f.route
                    key = (route.rep.wpairs if type(f) is _Agg else route.wpairs, route.solo_rate)
                    group = groups.get(key)
                    if group is None:
                        groups[key] = [f]
                    else:
                        group.append(f)
                folds.extend(group for group in groups.values() if len(group) > 1)
            if len(folds) > 1:
                pos = {f: i for i, f in enumerate(flows)}
                folds.sort(key=lambda group: pos[group[0]])
            for group in folds:
                self._fold(now, group)

    def _intrusions(self, arrivals: list[Flow]) -> list[Flow]:
        """Arrivals onto links another session holds end that session's isolation: a recording one is
        not kept, a replaying one is made real now. Returns flows the replays admit at this instant."""
        owner, sessions = self._owner, self._sessions
        extra: list[Flow] = []
        owner_np = self._owner_np
        for flow in arrivals:
            mine = 0 if flow.session is None else flow.session.sid
            route = flow.route
            if route.arrays is not None:  # a long route: the loop below only if it would find something
                held = owner_np[route.arrays[0]]
                if not count_nonzero((held != mine) & (held != 0) if mine else held):
                    continue
            for link in route.ulinks:
                sid = owner[link]
                if sid and sid != mine:
                    other = sessions[sid]
                    if other.traj is None:
                        self._stop_recording(other)
                    else:
                        extra += self._materialize(other)
        return extra

    def _components(self, seeds: dict[int, None], seed_flows: list[Flow], level: float
                    ) -> tuple[list[tuple[list[Flow], list[tuple], list[tuple], list[float], list[int]]], set[Flow]]:
        """Components of flows whose rate may change: connected through tight links, rate >= ``level``.

        ``level`` is the lowest rate of the flows that just left (0 when flows
        arrived: then everything connected may change). Progressive filling
        below that level runs exactly as before — the departed flows' links
        saturated at or above their own rate — so every flow frozen below it
        keeps its rate (relative tolerance 1e-9 for rounding). Such *fixed*
        flows are not searched through; what they use of a tight link is taken
        off its capacity for the re-solve.

        Each component comes as its max-min problem on local link ids (in order
        of first appearance): ``(flows, links, mults, capacity)`` with
        ``links[i]`` / ``mults[i]`` the tight links flow ``i`` crosses and how
        often, ``capacity[j]`` what is left of local link ``j`` (bytes/s), ``glinks[j]`` its link id:
        ``(flows, links, mults, capacity, glinks)``. Lazy links (:meth:`_rerate`) neither couple flows nor
        enter the problems. Also returns the set of flows in components. Deterministic.
        """
        on_link = self._on_link
        demand = self._demand
        tight_at = self._tight_at
        cap = self._cap
        floor = level * (1 - 1e-9)
        fixed = floor > 0
        seen: set[Flow] = set()
        seen_add, seen_update, seen_superset = seen.add, seen.update, seen.issuperset
        out = []
        starts = list(seed_flows)
        if seeds:
            # The flows on the seed links (each once, in order of first appearance; in C) at or above the
            # level. A lazy link couples nobody (see _rerate).
            lazy = self._lazy
            coupling = compress(seeds, map(not_, map(lazy.__getitem__, seeds)))
            starts += [f for f in dict.fromkeys(chain.from_iterable(map(on_link.__getitem__, coupling)))
                       if f.rate >= floor]
        wepoch = self._wepoch
        refresh = self._refresh
        demand_of, tight_of = demand.__getitem__, tight_at.__getitem__
        second = itemgetter(1)
        for start in starts:
            if start in seen:
                continue
            seen_add(start)
            flows: list[Flow] = []
            flow_links: list[tuple] = []
            flow_mults: list[tuple] = []
            capacity: list[float] = []
            local: dict[int, int] = {}
            local_get = local.get
            # Long rows walked in this component, by their links tuple: (which are tight, their local ids).
            # Flows over equal links (a bulk call's body and tail, DeepEP's hop and its forwarding) find
            # the same tight links (tightness is the link's) and local ids; only their crossings differ.
            walked: dict[int, tuple] = {}
            stack = [start]
            pop, push, extend = stack.pop, stack.append, stack.extend
            # Hot loop (every flow of every re-rated component): names bound once, the common cases
            # (every link of the route tight; arrivals, where nobody is fixed) without per-item calls.
            while stack:
                flow = pop()
                flows.append(flow)
                route = flow.route
                if route.wepoch != wepoch:
                    refresh(route)
                wlinks = route.wlinks
                # (the tight ones picked in C: most links of a route are slack)
                if len(wlinks) >= _LONG_ROW:
                    hit = walked.get(id(wlinks))
                    if hit is not None:
                        flow_links.append(hit[1])
                        flow_mults.append(tuple(map(second, compress(route.wpairs, hit[0]))))
                        continue
                    mask = list(map(gt, map(demand_of, wlinks), map(tight_of, wlinks)))
                    tight = compress(route.wpairs, mask)
                else:
                    mask = None
                    tight = compress(route.wpairs, map(gt, map(demand_of, wlinks), map(tight_of, wlinks)))
                ls = []
                ms = []
                for link, m in tight:
                    j = local_get(link)
                    if j is None:
                        j = local[link] = len(capacity)
                        if fixed:
                            used = 0.0  # by fixed flows
                            for other in on_link[link]:
                                if other.rate < floor:
                                    mo = other.route._mult_of
                                    used += (1 if mo is None else mo[link]) * other.rate
                                elif other not in seen:
                                    seen_add(other)
                                    push(other)
                            capacity.append(cap[link] - used)
                        else:  # arrivals: nobody is fixed
                            here = on_link[link]
                            if not seen_superset(here):  # (in C: mostly flows already found)
                                fresh = [other for other in here if other not in seen]
                                seen_update(fresh)
                                extend(fresh)
                            capacity.append(cap[link] - 0.0)
                    ls.append(j)
                    ms.append(m)
                row = tuple(ls)
                flow_links.append(row)
                flow_mults.append(tuple(ms))
                if mask is not None:
                    walked[id(wlinks)] = (mask, row)
            out.append((flows, flow_links, flow_mults, capacity, list(local)))
        return out, seen

    def _interned(self, links: tuple) -> tuple:
        """One tuple object for equal tuples of links (a component search recognises equal rows by identity)."""
        table = self._links_interned
        kept = table.get(links)
        if kept is None:
            if len(table) >= _MEMO_SHAPES:
                table.clear()
            kept = table[links] = links
        return kept

    def _refresh(self, route: _Route) -> None:
        """Bring a route's links that may be tight (not dominated, not a twin left out) up to date, split
        into those that are not lazy (``wpairs``) and the lazy ones (``lpairs``), as (link, crossings)."""
        if type(route) is _Agg:
            self._refresh_agg(route)
            return
        # (Tuples derived before from the same links are kept: a new epoch seldom changes a given route's.)
        if route.cepoch != self._epoch:
            ulinks = route.ulinks
            at = list(map(self._tight_at.__getitem__, ulinks))
            keep = list(map(_INF.__ne__, at)) if _INF in at else None
            if route.cepoch < 0 or keep != route.ckeep:
                if keep is not None:
                    route.cpairs = tuple(compress(zip(ulinks, route.mults), keep))
                    route.clinks = self._interned(tuple(compress(ulinks, keep)))
                else:  # (the pairs as they are, as the filter keeps them all)
                    route.cpairs = tuple(zip(ulinks, route.mults))
                    route.clinks = ulinks
                route.ckeep = keep
                route.wflags = None
            route.cepoch = self._epoch
        if self._lazy_count:
            cpairs, clinks = route.cpairs, route.clinks
            flags = list(map(self._lazy.__getitem__, clinks))
            if flags != route.wflags:
                if True in flags:
                    route.wpairs = tuple(compress(cpairs, map(not_, flags)))
                    route.wlinks = self._interned(tuple(compress(clinks, map(not_, flags))))
                    route.lpairs = tuple(compress(cpairs, flags))
                else:  # no lazy link on the route (the common case): its pairs as they are
                    route.wpairs = cpairs
                    route.wlinks = clinks
                    route.lpairs = ()
                route.larrays = None
                route.wflags = flags
        else:
            route.wpairs = route.cpairs
            route.wlinks = route.clinks
            route.lpairs = ()
            route.wflags = None
        route.wepoch = self._wepoch

    def _rerate(self, now: float, seeds: dict[int, None], seed_flows: list[Flow], lonely: list[Flow],
                level: float) -> None:
        """Re-solve the components of ``seeds`` and ``seed_flows`` above ``level`` (see
        :meth:`_components`); ``lonely`` arrivals not in them run solo (with lazy links, as components of one
        flow, checked against the lazy links with the rest).

        *Lazy links* (exact): a tight link that the last large solve including it left with at least
        ``_LAZY_SLACK`` of its capacity unused (an ECMP-hashed spine link under a uniform all-to-all on a
        1:1 fabric, where the NIC ports bind) is left out of the components and their problems, and
        every solution is checked against it instead: if the rates leave every lazy link within its
        capacity, they are the max-min rates of the full problem (a max-min allocation of a relaxed
        problem that is feasible for the full one is the full one's: its feasible set is a subset);
        otherwise the overloaded links are made strict again and the solve is redone. A link overloaded
        ``_LAZY_STRIKES`` times stays strict. Problems then have a row or two per flow instead of a
        dozen, and the search does not walk through the spine.
        """
        self.rate_solves += 1
        while True:
            components, seen = self._components(seeds, seed_flows, level)
            if lonely and self._lazy_count:
                # Flows admitted onto slack links this instant may share a link that a later arrival of the
                # instant made tight; if that link is lazy the search does not pass through it, so such a
                # flow runs at its solo rate alone, as a component of its own: its load on lazy links is
                # checked with the others' (a lazy link it overloads is made strict, and the search then
                # finds it with the flows it shares that link with).
                alone = [f for f in lonely if f not in seen]
                if alone:
                    for f in alone:
                        if f.route.wepoch != self._wepoch:
                            self._refresh(f.route)  # (its lazy links, which the check reads)
                    components += [([f], [()], [()], [], []) for f in alone]
                    seen.update(alone)
            solved = []
            for flows, flow_links, flow_mults, capacity, _glinks in components:
                if len(flows) == 1:
                    # Progressive filling of one flow: the least of its cap and its tight links' shares.
                    rate = flows[0].route.solo_rate
                    for j, m in zip(flow_links[0], flow_mults[0]):
                        share = capacity[j] / m
                        if share < rate:
                            rate = share
                    solved.append([rate])
                else:
                    solved.append(self._solve(flows, flow_links, flow_mults, capacity))
            if not self._lazy_count:
                break
            overloaded = self._overloaded(components, solved, seen)
            if not overloaded:
                break
            self.lazy_misses += 1
            self._dissolve_on(overloaded)  # their members may cross these links unequally
            lazy, strikes = self._lazy, self._strikes
            for link in overloaded:  # back into the problems; the solve is redone with them
                lazy[link] = False
                strikes[link] += 1
                self._lload[link] = 0.0  # kept for lazy links only
            self._lazy_count -= len(overloaded)
            self._wepoch += 1
        commit = self._pending_loads
        self._pending_loads = None
        for component, rates in zip(components, solved):
            self._set_rates(now, component[0], rates, commit is None)
        if commit is not None:
            np.add.at(self._lload, commit[0], commit[1])
        if self.aggregate:
            self._merge(now, components)
        if self.lazy:
            self._mark_lazy(components, solved)
        if lonely:
            self._solo(now, [f for f in lonely if f not in seen])

    def _solo(self, now: float, flows: list[Flow]) -> None:
        """Flows alone in their component run at their solo rate."""
        self._set_rates(now, flows)

    def _set_rates(self, now: float, flows: list[Flow], rates: list[float] | None = None,
                   track: bool = True) -> None:
        """Give ``flows`` their new ``rates`` (default: their solo rates) and push their finish times.

        A flow whose rate did not change keeps its heap entry. ``track``: add the rate changes to the
        loads of lazy links (else the caller does).
        """
        heap = self._heap
        seq = self._seq
        push = heapq.heappush
        ledger = self.ledger
        log_t, log_route, log_delta = ledger.rate_t.append, ledger.rate_route.append, ledger.rate_delta.append
        # One pass: a flow's lazy-link loads (_track) read nothing the rest of the loop writes, so tracking
        # each flow just before setting it adds the same changes in the same order as a pass of its own.
        track = track and self._lazy_count
        if rates is None:
            rates = [flow.route.solo_rate for flow in flows]
        for flow, rate in zip(flows, rates):
            old = flow.rate
            if rate == old:
                if flow.seq > 0:
                    continue  # same rate: its heap entry (finish time) still holds
            elif track:
                self._track(flow, rate - old)
            if type(flow) is _Agg:  # its clock moves on; its next member's finish comes from it
                flow.svc += old * (now - flow.ts)
                flow.ts = now
                ledger.log_aggregate_rate(flow.id, now, rate)
                flow.rate = rate
                seq += 1
                flow.seq = seq
                push(heap, (now + (flow.heap[0][0] - flow.svc) / rate, seq, flow))
                continue
            if flow.rec is not None:
                flow.rec[2].append((now, rate))
                session = flow.session
                session.budget -= 1
                if session.budget < 0:
                    self._stop_recording(session)
            if flow.t0 != now:
                flow.remaining -= old * (now - flow.t0)
                flow.t0 = now
            log_t(now)
            log_route(flow.route.idx)
            log_delta(rate - old)
            flow.rate = rate
            seq += 1
            flow.seq = seq
            push(heap, (now + flow.remaining / rate, seq, flow))
        self._seq = seq

    def _solve(self, flows: list[Flow], flow_links: list[tuple], flow_mults: list[tuple],
               capacity: list[float]) -> list[float]:
        """Max-min rates of one component (see :meth:`_components` for the arguments); every flow is
        also capped by its solo rate, which stands for all its slack links (they can never bind).

        Components of the same shape — the same pattern of crossings, capacities and caps, as the
        replicas of one collective or the same all-to-all in every EP group produce — are the same
        problem: their rates are solved once and looked up after (exact: the solver is deterministic).
        """
        caps = tuple([f.route.solo_rate for f in flows])
        key = (tuple(flow_links), tuple(flow_mults), tuple(capacity), caps)
        rates = self._solved.get(key)
        if rates is not None:
            self.shape_hits += 1
        else:
            self.component_solves += 1
            if len(flows) <= _SMALL_COMPONENT and len(capacity) <= _SMALL_LINKS:
                rates = max_min_rates_small(flow_links, flow_mults, capacity, caps)
            else:
                rates = _max_min_numpy(flow_links, flow_mults, capacity, caps)
            size = len(flows) + len(capacity) + sum(map(len, flow_links))
            self._solved_flows += size
            if self._solved_flows > _SOLVED_CACHE_ENTRIES:
                self._solved.clear()
                self._solved_flows = size
            self._solved[key] = rates
        return rates

    def _overloaded(self, components: list, solved: list, seen: set[Flow]) -> list[int]:
        """Lazy links that the new rates of ``components`` (``solved``) would load beyond their capacity
        (relative tolerance 1e-9, the tightness tolerance): each lazy link's load is kept up to date as
        rates change (``_lload``); the new rates add their changes. An apparent overload is confirmed by
        summing the link's flows afresh. Leaves the load changes for :meth:`_rerate` to apply in
        ``_pending_loads`` when it computed them in bulk."""
        self._pending_loads = None
        lload = self._lload
        total = sum(len(c[0]) for c in components)
        small = total < 256  # and no aggregate among the flows (found on the way: summing has no side effect)
        if small:
            loads: dict[int, float] = {}
            loads_get = loads.get
            for component, rates in zip(components, solved):
                for flow, rate in zip(component[0], rates):
                    if type(flow) is _Agg:
                        small = False
                        break
                    lpairs = flow.route.lpairs
                    if lpairs:
                        delta = rate - flow.rate
                        for link, m in lpairs:
                            loads[link] = loads_get(link, 0.0) + m * delta
                if not small:
                    break
        if small:
            cap = self._cap
            acc = self._lload_acc
            candidates = [link for link, d in loads.items() if acc[link] + d > cap[link] * (1 + 1e-9)]
        else:
            larrays = self._larrays
            # Only the flows that cross a lazy link add entries (the others' arrays are empty): the same
            # ids and weights, without an empty array per flow.
            picked = [(f, r) for c, rates in zip(components, solved) for f, r in zip(c[0], rates) if f.route.lpairs]
            if not picked:
                return []
            arrays = [larrays(f.route) for f, _r in picked]
            count = len(picked)
            sizes = np.fromiter((len(a[0]) for a in arrays), dtype=np.int64, count=count)
            if not sizes.any():
                return []
            ids = np.concatenate([a[0] for a in arrays])
            old = np.fromiter((f.rate for f, _r in picked), dtype=float, count=count)
            new = np.fromiter((r for _f, r in picked), dtype=float, count=count)
            weights = np.concatenate([a[1] for a in arrays]) * np.repeat(new - old, sizes)
            if len(lload) <= 8 * len(ids):  # a bincount over every link beats sorting the entries
                after = lload + np.bincount(ids, weights=weights, minlength=len(lload))
                candidates = np.flatnonzero(after > self.capacity * (1 + 1e-9)).tolist()
            else:
                uniq, inverse = np.unique(ids, return_inverse=True)
                after = lload[uniq] + np.bincount(inverse, weights=weights)
                candidates = uniq[after > self.capacity[uniq] * (1 + 1e-9)].tolist()
            self._pending_loads = (ids, weights)
        if not candidates:
            return []
        new_rate = {f: r for c, rates in zip(components, solved) for f, r in zip(c[0], rates)}
        out = []
        for link in candidates:
            load = 0.0
            for other in self._on_link[link]:
                mo = other.route._mult_of
                load += (1 if mo is None else mo[link]) * new_rate.get(other, other.rate)
            if load > self._cap[link] * (1 + 1e-9):
                out.append(link)
        if out:
            self._pending_loads = None
        return out

    def _track(self, flow: Flow, delta: float) -> None:
        """Add a change of ``flow``'s rate by ``delta`` to the loads of the lazy links it crosses."""
        route = flow.route
        if route.wepoch != self._wepoch:
            self._refresh(route)
        if type(flow) is _Agg:
            ids, mults = self._larrays(route)
            np.add.at(self._lload, ids, mults * delta)
            return
        lload = self._lload_acc
        for link, m in route.lpairs:
            lload[link] += m * delta

    @staticmethod
    def _larrays(route: _Route | _Agg) -> tuple[np.ndarray, np.ndarray]:
        """A route's (or aggregate's) ``lpairs`` as (link ids, crossings) arrays, made once per refresh."""
        a = route.larrays
        if a is None:
            lp = route.lpairs
            a = route.larrays = (np.array([x for x, _ in lp], dtype=np.int64),
                                 np.array([m for _, m in lp], dtype=float))
        return a

    def _mark_lazy(self, components: list, solved: list) -> None:
        """Make the tight links of large components that their solution leaves slack lazy (see :meth:`_rerate`)."""
        lazy, strikes, cap = self._lazy, self._strikes, self._cap
        slack_of = self._slack_of
        marked = 0
        for (flows, flow_links, flow_mults, capacity, glinks), rates in zip(components, solved):
            if len(flows) < _LAZY_MIN_FLOWS:
                continue
            # What each local link has to spare is a function of the component's shape alone (its
            # rates are, see _solve): kept per rates list of _solved, which a shape seen again returns.
            entry = slack_of.get(id(rates))
            if entry is None or entry[0] is not rates:
                load = [0.0] * len(capacity)
                for ls, ms, rate in zip(flow_links, flow_mults, rates):
                    for j, m in zip(ls, ms):
                        load[j] += m * rate
                spare = [(j, c - x) for j, (c, x) in enumerate(zip(capacity, load)) if c - x > 0]
                if len(slack_of) >= _MEMO_SHAPES:
                    slack_of.clear()
                entry = slack_of[id(rates)] = (rates, spare)  # holds rates: its id is not reused meanwhile
            for j, left in entry[1]:
                link = glinks[j]
                if left > _LAZY_SLACK * cap[link] and strikes[link] < _LAZY_STRIKES:
                    lazy[link] = True
                    marked += 1
                    total = 0.0
                    for other in self._on_link[link]:
                        mo = other.route._mult_of
                        total += (1 if mo is None else mo[link]) * other.rate
                    self._lload_acc[link] = total
        if marked:
            self.lazy_marked += marked
            self._lazy_count += marked
            self._wepoch += 1


def _replayed_until(t0: float, rates: tuple, t_in: float, nbytes: float, limit: float
                    ) -> tuple[int, float, float, float]:
    """How far a replayed flow (``nbytes``, admitted at ``t_in``, its ``rates`` as ``(s after t0, rate)``) has
    got by ``limit``: the rate changes reached, the bytes it had left at the last of them, that rate and when
    (the event loop's arithmetic: bytes left are brought up to date at each rate change)."""
    reached, remaining, prev, t_prev = 0, nbytes, 0.0, t_in
    for off, r in rates:
        t = t0 + off
        if t > limit:
            break
        remaining -= prev * (t - t_prev)
        prev, t_prev = r, t
        reached += 1
    return reached, remaining, prev, t_prev


def _trajectory_of(t0: float, recs: list, links: np.ndarray, routes: list[_Route], busy_from: float = -_INF
                   ) -> _Trajectory:
    """The :class:`_Trajectory` of flows over ``routes`` whose records ``recs`` (absolute times) were worked
    out ahead (every flow moved bytes) for a session started at ``t0`` over ``links``; the links' busy time
    counted from ``busy_from`` on (what came before is booked)."""
    return _Trajectory(max([rec[1] for rec in recs]) - t0, t0, recs, links, routes,
                       [max(rec[0], busy_from) - t0 for rec in recs], [max(rec[1], busy_from) - t0 for rec in recs])


def _busy_intervals(links: np.ndarray, routes: list[_Route], starts: list[float], ends: list[float]
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The busy intervals of ``links`` (distinct ids) under flows on ``routes`` from ``starts[i]`` to ``ends[i]``
    (seconds): each link's intervals merged where they overlap or touch, as ``(pos, a, b)`` arrays link by link
    in the order of ``links`` (``pos``: index into ``links``), each link's in order of time (see
    :class:`_Trajectory`)."""
    counts = [len(route.ulinks) for route in routes]
    crossed = np.fromiter(chain.from_iterable(route.ulinks for route in routes), dtype=np.intp, count=sum(counts))
    order = np.argsort(links, kind="stable")
    pos = order[np.searchsorted(links[order], crossed)]
    a = np.repeat(np.array(starts, dtype=float), counts)
    b = np.repeat(np.array(ends, dtype=float), counts)
    by = np.lexsort((b, a, pos))
    pos, a, b = pos[by], a[by], b[by]
    n = len(pos)
    if n < 2 or not (pos[1:] == pos[:-1]).any():
        return pos, a, b  # every link under one flow at most
    # An interval begins a merged one when it is its link's first or starts after every earlier one of its link
    # has ended. One running maximum serves every link: of (link position, end) pairs, compared in that order
    # (numpy orders complex numbers so; built by assignment, so every part is the number itself, exact).
    key = np.empty(n, dtype=complex)
    key.real = pos
    key.imag = b
    ended = np.maximum.accumulate(key)  # per interval: (its link's position, the latest end of its link so far)
    begins = np.empty(n, dtype=bool)
    begins[0] = True
    begins[1:] = (ended.real[:-1] != pos[1:]) | (a[1:] > ended.imag[:-1])
    first = np.flatnonzero(begins)
    return pos[first], a[first], np.maximum.reduceat(b, first)


def _max_min_numpy(flow_links: list, flow_mults: list, capacity: list, caps: list) -> list[float]:
    """:func:`max_min_rates` on local link ids, with one private link per flow for its cap.

    Entries carry their crossings as weights (one entry per distinct link), which gives exactly the
    rates of one entry per crossing (sums of whole numbers are exact).
    """
    n = len(flow_links)
    sizes = np.fromiter(map(len, flow_links), dtype=np.int64, count=n)
    total = int(sizes.sum())
    links = np.fromiter(chain.from_iterable(flow_links), dtype=np.int64, count=total)
    mults = np.fromiter(chain.from_iterable(flow_mults), dtype=float, count=total)
    entry_flow = np.concatenate([np.arange(n), np.repeat(np.arange(n), sizes)])
    entry_link = np.concatenate([np.arange(n), links + n])
    weight = np.concatenate([np.ones(n), mults])
    cap = np.concatenate([np.asarray(caps, dtype=float), np.asarray(capacity, dtype=float)])
    return max_min_rates(entry_flow, entry_link, cap, n, weight).tolist()


class AnalyticNetwork(_NetworkBase):
    """Contention-free reference: each transfer takes ``latency + nbytes / bottleneck``.

    The bottleneck of a flow that crosses link ``l`` ``k`` times is
    ``min_l capacity[l] / k``. Flows never slow each other down.
    """

    def __init__(self, env: simpy.Environment, capacity: np.ndarray) -> None:
        _NetworkBase.__init__(self, env, capacity)
        self.rate_solves = 0  # instants at which some components were re-rated

    def start_flows(self, specs: Sequence[FlowSpec], traffic_class: str, on_done: Callable[[], None]) -> None:
        """Same contract as :meth:`FlowNetwork.start_flows`."""
        join = _Join(len(specs), on_done)
        if not specs:
            self.env.timeout(0).callbacks.append(lambda _ev: on_done())
            return
        for links, nbytes, latency_s, payload in specs:
            route = self._routes.get(links)
            duration = latency_s
            if route.ulinks and nbytes > 0:
                rate = min(self._cap[l] / m for l, m in zip(route.ulinks, route.mults))
                duration += nbytes / rate
                for link in route.ulinks:
                    self.ledger.add_busy(link, nbytes / rate)
                self.ledger.log_rate(self.env.now + latency_s, route, rate)
                self.ledger.log_rate(self.env.now + duration, route, -rate)
            self.env.timeout(duration, (route, nbytes, payload)).callbacks.append(
                lambda ev, join=join, cls=traffic_class: self._finish(ev._value, cls, join))

    def _finish(self, value: tuple, traffic_class: str, join: _Join) -> None:
        route, nbytes, payload = value
        self.ledger.record_route(route, nbytes, traffic_class, payload)
        join.left -= 1
        if join.left == 0:
            join.on_done()
