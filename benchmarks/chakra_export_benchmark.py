"""Wall time of ``--export-chakra`` (not a test): building every rank's program, then writing the trace.
Usage: ``python benchmarks/chakra_export_benchmark.py [--root CHECKOUT] CONFIG.yaml [OUT_DIR]``.

``--root`` times another checkout (e.g. ``git archive base | tar -x -C /tmp/old``) on the same machine, so
that two versions can be compared, and their folders compared file by file (``cmp``, ``sha256sum``): the
trace must stay byte-identical. Prints the seconds of the build (``build_step`` with every rank's program)
and of the write (``write_chakra``), the rank files and the bytes written. docs/DESIGN.md, "Chakra traces",
reads it.
"""
import argparse
import os
import sys
import tempfile
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("config")
    p.add_argument("out", nargs="?", help="folder to write the trace into (default: a temporary one, removed)")
    p.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    args = p.parse_args()
    sys.path.insert(0, args.root)
    from simulator.engine import paused_gc
    from simulator.experiment import build_step, load_experiment
    from workloads.chakra import write_chakra

    exp = load_experiment(args.config)
    with tempfile.TemporaryDirectory() as tmp, paused_gc():
        out = args.out or tmp
        t0 = time.perf_counter()
        step = build_step(exp, None, True)
        t1 = time.perf_counter()
        files = write_chakra(step.graph, out, compute=exp.compute_model())
        t2 = time.perf_counter()
        size = sum(f.stat().st_size for f in files)
    print(f"{args.config}: {step.graph.world_size} ranks, {len(step.graph.ops):,} ops; build {t1 - t0:.1f} s, "
          f"write {t2 - t1:.1f} s ({len(files)} files, {size / 1e9:.2f} GB), export {t2 - t0:.1f} s")


if __name__ == "__main__":
    main()
