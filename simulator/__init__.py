"""clustersim's engine: simulate per-rank op graphs on a cluster fabric.

>>> from topologies import single_server
>>> from workloads.ops import OpGraph
>>> from simulator import simulate
>>> g = OpGraph(8)
>>> _ = g.collective("all_reduce", range(8), 2**30)
>>> round(simulate(g, single_server("H100", 8)).step_time * 1e3, 2)  # ms: NCCL ring at 0.81 of NVLink
5.21
"""

from __future__ import annotations

import time
from importlib.metadata import PackageNotFoundError, version

from topologies.cluster import Cluster
from workloads.ops import OpGraph

from .compute import ComputeModel
from .engine import DeadlockError, Engine
from .fabric import NetworkConfig
from .result import Result
from .sweep import sweep  # shadows the submodule attribute; the module is sys.modules["simulator.sweep"]

__all__ = ["simulate", "Result", "ComputeModel", "NetworkConfig", "DeadlockError", "Engine", "sweep", "__version__"]

try:
    __version__ = version("clustersim")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"


def simulate(graph: OpGraph, cluster: Cluster, compute: ComputeModel | None = None,
             network: NetworkConfig | None = None) -> Result:
    """Run one op graph on ``cluster`` and return its :class:`Result`."""
    t0 = time.perf_counter()
    record = Engine(graph, cluster, compute, network).run()
    return Result(record, sim_wall_s=time.perf_counter() - t0)
