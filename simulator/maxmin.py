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
                  num_flows: int) -> np.ndarray:
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
        load = np.bincount(local_link[live], minlength=num_links).astype(float)
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
