"""How many ops a step may have: a refusal before the generator builds a graph no machine can simulate.

Each limit on its own (:data:`workloads.parallel.MAX_MICRO_BATCHES`, the model's layer count, the world size)
is generous, but they multiply: 65,536 micro-batches of a 4,096-layer model is ~10^10 ops, which the generator
would build for hours until memory ran out. :class:`OpBudget` projects the graph's final size while it is
built — from the actions of the rank in progress (a rank's program is its schedule's actions, each of roughly
equal size) and from the ranks already built (the simulated ranks' programs are about equally long) — and
raises :class:`StepTooLargeError` as soon as the projection passes the limit by a quarter (:data:`_SLACK`) or the
ops built pass it, after a few actions of the first rank, not after the graph.

The default limit, :data:`MAX_OPS`, is what a 24 GiB machine simulates: a whole run holds ~2 kB per op (peak
resident memory over ops, measured 2026-12-04 in ``fast``: 1.5 kB on ``benchmarks/gpt3-175b-1024.yaml``, 2.2 kB
on ``benchmarks/mixtral-8x7b-ep8-1024.yaml``, the flow network's state included) and takes ~30 µs of CPU per op
on the 2-core development machine. A caller with a bigger machine passes its own limit, or None for none
(``clustersim run --force``).
"""

from __future__ import annotations

from .errors import ConfigError
from .ops import OpGraph

MAX_OPS = 10_000_000
"""The most ops :func:`workloads.training.training_step` builds by default (module docstring)."""
BYTES_PER_OP = 2_000.0
"""Peak memory of a whole run per op of its graph (bytes; module docstring)."""
CPU_SECONDS_PER_OP = 30e-6
"""CPU time of a whole run per op of its graph (seconds, 2-core development machine; module docstring)."""
_SLACK = 1.25
"""How far a projection may pass the limit before it refuses: the first actions' one-off ops make it overshoot
by up to a few percent on real steps (a fifth on the tiny demo); the ops actually built are held to the limit."""
_MIN_ACTIONS = 4
"""Actions of a rank built before its own program is projected from them (its first forward may carry one-off
ops: FP8 weight casts, parameter gathers)."""


LOCKSTEP_HINT = ", and so does fidelity: lockstep"
"""The refusal's last clause; :func:`without_lockstep` takes it out where lockstep cannot help."""


def without_lockstep(message: str) -> str:
    """A refusal's message without :data:`LOCKSTEP_HINT`."""
    return message.replace(LOCKSTEP_HINT, "")


class StepTooLargeError(ConfigError):
    """The step's op graph would have more ops than the limit: ``ops`` (the projection, a float) over ``limit``."""

    def __init__(self, message: str, ops: float, limit: int) -> None:
        super().__init__(message)
        self.ops = ops
        self.limit = limit

    def __reduce__(self) -> tuple:  # (pickles and copies: a worker process raises it back to its caller)
        return type(self), (str(self), self.ops, self.limit)


class OpBudget:
    """Watches an :class:`~workloads.ops.OpGraph` as the programs of ``ranks`` ranks are built into it.

    The builder calls :meth:`check` before each action of a rank's schedule and :meth:`rank_done` after each
    rank. ``limit`` None never raises. ``lockstep_helps`` False leaves :data:`LOCKSTEP_HINT` out of the refusal:
    the step already runs one rank per stage, or would simulate these same ranks in lockstep.
    """

    def __init__(self, limit: int | None, ranks: int, graph: OpGraph, lockstep_helps: bool = True) -> None:
        self.limit = limit
        self.ranks = ranks
        self.graph = graph
        self.lockstep_helps = lockstep_helps
        self.done = 0  # ranks built
        self.start = len(graph.ops)  # ops when the rank in progress began

    def rank_done(self) -> None:
        """Count a rank built; refuse if its tail (its last action, reductions, optimizer: after the last
        :meth:`check`) took the ops built over the limit."""
        self.done += 1
        self.start = len(self.graph.ops)
        if self.limit is not None and self.start > self.limit:
            self._refuse(*self.projected(0, 1))  # (before the next rank's first action: the ranks built)

    def projected(self, action: int, actions: int) -> tuple[float, float]:
        """``(ops of the whole graph, ops per rank)`` projected when ``action`` of the rank in progress's
        ``actions`` is about to be built; ``(ops built, 0)`` before anything can be projected."""
        built = len(self.graph.ops)
        if action >= min(actions, _MIN_ACTIONS) and action:
            per_rank = (self.start + (built - self.start) * actions / action) / (self.done + 1)
        elif self.done:
            per_rank = self.start / self.done
        else:
            return float(built), 0.0
        return max(float(built), per_rank * self.ranks), per_rank

    def check(self, action: int, actions: int) -> None:
        """Raise :class:`StepTooLargeError` when the projected graph is over the limit."""
        if self.limit is None:
            return
        ops, per_rank = self.projected(action, actions)
        if ops > self.limit * _SLACK or len(self.graph.ops) > self.limit:
            self._refuse(ops, per_rank)

    def _refuse(self, ops: float, per_rank: float) -> None:
        """Raise the one-line :class:`StepTooLargeError` of ``ops`` projected (``per_rank`` each)."""
        minutes = ops * CPU_SECONDS_PER_OP / 60
        raise StepTooLargeError(
            f"the step would have ~{ops:,.0f} ops ({self.ranks:,} simulated ranks x ~{per_rank:,.0f}), over "
            f"the limit of {self.limit:,} (~{ops * BYTES_PER_OP / 1e9:,.1f} GB of memory and ~{minutes:,.1f} "
            f"min of CPU to simulate); fewer micro-batches (parallel.global_batch) or fewer model.layers make it "
            f"smaller{LOCKSTEP_HINT if self.lockstep_helps else ''}", ops, self.limit)
