"""Hardware and fabric: GPU specs, networkx cluster builders, YAML loader, custom topology files and export.

Knows nothing of SimPy, ``simulator`` or ``workloads``.

>>> import topologies
>>> c = topologies.build_cluster({"preset": "dgx-h100", "nodes": 16})
>>> c.num_gpus, c.name
(128, '16x dgx-h100 (128 H100-SXM), leaf_spine 1:1')
"""

from topologies.builders import fat_tree, leaf_spine, rail_optimized, single_server, validate_cluster
from topologies.cluster import LINK_KINDS, NODE_KINDS, TIERS, Cluster, GPUSpec, TopologyError
from topologies.custom import cluster_from_dict, load_topology
from topologies.export import cluster_to_dict, cluster_to_graphml, cluster_to_yaml, write_topology
from topologies.gpus import GPU_SPECS, get_gpu, gpu_names
from topologies.loader import FABRICS, FIELDS, build_cluster, load_cluster
from topologies.presets import PRESETS, preset_names
from topologies.units import (
    format_bandwidth,
    format_bytes,
    format_time,
    parse_bandwidth,
    parse_bytes,
    parse_time,
)

__all__ = [
    "Cluster",
    "GPUSpec",
    "TopologyError",
    "NODE_KINDS",
    "LINK_KINDS",
    "TIERS",
    "GPU_SPECS",
    "get_gpu",
    "gpu_names",
    "single_server",
    "leaf_spine",
    "rail_optimized",
    "fat_tree",
    "validate_cluster",
    "FABRICS",
    "FIELDS",
    "build_cluster",
    "load_cluster",
    "cluster_from_dict",
    "load_topology",
    "cluster_to_dict",
    "cluster_to_yaml",
    "cluster_to_graphml",
    "write_topology",
    "PRESETS",
    "preset_names",
    "parse_bytes",
    "parse_bandwidth",
    "parse_time",
    "format_bytes",
    "format_bandwidth",
    "format_time",
]
