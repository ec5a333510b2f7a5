"""Pipeline-parallel schedules: GPipe, 1F1B, interleaved 1F1B and Zero Bubble H1.

This module answers one question: *in which order does each pipeline rank run
the forward and backward passes of its micro-batches in one training step?*
It is pure Python (no simulator imports) so that the engine, the memory model
and the tests can all share the same orderings.

Conventions
-----------
``p``
    Number of pipeline ranks (``parallel.pp``), ranks ``0..p-1``.
``m``
    Number of micro-batches per step and per pipeline
    (``parallel.global_batch / (parallel.micro_batch * parallel.dp)``).
``v``
    Number of model chunks per rank (``parallel.virtual_stages``). Rank ``r``
    chunk ``c`` is *virtual stage* ``c * p + r`` of the ``p * v`` stage model,
    as in Megatron-LM's interleaved schedule.

Orderings reproduced
--------------------
``"gpipe"``
    All ``m`` forwards in micro-batch order, then all ``m`` backwards in
    *reverse* micro-batch order ``m-1..0`` (what autograd does after a GPipe
    flush, as in torchgpipe). The backward order does not change the bubble.
``"1f1b"``
    PipeDream-Flush, Megatron-LM ``forward_backward_pipelining_without_
    interleaving``: ``min(p - r - 1, m)`` warm-up forwards, then alternating
    one-forward-one-backward, then the cool-down backwards.
``"zb-h1"``
    Zero Bubble H1 (Qi et al., *Zero Bubble Pipeline Parallelism*, ICLR
    2024, the handcrafted schedule of section 3.1, as PaddlePaddle's
    ``PipelineZeroBubblePipelinePass`` lists it): the backward is split into
    ``B`` (the input gradient, on the critical path) and ``W`` (the weight
    gradient, which nothing downstream waits for). Rank ``r`` runs ``p - r``
    warm-up forwards, then ``r`` times ``B F`` (postponing their ``W``), then
    ``B W F`` while forwards remain, then ``B W`` and finally the ``r``
    postponed ``W``. At most ``p`` micro-batches are in flight (forward done,
    ``W`` not), 1F1B's peak (its first rank's). With ``F``, ``B``, ``W`` of
    ``T_F``, ``T_B``, ``T_W`` and free communication the step takes
    ``m (T_F + T_B + T_W) + (p - 1) max(T_F, T_B, T_F + T_B - T_W)``: the
    paper's bubble ``(p - 1)(T_F + T_B - T_W)`` when ``T_W`` is at most
    ``T_F`` and ``T_B``, a third of 1F1B's ``(p - 1)(T_F + T_B + T_W)`` when
    all three are equal. Needs ``m >= p``.
``"interleaved"``
    Megatron-LM ``forward_backward_pipelining_with_interleaving``
    (Narayanan et al., SC'21). The ``m * v`` forward "iterations" ``k`` of a
    rank map to chunk ``(k // p) % v`` and micro-batch
    ``(k // (p * v)) * p + k % p``; backward iteration ``k`` uses chunk
    ``v - 1 - (k // p) % v`` and the same micro-batch formula. Warm-up is
    ``(p - r - 1) * 2 + (v - 1) * p`` forwards (capped at ``m * v``), except
    that when ``m == p`` Megatron runs *all* forwards as warm-up (then all
    backwards); this module reproduces that special case too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "SCHEDULE_KINDS",
    "PipeAction",
    "pipeline_schedule",
    "max_in_flight",
    "simulate_unit_times",
]

#: Valid values of ``parallel.schedule``.
SCHEDULE_KINDS: tuple[str, ...] = ("gpipe", "1f1b", "interleaved", "zb-h1")


@dataclass(frozen=True, slots=True)
class PipeAction:
    """One compute action of one pipeline rank.

    Attributes
    ----------
    phase : str
        ``"F"`` (forward), ``"B"`` (backward; under ``zb-h1`` only the input
        gradient) or ``"W"`` (``zb-h1``: the weight gradient).
    micro_batch : int
        Micro-batch index, ``0..m-1``.
    chunk : int
        Model chunk on this rank, ``0..v-1``; rank ``r`` chunk ``c`` is
        virtual stage ``c * p + r``.
    """

    phase: str
    micro_batch: int
    chunk: int


def _check_positive_int(value: object, name: str) -> int:
    """Return ``value`` if it is an int >= 1, else raise ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return value


def pipeline_schedule(
    kind: str,
    stages: int,
    micro_batches: int,
    virtual_stages: int = 1,
) -> list[list[PipeAction]]:
    """Per-rank ordered forward/backward actions of one training step.

    Parameters
    ----------
    kind : str
        ``"gpipe"``, ``"1f1b"``, ``"interleaved"`` or ``"zb-h1"``
        (``parallel.schedule``).
    stages : int
        Pipeline ranks ``p`` (``parallel.pp``), >= 1.
    micro_batches : int
        Micro-batches per step ``m``, >= 1. Must be a multiple of ``stages``
        for ``"interleaved"`` (Megatron-LM asserts the same).
    virtual_stages : int, optional
        Model chunks per rank ``v`` (``parallel.virtual_stages``), >= 1.
        Must be 1 for ``"gpipe"`` and ``"1f1b"``. ``"interleaved"`` with
        ``v == 1`` follows Megatron's interleaved code literally (warm-up
        ``2 * (p - r - 1)``), which has the 1F1B bubble but more activations
        in flight than ``"1f1b"``.

    Returns
    -------
    list of list of PipeAction
        ``result[r]`` is the ordered action list of pipeline rank ``r``.
        Every rank runs every ``(phase, micro_batch, chunk)`` exactly once.

    Raises
    ------
    ValueError
        On an unknown ``kind`` (message names ``parallel.schedule``), on
        ``stages``/``micro_batches``/``virtual_stages`` < 1, on
        ``virtual_stages > 1`` with a non-interleaved kind, or on
        ``micro_batches % stages != 0`` for ``"interleaved"``.
    """
    if kind not in SCHEDULE_KINDS:
        raise ValueError(
            f"parallel.schedule must be one of {', '.join(SCHEDULE_KINDS)}; "
            f"got {kind!r}"
        )
    p = _check_positive_int(stages, "stages (parallel.pp)")
    m = _check_positive_int(micro_batches, "micro_batches")
    v = _check_positive_int(virtual_stages, "virtual_stages (parallel.virtual_stages)")

    if kind != "interleaved" and v != 1:
        raise ValueError(
            f"virtual_stages (parallel.virtual_stages) = {v} requires "
            f"parallel.schedule 'interleaved', got {kind!r}"
        )
    if kind == "gpipe":
        return [_gpipe(m) for _ in range(p)]
    if kind == "1f1b":
        return [_one_f_one_b(p, m, r) for r in range(p)]
    if kind == "zb-h1":
        if m < p:
            raise ValueError(f"micro_batches = {m} must be at least stages (parallel.pp) = {p} for "
                             f"parallel.schedule 'zb-h1'")
        return [_zb_h1(p, m, r) for r in range(p)]
    if m % p != 0:
        raise ValueError(
            f"micro_batches = {m} must be a multiple of stages "
            f"(parallel.pp) = {p} for parallel.schedule 'interleaved'"
        )
    return [_interleaved(p, m, v, r) for r in range(p)]


def _gpipe(m: int) -> list[PipeAction]:
    """GPipe: all forwards, then all backwards in reverse order."""
    fwd = [PipeAction("F", i, 0) for i in range(m)]
    bwd = [PipeAction("B", i, 0) for i in reversed(range(m))]
    return fwd + bwd


def _one_f_one_b(p: int, m: int, r: int) -> list[PipeAction]:
    """Non-interleaved 1F1B (PipeDream-Flush) order for rank ``r``."""
    warmup = min(p - r - 1, m)
    remaining = m - warmup
    out = [PipeAction("F", i, 0) for i in range(warmup)]
    for i in range(remaining):
        out.append(PipeAction("F", warmup + i, 0))
        out.append(PipeAction("B", i, 0))
    out.extend(PipeAction("B", i, 0) for i in range(remaining, m))
    return out


def _zb_h1(p: int, m: int, r: int) -> list[PipeAction]:
    """Zero Bubble H1 order for rank ``r`` (module docstring); needs ``m >= p``."""
    out = [PipeAction("F", i, 0) for i in range(p - r)]
    f = b = w = 0
    f = p - r
    for _ in range(r):                      # B F, their W postponed
        out += [PipeAction("B", b, 0), PipeAction("F", f, 0)]
        b, f = b + 1, f + 1
    while f < m:                            # steady state
        out += [PipeAction("B", b, 0), PipeAction("W", w, 0), PipeAction("F", f, 0)]
        b, w, f = b + 1, w + 1, f + 1
    while b < m:                            # cool-down
        out += [PipeAction("B", b, 0), PipeAction("W", w, 0)]
        b, w = b + 1, w + 1
    out += [PipeAction("W", i, 0) for i in range(w, m)]  # the postponed weight gradients fill the tail
    return out


def _interleaved(p: int, m: int, v: int, r: int) -> list[PipeAction]:
    """Megatron-LM interleaved 1F1B order for rank ``r``."""
    total = m * v
    group = p * v

    def mb(k: int) -> int:
        return (k // group) * p + k % p

    def fwd(k: int) -> PipeAction:
        return PipeAction("F", mb(k), (k % group) // p)

    def bwd(k: int) -> PipeAction:
        return PipeAction("B", mb(k), v - 1 - (k % group) // p)

    if m == p:
        # Megatron: "Run all forward passes and then all backward passes if
        # number of microbatches is just the number of pipeline stages."
        warmup = total
    else:
        warmup = min((p - r - 1) * 2 + (v - 1) * p, total)
    remaining = total - warmup
    out = [fwd(k) for k in range(warmup)]
    for k in range(remaining):
        out.append(fwd(warmup + k))
        out.append(bwd(k))
    out.extend(bwd(k) for k in range(remaining, total))
    return out


def max_in_flight(actions: Sequence[PipeAction]) -> int:
    """Peak number of micro-batch-chunks with forward done, backward pending.

    Parameters
    ----------
    actions : sequence of PipeAction
        One rank's ordered actions (an element of :func:`pipeline_schedule`).

    Returns
    -------
    int
        Maximum, over the action list, of the number of ``(micro_batch,
        chunk)`` pairs whose forward has run and whose backward has not (under
        a split backward, whose weight gradient ``W`` has not: it still reads
        the stored inputs). This is what drives a rank's stored activation
        memory (each unit holds one micro-batch's activations of one chunk,
        i.e. ``1/v`` of the rank's layers).

    Raises
    ------
    ValueError
        If a backward appears before its forward, a ``W`` before its ``B``,
        or a phase is unknown.
    """
    split = any(a.phase == "W" for a in actions)
    live: set[tuple[int, int]] = set()
    done_b: set[tuple[int, int]] = set()
    peak = 0
    for a in actions:
        key = (a.micro_batch, a.chunk)
        if a.phase == "F":
            live.add(key)
            peak = max(peak, len(live))
        elif a.phase == "B":
            if key not in live:
                raise ValueError(f"backward {a} runs before its forward")
            done_b.add(key)
            if not split:
                live.remove(key)
        elif a.phase == "W":
            if key not in done_b:
                raise ValueError(f"weight gradient {a} runs before its backward")
            live.remove(key)
        else:
            raise ValueError(f"unknown phase {a.phase!r} in {a}")
    return peak


def _per_vstage(value: float | Sequence[float], n: int, name: str) -> list[float]:
    """Broadcast a scalar or validate a per-virtual-stage sequence."""
    if isinstance(value, (int, float)):
        return [float(value)] * n
    vals = [float(x) for x in value]
    if len(vals) != n:
        raise ValueError(f"{name} must be a scalar or have {n} entries, got {len(vals)}")
    return vals


def simulate_unit_times(
    schedule: Sequence[Sequence[PipeAction]],
    t_fwd: float | Sequence[float] = 1.0,
    t_bwd: float | Sequence[float] = 2.0,
    comm: float = 0.0,
    t_wgrad: float | Sequence[float] = 0.0,
) -> tuple[float, list[float]]:
    """Execute a schedule with data dependencies; reference list-scheduler.

    Each rank runs its actions strictly in list order, one at a time; an
    action starts as soon as the rank is free and its inputs are ready:

    * ``F(mb, j)`` needs ``F(mb, j-1)`` finished (+ ``comm`` if on another
      rank), for virtual stage ``j = chunk * p + rank``;
    * ``B(mb, j)`` needs ``B(mb, j+1)`` finished (+ ``comm`` if on another
      rank), and ``F(mb, j)`` finished on this rank (for the last virtual
      stage only the latter);
    * ``W(mb, j)`` (a split backward's weight gradient) needs ``B(mb, j)``.

    Parameters
    ----------
    schedule : sequence of sequence of PipeAction
        Output of :func:`pipeline_schedule` (``p`` ranks).
    t_fwd, t_bwd : float or sequence of float, optional
        Duration of one forward / backward of one micro-batch on one *chunk*
        (for interleaved with ``v`` chunks pass the per-chunk time, i.e. the
        stage time divided by ``v``). A sequence gives one value per virtual
        stage ``0..p*v-1``.
    comm : float, optional
        Latency of every cross-rank activation / gradient transfer, >= 0.
    t_wgrad : float or sequence of float, optional
        Duration of a ``W`` action (``zb-h1``; ``t_bwd`` is then the input
        gradient alone).

    Returns
    -------
    step_time : float
        Finish time of the last action (the step starts at 0).
    per_stage_busy : list of float
        Total compute time of each rank; the bubble fraction of rank ``r`` is
        ``1 - per_stage_busy[r] / step_time``.

    Raises
    ------
    ValueError
        If ``comm < 0``, the schedule is empty, or a time sequence has the
        wrong length.
    RuntimeError
        If the schedule deadlocks (a rank waits on an action that can never
        run, e.g. a backward before its forward).
    """
    p = len(schedule)
    if p == 0:
        raise ValueError("schedule must have at least one rank")
    if comm < 0:
        raise ValueError(f"comm must be >= 0, got {comm}")
    v = 1 + max((a.chunk for acts in schedule for a in acts), default=0)
    n_vs = p * v
    tf = _per_vstage(t_fwd, n_vs, "t_fwd")
    tb = _per_vstage(t_bwd, n_vs, "t_bwd")
    tw = _per_vstage(t_wgrad, n_vs, "t_wgrad")

    done: dict[tuple[str, int, int], float] = {}  # (phase, mb, vstage) -> finish
    free = [0.0] * p
    busy = [0.0] * p
    pos = [0] * p
    remaining = sum(len(acts) for acts in schedule)

    def ready_time(r: int, a: PipeAction) -> float | None:
        j = a.chunk * p + r
        if a.phase == "W":
            return done.get(("B", a.micro_batch, j))
        if a.phase == "F":
            if j == 0:
                return 0.0
            prev = done.get(("F", a.micro_batch, j - 1))
            if prev is None:
                return None
            return prev + (comm if (j - 1) % p != r else 0.0)
        own = done.get(("F", a.micro_batch, j))
        if own is None:
            return None
        if j == n_vs - 1:
            return own
        nxt = done.get(("B", a.micro_batch, j + 1))
        if nxt is None:
            return None
        return max(own, nxt + (comm if (j + 1) % p != r else 0.0))

    while remaining:
        progressed = False
        for r in range(p):
            acts = schedule[r]
            while pos[r] < len(acts):
                a = acts[pos[r]]
                t_ready = ready_time(r, a)
                if t_ready is None:
                    break
                j = a.chunk * p + r
                dur = tf[j] if a.phase == "F" else tb[j] if a.phase == "B" else tw[j]
                start = max(free[r], t_ready)
                free[r] = start + dur
                busy[r] += dur
                done[(a.phase, a.micro_batch, j)] = free[r]
                pos[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = {r: schedule[r][pos[r]] for r in range(p) if pos[r] < len(schedule[r])}
            raise RuntimeError(f"pipeline schedule deadlocks; ranks blocked on {stuck}")
    return max(free), busy
