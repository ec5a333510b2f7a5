"""Token routing for mixture-of-experts layers: who sends how many tokens to whom.

A routing model draws, for one MoE layer, how many of each EP rank's token
choices go to each expert (``top_k`` choices per token), applies the expert
capacity (GShard / Switch Transformer: ``capacity = c · T·k / E`` token slots
per expert, overflow dropped), and folds experts onto EP ranks (expert ``e``
lives on EP rank ``e // (E / ep)``). The result is the token matrix of the
dispatch all-to-all; the combine all-to-all is its transpose.

Routing distributions
---------------------
uniform
    Every expert equally likely; counts drawn multinomially (so even
    "uniform" routing has the sampling noise real routers show).
zipf
    Expert ``e`` (in a seeded random order) has probability ∝ ``1 / r^s``
    with popularity rank ``r``: a few hot experts, a long tail.
custom
    A user-supplied expert-load vector, normalised to probabilities.
balanced
    Exactly ``T·k / E`` per expert (no noise): the closed-form reference.

Counts are drawn with ``numpy.random.default_rng(seed)``: same seed, same
routing. Choices of one token are drawn independently (the top-k
without-replacement constraint is ignored; it changes nothing in the
aggregate counts that drive traffic).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .errors import ConfigError, check_int, check_number

ROUTING_KINDS = ("uniform", "zipf", "custom", "balanced")


@dataclass(frozen=True)
class RoutingModel:
    """How tokens pick experts.

    Attributes
    ----------
    kind : {"uniform", "zipf", "custom", "balanced"}
    zipf_s : float
        Zipf exponent (``kind="zipf"``); 0 is uniform, 1 is strongly skewed.
    expert_load : sequence of float, optional
        Relative load per expert (``kind="custom"``), length = experts.
    capacity_factor : float or None
        Expert capacity as a multiple of the balanced load; ``None`` = no
        dropping (dropless MoE, as Megatron-core's default).
    seed : int
    """

    kind: str = "uniform"
    zipf_s: float = 1.0
    expert_load: tuple[float, ...] | None = None
    capacity_factor: float | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.kind, str) or self.kind not in ROUTING_KINDS:
            raise ConfigError(f"moe.routing: {self.kind!r} unknown; valid: {', '.join(ROUTING_KINDS)}")
        check_number("moe.zipf_s", self.zipf_s, minimum=0.0, maximum=100.0)
        if self.capacity_factor is not None:
            check_number("moe.capacity_factor", self.capacity_factor, minimum=1e-6, maximum=1e6,
                         unit="(null for dropless)")
        check_int("moe.seed", self.seed, minimum=0)
        if self.kind == "custom":
            if not self.expert_load:
                raise ConfigError("moe.expert_load: a list of per-expert loads is required with routing: custom")
            for x in self.expert_load:
                check_number("moe.expert_load", x, minimum=0.0, maximum=1e30)
            if sum(self.expert_load) <= 0:
                raise ConfigError("moe.expert_load: loads must be >= 0 and not all zero")

    def probabilities(self, experts: int, layer: int = 0) -> np.ndarray:
        """Probability that one token choice goes to each expert (layer-specific hot set for zipf)."""
        if self.kind in ("uniform", "balanced"):
            return np.full(experts, 1.0 / experts)
        if self.kind == "custom":
            load = np.asarray(self.expert_load, dtype=float)
            if len(load) != experts:
                raise ConfigError(f"moe.expert_load: has {len(load)} entries but the model has {experts} experts")
            return load / load.sum()
        weights = 1.0 / np.arange(1, experts + 1) ** self.zipf_s
        order = np.random.default_rng([self.seed, layer, 1]).permutation(experts)
        probs = np.empty(experts)
        probs[order] = weights / weights.sum()
        return probs


@dataclass(frozen=True)
class LayerRouting:
    """Routing of one MoE layer over one EP group.

    Attributes
    ----------
    choices : numpy.ndarray, shape (ep, experts)
        Token choices each EP rank routes to each expert, before capacity.
    kept : numpy.ndarray, shape (ep, experts)
        After dropping tokens over capacity.
    capacity : float or None
        Token slots per expert.
    """

    choices: np.ndarray
    kept: np.ndarray
    capacity: float | None

    @property
    def expert_load(self) -> np.ndarray:
        """Tokens each expert processes (after capacity)."""
        return self.kept.sum(axis=0)

    @property
    def dropped(self) -> int:
        return int(self.choices.sum() - self.kept.sum())

    @property
    def dropped_fraction(self) -> float:
        total = self.choices.sum()
        return float(self.dropped / total) if total else 0.0

    def rank_matrix(self) -> np.ndarray:
        """Tokens EP rank ``i`` sends to EP rank ``j`` (dispatch), shape (ep, ep)."""
        ep, experts = self.kept.shape
        per_rank = experts // ep
        return self.kept.reshape(ep, ep, per_rank).sum(axis=2)

    @property
    def rank_load(self) -> np.ndarray:
        """Tokens each EP rank's experts process."""
        return self.rank_matrix().sum(axis=0)

    @property
    def imbalance(self) -> float:
        """Max over mean of the per-EP-rank load (1 = perfectly balanced)."""
        load = self.rank_load
        return float(load.max() / load.mean()) if load.mean() else 1.0


def _apply_capacity(choices: np.ndarray, capacity: float | None) -> np.ndarray:
    """Drop each expert's overflow, taking it from the senders in proportion (largest remainder)."""
    if capacity is None:
        return choices.copy()
    cap = int(np.floor(capacity))
    kept = choices.copy()
    for e in np.flatnonzero(choices.sum(axis=0) > cap):
        col = choices[:, e].astype(float)
        share = col * cap / col.sum()
        base = np.floor(share).astype(np.int64)
        short = cap - base.sum()
        order = np.lexsort((np.arange(len(col)), -(share - base)))  # ties → lower rank first
        base[order[:short]] += 1
        kept[:, e] = base
    return kept


def route_layer(model_experts: int, top_k: int, tokens_per_rank: int, ep: int, routing: RoutingModel,
                layer: int = 0) -> LayerRouting:
    """Draw the routing of one MoE layer.

    Parameters
    ----------
    model_experts : int
        Routed experts ``E`` (divisible by ``ep``).
    top_k : int
        Experts per token ``k``.
    tokens_per_rank : int
        Tokens each EP rank routes (``b·s``, or ``b·s/tp`` with sequence parallelism).
    ep : int
        Expert-parallel degree.
    routing : RoutingModel
    layer : int
        Layer index, mixed into the seed so layers differ.

    Examples
    --------
    >>> r = route_layer(8, 2, 1000, 4, RoutingModel("balanced"))
    >>> r.rank_matrix().tolist()
    [[500, 500, 500, 500], [500, 500, 500, 500], [500, 500, 500, 500], [500, 500, 500, 500]]
    """
    if model_experts % ep:
        raise ConfigError(f"parallel.ep: {ep} does not divide model.experts={model_experts}")
    n_choices = tokens_per_rank * top_k
    if routing.kind == "balanced":
        if n_choices % model_experts:
            raise ConfigError(f"moe.routing: balanced needs tokens*top_k ({n_choices}) divisible by experts "
                              f"({model_experts})")
        choices = np.full((ep, model_experts), n_choices // model_experts, dtype=np.int64)
    else:
        rng = np.random.default_rng([routing.seed, layer, 0])
        probs = routing.probabilities(model_experts, layer)
        choices = rng.multinomial(n_choices, probs, size=ep).astype(np.int64)
    capacity = None
    if routing.capacity_factor is not None:
        capacity = routing.capacity_factor * ep * n_choices / model_experts
    return LayerRouting(choices, _apply_capacity(choices, capacity), capacity)


def routing_from_dict(section: dict | None) -> RoutingModel:
    """Build a :class:`RoutingModel` from the experiment file's ``moe:`` section (strict keys)."""
    section = dict(section or {})
    valid = ("routing", "zipf_s", "expert_load", "capacity_factor", "seed")
    unknown = sorted(set(section) - set(valid))
    if unknown:
        raise ConfigError(f"moe.{unknown[0]}: unknown field; valid fields: {', '.join(valid)}")
    load = section.get("expert_load")
    if load is not None and (isinstance(load, str) or not isinstance(load, Sequence)):
        raise ConfigError(f"moe.expert_load: must be a list of numbers, got {load!r}")
    return RoutingModel(kind=section.get("routing", "uniform"), zipf_s=section.get("zipf_s", 1.0),
                        expert_load=tuple(load) if load is not None else None,
                        capacity_factor=section.get("capacity_factor"), seed=section.get("seed", 0))
