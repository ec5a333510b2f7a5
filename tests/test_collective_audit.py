"""A helper's hunt over ``clustersim collective`` (2026-12-04): a forced tree all-reduce runs the protocol NCCL's
tuner prices for it, off the ring's bandwidth (``NCCL_ALGO=Tree`` narrows the algorithms, not the pricing), so
it agrees with ``auto`` wherever ``auto`` picks the tree."""

from __future__ import annotations

import pytest

from simulator.bench import collective_time
from simulator.cli import resolve_cluster
from simulator.fabric import Fabric


@pytest.mark.parametrize("gpus", [16, 24, 128])
@pytest.mark.parametrize("size", [2**20, 2**21, 2**22])
def test_a_forced_tree_runs_the_protocol_auto_gives_the_tree(gpus, size):
    # Before: the forced tree chose its protocol by the plain LL/LL128/Simple factors (LL at 1 MiB over 16 GPUs,
    # 47.9 us) where NCCL's tuner, pricing the tree off the ring, picks LL128 (57.5 us, what auto ran).
    import simpy

    cluster = resolve_cluster(None, gpus)
    fabric = Fabric(simpy.Environment(), cluster)
    group = tuple(range(gpus))
    auto_plan, auto_protocol = fabric.choose("all_reduce", group, size, "auto")
    tree_plan, tree_protocol = fabric.choose("all_reduce", group, size, "tree")
    assert auto_plan.algorithm == "tree"  # (at these sizes and GPU counts: else the case compares nothing)
    assert tree_plan.algorithm == "tree" and tree_protocol == auto_protocol
    assert collective_time(cluster, "all_reduce", gpus, size, "tree") == collective_time(
        cluster, "all_reduce", gpus, size, "auto")
    if (gpus, size) == (16, 2**20):
        assert tree_protocol == "LL128"  # (the plain factors had picked LL)



def test_an_algorithm_that_does_not_implement_the_op_names_the_option(capsys):
    from simulator.cli import main
    assert main(["collective", "--op", "all_reduce", "--algo", "direct"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("clustersim: error: --algo: direct does not implement all_reduce; valid for all_reduce: ")
    assert err.count("\n") == 1


def test_the_table_says_what_size_is_and_which_network_model_ran(tmp_path, capsys):
    from simulator.cli import main
    assert main(["collective", "--gpus", "8", "--min-size", "1MiB", "--max-size", "1MiB"]) == 0
    assert "size: the whole buffer, as nccl-tests prints it" in capsys.readouterr().out
    (tmp_path / "a.yaml").write_text("cluster: {preset: dgx-h100, nodes: 2}\nnetwork: {model: analytic}\n")
    assert main(["collective", "--gpus", "16", "--cluster", str(tmp_path / "a.yaml"), "--min-size", "1MiB",
                 "--max-size", "1MiB"]) == 0
    assert ", network model analytic (no contention)" in capsys.readouterr().out


def test_the_network_post_overhead_floors_a_rings_intra_server_steps_only():
    # NCCL's tuning.cc applies intraLat = max(intraLat, netOverhead) in its ring branch ("Inter-node rings still
    # have to launch nsteps * net overhead"); the tree's formula keeps the NVLink hop latency. Its numbers
    # (us): NVLink hwLat ring LL 0.6, LL128 1.9, Simple 3.4; tree LL 0.6, LL128 1.25, Simple 4.0; netOverhead
    # 1.0, x3 for Simple.
    from simulator.nccl import step_latencies
    expected = {  # protocol -> (tree across servers, ring across servers, ring inside one server)
        "LL": (0.6, 1.0, 0.6), "LL128": (1.25, 1.9, 1.9), "Simple": (4.0, 3.4, 3.4)}
    for protocol, (tree, ring_across, ring_inside) in expected.items():
        assert step_latencies("tree", protocol, True)[1] == pytest.approx(tree * 1e-6, rel=1e-12)
        assert step_latencies("ring", protocol, True)[1] == pytest.approx(ring_across * 1e-6, rel=1e-12)
        assert step_latencies("ring", protocol, False)[1] == pytest.approx(ring_inside * 1e-6, rel=1e-12)
