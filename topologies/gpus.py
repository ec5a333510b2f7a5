"""GPU datasheet numbers (SI units) and name lookup.

All FLOP/s are *dense* (no 2:4 structured sparsity): NVIDIA datasheets print
the sparse figure first, with a footnote; the dense figure is half of it.
HBM capacity is the datasheet's decimal GB (``80GB`` -> 80e9 bytes), which is
slightly below what ``nvidia-smi`` reports and so errs on the side of
"does not fit" in memory checks.

``matmul_efficiency`` is the fraction of dense peak that the best-shaped
cuBLAS GEMMs sustain at the GPU's default power limit: the maximum achievable
matmul FLOP/s (MAMF) that S. Bekman's ``mamf-finder.py`` found by searching
GEMM shapes (``stas00/ml-engineering``, compute/accelerator/README.md, "Maximum
Achievable Matmul FLOPS comparison table", commit 744d01e; ``torch.mm`` on
random BF16 inputs, L2 flushed between runs). It is a component
microbenchmark, not a fit to training throughput; :mod:`simulator.gemm` takes
every other shape below it by waves, tiles and pipeline fill:

* A100-SXM: 271.2 of 312 TFLOP/s (1024×10240×5120, torch 2.6 / CUDA 12.6): 0.869.
* H100-SXM: 794.5 of 989.4 (2048×2048×13312, torch 2.7 / CUDA 12.6): 0.803;
  the table notes that H200 measures the same.
* B200: 1745.0 of 2250 (1792×16128×3072, torch 2.7.1+cu128): 0.776.
* GB200: 1822.0 of 2500 (4096×9728×2048, torch 2.10 nightly, cu130): 0.729.
* GB300: no row; the B300 SXM row (the same Blackwell Ultra die), 1769.0 of
  2250 (12288×18432×1024, torch 2.9.1+cu130): 0.786.

``matmul_efficiency_fp8`` is the same search's FP8 table (``torch._scaled_mm``
on ``float8_e4m3fn`` inputs, per-tensor scales, bf16 output, cuBLASLt; same
README and commit, "FP8 (float8_e4m3fn)"), as a fraction of the dense FP8 peak:

* H100-SXM: 1402.6 of 1979 TFLOP/s (1024×9216×14336, torch 2.7.0+cu126): 0.709.
* H200-SXM: 1453.4 of 1979 (1280×4096×12032, torch 2.7.1+cu128): 0.734.
* B200: 3432.5 of 4500 (15360×4096×3072, torch 2.7.1+cu128): 0.763.
* GB200: 3615.6 of 5000 (19456×5120×1536, torch 2.10 nightly, cu130): 0.723.
* GB300: no row; the B300 SXM row (the same Blackwell Ultra die), 3353.3 of
  4500 (3072×6144×7168, torch 2.9.1+cu130): 0.745.

``matmul_efficiency_fp8_wgrad`` is the weight-gradient GEMM of fine-grained (blockwise) FP8 scaling, the recipe
of DeepSeek-V3 (``training.fp8_recipe: blockwise``): its operands are the activation and the output gradient, each
scaled per 1 x 128 tile along the reduced (token) dimension, so every 128 of ``k`` the partial sums are promoted to
fp32 and rescaled by two scales, and the output is fp32. DeepSeek's own kernels for it (DeepGEMM pull request 95,
``wgrad_gemm_fp8_fp8_fp32_nt`` / ``k_grouped_wgrad_gemm_fp8_fp8_fp32_nt``, merged as commit 04278f6, H800 SXM,
"~20% speedup compared to the internal CUTLASS implementation") reach 878-1092 TFLOP/s over DeepSeek-V3's shapes,
against 1,550 for the forward GEMMs of the same library:

* Hopper (H100, H800, H200 SXM): the table's best row, 1092 of 1979 TFLOP/s (M 1536, N 24576, K 8192): 0.552.
* Blackwell: no measurement; its tensor cores apply block scales themselves (MXFP8), so the FP8 ceiling stands.

``_scaled_mm`` runs without fast accumulation, as Transformer Engine's backward
(``dgrad``, ``wgrad``) GEMMs do; TE's forward GEMMs use fast accumulation and
may run somewhat faster. A100 has no FP8.

``sustained_clock_fraction`` is the rate a GEMM keeps when GEMMs run back to back for seconds, as in
training, over the rate the wave/tile model (:mod:`simulator.gemm`) gives it from the short-burst ceilings
above (MAMF times each shape for ~40 ms, with a 256 MiB cache-clearing memset between GEMMs:
``compute/accelerator/benchmarks/mamf-finder.py``). Under a sustained load a GPU at its power limit lowers its
SM clock; the tile model's time is all in SM cycles, so :class:`simulator.compute.ComputeModel` divides every
tensor-core GEMM's time by the fraction (HBM traffic keeps its rate: memory has its own clock; fp32 GEMMs on
the SIMT cores are not scaled: the same H100 run below holds 51.8 TFLOP/s flat over seven rounds):

* Hopper (H100, H800, H200 SXM, 700 W): 0.96 (:data:`HOPPER_SUSTAINED_CLOCK`). cuBLAS BF16 8192³ on an
  H100 SXM at its 700 W limit: 789.6 TFLOP/s in the first 20-GEMM round (~28 ms, after ~0.2 s of fp16
  GEMMs, so not a cold start), 698-729 in the six rounds after it (median of the seven 717.4; fp16 769 then
  a median of 693; ``tusharhqq/napkin-math-gpu`` ``results/h100-sxm.json``, commit 9da5cf3, torch
  2.8.0+cu128, ``power_limit_w`` 700); ~730 back to back for gpu-fryer's default 60 s
  (``huggingface/gpu-fryer`` README at commit 2b6fb06, "NVIDIA H100 80GB HBM3 ~730 BF16", 8192³ cuBLASLt).
  So the clock costs 8% (730 / 789.6 = 0.925, 717.4 / 789.6 = 0.909), but the model's burst rate at 8192³
  is 758.0, itself 4% under the burst (its wave and pipeline-fill terms: 15.5 waves of 256×128 tiles; 128 of
  8192 elements of ``k``), so against the model the long runs read 730 / 758 = 0.963 and 717.4 / 758 =
  0.946: 0.96. Taking the clock's 0.92 instead would count the model's shortfall twice (697 where 730 is
  measured). (SMOL's ``do_bench`` median at 8192³, 729.4, reads like the long runs, but its other large
  shapes, 753-758, like the burst model: ``do_bench``'s flushes leave a duty cycle that varies with the
  GEMM's length, so it is neither, and the tests keep it with the burst references.) H800 and H200 are the
  same die at the same 700 W: the H100's fraction is assumed. FP8 GEMMs take the same fraction, an
  assumption: no usable sustained FP8 rate exists (gpu-fryer's FP8 row, ~1530, above MAMF's burst 1402.6,
  multiplies random 32-bit integers cast to E4M3, whose range ends at 448, so its operands are saturated
  and toggle few bits; its README expects FP8 to draw less power), and DeepSeek's DeepGEMM issues report
  Hopper clocks of 1575 MHz under FP8 GEMMs beside communication (deepseek-ai/DeepGEMM #120).
* A100 SXM: 1.0. Ten minutes of cuBLAS BF16 8192³ sustain ~270 TFLOP/s (huggingface/gpu-fryer PR #9, three
  10-minute runs on A100-SXM4-80GB; the README's A100 row since), which the model's 266.4 there already
  meets (and the MAMF ceiling, 271.2, too); napkin-math-gpu's A100-SXM4-80GB (500 W) holds 289 flat over
  seven rounds. Nothing is left to take off.
* GB200 (NVL72): 0.90 (:data:`GB200_SUSTAINED_CLOCK`). cuBLASLt BF16 8192³ back to back: ~1550 TFLOP/s
  (``huggingface/gpu-fryer`` README since commit f9d564b, PR #20, 2026-01-14, "NVIDIA GB200-NVL72 186GB HBM3e
  ~1550 BF16"; the row does not give the run's length: the tool's default is 60 s, its first 5 s uncounted;
  same operands and kernel path as its H100 row above). The model's burst rate at 8192³ is 1724.3, itself 5%
  under MAMF's 1822 (13.5 waves of 256×128 tiles on 152 SMs, the 128-element fill of 8192), so
  1550 / 1724.3 = 0.899: 0.90. Against MAMF the
  long run reads 1550 / 1822 = 0.851; taking that as the fraction would count the model's 5% twice (1467 where
  1550 is measured). gpu-fryer's BF16 operands are random 32-bit integers rounded to BF16 (one sign, a few
  exponents): if anything they draw less power than ``randn`` (its H100 row, 730, sits 1.8% above
  napkin-math-gpu's ``randn`` median, 717.4), so 0.90 errs fast, not slow. Its FP8 row (~4300, above MAMF's
  burst 3615.6) is the saturated-operand run described for Hopper and is not used.
* B200 (HGX/DGX B200): 0.88 (:data:`B200_SUSTAINED_CLOCK`), from a B200 measurement that is not a GEMM,
  carried over by the GB200 one. FlashInfer timed FlashAttention-4 (BF16, batch 4, 8192 tokens, 16 heads of
  128; flashinfer-ai/flashinfer PR #2899, 2026-03-26) over 100 back-to-back iterations on a B200: 1450 TFLOP/s
  at its peak (iterations 10-19), 1237 once throttled (70-79), 0.853, as the SM clock fell from 1965 to ~1580
  MHz (0.804) and the board reached ~1000 W. Its throughput ratio, not the clock ratio, is the cost (the kernel
  is not all SM cycles; 0.804 would count what is not clock-bound as if it were). It transfers to GEMMs because
  the GB200's GEMM run above loses the same share of its burst ceiling, 1550 / 1822 = 0.851: two tensor-core
  kernels, two parts of the same die, each at its power limit. As for Hopper, the cost is measured against the
  burst rate (which at 8192³ is MAMF's, as the H100's first round, 789.6, is MAMF's 794.5), and the model's
  burst rate at 8192³ is 1696.6, 2.8% under B200's MAMF (1745.0): 0.853 × 1745.0 / 1696.6 = 0.877 (0.851,
  GB200's, gives 0.875): 0.88. No sustained B200 GEMM rate was found (gpu-fryer has no B200 row;
  napkin-math-gpu's ``B200.md`` has datasheet ceilings only, no run); the 1.0 it replaces read a B200's 8192³
  GEMM in training at 1696.6, 14% above the 1489 (0.853 × 1745.0) these measurements give.
* GB300: 1.0 for want of a measurement. It runs the GB200's BF16/FP8 peaks at a 1,400 W default limit (1,200
  for GB200; facebookexperimental/triton PR #2023's ``denoise.sh``), so more power per FLOP: GB200's cost need
  not carry over, and none has been measured. The default likely flatters it; set
  ``compute.sustained_clock_fraction``.
* FP8 GEMMs on Blackwell take BF16's fraction, as on Hopper (an assumption).

Fused attention is not scaled: its published rates (FlashAttention-3's and cuDNN's, :mod:`simulator.attention`)
were measured on an H100 SXM5 at 700 W with its SM clock fixed at 1830 MHz (FlashAttention-3, arXiv:2407.08608,
appendix C.1: "the clock speed used to calculate the 989 TFLOPS FP16 theoretical max"), 0.92 of its 1980 MHz
boost: already at about the sustained clock.

``nvlink_efficiency`` is nccl-tests' bus bandwidth at multi-GB sizes on one
8-GPU NVSwitch node over the NVLink rate per direction: A100 all-reduce /
all-gather / reduce-scatter 235 / 223 / 232 GB/s of 300 (0.77;
microsoft/superbenchmark nccl logs), H100/H200 367 / 361 / 363 of 450 (0.81;
NCCL 2.27.7 on H200, NVIDIA GTC'24: "370 GB/s"). B200: no measurement found;
Hopper's fraction is assumed.

``gemm_critical_intensity`` (FLOPs per operand byte below which a GEMM tile is
short of operands, :mod:`simulator.gemm`):

* A100: an SM's tensor cores do 1024 dense BF16 FMAs = 2048 FLOPs per clock
  (312 TFLOP/s / 108 SMs / 1.41 GHz) and its share of the L2's 5120 bytes per
  clock (NVIDIA A100 Tensor Core GPU Architecture whitepaper, "L2 cache") is
  47.4 bytes: 43.2 FLOP/B, which a 128×64 tile just reaches.
* H100, H200, B200: tensor throughput per SM per clock doubled (H100
  whitepaper) while L2 bandwidth per SM did not keep pace, and Hopper's
  fastest cuBLAS/CUTLASS kernels use 256×128 (two consumer warp groups) or
  2-CTA clusters; we take the 256×128 tile's 85.3 FLOP/B as critical. The
  check of both against published cuBLAS timings is in
  ``tests/test_compute_grounding.py`` (large GEMMs within 7%).
"""

from __future__ import annotations

from types import MappingProxyType

from topologies.cluster import GPUSpec, TopologyError

__all__ = ["GPU_SPECS", "PCIE_BANDWIDTH", "get_gpu", "gpu_names"]

HOPPER_SUSTAINED_CLOCK = 0.96
"""The sustained GEMM rate of a Hopper SXM GPU at 700 W over the burst model's (module docstring,
``sustained_clock_fraction``)."""

GB200_SUSTAINED_CLOCK = 0.90
"""GB200's sustained GEMM rate (gpu-fryer's ~1550 TFLOP/s at 8192³) over the burst model's there (1724.3)."""

B200_SUSTAINED_CLOCK = 0.88
"""B200's: FlashInfer's throttled over peak FlashAttention-4 rate (0.853; GB200's GEMMs 0.851) times MAMF over the
burst model at 8192³ (module docstring, ``sustained_clock_fraction``)."""

_T = 1e12  # TFLOP/s
_GB = 1e9

GPU_SPECS: dict[str, GPUSpec] = {
    # NVIDIA A100 Tensor Core GPU datasheet (80GB SXM column): FP32 19.5 TF,
    # TF32 156 TF, BF16/FP16 312 TF (dense; 2x with sparsity), no FP8.
    # HBM2e 80 GB at 2,039 GB/s. NVLink 3: 600 GB/s bidirectional = 300 GB/s
    # per direction. DGX A100 user guide: ConnectX-6 HDR 200 Gb/s per GPU.
    "A100-80GB-SXM": GPUSpec(
        name="A100-80GB-SXM",
        peak_flops=MappingProxyType({"fp32": 19.5 * _T, "tf32": 156 * _T, "bf16": 312 * _T, "fp16": 312 * _T}),
        hbm_bytes=80 * _GB,
        hbm_bandwidth=2039 * _GB,
        nvlink_bandwidth=300 * _GB,
        nic_bandwidth=200e9 / 8,
        sm_count=108,
        matmul_efficiency=0.869,
        gemm_critical_intensity=43.2,
        nvlink_efficiency=0.77,
        arch="sm80",
        source="NVIDIA A100 Tensor Core GPU datasheet (80GB SXM); DGX A100 System User Guide",
    ),
    # NVIDIA H100 Tensor Core GPU datasheet (H100 SXM column): FP32 67 TF,
    # TF32 989 TF*, BF16/FP16 1,979 TF*, FP8 3,958 TF* (* with sparsity; dense
    # is half). HBM3 80 GB at 3.35 TB/s. NVLink 4: 900 GB/s bidirectional =
    # 450 GB/s per direction. DGX H100: ConnectX-7 NDR 400 Gb/s per GPU.
    "H100-SXM": GPUSpec(
        name="H100-SXM",
        peak_flops=MappingProxyType(
            {"fp32": 67 * _T, "tf32": 494.7 * _T, "bf16": 989.4 * _T, "fp16": 989.4 * _T, "fp8": 1978.9 * _T}
        ),
        hbm_bytes=80 * _GB,
        hbm_bandwidth=3350 * _GB,
        nvlink_bandwidth=450 * _GB,
        nic_bandwidth=400e9 / 8,
        sm_count=132,
        matmul_efficiency=0.803,
        matmul_efficiency_fp8=0.709,
        matmul_efficiency_fp8_wgrad=0.552,
        sustained_clock_fraction=HOPPER_SUSTAINED_CLOCK,
        gemm_critical_intensity=85.3,
        nvlink_efficiency=0.81,
        source="NVIDIA H100 Tensor Core GPU datasheet (H100 SXM); DGX H100 User Guide",
    ),
    # NVIDIA H800 SXM: the export variant of the H100 SXM with the same SMs, clocks and HBM3 (so the
    # same peaks and measured GEMM efficiencies, 80 GB at 3.35 TB/s) but NVLink cut to 400 GB/s
    # bidirectional = 200 GB/s per direction (NVIDIA H800 product brief). DeepSeek-AI, DeepSeek-V3
    # Technical Report (arXiv:2412.19437) section 3.1: 8 H800 per node on NVLink/NVSwitch, nodes on
    # InfiniBand; section 3.2.2: "NVLink offers a bandwidth of 160 GB/s, roughly 3.2 times that of IB
    # (50 GB/s)", i.e. one ConnectX-7 400 Gb/s NIC per GPU. 0.81 of 200 GB/s = 162 GB/s achievable,
    # as the report's 160 GB/s.
    "H800-SXM": GPUSpec(
        name="H800-SXM",
        peak_flops=MappingProxyType(
            {"fp32": 67 * _T, "tf32": 494.7 * _T, "bf16": 989.4 * _T, "fp16": 989.4 * _T, "fp8": 1978.9 * _T}
        ),
        hbm_bytes=80 * _GB,
        hbm_bandwidth=3350 * _GB,
        nvlink_bandwidth=200 * _GB,
        nic_bandwidth=400e9 / 8,
        sm_count=132,
        matmul_efficiency=0.803,
        matmul_efficiency_fp8=0.709,
        matmul_efficiency_fp8_wgrad=0.552,
        sustained_clock_fraction=HOPPER_SUSTAINED_CLOCK,
        gemm_critical_intensity=85.3,
        nvlink_efficiency=0.81,
        source="NVIDIA H800 product brief (H100 SXM compute, NVLink 400 GB/s); DeepSeek-V3 report section 3",
    ),
    # NVIDIA H200 Tensor Core GPU datasheet (H200 SXM column): same compute as
    # H100 SXM; HBM3e 141 GB at 4.8 TB/s; NVLink 900 GB/s bidirectional.
    # DGX H200: ConnectX-7 NDR 400 Gb/s per GPU.
    "H200-SXM": GPUSpec(
        name="H200-SXM",
        peak_flops=MappingProxyType(
            {"fp32": 67 * _T, "tf32": 494.7 * _T, "bf16": 989.4 * _T, "fp16": 989.4 * _T, "fp8": 1978.9 * _T}
        ),
        hbm_bytes=141 * _GB,
        hbm_bandwidth=4800 * _GB,
        nvlink_bandwidth=450 * _GB,
        nic_bandwidth=400e9 / 8,
        sm_count=132,
        matmul_efficiency=0.803,
        matmul_efficiency_fp8=0.734,
        matmul_efficiency_fp8_wgrad=0.552,
        sustained_clock_fraction=HOPPER_SUSTAINED_CLOCK,
        gemm_critical_intensity=85.3,
        nvlink_efficiency=0.81,
        source="NVIDIA H200 Tensor Core GPU datasheet (H200 SXM); DGX H200 User Guide",
    ),
    # NVIDIA HGX B200 / DGX B200 datasheets, per GPU (8-GPU totals / 8):
    # FP32 75 TF, TF32 2.2 PF*, BF16/FP16 4.5 PF*, FP8 9 PF* (* sparse; dense
    # is half). HBM3e 180 GB at 8 TB/s (DGX B200: 64 TB/s for 8 GPUs; the HGX
    # B200 table says 7.7 TB/s per GPU, ~4% less for memory-bound kernels on
    # HGX). NVLink 5: 1.8 TB/s bidirectional = 900 GB/s per direction.
    # DGX B200: ConnectX-7 400 Gb/s per GPU.
    # FP4 exists but is not a training dtype here.
    "B200": GPUSpec(
        name="B200",
        peak_flops=MappingProxyType(
            {"fp32": 75 * _T, "tf32": 1100 * _T, "bf16": 2250 * _T, "fp16": 2250 * _T, "fp8": 4500 * _T}
        ),
        hbm_bytes=180 * _GB,
        hbm_bandwidth=8000 * _GB,
        nvlink_bandwidth=900 * _GB,
        nic_bandwidth=400e9 / 8,
        sm_count=148,
        matmul_efficiency=0.776,
        matmul_efficiency_fp8=0.763,
        sustained_clock_fraction=B200_SUSTAINED_CLOCK,
        gemm_critical_intensity=85.3,
        nvlink_efficiency=0.81,
        arch="sm100",
        source="NVIDIA HGX B200 and DGX B200 datasheets",
    ),
    # NVIDIA GB200 NVL72 datasheet, rack totals / 72 GPUs: FP8 720 PF*, BF16/FP16
    # 360 PF*, TF32 180 PF* (* sparse; dense is half: 5, 2.5 and 1.25 PF per
    # GPU, the 1,200 W Grace-Blackwell part), HBM3e 13.4 TB (186 GB per GPU) at
    # 576 TB/s (8 TB/s per GPU), NVLink 5 at 130 TB/s (1.8 TB/s bidirectional =
    # 900 GB/s per direction per GPU) over one 72-GPU NVLink switch domain. Each
    # compute tray (4 GPUs) has 4x ConnectX-7 400 Gb/s: one per GPU. FP32 80 TF
    # (the GB200 NVL72 / HGX B200 spec table's per-GPU figure; B200: 75). 152 SMs
    # enabled as the device reports them (B200: 148; NVIDIA publishes no count:
    # kernels' own notes on GB200 say 152). The critical GEMM intensity is
    # B200's (same die); MAMF fractions in the module docstring.
    "GB200": GPUSpec(
        name="GB200",
        peak_flops=MappingProxyType(
            {"fp32": 80 * _T, "tf32": 1250 * _T, "bf16": 2500 * _T, "fp16": 2500 * _T, "fp8": 5000 * _T}
        ),
        hbm_bytes=186 * _GB,
        hbm_bandwidth=8000 * _GB,
        nvlink_bandwidth=900 * _GB,
        nic_bandwidth=400e9 / 8,
        sm_count=152,
        matmul_efficiency=0.729,
        matmul_efficiency_fp8=0.723,
        sustained_clock_fraction=GB200_SUSTAINED_CLOCK,
        gemm_critical_intensity=85.3,
        nvlink_efficiency=0.81,
        arch="sm100",
        source="NVIDIA GB200 NVL72 datasheet (rack totals / 72)",
    ),
    # NVIDIA GB300 NVL72 datasheet, rack totals / 72 GPUs: FP8 720 PF*, BF16/FP16
    # 360 PF*, TF32 180 PF* (* sparse: dense 5, 2.5, 1.25 PF per GPU; Blackwell
    # Ultra adds FP4 and attention-exponent throughput, not BF16/FP8 matmul
    # rate), HBM3e 20.1 TB (279 GB per GPU) at 576 TB/s, NVLink 5 as GB200. Each
    # GPU has a ConnectX-8 SuperNIC at 800 Gb/s. 152 SMs enabled as the device
    # reports them (sm_103, cc 10.3; the full Blackwell Ultra die has 160:
    # NVIDIA's "Inside NVIDIA Blackwell Ultra"; B200 likewise enables 148).
    "GB300": GPUSpec(
        name="GB300",
        peak_flops=MappingProxyType(
            {"fp32": 80 * _T, "tf32": 1250 * _T, "bf16": 2500 * _T, "fp16": 2500 * _T, "fp8": 5000 * _T}
        ),
        hbm_bytes=279 * _GB,
        hbm_bandwidth=8000 * _GB,
        nvlink_bandwidth=900 * _GB,
        nic_bandwidth=800e9 / 8,
        sm_count=152,
        matmul_efficiency=0.786,
        matmul_efficiency_fp8=0.745,
        gemm_critical_intensity=85.3,
        nvlink_efficiency=0.81,
        arch="sm100",
        source="NVIDIA GB300 NVL72 datasheet (rack totals / 72)",
    ),
}

# GPU <-> NIC PCIe bandwidth per direction, bytes/s. A100 systems use PCIe Gen4
# x16 (16 GT/s * 16 lanes * 128/130 / 8 ~= 31.5 GB/s, rounded to 32 GB/s);
# H100, H200 and B200 systems use Gen5 x16 (~63 GB/s, rounded to 64 GB/s).
# Both sit above the GPU's NIC rate (25 and 50 GB/s), so PCIe is not the
# bottleneck by default.
PCIE_BANDWIDTH: dict[str, float] = {
    "A100-80GB-SXM": 32 * _GB,
    "H100-SXM": 64 * _GB,
    "H200-SXM": 64 * _GB,
    "H800-SXM": 64 * _GB,
    "B200": 64 * _GB,
    "GB200": 64 * _GB,  # ConnectX-7: PCIe Gen5 x16
    "GB300": 128 * _GB,  # ConnectX-8: PCIe Gen6 x16
}

_ALIASES: dict[str, str] = {
    "a100": "A100-80GB-SXM",
    "a100-80gb": "A100-80GB-SXM",
    "a100-sxm": "A100-80GB-SXM",
    "a100-sxm4": "A100-80GB-SXM",
    "a100-sxm4-80gb": "A100-80GB-SXM",
    "a100-80gb-sxm4": "A100-80GB-SXM",
    "h100": "H100-SXM",
    "h100-sxm5": "H100-SXM",
    "h100-80gb": "H100-SXM",
    "h100-sxm5-80gb": "H100-SXM",
    "h800": "H800-SXM",
    "h800-sxm5": "H800-SXM",
    "h800-80gb": "H800-SXM",
    "h200": "H200-SXM",
    "h200-sxm5": "H200-SXM",
    "h200-141gb": "H200-SXM",
    "b200-sxm": "B200",
    "b200-180gb": "B200",
    "gb200-nvl72": "GB200",
    "gb300-nvl72": "GB300",
}


def _key(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


_LOOKUP: dict[str, str] = {_key(n): n for n in GPU_SPECS} | _ALIASES


def gpu_names() -> list[str]:
    """Canonical GPU names, in :data:`GPU_SPECS` order."""
    return list(GPU_SPECS)


def get_gpu(name: str | GPUSpec, field: str = "gpu") -> GPUSpec:
    """Look up a GPU by canonical name or alias, case-insensitively.

    Parameters
    ----------
    name : str or GPUSpec
        ``"H100-SXM"``, ``"h100"``, ``"H100_SXM5"``, ``"A100"``, ...; a
        :class:`GPUSpec` is returned unchanged (for custom GPUs).
    field : str
        Name used in error messages, e.g. ``"cluster.gpu"``.

    Returns
    -------
    GPUSpec

    Raises
    ------
    TopologyError
        If the name is unknown; the message lists the valid names.

    Examples
    --------
    >>> get_gpu("h100").name
    'H100-SXM'
    """
    if isinstance(name, GPUSpec):
        return name
    canonical = _LOOKUP.get(_key(name)) if isinstance(name, str) else None
    if canonical is None:
        raise TopologyError(f"{field}: unknown GPU {name!r}; valid: {', '.join(GPU_SPECS)} (aliases such as "
                            f"'H100', 'A100', 'h100-sxm5' also work)")
    return GPU_SPECS[canonical]
