"""Where and when the bytes went: traffic matrices and link bandwidth over time.

Both are rebuilt after the run from what the network recorded while it ran
(:class:`simulator.network.LinkLedger`), so they cost the simulation nothing
but the appends:

* the **traffic matrix** from the payload bytes each route carried, per
  traffic class; the fabric knows which ``(src rank, dst rank)`` hops a route
  carries (:meth:`simulator.fabric.Fabric.pairs_of`) — a pipelined ring's
  transfer is one route over every hop of the ring, each hop carrying an
  equal share;
* **link bandwidth over time** from the rate log: one ``(time, route, Δrate)``
  entry each time a flow's rate changed. A link's rate is the sum of the
  rates of the flows on it, so it is piecewise constant between log entries;
  the series here are exact (no sampling), and their time integral is the
  link's byte count.

Rates are *wire* bytes/s (what the link carries, protocol overhead included,
as ``result.links["bytes"]``); the traffic matrix counts *payload* bytes (what
GPUs send, as ``result.bytes_by_class``).
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

from topologies.cluster import Cluster

from .bulk_alltoall import AllToAllPairs

LEVELS = ("gpu", "node", "leaf")


# ------------------------------------------------------------ argument checks
# One-line errors naming the argument and what is valid, for what a notebook user passes to a result
# (``Result.traffic_matrix``, ``busiest_links``, ``timeline``, ``to_chrome_trace``, the plots).
def check_choice(value: object, valid: Sequence[str], field: str) -> str:
    """``value`` if it is one of the names ``valid``; else ``ValueError``: ``<field>: 'x' unknown; valid: a, b``."""
    if not isinstance(value, str) or value not in valid:
        raise ValueError(f"{field}: {value!r} unknown; valid: {', '.join(valid)}")
    return value


def check_count(value: object, field: str, minimum: int = 0) -> int:
    """``value`` as an ``int`` if it is a whole number (``int`` or numpy integer, not a bool) ``>= minimum``;
    else ``ValueError`` naming ``field``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{field}: need a whole number >= {minimum}, got {value!r}")
    return int(value)


def check_ids(values: object, field: str, what: str, stop: int | None = None, empty_ok: bool = False
              ) -> list[int]:
    """``values`` (a list of ``what``: whole numbers in ``0..stop-1``, or ``>= 0`` when ``stop`` is None) as a
    list of ``int``, each once in the order first given (``[1, 1]`` asked for link 1's series twice, and a trace
    showed a repeated rank's events twice); else ``ValueError`` naming ``field`` and the valid range. Bools are
    refused (``True`` is not rank 1), and an empty list unless ``empty_ok``."""
    valid = f"0..{stop - 1}" if stop is not None else "whole numbers >= 0"
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise ValueError(f"{field}: need a list of {what}s ({valid}), got {values!r}")
    items = list(values)
    if not items and not empty_ok:
        raise ValueError(f"{field}: an empty list selects no {what}; give at least one ({valid})")
    for x in items:
        if isinstance(x, bool) or not isinstance(x, numbers.Integral) or x < 0 or (stop is not None and x >= stop):
            raise ValueError(f"{field}: {x!r} is not a {what}; valid: {valid}")
    return list(dict.fromkeys(int(x) for x in items))


def known_classes(run_classes: Iterable[str] = ()) -> tuple[str, ...]:
    """The traffic classes a traffic matrix can be asked for: a training step's
    (:data:`simulator.sweeps.columns.TRAFFIC_CLASSES`), then ``run_classes`` (those
    of a run's communication ops: a Chakra trace's or a hand-built graph's own names)."""
    from .sweeps.columns import TRAFFIC_CLASSES  # (here: the sweeps package imports the experiment code)
    return tuple(dict.fromkeys([*TRAFFIC_CLASSES, *sorted(run_classes)]))


def check_classes(traffic_class: object, known: Sequence[str]) -> list[str] | None:
    """``traffic_class`` (None, a class name or a list of them) as a list of names each in ``known`` (None for
    None); else ``ValueError`` naming ``traffic_class`` and the valid classes. A known class that carried no
    bytes is valid (its matrix is zeros); an unknown name or an empty list is not."""
    if traffic_class is None:
        return None
    if isinstance(traffic_class, str):
        wanted = [traffic_class]
    elif isinstance(traffic_class, Iterable) and not isinstance(traffic_class, bytes):
        wanted = list(traffic_class)
        if not wanted:
            raise ValueError(f"traffic_class: an empty list selects no traffic; give one or more of "
                             f"{', '.join(known)} (None: all)")
    else:
        raise ValueError(f"traffic_class: need a class name or a list of them, got {traffic_class!r}; valid: "
                         f"{', '.join(known)}")
    for c in wanted:
        check_choice(c, known, "traffic_class")
    return wanted


def rank_labels(cluster: Cluster, level: str) -> list[str]:
    """A label per rank naming its place at ``level``: ``gpu`` (the rank), ``node`` (its server) or
    ``leaf`` (the leaf switch its NIC plugs into; refused where a server's NICs plug into several leaves, as on
    a rail-optimized fabric: a GPU is not in one leaf there)."""
    check_choice(level, LEVELS, "level")
    if level == "gpu":
        return [f"gpu{r}" for r in range(cluster.num_gpus)]
    if level == "node":
        return [f"node{cluster.server_of(r)}" for r in range(cluster.num_gpus)]
    g = cluster.graph  # level "leaf"
    out = []
    for gpu in cluster.gpus:
        leaves = sorted((w for nic in g.successors(gpu) if g.nodes[nic]["kind"] == "nic"
                         for w in g.successors(nic) if g.nodes[w]["kind"] == "leaf"), key=repr)
        if not leaves:
            raise ValueError(f"level: 'leaf' needs GPUs attached to leaf switches; {cluster.name} has none "
                             f"for {gpu} (use 'gpu' or 'node')")
        leaf = leaves[0]  # ("leaf", i) from the builders; a custom fabric's id otherwise
        out.append(f"leaf{leaf[1]}" if isinstance(leaf, tuple) and len(leaf) == 2 else f"leaf {leaf}")
    by_server: dict[int, set[str]] = {}
    for r, label in enumerate(out):
        by_server.setdefault(cluster.server_of(r), set()).add(label)
    if any(len(labels) > 1 for labels in by_server.values()):
        raise ValueError(f"level: 'leaf' places a GPU by its NIC's leaf, and on {cluster.name} the GPUs of one "
                         f"server hang off several leaves (a rail-optimized fabric), so their NVLink traffic would "
                         f"read as leaf to leaf; use 'node', or bytes_by_class_and_tier() for what crossed leaves")
    return out


def pair_bytes(payload_by_route: Sequence[tuple[np.ndarray, str, float]], pairs_of, shares_of=None) -> pd.DataFrame:
    """Payload bytes per ``(src rank, dst rank, traffic class)`` from the ledger's per-route totals.

    ``pairs_of(links)`` gives the hops a route carries; its payload is split
    equally among them (every hop of a transfer carries the same bytes), or
    by ``shares_of(links)`` where that gives fractions (a grouped alltoallv).
    """
    src: list[int] = []
    dst: list[int] = []
    cls: list[str] = []
    nbytes: list[float] = []
    frames = []  # in route order (a pair's bytes are summed in that order): rows built one by one, then the
    # pairs given as arrays (a bulk all-to-all's millions)

    def rows() -> pd.DataFrame:
        frame = pd.DataFrame({"src": np.array(src, dtype=np.int64), "dst": np.array(dst, dtype=np.int64),
                              "traffic_class": cls, "bytes": np.array(nbytes, dtype=float)})
        src.clear(), dst.clear(), cls.clear(), nbytes.clear()
        return frame

    for links, traffic_class, payload in payload_by_route:
        if payload <= 0:
            continue
        hops = pairs_of(links)
        fractions = shares_of(links) if shares_of is not None else None
        share = payload / len(hops)
        if isinstance(hops, AllToAllPairs):
            if src:
                frames.append(rows())
            s, d = hops.arrays()
            frames.append(pd.DataFrame({"src": s, "dst": d, "traffic_class": traffic_class,
                                        "bytes": np.full(len(s), share) if fractions is None
                                        else payload * np.asarray(fractions, dtype=float)}))
            continue
        for k, (s, d) in enumerate(hops):
            src.append(s)
            dst.append(d)
            cls.append(traffic_class)
            nbytes.append(share if fractions is None else payload * fractions[k])
    if src or not frames:
        frames.append(rows())
    df = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
    return df.groupby(["src", "dst", "traffic_class"], as_index=False, sort=True)["bytes"].sum()


def traffic_matrix(pairs: pd.DataFrame, labels: list[str], traffic_class: str | Sequence[str] | None = None,
                   known: Sequence[str] | None = None) -> pd.DataFrame:
    """Square matrix of payload bytes, rows = source, columns = destination, at the level of ``labels``
    (one per rank, from :func:`rank_labels`); every place appears, idle ones with zeros. Traffic that stays
    inside one place (e.g. NVLink traffic at ``node`` level) is on the diagonal.

    ``traffic_class`` must name classes of ``known`` (default :func:`known_classes` of the classes in
    ``pairs``): a typo raises ``ValueError`` rather than giving a matrix of zeros."""
    if known is None:
        known = known_classes(pairs["traffic_class"].unique().tolist())
    wanted = check_classes(traffic_class, known)
    if wanted is not None:
        pairs = pairs[pairs["traffic_class"].isin(wanted)]
    order = list(dict.fromkeys(labels))
    lab = np.array(labels, dtype=object)
    df = pd.DataFrame({"src": lab[pairs["src"].to_numpy()] if len(pairs) else [],
                       "dst": lab[pairs["dst"].to_numpy()] if len(pairs) else [],
                       "bytes": pairs["bytes"].to_numpy()})
    table = df.pivot_table(index="src", columns="dst", values="bytes", aggfunc="sum", fill_value=0.0)
    table = table.reindex(index=order, columns=order, fill_value=0.0).astype(float)
    table.index.name, table.columns.name = "src", "dst"
    return table


# ------------------------------------------------------------------ rate log
def _rate_log(ledger) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ledger's rate log as arrays: ``(times_s, route idx, delta rate in bytes/s)`` (see
    :meth:`simulator.network.LinkLedger.rate_log`)."""
    return ledger.rate_log()


def _route_entries(routes, keep: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CSR of every route's distinct links restricted to ``keep`` (a boolean mask over link ids):
    ``(ptr, link ids, crossings)``."""
    counts, links, mults = [], [], []
    for route in routes:
        n = 0
        for link, m in zip(route.ulinks, route.mults):
            if keep[link]:
                links.append(link)
                mults.append(m)
                n += 1
        counts.append(n)
    ptr = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=ptr[1:])
    return ptr, np.array(links, dtype=np.int64), np.array(mults, dtype=float)


def link_series(ledger, routes, link_ids: Sequence[int]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Exact rate of each link in ``link_ids`` over time: ``{link: (times_s, rates_Bps)}``.

    The rate is ``rates[i]`` from ``times[i]`` until ``times[i + 1]``; the first time is 0 (rate 0 unless
    a flow started then) and the last rate is 0 (every flow has ended). Rounding residues of the running
    sums (below 1e-9 of the largest rate) are set to zero.
    """
    link_ids = [int(x) for x in link_ids]
    keep = np.zeros(ledger.num_links, dtype=bool)
    keep[link_ids] = True
    ptr, elinks, emults = _route_entries(routes, keep)
    t, r, d = _rate_log(ledger)
    per_event = ptr[r + 1] - ptr[r]
    sel = per_event > 0
    t, r, d, per_event = t[sel], r[sel], d[sel], per_event[sel]
    ev = np.repeat(np.arange(len(t)), per_event)
    first = np.repeat(ptr[r], per_event)
    offset = np.arange(len(ev)) - np.repeat(np.cumsum(per_event) - per_event, per_event)
    entry = first + offset
    link, time, delta = elinks[entry], t[ev], d[ev] * emults[entry]
    order = np.lexsort((time, link))
    link, time, delta = link[order], time[order], delta[order]
    out: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    bounds = np.searchsorted(link, link_ids, side="left"), np.searchsorted(link, link_ids, side="right")
    for lid, lo, hi in zip(link_ids, *bounds):
        out[lid] = _step_function(time[lo:hi], delta[lo:hi])
    return out


def tier_series(ledger, routes, tiers: np.ndarray) -> pd.DataFrame:
    """Exact total rate of every tier over time: one row per change point, ``time_s`` and a column of
    bytes/s per tier (the sum over the tier's links of the rate each carries)."""
    names = sorted(set(tiers.tolist()))
    col = {n: i for i, n in enumerate(names)}
    tier_id = np.array([col[x] for x in tiers.tolist()], dtype=np.int64)
    counts = np.zeros((len(routes), len(names)))
    for route in routes:
        for link, m in zip(route.ulinks, route.mults):
            counts[route.idx, tier_id[link]] += m
    t, r, d = _rate_log(ledger)
    order = np.argsort(t, kind="stable")
    t, r, d = t[order], r[order], d[order]
    # Every tier's step function changes at the same distinct times, so they share one time axis.
    columns = {name: _step_function(t, d * counts[r, j])[1] for name, j in col.items()}
    times = _step_function(t, np.zeros(len(t)))[0]
    return pd.DataFrame({"time_s": times, **columns})


def _step_function(time: np.ndarray, delta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Piecewise-constant function from sorted change ``time``s and ``delta``s: ``(times, values)``
    starting at 0 with one point per distinct time; tiny residues of the running sum set to 0."""
    if len(time) == 0:
        return np.zeros(1), np.zeros(1)
    starts = np.flatnonzero(np.r_[True, time[1:] != time[:-1]])
    times = time[starts]
    values = np.cumsum(np.add.reduceat(delta, starts))
    scale = float(np.max(np.abs(values))) if len(values) else 0.0
    values[np.abs(values) <= 1e-9 * scale] = 0.0
    if times[0] > 0:
        times = np.r_[0.0, times]
        values = np.r_[0.0, values]
    return times, values


def integral(times: np.ndarray, rates: np.ndarray) -> float:
    """Bytes under a piecewise-constant rate (the last rate lasts zero time)."""
    return float(np.sum(rates[:-1] * np.diff(times)))


def window_means(times: np.ndarray, rates: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Exact mean rate over each window ``[edges[i], edges[i+1])`` of a piecewise-constant rate: the
    cumulative bytes are piecewise linear, so interpolating them at the edges is exact."""
    cum = np.r_[0.0, np.cumsum(rates[:-1] * np.diff(times))]
    at = np.interp(edges, times, cum)
    return np.diff(at) / np.diff(edges)
