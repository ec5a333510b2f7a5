"""GPU datasheet numbers (SI units) and name lookup.

All FLOP/s are *dense* (no 2:4 structured sparsity): NVIDIA datasheets print
the sparse figure first, with a footnote; the dense figure is half of it.
HBM capacity is the datasheet's decimal GB (``80GB`` -> 80e9 bytes), which is
slightly below what ``nvidia-smi`` reports and so errs on the side of
"does not fit" in memory checks.

``matmul_efficiency`` is the fraction of dense bf16 peak that large,
well-shaped cuBLAS GEMMs (M, N, K >= 4096) sustain at the GPU's default power
limit. It is a modelling default, not a datasheet number:

* A100-SXM: large bf16 GEMMs measure ~250-270 TFLOP/s of 312 (0.80-0.87);
  Megatron-LM reports ~0.8 of peak for its largest GEMMs. We use 0.80.
* H100/H200-SXM: sustained clocks under the 700 W limit sit below the boost
  clock the 989 TFLOP/s peak assumes; measured large bf16 GEMMs reach about
  700-800 TFLOP/s. We use 0.75 (H200 shares the H100 die and clocks).
* B200: early measurements of large bf16 GEMMs report ~1.5-1.7 PFLOP/s of
  2.25; we use 0.70 and flag it as the least certain number here.
"""

from __future__ import annotations

from types import MappingProxyType

from topologies.cluster import GPUSpec, TopologyError

__all__ = ["GPU_SPECS", "PCIE_BANDWIDTH", "get_gpu", "gpu_names"]

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
        matmul_efficiency=0.80,
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
        matmul_efficiency=0.75,
        source="NVIDIA H100 Tensor Core GPU datasheet (H100 SXM); DGX H100 User Guide",
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
        matmul_efficiency=0.75,
        source="NVIDIA H200 Tensor Core GPU datasheet (H200 SXM); DGX H200 User Guide",
    ),
    # NVIDIA HGX B200 / DGX B200 datasheets, per GPU (8-GPU totals / 8):
    # FP32 75 TF, TF32 2.2 PF*, BF16/FP16 4.5 PF*, FP8 9 PF* (* sparse; dense
    # is half). HBM3e 180 GB at 8 TB/s. NVLink 5: 1.8 TB/s bidirectional =
    # 900 GB/s per direction. DGX B200: ConnectX-7 400 Gb/s per GPU.
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
        matmul_efficiency=0.70,
        source="NVIDIA HGX B200 and DGX B200 datasheets",
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
    "B200": 64 * _GB,
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
    "h200": "H200-SXM",
    "h200-sxm5": "H200-SXM",
    "h200-141gb": "H200-SXM",
    "b200-sxm": "B200",
    "b200-180gb": "B200",
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
