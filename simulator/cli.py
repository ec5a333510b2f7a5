"""The ``clustersim`` command line: a registry of subcommands.

Every user error (bad YAML, unknown preset, impossible config, bad size) ends
in one line on stderr and exit status 2; a deadlocked op graph exits 3.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import math
import os
import re
import sys
from collections.abc import Callable, Iterator, Mapping

from topologies import build_cluster, format_bandwidth, format_bytes, format_time, load_cluster, parse_bytes
from topologies.cluster import Cluster
from topologies.loader import MAX_GPUS, preset_section
from workloads.ops import COLLECTIVE_KINDS

from . import chakra_cli
from .collectives import COLLECTIVE_ALGORITHMS, valid_algorithms
from .engine import DeadlockError
from .fabric import NetworkConfig
from .output_paths import cannot_create_in, check_writable

_BENCH_OPS = (*COLLECTIVE_KINDS, "sendrecv")  # bench.BENCH_OPS, spelled out to keep pandas out of start-up (tested)

COMMANDS: dict[str, tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int], str]] = {}


def command(name: str, help: str):
    """Register ``configure(parser)`` and ``run(args)`` under ``name``."""
    def wrap(fn_pair):
        configure, run = fn_pair()
        COMMANDS[name] = (configure, run, help)
        return fn_pair
    return wrap


def resolve_cluster(spec: str | None, min_gpus: int, gpus_per_node: int = 8, field: str = "--cluster") -> Cluster:
    """``spec`` is a preset name, ``PRESET:NODES``, a YAML file or a GraphML topology; with no spec, a DGX-H100
    leaf-spine big enough for ``min_gpus``. ``field``: what the user gave ``spec`` as, for the error messages
    (an option, or ``cluster`` where it is the command's argument)."""
    if spec is None:
        nodes = max(1, math.ceil(min_gpus / gpus_per_node))
        return build_cluster({"preset": "dgx-h100", "nodes": nodes})
    if spec.lower().endswith((".yaml", ".yml", ".graphml")):
        from workloads.errors import ConfigError

        from .experiment import check_file_sections
        faults = []

        def check(doc: Mapping) -> None:  # (the file parsed once: its sections checked, its faults seen)
            check_file_sections(doc)
            faults.append(bool(doc.get("faults")))

        try:
            cluster = load_cluster(spec, check=check)
        except ConfigError as exc:  # a misspelled section, named with the file (a TopologyError names it already)
            raise ValueError(f"{spec}: {exc}") from None
        if any(faults):
            print(faults_not_applied(spec), file=sys.stderr)
        return cluster
    section = preset_section(spec, field)  # a preset, or PRESET:NODES
    try:
        return build_cluster(section)
    except ValueError as exc:  # (an unknown preset is named as the user gave it: the option, not a file's field)
        text = str(exc)
        if field != "cluster" and text.startswith("cluster.preset:"):
            raise ValueError(f"{field}:{text[len('cluster.preset:'):]}") from None
        raise


def _top_level(path: str, key: str) -> object:
    """The top-level ``key`` of the YAML file at ``path`` (read already: it is valid YAML), or None. Parsed again
    only when the key is in its text (a topology file of thousands of GPUs takes seconds)."""
    import re

    from topologies.yamlio import load_yaml
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if not re.search(rf"^{key}\s*:", text, re.MULTILINE):
        return None
    doc = load_yaml(text)
    return doc.get(key) if isinstance(doc, dict) else None


def _file_network(spec: str | None) -> NetworkConfig:
    """The ``network:`` section of the experiment file ``spec`` (checked as ``clustersim run`` checks it), or
    the defaults for a preset, a topology file or a file without one."""
    from .experiment import _network_from_dict
    if spec is None or not spec.lower().endswith((".yaml", ".yml")):
        return NetworkConfig()
    section = _top_level(spec, "network")
    if section is None:
        return NetworkConfig()
    if not isinstance(section, dict):
        raise ValueError(f"{spec}: network: must be a mapping of fields, got {type(section).__name__}")
    try:
        return _network_from_dict(section)
    except ValueError as exc:  # (ConfigError too)
        raise ValueError(f"{spec}: {exc}") from None


def faults_not_applied(spec: str) -> str:
    """The note of a command that reads a file's cluster but not its ``faults:`` (``collective``, ``topology``,
    ``plan``)."""
    return (f"clustersim: note: {spec}'s faults: section is not applied here: this is the healthy fabric "
            f"(clustersim run simulates the faults)")


# ------------------------------------------------------------------ zero
@command("zero", "ZeRO-0..3 model-state memory and traffic per GPU, with the formulas (Rajbhandari et al.)")
def _zero():
    def configure(p: argparse.ArgumentParser) -> None:
        p.add_argument("--params", default="1T", help="parameters Ψ, e.g. 1T, 175B, 7.5e9 (default 1T)")
        p.add_argument("--gpus", type=int, default=1024, help="data-parallel GPUs N (default 1024)")
        p.add_argument("--dtype-bytes", type=int, default=2, choices=(2, 4), help="parameter/gradient bytes")
        p.add_argument("--json", action="store_true", help="print a JSON list instead of a table")

    def run(args: argparse.Namespace) -> int:
        from workloads.sharding import optimizer_bytes_per_param, parse_count, zero_figures
        if not 1 <= args.gpus <= 10**9:
            raise ValueError(f"--gpus: must be an integer in 1..1000000000, got {args.gpus}")
        params = _whole(parse_count(args.params, "--params"), args.params, "--params", "parameters", "7.5e9 or 175B")
        rows = zero_figures(params, args.gpus, args.dtype_bytes)
        if args.json:
            print(json.dumps(rows))
            return 0
        adam = "mixed-precision Adam" if args.dtype_bytes == 2 else "fp32 Adam"
        k = optimizer_bytes_per_param(args.dtype_bytes)
        print(f"Ψ = {args.params} parameters, N = {args.gpus} GPUs, {adam} (K = {k}); per GPU, GB = 1e9 bytes:")
        print(f"{'ZeRO':>4}  {'model states':>14}  {'memory formula':<16}  {'sent / step':>13}  traffic formula")
        for r in rows:
            print(f"{r['zero']:>4}  {r['model_states_bytes'] / 1e9:>11,.1f} GB  {r['memory_formula']:<16}  "
                  f"{r['traffic_bytes_per_gpu'] / 1e9:>10,.1f} GB  {r['traffic_formula']}")
        return 0
    return configure, run


# ------------------------------------------------------------------------ plan
@command("plan", "capacity planning: a cluster's bill of materials, power, cost and bisection bandwidth")
def _plan():
    from .plan_cli import configure, run
    return configure, run


# ------------------------------------------------------------------ collective
_DEFAULT_BENCH_GPUS = 8  # ranks of `collective` without --gpus (one DGX node, as nccl-tests on one server)
@command("collective", "simulated nccl-tests: time one collective over a range of sizes")
def _collective():
    def configure(p: argparse.ArgumentParser) -> None:
        p.add_argument("--op", default="all_reduce", help=f"one of: {', '.join(_BENCH_OPS)}")
        p.add_argument("--gpus", type=int, help="number of ranks (default 8, or every GPU of a smaller --cluster)")
        p.add_argument("--min-size", default="1MiB", help="smallest size, e.g. 1MiB (default)")
        p.add_argument("--max-size", default="1GiB", help="largest size, e.g. 8GiB (default 1GiB)")
        p.add_argument("--step-factor", type=float, default=2.0, help="size multiplier between rows (default 2)")
        p.add_argument("--cluster", help="preset name, PRESET:NODES or cluster YAML (default: DGX-H100 nodes, as many "
                                          "as needed)")
        p.add_argument("--algo", default="auto", help=f"one of: {', '.join(COLLECTIVE_ALGORITHMS)}")
        p.add_argument("--fidelity", default=None, choices=("fast", "full"),
                       help="fast (one pipelined transfer per ring) or full (every ring step); default the "
                            "--cluster file's network: {fidelity: ...} (not its top-level fidelity:, which "
                            "chooses the ranks a training step simulates), else fast")
        p.add_argument("--no-pxn", dest="pxn", action="store_false",
                       help="send from each GPU's own NIC (NCCL_PXN_DISABLE=1); default: NCCL's PXN, traffic between "
                            "servers leaving through the NIC on the destination's rail")
        p.add_argument("--json", action="store_true", help="print a JSON list instead of a table")

    def run(args: argparse.Namespace) -> int:
        from .bench import collective_sweep, size_ladder
        if args.op not in _BENCH_OPS:
            raise ValueError(f"--op: {args.op!r} unknown; valid: {', '.join(_BENCH_OPS)}")
        if args.algo not in COLLECTIVE_ALGORITHMS:
            raise ValueError(f"--algo: {args.algo!r} unknown; valid: {', '.join(COLLECTIVE_ALGORITHMS)}")
        if args.op == "sendrecv" and args.algo != "auto":  # (bench.collective_time runs sendrecv as send/recv)
            raise ValueError(f"--algo: {args.algo} does not apply to sendrecv, a point-to-point transfer with no "
                             f"algorithm choice; leave --algo out (or give auto)")
        if args.op != "sendrecv" and args.algo not in valid_algorithms(args.op):
            raise ValueError(f"--algo: {args.algo} does not implement {args.op}; valid for {args.op}: "
                             f"{', '.join(valid_algorithms(args.op))}")
        if args.gpus is not None and not 2 <= args.gpus <= MAX_GPUS:
            raise ValueError(f"--gpus: must be in 2..{MAX_GPUS:,}, got {args.gpus:,}")
        lo = _whole(parse_bytes(args.min_size, "--min-size", allow_zero=False), args.min_size, "--min-size",
                    "bytes", "2B or 1MiB")
        hi = _whole(parse_bytes(args.max_size, "--max-size", allow_zero=False), args.max_size, "--max-size",
                    "bytes", "2B or 1GiB")
        sizes = size_ladder(lo, hi, args.step_factor)
        cluster = resolve_cluster(args.cluster, args.gpus or _DEFAULT_BENCH_GPUS)
        if args.gpus is None:  # (not given: 8, or every GPU of a smaller cluster)
            args.gpus = min(_DEFAULT_BENCH_GPUS, cluster.num_gpus)
            if args.gpus < 2:
                raise ValueError(f"--cluster: {cluster.name!r} has {cluster.num_gpus} GPU; a collective needs 2 or "
                                 f"more")
        elif args.gpus > cluster.num_gpus:
            raise ValueError(f"--gpus: {args.gpus} exceeds the {cluster.num_gpus} GPUs of cluster {cluster.name!r}")
        network = _file_network(args.cluster)  # (a file's network: section, e.g. routing: spray, is honoured)
        network = dataclasses.replace(network, fidelity=args.fidelity or network.fidelity,
                                      pxn=network.pxn and args.pxn)
        table = collective_sweep(cluster, args.op, args.gpus, sizes, args.algo, network)
        if args.json:
            print(json.dumps(table.to_dict(orient="records")))
            return 0
        print(f"# {args.op} over {args.gpus} GPUs of {cluster.name}, algorithm {args.algo}"
              + ("" if network.pxn else ", PXN off") + (", spray" if network.routing == "spray" else "")
              + (", fidelity full" if network.fidelity == "full" else "")
              + (", network model analytic (no contention)" if network.model == "analytic" else "")
              + "; size: the whole buffer, as nccl-tests prints it (all-gather's output, reduce-scatter's input)")
        print(f"{'size':>12} {'time':>12} {'algbw':>14} {'busbw':>14}")
        for row in table.itertuples(index=False):
            print(f"{format_bytes(row.size_bytes):>12} {format_time(row.time_s):>12} "
                  f"{format_bandwidth(row.algbw_Bps):>14} {format_bandwidth(row.busbw_Bps):>14}")
        return 0

    return configure, run


# ------------------------------------------------------------------------- run
def print_summary(result, file=None) -> None:
    """A readable multi-line summary of a training-step result."""
    s = result.summary
    out = file or sys.stdout
    gb = 1e-9
    print(f"{s.get('name', 'run')}", file=out)
    for key, line in s.get("setup", {}).items():
        print(f"  {key:<20} {line}", file=out)
    print(file=out)
    tokens = f"   ({s['tokens_per_s']:,.0f} tokens/s)" if "tokens_per_s" in s else ""
    print(f"  step time            {format_time(s['step_time_s'])}{tokens}", file=out)
    if "fault_slowdown" in s:
        print(f"  with the faults      {s['fault_slowdown']:.3f}x the healthy fabric's "  # (counted in the title)
              f"{format_time(s['healthy_step_time_s'])}", file=out)
    if "mfu" in s:
        of = (f"; MFU is of the dense {s['mfu_peak_dtype']} peak, {s['mfu_peak_tflops']:.0f} TFLOP/s, which FP8 "
              f"GEMMs run above" if s.get("training_dtype") == "fp8" else "")
        print(f"  MFU                  {s['mfu'] * 100:.1f} %   ({s['tflops_per_gpu']:.0f} TFLOP/s per GPU, "
              f"{s['hardware_tflops_per_gpu']:.0f} with recompute{of})", file=out)
        print(f"  pipeline bubble      {s['bubble_fraction'] * 100:.1f} % of the pipeline window"
              f"   ({s['num_micro_batches']} micro-batch{'es' if s['num_micro_batches'] != 1 else ''})", file=out)
        mem = s["memory_breakdown_bytes"]
        over = "" if s.get("fits_in_memory", True) else "   does not fit in the GPU (simulated with --force)"
        print(f"  memory per GPU       {s['memory_per_gpu_bytes'] * gb:.1f} GB (params {mem['parameters'] * gb:.1f}"
              f" + grads {mem['gradients'] * gb:.1f} + optimizer {mem['optimizer'] * gb:.1f}"
              f" + activations {mem['activations'] * gb:.1f}; stage {s['memory_stage']}){over}", file=out)
    moe = s.get("moe")
    if moe and moe.get("draws"):
        dropped = moe["dropped_fraction"]
        print(f"  MoE routing          imbalance {moe['imbalance_mean']:.2f} mean, {moe['imbalance_max']:.2f} worst "
              f"(max/mean tokens per EP rank, {moe['draws']:,} draws); "
              + (f"{dropped * 100:.1f} % of token choices dropped by moe.capacity_factor (MFU counts them)"
                 if dropped else "no tokens dropped"), file=out)
    print(f"  exposed comm         {format_time(s['exposed_comm_s'])} per rank: " + ", ".join(
        f"{k} {format_time(v)}" for k, v in s["exposed_comm_by_class_s"].items())
        + " (each class's time in flight outside compute; where classes overlap, counted in each)", file=out)
    if s.get("compute_beside_comm_s"):
        print(f"  compute beside comm  +{format_time(s['compute_beside_comm_s'])} per rank (the SMs overlapped "
              f"communication holds, compute.comm_sms)", file=out)
    print("  bytes sent by class  " + ", ".join(f"{k} {format_bytes(v)}" for k, v in s["bytes_by_class"].items()),
          file=out)
    print("  link bytes by tier   " + ", ".join(f"{k} {format_bytes(v)}" for k, v in s["bytes_by_tier"].items()),
          file=out)
    if "fabric_cost_usd" in s:
        print(f"  fabric cost          ${s['fabric_cost_usd']:,.0f}, {s['fabric_power_kw']:,.1f} kW (every part but "
              f"the GPUs; estimates, see clustersim plan), bisection {format_bandwidth(s['bisection_bytes_s'])}",
              file=out)
    print(f"  simulated in         {s['sim_wall_s']:.2f} s wall ({s['events']:,} events, "
          f"{s['rate_solves']:,} rate solves, {s['flows']:,} flows)", file=out)
    records = result.stage_records()
    if records:
        print(file=out)
        print(stage_time_table(records), file=out)


def stage_time_table(stages: list[dict], max_rows: int = 32) -> str:
    """Where the step time went on each pipeline stage (``result.stage_records()``: the rows of
    ``result.stages``, partition columns), in ms."""
    cols = [c for c in stages[0] if c.endswith("_s") and c != "busy_s"]
    cols = [c for c in cols if c != "bubble_s"] + ["bubble_s"] * ("bubble_s" in cols)  # bubble, then idle
    cols = [c for c in cols if c != "idle_s"] + ["idle_s"] * ("idle_s" in cols)
    cols = [c for c in cols if any(abs(row[c]) > 0 for row in stages)]  # (NaN is not > 0: pandas' skipna max)
    names = [c[:-2].replace("exposed_", "") for c in cols]
    width = max(9, *(len(n) + 1 for n in names))
    lines = ["  where the step went per pipeline stage (ms; mean over the stage's ranks; every instant counted once, "
             "in the first category that holds it: simulator.breakdown):",
             "  " + f"{'stage':>5}" + "".join(f"{n:>{width}}" for n in names)]
    for values in stages[:max_rows]:
        lines.append("  " + f"{values['stage']:>5}" + "".join(f"{values[c] * 1e3:>{width}.3f}" for c in cols))
    if len(stages) > max_rows:
        lines.append(f"  ... {len(stages) - max_rows} more stages (result.stages has them all)")
    return "\n".join(lines)


_FIDELITIES = ("fast", "full", "lockstep")  # experiment.FIDELITIES, spelled out to keep pandas out of start-up (tested)


def _json_summary(result) -> str:
    return json.dumps(result.summary, default=float)


LONG_RUN_S = 60.0
"""A run without a progress bar says how long it will take when that is more than this (CPU seconds)."""


@contextlib.contextmanager
def _ops_bar(enabled: bool) -> Iterator[Callable[[int, int], None] | None]:
    """A progress callback for :func:`~simulator.experiment.run_experiment` drawing a tqdm bar of the ops
    simulated on stderr, when ``enabled`` and stderr is a terminal (None otherwise: nothing to draw); the bar
    is cleared when the run ends, so the summary prints as without it. Without a bar, a step long enough to
    take over a minute (:data:`~workloads.op_budget.CPU_SECONDS_PER_OP`) says so in one note when it starts."""
    if not enabled or not sys.stderr.isatty():
        from workloads.op_budget import CPU_SECONDS_PER_OP
        told = False

        def note(done: int, total: int) -> None:
            nonlocal told
            if not told and total * CPU_SECONDS_PER_OP >= LONG_RUN_S:
                print(f"clustersim: note: {total / 1e6:.1f} M ops to simulate, about "
                      f"{total * CPU_SECONDS_PER_OP / 60:.0f} min of CPU on a 2-core machine", file=sys.stderr)
            told = True

        yield note
        return
    from tqdm import tqdm
    bar = None

    def progress(done: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            bar = tqdm(total=total, unit="op", unit_scale=True, desc="simulating", leave=False, dynamic_ncols=True)
        bar.update(done - bar.n)

    try:
        yield progress
    finally:
        if bar is not None:
            bar.close()


@command("run", "simulate one training step described by an experiment YAML file, or a Chakra trace")
def _run():
    def configure(p: argparse.ArgumentParser) -> None:
        p.add_argument("file", nargs="?", help="experiment YAML (sections: cluster, model, parallel, training, ...)")
        p.add_argument("--json", action="store_true", help="print one JSON object instead of a summary")
        p.add_argument("--trace", metavar="OUT.json[.gz]", help="write a Chrome/Perfetto trace (.gz: compressed)")
        p.add_argument("--trace-ranks", metavar="R1,R2,...|stages|all", default="stages",
                       help="ranks in the trace: a list, 'stages' (one per pipeline stage, default) or 'all'")
        p.add_argument("--plots", metavar="DIR", help="write every figure as a PNG into DIR (created, with any "
                       "missing parent folders)")
        p.add_argument("--force", action="store_true", help="simulate even if the config does not fit in memory")
        p.add_argument("--fidelity", choices=_FIDELITIES, help="override the file's fidelity (default: fast)")
        p.add_argument("--no-progress", action="store_true",
                       help="no progress bar (shown on a terminal while the step simulates)")
        chakra_cli.add_arguments(p)

    def run(args: argparse.Namespace) -> int:
        from workloads.errors import with_prefix
        from workloads.op_budget import StepTooLargeError
        from workloads.parallel import RankLayout

        from .bulk_alltoall import slow_alltoallv_note, under_one_switch
        from .experiment import OutOfMemoryError, check_memory, load_experiment, run_experiment, unused_settings
        chakra_cli.check_arguments(args)
        if args.chakra is not None:
            return chakra_cli.run_trace(args)
        check_writable(args.trace, "--trace")
        trace_ranks = parse_trace_ranks(args.trace_ranks)
        check_folder(args.plots, "--plots")
        exp = load_experiment(args.file)
        world = exp.parallel.world_size
        bad = [r for r in trace_ranks if r >= world] if isinstance(trace_ranks, list) else []
        if bad:
            raise ValueError(f"--trace-ranks: {bad[0]} is not a rank of this run; valid: 0..{world - 1}")
        chakra_cli.check_export_folder(args.export_chakra, world)
        one_switch = exp.model.is_moe and exp.parallel.ep > 1 and under_one_switch(
            exp.cluster, RankLayout(exp.parallel).ep_group(0))
        slow = slow_alltoallv_note(exp.parallel.ep, exp.network.all_to_all, exp.routing.kind, exp.model.is_moe,
                                   one_switch)
        for note in ([slow] if slow else []) + unused_settings(exp, args.fidelity):
            print(f"clustersim: note: {note}", file=sys.stderr)
        if args.trace_ranks != "stages" and not args.trace:  # (given: not the default)
            print("clustersim: note: --trace-ranks has no effect without --trace", file=sys.stderr)
        if (exp.raw or {}).get("sweep") is not None:
            print("clustersim: note: sweep: has no effect in clustersim run, which runs the file as it is; "
                  "clustersim sweep FILE runs its grid", file=sys.stderr)
        try:
            if args.export_chakra is not None:
                # Exported before the run: a step that does not fit, or whose every-rank graph is over the op
                # budget, is refused before minutes of simulation rather than after them.
                check_memory(exp, args.force)
            exported = chakra_cli.export_experiment(exp, args.export_chakra, force=args.force)
            with _ops_bar(not args.no_progress) as progress:
                result = run_experiment(exp, force=args.force, fidelity=args.fidelity, progress=progress)
        except OutOfMemoryError as exc:  # (found after loading: named by its file, as loading errors are)
            raise with_prefix(exc.with_remedies(exp), args.file) from None
        except StepTooLargeError as exc:
            raise with_prefix(exc, args.file) from None
        write_outputs(result, args, trace_ranks)
        if exported and not args.json:
            print(exported)
        return 0

    return configure, run


@command("jobs", "simulate several training jobs sharing one fabric: each job's slowdown and the shared links")
def _jobs():
    def configure(p: argparse.ArgumentParser) -> None:
        p.add_argument("file", help="jobs YAML (sections: cluster, placement, jobs: [{name, nodes, model, ...}])")
        p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
        p.add_argument("--force", action="store_true", help="simulate even if a job does not fit in memory")
        p.add_argument("--links", type=int, default=10, metavar="N", help="shared links listed (default 10)")

    def run(args: argparse.Namespace) -> int:
        from workloads.errors import with_prefix
        from workloads.op_budget import StepTooLargeError

        from .experiment import OutOfMemoryError, read_experiment_file
        from .jobs import JOBS_SECTIONS, job_notes, jobs_from_dict, run_jobs
        if args.links < 0:
            raise ValueError(f"--links: must be >= 0, got {args.links}")
        # read once: a second read of a pipe (clustersim jobs <(...)) found it empty, "the file is empty"
        doc = read_experiment_file(args.file, JOBS_SECTIONS)
        try:
            spec = jobs_from_dict(doc)
        except ValueError as exc:
            raise with_prefix(exc, args.file) from None
        for note in job_notes(spec, doc):
            print(f"clustersim: note: {note}", file=sys.stderr)
        try:
            result = run_jobs(spec, force=args.force)
        except (OutOfMemoryError, StepTooLargeError) as exc:  # (found after loading: named by its file)
            raise with_prefix(exc, args.file) from None
        for note in result.notes:
            print(f"clustersim: note: {note}", file=sys.stderr)
        if args.json:
            print(json.dumps(result.summary, default=float))
            return 0
        print(jobs_report(result, spec.cluster.name, args.links))
        return 0

    return configure, run


def jobs_report(result, cluster_name: str, links: int = 10) -> str:
    """``clustersim jobs``' text: one row per job, then the links most shared."""
    lines = [f"{result.name}", f"  cluster: {cluster_name}",
             f"  {'job':<16}{'nodes':>6}{'GPUs':>6}{'steps':>6}{'step together':>15}{'step alone':>12}"
             f"{'slowdown':>10}{'bound':>8}{'shared links':>14}"]
    for row in result.jobs.itertuples(index=False):
        lines.append(f"  {row.job:<16}{row.nodes:>6}{row.gpus:>6}{row.steps:>6}{format_time(row.step_time_s):>15}"
                     f"{format_time(row.alone_step_time_s):>12}{row.slowdown:>10.3f}{row.slowdown_bound:>8.2f}"
                     f"{row.shared_links:>14}")
    shared = result.shared_links
    if len(shared) and links:
        cols = [c for c in shared.columns if c.startswith("bytes_")]
        top = shared.assign(total=shared[cols].sum(axis=1)).nlargest(links, "total")
        lines.append(f"  links used by several jobs ({len(shared)}; busiest {len(top)}):")
        for _, row in top.iterrows():
            parts = ", ".join(f"{c[6:]} {format_bytes(row[c])}" for c in cols)
            lines.append(f"    {str(row['src']):>14} -> {str(row['dst']):<14} {row['tier']:<7} {parts}")
    elif not len(shared):
        lines.append("  no link carried bytes of more than one job")
    lines.append(f"  simulated in {result.together.sim_wall_s:.2f} s wall")
    return "\n".join(lines)


def parse_trace_ranks(text: str) -> list[int] | str:
    """``--trace-ranks``: ``stages``, ``all`` or a comma-separated list of ranks."""
    if text in ("stages", "all"):
        return text
    try:
        items = [x.strip() for x in text.split(",")]  # (spaces after commas are fine)
        if not all(x.isdecimal() for x in items):  # (int() would read "1_0" as 10; an empty item is a typo)
            raise ValueError
        ranks = [int(x) for x in items]
    except ValueError:
        raise ValueError(f"--trace-ranks: {text!r} is not a list of ranks such as 0,8,16, nor 'stages' or "
                         f"'all'") from None
    if not ranks or any(r < 0 for r in ranks):
        raise ValueError(f"--trace-ranks: need ranks >= 0 such as 0,8,16 (or 'stages', 'all'), got {text!r}")
    return ranks


def check_folder(path: str | None, flag: str) -> None:
    """Refuse an output folder that cannot be created or written, before any work is done (None: not asked
    for; an empty name is refused, not read as the current folder).

    A folder that does not exist is created with any missing parents, as the Python API does
    (:meth:`~simulator.result.Result.save_plots`, :func:`~workloads.chakra.write_chakra`): what is
    checked is the nearest folder that exists, which must be a folder and take a new file."""
    if path is None:
        return
    if not path.strip():
        raise ValueError(f"{flag}: needs a folder name (give . for the current folder)")
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"{flag}: {path!r} exists and is not a folder")
    existing = os.path.abspath(path)
    while not os.path.exists(existing):  # (the root exists: the walk ends)
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise ValueError(f"{flag}: {existing!r} is a file, not a folder")
    reason = cannot_create_in(existing)
    if reason is not None:
        raise ValueError(f"{flag}: cannot write into {path!r} ({reason})")


def write_outputs(result, args: argparse.Namespace, trace_ranks: list[int] | str = "stages") -> None:
    """The summary (or JSON) of ``clustersim run``/``demo``, and the trace and plots asked for."""
    lines = []
    if getattr(args, "trace", None):
        ranks = None if trace_ranks == "stages" else (
            list(range(result.record.graph.world_size)) if trace_ranks == "all" else trace_ranks)
        try:
            n = result.to_chrome_trace(args.trace, ranks)
        except OSError as exc:  # (a full disk, a vanished folder: found only as the trace is written)
            raise ValueError(f"--trace: cannot write {args.trace}: {exc.strerror or exc}") from None
        lines.append(f"  trace written to     {args.trace} ({n:,} events)")
    if getattr(args, "plots", None):
        import matplotlib
        matplotlib.use("Agg")  # files only: no display needed
        try:
            paths = result.save_plots(args.plots)
        except OSError as exc:
            raise ValueError(f"--plots: cannot write into {args.plots}: {exc.strerror or exc}") from None
        folder = os.path.join(args.plots, "")  # one trailing separator, however the folder was typed
        lines.append(f"  figures written to   {folder} ({', '.join(os.path.basename(p) for p in paths)})")
    if args.json:
        print(_json_summary(result))
        return
    print_summary(result)
    for line in lines:
        print(line)


@command("demo", "simulate a small built-in 3D-parallel training step and print what happened")
def _demo():
    def configure(p: argparse.ArgumentParser) -> None:
        p.add_argument("--json", action="store_true", help="print one JSON object instead of a summary")
        p.add_argument("--trace", metavar="OUT.json[.gz]", help="write a Chrome/Perfetto trace (.gz: compressed)")
        p.add_argument("--plots", metavar="DIR", help="write every figure as a PNG into DIR (created, with any "
                       "missing parent folders)")

    def run(args: argparse.Namespace) -> int:
        from .experiment import DEMO_EXPERIMENT, experiment_from_dict, run_experiment
        check_writable(args.trace, "--trace")
        check_folder(args.plots, "--plots")
        result = run_experiment(experiment_from_dict(DEMO_EXPERIMENT))
        write_outputs(result, args)
        if args.json:
            return 0
        links = result.links
        top = links[links["bytes"] > 0].sort_values("utilization", ascending=False).head(5)
        print("\n  busiest links:")
        print(top[["src", "dst", "tier", "bytes", "utilization"]].to_string(index=False,
                                                                           float_format=lambda x: f"{x:.3g}"))
        print("\nNext: clustersim run examples/gpt3-175b-1024-h100.yaml   |   clustersim collective --help")
        return 0

    return configure, run


# ----------------------------------------------------------------------- sweep
@command("sweep", "simulate an experiment file over a grid of overrides and rank the feasible points")
def _sweep():
    def configure(p: argparse.ArgumentParser) -> None:
        p.add_argument("file", help="experiment YAML; its sweep: section (grid, metric, max_tp) gives defaults")
        p.add_argument("--grid", action="append", default=[], metavar="PATH=V1,V2,...",
                       help="sweep a dotted field, e.g. parallel.tp=1,2,4,8 (repeatable; overrides the file's grid); "
                            "layout=auto: every (tp, pp, dp); parallel.micro_batch=auto: every divisor")
        p.add_argument("-o", "--output", metavar="OUT.csv|OUT.parquet",
                       help="write every row; rerunning with the same file skips the points already there")
        p.add_argument("--jobs", type=int, help="local worker processes (default: all cores; 1 runs in-process)")
        p.add_argument("--scheduler", metavar="tcp://HOST:PORT", help="run on an existing Dask distributed cluster")
        p.add_argument("--top", type=int, default=10, help="print the best K feasible points (default 10)")
        p.add_argument("--metric", help="ranking column (default: the file's sweep.metric, else step_time_s)")
        p.add_argument("--max-tp", type=int, help="largest tp of layout=auto (default: GPUs per node)")
        p.add_argument("--no-progress", action="store_true", help="no progress bar")
        p.add_argument("--fidelity", metavar="{fast,full,lockstep,screen}",
                       help="every point's fidelity (default: the file's, else fast); screen: a closed-form "
                            "estimate in milliseconds per layout, for ranking (docs/DESIGN.md); not with "
                            "--grid fidelity=..., which sets every point's fidelity (an error)")
        p.add_argument("--refine", type=int, metavar="K",
                       help="with --fidelity screen: simulate the best K screened points again in fast; they "
                            "come first, with the screened value beside them (not with --grid fidelity=...)")
        p.add_argument("--checkpoint", type=float, metavar="SECONDS",
                       help="rewrite --output every SECONDS while the sweep runs (default 30)")

    def run(args: argparse.Namespace) -> int:
        from .sweeps import (
            FIDELITIES,
            SCREEN,
            SweepInterrupted,
            batch_note,
            counts_line,
            parse_grid_arg,
            reasons_lines,
            sweep,
            top_table,
        )
        from .sweeps.columns import check_metric
        from .sweeps.driver import CHECKPOINT_S
        if args.metric is not None:
            check_metric(args.metric, "--metric")  # (the flag's name, where the file's would say sweep.metric)
        for flag, value, least in (("--jobs", args.jobs, 1), ("--top", args.top, 0), ("--max-tp", args.max_tp, 1),
                                   ("--refine", args.refine, 1)):
            if value is not None and value < least:
                raise ValueError(f"{flag}: must be >= {least}, got {value}")
        if args.fidelity is not None and args.fidelity not in FIDELITIES:
            raise ValueError(f"--fidelity: {args.fidelity!r} unknown; valid: {', '.join(FIDELITIES)}")
        if args.checkpoint is not None and not args.checkpoint > 0:  # (not > 0: also refuses nan)
            raise ValueError(f"--checkpoint: must be a number of seconds > 0, got {args.checkpoint}")
        if args.refine is not None and args.fidelity not in (None, SCREEN):
            raise ValueError(f"--refine: re-simulates the best screened points; use it with --fidelity screen, "
                             f"not {args.fidelity}")
        check_writable(args.output, "--output")
        grid: dict[str, list] = {}
        for text in args.grid:
            path, values = parse_grid_arg(text)
            if path in grid:
                merged = grid[path] + values
                if "auto" in merged:  # (auto stands for every valid value: normalise_grid refuses it mixed)
                    raise ValueError(f"--grid: {path} given twice; auto stands for every valid value, so give "
                                     f"{path}=auto alone or list the values in one --grid")
                raise ValueError(f"--grid: {path} given twice; give all its values in one --grid, "
                                 f"e.g. {path}={','.join(map(str, merged))}")
            grid[path] = values
        if "fidelity" in grid:  # (the grid's would set every point's fidelity, silently winning over the option)
            swept = ",".join(map(str, grid["fidelity"]))
            if args.fidelity is not None:
                raise ValueError(f"--fidelity: not with --grid fidelity={swept}, which sets every point's fidelity; "
                                 f"give --grid fidelity or --fidelity, not both")
            if args.refine is not None:
                raise ValueError(f"--refine: re-simulates the best screened points, not with --grid fidelity={swept} "
                                 f"(which sets every point's fidelity); drop fidelity from --grid and give "
                                 f"--fidelity screen")

        def started(points: int, reused: int) -> None:
            print(f"# {points} points" + (f", {reused} already in {args.output}" if reused else ""), file=sys.stderr)

        def refining(points: int, reused: int) -> None:
            print(f"# refining the best {points} in fast" + (f", {reused} already in {args.output}" if reused
                                                                else ""), file=sys.stderr)

        try:
            table = sweep(args.file, grid, metric=args.metric, jobs=args.jobs,
                          scheduler=args.scheduler, output=args.output, progress=not args.no_progress,
                          max_tp=args.max_tp, on_start=started, fidelity=args.fidelity, refine=args.refine,
                          on_refine=refining,
                          checkpoint_s=CHECKPOINT_S if args.checkpoint is None else args.checkpoint)
        except SweepInterrupted as exc:
            where = f"; kept in {args.output}, rerun the same command to resume" if args.output else ""
            print(f"interrupted after {counts_line(exc.table)}{where}", file=sys.stderr)
            return 130
        if args.top:
            print(top_table(table, args.top))
        print(counts_line(table) + (f"; written to {args.output}" if args.output else ""))
        unlike = batch_note(table)
        if unlike:
            print(f"# {unlike}", file=sys.stderr)
        others = table.attrs.get("other_rows", 0)
        if others:
            print(f"# {args.output} also keeps {others} row{'s' * (others != 1)} of other sweeps (another grid, "
                  f"base file or fidelity), after this sweep's, unranked; choose another --output to keep them apart",
                  file=sys.stderr)
        statuses = set(table["status"]) if len(table) else set()
        if "ok" not in statuses:  # say why nothing is feasible; nothing simulated at all is an error
            for line in reasons_lines(table):
                print(f"clustersim: {line}", file=sys.stderr)
            if statuses <= {"invalid", "failed"}:
                return 2
        else:  # and why the others did not run: a typo in a grid value is one of these, not only a layout
            for line in reasons_lines(table):
                print(f"# {line}", file=sys.stderr)
        return 0

    return configure, run


# -------------------------------------------------------------------- validate
@command("validate", "compare simulated throughput with published training runs (Megatron-LM, Llama 3, "
                     "DeepSeek-V3)")
def _validate():
    def configure(p: argparse.ArgumentParser) -> None:
        p.add_argument("--only", nargs="+", metavar="NAME",
                       help="run only these entries (default: every entry but those --list marks slow)")
        p.add_argument("--all", action="store_true", help="also run the entries --list marks slow")
        p.add_argument("--max-gpus", type=int, metavar="N", help="skip entries of published runs on more than N GPUs")
        p.add_argument("--fidelity", default=None, choices=_FIDELITIES,
                       help="every entry's fidelity (default: each entry's file's: fast, or as the file says)")
        p.add_argument("--jobs", type=int, default=1, help="entries simulated in parallel processes (default 1)")
        p.add_argument("--json", action="store_true", help="print a JSON list of rows instead of a table")
        p.add_argument("--list", action="store_true",
                       help="list the entries and their sources (those --only and --max-gpus keep; --json: as a "
                            "JSON list), simulate nothing")

    def run(args: argparse.Namespace) -> int:
        from .validation import ENTRIES, check_options, select_entries, validate_against_published
        check_options(args.only, args.jobs)  # before the table's header: a bad option prints only its error
        if args.max_gpus is not None and args.max_gpus < 1:
            raise ValueError(f"--max-gpus: must be >= 1, got {args.max_gpus}")
        if args.all and args.only:
            raise ValueError("--all: runs every entry; leave out --only (or --all)")
        # what is run (or listed): the entries --only names, or all (the list shows the slow ones too)
        kept = select_entries(args.only, max_gpus=args.max_gpus, include_slow=args.all or args.list)
        if args.only:
            left_out = [e for e in select_entries(args.only) if e not in kept]
            if left_out and not kept:
                raise ValueError(f"--max-gpus: {args.max_gpus} leaves out every entry --only names "
                                 f"({', '.join(f'{e.name}: {e.gpus} GPUs' for e in left_out)})")
            for e in left_out:  # (asked for by name: say why it is not run)
                print(f"# skipped {e.name} ({e.gpus} GPUs > --max-gpus {args.max_gpus})", file=sys.stderr)
        elif not kept:  # (was: an empty table, or an empty list, and exit 0)
            fewest = min(e.gpus for e in select_entries(include_slow=args.all or args.list))
            raise ValueError(f"--max-gpus: {args.max_gpus} leaves out every entry; the smallest published run is "
                             f"on {fewest} GPUs (clustersim validate --list)")
        if args.list:
            listed = kept
            if args.json:
                print(json.dumps([{"name": e.name, "gpus": e.gpus, "metric": e.metric, "published": e.published,
                                   "source": e.source, "slow": e.slow or None} for e in listed]))
                return 0
            for e in listed:
                slow = f"  [slow: {e.slow}]" if e.slow else ""
                print(f"{e.name:<26} {e.gpus:>6} GPUs  {e.metric:<24} {e.published:g}  {e.source}{slow}")
            return 0

        def fmt(metric: str, v: float) -> str:
            return f"{v * 100:.1f}%" if metric == "mfu" else f"{v:.1f}"

        def show(row: dict) -> None:
            if not args.json:
                flag = "" if row["fits"] else "  (does not fit in memory: forced)"
                pub, sim = fmt(row["metric"], row["published"]), fmt(row["metric"], row["simulated"])
                print(f"{row['name']:<26} {row['gpus']:>6} {row['metric']:<24} {pub:>9} {sim:>9} "
                      f"{row['error_pct']:>+7.1f}% {row['sim_wall_s']:>7.1f}s{flag}", flush=True)

        if not args.json:
            print(f"{'entry':<26} {'GPUs':>6} {'metric':<24} {'published':>9} {'simulated':>9} {'error':>8} "
                  f"{'wall':>8}")
        table = validate_against_published(args.only, args.fidelity, max_gpus=args.max_gpus, jobs=args.jobs,
                                           progress=show, include_slow=args.all)
        skipped = [e for e in ENTRIES if e.slow and not args.all and not args.only]
        for e in skipped:
            print(f"# skipped {e.name} (slow: {e.slow}); run it with --only {e.name} or --all", file=sys.stderr)
        if args.json:
            print(json.dumps(table.to_dict(orient="records")))
        elif len(table):
            err = table["error_pct"].abs()
            print(f"# {len(table)} entries: mean |error| {err.mean():.1f}%, max |error| {err.max():.1f}%; "
                  f"sources in docs/VALIDATION.md and each file's header")
        return 0

    return configure, run


# -------------------------------------------------------------------- topology
@command("topology", "describe and check a cluster's fabric; export it as a topology file (YAML) or GraphML")
def _topology():
    from .topology_cmd import configure, run
    return configure, run


# ------------------------------------------------------------------------ main
class _OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and exit 2), like every other error; and a value that starts
    with a minus and a digit (``--min-size -1MiB``) is a value, so that its own check names what is wrong,
    where argparse took it for an option ("expected one argument"). No option of ours looks like ``-1``."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if hasattr(self, "_negative_number_matcher"):  # (argparse's, since Python 2.7: bare numbers only)
            self._negative_number_matcher = re.compile(r"^-\.?\d")

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class _Version(argparse.Action):
    """``--version``, looked up (``importlib.metadata``, ~10 ms) only when asked for, not at every start."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        from . import __version__
        print(f"clustersim {__version__}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(prog="clustersim", description="Simulate the traffic that parallel LLM training puts on a "
                                                           "GPU cluster: step time, bubbles, bytes per link.")
    parser.add_argument("--version", action=_Version, help="show the version and exit")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_OneLineParser)
    for name, (configure, _run, help_text) in COMMANDS.items():
        configure(sub.add_parser(name, help=help_text, description=help_text))
    return parser


SIGPIPE_EXIT = 141
"""Exit status when the reader of our output went away (``clustersim ... | head``): 128 + SIGPIPE, as a
Unix tool killed by the signal reports it."""


def _stdout_closed() -> int:
    """Quietly give up writing when stdout's reader has closed the pipe.

    Python ignores SIGPIPE, so a write to a closed pipe raises :class:`BrokenPipeError`; the output left
    in the buffer would raise again when the interpreter flushes at exit. Pointing stdout at
    ``os.devnull`` drops it (the recipe in Python's ``signal`` documentation).
    """
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (AttributeError, OSError, ValueError):  # stdout replaced by an object without a file descriptor
        pass
    return SIGPIPE_EXIT


class _NamedStdout:
    """``sys.stdout`` while a command runs, naming itself in a write error: a full disk or device under a redirect
    (``> /dev/full``) raised a bare ``[Errno 28] No space left on device`` that named nothing. Everything else is
    the stream's own."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as exc:
            raise _named(exc) from None

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as exc:
            raise _named(exc) from None

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def _named(exc: OSError) -> OSError:
    """``exc`` naming standard output, unless it is a closed pipe (:func:`_stdout_closed`) or names a file."""
    if isinstance(exc, BrokenPipeError) or exc.filename is not None:
        return exc
    return OSError(exc.errno, f"standard output: {exc.strerror or exc} (redirect it to a file system with room, or "
                              f"to /dev/null)")


def _whole(value: float, given: str, field: str, unit: str, example: str) -> float:
    """``value`` (parsed from ``given``) if it is a whole number of ``unit`` (a message is whole bytes, a model
    whole parameters), else a one-line error naming ``field``."""
    if value != int(value):
        raise ValueError(f"{field}: {given} is {value:.12g} {unit}, not a whole number; give e.g. {example}")
    return value


_MESSAGE_CHARS = 1000


def _bounded(message: str) -> str:
    """``message`` cut to :data:`_MESSAGE_CHARS` characters: an error echoing a huge value (a 200,000-entry list
    printed a 2.6 MB line) still reads as one line."""
    if len(message) <= _MESSAGE_CHARS:
        return message
    return f"{message[:_MESSAGE_CHARS]}... ({len(message) - _MESSAGE_CHARS:,} more characters)"


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``clustersim`` console script."""
    args = build_parser().parse_args(argv)
    _configure, run, _help = COMMANDS[args.command]
    stdout = sys.stdout
    sys.stdout = _NamedStdout(stdout)
    try:
        status = run(args)
        sys.stdout.flush()  # inside the try: a closed pipe is reported here, not at interpreter exit
        return status
    except BrokenPipeError:
        return _stdout_closed()
    except DeadlockError as exc:
        print(f"clustersim: {exc}", file=sys.stderr)
        return 3
    except (ValueError, OSError) as exc:
        print(f"clustersim: error: {_bounded(str(exc))}", file=sys.stderr)
        return 2
    except (TypeError, ArithmeticError, LookupError, AttributeError, RecursionError) as exc:
        # An input that got past validation without a clear message: still one line, never a traceback.
        msg = _bounded(str(exc).splitlines()[0]) if str(exc) else ""
        print(f"clustersim: internal error: {type(exc).__name__}: {msg} (please report this input)",
              file=sys.stderr)
        return 1
    finally:
        if isinstance(sys.stdout, _NamedStdout):
            sys.stdout = stdout


def console() -> int:
    """The ``clustersim`` console script: :func:`main`, then an exit that skips the final garbage collection.

    A simulated step leaves millions of objects in reference cycles (SimPy callbacks, the engine's closures,
    the flow network's sessions): the interpreter's last collection at exit would walk them all only to let
    the operating system take the memory back anyway (1.5 s of the 9.5 s a 1,024-GPU MoE step takes from the
    shell, measured). :func:`gc.freeze` hides them from that collection; exit handlers still run and files
    are already closed. Not in :func:`main`, which tests and scripts call in a process that goes on.
    """
    status = main()
    gc.freeze()
    return status


if __name__ == "__main__":
    sys.exit(console())
