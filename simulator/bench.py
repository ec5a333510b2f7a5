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
from numbers import Integral, Real

import pandas as pd

from topologies.cluster import Cluster
from workloads.ops import COLLECTIVE_KINDS, OpGraph

from .engine import Engine
from .fabric import NetworkConfig

BENCH_OPS = (*COLLECTIVE_KINDS, "sendrecv")


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' busbw / algbw factor for ``op`` over ``n`` ranks."""
    if op not in BENCH_OPS:
        raise ValueError(f"op: {op!r} unknown; valid: {', '.join(BENCH_OPS)}")
    if isinstance(n, bool) or not isinstance(n, Integral) or n < 1:
        raise ValueError(f"n: must be a number of ranks >= 1, got {n!r}")
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
                    network: NetworkConfig | None = None) -> float:
    """Seconds for one ``op`` of ``nbytes`` over ranks ``0..gpus-1`` of ``cluster``."""
    if not isinstance(cluster, Cluster):
        raise TypeError(f"cluster: must be a Cluster (topologies.build_cluster), got {type(cluster).__name__}")
    if op not in BENCH_OPS:
        raise ValueError(f"op: {op!r} unknown; valid: {', '.join(BENCH_OPS)}")
    if isinstance(gpus, bool) or not isinstance(gpus, Integral) or not 2 <= gpus <= cluster.num_gpus:
        raise ValueError(f"gpus: need 2..{cluster.num_gpus} for this cluster, got {gpus!r}")
    graph = OpGraph(gpus)
    if op == "sendrecv":
        # nccl-tests sendrecv: every rank sends to the next and receives from the previous.
        for r in range(gpus):
            graph.send(r, (r + 1) % gpus, nbytes, traffic_class="bench", stream="send")
            graph.recv(r, (r - 1) % gpus, nbytes, traffic_class="bench", stream="recv")
    else:
        graph.collective(op, list(range(gpus)), nbytes, algorithm=algorithm, traffic_class="bench")
    return Engine(graph, cluster, network=network).run().step_time_s


def collective_sweep(cluster: Cluster, op: str, gpus: int, sizes: Iterable[float], algorithm: str = "auto",
                     network: NetworkConfig | None = None) -> pd.DataFrame:
    """One row per size (each > 0 bytes): ``size_bytes, time_s, algbw_Bps, busbw_Bps``."""
    if isinstance(sizes, (str, bytes)) or not isinstance(sizes, Iterable):
        raise ValueError(f"sizes: must be a list of message sizes in bytes (size_ladder), got {sizes!r:.60}")
    rows = []
    for s in sizes:
        if isinstance(s, bool) or not isinstance(s, Real) or not 0 < s < math.inf:
            raise ValueError(f"sizes: each must be a number of bytes > 0, got {s!r}")
        t = collective_time(cluster, op, gpus, s, algorithm, network)
        algbw = s / t
        rows.append({"size_bytes": s, "time_s": t, "algbw_Bps": algbw, "busbw_Bps": algbw * bus_factor(op, gpus)})
    return pd.DataFrame(rows)
