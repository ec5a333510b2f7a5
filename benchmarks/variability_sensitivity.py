"""How the validation entries move under GPU-to-GPU variability (a sensitivity study, not a test).

Usage::

    python benchmarks/variability_sensitivity.py                          # entries up to 1,024 GPUs, spread 1.5%
    python benchmarks/variability_sensitivity.py --spread 0.01 0.02 --max-gpus 600
    python benchmarks/variability_sensitivity.py --only llama3-405b-8192 --fidelity lockstep

Each entry of ``clustersim validate`` runs at its file's fidelity (or ``--fidelity``) with
``faults: [{kind: variability, spread: S, seed: 0}]`` added (every GPU's compute time times ``exp(S z)``, ``z``
one standard-normal draw per GPU: :mod:`topologies.faults`), and the script prints its published, its simulated
(without) and its simulated (with) metric and their errors. The knob is off by default: this shows what a spread
such as Sinha et al.'s (SC'22, "8% average performance variation" between a cluster's GPUs) would do, it does
not tune anything. Results go to ``benchmarks/variability-sensitivity.csv``.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from simulator.experiment import run_experiment  # noqa: E402
from simulator.validation import load_entry, select_entries  # noqa: E402


def _metric(entry, summary: dict) -> float:
    """The entry's metric from a run's summary (as ``clustersim validate`` reads it)."""
    if entry.metric == "tokens_per_gpu_s":
        return float(summary["tokens_per_s"] / summary["world_size"])
    return float(summary[entry.metric])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spread", type=float, nargs="+", default=[0.015])
    parser.add_argument("--max-gpus", type=int, default=1024)
    parser.add_argument("--only", nargs="+", help="these entries (any size)")
    parser.add_argument("--fidelity", help="every entry at this fidelity (default: each file's)")
    parser.add_argument("--out", default=os.path.join(HERE, "variability-sensitivity.csv"))
    args = parser.parse_args(argv)
    rows = []
    print(f"{'entry':28s} {'GPUs':>6s} {'spread':>7s} {'published':>10s} {'without':>9s} {'with':>9s} "
          f"{'err without':>11s} {'err with':>9s} {'wall':>6s}")
    for entry in select_entries(args.only, max_gpus=None if args.only else args.max_gpus):
        for spread in args.spread:
            t0 = time.perf_counter()
            exp = load_entry(entry)
            exp.faults = [{"kind": "variability", "spread": spread, "seed": 0}]
            result = run_experiment(exp, force=True, fidelity=args.fidelity)
            with_ = _metric(entry, result.summary)
            without = with_ * result.summary["fault_slowdown"]  # (the same step on the same GPUs without it)
            row = {"entry": entry.name, "gpus": entry.gpus, "spread": spread, "published": entry.published,
                   "without": without, "with": with_, "error_without_pct": 100 * (without / entry.published - 1),
                   "error_with_pct": 100 * (with_ / entry.published - 1), "wall_s": time.perf_counter() - t0}
            rows.append(row)
            print(f"{entry.name:28s} {entry.gpus:6d} {spread:7.3f} {entry.published:10.4g} {without:9.4g} "
                  f"{with_:9.4g} {row['error_without_pct']:+10.2f}% {row['error_with_pct']:+8.2f}% "
                  f"{row['wall_s']:5.1f}s", flush=True)
    for spread in args.spread:
        mine = [r for r in rows if r["spread"] == spread]
        if mine:
            print(f"# spread {spread}: {len(mine)} entries, mean |error| "
                  f"{sum(abs(r['error_without_pct']) for r in mine) / len(mine):.2f}% without, "
                  f"{sum(abs(r['error_with_pct']) for r in mine) / len(mine):.2f}% with")
    with open(args.out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["entry"])
        writer.writeheader()
        writer.writerows(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
