"""Build a :class:`~topologies.cluster.Cluster` from an experiment file's ``cluster:`` section.

Fields (all optional except that one of ``preset`` / ``gpu`` is needed)::

    cluster:
      preset: dgx-h100            # see preset_names(); the fields below override it
      gpu: H100-SXM               # see topologies.GPU_SPECS (aliases like H100 work)
      nodes: 16                   # servers (NVLink domains)
      gpus_per_node: 8
      nvlink_bandwidth: 450GB/s   # per GPU per direction; default from the GPU
      nic_bandwidth: 400Gbps      # per GPU NIC per direction; default from the GPU
      pcie_bandwidth: 64GB/s      # GPU <-> NIC per direction; default by PCIe gen
      fabric: leaf_spine          # leaf_spine | rail_optimized | fat_tree | single_node
      nodes_per_leaf: 16          # (rail_optimized: nodes per pod)
      spines: 16                  # default nodes_per_leaf (fat_tree: per pod; rail_optimized: nodes in a pod / ratio)
      oversubscription: 1         # leaf downlink : uplink, >= 1 ("3:1" also accepted)
      nvlink_latency: 0.25us      # per hop
      nic_latency: 0.25us
      switch_latency: 0.5us
      leaves_per_pod: 8           # fat_tree only
      cores: 16                   # fat_tree only; multiple of spines
      core_oversubscription: 1    # fat_tree only
      nvlink_racks: 1             # racks one NVLink domain spans (2: GB200 NVL36x2)

Any other fabric comes from a topology file (:mod:`topologies.custom`), named
on its own or written inline::

    cluster:
      topology: fabrics/two-racks.yaml   # or .graphml; relative to the experiment file
    cluster: {gpu: H100, nodes: [...], links: [...]}   # inline: a topology document

(``fabric: <path>`` is read as ``topology: <path>``.) Nothing else may be set
beside ``topology``: the file describes the whole cluster.

Every invalid value raises :class:`TopologyError` with a one-line message that
names ``cluster.<field>`` and what is valid.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
import re
from collections.abc import Callable, Mapping

import yaml

from topologies import builders
from topologies.builders import MAX_GPUS as MAX_GPUS  # (re-exported: defined once, where the builders refuse)
from topologies.builders import MAX_SWITCHES
from topologies.cluster import Cluster, TopologyError
from topologies.custom import GRAPHML_SUFFIXES, cluster_from_dict, is_topology_document, load_topology
from topologies.gpus import GPU_SPECS, get_gpu
from topologies.presets import PRESETS, preset_names
from topologies.units import parse_link_bandwidth, parse_link_latency
from topologies.yamlio import load_yaml, malformed, not_utf8

__all__ = ["FIELDS", "FABRICS", "build_cluster", "load_cluster", "preset_section", "resolve_topology_path",
           "describes_topology", "topology_key"]

FABRICS = ("leaf_spine", "rail_optimized", "fat_tree", "single_node")

# Defaults under every preset; ``None`` means "derive" (from the GPU, or per builder).
_BASE: dict[str, object] = {
    "gpu": None,
    "nodes": 1,
    "gpus_per_node": 8,
    "nvlink_bandwidth": None,
    "nic_bandwidth": None,
    "pcie_bandwidth": None,
    "fabric": "leaf_spine",
    "nodes_per_leaf": 16,
    "spines": None,
    "oversubscription": 1.0,
    "nvlink_latency": builders.DEFAULT_NVLINK_LATENCY,
    "nic_latency": builders.DEFAULT_NIC_LATENCY,
    "switch_latency": builders.DEFAULT_SWITCH_LATENCY,
    "leaves_per_pod": 8,
    "cores": None,
    "core_oversubscription": 1.0,
    "nvlink_racks": 1,
}

FIELDS: tuple[str, ...] = ("preset", *_BASE, "topology")
"""Every key a ``cluster:`` section may hold (``topology`` only on its own)."""
_TOPOLOGY_SUFFIXES = (".yaml", ".yml", *GRAPHML_SUFFIXES)

_FABRIC_ALIASES = {"leaf-spine": "leaf_spine", "rail-optimized": "rail_optimized", "rail": "rail_optimized",
                   "fat-tree": "fat_tree", "single-node": "single_node", "single_server": "single_node",
                   "single-server": "single_node"}


def _int(value: object, key: str, *, optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    if isinstance(value, str) and value.strip().isdigit():
        # (the experiment's own fields refuse a quoted number too: one rule for every numeric field)
        raise TopologyError(f"cluster.{key}: {value!r} is text; write the number without quotes "
                            f"({key}: {value.strip()})")
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:  # (numpy's too)
        raise TopologyError(f"cluster.{key}: {value!r} is not a positive integer")
    return int(value)


def _ratio(value: object, key: str) -> float:
    """``cluster.<key>`` as a ratio >= 1: a real number (numpy's too, not a bool) or text, ``"3"`` or ``"3:1"``."""
    x: object = value
    if isinstance(value, str):
        text = value.strip()
        num, sep, den = text.partition(":")
        try:
            x = float(num) / float(den) if sep else float(text)
        except (ValueError, ZeroDivisionError):
            x = None
    if isinstance(x, numbers.Integral) and not isinstance(x, bool) and x > 1e300:  # (beyond any float: refused)
        x = math.inf
    if isinstance(x, bool) or not isinstance(x, numbers.Real) or not 1 <= x < math.inf:  # (numpy's numbers too)
        raise TopologyError(f"cluster.{key}: {value!r} is not a ratio >= 1 (downlink:uplink, e.g. 1 for "
                            f"non-blocking, 3 or '3:1')")
    return float(x)


def _bandwidth(value: object, key: str) -> float | None:
    """``cluster.<key>`` in bytes/s (None: the GPU's default); below 1 MB/s refused here, as written
    (:func:`~topologies.units.parse_link_bandwidth`): the builders take bare numbers, which they refuse below it
    as a forgotten unit."""
    if value is None:
        return None
    return parse_link_bandwidth(value, f"cluster.{key}")


def _fabric(value: object) -> str:
    if isinstance(value, str):
        name = value.strip().lower()
        name = _FABRIC_ALIASES.get(name, name)
        if name in FABRICS:
            return name
    raise TopologyError(f"cluster.fabric: {value!r} is not a fabric; valid: {', '.join(FABRICS)}, or a topology "
                        f"file (.yaml, .graphml)")


def _describe(preset: str | None, nodes: int, gpus_per_node: int, gpu_name: str, fabric: str,
              oversubscription: float, core_oversubscription: float = 1.0) -> str:
    n = nodes * gpus_per_node
    ref = PRESETS.get(preset) if preset else None
    if ref is not None and ref["gpu"] == gpu_name and ref["gpus_per_node"] == gpus_per_node:
        text = f"{nodes}x {preset} ({n} {gpu_name})"
    else:
        text = f"{nodes}x {gpus_per_node}-GPU {gpu_name} node ({n} GPUs)"
    if fabric == "single_node":
        return f"{text}, single_node"
    return f"{text}, {fabric} {builders.ratios_text(oversubscription, core_oversubscription)}"


def topology_key(section: Mapping[str, object]) -> str | None:
    """``"topology"``, or ``"fabric"`` when it holds a file path, or ``None``."""
    if "topology" in section:
        return "topology"
    fabric = section.get("fabric")
    if isinstance(fabric, str) and fabric.strip().lower().endswith(_TOPOLOGY_SUFFIXES):
        return "fabric"
    return None


def describes_topology(section: object) -> bool:
    """Whether a cluster section is a topology: a topology document, or ``topology:`` (or ``fabric:``) naming a
    topology file. Its nodes are listed one by one, so builder fields such as ``nodes: 64`` do not apply."""
    return isinstance(section, Mapping) and (is_topology_document(section) or topology_key(section) is not None)


def resolve_topology_path(section: Mapping[str, object], base_dir: str | os.PathLike[str]) -> Mapping[str, object]:
    """``section`` with a relative topology file path taken relative to ``base_dir`` (an experiment file's folder).

    Anything that is not a ``cluster:`` mapping naming a topology file by a
    relative path is returned unchanged.
    """
    if not isinstance(section, Mapping):
        return section
    key = topology_key(section)
    value = section.get(key) if key else None
    if not isinstance(value, str) or not value.strip():
        return section
    path = os.path.expanduser(value.strip())
    if not os.path.isabs(path):
        path = os.path.normpath(os.path.join(os.fspath(base_dir), path))
    return {**section, key: path}


def _from_topology_file(section: Mapping[str, object], key: str, base_dir: str | os.PathLike[str] | None) -> Cluster:
    others = [k for k in section if k != key]
    if others:
        raise TopologyError(f"cluster.{others[0]}: cannot be combined with cluster.{key}: the topology file "
                            f"describes the whole cluster")
    value = section[key]
    if not isinstance(value, str) or not value.strip():
        raise TopologyError(f"cluster.{key}: {value!r} is not the path of a topology file (.yaml, .yml or .graphml)")
    path = resolve_topology_path(section, base_dir)[key] if base_dir is not None else value.strip()
    try:
        return load_topology(path)  # type: ignore[arg-type]
    except TopologyError as e:
        raise TopologyError(f"cluster.{key}: {e}") from None
    except UnicodeDecodeError as e:  # load_topology reads the whole text before parsing it
        raise TopologyError(f"cluster.{key}: {path}: {not_utf8(e)}") from None


def preset_section(spec: str, field: str = "cluster") -> dict[str, object]:
    """The ``cluster:`` fields a text names: ``"dgx-h100"`` is ``{"preset": "dgx-h100"}``, ``"dgx-h100:4"``
    (``PRESET:NODES``, as experiment files and every command's cluster argument take it) adds ``"nodes": 4``.
    A NODES that is not a whole number raises a one-line :class:`TopologyError` naming ``field``.

    >>> preset_section("dgx-h100:4")
    {'preset': 'dgx-h100', 'nodes': 4}
    """
    preset, sep, nodes = spec.partition(":")
    if not sep:
        return {"preset": spec}
    if re.fullmatch(r"\s*-?\d+\s*", nodes) and int(nodes) < 1:
        raise TopologyError(f"{field}: {spec!r}: NODES must be >= 1, as in dgx-h100:4")
    if not nodes.strip().isdigit():
        raise TopologyError(f"{field}: {spec!r}: NODES must be an integer, as in dgx-h100:4")
    return {"preset": preset.strip(), "nodes": int(nodes)}


def build_cluster(section: Mapping[str, object] | str, base_dir: str | os.PathLike[str] | None = None) -> Cluster:
    """Build the cluster an experiment file's ``cluster:`` section describes.

    Parameters
    ----------
    section : Mapping or str
        The section's fields (see the module docstring); values may carry
        units (``"400Gbps"``, ``"450GB/s"``, ``"1us"``); numbers may be numpy
        scalars (``np.int64``, ``np.float32``), as a plain int or float. A bare string is
        shorthand for ``{"preset": section}``, or with ``PRESET:NODES`` for
        ``{"preset": ..., "nodes": ...}`` (:func:`preset_section`). A section with ``links``
        (or a list of ``nodes``) is a topology document
        (:func:`topologies.custom.cluster_from_dict`); ``topology: <path>``
        loads a topology file (:func:`topologies.custom.load_topology`).
    base_dir : str or os.PathLike, optional
        Folder a relative ``topology`` path is taken from (default: the
        current folder).

    Returns
    -------
    Cluster
        ``params`` holds the resolved fields in SI units under the file's
        names (``nodes``, ``gpus_per_node``, ``nodes_per_leaf``, ...), plus
        ``preset`` and what the builder derived (``leaves``, ``spines``,
        ``uplink_bandwidth``, ...). ``name`` reads like
        ``"16x dgx-h100 (128 H100-SXM), leaf_spine 1:1"``.

    Raises
    ------
    TopologyError
        On an unknown field or preset, or an invalid value; the one-line
        message names ``cluster.<field>`` and what is valid.

    Examples
    --------
    >>> c = build_cluster({"preset": "dgx-h100", "nodes": 16})
    >>> c.name
    '16x dgx-h100 (128 H100-SXM), leaf_spine 1:1'
    """
    if isinstance(section, str):
        section = preset_section(section)
    if not isinstance(section, Mapping):
        raise TopologyError(f"cluster: expected a mapping of fields or a preset name, got {type(section).__name__}")
    if is_topology_document(section):
        if "preset" in section and "links" not in section:  # a preset's node count written as a list
            raise TopologyError(f"cluster.nodes: must be a number of servers with a preset, got "
                                f"{section.get('nodes')!r} (a topology document has nodes and links, no preset)")
        return cluster_from_dict(section, where="cluster.")
    topology = topology_key(section)
    if topology is not None:
        return _from_topology_file(section, topology, base_dir)
    for key in section:
        if key not in FIELDS:
            raise TopologyError(f"cluster.{key}: unknown field; valid fields: {', '.join(FIELDS)}")

    preset = section.get("preset")
    merged = dict(_BASE)
    if preset is not None:
        key = preset.strip().lower() if isinstance(preset, str) else None
        if key not in PRESETS:
            if isinstance(preset, str) and os.path.isdir(preset):  # (a preset's name wins over a folder's)
                raise TopologyError(f"cluster.preset: {preset!r} is a folder, not a preset; give a preset "
                                    f"({', '.join(preset_names())}), an experiment or cluster YAML file, or a GraphML "
                                    f"topology")
            if isinstance(preset, str) and os.path.exists(preset):  # a file read by its suffix: .yaml, .graphml
                raise TopologyError(f"cluster.preset: {preset!r} is a file, not a preset; name a cluster or "
                                    f"experiment file .yaml or .yml, a topology .graphml, or give a preset "
                                    f"({', '.join(preset_names())})")
            raise TopologyError(f"cluster.preset: unknown preset {preset!r}; valid: {', '.join(preset_names())}")
        preset = key
        merged.update(PRESETS[key])
    merged.update({k: v for k, v in section.items() if k != "preset"})

    if merged["gpu"] is None:
        raise TopologyError(f"cluster.gpu: required when no preset is given; valid GPUs: {', '.join(GPU_SPECS)} "
                            f"(or set cluster.preset: {', '.join(preset_names())})")
    gpu = get_gpu(merged["gpu"], "cluster.gpu")  # type: ignore[arg-type]
    nodes = _int(merged["nodes"], "nodes")
    gpus_per_node = _int(merged["gpus_per_node"], "gpus_per_node")
    builders.check_gpu_count(nodes, gpus_per_node, "cluster.nodes", "nodes")  # type: ignore[arg-type]
    fabric = _fabric(merged["fabric"])
    nodes_per_leaf = _int(merged["nodes_per_leaf"], "nodes_per_leaf")
    spines = _int(merged["spines"], "spines", optional=True)
    leaves_per_pod = _int(merged["leaves_per_pod"], "leaves_per_pod")
    nvlink_racks = _int(merged["nvlink_racks"], "nvlink_racks")
    if gpus_per_node % nvlink_racks:
        raise TopologyError(f"cluster.nvlink_racks: {nvlink_racks} does not divide gpus_per_node ({gpus_per_node});"
                            f" each rack of an NVLink domain holds the same number of GPUs")
    cores = _int(merged["cores"], "cores", optional=True)
    for field, value in (("nodes_per_leaf", nodes_per_leaf), ("spines", spines), ("leaves_per_pod", leaves_per_pod),
                         ("cores", cores)):
        if value is not None and value > MAX_SWITCHES:
            raise TopologyError(f"cluster.{field}: {value:,} exceeds the supported {MAX_SWITCHES:,}")
    oversubscription = _ratio(merged["oversubscription"], "oversubscription")
    core_oversubscription = _ratio(merged["core_oversubscription"], "core_oversubscription")
    nvlink_bw = _bandwidth(merged["nvlink_bandwidth"], "nvlink_bandwidth")
    nic_bw = _bandwidth(merged["nic_bandwidth"], "nic_bandwidth")
    pcie_bw = _bandwidth(merged["pcie_bandwidth"], "pcie_bandwidth")
    # Checked here (errors name the cluster section's fields); the builders parse the values as written, since
    # seconds as a bare number over BARE_TIME_MAX read as a missing unit
    for field in ("nvlink_latency", "nic_latency", "switch_latency"):
        parse_link_latency(merged[field], f"cluster.{field}")
    nvlink_lat, nic_lat, switch_lat = merged["nvlink_latency"], merged["nic_latency"], merged["switch_latency"]

    common = dict(gpu=gpu, servers=nodes, gpus_per_server=gpus_per_node, servers_per_leaf=nodes_per_leaf,
                  spines=spines, nic_bandwidth=nic_bw, nvlink_bandwidth=nvlink_bw,
                  oversubscription=oversubscription, pcie_bandwidth=pcie_bw, nvlink_latency=nvlink_lat,
                  nic_latency=nic_lat, switch_latency=switch_lat, nvlink_racks=nvlink_racks)
    if fabric == "single_node":
        if nodes != 1:
            raise TopologyError(f"cluster.nodes: {nodes} with fabric single_node; single_node needs nodes: 1 "
                                f"(or a scale-out fabric: {', '.join(FABRICS[:3])})")
        cluster = builders.single_server(gpu, gpus_per_node, nvlink_bw, nvlink_lat, nvlink_racks)
    else:
        per_pod = spines if spines is not None else nodes_per_leaf
        if fabric == "fat_tree" and cores is not None and cores % per_pod:
            raise TopologyError(f"cluster.cores: {cores} is not a multiple of spines per pod ({per_pod})")
        extra = ({"leaves_per_pod": leaves_per_pod, "cores": cores, "core_oversubscription": core_oversubscription}
                 if fabric == "fat_tree" else {})
        try:
            cluster = getattr(builders, fabric)(**common, **extra)
        except TopologyError as e:  # a builder names its keyword: here, the file's field (the ratios' uplinks)
            if str(e).split(":", 1)[0] in ("oversubscription", "core_oversubscription"):
                raise TopologyError(f"cluster.{e}") from None
            raise

    rename = {"servers": "nodes", "gpus_per_server": "gpus_per_node", "servers_per_leaf": "nodes_per_leaf"}
    params = {"preset": preset, **{rename.get(k, k): v for k, v in cluster.params.items()}}
    name = _describe(preset, nodes, gpus_per_node, gpu.name, fabric, oversubscription,  # type: ignore[arg-type]
                     builders.core_ratio(cluster.params))
    return dataclasses.replace(cluster, name=name, params=params)


def load_cluster(path: str | os.PathLike[str], check: Callable[[Mapping], None] | None = None) -> Cluster:
    """Read a YAML file and build its cluster.

    Parameters
    ----------
    path : str or os.PathLike
        An experiment file (a mapping with a ``cluster:`` key; other
        sections are ignored), a file holding the cluster fields at top
        level, or a topology file (YAML with ``nodes`` and ``links``, or
        ``.graphml``; :mod:`topologies.custom`). A relative ``topology``
        path is taken relative to the file's folder.
    check : callable, optional
        Called with a YAML file's parsed mapping before its cluster is built (a command that reads only the
        cluster refuses a misspelled section of an experiment or jobs file with it, without parsing twice).

    Returns
    -------
    Cluster

    Raises
    ------
    TopologyError
        One line naming the file: it is missing or unreadable, is not valid
        YAML, is not a mapping, or its cluster section is invalid.
    TypeError
        ``path`` is not a str or os.PathLike (``None``, an int: ``open`` would read a file descriptor).
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path: must be a file path (str or os.PathLike), got {type(path).__name__} {path!r:.60}")
    where = os.fspath(path)
    if where.lower().endswith(GRAPHML_SUFFIXES):
        return load_topology(where)
    try:
        with open(where, encoding="utf-8") as f:
            data = load_yaml(f)
    except OSError as e:
        raise TopologyError(f"{where}: cannot read cluster file ({e.strerror or e})") from None
    except yaml.YAMLError as e:
        raise TopologyError(f"{where}: {malformed(e)}") from None
    if data is None:
        raise TopologyError(f"{where}: the file is empty; expected a mapping with a 'cluster:' section or cluster "
                            f"fields at top level, e.g. preset: dgx-h100")
    if not isinstance(data, Mapping):
        raise TopologyError(f"{where}: expected a mapping with a 'cluster:' section or cluster fields at top "
                            f"level, got {type(data).__name__}")
    experiment = {"model", "parallel", "training", "moe", "options", "sweep", "jobs"} & set(data)
    if "cluster" not in data and experiment:  # an experiment file without its cluster, not cluster fields
        raise TopologyError(f"{where}: no 'cluster:' section (the file has {', '.join(sorted(experiment))}); give "
                            f"one, e.g. cluster: {{preset: dgx-h100, nodes: 2}}")
    if check is not None:
        check(data)
    section = data["cluster"] if "cluster" in data else data
    try:
        if section is data and is_topology_document(data):
            return cluster_from_dict(data, source=where)
        return build_cluster(section, base_dir=os.path.dirname(where))  # type: ignore[arg-type]
    except TopologyError as e:
        raise TopologyError(f"{where}: {e}") from None
