"""All-to-all and MoE speed benchmark (not a test): one fresh process per rung.

Usage::

    python benchmarks/alltoall_benchmark.py                      # every rung
    python benchmarks/alltoall_benchmark.py --only a2a-64 a2a-512 --repeat 3
    python benchmarks/alltoall_benchmark.py --max-gpus 1024

Rungs:

``a2a-64``
    all_to_all of 1 GiB over 64 H100s on an oversubscribed leaf-spine (8 servers, 2 per leaf, 4 spines,
    2:1): ECMP collisions on the uplinks, every flow in one max-min component.
``a2a-512``, ``a2a-4096``
    all_to_all of 1 GiB over 512 / 4,096 GPUs of the CLI's default cluster (DGX-H100 nodes on a 1:1
    leaf-spine, 16 nodes per leaf): what ``clustersim collective --op all_to_all --gpus N --min-size 1GiB
    --max-size 1GiB`` simulates.
``mixtral-ep8-1024``
    Mixtral 8x7B, TP 2 PP 4 DP 128 EP 8, Zipf routing (``mixtral-8x7b-ep8-1024.yaml``), one step in ``fast``.
``deepseek-ep64-1024``
    DeepSeek-V3-style, PP 16 DP 64 EP 64 (``deepseek-v3-ep64-1024.yaml``), one step in ``fast``.
``mixtral-ep8-1024-bulk``, ``deepseek-ep64-1024-bulk``
    The same steps with ``network.all_to_all: bulk`` (alltoallv dispatch and combine as at most four
    flows each; the default ``auto`` does the same for EP groups under one switch, as both benchmarks'
    are; see docs/DESIGN.md, "Bulk all-to-all").
``deepseek-v3-2048``
    The validation entry ``deepseek-v3-2048-h800`` (DeepSeek-V3, DualPipe over PP 16, EP 64, DP 128 on 2,048
    H800s, DeepEP dispatch, balanced routing, 120 micro-batches), one step in ``lockstep`` whatever
    ``--fidelity`` says: what
    ``clustersim validate --only deepseek-v3-2048-h800 --fidelity lockstep`` simulates.
``mixtral-ep8-1024-grouped``
    Mixtral with ``network.all_to_all: grouped`` (staggered waves, one flow per wave and size: what
    ``auto`` ran for every alltoallv before it used bulk under one switch).

Per rung it prints the simulated time (collective or step), the wall time of the simulation inside the
child, the CPU time (``sys_s`` of it in the kernel) and the wall time of the whole child process
(interpreter start and imports included, as a CLI user waits), engine events, rate solves (instants at
which rates were recomputed), max-min components solved, the point-to-point transfers (``flows``), the
flows the network simulated or replayed for them (``net_flows``: a grouped all-to-all wave is one), calls
replayed from a recorded trajectory and the peak resident memory. CPU time (of the whole child) is the
steadier figure on a shared machine; ``--repeat`` keeps the run with the least of it (every run simulates the
same thing). ``--root`` runs another checkout's simulator (a "before" measurement). Results go to
``benchmarks/alltoall-results.csv``. Figures measured before and after twin and lazy links: README.md,
"All-to-all and MoE speed (issue 15)".
"""

from __future__ import annotations

import argparse
import csv
import gc
import json
import os
import resource
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
GIB = float(2**30)

RUNGS = [
    ("a2a-64", 64, "a2a:64"),
    ("a2a-512", 512, "a2a:512"),
    ("a2a-4096", 4096, "a2a:4096"),
    ("mixtral-ep8-1024", 1024, "mixtral-8x7b-ep8-1024.yaml"),
    ("deepseek-ep64-1024", 1024, "deepseek-v3-ep64-1024.yaml"),
    ("mixtral-ep8-1024-bulk", 1024, "mixtral-8x7b-ep8-1024.yaml@bulk"),
    ("mixtral-ep8-1024-grouped", 1024, "mixtral-8x7b-ep8-1024.yaml@grouped"),
    ("deepseek-ep64-1024-bulk", 1024, "deepseek-v3-ep64-1024.yaml@bulk"),
    ("deepseek-v3-2048", 2048, "../simulator/validation_runs/deepseek-v3-2048-h800.yaml", "lockstep"),
]
FIELDS = ["rung", "gpus", "fidelity", "sim_time_s", "wall_s", "cpu_s", "sys_s", "process_s", "repeats", "events",
          "rate_solves", "component_solves", "flows", "net_flows", "calls", "replays", "peak_rss_mb"]


def _network_counts(network) -> dict:
    """Counters of the flow network (``net_flows``: flows it simulated or replayed, a grouped all-to-all wave
    counting once; ``flows``: the point-to-point transfers they stand for)."""
    flows = network.ledger.flows_completed
    return {"rate_solves": network.rate_solves, "component_solves": getattr(network, "component_solves", 0),
            "flows": flows, "net_flows": getattr(network, "flows_started", flows),
            "replays": getattr(network, "replays", 0), "calls": getattr(network, "calls", 0)}


def run_alltoall(gpus: int) -> dict:
    """One 1 GiB all_to_all over ``gpus`` ranks, as ``clustersim collective`` runs it."""
    from simulator.engine import Engine
    from topologies import build_cluster
    from topologies.builders import leaf_spine
    from workloads.ops import OpGraph

    t0 = time.perf_counter()
    if gpus == 64:
        cluster = leaf_spine("H100", servers=8, gpus_per_server=8, servers_per_leaf=2, spines=4,
                             oversubscription=2)
    else:
        cluster = build_cluster({"preset": "dgx-h100", "nodes": gpus // 8})
    graph = OpGraph(gpus)
    graph.collective("all_to_all", list(range(gpus)), GIB, traffic_class="bench")
    engine = Engine(graph, cluster)
    record = engine.run()
    wall = time.perf_counter() - t0
    return {"sim_time_s": record.step_time_s, "wall_s": wall, "events": record.events,
            **_network_counts(engine.fabric.network)}


def run_step(path: str, fidelity: str, all_to_all: str | None = None) -> dict:
    """One training step of an experiment file, summary included (as ``clustersim run`` builds it);
    ``all_to_all`` overrides the file's ``network.all_to_all``."""
    import dataclasses

    from simulator.experiment import load_experiment, run_experiment

    t0 = time.perf_counter()
    exp = load_experiment(path)
    if all_to_all is not None:
        exp = dataclasses.replace(exp, network=dataclasses.replace(exp.network, all_to_all=all_to_all))
    result = run_experiment(exp, force=True, fidelity=fidelity)
    s = result.summary
    wall = time.perf_counter() - t0
    return {"sim_time_s": s["step_time_s"], "wall_s": wall, "events": s["events"],
            **_network_counts(result.record.fabric.network)}


def child(spec: str, fidelity: str, root: str) -> dict:
    sys.path.insert(0, root)
    if spec.startswith("a2a:"):
        out = run_alltoall(int(spec[4:]))
    else:
        path, _, mode = spec.partition("@")
        out = run_step(os.path.join(HERE, path), fidelity, mode or None)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    out["peak_rss_mb"] = usage.ru_maxrss / 1024
    out["cpu_s"] = usage.ru_utime + usage.ru_stime  # the whole process: imports included
    # The kernel's share (first touches of fresh memory, mostly): 0.36 to 1.7 s on the same DeepSeek EP64 run of
    # this VM, 2026-12-02, as the host's page-fault cost varied; compare user time (cpu_s - sys_s) when it swings.
    out["sys_s"] = usage.ru_stime
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", nargs="*", default=None, help="rung names to run")
    ap.add_argument("--max-gpus", type=int, default=None, help="skip rungs with more GPUs")
    ap.add_argument("--fidelity", default="fast", choices=("fast", "full", "lockstep"), help="of the MoE rungs")
    ap.add_argument("--repeat", type=int, default=1, help="fresh processes per rung; the fastest is kept")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    ap.add_argument("--out", default=os.path.join(HERE, "alltoall-results.csv"))
    ap.add_argument("--root", default=ROOT, help="checkout whose simulator the rungs import (default: this one)")
    ap.add_argument("--_child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args._child:
        print(json.dumps(child(args._child, args.fidelity, os.path.abspath(args.root))))
        gc.freeze()  # exit as the clustersim script does (simulator.cli.console): no final walk of the heap
        return 0
    print(f"{'rung':20s} {'gpus':>5s} {'sim_s':>10s} {'wall_s':>7s} {'cpu_s':>7s} {'sys_s':>6s} "
          f"{'proc_s':>7s} {'events':>10s} {'solves':>8s} {'comps':>8s} {'flows':>10s} {'net_flows':>10s} "
          f"{'replays':>8s} {'peak_MB':>8s}")
    rows = []
    for name, gpus, spec, *fixed in RUNGS:
        fidelity = fixed[0] if fixed else args.fidelity
        if (args.only and name not in args.only) or (args.max_gpus is not None and gpus > args.max_gpus):
            continue
        cmd = [sys.executable, os.path.abspath(__file__), "--fidelity", fidelity, "--root", args.root,
               "--_child", spec]
        runs = []
        for _ in range(max(1, args.repeat)):
            t0 = time.perf_counter()
            try:
                out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, cwd=args.root)
            except subprocess.TimeoutExpired:
                print(f"{name:20s} {gpus:5d}  timed out after {args.timeout:g} s", flush=True)
                break
            if out.returncode != 0:
                print(f"{name:20s} {gpus:5d}  failed: {out.stderr.strip().splitlines()[-1:]}", flush=True)
                break
            run = json.loads(out.stdout.strip().splitlines()[-1])
            run["process_s"] = time.perf_counter() - t0
            runs.append(run)
        if not runs:
            continue
        best = min(runs, key=lambda r: r["cpu_s"])
        row = {"rung": name, "gpus": gpus, "fidelity": fidelity if spec.endswith(".yaml") else "-",
               "repeats": len(runs), **best}
        rows.append(row)
        print(f"{name:20s} {gpus:5d} {row['sim_time_s']:10.6f} {row['wall_s']:7.2f} {row['cpu_s']:7.2f} "
              f"{row['sys_s']:6.2f} "
              f"{row['process_s']:7.2f} {row['events']:10,d} {row['rate_solves']:8,d} {row['component_solves']:8,d} "
              f"{row['flows']:10,d} {row['net_flows']:10,d} {row['replays']:8,d} {row['peak_rss_mb']:8.0f}",
              flush=True)
    with open(args.out, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=FIELDS)
        w.writeheader()
        for r in rows:
            w.writerow({f: r.get(f) for f in FIELDS})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
