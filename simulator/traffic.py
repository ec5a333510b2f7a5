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

from collections.abc import Sequence

import numpy as np
import pandas as pd

from topologies.cluster import Cluster

from .bulk_alltoall import AllToAllPairs

LEVELS = ("gpu", "node", "leaf")


def rank_labels(cluster: Cluster, level: str) -> list[str]:
    """A label per rank naming its place at ``level``: ``gpu`` (the rank), ``node`` (its server) or
    ``leaf`` (the leaf switch its NIC plugs into)."""
    if level == "gpu":
        return [f"gpu{r}" for r in range(cluster.num_gpus)]
    if level == "node":
        return [f"node{cluster.server_of(r)}" for r in range(cluster.num_gpus)]
    if level == "leaf":
        g = cluster.graph
        out = []
        for gpu in cluster.gpus:
            leaves = sorted((w for nic in g.successors(gpu) if g.nodes[nic]["kind"] == "nic"
                             for w in g.successors(nic) if g.nodes[w]["kind"] == "leaf"), key=repr)
            if not leaves:
                raise ValueError(f"level: 'leaf' needs GPUs attached to leaf switches; {cluster.name} has none "
                                 f"for {gpu} (use 'gpu' or 'node')")
            leaf = leaves[0]  # ("leaf", i) from the builders; a custom fabric's id otherwise
            out.append(f"leaf{leaf[1]}" if isinstance(leaf, tuple) and len(leaf) == 2 else f"leaf {leaf}")
        return out
    raise ValueError(f"level: {level!r} unknown; valid: {', '.join(LEVELS)}")


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


def traffic_matrix(pairs: pd.DataFrame, labels: list[str], traffic_class: str | Sequence[str] | None = None
                   ) -> pd.DataFrame:
    """Square matrix of payload bytes, rows = source, columns = destination, at the level of ``labels``
    (one per rank, from :func:`rank_labels`); every place appears, idle ones with zeros. Traffic that stays
    inside one place (e.g. NVLink traffic at ``node`` level) is on the diagonal."""
    if traffic_class is not None:
        wanted = [traffic_class] if isinstance(traffic_class, str) else list(traffic_class)
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
