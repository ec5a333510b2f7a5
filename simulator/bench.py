"""A simulated nccl-tests: time one collective over a range of sizes.

Bandwidth vocabulary follows NVIDIA nccl-tests' PERFORMANCE.md: ``algbw =
S / t`` and ``busbw = algbw · factor`` with factor ``2(n-1)/n`` for
all_reduce, ``(n-1)/n`` for all_gather, reduce_scatter, all_to_all and
gather, and 1 for broadcast, reduce and send/recv. busbw is comparable to
the hardware's per-GPU link bandwidth whatever the number of ranks.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import pandas as pd

from topologies.cluster import Cluster
from workloads.ops import COLLECTIVE_KINDS, OpGraph

from .engine import Engine
from .fabric import NetworkConfig

BENCH_OPS = (*COLLECTIVE_KINDS, "sendrecv")


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' busbw / algbw factor for ``op`` over ``n`` ranks."""
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all", "gather"):
        return (n - 1) / n
    return 1.0


MAX_BYTES = float(2**50)
"""The largest message one ``clustersim collective`` sweep simulates (1 PiB)."""
MAX_SIZES = 1000
"""The most message sizes one ``clustersim collective`` sweep simulates."""


def size_ladder(min_bytes: float, max_bytes: float, factor: float = 2.0) -> list[float]:
    """Sizes from ``min_bytes`` to ``max_bytes`` inclusive, multiplying by ``factor`` (nccl-tests ``-f``), in whole
    bytes (each distinct once: a factor close to 1 repeats a small size otherwise)."""
    if not 1 <= min_bytes <= max_bytes <= MAX_BYTES:
        raise ValueError(f"--min-size/--max-size: need 1 B <= min-size <= max-size <= 1 PiB, got {min_bytes:g} "
                         f"and {max_bytes:g} bytes")
    if min_bytes != math.floor(min_bytes) or max_bytes != math.floor(max_bytes):
        raise ValueError(f"--min-size/--max-size: need whole numbers of bytes, got {min_bytes:g} and {max_bytes:g}")
    if not factor > 1 or not math.isfinite(factor):
        raise ValueError(f"--step-factor: must be a finite number > 1, got {factor}")
    count = math.floor(math.log(max_bytes / min_bytes) / math.log(factor) + 1e-9) + 1
    if count > MAX_SIZES:
        raise ValueError(f"--step-factor: {factor} gives {count:,} sizes from {min_bytes:g} to {max_bytes:g} bytes; "
                         f"the most is {MAX_SIZES} (use a larger factor)")
    sizes, s = [], float(min_bytes)
    while s <= max_bytes * (1 + 1e-12):
        whole = float(min(round(s), max_bytes))  # whole bytes, as nccl-tests' size_t sizes
        if not sizes or whole > sizes[-1]:
            sizes.append(whole)
        s *= factor
    return sizes


def collective_time(cluster: Cluster, op: str, gpus: int, nbytes: float, algorithm: str = "auto",
                    network: NetworkConfig | None = None, host_overhead_s: float = 0.0) -> float:
    """Seconds for one ``op`` of ``nbytes`` over ranks ``0..gpus-1`` of ``cluster``, plus ``host_overhead_s``.

    ``host_overhead_s`` is a per-call cost of the benchmark harness, not of NCCL's kernels: nccl-tests run as one
    process driving every GPU (``nThread 1 nGpus 8``, ``-g 8``) issues the eight calls of each iteration from
    one thread, and its 0-byte rows, for which NCCL launches no kernel at all (``taskAppend``, ``src/enqueue.cc``:
    "Empty collectives can be discarded"), read 33-35 us per call on 8 A100s (microsoft/superbenchmark
    tests/data/nccl_*.log) against 9.5-17 us for a 1 KiB collective run one process per GPU (mscclpp, msccl).
    Pass that 0-byte time to compare with such a log; leave it 0 for training, where each rank's process
    launches its own collectives ahead of the GPU and this cost is not on the GPU's critical path."""
    if not (host_overhead_s >= 0 and math.isfinite(host_overhead_s)):
        raise ValueError(f"host_overhead_s: must be a finite time >= 0 s, got {host_overhead_s!r}")
    if op not in BENCH_OPS:
        raise ValueError(f"op: {op!r} unknown; valid: {', '.join(BENCH_OPS)}")
    if not 2 <= gpus <= cluster.num_gpus:
        raise ValueError(f"gpus: need 2..{cluster.num_gpus} for this cluster, got {gpus}")
    graph = OpGraph(gpus)
    if op == "sendrecv":
        # nccl-tests sendrecv: every rank sends to the next and receives from the previous.
        for r in range(gpus):
            graph.send(r, (r + 1) % gpus, nbytes, traffic_class="bench", stream="send")
            graph.recv(r, (r - 1) % gpus, nbytes, traffic_class="bench", stream="recv")
    else:
        graph.collective(op, list(range(gpus)), nbytes, algorithm=algorithm, traffic_class="bench")
    return Engine(graph, cluster, network=network).run().step_time_s + host_overhead_s


def collective_sweep(cluster: Cluster, op: str, gpus: int, sizes: Iterable[float], algorithm: str = "auto",
                     network: NetworkConfig | None = None, host_overhead_s: float = 0.0) -> pd.DataFrame:
    """One row per size: ``size_bytes, time_s, algbw_Bps, busbw_Bps`` (``host_overhead_s``: see
    :func:`collective_time`)."""
    rows = []
    for s in sizes:
        t = collective_time(cluster, op, gpus, s, algorithm, network, host_overhead_s)
        algbw = s / t
        rows.append({"size_bytes": s, "time_s": t, "algbw_Bps": algbw, "busbw_Bps": algbw * bus_factor(op, gpus)})
    return pd.DataFrame(rows)
