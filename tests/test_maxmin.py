"""Max-min fairness on hand-worked cases (independent of the engine)."""

import numpy as np
import pytest

from simulator.maxmin import max_min_rates


def rates(paths, capacity):
    flow = np.array([f for f, p in enumerate(paths) for _ in p], dtype=np.int64)
    link = np.array([l for p in paths for l in p], dtype=np.int64)
    return max_min_rates(flow, link, np.asarray(capacity, dtype=float), len(paths))


def test_two_flows_on_one_link_get_half_each():
    np.testing.assert_allclose(rates([[0], [0]], [10.0]), [5.0, 5.0])


def test_classic_three_link_example():
    # One long flow crosses links 0,1,2 (capacity 1 each); a short flow on link 0 and one on link 1.
    # Links 0 and 1 each have two flows: every flow gets 1/2, link 2 is left half idle.
    np.testing.assert_allclose(rates([[0, 1, 2], [0], [1]], [1, 1, 1]), [0.5, 0.5, 0.5])


def test_unequal_capacities_redistribute_leftover():
    # Flow A crosses links 0 (cap 1) and 1 (cap 10); flow B only link 1.
    # A is held to 1 by link 0; B takes the remaining 9 of link 1.
    np.testing.assert_allclose(rates([[0, 1], [1]], [1, 10]), [1.0, 9.0])


def test_multi_level_bottlenecks():
    # Link 0 (cap 3) shared by A, B, C; link 1 (cap 1) also crossed by C and D.
    # Link 1 saturates first at 0.5 (C, D); then A, B share 3 - 0.5 = 2.5 → 1.25 each.
    np.testing.assert_allclose(rates([[0], [0], [0, 1], [1]], [3, 1]), [1.25, 1.25, 0.5, 0.5])


def test_flow_crossing_a_link_twice_counts_twice():
    # A ring flow crossing link 0 twice and a plain flow: 2a + b = 10 with a = b.
    np.testing.assert_allclose(rates([[0, 0], [0]], [10.0]), [10 / 3, 10 / 3])


def test_flow_without_links_is_unbounded():
    r = rates([[], [0]], [4.0])
    assert r[0] == np.inf and r[1] == pytest.approx(4.0)


@pytest.mark.parametrize("seed", range(5))
def test_random_allocations_are_feasible_and_bottlenecked(seed):
    rng = np.random.default_rng(seed)
    num_links, num_flows = 12, 30
    cap = rng.uniform(1, 10, num_links)
    paths = [list(rng.choice(num_links, size=rng.integers(1, 5), replace=False)) for _ in range(num_flows)]
    r = rates(paths, cap)
    load = np.zeros(num_links)
    for f, p in enumerate(paths):
        load[p] += r[f]
    assert np.all(load <= cap * (1 + 1e-9))
    # Max-min optimality: every flow crosses a saturated link on which it has the largest rate.
    for f, p in enumerate(paths):
        assert any(load[l] >= cap[l] * (1 - 1e-9) and r[f] >= max(r[g] for g, q in enumerate(paths) if l in q) - 1e-9
                   for l in p)
