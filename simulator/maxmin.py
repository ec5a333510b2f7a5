"""Max-min fair rate allocation by progressive filling (vectorised).

Each link is a capacity constraint, each flow a variable (SimGrid's
formulation). A flow may cross a link more than once — a pipelined ring
collective modelled as one flow crosses every ring link — so each
(flow, link) incidence carries a weight, and the constraint of link ``l`` is
``sum_f weight[f, l] * rate[f] <= capacity[l]``.

Progressive filling raises all unfrozen flows' rates together until some link
saturates, freezes every flow crossing a saturated link, and repeats. The
result is the unique max-min fair allocation. The number of rounds is the
number of distinct bottleneck levels, never the number of bytes.
"""

from __future__ import annotations

import numpy as np

_REL_EPS = 1e-12


def max_min_rates(entry_flow: np.ndarray, entry_link: np.ndarray, capacity: np.ndarray,
                  num_flows: int, entry_weight: np.ndarray | None = None) -> np.ndarray:
    """Max-min fair rates (bytes/s) of ``num_flows`` flows.

    Parameters
    ----------
    entry_flow, entry_link : numpy.ndarray of int
        One entry per (flow, link) crossing: flow ``entry_flow[i]`` crosses
        link ``entry_link[i]``. Repeated pairs count as multiple crossings.
    capacity : numpy.ndarray of float
        Capacity in bytes/s of every link id.
    num_flows : int
        Number of flows; a flow with no entries gets rate ``inf``.
    entry_weight : numpy.ndarray of float, optional
        How many crossings each entry stands for (default 1 each): entry ``i``
        loads its link with ``entry_weight[i]`` times the flow's rate. Integer
        weights give exactly the rates of repeating the entries.

    Returns
    -------
    numpy.ndarray
        ``rates[f]`` in bytes/s.

    Examples
    --------
    Two flows sharing one 10 B/s link get 5 B/s each:

    >>> max_min_rates(np.array([0, 1]), np.array([0, 0]), np.array([10.0]), 2)
    array([5., 5.])
    """
    rates = np.zeros(num_flows)
    if num_flows == 0:
        return rates
    links, local_link = np.unique(entry_link, return_inverse=True)
    remaining = capacity[links].astype(float)
    cap_eps = remaining * _REL_EPS
    unfrozen = np.ones(num_flows, dtype=bool)
    has_entry = np.zeros(num_flows, dtype=bool)
    has_entry[entry_flow] = True
    rates[~has_entry] = np.inf
    unfrozen &= has_entry
    num_links = len(links)
    while unfrozen.any():
        live = unfrozen[entry_flow]
        if entry_weight is None:
            load = np.bincount(local_link[live], minlength=num_links).astype(float)
        else:
            load = np.bincount(local_link[live], weights=entry_weight[live], minlength=num_links)
        loaded = load > 0
        share = np.full(num_links, np.inf)
        share[loaded] = remaining[loaded] / load[loaded]
        increment = share.min()
        rates[unfrozen] += increment
        remaining -= increment * load
        saturated = loaded & (remaining <= cap_eps)
        saturated[np.argmin(share)] = True  # guard against rounding: the bottleneck always freezes
        hit = live & saturated[local_link]
        unfrozen[entry_flow[hit]] = False
    return rates


def max_min_rates_small(flow_links: list, flow_mults: list, capacity: list,
                        flow_caps: list | None = None) -> list[float]:
    """Pure-Python progressive filling for small flow sets (same arithmetic as :func:`max_min_rates`).

    ``flow_links[f]`` are the distinct links flow ``f`` crosses, ``flow_mults[f]``
    how many times it crosses each; ``capacity`` is indexable by link id.
    ``flow_caps[f]``, if given, bounds flow ``f``'s rate on its own (a private
    link of that capacity); without it every flow must cross at least one
    link. The rounds perform the same IEEE operations as the vectorised solver
    (share = remaining / load, a common increment, ``remaining -= increment ·
    load``), so both give the same rates.
    """
    n = len(flow_links)
    local: dict[int, int] = {}
    load: list[float] = []
    users: list[int] = []  # unfrozen flows per link (fractional loads need not come back to exactly 0)
    remaining: list[float] = []
    on_link: list[list[int]] = []
    flow_local: list[list[int]] = []
    local_mults = [(1, *m) for m in flow_mults] if flow_caps is not None else flow_mults
    for f in range(n):
        mine = []
        if flow_caps is not None:
            mine.append(len(load))
            load.append(1.0)
            users.append(1)
            remaining.append(float(flow_caps[f]))
            on_link.append([f])
        for link, m in zip(flow_links[f], flow_mults[f]):
            j = local.get(link)
            if j is None:
                j = local[link] = len(load)
                load.append(float(m))
                users.append(1)
                remaining.append(float(capacity[link]))
                on_link.append([f])
            else:
                load[j] += m
                users[j] += 1
                on_link[j].append(f)
            mine.append(j)
        flow_local.append(mine)
    cap_eps = [c * _REL_EPS for c in remaining]
    active = list(range(len(load)))
    rates = [0.0] * n
    frozen = [False] * n
    left = n
    level = 0.0
    while left:
        best = -1
        increment = float("inf")
        for j in active:
            share = remaining[j] / load[j]
            if share < increment:
                increment, best = share, j
        level += increment
        saturated = [best]
        for j in active:
            r = remaining[j] - increment * load[j]
            remaining[j] = r
            if r <= cap_eps[j] and j != best:
                saturated.append(j)
        for j in saturated:
            for f in on_link[j]:
                if not frozen[f]:
                    frozen[f] = True
                    rates[f] = level
                    left -= 1
                    for j2, m in zip(flow_local[f], local_mults[f]):
                        load[j2] -= m
                        users[j2] -= 1
        active = [j for j in active if users[j] > 0]
    return rates


def max_min_rates_dense(crossings: np.ndarray, capacity: np.ndarray, flow_caps: np.ndarray) -> np.ndarray:
    """Progressive filling of a few flows over many links, as a dense matrix (the arithmetic of
    :func:`max_min_rates`, a round at a time over every link at once).

    ``crossings[l, f]``: how many times flow ``f`` crosses link ``l`` (0: it does not); ``capacity[l]`` in
    bytes/s; ``flow_caps[f]`` bounds flow ``f``'s rate on its own (a private link of that capacity). Made for
    the flows of one call worked out ahead (:meth:`simulator.network.FlowNetwork._fill`): a handful of bulk
    all-to-all flows, each over hundreds of links at unlike weights, where :func:`max_min_rates_small` walks
    every crossing in Python at every round (6.8 s of the DeepSeek EP64 rung's run; this: 0.7 s).

    >>> max_min_rates_dense(np.array([[1.0, 1.0]]), np.array([10.0]), np.array([4.0, 100.0])).tolist()
    [4.0, 6.0]
    """
    num_flows = crossings.shape[1]
    rates = np.zeros(num_flows)
    remaining = capacity.astype(float)
    cap_left = flow_caps.astype(float)
    cap_eps = remaining * _REL_EPS
    flow_eps = cap_left * _REL_EPS
    unfrozen = np.ones(num_flows, dtype=bool)
    while unfrozen.any():
        load = crossings[:, unfrozen].sum(axis=1)
        loaded = load > 0
        share = np.full(len(load), np.inf)
        share[loaded] = remaining[loaded] / load[loaded]
        own = np.where(unfrozen, cap_left, np.inf)  # each flow's private link, loaded by itself alone
        increment = min(share.min(), own.min())
        rates[unfrozen] += increment
        remaining -= increment * load
        cap_left[unfrozen] -= increment
        saturated = loaded & (remaining <= cap_eps)
        hit = (crossings[saturated] > 0).any(axis=0) | (unfrozen & (cap_left <= flow_eps))
        if share.min() <= own.min():
            hit[crossings[np.argmin(share)] > 0] = True  # guard against rounding: the bottleneck always freezes
        else:
            hit[np.argmin(own)] = True
        unfrozen &= ~hit
    return rates
