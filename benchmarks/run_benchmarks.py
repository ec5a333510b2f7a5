"""Simulation-speed benchmark (not a test): a ladder of cluster sizes, one fresh process per rung.

Usage::

    python benchmarks/run_benchmarks.py                 # every rung
    python benchmarks/run_benchmarks.py --max-gpus 1024 # rungs up to 1,024 GPUs
    python benchmarks/run_benchmarks.py --fidelity full --max-gpus 256

Rungs: GPT-3 175B in 3D parallelism (TP 8, PP 8, DP = GPUs/64, 96 micro-batches per pipeline) on 64,
256, 1,024 and 4,096 GPUs, and Llama-3 405B on 16,384 GPUs (TP 8, PP 16, DP 128, seq 8192, global batch
2048; see ``llama3-405b-16384.yaml`` for its documented deviations), then the same layout with DP 1,024 on
131,072 GPUs of a three-tier fat tree (``llama3-405b-131072.yaml``; ``--fidelity lockstep`` only),

and a Mixtral-8x7B MoE with expert parallelism on 1,024 GPUs (TP 2, PP 4, DP 128, EP 8; variable-size
all-to-all dispatch/combine per MoE layer).

Per rung it prints the simulated step time, wall time (generation + simulation + metrics), engine events,
rate solves, flows, events per second of wall time, CPU seconds (user + sys, whole process: the figure to
compare on a shared machine) and the peak resident memory of the rung's process,
then the growth exponent ``k`` of wall time ~ GPUs^k fitted over the GPT-3 ladder. Results go to
``benchmarks/results.csv`` (``results-<fidelity>.csv`` with ``--fidelity`` other than fast; ``--out`` elsewhere).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import resource
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

RUNGS = [
    ("gpt3-175b-64", 64, "gpt3-175b-64.yaml"),
    ("gpt3-175b-256", 256, "gpt3-175b-256.yaml"),
    ("gpt3-175b-1024", 1024, "gpt3-175b-1024.yaml"),
    ("gpt3-175b-4096", 4096, "gpt3-175b-4096.yaml"),
    ("llama3-405b-16384", 16384, "llama3-405b-16384.yaml"),
    ("mixtral-8x7b-1024", 1024, "mixtral-8x7b-1024.yaml"),
    ("llama3-405b-131072", 131072, "llama3-405b-131072.yaml"),
]
LOCKSTEP_ONLY = {"llama3-405b-131072"}
"""Rungs run only with ``--fidelity lockstep`` (or when named with ``--only``): 131,072 GPUs in ``fast`` is
one simulated rank per TP group, 16,384 of them."""
FIELDS = ["rung", "gpus", "fidelity", "step_time_s", "mfu", "wall_s", "cpu_s", "repeats", "events", "rate_solves",
          "flows", "events_per_s", "peak_rss_mb", "fits_in_memory"]


def run_rung(path: str, fidelity: str) -> dict:
    """Run one experiment in this process and measure it."""
    sys.path.insert(0, ROOT)
    from simulator.experiment import load_experiment, run_experiment

    t0 = time.perf_counter()
    exp = load_experiment(path)
    result = run_experiment(exp, force=True, fidelity=fidelity)
    s = result.summary  # builds the metrics (exposed communication, bubbles) as a user would
    wall = time.perf_counter() - t0
    usage = resource.getrusage(resource.RUSAGE_SELF)
    rss_kb = usage.ru_maxrss
    # CPU seconds (user + sys) of the whole process: on a shared machine, what the rung cost whatever the load
    return {"step_time_s": s["step_time_s"], "mfu": s["mfu"], "wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime,
            "events": s["events"],
            "rate_solves": s["rate_solves"], "flows": s["flows"], "events_per_s": s["events"] / wall,
            "peak_rss_mb": rss_kb / 1024, "fits_in_memory": s["fits_in_memory"]}


def growth_exponent(rows: list[dict]) -> float | None:
    """Least-squares slope of log(wall) against log(GPUs)."""
    pts = [(math.log(r["gpus"]), math.log(r["wall_s"])) for r in rows if r["wall_s"] > 0]
    if len(pts) < 2:
        return None
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    return sum((x - mx) * (y - my) for x, y in pts) / sxx if sxx else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max-gpus", type=int, default=None, help="skip rungs with more GPUs")
    ap.add_argument("--only", nargs="*", default=None, help="rung names to run")
    ap.add_argument("--fidelity", default="fast", choices=("fast", "full", "lockstep"))
    ap.add_argument("--out", default=None,
                    help="CSV to write (default: benchmarks/results.csv in fast, results-<fidelity>.csv otherwise)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per rung")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run each rung this many times (fresh processes) and keep the fastest, as timeit does: "
                         "the minimum is the least disturbed by other load on the machine")
    ap.add_argument("--_child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.out is None:  # one table per fidelity: a lockstep run does not overwrite the fast one
        args.out = os.path.join(HERE, "results.csv" if args.fidelity == "fast" else f"results-{args.fidelity}.csv")
    if args._child:
        print(json.dumps(run_rung(args._child, args.fidelity)))
        return 0
    rows = []
    print(f"{'rung':22s} {'gpus':>6s} {'step_s':>9s} {'wall_s':>8s} {'cpu_s':>7s} {'events':>10s} {'solves':>9s} "
          f"{'flows':>9s} {'events/s':>9s} {'peak_MB':>8s}")
    for name, gpus, yaml in RUNGS:
        if args.max_gpus is not None and gpus > args.max_gpus:
            continue
        if args.only and name not in args.only:
            continue
        if name in LOCKSTEP_ONLY and args.fidelity != "lockstep" and not args.only:
            continue
        cmd = [sys.executable, os.path.abspath(__file__), "--fidelity", args.fidelity,
               "--_child", os.path.join(HERE, yaml)]
        runs = []
        for _ in range(max(1, args.repeat)):
            try:
                out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, cwd=ROOT)
            except subprocess.TimeoutExpired:
                print(f"{name:22s} {gpus:6d}  timed out after {args.timeout:g} s")
                break
            if out.returncode != 0:
                print(f"{name:22s} {gpus:6d}  failed: {out.stderr.strip().splitlines()[-1:]}")
                break
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
        if not runs:
            continue
        fastest = min(runs, key=lambda r: r["wall_s"])  # every run simulates the same thing (deterministic)
        row = {"rung": name, "gpus": gpus, "fidelity": args.fidelity, "repeats": len(runs), **fastest}
        rows.append(row)
        print(f"{name:22s} {gpus:6d} {row['step_time_s']:9.4f} {row['wall_s']:8.2f} {row['cpu_s']:7.1f} "
              f"{row['events']:10,d} {row['rate_solves']:9,d} {row['flows']:9,d} {row['events_per_s']:9,.0f} "
              f"{row['peak_rss_mb']:8.0f}",
              flush=True)
    ladder = [r for r in rows if r["rung"].startswith("gpt3")]
    dense = [r for r in rows if not r["rung"].startswith("mixtral")]
    k = growth_exponent(ladder)
    if k is not None:
        print(f"growth exponent of wall time vs GPUs (GPT-3 ladder, {len(ladder)} rungs): {k:.2f}")
    k_all = growth_exponent(dense)
    if k_all is not None and len(dense) > len(ladder):
        print(f"growth exponent over the dense rungs: {k_all:.2f}")
    table = rows
    if (args.only or args.max_gpus is not None) and os.path.exists(args.out):
        # a subset re-run replaces its own rows and keeps the table's others (in the ladder's order)
        with open(args.out, newline="") as fh:
            kept = {r["rung"]: r for r in csv.DictReader(fh)}
        kept.update({r["rung"]: r for r in rows})
        order = [name for name, _gpus, _yaml in RUNGS]
        table = sorted(kept.values(), key=lambda r: order.index(r["rung"]) if r["rung"] in order else len(order))
    with open(args.out, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=FIELDS)
        w.writeheader()
        for r in table:
            w.writerow({f: r.get(f) for f in FIELDS})
    print(f"wrote {args.out} ({len(rows)} of its {len(table)} rows re-run)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
