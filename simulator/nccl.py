"""NCCL's protocols and latencies, as NCCL's own tuner models them, and measured link efficiencies.

A collective in NCCL runs one of three protocols, chosen per call by the
tuner as the one with the least estimated ``latency + bytes / bandwidth``:

``LL``      8-byte stores of 4 data bytes + a 4-byte flag: half the link
            bandwidth, lowest latency.
``LL128``   128-byte lines of 120 data bytes + flag: 0.92 of the bandwidth.
``Simple``  bulk copies with fences: full bandwidth, highest latency.

Constants (NCCL 2.30.7, ``src/graph/tuning.cc``; NVIDIA/nccl tag
``v2.30.7-1``): base latency per collective (``baseLat``, lines 149-155),
latency per algorithm step by the kind of hop it crosses (``hwLat``,
lines 156-176: NVLink, PCIe, network), the per-step network post overhead
(1 µs, x3 for Simple, lines 225-233 and 405-408) and the protocol bandwidth
factors (lines 327-337). The ring latency is
``base + intra_steps·hop(nvlink) + inter_steps·hop(net)`` with
``inter_steps = 2(nodes-1)`` for all-reduce and ``nodes-1`` for all-gather /
reduce-scatter; the tree all-reduce's is ``base + 2·((ranks per node-1)·hop(nvlink)
+ log2(nodes)·hop(net))`` (lines 384-435). :mod:`simulator.collectives` counts
intra- and inter-server steps of every planned transfer the same way.

What NCCL's tuner does not give is how close the Simple protocol comes to a
link's rate at large sizes; that is measured (nccl-tests bus bandwidth at
multi-GB sizes, which equals the bottleneck link's achieved rate for ring
algorithms):

==========  ===========================================  =====================
tier        measurement                                  efficiency
==========  ===========================================  =====================
NVLink      8x A100 (NVSwitch): all-reduce 235, all-      A100 0.77 (GPU spec
            gather 223, reduce-scatter 232 GB/s of 300    ``nvlink_efficiency``)
            (microsoft/superbenchmark nccl logs); 8x
            H100/H200: all-reduce 367 (ring), all-gather  H100/H200 0.81
            361, reduce-scatter 363 GB/s of 450 (NCCL
            2.27.7; NVIDIA GTC'24 slides: 370)
NIC / IB    DGX A100 8x HDR 200 Gb/s: 192 GB/s per node   0.95
            of 200 (NVIDIA; nccl-tests maintainers);
            DGX H100 8x NDR 400 Gb/s: 370-380 of 400,
            "46-49 GB/s per 400 Gb/s NIC"
==========  ===========================================  =====================

NCCL's tuner also carries two corrections of its own model at medium sizes, both
in ``ncclTopoGetAlgoTime`` (``tuning.cc``, NCCL 2.30.7, lines 620-656): a tree
all-reduce reaches only a fraction of its modelled bandwidth, by protocol and
size (:data:`TREE_CORRECTION`: "Trees are not perfectly sticking to the model
for medium sizes"), and a ring all-reduce over several nodes under Simple takes
1.4x its modelled latency (:data:`RING_PLATEAU`, "Plateau effect of ring").
Both are applied to what is simulated, not only to the tuner's choice (the
tree's as time paid with its base latency, priced without contention:
``Fabric._route_plan``). Two DGX A100-class nodes' all-reduce against
nccl-tests (NCCL 2.17, Azure NDmv4; ``tests/test_compute_grounding.py``): 16 MiB
now reads 1.29x the measured bus bandwidth (1.75x without them), 4-128 MiB
1.1-1.64x, from 256 MiB within 7%. Not NCCL's per-channel bandwidth caps
(``perChMaxRingLL128Bws`` and the like feed the tuner's estimate only; no
device code reads them): see below for what the one-node gap turned out to be.

Not modelled: NVLS / NVLink SHARP and in-network (SHARP) reductions (H100
all-reduce reaches ~480 GB/s bus bandwidth with NVLS, against ~365 on a ring;
an all-reduce inside an NVLink domain is therefore up to ~25% pessimistic on
Hopper), NCCL's per-architecture caps of the LL protocol's bandwidth. Inside
one server a ring all-reduce of 4-32 MiB reads 1.1-1.5x the bus bandwidth
nccl-tests measure on 8 A100s (pinned in ``tests/test_compute_grounding.py``),
in logs of one process driving all eight GPUs (microsoft/superbenchmark
``tests/data/nccl_*.log``, ``nThread 1 nGpus 8``, whose 0-byte rows, with no
kernel launched, read 33-35 us a call: a suspect, not a proven cause, since
nccl-tests queues its iterations and such a cost then overlaps the kernels).
Measured one process per GPU, as training runs (Azure/msccl, 8x H100, NCCL
2.18.3), the all-gather is within 12% from 8 MiB to 1 GiB.
"""

from __future__ import annotations

from collections.abc import Mapping

PROTOCOLS = ("LL", "LL128", "Simple")
BANDWIDTH_FACTOR: Mapping[str, float] = {"LL": 0.5, "LL128": 0.92, "Simple": 1.0}
"""Fraction of the Simple protocol's bandwidth each protocol reaches (tuning.cc:327-337)."""

TREE_BANDWIDTH_FACTOR: Mapping[str, float] = {"LL": 1.0 / 3.8, "LL128": 120.0 / 128.0, "Simple": 1.0}
"""The same as NCCL's tuner prices the tree (``tuning.cc``, NCCL 2.30: ``busBw * 1.0/3.8`` for LL,
``busBw * 120.0/128.0`` for LL128 over several nodes, ``7.0/9.0`` on one)."""

TREE_ALL_REDUCE_FACTOR = 0.92
"""NCCL's tuner prices a tree all-reduce at 0.92 of the tree's bandwidth (``busBw * .92``, ``tuning.cc``)."""


TREE_CORRECTION: Mapping[str, tuple[float, ...]] = {
    "LL": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0, 1.0),
    "LL128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0, 1.0),
    "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9),
}
"""NCCL's ``treeCorrectionFactor`` (``tuning.cc``, NCCL 2.30.7): the fraction of its modelled bandwidth a tree
all-reduce reaches, by protocol and ``log2(bytes / 64)`` (64 B to 256 MiB). NCCL 2.30 has 24 entries and reads
the 24th for NVLS trees only (not modelled); a tree reads the first 23, as earlier versions' table holds."""

RING_PLATEAU = 1.4
"""NCCL multiplies a ring all-reduce's latency over several nodes under Simple by this on sm80 and later (1.9
before, which no catalogue GPU is) once each rank's share per channel is 64 bytes or more (``tuning.cc``: "Plateau
effect of ring")."""

RING_PLATEAU_CHANNELS = 32
"""Channels assumed in the plateau's size test (NCCL's ``MAXCHANNELS``; the test ``bytes / (channels · ranks) >=
64`` then holds from 2 KiB a rank: below that a collective is latency-bound by far either way)."""


def tree_correction(protocol: str, nbytes: float) -> float:
    """:data:`TREE_CORRECTION` of a tree all-reduce of ``nbytes`` under ``protocol`` (1 outside its range)."""
    size = int(nbytes) >> 6
    log_size = size.bit_length() - 1  # (NCCL's log2i: floor(log2), -1 for 0)
    return TREE_CORRECTION[protocol][log_size] if 0 <= log_size < 23 else 1.0


def ring_plateau(nbytes: float, ranks: int) -> float:
    """NCCL's factor on a multi-node Simple ring all-reduce's latency (:data:`RING_PLATEAU`), 1 below its size."""
    return RING_PLATEAU if nbytes / (RING_PLATEAU_CHANNELS * ranks) >= 64 else 1.0


def bandwidth_factor(algorithm: str, kind: str, protocol: str, one_node: bool = False,
                     nbytes: float | None = None) -> float:
    """The fraction of the bus bandwidth NCCL's tuner prices a collective at under ``protocol``:
    :data:`BANDWIDTH_FACTOR`, or for the tree :data:`TREE_BANDWIDTH_FACTOR` (LL128 on ``one_node``: 7/9),
    x :data:`TREE_ALL_REDUCE_FACTOR` for all-reduce, and x :func:`tree_correction` of ``nbytes`` when given. The
    tuner's choice reads it (:meth:`simulator.fabric.Fabric.choose`); data moves at the protocols' own factors
    (:data:`BANDWIDTH_FACTOR`: LL's and LL128's wire formats), a tree all-reduce's slowed by its correction."""
    if algorithm != "tree":
        return BANDWIDTH_FACTOR[protocol]
    factor = 7.0 / 9.0 if protocol == "LL128" and one_node else TREE_BANDWIDTH_FACTOR[protocol]
    if kind != "all_reduce":
        return factor
    return factor * TREE_ALL_REDUCE_FACTOR * (1.0 if nbytes is None else tree_correction(protocol, nbytes))

_US = 1e-6
BASE_LATENCY_S: Mapping[str, Mapping[str, float]] = {
    "ring": {"LL": 6.6 * _US, "LL128": 14.0 * _US, "Simple": 8.4 * _US},
    "tree": {"LL": 6.8 * _US, "LL128": 14.0 * _US, "Simple": 8.4 * _US},
}
"""Fixed latency of one collective call, seconds (``baseLat``)."""

HOP_LATENCY_S: Mapping[str, Mapping[str, Mapping[str, float]]] = {
    "nvlink": {"ring": {"LL": 0.6 * _US, "LL128": 1.9 * _US, "Simple": 3.4 * _US},
               "tree": {"LL": 0.6 * _US, "LL128": 1.25 * _US, "Simple": 4.0 * _US}},
    "pcie": {"ring": {"LL": 1.0 * _US, "LL128": 2.5 * _US, "Simple": 5.7 * _US},
             "tree": {"LL": 1.0 * _US, "LL128": 1.9 * _US, "Simple": 4.0 * _US}},
    "net": {"ring": {"LL": 2.7 * _US, "LL128": 4.0 * _US, "Simple": 14.0 * _US},
            "tree": {"LL": 5.0 * _US, "LL128": 8.5 * _US, "Simple": 14.0 * _US}},
}
"""Latency of one algorithm step over a hop of each kind, seconds (``hwLat``)."""

NET_OVERHEAD_S = 1.0 * _US
"""Per-step cost of posting to the network (x3 for Simple); the floor of intra-server steps of a ring
that spans servers (``intraLat = max(intraLat, netOverhead)``, in tuning.cc's ring branch only)."""

NIC_EFFICIENCY = 0.95
"""Fraction of a NIC's (and the fabric's) line rate NCCL reaches at large sizes (see the module table)."""

ALL_TO_ALL_NET_EFFICIENCY = 0.85
"""Fraction of a NIC's line rate an all-to-all's (or alltoallv's) transfers between servers reach at large
sizes: below :data:`NIC_EFFICIENCY`, which rings reach. Published points (per-NIC rate = the bytes each GPU
sends to other servers over the time, against the line rate):

* Azure NDmv4, 2 x 8 A100, 8x HDR 200 Gb/s a node, NCCL 2.17.1, ``alltoall_perf`` 1 and 4 GiB: 37.80 and
  37.81 GB/s bus bandwidth = 20.2 GB/s per 25 GB/s NIC, **0.807** (microsoft/mscclpp,
  ``docs/performance-ndmv4.md``); on the same system all-gather reaches 186 of 200 (0.93) and MSCCL++'s
  all-pairs all-gather 23.8 GB/s per NIC (0.95): the NIC is not the limit, NCCL's send/recv is.
* 2 x 8 A100, 4x 200 Gb/s a node, NCCL 2.18.6, ``alltoall_perf`` 4 GiB: 19.83 GB/s bus bandwidth = 21.2
  GB/s per 25 GB/s NIC, **0.846** (NVIDIA/nccl issue 1138: the proxy of PXN's sends sits on one GPU of
  each NIC pair; moving it to the peer's local rank gave 20.71, 0.88).
* DeepEP's normal kernels, H800 / SM90 with a CX7 400 Gb/s NIC each (deepseek-ai/DeepEP ``README.md``,
  V2, EP 8x2: dispatch 90, combine 81 GB/s logical, half of it to the sender's own node: **0.90, 0.81**
  of 50 GB/s; ``docs/legacy.md``, V1: EP32 58/57, EP64 51/50 GB/s with ~25% and ~12.5% local: **0.86-0.89**).

0.85 is the middle of that range (0.81-0.90) and within 6% of each point. Not a fit to training throughput.
Why NCCL's all-to-all loses it (NVIDIA/nccl issues 1138, 1272; ``NCCL_NCHANNELS_PER_NET_PEER``,
``NCCL_P2P_NET_CHUNKSIZE``): each network peer gets 2 channels of 128 KiB chunks and one proxy thread per
GPU posts every peer's messages in turn. One peer alone reaches the NIC: ``sendrecv_perf`` between nodes reads
24.2 GB/s per 25 GB/s Slingshot NIC (issue 1272, 0.97), so pipeline sends keep :data:`NIC_EFFICIENCY`."""

ALGORITHM_LATENCY_CLASS: Mapping[str, str] = {
    "ring": "ring", "hierarchical": "ring", "direct": "ring", "parameter_server": "ring", "tree": "tree",
}
"""Which of NCCL's latency tables each planned algorithm uses (point-to-point patterns use the ring's)."""


def step_latencies(algorithm: str, protocol: str, spans_servers: bool,
                   intra_kind: str = "nvlink") -> tuple[float, float, float]:
    """``(base, intra-server step, inter-server step)`` latencies in seconds for one collective."""
    cls = ALGORITHM_LATENCY_CLASS.get(algorithm, "ring")
    intra = HOP_LATENCY_S[intra_kind][cls][protocol]
    if spans_servers and cls == "ring":  # ("Inter-node rings still have to launch nsteps * net overhead": the
        # floor is in tuning.cc's ring branch only; a tree's intra-server steps keep their NVLink latency)
        intra = max(intra, NET_OVERHEAD_S * (3 if protocol == "Simple" else 1))
    return BASE_LATENCY_S[cls][protocol], intra, HOP_LATENCY_S["net"][cls][protocol]


MAX_THREADS: Mapping[str, int] = {"LL": 512, "LL128": 640, "Simple": 512}
"""Threads per channel NCCL starts a ring or tree collective with, by protocol (``NCCL_LL_MAX_NTHREADS``,
``NCCL_LL128_MAX_NTHREADS``, ``NCCL_SIMPLE_MAX_NTHREADS``: ``src/include/device.h``; ``maxThreads`` in
``src/graph/tuning.cc``. A ring's Simple drops to 256 threads only where the ring is PCIe-bound, which no
preset here is)."""

THREAD_THRESHOLD: Mapping[str, int] = {"LL": 8, "LL128": 8, "Simple": 64}
"""Bytes each thread must have before NCCL adds a channel (``NCCL_*_THREAD_THRESHOLD``, ``src/include/comm.h``);
a ring's LL threshold is this times the ranks (``threadThresholds``, ``src/graph/tuning.cc``)."""


def collective_channels(algorithm: str, protocol: str, nbytes: float, ranks: int) -> int | None:
    """The most channels NCCL runs a ring or tree collective of ``nbytes`` on; None for other algorithms.

    NCCL prices and picks the algorithm and protocol with every channel, then cuts the channels while a
    channel's threads would each get less than their threshold: ``while (nBytes < nc * nt *
    threadThreshold) nc--`` down to one (``topoGetAlgoInfo``, ``src/enqueue.cc``, NCCL 2.30). ``nBytes`` is
    the whole buffer (an all-gather's output, a reduce-scatter's input), as ``nbytes`` here. So a Simple ring
    needs 32 KiB a channel, LL128 5 KiB, an LL ring 4 KiB per rank of the ring: the 4-byte all-reduce of a
    gradient norm runs on one channel, through one NIC of each server, whatever the communicator's width.
    The count returned is that cut before the communicator's width caps it (the caller's channels do).

    >>> collective_channels("ring", "Simple", 256 * 1024, 16), collective_channels("ring", "LL", 4, 1024)
    (8, 1)
    >>> collective_channels("tree", "LL128", 40 * 1024, 64), collective_channels("direct", "Simple", 1e9, 8)
    (8, None)
    """
    if algorithm not in ("ring", "tree"):
        return None
    per_channel = MAX_THREADS[protocol] * THREAD_THRESHOLD[protocol] * (ranks if algorithm == "ring"
                                                                        and protocol == "LL" else 1)
    return max(1, int(nbytes // per_channel))


def p2p_protocol(nbytes: float, network: bool = False) -> str:
    """Protocol of a point-to-point transfer: LL up to ``NCCL_P2P_LL_THRESHOLD`` (16 KiB), else Simple; over
    the network always Simple (``network``): NCCL allocates no LL buffers for network send/recv connections
    (``NCCL_ALLOC_P2P_NET_LL_BUFFERS`` defaults to 0, ``src/init.cc``, ``src/transport/net.cc``), so a
    1 KiB send to another node pays Simple's latency (2 x 1 A100, mscclpp NDmv4 tables: all-to-all of
    1 KiB 29.8 us against all-gather 16.1)."""
    return "LL" if nbytes <= 16384 and not network else "Simple"
