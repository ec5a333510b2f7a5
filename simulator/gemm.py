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
  1, 2, 4, 8, 16 and charge the reduction as HBM traffic.
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
  wave. 16-bit GEMMs keep the wave model, which their published timings fit.

The operand traffic to HBM (the memory roofline) and the per-kernel launch
cost are the caller's (:class:`simulator.compute.ComputeModel`).
``tests/test_compute_grounding.py`` checks this model against published cuBLAS
measurements on A100 and H100, with the sources.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

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
        return _best_time(self, int(m), int(n), int(k), int(batch))[0]

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
        tiles = batch * ceil(m / tm) * ceil(n / tn)
        if model.stream_k and tiles > sm_count:
            segments = ceil(tiles / sm_count) + 1
            t = 2.0 * tm * tn * (tiles * k / sm_count + segments * k_overhead) / rate
            if t < best_t:
                best_t, best = t, (tm, tn, 0)  # split 0: stream-K
        for split in SPLITS:
            if split > 1 and (k // split < 2 * k_overhead or tiles >= sm_count):
                break
            waves = ceil(tiles * split / sm_count)
            t = waves * 2.0 * tm * tn * (ceil(k / split) + k_overhead) / rate
            if split > 1:  # write and read back the fp32 partials, write the result
                t += batch * m * n * (2 * split * PARTIAL_BYTES + model.dtype_bytes) / model.hbm_bandwidth
            if t < best_t:
                best_t, best = t, (tm, tn, split)
    return best_t, best
