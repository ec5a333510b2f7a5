"""Token routing for mixture-of-experts layers: who sends how many tokens to whom.

A routing model draws, for one MoE layer and one micro-batch, how many of
each EP rank's token choices go to each expert (``top_k`` choices per token),
applies the expert capacity, and folds experts onto EP ranks (expert ``e``
lives on EP rank ``e // (E / ep)``). The result is the token matrix of the
dispatch all-to-all; the combine all-to-all is its transpose.

Capacity and dropping (Megatron-Core ``--moe-expert-capacity-factor``)
----------------------------------------------------------------------
Megatron-Core drops in the router, on each rank's own tokens before the
dispatch (``apply_router_token_dropping`` in ``moe_utils.py``): every source
rank keeps at most ``capacity = ceil(c · T·k / E)`` of its ``T·k`` choices
per expert (``get_capacity``), so an expert receives at most ``ep ·
capacity``. Dropped choices neither travel nor compute. With
``pad_to_capacity`` (``--moe-pad-expert-input-to-capacity``) every source
rank sends exactly ``capacity`` slots to every expert, real or padding, so
the all-to-alls and the expert GEMMs have a fixed size. ``capacity_factor:
null`` is dropless (Megatron-Core's default).

Draws
-----
``draw: micro_batch`` (default) draws every (layer, micro-batch) afresh, as a
router sees new tokens each micro-batch; ``draw: layer`` draws once per layer
and reuses it for every micro-batch (the behaviour before; far fewer
distinct all-to-alls, so it simulates faster and keeps less in memory on
very large runs). Either way every EP group sees the same draw.

Routing distributions
---------------------
uniform
    Every expert equally likely; counts drawn multinomially (so even
    "uniform" routing has the sampling noise real routers show).
zipf
    Expert ``e`` (in a seeded random order) has popularity ∝ ``1 / r^s``
    with popularity rank ``r``: a few hot experts, a long tail. A token picks
    ``k`` *distinct* experts, one after another in proportion to the
    popularities of those it has not picked (Plackett-Luce: what the top-k
    of router logits with these popularities amounts to), so a choice lands
    on expert ``e`` with probability ``π_e / k``, ``π_e`` the probability that
    ``e`` is among a token's ``k`` (:func:`inclusion_probabilities`). An expert
    therefore never takes more than ``1/k`` of the choices: at ``s`` 1, top-2 of
    8, the hottest takes 0.315 of them, not the 0.368 its popularity share would
    give (and at ``s`` 2 not 0.655: more choices than tokens).
custom
    A user-supplied expert-load vector: the share of the choices each expert
    takes (a measured load), normalised. No expert can take more than ``1/k``
    of them (a token picks it at most once): shares above are capped there and
    the rest spread over the others in proportion to theirs (:func:`capped_shares`).
balanced
    Exactly ``T·k / E`` per expert (no noise): the closed-form reference.

Counts are drawn with ``numpy.random.default_rng(seed)``: same seed, same
routing. An EP rank's ``T·k`` choices are drawn as one multinomial of the
choice probabilities: the expected count of every expert is exact (``T π_e``,
at most ``T``), the token-level pairing of a token's ``k`` choices is not
drawn (a count can exceed ``T`` in a far tail where ``π_e`` is near 1).
Until 2026-12-05 the popularities themselves were the choice probabilities,
a token's ``k`` choices independent: at ``s`` 2 one rank sent 5,416 choices
from 4,096 tokens to one expert.

Node-limited routing (``max_nodes``)
------------------------------------
DeepSeek-V3 (arXiv:2412.19437, section 2.1.2) sends each token to experts on
at most ``M`` nodes (``M = 4``), the nodes with the highest sums of the
``K / M`` highest affinities of their experts. The node choice changes which
experts a token picks *together*, not how often each expert is picked, so the
drawn counts stay as they are; what changes is how many distinct nodes and
GPUs a token reaches, which is what DeepEP's dispatch sends
(:func:`deepep_matrices`). Model: a token picks its ``M`` nodes, then its
``k`` distinct experts among the experts of those nodes, node ``n``
taking the share ``σ_n = p_n / (p_n + (M - 1)(1 - p_n) / (N - 1))`` of them
(``p_n``: probability of node ``n`` of the ``N`` of the EP group that hold load; the other
``M - 1`` nodes at the average). Exact in the node shares for uniform routing (``σ = 1/M``) and in both limits
(``M = 1``: one node per token; ``M ≥ N``: unlimited). DeepSeek's own
selection (by the top ``K / M`` affinities) nearly always uses all ``M``
nodes (3.95 of 4 for V3's 8 nodes of 32 experts and uniform affinities, by a
Monte Carlo of the rule, against this model's 3.63): the model is a lower
bound on DeepEP's inter-node copies. The ``all_to_all`` dispatcher sends one
copy per choice, so the node limit does not change its traffic.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .errors import ConfigError, check_int, check_number, unknown_keys

ROUTING_KINDS = ("uniform", "zipf", "custom", "balanced")
DRAWS = ("micro_batch", "layer")
DISPATCHERS = ("all_to_all", "deepep")


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
        Expert capacity as a multiple of the balanced load, per source rank
        (Megatron-Core); ``None`` = no dropping (dropless MoE, Megatron-Core's default).
    seed : int
    draw : {"micro_batch", "layer"}
        Draw the routing per (layer, micro-batch) (default) or once per layer.
    pad_to_capacity : bool
        Pad every (source rank, expert) to the capacity (needs ``capacity_factor``).
    dispatch : {"all_to_all", "deepep"}
        How tokens reach the experts: one all-to-all over the EP group (Megatron's
        ``alltoall`` dispatcher), or DeepEP's node-aggregated dispatch (each token
        crosses the network once per destination node, then NVLink forwarding);
        see :func:`deepep_tier_bytes`.
    shared_expert_overlap : bool
        Run the shared experts beside the dispatch / combine (Megatron
        ``--moe-shared-expert-overlap``) instead of after the routed experts.
    node_gpus : int
        GPUs per NVLink domain (rank ``r`` on node ``r // node_gpus``); the experiment sets it from the
        cluster. Only ``dispatch: deepep`` reads it.
    max_nodes : int or None
        Node-limited routing (DeepSeek-V3 section 2.1.2): every token's experts lie on at most this many
        nodes of its EP group (module docstring); ``None`` = unlimited. Only ``dispatch: deepep`` reads it
        (the ``all_to_all`` dispatcher sends one copy per choice whichever nodes they are on).
    """

    kind: str = "uniform"
    zipf_s: float = 1.0
    expert_load: tuple[float, ...] | None = None
    capacity_factor: float | None = None
    seed: int = 0
    draw: str = "micro_batch"
    pad_to_capacity: bool = False
    dispatch: str = "all_to_all"
    shared_expert_overlap: bool = False
    node_gpus: int = 8
    max_nodes: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.kind, str) or self.kind not in ROUTING_KINDS:
            raise ConfigError(f"moe.routing: {self.kind!r} unknown; valid: {', '.join(ROUTING_KINDS)}")
        check_number("moe.zipf_s", self.zipf_s, minimum=0.0, maximum=100.0)
        if self.capacity_factor is not None:
            check_number("moe.capacity_factor", self.capacity_factor, minimum=1e-6, maximum=1e6,
                         unit="(null for dropless)")
        check_int("moe.seed", self.seed, minimum=0)
        for name, value, valid in (("draw", self.draw, DRAWS), ("dispatch", self.dispatch, DISPATCHERS)):
            if not isinstance(value, str) or value not in valid:
                raise ConfigError(f"moe.{name}: {value!r} unknown; valid: {', '.join(valid)}")
        for name in ("pad_to_capacity", "shared_expert_overlap"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"moe.{name}: must be true or false, got {getattr(self, name)!r}")
        check_int("moe.node_gpus", self.node_gpus)
        if self.max_nodes is not None:
            check_int("moe.max_nodes", self.max_nodes)
            if self.max_nodes > 1 << 20:
                raise ConfigError(f"moe.max_nodes: {self.max_nodes:,} exceeds the supported {1 << 20:,} "
                                  "(null for unlimited)")
        if self.dispatch == "deepep" and self.pad_to_capacity:
            raise ConfigError("moe.dispatch: deepep sends each token once per destination node and GPU; it is not "
                              "modelled with pad_to_capacity (fixed-size all-to-alls)")
        if self.pad_to_capacity and self.capacity_factor is None:
            raise ConfigError("moe.pad_to_capacity: needs moe.capacity_factor (a dropless MoE has no capacity "
                              "to pad to)")
        if self.kind == "custom":
            if not self.expert_load:
                raise ConfigError("moe.expert_load: a list of per-expert loads is required with routing: custom")
            for x in self.expert_load:
                check_number("moe.expert_load", x, minimum=0.0, maximum=1e30)
            if sum(self.expert_load) <= 0:
                raise ConfigError("moe.expert_load: loads must be >= 0 and not all zero")

    def choice_probabilities(self, experts: int, top_k: int, layer: int = 0) -> np.ndarray:
        """Probability that one token choice goes to each expert: :meth:`probabilities` for ``custom`` (a
        measured share of the choices, capped at ``1 / top_k``: :func:`capped_shares`; refused with fewer
        loaded experts than ``top_k``, whom a token could not pick distinct) and the uniform kinds; for ``zipf``
        the popularities' :func:`inclusion_probabilities` over ``top_k`` (a token's choices are distinct
        experts)."""
        probs = self.probabilities(experts, layer)
        if self.kind == "zipf" and top_k > 1:
            return inclusion_probabilities(probs, top_k) / top_k
        if self.kind == "custom" and top_k > 1:
            loaded = int((probs > 0).sum())
            if loaded < top_k:
                raise ConfigError(f"moe.expert_load: {loaded} experts with a load, but every token picks top_k = "
                                  f"{top_k} distinct experts; give at least {top_k} a positive load")
            return capped_shares(probs, 1.0 / top_k)
        return probs

    def probabilities(self, experts: int, layer: int = 0) -> np.ndarray:
        """Each expert's popularity (normalised; layer-specific hot set for zipf): the probability that one token
        choice goes to it for ``uniform``, ``balanced`` and ``custom``; for ``zipf`` the weights a token's
        distinct choices are made by (:meth:`choice_probabilities`)."""
        if self.kind in ("uniform", "balanced"):
            return np.full(experts, 1.0 / experts)
        if self.kind == "custom":
            load = np.asarray(self.expert_load, dtype=float)
            if len(load) != experts:
                raise ConfigError(f"moe.expert_load: has {len(load)} entries but the model has {experts} experts")
            return load / load.sum()
        # (in floats: an integer exponent would raise integers and overflow int64 from 64 experts at s = 11)
        weights = 1.0 / np.arange(1, experts + 1, dtype=float) ** self.zipf_s
        order = np.random.default_rng([self.seed, layer, 1]).permutation(experts)
        probs = np.empty(experts)
        probs[order] = weights / weights.sum()
        return probs


@dataclass(frozen=True)
class LayerRouting:
    """Routing of one MoE layer (one micro-batch, or a sum of them) over one EP group.

    Attributes
    ----------
    choices : numpy.ndarray, shape (ep, experts)
        Token choices each EP rank routes to each expert, before capacity.
    kept : numpy.ndarray, shape (ep, experts)
        After dropping the choices over capacity.
    capacity : float or None
        Token slots per (source EP rank, expert) in one micro-batch.
    padded : bool
        Every (source, expert) pair sends ``capacity`` slots (pad to capacity).
    draws : int
        How many draws (micro-batches) this routing sums (:meth:`plus`); 1 for one draw.
    """

    choices: np.ndarray
    kept: np.ndarray
    capacity: float | None
    padded: bool = False
    draws: int = 1

    @property
    def slots(self) -> np.ndarray:
        """What travels and computes per (source EP rank, expert): the kept choices, or the capacity of each draw
        summed when padded."""
        return np.full_like(self.kept, int(self.capacity) * self.draws) if self.padded else self.kept

    def plus(self, other: LayerRouting) -> LayerRouting:
        """The sum of two routings of one layer (over micro-batches): choices, kept choices and draws add up;
        capacity (per draw) and padding are the layer's own."""
        return LayerRouting(self.choices + other.choices, self.kept + other.kept, other.capacity, other.padded,
                            self.draws + other.draws)

    @property
    def expert_load(self) -> np.ndarray:
        """Token slots each expert processes (after capacity; padding included)."""
        return self.slots.sum(axis=0)

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
        return self.slots.reshape(ep, ep, per_rank).sum(axis=2)

    @property
    def rank_load(self) -> np.ndarray:
        """Tokens each EP rank's experts process."""
        return self.rank_matrix().sum(axis=0)

    @property
    def imbalance(self) -> float:
        """Max over mean of the per-EP-rank load (1 = perfectly balanced)."""
        load = self.rank_load
        return float(load.max() / load.mean()) if load.mean() else 1.0


def _router_shares(rng: np.random.Generator, choices: np.ndarray, routers: int, each: int) -> np.ndarray:
    """Split each EP rank's choices per expert (``choices``, ranks x experts) among ``routers`` routers of ``each``
    choices (the last takes what is left): ``(routers, ranks, experts)``. Router ``r`` draws its ``each`` from
    what the routers before it left, without replacement (multivariate hypergeometric), which is the law of
    ``routers`` independent multinomials given their sum."""
    shares = np.empty((routers,) + choices.shape, dtype=np.int64)
    for i, row in enumerate(choices):
        left = row.copy()
        for r in range(routers - 1):
            shares[r, i] = rng.multivariate_hypergeometric(left, each)
            left -= shares[r, i]
        shares[routers - 1, i] = left
    return shares


def _apply_capacity(choices: np.ndarray, capacity: int | None) -> np.ndarray:
    """Megatron-Core's router dropping: each source rank keeps at most ``capacity`` choices per expert."""
    if capacity is None:
        return choices
    return np.minimum(choices, capacity)


def capacity_slots(tokens_per_rank: int, top_k: int, experts: int, capacity_factor: float) -> int:
    """Megatron-Core's ``get_capacity(T·k, E, c)``: ``ceil(T·k / E · c)`` slots per expert and source rank."""
    return int(math.ceil(tokens_per_rank * top_k / experts * capacity_factor))


def capped_shares(shares: np.ndarray, cap: float) -> np.ndarray:
    """``shares`` (summing to 1) with none above ``cap``: those above are set to it and the remainder spread over
    the others in proportion to their shares, until none exceeds it (water-filling). Unchanged where none does.

    >>> capped_shares(np.array([8, 1, 1, 1, 1, 1, 1, 1]) / 15, 0.5).round(4).tolist()
    [0.5, 0.0714, 0.0714, 0.0714, 0.0714, 0.0714, 0.0714, 0.0714]
    """
    out = np.asarray(shares, dtype=float).copy()
    fixed = np.zeros(len(out), dtype=bool)
    while (out[~fixed] > cap * (1 + 1e-12)).any():
        fixed |= out > cap * (1 + 1e-12)
        out[fixed] = cap
        free = ~fixed
        rest = out[free].sum()
        out[free] *= (1.0 - cap * fixed.sum()) / rest if rest > 0 else 0.0
    return out


INCLUSION_SAMPLES = 1 << 14
"""Tokens a Monte Carlo of :func:`inclusion_probabilities` draws: its standard error is at most 0.004 (of a
``π`` near 0.5; 0.4% of a hot expert's 0.8; ~10% of the coldest experts' ~0.01), below a layer's own sampling noise;
~0.3 s for 256 experts."""


def inclusion_probabilities(weights: np.ndarray, top_k: int) -> np.ndarray:
    """``π_e``: the probability that a token's ``top_k`` distinct experts include expert ``e`` when it picks them
    one after another, each time in proportion to ``weights`` among those not picked yet (Plackett-Luce sampling
    without replacement; equivalently the ``top_k`` largest of ``log w_e`` plus independent Gumbel noise).
    ``Σ π = top_k`` and every ``π_e ≤ 1``. Equal weights: exactly ``top_k / E``. Otherwise a seeded Monte Carlo of
    :data:`INCLUSION_SAMPLES` tokens, computed once per sorted weight vector (a layer's Zipf order is a
    permutation of the same weights).

    >>> inclusion_probabilities(np.full(8, 1 / 8), 2).tolist() == [0.25] * 8
    True
    >>> p = inclusion_probabilities(np.array([0.6, 0.2, 0.1, 0.1]), 2)
    >>> bool(abs(p.sum() - 2) < 1e-12 and p.max() <= 1 and 0.8 < p[0] < 0.95)
    True
    """
    w = np.asarray(weights, dtype=float)
    if top_k >= len(w):
        return np.ones(len(w))
    if w.min() == w.max():
        return np.full(len(w), top_k / len(w))
    order = np.argsort(-w, kind="stable")
    out = np.empty(len(w))
    out[order] = _inclusion_sorted(tuple(w[order].tolist()), top_k)
    return out


@lru_cache(maxsize=64)
def _inclusion_sorted(weights: tuple[float, ...], top_k: int) -> np.ndarray:
    """:func:`inclusion_probabilities` of weights sorted in decreasing order (cached: every layer's)."""
    w = np.array(weights)
    logw = np.full(len(w), -np.inf)
    positive = w > 0
    logw[positive] = np.log(w[positive])
    rng = np.random.default_rng([len(w), top_k, 3])
    counts = np.zeros(len(w))
    chunk = max(1, (1 << 22) // len(w))  # (tokens per block: ~32 MB of keys)
    for start in range(0, INCLUSION_SAMPLES, chunk):
        n = min(chunk, INCLUSION_SAMPLES - start)
        keys = logw + rng.gumbel(size=(n, len(w)))
        picked = np.argpartition(-keys, top_k - 1, axis=1)[:, :top_k]
        counts += np.bincount(picked.ravel(), minlength=len(w))
    return counts / INCLUSION_SAMPLES


def route_layer(model_experts: int, top_k: int, tokens_per_rank: int, ep: int, routing: RoutingModel,
                layer: int = 0, micro_batch: int | None = None, routers: int = 1) -> LayerRouting:
    """Draw the routing of one MoE layer (for one micro-batch).

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
    micro_batch : int, optional
        Micro-batch index, mixed into the seed too (``draw: micro_batch``); ``None`` draws the
        layer's one routing (``draw: layer``, the same stream as before per-micro-batch draws).
    routers : int
        Routers that share an EP rank's tokens, each routing ``tokens_per_rank / routers`` of them under its
        own capacity: Megatron-Core's router runs on each TP rank's sequence-parallel share
        (``topk_softmax_with_capacity`` on ``b·s/t`` tokens, ``get_capacity`` of those), so with ``etp = tp``
        a TP group's ``t`` routers each keep at most ``C = ceil(T/t · k / E · c)`` per expert; the EP rank's
        capacity (its padded slots) is then ``t·C``. Capping a sum of ``t`` draws at ``t·C`` would drop fewer
        (uniform routing, 8 experts, top-2, 4,096 tokens, c = 1: 1.2% against Megatron's 2.3% at t = 4).
        The ``t`` draws sum to one multinomial of ``T``, which is drawn first, as without a capacity; the
        routers' shares are then its split (a multivariate hypergeometric draw of each router's ``T·k/t``
        choices from what is left: ``t`` independent multinomials conditioned on their sum), so a capacity
        that drops nothing leaves the routing as the dropless one draws it, and capacity against dropless
        compares the same tokens.

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
        seed = [routing.seed, layer, 0] if micro_batch is None else [routing.seed, layer, 2, micro_batch]
        rng = np.random.default_rng(seed)
        probs = routing.choice_probabilities(model_experts, top_k, layer)
        choices = rng.multinomial(n_choices, probs, size=ep).astype(np.int64, copy=False)  # (int64 already)
        if routers > 1 and routing.capacity_factor is not None:  # each router's share, capped on its own
            shares = _router_shares(rng, choices, routers, n_choices // routers)
            capacity = capacity_slots(tokens_per_rank // routers, top_k, model_experts, routing.capacity_factor)
            return LayerRouting(choices, _apply_capacity(shares, capacity).sum(axis=0), routers * capacity,
                                routing.pad_to_capacity)
    capacity = None
    if routing.capacity_factor is not None:
        capacity = routers * capacity_slots(tokens_per_rank // routers, top_k, model_experts,
                                            routing.capacity_factor)
    return LayerRouting(choices, _apply_capacity(choices, capacity), capacity, routing.pad_to_capacity)


def node_limited_shares(node_probs: np.ndarray, max_nodes: int) -> np.ndarray:
    """Share ``σ_n`` of a token's choices that node ``n`` takes when it is one of the token's ``max_nodes``
    nodes (module docstring): ``p_n / (p_n + (M - 1)(1 - p_n) / (N - 1))`` with ``N`` the nodes of positive
    ``p`` (a node without load is never one of a token's); ``p_n`` itself when ``M >= N`` (the limit cannot
    bind), 1 when ``M = 1``.

    Examples
    --------
    >>> node_limited_shares(np.full(8, 1 / 8), 4).tolist()   # uniform: 1/M
    [0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25]
    >>> node_limited_shares(np.array([0.5, 0.5, 0.0, 0.0]), 2).tolist()   # two loaded nodes: nothing to limit
    [0.5, 0.5, 0.0, 0.0]
    """
    p = np.asarray(node_probs, dtype=float)
    nz = p > 0
    n = int(nz.sum())  # the nodes a token can choose: one without load never takes part of one's share
    if max_nodes >= n:
        return p
    out = np.zeros_like(p)
    out[nz] = p[nz] / (p[nz] + (max_nodes - 1) * (1.0 - p[nz]) / (n - 1))
    return out


def deepep_matrices(slots: np.ndarray, rank_probs: np.ndarray, top_k: int,
                    node_of: Sequence[int], max_nodes: int | None = None,
                    experts_per_rank: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Tokens of DeepEP's node-aggregated dispatch over one EP group: ``(first hop, NVLink forward)``.

    DeepEP's normal kernels (DeepSeek-V3 report section 3.2.2; github.com/deepseek-ai/DeepEP) send a
    token once to every *GPU* that holds one of its experts (not once per expert), and across nodes once
    to every destination *node*: over RDMA to the GPU with the sender's local index on that node, which
    forwards it over NVLink to the GPUs there that need it. Combine is the reverse (NVLink reduce into the
    forwarder, then RDMA back).

    Counts are expectations given the drawn choices: the ``slots[i, j]`` choices rank ``i`` sends to EP rank
    ``j`` stand for ``slots[i, j] * r_j`` distinct tokens, ``r_j`` the probability that a token picks ``j`` at
    least once over ``k p_j`` (``p_j`` the probability that one choice lands on ``j``): for distinct experts
    (``experts_per_rank``) below; for ``k`` independent choices ``r_j = (1 - (1 - p_j)^k) / (k p_j)``; likewise per
    node with ``p_n = sum of p_j on node n``. With ``max_nodes`` (node-limited
    routing, fewer than the group's nodes) a token's choices fall on its own ``M`` nodes only: ``p_n`` becomes
    the share ``σ_n`` of :func:`node_limited_shares` and ``p_j`` becomes ``p_j σ_n / p_n`` (the same
    choices, concentrated on fewer nodes and GPUs, so fewer distinct copies).

    With ``experts_per_rank`` (``g``) a token's ``k`` choices are distinct experts (:mod:`workloads.moe`,
    "Routing distributions"): a group of ``g`` experts (a rank's, or ``g`` times the ranks of a node) that takes
    the share ``q`` of the choices is missed with probability ``Π_{i<k} (P - g - i) / (P - i)`` over an
    effective pool of ``P = g / q`` experts (each factor at least 0), so ``r = (1 - miss) / (k q)``. Exact for
    equal popularities (the hypergeometric draw of ``k`` of ``E`` experts; under node-limited routing of the
    ``E M / N`` on a token's nodes) and for one expert per rank at any skew (``r = 1``: a token never picks
    an expert twice; without a node limit); an interpolation between them otherwise, held within its physical
    bounds ``1/min(g, k) <= r <= 1``: under skew with several experts a rank it undercounts the hot rank's tokens
    (by ~15% against a Monte Carlo of the routing at zipf s 1, DeepSeek-V3's shape; a review's measurement), which a
    per-layer Monte Carlo of each rank's hits would mend at ~0.3 s a layer.

    Parameters
    ----------
    slots : numpy.ndarray, shape (ep, ep)
        Token choices (slots) EP rank ``i`` sends to EP rank ``j`` (:meth:`LayerRouting.rank_matrix`).
    rank_probs : numpy.ndarray, shape (ep,)
        Probability that one choice goes to each EP rank.
    top_k : int
    node_of : sequence of int
        Node of each EP member; every node must hold the same number of members.
    max_nodes : int, optional
        Most nodes one token's experts lie on (``None``: unlimited).
    experts_per_rank : int, optional
        Experts on each EP rank: a token's choices are distinct experts (above). ``None``: independent choices.

    Returns
    -------
    (first, forward) : numpy.ndarray, shape (ep, ep)
        ``first[i, j]``: tokens ``i`` sends to ``j`` directly (NVLink inside its node, RDMA to its
        same-index peer on another node); ``forward[f, g]``: tokens forwarder ``f`` relays to ``g`` on its node.

    Examples
    --------
    >>> first, fwd = deepep_matrices(np.full((4, 4), 4.0), np.full(4, 0.25), 2, [0, 0, 1, 1])
    >>> first[0].tolist()   # itself and its node-mate: 4 choices x r = (1 - 0.75^2)/0.5 = 0.875; node 1: 8 x 0.75
    [3.5, 3.5, 6.0, 0.0]
    >>> fwd[2].tolist()     # rank 2 relays rank 0's tokens for rank 3
    [0.0, 0.0, 0.0, 3.5]
    """
    ep = len(node_of)
    nodes = sorted(set(node_of))
    members = {n: [j for j in range(ep) if node_of[j] == n] for n in nodes}
    if len({len(m) for m in members.values()}) != 1:
        raise ConfigError("moe.dispatch: deepep needs the same number of EP ranks on every node of an EP group "
                          f"(got {', '.join(str(len(members[n])) for n in nodes)} per node)")
    local = {j: members[node_of[j]].index(j) for j in range(ep)}

    def ratio(p: np.ndarray, group: int | None) -> np.ndarray:
        """Distinct tokens per choice for groups of ``group`` experts taking the shares ``p`` of the choices."""
        p = np.asarray(p, dtype=float)
        out = np.ones_like(p)
        nz = p > 0
        if group is None:
            miss = (1.0 - p[nz]) ** top_k
        else:
            pool = group / p[nz]
            miss = np.ones_like(pool)
            for i in range(top_k):
                miss *= np.clip((pool - group - i) / np.maximum(pool - i, 1e-300), 0.0, 1.0)
        out[nz] = (1.0 - miss) / (top_k * p[nz])
        if group is not None:  # (a token puts at most min(g, k) of its choices on g experts: r >= 1/min(g, k))
            out = np.clip(out, 1.0 / min(group, top_k), 1.0)
        return out

    slots = np.asarray(slots, dtype=float)
    rank_probs = np.asarray(rank_probs, dtype=float)
    node_p = np.array([rank_probs[members[n]].sum() for n in nodes])
    if max_nodes is not None and max_nodes < len(nodes):
        share = node_limited_shares(node_p, max_nodes)
        scale = np.divide(share, node_p, out=np.zeros_like(share), where=node_p > 0)
        rank_probs = rank_probs * scale[[nodes.index(node_of[j]) for j in range(ep)]]
        node_p = share
    per_node = None if experts_per_rank is None else experts_per_rank * len(members[nodes[0]])
    per_rank = slots * ratio(rank_probs, experts_per_rank)[None, :]           # distinct tokens i -> j
    node_tokens = (np.stack([slots[:, members[n]].sum(axis=1) for n in nodes], axis=1)
                   * ratio(node_p, per_node)[None, :])
    first = np.zeros((ep, ep))
    forward = np.zeros((ep, ep))
    for i in range(ep):
        for k, n in enumerate(nodes):
            if n == node_of[i]:
                first[i, members[n]] = per_rank[i, members[n]]
                continue
            f = members[n][local[i]]
            first[i, f] = node_tokens[i, k]
            for g in members[n]:
                if g != f:
                    forward[f, g] += per_rank[i, g]
    return first, forward


def routing_from_dict(section: dict | None) -> RoutingModel:
    """Build a :class:`RoutingModel` from the experiment file's ``moe:`` section (strict keys)."""
    section = dict(section or {})
    valid = ("routing", "zipf_s", "expert_load", "capacity_factor", "seed", "draw", "pad_to_capacity", "dispatch",
             "shared_expert_overlap", "max_nodes")
    unknown = unknown_keys(section, valid)
    if unknown:
        raise ConfigError(f"moe.{unknown[0]}: unknown field; valid fields: {', '.join(valid)}")
    load = section.get("expert_load")
    if load is not None and (isinstance(load, str) or not isinstance(load, Sequence)):
        raise ConfigError(f"moe.expert_load: must be a list of numbers, got {load!r}")
    return RoutingModel(kind=section.get("routing", "uniform"), zipf_s=section.get("zipf_s", 1.0),
                        expert_load=tuple(load) if load is not None else None,
                        capacity_factor=section.get("capacity_factor"), seed=section.get("seed", 0),
                        draw=section.get("draw", "micro_batch"),
                        pad_to_capacity=section.get("pad_to_capacity", False),
                        dispatch=section.get("dispatch", "all_to_all"),
                        shared_expert_overlap=section.get("shared_expert_overlap", False),
                        max_nodes=section.get("max_nodes"))
