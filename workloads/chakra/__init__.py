"""MLCommons Chakra execution traces in and out of clustersim op graphs.

Chakra is the field's shared workload format: one file per rank of compute
and communication nodes with dependencies, produced from PyTorch and run by
ASTRA-sim. :func:`write_chakra` writes any full :class:`~workloads.ops.OpGraph`
as such a trace, so ASTRA-sim can run the workload clustersim ran;
:func:`read_chakra` turns a trace (clustersim's or anyone's) back into an op
graph for any clustersim fabric. Schema and framing: :mod:`workloads.chakra.schema`.

What a node carries (the attributes ASTRA-sim's feeder reads)
-------------------------------------------------------------
=================  =====================================================================
COMP_NODE          ``num_ops`` (FLOPs, int64), ``tensor_size`` (HBM bytes, uint64),
                   ``duration_micros`` (integer µs) when the op has a fixed duration or a
                   duration model is given; ``is_cpu_op`` false
COMM_COLL_NODE     ``comm_type`` (CollectiveCommType, int64), ``comm_size`` (int64 bytes,
                   the buffer each rank puts in: for ALL_GATHER and GATHER ``S/n`` of
                   clustersim's gathered ``S``, else ``S``), ``pg_name`` (process group)
COMM_SEND_NODE     ``comm_src`` = this rank, ``comm_dst``, ``comm_size``, ``comm_tag`` (int32)
COMM_RECV_NODE     ``comm_src``, ``comm_dst`` = this rank, ``comm_size``, ``comm_tag``
METADATA_NODE      the process groups: ``inputs.values`` = ``['[{"pg_name": "1", "ranks":
                   [..]}, ..]']``, PyTorch's ``process_group:init`` form, which ASTRA-sim
                   parses; the same map is written as ``<prefix>.comm_group.json`` for
                   ASTRA-sim's ``--comm-group-configuration``
=================  =====================================================================

Dependencies are ``data_deps``. A clustersim stream (ops of one ``(rank,
stream)`` run in order) becomes a data dependency on the previous node of
the stream. A coarsened collective (``count`` > 1) becomes ``count`` chained
nodes, so ASTRA-sim pays its latency ``count`` times as clustersim does.
Everything else clustersim needs (category, GEMM shape, exact float sizes,
stream, traffic class, layer / micro-batch / stage, algorithm, all-to-all-v
split) rides along as attributes named ``clustersim.*``, which ASTRA-sim
ignores; the kernels of fused compute ops are tables in each file's
GlobalMetadata (``clustersim.parts.<k>.*``), once per distinct tuple, which
a node names by index (``clustersim.parts``). Reading them back is lossless:
the same op graph, step time and bytes on every link (``tests/test_chakra.py``).
Each file's GlobalMetadata also records the GPU and compute settings the
durations were modelled with (``clustersim.gpu``, ``clustersim.compute``:
the CLI re-times the trace with them when no experiment file says otherwise)
and a CRC-32 of its nodes (``clustersim.digest``): a file edited after it was
written (``duration_micros`` or ``comm_size`` changed by another tool) is read
by its Chakra fields only, with a :class:`ChakraWarning`, since its
``clustersim.*`` attributes may no longer describe it.
A full graph is needed (one program per rank); a graph of representatives or
a dependency across ranks is refused.

Reading a trace clustersim did not write
----------------------------------------
* Files ``<prefix>.<rank>.et`` for ranks ``0..N-1`` (ASTRA-sim's naming),
  optionally gzipped.
* Dependencies: ``data_deps`` and ``ctrl_deps``, both honoured (Chakra's
  ``src/feeder/et_feeder.cpp``, which ASTRA-sim reads traces with, waits on
  ``data_deps`` only; :func:`write_chakra` writes every dependency as
  ``data_deps``, so its traces run alike in both). METADATA and INVALID nodes take no time (their dependencies pass
  through). MEM_LOAD / MEM_STORE nodes (remote memory) are not modelled: a
  one-line :class:`ChakraError` names the node, file and type.
* COMP_NODE: ``duration_micros`` > 0 makes a fixed-duration op (category
  ``fixed``); otherwise ``num_ops`` makes a ``gemm`` op of that many FLOPs
  over ``tensor_size`` bytes; otherwise a zero-time op.
* Collectives: ALL_REDUCE, REDUCE, ALL_GATHER, GATHER, BROADCAST, ALL_TO_ALL,
  REDUCE_SCATTER (and REDUCE_SCATTER_BLOCK, the same with equal blocks);
  BARRIER is an all-reduce of one float32, 4 bytes (what ``torch.distributed.barrier``
  runs on NCCL), so it pays that all-reduce's latency; a collective of 0 bytes
  takes no time, as NCCL discards one of count 0 unlaunched; SCATTER is refused.
  A missing or ``"0"`` ``pg_name`` means all ranks (ASTRA-sim's rule) unless group ``"0"`` is defined; the root of
  REDUCE/GATHER/BROADCAST is the group's first rank (Chakra names no root).
* Resources follow ASTRA-sim's: per rank one compute node and one
  communication node at a time (clustersim streams ``compute`` and
  ``comm``; CPU nodes on ``cpu``), receives on their own stream per source
  so a posted receive never blocks a send. A stream runs in a fixed order
  (dependencies first, then lowest node id), where ASTRA-sim issues whichever
  node is ready; traces that rely on that freedom to avoid a deadlock
  deadlock here (reported, exit 3 in the CLI).
"""

from .read import ChakraWarning, TraceEditedWarning, name_trace_nodes, read_chakra, trace_files, trace_settings
from .schema import FORMAT, PREFIX, ChakraError
from .write import DurationModel, write_chakra

__all__ = ["ChakraError", "ChakraWarning", "TraceEditedWarning", "write_chakra", "read_chakra", "trace_files",
           "trace_settings", "name_trace_nodes", "DurationModel", "PREFIX", "FORMAT"]
