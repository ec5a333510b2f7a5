"""The cluster contract between ``topologies`` and ``simulator``.

A :class:`Cluster` is a full-duplex :class:`networkx.DiGraph` (one directed
edge per direction of every cable) plus the GPU model and the ordered list of
GPU nodes that ranks are mapped onto (rank ``i`` runs on ``gpus[i]``).

Node attributes (all required)
------------------------------
kind : str
    One of :data:`NODE_KINDS`.
server : int
    For ``gpu``, ``nic`` and ``nvswitch`` nodes: index of the server (the
    NVLink domain) the node sits in. Switches of the fabric carry ``-1``.

Edge attributes (all required, SI units)
----------------------------------------
bandwidth : float
    Bytes per second in this edge's direction.
latency : float
    Seconds of propagation + switching on this hop.
kind : str
    Physical link type, one of :data:`LINK_KINDS`.
tier : str
    Where on the fabric the hop sits, one of :data:`TIERS`; results break
    link bytes down by it.

Node labels are tuples, as networkx generators do: ``("gpu", server, local)``,
``("nvswitch", server)``, ``("nic", server, local)``, ``("leaf", i)``,
``("spine", j)``, ``("core", k)``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import networkx as nx

NODE_KINDS = ("gpu", "nvswitch", "nic", "leaf", "spine", "core")
LINK_KINDS = ("nvlink", "pcie", "ib", "eth")
TIERS = ("nvlink", "pcie", "leaf", "spine", "core")


class TopologyError(ValueError):
    """Invalid cluster description: the message names the field and what is valid."""


def node_name(node: Hashable) -> str:
    """A graph node as files and messages name it: ``("spine", 1)`` -> ``"spine:1"``, ``("gpu", 0, 3)`` ->
    ``"gpu:0:3"`` (a custom fabric's own id as it is)."""
    return ":".join(str(x) for x in node) if isinstance(node, tuple) else str(node)


class PicklesProxies:
    """Pickling and deep copies for a dataclass whose fields may be read-only mapping proxies (the catalogues'
    ``GPUSpec.peak_flops``, ``PlanOptions.components``), which neither handles: it is rebuilt from its fields,
    each proxy from a dict of its items (a proxy again)."""

    def __reduce__(self):
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        proxies = tuple(k for k, v in fields.items() if isinstance(v, MappingProxyType))
        return _rebuilt, (type(self), {k: dict(v) if k in proxies else v for k, v in fields.items()}, proxies)


def _rebuilt(cls: type, fields: dict, proxies: tuple[str, ...]):
    """``cls(**fields)`` with the ``proxies`` fields read-only again (:class:`PicklesProxies`)."""
    return cls(**{k: MappingProxyType(v) if k in proxies else v for k, v in fields.items()})


@dataclass(frozen=True)
class GPUSpec(PicklesProxies):
    """One GPU model's datasheet numbers, SI units.

    Attributes
    ----------
    name : str
        Canonical name, e.g. ``"H100-SXM"``.
    peak_flops : Mapping[str, float]
        Dense (no sparsity) peak FLOP/s per dtype: keys among
        ``"fp32", "tf32", "bf16", "fp16", "fp8"``.
    hbm_bytes : float
        HBM capacity in bytes.
    hbm_bandwidth : float
        HBM bandwidth in bytes/s.
    nvlink_bandwidth : float
        NVLink bandwidth per GPU per direction, bytes/s.
    nic_bandwidth : float
        Typical scale-out NIC rate per GPU per direction, bytes/s.
    sm_count : int
        Streaming multiprocessors (used for GEMM wave quantisation).
    matmul_efficiency : float
        Fraction of peak the best-shaped GEMMs reach (cuBLAS-class; the
        maximum achievable matmul FLOP/s of a shape search), 16-bit operands.
    matmul_efficiency_fp8 : float or None
        The same for FP8 (E4M3) operands, as a fraction of the FP8 dense peak;
        None where no measurement exists (FP8 GEMMs then need
        ``compute.fp8_matmul_efficiency``).
    matmul_efficiency_fp8_wgrad : float or None
        The same for the weight-gradient GEMMs of fine-grained (blockwise) FP8 scaling
        (``training.fp8_recipe: blockwise``: both operands scaled per 128 elements along the reduced token
        dimension, DeepGEMM's 1D1D kernels), as a fraction of the FP8 dense peak; None where no measurement
        exists (they then run at ``matmul_efficiency_fp8``).
    sustained_clock_fraction : float
        The rate a tensor-core GEMM keeps when GEMMs run back to back for seconds, as they do in training
        (the GPU at its power limit, its SM clock lowered), over the rate :mod:`simulator.gemm` gives it from the
        short-burst ceilings ``matmul_efficiency*``: a measured sustained rate over the model's rate at the
        measured shape, which is not the clock's own ratio where the model misses the burst (Hopper: 0.96
        against the clock's 0.92; :mod:`topologies.gpus`). In [0.01, 1]; 1 where no sustained measurement
        exists. ``compute.sustained_clock_fraction`` overrides it.
    nvlink_efficiency : float
        Fraction of the NVLink rate NCCL's ring reaches at large sizes
        (nccl-tests bus bandwidth on one NVSwitch node / NVLink rate).
    arch : str
        GPU generation (CUDA compute capability): ``"sm80"`` Ampere, ``"sm90"``
        Hopper, ``"sm100"`` Blackwell; selects published kernel rates.
    gemm_critical_intensity : float
        FLOPs per operand byte a GEMM output tile needs so that the SM's share
        of L2 bandwidth keeps its tensor cores fed (16-bit operands); smaller
        tiles run proportionally slower (:mod:`simulator.gemm`).
    source : str
        Where the numbers come from.
    """

    name: str
    peak_flops: Mapping[str, float]
    hbm_bytes: float
    hbm_bandwidth: float
    nvlink_bandwidth: float
    nic_bandwidth: float
    sm_count: int
    matmul_efficiency: float = 0.8
    matmul_efficiency_fp8: float | None = None
    matmul_efficiency_fp8_wgrad: float | None = None
    gemm_critical_intensity: float = 64.0
    sustained_clock_fraction: float = 1.0
    nvlink_efficiency: float = 0.8
    arch: str = "sm90"
    source: str = ""

    def peak(self, dtype: str) -> float:
        """Dense peak FLOP/s for ``dtype``; raises ``ValueError`` naming valid dtypes."""
        try:
            return self.peak_flops[dtype]
        except KeyError:
            valid = ", ".join(sorted(self.peak_flops))
            raise ValueError(f"dtype: {dtype!r} is not supported by {self.name}; valid: {valid}") from None


@dataclass
class Cluster:
    """A GPU cluster: fabric graph, GPU model and rank order.

    Attributes
    ----------
    graph : networkx.DiGraph
        Full-duplex fabric, attributes as in the module docstring.
    gpu : GPUSpec
        The (homogeneous) GPU model.
    gpus : tuple
        GPU node labels in rank order.
    gpus_per_server : int
        Size of one NVLink domain.
    name : str
        Human-readable description.
    params : dict
        The builder parameters that produced it (for reports and sweeps).
    """

    graph: nx.DiGraph
    gpu: GPUSpec
    gpus: tuple[Hashable, ...]
    gpus_per_server: int
    name: str = ""
    params: dict = field(default_factory=dict)

    @property
    def num_gpus(self) -> int:
        return len(self.gpus)

    def server_of(self, rank: int) -> int:
        """Index of the server (NVLink domain) that ``rank`` runs on."""
        return self.graph.nodes[self.gpus[rank]]["server"]


def check_cluster(value: object, name: str = "cluster") -> None:
    """Raise a one-line ``TypeError`` unless ``value`` is a :class:`Cluster` (what a public function taking a
    cluster says when handed a preset name or a ``cluster:`` section instead)."""
    if not isinstance(value, Cluster):
        hint = (f"; build it first: topologies.build_cluster({value!r})" if isinstance(value, (str, dict)) else "")
        raise TypeError(f"{name}: must be a Cluster (topologies.build_cluster), got {type(value).__name__}{hint}")
