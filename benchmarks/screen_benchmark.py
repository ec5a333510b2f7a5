"""Screening benchmark (not a test): the 1,024-GPU GPT-3 layout sweep in ``screen`` and in ``fast``.

Runs ``examples/sweep-gpt3-1024.yaml`` (38 layouts x 3 oversubscription ratios = 114 points, 30 feasible)
with ``fidelity: screen`` in a fresh sweep, then in ``fast`` (the reference: every flow simulated), and
prints

* the screen's speed: points and feasible layouts per minute of wall time, and CPU seconds (this process
  and its workers) per point;
* its agreement with ``fast`` over the feasible layouts: Spearman's rank correlation of step time, how
  many of the five best layouts are the same (and whether in the same order), and the largest and mean
  relative error of the screened step time.

The ``fast`` table is written to ``--fast-table`` and reused when it is there (a sweep resumes from its
output file), because it takes tens of minutes on two cores; delete it to re-simulate.

    python benchmarks/screen_benchmark.py                      # 2 workers, reuses the fast table
    python benchmarks/screen_benchmark.py --jobs 1 --fast-table /tmp/fast.csv
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time

import pandas as pd

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from simulator.sweeps import sweep  # noqa: E402 - after the path set-up

SWEEP = os.path.join(ROOT, "examples", "sweep-gpt3-1024.yaml")
KEYS = ["cluster.oversubscription", "parallel.tp", "parallel.pp", "parallel.dp"]


def _cpu_s() -> float:
    """CPU seconds of this process and of its finished workers (user + system)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def spearman(a: pd.Series, b: pd.Series) -> float:
    """Spearman's rank correlation (Pearson's on average ranks)."""
    return float(a.rank().corr(b.rank()))


def _plain(key: tuple) -> tuple:
    """A layout key with plain ints (numpy scalars print as ``np.int64(4)``)."""
    return tuple(int(x) for x in key)


def compare(screened: pd.DataFrame, fast: pd.DataFrame, k: int = 5) -> dict:
    """Agreement of a screened table with the ``fast`` one over the layouts feasible in both."""
    s = screened[screened["status"] == "ok"].set_index(KEYS)["step_time_s"]
    f = fast[fast["status"] == "ok"].set_index(KEYS)["step_time_s"]
    both = s.index.intersection(f.index)
    s, f = s.loc[both], f.loc[both]
    err = (s / f - 1).abs()
    top_s, top_f = list(s.sort_values(kind="stable").index[:k]), list(f.sort_values(kind="stable").index[:k])
    return {"layouts": len(both), "spearman": spearman(s, f), "top_overlap": len(set(top_s) & set(top_f)),
            "top_same_order": top_s == top_f, "max_rel_err": float(err.max()), "mean_rel_err": float(err.mean()),
            "worst": _plain(err.idxmax()), "top_screen": [_plain(x) for x in top_s],
            "top_fast": [_plain(x) for x in top_f]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2, help="sweep workers (default 2)")
    ap.add_argument("--fast-table", default=os.path.join(HERE, "screen-fast-gpt3-1024.csv"),
                    help="the fast sweep's output, reused when present")
    ap.add_argument("--sweep", default=SWEEP, help="the sweep file (default examples/sweep-gpt3-1024.yaml)")
    args = ap.parse_args(argv)

    t0, c0 = time.perf_counter(), _cpu_s()
    screened = sweep(args.sweep, fidelity="screen", jobs=args.jobs, progress=False)
    wall, cpu = time.perf_counter() - t0, _cpu_s() - c0
    n, ok = len(screened), int((screened["status"] == "ok").sum())
    print(f"screen: {n} points ({ok} feasible) in {wall:.1f} s wall, {cpu:.1f} s CPU, {args.jobs} workers: "
          f"{60 * n / wall:.0f} points/min, {60 * ok / wall:.0f} feasible layouts/min; "
          f"{1000 * cpu / n:.0f} ms CPU per point")

    t0, c0 = time.perf_counter(), _cpu_s()
    fast = sweep(args.sweep, fidelity="fast", jobs=args.jobs, progress=False, output=args.fast_table)
    lock = os.path.join(os.path.dirname(os.path.abspath(args.fast_table)), f".{os.path.basename(args.fast_table)}.lock")
    if os.path.exists(lock):  # the sweep's output lock; nothing holds it now
        os.unlink(lock)
    print(f"fast:   {len(fast)} points in {time.perf_counter() - t0:.1f} s wall, {_cpu_s() - c0:.1f} s CPU "
          f"(rows already in {args.fast_table} are reused; per-point simulation: "
          f"{fast.loc[fast['status'] == 'ok', 'sim_wall_s'].sum():.0f} s wall in all)")

    c = compare(screened, fast)
    print(f"agreement over {c['layouts']} feasible layouts: Spearman {c['spearman']:.4f}; top-5 overlap "
          f"{c['top_overlap']}/5 ({'same order' if c['top_same_order'] else 'different order'}); relative error "
          f"of step time max {100 * c['max_rel_err']:.2f}% (os, tp, pp, dp = {c['worst']}), "
          f"mean {100 * c['mean_rel_err']:.2f}%")
    print("top-5 screen:", c["top_screen"])
    print("top-5 fast:  ", c["top_fast"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
