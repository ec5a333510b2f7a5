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
