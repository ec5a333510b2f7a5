"""``screen``: a closed-form, tier-level estimate of one training step, for ranking layouts in sweeps.

``fidelity: fast`` simulates every flow of the step (seconds per 1,024-GPU
layout); a sweep over hundreds of layouts wants a ranking first and flows for
the winners only. This module prices one layout in milliseconds from the
same parts the simulator uses, without an op graph, an event loop or a flow
network:

compute
    The generator's own segments (``workloads.training``): the kernels of
    each (stage, chunk, pass), timed by :class:`~simulator.compute.ComputeModel`
    (GEMM waves, attention rates, memory-bound kernels) exactly as the engine
    times a coarsened op.
collectives
    The fabric's NCCL plans (:meth:`~simulator.fabric.Fabric.phases`: algorithm
    and protocol as NCCL's tuner picks them, routed over the real ECMP or
    sprayed paths, NCCL's latencies), priced in closed form: every flow that
    runs *at the same time* (every TP group, every DP replica, every pipeline
    boundary) is routed, each link's load is the number of flows crossing it,
    and a flow moves its wire bytes at ``min over its links of usable
    capacity / load``. Oversubscription, ECMP collisions and leaf-crossing rings
    are therefore priced per link. Stages whose DP rings share links are priced
    again over each other's rings, weighted by how much their windows overlap
    in time. What is not priced is max-min's redistribution of the rate a flow
    bottlenecked elsewhere leaves (pessimistic) and sharing between different
    kinds of traffic (activation transfers with DP rings).
pipeline
    The schedule itself (``workloads.schedules.pipeline_schedule``), run by
    the reference list scheduler :func:`~workloads.schedules.simulate_unit_times`
    with per-virtual-stage forward/backward times (compute + blocking TP
    communication) and each boundary's contended activation transfer: the
    warm-up forwards' with every DP replica sending at once, the later ones
    as far as the replicas have drifted apart (:func:`pipeline_transfer_times`).
data parallelism
    The last backward's gradient buckets, filled layer by layer as the
    generator fills them, reduced back to back on the DP stream: what is left
    after the backward ends is exposed. Megatron's data parallelism buckets
    only the first stage's first chunk; every other chunk is one collective
    after its last backward (``_StepBuilder.unbucketed``), when the list
    scheduler ends it, on the same DP stream. Then the gradient-norm all-reduces
    (every stage waits for the slowest), the optimizer kernels and the ZeRO-1
    parameter all-gather.
memory
    :func:`workloads.memory.memory_per_gpu`, as ``run`` checks it.

Left out: the SMs communication kernels hold beside compute (``compute.comm_sms``, :mod:`simulator.engine`),
which slow the backward under overlapped DP buckets in the engine; the screen is optimistic by that much
(within 1.08% on the 1,024-GPU GPT-3 sweep, docs/DESIGN.md).

The agreement with ``fast`` is measured, not assumed: ``tests/test_screen.py``
(a 64-GPU sweep, Spearman and top-k) and ``benchmarks/screen_benchmark.py``
(the 1,024-GPU GPT-3 layout sweep). Configurations the closed form does not
cover (MoE, DualPipe, context parallelism, TP communication overlap, Megatron's aligned
gradient reductions where they apply, ZeRO-3 / FSDP gathers, per-micro-batch
gradient reduction, overlapped parameter gathers, blocking p2p, faults, a
parameter server) raise :class:`ScreenUnsupported`, a ``ValueError`` naming
what is not modelled.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import simpy

from topologies.capacity import plan_columns
from workloads.errors import ConfigError
from workloads.flops import FP8_CAST_BYTES, fp8_gemm_modules, model_flops_per_step, optimizer_step_ops
from workloads.memory import stage_params
from workloads.ops import Kernel
from workloads.parallel import padded_vocab
from workloads.schedules import simulate_unit_times
from workloads.training import FP8_AMAX_ENTRIES, FP8_SCALE_UPDATE_BYTES, _StepBuilder

from .compute import ComputeModel
from .experiment import Experiment, check_memory
from .fabric import Fabric

__all__ = ["SCREEN", "ScreenUnsupported", "screen_experiment", "unsupported_reason"]

SCREEN = "screen"
"""The sweep fidelity this module implements."""


class ScreenUnsupported(ConfigError):
    """The configuration uses something the closed-form screen does not model (sweep it with ``fast``)."""


def unsupported_reason(exp: Experiment) -> str | None:
    """What in ``exp`` the screen does not model (one phrase), or None when it can price it.

    Parameters
    ----------
    exp : Experiment
        A resolved experiment.

    Returns
    -------
    str or None
    """
    par, opt = exp.parallel, exp.options
    checks = (
        (exp.model.is_moe, "mixture-of-experts layers"),
        (par.cp > 1, "context parallelism (parallel.cp > 1)"),
        (par.tp_comm_overlap, "parallel.tp_comm_overlap"),
        (par.schedule == "dualpipe", "parallel.schedule: dualpipe (its two directions and overlapped pairs)"),
        (par.overlap_param_gather, "parallel.overlap_param_gather"),
        (par.dp_sync == "parameter_server", "parallel.dp_sync: parameter_server"),
        (opt.p2p != "async", "options.p2p: blocking"),
        (bool(exp.faults), "faults"),
        (opt.granularity != "chunk", "options.granularity: layer"),
        (exp.network.model != "flow", f"network.model: {exp.network.model} (the screen prices every link's load)"),
    )
    for bad, what in checks:
        if bad:
            return what
    return None


# ------------------------------------------------------------------ fabrics
_FABRICS: dict[tuple[int, str], tuple[Any, Fabric]] = {}
_MAX_FABRICS = 8


def _fabric(exp: Experiment) -> Fabric:
    """The fabric of ``exp``'s cluster and network settings, kept per process (its routes and plans are
    cached inside it, so a sweep over one cluster routes each pair once)."""
    key = (id(exp.cluster), repr(exp.network))
    hit = _FABRICS.get(key)
    if hit is not None and hit[0] is exp.cluster:
        return hit[1]
    if len(_FABRICS) >= _MAX_FABRICS:
        _FABRICS.pop(next(iter(_FABRICS)))
    fabric = Fabric(simpy.Environment(), exp.cluster, exp.network)
    _FABRICS[key] = (exp.cluster, fabric)
    return fabric


def flow_times(fabric: Fabric, flows: Sequence[tuple], background: Sequence[tuple] = (),
               groups: Sequence[int] | None = None) -> np.ndarray:
    """Seconds each of ``flows`` takes when they all start together (parameters as :func:`concurrent_time`).

    Flow ``i`` takes ``latency + wire_bytes · max over its links of load / usable capacity``, a link's load the
    flows crossing it, each by the weight the fabric declared for that entry (1, or ``1/k`` on each of the ``k``
    paths of a sprayed hop, whose ``wire_bytes`` are then its whole payload's). With ``groups``
    (a group label per flow, any integers) a link's load counts only the flows of the flow's own group (and
    the background): each group is priced as if it ran alone on the fabric, all of them in one pass, in
    memory that grows with the flows' links, not with groups x links.
    """
    if not flows:
        return np.zeros(0)
    cap = fabric.usable_capacity
    n = len(cap)
    routes = [np.asarray(f[0], dtype=np.int64) for f in flows]
    sizes = np.fromiter(map(len, routes), dtype=np.int64, count=len(routes))
    links = np.concatenate(routes)
    # Each entry's weight: 1, or the share of the flow's rate it carries where the fabric declared one (a hop
    # sprayed over k paths: 1/k on each path's entries, so a link all k paths cross counts the flow once)
    network = getattr(fabric, "network", None)  # (a stand-in fabric with no network declares nothing)
    declared = ([network.weights_of(f[0]) if isinstance(f[0], np.ndarray) else None for f in flows]
                if network is not None else [None] * len(flows))
    weight = (None if all(w is None for w in declared) else
              np.concatenate([np.ones(k) if w is None else w for w, k in zip(declared, sizes.tolist())]))
    if groups is None:
        load = np.bincount(links, weights=weight, minlength=n).astype(float)[links]
    else:
        if len(groups) != len(flows):
            raise ValueError(f"groups must give one label per flow: {len(groups)} labels for {len(flows)} flows")
        # (group, link) pairs: a flow's load on a link is how many flows of its group cross it
        _, inverse, counts = np.unique(np.repeat(np.asarray(groups, dtype=np.int64), sizes) * n + links,
                                       return_inverse=True, return_counts=True)
        inverse = inverse.ravel()
        load = (counts[inverse].astype(float) if weight is None else
                np.bincount(inverse, weights=weight, minlength=len(counts))[inverse])
    if background:
        extra = np.concatenate([b[0] for b in background])
        weights = np.concatenate([np.full(len(b[0]), float(b[1])) for b in background])
        load = load + np.bincount(extra, weights=weights, minlength=n)[links]
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    worst = np.maximum.reduceat(load / cap[links], starts)  # each flow's most loaded link, seconds per byte
    return np.array([f[2] for f in flows]) + np.array([f[1] for f in flows]) * worst


def concurrent_time(fabric: Fabric, flows: Sequence[tuple], background: Sequence[tuple] = ()) -> float:
    """Seconds until the last of ``flows`` ends when they all start together.

    Parameters
    ----------
    fabric : Fabric
        Where the flows were routed (its ``usable_capacity``, bytes/s per link).
    flows : sequence of tuple
        ``(links, wire_bytes, latency_s, ...)`` specs as :meth:`Fabric.phases` and :meth:`Fabric.send_spec`
        give them.
    background : sequence of (links, weight)
        Other traffic on the fabric meanwhile: a flow over ``links`` present ``weight`` of the time (a
        time average).

    Returns
    -------
    float
        ``max over flows of latency + wire_bytes · max over its links of load / usable capacity``, where a
        link's load is how many flows cross it (background flows by their weight): each flow at its equal
        share of its most loaded link, as :meth:`Fabric.estimate` prices a plan's own transfers.
    """
    return float(flow_times(fabric, flows, background).max(initial=0.0))


def _share_tuning(fabric: Fabric, kind: str, groups: Sequence[tuple[int, ...]], nbytes: float,
                  algorithm: str) -> None:
    """Let every group of ``groups`` take the algorithm and protocol NCCL's tuner picks for the first.

    The groups one collective runs over at once (the DP groups of a stage, one per TP rank; the TP groups of
    a stage, one per DP replica) are translates of each other on identical hardware, so their
    contention-free estimates, and the tuner's pick, are the same; estimating each (routing every candidate)
    was half of the screen's time. A group split over servers otherwise than the first (how many members
    each of its servers holds: a placement that strides groups over servers of another size) is left to the
    tuner. Only the fabric's cache of picks is seeded; planning and routing stay the fabric's.
    """
    cache = getattr(fabric, "_auto_cache", None)
    if algorithm != "auto" or len(groups) < 2 or not isinstance(cache, dict):
        return
    first = (kind, groups[0], nbytes, algorithm)
    if first not in cache:
        fabric.choose(kind, groups[0], nbytes, algorithm)
    pick = cache.get(first)
    if pick is None:
        return
    server_of = fabric.server_of

    def split(group: tuple[int, ...]) -> list[int]:
        """Members per server, largest first."""
        return sorted(Counter(server_of(r) for r in group).values(), reverse=True)

    first_split = split(groups[0])
    for g in groups[1:]:
        if len(g) == len(groups[0]) and split(g) == first_split:
            cache.setdefault((kind, g, nbytes, algorithm), pick)


def collective_flows(fabric: Fabric, kind: str, groups: Iterable[tuple[int, ...]], nbytes: float,
                     algorithm: str = "auto") -> list[list[tuple]]:
    """Per phase, the routed flows of one collective over every group of ``groups`` (NCCL's plan per group)."""
    if nbytes <= 0:
        return []
    groups = [g for g in groups if len(g) > 1]
    _share_tuning(fabric, kind, groups, nbytes, algorithm)
    plans = [fabric.phases(kind, g, nbytes, algorithm) for g in groups]
    phases = max((len(p) for p in plans), default=0)
    return [[f for p in plans if i < len(p) for f in p[i]] for i in range(phases)]


def collective_time(fabric: Fabric, kind: str, groups: Iterable[tuple[int, ...]], nbytes: float,
                    count: int = 1, algorithm: str = "auto", background: Sequence[tuple] = ()) -> float:
    """Seconds of ``count`` back-to-back collectives run at once over every group of ``groups`` (NCCL's plan
    per group).

    Phase ``i`` of every group runs together (:func:`concurrent_time`, over ``background``); phases follow
    one another. ``count`` identical calls take ``count`` times one (their bytes and latencies add; the loads
    do not change).
    """
    if count < 1:
        return 0.0
    return count * sum(concurrent_time(fabric, flows, background)
                       for flows in collective_flows(fabric, kind, groups, nbytes, algorithm))


# ------------------------------------------------------------------ compute
class _Timer:
    """Kernel durations under one compute model, cached per kernel."""

    def __init__(self, model: ComputeModel) -> None:
        self.model = model
        self.cache: dict[Any, float] = {}

    def __call__(self, ops: Iterable) -> float:
        """Seconds of the generator's kernels (``LayerOp``) run back to back."""
        return sum(self.kernel(op.kernel()) for op in ops)

    def kernel(self, k: Kernel) -> float:
        """Seconds of one kernel."""
        t = self.cache.get(k)
        if t is None:
            t = self.cache[k] = self.model.duration(k)
        return t


def _stage_chain(finish_last: float, tb: Sequence[float], comm: Sequence[float], p: int) -> list[float]:
    """When each pipeline rank's last backward ends: rank 0's at ``finish_last`` (the pipeline's end), rank ``r``
    one backward and one transfer (``comm[r - 1]``, the boundary between ranks ``r - 1`` and ``r``) earlier than
    rank ``r - 1``'s (the cool-down chain of GPipe, 1F1B and interleaved schedules)."""
    out = [finish_last]
    for r in range(1, p):
        out.append(out[-1] - tb[r - 1] - comm[r - 1])
    return out


def boundary_transfer_times(fabric: Fabric, block: Sequence[Sequence[int]], nbytes: float, positions: int,
                            tp: int = 1) -> list[float]:
    """Seconds of each pipeline boundary's activation (or gradient) transfer when every DP replica sends at
    once, ``positions - 1`` of them (the warm-up prices :func:`pipeline_transfer_times` starts from).

    Boundary ``j`` joins chain positions ``j`` and ``j + 1``: ranks ``j mod p`` and ``(j + 1) mod p`` of every DP
    x TP replica (``block[s]``: the ranks of stage ``s``, in matching order, a replica's ``tp`` ranks next to
    each other), one ``nbytes`` send per rank.

    * **Contention.** Each direction is priced with every boundary's transfers in that direction at once (the
      warm-up of a 1F1B schedule, where every replica's every stage sends at about the same time; the chunks
      of an interleaved schedule take turns on a pair of ranks, so a pair counts once), each flow at its
      equal share of its most loaded link (:func:`flow_times`); a replica's transfer over a boundary takes its
      slowest member's flow in the slower direction (its TP collectives keep the members together).
    * **Which replica.** The DP replicas run the schedule each at its own pace: a replica whose transfers
      collide at one boundary falls behind the others there and is not held back by the replicas that
      collide at the next (the engine shows it: on the 1,024-GPU GPT-3 layout TP4 PP8 DP32 at 4:1 one
      boundary's 32 replica sends take 0.29 to 1.45 ms and start up to 1 ms apart). The pipeline ends when the
      slowest replica does, so the times returned are those of the replica whose transfers take longest in
      sum over the boundaries: the maximum of the sums, not the sum of each boundary's maximum (which prices
      every transfer at the worst collision the fabric has). A boundary inside a leaf is therefore not charged
      for the oversubscribed uplinks another one crosses.
    """
    (synced,) = _replica_transfer_times(fabric, block, nbytes, positions, tp)
    if not synced.size:
        return []
    return [float(x) for x in synced[:, int(np.argmax(synced.sum(axis=0)))]]


def pipeline_transfer_times(fabric: Fabric, block: Sequence[Sequence[int]], nbytes: float, positions: int,
                            tp: int = 1) -> tuple[list[float], list[float]]:
    """Seconds of each pipeline boundary's transfer in the warm-up and after it, for the DP replica whose
    transfers sum the largest (parameters as :func:`boundary_transfer_times`'s).

    Every replica starts the step at once and sends its warm-up forwards at the same instants: those are
    priced all together (:func:`boundary_transfer_times`). Each replica's transfer then takes its own time
    (its collisions), so the replicas leave the warm-up apart, by up to the *spread* ``D`` of a boundary's
    warm-up prices over the replicas, and send later micro-batches at those offsets. A later transfer of
    ``a`` seconds alone (its TP members' flows, nothing else on the fabric) meets the others' for about
    ``min(1, a / D)`` of the time, so it is priced ``a + (w - a) · min(1, a / D)``, ``w`` its warm-up price:
    the warm-up price where every replica is delayed alike (``D = 0``, a symmetric fabric, where they stay
    in step and keep colliding) or where the offsets are shorter than a transfer, and nearly ``a`` where they
    are much longer. The pipeline is priced by the replica whose warm-up and later transfers sum the largest.
    Simplifications: ``D`` is each boundary's own spread (offsets built up over the boundaries before are
    not carried on: summing them took the 32-GPU interleaved schedules further from `fast`, -0.64% to
    -1.31%), and ``min(1, a / D)`` reaches the warm-up price as soon as ``D`` falls to ``a``. Measured against
    the engine on the 1,024-GPU GPT-3 layout TP4 PP8 DP32 at 4:1: its
    warm-up forwards take 0.29 to 1.61 ms (mean 0.69), its later forwards 0.29 to 0.93 ms (mean 0.38), its
    backward sends 0.29 to 0.70 ms (mean 0.35), one send alone 0.29 ms; on 32 GPUs (TP2 PP2 DP8 at 2:1,
    four micro-batches) every transfer takes about its warm-up price (docs/DESIGN.md, "Twenty-sixth
    session").

    Returns
    -------
    warm-up, later : list of float
        ``positions - 1`` seconds each.
    """
    synced, alone = _replica_transfer_times(fabric, block, nbytes, positions, tp, alone=(False, True))
    if not synced.size:
        return [], []
    spread = (synced.max(axis=1) - synced.min(axis=1))[:, None]
    meet = np.minimum(1.0, alone / np.where(spread > 0, spread, np.inf), where=spread > 0,
                      out=np.ones_like(alone))
    later = np.where(meet < 1.0, alone + (synced - alone) * meet, synced)
    slowest = int(np.argmax(synced.sum(axis=0) + later.sum(axis=0)))  # the replica slowest over its whole step
    return [float(x) for x in synced[:, slowest]], [float(x) for x in later[:, slowest]]


def _replica_transfer_times(fabric: Fabric, block: Sequence[Sequence[int]], nbytes: float, positions: int,
                            tp: int, alone: Sequence[bool] = (False,)) -> list[np.ndarray]:
    """Seconds of every replica's transfer over every boundary, ``(positions - 1) x replicas``, the slower
    direction of each: one array per entry of ``alone``, all at once (False) or each replica's (its TP
    members' flows) alone on the fabric (True). The flows are routed once for every entry."""
    p = len(block)
    replicas = len(block[0]) // tp
    pairs = sorted({(j % p, (j + 1) % p) for j in range(positions - 1)} - {(s, s) for s in range(p)})
    # each pass's per pair: each replica's seconds, slower direction
    per_pair = [{pair: np.zeros(replicas) for pair in pairs} for _ in alone]
    # flow i of pair k is replica (i // tp) % replicas's member i % tp (send_specs keeps the block's order)
    apart = np.arange(len(pairs) * replicas * tp) // tp
    for forward in (True, False):
        flows: list[tuple] = []
        for src, dst in pairs:
            a_side, z_side = (block[src], block[dst]) if forward else (block[dst], block[src])
            flows += fabric.send_specs(tuple(a_side), tuple(z_side), nbytes)
        for times, by_itself in zip(per_pair, alone):
            seconds = flow_times(fabric, flows, groups=apart if by_itself else None)
            seconds = seconds.reshape(len(pairs), replicas, tp).max(axis=2)
            for k, pair in enumerate(pairs):
                np.maximum(times[pair], seconds[k], out=times[pair])
    zero = np.zeros(replicas)
    return [np.array([times.get((j % p, (j + 1) % p), zero) for j in range(positions - 1)]).reshape(-1, replicas)
            for times in per_pair]


def _contend(windows: list[tuple[float, float]], rings: list[list[np.ndarray]],
             rerun: Callable[[int, Sequence[tuple]], tuple[float, float]],
             rounds: int = 2) -> list[tuple[float, float]]:
    """Windows ``(start, end)`` of every stage's DP collectives once they share links with each other's.

    ``windows`` are each stage's alone; stage ``s`` is then re-priced by ``rerun(s, background)`` over every
    other stage's ring flows, each weighted by the fraction of ``s``'s window it overlaps (a time average),
    ``rounds`` times (the windows stretch under the extra load).
    """
    p = len(windows)
    shared = _shared_rings(rings)
    if shared is None:
        return windows
    for _ in range(rounds):
        updated = []
        for stage in range(p):
            a, e = windows[stage]
            bg: list[tuple] = []
            for other in range(p):
                if not shared[stage][other] or e <= a:
                    continue
                share = max(0.0, min(e, windows[other][1]) - max(a, windows[other][0])) / (e - a)
                if share > 0:
                    bg += [(links, share) for links in shared[stage][other]]
            updated.append(rerun(stage, bg) if bg else windows[stage])
        windows = updated
    return windows


def _shared_rings(rings: list[list[np.ndarray]]) -> list[list[list[np.ndarray]]] | None:
    """For every stage ``s`` and other stage ``o``, the links arrays of ``o``'s flows (``rings[o]``) that cross one
    of ``s``'s links: only those can slow ``s`` (directly). None where no link carries two stages' flows."""
    p = len(rings)
    own = [np.unique(np.concatenate(r)) if r else np.zeros(0, dtype=np.int64) for r in rings]
    if np.bincount(np.concatenate(own)).max(initial=0) <= 1:  # no link carries two stages' rings
        return None
    shared = [[[links for links in rings[o] if o != s and np.isin(links, own[s]).any()] for o in range(p)]
              for s in range(p)]
    return shared if any(shared[s][o] for s in range(p) for o in range(p)) else None


def _tp_contend(flows: list[list[list[tuple]]], rerun: Callable[[int, Sequence[tuple]], dict[str, float]],
                shares: Callable[[list[dict[str, float]]], list[float]],
                costs: list[dict[str, float]]) -> list[dict[str, float]]:
    """Every stage's TP collective costs once they share links with the other stages' TP rings.

    ``flows`` holds each stage's TP collective flows (per phase); stage ``s`` is re-priced once by ``rerun(s,
    background)`` over the other stages' flows that cross one of its links (:func:`_shared_rings`), each weighted
    by ``shares(costs)``: the fraction of the pipeline's window that stage spends in TP collectives (a time
    average, since the stages' passes are at unrelated points of their schedules; re-priced twice, it overshot).
    """
    shared = _shared_rings([[f[0] for phase in stage for f in phase] for stage in flows])
    if shared is None:
        return costs
    share = shares(costs)
    return [rerun(stage, [(links, share[other]) for other, found in enumerate(shared[stage]) if share[other] > 0
                          for links in found]) if any(shared[stage]) else costs[stage]
            for stage in range(len(flows))]


# ------------------------------------------------------------------ the estimate
def screen_experiment(exp: Experiment, *, force: bool = False) -> dict[str, Any]:
    """Estimate one training step of ``exp`` in closed form (see the module docstring).

    Parameters
    ----------
    exp : Experiment
        A resolved experiment (its ``fidelity`` is ignored).
    force : bool, default False
        Estimate even when the configuration does not fit in GPU memory.

    Returns
    -------
    dict
        Summary fields named as :attr:`simulator.result.Result.summary` names them: ``step_time_s``,
        ``mfu``, ``tflops_per_gpu``, ``bubble_fraction``, ``exposed_comm_s``, ``tokens_per_s`` (seconds,
        fractions, TFLOP/s, tokens/s), ``exposed_comm_by_class_s`` (``tp``, ``pp``, ``dp``, ``zero``,
        ``sync``), ``time_breakdown_s`` (``forward``, ``backward``, ``bubble``, ``optimizer``; mean
        over ranks), ``memory_per_gpu_bytes``, the capacity columns, ``fidelity: "screen"`` and
        ``sim_wall_s``.

    Raises
    ------
    OutOfMemoryError
        The configuration does not fit (unless ``force``).
    ScreenUnsupported
        The configuration uses something the screen does not model.
    """
    t0 = time.perf_counter()
    memory = check_memory(exp, force)
    why = unsupported_reason(exp)
    if why is not None:
        raise ScreenUnsupported(f"fidelity: screen does not model {why}; sweep with --fidelity fast")
    b = _StepBuilder(exp.model, exp.parallel, exp.training, exp.options, exp.routing)
    if b.aligned_grad_reduce:  # (the generator's own test of where the flag applies)
        raise ScreenUnsupported("fidelity: screen does not model parallel.align_grad_reduce (Megatron's aligned "
                                "gradient reductions); sweep with --fidelity fast")
    if b.plan.gather is not None or b.plan.grad_sync == "micro_batch" or b.plan.bucket_bytes is None:
        raise ScreenUnsupported(f"fidelity: screen does not model ZeRO-{exp.parallel.zero} with "
                                f"zero_impl {b.plan.impl} (per-layer gathers or per-micro-batch reduction); "
                                f"sweep with --fidelity fast")
    par, lay = exp.parallel, b.layout
    p, v, m, t = b.p, b.v, b.m, b.t
    nvs = p * v
    fabric = _fabric(exp)
    timer = _Timer(exp.compute_model())
    # A stage's DP replicas run the same TP collective at the same instant: priced together, so a placement
    # whose TP groups leave their servers pays for the uplinks they share. The other stages' TP collectives run
    # at other points of their passes: with every stage's at once, TP 8 x PP 2 x DP 2 placed [pp, tp, dp] on a
    # 4:1 fabric read +23.7% of `fast`, with stage 0's alone -11.0%. So where TP groups leave their servers,
    # each stage's are priced over the other stages' rings at the fraction of the time those stages spend in
    # TP collectives (a time average, as the DP reductions' _contend; [pp, dp, tp] TP 8 PP 2 DP 2 at 4:1 read
    # -26.6% of `fast` with its own stage's alone). Inside servers no two stages share a link: stage 0's
    # groups price every stage (the screen models no faults, so servers are alike).
    tp_groups_of = [[lay.tp_group(lay.rank(tp=0, dp=d, pp=stage)) for d in range(par.dp)] for stage in range(p)]
    server_of = fabric.server_of
    tp_leaves = t > 1 and any(len({server_of(r) for r in g}) > 1 for groups in tp_groups_of for g in groups)
    tp_kinds = ("all_reduce", "all_gather", "reduce_scatter")
    passes = {(stage, chunk): (b.segments(stage, chunk, "F", False), b.segments(stage, chunk, "B", False))
              for stage in range(p) for chunk in range(v)}
    # multi-head latent attention's collectives of other widths (_StepBuilder._tp_widths; a re-gather is an
    # all-gather): (kind, width) -> seconds, beside the b s h ones
    widths = sorted({("all_gather" if kind == "regather" else kind, w) for segs in passes.values() for pas in segs
                     for s in pas for kind, w in s.tp_widths})

    def stage_tp_cost(stage: int, background: Sequence[tuple] = ()) -> dict:
        """Seconds of each TP collective (and ``loss``: the loss all-reduces; ``(kind, width)``: MLA's latents) of
        ``stage``'s groups at once."""
        groups = tp_groups_of[stage]
        cost: dict = {kind: collective_time(fabric, kind, groups, b.tp_bytes, background=background)
                      for kind in tp_kinds}
        for kind, w in widths:
            cost[kind, w] = collective_time(fabric, kind, groups, b.tp_width_bytes(w), background=background)
        cost["loss"] = sum(collective_time(fabric, "all_reduce", groups, nbytes, background=background)
                           for nbytes in b.loss_all_reduce_bytes)
        return cost

    tp_cost = [stage_tp_cost(stage) for stage in range(p)] if tp_leaves else [stage_tp_cost(0)] * p

    def tp_time(segs, cost: dict) -> float:
        return sum(n * cost[kind] for s in segs for kind, n in s.tp.items()) + sum(
            cost["loss"] for s in segs if s.loss_reduce) + sum(
            n * cost[key] for s in segs for key, n in s.tp_widths.items() if key[0] != "regather")

    stage_groups: dict[int, tuple[int, ...]] = {}

    def fp8_amax(stage: int, chunk: int, phase: int) -> float:
        """The generator's per-pass FP8 amax reduction (stage group, DP-major) and scale update, seconds."""
        entries = FP8_AMAX_ENTRIES[phase] * sum(fp8_gemm_modules(exp.model, i, par.ep)
                                                for i in b.chunk_layers(stage, chunk))
        if stage not in stage_groups:
            stage_groups[stage] = tuple(lay.rank(tp=r, dp=d, pp=stage) for d in range(par.dp) for r in range(t))
        reduce = collective_time(fabric, "all_reduce", [stage_groups[stage]], 4.0 * entries)
        return reduce + timer.kernel(Kernel("fp8_cast", 0.0, FP8_SCALE_UPDATE_BYTES * entries))

    # Per virtual stage j = chunk·p + stage: compute, blocking TP communication, per micro-batch.
    split = par.schedule == "zb-h1"
    grad_phase = "W" if split else "B"
    cf_of, cb_of, tw = [0.0] * nvs, [0.0] * nvs, [0.0] * nvs  # compute alone, per virtual stage
    comp_f, comp_b = [0.0] * p, [0.0] * p
    for (stage, chunk), (fwd, bwd) in passes.items():
        j = chunk * p + stage
        cf, cb = timer(k for s in fwd for k in s.kernels), timer(k for s in bwd for k in s.kernels)
        comp_f[stage] += cf
        comp_b[stage] += cb
        cf_of[j], cb_of[j] = cf, cb
        if split:
            wgt = b.segments(stage, chunk, "W", False)
            tw[j] = timer(k for s in wgt for k in s.kernels)
            comp_b[stage] += tw[j]
    amax = {(stage, chunk): (fp8_amax(stage, chunk, 0), fp8_amax(stage, chunk, 1)) if b.fp8_amax else (0.0, 0.0)
            for stage, chunk in passes}

    def add_tp(costs: list[dict[str, float]]) -> tuple[list[float], list[float], list[float]]:
        """Each virtual stage's forward and backward with their blocking TP communication, and each stage's TP
        seconds per micro-batch, under ``costs`` (per stage)."""
        f, g, per_stage = list(cf_of), list(cb_of), [0.0] * p
        for (stage, chunk), (fwd, bwd) in passes.items():
            j, cost = chunk * p + stage, costs[stage]
            xf, xb = tp_time(fwd, cost), tp_time(bwd, cost)
            # SP's backward re-gathers run beside the pass's compute; its TP collectives wait for both
            regather = sum(s.regather for s in bwd) * cost["all_gather"] + sum(
                n * cost["all_gather", w] for s in bwd for (kind, w), n in s.tp_widths.items() if kind == "regather")
            xb += max(0.0, regather - cb_of[j])
            if b.pp_gather:  # Megatron's scatter/gather: the received 1/t all-gathered over TP
                xf += cost["all_gather"] if j > 0 else 0.0
                xb += cost["all_gather"] if j < nvs - 1 else 0.0
            # after every FP8 pass: the amax all-reduce over the stage, then the scale update
            xf += amax[stage, chunk][0]
            xb += amax[stage, chunk][1]
            f[j] += xf
            g[j] += xb
            per_stage[stage] += xf + xb
        return f, g, per_stage

    # Activation transfers: the warm-up forwards' priced with every replica's and boundary's at once in the
    # same direction, the later ones as far as the replicas have drifted apart (pipeline_transfer_times).
    block = [[lay.rank(tp=r, dp=d, pp=stage) for d in range(par.dp) for r in range(t)] for stage in range(p)]
    warm, comm = pipeline_transfer_times(fabric, block, b.p2p_bytes, nvs, t)

    def tp_shares(costs: list[dict[str, float]]) -> list[float]:
        """The fraction of the pipeline's window each stage spends in TP collectives under ``costs``."""
        f, g, per_stage = add_tp(costs)
        window = simulate_unit_times(b.schedules, f, g, comm, tw, warmup_comm=warm)[0]
        return [min(1.0, m * x / window) if window > 0 else 0.0 for x in per_stage]

    if tp_leaves and p > 1:  # (the rings' links: an all-gather's, a ring whatever the size)
        tp_cost = _tp_contend([collective_flows(fabric, "all_gather", tp_groups_of[stage], b.tp_bytes)
                               for stage in range(p)], stage_tp_cost, tp_shares, tp_cost)
    tf, tb, tp_mb = add_tp(tp_cost)
    ends: dict[tuple[str, int, int], float] = {}
    pipe, busy = simulate_unit_times(b.schedules, tf, tb, comm, tw, warmup_comm=warm, finish=ends)
    last_backward: dict[int, float] = {}  # chain position -> when its last backward ends
    for (phase, _mb, position), end in ends.items():
        if phase == "B" and end > last_backward.get(position, -1.0):
            last_backward[position] = end
    if b.fp8 and not par.overlap_param_gather:
        # FP8 weights cast once per step before each chunk's first forward: on the pipeline's fill chain.
        per_weight = 2 if exp.training.fp8_param_gather else FP8_CAST_BYTES
        cast = sum(timer.kernel(Kernel("fp8_cast", 0.0, per_weight * sum(b.fp8_weights(st, c))))
                   for st in range(p) for c in range(v))
        pipe += cast
        busy = [bz + cast / p for bz in busy]
    finish = [pipe] * p if split else _stage_chain(pipe, [tb[s] for s in range(p)], comm, p)
    finish = [max(f, bz) for f, bz in zip(finish, busy)]

    # Gradient reduction: buckets of the last backward, back to back on the DP stream.
    grad_dp = par.grad_dp
    kind = "all_reduce" if par.zero == 0 else "reduce_scatter"
    overlap = par.overlap_grad_reduce and grad_dp > 1
    size = b.plan.bucket_bytes
    dp_end = list(finish)
    reduced: list[dict[float, int]] = [{} for _ in range(p)]
    bucket_cost: dict[tuple[int, float], float] = {}

    grad_groups: dict[int, list[tuple[int, ...]]] = {}

    def dp_groups(stage: int) -> list[tuple[int, ...]]:
        if stage not in grad_groups:
            grad_groups[stage] = [lay.grad_group(block[stage][r]) for r in range(t)]
        return grad_groups[stage]

    def reduce_time(stage: int, nbytes: float, count: int, background: Sequence[tuple]) -> float:
        key = (stage, nbytes)
        if background or key not in bucket_cost:
            cost = collective_time(fabric, kind, dp_groups(stage), nbytes, background=background)
            if background:
                return count * cost
            bucket_cost[key] = cost
        return count * bucket_cost[key]

    def buckets(stage: int) -> list[tuple[float, float, int]]:
        """``(ready time, bucket bytes, count)`` of the stage's gradient buckets, as ``_Buckets`` fills them."""
        ready: list[tuple[float, float, int]] = []
        fill = 0.0
        if overlap:  # chunk 0's backward is the stage's last
            if b.megatron_overlap:  # Megatron buckets only stage 0's chunk 0: the others one collective each
                whole = [sum(s.grad_bytes for s in b.segments(stage, c, grad_phase, False)) for c in range(v)]
                # chunk c > 0 once its last backward is done (the schedule's own time), on the same DP stream:
                # behind the backwards of the later chunks when it is short, past them when it is not
                ready = [(last_backward[c * p + stage], whole[c], 1) for c in range(1, v) if whole[c] > 0]
                if b.unbucketed(stage, 0):  # reduced once the last backward is done
                    return sorted(ready + [(finish[stage], whole[0], 1)] if whole[0] > 0 else ready,
                                  key=lambda bucket: bucket[0])
            else:
                fill = sum(s.grad_bytes for c in range(1, v) for s in b.segments(stage, c, grad_phase, False))
                if fill >= size:
                    full = int(fill // size)
                    hidden[stage][size] = hidden[stage].get(size, 0) + full
                    fill -= full * size
            segs = b.segments(stage, 0, grad_phase, True)
            at = finish[stage] - timer(k for s in segs for k in s.kernels)
            for s in segs:
                at += timer(s.kernels)
                fill += s.grad_bytes
                if fill >= size:
                    full = int(fill // size)
                    ready.append((at, size, full))
                    fill -= full * size
        else:
            fill = sum(s.grad_bytes for c in range(v) for s in b.segments(stage, c, grad_phase, False))
        if size == float("inf"):
            ready.append((finish[stage], fill, 1))
        else:
            full = int(fill // size)
            ready += [(finish[stage], size, full), (finish[stage], fill - full * size, 1)]
        return sorted(((at, nbytes, count) for at, nbytes, count in ready if nbytes > 0 and count > 0),
                      key=lambda bucket: bucket[0])

    def reduce_stage(stage: int, background: Sequence[tuple]) -> tuple[float, float]:
        """When the stage's DP stream starts and ends reducing, buckets back to back from their ready times."""
        end, first = 0.0, None  # the DP stream is idle until the first bucket
        for at, nbytes, count in ready_of[stage]:
            start = max(end, at)
            first = start if first is None else first
            end = start + reduce_time(stage, nbytes, count, background)
        return (finish[stage] if first is None else first), end

    windows: list[tuple[float, float]] = []
    rings: list[list[np.ndarray]] = [[] for _ in range(p)]  # each stage's DP ring flows (their links)
    if grad_dp > 1:
        hidden: list[dict[float, int]] = [{} for _ in range(p)]
        ready_of = [buckets(stage) for stage in range(p)]
        for stage in range(p):
            reduced[stage] = dict(hidden[stage])
            for _at, nbytes, count in ready_of[stage]:
                reduced[stage][nbytes] = reduced[stage].get(nbytes, 0) + count
        windows = [reduce_stage(stage, ()) for stage in range(p)]
        # Stages whose reductions overlap in time share links: each stage's buckets run over the others'
        # rings weighted by the fraction of its window they overlap (a time average), twice (the windows
        # stretch under the extra load).
        if p > 1:
            rings = [[f[0] for ph in collective_flows(fabric, kind, dp_groups(stage),
                                                      max(ready_of[stage], key=lambda r: r[1])[1]) for f in ph]
                     if ready_of[stage] else [] for stage in range(p)]
            windows = _contend(windows, rings, reduce_stage)
        for stage in range(p):
            dp_end[stage] = max(windows[stage][1], finish[stage])
    # Tied embeddings: the first and last stage all-reduce the word-embedding gradient on the DP stream.
    if exp.model.tied_embeddings and p > 1:
        pairs = list(zip(block[0], block[p - 1]))
        nbytes = exp.model.word_embedding_params(t, padded_vocab(exp.model.vocab, t)) * b.grad_bytes
        tied = collective_time(fabric, "all_reduce", pairs, nbytes)
        for s in (0, p - 1):
            dp_end[s] = max(dp_end[s], finish[s]) + tied

    # Optimizer: the gradient norm (kernels, then all-reduces every stage joins), Adam, the ZeRO-1 gather.
    norm_c, opt_c, gather = [0.0] * p, [0.0] * p, [0.0] * p
    for stage in range(p):
        dense, experts = stage_params(exp.model, par, stage)
        shard = dense / grad_dp + experts if par.zero >= 1 else dense + experts
        fp8_shard = 0.0
        if exp.training.fp8_param_gather:
            fp8_dense, _ = b.stage_fp8_weights(stage)
            fp8_shard = fp8_dense / grad_dp
        before, after = optimizer_step_ops(shard, dense + experts, b.grad_bytes, b.dtype, fp8_shard,
                                           b.plan.fp32_main_grads)
        norm_c[stage], opt_c[stage] = timer(before), timer(after)
    rank0 = lay.rank()
    mp = tuple(lay.rank(tp=r, dp=0, pp=s) for s in range(p) for r in range(t))
    sync = collective_time(fabric, "all_reduce", [mp], 4.0)
    if par.zero >= 1 and grad_dp > 1:
        sync += collective_time(fabric, "all_reduce", [lay.grad_group(rank0)], 4.0)
    # (with sequence parallelism each stage first all-reduces its norms' gradients over TP, on the compute stream)
    sp_sync = [collective_time(fabric, "all_reduce", tp_groups_of[stage if tp_leaves else 0], nbytes) if nbytes
               else 0.0 for stage, nbytes in enumerate(map(b.sequence_parallel_grad_bytes, range(p)))]
    synced = max(max(f, e) + g + n for f, e, g, n in zip(finish, dp_end, sp_sync, norm_c)) + sync
    if b.plan.step_gather and grad_dp > 1:
        # Every stage gathers right after its optimizer (all start from the synchronised norm), over the
        # rings of the stages gathering at the same time.
        def gather_stage(stage: int, background: Sequence[tuple]) -> tuple[float, float]:
            ratio = b.param_gather_bytes(stage) / b.grad_bytes
            start = synced + opt_c[stage]
            return start, start + sum(collective_time(fabric, "all_gather", dp_groups(stage), nbytes * ratio, count,
                                                      background=background)
                                      for nbytes, count in reduced[stage].items())

        spans = _contend([gather_stage(stage, ()) for stage in range(p)], rings, gather_stage)
        gather = [e - a for a, e in spans]
    step = synced + max(o + g for o, g in zip(opt_c, gather))

    # Summary, as a run reports it.
    world = par.world_size
    flops = model_flops_per_step(exp.model, par.global_batch, exp.training.seq_len, causal=exp.options.causal)
    if not exp.options.embedding_and_loss:
        flops -= 6.0 * exp.model.hidden * exp.model.vocab * par.global_batch * exp.training.seq_len
    peak = exp.cluster.gpu.peak(exp.training.base_dtype)
    # The bubble as a run reports it (docs/DESIGN.md, "Where the time went"): idle compute inside the pipeline
    # window less the activation transfers, which every stage waits for on the fill and drain chains and
    # which are exposed PP communication, not bubble.
    pp_exposed = sum(warm) + sum(comm)  # the fill chain's warm-up transfers, the drain chain's later ones
    bubble = [max(0.0, pipe - bz - pp_exposed) for bz in busy]
    exposed = {"tp": m * sum(tp_mb) / p,
               "pp": pp_exposed,  # the transfers on the fill and drain chains
               "dp": sum(max(0.0, e - f) for e, f in zip(dp_end, finish)) / p,
               "zero": sum(gather) / p,
               "sync": sync}
    out: dict[str, Any] = {
        "fidelity": SCREEN,
        "step_time_s": step,
        "mfu": flops / step / world / peak,
        "tflops_per_gpu": flops / step / world / 1e12,
        "bubble_fraction": sum(bubble) / p / pipe if pipe else 0.0,
        "exposed_comm_s": sum(exposed.values()),
        "tokens_per_s": par.global_batch * exp.training.seq_len / step,
        "exposed_comm_by_class_s": exposed,
        "time_breakdown_s": {"forward": m * sum(comp_f) / p, "backward": m * sum(comp_b) / p,
                             "bubble": sum(bubble) / p, "optimizer": sum(n + o for n, o in zip(norm_c, opt_c)) / p},
        "memory_per_gpu_bytes": memory.total,
        "pipeline_s": pipe,
        "pp_transfer_s": max(warm, default=0.0),
        "stages": [{"finish_s": f, "dp_start_s": w[0] if windows else f, "dp_end_s": e, "gather_s": g,
                    "optimizer_s": n + o} for f, w, e, g, n, o in zip(finish, windows or finish, dp_end, gather,
                                                                     norm_c, opt_c)],
    }
    out.update(plan_columns(exp.healthy_cluster or exp.cluster, exp.plan))
    out["sim_wall_s"] = time.perf_counter() - t0
    return out
