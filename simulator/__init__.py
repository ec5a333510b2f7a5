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

import functools
import sys
import time
import types

from topologies.cluster import Cluster
from workloads.ops import OpGraph

from .compute import ComputeModel
from .engine import DeadlockError, Engine
from .fabric import NetworkConfig
from .result import Result

__all__ = ["simulate", "Result", "ComputeModel", "NetworkConfig", "DeadlockError", "Engine", "sweep", "__version__"]


class _Package(types.ModuleType):
    """This package, with two attributes resolved on first use so that ``import simulator`` (and the CLI, and
    every run) does not pay for them: ``sweep`` (:func:`simulator.sweeps.sweep`; the sweep code imports pandas,
    ~0.6 s) and ``__version__`` (``importlib.metadata``, ~0.05 s)."""

    @property
    def sweep(self):
        patched = self.__dict__.get("_sweep_set")
        if patched is not None:
            return patched
        from .sweeps import sweep
        return sweep

    @sweep.setter
    def sweep(self, value: object) -> None:
        """Importing the compatibility submodule ``simulator.sweep`` sets this attribute to the module: that is
        ignored (the attribute stays the function, as when the package imported it eagerly). Any other value
        (``mock.patch``, a monkeypatch) is kept until deleted."""
        if value is not sys.modules.get(__name__ + ".sweep"):
            self.__dict__["_sweep_set"] = value

    @sweep.deleter
    def sweep(self) -> None:
        self.__dict__.pop("_sweep_set", None)

    @functools.cached_property
    def __version__(self) -> str:
        from importlib.metadata import PackageNotFoundError, version
        try:
            return version("clustersim")
        except PackageNotFoundError:  # running from a source tree that was never installed
            return "0+unknown"

    def __dir__(self) -> list[str]:
        return sorted({*super().__dir__(), "sweep", "__version__"})


sys.modules[__name__].__class__ = _Package


def simulate(graph: OpGraph, cluster: Cluster, compute: ComputeModel | None = None,
             network: NetworkConfig | None = None) -> Result:
    """Run one op graph on ``cluster`` and return its :class:`Result`."""
    t0 = time.perf_counter()
    record = Engine(graph, cluster, compute, network).run()
    return Result(record, sim_wall_s=time.perf_counter() - t0)
