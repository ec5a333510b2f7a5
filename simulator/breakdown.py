"""Where each rank's step time went: an exact partition into compute, exposed communication, waits and
bubbles.

Every instant of ``[0, step time]`` on a rank is given to exactly one
category, the first of these that is true at that instant. First the
micro-batch work the pipeline schedule is made of:

1. **compute** of a micro-batch: ``forward``, ``backward``, ``recompute``
   (activation recomputation, the ``R…`` ops);
2. **blocking communication** of a micro-batch — a collective on the compute
   stream in flight (TP/SP collectives, MoE all-to-alls, ZeRO-3 gathers):
   ``exposed_<class>``;
3. **waits** — such a collective issued, waiting for the slowest member of its
   group: ``moe_wait`` for expert-parallel all-to-alls (routing imbalance:
   peers still computing their heavier experts), ``sync_wait`` for others;
4. **transfers of a micro-batch** off the compute stream — an activation or
   gradient in flight to or from this rank (``exposed_pp``), a prefetched
   ZeRO-3 parameter gather (``exposed_zero``);
5. **bubble** — none of the above, inside the pipeline window (from 0 to the
   end of the last micro-batch op on any rank): the schedule leaves the GPU
   without micro-batch work. Anything else that runs then (an overlapped
   gradient reduction, the last stage's gradient norm) is hidden in it;

then the rest of the step, after the window:

6. ``optimizer`` (gradient norm and optimizer step) and ``other_compute``;
7. blocking communication and waits outside micro-batches (the gradient-norm
   all-reduce): ``exposed_<class>``, ``sync_wait``;
8. other communication in flight: ``exposed_<class>`` (the gradient
   reduction that did not overlap, ZeRO parameter gathers);
9. **idle** — nothing at all (waiting for other ranks to end the step).

With uniform stages and free communication the bubble is the textbook
``(p-1)/(m+p-1)`` of the window (tested through the engine).

The columns sum to the step time on every rank (tested). ``Result.exposed_comm_by_class``
answers another question — how long each class is in flight outside compute, classes
overlapping each other counted in each — so its figures are at least these.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

COMPUTE_CATEGORIES = ("forward", "backward", "recompute", "optimizer", "other_compute")
WAITS = ("moe_wait", "sync_wait")
_PHASE = {"F": "forward", "B": "backward", "R": "recompute"}
_OPTIMIZER_OPS = ("grad_norm", "optimizer")
_COMPUTE_STREAM = "compute"


def op_category(kind: np.ndarray, name: np.ndarray, micro_batch: np.ndarray, traffic_class: np.ndarray
                ) -> np.ndarray:
    """The category of each op: a compute category, or ``exposed_<class>`` for communication."""
    out = np.empty(len(kind), dtype=object)
    for i, (k, n, mb, cls) in enumerate(zip(kind.tolist(), name.tolist(), micro_batch.tolist(),
                                            traffic_class.tolist())):
        if k != "compute":
            out[i] = f"exposed_{cls}"
        elif mb >= 0 and n[:1] in _PHASE:
            out[i] = _PHASE[n[:1]]
        elif n in _OPTIMIZER_OPS:
            out[i] = "optimizer"
        else:
            out[i] = "other_compute"
    return out


def pipeline_window(ops: pd.DataFrame) -> float:
    """End of the last micro-batch op on the compute stream of any rank (s); 0 without micro-batches."""
    mb = ops[(ops["stream"] == _COMPUTE_STREAM) & (ops["micro_batch"] >= 0)]
    return float(mb["end_s"].max()) if len(mb) else 0.0


def rank_segments(ops: pd.DataFrame, window: float, step_time: float) -> pd.DataFrame:
    """The partition of every rank in ``ops`` as intervals: ``rank, start_s, end_s, category`` with
    adjacent intervals of one category merged (so a bubble is one row)."""
    parts = []
    cat = op_category(ops["kind"].to_numpy(), ops["name"].to_numpy(), ops["micro_batch"].to_numpy(),
                      ops["traffic_class"].to_numpy())
    ops = ops.assign(category=cat)
    for rank, part in ops.groupby("rank", sort=True):
        starts, ends, names = _partition(part, window, step_time)
        parts.append(pd.DataFrame({"rank": rank, "start_s": starts, "end_s": ends, "category": names}))
    if not parts:
        return pd.DataFrame(columns=["rank", "start_s", "end_s", "category"])
    return pd.concat(parts, ignore_index=True)


def time_breakdown(ops: pd.DataFrame, window: float, step_time: float) -> pd.DataFrame:
    """Seconds per category for every rank in ``ops`` (one row per rank; columns sum to ``step_time``)."""
    seg = rank_segments(ops, window, step_time)
    seg["seconds"] = seg["end_s"] - seg["start_s"]
    table = seg.pivot_table(index="rank", columns="category", values="seconds", aggfunc="sum", fill_value=0.0)
    return table[[c for c in category_order(table.columns) if c in table.columns]]


def category_order(names) -> list[str]:
    """Categories in reading order: compute, exposed communication by class, waits, bubble, idle."""
    names = set(names)
    comm = sorted(n for n in names if n.startswith("exposed_"))
    return [*COMPUTE_CATEGORIES, *comm, *WAITS, "bubble", "idle"]


def _partition(ops: pd.DataFrame, window: float, step_time: float) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """One rank's partition (see the module docstring): interval starts, ends and category names."""
    s, e = ops["start_s"].to_numpy(), ops["end_s"].to_numpy()
    issue = ops["issue_s"].to_numpy()
    cat = ops["category"].to_numpy()
    is_compute = ops["kind"].to_numpy() == "compute"
    blocking = (ops["stream"].to_numpy() == _COMPUTE_STREAM) & ~is_compute
    in_mb = ops["micro_batch"].to_numpy() >= 0
    ep = ops["traffic_class"].to_numpy() == "ep"
    waiting = blocking & (issue < s)
    comm_names = sorted(set(cat[~is_compute].tolist()))
    layers: list[tuple[str, np.ndarray]] = []  # (category, selected ops) in priority order; "_" = fixed span

    def comm(mask: np.ndarray) -> None:
        for c in comm_names:
            layers.append((c, mask & (cat == c)))

    # micro-batch work: what the pipeline schedule is made of
    for c in ("forward", "backward", "recompute"):
        layers.append((c, is_compute & (cat == c)))
    comm(blocking & in_mb)
    layers.append(("moe_wait", waiting & in_mb & ep))
    layers.append(("sync_wait", waiting & in_mb & ~ep))
    comm(~is_compute & ~blocking & in_mb)
    layers.append(("bubble", None))
    # the rest of the step: optimizer, gradient synchronisation, waiting for the others
    for c in ("optimizer", "other_compute"):
        layers.append((c, is_compute & (cat == c)))
    comm(blocking & ~in_mb)
    layers.append(("moe_wait", waiting & ~in_mb & ep))
    layers.append(("sync_wait", waiting & ~in_mb & ~ep))
    comm(~is_compute & ~blocking)
    layers.append(("idle", None))

    bounds = np.unique(np.concatenate([np.array([0.0, window, step_time]), s, e, issue[waiting]]))
    bounds = bounds[(bounds >= 0) & (bounds <= step_time)]
    nseg = len(bounds) - 1
    owner = np.full(nseg, -1, dtype=np.int64)
    for li, (name, sel) in enumerate(layers):
        if sel is None:
            ls, le = np.array([0.0]), np.array([window if name == "bubble" else step_time])
        elif name in WAITS:
            ls, le = issue[sel], s[sel]
        else:
            ls, le = s[sel], e[sel]
        if len(ls) == 0:
            continue
        diff = np.zeros(nseg + 1, dtype=np.int64)
        np.add.at(diff, np.searchsorted(bounds, ls), 1)
        np.add.at(diff, np.searchsorted(bounds, le), -1)
        covered = np.cumsum(diff[:-1]) > 0
        owner[(owner < 0) & covered] = li
    # merge neighbouring segments of the same category
    names = np.array([name for name, _ in layers], dtype=object)[owner] if nseg else np.zeros(0, dtype=object)
    keep = np.r_[True, names[1:] != names[:-1]] if nseg else np.zeros(0, dtype=bool)
    first = np.flatnonzero(keep)
    starts = bounds[:-1][first]
    ends = np.r_[starts[1:], bounds[-1]] if len(first) else starts
    return starts, ends, names[first].tolist()
