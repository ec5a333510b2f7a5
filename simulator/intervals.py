"""Small interval arithmetic on sorted numpy arrays (seconds), for overlap metrics."""

from __future__ import annotations

import numpy as np


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
    return GroupedIntervals(group, starts, ends).union_length(None, num_groups)


class GroupedIntervals:
    """Intervals owned by groups, sorted once by group and start, for :meth:`union_length` of many subsets
    (exposed communication takes the union of compute with each traffic class in turn).

    A subset of the sorted order, kept in that order, is the order sorting the subset alone gives (the sort
    is stable: ties stay in index order), so every subset's union is computed as if sorted afresh.
    """

    def __init__(self, group: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> None:
        self.group, self.starts, self.ends = group, starts, ends
        self.order = np.lexsort((starts, group))
        n = len(ends)
        # the rank of every end among all ends, for grouped_cummax's integer keys (see there)
        self.exact = not n or not (np.isnan(ends).any() or (np.signbit(ends) & (ends == 0)).any())
        if self.exact:
            self.end_order = np.argsort(ends, kind="stable")
            self.end_rank = np.empty(n, dtype=np.int64)
            self.end_rank[self.end_order] = np.arange(n, dtype=np.int64)

    def union_length(self, mask: np.ndarray | None, num_groups: int) -> np.ndarray:
        """Length of the union of each group's intervals among those ``mask`` selects (all if None)."""
        order = self.order if mask is None else self.order[mask[self.order]]
        if len(order) == 0:
            return np.zeros(num_groups)
        g, s, e = self.group[order], self.starts[order], self.ends[order]
        first = np.empty(len(g), dtype=bool)
        first[0] = True
        first[1:] = g[1:] != g[:-1]
        if self.exact:  # grouped_cummax(g, e), the ranks shared by every subset
            offset = g.astype(np.int64) * len(self.ends)
            running = self.ends[self.end_order[np.maximum.accumulate(offset + self.end_rank[order]) - offset]]
        else:
            running = grouped_cummax(g, e)
        new_block = first.copy()
        new_block[1:] |= s[1:] > running[:-1]
        blocks = np.flatnonzero(new_block)
        block_end = np.maximum.reduceat(e, blocks)
        # bincount adds each group's blocks in order onto 0.0: the very additions of np.add.at onto zeros
        return np.bincount(g[blocks], weights=block_end - s[blocks], minlength=num_groups)


def grouped_cummax(group: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Running maximum of ``values`` restarted at every group, ``group`` sorted (non-decreasing): pandas'
    ``Series(values).groupby(group).cummax()`` without pandas.

    Exact: maxima are taken of integer keys ``group · n + rank of the value`` (a running maximum cannot
    leave its group, whose keys are all above the previous groups'), then read back as the values they
    rank. Equal values are the same double, so which of them is read back does not matter, except for
    0.0 and -0.0; with a -0.0, or NaNs (which pandas' cummax skips), pandas does it.
    """
    n = len(values)
    if n and (np.isnan(values).any() or (np.signbit(values) & (values == 0)).any()):
        import pandas as pd

        return pd.Series(values).groupby(group).cummax().to_numpy()
    order = np.argsort(values, kind="stable")
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n, dtype=np.int64)
    key = np.maximum.accumulate(group.astype(np.int64) * n + rank)
    return values[order[key - group.astype(np.int64) * n]]
