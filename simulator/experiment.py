"""Experiment files: one YAML document describes one run.

Sections (every section may name a ``preset`` and override its fields)::

    name: gpt3-175b on 1024 H100
    cluster:  {preset: dgx-h100, nodes: 128, ...}     # topologies.build_cluster
    model:    {preset: gpt3-175b, ...}                # workloads.models.model_from_dict
    parallel: {tp: 8, pp: 8, ...}                     # workloads.parallel.parallel_from_dict
    training: {seq_len: 2048, dtype: bf16}
    network:  {model: flow, step_latency: 2us, fidelity: fast, seed: 0, routing: ecmp, all_to_all: auto,
               replica_sends: merged, pxn: true, channels: nccl, all_to_all_efficiency: 0.85}  # optional
    fidelity: fast                                     # optional: fast | full | lockstep (see FIDELITIES)
    moe:      {routing: zipf, zipf_s: 1.2, capacity_factor: 1.25, seed: 0}  # optional, MoE token routing
    compute:  {matmul_efficiency: 0.75, attention_efficiency: 0.5, ...}     # optional
    options:  {granularity: chunk, grad_dtype_bytes: 2, causal: false, flash_attention: true}  # optional
    sweep:    {...}                                    # read by ``clustersim sweep`` only
    plan:     {port_speed: auto, components: {...}}    # optional: capacity planning (topologies.components)

``parallel.dp`` may be omitted (or ``auto``): it is then the cluster's GPU
count divided by ``tp·cp·pp``. The world size must equal the cluster's GPUs.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from functools import partial
from typing import TYPE_CHECKING

import numpy as np
import yaml

from topologies import build_cluster, format_bandwidth, parse_time
from topologies.bisection import bisection_bandwidth
from topologies.builders import core_ratio, default_spines, rail_pod, ratio_text, ratios_text
from topologies.capacity import plan_columns
from topologies.cluster import Cluster, check_cluster
from topologies.components import PlanOptions, plan_options
from topologies.faults import (
    COMPUTE_FAULTS,
    apply_faults,
    check_fault,
    check_variability,
    compute_slowdown,
    fault_counts,
)
from topologies.loader import describes_topology, preset_section, resolve_topology_path
from topologies.yamlio import load_yaml, malformed
from workloads.errors import ConfigError, check_bool, plain_values, unknown_keys, with_prefix
from workloads.memory import MemoryBreakdown, memory_per_gpu, model_state_bytes, routed_rows_factor
from workloads.models import ModelSpec, model_from_dict
from workloads.moe import RoutingModel, routing_from_dict
from workloads.op_budget import MAX_OPS, StepTooLargeError, without_lockstep
from workloads.parallel import (
    SPLIT_BACKWARD_SCHEDULES,
    ParallelConfig,
    TrainingSpec,
    layers_per_stage,
    parallel_from_dict,
    training_from_dict,
    validate,
)
from workloads.sharding import sharding_plan
from workloads.training import StepOptions, TrainingStep, check_step_options, megatron_grad_overlap, training_step

from .compute import ComputeModel
from .engine import Engine, paused_gc
from .fabric import NetworkConfig
from .result import Result

if TYPE_CHECKING:
    import pandas as pd

SECTIONS = ("name", "cluster", "model", "parallel", "training", "moe", "network", "compute", "options", "sweep",
            "fidelity", "faults", "plan")
FIDELITIES = ("fast", "full", "lockstep")
"""Simulation fidelity. ``full`` simulates every rank's program. ``fast`` (default) simulates one
representative per TP group — the members of a TP group run identical programs in lockstep — or, for a MoE
model, per EP group with its TP peers where one rank can issue for the whole group (not on the expert grid, nor
where work runs beside the experts or ranks differ in speed: docs/DESIGN.md, "One representative per EP group in
fast"), while the
network still carries every member's flows (each DP/PP flow and collective is replayed once per member,
TP collectives run over the real group; a send's replicas of one kind run as one flow over all their routes
unless ``network.replica_sends: each``), so link loads and contention are those of the full run. The two
agree on step time within 2% (``tests/test_fidelity.py``). ``lockstep`` goes further: one
representative per pipeline stage stands for its whole DP x TP block, so DP replicas advance in lockstep,
each op waiting for the slowest replica's flows; the network still carries every replica's flows. A MoE
stage's representative issues for its whole EP group with its slowest member's experts (one per EP index,
for its expert-DP x TP block, where work runs beside the experts: the overlapped shared expert, a split
backward; docs/DESIGN.md, "Skewed MoE stages"). A MoE step
whose DeepEP matrices differ between the EP groups of one stage (groups spread over nodes unalike) runs as
``fast``. Exact when the replicas see the same contention; usually pessimistic otherwise
(measured: +0.003% at 1,024 GPUs on the GPT-3 ladder, up to +14% on a deliberately comm-bound config with
8:1 oversubscription and ECMP collisions — see docs/DESIGN.md). For large sweeps; check winners with
``fast``. Not to be confused with ``network.fidelity`` (pipelined rings vs every ring step)."""

_REPRESENTATIVES = {"full": None, "fast": "ep", "lockstep": "stage"}


def representatives_for(exp: Experiment, fidelity: str) -> str | None:
    """Which ranks a representative stands for in ``fidelity`` (:func:`~workloads.training.training_step`'s
    ``representatives``): in ``fast`` a TP group, or a MoE model's EP group with its TP peers where one rank can
    issue for the whole group (``"ep"``); a stage's block in ``lockstep``; none in ``full``.

    Stragglers and GPU variability narrow it: in ``lockstep`` one stands for an EP index, not the whole group (a
    straggler is one EP member), and in ``fast`` for a TP group; under a split backward (``zb-h1``,
    ``dualpipe``) every rank runs its own program, since a straggler's healthy TP partners run their W passes,
    which hold no TP collective, at their own speed and start their DP reductions earlier (a representative at
    the slowest member's speed read +8.5% on a 4:1 fabric, tests/test_audit22.py)."""
    if _every_rank_for_stragglers(exp):
        return None
    representatives = _REPRESENTATIVES[fidelity]
    if exp.slowdown():  # ranks of unequal speed: a representative stands only for ranks of one program
        return {"stage": "stage_ep", "ep": "tp"}.get(representatives, representatives)
    return representatives


def _every_rank_for_stragglers(exp: Experiment) -> bool:
    """A straggler under a split backward: every fidelity simulates every rank (:func:`representatives_for`)."""
    return bool(exp.slowdown()) and exp.parallel.schedule in SPLIT_BACKWARD_SCHEDULES


_EVERY_RANK = ("a straggler under a split backward (schedule: {schedule}) runs every rank in every fidelity: "
               "its healthy TP partners' W passes hold no TP collective and run ahead")

FP8_DELAYED_SCALING_NO_RECOMPUTE = ("layernorm", "moe_act")
"""Recompute modules Megatron-Core refuses under FP8's delayed-scaling recipe (``transformer_config.py``: "Delayed
scaling does not support moe_act and layernorm recompute for fp8"): noted, and caveated as a remedy."""


DEMO_EXPERIMENT = {
    "name": "demo: gpt2-small, TP2 x PP2 x DP4 on 2 DGX-H100 nodes",
    "cluster": {"preset": "dgx-h100", "nodes": 2},
    "model": {"preset": "gpt2-small"},
    "parallel": {"tp": 2, "pp": 2, "dp": 4, "micro_batch": 4, "global_batch": 64, "schedule": "1f1b",
                 "sequence_parallel": True},
    "training": {"seq_len": 1024, "dtype": "bf16"},
}
"""The built-in demo (same as ``examples/demo.yaml``)."""


FORCE_HINT = " (or use --force to simulate anyway)"
"""The end of an out-of-memory hint where the command has ``--force`` (``run``, ``jobs``; a sweep has none)."""


def without_force(message: str) -> str:
    """``message`` without the :data:`FORCE_HINT` it may end with (where the command has no ``--force``)."""
    return message[:-len(FORCE_HINT)] if message.endswith(FORCE_HINT) else message


class OutOfMemoryError(ValueError):
    """The configuration does not fit in GPU memory: ``summary`` (the breakdown against the GPU's memory),
    then ``hint`` (what to do about it) when given, which may end with :data:`FORCE_HINT`."""

    def __init__(self, summary: str, hint: str | None = None) -> None:
        super().__init__(summary if hint is None else f"{summary}; {hint}")
        self.summary = summary

    def with_remedies(self, exp: Experiment) -> OutOfMemoryError:
        """The same error, its hint replaced by the single changes that make ``exp`` fit
        (:func:`memory_remedies`), when there are any."""
        remedies = memory_remedies(exp)
        if not remedies:
            return self
        fits = ", or ".join(f"{what} ({m.total / 1e9:.1f} GB)" for what, m in remedies)
        return OutOfMemoryError(self.summary, f"fits with {fits}{FORCE_HINT}")


@dataclass
class Experiment:
    """A fully resolved experiment: cluster, model, parallel layout, training and engine knobs."""

    name: str
    cluster: Cluster
    model: ModelSpec
    parallel: ParallelConfig
    training: TrainingSpec
    network: NetworkConfig = field(default_factory=NetworkConfig)
    compute: dict = field(default_factory=dict)
    options: StepOptions = field(default_factory=StepOptions)
    raw: dict = field(default_factory=dict)
    fidelity: str = "fast"
    routing: RoutingModel = field(default_factory=RoutingModel)
    faults: list = field(default_factory=list)
    """The ``faults:`` list (:mod:`topologies.faults`); ``cluster`` has them applied."""
    healthy_cluster: Cluster | None = None
    """The cluster before ``faults`` (None without faults)."""
    plan: PlanOptions = field(default_factory=PlanOptions)
    """The ``plan:`` section: port speed, cable media and component prices for the capacity columns."""

    def memory(self) -> MemoryBreakdown:
        """Peak memory per GPU (most loaded pipeline stage)."""
        return memory_per_gpu(self.model, self.parallel, self.training,
                              flash_attention=self.options.flash_attention,
                              grad_dtype_bytes=self.options.grad_dtype_bytes,
                              routed_factor=routed_rows_factor(self.model, self.parallel, self.training,
                                                               self.routing.capacity_factor,
                                                               self.routing.pad_to_capacity))

    def compute_model(self) -> ComputeModel:
        return ComputeModel(self.cluster.gpu, dtype=self.training.dtype, **self.compute)

    def slowdown(self) -> dict[int, float]:
        """GPUs slowed by the compute faults of ``faults`` (stragglers, the GPUs' variability): rank -> factor on its
        compute time (:func:`topologies.faults.compute_slowdown`; under variability some factors are below 1, GPUs
        faster than the model's; a factor of 1 slows nothing, so it neither changes which ranks a fidelity
        simulates nor appears here)."""
        return compute_slowdown(self.faults, self.cluster.num_gpus)


# -------------------------------------------------------------------- loading
_PRESET_SECTIONS = ("cluster", "model")
"""Sections a bare name stands for: ``cluster: dgx-h100`` is ``cluster: {preset: dgx-h100}``, and ``cluster:
dgx-h100:4`` (the command line's ``PRESET:NODES``) is ``cluster: {preset: dgx-h100, nodes: 4}``."""


def preset_fields(key: str, text: str) -> dict:
    """The fields of section ``key`` given as ``text`` (:data:`_PRESET_SECTIONS`): ``{preset: text}``, or for
    the cluster ``PRESET:NODES`` as well (:func:`topologies.loader.preset_section`)."""
    return preset_section(text) if key == "cluster" else {"preset": text}


def _section(doc: Mapping, key: str) -> dict:
    value = doc.get(key, {})
    if value is None:
        return {}
    if isinstance(value, str) and key in _PRESET_SECTIONS:
        return preset_fields(key, value)
    if not isinstance(value, Mapping):
        got = f"the text {value!r}" if isinstance(value, str) else type(value).__name__
        raise ConfigError(f"{key}: must be a mapping of fields (e.g. {key}: {{field: value}}), got {got}")
    return dict(value)


def _network_from_dict(section: Mapping) -> NetworkConfig:
    valid = ("model", "step_latency", "fidelity", "seed", "bandwidth_efficiency", "routing", "all_to_all",
             "replica_sends", "pxn", "channels", "all_to_all_efficiency")
    unknown = unknown_keys(section, valid)
    if unknown:
        raise ConfigError(f"network.{unknown[0]}: unknown field; valid fields: {', '.join(valid)}")
    kwargs = {}
    if "model" in section:
        kwargs["model"] = section["model"]
    if "step_latency" in section and section["step_latency"] != "nccl":
        kwargs["step_latency_s"] = parse_time(section["step_latency"], "network.step_latency")
    if "fidelity" in section:
        kwargs["fidelity"] = section["fidelity"]
    if "routing" in section:
        kwargs["routing"] = section["routing"]
    if "all_to_all" in section:
        kwargs["all_to_all"] = section["all_to_all"]
    if "replica_sends" in section:
        kwargs["replica_sends"] = section["replica_sends"]
    if "channels" in section:
        kwargs["channels"] = section["channels"]
    if "pxn" in section:
        check_bool("network.pxn", section["pxn"])
        kwargs["pxn"] = section["pxn"]
    if "all_to_all_efficiency" in section:
        a2a = section["all_to_all_efficiency"]
        if isinstance(a2a, bool) or not isinstance(a2a, (int, float)):
            raise ConfigError(f"network.all_to_all_efficiency: must be a number in [0.01, 1] (a fraction of the "
                              f"NIC's line rate), got {a2a!r}")
        kwargs["all_to_all_efficiency"] = a2a
    if "bandwidth_efficiency" in section:
        eff = section["bandwidth_efficiency"]
        if isinstance(eff, Mapping):
            eff = dict(eff)
        elif isinstance(eff, bool) or not isinstance(eff, (int, float)):
            raise ConfigError(f"network.bandwidth_efficiency: must be a number in [0.01, 1] or a mapping "
                              f"{{tier: number}}, got {eff!r}")
        kwargs["bandwidth_efficiency"] = eff
    if "seed" in section:
        seed = section["seed"]
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ConfigError(f"network.seed: must be an integer, got {seed!r}")
        kwargs["seed"] = seed
    return NetworkConfig(**kwargs)


def _check_moe_section(model: ModelSpec, routing: RoutingModel) -> None:
    """Refuse a custom expert load of the wrong length (found here, with the file's name, rather than when the
    step is built). A ``moe:`` section on a dense model is a note (:func:`unused_settings`), not an error: the
    README's annotated file shows every section on one dense model."""
    load = routing.expert_load
    if model.is_moe and routing.kind == "custom" and load is not None:
        if len(load) != model.experts:
            raise ConfigError(f"moe.expert_load: has {len(load)} entries but the model has {model.experts} experts")
        routing.choice_probabilities(model.experts, model.top_k)  # (fewer loaded experts than top_k: refused)


def _compute_from_dict(section: Mapping) -> dict:
    valid = [f.name for f in fields(ComputeModel) if f.name not in ("gpu", "dtype")]
    unknown = unknown_keys(section, valid)
    if unknown:
        raise ConfigError(f"compute.{unknown[0]}: unknown field; valid fields: {', '.join(valid)}")
    for k, v in section.items():
        if k == "attention_kernel":
            if not isinstance(v, str) or not v.strip():
                raise ConfigError(f"compute.attention_kernel: must be a kernel name (fa2, fa3, cudnn), got {v!r}")
        elif isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ConfigError(f"compute.{k}: must be a number, got {v!r}")
    return dict(section)


def _options_from_dict(section: Mapping) -> StepOptions:
    valid = [f.name for f in fields(StepOptions)]
    unknown = unknown_keys(section, valid)
    if unknown:
        raise ConfigError(f"options.{unknown[0]}: unknown field; valid fields: {', '.join(valid)}")
    return StepOptions(**section)


def derived_dp(num_gpus: int, tp: int, pp: int) -> int | None:
    """The dp that fills ``num_gpus`` with ``tp·pp``-GPU model replicas, or None if they do not divide it."""
    return None if num_gpus % (tp * pp) else num_gpus // (tp * pp)


def experiment_from_dict(doc: Mapping, cluster: Cluster | None = None, *, job: bool = True) -> Experiment:
    """Resolve an experiment document (already parsed YAML) into an :class:`Experiment`.

    ``cluster``, if given, is the cluster to run on instead of the document's ``cluster`` section (which must
    then be absent): a job's GPUs on a shared fabric (:mod:`simulator.jobs`), or (``job=False``) the
    document's own cluster section built once by the caller (a sweep's points), whose messages then name
    ``cluster.nodes`` rather than a job's nodes.
    """
    if not isinstance(doc, Mapping):
        raise ConfigError(f"experiment: the file must hold a mapping of sections ({', '.join(SECTIONS)})")
    doc = plain_values(doc)  # (numpy scalars of a notebook's document as a file's values)
    if cluster is not None:
        check_cluster(cluster)
    check_not_jobs(doc)
    check_sections(doc)
    if doc.get("sweep") is not None:  # read by `clustersim sweep` only, but a malformed one is an error everywhere
        from .sweeps.grid import sweep_settings  # (here: the sweeps package imports this module)
        sweep_settings(doc)
    shared = cluster is not None and job  # a job's GPUs of a shared fabric: its nodes size it, not cluster.nodes
    required = [("model", "model: {preset: gpt3-175b}")]
    if cluster is None:
        required.insert(0, ("cluster", "cluster: {preset: dgx-h100, nodes: 2}"))
    elif "cluster" in doc:
        raise ConfigError("cluster: not allowed here: the cluster is given (a job runs on the shared fabric)")
    for key, example in required:
        if not doc.get(key):
            raise ConfigError(f"{key}: required section is missing or empty; e.g. {example}")
    if cluster is None:
        with paused_gc():  # (millions of graph objects, no cycles to find: see paused_gc)
            cluster = build_cluster(_section(doc, "cluster"))
    model = model_from_dict(_section(doc, "model"))
    par = _section(doc, "parallel")
    tp, pp, cp = par.get("tp", 1), par.get("pp", 1), par.get("cp", 1)
    if "dp" in par and par["dp"] is None:  # (``dp:`` or ``dp: null`` in YAML: not given, so derived)
        del par["dp"]
    if par.get("dp", "auto") == "auto" and all(isinstance(x, int) and x > 0 for x in (tp, pp, cp)):
        dp = derived_dp(cluster.num_gpus, tp * cp, pp)
        if dp is None:
            what = "tp*cp*pp" if cp > 1 else "tp*pp"
            raise ConfigError(f"parallel.dp: cannot derive dp: {what} = {tp * cp * pp} does not divide the "
                              f"cluster's {cluster.num_gpus} GPUs")
        par["dp"] = dp
    parallel = parallel_from_dict(par)
    if parallel.world_size != cluster.num_gpus:
        cpw = ("cp*", f"{parallel.cp}*") if parallel.cp > 1 else ("", "")
        replica = parallel.tp * parallel.cp * parallel.pp
        fix = (f"set dp to {cluster.num_gpus // replica}" if cluster.num_gpus % replica == 0 else
               f"tp*{cpw[0]}pp = {replica} does not divide {cluster.num_gpus}, so no dp fits: choose tp"
               f"{', cp' if cpw[0] else ''} and pp whose product divides it")
        from_file = describes_topology(doc.get("cluster")) or cluster.params.get("fabric") == "custom"
        # (a topology file's cluster takes no nodes: field)
        resize = ("give the job other nodes (its nodes: field)" if shared else
                  f"give the topology file {parallel.world_size} GPUs" if from_file else "resize cluster.nodes")
        raise ConfigError(f"parallel: tp*{cpw[0]}pp*dp = {parallel.tp}*{cpw[1]}{parallel.pp}*{parallel.dp} = "
                          f"{parallel.world_size} but the cluster has {cluster.num_gpus} GPUs; {fix} or {resize}")
    section = _section(doc, "training")
    if "seq_len" not in section and model.max_seq_len < TrainingSpec.seq_len:
        section["seq_len"] = model.max_seq_len  # (the default, 2048, would exceed a small model's positions)
    training = training_from_dict(section)
    validate(model, parallel, training)  # impossible combinations fail at load time, with the file's name
    faults, healthy = _faults_from_list(doc.get("faults"), cluster), None
    if faults:
        healthy, cluster = cluster, apply_faults(cluster, faults)
    name = label(doc.get("name"), "name") or f"{model.name} on {cluster.name}"
    exp = Experiment(str(name), cluster, model, parallel, training, _network_from_dict(_section(doc, "network")),
                     _compute_from_dict(_section(doc, "compute")), _options_from_dict(_section(doc, "options")),
                     raw=copy.deepcopy(dict(doc)), fidelity=_fidelity(
                         "fast" if doc.get("fidelity") is None else doc["fidelity"]),
                     routing=dataclasses.replace(routing_from_dict(_section(doc, "moe")),
                                                 node_gpus=cluster.gpus_per_server))
    check_step_options(model, parallel, exp.options)  # (at load time too: the error then names the file)
    exp.faults, exp.healthy_cluster = faults, healthy
    _check_moe_section(model, exp.routing)
    for knob, used in (("tp_comm_overlap_sms", parallel.tp_comm_overlap),
                       ("dualpipe_comm_sms", parallel.schedule == "dualpipe" and model.is_moe)):
        sms = getattr(exp.options, knob)
        if used and sms >= cluster.gpu.sm_count:
            raise ConfigError(f"options.{knob}: {sms} SMs for communication leave none of the "
                              f"{cluster.gpu.sm_count} SMs of {cluster.gpu.name} for the GEMMs beside them")
    exp.plan = plan_options(doc.get("plan"))
    exp.compute_model()  # compute knobs fail here, with the file's name, not after the step is built
    return exp


def _faults_from_list(value: object, cluster: Cluster) -> list[dict]:
    """The ``faults:`` list, each entry checked (topology faults again when applied); stragglers here."""
    if value is None:
        return []
    if isinstance(value, (str, Mapping)) or not isinstance(value, list):
        raise ConfigError(f"faults: must be a list of faults such as [{{kind: switch_down, switch: spine:0}}], "
                          f"got {value!r}")
    faults = [check_fault(f, i) for i, f in enumerate(value)]
    spreads = [i for i, f in enumerate(faults) if f["kind"] == "variability"]
    for i, f in enumerate(faults):
        if f["kind"] == "variability":
            check_variability(f, f"faults[{i}]")
            if i != spreads[0]:
                raise ConfigError(f"faults[{i}]: the GPUs already have a variability (faults[{spreads[0]}]); give "
                                  f"one entry")
        if f["kind"] == "straggler":
            rank, factor = f["gpu"], f["factor"]
            if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < cluster.num_gpus:
                raise ConfigError(f"faults[{i}].gpu: must be a rank in 0..{cluster.num_gpus - 1}, got {rank!r}")
            if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 1 <= factor <= 1000:
                raise ConfigError(f"faults[{i}].factor: must be a compute slowdown in [1, 1000], got {factor!r}")
    return faults


def check_not_jobs(doc: Mapping) -> None:
    """Refuse a jobs file (one with ``jobs:``) where one experiment is expected: it runs with ``clustersim jobs``."""
    if "jobs" in doc:
        raise ConfigError("jobs: a file of several jobs sharing a fabric runs with `clustersim jobs FILE` "
                          "(API: simulator.jobs.load_jobs / run_jobs)")


def check_sections(keys: Iterable) -> None:
    """Refuse a top-level key of an experiment file (``keys``: the file's dict, or its keys) that is not one of
    :data:`SECTIONS` (a typo such as ``netwrk:`` would otherwise leave the section's defaults silently)."""
    unknown = unknown_keys(keys, SECTIONS)
    if unknown:
        raise ConfigError(f"{unknown[0]}: unknown section; valid sections: {', '.join(SECTIONS)}")


def check_file_sections(doc: Mapping) -> None:
    """A file read for its cluster only (``collective``, ``topology``, ``plan``): refuse a misspelled section of an
    experiment file (one with ``cluster:``) or of a jobs file (one with ``jobs:``); a file of cluster or topology
    fields at top level is left to the cluster builder."""
    if "jobs" in doc:
        from .jobs import check_jobs_sections  # (jobs imports this module)
        check_jobs_sections(doc)
    elif "cluster" in doc:
        check_sections(doc)


def read_experiment_file(path: str | os.PathLike, sections: Sequence[str] = SECTIONS) -> dict:
    """Parse an experiment YAML file into a dict; one-line ``ConfigError`` for unreadable or malformed files
    (``sections``: the file's valid sections, named when it holds no mapping; a jobs file's differ)."""
    if not isinstance(path, (str, os.PathLike)):  # (an int would be opened as a file descriptor)
        raise TypeError(f"experiment file: must be a path (str or os.PathLike), got {type(path).__name__} "
                        f"{path!r:.60}")
    try:
        with open(path) as fh:
            doc = load_yaml(fh)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such experiment file") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: {malformed(exc)}") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a folder, not an experiment file (a folder of Chakra traces runs as "
                          f"clustersim run --chakra {path})") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    if doc is None:
        raise ConfigError(f"{path}: the file is empty")
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: must hold a mapping of sections ({', '.join(sections)})")
    if "cluster" in doc:  # a relative topology file is next to the experiment file
        doc["cluster"] = resolve_topology_path(doc["cluster"], os.path.dirname(os.fspath(path)))
    return doc


def load_experiment(path: str | os.PathLike) -> Experiment:
    """Read and resolve an experiment YAML file.

    Examples
    --------
    >>> exp = load_experiment("examples/demo.yaml")  # doctest: +SKIP
    >>> result = run_experiment(exp)                   # doctest: +SKIP
    """
    doc = read_experiment_file(path)
    try:
        return experiment_from_dict(doc)
    except ValueError as exc:
        raise with_prefix(exc, str(path)) from None


def unused_settings(exp: Experiment, fidelity: str | None = None) -> list[str]:
    """Settings the experiment file gives that this run never reads (each a one-line note naming the field and
    what would make it count): knobs of a mechanism the layout does not use. They are not errors, since a
    sweep's base file may set them for the points that do use them, but a user should not think they acted.
    ``fidelity`` is the run's when it overrides the file's (``clustersim run --fidelity``)."""
    if not isinstance(exp, Experiment):
        raise TypeError(f"exp: must be an Experiment (load_experiment or experiment_from_dict), got "
                        f"{type(exp).__name__}")
    fidelity = _fidelity(exp.fidelity if fidelity is None else fidelity)
    raw = exp.raw or {}
    par, model = exp.parallel, exp.model

    def given(section: str, key: str) -> bool:
        value = raw.get(section)
        return isinstance(value, Mapping) and key in value

    notes = []
    if not model.is_moe:
        for key in ("moe_ffn_hidden", "moe_layer_freq", "first_dense_layers", "shared_experts"):
            if given("model", key):
                notes.append(f"model.{key} has no effect: model {model.name} has no experts (model.experts, "
                             f"model.top_k)")
    elif not any(model.is_moe_layer(i) for i in range(model.layers)):
        notes.append(f"model: no layer of {model.name} is a MoE layer (first_dense_layers "
                     f"{model.first_dense_layers}, moe_layer_freq {model.moe_layer_freq}, {model.layers} layers): "
                     f"its experts have no effect; the step is dense")
    if raw.get("moe") and not model.is_moe:
        notes.append(f"moe: has no effect: model {model.name} has no experts (model.experts, model.top_k)")
    elif given("moe", "zipf_s") and exp.routing.kind != "zipf" and par.ep > 1:
        notes.append(f"moe.zipf_s has no effect with routing: {exp.routing.kind} (only routing: zipf reads it)")
    if model.is_moe and given("moe", "max_nodes") and exp.routing.dispatch != "deepep" and par.ep > 1:
        notes.append(f"moe.max_nodes has no effect with dispatch: {exp.routing.dispatch} (only dispatch: deepep "
                     f"sends a token once per node; the all-to-all sends it once per expert)")
    moe_keys = list(raw["moe"]) if isinstance(raw.get("moe"), Mapping) else []
    if model.is_moe and par.ep == 1 and moe_keys:
        notes.append(f"moe.{', moe.'.join(moe_keys)} {'has' if len(moe_keys) == 1 else 'have'} no effect at "
                     f"parallel.ep 1: without expert parallelism every rank computes its experts at the balanced "
                     f"load (routing, capacity dropping and padding are simulated with ep > 1)")
    if model.is_moe and given("moe", "expert_load") and exp.routing.kind != "custom" and par.ep > 1:
        notes.append(f"moe.expert_load has no effect with routing: {exp.routing.kind} (only routing: custom reads "
                     f"it)")
    if given("parallel", "cp_comm_type") and par.cp == 1:
        notes.append("parallel.cp_comm_type has no effect without context parallelism (cp > 1)")
    plan = sharding_plan(par)
    for key in ("zero_prefetch", "zero_reuse_distance", "zero_persistence"):
        if given("parallel", key) and par.zero < 3:
            notes.append(f"parallel.{key} has no effect below zero: 3 (it is ZeRO-3's parameter fetching)")
        elif given("parallel", key) and plan.impl != "deepspeed":
            notes.append(f"parallel.{key} has no effect with zero_impl: {plan.impl} (it is DeepSpeed ZeRO-3's "
                         f"parameter fetching)")
    if given("parallel", "zero_prefetch") and plan.impl == "deepspeed" and par.zero >= 3 and not plan.overlap:
        notes.append("parallel.zero_prefetch has no effect with zero_overlap: false (blocking gathers fetch each "
                     "module when it is used, none ahead)")
    if given("parallel", "zero_overlap") and plan.gather is None:
        notes.append("parallel.zero_overlap has no effect without per-layer parameter gathers (zero: 3, or FSDP's "
                     "zero: 2)")
    if given("training", "fp8_recipe") and exp.training.dtype != "fp8":
        notes.append(f"training.fp8_recipe has no effect with dtype: {exp.training.dtype} (training.dtype: fp8 "
                     f"reads it)")
    if given("parallel", "align_param_gather") and not (par.overlap_param_gather and par.schedule == "interleaved"):
        notes.append("parallel.align_param_gather has no effect without parallel.overlap_param_gather under "
                     "schedule: interleaved (Megatron forces it off without interleaving)")
    if given("parallel", "align_grad_reduce") and not (par.pp > 1 and megatron_grad_overlap(par, plan)):
        notes.append("parallel.align_grad_reduce has no effect here: it is how Megatron's distributed data "
                     "parallelism (zero_impl megatron, overlap_grad_reduce, gradients reduced once per step) "
                     "launches the reductions of a pipeline (pp > 1, schedule 1f1b or interleaved)")
    if given("options", "tp_comm_overlap_sms") and not par.tp_comm_overlap:
        notes.append("options.tp_comm_overlap_sms has no effect without parallel.tp_comm_overlap")
    if given("options", "dualpipe_comm_sms") and not (par.schedule == "dualpipe" and model.is_moe):
        notes.append("options.dualpipe_comm_sms has no effect outside DualPipe with a MoE model")
    if _deepspeed_pipeline(par):
        notes.append(f"parallel.zero: {par.zero} with pp {par.pp} and zero_impl deepspeed: DeepSpeed's pipeline "
                     f"engine refuses ZeRO-2/3 (\"ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism\"); "
                     f"simulated as given (zero_impl: fsdp2 is a framework that combines them, torchtitan)")
    late = [m for m in FP8_DELAYED_SCALING_NO_RECOMPUTE if m in par.selective_modules]
    if exp.training.fp8_amax_reductions and par.recompute == "selective" and late:
        notes.append(f"parallel.recompute_modules: {', '.join(late)} with dtype fp8: Megatron-Core refuses "
                     f"{'them' if len(late) > 1 else 'it'} under its delayed-scaling FP8 recipe (\"Delayed scaling "
                     f"does not support moe_act and layernorm recompute for fp8\"; other recipes and DeepSeek-V3's "
                     f"fine-grained FP8 recompute them); simulated as given")
    if given("compute", "fp8_matmul_efficiency") and exp.training.dtype != "fp8":
        notes.append(f"compute.fp8_matmul_efficiency has no effect with dtype: {exp.training.dtype} "
                     f"(training.dtype: fp8 reads it)")
    if given("compute", "fp8_wgrad_matmul_efficiency") and exp.training.fp8_recipe != "blockwise":
        notes.append("compute.fp8_wgrad_matmul_efficiency has no effect without training.fp8_recipe: blockwise "
                     "(it times blockwise FP8's weight-gradient GEMMs)")
    fused = exp.options.flash_attention
    for key in ("attention_kernel", "attention_efficiency"):
        if given("compute", key) and not fused:
            notes.append(f"compute.{key} has no effect with options.flash_attention: false (unfused attention's "
                         f"kernels are timed as GEMMs and score kernels)")
    if given("compute", "score_memory_efficiency") and fused:
        notes.append("compute.score_memory_efficiency has no effect with fused attention (options.flash_attention: "
                     "true, the default): no s x s scores go through HBM")
    if given("compute", "attention_kernel") and given("compute", "attention_efficiency") and fused:
        notes.append("compute.attention_kernel has no effect with compute.attention_efficiency set (one flat "
                     "fraction of peak instead of the kernel's published rates)")
    # ranks a representative can stand for at most: fast, its TP group; lockstep, its stage's DP x CP x TP block
    replicas = {"fast": par.tp, "lockstep": par.tp * par.cp * par.dp}.get(fidelity, 1)
    if given("network", "replica_sends") and (replicas == 1 or exp.network.model != "flow"):
        why = ("network.model: analytic" if fidelity != "full" and replicas > 1 else
               "the top-level fidelity: full" if fidelity == "full" else
               "fidelity fast at tp 1, where no representative stands for other ranks" if fidelity == "fast" else
               "fidelity lockstep with one rank per pipeline stage, where no representative stands for others")
        notes.append(f"network.replica_sends has no effect with {why}; it is how the sends of a representative's "
                     f"replicas run on the flow model, in fidelity fast or lockstep")
    # (a straggler's representative runs at its slowest replica's speed, and a latency fault delays every link of
    # its tier alike: neither tells the members apart)
    if replicas > 1 and _every_rank_for_stragglers(exp):
        notes.append(f"fidelity {fidelity}: " + _EVERY_RANK.format(schedule=exp.parallel.schedule)
                     + " (as fidelity full: slower to simulate)")
    fabric_faults = sorted({f.get("kind") for f in exp.faults if f.get("kind") not in COMPUTE_FAULTS + ("latency",)})
    if fabric_faults and replicas > 1:
        notes.append(f"faults ({', '.join(fabric_faults)}) with fidelity {fidelity}: a representative's replicas "
                     f"run in step, so a faulted member's flows hold back the others it stands for (a degraded "
                     f"NVLink port of one TP member read +4.7% against full); re-check with fidelity: full")
    if given("network", "all_to_all_efficiency") and not exp.network.nccl_latency:
        notes.append("network.all_to_all_efficiency has no effect with network.step_latency given as a time; it "
                     "is part of NCCL's model (step_latency: nccl)")
    if given("network", "channels") and not exp.network.nccl_latency:
        notes.append("network.channels has no effect with network.step_latency given as a time; it is NCCL's "
                     "channel count, part of NCCL's model (step_latency: nccl)")
    fabric = exp.cluster.params.get("fabric")
    uplink, port = exp.cluster.params.get("uplink_bandwidth") or 0.0, exp.cluster.params.get("nic_bandwidth") or 0.0
    if 0 < uplink < port * (1 - 1e-9) and fabric in ("leaf_spine", "rail_optimized"):
        # (the builders spread a leaf's uplink bandwidth over its spines: with many spines and a high ratio
        # each leaf-spine cable would be a fraction of a port, which no switch has)
        params = exp.cluster.params
        ports = (params["nodes_per_leaf"] * params["gpus_per_node"] if fabric == "leaf_spine"
                 else rail_pod(params["nodes"], params["nodes_per_leaf"]))
        fewer = default_spines(ports, params["oversubscription"])
        spines = f"cluster.spines: {params['spines']}" + ("" if given("cluster", "spines") else " (the default)")
        notes.append(f"{spines} at {ratio_text(params['oversubscription'])} gives each leaf-spine link "
                     f"{format_bandwidth(uplink)}, less than one {format_bandwidth(port)} port: it is simulated "
                     f"at that rate, but a switch has whole ports (clustersim plan prices one cable each); "
                     f"spines: {fewer} or fewer keeps each link at least one port")
    scale_out = ("nic_bandwidth", "pcie_bandwidth", "nic_latency", "switch_latency", "spines", "nodes_per_leaf",
                 "oversubscription")
    if fabric == "single_node":
        for key in scale_out:
            if given("cluster", key):
                notes.append(f"cluster.{key} has no effect with fabric single_node (one NVLink domain, no NICs)")
    elif exp.cluster.params.get("leaves") == 1:  # (one leaf: no spines, every route one switch)
        for key in ("spines", "oversubscription"):
            if given("cluster", key):
                notes.append(f"cluster.{key} has no effect: the {exp.cluster.params.get('nodes')} nodes hang off "
                             f"one leaf (nodes_per_leaf {exp.cluster.params.get('nodes_per_leaf')}), so no "
                             f"traffic crosses a spine")
        if exp.network.routing == "spray" and given("network", "routing"):
            notes.append("network.routing: spray has no effect: one leaf gives every pair one path")
    for key in ("core_oversubscription", "cores", "leaves_per_pod"):
        if given("cluster", key) and fabric != "fat_tree":
            notes.append(f"cluster.{key} has no effect with fabric {fabric or '(a topology file)'} "
                         f"(only fat_tree has a core tier)")
    efficiency = exp.network.bandwidth_efficiency  # (a mapping only as the file gave it: per tier)
    if isinstance(efficiency, Mapping):
        present = {tier for _u, _v, tier in exp.cluster.graph.edges(data="tier")}
        for tier in efficiency:
            if tier not in present:
                notes.append(f"network.bandwidth_efficiency.{tier} has no effect: this cluster has no {tier} links "
                             f"(its tiers: {', '.join(sorted(t for t in present if t))})")
    if given("moe", "shared_expert_overlap") and exp.routing.shared_expert_overlap and model.is_moe \
            and not model.shared_experts:
        notes.append(f"moe.shared_expert_overlap has no effect: model {model.name} has no shared experts "
                     f"(model.shared_experts)")
    if given("network", "pxn") and len({exp.cluster.server_of(r) for r in range(exp.cluster.num_gpus)}) < 2:
        notes.append("network.pxn has no effect on one server (it is how traffic between servers reaches a NIC)")
    if given("network", "all_to_all") and not model.is_moe and not (par.cp > 1 and par.cp_comm_type == "a2a"):
        notes.append("network.all_to_all has no effect: this layout runs no all-to-all (MoE experts or "
                     "cp_comm_type: a2a do)")
    return notes


# -------------------------------------------------------------------- running
def label(value: object, field: str) -> str | None:
    """A name given in a file (``field`` names it in the error) as text: a string or a number; None when absent.
    A list, a mapping or a YAML boolean is refused, as a name that reads back as ``['a', 'b']`` is a slip."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ConfigError(f"{field}: must be text (a label), got a {type(value).__name__}: {value!r}")
    return str(value)


def _fidelity(value: object) -> str:
    if value == "screen":  # (the sweeps' closed-form estimate: no step is simulated, so a run has nothing to show)
        raise ConfigError(f"fidelity: 'screen' ranks sweep points without simulating them (clustersim sweep "
                          f"--fidelity screen); a run simulates the step: valid: {', '.join(FIDELITIES)}")
    if value not in FIDELITIES:
        raise ConfigError(f"fidelity: {value!r} unknown; valid: {', '.join(FIDELITIES)}")
    return str(value)


def memory_remedies(exp: Experiment) -> list[tuple[str, MemoryBreakdown]]:
    """Single changes of ``exp``'s parallel layout that make its step fit in GPU memory, cheapest first by
    the usual cost to throughput: what each is (the fields to set) and the memory it leaves. Tried: selective
    recomputation of every module the model has (Megatron-Core's output-discarding checkpoints, cheap; the
    attention core too where its scores go through HBM), ZeRO stages above the current one (more DP
    traffic), full recomputation (another forward), half the micro-batch (the global batch kept). Only valid
    layouts are offered (:func:`~workloads.parallel.validate`); empty when none fits. Memory model only:
    nothing is simulated (milliseconds per candidate)."""
    par, model = exp.parallel, exp.model
    modules = ((["core_attn"] if not exp.options.flash_attention else []) + ["layernorm"]
               + (["mla_up_proj"] if model.is_mla else []) + (["moe_act"] if model.is_moe else []))
    candidates: list[tuple[str, dict]] = []
    if par.recompute != "full" and set(modules) - set(par.selective_modules):
        both = list(dict.fromkeys([*par.selective_modules, *modules]))
        late = [m for m in FP8_DELAYED_SCALING_NO_RECOMPUTE if m in both] if exp.training.fp8_amax_reductions else []
        caveat = (f" (under FP8, Megatron-Core recomputes {', '.join(late)} only with a recipe other than delayed "
                  f"scaling)" if late else "")
        candidates.append((f"parallel.recompute: selective, parallel.recompute_modules: [{', '.join(both)}]"
                           + caveat, {"recompute": "selective", "recompute_modules": tuple(both)}))
    candidates += [(f"parallel.zero: {z}", {"zero": z}) for z in _higher_zero_stages(exp)]
    if par.recompute != "full":
        what = "parallel.recompute: full" + (" without parallel.recompute_modules"
                                             if par.recompute_modules is not None else "")
        candidates.append((what, {"recompute": "full", "recompute_modules": None}))
    if par.micro_batch > 1 and par.micro_batch % 2 == 0:
        given = "global_batch" in ((exp.raw or {}).get("parallel") or {})
        candidates.append((f"parallel.micro_batch: {par.micro_batch // 2}"
                           + ("" if given else f" with parallel.global_batch: {par.global_batch}"),
                           {"micro_batch": par.micro_batch // 2}))
    hbm = exp.cluster.gpu.hbm_bytes
    out = []
    for what, change in candidates:
        try:
            parallel = dataclasses.replace(par, **change)
            validate(model, parallel, exp.training, exp.cluster.num_gpus)
            memory = dataclasses.replace(exp, parallel=parallel).memory()
        except ConfigError:
            continue
        if memory.fits(hbm):
            out.append((what, memory))
    return out


def _higher_zero_stages(exp: Experiment) -> list[int]:
    """The ZeRO stages above ``exp``'s that shard something and that its layout may run (:func:`~workloads.
    parallel.validate`: DualPipe, Megatron's distributed optimizer, a parameter server and a separate expert TP
    refuse some; DeepSpeed's pipeline engine runs ZeRO-1 only)."""
    par = exp.parallel
    if par.grad_dp * par.weight_copies <= 1:  # (DualPipe shards over the mirror stage's copy too)
        return []
    out = []
    for z in range(par.zero + 1, 4):
        parallel = dataclasses.replace(par, zero=z)
        if _deepspeed_pipeline(parallel):
            continue
        try:
            validate(exp.model, parallel, exp.training, exp.cluster.num_gpus)
        except ConfigError:
            continue
        out.append(z)
    return out


def _deepspeed_pipeline(par: ParallelConfig) -> bool:
    """Whether ``par`` is DeepSpeed ZeRO-2/3 under pipeline parallelism, which DeepSpeed's ``PipelineEngine``
    refuses ("ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism")."""
    return par.pp > 1 and par.zero >= 2 and sharding_plan(par).impl == "deepspeed"


def check_memory(exp: Experiment, force: bool = False) -> MemoryBreakdown:
    """The step's memory per GPU (:meth:`Experiment.memory`); raises :class:`OutOfMemoryError` when it does
    not fit in the GPU's HBM, unless ``force``."""
    memory = exp.memory()
    hbm = exp.cluster.gpu.hbm_bytes
    if not memory.fits(hbm) and not force:
        raise OutOfMemoryError(f"out of memory: {memory.describe()} > {hbm / 1e9:.0f} GB of {exp.cluster.gpu.name}",
                               f"{memory_hint(exp)}{FORCE_HINT}")
    return memory


def memory_hint(exp: Experiment) -> str:
    """What may lower a step's memory per GPU, naming only the knobs with room left (:func:`memory_remedies`
    says which single change fits, when one does): the higher ZeRO stages the layout may run
    (:func:`_higher_zero_stages`), more TP or PP where DP can give up ranks, full recomputation, a smaller
    micro-batch. When the model's states alone (:func:`~workloads.memory.model_state_bytes`: ZeRO's ``2 + 2 +
    12`` bytes a parameter in mixed precision), sharded over every GPU, exceed a GPU's memory, the cluster is
    too small."""
    par, hbm, gpus = exp.parallel, exp.cluster.gpu.hbm_bytes, exp.cluster.num_gpus
    params = exp.model.total_params()
    states = sum(model_state_bytes(params, dtype_bytes=exp.training.dtype_bytes))
    if states / gpus > hbm:
        need = math.ceil(states / hbm)
        return (f"the cluster is too small: the model's states alone ({states / params:.0f} bytes a parameter, "
                f"{states / 1e12:.2f} TB) need at least {need:,} GPUs of {hbm / 1e9:.0f} GB, sharded over all")
    knobs = []
    stages = _higher_zero_stages(exp)
    if stages:
        knobs.append(f"parallel.zero: {' or '.join(map(str, stages))} (now {par.zero})")
    if par.dp > 1:
        knobs.append("more tp or pp")
    if par.recompute != "full":
        knobs.append("parallel.recompute: full")
    if par.micro_batch > 1:
        knobs.append("a smaller parallel.micro_batch")
    if not knobs:
        return "no single knob of this layout has room left: try more GPUs"
    return "lower it with " + "; ".join(knobs[:-1]) + ("; or " if len(knobs) > 1 else "") + knobs[-1]


def build_step(exp: Experiment, representatives: str | None, force: bool = False, what: str = "",
               lockstep_helps: bool = True) -> TrainingStep:
    """``exp``'s training step (:func:`~workloads.training.training_step` with ``representatives``), refused
    with a :class:`~workloads.op_budget.StepTooLargeError` that ends with :data:`FORCE_HINT` when its graph would
    have more than :data:`~workloads.op_budget.MAX_OPS` ops, unless ``force``; ``what`` leads that message, which
    suggests fidelity lockstep unless ``lockstep_helps`` is False."""
    try:
        return training_step(exp.model, exp.parallel, exp.training, exp.options, exp.routing,
                             representatives=representatives, max_ops=None if force else MAX_OPS)
    except StepTooLargeError as exc:
        message = str(exc) if lockstep_helps else without_lockstep(str(exc))
        raise StepTooLargeError(f"{what}{message}{FORCE_HINT}", exc.ops, exc.limit) from None


def _healthy_cluster(exp: Experiment) -> Cluster:
    """The cluster before ``exp.faults``: an Experiment built or edited with faults (not loaded with them) has
    no ``healthy_cluster``; stragglers leave the fabric as it is, topology faults must be applied to it."""
    if exp.healthy_cluster is not None:
        return exp.healthy_cluster
    topology = [f.get("kind") for f in exp.faults if not isinstance(f, Mapping) or f.get("kind") not in COMPUTE_FAULTS]
    if topology:
        raise ConfigError(f"faults: this Experiment's cluster does not have its {topology[0]} fault applied "
                          f"(healthy_cluster is None): give faults to experiment_from_dict or load_experiment, "
                          f"or set cluster=apply_faults(cluster, faults) and healthy_cluster=cluster")
    _faults_from_list(list(exp.faults), exp.cluster)  # (each straggler's rank and factor, as a file's are)
    return exp.cluster


def run_experiment(exp: Experiment, *, force: bool = False, fidelity: str | None = None,
                   progress: Callable[[int, int], None] | None = None) -> Result:
    """Generate the step, simulate it and attach training metrics to the result.

    Raises :class:`OutOfMemoryError` when the config does not fit in GPU
    memory, and :class:`~workloads.op_budget.StepTooLargeError` when its op
    graph would have more than :data:`~workloads.op_budget.MAX_OPS` ops,
    unless ``force``. ``fidelity`` (``"fast"``, ``"full"`` or ``"lockstep"``, see
    :data:`FIDELITIES`) overrides the experiment's. ``progress(done, total)``
    is told the step's ops finished so far as the simulation goes
    (:class:`~simulator.engine.Engine`'s ``progress``; e.g. a progress bar's
    update); it does not change the result.
    """
    if not isinstance(exp, Experiment):
        raise TypeError(f"run_experiment: needs an Experiment (load_experiment or experiment_from_dict), got "
                        f"{type(exp).__name__}")
    check_bool("force", force)  # (a truthy "no" skipped the memory check)
    t0 = time.perf_counter()
    world = exp.parallel.world_size
    if world != exp.cluster.num_gpus:  # (experiment_from_dict checks it; an Experiment edited since may not hold)
        raise ConfigError(f"parallel: tp x cp x pp x dp = {world} but cluster {exp.cluster.name!r} has "
                          f"{exp.cluster.num_gpus} GPUs; they must be equal")
    healthy_cluster = _healthy_cluster(exp) if exp.faults else None  # (before minutes of building the step)
    memory = check_memory(exp, force)
    fidelity = _fidelity(exp.fidelity if fidelity is None else fidelity)
    with paused_gc():
        every_rank = fidelity != "full" and _every_rank_for_stragglers(exp)
        what = _EVERY_RANK.format(schedule=exp.parallel.schedule) + "; " if every_rank else ""
        step = build_step(exp, representatives_for(exp, fidelity), force, what, lockstep_helps=not every_rank)
        healthy = None
        if exp.faults:  # the same step on the healthy cluster, for the cost of the faults
            healthy = Engine(step.graph, healthy_cluster, exp.compute_model(), exp.network).run().step_time_s
        record = Engine(step.graph, exp.cluster, exp.compute_model(), exp.network, exp.slowdown(),
                        progress=progress).run()
    result = Result(record, sim_wall_s=time.perf_counter() - t0)
    # The summary describes what ran: the fidelity override, not the file's.
    attach_training_metrics(result, step, dataclasses.replace(exp, fidelity=fidelity), memory)
    # what the fabric costs: of the hardware bought (the healthy cluster), cached per cluster; what it carries: the
    # bisection of the fabric the step ran on (a spine down lowers it)
    with paused_gc():  # (the bisection's contraction makes a dict per switch, no cycles)
        result.extra_summary.update(plan_columns(exp.healthy_cluster or exp.cluster, exp.plan))
        if exp.healthy_cluster is not None:
            result.extra_summary["bisection_bytes_s"] = bisection_bandwidth(exp.cluster)
    if healthy is not None:
        result.extra_summary.update({"faults": len(exp.faults), "healthy_step_time_s": healthy,
                                     "fault_slowdown": result.step_time / healthy if healthy else float("nan")})
    return result


def pipeline_stages(result: Result, step: TrainingStep) -> pd.DataFrame:
    """Where time went per pipeline stage: the mean over the stage's ranks of each rank's partition of the
    step (:mod:`simulator.breakdown`: compute by phase, exposed communication by class, MoE and sync waits,
    bubble, idle; seconds), plus the pipeline view.

    The pipeline window runs from 0 to the end of the last micro-batch op on any rank (without a pipeline each
    rank's own: :attr:`Result.breakdown_window`). ``busy_s`` is the stage's window (its ranks' mean, without a
    pipeline) minus the stage's ``bubble`` (the time the schedule leaves the GPU with nothing to do, nothing
    in flight on its compute stream and no activation transfer in flight); ``bubble_fraction`` is
    ``bubble / window``. Columns of the partition sum to the step time.
    """
    return _stages_frame(stage_rows(result, step))


def stage_rows(result: Result, step: TrainingStep) -> list[dict]:
    """The rows of :func:`pipeline_stages` as dicts (column name -> value), computed with numpy alone: a run
    needs the summary's figures, not the frame, and pandas costs ~0.6 s to import."""
    # With fidelity="fast" only representatives have rows; every rank a representative stands for
    # has the same timeline, so the representatives' partition, weighted by how many they stand for, is enough.
    window = result.pipeline_window_s
    own = result.breakdown_window  # (without a pipeline each rank's own: busy_s is then the stage's mean of them)
    ranks, categories, seconds, replicas = result.time_breakdown_arrays()
    weight = replicas.astype(float)
    stage = np.array([step.stage_of_rank[r] for r in ranks.tolist()], dtype=np.int64)
    # One row per category, one column per rank, C-ordered: the very array pandas reduced when this was
    # ``table.loc[ranks].mul(w, axis=0).sum()`` (the block of a frame is categories x ranks), so each
    # category's sum is numpy's pairwise sum over the same values in the same order; NaN counts as 0 (skipna).
    weighted = (seconds * weight[:, None]).T
    weighted = np.ascontiguousarray(np.where(np.isnan(weighted), 0.0, weighted))
    bubble_at = categories.index("bubble") if "bubble" in categories else None
    rows = []
    for s in range(step.parallel.pp):
        sel = np.flatnonzero(stage == s)
        w = weight[sel]
        # np.take keeps the rows C-contiguous (``weighted[:, sel]`` would not, and a strided sum adds in
        # another order)
        mean = np.take(weighted, sel, axis=1).sum(axis=1) / w.sum() if len(sel) else np.zeros(len(categories))
        bubble = float(mean[bubble_at]) if bubble_at is not None else 0.0
        span = window
        if isinstance(own, Mapping) and len(sel):  # (per-rank windows: floats here, one step per rank)
            span = float(np.dot(w, [own[r] for r in ranks[sel].tolist()]) / w.sum())
        rows.append({"stage": s, "ranks": int(w.sum()), "busy_s": span - bubble, "bubble_s": bubble,
                     "bubble_fraction": bubble / window if window else 0.0,
                     **{f"{c}_s": float(v) for c, v in zip(categories, mean.tolist())}})
    return rows


def _stages_frame(rows: list[dict]) -> pd.DataFrame:
    """:func:`pipeline_stages`' frame of its rows (pandas imported here: see :func:`stage_rows`)."""
    import pandas as pd

    return pd.DataFrame(rows)


def describe_setup(exp: Experiment, step: TrainingStep | None = None) -> dict[str, str]:
    """What is simulated, resolved from presets and defaults, one line each: ``cluster``, ``fabric``,
    ``model``, ``layout``, ``training`` (for summaries; the file's free-text ``name`` says none of it)."""
    c, m, par, tr = exp.cluster, exp.model, exp.parallel, exp.training
    p = c.params
    nodes = c.num_gpus // c.gpus_per_server
    cluster = f"{nodes} x {c.gpus_per_server} {c.gpu.name} = {c.num_gpus:,} GPUs"
    if p.get("preset"):
        cluster += f" ({p['preset']})"
    fabric = str(p.get("fabric", "custom"))
    switches = [f"{p[k]} {one if p[k] == 1 else k}" for k, one in (("leaves", "leaf"), ("spines", "spine"),
                                                                    ("cores", "core")) if p.get(k)]
    if p.get("pods", 1) > 1 and p.get("leaves_per_pod") and p.get("spines"):  # a fat tree's spines are per pod
        switches[1] += " per pod"
    if switches:
        fabric += f" ({', '.join(switches)})"
    if "oversubscription" in p:
        ratio = p["oversubscription"]
        core = core_ratio(p)
        if core != 1:
            fabric += f", {ratios_text(ratio, core)} oversubscribed"
        elif ratio == 1:
            fabric += ", non-blocking"
        elif p.get("leaves") == 1 and not p.get("cores"):
            # one leaf has no uplinks: nothing leaves it, so the ratio set in the file changes nothing
            fabric += f", oversubscription {ratio_text(ratio)} has no effect (one leaf, no uplinks)"
        else:
            fabric += f", {ratio_text(ratio)} oversubscribed"
    if p.get("nic_bandwidth"):
        fabric += f", NIC {format_bandwidth(p['nic_bandwidth'])} per GPU"
    fabric += f", NVLink {format_bandwidth(p.get('nvlink_bandwidth') or c.gpu.nvlink_bandwidth)} per GPU"
    if exp.faults:
        fabric += f", {fault_counts(exp.faults)}"  # as the title counts them (topology faults, stragglers)
    params = m.total_params()
    size = f"{params / 1e9:,.1f} B" if params >= 1e9 else f"{params / 1e6:,.1f} M"  # (0.1 B read "0.0 B" at 38 M)
    model = (f"{m.name}: {size} parameters, {m.layers} layers, hidden {m.hidden}, {m.heads} "
             f"head{'s' if m.heads != 1 else ''}" + (f" (MLA, KV latent {m.kv_lora_rank})" if m.is_mla else ""))
    if m.is_moe:
        model += f", {m.experts} experts top-{m.top_k}"
    layout = f"TP {par.tp} x PP {par.pp} x DP {par.dp}"
    if par.cp > 1:
        layout = f"TP {par.tp} x CP {par.cp} ({par.cp_comm_type}) x PP {par.pp} x DP {par.dp}"
    if par.ep > 1:
        layout += f" (EP {par.ep}, expert TP {par.expert_tp})" if par.expert_tp != par.tp else f" (EP {par.ep})"
    if par.pp > 1:  # (one stage: no pipeline schedule, the micro-batches accumulate gradients in turn)
        layout += f", {par.schedule}"
    if par.virtual_stages > 1:
        layout += f" x{par.virtual_stages} virtual"
        if par.microbatch_group_size is not None:
            layout += f" (micro-batch groups of {par.microbatch_group_size})"
    counts = layers_per_stage(m.layers, par)
    if len(set(counts)) > 1:
        layout += f", layers per stage {_runs(counts)}"
    micro = step.num_micro_batches if step is not None else par.global_batch // (par.micro_batch * par.dp)
    layout += f", micro-batch {par.micro_batch} x {micro} per pipeline (global batch {par.global_batch})"
    extras = [x for x in ("SP" if par.sequence_parallel else "",
                          f"recompute {par.recompute}" if par.recompute != "none" else "",
                          f"ZeRO-{par.zero}" if par.zero else "") if x]
    if extras:
        layout += ", " + ", ".join(extras)
    dtype = tr.dtype + (f" {tr.fp8_recipe}" if tr.fp8 else "") + (" (FP8 parameter all-gather)"
                                                                  if tr.fp8_param_gather else "")
    training = f"seq {tr.seq_len}, {dtype}, fidelity {exp.fidelity}"
    return {"cluster": cluster, "fabric": fabric, "model": model, "layout": layout, "training": training}


def _runs(counts: tuple[int, ...]) -> str:
    """``(7, 8, 8, 8, 7)`` as ``[7, 8x3, 7]``."""
    out: list[str] = []
    i = 0
    while i < len(counts):
        j = i
        while j < len(counts) and counts[j] == counts[i]:
            j += 1
        out.append(str(counts[i]) if j - i == 1 else f"{counts[i]}x{j - i}")
        i = j
    return "[" + ", ".join(out) + "]"


def attach_training_metrics(result: Result, step: TrainingStep, exp: Experiment, memory: MemoryBreakdown) -> None:
    """Add MFU, TFLOP/s, bubble and memory to ``result.summary`` and fill ``result.stages`` (and, for a MoE
    model, ``result.expert_load``); the frames are built when first read."""
    world = step.parallel.world_size
    peak = exp.cluster.gpu.peak(exp.training.base_dtype)  # FP8 training: MFU of the dense bf16 peak
    stages = stage_rows(result, step)
    result.defer("stages", partial(_stages_frame, stages), records=stages)
    bubble = [r["bubble_s"] for r in stages]
    window = stages[0]["busy_s"] + stages[0]["bubble_s"] if stages else 0.0
    tflops = step.model_flops / result.step_time / world
    result.extra_summary.update({
        "name": exp.name,
        "setup": describe_setup(exp, step),
        "world_size": world,
        "num_micro_batches": step.num_micro_batches,
        "bubble_fraction": max(0.0, float(_nanmean(bubble) / window)) if window else 0.0,
        "bubble_fraction_by_stage": [float(r["bubble_fraction"]) for r in stages],
        "time_breakdown_s": _mean_breakdown(stages),
        "model_flops_per_step": step.model_flops,
        "hardware_flops_per_step": step.hardware_flops,
        "executed_flops_per_step": step.executed_flops,
        "tflops_per_gpu": tflops / 1e12,
        "hardware_tflops_per_gpu": step.hardware_flops / result.step_time / world / 1e12,
        "mfu": tflops / peak,
        # what MFU is of: the dense peak of the base dtype (bf16 under FP8 training, whose GEMMs run above it)
        "mfu_peak_tflops": peak / 1e12,
        "mfu_peak_dtype": exp.training.base_dtype,
        "training_dtype": exp.training.dtype,
        "memory_per_gpu_bytes": memory.total,
        # bytes only (they sum to memory_per_gpu_bytes); the stage they are of is its own field
        "memory_breakdown_bytes": {"parameters": memory.parameters, "gradients": memory.gradients,
                                   "optimizer": memory.optimizer, "activations": memory.activations},
        "memory_stage": memory.stage,
        "fits_in_memory": memory.fits(exp.cluster.gpu.hbm_bytes),
        "tokens_per_s": step.parallel.global_batch * exp.training.seq_len / result.step_time,
    })
    if step.routes:
        result.defer("expert_load", partial(expert_load_table, step))
        result.extra_summary["moe"] = moe_summary(step)
    result.step = step


def _nanmean(values: list[float]) -> float:
    """pandas' ``Series.mean()`` of floats: NaNs filled with 0 for a pairwise sum over the whole array, divided
    by the number of values that are not NaN."""
    a = np.array(values, dtype=float)
    nan = np.isnan(a)
    count = len(a) - int(nan.sum())
    with np.errstate(all="ignore"):
        return float(np.where(nan, 0.0, a).sum() / np.float64(count))


def _mean_breakdown(stages: list[dict]) -> dict[str, float]:
    """The partition of the step (:mod:`simulator.breakdown`) averaged over every rank: ``{category: s}``, of
    :func:`stage_rows`' rows."""
    if not stages:
        return {}
    w = np.array([r["ranks"] for r in stages], dtype=float)
    cols = [c for c in stages[0] if c.endswith("_s") and c not in ("busy_s",)]
    return {c[:-2]: float((np.array([r[c] for r in stages], dtype=float) * w).sum() / w.sum()) for c in cols}


def expert_load_table(step: TrainingStep) -> pd.DataFrame:
    """One row per (MoE layer, expert): tokens routed to it and kept under capacity, summed over the EP group
    and over one replica's micro-batches (``moe.draw: micro_batch``; one micro-batch with ``draw: layer``),
    the token slots it processes (``slots``: the kept tokens, or every source's capacity under
    ``moe.pad_to_capacity``; what the summary's ``rank_load_tokens`` sums per EP rank), and the EP rank
    (within the group) that holds it."""
    cols: dict[str, list] = {"layer": [], "expert": [], "ep_rank": [], "tokens_routed": [], "tokens_kept": [],
                             "slots": []}
    for layer, r in step.routes.items():
        experts = r.choices.shape[1]
        per_rank = experts // r.choices.shape[0]
        expert = np.arange(experts, dtype=np.int64)
        cols["layer"].append(np.full(experts, layer, dtype=np.int64))
        cols["expert"].append(expert)
        cols["ep_rank"].append(expert // per_rank)
        cols["tokens_routed"].append(r.choices.sum(axis=0).astype(np.int64))
        cols["tokens_kept"].append(r.kept.sum(axis=0).astype(np.int64))
        cols["slots"].append(r.expert_load.astype(np.int64))
    import pandas as pd  # here: a run builds this frame only when ``result.expert_load`` is read

    if not step.routes:
        return pd.DataFrame([])
    return pd.DataFrame({c: np.concatenate(parts) for c, parts in cols.items()})


def moe_summary(step: TrainingStep) -> dict:
    """Routing statistics: load imbalance (max/mean token slots per EP rank, per draw: one layer in one
    micro-batch, or one layer with ``moe.draw: layer``) and dropped-token fraction."""
    routes = list(step.routes.values())
    choices = sum(float(r.choices.sum()) for r in routes)
    dropped = sum(r.dropped for r in routes)
    imbalance = list(step.draw_imbalance.values()) or [r.imbalance for r in routes]
    return {"layers": len(routes), "draws": len(imbalance), "imbalance_mean": float(sum(imbalance) / len(imbalance)),
            "imbalance_max": float(max(imbalance)), "dropped_fraction": dropped / choices if choices else 0.0,
            "rank_load_tokens": [int(x) for x in sum(r.rank_load for r in routes)]}
