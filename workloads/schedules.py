"""Pipeline-parallel schedules: GPipe, 1F1B, interleaved 1F1B, Zero Bubble H1 and DualPipe.

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
    ``(p - r - 1) * 2 + (v - 1) * p`` forwards, capped at ``m * v`` (a rank
    whose warm-up reaches every forward runs them all, then every backward):
    Megatron-Core's ``get_pp_rank_microbatches``. Megatron-LM 2021 and
    Megatron-Core up to 0.9 ran all forwards first on *every* rank when
    ``m == p``; this module followed it until 2026-12-02. With a micro-batch
    group size ``N`` (Megatron-Core's ``microbatch_group_size_per_vp_stage``,
    ``--microbatch-group-size-per-virtual-pipeline-stage``; default ``p``,
    the depth-first order above; ``N = m`` is breadth-first): iterations run
    ``N`` contiguous micro-batches per chunk, chunk by chunk, group by group
    (the last group holds what is left: ``get_schedule_table``), and warm-up
    is ``(p - r - 1) * 2 + (v - 1) * N``. Megatron-Core asks ``p <= N <= m``
    and ``m mod N`` either 0 or at least ``p`` (else dependency bubbles); ``m``
    need then not be a multiple of ``p`` (the Llama 3 paper's "N = 5" with
    4 stages, section 3.3.2).
``"dualpipe"``
    DualPipe (DeepSeek-V3 technical report, arXiv 2412.19437, section 3.2.1;
    the order of ``DualPipe.step`` in github.com/deepseek-ai/DualPipe,
    ``dualpipe/dualpipe.py``). The model is cut into ``p`` stages and every
    rank holds two of them: chunk 0 is stage ``r`` of the *forward direction*
    (micro-batches ``0..m/2-1`` enter at rank 0) and chunk 1 is stage
    ``p - 1 - r`` of the *reverse direction* (micro-batches ``m/2..m-1``
    enter at rank ``p - 1``): two copies of the model's parameters. With
    ``h = min(r, p - 1 - r)`` and local phase 0 the direction whose first
    half this rank is in, rank ``r`` runs the reference's eight steps:
    ``2 (p/2 - h - 1)`` forwards of phase 0; ``h + 1`` times ``F0 F1``;
    ``p/2 - h - 1`` times ``B1 W1 F1`` (split backward); ``m/2 - p + h + 1``
    times the overlapped pairs ``(F0 & B1) (F1 & B0)`` (the two middle ranks
    run their first ``F0``, ``B1`` apart); ``p/2 - h - 1`` times ``B1 (F1 &
    B0)``; ``h + 1`` times ``B1 B0`` (the second half of them split); ``p/2 -
    h - 1`` times ``W B0`` (split) and ``h + 1`` final ``W`` (weight
    gradients in FIFO order, like the reference's ``WeightGradStore``). A
    ``B`` with a ``W`` of the same micro-batch later in the list computes
    the input gradient only; a ``B`` without one is a full backward (input
    and weight gradients). Pairs are marked :attr:`PipeAction.paired`; sends
    the reference posts later than right after their compute carry
    :attr:`PipeAction.send_after`. Needs ``p`` even and ``m`` even with
    ``m >= 2 p`` (the reference asserts both). With free communication,
    ``T_F = T_B`` (input gradient), ``T_W <= T_F`` and a pair taking ``T_FB``
    between ``max(T_F, T_B + T_W)`` and ``T_F + T_B + T_W``, the most idle
    rank idles ``(p/2 - 1)(T_FB + (T_B + T_W) - 3 T_W)``: the bubble of the
    report's Table 2, whose ``B`` is the full backward.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, MutableMapping, Sequence
from dataclasses import dataclass
from numbers import Integral, Real

__all__ = [
    "SCHEDULE_KINDS",
    "PipeAction",
    "pipeline_schedule",
    "rank_schedule",
    "group_size_problem",
    "group_sizes",
    "interleaved_table",
    "max_in_flight",
    "holding_changes",
    "simulate_unit_times",
    "chain_position",
    "chain_neighbour",
    "Exchange",
    "interleaved_exchanges",
]

#: Valid values of ``parallel.schedule``.
SCHEDULE_KINDS: tuple[str, ...] = ("gpipe", "1f1b", "interleaved", "zb-h1", "dualpipe")


@dataclass(frozen=True, slots=True)
class PipeAction:
    """One compute action of one pipeline rank.

    Attributes
    ----------
    phase : str
        ``"F"`` (forward), ``"B"`` (backward; only the input gradient when a
        ``"W"`` of the same micro-batch and chunk follows on the rank) or
        ``"W"`` (the weight gradient of a split backward: ``zb-h1``,
        ``dualpipe``).
    micro_batch : int
        Micro-batch index, ``0..m-1``.
    chunk : int
        Model chunk on this rank, ``0..v-1``; rank ``r`` chunk ``c`` is
        virtual stage ``c * p + r`` (:func:`chain_position`; under
        ``dualpipe`` chunk 0 is stage ``r`` of the forward direction, chunk 1
        stage ``p - 1 - r`` of the reverse direction).
    paired : bool
        ``dualpipe``: this action and its neighbour in the list (a forward
        and the backward right after it) run as one overlapped pair whose
        inputs are both received before it starts and whose outputs are
        both sent after it ends.
    send_after : int
        The output activation (gradient) is sent after this many further
        actions of the rank have run, not right after this one (the
        reference DualPipe posts a few sends late); 0 for every other
        schedule.
    """

    phase: str
    micro_batch: int
    chunk: int
    paired: bool = False
    send_after: int = 0


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
    group_size: int | None = None,
) -> list[list[PipeAction]]:
    """Per-rank ordered forward/backward actions of one training step.

    Parameters
    ----------
    kind : str
        ``"gpipe"``, ``"1f1b"``, ``"interleaved"``, ``"zb-h1"`` or
        ``"dualpipe"`` (``parallel.schedule``).
    stages : int
        Pipeline ranks ``p`` (``parallel.pp``), >= 1.
    micro_batches : int
        Micro-batches per step ``m``, >= 1. For ``"interleaved"``: a
        multiple of ``group_size`` or leaving a remainder of at least
        ``stages`` (Megatron-Core asserts the same; with the default group
        size, a multiple of ``stages``); even and at
        least ``2 * stages`` for ``"dualpipe"`` (both directions together;
        DualPipe asserts the same), with ``stages`` even.
    virtual_stages : int, optional
        Model chunks per rank ``v`` (``parallel.virtual_stages``), >= 1.
        Must be 1 for ``"gpipe"`` and ``"1f1b"``. ``"interleaved"`` with
        ``v == 1`` follows Megatron's interleaved code literally (warm-up
        ``2 * (p - r - 1)``), which has the 1F1B bubble but more activations
        in flight than ``"1f1b"``.
    group_size : int, optional
        ``"interleaved"`` only: contiguous micro-batches per model chunk
        ``N`` (``parallel.microbatch_group_size``; Megatron-Core's
        ``microbatch_group_size_per_vp_stage``), in ``stages..micro_batches``;
        None: ``stages``.

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
        ``virtual_stages > 1`` with a non-interleaved kind, on a
        ``group_size`` or ``micro_batches`` that ``"interleaved"`` refuses (or
        a ``group_size`` with another kind), or on an odd
        ``stages`` or ``micro_batches``, or ``micro_batches < 2 * stages``,
        for ``"dualpipe"``.
    """
    build = _rank_builder(kind, stages, micro_batches, virtual_stages, group_size)
    return [build(r) for r in range(stages)]


def rank_schedule(kind: str, stages: int, micro_batches: int, virtual_stages: int, rank: int,
                  group_size: int | None = None) -> list[PipeAction]:
    """``pipeline_schedule(kind, stages, micro_batches, virtual_stages, group_size)[rank]``, without building the
    other ranks' orders (the memory model asks one stage at a time). Raises as :func:`pipeline_schedule` does,
    and on a ``rank`` outside ``0..stages-1``."""
    build = _rank_builder(kind, stages, micro_batches, virtual_stages, group_size)
    if isinstance(rank, bool) or not isinstance(rank, Integral) or not 0 <= rank < stages:
        raise ValueError(f"rank must be an integer in 0..{stages - 1}, got {rank!r}")
    return build(int(rank))


def _rank_builder(kind: str, stages: int, micro_batches: int, virtual_stages: int, group_size: int | None = None
                  ) -> Callable[[int], list[PipeAction]]:
    """The checks of :func:`pipeline_schedule`; then what builds one rank's order."""
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
    if kind != "interleaved" and group_size is not None:
        raise ValueError(f"group_size (parallel.microbatch_group_size) = {group_size} requires "
                         f"parallel.schedule 'interleaved', got {kind!r}")
    if kind == "gpipe":
        return lambda r: _gpipe(m)
    if kind == "1f1b":
        return lambda r: _one_f_one_b(p, m, r)
    if kind == "zb-h1":
        if m < p:
            raise ValueError(f"micro_batches = {m} must be at least stages (parallel.pp) = {p} for "
                             f"parallel.schedule 'zb-h1'")
        return lambda r: _zb_h1(p, m, r)
    if kind == "dualpipe":
        if p % 2:
            raise ValueError(f"stages (parallel.pp) = {p} must be even for parallel.schedule 'dualpipe'")
        if m % 2 or m < 2 * p:
            raise ValueError(f"micro_batches = {m} must be even and at least 2 * stages (parallel.pp) = {2 * p} "
                             f"for parallel.schedule 'dualpipe'")
        return lambda r: _dualpipe(p, m, r)
    if group_size is None:
        if m % p != 0:
            raise ValueError(
                f"micro_batches = {m} must be a multiple of stages "
                f"(parallel.pp) = {p} for parallel.schedule 'interleaved'"
            )
        n = p
    else:
        n = _check_positive_int(group_size, "group_size (parallel.microbatch_group_size)")
        problem = group_size_problem(p, m, n)
        if problem is not None:
            raise ValueError(f"group_size (parallel.microbatch_group_size) = {n} {problem}")
    return lambda r: _interleaved(p, m, v, r, n)


def group_size_problem(stages: int, micro_batches: int, group_size: int) -> str | None:
    """Why Megatron-Core's interleaved schedule refuses ``group_size`` contiguous micro-batches per chunk with
    ``stages`` pipeline ranks and ``micro_batches`` per step (a phrase to follow the value), or None:
    ``forward_backward_pipelining_with_interleaving`` asks ``p <= N <= m`` and ``m mod N`` 0 or at least ``p``
    (a shorter last group stalls the pipeline)."""
    p, m, n = stages, micro_batches, group_size
    if not p <= n <= m:
        return f"must be in pp={p} .. the number of micro-batches ({m}) (Megatron-Core)"
    if 0 < m % n < p:
        fits = group_sizes(p, m)
        valid = ", ".join(map(str, fits[:12])) + (", ..." if len(fits) > 12 else "")
        return (f"leaves a last group of {m % n} of the {m} micro-batches, fewer than pp={p}; Megatron-Core needs "
                f"the micro-batches to be a multiple of it or to leave at least pp (valid: {valid})")
    return None


def group_sizes(stages: int, micro_batches: int) -> list[int]:
    """Every group size :func:`group_size_problem` accepts, in increasing order (none when there are fewer
    micro-batches than stages; ``micro_batches`` itself otherwise)."""
    p, m = stages, micro_batches
    return [n for n in range(p, m + 1) if not 0 < m % n < p]


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


def _dualpipe(p: int, m: int, r: int) -> list[PipeAction]:
    """DualPipe order for rank ``r`` (module docstring), step by step as ``DualPipe.step`` runs it."""
    half_ranks, half = p // 2, m // 2
    h = min(r, p - 1 - r)
    second = int(r >= half_ranks)               # local phase ^ second = direction (0 forward, 1 reverse)
    middle = r in (half_ranks - 1, half_ranks)
    fwd, bwd = [0, 0], [0, 0]                   # next micro-batch of each direction
    deferred: deque[tuple[int, int]] = deque()  # WeightGradStore: backwards whose W is postponed, FIFO
    out: list[PipeAction] = []

    def f(phase: int, paired: bool = False, send_after: int = 0) -> None:
        d = phase ^ second
        out.append(PipeAction("F", d * half + fwd[d], d, paired, send_after))
        fwd[d] += 1

    def b(phase: int, split: bool = False, paired: bool = False) -> None:
        d = phase ^ second
        out.append(PipeAction("B", d * half + bwd[d], d, paired))
        if split:
            deferred.append((d * half + bwd[d], d))
        bwd[d] += 1

    def w() -> None:
        mb, d = deferred.popleft()
        out.append(PipeAction("W", mb, d))

    for _ in range(2 * (half_ranks - h - 1)):               # step 1: nF0
        f(0)
    for i in range(h + 1):                                   # step 2: nF0F1
        f(0, send_after=0 if middle else 1)                  # others send F0's output after F1
        f(1, send_after=1 if middle and i == h else 0)       # the middle ranks' last F1: after step 4's F0
    for _ in range(half_ranks - h - 1):                      # step 3: nB1W1F1
        b(1, split=True)
        w()
        f(1)
    for i in range(half - p + h + 1):                        # step 4 (main): n(F0&B1)(F1&B0)
        if i == 0 and middle:                                # not overlapped, to shorten the bubble
            f(0, send_after=1)
            b(1)
        else:
            f(0, paired=True)
            b(1, paired=True)
        f(1, paired=True)
        b(0, paired=True)
    for _ in range(half_ranks - h - 1):                      # step 5: nB1(F1&B0)
        b(1)
        f(1, paired=True)
        b(0, paired=True)
    split = False
    for i in range(h + 1):                                   # step 6: nB1B0, the second half split
        if i == (h + 1) // 2 and h % 2 == 1:
            split = True
        b(1, split)
        if i == (h + 1) // 2 and h % 2 == 0:
            split = True
        b(0, split)
    for _ in range(half_ranks - h - 1):                      # step 7: nWB0
        w()
        b(0, split=True)
    for _ in range(h + 1):                                   # step 8: nW
        w()
    return out


def chain_position(kind: str, stages: int, rank: int, chunk: int) -> int:
    """Position of chunk ``chunk`` of rank ``rank`` in its micro-batches' chain of stages.

    ``c * p + r`` (virtual stage) for every schedule but ``dualpipe``, where
    chunk 0 is stage ``r`` of the forward direction and chunk 1 stage
    ``p - 1 - r`` of the reverse direction. A forward at position ``j > 0``
    receives from position ``j - 1``; the last position is ``p v - 1``
    (``p - 1`` under ``dualpipe``).
    """
    if kind == "dualpipe":
        return rank if chunk == 0 else stages - 1 - rank
    return chunk * stages + rank


def chain_neighbour(kind: str, stages: int, rank: int, chunk: int, step: int) -> int:
    """The rank holding position ``chain_position(...) + step`` (``step`` = +1 or -1) of the same chain."""
    if kind == "dualpipe":
        return rank + step if chunk == 0 else rank - step
    return (chunk * stages + rank + step) % stages


def _interleaved_warmup(p: int, m: int, v: int, r: int, n: int) -> int:
    """Megatron-Core's warm-up forwards of rank ``r`` in the interleaved schedule with micro-batch groups of
    ``n`` (all ``m v`` of them where the warm-up count reaches them: ``get_pp_rank_microbatches``'
    ``are_all_microbatches_in_warmup``)."""
    return min((p - r - 1) * 2 + (v - 1) * n, m * v)


def interleaved_table(m: int, v: int, n: int) -> list[tuple[int, int]]:
    """``(micro_batch, chunk)`` of each forward iteration of the interleaved schedule with ``m`` micro-batches,
    ``v`` chunks and groups of ``n``: Megatron-Core's ``get_schedule_table`` (groups of ``n`` micro-batches,
    each run chunk by chunk; the last group holds what is left). The backward iteration ``k`` runs the same
    micro-batch on chunk ``v - 1 - chunk``."""
    table = []
    for first in range(0, m, n):
        last = m if first + n >= m else first + n
        table += [(mb, chunk) for chunk in range(v) for mb in range(first, last)]
    return table


def _interleaved(p: int, m: int, v: int, r: int, n: int) -> list[PipeAction]:
    """Megatron-LM interleaved 1F1B order for rank ``r`` (micro-batch groups of ``n``)."""
    total = m * v
    table = interleaved_table(m, v, n)

    def fwd(k: int) -> PipeAction:
        mb, chunk = table[k]
        return PipeAction("F", mb, chunk)

    def bwd(k: int) -> PipeAction:
        mb, chunk = table[k]
        return PipeAction("B", mb, v - 1 - chunk)

    # (Megatron-LM 2021 ran all forwards first on every rank when m == p; Megatron-Core decides per rank.)
    warmup = _interleaved_warmup(p, m, v, r, n)
    remaining = total - warmup
    out = [fwd(k) for k in range(warmup)]
    for k in range(remaining):
        out.append(fwd(warmup + k))
        out.append(bwd(k))
    out.extend(bwd(k) for k in range(remaining, total))
    return out


@dataclass(frozen=True, slots=True)
class Exchange:
    """One batched, blocking point-to-point exchange of Megatron's interleaved schedule.

    Megatron-LM posts its pipeline transfers with ``batch_isend_irecv`` and
    waits for all of them (``p2p_communication._communicate``,
    ``wait_on_reqs``) before computing again: the rank waits until its sends
    have been received and its receives have arrived.

    Attributes
    ----------
    sends : tuple of int
        Indices, in the rank's action list, of the actions whose output
        (activation of a forward, input gradient of a backward) is sent.
    recv_act, recv_grad : bool
        Whether an activation (from the previous virtual stage) / a gradient
        (from the next) is received. Received tensors are queued in arrival
        order; the rank's forwards (backwards) that need one take them in
        order.
    """

    sends: tuple[int, ...]
    recv_act: bool
    recv_grad: bool


def interleaved_exchanges(stages: int, micro_batches: int, virtual_stages: int,
                          rank: int, group_size: int | None = None) -> list[tuple[Exchange, ...]]:
    """Where Megatron-LM's interleaved schedule posts its blocking transfers, for one rank.

    Follows ``forward_backward_pipelining_with_interleaving`` in
    ``megatron/core/pipeline_parallel/schedules.py`` without
    ``overlap_p2p_comm``: ``recv_forward`` before the first forward (not on
    rank 0); after each warm-up forward ``send_forward_recv_forward`` (the
    last one, unless every iteration is warm-up,
    ``send_forward_backward_recv_forward_backward``, which also receives the
    gradient of the first backward); after each steady-state *pair* of a
    forward and a backward one ``send_forward_backward_recv_forward_backward``
    (nothing between the two); after each cool-down backward
    ``send_backward_recv_backward``; ``recv_backward`` before the cool-down
    when everything was warm-up. A rank receives for iteration ``k + 1``
    after iteration ``k``, except that the first (last) rank, which starts
    the forward (backward) chain, receives what the last (first) rank sent
    ``p - 1`` iterations earlier, and nothing in the first ``p - 1``
    iterations (``recv_tensor_from_previous_stage``). The last iteration
    receives nothing.

    Parameters
    ----------
    stages, micro_batches, virtual_stages, rank : int
        ``p``, ``m``, ``v`` (>= 2) and the pipeline rank, as for
        :func:`pipeline_schedule` with ``"interleaved"``.
    group_size : int, optional
        Micro-batches per group ``N`` (:func:`pipeline_schedule`); None: ``p``.

    Returns
    -------
    list of tuple of Exchange
        ``result[0]``: the exchanges before the first action; ``result[i +
        1]``: those right after action ``i`` of ``pipeline_schedule(
        "interleaved", ...)[rank]``, run one after the other; empty where
        the rank computes on without exchanging.

    Raises
    ------
    ValueError
        On arguments :func:`pipeline_schedule` refuses, ``virtual_stages <
        2`` or ``rank`` outside ``0..stages-1``.
    """
    acts = pipeline_schedule("interleaved", stages, micro_batches, virtual_stages, group_size)
    p, m, v = stages, micro_batches, virtual_stages
    n = p if group_size is None else group_size
    if v < 2:
        raise ValueError(f"virtual_stages (parallel.virtual_stages) = {v} must be at least 2")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < p:
        raise ValueError(f"rank must be in 0..{p - 1}, got {rank!r}")
    r, total = rank, m * v
    warmup = _interleaved_warmup(p, m, v, r, n)
    all_warmup = warmup == total
    remaining = total - warmup
    first_rank, last_rank = r == 0, r == p - 1
    chunks = [c for _mb, c in interleaved_table(m, v, n)]

    def chunk(k: int, forward: bool) -> int:  # Megatron-Core's get_model_chunk_id
        c = chunks[k % total]
        return c if forward else v - 1 - c

    def recv_from_prev(k: int, forward: bool) -> bool:
        """Megatron's ``recv_tensor_from_previous_stage``: does anything arrive for iteration ``k + 1``?"""
        if not (first_rank if forward else last_rank):
            return True
        if k < p - 1:  # the rank at the other end has not produced anything yet
            return False
        return chunk(k - (p - 1), forward) != (v - 1 if forward else 0)

    def sends_fwd(k: int) -> bool:  # nothing leaves the last virtual stage
        return not (last_rank and chunk(k, True) == v - 1)

    def sends_bwd(k: int) -> bool:  # nothing leaves the first virtual stage
        return not (first_rank and chunk(k, False) == 0)

    posts: list[tuple[Exchange, ...]] = [() for _ in range(len(acts[r]) + 1)]
    posts[0] = (Exchange((), not first_rank, False),)
    for k in range(warmup):
        recv_next = k == warmup - 1 and not all_warmup and not last_rank
        posts[k + 1] = (Exchange((k,) if sends_fwd(k) else (), recv_from_prev(k, True) and k != total - 1,
                                 recv_next),)
    if all_warmup:
        posts[warmup] += (Exchange((), False, not last_rank),)
    for k in range(remaining):
        f, b = warmup + 2 * k, warmup + 2 * k + 1
        sends = ((f,) if sends_fwd(warmup + k) else ()) + ((b,) if sends_bwd(k) else ())
        posts[b + 1] = (Exchange(sends, recv_from_prev(warmup + k, True) and k != remaining - 1,
                                 recv_from_prev(k, False)),)
    for k in range(remaining, total):
        i = warmup + remaining + k
        posts[i + 1] = (Exchange((i,) if sends_bwd(k) else (), False,
                                 recv_from_prev(k, False) and k != total - 1),)
    return [tuple(x for x in post if x.sends or x.recv_act or x.recv_grad) for post in posts]


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
        i.e. ``1/v`` of the rank's layers). The forward of an overlapped pair
        counts before its backward frees anything (an upper bound).

    Raises
    ------
    ValueError
        If a backward appears before its forward, a ``W`` before its ``B``,
        or a phase is unknown.
    """
    live = peak = 0
    for change in holding_changes(actions):
        live += 1 if change > 0 else -1
        peak = max(peak, live)
    return peak


def holding_changes(actions: Sequence[PipeAction]) -> tuple[int, ...]:
    """The actions of one rank's order that change which ``(micro_batch, chunk)`` activations it holds, as
    ``chunk + 1`` (a forward stores them) or ``-(chunk + 1)`` (the backward frees them; under a split backward
    its weight gradient ``W``, which still reads them): what :func:`max_in_flight` counts, and what the
    memory model weighs by each chunk's bytes. Small ints, which Python shares (8 bytes an action).

    Raises
    ------
    ValueError
        As :func:`max_in_flight`.
    """
    split = {(a.micro_batch, a.chunk) for a in actions if a.phase == "W"}
    live: set[tuple[int, int]] = set()
    done_b: set[tuple[int, int]] = set()
    out: list[int] = []
    for a in actions:
        key = (a.micro_batch, a.chunk)
        if a.phase == "F":
            live.add(key)
            out.append(a.chunk + 1)
        elif a.phase == "B":
            if key not in live:
                raise ValueError(f"backward {a} runs before its forward")
            done_b.add(key)
            if key not in split:
                live.remove(key)
                out.append(-(a.chunk + 1))
        elif a.phase == "W":
            if key not in done_b:
                raise ValueError(f"weight gradient {a} runs before its backward")
            live.remove(key)
            out.append(-(a.chunk + 1))
        else:
            raise ValueError(f"unknown phase {a.phase!r} in {a}")
    return tuple(out)


def _per_vstage(value: float | Sequence[float], n: int, name: str) -> list[float]:
    """Broadcast a scalar (a Python or numpy real) or validate a per-virtual-stage sequence."""
    if isinstance(value, Real):
        return [float(value)] * n
    vals = [float(x) for x in value]
    if len(vals) != n:
        raise ValueError(f"{name} must be a scalar or have {n} entries, got {len(vals)}")
    return vals


def simulate_unit_times(
    schedule: Sequence[Sequence[PipeAction]],
    t_fwd: float | Sequence[float] = 1.0,
    t_bwd: float | Sequence[float] = 2.0,
    comm: float | Sequence[float] = 0.0,
    t_wgrad: float | Sequence[float] = 0.0,
    *,
    t_pair: float | None = None,
    dualpipe: bool = False,
    warmup_comm: float | Sequence[float] | None = None,
    finish: dict[tuple[str, int, int], float] | None = None,
) -> tuple[float, list[float]]:
    """Execute a schedule with data dependencies; reference list-scheduler.

    Each rank runs its actions strictly in list order, one at a time; an
    action starts as soon as the rank is free and its inputs are ready:

    * ``F(mb, j)`` needs ``F(mb, j-1)`` sent (+ ``comm`` if on another
      rank; ``warmup_comm`` if that forward ran before its rank's first
      backward), for chain position ``j`` (:func:`chain_position`: the
      virtual stage ``j = chunk * p + rank``);
    * ``B(mb, j)`` needs ``B(mb, j+1)`` sent (+ ``comm`` if on another
      rank), and ``F(mb, j)`` finished on this rank (for the last position
      only the latter);
    * ``W(mb, j)`` (a split backward's weight gradient) needs ``B(mb, j)``;
    * an overlapped pair (:attr:`PipeAction.paired`) needs the inputs of
      both its actions and finishes both at once.

    An output is sent when its action ends, or :attr:`PipeAction.send_after`
    actions later.

    Parameters
    ----------
    schedule : sequence of sequence of PipeAction
        Output of :func:`pipeline_schedule` (``p`` ranks).
    t_fwd, t_bwd : float or sequence of float, optional
        Duration of one forward / backward of one micro-batch on one *chunk*
        (for interleaved with ``v`` chunks pass the per-chunk time, i.e. the
        stage time divided by ``v``). A sequence gives one value per chain
        position ``0..p*v-1`` (``0..p-1`` under ``dualpipe``).
    comm : float or sequence of float, optional
        Seconds of every cross-rank activation / gradient transfer, >= 0. A
        sequence gives one value per boundary: entry ``j`` is the transfer
        between chain positions ``j`` and ``j + 1``, either way (``n - 1``
        entries for ``n`` positions), so a boundary that crosses a slow tier
        need not price the fast ones. Positions are
        :func:`chain_position`'s: under ``dualpipe`` chunk 1's run backwards
        (its position ``j`` is on rank ``p - 1 - j``), so there entry ``j``
        is the link between ranks ``j`` and ``j + 1`` for chunk 0 and between
        ranks ``p - 1 - j`` and ``p - 2 - j`` for chunk 1.
    t_wgrad : float or sequence of float, optional
        Duration of a ``W`` action. ``t_bwd`` is then the input gradient
        alone, and a ``B`` with no ``W`` of its own (a full backward) takes
        ``t_bwd + t_wgrad``.
    t_pair : float, optional
        Duration of an overlapped forward-backward pair (DualPipe's
        ``F&B``); default the sum of its two actions.
    dualpipe : bool, optional
        The schedule is ``dualpipe``'s (two directions, chunk 1 reversed).
    warmup_comm : float or sequence of float, optional
        Seconds of a transfer sent by a *warm-up* forward, one its rank runs before its first backward (per
        boundary as ``comm``; default ``comm``). Data-parallel replicas start a step together and run their
        warm-up forwards back to back, so those sends leave every replica at once and share the fabric;
        later the replicas may drift apart and send less often together. A caller pricing the two apart passes
        the synchronised price here and the drifted one as ``comm`` (:mod:`simulator.screen`).
    finish : dict, optional
        Filled with when every action ends, keyed ``(phase, micro_batch, position)`` (``position`` as
        :func:`chain_position` numbers it): when a chunk's last backward ends on a rank, say, which is when
        its gradients are ready to reduce.

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
        If a ``comm`` or ``warmup_comm`` is negative, ``t_pair < 0``, the schedule is empty, or
        a time sequence has the wrong length.
    TypeError
        If ``finish`` is not a dict (a mutable mapping).
    RuntimeError
        If the schedule deadlocks (a rank waits on an action that can never
        run, e.g. a backward before its forward).
    """
    p = len(schedule)
    if p == 0:
        raise ValueError("schedule must have at least one rank")
    if finish is not None and not isinstance(finish, MutableMapping):
        raise TypeError(f"finish must be a dict to fill with each action's end, got {type(finish).__name__}")
    if t_pair is not None and t_pair < 0:
        raise ValueError(f"t_pair must be >= 0, got {t_pair}")
    kind = "dualpipe" if dualpipe else ""
    v = 1 + max((a.chunk for acts in schedule for a in acts), default=0)
    n_vs = p if dualpipe else p * v
    tf = _per_vstage(t_fwd, n_vs, "t_fwd")
    tb = _per_vstage(t_bwd, n_vs, "t_bwd")
    tw = _per_vstage(t_wgrad, n_vs, "t_wgrad")
    boundary = _per_vstage(comm, max(n_vs - 1, 0), "comm")
    warm = boundary if warmup_comm is None else _per_vstage(warmup_comm, max(n_vs - 1, 0), "warmup_comm")
    for name, value, prices in (("comm", comm, boundary), ("warmup_comm", warmup_comm, warm)):
        if min(prices, default=0.0) < 0 or (isinstance(value, Real) and value < 0):
            raise ValueError(f"{name} must be >= 0, got {value}")
    warmup = set()  # (micro-batch, position) of every forward its rank runs before its first backward
    for r, acts in enumerate(schedule):
        for a in acts:
            if a.phase == "B":
                break
            if a.phase == "F":
                warmup.add((a.micro_batch, chain_position(kind, p, r, a.chunk)))
    split = [{(a.micro_batch, a.chunk) for a in acts if a.phase == "W"} for acts in schedule]

    done: dict[tuple[str, int, int], float] = {}  # (phase, mb, position) -> finish
    sent: dict[tuple[str, int, int], float] = {}  # (phase, mb, position) -> output sent
    waiting: list[list[tuple[int, tuple[str, int, int]]]] = [[] for _ in range(p)]  # (action index, key)
    free = [0.0] * p
    busy = [0.0] * p
    pos = [0] * p
    remaining = sum(len(acts) for acts in schedule)

    def hop(r: int, chunk: int, step: int, micro_batch: int) -> float:
        """Seconds of the transfer from the neighbour ``step`` along the chain to rank ``r`` (0 on the same rank)."""
        if chain_neighbour(kind, p, r, chunk, step) == r:
            return 0.0
        j = chain_position(kind, p, r, chunk)
        if step == -1:
            return (warm if (micro_batch, j - 1) in warmup else boundary)[j - 1]
        return boundary[j]

    def ready_time(r: int, a: PipeAction) -> float | None:
        j = chain_position(kind, p, r, a.chunk)
        if a.phase == "W":
            return done.get(("B", a.micro_batch, j))
        if a.phase == "F":
            if j == 0:
                return 0.0
            prev = sent.get(("F", a.micro_batch, j - 1))
            return None if prev is None else prev + hop(r, a.chunk, -1, a.micro_batch)
        own = done.get(("F", a.micro_batch, j))
        if own is None:
            return None
        if j == n_vs - 1:
            return own
        nxt = sent.get(("B", a.micro_batch, j + 1))
        return None if nxt is None else max(own, nxt + hop(r, a.chunk, 1, a.micro_batch))

    def duration(r: int, a: PipeAction) -> float:
        j = chain_position(kind, p, r, a.chunk)
        if a.phase == "F":
            return tf[j]
        if a.phase == "W":
            return tw[j]
        return tb[j] if (a.micro_batch, a.chunk) in split[r] else tb[j] + tw[j]

    while remaining:
        progressed = False
        for r in range(p):
            acts = schedule[r]
            while pos[r] < len(acts):
                group = list(acts[pos[r]:pos[r] + 2]) if acts[pos[r]].paired else [acts[pos[r]]]
                ready = [ready_time(r, a) for a in group]
                if any(t is None for t in ready):
                    break
                dur = t_pair if len(group) == 2 and t_pair is not None else sum(duration(r, a) for a in group)
                free[r] = max([free[r]] + ready) + dur  # type: ignore[arg-type]
                busy[r] += dur
                for k, a in enumerate(group):
                    key = (a.phase, a.micro_batch, chain_position(kind, p, r, a.chunk))
                    done[key] = free[r]
                    if a.phase != "W":
                        waiting[r].append((pos[r] + k + a.send_after, key))
                pos[r] += len(group)
                remaining -= len(group)
                progressed = True
                for item in [x for x in waiting[r] if x[0] < pos[r]]:
                    sent[item[1]] = free[r]
                    waiting[r].remove(item)
        if not progressed:
            stuck = {r: schedule[r][pos[r]] for r in range(p) if pos[r] < len(schedule[r])}
            raise RuntimeError(f"pipeline schedule deadlocks; ranks blocked on {stuck}")
    if finish is not None:
        finish.update(done)
    return max(free), busy
