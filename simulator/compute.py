"""How long a compute op takes on a GPU: each kernel from its own, published, microbenchmark model.

Time of a kernel = ``max(math time, nbytes / achieved HBM bandwidth) +
op_overhead_s``; a coarsened op is the sum over its kernels. The math time
depends on the kind of kernel:

gemm
    :mod:`simulator.gemm`: waves of output tiles, the best of cuBLAS's tile
    shapes and split-K, a per-tile pipeline fill, under the best-shape
    ceiling ``matmul_efficiency`` (the GPU's measured maximum achievable
    matmul FLOP/s, :mod:`topologies.gpus`). A batched GEMM (the ``b·a/t``
    heads of unfused attention) is timed as ``batch`` GEMMs in one launch,
    never with the batch folded into a GEMM dimension. At another dtype's
    peak (fp32) the critical intensity scales with the rate, as
    ``gemm_fp8``'s below.
    Its ceiling is a short burst's; GEMMs run back to back for seconds, as in training, at the
    GPU's sustained clock: every tensor-core GEMM kind's tile time is divided by
    ``sustained_clock_fraction`` (``GPUSpec.sustained_clock_fraction``, :mod:`topologies.gpus`: 0.96 on
    Hopper, long cuBLAS runs over this model's rate at their shape; 1 on A100, whose ten-minute rate the
    model meets; 0.90 on GB200, a 60 s cuBLASLt run over this model's rate; 0.88 on B200, a throttled
    attention kernel's loss carried over by GB200's; 1 on GB300, unmeasured; fp32 SIMT GEMMs, measured flat
    under load, not at all).
gemm_fp8
    the same wave/tile model at the GPU's dense FP8 peak under its measured
    FP8 ceiling (``GPUSpec.matmul_efficiency_fp8``, or
    ``fp8_matmul_efficiency``), 1-byte operands. The FP8 rate is the 16-bit one
    times ``r = peak(fp8) / peak(bf16)`` (2 on Hopper and Blackwell) with the
    same SMs and L2, so a tile needs ``r`` times the FLOPs per operand byte to
    stay fed (critical intensity ``× r``) and its fixed pipeline fill, a time,
    is ``r`` times as many elements of ``k`` (``gemm_k_overhead × r``). Its
    kernels may schedule stream-K (:mod:`simulator.gemm`), which the
    published FP8 best shapes show cuBLASLt does.
gemm_fp8_wgrad
    a weight-gradient GEMM of blockwise FP8 scaling (``training.fp8_recipe: blockwise``, DeepSeek-V3's
    recipe): ``gemm_fp8``'s model under its own measured ceiling (``GPUSpec.matmul_efficiency_fp8_wgrad``:
    DeepSeek's DeepGEMM kernels, 1092 of 1979 TFLOP/s at best on an H800, against 1,550 for its forward
    GEMMs; or ``fp8_wgrad_matmul_efficiency``), the FP8 ceiling where the GPU has no measurement.
attention, attention_bwd
    :mod:`simulator.attention`: the published forward and backward rates of
    the fused kernel (FlashAttention-2/3, cuDNN) for the GPU generation, head
    dimension and sequence length (of the keys, ``shape[1]``), causal mask;
    ``attention_efficiency`` overrides them with one flat fraction of peak for
    both passes.
attention_nomask, attention_nomask_bwd
    the same without a mask (the papers' non-causal rates): ring attention's
    off-diagonal steps.
elementwise, fp8_cast, optimizer
    memory-bound: ``nbytes / (hbm_bandwidth · memory_efficiency)``; default
    0.85, what STREAM-like kernels reach on HBM2e/HBM3.
activation
    an MLP's activation (GeLU, SwiGLU), memory-bound at ``activation_memory_efficiency``
    of HBM bandwidth. Default 0.56: Megatron-Core's fused SwiGLU (``bias_swiglu_impl``)
    reads 2 and writes 1 element of 2 bytes per output element at 1.77-1.88 TB/s of an
    H100 SXM's 3.35 for 4,096-32,768 columns of 8,192 tokens (0.114-0.859 ms; Liger-Kernel
    ``benchmark/data/all_benchmark_data.csv``, rows ``megatron_swiglu``, provider
    ``megatron``, commit 2120862), not a STREAM copy's 0.85. Measured on SwiGLU and
    Hopper; GeLU and other GPUs take the same fraction.
scores
    the element-wise kernels of unfused attention over the ``s × s`` scores
    (scale-mask-softmax, dropout), memory-bound at ``score_memory_efficiency``
    of HBM bandwidth, which also bounds the batched ``Q Kᵀ`` / ``P V`` GEMMs that
    write and read the scores. Default 0.65: Megatron's standard attention
    forward moves 4.36 GB of scores in 4.28 ms at 2K tokens on an A100-40GB
    (1.02 of 1.555 TB/s; Dao et al., *FlashAttention*, Table 18; the backward
    at 2K and other lengths are the check in ``tests/test_compute_grounding.py``).
fixed
    ``duration_s`` as given.

A GEMM kernel with ``sm_reserved`` SMs held by a communication kernel beside
it (Transformer Engine's userbuffers reserve ``num_sm`` SMs for their
pipelined and bulk overlaps and launch the GEMM on the rest) runs the same
wave/tile model on ``sm_count - sm_reserved`` SMs, each at its usual rate.

Every constant is a knob on :class:`ComputeModel` with its source in the
module that uses it; none is fitted to end-to-end training throughput
(``tests/test_compute_grounding.py`` checks each kernel model against
published microbenchmarks).
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from topologies.cluster import GPUSpec
from topologies.gpus import get_gpu
from workloads.ops import GEMM_CATEGORIES, Compute, Kernel, Op
from workloads.parallel import DTYPE_BYTES

from .attention import ATTENTION_KERNELS, DEFAULT_KERNEL, attention_fraction, kernels_for, measured_at_burst
from .gemm import K_OVERHEAD, GemmModel, times

_DTYPE_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
_ATTENTION = {"attention": (False, True), "attention_bwd": (True, True),
              "attention_nomask": (False, False), "attention_nomask_bwd": (True, False)}
"""Fused attention categories -> (backward, causal mask) of the published rates they run at."""


MIN_EFFICIENCY = 0.01
"""Smallest efficiency knob accepted (a fraction of a peak: ``compute.*_efficiency``,
``network.bandwidth_efficiency``). Below 1% a knob describes no working GPU or link; a typo such as ``1e-9``
would otherwise give a step of days without a word."""


def is_fraction(value: object) -> bool:
    """``value`` is a knob's fraction: a real number (numpy's too, not a bool) in ``[MIN_EFFICIENCY, 1]``."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and MIN_EFFICIENCY <= value <= 1


_MAX_OP_OVERHEAD_S = 1e-3
"""Largest ``op_overhead_s``: a millisecond per op is 1,000 kernel launches; above it is a slip of unit
(``1e9`` printed a step of 754,000,000,000 s)."""


@dataclass(frozen=True)
class ComputeModel:
    """Maps :class:`workloads.ops.Compute` ops to seconds on one GPU model.

    Attributes
    ----------
    gpu : GPUSpec
    dtype : str
        Training datatype (``"bf16"``, ``"fp16"``, ``"fp32"``, ``"fp8"``):
        the peak of ``gemm`` and attention kernels. ``"fp8"`` is Transformer
        Engine's mixed FP8: ``gemm_fp8`` kernels at the FP8 peak, every other
        kernel at bf16 (:attr:`base_dtype`). ``gemm_fp8`` kernels always run at
        the FP8 peak, whatever ``dtype``.
    matmul_efficiency : float or None
        Overrides ``gpu.matmul_efficiency`` (the best-shape GEMM ceiling).
    fp8_wgrad_matmul_efficiency : float or None
        Overrides ``gpu.matmul_efficiency_fp8_wgrad`` (``gemm_fp8_wgrad`` kernels: blockwise FP8's weight
        gradients; module docstring).
    sustained_clock_fraction : float or None
        Overrides ``gpu.sustained_clock_fraction``: the rate GEMMs keep running back to back for seconds over
        the rate this model gives them from short-burst ceilings (``*matmul_efficiency``), in [0.01, 1]; every
        tensor-core GEMM's time is divided by it (not fp32 SIMT GEMMs, not the HBM roofline, not Ampere's or
        Hopper's attention, whose published rates were taken at the sustained clock: :mod:`topologies.gpus`;
        Blackwell's cuDNN attention rates are burst rates and are scaled:
        :func:`simulator.attention.measured_at_burst`). Set 1 where a given
        ceiling is itself a sustained measurement.
    fp8_matmul_efficiency : float or None
        Overrides ``gpu.matmul_efficiency_fp8`` (the best-shape FP8 GEMM
        ceiling, a fraction of the FP8 peak); needed for FP8 on a GPU without
        a published FP8 measurement.
    attention_kernel : str or None
        Fused attention kernel whose published rates to use (``fa2``, ``fa3``,
        ``cudnn``; :func:`simulator.attention.kernels_for`); default the GPU
        generation's (:data:`simulator.attention.DEFAULT_KERNEL`).
    attention_efficiency : float or None
        One flat fraction of peak for fused attention forward and backward,
        instead of the published rates.
    memory_efficiency : float
        Fraction of HBM bandwidth that streaming kernels reach.
    score_memory_efficiency : float
        Fraction of HBM bandwidth that kernels streaming unfused attention's
        ``s × s`` scores reach (softmax, dropout, the batched score GEMMs).
    activation_memory_efficiency : float
        Fraction of HBM bandwidth that an MLP's fused activation reaches.
    gemm_k_overhead : int
        Per-tile pipeline fill and drain of a GEMM, in elements of ``k``.
    op_overhead_s : float
        Fixed cost per kernel (the gap between dependent kernels on a stream),
        seconds. Default 1 µs.
    comm_sms : int
        SMs a collective's kernel (all-reduce, reduce-scatter, all-gather,
        all-to-all: NCCL's, one CTA per channel; DeepEP's outside DualPipe's
        pairs too) holds while its data moves. While a rank has such kernels
        running, its compute ops on other streams run on the SMs left
        (:mod:`simulator.engine`, "Compute beside communication"), except ops
        with a kernel already timed on reserved SMs, and collectives whose SMs
        the generator priced itself (``holds_sms`` False: TE's userbuffers).
        A collective that NCCL cuts to fewer channels for its size holds
        one SM per channel kept, when that is fewer (``network.channels:
        nccl``). Default 24, measured on an H100: an ``ncclAllGather`` beside a GEMM
        launched 24 blocks (NVIDIA developer forum, "Compute-communication
        overlap causes severe GEMM performance degradation because of tail
        effect", 2025); NCCL alone kept ~15% of an H100's SMs active
        (NVIDIA/nccl issue 1432: ~20 of 132). 0 turns the effect off.
    p2p_sms : int
        SMs a point-to-point NCCL kernel (send / receive) holds. Default 0:
        NCCL runs one per channel, ``NCCL_NCHANNELS_PER_NET_PEER`` (2 by
        default, src/graph/paths.cc), and 2 moves GPT-3 175B on 1,024 GPUs by
        +0.003% and a DeepSeek-style EP64 step by +0.003%, while the slightly
        shifted compute ends cost up to 38% more simulated events (Mixtral EP8,
        1,024 GPUs, 58,945 → 81,085; docs/DESIGN.md). Set 2 for NCCL's count.
    """

    gpu: GPUSpec
    dtype: str = "bf16"
    matmul_efficiency: float | None = None
    fp8_matmul_efficiency: float | None = None
    fp8_wgrad_matmul_efficiency: float | None = None
    sustained_clock_fraction: float | None = None
    attention_kernel: str | None = None
    attention_efficiency: float | None = None
    memory_efficiency: float = 0.85
    score_memory_efficiency: float = 0.65
    activation_memory_efficiency: float = 0.56
    gemm_k_overhead: int = K_OVERHEAD
    op_overhead_s: float = 1e-6
    comm_sms: int = 24
    p2p_sms: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.gpu, str):  # (a GPU by name, as the topology builders take it)
            object.__setattr__(self, "gpu", get_gpu(self.gpu))
        if not isinstance(self.gpu, GPUSpec):
            raise TypeError(f"gpu: must be a GPUSpec or a GPU name (topologies.get_gpu), got "
                            f"{type(self.gpu).__name__} {self.gpu!r:.60}")
        if self.dtype not in self.gpu.peak_flops:
            raise ValueError(f"training.dtype: {self.dtype!r} is not supported by {self.gpu.name}; valid: "
                             f"{', '.join(self._trainable_dtypes())}")
        for name in ("matmul_efficiency", "fp8_matmul_efficiency", "fp8_wgrad_matmul_efficiency",
                     "sustained_clock_fraction", "attention_efficiency", "memory_efficiency",
                     "score_memory_efficiency", "activation_memory_efficiency"):
            v = getattr(self, name)
            if v is not None and not is_fraction(v):
                what = ("the sustained over the burst GEMM rate" if name == "sustained_clock_fraction"
                        else "a fraction of the peak")
                raise ValueError(f"compute.{name}: must be {what} in [{MIN_EFFICIENCY:g}, 1], got {v!r}")
        v = self.op_overhead_s
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not 0 <= v <= _MAX_OP_OVERHEAD_S:
            raise ValueError(f"compute.op_overhead_s: must be a finite number of seconds in "
                             f"[0, {_MAX_OP_OVERHEAD_S:g}] (a kernel launch is ~1e-6), got {self.op_overhead_s!r}")
        for name in ("comm_sms", "p2p_sms"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or not 0 <= v < self.gpu.sm_count:
                raise ValueError(f"compute.{name}: must be an integer number of SMs in 0..{self.gpu.sm_count - 1} "
                                 f"({self.gpu.name} has {self.gpu.sm_count}), got {v!r}")
        v = self.gemm_k_overhead
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or not 0 <= v <= 65536:
            raise ValueError(f"compute.gemm_k_overhead: must be an integer in 0..65536, got {self.gemm_k_overhead!r}")
        if self.attention_kernel is not None and self.attention_kernel not in ATTENTION_KERNELS:
            # (a name no GPU has rates for: a typo, refused even where attention_efficiency sets the rate)
            raise ValueError(f"compute.attention_kernel: {self.attention_kernel!r} unknown; valid: "
                             f"{', '.join(ATTENTION_KERNELS)}")
        if self.attention_efficiency is None:
            kernel = self.fused_attention_kernel
            if kernel not in kernels_for(self.gpu.arch):
                valid = ", ".join(kernels_for(self.gpu.arch)) or "none"
                raise ValueError(f"compute.attention_kernel: {kernel!r} has no published rates on "
                                 f"{self.gpu.name} ({self.gpu.arch}); valid: {valid} "
                                 f"(or set compute.attention_efficiency)")

        v = self.gpu.sustained_clock_fraction  # (a GPUSpec built in Python, checked where it is used)
        if self.sustained_clock_fraction is None and not is_fraction(v):
            raise ValueError(f"GPUSpec.sustained_clock_fraction: {self.gpu.name}'s must be the sustained over the "
                             f"burst GEMM rate in [{MIN_EFFICIENCY:g}, 1], got {v!r}")
        if self.dtype == "fp8":
            _ = self.fp8_gemm  # raises a clear ValueError without a measured (or given) FP8 ceiling

    @property
    def base_dtype(self) -> str:
        """The dtype of every kernel but ``gemm_fp8``: ``bf16`` under FP8 training, else :attr:`dtype`."""
        return "bf16" if self.dtype == "fp8" else self.dtype

    @property
    def peak_flops(self) -> float:
        """Dense peak FLOP/s of :attr:`base_dtype` (``gemm``, attention)."""
        return self.gpu.peak(self.base_dtype)

    @property
    def fused_attention_kernel(self) -> str:
        """The fused attention kernel in use (``attention_kernel`` or the GPU generation's default)."""
        return self.attention_kernel or DEFAULT_KERNEL.get(self.gpu.arch, "cudnn")

    @property
    def clock_fraction(self) -> float:
        """The sustained over burst GEMM rate in use (``sustained_clock_fraction``, else the GPU's)."""
        given = self.sustained_clock_fraction
        return given if given is not None else self.gpu.sustained_clock_fraction

    @cached_property
    def gemm(self) -> GemmModel:
        """The wave/tile GEMM model of this GPU and datatype, at the sustained clock (:attr:`clock_fraction`
        scales the burst ceiling of tensor-core GEMMs: a tile's every cycle is an SM cycle)."""
        eff = self.matmul_efficiency if self.matmul_efficiency is not None else self.gpu.matmul_efficiency
        if self.base_dtype != "fp32":  # (fp32 runs on the SIMT cores, measured flat under load: topologies.gpus)
            eff *= self.clock_fraction
        # The pipeline fill keeps its 16-bit depth: fp32's SIMT kernels are not the tensor-core pipeline it was
        # measured on, and 9 elements let tiny fp32 GEMMs split k 16 ways and beat the same bf16 GEMM.
        return GemmModel(self.peak_flops, self.gpu.sm_count, eff, self._critical_intensity(self.peak_flops),
                         self.gpu.hbm_bandwidth, _DTYPE_BYTES.get(self.base_dtype, 2), self.gemm_k_overhead)

    def _rate_ratio(self, peak: float) -> float:
        """``peak`` FLOP/s over the GPU's bf16 peak (1 for a GPU without one): how many times the 16-bit rate's
        FLOPs per operand byte a tile at that rate needs, and how many times its pipeline fill in elements."""
        bf16 = self.gpu.peak_flops.get("bf16")
        return peak / bf16 if bf16 else 1.0

    def _critical_intensity(self, peak: float) -> float:
        """FLOPs per operand byte a tile needs at a dense rate of ``peak`` FLOP/s: the 16-bit rate's
        (``GPUSpec.gemm_critical_intensity``) times :meth:`_rate_ratio`, since r times the rate needs r times
        the FLOPs per byte (FP8: 2x; fp32 ~1/15 on Hopper, whose 4-byte operands at the 16-bit intensity
        starved every tile: 38% of peak at 8192^3)."""
        return self.gpu.gemm_critical_intensity * self._rate_ratio(peak)

    def _trainable_dtypes(self) -> list[str]:
        """The ``training.dtype`` values this GPU has a peak for (``tf32`` is a GEMM mode of fp32 training, not
        a dtype the step can be given)."""
        return [d for d in DTYPE_BYTES if d in self.gpu.peak_flops]

    @cached_property
    def fp8_gemm(self) -> GemmModel:
        """The wave/tile GEMM model of FP8 operands at the sustained clock (module docstring, ``gemm_fp8``)."""
        if "fp8" not in self.gpu.peak_flops:
            raise ValueError(f"training.dtype: fp8 needs FP8 tensor cores; {self.gpu.name} has none "
                             f"(valid: {', '.join(self._trainable_dtypes())})")
        eff = self.fp8_matmul_efficiency if self.fp8_matmul_efficiency is not None \
            else self.gpu.matmul_efficiency_fp8
        if eff is None:
            raise ValueError(f"compute.fp8_matmul_efficiency: {self.gpu.name} has no measured FP8 GEMM ceiling; "
                             f"set it (a fraction of the FP8 peak in [{MIN_EFFICIENCY:g}, 1])")
        peak = self.gpu.peak("fp8")
        eff *= self.clock_fraction
        return GemmModel(peak, self.gpu.sm_count, eff, self._critical_intensity(peak), self.gpu.hbm_bandwidth, 1,
                         round(self.gemm_k_overhead * self._rate_ratio(peak)), stream_k=True)

    @cached_property
    def fp8_wgrad_gemm(self) -> GemmModel:
        """The FP8 GEMM model (:attr:`fp8_gemm`) under the weight-gradient ceiling of blockwise scaling
        (``fp8_wgrad_matmul_efficiency``, else ``GPUSpec.matmul_efficiency_fp8_wgrad`` scaled as a given
        ``fp8_matmul_efficiency`` scales the FP8 ceiling, else the FP8 ceiling itself where no measurement
        exists): module docstring, ``gemm_fp8_wgrad``."""
        gemm = self.fp8_gemm
        measured = self.gpu.matmul_efficiency_fp8_wgrad
        if self.fp8_wgrad_matmul_efficiency is not None:
            eff = self.fp8_wgrad_matmul_efficiency * self.clock_fraction
        elif measured is not None and self.gpu.matmul_efficiency_fp8:  # (a user's FP8 ceiling scales it alike)
            eff = measured * gemm.efficiency / self.gpu.matmul_efficiency_fp8
        else:
            eff = gemm.efficiency
        return replace(gemm, efficiency=min(eff, 1.0))

    def gemm_model(self, category: str) -> GemmModel:
        """The GEMM model that times kernels of ``category`` (one of :data:`~workloads.ops.GEMM_CATEGORIES`)."""
        return self.gemm if category == "gemm" else self.fp8_gemm if category == "gemm_fp8" else self.fp8_wgrad_gemm

    def reserved_gemm(self, gemm: GemmModel, sm_reserved: int) -> GemmModel:
        """``gemm`` on the SMs that ``sm_reserved`` communication SMs leave: fewer SMs, the same rate each."""
        sms = gemm.sm_count - sm_reserved
        if sms < 1:
            raise ValueError(f"options.tp_comm_overlap_sms: {sm_reserved} SMs for communication leave none of the "
                             f"{gemm.sm_count} SMs of {self.gpu.name} for the GEMM")
        return _with_sms(gemm, sms)

    def achieved_flops(self, op: Compute | Kernel) -> float:
        """Sustained FLOP/s of ``op`` (before the memory roofline)."""
        if op.category in GEMM_CATEGORIES:
            gemm = self.gemm_model(op.category)
            reserved = getattr(op, "sm_reserved", 0)
            if reserved:
                gemm = self.reserved_gemm(gemm, reserved)
            if op.shape is not None:
                m, n, k = op.shape
                return gemm.achieved_flops(m, n, k, getattr(op, "batch", 1))
            return gemm.peak_flops * gemm.efficiency
        if op.category in _ATTENTION:
            if self.attention_efficiency is not None:
                return self.peak_flops * self.attention_efficiency
            seq, head_dim = (op.shape[1], op.shape[2]) if op.shape is not None else (4096, 128)
            backward, causal = _ATTENTION[op.category]
            arch, kernel = self.gpu.arch, self.fused_attention_kernel
            clock = self.clock_fraction if measured_at_burst(arch, kernel) else 1.0
            return self.peak_flops * clock * attention_fraction(arch, kernel, backward, head_dim, seq, causal)
        return self.peak_flops * 0.5  # element-wise FLOPs are never the bound in practice

    def duration(self, op: Compute | Kernel) -> float:
        """Seconds ``op`` occupies its stream (a coarsened op: the sum over its kernels)."""
        if getattr(op, "duration_s", None) is not None:
            return op.duration_s
        parts = getattr(op, "parts", None)
        if parts:
            kernel = self._kernel_duration
            return sum(kernel(k) if type(k) is Kernel else self.duration(k) for k in parts)
        t_math = op.flops / self.achieved_flops(op) if op.flops else 0.0
        return self._roofline(op.category, getattr(op, "batch", 1), op.nbytes, t_math)

    def _hbm_efficiency(self, category: str, batch: int) -> float:
        """The fraction of HBM bandwidth a kernel of ``category`` (``batch`` GEMMs) streams at: unfused attention's
        scores and the batched GEMMs over them at ``score_memory_efficiency``, an MLP's activation at
        ``activation_memory_efficiency``, every other kernel at ``memory_efficiency``."""
        if category == "scores" or (category == "gemm" and batch > 1):
            return self.score_memory_efficiency
        return self.activation_memory_efficiency if category == "activation" else self.memory_efficiency

    def _roofline(self, category: str, batch: int, nbytes: float, t_math: float) -> float:
        """Seconds of a kernel whose math takes ``t_math`` s and which moves ``nbytes`` of HBM traffic: the
        larger of the two, plus the per-op overhead (score and batched-GEMM traffic, and activations, at their own
        efficiency)."""
        t_mem = nbytes / (self.gpu.hbm_bandwidth * self._hbm_efficiency(category, batch)) if nbytes else 0.0
        return max(t_math, t_mem) + self.op_overhead_s

    def _kernel_duration(self, k: Kernel) -> float:
        """:meth:`duration` of one :class:`~workloads.ops.Kernel` (no ``duration_s``, no ``parts``), the same
        operations in the same order: the kernels of a coarsened op, thousands of distinct ones under skewed
        MoE routing. Its GEMM branch is :meth:`achieved_flops`' without the generic lookups (their cost was the
        point): a change to the GEMM path there must be made here too."""
        category = k.category
        flops = k.flops
        if flops:
            if category == "gemm" and k.shape is not None and not k.sm_reserved:
                m, n, kk = k.shape
                batch = k.batch
                gemm = self.gemm
                t_math = flops / (2.0 * batch * m * n * kk / gemm.time(m, n, kk, batch))
            else:
                t_math = flops / self.achieved_flops(k)
        else:
            t_math = 0.0
        return self._roofline(category, k.batch, k.nbytes, t_math)


def op_durations(ops: Sequence[Op], compute: ComputeModel,
                 rank_compute: Mapping[int, ComputeModel] | None = None,
                 member_busy: dict[int, float] | None = None) -> list[float]:
    """Seconds of every compute op of ``ops`` (indexed by op id; NaN for the other ops) on its rank's model
    (``rank_compute``, else ``compute``): :meth:`ComputeModel.duration`, once per distinct op shape.

    An op with ``members`` (a representative computing for ranks whose work differs) takes its longest
    member's time; ``member_busy``, if given, receives ``{op id: mean member time / that time}`` for each
    such op (the share of the op its members compute, on average: the rest they wait).

    An op with ``duration_s`` takes it. A coarsened op (non-empty ``parts``) is timed once per kernel tuple
    object and model (generators share one tuple across many ops), all such tuples together at the end by
    :func:`_parts_durations`: a skewed MoE step holds ~10^5 distinct expert kernels, whose GEMMs are then timed
    in blocks. Any other op is timed once per distinct value of what :meth:`ComputeModel.duration` reads of it."""
    nan = float("nan")
    duration: list[float] = [nan] * len(ops)
    one = not rank_compute  # one model: a tuple's key is its id alone (no key tuple made per op)
    slot_of: dict = {}  # key of a (tuple, model) -> its entry of ``later``
    by_value: dict[tuple, float] = {}
    later: list[tuple[ComputeModel, tuple[Kernel, ...]]] = []  # tuples to time together, in first-seen order
    waiting: list[int] = []  # ids of the ops timed with ``later``
    slots: list[int] = []  # ... and their entries of it
    member_slots: list[tuple[int, list[int]]] = []  # (op id, its members' entries of ``later``) of ops with members

    def slot_for(model: ComputeModel, parts: tuple[Kernel, ...]) -> int:
        """The entry of ``later`` that times ``parts`` on ``model``, added when first seen."""
        key = id(parts) if one else (id(parts), id(model))
        slot = slot_of.get(key)
        if slot is None:
            slot = slot_of[key] = len(later)
            later.append((model, parts))
        return slot

    model = compute
    for op in ops:
        if op.kind != "compute":
            continue
        if op.duration_s is not None:  # what duration() returns first, whatever the op's kernels
            duration[op.id] = op.duration_s
            continue
        if not one:
            model = rank_compute.get(op.rank, compute)
        parts = op.parts
        if parts:  # (duration() is then the sum over the kernels alone)
            if op.members is None:
                waiting.append(op.id)
                slots.append(slot_for(model, parts))
            else:
                member_slots.append((op.id, [slot_for(model, member) for member in op.members]))
            continue
        # (no parts, or none in them: duration() reads the op's own category, FLOPs, bytes and shape)
        vkey = (id(model), op.category, op.flops, op.nbytes, op.shape)
        d = by_value.get(vkey)
        if d is None:
            d = by_value[vkey] = model.duration(op)
        duration[op.id] = d
    if later:
        timed = _parts_durations(later)
        for i, slot in zip(waiting, slots):
            duration[i] = timed[slot]
        for i, entries in member_slots:
            times = [timed[slot] for slot in entries]
            duration[i] = longest = max(times)
            if member_busy is not None:
                member_busy[i] = sum(times) / len(times) / longest if longest > 0 else 1.0
    return duration


def _parts_durations(later: Sequence[tuple[ComputeModel, tuple[Kernel, ...]]]) -> list[float]:
    """:meth:`ComputeModel.duration` of each ``(model, parts)`` of ``later`` (an op of those non-empty parts and
    no ``duration_s``): the sum over its kernels, in order. Kernels are timed as arrays, one model at a time:
    the plain GEMMs (those whose time :meth:`ComputeModel._kernel_duration` works out from
    :meth:`GemmModel.time`) by :func:`_gemm_durations`, the kernels without FLOPs (memory-bound: element-wise,
    casts) by :func:`_memory_durations`; every other kernel by :meth:`ComputeModel._kernel_duration` (or
    :meth:`ComputeModel.duration`, not a Kernel), each kernel object once per model however many tuples hold
    it. The sums are Python's ``sum`` over the same floats in the same order, so each total is the one
    :meth:`ComputeModel.duration` makes."""
    values: list = []  # one per distinct (model, kernel object), in first-seen order; the arrays' filled in below
    # id(model) -> (model, {id(kernel) -> its entry of ``values``}, (where, kernels) of its plain GEMMs, (where,
    # kernels) of its kernels without FLOPs): a kernel object in many tuples (the layers' shared kernels around a
    # MoE rank's scaled experts) is timed once per model; every tuple in ``later`` keeps its kernels alive
    per_model: dict[int, tuple[ComputeModel, dict[int, int], tuple[list[int], list[Kernel]],
                               tuple[list[int], list[Kernel]]]] = {}
    bounds: list[list[int]] = []  # each tuple's entries of ``values``, in its kernels' order
    for model, parts in later:
        mine = per_model.get(id(model))
        if mine is None:
            mine = per_model[id(model)] = (model, {}, ([], []), ([], []))
        index_of = mine[1]
        entries = []
        for k in parts:
            i = index_of.get(id(k))
            if i is None:
                i = index_of[id(k)] = len(values)
                if type(k) is not Kernel:
                    values.append(model.duration(k))
                elif k.flops and not (k.category == "gemm" and k.shape is not None and not k.sm_reserved):
                    values.append(model._kernel_duration(k))
                else:  # a plain GEMM, or a kernel without FLOPs: timed with its model's others as arrays
                    where, kernels = mine[2] if k.flops else mine[3]
                    where.append(i)
                    kernels.append(k)
                    values.append(None)
            entries.append(i)
        bounds.append(entries)
    for model, _index_of, gemms, memory in per_model.values():
        for (where, kernels), timer in ((gemms, _gemm_durations), (memory, _memory_durations)):
            if kernels:
                for i, t in zip(where, timer(model, kernels)):
                    values[i] = t
    at = values.__getitem__
    return [sum(map(at, entries)) for entries in bounds]


def _gemm_durations(model: ComputeModel, kernels: Sequence[Kernel]) -> list[float]:
    """:meth:`ComputeModel._kernel_duration` of plain GEMM kernels (category ``gemm``, a shape, no reserved SMs,
    non-zero FLOPs), as arrays: ``t_math = flops / (2.0 · batch · m · n · k / time)``, then the roofline
    (:func:`_roofline_durations`). Each element goes through the same float64 operations in the same order as
    the scalar path (an integer below 2**53 converts to a double exactly, in Python's arithmetic as in numpy's).
    Kernels whose shapes or batch are not all integers in ``1 .. 2**53`` take the scalar path."""
    try:
        dims = np.array([d for k in kernels for d in (*k.shape, k.batch)])  # int64 when all are integers
    except (OverflowError, TypeError, ValueError):
        dims = None
    if dims is None or dims.dtype != np.int64 or dims.shape != (4 * len(kernels),) \
            or int(dims.min()) < 1 or int(dims.max()) >= 2 ** 53:
        return [model._kernel_duration(k) for k in kernels]
    m, n, kk, batch = dims[0::4], dims[1::4], dims[2::4], dims[3::4]
    t = times(model.gemm, m, n, kk, batch)
    flops = np.array([k.flops for k in kernels], dtype=np.float64)
    t_math = flops / (2.0 * batch.astype(np.float64) * m.astype(np.float64) * n.astype(np.float64)
                      * kk.astype(np.float64) / t)
    return _roofline_durations(model, kernels, t_math)


def _memory_durations(model: ComputeModel, kernels: Sequence[Kernel]) -> list[float]:
    """:meth:`ComputeModel._kernel_duration` of kernels without FLOPs (``t_math`` 0), as arrays."""
    return _roofline_durations(model, kernels, np.zeros(len(kernels)))


def _roofline_durations(model: ComputeModel, kernels: Sequence[Kernel], t_math: np.ndarray) -> list[float]:
    """:meth:`ComputeModel._roofline` of each kernel whose math takes ``t_math`` s, as arrays: the same operations
    on the same doubles (``nbytes / (bandwidth · efficiency)``, 0 without bytes, the larger of the two, plus the
    overhead; ``max`` of these finite non-negative values is exact). A model whose bandwidth terms are not
    positive (the scalar path would raise or divide by zero) takes the scalar path."""
    hbm = model.gpu.hbm_bandwidth
    if not (hbm * min(model.memory_efficiency, model.score_memory_efficiency,
                      model.activation_memory_efficiency) > 0):
        return [model._kernel_duration(k) for k in kernels]
    nbytes = np.array([k.nbytes for k in kernels], dtype=np.float64)
    efficiency = model._hbm_efficiency
    rate = np.array([hbm * efficiency(k.category, k.batch) for k in kernels])
    with np.errstate(divide="ignore", invalid="ignore"):
        t_mem = np.where(nbytes == 0, 0.0, nbytes / rate)
    return (np.maximum(t_math, t_mem) + model.op_overhead_s).tolist()


_REDUCED: dict[tuple[GemmModel, int], GemmModel] = {}


def _with_sms(gemm: GemmModel, sms: int) -> GemmModel:
    """``gemm`` on ``sms`` of its SMs (peak in proportion), cached: GEMM times are cached per model."""
    key = (gemm, sms)
    out = _REDUCED.get(key)
    if out is None:
        out = _REDUCED[key] = replace(gemm, sm_count=sms, peak_flops=gemm.peak_flops * sms / gemm.sm_count)
    return out
