"""``clustersim run --chakra DIR`` and ``clustersim run FILE --export-chakra DIR``: Chakra traces on the command line.

``--chakra DIR`` simulates the trace in ``DIR`` (one ``<prefix>.<rank>.et`` per
rank, read by :func:`workloads.chakra.read_chakra`) instead of generating a
training step. The workload is the trace; the cluster is ``--cluster
PRESET[:NODES]`` or ``--cluster FILE.yaml``, else the ``cluster:`` section of
the experiment FILE if one is given, else DGX-H100 nodes enough for the
trace's ranks. FILE's ``network``, ``compute``, ``faults`` and
``training.dtype`` apply too; its model, parallel, moe and options sections
describe a generated step and are not used.

``--export-chakra DIR`` also writes the experiment's step as a Chakra trace
(every rank's program, whatever the fidelity, with compute durations from the
experiment's compute model) after simulating it as usual, so ASTRA-sim can
run the same workload. With ``--chakra`` it re-exports the trace read.

Kept out of :mod:`simulator.cli`, which only registers the options and calls in.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import time
import warnings

from topologies import build_cluster
from topologies.cluster import Cluster
from topologies.faults import compute_slowdown
from topologies.loader import preset_section
from workloads.errors import with_prefix
from workloads.ops import FP8_GEMM_CATEGORIES, Compute


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The Chakra options of ``clustersim run``."""
    p.add_argument("--chakra", metavar="DIR", help="simulate the Chakra trace in DIR (<prefix>.<rank>.et, one file "
                   "per rank; or DIR/PREFIX) instead of generating a step; FILE is then optional and only its "
                   "cluster, network, compute and faults sections apply")
    p.add_argument("--cluster", metavar="PRESET[:NODES]|FILE.yaml",
                   help="with --chakra: the cluster, a preset, PRESET:NODES, a cluster YAML or a .graphml (default: "
                   "FILE's, else DGX-H100 nodes for the trace's ranks)")
    p.add_argument("--export-chakra", metavar="DIR", help="also write the step as a Chakra trace into DIR (every "
                   "rank's program, one file per rank, for ASTRA-sim; DIR is created, with any missing parent "
                   "folders)")


def check_arguments(args: argparse.Namespace) -> None:
    """Refuse combinations that make no sense, and a missing ``protobuf``, before any work (an export
    would otherwise fail only after the whole simulation)."""
    from .cli import check_folder
    if args.chakra is not None or args.export_chakra is not None:
        from workloads.chakra.schema import require_protobuf
        require_protobuf()
    if args.chakra is None:
        if args.file is None:
            raise ValueError("run: give an experiment FILE, or --chakra DIR to simulate a Chakra trace")
        if args.cluster is not None:
            raise ValueError("--cluster: only with --chakra (an experiment file has its own cluster section)")
    elif args.fidelity is not None:
        raise ValueError("--fidelity: a Chakra trace is always simulated in full (it holds every rank's program)")
    if args.export_chakra is not None:
        check_folder(args.export_chakra, "--export-chakra")


def check_export_folder(folder: str | None, world: int) -> None:
    """``--export-chakra``: refuse a folder that holds a larger trace's rank files before the run, not after it
    (:func:`~workloads.chakra.write.check_trace_folder`)."""
    if folder is not None:
        from workloads.chakra import ChakraError
        from workloads.chakra.write import check_trace_folder
        try:
            check_trace_folder(folder, world)
        except ChakraError as exc:  # (the library names the folder; the command line names the option too)
            raise ChakraError(f"--export-chakra: {exc}") from None


def export_experiment(exp, folder: str | None, *, force: bool = False) -> str | None:
    """``--export-chakra``: write ``exp``'s full step (every rank's program) as a Chakra trace into ``folder``
    (with ``force``, however many ops it has: :mod:`workloads.op_budget`).

    Returns the summary line to print after the run (None without ``folder``)."""
    if folder is None:
        return None
    from workloads.chakra import write_chakra

    from .engine import paused_gc
    from .experiment import build_step
    with paused_gc():
        step = build_step(exp, None, force, what="--export-chakra: every rank's program: ")
        write_chakra(step.graph, folder, compute=exp.compute_model())
    return _export_line(folder, step.graph.world_size)


def _export_line(folder: str, ranks: int) -> str:
    return f"  Chakra trace in      {os.path.normpath(folder)}/ ({ranks} rank files; for ASTRA-sim)"


def run_trace(args: argparse.Namespace) -> int:
    """``clustersim run [FILE] --chakra DIR``: simulate a Chakra trace and print what ``run`` prints."""
    from topologies.faults import apply_faults
    from workloads.chakra import (
        ChakraError,
        ChakraWarning,
        TraceEditedWarning,
        name_trace_nodes,
        read_chakra,
        trace_settings,
        write_chakra,
    )
    from workloads.ops import OpGraphError

    from .cli import check_folder, check_writable, parse_trace_ranks, write_outputs
    from .engine import DeadlockError, Engine, paused_gc
    from .experiment import _faults_from_list, _network_from_dict, _section, read_experiment_file
    from .result import Result

    check_writable(args.trace, "--trace")
    trace_ranks = parse_trace_ranks(args.trace_ranks)
    check_folder(args.plots, "--plots")
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ChakraWarning)
            graph = read_chakra(args.chakra)
            written = trace_settings(args.chakra)
    except ChakraError as exc:  # every error of the trace is one of --chakra's input
        raise with_prefix(exc, "--chakra") from None
    _print_notes(caught, "--chakra")
    if any(issubclass(w.category, TraceEditedWarning) for w in caught):
        written = {}  # (read by its Chakra fields: fixed durations, nothing to re-time)
    world = graph.world_size
    bad = [r for r in trace_ranks if r >= world] if isinstance(trace_ranks, list) else []
    if bad:
        raise ValueError(f"--trace-ranks: {bad[0]} is not a rank of this trace; valid: 0..{world - 1}")
    doc = read_experiment_file(args.file) if args.file else {}
    try:
        notes = trace_unused(doc)
    except ValueError as exc:  # a misspelled section of the file
        raise with_prefix(exc, args.file) from None
    if args.cluster is not None and doc.get("cluster"):
        notes.append(f"cluster: has no effect: --cluster {args.cluster} replaces the file's cluster section")
    for note in notes:
        print(f"clustersim: note: {note}", file=sys.stderr)
    if args.cluster is not None:
        cluster = trace_cluster(args.cluster, world)
    try:
        if args.cluster is None:
            cluster = build_cluster(_section(doc, "cluster")) if doc.get("cluster") else trace_cluster("dgx-h100",
                                                                                                      world)
        network = _network_from_dict(_section(doc, "network"))
        compute = _trace_compute(cluster.gpu, *_compute_settings(doc, written, cluster.gpu.name))
        faults = _faults_from_list(doc.get("faults"), cluster)
        healthy_cluster = cluster
        if faults:
            cluster = apply_faults(cluster, faults)
    except ValueError as exc:
        raise (with_prefix(exc, str(args.file)) if args.file else exc) from None
    _check_fp8(graph, compute)  # (after the file's compute settings: the trace, not the file, is to blame)
    if world > cluster.num_gpus:
        raise ValueError(f"cluster: the trace has {world} ranks but {cluster.name} has {cluster.num_gpus} GPUs")
    if args.export_chakra is not None:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ChakraWarning)
            write_chakra(graph, args.export_chakra, compute=compute)
        _print_notes(caught, "--export-chakra")
    slowdown = compute_slowdown(faults, cluster.num_gpus)
    for gpu in [f["gpu"] for f in faults if f.get("kind") == "straggler" and f["gpu"] >= world]:
        print(f"clustersim: note: faults: the straggler on GPU {gpu} has no effect: the trace runs on GPUs "
              f"0..{world - 1}", file=sys.stderr)
    slowdown = {gpu: factor for gpu, factor in slowdown.items() if gpu < world}  # (the engine refuses other ranks)
    try:
        with paused_gc():
            # the same trace on the healthy cluster, for the cost of the faults (as run_experiment does)
            healthy = Engine(graph, healthy_cluster, compute, network).run().step_time_s if faults else None
            record = Engine(graph, cluster, compute, network, slowdown).run()
    except (OpGraphError, DeadlockError) as exc:  # found running the trace: named by its files' nodes
        raise type(exc)(f"--chakra: {args.chakra}: {name_trace_nodes(str(exc), graph)}") from None
    result = Result(record, sim_wall_s=time.perf_counter() - t0)
    if healthy is not None:
        result.extra_summary.update({"faults": len(faults), "healthy_step_time_s": healthy,
                                     "fault_slowdown": result.step_time / healthy if healthy else float("nan")})
    kinds: dict[str, int] = {}
    for op in graph.ops:
        kinds[op.kind] = kinds.get(op.kind, 0) + 1
    result.extra_summary.update({
        "name": f"Chakra trace {args.chakra}",  # (the file's name: describes its model, which the trace replaces)
        "setup": {"workload": f"Chakra trace {args.chakra}: {world} ranks, "
                              + ", ".join(f"{n:,} {k}" for k, n in kinds.items()),
                  "cluster": cluster.name},
        "world_size": world})
    write_outputs(result, args, trace_ranks)
    if args.export_chakra is not None and not args.json:
        print(_export_line(args.export_chakra, world))
    return 0


def _print_notes(caught: list[warnings.WarningMessage], option: str) -> None:
    """The :class:`~workloads.chakra.ChakraWarning` s caught as ``clustersim: note:`` lines led by ``option``;
    other warnings as they were."""
    from workloads.chakra import ChakraWarning
    for w in caught:
        if issubclass(w.category, ChakraWarning):
            print(f"clustersim: note: {option}: {w.message}", file=sys.stderr)
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


def _check_fp8(graph, compute) -> None:
    """Refuse, naming the trace, a trace holding FP8 GEMMs that ``compute``'s GPU cannot time (no FP8 tensor
    cores, or no measured FP8 ceiling: :attr:`~simulator.compute.ComputeModel.fp8_gemm`'s own check); no setting
    of the experiment file can re-time them: they are the trace's kernels."""
    try:
        compute.fp8_gemm  # noqa: B018 - the cached model, built (and checked) on first read
        return  # (a GPU that can time FP8 GEMMs: no op to look for)
    except ValueError as exc:
        reason = exc
    for op in graph.ops:
        if isinstance(op, Compute) and (op.category in FP8_GEMM_CATEGORIES or any(
                k.category in FP8_GEMM_CATEGORIES for k in op.parts or ())):
            raise ValueError(f"--chakra: the trace holds FP8 GEMMs (op {op.name!r} of rank {op.rank}: written "
                             f"under training.dtype fp8), which {compute.gpu.name} cannot run: {reason}") from None


def _trace_compute(gpu, dtype: str, settings: dict, inherited: tuple[bool, bool]):
    """The compute model of ``gpu`` with ``dtype`` and ``settings`` (:func:`_compute_settings`); where those the
    trace recorded (``inherited``: the dtype, the compute settings) are not available on ``gpu`` (FP8 on an A100,
    a Hopper-only attention kernel), the defaults in their place, with a note."""
    from .compute import ComputeModel
    try:
        return ComputeModel(gpu, dtype=dtype, **settings)
    except ValueError as exc:
        if not any(inherited):
            raise
        # the fewest of the trace's settings replaced by the defaults: its compute settings, its dtype, both
        for drop_settings, drop_dtype in ((True, False), (False, True), (True, True)):
            if (drop_settings and not inherited[1]) or (drop_dtype and not inherited[0]):
                continue
            try:
                fallback = ComputeModel(gpu, dtype="bf16" if drop_dtype else dtype,
                                        **({} if drop_settings else settings))
            except ValueError:
                continue
            what = " and ".join(w for w, dropped in (("training.dtype", drop_dtype),
                                                     ("compute settings", drop_settings)) if dropped)
            print(f"clustersim: note: the trace's recorded {what} cannot time kernels on {gpu.name} ({exc}); "
                  f"timed with the defaults instead (set them in the experiment file to choose)", file=sys.stderr)
            return fallback
        raise  # (the file's own settings do not fit this GPU either)


def _compute_settings(doc: dict, written: dict, gpu: str) -> tuple[str, dict, tuple[bool, bool]]:
    """``(dtype, compute settings, inherited)`` to time a trace's kernels with: the experiment file's where it
    gives them (``training.dtype``, the ``compute`` section), else what the trace was written with (``written``,
    :func:`~workloads.chakra.trace_settings`), else the defaults; ``inherited`` says whether the dtype and the
    settings are the trace's. Prints a note where the file's settings or the cluster's GPU differ from the
    trace's, since the step then differs from the one exported."""
    from workloads.parallel import training_from_dict

    from .experiment import _compute_from_dict, _section
    training, section = _section(doc, "training"), _section(doc, "compute")
    dtype = training_from_dict(training).dtype
    settings = _compute_from_dict(section)
    if not written:
        return dtype, settings, (False, False)
    try:
        theirs = dict(written["compute"])
        their_dtype = training_from_dict({"dtype": theirs.pop("dtype", "bf16")}).dtype
        their_settings = _compute_from_dict(theirs)
    except ValueError as exc:
        raise with_prefix(exc, "--chakra: the trace's clustersim.compute") from None
    from .compute import ComputeModel
    defaults = {f.name: f.default for f in dataclasses.fields(ComputeModel) if f.name not in ("gpu", "dtype")}
    notes = []
    if written["gpu"] != gpu:
        notes.append(f"the trace's compute was timed for {written['gpu']}; its kernels are re-timed for this "
                     f"cluster's {gpu}")
    if "dtype" in training and dtype != their_dtype:
        notes.append(f"training.dtype {dtype} re-times the trace's kernels, written for {their_dtype}")
    elif "dtype" not in training:
        dtype = their_dtype
    if section and {**defaults, **settings} != {**defaults, **their_settings}:
        changed = ", ".join(f"{k}: {v}" for k, v in sorted(their_settings.items()) if defaults.get(k) != v)
        notes.append(f"compute: the file's compute settings re-time the trace's kernels, written with "
                     f"{changed or 'the defaults'}")
    elif not section:
        settings = their_settings
    for note in notes:
        print(f"clustersim: note: {note}", file=sys.stderr)
    return dtype, settings, ("dtype" not in training, not section)


TRACE_SECTIONS = ("name", "cluster", "network", "compute", "faults", "training")
"""The sections of an experiment file that ``run FILE --chakra DIR`` reads (of ``training``, only ``dtype``)."""


def trace_unused(doc: dict) -> list[str]:
    """One note per section (or ``training`` field) of ``doc`` that a trace run does not read: the trace is the
    workload, so the model, layout and schedule a file gives have no effect on it."""
    from .experiment import check_sections
    check_sections(doc)  # a misspelled section is an error, as in a plain run, not a note
    notes = [f"{key}: has no effect with --chakra (the trace is the workload; the file's cluster, network, "
             f"compute, faults and training.dtype apply)" for key in doc if key not in TRACE_SECTIONS]
    training = doc.get("training")
    if isinstance(training, dict):
        notes += [f"training.{key}: has no effect with --chakra (of training, only dtype applies: the trace "
                  f"fixes the rest)" for key in training if key != "dtype"]
    return notes


def trace_cluster(spec: str, ranks: int) -> Cluster:
    """``--cluster``: a YAML or GraphML file, ``PRESET:NODES``, or ``PRESET`` sized to ``ranks`` GPUs.

    A file is read as every other command's cluster argument reads it (:func:`simulator.cli.resolve_cluster`):
    its suffix in any case (``.YAML``, ``.graphml``), a misspelled section refused, and a note where its
    ``faults:`` section does not apply (only FILE's faults do)."""
    if spec.lower().endswith((".yaml", ".yml", ".graphml")):
        from .cli import resolve_cluster
        try:
            return resolve_cluster(spec, ranks)
        except ValueError as exc:  # (it names the file already)
            raise with_prefix(exc, "--cluster") from None
    section = preset_section(spec, "--cluster")
    try:
        if "nodes" in section:
            return build_cluster(section)
        per_node = build_cluster({**section, "nodes": 1}).gpus_per_server
        return build_cluster({**section, "nodes": max(1, math.ceil(ranks / per_node))})
    except ValueError as exc:
        raise with_prefix(exc, f"--cluster {spec}") from None
