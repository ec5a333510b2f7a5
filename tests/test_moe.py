"""MoE routing: hand-worked capacity drops, seeded determinism, skew."""

import numpy as np
import pytest

from workloads.errors import ConfigError
from workloads.moe import RoutingModel, _apply_capacity, route_layer, routing_from_dict


def test_capacity_drops_match_a_hand_worked_example():
    # 2 EP ranks x 2 experts; rank 0 routes 6 choices to expert 0 and 2 to expert 1, rank 1 routes 4 and 4.
    # Capacity factor 1: 16 choices / 2 experts = 8 slots each. Expert 0 gets 10 -> 2 dropped,
    # kept in proportion 6:4 of 8 = 4.8 : 3.2 -> largest remainder gives 5 : 3. Expert 1 (6) keeps all.
    kept = _apply_capacity(np.array([[6, 2], [4, 4]]), capacity=8)
    assert kept.tolist() == [[5, 2], [3, 4]]
    assert kept.sum() == 14


def test_route_layer_counts_and_drops():
    r = route_layer(4, 1, 100, 2, RoutingModel("custom", expert_load=(5, 1, 1, 1), capacity_factor=1.0, seed=3))
    assert r.choices.sum() == 200                          # every token choice accounted for
    assert r.capacity == pytest.approx(1.0 * 200 / 4)      # GShard: c * tokens * k / E
    assert (r.expert_load <= 50).all()
    assert r.dropped == r.choices.sum() - r.kept.sum() == int(max(0, r.choices[:, 0].sum() - 50)
                                                               + sum(max(0, r.choices[:, e].sum() - 50)
                                                                     for e in (1, 2, 3)))


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
