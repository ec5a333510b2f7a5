"""Where one simulated step's time goes, phase by phase (a measurement, not a test).

Usage::

    python benchmarks/phase_breakdown.py                         # the two MoE rungs of issue 15
    python benchmarks/phase_breakdown.py benchmarks/gpt3-175b-1024.yaml --fidelity lockstep

Each file runs in a fresh process, as ``clustersim run FILE --no-progress`` would (the collector paused where
the CLI pauses it), with a clock around the parts of the run that the speed work has to choose between:

``import``      importing :mod:`simulator.cli` (numpy, networkx, yaml, the package);
``load``        reading the file and building the cluster (:func:`simulator.experiment.load_experiment`);
``generate``    the workload generator (:func:`workloads.training.training_step`: op graph, routing draws);
``durations``   timing every compute op (:func:`simulator.compute.op_durations`, the engine's duration pass);
``match``       pairing the members of each collective and send (:func:`simulator.engine._match`);
``plan``        collective plans and routes (:meth:`simulator.fabric.Fabric.phases` and
                ``replicated_phases``; bulk all-to-all layouts and weights);
``network``     the flow network's work at each instant (``FlowNetwork.start_flows`` and ``_on_wake``:
                arrivals, departures, max-min re-solves) less the planning and the engine's callbacks (a
                collective's end) it calls;
``engine``      the rest of :meth:`simulator.engine.Engine.run` (SimPy's loop, issuing ops, ends, count-downs);
``metrics``     :func:`simulator.experiment.attach_training_metrics` (stage table, breakdowns, link tables);
``other``       the rest of :func:`simulator.experiment.run_experiment` (memory model, engine set-up: fabric,
                routes' tables) and of this script (the printed summary of ``clustersim run`` is left out).

Each clock counts the outermost call only (a phase that calls itself, or another phase's function inside its
own, is not counted twice: ``plan`` inside ``network`` is moved to ``plan``). Wrapping costs ~1 µs per call of a
wrapped function, which lands in the caller's phase, so compare breakdowns made by this script with each other,
not with ``alltoall_benchmark.py``'s totals. Times are wall clock of the child (on a quiet machine ~CPU time).
Results go to ``benchmarks/phase-breakdown.csv``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DEFAULT_FILES = ["mixtral-8x7b-ep8-1024.yaml", "deepseek-v3-ep64-1024.yaml"]
PHASES = ["import", "load", "generate", "durations", "match", "plan", "network", "engine", "metrics", "other"]


def _child(path: str, fidelity: str | None) -> dict:
    """Run ``path`` in this process with clocks around the phases; the seconds per phase (and the total)."""
    start = time.perf_counter()
    import simulator.cli  # noqa: F401  (the CLI's imports, timed as a user waits for them)
    from simulator import engine, experiment, fabric, network
    spent = dict.fromkeys(PHASES, 0.0)
    spent["import"] = time.perf_counter() - start
    stack: list[str] = []  # phases whose clock is running, innermost last

    def clocked(phase: str, func):
        def wrapper(*args, **kwargs):
            if stack and stack[-1] == phase:  # (re-entered: the outer call's clock runs)
                return func(*args, **kwargs)
            t0 = time.perf_counter()
            stack.append(phase)
            try:
                return func(*args, **kwargs)
            finally:
                stack.pop()
                dt = time.perf_counter() - t0
                spent[phase] += dt
                if stack:  # (the caller's clock ran too: take this call out of it)
                    spent[stack[-1]] -= dt
        return wrapper

    for owner, name, phase in [
            (experiment, "load_experiment", "load"), (experiment, "training_step", "generate"),
            (engine, "op_durations", "durations"), (engine, "_match", "match"),
            (fabric.Fabric, "phases", "plan"), (fabric.Fabric, "replicated_phases", "plan"),
            (network.FlowNetwork, "start_flows", "network"), (network.FlowNetwork, "_on_wake", "network"),
            (engine.Engine, "run", "engine"), (experiment, "attach_training_metrics", "metrics")]:
        setattr(owner, name, clocked(phase, getattr(owner, name)))
    # A collective's last flow ends inside the network's update, which calls the engine back there (the op's end,
    # its dependents issued): that is the engine's time, not the network's.
    run_phases = fabric.Fabric.run_phases
    fabric.Fabric.run_phases = lambda self, phases, traffic_class, on_done: run_phases(
        self, phases, traffic_class, clocked("engine", on_done))

    exp = experiment.load_experiment(path)
    result = experiment.run_experiment(exp, force=True, fidelity=fidelity)
    total = time.perf_counter() - start
    spent["other"] = total - sum(spent[p] for p in PHASES if p != "other")
    return {"file": os.path.basename(path), "fidelity": fidelity or exp.fidelity, "step_time_s": result.step_time,
            "events": result.events, **{f"{p}_s": spent[p] for p in PHASES},
            "total_s": total}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="*", help="experiment files (default: the MoE rungs of issue 15)")
    ap.add_argument("--fidelity", default=None, choices=("fast", "full", "lockstep"),
                    help="override the files' fidelity")
    ap.add_argument("--out", default=os.path.join(HERE, "phase-breakdown.csv"))
    ap.add_argument("--_child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args._child:
        print(json.dumps(_child(args._child, args.fidelity)))
        return 0
    files = args.files or [os.path.join(HERE, f) for f in DEFAULT_FILES]
    rows = []
    for path in files:
        cmd = [sys.executable, os.path.abspath(__file__), "--_child", os.path.abspath(path)]
        if args.fidelity:
            cmd += ["--fidelity", args.fidelity]
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        if done.returncode:
            print(f"{path}: failed\n{done.stderr.strip()}", file=sys.stderr)
            return 1
        row = json.loads(done.stdout.strip().splitlines()[-1])
        rows.append(row)
        parts = "  ".join(f"{p} {row[p + '_s']:.2f}" for p in PHASES)
        print(f"{row['file']} ({row['fidelity']}): total {row['total_s']:.2f} s = {parts}", flush=True)
    with open(args.out, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
