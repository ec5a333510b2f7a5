"""How long one (batched) GEMM takes on a GPU: waves of output tiles, as cuBLAS runs it.

A GEMM ``C[m,n] = A[m,k] B[k,n]`` (``batch`` independent ones in a batched
GEMM) is cut into output tiles of ``tm × tn``; every tile is computed by one
SM, which walks the ``k`` dimension; the SMs work through the tiles in waves
of ``sm_count``. So the time is::

    t = waves · t_tile,      waves  = ceil(batch · ceil(m/tm) · ceil(n/tn) · split / sm_count)
                             t_tile = 2 · tm · tn · (k/split + k_overhead) / (peak_per_sm · efficiency · e_tile)

plus, for split-K, the reduction of the fp32 partial tiles through HBM. The
terms, each with where it comes from:

* ``efficiency`` — what the best-shaped GEMMs reach: the maximum achievable
  matmul FLOP/s (MAMF) that S. Bekman's ``mamf-finder.py`` measured by
  searching shapes (``stas00/ml-engineering``, compute/accelerator README):
  A100-SXM 271.2 of 312 TFLOP/s (0.869), H100-SXM 794.5 of 989.4 (0.803).
  It is :attr:`topologies.cluster.GPUSpec.matmul_efficiency`.
* **Wave quantisation** — the last wave leaves SMs idle (NVIDIA, *Matrix
  Multiplication Background User's Guide*, "Wave quantization"), and edge
  tiles compute padding.
* **Tile choice** — cuBLAS's heuristics pick among tiles of 256×128,
  128×256, 128×128, 128×64, 64×128 and 64×64 (the guide's list; CUTLASS's
  SM80 and SM90 generators), trading wave fill against efficiency: a
  small tile re-reads its operands more often per FLOP. A tile loads
  ``(tm + tn)·d`` bytes per ``2·tm·tn`` FLOPs of each k-step; below the GPU's
  ``gemm_critical_intensity`` (FLOP per operand byte at which an SM's share of
  L2 bandwidth keeps up with its tensor cores) it slows in proportion:
  ``e_tile = min(1, intensity / critical)``. We pick the fastest tile, as
  the heuristics aim to.
* **K overhead** — every tile fills its software pipeline before the first
  multiply-accumulate and drains its accumulators after the last: a fixed cost
  of about ``k_overhead`` = 128 elements of ``k`` per tile (two 64-deep
  k-blocks), which is why small-``k`` GEMMs (attention's ``k = d_head``) run far
  below peak.
* **Split-K** — when ``m·n`` gives too few tiles, cuBLAS splits ``k`` over
  ``split`` tiles and reduces their fp32 partials; we try ``split`` in
  1, 2, 4, 8, 16 and charge the reduction as HBM traffic. In a batched GEMM
  the test is each problem's own tiles (not the batch's): the batch can run
  every problem as it runs alone, so it never takes longer than its problems
  one by one (gating on the batch's tiles made 3 problems of 8192×64×8192 on
  an H100 take 1.12x as long as three launches). A split's slices
  are at least ``2·k_overhead`` deep (a shorter ``k`` is charged as that
  depth), so no GEMM gets faster as ``k`` grows (a gate on the slice depth
  did: 64×64×511 took 1.6x as long as ×512).
* **Stream-K** (``stream_k``, FP8 GEMMs on Hopper and later) — a persistent
  kernel deals every SM an equal share of all tiles' k-iterations, so there is
  no partial last wave: ``t = 2·tm·tn·(tiles·k / sm_count + (ceil(tiles /
  sm_count) + 1)·k_overhead) / rate`` (each SM fills its pipeline once per tile
  segment it touches; the fp32 fix-up of the split tiles stays in L2 and is not
  charged). Evidence that cuBLASLt's FP8 kernels schedule this way: the MAMF
  search found FP8's best shapes at tile counts far from a multiple of the SMs
  (1024×9216×14336 on H100: 288 tiles of 256×128 on 132 SMs, 2.2 waves of work;
  1280×4096×12032 on H200: 160 tiles, 1.2 waves), which a wave-quantised
  kernel could not reach (it would run 3 and 2 full waves, 73% and 61% of its
  rate), while 16-bit's best shape (2048×2048×13312: 128 tiles) is one full
  wave. 16-bit GEMMs keep the wave model, which their published timings fit:
  cuBLAS's FP16 sweep on an H100 from 2048³ to 3072³ (triton-lang/triton#3672)
  reads 3.8% under it on average and 31% under a stream-K schedule. So where
  a 16-bit GEMM's last wave is partial, FP8 can run more than the peaks' 2x
  its rate (2.7x at 4096×1280×8192): the two measured schedules, not one
  kernel's mechanics disagreeing (docs/DESIGN.md, "FP8 over BF16").

The operand traffic to HBM (the memory roofline) and the per-kernel launch
cost are the caller's (:class:`simulator.compute.ComputeModel`).
``tests/test_compute_grounding.py`` checks this model against published cuBLAS
measurements on A100 and H100, with the sources.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

TILES: tuple[tuple[int, int], ...] = ((256, 128), (128, 256), (128, 128), (128, 64), (64, 128), (64, 64))
"""Output tiles cuBLAS chooses among for 16-bit GEMMs on Ampere and Hopper (largest first)."""
SPLITS: tuple[int, ...] = (1, 2, 4, 8, 16)
"""Split-K factors tried when the output has too few tiles to fill the GPU."""
K_OVERHEAD = 128
"""Pipeline fill and drain of one tile, in elements of ``k``."""
PARTIAL_BYTES = 4
"""Split-K partial tiles are fp32."""


@dataclass(frozen=True)
class GemmModel:
    """The wave/tile model of one GPU for one datatype.

    Attributes
    ----------
    peak_flops : float
        Dense peak FLOP/s of the datatype.
    sm_count : int
    efficiency : float
        Fraction of peak the best-shaped GEMMs reach (MAMF).
    critical_intensity : float
        FLOP per operand byte a tile needs to run at full rate (see module docstring).
    hbm_bandwidth : float
        Bytes/s, for the split-K reduction.
    dtype_bytes : int
        Bytes per operand element.
    k_overhead : int
        Per-tile pipeline fill and drain, elements of ``k``.
    stream_k : bool
        Also consider a stream-K schedule (no wave quantisation; module docstring).
    """

    peak_flops: float
    sm_count: int
    efficiency: float
    critical_intensity: float
    hbm_bandwidth: float
    dtype_bytes: int = 2
    k_overhead: int = K_OVERHEAD
    stream_k: bool = False

    def tile_efficiency(self, tm: int, tn: int) -> float:
        """Rate of a ``tm × tn`` tile relative to a tile that is never short of operands."""
        intensity = 2.0 * tm * tn / ((tm + tn) * self.dtype_bytes)
        return min(1.0, intensity / self.critical_intensity)

    def time(self, m: int, n: int, k: int, batch: int = 1) -> float:
        """Seconds of the tensor-core work of ``batch`` GEMMs of ``m × n × k`` (best tile and split)."""
        return _time(self, int(m), int(n), int(k), int(batch))

    def tile(self, m: int, n: int, k: int, batch: int = 1) -> tuple[int, int, int]:
        """``(tm, tn, split)`` the model picks (``split`` 0: a stream-K schedule)."""
        return _best_time(self, int(m), int(n), int(k), int(batch))[1]

    def achieved_flops(self, m: int, n: int, k: int, batch: int = 1) -> float:
        """FLOP/s of the GEMM: ``2·batch·m·n·k / time``."""
        return 2.0 * batch * m * n * k / self.time(m, n, k, batch)


_RATES: dict[int, tuple[GemmModel, tuple[tuple[int, int, float], ...]]] = {}  # id(model) -> (model, rates)


def _tile_rates(model: GemmModel) -> tuple[tuple[int, int, float], ...]:
    """``(tm, tn, FLOP/s of one SM on that tile)`` of every tile of :data:`TILES`, in order: what
    :func:`_best_time` would work out again for every shape (cached per model object: a model's hash
    hashes all its fields, and models are few)."""
    hit = _RATES.get(id(model))
    if hit is not None and hit[0] is model:
        return hit[1]
    per_sm = model.peak_flops * model.efficiency / model.sm_count
    rates = tuple((tm, tn, per_sm * model.tile_efficiency(tm, tn)) for tm, tn in TILES)
    if len(_RATES) >= 64:
        _RATES.clear()
    _RATES[id(model)] = (model, rates)
    return rates


@lru_cache(maxsize=65536)
def _best_time(model: GemmModel, m: int, n: int, k: int, batch: int) -> tuple[float, tuple[int, int, int]]:
    best_t, best = math.inf, (0, 0, 0)
    sm_count, k_overhead, ceil = model.sm_count, model.k_overhead, math.ceil
    for tm, tn, rate in _tile_rates(model):
        per_problem = ceil(m / tm) * ceil(n / tn)
        tiles = batch * per_problem
        if model.stream_k and tiles > sm_count:
            segments = ceil(tiles / sm_count) + 1
            t = 2.0 * tm * tn * (tiles * k / sm_count + segments * k_overhead) / rate
            if t < best_t:
                best_t, best = t, (tm, tn, 0)  # split 0: stream-K
        for split in SPLITS:
            if split > 1 and per_problem >= sm_count:  # (each problem's own tiles: module docstring, "Split-K")
                break
            waves = ceil(tiles * split / sm_count)
            # a split's slices are at least two pipeline fills deep (padded: a shorter k runs the same kernel as
            # the shortest k the split is worth at, so the time never falls as k grows)
            depth = ceil(k / split) if split == 1 else max(ceil(k / split), 2 * k_overhead)
            t = waves * 2.0 * tm * tn * (depth + k_overhead) / rate
            if split > 1:  # write and read back the fp32 partials, write the result
                t += batch * m * n * (2 * split * PARTIAL_BYTES + model.dtype_bytes) / model.hbm_bandwidth
            if t < best_t:
                best_t, best = t, (tm, tn, split)
    return best_t, best


BLOCK = 512
"""Shapes timed together, along the one dimension that varies (:func:`_time`)."""
VECTOR_AFTER = 32
"""Distinct shapes of one block timed one by one before the whole block is timed at once (a block costs about
as much as 33 shapes timed one by one: measured in review)."""
_MODELS = 8  # models whose times are kept (then all forgotten at once)
_ENTRIES = 1 << 20  # shapes looked up plus shapes timed in blocks, per model (then all forgotten at once)
_EXACT = float(2 ** 53)  # integers below this are exact doubles: Python's and numpy's arithmetic then agree


class _Times:
    """One model's GEMM times: every shape looked up so far, the blocks timed at once, and the distinct shapes
    each block has missed."""

    __slots__ = ("model", "times", "blocks", "misses")

    def __init__(self, model: GemmModel) -> None:
        self.model = model
        self.times: dict[tuple[int, int, int, int], float] = {}
        self.blocks: dict[tuple[int, int, int, int, int], list[float]] = {}
        self.misses: dict[tuple[int, int, int, int, int], int] = {}


_TIMES: dict[int, _Times] = {}  # id(model) -> its times (the model kept in them, so that its id stays its own)


def _store(model: GemmModel) -> _Times:
    """``model``'s :class:`_Times`, made on first use (at most :data:`_MODELS` kept)."""
    st = _TIMES.get(id(model))
    if st is None or st.model is not model:
        if len(_TIMES) >= _MODELS:
            _TIMES.clear()
        st = _TIMES[id(model)] = _Times(model)
    return st


MANY = 16384
"""Shapes timed together by :func:`times` (bounds its arrays: ~30 candidate rows of this many float64s)."""


def times(model: GemmModel, m: np.ndarray, n: np.ndarray, k: np.ndarray, batch: np.ndarray) -> np.ndarray:
    """:meth:`GemmModel.time` of many shapes at once: ``m``, ``n``, ``k``, ``batch`` int64 arrays of one length,
    every element in ``1 .. 2**53``. A skewed MoE step's duration pass asks for ~10^5 distinct expert GEMMs,
    which one by one (:func:`_time`) cost ~15 µs each. The shapes that :func:`_block_times` would take one by
    one (their integers stay exact doubles) are timed together by its arithmetic, one batch count at a time in
    chunks of :data:`MANY`: that arithmetic is element by element, so an element's time does not depend on the
    others beside it. The rest (the LM head's wide GEMMs, say) are timed by :func:`_time`. Either way each time
    is :func:`_best_time`'s."""
    out = np.empty(len(m))
    fast = np.zeros(len(m), dtype=bool)
    if _vector_model(model):
        fast = _bound(model, batch, m, n, k) < _EXACT
    rates = _tile_rates(model)
    for b in np.unique(batch[fast]).tolist():
        where = np.flatnonzero(fast & (batch == b))
        for start in range(0, len(where), MANY):
            at = where[start:start + MANY]
            with np.errstate(over="ignore", invalid="ignore"):  # as in _block_times
                out[at] = _candidate_times(model, rates, m[at], n[at], k[at], b)
    slow = np.flatnonzero(~fast)
    if len(slow):
        out[slow] = [_time(model, *shape) for shape in zip(m[slow].tolist(), n[slow].tolist(), k[slow].tolist(),
                                                             batch[slow].tolist())]
    return out


def _time(model: GemmModel, m: int, n: int, k: int, batch: int) -> float:
    """:func:`_best_time`'s time of one shape, looked up. Skewed MoE routing gives every EP rank its own token
    count, so one expert GEMM comes in thousands of shapes differing in one dimension (``m``, or ``k`` for the
    weight gradient). A block is :data:`BLOCK` consecutive values of one dimension, the other two and the
    batch fixed; once a block has missed :data:`VECTOR_AFTER` times, all its shapes are timed at once by
    :func:`_block_times`, which does :func:`_best_time`'s arithmetic element by element (the same results)."""
    st = _store(model)
    key = (m, n, k, batch)
    times = st.times
    t = times.get(key)
    if t is not None:
        return t
    if len(times) + BLOCK * len(st.blocks) >= _ENTRIES:
        times.clear()
        st.blocks.clear()
        st.misses.clear()
    if m < 1 or n < 1 or k < 1 or batch < 1:
        t = times[key] = _best_time(model, m, n, k, batch)[0]
        return t
    blocks = st.blocks
    wheres = [(0, n, k, batch, m // BLOCK), (1, m, k, batch, n // BLOCK), (2, m, n, batch, k // BLOCK)]
    for where in wheres:
        block = blocks.get(where)
        if block is not None:
            axis = where[0]
            t = times[key] = block[key[axis] - where[4] * BLOCK]
            return t
    misses = st.misses
    for axis, where in enumerate(wheres):
        seen = misses[where] = misses.get(where, 0) + 1
        if seen <= VECTOR_AFTER:
            continue
        index = where[4]
        if (index + 1) * BLOCK >= _EXACT:  # beyond int64's exact doubles: shape by shape
            misses[where] = -(1 << 62)
            continue
        values = np.arange(index * BLOCK, (index + 1) * BLOCK, dtype=np.int64)
        values[0] = max(1, index * BLOCK)  # (block 0: 0 is never asked for, 1 stands in its place)
        dims: list = [m, n, k]
        dims[axis] = values
        found = _block_times(model, dims[0], dims[1], dims[2], batch)
        if found is not None:
            block = blocks[where] = found.tolist()
            t = times[key] = block[key[axis] - index * BLOCK]
            return t
        misses[where] = -(1 << 62)  # not to be timed at once: not asked again
    t = times[key] = _best_time(model, m, n, k, batch)[0]
    return t


def _block_times(model: GemmModel, m, n, k, batch: int) -> np.ndarray | None:
    """:func:`_best_time`'s times of many shapes at once: ``m``, ``n``, ``k`` integers or int64 vectors (one
    of them), every dimension at least 1. Every candidate (tile, then stream-K and each split, in
    :func:`_best_time`'s order) is one row, each element going through the same operations in the same order as
    there (numpy's float64 element-wise operations round as Python's floats do, and integers below 2**53
    convert exactly); the minimum over the rows is the one :func:`_best_time` keeps (a minimum is exact). None
    where an intermediate integer could reach 2**53 (Python's big integers would then round differently)."""
    hi = [int(d.max()) if isinstance(d, np.ndarray) else d for d in (m, n, k)]
    lo = [int(d.min()) if isinstance(d, np.ndarray) else d for d in (m, n, k)]
    if min(lo) < 1 or batch < 1 or not _vector_model(model) or _bound(model, batch, *hi) >= _EXACT:
        return None
    with np.errstate(over="ignore", invalid="ignore"):  # (Python's floats overflow to inf without a word)
        return _candidate_times(model, _tile_rates(model), m, n, k, batch)


def _vector_model(model: GemmModel) -> bool:
    """Whether ``model``'s constants let :func:`_candidate_times` time shapes (no division by a zero count or
    rate, which the scalar model would raise on)."""
    return model.sm_count >= 1 and all(rate > 0 for _tm, _tn, rate in _tile_rates(model)) \
        and model.hbm_bandwidth > 0


def _bound(model: GemmModel, batch, m, n, k):
    """A bound on the integers :func:`_candidate_times` makes of a shape (floats; integers or arrays, element by
    element): below :data:`_EXACT`, every one of them is an exact double."""
    floor = max(2 * SPLITS[-1] * PARTIAL_BYTES + model.dtype_bytes, model.k_overhead + 1)
    if isinstance(k, np.ndarray):
        return batch.astype(np.float64) * m * n * np.maximum(k, floor) * SPLITS[-1]
    return float(batch) * m * n * max(k, floor) * SPLITS[-1]


def _candidate_times(model: GemmModel, rates: list, m, n, k, batch: int) -> np.ndarray:
    """:func:`_block_times`' arithmetic, its inputs checked."""
    sm_count, k_overhead = model.sm_count, model.k_overhead
    ceil, i64 = np.ceil, np.int64
    # one row per tile: (tiles, 1) columns broadcast against the shapes
    tm = np.array([[r[0]] for r in rates], dtype=i64)
    tn = np.array([[r[1]] for r in rates], dtype=i64)
    rate = np.array([[r[2]] for r in rates])
    per_problem = ceil(m / tm).astype(i64) * ceil(n / tn).astype(i64)
    tiles = batch * per_problem
    lanes = np.broadcast_shapes(tiles.shape, np.shape(k))
    tiles = np.broadcast_to(tiles, lanes)
    rows = []  # per tile, its candidates in _best_time's order
    if model.stream_k:
        segments = ceil(tiles / sm_count).astype(i64) + 1
        t = 2.0 * tm * tn * (tiles * k / sm_count + segments * k_overhead) / rate
        rows.append(np.where(tiles > sm_count, t, math.inf))
    few = np.broadcast_to(per_problem < sm_count, lanes)  # (as _best_time: each problem's own tiles)
    for split in SPLITS:
        if split > 1:
            alive = few
            if not alive.any():
                break
        waves = ceil(tiles * split / sm_count).astype(i64)
        depth = ceil(k / split).astype(i64)
        if split > 1:  # (padded to two pipeline fills, as _best_time)
            depth = np.maximum(depth, 2 * k_overhead)
        t = waves * 2.0 * tm * tn * (depth + k_overhead) / rate
        if split > 1:
            t = t + batch * m * n * (2 * split * PARTIAL_BYTES + model.dtype_bytes) / model.hbm_bandwidth
            t = np.where(alive, t, math.inf)
        rows.append(t)
    return np.min(np.concatenate(rows), axis=0)
