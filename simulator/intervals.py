"""Small interval arithmetic on sorted numpy arrays (seconds), for overlap metrics."""

from __future__ import annotations

import numpy as np
import pandas as pd


def union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge possibly overlapping intervals into sorted disjoint ones."""
    if len(starts) == 0:
        return np.zeros(0), np.zeros(0)
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    running_end = np.maximum.accumulate(e)
    new_block = np.empty(len(s), dtype=bool)
    new_block[0] = True
    new_block[1:] = s[1:] > running_end[:-1]
    block = np.cumsum(new_block) - 1
    out_s = s[new_block]
    out_e = np.zeros(len(out_s))
    np.maximum.at(out_e, block, e)
    return out_s, out_e


def length(starts: np.ndarray, ends: np.ndarray) -> float:
    """Total length of disjoint intervals."""
    return float(np.sum(ends - starts))


def overlap(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> float:
    """Length of the intersection of two sets of disjoint sorted intervals."""
    a_s, a_e = a
    b_s, b_e = b
    if len(a_s) == 0 or len(b_s) == 0:
        return 0.0
    # Measure of A ∩ B = |A| + |B| - |A ∪ B|.
    u_s, u_e = union(np.concatenate([a_s, b_s]), np.concatenate([a_e, b_e]))
    return length(a_s, a_e) + length(b_s, b_e) - length(u_s, u_e)


def exposed(comm: tuple[np.ndarray, np.ndarray], compute: tuple[np.ndarray, np.ndarray]) -> float:
    """Time communication runs while no compute runs: ``|comm \\ compute|``."""
    return length(*comm) - overlap(comm, compute)


def grouped_union_length(group: np.ndarray, starts: np.ndarray, ends: np.ndarray, num_groups: int) -> np.ndarray:
    """Length of the union of each group's intervals, for all groups at once.

    ``group[i]`` in ``0..num_groups-1`` owns interval ``[starts[i], ends[i]]``;
    same merge rule as :func:`union` (touching intervals merge).
    """
    out = np.zeros(num_groups)
    if len(starts) == 0:
        return out
    order = np.lexsort((starts, group))
    g, s, e = group[order], starts[order], ends[order]
    first = np.empty(len(g), dtype=bool)
    first[0] = True
    first[1:] = g[1:] != g[:-1]
    # Running end within each group (a cumulative max restarted at every group; exact).
    running = pd.Series(e).groupby(g).cummax().to_numpy()
    new_block = first.copy()
    new_block[1:] |= s[1:] > running[:-1]
    blocks = np.flatnonzero(new_block)
    block_end = np.maximum.reduceat(e, blocks)
    np.add.at(out, g[blocks], block_end - s[blocks])
    return out

