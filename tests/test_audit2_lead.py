"""Defects found by the second new-user audit (fabrics, plan, sweeps, CLI), each with its reproducer."""

import copy

import pytest
import yaml

from topologies.bisection import bisection_bandwidth
from topologies.capacity import plan_summary
from topologies.custom import cluster_from_dict


def _two_racks():
    with open("examples/fabrics/two-racks.yaml") as f:
        return yaml.safe_load(f)


def test_plan_cache_tells_apart_two_fabrics_of_one_name_and_size_wired_differently():
    """Moving a NIC to the other rack (and one back) keeps the name, node and edge counts and the total
    bandwidth; the cache keyed on those gave the first fabric's bisection for the second."""
    base = _two_racks()
    moved = copy.deepcopy(base)
    for link in moved["links"]:
        if link["a"] == "nic:1:0" and link["b"] == "rack-a":
            link["b"] = "rack-b"
        elif link["a"] == "nic:2:0" and link["b"] == "rack-b":
            link["b"] = "rack-a"
    a, b = cluster_from_dict(base), cluster_from_dict(moved)
    assert (a.name, a.graph.number_of_edges()) == (b.name, b.graph.number_of_edges())
    for c in (a, b, a, b):  # each twice: the cached answer is each fabric's own
        assert plan_summary(c)["bisection_bytes_s"] == pytest.approx(bisection_bandwidth(c), rel=1e-12)
    assert bisection_bandwidth(a) != bisection_bandwidth(b)
