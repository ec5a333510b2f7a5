"""Cost of the insight outputs at scale (a benchmark, not a test): traces, figures, traffic matrices.

Usage::

    python benchmarks/insight_benchmark.py                       # 1,024-GPU GPT-3 rung
    python benchmarks/insight_benchmark.py --rungs gpt3-175b-1024 llama3-405b-16384 mixtral-8x7b-1024

Per rung (one process, after simulating the step once) it measures: the rate log the network kept for link
bandwidth over time (entries, MB), the default trace (one rank per pipeline stage, flow arrows, tier
counters) as ``.json`` and ``.json.gz`` — events, MB and seconds —, building the timeline, the stage table,
the node traffic matrix, the 20 busiest links' series, and writing every figure (``save_plots``).
Results go to ``benchmarks/insight-results.csv``.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FIELDS = ["rung", "gpus", "sim_wall_s", "rate_log_entries", "rate_log_mb", "trace_events", "trace_json_mb",
          "trace_json_s", "trace_gz_mb", "trace_gz_s", "timeline_s", "timeline_bars", "stages_s", "traffic_node_s",
          "link_series_s", "plots_s"]


def timed(fn):
    t0 = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - t0


def measure(rung: str) -> dict:
    sys.path.insert(0, ROOT)
    import matplotlib
    matplotlib.use("Agg")
    from simulator.experiment import load_experiment, run_experiment

    exp = load_experiment(os.path.join(HERE, f"{rung}.yaml"))
    result, sim = timed(lambda: run_experiment(exp, force=True))
    ledger = result.record.fabric.network.ledger
    row = {"rung": rung, "gpus": exp.parallel.world_size, "sim_wall_s": sim, "rate_log_entries": len(ledger.rate_t),
           "rate_log_mb": 24 * len(ledger.rate_t) / 1e6}
    with tempfile.TemporaryDirectory() as tmp:
        for ext, key in (("json", "trace_json"), ("json.gz", "trace_gz")):
            path = os.path.join(tmp, f"trace.{ext}")
            n, seconds = timed(lambda p=path: result.to_chrome_trace(p))
            row.update({"trace_events": n, f"{key}_mb": os.path.getsize(path) / 1e6, f"{key}_s": seconds})
        bars, row["timeline_s"] = timed(result.timeline)
        row["timeline_bars"] = len(bars)
        _, row["stages_s"] = timed(lambda: result.stages)
        _, row["traffic_node_s"] = timed(lambda: result.traffic_matrix("node"))
        _, row["link_series_s"] = timed(lambda: result.link_timeseries(top=20))
        _, row["plots_s"] = timed(lambda: result.save_plots(os.path.join(tmp, "figs")))
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rungs", nargs="+", default=["gpt3-175b-1024"], help="benchmark YAML names (no .yaml)")
    ap.add_argument("--out", default=os.path.join(HERE, "insight-results.csv"))
    args = ap.parse_args(argv)
    rows = []
    for rung in args.rungs:
        row = measure(rung)
        rows.append(row)
        print(", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
    with open(args.out, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=FIELDS)
        w.writeheader()
        for r in rows:
            w.writerow({f: r.get(f) for f in FIELDS})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
