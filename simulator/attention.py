"""How fast fused (Flash) attention kernels run: published forward and backward throughput.

A fused attention kernel is compute-bound and its efficiency depends on the
kernel, the GPU generation, the pass (backward is slower), the head dimension
and the sequence length (short sequences leave the tail of every tile idle).
No roofline captures that, so the rates are the kernel authors' published
benchmarks, interpolated:

===============  =====  ========================================================
kernel           GPU    source (16-bit, causal mask, TFLOP/s by sequence length)
===============  =====  ========================================================
``fa2``          A100   Dao 2023, *FlashAttention-2* (arXiv:2307.08691v1), Fig. 5
                        (forward) and Fig. 6 (backward), A100-SXM4-80GB
``fa2``          H100   Shah et al. 2024, *FlashAttention-3* (arXiv:2407.08608v2),
                        Fig. 5 / 6, FlashAttention 2.5.8 on H100-SXM5 (700 W)
``fa3``          H100   same paper, FlashAttention-3
``cudnn``        H100   same paper, cuDNN 9.1.1.17 fused attention
``cudnn``        GB200  NVIDIA/cudnn-frontend ``benchmark/sdpa_benchmark_training``:
                        ``results/llama3.1/gb200/llama3.1_20260813_111214.csv``
                        (cuDNN 9.27, 2,048-16,384 tokens, both masks) and
                        ``artifacts/sdpa_bf16_benchmark_results_NVIDIA_GB200.csv``
                        (cuDNN 9.17, causal 512 and 1,024); head dim 128 only
===============  =====  ========================================================

All use the FlashAttention papers' FLOP convention (section 4.1 of both):
forward ``4·b·h·s²·d``, halved for a causal mask (only the unmasked half is
computed), backward 2.5x the forward (five ``s × s`` matmuls against two: the
backward recomputes ``Q Kᵀ``). :mod:`workloads.flops` gives its attention
kernels exactly these executed FLOPs, so ``time = flops / rate``.

Where a paper gives only the non-causal backward (FA3 and cuDNN on H100), the
causal backward is the non-causal one times the same kernel's causal /
non-causal forward ratio at that length. On A100, where FA2 publishes both,
this rule lands within 8% of the measured causal backward
(``tests/test_compute_grounding.py``). Head dimensions between the measured
ones are interpolated linearly, sequence lengths in ``log2`` (clamped to
512...16,384: beyond 16K the kernels are at their asymptote). Rates are
stored as fractions of the measuring GPU's dense peak and applied to the
GPU's own peak; a kernel without measurements on its GPU generation (FA2 and
FA3 on Blackwell) uses the nearest measured generation's fractions.

Blackwell (``sm100``: B200, GB200, GB300) runs cuDNN at the GB200 rates above,
as fractions of GB200's 2,500 TFLOP/s dense BF16 datasheet peak. Only head dim
128 was measured: every head dimension takes its rates. The cuDNN 9.27 set has
no 512 or 1,024: those causal rates are the 9.17 run's (batch 1, 128 query
heads: at 2,048 its forward matches 9.27's within 1%, its backward is 26%
under, so the short-length backward is likely pessimistic), their unmasked
ones the causal ones times 9.27's unmasked / causal ratio at 2,048. Unlike
Hopper's (taken at a fixed 1830 MHz, about the sustained clock), these were
taken at the default clocks over 10 iterations: burst rates (the same run
reports a 2,568 TFLOP/s MMA peak, above the datasheet's), so
:func:`measured_at_burst` tells :mod:`simulator.compute` to scale them by the
GPU's ``sustained_clock_fraction``.

Software era: the rates are as new as each generation's published measurements, not of one year. Hopper's
are 2024 kernels (FlashAttention 2.5.8 and 3, cuDNN 9.1), Blackwell's cuDNN 9.27 and 9.17 (2025-26); runs of an
older stack were slower: cudnn-frontend's own B200 run with cuDNN 9.10.2 (NGC PyTorch 25.06; its
``artifacts/sdpa_bf16_benchmark_results_NVIDIA_B200.csv``) reads 7-11% under these rates at 8K once its per-call
host overhead is taken off (docs/VALIDATION.md, the NeMo 25.02 B200 spot check), and cuDNN 9.13 read 1,496
TFLOP/s where 9.17 reads 1,899 on GB300's 8K forward (cudnn-frontend's GB300 artifacts).
``compute.attention_efficiency`` sets one flat fraction for another stack.

Kernels without a mask (the off-diagonal steps of ring attention under
context parallelism, Transformer Engine's ``no_mask`` steps) use the same
papers' non-causal curves (:data:`NO_MASK_TABLES`; the head dimension 256 of
H100, which has no published non-causal backward, takes the nearest measured
head dimension's backward scaled by the two head dimensions' forwards).

Defaults (:data:`DEFAULT_KERNEL`): ``fa2`` on Ampere; ``cudnn`` on Hopper and
later, the fused attention Megatron-Core reaches through Transformer Engine.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping

SEQ_LENS = (512, 1024, 2048, 4096, 8192, 16384)
"""Sequence lengths of the published benchmarks (16K tokens per batch, hidden 2048)."""

_A100_PEAK = 312.0
_H100_PEAK = 989.4
_GB200_PEAK = 2500.0  # dense BF16, NVIDIA GB200 NVL72 datasheet (topologies.gpus)

# cuDNN on GB200 (BF16, head dim 128, GQA 8 KV heads, non-deterministic backward). 2,048-16,384: cuDNN 9.27
# (frontend 1.27.0), batch 2 x 64 query heads, NVIDIA/cudnn-frontend commit 20dc108987f2,
# benchmark/sdpa_benchmark_training/results/llama3.1/gb200/llama3.1_20260813_111214.csv. 512 and 1,024 (causal):
# cuDNN 9.17 (frontend 1.16.0), batch 1 x 128 query heads, commit d48a60eb146e,
# benchmark/sdpa_benchmark_training/artifacts/sdpa_bf16_benchmark_results_NVIDIA_GB200.csv ("cudnn_fe").
_GB200_CUDNN_CAUSAL_FWD = (408, 733, 1061, 1334, 1552, 1608)
_GB200_CUDNN_CAUSAL_BWD = (329, 527, 880, 1131, 1297, 1271)
_GB200_CUDNN_FULL_FWD_2K_UP = (1407, 1559, 1701, 1690)
_GB200_CUDNN_FULL_BWD_2K_UP = (1114, 1325, 1434, 1305)


def _short_unmasked(causal: tuple[int, ...], full_2k_up: tuple[int, ...]) -> tuple[float, ...]:
    """Unmasked rates at :data:`SEQ_LENS`: measured from 2,048 up; at 512 and 1,024 the causal rate times the
    unmasked / causal ratio at 2,048 (no unmasked run at those lengths)."""
    ratio = full_2k_up[0] / causal[2]
    return (causal[0] * ratio, causal[1] * ratio, *full_2k_up)


# (measured-on peak TFLOP/s, {head_dim: {(pass, causal): TFLOP/s at SEQ_LENS}}); "bwd", True may be absent.
_MEASURED: dict[tuple[str, str], tuple[float, dict[int, dict[tuple[str, bool], tuple[float, ...]]]]] = {
    ("sm80", "fa2"): (_A100_PEAK, {  # FA2 paper, Fig. 5 (a)-(d) and Fig. 6 (a)-(d)
        64: {("fwd", True): (115, 146, 167, 177, 181, 183), ("fwd", False): (178, 191, 193, 192, 192, 192),
             ("bwd", True): (81, 111, 131, 149, 160, 166), ("bwd", False): (120, 141, 152, 163, 169, 170)},
        128: {("fwd", True): (132, 168, 187, 198, 200, 197), ("fwd", False): (209, 224, 227, 222, 224, 223),
              ("bwd", True): (90, 122, 145, 165, 176, 186), ("bwd", False): (136, 159, 175, 187, 193, 196)},
    }),
    ("sm90", "fa3"): (_H100_PEAK, {  # FA3 paper, Fig. 5 (a)-(f) and Fig. 6 (a), (b)
        64: {("fwd", True): (197, 265, 371, 420, 460, 473), ("fwd", False): (333, 392, 460, 476, 496, 497),
             ("bwd", False): (272, 363, 422, 453, 472, 474)},
        128: {("fwd", True): (292, 423, 521, 579, 602, 616), ("fwd", False): (467, 565, 625, 638, 646, 648),
              ("bwd", False): (316, 424, 501, 542, 559, 561)},
        256: {("fwd", True): (286, 427, 537, 612, 628, 642), ("fwd", False): (482, 627, 707, 736, 746, 756)},
    }),
    ("sm90", "cudnn"): (_H100_PEAK, {  # FA3 paper, Fig. 5 and 6: cuDNN 9.1.1.17
        64: {("fwd", True): (225, 288, 334, 363, 379, 388), ("fwd", False): (335, 373, 395, 408, 412, 413),
             ("bwd", False): (266, 348, 395, 417, 432, 433)},
        128: {("fwd", True): (315, 410, 484, 518, 529, 539), ("fwd", False): (497, 574, 617, 609, 600, 595),
              ("bwd", False): (305, 408, 465, 499, 518, 516)},
        256: {("fwd", True): (308, 391, 450, 483, 497, 509), ("fwd", False): (470, 546, 580, 581, 580, 581)},
    }),
    ("sm90", "fa2"): (_H100_PEAK, {  # FA3 paper, Fig. 5 and 6: FlashAttention 2.5.8 on H100
        64: {("fwd", True): (180, 229, 262, 284, 295, 299), ("fwd", False): (282, 306, 318, 321, 322, 324),
             ("bwd", False): (198, 238, 264, 279, 287, 291)},
        128: {("fwd", True): (191, 260, 298, 319, 333, 335), ("fwd", False): (309, 350, 362, 368, 370, 370),
              ("bwd", False): (214, 260, 291, 310, 318, 322)},
        256: {("fwd", True): (208, 251, 278, 293, 297, 298), ("fwd", False): (275, 313, 321, 323, 324, 326)},
    }),
    ("sm100", "cudnn"): (_GB200_PEAK, {  # cudnn-frontend's GB200 runs, above: burst rates (measured_at_burst)
        128: {("fwd", True): _GB200_CUDNN_CAUSAL_FWD, ("bwd", True): _GB200_CUDNN_CAUSAL_BWD,
              ("fwd", False): _short_unmasked(_GB200_CUDNN_CAUSAL_FWD, _GB200_CUDNN_FULL_FWD_2K_UP),
              ("bwd", False): _short_unmasked(_GB200_CUDNN_CAUSAL_BWD, _GB200_CUDNN_FULL_BWD_2K_UP)},
    }),
}

DEFAULT_KERNEL = {"sm80": "fa2", "sm90": "cudnn", "sm100": "cudnn"}
"""Fused attention kernel per GPU generation when ``compute.attention_kernel`` is not set."""
_FALLBACK_ARCH = {"sm100": "sm90"}
"""A kernel without published measurements on a generation borrows the nearest measured generation's fractions."""
_BURST_MEASURED = frozenset({("sm100", "cudnn")})
"""Tables measured at the default (boost) clock over a few iterations, not at a sustained clock."""


def _table_key(arch: str, kernel: str) -> tuple[str, str]:
    """The measured ``(arch, kernel)`` a kernel on ``arch`` takes its rates from (its own, else the fallback's)."""
    return (arch, kernel) if (arch, kernel) in _MEASURED else (_FALLBACK_ARCH.get(arch, arch), kernel)


def measured_at_burst(arch: str, kernel: str) -> bool:
    """Whether ``kernel``'s rates on ``arch`` are burst rates, to be scaled by the sustained clock fraction (the
    Hopper and Ampere ones were taken at about the sustained clock: module docstring)."""
    return _table_key(arch, kernel) in _BURST_MEASURED


def derived_causal_backward(fwd_causal: float, fwd_full: float, bwd_full: float) -> float:
    """Causal backward rate from the non-causal one, scaled by the forward's causal / non-causal ratio."""
    return bwd_full * fwd_causal / fwd_full


def _rate_table(peak: float, by_hd: Mapping[int, Mapping[tuple[str, bool], tuple[float, ...]]], causal: bool
                ) -> dict[str, dict[int, tuple[float, ...]]]:
    """Forward and backward rates with a causal mask (``causal``) or none, as fractions of peak, per head
    dimension: as published. A backward not published for the mask is a source head dimension's scaled by the
    two head dimensions' forwards; the source is the head dimension itself where it has a non-causal backward
    (causal only), else the largest one that has (256 on H100 takes 128's), and its backward is the published
    non-causal one or, causal, :func:`derived_causal_backward` of it."""
    out: dict[str, dict[int, tuple[float, ...]]] = {"fwd": {}, "bwd": {}}
    dims = sorted(by_hd)
    for hd in dims:
        rows = by_hd[hd]
        fwd = rows[("fwd", causal)]
        bwd = rows.get(("bwd", causal))
        if bwd is None:
            src = by_hd[hd if ("bwd", False) in rows else max(d for d in dims if ("bwd", False) in by_hd[d])]
            src_bwd = (tuple(map(derived_causal_backward, src[("fwd", True)], src[("fwd", False)], src[("bwd", False)]))
                       if causal else src[("bwd", False)])
            bwd = tuple(sb * f / sf for sb, sf, f in zip(src_bwd, src[("fwd", causal)], fwd))
        out["fwd"][hd] = tuple(x / peak for x in fwd)
        out["bwd"][hd] = tuple(x / peak for x in bwd)
    return out


TABLES: dict[tuple[str, str], dict[str, dict[int, tuple[float, ...]]]] = {
    key: _rate_table(peak, rows, causal=True) for key, (peak, rows) in _MEASURED.items()}
"""``(arch, kernel) -> pass -> head_dim -> fraction of dense peak`` at :data:`SEQ_LENS` (causal mask)."""

NO_MASK_TABLES: dict[tuple[str, str], dict[str, dict[int, tuple[float, ...]]]] = {
    key: _rate_table(peak, rows, causal=False) for key, (peak, rows) in _MEASURED.items()}
"""``(arch, kernel) -> pass -> head_dim -> fraction of dense peak`` at :data:`SEQ_LENS` without a mask: the
off-diagonal steps of ring attention (:func:`workloads.flops.ring_attention_steps`)."""


ATTENTION_KERNELS = tuple(sorted({k for _, k in TABLES}))
"""Every fused attention kernel with published rates on some GPU generation (``compute.attention_kernel``)."""


def kernels_for(arch: str) -> list[str]:
    """Attention kernels with published rates on a GPU generation."""
    fallback = _FALLBACK_ARCH.get(arch, arch)
    return sorted({k for a, k in TABLES if a in (arch, fallback)})


def _interp_seq(values: tuple[float, ...], seq_len: float) -> float:
    x = math.log2(min(max(seq_len, SEQ_LENS[0]), SEQ_LENS[-1]))
    xs = [math.log2(s) for s in SEQ_LENS]
    i = min(bisect.bisect_right(xs, x), len(xs) - 1)
    if i == 0:
        return values[0]
    f = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
    return values[i - 1] + f * (values[i] - values[i - 1])


def attention_fraction(arch: str, kernel: str, backward: bool, head_dim: int, seq_len: float,
                       causal: bool = True) -> float:
    """Fraction of dense 16-bit peak a fused attention kernel reaches (FlashAttention FLOP convention), with a
    causal mask or (``causal=False``) none.

    Raises ``ValueError`` naming the valid kernels for an unknown ``(arch, kernel)``.
    """
    key = _table_key(arch, kernel)
    table = (TABLES if causal else NO_MASK_TABLES).get(key)
    if table is None:
        raise ValueError(f"compute.attention_kernel: {kernel!r} has no published rates on {arch}; "
                         f"valid: {', '.join(kernels_for(arch)) or 'none (set compute.attention_efficiency)'}")
    rows = table["bwd" if backward else "fwd"]
    dims = sorted(rows)
    hd = min(max(head_dim, dims[0]), dims[-1])
    j = bisect.bisect_left(dims, hd)
    if dims[j] == hd:
        return _interp_seq(rows[hd], seq_len)
    lo, hi = dims[j - 1], dims[j]
    f = (hd - lo) / (hi - lo)
    return (1 - f) * _interp_seq(rows[lo], seq_len) + f * _interp_seq(rows[hi], seq_len)
