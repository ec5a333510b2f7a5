"""``clustersim plan``: a cluster's bill of materials, power, cost and bisection bandwidth.

Kept apart from :mod:`simulator.cli`, which only registers it; the heavy imports (pandas, the builders)
happen when the command runs, not at start-up.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Mapping

__all__ = ["configure", "run", "load_plan_inputs"]


def configure(p: argparse.ArgumentParser) -> None:
    """Arguments of ``clustersim plan``."""
    p.add_argument("cluster", help="a preset name (dgx-h100), PRESET:NODES (dgx-h100:4), a cluster YAML, an "
                                   "experiment YAML or a .graphml topology; a plan: section beside the cluster "
                                   "overrides port speed, cable media and prices")
    p.add_argument("--nodes", type=int, help="override the number of servers (NVLink domains)")
    p.add_argument("--json", action="store_true", help="print one JSON object (summary and bill of materials)")
    p.add_argument("--csv", metavar="OUT.csv", help="also write the bill of materials as CSV")


def load_plan_inputs(spec: str, nodes: int | None = None) -> tuple[object, object]:
    """``(cluster, plan section)`` of a preset name, ``PRESET:NODES``, a YAML file or a GraphML topology;
    one-line ``ValueError`` naming the file."""
    from topologies import build_cluster, load_cluster
    from topologies.cluster import TopologyError
    from topologies.components import plan_options
    from topologies.custom import GRAPHML_SUFFIXES
    from topologies.loader import describes_topology, preset_section

    if spec.lower().endswith(GRAPHML_SUFFIXES):  # a topology file lists every node: no --nodes, no plan: section
        if nodes is not None:
            raise ValueError(f"--nodes: cannot be used with a topology file ({spec} lists every node and link)")
        return load_cluster(spec), plan_options(None)
    section: object
    plan: object = None
    where = ""
    if not spec.lower().endswith((".yaml", ".yml")):  # a preset, or PRESET:NODES as run --cluster takes it
        section = preset_section(spec, "cluster")
        if "nodes" in section and nodes is not None:
            raise ValueError(f"--nodes: {spec} gives the number of nodes already; give it once ({spec} or "
                             f"{section['preset']} --nodes {nodes})")
    else:
        from .experiment import check_file_sections, read_experiment_file
        doc = read_experiment_file(spec)
        where = f"{spec}: "
        try:  # an experiment or jobs file: its other sections are not read here, but a typo is an error
            check_file_sections(doc)
        except ValueError as exc:
            raise ValueError(f"{where}{exc}") from None
        if doc.get("faults"):
            from .cli import faults_not_applied
            print(faults_not_applied(spec), file=sys.stderr)
        plan = doc.get("plan")
        section = doc["cluster"] if "cluster" in doc else {k: v for k, v in doc.items() if k != "plan"}
    if nodes is not None:
        if describes_topology(section):
            raise ValueError(f"--nodes: cannot be used with a topology file (the cluster of {spec} lists every "
                             f"node and link); drop --nodes, or give a preset or builder fields (preset: dgx-h100)")
        if isinstance(section, str):  # ``cluster: dgx-h100`` is shorthand for a preset
            section = preset_section(section, "cluster")
        if isinstance(section, Mapping):
            section = {**section, "nodes": nodes}
    try:
        return build_cluster(section), plan_options(plan)  # type: ignore[arg-type]
    except TopologyError as exc:
        raise TopologyError(f"{where}{exc}") from None


_SPEC_WIDTH_MAX = 40
"""Widest spec column of the printed bill of materials; a longer spec is cut with "..."."""


def _money(x: float) -> str:
    return "n/a" if math.isnan(x) else f"${x:,.0f}"


def _print(cluster, bom, s, out=None) -> None:
    out = out or sys.stdout
    from topologies import format_bandwidth
    from topologies.builders import ratio_text

    print(f"# {cluster.name}: {s['switch_family']} fabric, {s['port_speed_Gbps']} Gb/s switch ports and cables",
          file=out)
    width = min(_SPEC_WIDTH_MAX, max([26, *(len(r) for r in bom["spec"])]))  # "36 per NVLink domain (18 trays)"
    header = f"{'item':<15} {'tier':<7} {'component':<17} {'spec':<{width}} {'count':>8} {'unit W':>7} " \
             f"{'unit $':>9} {'kW':>9} {'$':>13}"
    print(header, file=out)
    for r in bom.itertuples(index=False):
        spec = r.spec if len(r.spec) <= width else r.spec[:width - 3] + "..."
        unit_w = "n/a" if math.isnan(r.unit_power_w) else f"{r.unit_power_w:,.0f}"
        kw = "n/a" if math.isnan(r.power_w) else f"{r.power_w / 1e3:,.1f}"
        print(f"{r.item:<15} {r.tier:<7} {r.component:<17} {spec:<{width}} {r.count:>8,} {unit_w:>7} "
              f"{_money(r.unit_cost_usd):>9} {kw:>9} {_money(r.cost_usd):>13}", file=out)
    print(file=out)
    tiers = ", ".join(f"{n:,} {t}" for t, n in s["switches_by_tier"].items())
    switches = f"{s['switches']:,} switch" + ("es" if s["switches"] != 1 else "")
    print(f"fabric        {switches} ({tiers}), {s['nics']:,} NICs, {s['nvswitch_chips']:,} NVSwitch chips, "
          f"{s['cables']:,} cables, {s['transceivers']:,} transceivers", file=out)
    print(f"              {s['fabric_power_kw']:,.1f} kW, {_money(s['fabric_cost_usd'])} "
          f"({_money(s['fabric_cost_per_gpu_usd'])} per GPU)", file=out)
    gpu_kw = "n/a" if math.isnan(s["gpu_power_kw"]) else f"{s['gpu_power_kw']:,.1f} kW"
    print(f"GPUs (apart)  {s['gpus']:,} {cluster.gpu.name}: {gpu_kw}, {_money(s['gpu_cost_usd'])}", file=out)
    ratios = ", ".join(f"{t} {ratio_text(r)}" for t, r in s["oversubscription"].items()) or "none (one switch tier)"
    if s["gpus"] < 2:  # (no half to cut: the JSON's per-GPU figure is null)
        print(f"bisection     n/a (one GPU); oversubscription {ratios}", file=out)
    else:
        print(f"bisection     {format_bandwidth(s['bisection_bytes_s'])} from the first half of the fabric to the "
              f"rest ({format_bandwidth(s['bisection_per_gpu_bytes_s'])} per GPU); oversubscription {ratios}",
              file=out)
    print("unit figures: datasheets for optics and GPU power, labelled estimates otherwise (topologies/components.py);"
          " override them in the file's plan: section", file=out)


def _records(bom) -> list[dict]:
    rows = bom.to_dict(orient="records")
    return [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()} for r in rows]


def run(args: argparse.Namespace) -> int:
    """Print the plan of ``args.cluster``; 0 on success (errors are ``ValueError``: exit 2)."""
    from topologies.capacity import bill_of_materials, plan_summary

    from .cli import check_writable
    check_writable(args.csv, "--csv")
    if args.nodes is not None and args.nodes < 1:
        raise ValueError(f"--nodes: must be >= 1, got {args.nodes}")
    cluster, plan = load_plan_inputs(args.cluster, args.nodes)
    bom = bill_of_materials(cluster, plan)
    summary = plan_summary(cluster, plan)
    if args.csv:
        try:
            bom.to_csv(args.csv, index=False)
        except OSError as exc:  # (a full disk: found only as the file is written)
            raise ValueError(f"--csv: cannot write {args.csv}: {exc.strerror or exc}") from None
    if args.json:
        clean = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in summary.items()}
        print(json.dumps({"cluster": cluster.name, "summary": clean, "bom": _records(bom)}))
    else:
        _print(cluster, bom, summary)
        if args.csv:
            print(f"bill of materials written to {os.path.abspath(args.csv)}")
    return 0
