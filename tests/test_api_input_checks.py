"""The Python API refuses bad input where it is given, with a one-line error naming the argument (a probe of the
API as a capacity-planning script uses it found each of these accepted silently, or failing deep inside with
a TypeError, IndexError or ZeroDivisionError, or giving a wrong number)."""

from __future__ import annotations

import numpy as np
import pytest

from simulator import simulate
from simulator.engine import Engine
from simulator.fabric import NetworkConfig
from simulator.validation import validate_against_published
from topologies import single_server
from workloads.ops import Kernel, OpGraph, OpGraphError


@pytest.fixture(scope="module")
def node():
    return single_server("H100", 8)


def test_an_engine_runs_once(node):
    # A second run went on from the first one's clock: one 1 ms op read 0.001 s, then 0.002 s.
    g = OpGraph(2)
    g.compute(0, duration_s=1e-3, category="fixed")
    engine = Engine(g, node)
    assert engine.run().step_time_s == pytest.approx(1e-3)
    with pytest.raises(RuntimeError, match="make a new Engine"):
        engine.run()
    assert Engine(g, node).run().step_time_s == pytest.approx(1e-3)  # a new one gives the same


@pytest.mark.parametrize("tag", [1.2, "x", None, True])
def test_a_tag_that_is_not_an_integer_is_refused(tag):
    # int(1.2) == int(1.9): two streams meant to be apart matched each other.
    g = OpGraph(2)
    with pytest.raises(OpGraphError, match=r"^tag: must be an integer"):
        g.send(0, 1, 100, tag=tag)


def test_numpy_integers_stay_valid_tags_and_deps():
    g = OpGraph(2)
    a = g.compute(0, 1e9)
    g.send(0, 1, 10, deps=[np.int64(a)], tag=np.int64(3))
    assert g.ops[-1].tag == 3


@pytest.mark.parametrize("deps, words", [([0.0], "op ids are integers"), (["0"], "op ids are integers"),
                                         ([None], "op ids are integers"), (3, "must be op ids")])
def test_bad_deps_are_refused_when_the_op_is_built(deps, words):
    g = OpGraph(2)
    g.compute(0, 1e9)
    with pytest.raises(OpGraphError, match=words):
        g.compute(1, 1e9, deps=deps)


@pytest.mark.parametrize("kwargs, words", [
    ({"parts": [Kernel("bogus_category", 1e12, 0)]}, "kernel category 'bogus_category' unknown"),
    ({"parts": [Kernel("fixed", 1e12, 0)]}, "kernel category 'fixed' unknown"),
    ({"category": "fixed"}, "takes its time from duration_s"),
    ({"shape": (0, 0, 0)}, "shape must be three positive numbers"),
    ({"shape": (-5, 10, 10)}, "shape must be three positive numbers"),
    ({"shape": "abc"}, "shape must be three positive numbers"),
    ({"parts": [Kernel("gemm", 1e9, 1e6, shape=(0, 0, 0))]}, "shape must be three positive numbers"),
    ({"parts": [Kernel("gemm", 1e9, 1e6, batch=0)]}, "batch must be an integer >= 1"),
])
def test_a_kernel_the_hardware_model_cannot_time_is_refused(kwargs, words):
    # An unknown kernel category was timed by the roofline as if it were another; a zero shape divided by zero
    # in the wave model once simulated.
    g = OpGraph(2)
    with pytest.raises(OpGraphError, match=words):
        g.compute(0, 1e12, **kwargs)


@pytest.mark.parametrize("group, deps, words", [
    ([0, 1], [0], "deps: maps a member rank"),
    ([0, 1], {5: [0]}, "rank 5 is not a member"),
    (None, None, "group: must be a non-empty list"),
    (0, None, "group: must be a non-empty list"),
    ([], None, "got an empty one"),
])
def test_collective_arguments(group, deps, words):
    g = OpGraph(8)
    g.compute(0, 1e9)
    with pytest.raises(OpGraphError, match=words):
        g.collective("all_reduce", group, 1e6, deps=deps)


@pytest.mark.parametrize("kwargs, error, words", [
    ({"compute": "x"}, TypeError, "compute: must be a ComputeModel"),
    ({"network": "x"}, TypeError, "network: must be a NetworkConfig"),
    ({"slowdown": {99: 2.0}}, ValueError, "slowdown: 99 is not a rank"),
    ({"slowdown": {"a": 2.0}}, ValueError, "slowdown: 'a' is not a rank"),
    ({"rank_compute": {0: "x"}}, TypeError, r"rank_compute\[0\]: must be a ComputeModel"),
])
def test_engine_arguments(node, kwargs, error, words):
    g = OpGraph(2)
    g.compute(0, 1e12)
    with pytest.raises(error, match=words):
        Engine(g, node, **kwargs)


@pytest.mark.parametrize("seed", ["x", None, 1.5, True])
def test_network_seed_is_an_integer(seed):
    with pytest.raises(ValueError, match=r"^network\.seed: must be an integer"):
        NetworkConfig(seed=seed)


def test_simulate_still_takes_what_it_documents(node):
    g = OpGraph(2)
    a = g.compute(0, 1e12)
    g.send(0, 1, 1e6, deps=[a])
    g.recv(1, 0, 1e6)
    # a numpy integer seed is the same seed as the int
    assert (simulate(g, node, network=NetworkConfig(seed=np.int64(3))).step_time
            == simulate(g, node, network=NetworkConfig(seed=3)).step_time > 0)


@pytest.mark.parametrize("kwargs, words", [
    ({"max_gpus": "8"}, "max_gpus: must be an integer >= 1"),
    ({"max_gpus": 0}, "max_gpus: must be an integer >= 1"),
    ({"max_gpus": float("nan")}, "max_gpus: must be an integer >= 1"),
    ({"names": 3}, "names: an entry's name or a list"),
    ({"names": "korthikanti22-22b", "progress": 3}, "progress: must be a callable"),
])
def test_validate_against_published_arguments_are_checked_before_simulating(kwargs, words):
    with pytest.raises(ValueError, match=words):
        validate_against_published(**kwargs)


DEMO = {"cluster": {"preset": "dgx-h100", "nodes": 1}, "model": {"preset": "tiny"},
        "parallel": {"tp": 2, "pp": 1, "dp": 4, "micro_batch": 1, "global_batch": 8}, "training": {"seq_len": 128}}


@pytest.mark.parametrize("kwargs, words", [
    ({"grid": [1, 2]}, "grid: must map dotted paths"),
    ({"grid": {"parallel.tp": [1, 2]}, "jobs": "x"}, "jobs: must be an integer >= 1"),
    ({"grid": {"parallel.tp": [1, 2]}, "jobs": -1}, "jobs: must be an integer >= 1"),
    ({"grid": {"parallel.tp": [1, 2]}, "on_start": 3}, "on_start: must be a callable"),
])
def test_sweep_arguments_are_checked_before_any_point(kwargs, words):
    from simulator.sweeps import sweep
    with pytest.raises(ValueError, match=words):
        sweep(DEMO, progress=False, **kwargs)


def test_grad_dtype_bytes_true_is_not_one_byte():
    # True == 1 in Python: the gradients' memory read a quarter of its fp32 size.
    from simulator.experiment import experiment_from_dict
    with pytest.raises(ValueError, match=r"options\.grad_dtype_bytes: must be 1, 2 or 4, got True"):
        experiment_from_dict({**DEMO, "options": {"grad_dtype_bytes": True}})
    assert experiment_from_dict({**DEMO, "options": {"grad_dtype_bytes": 2}}).options.grad_dtype_bytes == 2


@pytest.mark.parametrize("replicas, words", [
    ({0: (0, 1), 1: (1, 0)}, "rank 0 is stood for by two representatives"),
    ("x", "replicas: must map a representative rank"),
    ({0: (0, 20), 1: (1, 21)}, "20 is not a rank of this graph"),
    ({0: (1, 2)}, r"replicas\[0\]: must be a tuple of distinct ranks holding 0 itself"),
    ({0: (0, 2, 4), 1: (1, 3)}, "stand for unequal numbers of ranks"),
])
def test_graph_replicas_are_checked(node, replicas, words):
    # Two ranks standing for each other gave a number; out-of-range or unequal sets an IndexError deep inside.
    g = OpGraph(8)
    g.collective("all_reduce", [0, 1], 1e6)
    g.replicas = replicas
    with pytest.raises(OpGraphError, match=words):
        Engine(g, node).run()


@pytest.mark.parametrize("parts, words", [([], "non-empty list"), ([(OpGraph(2), "1")], r"parts\[0\]: must be"),
                                          ([("x", 0)], r"parts\[0\]: must be")])
def test_merge_graphs_arguments(parts, words):
    from workloads.ops import merge_graphs
    with pytest.raises(OpGraphError, match=words):
        merge_graphs(parts)


def test_a_cluster_given_to_experiment_from_dict_must_be_a_cluster():
    from simulator.experiment import experiment_from_dict
    doc = {k: v for k, v in DEMO.items() if k != "cluster"}
    with pytest.raises(TypeError, match="cluster: must be a Cluster"):
        experiment_from_dict(doc, cluster="x")


def test_run_jobs_takes_a_jobs_spec():
    from simulator.jobs import run_jobs
    with pytest.raises(TypeError, match="spec: must be a JobsSpec"):
        run_jobs(None)
