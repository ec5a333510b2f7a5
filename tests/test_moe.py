"""MoE routing: hand-worked capacity drops, seeded determinism, skew."""

import numpy as np
import pytest

from workloads.errors import ConfigError
from workloads.moe import RoutingModel, _apply_capacity, capacity_slots, route_layer, routing_from_dict


def test_capacity_drops_match_a_hand_worked_example():
    # Megatron-Core drops in each rank's router: 2 EP ranks x 2 experts, 4 tokens x top-2 = 8 choices per rank.
    # Capacity factor 1: ceil(8 / 2 * 1) = 4 slots per (source rank, expert). Rank 0 routes 6 and 2 -> keeps
    # 4 and 2 (2 dropped); rank 1 routes 4 and 4 -> keeps both.
    kept = _apply_capacity(np.array([[6, 2], [4, 4]]), capacity=4)
    assert kept.tolist() == [[4, 2], [4, 4]]
    assert kept.sum() == 14
    assert capacity_slots(4, 2, 2, 1.0) == 4 and capacity_slots(4, 2, 2, 1.25) == 5   # ceil(5.0), ceil(5.0)
    assert capacity_slots(5, 1, 2, 1.0) == 3                                        # ceil(2.5)


def test_route_layer_counts_and_drops():
    r = route_layer(4, 1, 100, 2, RoutingModel("custom", expert_load=(5, 1, 1, 1), capacity_factor=1.0, seed=3))
    assert r.choices.sum() == 200                          # every token choice accounted for
    assert r.capacity == 25                                # Megatron get_capacity: ceil(100 * 1 / 4 * 1.0)
    assert (r.kept <= 25).all() and (r.expert_load <= 2 * 25).all()
    assert r.dropped == r.choices.sum() - r.kept.sum() == int(np.maximum(r.choices - 25, 0).sum())


def test_pad_to_capacity_sends_and_computes_full_capacity():
    # Padded: every (source, expert) pair carries ceil(T k / E c) slots, real or padding, whatever was drawn.
    rm = RoutingModel("custom", expert_load=(5, 1, 1, 1), capacity_factor=1.5, pad_to_capacity=True, seed=2)
    r = route_layer(4, 2, 100, 2, rm)
    cap = int(np.ceil(100 * 2 / 4 * 1.5))                  # 75
    assert r.capacity == cap
    assert (r.rank_matrix() == cap * 2).all()              # 2 experts per EP rank
    assert r.dropped == int(np.maximum(r.choices - cap, 0).sum()) > 0
    assert (r.expert_load == 2 * cap).all()
    with pytest.raises(ConfigError, match="moe.pad_to_capacity"):
        RoutingModel(pad_to_capacity=True)


def test_draws_per_micro_batch_are_seeded_and_differ():
    rm = RoutingModel("uniform", seed=4)
    a0, a0_again = route_layer(8, 2, 512, 4, rm, layer=1, micro_batch=0), route_layer(8, 2, 512, 4, rm, 1, 0)
    a1 = route_layer(8, 2, 512, 4, rm, layer=1, micro_batch=1)
    assert (a0.choices == a0_again.choices).all()
    assert (a0.choices != a1.choices).any()
    with pytest.raises(ConfigError, match="moe.draw"):
        RoutingModel(draw="step")
    with pytest.raises(ConfigError, match="moe.dispatch"):
        routing_from_dict({"dispatch": "nvshmem"})


def test_balanced_routing_is_exact_and_uniform_is_noisy_but_unbiased():
    b = route_layer(8, 2, 4096, 4, RoutingModel("balanced"))
    assert (b.rank_matrix() == 4096 * 2 // 4).all() and b.imbalance == 1.0
    u = route_layer(8, 2, 4096, 4, RoutingModel("uniform", seed=1))
    assert u.rank_matrix().sum() == 4 * 4096 * 2
    assert 1.0 <= u.imbalance < 1.05


def test_zipf_is_skewed_and_seeded():
    z1 = route_layer(64, 8, 4096, 8, RoutingModel("zipf", zipf_s=1.0, seed=7), layer=2)
    z2 = route_layer(64, 8, 4096, 8, RoutingModel("zipf", zipf_s=1.0, seed=7), layer=2)
    assert (z1.choices == z2.choices).all()
    assert z1.imbalance > 1.3
    z3 = route_layer(64, 8, 4096, 8, RoutingModel("zipf", zipf_s=1.0, seed=8), layer=2)
    assert (z1.choices != z3.choices).any()


def test_bad_routing_configs_name_the_field():
    with pytest.raises(ConfigError, match="moe.routing"):
        RoutingModel("random")
    with pytest.raises(ConfigError, match="moe.capacity_factor"):
        RoutingModel(capacity_factor=0)
    with pytest.raises(ConfigError, match="moe.expert_load"):
        RoutingModel("custom")
    with pytest.raises(ConfigError, match="moe.bogus"):
        routing_from_dict({"bogus": 1})
    with pytest.raises(ConfigError, match="parallel.ep"):
        route_layer(8, 2, 10, 3, RoutingModel())
