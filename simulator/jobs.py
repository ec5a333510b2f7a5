"""Many jobs, one fabric: several training jobs simulated together, each against itself alone.

A jobs file has the experiment file's shared sections (``cluster``, ``network``, ``fidelity``) and a list of
jobs, each with its own model, layout and node count::

    name: two jobs on a 2:1 fabric
    cluster: {preset: dgx-h100, nodes: 8, nodes_per_leaf: 2, oversubscription: 2}
    placement: contiguous          # contiguous | scattered (seeded shuffle of nodes) ; or nodes: [..] per job
    placement_seed: 0
    steps: auto                    # steps each job runs (auto: enough to overlap the longest job; or 1..16)
    jobs:
      - name: gpt
        nodes: 4                   # a node count, or the node indices themselves: [0, 2, 4, 6]
        model: {preset: gpt3-13b}
        parallel: {tp: 8, pp: 1}   # dp derived from the job's own GPUs
        training: {seq_len: 2048}
      - name: llama
        nodes: 4
        ...

Jobs get whole nodes (NVLink domains); their ranks are numbered over their own GPUs, in node order. Each job
is simulated twice on the same fabric with the same routes: alone (every other GPU idle) and together with
the others (their op graphs merged, :func:`workloads.ops.merge_graphs`). Its slowdown is the ratio of the
two. So that the jobs overlap for the whole measurement rather than one finishing while the other runs
alone, ``steps: auto`` runs each job ``max(1, round(T_longest / T_job))`` consecutive steps (at most
:data:`MAX_AUTO_STEPS`), and times are per step.

Interference is reported per link: every link two or more jobs used, with each job's bytes on it. A job's
``slowdown_bound`` is ``1 + sum over the links it shares of the others' bytes there / the link's usable
rate / its time alone``: the longest the others' traffic can occupy the links it depends on. Max-min
sharing never gives a flow less than its fair share, so a job is held back only while another job's bytes
cross a link it uses; the bound is what that costs if none of it overlaps anything else.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from topologies import build_cluster
from topologies.cluster import Cluster
from workloads.errors import ConfigError, check_bool, plain_values, unknown_keys, with_prefix
from workloads.ops import OpGraph, merge_graphs

from .engine import Engine, RunRecord, paused_gc
from .experiment import (
    FORCE_HINT,
    Experiment,
    OutOfMemoryError,
    build_step,
    experiment_from_dict,
    label,
    memory_hint,
    read_experiment_file,
    representatives_for,
)
from .result import Result

__all__ = ["JOB_FIELDS", "PLACEMENTS", "Job", "JobsResult", "MAX_AUTO_STEPS", "jobs_from_dict", "load_jobs",
           "run_jobs"]

PLACEMENTS = ("contiguous", "scattered")
JOBS_SECTIONS = ("name", "cluster", "network", "fidelity", "placement", "placement_seed", "steps", "jobs")
JOB_FIELDS = ("name", "nodes", "model", "parallel", "training", "moe", "compute", "options")
MAX_AUTO_STEPS = 16
"""The most steps ``steps: auto`` gives a short job (its time is per step either way), and the most an explicit
``steps:`` may ask for."""


@dataclass
class Job:
    """One job of a jobs file: its resolved experiment on its own GPUs, and the nodes it holds."""

    name: str
    experiment: Experiment
    nodes: tuple[int, ...]
    """Indices of the nodes (NVLink domains) it runs on, in rank order."""


@dataclass
class JobsSpec:
    """A resolved jobs file: the shared cluster and the jobs placed on it."""

    name: str
    cluster: Cluster
    jobs: list[Job]
    steps: int | str = "auto"


def _nodes_of(cluster: Cluster) -> list[list]:
    """GPU labels per node (NVLink domain), nodes in index order, GPUs in rank order."""
    nodes: dict[int, list] = {}
    for gpu in cluster.gpus:
        nodes.setdefault(cluster.graph.nodes[gpu]["server"], []).append(gpu)
    return [nodes[k] for k in sorted(nodes)]


def _view(cluster: Cluster, gpus: list, name: str) -> Cluster:
    """The whole fabric with only ``gpus`` as ranks (rank ``i`` on ``gpus[i]``)."""
    return dataclasses.replace(cluster, gpus=tuple(gpus), name=name)


def _positive(value: object, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{field}: must be a positive integer, got {value!r}")
    return value


def _place(entries: list[Mapping], n_nodes: int, placement: object, seed: object) -> list[tuple[int, ...]]:
    """Node indices of every job: explicit lists kept, counts filled from the free nodes by ``placement``."""
    if placement not in PLACEMENTS:
        raise ConfigError(f"placement: {placement!r} unknown; valid: {', '.join(PLACEMENTS)} (or nodes: [..] "
                          f"per job)")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"placement_seed: must be an integer >= 0, got {seed!r}")
    taken: dict[int, str] = {}
    out: list[tuple[int, ...] | None] = []
    for i, job in enumerate(entries):
        nodes = job.get("nodes")
        if isinstance(nodes, list):
            if not nodes:
                raise ConfigError(f"jobs[{i}].nodes: an empty list; give node indices or a count")
            for j, k in enumerate(nodes):
                if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k < n_nodes:
                    raise ConfigError(f"jobs[{i}].nodes: {k!r} is not a node index in 0..{n_nodes - 1}")
                if k in nodes[:j]:
                    raise ConfigError(f"jobs[{i}].nodes: node {k} is listed twice; each node once")
                if k in taken:
                    raise ConfigError(f"jobs[{i}].nodes: node {k} is already held by job {taken[k]!r}")
                taken[k] = label(job.get("name"), f"jobs[{i}].name") or f"job{i}"  # (its name, default job<i>)
            out.append(tuple(nodes))
        else:
            _positive(nodes, f"jobs[{i}].nodes")
            out.append(None)
    free = [k for k in range(n_nodes) if k not in taken]
    if placement == "scattered":
        free = [free[j] for j in np.random.default_rng(seed).permutation(len(free))]
    need = sum(job["nodes"] for job, nodes in zip(entries, out) if nodes is None)
    if need > len(free):
        raise ConfigError(f"jobs: the jobs need {need + len(taken)} nodes but the cluster has {n_nodes}; add "
                          f"cluster.nodes or shrink a job")
    for i, job in enumerate(entries):
        if out[i] is None:
            chunk, free = free[:job["nodes"]], free[job["nodes"]:]
            out[i] = tuple(sorted(chunk))  # a scheduler's host list: node order
    return out  # type: ignore[return-value]


def check_jobs_sections(doc: Mapping) -> None:
    """Refuse a top-level key of a jobs file that is not one of :data:`JOBS_SECTIONS`."""
    unknown = unknown_keys(doc, JOBS_SECTIONS)
    if unknown:
        raise ConfigError(f"{unknown[0]}: unknown section of a jobs file; valid: {', '.join(JOBS_SECTIONS)}")


def jobs_from_dict(doc: Mapping) -> JobsSpec:
    """Resolve a jobs document (parsed YAML, see the module docstring) into a :class:`JobsSpec`.

    Every job is checked as an experiment of its own (its world size is its GPUs: ``parallel.dp`` may be
    left to be derived), with the shared ``network`` and ``fidelity``.
    """
    if not isinstance(doc, Mapping):
        raise ConfigError("jobs file: must hold a mapping of sections (" + ", ".join(JOBS_SECTIONS) + ")")
    doc = plain_values(doc)  # (numpy scalars of a notebook's document as a file's values)
    check_jobs_sections(doc)
    entries = doc.get("jobs")
    if not isinstance(entries, list) or not entries:
        raise ConfigError("jobs: must be a non-empty list of jobs, e.g. [{name: a, nodes: 2, model: {...}, "
                          "parallel: {...}}]")
    if not doc.get("cluster"):
        raise ConfigError("cluster: required section is missing or empty; e.g. cluster: {preset: dgx-h100, nodes: 8}")
    cluster = build_cluster(doc["cluster"])
    nodes = _nodes_of(cluster)
    names: set[str] = set()
    for i, job in enumerate(entries):
        if not isinstance(job, Mapping):
            raise ConfigError(f"jobs[{i}]: must be a mapping with {', '.join(JOB_FIELDS)}")
        bad = unknown_keys(job, JOB_FIELDS)
        if bad:
            raise ConfigError(f"jobs[{i}].{bad[0]}: unknown field; valid fields: {', '.join(JOB_FIELDS)}")
        if "nodes" not in job:
            raise ConfigError(f"jobs[{i}].nodes: required: a node count or a list of node indices")
        given = label(job.get("name"), f"jobs[{i}].name")
        name = given or f"job{i}"
        if name in names:
            raise ConfigError(f"jobs[{i}].name: {name!r} is used twice; job names must differ" if given else
                              f"jobs[{i}]: its default name {name!r} is another job's name; name this job (name:)")
        names.add(name)
    placed = _place(entries, len(nodes), doc.get("placement", "contiguous"), doc.get("placement_seed", 0))
    steps = doc.get("steps", "auto")
    if steps != "auto":
        _positive(steps, "steps")
        if steps > MAX_AUTO_STEPS:  # each step is simulated: 100,000 would run for tens of minutes
            raise ConfigError(f"steps: {steps} is more than {MAX_AUTO_STEPS}, the most a jobs file runs (times are "
                              f"per step); give 1..{MAX_AUTO_STEPS} or auto")
    jobs = []
    for i, (job, where) in enumerate(zip(entries, placed)):
        name = label(job.get("name"), f"jobs[{i}].name") or f"job{i}"
        gpus = [g for k in where for g in nodes[k]]
        view = _view(cluster, gpus, f"{name}: nodes {list(where)} of {cluster.name}")
        sub = {k: copy.deepcopy(v) for k, v in job.items() if k not in ("name", "nodes")}
        sub.update({k: doc[k] for k in ("network", "fidelity") if k in doc})
        sub["name"] = name
        try:
            exp = experiment_from_dict(sub, cluster=view)
        except ValueError as exc:
            raise with_prefix(exc, f"jobs[{i}] ({name})") from None
        jobs.append(Job(name, exp, where))
    return JobsSpec(label(doc.get("name"), "name") or " + ".join(j.name for j in jobs), cluster, jobs, steps)


_SHARED = ("cluster.", "network.", "fidelity")
"""Notes about the sections the jobs share (said once, against the jobs file's own sections)."""


def job_notes(spec: JobsSpec, doc: Mapping) -> list[str]:
    """The settings of a jobs file that have no effect, as :func:`~simulator.experiment.unused_settings` finds
    them for one experiment: each job's own (``job 'a': ...``), then the shared sections' once (judged against
    the jobs file's ``cluster``, ``network`` and ``fidelity``, which a job's own document does not hold)."""
    from .experiment import unused_settings
    out = [f"job {job.name!r}: {n}" for job in spec.jobs for n in unused_settings(job.experiment)
           if not n.startswith(_SHARED)]
    shared = {k: doc[k] for k in ("cluster", "network", "fidelity") if k in doc}
    first = spec.jobs[0].experiment
    out += [n for n in unused_settings(dataclasses.replace(first, raw={**(first.raw or {}), **shared}))
            if n.startswith(_SHARED)]
    return out


def load_jobs(path: str | os.PathLike) -> JobsSpec:
    """Read and resolve a jobs YAML file (one-line errors name the file)."""
    doc = read_experiment_file(path, JOBS_SECTIONS)
    try:
        return jobs_from_dict(doc)
    except ValueError as exc:
        raise with_prefix(exc, str(path)) from None


class JobsResult:
    """Jobs simulated together and alone.

    Attributes
    ----------
    together : Result
        The run of every job at once (ranks: job after job, each over its own GPUs); its links, traffic
        matrices, timelines and plots show the whole fabric. Its ``rank_groups`` are the jobs' ranks: each
        job's time breakdown has its own pipeline window (its GPUs idle from its last op to the joint end),
        and timelines and traces show each job's stages (:meth:`~simulator.result.Result.phases` and
        ``step_time`` are the joint run's).
    jobs : pandas.DataFrame
        One row per job: ``job, nodes, gpus, steps, step_time_s`` (per step, together),
        ``alone_step_time_s``, ``slowdown`` (together / alone: usually >= 1, but max-min sharing with a fixed
        order of issue is not monotone, so another job's traffic can shift a job's flows into a slightly
        faster order and read a fraction of a percent below 1), ``slowdown_bound``
        (module docstring), ``shared_links``, ``rank_offset``, ``span`` (when the job's last step ended, as a
        fraction of the joint run: below 1 the others ran alone after it).
    shared_links : pandas.DataFrame
        Links two or more jobs used: ``link, src, dst, tier, capacity_Bps`` and ``bytes_<job>`` per job
        (wire bytes over all its steps), ``jobs`` (how many used it).
    notes : list of str
        What the reader should know about the numbers: a job that ended before two thirds of the joint run
        (``steps: auto`` runs at most :data:`MAX_AUTO_STEPS` steps), after which the others ran alone.
    """

    def __init__(self, name: str, together: Result, jobs: pd.DataFrame, shared_links: pd.DataFrame,
                 notes: list[str] | None = None) -> None:
        self.name = name
        self.together = together
        self.jobs = jobs
        self.shared_links = shared_links
        self.notes = list(notes or [])

    @property
    def summary(self) -> dict:
        return {"name": self.name, "jobs": self.jobs.to_dict(orient="records"),
                "shared_links": int(len(self.shared_links)), "notes": list(self.notes),
                "sim_wall_s": self.together.sim_wall_s}


def _job_end(record: RunRecord, lo: int, hi: int) -> float:
    """When the last op of ranks ``lo..hi-1`` ended (s)."""
    ends = [record.end_s[op.id] for op in record.graph.ops if lo <= op.rank < hi]
    return float(max(ends)) if ends else 0.0


def _link_bytes_by_job(record: RunRecord, offsets: list[int], sizes: list[int]) -> np.ndarray:
    """Wire bytes per (job, link): each route's bytes go to the job whose ranks it connects."""
    fabric = record.fabric
    ledger = fabric.network.ledger
    owner = np.empty(sum(sizes), dtype=np.int64)
    for j, (off, n) in enumerate(zip(offsets, sizes)):
        owner[off:off + n] = j
    out = np.zeros((len(sizes), ledger.num_links))
    for links, _cls, nbytes in ledger.wire_by_route():
        src = fabric.pairs_of(links)[0][0]
        np.add.at(out[owner[src]], links, nbytes)
    return out


def run_jobs(spec: JobsSpec, *, force: bool = False) -> JobsResult:
    """Simulate every job alone and all together on the shared fabric (see the module docstring).

    Raises :class:`~simulator.experiment.OutOfMemoryError` when a job does not fit, and
    :class:`~workloads.op_budget.StepTooLargeError` when its op graph is too large to simulate, unless ``force``.
    """
    if not isinstance(spec, JobsSpec):
        raise TypeError(f"spec: must be a JobsSpec (simulator.jobs.load_jobs), got {type(spec).__name__}")
    check_bool("force", force)
    t0 = time.perf_counter()
    cluster = spec.cluster
    graphs: list[OpGraph] = []
    with paused_gc():
        for job in spec.jobs:
            exp = job.experiment
            memory = exp.memory()
            if not memory.fits(cluster.gpu.hbm_bytes) and not force:  # (as run says it: what would fit)
                raise OutOfMemoryError(f"job {job.name!r}: out of memory: {memory.describe()} > "
                                       f"{cluster.gpu.hbm_bytes / 1e9:.0f} GB of {cluster.gpu.name}",
                                       f"{memory_hint(exp)}{FORCE_HINT}").with_remedies(exp)
            step = build_step(exp, representatives_for(exp, exp.fidelity), force, what=f"job {job.name!r}: ")
            graphs.append(step.graph)

        def alone(j: int, steps: int) -> float:
            exp = spec.jobs[j].experiment
            graph = graphs[j] if steps == 1 else merge_graphs([(graphs[j], 0)] * steps)
            return Engine(graph, exp.cluster, exp.compute_model(), exp.network).run().step_time_s

        single = [alone(j, 1) for j in range(len(graphs))]
        if spec.steps == "auto":
            longest = max(single)
            steps = [min(MAX_AUTO_STEPS, max(1, round(longest / t))) if t > 0 else 1 for t in single]
        else:
            steps = [int(spec.steps)] * len(graphs)
        alone_s = [single[j] if steps[j] == 1 else alone(j, steps[j]) for j in range(len(graphs))]

        sizes = [job.experiment.cluster.num_gpus for job in spec.jobs]
        offsets = [int(x) for x in np.cumsum([0, *sizes[:-1]])]
        merged = merge_graphs([(graphs[j], offsets[j]) for j in range(len(graphs)) for _ in range(steps[j])])
        view = _view(cluster, [g for job in spec.jobs for g in job.experiment.cluster.gpus], spec.name)
        rank_compute = {}
        for job, off, n in zip(spec.jobs, offsets, sizes):
            model = job.experiment.compute_model()
            rank_compute.update({r: model for r in range(off, off + n)})
        first = spec.jobs[0].experiment
        record = Engine(merged, view, first.compute_model(), first.network, rank_compute=rank_compute).run()
    together = Result(record, sim_wall_s=time.perf_counter() - t0,
                      rank_groups=[(off, off + n) for off, n in zip(offsets, sizes)], group_steps=steps)

    by_job = _link_bytes_by_job(record, offsets, sizes)
    used = by_job > 0
    shared = used.sum(axis=0) >= 2
    usable = record.fabric.usable_capacity
    rows, notes = [], []
    ends = [_job_end(record, offsets[j], offsets[j] + sizes[j]) for j in range(len(spec.jobs))]
    for j, job in enumerate(spec.jobs):
        end = ends[j]
        span = end / max(ends) if max(ends) > 0 else 1.0
        if span < 2 / 3:  # (rounding the step counts alone never leaves a job under 2/3 of the window)
            why = (f"{steps[j]} step{'s' if steps[j] > 1 else ''}" + (", the most steps: auto runs"
                                                                      if steps[j] == MAX_AUTO_STEPS else ""))
            notes.append(f"job {job.name!r} ({why}) ends at {span:.0%} of the joint run; the other jobs run "
                         f"alone after it, so their slowdowns read the interference of that part only")
        mine = used[j] & shared
        others = by_job[:, mine].sum(axis=0) - by_job[j, mine]
        hold = float((others / usable[mine]).sum())
        rows.append({"job": job.name, "nodes": len(job.nodes), "gpus": sizes[j], "steps": steps[j],
                     "step_time_s": end / steps[j], "alone_step_time_s": alone_s[j] / steps[j],
                     "slowdown": end / alone_s[j] if alone_s[j] else float("nan"),
                     "slowdown_bound": 1 + hold / alone_s[j] if alone_s[j] else float("nan"),
                     "shared_links": int(mine.sum()), "rank_offset": offsets[j], "span": span})
    links = record.fabric.links
    idx = np.flatnonzero(shared)
    table = {"link": idx, "src": [links[i][0] for i in idx], "dst": [links[i][1] for i in idx],
             "tier": record.fabric.tier[idx], "capacity_Bps": record.fabric.capacity[idx]}
    for j, job in enumerate(spec.jobs):
        table[f"bytes_{job.name}"] = by_job[j, idx]
    table["jobs"] = used[:, idx].sum(axis=0)
    shared_links = pd.DataFrame(table)
    if len(shared_links):
        shared_links = shared_links.sort_values("link", kind="stable").reset_index(drop=True)
    return JobsResult(spec.name, together, pd.DataFrame(rows), shared_links, notes)
