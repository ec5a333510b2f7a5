"""Validation against published measurements of real training runs (compare and report only).

Each :class:`Entry` names one experiment file under ``simulator/validation_runs/`` that
reproduces the layout of a published training run (paper and table in
:attr:`Entry.source` and in the file's header comment), the metric the paper
reports and its value. :func:`validate_against_published` simulates the files
and returns published vs simulated side by side.

Nothing here feeds back into the model: no constant anywhere in clustersim is
fitted to these numbers (the compute model is a roofline with datasheet peaks
and documented efficiencies, see :mod:`simulator.compute`). The table only
says how far that first-principles model lands from reality; see
``docs/VALIDATION.md`` for the latest table and the discussion of deviations.

Metrics (the paper's FLOP convention decides which of ours is comparable):

``mfu``
    Model FLOPs utilisation, a fraction of the GPU's dense bf16 peak; model
    FLOPs exclude recomputation (Korthikanti et al. 2022; Llama 3). Ours:
    ``summary["mfu"]``.
``hardware_tflops_per_gpu``
    TFLOP/s per GPU counting recomputed FLOPs (Narayanan et al. SC'21 eq. 3,
    ``96 B s l h^2 (...)`` with full recompute). Ours:
    ``summary["hardware_tflops_per_gpu"]``.
``tflops_per_gpu``
    Model TFLOP/s per GPU, recomputation excluded. Ours:
    ``summary["tflops_per_gpu"]``.
``tokens_per_gpu_s``
    Training tokens per second per GPU, for reports that give throughput as
    GPU-hours per token count (DeepSeek-V3: 180K H800 GPU-hours per trillion
    tokens = 1e12 / (180e3 * 3600) = 1543.2 tokens/s per GPU). Ours:
    ``summary["tokens_per_s"] / summary["world_size"]``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

__all__ = ["Entry", "ENTRIES", "METRICS", "VALIDATION_DIR", "check_options", "entry_names", "get_entry",
           "validate_against_published", "load_entry"]

VALIDATION_DIR = Path(__file__).resolve().parent / "validation_runs"
"""Where the experiment files live: package data, installed with the package."""

METRICS = ("mfu", "tflops_per_gpu", "hardware_tflops_per_gpu", "tokens_per_gpu_s")
"""Summary keys an entry may be compared on (see the module docstring)."""

_KORTHIKANTI = ("Korthikanti et al., Reducing Activation Recomputation in Large Transformer Models, "
                "MLSys 2023 (arXiv:2205.05198), Tables 3 and 5; NVIDIA/Megatron-LM README")
_SC21_T1 = ("Narayanan et al., Efficient Large-Scale Language Model Training on GPU Clusters Using "
            "Megatron-LM, SC'21 (arXiv:2104.04473), Table 1")
_SC21_T2 = ("Narayanan et al., Efficient Large-Scale Language Model Training on GPU Clusters Using "
            "Megatron-LM, SC'21 (arXiv:2104.04473), Table 2 (PTD-P)")
_LLAMA3 = "Llama Team, AI @ Meta, The Llama 3 Herd of Models, arXiv:2407.21783, Table 4"
_DEEPSEEK_V3 = ("DeepSeek-AI, DeepSeek-V3 Technical Report, arXiv:2412.19437, abstract and section 1 (180K H800 "
                "GPU hours per trillion tokens), sections 3.1-3.3 and 4.2")


@dataclass(frozen=True)
class Entry:
    """One published measurement and the experiment file that reproduces its setup.

    Attributes
    ----------
    name : str
        Short unique name (``--only`` on the command line).
    gpus : int
        GPUs of the published run (the file's cluster has exactly these).
    metric : str
        One of :data:`METRICS`.
    published : float
        The published value in the metric's unit (a fraction for ``mfu``, tokens/s per GPU for
        ``tokens_per_gpu_s``, TFLOP/s otherwise).
    source : str
        Paper and table.
    note : str
        What the file could not reproduce exactly (details in its header comment).
    slow : str
        Empty for entries that a default ``validate`` runs; otherwise why this one is left out of it (its
        simulation takes far longer than the rest put together). ``--only NAME`` or ``--all`` runs it.
    """

    name: str
    gpus: int
    metric: str
    published: float
    source: str
    note: str = ""
    slow: str = ""

    @property
    def file(self) -> str:
        """Its experiment file's name in :data:`VALIDATION_DIR`: ``<name>.yaml``."""
        return f"{self.name}.yaml"

    @property
    def path(self) -> Path:
        return VALIDATION_DIR / self.file


ENTRIES: tuple[Entry, ...] = (
    # Korthikanti et al. 2022: sequence parallelism + selective recompute, DP = 1, A100 80GB.
    Entry("korthikanti22-22b", 8, "mfu", 0.415, _KORTHIKANTI),
    Entry("korthikanti22-175b", 64, "mfu", 0.514, _KORTHIKANTI,
          "interleaving v=3 and micro-batch 1 from Calculon's configs, not the paper"),
    Entry("korthikanti22-530b", 280, "mfu", 0.560, _KORTHIKANTI,
          "interleaving v=3 and micro-batch 1 from Calculon's configs, not the paper"),
    Entry("korthikanti22-1t", 512, "mfu", 0.563, _KORTHIKANTI),
    # Narayanan et al. SC'21 Table 2, PTD-P rows: full recompute, TFLOP/s counted with recompute.
    Entry("narayanan21-t2-175b-384", 384, "hardware_tflops_per_gpu", 153.0,
          _SC21_T2, "TP8xPP12 split of model-parallel size 96 assumed; 1F1B assumed"),
    Entry("narayanan21-t2-175b-768", 768, "hardware_tflops_per_gpu", 149.0,
          _SC21_T2, "TP8xPP12 split of model-parallel size 96 assumed; 1F1B assumed"),
    Entry("narayanan21-t2-175b-1536", 1536, "hardware_tflops_per_gpu", 141.0,
          _SC21_T2, "TP8xPP12 split of model-parallel size 96 assumed; 1F1B assumed"),
    Entry("narayanan21-t2-530b-560", 560, "hardware_tflops_per_gpu", 171.0,
          _SC21_T2, "TP8xPP35 split of model-parallel size 280 assumed; 1F1B assumed"),
    Entry("narayanan21-t2-530b-1120", 1120, "hardware_tflops_per_gpu", 167.0,
          _SC21_T2, "TP8xPP35 split of model-parallel size 280 assumed; 1F1B assumed"),
    Entry("narayanan21-t2-530b-2240", 2240, "hardware_tflops_per_gpu", 159.0,
          _SC21_T2, "TP8xPP35 split of model-parallel size 280 assumed; 1F1B assumed"),
    # Narayanan et al. SC'21 Table 1 (weak scaling): full recompute, TFLOP/s counted with recompute.
    Entry("narayanan21-t1-18b", 256, "hardware_tflops_per_gpu", 135.0, _SC21_T1,
          "micro-batch 1 and 1F1B assumed (not in Table 1)"),
    Entry("narayanan21-t1-39b", 512, "hardware_tflops_per_gpu", 138.0, _SC21_T1,
          "interleaved as section 5.1 says; micro-batch 1 and v = 2 assumed"),
    Entry("narayanan21-t1-146b", 1536, "hardware_tflops_per_gpu", 148.0, _SC21_T1,
          "interleaved as section 5.1 says; micro-batch 1 and v = 2 assumed"),
    Entry("narayanan21-t1-1t", 3072, "hardware_tflops_per_gpu", 163.0, _SC21_T1,
          "interleaved as section 5.1 says; micro-batch 1 and v = 2 assumed"),
    # Llama 3 405B on H100 (BF16 MFU).
    Entry("llama3-405b-8192", 8192, "mfu", 0.43, _LLAMA3,
          "v=8 assumed (one layer per chunk, the end chunks the embedding and the output layer alone); ZeRO-1 "
          "for FSDP; leaf-spine instead of 3-layer Clos"),
    Entry("llama3-405b-16384", 16384, "mfu", 0.41, _LLAMA3,
          "v=8 assumed (one layer per chunk, the end chunks the embedding and the output layer alone); ZeRO-1 "
          "for FSDP; leaf-spine instead of 3-layer Clos"),
    # Llama 3 405B long-context pre-training: 131K tokens, context parallelism 16 (all-gather CP).
    Entry("llama3-405b-131k-cp16", 16384, "mfu", 0.38, _LLAMA3,
          "v=8 assumed; no document masking; leaf-spine instead of 3-layer Clos"),
    # DeepSeek-V3 on 2,048 H800: GPU-hours per trillion tokens as tokens/s per GPU.
    Entry("deepseek-v3-2048-h800", 2048, "tokens_per_gpu_s", 1e12 / (180e3 * 3600), _DEEPSEEK_V3,
          "no MTP module; stage split assumed; balanced routing; leaf-spine instead of multi-plane fat tree; "
          "simulated in lockstep (its file's fidelity: ~15 s of CPU)"),
)
"""Every validation entry, smallest first within each source."""

COLUMNS = ("name", "gpus", "published", "simulated", "metric", "ratio", "error_pct", "fits", "sim_wall_s",
           "source")


def entry_names() -> list[str]:
    """Names of all entries, in :data:`ENTRIES` order."""
    return [e.name for e in ENTRIES]


def get_entry(name: str) -> Entry:
    """The entry called ``name``; ``ValueError`` listing the names otherwise."""
    for e in ENTRIES:
        if e.name == name:
            return e
    raise ValueError(f"validation entry {name!r} unknown; valid: {', '.join(entry_names())}")


def load_entry(entry: Entry | str):
    """The :class:`~simulator.experiment.Experiment` of an entry (its YAML, resolved)."""
    from .experiment import load_experiment
    return load_experiment((get_entry(entry) if isinstance(entry, str) else entry).path)


def select_entries(names: str | Iterable[str] | None = None, *, max_gpus: int | None = None,
                   include_slow: bool = False) -> tuple[Entry, ...]:
    """The entries a validation run simulates, in :data:`ENTRIES` order unless ``names`` orders them.

    ``names`` picks entries by name, each once (slow ones included: asked for by name; one name may be given as a
    string);
    without it every entry runs except the :attr:`Entry.slow` ones, unless ``include_slow``. ``max_gpus`` then
    drops the entries of published runs on more GPUs.
    """
    if isinstance(names, str):  # one entry's name, not its letters
        names = (names,)
    if max_gpus is not None and (isinstance(max_gpus, bool) or not isinstance(max_gpus, int) or max_gpus < 1):
        raise ValueError(f"max_gpus: must be an integer >= 1, got {max_gpus!r}")
    if names is not None:
        if not isinstance(names, Iterable):
            raise ValueError(f"names: an entry's name or a list of them (validate --list), got {names!r}")
        entries = tuple(get_entry(n) for n in dict.fromkeys(names))  # (a name given twice runs once)
    else:
        entries = tuple(e for e in ENTRIES if include_slow or not e.slow)
    if max_gpus is not None:
        entries = tuple(e for e in entries if e.gpus <= max_gpus)
    return entries


def check_options(only: Iterable[str] | None, jobs: object) -> None:
    """``clustersim validate``'s ``--only`` and ``--jobs``, checked before anything is printed (a bad one is then
    the only output: one line naming the option and what is valid)."""
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"--jobs: must be an integer >= 1, got {jobs!r}")
    for name in only or ():
        if name not in entry_names():
            raise ValueError(f"--only: {name!r} is not a validation entry; valid: {', '.join(entry_names())} "
                             f"(clustersim validate --list)")


def _run_entry(name: str, fidelity: str | None) -> dict:
    """Simulate one entry (forced if it does not fit; at ``fidelity``, None: its file's) and return its table
    row."""
    from .experiment import run_experiment
    e = get_entry(name)
    t0 = time.perf_counter()
    exp = load_entry(e)
    fits = bool(exp.memory().fits(exp.cluster.gpu.hbm_bytes))
    result = run_experiment(exp, force=True, fidelity=fidelity)
    summary = result.summary
    simulated = float(summary["tokens_per_s"] / summary["world_size"] if e.metric == "tokens_per_gpu_s"
                      else summary[e.metric])
    ratio = simulated / e.published
    return {"name": e.name, "gpus": e.gpus, "published": e.published, "simulated": simulated,
            "metric": e.metric, "ratio": ratio, "error_pct": 100.0 * (ratio - 1.0), "fits": fits,
            "sim_wall_s": time.perf_counter() - t0, "source": e.source}


def validate_against_published(names: str | Iterable[str] | None = None, fidelity: str | None = None, *,
                               max_gpus: int | None = None, jobs: int = 1, progress=None,
                               include_slow: bool = False) -> pd.DataFrame:
    """Simulate validation entries and compare with the published numbers.

    Parameters
    ----------
    names : str or iterable of str, optional
        Entries to run (default: all of :data:`ENTRIES` but the slow ones, in that order; see
        :func:`select_entries`).
    fidelity : {"fast", "full", "lockstep"}, optional
        Simulation fidelity of every entry (see :data:`simulator.experiment.FIDELITIES`); default each entry's
        file's (``fast`` unless the file says otherwise: DeepSeek-V3's says ``lockstep``).
    max_gpus : int, optional
        Skip entries whose published run used more GPUs.
    jobs : int, default 1
        Worker processes; entries are independent, so ``jobs > 1`` runs them in
        parallel (rows still come back in entry order). Each entry of a run of
        several runs in a fresh process, so the run's peak memory is one entry's.
    progress : callable, optional
        Called with each finished row (a dict), e.g. to print as results come in.
    include_slow : bool, default False
        Without ``names``, also run the entries marked :attr:`Entry.slow`.

    Returns
    -------
    pandas.DataFrame
        One row per entry: ``name, gpus, published, simulated, metric, ratio``
        (simulated / published), ``error_pct`` (100 (ratio - 1)), ``fits`` (False
        when our memory model says the layout does not fit in GPU memory; it is
        then simulated anyway, with ``force``), ``sim_wall_s``, ``source``.
        ``mfu`` values are fractions; TFLOP/s metrics are in TFLOP/s; ``tokens_per_gpu_s`` in tokens/s.
    """
    from .experiment import _fidelity
    if fidelity is not None:
        fidelity = _fidelity(fidelity)
    entries = select_entries(names, max_gpus=max_gpus, include_slow=include_slow)
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs: must be an integer >= 1, got {jobs!r}")
    if progress is not None and not callable(progress):
        raise ValueError(f"progress: must be a callable progress(row), got {type(progress).__name__}")
    rows: dict[str, dict] = {}
    if len(entries) <= 1:
        for e in entries:
            rows[e.name] = _run_entry(e.name, fidelity)
            if progress is not None:
                progress(rows[e.name])
    else:
        # Each entry in a fresh worker process (max_tasks_per_child=1), also with one job: run in one process the
        # entries' peaks piled up (14.6 GB at the end of a default run, 2026-12-03) where each alone peaks at
        # 7.2 GB at most (llama3-405b-131k-cp16) and leaves under 1 GB behind.
        from concurrent.futures import ProcessPoolExecutor, as_completed
        with ProcessPoolExecutor(max_workers=min(jobs, len(entries)), max_tasks_per_child=1) as pool:
            # One job: in entry order, each reported as it ends. Several: largest first, so the longest
            # simulations do not start last.
            order = entries if jobs == 1 else sorted(entries, key=lambda e: -e.gpus)
            futures = [pool.submit(_run_entry, e.name, fidelity) for e in order]
            for fut in (futures if jobs == 1 else as_completed(futures)):
                row = fut.result()
                rows[row["name"]] = row
                if progress is not None:
                    progress(row)
    return pd.DataFrame([rows[e.name] for e in entries], columns=list(COLUMNS))
