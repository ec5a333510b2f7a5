"""Per-op cost floor of the generator API and the engine (not a test): what one op costs when it does nothing
else. Usage: ``python benchmarks/per_op_floor.py [root]`` (``root``: another checkout, default this one).

Two graphs of 512 ranks and 204,800 ops on 64 DGX-H100 nodes: (1) 400 chained compute ops per rank;
(2) 200 compute ops and 200 two-rank all-gathers over NVLink per rank (each all-gather replayed by the flow
network once its shape is recorded). Prints seconds and microseconds per op of building the graph through
``OpGraph``'s public builders and of ``Engine.run``; docs/DESIGN.md, "What the MoE targets need", reads them.
"""
import os
import sys
import time

sys.path.insert(0, sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from simulator.engine import Engine  # noqa: E402
from topologies import build_cluster  # noqa: E402
from workloads.ops import OpGraph  # noqa: E402

RANKS, OPS_PER_RANK = 512, 400


def graph(collectives: bool) -> OpGraph:
    g = OpGraph(RANKS)
    for r in range(RANKS):
        for k in range(OPS_PER_RANK):
            if not (collectives and k % 2):
                g.compute(r, duration_s=1e-4 * (1 + (k % 7)), category="fixed", name="c")
    if collectives:
        for _ in range(OPS_PER_RANK // 2):
            for r in range(0, RANKS, 2):
                g.collective("all_gather", [r, r + 1], 1e6, algorithm="ring")
    return g


def main() -> None:
    cluster = build_cluster({"preset": "dgx-h100", "nodes": 64})
    for collectives in (False, True):
        t = time.perf_counter()
        g = graph(collectives)
        built = time.perf_counter() - t
        t = time.perf_counter()
        record = Engine(g, cluster).run()
        ran = time.perf_counter() - t
        n = len(g.ops)
        print(f"{'compute + all-gathers' if collectives else 'compute only':22s} ops {n:,}  build {built:.2f} s "
              f"({built / n * 1e6:.1f} us/op)  engine {ran:.2f} s ({ran / n * 1e6:.1f} us/op)  "
              f"step {record.step_time_s:.4f} s")


if __name__ == "__main__":
    main()
