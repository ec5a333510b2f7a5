"""Where each rank's step time went: an exact partition into compute, exposed communication, waits and
bubbles.

Every instant of ``[0, step time]`` on a rank is given to exactly one
category, the first of these that is true at that instant. First the
micro-batch work the pipeline schedule is made of:

1. **compute** of a micro-batch: ``forward``, ``backward``, ``recompute``
   (activation recomputation, the ``R…`` ops), by the first letter of the op's name (``W``: backward);
   a micro-batch's compute op named otherwise is ``other_compute``, here too;
2. **blocking communication** of a micro-batch — a collective on the compute
   stream in flight (TP/SP collectives, MoE all-to-alls, ZeRO-3 gathers):
   ``exposed_<class>``;
3. **waits** — such a collective issued, waiting for the slowest member of its
   group: ``moe_wait`` for expert-parallel all-to-alls (routing imbalance:
   peers still computing their heavier experts), ``sync_wait`` for others;
   an expert-parallel exchange off the compute stream (``moe.shared_expert_overlap``,
   DualPipe's pairs) issued and waiting, with nothing above running, is
   ``moe_wait`` too (below the transfers of item 4);
4. **transfers of a micro-batch** off the compute stream — an activation or
   gradient in flight to or from this rank (``exposed_pp``), a prefetched
   ZeRO-3 parameter gather (``exposed_zero``);
5. **bubble** — none of the above, inside the pipeline window (from 0 to the
   end of the last micro-batch op on any rank; in a joint run each job's own,
   one per step, :func:`group_windows`; without a pipeline each rank's own, so
   that a rank whose micro-batches end first waits as what it waits for, not as
   a bubble: :func:`breakdown_window`): the schedule leaves the GPU
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

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

COMPUTE_CATEGORIES = ("forward", "backward", "recompute", "optimizer", "other_compute")
WAITS = ("moe_wait", "sync_wait")
_PHASE = {"F": "forward", "B": "backward", "W": "backward", "R": "recompute"}  # W: a split backward's weight grads
_OPTIMIZER_OPS = ("grad_norm", "optimizer")
_COMPUTE_STREAM = "compute"

Window = float | Mapping[int, float] | Mapping[int, tuple[tuple[float, float], ...]]
"""The pipeline window of a partition: its end (s) for every rank, or each rank's from a mapping (the jobs of a
joint run each have their own, :func:`group_windows`), or each rank's windows as ``(start, end)`` intervals (a
job that runs several steps of a joint run: one per step)."""


def op_category(kind: np.ndarray, name: np.ndarray, micro_batch: np.ndarray, traffic_class: np.ndarray
                ) -> np.ndarray:
    """The category of each op: a compute category, or ``exposed_<class>`` for communication."""
    code, names = _category_codes(kind, name, micro_batch, traffic_class)
    return np.array(names, dtype=object)[code]


_BASE_CODE = {c: i for i, c in enumerate(COMPUTE_CATEGORIES)}
_PHASE_CODE = {letter: _BASE_CODE[c] for letter, c in _PHASE.items()}


def _category_codes(kind: np.ndarray, name: np.ndarray, micro_batch: np.ndarray, traffic_class: np.ndarray
                    ) -> tuple[np.ndarray, list[str]]:
    """:func:`op_category` as integer codes into a list of category names (the compute categories, then
    ``exposed_<class>`` per class of the communication ops in order of first appearance): the strings are
    looked at once per distinct name and class, not per op."""
    kind = np.asarray(kind, dtype=object)
    compute = kind == "compute"
    in_mb = np.asarray(micro_batch) >= 0
    other = _BASE_CODE["other_compute"]
    out = np.full(len(kind), other, dtype=np.int64)
    # a compute op's category: its name's phase letter in a micro-batch, optimizer (or not) outside one;
    # per distinct name, coded as phase + 8 · optimizer
    names = np.asarray(name, dtype=object)[compute].tolist()
    coded = {x: _PHASE_CODE.get(x[:1], other) + 8 * (x in _OPTIMIZER_OPS) for x in dict.fromkeys(names)}
    code = np.fromiter(map(coded.__getitem__, names), dtype=np.int64, count=len(names))
    in_mb_c = in_mb[compute]
    out[compute] = np.where(in_mb_c, code & 7, np.where(code >= 8, _BASE_CODE["optimizer"], other))
    comm = ~compute
    comm_classes = np.asarray(traffic_class, dtype=object)[comm].tolist()
    classes = {c: len(COMPUTE_CATEGORIES) + i for i, c in enumerate(dict.fromkeys(comm_classes))}
    out[comm] = np.fromiter(map(classes.__getitem__, comm_classes), dtype=np.int64, count=len(comm_classes))
    return out, [*COMPUTE_CATEGORIES, *("exposed_" + c for c in classes)]


def _column(ops, name: str) -> np.ndarray:
    """Column ``name`` of ``ops`` (a DataFrame, or a mapping of column name to array) as a numpy array."""
    col = ops[name]
    return col.to_numpy() if hasattr(col, "to_numpy") else np.asarray(col)


def pipeline_window(ops) -> float:
    """End of the last micro-batch op on the compute stream of any rank (s); 0 without micro-batches.

    ``ops``: a frame like ``Result.rep_ops``, or a mapping of its column names to arrays."""
    sel = (_column(ops, "stream") == _COMPUTE_STREAM) & (_column(ops, "micro_batch") >= 0)
    if not sel.any():
        return 0.0
    end = _column(ops, "end_s")[sel]
    end = end[~np.isnan(end)]  # as pandas' max: missing values skipped
    return float(end.max()) if len(end) else float("nan")


def breakdown_window(ops, groups: Sequence[tuple[int, int]] | None = None, steps: Sequence[int] | None = None
                     ) -> Window:
    """The pipeline window the partition of ``ops`` uses: each group's (:func:`group_windows`) where ``groups``
    run steps of their own; with one pipeline stage (no op of a stage past 0) each rank's own, the end of its
    last micro-batch op (nothing is a bubble without a pipeline; a rank whose micro-batches end before a peer's,
    an expert-parallel peer with more tokens, say, waits for that peer's collectives); else
    :func:`pipeline_window`."""
    if groups:
        return group_windows(ops, groups, steps)
    stage = _column(ops, "stage")
    if len(stage) and stage.max() > 0:
        return pipeline_window(ops)
    ranks, index = np.unique(_column(ops, "rank"), return_inverse=True)
    end = _column(ops, "end_s")
    sel = (_column(ops, "stream") == _COMPUTE_STREAM) & (_column(ops, "micro_batch") >= 0) & ~np.isnan(end)
    last = np.zeros(len(ranks))  # (0 for a rank without micro-batch ops)
    np.maximum.at(last, index[sel], end[sel])
    return dict(zip(ranks.tolist(), last.tolist()))


def rank_segments(ops, window: Window, step_time: float
                  ) -> pd.DataFrame:
    """The partition of every rank in ``ops`` as intervals: ``rank, start_s, end_s, category`` with
    adjacent intervals of one category merged (so a bubble is one row)."""
    import pandas as pd  # here, not at import: ``import simulator`` stays quick

    ranks, seg_rank, start, end, category = _partition(ops, window, step_time)
    if len(seg_rank) == 0:
        return pd.DataFrame(columns=["rank", "start_s", "end_s", "category"])
    first = np.r_[True, (seg_rank[1:] != seg_rank[:-1]) | (category[1:] != category[:-1])]
    idx = np.flatnonzero(first)
    last = np.r_[idx[1:] - 1, len(seg_rank) - 1]
    return pd.DataFrame({"rank": ranks[seg_rank[idx]], "start_s": start[idx], "end_s": end[last],
                         "category": category[idx]})


def time_breakdown(ops, window: float, step_time: float) -> pd.DataFrame:
    """Seconds per category for every rank in ``ops`` (one row per rank; columns sum to ``step_time``).

    ``ops``: a frame like ``Result.rep_ops``, or a mapping of its column names to arrays."""
    return breakdown_frame(*breakdown_arrays(ops, window, step_time))


def breakdown_arrays(ops, window: Window, step_time: float
                     ) -> tuple[np.ndarray, list[str], np.ndarray]:
    """:func:`time_breakdown` as arrays, without pandas: ``(ranks, categories, seconds)``, the distinct ranks
    (sorted), the categories present in reading order (:func:`category_order`) and seconds per rank and
    category (``len(ranks) x len(categories)``)."""
    ranks, seg_rank, start, end, owner, layer_names = _partition_owners(ops, window, step_time)
    # the categories present, sorted, and each segment's index among them (layers share categories)
    present = sorted(set(np.asarray(layer_names, dtype=object)[np.unique(owner)].tolist()))
    position = {c: i for i, c in enumerate(present)}
    code = np.array([position.get(c, -1) for c in layer_names], dtype=np.int64)[owner]
    sums = np.bincount(seg_rank * len(present) + code, weights=end - start,
                       minlength=len(ranks) * len(present)).reshape(len(ranks), len(present))
    names = [c for c in category_order(present) if c in position]
    return ranks, names, sums[:, [position[c] for c in names]]


def breakdown_frame(ranks: np.ndarray, categories: list[str], seconds: np.ndarray) -> pd.DataFrame:
    """The frame of :func:`time_breakdown` from :func:`breakdown_arrays`' arrays: index ``rank``, columns
    ``category``."""
    import pandas as pd  # here, not at import: ``import simulator`` stays quick

    return pd.DataFrame(seconds, index=pd.Index(ranks, name="rank"),
                        columns=pd.Index(np.array(categories, dtype=object), name="category"))


def category_order(names) -> list[str]:
    """Categories in reading order: compute, exposed communication by class, waits, bubble, idle."""
    names = set(names)
    comm = sorted(n for n in names if n.startswith("exposed_"))
    return [*COMPUTE_CATEGORIES, *comm, *WAITS, "bubble", "idle"]


def _layers(ops) -> list[tuple[str, np.ndarray | None, str]]:
    """The partition's layers in priority order: ``(category, selected ops or None for a whole-rank span,
    which interval of each op)``: ``"run"`` from its start to its end (less its members' wait), ``"wait"``
    from its issue to its start, ``"tail"`` its members' wait at its end (optional column ``member_wait_s``:
    a representative's op that its members finish early, on average, to wait for the slowest of them)."""
    kind = np.asarray(_column(ops, "kind"), dtype=object)
    micro_batch = _column(ops, "micro_batch")
    traffic_class = np.asarray(_column(ops, "traffic_class"), dtype=object)
    code, cat_names = _category_codes(kind, _column(ops, "name"), micro_batch, traffic_class)
    cat_code = {c: i for i, c in enumerate(cat_names)}
    is_compute = kind == "compute"
    blocking = (_column(ops, "stream") == _COMPUTE_STREAM) & ~is_compute
    in_mb = micro_batch >= 0
    ep = traffic_class == "ep"
    issued_early = _column(ops, "issue_s") < _column(ops, "start_s")
    waiting = blocking & issued_early
    # an exchange off the compute stream (the overlapped shared expert's, DualPipe's) waited for by an idle
    # compute stream: the same wait for the slowest EP member as a blocking one's
    waiting_aside = ~blocking & ~is_compute & issued_early & ep
    # (``in``: a frame's columns, a mapping's keys)
    tail = (_column(ops, "member_wait_s") > 0) if "member_wait_s" in ops else np.zeros(len(kind), dtype=bool)
    comm_names = sorted(cat_names[len(COMPUTE_CATEGORIES):])  # every class named is that of a communication op
    layers: list[tuple[str, np.ndarray | None, str]] = []

    def comm(mask: np.ndarray) -> None:
        layers.extend((c, mask & (code == cat_code[c]), "run") for c in comm_names)

    # micro-batch work: what the pipeline schedule is made of
    layers.extend((c, is_compute & (code == cat_code[c]), "run") for c in ("forward", "backward", "recompute"))
    # a micro-batch's compute op whose name carries no phase letter (a hand-built graph's "fwd") is micro-batch
    # work too, never a bubble
    layers.append(("other_compute", is_compute & in_mb & (code == cat_code["other_compute"]), "run"))
    comm(blocking & in_mb)
    layers.append(("moe_wait", tail & in_mb, "tail"))
    layers.append(("moe_wait", waiting & in_mb & ep, "wait"))
    layers.append(("sync_wait", waiting & in_mb & ~ep, "wait"))
    comm(~is_compute & ~blocking & in_mb)
    layers.append(("moe_wait", waiting_aside & in_mb, "wait"))
    layers.append(("bubble", None, "run"))
    # the rest of the step: optimizer, gradient synchronisation, waiting for the others
    layers.extend((c, is_compute & (code == cat_code[c]), "run") for c in ("optimizer", "other_compute"))
    comm(blocking & ~in_mb)
    layers.append(("moe_wait", tail & ~in_mb, "tail"))
    layers.append(("moe_wait", waiting & ~in_mb & ep, "wait"))
    layers.append(("sync_wait", waiting & ~in_mb & ~ep, "wait"))
    comm(~is_compute & ~blocking)
    layers.append(("idle", None, "run"))
    return layers


def _unique(values: np.ndarray) -> np.ndarray:
    """``np.unique(values)`` of a 1-D array by sorting (NaNs as one, last): numpy 2.4's hash table is
    ~20x slower than a sort on the million-odd wide-ranged keys of a partition."""
    aux = np.sort(values)
    mask = np.empty(len(aux), dtype=bool)
    mask[:1] = True
    mask[1:] = aux[1:] != aux[:-1]
    if aux.dtype.kind == "f" and len(aux) and np.isnan(aux[-1]):
        first_nan = np.searchsorted(aux, aux[-1], side="left")
        mask[first_nan] = True
        mask[first_nan + 1:] = False
    return aux[mask]


def _partition(ops, window: Window, step_time: float
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every rank's partition at once (see the module docstring).

    Returns ``(ranks, seg_rank, start, end, category)``: the distinct ranks, and per elementary segment
    the index of its rank in ``ranks``, its start and end (s) and its category, ordered by rank and time.
    Segments are cut at every op boundary of their rank; each belongs to the first layer of
    :func:`_layers` covering it. All ranks are done together on exact integer keys
    ``rank index · (number of distinct times) + time code``, so no float offset ever shifts a boundary.
    """
    ranks, seg_rank, start, end, owner, layer_names = _partition_owners(ops, window, step_time)
    return ranks, seg_rank, start, end, np.array(layer_names, dtype=object)[owner]


def _bubble_spans(window: Window, ranks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(rank index, start, end)`` of every pipeline window of ``ranks`` (:data:`Window`); a window given by
    its end starts at 0."""
    nr = len(ranks)
    if not isinstance(window, Mapping):
        return np.arange(nr), np.zeros(nr), np.full(nr, float(window))
    values = [window[r] for r in ranks.tolist()]
    if all(not isinstance(v, tuple) for v in values):
        return np.arange(nr), np.zeros(nr), np.array(values, dtype=float)
    spans = [(i, *span) for i, v in enumerate(values) for span in (v if isinstance(v, tuple) else ((0.0, v),))]
    r, a, b = zip(*spans)
    return np.array(r, dtype=np.int64), np.array(a, dtype=float), np.array(b, dtype=float)


def group_windows(ops, groups: Sequence[tuple[int, int]], steps: Sequence[int] | None = None) -> dict:
    """``{rank: pipeline window}`` (:data:`Window`) where the ranks form ``groups``, ranges ``[lo, hi)`` that
    each run a step of their own (the jobs of :func:`simulator.jobs.run_jobs`): each group's window is the end
    of its own last micro-batch op, so a job whose pipeline ends first reads its gradient sync and optimizer as
    such, not as the bubble of a longer job's pipeline (and its GPUs idle after its last op, to the joint end).

    ``steps``: how many steps each group runs, its ops being that many copies of one step's, one after
    another in ``ops`` (:func:`workloads.ops.merge_graphs`). A group of several steps has a window per step,
    from its first micro-batch op (0 for the first step) to its last, so that each step's gradient sync and
    optimizer read as such too, not as the next step's bubble."""
    rank = _column(ops, "rank")
    stream, micro_batch = _column(ops, "stream"), _column(ops, "micro_batch")
    start, end = _column(ops, "start_s"), _column(ops, "end_s")
    window: dict = {}
    for g, (lo, hi) in enumerate(groups):
        mine = np.flatnonzero((rank >= lo) & (rank < hi))
        k = steps[g] if steps is not None else 1
        if k <= 1 or len(mine) % k:
            w = pipeline_window({"stream": stream[mine], "micro_batch": micro_batch[mine], "end_s": end[mine]})
            window.update(dict.fromkeys(range(lo, hi), w))
            continue
        spans = []
        for i, copy in enumerate(np.split(mine, k)):
            sel = copy[(stream[copy] == _COMPUTE_STREAM) & (micro_batch[copy] >= 0)]
            if len(sel):
                spans.append((0.0 if i == 0 else float(np.nanmin(start[sel])), float(np.nanmax(end[sel]))))
        window.update(dict.fromkeys(range(lo, hi), tuple(spans)))
    return window


def _partition_owners(ops, window: Window, step_time: float
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """:func:`_partition` with each segment's category given as the index of the layer that owns it, in
    the list of the layers' categories (returned last)."""
    ranks, ridx = np.unique(_column(ops, "rank"), return_inverse=True)
    nr = len(ranks)
    layers = _layers(ops)
    if nr == 0:  # (a graph with no ops: no rank, no segment)
        empty = np.zeros(0)
        return ranks, empty.astype(np.int64), empty, empty, empty.astype(np.int64), [n for n, _, _ in layers]
    win_r, win_a, win_b = _bubble_spans(window, ranks)
    stop = np.full(nr, float(step_time))
    s, e, issue = _column(ops, "start_s"), _column(ops, "end_s"), _column(ops, "issue_s")
    cut = e - _column(ops, "member_wait_s") if "member_wait_s" in ops else e  # where the members' wait starts
    spans = []  # (layer index, rank index, start, end) arrays per layer
    every = np.arange(nr)
    for li, (name, sel, part) in enumerate(layers):
        if sel is None:
            a, b, r = (win_a, win_b, win_r) if name == "bubble" else (np.zeros(nr), stop, every)
        else:
            a, b = {"run": (s, cut), "wait": (issue, s), "tail": (cut, e)}[part]
            a, b, r = a[sel], b[sel], ridx[sel]
        keep = b > a
        spans.append((li, r[keep], a[keep], b[keep]))
    fixed_r = np.concatenate([every, win_r, every])  # each rank's 0, window ends, step end
    fixed_t = np.concatenate([np.zeros(nr), win_b, stop])
    times = _unique(np.concatenate([fixed_t, *(x[2] for x in spans), *(x[3] for x in spans)]))
    times = times[(times >= 0) & (times <= step_time)]
    nt = len(times)

    def key(r: np.ndarray, t: np.ndarray) -> np.ndarray:
        return r.astype(np.int64) * nt + np.searchsorted(times, t)

    keys = [(li, key(r, a), key(r, b)) for li, r, a, b in spans]
    bounds = _unique(np.concatenate([key(fixed_r, fixed_t), *(x[1] for x in keys), *(x[2] for x in keys)]))
    nseg = len(bounds) - 1
    owner = np.full(nseg, -1, dtype=np.int64)
    for li, ka, kb in keys:
        if len(ka) == 0:
            continue
        diff = np.bincount(np.searchsorted(bounds, ka), minlength=nseg + 1) - \
            np.bincount(np.searchsorted(bounds, kb), minlength=nseg + 1)
        covered = np.cumsum(diff[:-1]) > 0
        owner[(owner < 0) & covered] = li
    seg_rank = bounds[:-1] // nt
    valid = seg_rank == bounds[1:] // nt  # the last boundary of a rank starts no segment
    return (ranks, seg_rank[valid], times[bounds[:-1][valid] % nt], times[bounds[1:][valid] % nt],
            owner[valid], [name for name, _, _ in layers])
