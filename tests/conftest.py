"""Shared fixtures: small clusters built by the real topology builders."""

import pytest

from topologies import leaf_spine, single_server


@pytest.fixture
def node8():
    """One 8-GPU H100 server: NVLink 450 GB/s per direction, 0.25 us per hop."""
    return single_server("H100-SXM", 8)


@pytest.fixture
def two_leaves():
    """4 DGX-H100-like servers, 2 per leaf, 2 spines, non-blocking."""
    return leaf_spine("H100-SXM", servers=4, servers_per_leaf=2, spines=2)
