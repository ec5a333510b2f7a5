"""Each component model against published microbenchmarks, never against end-to-end training throughput.

Every number below is a published measurement with its source beside it; the
tolerances are stated per class of measurement, and where the model is known
to miss (small GEMMs on Hopper, unfused attention's backward) the test pins
the direction and size of the miss so that it is documented, not hidden
(docs/VALIDATION.md, "Error budget").

Sources
-------
MAMF     S. Bekman, *Machine Learning Engineering*, github stas00/ml-engineering,
         compute/accelerator/README.md, "Maximum Achievable Matmul FLOPS comparison
         table" (commit 744d01e): best shape of a brute-force ``torch.mm`` search;
         its "FP8 (float8_e4m3fn)" table: ``torch._scaled_mm`` (cuBLASLt), H100 SXM
         1402.6 TFLOP/s at 1024x9216x14336, H200 SXM 1453.4 at 1280x4096x12032.
SMOL     Hugging Face, *Smol Training Playbook*, "Compute units and FLOPs": the
         SemiAnalysis GEMM benchmark (``semianalysiswork/nvidia-matmul``, NVIDIA
         24.09 stack) on H100 80GB HBM3, Llama-70B TP8 shapes, median of triton
         ``do_bench``.
HE       H. He, "Strangely, Matrix Multiplications on GPUs Run Faster When Given
         'Predictable' Data!" (thonking.ai, 2024): A100 cuBLAS 8192³, randn inputs.
TRITON   cuBLAS columns of Triton's matmul tutorial benchmarks, ``torch.matmul``
         FP16 via ``do_bench``: triton-lang/triton issues #2339 (H100), #3672 (H100),
         #3551 (A100).
VLLM     vllm-project/vllm PR #49363, "H100 benchmarks", ``torch-bf16`` column; FP8:
         its ``fp8-tensor-w-tensor-a-noquant`` column (per-tensor scaled FP8 GEMM,
         quantisation excluded), N=12288 K=5376.
F8EXP    meta-pytorch/float8_experimental pull requests #38 (2023-08-18, "add simple benchmark for single GPU LLaMa
         70B shapes") and #100 (2023-09-19, ``benchmarks/bench_matmul.py``): ``torch.mm`` (BF16) against
         ``torch._scaled_mm`` (FP8, cuBLASLt) on an H100, LLaMa-2 70B's linear layers at 16384 tokens, seconds per
         GEMM; shapes printed (M, K, N).
DEEPGEMM deepseek-ai/DeepGEMM pull request #95, "Weight gradient kernels for dense and MoE models"
         (2025-05-06, merged as commit 04278f6): ``wgrad_gemm_fp8_fp8_fp32_nt`` ("Weight gradient GEMMs
         for dense models" table) and ``k_grouped_wgrad_gemm_fp8_fp8_fp32_nt`` (its MoE rows as issue #107
         quotes them, "PR #95" column), DeepSeek-V3's shapes, fine-grained (1 x 128) FP8 scaling, fp32
         output; H800 SXM (DeepGEMM's published benchmarks: H800 SXM5, NVCC 12.8).
NAPKIN   tusharhqq/napkin-math-gpu, ``results/h100-sxm.json`` (commit 9da5cf3, 2026-08-08): H100 80GB HBM3 at
         ``power_limit_w`` 700, torch 2.8.0+cu128, ``torch.mm`` BF16 8192³ on randn, 7 rounds of 20
         back-to-back GEMMs: 1.3924 ms in the first (789.6 TFLOP/s), 1.507-1.575 ms after (698-729; median of
         the seven 1.5326 ms, 717.4 TFLOP/s); fp32 (SIMT) 21.23 ms in every round.
FRYER    huggingface/gpu-fryer: cuBLASLt 8192³ back to back (60 s by default): README at commit 2b6fb06,
         "NVIDIA H100 80GB HBM3 ~730 BF16"; A100-SXM4-80GB ~270 BF16 over three 10-minute runs (PR #9); GB200
         (NVL72, 186 GB) ~1550 BF16 (README since commit f9d564b, PR #20, 2026-01-14).
FINFER   flashinfer-ai/flashinfer pull request #2899 (2026-03-26), "bench: fix GPU power throttling": BF16
         FlashAttention-4 (batch 4, 8192 tokens, 16 heads of 128) on a B200, 100 back-to-back event-timed
         iterations: 1450 TFLOP/s at the peak (iterations 10-19), 1237 throttled (70-79); SM clock 1965 -> ~1580
         MHz, ~1000 W.
FA2      T. Dao, *FlashAttention-2*, arXiv:2307.08691v1, Fig. 5 (forward) and Fig. 6
         (backward), A100-SXM4-80GB, FP16, causal.
FA3      J. Shah et al., *FlashAttention-3*, arXiv:2407.08608v2, Fig. 5, H100-SXM5
         at 700 W and 1830 MHz: FA3 and cuDNN 9.1.1 forward, causal.
FA1      T. Dao et al., *FlashAttention*, arXiv:2205.14135v2, App. E.6 Tables 18-19:
         runtimes of Megatron's standard attention, A100-SXM4-40GB, FP16, batch 16,
         8 heads, head dim 64, no dropout, no mask.
NCCL     nccl-tests bus bandwidth: 8x A100-SXM4: microsoft/superbenchmark
         tests/data/nccl_*.log (all-reduce / all-gather / reduce-scatter, 8 GiB);
         8x H100 ring: NVIDIA GTC'24 S62129 ("NVLink4 H100: 370 GB/s"), H200 ring
         all-gather 361 / reduce-scatter 363 (NCCL 2.27.7); multi-node: "DGX A100 +
         8x200Gb RDMA: 192 GB/s", "DGX H100 + 8x400Gb: 370-380 GB/s" (same slides;
         NVIDIA/nccl#812); small sizes: H100 all-reduce of 8 B in 13.7 µs
         (NVIDIA/dgxc-benchmarking nccl/README.md), A100 all-gather of 1 KiB in
         12.5 µs and all-reduce in ~17 µs (microsoft/mscclpp, NDmv4, NCCL 2.17.1).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import simpy

from simulator.attention import derived_causal_backward
from simulator.bench import bus_factor, collective_time
from simulator.compute import ComputeModel
from simulator.fabric import Fabric
from topologies import build_cluster, get_gpu, single_server
from workloads.flops import layer_ops
from workloads.models import model_from_dict
from workloads.ops import Kernel

A100, H100 = get_gpu("A100"), get_gpu("H100")


def gemm_tflops(gpu, m: int, n: int, k: int) -> float:
    """Simulated TFLOP/s of one 16-bit GEMM, HBM roofline and launch included, as a benchmark times it: in a
    short burst, at the clock a burst sees (``sustained_clock_fraction`` 1; the sustained rate is tested below)."""
    cm = ComputeModel(gpu, sustained_clock_fraction=1.0)
    flops = 2.0 * m * n * k
    return flops / cm.duration(Kernel("gemm", flops, 2.0 * (m * k + k * n + m * n), (m, n, k))) / 1e12


# ------------------------------------------------------------------- GEMMs
LARGE_GEMMS = [  # gpu, m, n, k, measured TFLOP/s, source: each >= 100 GFLOP
    (A100, 1024, 10240, 5120, 271.2, "MAMF"),
    (A100, 8192, 8192, 8192, 258.0, "HE"),
    (H100, 2048, 2048, 13312, 794.5, "MAMF"),
    (H100, 16384, 8192, 1280, 714.5, "SMOL"),
    (H100, 16384, 1024, 8192, 757.7, "SMOL"),
    (H100, 16384, 8192, 7168, 752.9, "SMOL"),
    (H100, 16384, 3584, 8192, 733.0, "SMOL"),
    (H100, 8192, 8192, 8192, 729.4, "SMOL"),
    (H100, 2048, 8192, 8192, 721.6, "TRITON #2339"),
]
MEDIUM_GEMMS = [  # 20-100 GFLOP
    (A100, 2560, 2560, 2560, 244.5, "TRITON #3551"),
    (A100, 3072, 3072, 3072, 229.2, "TRITON #3551"),
    (H100, 2048, 4096, 4096, 613.7, "TRITON #2339"),
    (H100, 2560, 2560, 2560, 533.4, "TRITON #3672"),
    (H100, 3072, 3072, 3072, 584.7, "TRITON #3672"),
]
SMALL_GEMMS = [  # < 20 GFLOP: launch-dominated, Hopper's small-tile effects not modelled
    (A100, 2048, 2048, 2048, 233.0, "TRITON #3551"),
    (H100, 2048, 2048, 2048, 515.2, "TRITON #2339"),
    (A100, 1024, 1024, 1024, 104.9, "TRITON #3551"),
    (H100, 1024, 1024, 1024, 121.1, "TRITON #3672"),
    (H100, 2048, 1024, 1024, 243.1, "TRITON #2339"),
    (H100, 128, 12288, 5376, 352.6, "VLLM"),
    (H100, 64, 12288, 5376, 182.6, "VLLM"),
]


@pytest.mark.parametrize("gpu, m, n, k, measured, source", LARGE_GEMMS)
def test_large_gemms_within_7_percent_of_published_cublas(gpu, m, n, k, measured, source):
    assert gemm_tflops(gpu, m, n, k) == pytest.approx(measured, rel=0.07), source


@pytest.mark.parametrize("gpu, m, n, k, measured, source", MEDIUM_GEMMS)
def test_medium_gemms_within_30_percent(gpu, m, n, k, measured, source):
    assert gemm_tflops(gpu, m, n, k) == pytest.approx(measured, rel=0.30), source


@pytest.mark.parametrize("gpu, m, n, k, measured, source", SMALL_GEMMS)
def test_small_gemms_are_optimistic_by_at_most_2_5x(gpu, m, n, k, measured, source):
    # Documented limit (docs/VALIDATION.md): below ~20 GFLOP the model reaches up to 2.5x the measured rate.
    assert 0.9 * measured <= gemm_tflops(gpu, m, n, k) <= 2.5 * measured, source


def test_best_shape_ceiling_is_the_mamf_measurement():
    # The wave/tile model never exceeds the measured maximum achievable matmul rate of the GPU.
    for gpu in (A100, H100):
        best = max(gemm_tflops(gpu, m, n, k) for m in (2048, 4096, 8192, 16384)
                   for n in (2048, 4096, 8192, 12288) for k in (4096, 8192, 12288))
        assert best <= gpu.matmul_efficiency * gpu.peak("bf16") / 1e12


# ------------------------------------------------- GEMMs at the sustained clock
def sustained_gemm_tflops(gpu, n: int, **knobs) -> float:
    """Simulated TFLOP/s of an ``n``³ 16-bit GEMM in training (the GPU's sustained clock, unless ``knobs``)."""
    cm = ComputeModel(gpu, **knobs)
    flops = 2.0 * n ** 3
    return flops / cm.duration(Kernel("gemm", flops, 6.0 * n * n, (n, n, n))) / 1e12


def test_hopper_sustained_fraction_lies_within_the_long_runs_over_the_burst_model():
    # The long runs (NAPKIN's median of seven rounds, FRYER's 60 s) over the model's burst rate at their shape
    burst = sustained_gemm_tflops(H100, 8192, sustained_clock_fraction=1.0)
    assert 717.4 / burst <= H100.sustained_clock_fraction <= 730 / burst
    # the clock alone costs more (NAPKIN's first round against the same long runs): the burst model is itself
    # under the burst at this shape (758 of 789.6, its wave and fill terms), which the fraction must not repeat
    assert 730 / 789.6 < H100.sustained_clock_fraction
    assert burst == pytest.approx(789.6, rel=0.05)  # (NAPKIN's first round)
    assert get_gpu("H200").sustained_clock_fraction == get_gpu("H800").sustained_clock_fraction == \
        H100.sustained_clock_fraction  # (the same die at the same 700 W)


def test_h100_gemm_in_training_runs_at_the_long_runs_rate():
    assert sustained_gemm_tflops(H100, 8192) == pytest.approx(730, rel=0.025)  # FRYER, 60 s
    assert sustained_gemm_tflops(H100, 8192) == pytest.approx(717.4, rel=0.025)  # NAPKIN, median of 7 rounds


def test_a100_gemm_in_training_runs_at_its_burst_ceiling():
    # FRYER's ten-minute A100 rate is MAMF's burst ceiling (271.2): nothing to take off
    assert A100.sustained_clock_fraction == 1.0
    assert sustained_gemm_tflops(A100, 8192) == pytest.approx(270, rel=0.03)


GB200, B200 = get_gpu("GB200"), get_gpu("B200")
GB200_MAMF, B200_MAMF = 1822.0, 1745.0  # MAMF, BF16 (burst ceilings)


def test_gb200_sustained_fraction_is_the_long_run_over_the_burst_model():
    # FRYER's GB200 run over the model's burst rate at its shape (8192³), as Hopper's fraction is derived
    burst = sustained_gemm_tflops(GB200, 8192, sustained_clock_fraction=1.0)
    assert burst < GB200_MAMF  # (the model's burst is itself under MAMF there: waves and pipeline fill)
    assert GB200.sustained_clock_fraction == pytest.approx(1550 / burst, abs=0.005)
    # not the long run over MAMF (0.851), which would count the model's own shortfall twice
    assert 1550 / GB200_MAMF < GB200.sustained_clock_fraction


def test_gb200_gemm_in_training_runs_at_gpu_fryers_rate():
    assert sustained_gemm_tflops(GB200, 8192) == pytest.approx(1550, rel=0.025)  # FRYER, 60 s


def test_b200_gemm_in_training_loses_the_share_of_its_burst_ceiling_blackwell_loses_sustained():
    # No sustained B200 GEMM is published; FINFER's B200 attention kernel loses 1237 / 1450 = 0.853 of its rate
    # back to back, the share FRYER's GB200 GEMMs lose against MAMF (1550 / 1822 = 0.851), so a B200 GEMM in
    # training runs at that share of B200's burst ceiling (MAMF; the burst at 8192³ is taken to reach it, as the
    # H100's first NAPKIN round, 789.6, reaches its 794.5)
    assert 1550 / GB200_MAMF == pytest.approx(1237 / 1450, rel=0.01)  # (the two published losses agree)
    assert sustained_gemm_tflops(B200, 8192) / B200_MAMF == pytest.approx(1237 / 1450, rel=0.025)
    # not FINFER's clock ratio (0.804): the kernel's throughput fell less than its clock did
    assert B200.sustained_clock_fraction > 1580 / 1965


def test_the_sustained_clock_slows_every_tensor_core_gemm_kind_and_nothing_else():
    slow, burst = (ComputeModel(H100, dtype="fp8", sustained_clock_fraction=f) for f in (0.5, 1.0))
    n = 8192  # compute-bound: the tile time is all SM cycles, halved clock -> twice the time
    for category in ("gemm", "gemm_fp8", "gemm_fp8_wgrad"):
        gemm_s, gemm_b = slow.gemm_model(category), burst.gemm_model(category)
        assert gemm_s.time(n, n, n) == pytest.approx(2 * gemm_b.time(n, n, n), rel=1e-12), category
    # ... a user's ceilings alike (each a burst's too)
    given = dict(dtype="fp8", matmul_efficiency=0.7, fp8_matmul_efficiency=0.6, fp8_wgrad_matmul_efficiency=0.5)
    slow, burst = (ComputeModel(H100, sustained_clock_fraction=f, **given) for f in (0.5, 1.0))
    for category in ("gemm", "gemm_fp8", "gemm_fp8_wgrad"):
        gemm_s, gemm_b = slow.gemm_model(category), burst.gemm_model(category)
        assert gemm_s.time(n, n, n) == pytest.approx(2 * gemm_b.time(n, n, n), rel=1e-12), category
    # ... but not fp32 GEMMs on the SIMT cores (NAPKIN: 51.8 TFLOP/s in every round)
    fp32_slow, fp32_burst = (ComputeModel(H100, dtype="fp32", sustained_clock_fraction=f) for f in (0.5, 1.0))
    assert fp32_slow.gemm.time(n, n, n) == fp32_burst.gemm.time(n, n, n)
    for kernel in (Kernel("attention", 1e12, 1e9, (4096, 4096, 128), 32), Kernel("elementwise", 0.0, 4e9),
                   Kernel("activation", 0.0, 3e9), Kernel("optimizer", 0.0, 8e9)):
        assert slow.duration(kernel) == burst.duration(kernel), kernel.category
    # a GEMM too thin to be compute-bound stays on HBM's roofline
    thin = Kernel("gemm", 2.0 * 8192 * 8192 * 1, 2.0 * (8192 * 1 + 8192 * 8192 + 8192), (8192, 8192, 1))
    slower = ComputeModel(H100, sustained_clock_fraction=0.8)
    assert slower.duration(thin) == burst.duration(thin)


@pytest.mark.parametrize("value", [0, 1.5, -0.9, True, "0.9", float("nan")])
def test_a_bad_sustained_clock_fraction_is_one_clear_error(value):
    with pytest.raises(ValueError, match="compute.sustained_clock_fraction"):
        ComputeModel(H100, sustained_clock_fraction=value)
    with pytest.raises(ValueError, match="GPUSpec.sustained_clock_fraction"):  # (a GPU built in Python)
        ComputeModel(replace(H100, sustained_clock_fraction=value))


# -------------------------------------------------------------- FP8 GEMMs
H200 = get_gpu("H200")


def fp8_gemm_tflops(gpu, m: int, n: int, k: int) -> float:
    """Simulated TFLOP/s of one FP8 GEMM (1-byte operands, bf16 output), HBM roofline and launch included, in a
    short burst (as :func:`gemm_tflops`)."""
    cm = ComputeModel(gpu, dtype="fp8", sustained_clock_fraction=1.0)
    flops = 2.0 * m * n * k
    return flops / cm.duration(Kernel("gemm_fp8", flops, m * k + k * n + 2.0 * m * n, (m, n, k))) / 1e12


@pytest.mark.parametrize("gpu, m, n, k, measured", [(H100, 1024, 9216, 14336, 1402.6),
                                                     (H200, 1280, 4096, 12032, 1453.4)])
def test_large_fp8_gemms_within_7_percent_of_the_mamf_measurement(gpu, m, n, k, measured):
    # Both best shapes have tile counts (288 and 160 of 256x128 on 132 SMs) that a wave-quantised kernel
    # would run in 3 and 2 full waves; the model reaches the measurement only through stream-K (gemm.py).
    assert fp8_gemm_tflops(gpu, m, n, k) == pytest.approx(measured, rel=0.07)


@pytest.mark.parametrize("m, measured", [(128, 581.8), (64, 318.4)])
def test_small_fp8_gemms_are_optimistic_by_at_most_2_5x(m, measured):
    assert 0.9 * measured <= fp8_gemm_tflops(H100, m, 12288, 5376) <= 2.5 * measured  # VLLM, FP8 column


def test_fp8_ceiling_is_the_fp8_mamf_measurement():
    best = max(fp8_gemm_tflops(H100, m, n, k) for m in (2048, 4096, 8192, 16384)
               for n in (2048, 4096, 8192, 12288) for k in (4096, 8192, 12288))
    assert best <= 1402.6 * 1.001


def test_fp8_speedup_on_large_gemms_is_the_ratio_of_the_two_mamf_measurements():
    # MAMF: 1402.6 (FP8) over 794.5 (BF16) TFLOP/s on H100 SXM.
    for m, n, k in ((8192, 8192, 8192), (16384, 8192, 7168), (4096, 12288, 12288)):
        assert fp8_gemm_tflops(H100, m, n, k) / gemm_tflops(H100, m, n, k) == pytest.approx(1402.6 / 794.5,
                                                                                           rel=0.05)


# F8EXP: (name, M, K, N, seconds of (BF16, FP8) in PR #38, the same in PR #100)
F8EXP_LLAMA2_70B = [("attn.wqkv", 16384, 8192, 1280, (6.04e-4, 2.43e-4), (6.22e-4, 2.44e-4)),
                    ("attn.w0", 16384, 1024, 8192, (5.00e-4, 2.51e-4), (4.99e-4, 2.57e-4)),
                    ("ffn.w13", 16384, 8192, 7168, (3.57e-3, 1.39e-3), (3.445e-3, 1.470e-3)),
                    ("ffn.w2", 16384, 3584, 8192, (1.59e-3, 7.45e-4), (1.628e-3, 7.00e-4))]


@pytest.mark.parametrize("name, m, k, n, first, second", F8EXP_LLAMA2_70B)
def test_fp8_gemms_at_training_shapes_against_cublaslt_measurements(name, m, k, n, first, second):
    # FP8 (cuBLASLt) at four training shapes, 1070-1414 TFLOP/s: each run within 7% (the model reads 1104-1357).
    # Their BF16 column (539-605 TFLOP/s) is not a reference: the same library's BF16 kernels of mid-2023 ran
    # 17-28% under the 2024 stack's measurements at shapes of this size (SMOL's 714-758), so its FP8/BF16 ratios
    # (1.94-2.57) measure that library's BF16, not the hardware (docs/DESIGN.md, "FP8 over BF16").
    flops = 2.0 * m * n * k
    for _bf16_s, fp8_s in (first, second):
        assert fp8_gemm_tflops(H100, m, n, k) == pytest.approx(flops / fp8_s / 1e12, rel=0.07), name


# TRITON #3672 (2024-04-16): the cuBLAS column of Triton's matmul tutorial on an H100, torch.matmul FP16, every
# size from 2048^3 to 3072^3 in steps of 128 (TFLOP/s): a saw-tooth, partial last waves included.
TRITON_3672_SWEEP = [(2048, 511.3), (2176, 466.3), (2304, 521.4), (2432, 518.5), (2560, 533.4), (2688, 433.4),
                     (2816, 616.5), (2944, 573.9), (3072, 584.7)]


def test_16_bit_gemms_keep_wave_quantisation_as_a_published_cublas_sweep_shows():
    """Why the 16-bit model has no stream-K schedule while FP8's has (simulator/gemm.py): over this sweep the
    wave model reads 3.8% fast on (geometric) average; with stream-K it would read 31% fast, every size 18-59%
    (its partial last waves cost cuBLAS what the wave model charges). So BF16 keeps its partial waves, and an
    FP8/BF16 ratio above the peaks' 2 where BF16's last wave is partial (4096x1280x8192: 2.7) is the two
    measured schedules, not a disagreement of one kernel's mechanics (docs/DESIGN.md, "FP8 over BF16")."""
    import math
    wave = [gemm_tflops(H100, n, n, n) / measured for n, measured in TRITON_3672_SWEEP]
    assert math.exp(sum(map(math.log, wave)) / len(wave)) == pytest.approx(1.0, abs=0.10)
    streamed = ComputeModel(H100, sustained_clock_fraction=1.0)
    streamed.__dict__["gemm"] = replace(streamed.gemm, stream_k=True)  # (the counterfactual 16-bit schedule)
    fast = []
    for n, measured in TRITON_3672_SWEEP:
        flops = 2.0 * n ** 3
        seconds = streamed.duration(Kernel("gemm", flops, 6.0 * n * n, (n, n, n)))
        fast.append(flops / seconds / 1e12 / measured)
    assert min(fast) > 1.15 and math.exp(sum(map(math.log, fast)) / len(fast)) > 1.2


def test_fp8_training_runs_attention_and_other_gemms_at_the_bf16_rate():
    fp8, bf16 = ComputeModel(H100, dtype="fp8"), ComputeModel(H100)
    attn = Kernel("attention", 1e12, 1e9, (4096, 4096, 128), 32)
    gemm = Kernel("gemm", 2.0 * 4096**3, 6.0 * 4096**2, (4096, 4096, 4096))
    for k in (attn, gemm):
        assert fp8.duration(k) == bf16.duration(k)
    assert fp8.peak_flops == H100.peak("bf16")


# DEEPGEMM: (groups, M, N, K per group, TFLOP/s); a k-grouped kernel is one weight gradient per expert, timed as the
# generator emits the local experts' (one GEMM over their tokens together)
BLOCKWISE_WGRADS = [(1, 7168, 2112, 4096, 920), (1, 1536, 24576, 4096, 986), (1, 512, 32768, 4096, 878),
                    (1, 16384, 7168, 4096, 994), (1, 7168, 4096, 4096, 942), (1, 2048, 7168, 4096, 920),
                    (1, 7168, 2112, 8192, 1052), (1, 1536, 24576, 8192, 1092), (1, 512, 32768, 8192, 1014),
                    (4, 7168, 4096, 4096, 939), (4, 2048, 7168, 4096, 900), (4, 7168, 4096, 8192, 1044),
                    (4, 2048, 7168, 8192, 1033), (8, 7168, 4096, 4096, 942)]


def blockwise_wgrad_tflops(m: int, n: int, k: int, category: str = "gemm_fp8_wgrad") -> float:
    """Simulated TFLOP/s of a blockwise-FP8 weight gradient on an H800 (1-byte operands, fp32 output), in a short
    burst as DeepGEMM's benchmark times it (``bench_kineto``: a few tens of calls, L2 flushed between them)."""
    cm = ComputeModel(get_gpu("H800-SXM"), dtype="fp8", sustained_clock_fraction=1.0)
    flops = 2.0 * m * n * k
    return flops / cm.duration(Kernel(category, flops, m * k + k * n + 4.0 * m * n, (m, n, k))) / 1e12


def test_blockwise_fp8_weight_gradients_against_deepgemms_kernels():
    # Per row within 20% (the k-grouped K = 4096 rows are the most optimistic: +14-18%, the local experts
    # folded into one GEMM), over the table within 10%; at the per-tensor FP8 ceiling they read 1.23-1.52x.
    ratios = [blockwise_wgrad_tflops(m, n, g * k) / measured for g, m, n, k, measured in BLOCKWISE_WGRADS]
    assert all(0.9 <= r <= 1.2 for r in ratios), ratios
    assert sum(ratios) / len(ratios) == pytest.approx(1.0, abs=0.1)
    per_tensor = [blockwise_wgrad_tflops(m, n, g * k, "gemm_fp8") / measured
                  for g, m, n, k, measured in BLOCKWISE_WGRADS]
    assert min(per_tensor) > 1.2  # (the miss this measurement mends)


def test_fp8_on_a_gpu_without_fp8_is_one_clear_error():
    with pytest.raises(ValueError, match="fp8"):
        ComputeModel(A100, dtype="fp8")
    no_measurement = replace(H100, matmul_efficiency_fp8=None)
    with pytest.raises(ValueError, match="compute.fp8_matmul_efficiency"):
        ComputeModel(no_measurement, dtype="fp8")
    given = ComputeModel(no_measurement, dtype="fp8", fp8_matmul_efficiency=0.7, sustained_clock_fraction=1.0)
    assert given.fp8_gemm.efficiency == 0.7


def test_batched_gemm_is_timed_per_problem_not_folded():
    # 12 heads of Q Kᵀ (2048 x 2048 x 128) in one batched GEMM: about 12 times one head's GEMM (the heads
    # share the waves), and the kernel keeps its batch through the backward.
    cm = ComputeModel(A100)
    heads, s, d = 12, 2048, 128
    assert cm.gemm.time(s, s, d, heads) == pytest.approx(heads * cm.gemm.time(s, s, d), rel=0.15)
    model = model_from_dict({"name": "m", "layers": 1, "hidden": heads * d, "heads": heads, "kv_heads": heads,
                             "ffn_hidden": 4 * heads * d, "vocab": 128, "gated_mlp": False,
                             "tied_embeddings": False})
    ops = layer_ops(model, 1, s, 1, flash_attention=False)
    for o in ops.backward:
        if o.name.startswith(("attention_scores", "attention_values")):
            assert o.batch == heads and max(o.shape) == s and min(o.shape) == d


# ---------------------------------------------------------------- attention
def _bench_model(head_dim: int):
    """The FlashAttention benchmarks' shape: hidden 2048, 2048 / head_dim heads (16K tokens per batch)."""
    heads = 2048 // head_dim
    return model_from_dict({"name": "bench", "layers": 1, "hidden": 2048, "heads": heads, "kv_heads": heads,
                            "ffn_hidden": 8192, "vocab": 128, "gated_mlp": False, "tied_embeddings": False})


FLASH_CAUSAL = [  # gpu, kernel, head dim, seq, forward TFLOP/s, backward TFLOP/s or None (causal, FA convention)
    (A100, "fa2", 64, 2048, 167, 131),        # FA2 Fig. 5(c), 6(c)
    (A100, "fa2", 128, 2048, 187, 145),       # FA2 Fig. 5(d), 6(d)
    (A100, "fa2", 128, 8192, 200, 176),
    (H100, "fa3", 128, 2048, 521, None),      # FA3 Fig. 5(d)
    (H100, "fa3", 128, 16384, 616, None),
    (H100, "cudnn", 128, 4096, 518, None),    # FA3 Fig. 5(d), cuDNN 9.1.1
    (H100, "cudnn", 64, 8192, 379, None),     # FA3 Fig. 5(b)
]


@pytest.mark.parametrize("gpu, kernel, hd, s, fwd, bwd", FLASH_CAUSAL)
def test_flash_attention_kernels_take_the_published_time(gpu, kernel, hd, s, fwd, bwd):
    """A causal kernel on the benchmark shape takes (FA-convention FLOPs) / (published TFLOP/s).

    FA convention: forward 4·b·h·s²·d / 2 (causal), backward 2.5x that. The generator's kernels must
    carry exactly those executed FLOPs for the published rates to mean what they say.
    """
    cm = ComputeModel(gpu, attention_kernel=kernel)
    b, heads = 16384 // s, 2048 // hd
    ops = layer_ops(_bench_model(hd), b, s, 1)
    f_fwd = 4.0 * b * heads * s * s * hd / 2
    attn = next(o for o in ops.forward if o.category == "attention").kernel()
    attn_bwd = next(o for o in ops.backward if o.category == "attention_bwd").kernel()
    assert attn.flops == pytest.approx(f_fwd) and attn_bwd.flops == pytest.approx(2.5 * f_fwd)
    assert cm.duration(attn) - cm.op_overhead_s == pytest.approx(f_fwd / (fwd * 1e12), rel=1e-9)
    if bwd is not None:
        assert cm.duration(attn_bwd) - cm.op_overhead_s == pytest.approx(2.5 * f_fwd / (bwd * 1e12), rel=1e-9)


def test_derived_causal_backward_rule_checked_where_both_are_published():
    # FA2 on A100 publishes causal and non-causal, forward and backward (Fig. 5, 6): deriving the causal
    # backward from the non-causal one by the forward's ratio lands within 8% of the measurement.
    fwd_c = {64: (115, 146, 167, 177, 181, 183), 128: (132, 168, 187, 198, 200, 197)}
    fwd_n = {64: (178, 191, 193, 192, 192, 192), 128: (209, 224, 227, 222, 224, 223)}
    bwd_n = {64: (120, 141, 152, 163, 169, 170), 128: (136, 159, 175, 187, 193, 196)}
    bwd_c = {64: (81, 111, 131, 149, 160, 166), 128: (90, 122, 145, 165, 176, 186)}
    for hd in (64, 128):
        for i in range(6):
            derived = derived_causal_backward(fwd_c[hd][i], fwd_n[hd][i], bwd_n[hd][i])
            assert derived == pytest.approx(bwd_c[hd][i], rel=0.08)


def test_unfused_attention_against_megatron_baseline_fa1():
    """Megatron's standard attention (FA1 Tables 18-19; A100-40GB, B 16, h 8, d 64, no dropout, no mask).

    Measured: forward 0.42 / 1.33 / 4.28 ms and backward 0.80 / 2.59 / 8.86 ms at 512 / 1K / 2K tokens.
    The score kernels' HBM efficiency (0.65) comes from the 2K forward, so that point agrees by
    construction (within 5%); the backward at 2K (within 20%) and the shorter lengths are the checks.
    The model stays optimistic below 2K (launch and tail effects of short rows are not modelled).
    """
    a100_40 = replace(A100, name="A100-40GB-SXM", hbm_bandwidth=1555e9, hbm_bytes=40e9)  # datasheet
    cm = ComputeModel(a100_40)
    b, h, d = 16, 8, 64
    model = model_from_dict({"name": "fa1", "layers": 1, "hidden": h * d, "heads": h, "kv_heads": h,
                             "ffn_hidden": 4 * h * d, "vocab": 128, "gated_mlp": False, "tied_embeddings": False})
    core = ("attention_scores", "attention_softmax", "attention_values")  # no dropout in the benchmark
    measured = {512: (0.42e-3, 0.80e-3), 1024: (1.33e-3, 2.59e-3), 2048: (4.28e-3, 8.86e-3)}
    for s, (fwd_ms, bwd_ms) in measured.items():
        ops = layer_ops(model, b, s, 1, flash_attention=False)
        fwd = sum(cm.duration(o.kernel()) for o in ops.forward if o.name in core)
        bwd = sum(cm.duration(o.kernel()) for o in ops.backward if o.name.split(".")[0] in core)
        if s == 2048:
            assert fwd == pytest.approx(fwd_ms, rel=0.05)
            assert bwd == pytest.approx(bwd_ms, rel=0.20)
        else:
            assert 0.6 * fwd_ms <= fwd <= 1.05 * fwd_ms and 0.55 * bwd_ms <= bwd <= 1.05 * bwd_ms


# ------------------------------------------------------------- collectives
def _busbw(cluster, op, n, size, algorithm="auto"):
    t = collective_time(cluster, op, n, size, algorithm)
    return size / t * bus_factor(op, n) / 1e9


@pytest.mark.parametrize("op, measured", [("all_reduce", 235.3), ("all_gather", 223.4), ("reduce_scatter", 231.5),
                                          ("all_to_all", 224.3)])
def test_nccl_busbw_on_one_a100_node(op, measured):
    node = single_server("A100", 8)
    assert _busbw(node, op, 8, 2**33) == pytest.approx(measured, rel=0.05)


@pytest.mark.parametrize("op, measured", [("all_reduce", 370.0), ("all_gather", 361.4), ("reduce_scatter", 362.9)])
def test_nccl_ring_busbw_on_one_h100_node(op, measured):
    node = single_server("H100", 8)
    assert _busbw(node, op, 8, 2**33, "ring") == pytest.approx(measured, rel=0.05)


@pytest.mark.parametrize("preset, low, high", [("dgx-a100", 192.0, 192.0), ("dgx-h100", 370.0, 380.0)])
@pytest.mark.parametrize("nodes", [4, 16])
def test_nccl_multi_node_ring_all_reduce_busbw(preset, low, high, nodes):
    # Within 5% of the published figure (DGX H100: a range). Under PXN (NCCL's default) a ring closes through
    # the NIC it entered a server by, so each GPU's NVLink carries every channel, as on one node: on DGX H100
    # the NVLink rate measured on one node (0.81 of 450 GB/s) binds before the eight NICs (0.95 of 8 x 50).
    c = build_cluster({"preset": preset, "nodes": nodes})
    assert 0.95 * low <= _busbw(c, "all_reduce", 8 * nodes, 2**33, "ring") <= 1.05 * high


@pytest.mark.parametrize("preset", ["dgx-a100", "dgx-h100"])
def test_a_multi_node_ring_is_never_faster_than_the_ring_on_one_node(preset):
    # NCCL's search (src/graph/search.cc) asks rings, unlike other patterns, to close through their starting
    # NIC, which puts every channel on every GPU's NVLink: a ring over servers moves no more per GPU than the
    # NVLink ring of one server.
    one = _busbw(build_cluster({"preset": preset, "nodes": 1}), "all_reduce", 8, 2**33, "ring")
    assert _busbw(build_cluster({"preset": preset, "nodes": 4}), "all_reduce", 32, 2**33, "ring") <= one


def test_nccl_busbw_at_mid_sizes_on_one_a100_node():
    # superbenchmark log (8x A100, one process driving 8 GPUs): all-reduce 200.9 GB/s at 64 MiB and 230.3 at
    # 1 GiB. At 64 MiB NCCL's latency and protocol terms already matter: within 10%.
    node = single_server("A100", 8)
    assert _busbw(node, "all_reduce", 8, 64 * 2**20) == pytest.approx(200.9, rel=0.10)
    assert _busbw(node, "all_reduce", 8, 2**30) == pytest.approx(230.3, rel=0.05)


# microsoft/superbenchmark tests/data/nccl_allreduce.log (8x A100-SXM4-40GB, one process driving all 8 GPUs:
# "nThread 1 nGpus 8"), out-of-place busbw GB/s.
SUPERBENCH_ALL_REDUCE = [(4 * 2**20, 65.52), (8 * 2**20, 90.63), (16 * 2**20, 129.90), (32 * 2**20, 156.89),
                         (64 * 2**20, 200.91), (128 * 2**20, 202.11), (256 * 2**20, 222.40)]


@pytest.mark.parametrize("size, measured", SUPERBENCH_ALL_REDUCE)
def test_one_node_a100_all_reduce_medium_size_miss_is_pinned(size, measured):
    """Pinned, not hidden: the model reads this log 1.2-1.5x fast at 4-32 MiB and within 10% from 64 MiB. NCCL's
    per-channel caps do not explain it (they feed only NCCL's tuner, and NCCL's own model of this node predicts
    what ours does, within 4%); the log's single-process harness (0-byte rows 33-35 us a call, no kernel launched)
    is a suspect it does not prove, since nccl-tests queues its iterations and a host cost per call then overlaps
    the kernels (docs/DESIGN.md, "Twenty-fourth session")."""
    node = single_server("A100", 8)
    ratio = size / collective_time(node, "all_reduce", 8, size) * bus_factor("all_reduce", 8) / 1e9 / measured
    if size <= 32 * 2**20:
        assert 1.1 <= ratio <= 1.6
    else:
        assert ratio == pytest.approx(1.0, abs=0.1)


# Azure/msccl docs/performance-nd-h100-v5.md (ND H100 v5: 8x H100 SXM, one process per GPU, NCCL 2.18.3,
# NCCL_MIN_NCHANNELS=32, fp16, in-place): NCCL all-gather time in us by output size (NCCL's all-gather is a ring
# on one node there; its all-reduce is NVLink SHARP, not modelled, so only the all-gather is compared). The same
# figures appear in the repository's NDmv4 (A100) page; they are H100's: 1 GiB in 2663.8 us is 352 GB/s of bus
# bandwidth, more than an A100's NVLink carries.
MSCCL_H100_ALL_GATHER_US = [(8 * 2**20, 44.7), (16 * 2**20, 67.19), (32 * 2**20, 104.7), (64 * 2**20, 192.4),
                            (128 * 2**20, 368.3), (256 * 2**20, 699.5), (2**30, 2663.8)]


@pytest.mark.parametrize("size, measured_us", MSCCL_H100_ALL_GATHER_US)
def test_one_node_h100_all_gather_at_medium_sizes_one_process_per_gpu(size, measured_us):
    """Measured one process per GPU, the medium sizes need no correction: within 12% from 8 MiB to 1 GiB (8 MiB:
    the model 10% slow; the run forced 32 channels)."""
    node = single_server("H100", 8)
    assert collective_time(node, "all_gather", 8, size) * 1e6 == pytest.approx(measured_us, rel=0.12)


@pytest.mark.parametrize("op, measured", [("all_gather", 186.0), ("all_reduce", 188.2)])
def test_nccl_busbw_across_two_a100_nodes(op, measured):
    # mscclpp NDmv4 tables, 2 x 8 A100, 4 GiB
    c = build_cluster({"preset": "dgx-a100", "nodes": 2})
    assert _busbw(c, op, 16, 2**32) == pytest.approx(measured, rel=0.05)


# nccl-tests all_reduce_perf, float, 2 x Azure ND96amsr_A100_v4 (8x A100-SXM4-80GB, 8x HDR 200 Gb/s each, as
# dgx-a100), nvcr.io/nvidia/pytorch:23.03 (NCCL 2.17): J. Zhang, "NCCL test on AKS NDmV4 VM",
# github.com/JingchaoZhang/JingchaoZhang.github.io, _posts/2023-09-11-NCCL test on AKS NDmV4 VM.md (commit
# 4d2258f), out-of-place bus bandwidth, GB/s.
NDMV4_TWO_NODE_ALL_REDUCE = [(4 * 2**20, 53.11), (8 * 2**20, 74.51), (16 * 2**20, 94.35), (32 * 2**20, 102.21),
                             (64 * 2**20, 134.92), (128 * 2**20, 150.45), (256 * 2**20, 167.02),
                             (2**30, 181.98), (2**33, 189.20)]


@pytest.mark.parametrize("size, measured", NDMV4_TWO_NODE_ALL_REDUCE)
def test_two_node_all_reduce_at_every_size_against_nccl_tests(size, measured):
    """From 256 MiB within 7%. Below, NCCL's own corrections of its tuner's model (a tree all-reduce's bandwidth
    at medium sizes, a multi-node ring's latency plateau: simulator.nccl) bring 16 MiB from 1.75x the measured
    bus bandwidth to 1.29x; what stays optimistic (up to 1.64x at 4-32 MiB, where NCCL runs LL128 and trees) is
    documented (simulator.nccl, docs/VALIDATION.md "Component checks"), and pinned here in its direction and
    size."""
    c = build_cluster({"preset": "dgx-a100", "nodes": 2})
    ratio = _busbw(c, "all_reduce", 16, size) / measured
    if size >= 256 * 2**20:
        assert ratio == pytest.approx(1.0, rel=0.07)
    else:
        assert 1.0 <= ratio <= 1.7


def test_nccls_tree_correction_and_ring_plateau_as_its_tuner_reads_them():
    from simulator.nccl import ring_plateau, tree_correction
    # treeCorrectionFactor[protocol][log2(bytes >> 6)]: 16 MiB is entry 18, 1 MiB entry 14, 64 B entry 0
    assert tree_correction("Simple", 16 * 2**20) == 0.7
    assert tree_correction("LL128", 2**20) == 0.6 and tree_correction("LL", 2**20) == 0.5
    assert tree_correction("Simple", 64) == 0.9 and tree_correction("LL", 63) == 1.0   # (log2i(0) = -1: none)
    assert tree_correction("Simple", 2**30) == 1.0                                       # past the table
    # the plateau from 64 bytes per channel and rank (32 channels assumed): 16 ranks from 32 KiB
    assert ring_plateau(32 * 1024, 16) == 1.4 and ring_plateau(32 * 1024 - 1, 16) == 1.0


def test_a_tree_all_reduce_slowed_by_its_correction_moves_its_own_bytes(monkeypatch):
    """The correction is paid as time, not as bytes: the links carry what the tree sends, as before; the
    simulated time is the estimate, whose bandwidth term is the uncorrected one over the correction."""
    import simulator.fabric as fabric_module
    from simulator.engine import Engine
    from simulator.nccl import tree_correction
    from workloads.ops import OpGraph
    c = build_cluster({"preset": "dgx-a100", "nodes": 2})
    graph = OpGraph(16)
    graph.collective("all_reduce", list(range(16)), 16 * 2**20, algorithm="tree", traffic_class="bench")
    record = Engine(graph, c).run()
    ledger = record.fabric.network.ledger
    nics = [i for i, (u, v) in enumerate(record.fabric.links)
            if c.graph.nodes[u]["kind"] == "nic" and c.graph.nodes[v]["kind"] == "leaf"]
    # NCCL's double binary tree over two nodes: each tree reduces its half of the buffer into one node and
    # broadcasts it back, so S crosses between the nodes each way, at the protocol's wire format
    from simulator.nccl import BANDWIDTH_FACTOR
    plan, protocol = record.fabric.choose("all_reduce", tuple(range(16)), 16.0 * 2**20, "tree")
    assert sum(ledger.bytes[i] for i in nics) == pytest.approx(2 * 16 * 2**20 / BANDWIDTH_FACTOR[protocol], rel=1e-9)
    estimate = record.fabric.estimate(plan, protocol)
    assert record.step_time_s == pytest.approx(estimate, rel=1e-9)
    latency = record.fabric._both_estimates(plan, (protocol,))[1][0]
    correction = tree_correction(protocol, 16 * 2**20)
    assert correction < 1.0
    monkeypatch.setattr(fabric_module, "tree_correction", lambda protocol, nbytes: 1.0)
    plain = Fabric(simpy.Environment(), c).estimate(plan, protocol)
    assert estimate - latency == pytest.approx((plain - latency) / correction, rel=1e-9)


# Megatron-Core's fused vocab-parallel cross-entropy (cross_entropy_loss_fusion) on an H100 SXM, bf16 logits of
# 2048 x 4 tokens: linkedin/Liger-Kernel benchmark/data/all_benchmark_data_megatron.csv (commit 7097ab9),
# provider "megatron", medians in ms: (vocabulary, forward, forward + backward).
LIGER_MEGATRON_CROSS_ENTROPY = [(4096, 0.3127, 0.6057), (8192, 0.6374, 1.1875), (16384, 1.3829, 2.4350),
                                (32768, 2.8294, 4.9707), (65536, 5.8157, 10.0771), (131072, 11.8043, 20.0209)]


@pytest.mark.parametrize("vocab, forward_ms, full_ms", LIGER_MEGATRON_CROSS_ENTROPY)
def test_megatron_cross_entropy_against_its_kernels_measured(vocab, forward_ms, full_ms):
    """workloads.flops.CROSS_ENTROPY_BYTES is read off the 131,072 row; the other rows check that the loss
    scales as its logits do: forward and backward together within 7% at every vocabulary (the forward alone within
    20%: its share is 0.51-0.59 of the whole across the table). It was 2.55-2.65x fast."""
    from workloads.flops import logits_ops
    cm = ComputeModel(H100)
    ops = logits_ops(model_from_dict({"preset": "llama3-8b", "vocab": vocab}), 4, 2048, 1, vocab=vocab)
    forward = next(o for o in ops.forward if o.name == "cross_entropy")
    backward = next(o for o in ops.backward if o.name == "cross_entropy.bwd")
    fwd, bwd = (cm.duration(Kernel(o.name, o.flops, o.nbytes)) * 1e3 for o in (forward, backward))
    assert fwd == pytest.approx(forward_ms, rel=0.20)
    assert fwd + bwd == pytest.approx(full_ms, rel=0.07)


# Megatron-Core's fused SwiGLU (bias_swiglu_impl, no bias) forward on an H100 SXM, bf16 [2048 x 4 tokens,
# 2 x ffn_local]: linkedin/Liger-Kernel benchmark/data/all_benchmark_data.csv (commit 2120862), rows
# megatron_swiglu, provider megatron, medians in ms.
LIGER_MEGATRON_SWIGLU = [(4096, 0.11370), (8192, 0.22016), (16384, 0.43286), (32768, 0.85850)]


@pytest.mark.parametrize("ffn, forward_ms", LIGER_MEGATRON_SWIGLU)
def test_megatron_swiglu_forward_against_its_kernel_measured(ffn, forward_ms):
    """An MLP's activation streams at ComputeModel.activation_memory_efficiency (0.56 of HBM, read off these rows),
    not a STREAM copy's 0.85 (1.52-1.59x fast): within 5% at every width."""
    from workloads.flops import _mlp_forward
    model = model_from_dict({"preset": "llama3-8b"})
    act = next(o for o in _mlp_forward("mlp", model, 8192, ffn, 2) if o.name == "mlp_activation")
    assert act.nbytes == 8192 * ffn * 3 * 2                       # reads gate and up, writes one, bf16
    seconds = ComputeModel(H100).duration(Kernel(act.category, act.flops, act.nbytes))
    assert seconds * 1e3 == pytest.approx(forward_ms, rel=0.05)


ALL_TO_ALL_TOLERANCE = 0.06
"""Each published cross-node all-to-all point against the model, relative: the points themselves spread 0.81-0.90
of the NIC's line rate, and the one efficiency (0.85, ``simulator.nccl.ALL_TO_ALL_NET_EFFICIENCY``) sits within
6% of each."""


@pytest.mark.parametrize("nic, measured, source", [
    # Azure NDmv4 (2 x 8 A100, 8x HDR 200 Gb/s a node), NCCL 2.17.1, alltoall_perf 4 GiB: 37.81 GB/s bus bandwidth
    # (microsoft/mscclpp docs/performance-ndmv4.md; 37.80 at 1 GiB). Model 2 x 0.85 x 25 x 15/16 = 39.8 (+5.4%);
    # at the rings' 0.95 it read 44.5 (+17.7%).
    ("200Gbps", 37.81, "mscclpp NDmv4"),
    # 2 x 8 A100 with 4x 200 Gb/s NICs a node (100 Gb/s a GPU), NCCL 2.18.6, alltoall_perf 4 GiB: 19.83 GB/s bus
    # bandwidth (NVIDIA/nccl issue 1138). Model 2 x 0.85 x 12.5 x 15/16 = 19.9 (+0.5%; at 0.95: 22.3, +12.3%).
    ("100Gbps", 19.83, "NVIDIA/nccl#1138"),
])
def test_nccl_all_to_all_across_two_nodes(nic, measured, source):
    # Every GPU's NIC carries half its buffer (8 of its 16 peers are on the other node): busbw = 2 x the NIC's
    # achieved rate x 15/16, which NCCL's grouped send/recv holds at 0.81-0.85 of the line rate.
    c = build_cluster({"preset": "dgx-a100", "nodes": 2, "nic_bandwidth": nic})
    assert _busbw(c, "all_to_all", 16, 2**32) == pytest.approx(measured, rel=ALL_TO_ALL_TOLERANCE), source


@pytest.mark.parametrize("nodes, wire_gbs, source", [
    # DeepEP's normal kernels on H800 (SM90), one CX7 400 Gb/s NIC a GPU, DeepSeek-V3's setting (deepseek-ai/DeepEP).
    # Its "RDMA bandwidth" counts a token once per destination node, the sender's own node included
    # (tests/test_internode.py: num_rdma_token_sent; README: "contains local rank traffic"), so the bytes on the
    # wire are that times the share of a token's nodes that are other nodes: with DeepEP's test routing (random
    # scores, top-8 of 256 experts in top-min(nodes, 4) node groups) a token reaches ~2.0 of 2 nodes (1/2 its
    # own), ~3.6 of 4 (1/4 own), ~3.6 of the 4 it picks of 8 (1/8 own).
    (2, 90 / 2, "README.md V2, EP 8x2 dispatch 90 GB/s"),
    (2, 81 / 2, "README.md V2, EP 8x2 combine 81 GB/s"),
    (4, 58 * 3 / 4, "docs/legacy.md V1, EP32 dispatch 58 GB/s"),
    (4, 57 * 3 / 4, "docs/legacy.md V1, EP32 combine 57 GB/s"),
    (8, 51 * 7 / 8, "docs/legacy.md V1, EP64 dispatch 51 GB/s"),
    (8, 50 * 7 / 8, "docs/legacy.md V1, EP64 combine 50 GB/s"),
])
def test_deepep_rdma_hop_against_deepep_published_bandwidth(nodes, wire_gbs, source):
    """DeepEP's network hop: every GPU sends to the GPU of its own local index on each other node (its rail),
    as an alltoallv. The model's rate per NIC is 0.85 x 50 = 42.5 GB/s (-5.6% to +4.9% of the points;
    at the rings' 0.95, 47.5: +17% against the V2 combine)."""
    from simulator.engine import Engine
    from workloads.ops import OpGraph
    n, size = 8 * nodes, 256 * 2**20  # bytes each GPU sends to each other node
    matrix = [[size if j % 8 == i % 8 and j != i else 0 for j in range(n)] for i in range(n)]
    g = OpGraph(n)
    for i in range(n):
        g.collective_op(i, "all_to_all", list(range(n)), 0, split=tuple(matrix[i]), traffic_class="ep")
    t = Engine(g, build_cluster({"preset": "dgx-h800", "nodes": nodes})).run().step_time_s
    assert (nodes - 1) * size / t / 1e9 == pytest.approx(wire_gbs, rel=ALL_TO_ALL_TOLERANCE), source


def test_pipeline_sends_across_nodes_keep_the_nic_efficiency():
    # One peer alone reaches the NIC: nccl-tests sendrecv_perf between GH200 nodes reads 24.2 GB/s per 25 GB/s
    # Slingshot NIC (NVIDIA/nccl issue 1272, 0.97; 0.95 here), so NCCL send/recv outside an all-to-all (pipeline
    # sends) keeps the rings' NIC efficiency: 2 x 8 A100 at 25 GB/s a GPU, every rank to the next.
    c = build_cluster({"preset": "dgx-a100", "nodes": 2})
    assert _busbw(c, "sendrecv", 16, 2**32) == pytest.approx(0.95 * 25, rel=0.01)


def test_nccl_small_messages_are_latency_bound_at_the_measured_floor():
    h100, a100 = single_server("H100", 8), single_server("A100", 8)
    assert collective_time(h100, "all_reduce", 8, 8) == pytest.approx(13.7e-6, rel=0.25)
    assert collective_time(a100, "all_gather", 8, 1024) == pytest.approx(12.5e-6, rel=0.25)
    assert collective_time(a100, "all_reduce", 8, 1024) == pytest.approx(17e-6, rel=0.25)
    # 2 nodes x 8 A100 (mscclpp NDmv4 tables, NCCL 2.17.1): all-gather 33.7 us, all-reduce 35.9 us at 1 KiB
    two = build_cluster({"preset": "dgx-a100", "nodes": 2})
    assert collective_time(two, "all_gather", 16, 1024) == pytest.approx(33.7e-6, rel=0.15)
    assert collective_time(two, "all_reduce", 16, 1024) == pytest.approx(35.9e-6, rel=0.15)
    # ... and all-to-all 49.75 us, more than either: its 8 messages to the other node go over Simple (NCCL has no
    # LL buffers for network send/recv) and are posted one after another; 1 remote peer (2 x 1): 29.84 us; its
    # 7 NVLink peers alone (1 x 8) run at once: 9.34 us. Within 25% each (model: 46.2, 22.4, 7.2 us; the 2 x 1
    # case sits at -24.9%, the edge of the tolerance: NCCL's per-message costs beyond its tuner's are not modelled).
    a2a = collective_time(two, "all_to_all", 16, 1024)
    assert a2a == pytest.approx(49.75e-6, rel=0.10) and a2a > collective_time(two, "all_gather", 16, 1024)
    pair = build_cluster({"preset": "dgx-a100", "nodes": 2, "gpus_per_node": 1})
    assert collective_time(pair, "all_to_all", 2, 1024) == pytest.approx(29.84e-6, rel=0.25)
    assert collective_time(a100, "all_to_all", 8, 1024) == pytest.approx(9.34e-6, rel=0.25)


def test_nccl_picks_the_low_latency_protocol_for_small_and_simple_for_large():
    fabric = Fabric(simpy.Environment(), single_server("H100", 8))
    group = tuple(range(8))
    assert fabric.choose("all_reduce", group, 1024.0)[1] == "LL"
    assert fabric.choose("all_reduce", group, 2.0**30)[1] == "Simple"


# ------------------------------------------------------------- one layer
KORTHIKANTI_TABLE_4 = [  # sequence_parallel, recompute, forward ms, backward ms (22B layer, 8x A100, TP 8)
    (False, "none", 7.7, 11.9),
    (True, "none", 7.2, 11.8),
    (False, "full", 7.7, 19.5),
    (False, "selective", 7.7, 13.2),
    (True, "selective", 7.2, 13.1),
]


@pytest.mark.parametrize("sp, recompute, fwd_ms, bwd_ms", KORTHIKANTI_TABLE_4)
def test_one_megatron_layer_against_korthikanti_table_4(sp, recompute, fwd_ms, bwd_ms):
    """One transformer layer of the 22B model, kernels and TP collectives together (Korthikanti et al.
    2022, arXiv:2205.05198, Table 4: h 6144, 64 heads, seq 2048, micro-batch 4, TP 8 on one DGX A100).

    The composed layer lands within 6% of the measurement in every configuration (0.7-4.4% faster:
    docs/VALIDATION.md, "Error budget"), so the measured effects of SP and recomputation come out with
    the right sign and size.
    """
    from simulator.experiment import experiment_from_dict, run_experiment
    doc = {"cluster": {"preset": "dgx-a100", "nodes": 1},
           "model": {"preset": "gpt3-175b", "layers": 2, "hidden": 6144, "heads": 64, "kv_heads": 64,
                     "ffn_hidden": 24576},
           "parallel": {"tp": 8, "pp": 1, "dp": 1, "micro_batch": 4, "global_batch": 4, "sequence_parallel": sp,
                        "recompute": recompute},
           "training": {"seq_len": 2048},
           "options": {"flash_attention": False, "embedding_and_loss": False, "granularity": "layer"}}
    ops = run_experiment(experiment_from_dict(doc), force=True).rep_ops
    layer = ops[(ops["micro_batch"] >= 0) & (ops["stream"] == "compute") & (ops["layer"] == 1)]

    def span(phases: str) -> float:  # the measured backward includes its recomputation ("R" ops)
        x = layer[layer["name"].str[0].isin(list(phases))]
        return float(x["end_s"].max() - x["start_s"].min()) * 1e3

    assert span("F") == pytest.approx(fwd_ms, rel=0.06)
    assert span("BR") == pytest.approx(bwd_ms, rel=0.06)
    assert span("F") + span("BR") == pytest.approx(fwd_ms + bwd_ms, rel=0.05)
    assert (span("R") > 0) == (recompute != "none")


def test_all_to_all_efficiency_knob_touches_all_to_alls_between_servers_only():
    """``network.all_to_all_efficiency`` (default 0.85 of the line rate) moves an all-to-all's network transfers
    and nothing else: at the rings' 0.95 it gives the model before it (2 x 0.95 x 25 x 15/16 = 44.5 GB/s on 2 x 8
    A100); rings, trees, one server's all-to-all and pipeline sends are bit-identical at any value."""
    from simulator.experiment import ConfigError, _network_from_dict
    two = build_cluster({"preset": "dgx-a100", "nodes": 2})
    old = _network_from_dict({"all_to_all_efficiency": 0.95})
    assert _busbw(two, "all_to_all", 16, 2**32) == pytest.approx(2 * 0.85 * 25 * 15 / 16, rel=1e-3)
    assert collective_time(two, "all_to_all", 16, 2**32, network=old) * 1e9 == pytest.approx(
        2**32 * 15 / 16 / (2 * 0.95 * 25 * 15 / 16), rel=1e-3)
    low = _network_from_dict({"all_to_all_efficiency": 0.5})
    for op in ("all_reduce", "all_gather", "reduce_scatter", "sendrecv"):
        assert collective_time(two, op, 16, 2**28, network=low) == collective_time(two, op, 16, 2**28), op
    assert collective_time(two, "all_to_all", 8, 2**28, network=low) == collective_time(two, "all_to_all", 8, 2**28)
    for bad in (0, 1.5, "fast", True):
        with pytest.raises((ConfigError, ValueError), match="network.all_to_all_efficiency"):
            _network_from_dict({"all_to_all_efficiency": bad})


def test_the_tuners_estimate_of_an_all_to_all_between_servers_reads_the_all_to_all_efficiency():
    """``Fabric.estimate`` (the contention-free time the tuner prices) of a 2 x 8 A100 all-to-all of S = 4 GiB: each
    NIC carries 8 transfers of S/16 to the other server at 0.85 x 25 GB/s (closed form S/2 / 21.25e9, latency
    ~50 µs of 0.1 s aside), the time the flows take; inside one server (NVLink only) it does not move with
    ``network.all_to_all_efficiency``."""
    from simulator.fabric import NetworkConfig
    two = build_cluster({"preset": "dgx-a100", "nodes": 2})
    fabric = Fabric(simpy.Environment(), two)
    assert fabric.estimate(fabric.plan("all_to_all", tuple(range(16)), 2**32)) == pytest.approx(
        2**32 / 2 / (0.85 * 25e9), rel=1e-3)
    low = Fabric(simpy.Environment(), two, NetworkConfig(all_to_all_efficiency=0.5))
    one = tuple(range(8))
    assert low.estimate(low.plan("all_to_all", one, 2**28)) == fabric.estimate(fabric.plan("all_to_all", one, 2**28))


@pytest.mark.parametrize("leaf, a2a, fraction", [
    (0.9, 0.85, 0.85),   # a fraction of the NIC's line rate, not of the tier's usable rate (not 0.85 x 0.9)
    (0.8, 0.85, 0.8),    # at most the tier's own efficiency: "at most none" wire bytes more
    (0.95, 0.99, 0.95),  # the same: above the rings' 0.95 an all-to-all is not faster than the NIC tier allows
])
def test_all_to_all_efficiency_is_a_fraction_of_line_rate_at_most_the_nic_tiers(leaf, a2a, fraction):
    """``network.all_to_all_efficiency`` with ``bandwidth_efficiency.leaf`` given (NetworkConfig docstring): the
    cross-server all-to-all of 2 x 8 A100 reads busbw 2 x min(a2a, leaf) x 25 GB/s x 15/16."""
    from simulator.fabric import NetworkConfig
    two = build_cluster({"preset": "dgx-a100", "nodes": 2})
    net = NetworkConfig(bandwidth_efficiency={"leaf": leaf}, all_to_all_efficiency=a2a)
    t = collective_time(two, "all_to_all", 16, 2**32, network=net)
    assert 2**32 / t * bus_factor("all_to_all", 16) / 1e9 == pytest.approx(2 * fraction * 25 * 15 / 16, rel=2e-3)


def test_all_to_all_efficiency_is_nccls_and_idle_under_a_uniform_step_latency():
    """With ``step_latency`` given as a time (no NCCL model), ``all_to_all_efficiency`` moves nothing: the 2 x 8
    A100 all-to-all at the NIC tier's 0.95 (2 x 0.95 x 25 x 15/16 = 44.5 GB/s busbw), whatever it is set to."""
    from simulator.fabric import NetworkConfig
    two = build_cluster({"preset": "dgx-a100", "nodes": 2})
    low = collective_time(two, "all_to_all", 16, 2**32, network=NetworkConfig(step_latency_s=2e-6,
                                                                              all_to_all_efficiency=0.5))
    assert 2**32 / low * bus_factor("all_to_all", 16) / 1e9 == pytest.approx(2 * 0.95 * 25 * 15 / 16, rel=2e-3)


# cuDNN SDPA on GB200, BF16, head dim 128, GQA (8 KV heads), FA FLOP convention (causal halved, backward 2.5x the
# forward: the CSVs' time_ms x tflops give exactly these FLOPs). NVIDIA/cudnn-frontend,
# benchmark/sdpa_benchmark_training: 2,048 up from results/llama3.1/gb200/llama3.1_20260813_111214.csv (cuDNN 9.27,
# batch 2, 64 query heads; commit 20dc108987f2); 512 and 1,024 from
# artifacts/sdpa_bf16_benchmark_results_NVIDIA_GB200.csv (cuDNN 9.17, batch 1, 128 query heads; commit d48a60eb146e).
GB200_CUDNN = [  # seq, causal, forward TFLOP/s, backward TFLOP/s (non-deterministic)
    (512, True, 408, 329), (1024, True, 733, 527),
    (2048, True, 1061, 880), (4096, True, 1334, 1131), (8192, True, 1552, 1297), (16384, True, 1608, 1271),
    (2048, False, 1407, 1114), (4096, False, 1559, 1325), (8192, False, 1701, 1434), (16384, False, 1690, 1305),
]


def _attention_tflops(cm: ComputeModel, category: str, seq: int) -> float:
    """TFLOP/s the model gives a fused attention kernel of head dim 128 at ``seq`` tokens (no HBM bound)."""
    flops = 1e12
    return flops / (cm.duration(Kernel(category, flops, 0.0, (seq, seq, 128))) - cm.op_overhead_s) / 1e12


@pytest.mark.parametrize("seq, causal, fwd, bwd", GB200_CUDNN)
def test_blackwell_cudnn_attention_at_burst_is_the_published_gb200_rate(seq, causal, fwd, bwd):
    """With the sustained clock set to 1 (the runs' burst clock: 10 iterations at default clocks), GB200's cuDNN
    attention runs at the published rate at every published length, both masks and passes (exact: grid points)."""
    cm = ComputeModel(get_gpu("GB200"), sustained_clock_fraction=1.0)
    suffix = "" if causal else "_nomask"
    assert _attention_tflops(cm, "attention" + suffix, seq) == pytest.approx(fwd, rel=1e-9)
    assert _attention_tflops(cm, f"attention{suffix}_bwd", seq) == pytest.approx(bwd, rel=1e-9)


def test_blackwell_attention_runs_at_the_sustained_clock():
    """The published Blackwell rates are burst rates: in training each runs at the GPU's sustained fraction of
    them (GB200 0.90), on B200 at its own peak (2,250 of GB200's 2,500) and sustained fraction (0.88). Hopper's
    (taken at 1830 MHz, about the sustained clock) are not scaled."""
    gb200, b200 = ComputeModel(get_gpu("GB200")), ComputeModel(get_gpu("B200"))
    assert _attention_tflops(gb200, "attention", 8192) == pytest.approx(1552 * 0.90, rel=1e-9)
    assert _attention_tflops(b200, "attention_bwd", 8192) == pytest.approx(1297 * 2250 / 2500 * 0.88, rel=1e-9)
    h100 = ComputeModel(H100, attention_kernel="cudnn")
    assert _attention_tflops(h100, "attention", 4096) == pytest.approx(518, rel=1e-9)  # FA3 Fig. 5(d), cuDNN 9.1.1


def test_blackwell_kernels_without_blackwell_measurements_keep_hoppers_fractions():
    """FA2 on Blackwell has no table of its own: Hopper's fractions at Blackwell's peak, not clock-scaled."""
    from simulator.attention import attention_fraction, kernels_for, measured_at_burst
    assert kernels_for("sm100") == ["cudnn", "fa2", "fa3"]
    assert attention_fraction("sm100", "fa2", False, 128, 2048) == pytest.approx(298 / 989.4)  # FA3 Fig. 5(d)
    assert not measured_at_burst("sm100", "fa2") and measured_at_burst("sm100", "cudnn")
