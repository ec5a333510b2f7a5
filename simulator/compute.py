"""How long a compute op takes on a GPU: a roofline with documented efficiencies.

Time of an op = ``max(flops / achieved_flops, nbytes / achieved_hbm_bandwidth)
+ op_overhead_s``, where the achieved rates come from the GPU's datasheet
(:class:`topologies.cluster.GPUSpec`) times an efficiency:

gemm
    ``peak(dtype) · matmul_efficiency · wave_efficiency(m, n)``.
    ``matmul_efficiency`` (GPU spec, ~0.8) is what large cuBLAS GEMMs reach.
    Wave quantisation: a GEMM is cut into output tiles of ``tile_m × tile_n``
    (128×256, the common Hopper/Ampere cuBLAS tile); tiles run in waves of
    ``sm_count``; the last partial wave wastes the idle SMs, so small or
    awkwardly sized GEMMs reach less. Small GEMMs also become HBM-bound
    through the roofline term.
attention
    ``peak(dtype) · attention_efficiency``; default 0.5. FlashAttention-2
    reaches ~0.5–0.7 of peak forward on A100 and ~0.35–0.45 on H100;
    FlashAttention-3 ~0.6–0.75 on H100 forward, less backward (Dao 2023;
    Shah et al. 2024). 0.5 is the middle of that range.
elementwise, optimizer
    memory-bound: ``nbytes / (hbm_bandwidth · memory_efficiency)``; default
    0.85, what STREAM-like kernels reach on HBM.
fixed
    ``duration_s`` as given.

Every efficiency is a knob on :class:`ComputeModel`; none is fitted to
end-to-end training throughput.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from topologies.cluster import GPUSpec
from workloads.ops import Compute, Kernel


@dataclass(frozen=True)
class ComputeModel:
    """Maps :class:`workloads.ops.Compute` ops to seconds on one GPU model.

    Attributes
    ----------
    gpu : GPUSpec
    dtype : str
        Datatype of the matrix units (``"bf16"``, ``"fp8"`` ...).
    matmul_efficiency : float or None
        Overrides ``gpu.matmul_efficiency`` when given.
    attention_efficiency : float
        Fraction of peak that fused attention kernels reach.
    memory_efficiency : float
        Fraction of HBM bandwidth that streaming kernels reach.
    tile_m, tile_n : int
        GEMM output tile for wave quantisation.
    op_overhead_s : float
        Fixed cost per op (launch and tail), seconds. Default 1 µs.
    """

    gpu: GPUSpec
    dtype: str = "bf16"
    matmul_efficiency: float | None = None
    attention_efficiency: float = 0.5
    memory_efficiency: float = 0.85
    tile_m: int = 128
    tile_n: int = 256
    op_overhead_s: float = 1e-6

    def __post_init__(self) -> None:
        self.gpu.peak(self.dtype)  # raises a clear ValueError for an unsupported dtype
        for name in ("attention_efficiency", "memory_efficiency"):
            v = getattr(self, name)
            if not 0 < v <= 1:
                raise ValueError(f"compute.{name}: must be in (0, 1], got {v}")
        if self.matmul_efficiency is not None and not 0 < self.matmul_efficiency <= 1:
            raise ValueError(f"compute.matmul_efficiency: must be in (0, 1], got {self.matmul_efficiency}")

    @property
    def peak_flops(self) -> float:
        return self.gpu.peak(self.dtype)

    def wave_efficiency(self, m: int, n: int) -> float:
        """Fraction of SM-waves doing useful work for an ``m × n`` GEMM output."""
        tiles = math.ceil(m / self.tile_m) * math.ceil(n / self.tile_n)
        sms = self.gpu.sm_count
        waves = math.ceil(tiles / sms)
        # Partial tiles at the edges also waste work: useful area / tiled area.
        tiled_area = math.ceil(m / self.tile_m) * self.tile_m * math.ceil(n / self.tile_n) * self.tile_n
        return (tiles / (waves * sms)) * (m * n / tiled_area)

    def achieved_flops(self, op: Compute | Kernel) -> float:
        """Sustained FLOP/s of ``op``'s category (before the memory roofline)."""
        if op.category == "gemm":
            eff = self.matmul_efficiency if self.matmul_efficiency is not None else self.gpu.matmul_efficiency
            if op.shape is not None:
                eff *= self.wave_efficiency(op.shape[0], op.shape[1])
            return self.peak_flops * eff
        if op.category == "attention":
            return self.peak_flops * self.attention_efficiency
        return self.peak_flops * 0.5  # element-wise FLOPs are never the bound in practice

    def duration(self, op: Compute | Kernel) -> float:
        """Seconds ``op`` occupies its stream (a coarsened op: the sum over its kernels)."""
        if getattr(op, "duration_s", None) is not None:
            return op.duration_s
        parts = getattr(op, "parts", None)
        if parts:
            return sum(self.duration(k) for k in parts)
        t_math = op.flops / self.achieved_flops(op) if op.flops else 0.0
        t_mem = op.nbytes / (self.gpu.hbm_bandwidth * self.memory_efficiency) if op.nbytes else 0.0
        return max(t_math, t_mem) + self.op_overhead_s
