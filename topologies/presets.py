"""Named cluster presets: the defaults an experiment file's ``cluster.preset`` supplies.

A preset is a partial ``cluster:`` section in file units; any field the
experiment file gives overrides it. Bandwidths are deliberately left out, so
that they follow the GPU (``preset: dgx-h100`` with ``gpu: B200`` gets B200
NVLink and NIC rates unless those are given too).

Every DGX preset: 8 GPUs per node (one NVLink domain), one NIC per GPU, 4
nodes, a non-blocking leaf-spine fabric with 16 nodes per leaf (so the
default 4 nodes sit on one leaf).

Rack-scale NVLink presets (one "node" is one NVLink domain of 72 GPUs, one
NIC per GPU, 2 domains per leaf: a 144-port Quantum-X800 leaf's downlinks):

* ``gb200-nvl72``: GB200 NVL72, 72 GPUs on one NVLink switch fabric
  (1.8 TB/s per GPU), ConnectX-7 400 Gb/s per GPU; 2 racks by default.
* ``gb300-nvl72``: the same with GB300 and ConnectX-8 800 Gb/s per GPU.
* ``gb200-nvl36x2``: two 36-GPU racks joined by NVLink cables into one
  72-GPU domain (``nvlink_racks: 2``: one more switch hop between racks).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

__all__ = ["PRESETS", "preset_names"]


def _dgx(gpu: str) -> Mapping[str, object]:
    return MappingProxyType({
        "gpu": gpu,
        "nodes": 4,
        "gpus_per_node": 8,
        "fabric": "leaf_spine",
        "nodes_per_leaf": 16,
        "oversubscription": 1.0,
    })


def _nvl(gpu: str, racks: int = 1) -> Mapping[str, object]:
    return MappingProxyType({
        "gpu": gpu,
        "nodes": 2,
        "gpus_per_node": 72,
        "fabric": "leaf_spine",
        "nodes_per_leaf": 2,
        "oversubscription": 1.0,
        "nvlink_racks": racks,
    })


PRESETS: Mapping[str, Mapping[str, object]] = MappingProxyType({
    "dgx-a100": _dgx("A100-80GB-SXM"),  # DGX A100 640GB: 8x A100 80GB, 8x ConnectX-6 200 Gb/s
    "dgx-h100": _dgx("H100-SXM"),  # DGX H100: 8x H100 SXM, 8x ConnectX-7 400 Gb/s
    "dgx-h800": _dgx("H800-SXM"),  # HGX H800 (DeepSeek-V3's nodes): 8x H800 SXM, 8x 400 Gb/s InfiniBand
    "dgx-h200": _dgx("H200-SXM"),  # DGX H200: 8x H200 SXM, 8x ConnectX-7 400 Gb/s
    "dgx-b200": _dgx("B200"),  # DGX B200: 8x B200, 8x ConnectX-7 400 Gb/s
    "gb200-nvl72": _nvl("GB200"),
    "gb300-nvl72": _nvl("GB300"),
    "gb200-nvl36x2": _nvl("GB200", racks=2),
})


def preset_names() -> list[str]:
    """Names of the cluster presets, e.g. ``["dgx-a100", "dgx-h100", ...]``."""
    return list(PRESETS)
