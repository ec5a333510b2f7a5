"""Fixes of the Python-API audit 23: bad input refused at the call with one line naming the argument, numpy
scalars taken wherever a Python number is, the builders' GPU cap, and ``save_plots`` on a run without bars."""

import time

import numpy as np
import pytest

from simulator import Engine, simulate
from simulator.sweeps.driver import sweep
from topologies import (
    TopologyError,
    build_cluster,
    cluster_to_dict,
    cluster_to_yaml,
    fat_tree,
    leaf_spine,
    load_cluster,
    parse_bandwidth,
    parse_bytes,
    parse_time,
    rail_optimized,
    single_server,
)
from topologies.builders import MAX_GPUS
from topologies.loader import MAX_GPUS as LOADER_MAX_GPUS
from workloads.ops import OpGraph, OpGraphError

DEMO = "examples/demo.yaml"


# ------------------------------------------------------------ 1. traffic_class and stream refused at the call
@pytest.mark.parametrize("bad", [None, 5, "", b"dp"])
@pytest.mark.parametrize("field", ["traffic_class", "stream"])
def test_op_builders_refuse_a_traffic_class_or_stream_that_is_not_a_non_empty_string(field, bad):
    g = OpGraph(4)
    calls = [lambda: g.collective("all_reduce", range(4), 2**20, **{field: bad}),
             lambda: g.collective_op(0, "all_reduce", range(4), 2**20, **{field: bad}),
             lambda: g.compute(0, 1e9, **{field: bad}),
             lambda: g.send(0, 1, 1e6, **{field: bad}),
             lambda: g.recv(1, 0, 1e6, **{field: bad})]
    for call in calls:
        with pytest.raises(OpGraphError) as e:
            call()
        message = str(e.value)
        assert message.startswith(f"{field}: must be a non-empty string") and repr(bad) in message
        assert "\n" not in message
    assert len(g) == 0  # nothing half-added
    g.collective("all_reduce", range(4), 2**20, traffic_class="weird", stream="mine")  # a custom name is fine
    op = g.ops[g.compute(0, 1e9, traffic_class=np.str_("tp"), stream=np.str_("s"))]  # a str from a DataFrame
    assert (type(op.traffic_class), type(op.stream)) == (str, str) and (op.traffic_class, op.stream) == ("tp", "s")
    assert simulate(g, single_server("H100", 4)).summary["step_time_s"] > 0


# ------------------------------------------------------------ 2. the builders' GPU cap, before building
@pytest.mark.parametrize("build", [leaf_spine, rail_optimized, fat_tree])
def test_scale_out_builders_refuse_more_gpus_than_the_loader_fast(build):
    assert MAX_GPUS is LOADER_MAX_GPUS  # one constant
    start = time.perf_counter()
    with pytest.raises(TopologyError) as e:
        build("H100", 10**12)  # built, it hung while memory grew
    assert time.perf_counter() - start < 1.0
    assert str(e.value) == (f"servers: {10**12} servers x 8 GPUs = {8 * 10**12:,} GPUs exceeds the supported "
                            f"{MAX_GPUS:,}; use fewer servers")


def test_single_server_refuses_more_gpus_than_the_loader_fast():
    start = time.perf_counter()
    with pytest.raises(TopologyError) as e:
        single_server("H100", 10**9)  # built, it ran out of memory
    assert time.perf_counter() - start < 1.0
    assert str(e.value).startswith("gpus_per_server: ")
    assert f"= {10**9:,} GPUs exceeds the supported {MAX_GPUS:,}" in str(e.value)
    with pytest.raises(TopologyError, match="exceeds the supported 262,144"):
        single_server("H100", MAX_GPUS + 1)  # the first count refused
    # the loader still says it in its own field's words
    with pytest.raises(TopologyError, match=r"^cluster\.nodes: 1 nodes x 1000000000 GPUs = 1,000,000,000 GPUs "
                                            r"exceeds the supported 262,144; use fewer nodes$"):
        build_cluster({"preset": "dgx-h100", "nodes": 1, "gpus_per_node": 10**9})


# ------------------------------------------------------------ 3. numpy scalars taken as Python numbers
def test_unit_parsers_take_numpy_scalars_as_python_numbers():
    assert parse_bytes(np.int64(5)) == parse_bytes(5) == 5.0
    assert parse_bytes(np.float32(1024)) == 1024.0
    assert parse_bandwidth(np.float32(5e10)) == parse_bandwidth(float(np.float32(5e10)))
    assert parse_bandwidth(np.int64(50_000_000_000)) == 5e10
    assert parse_time(np.float64(2e-6)) == parse_time(2e-6)
    assert parse_time(np.int32(0)) == 0.0
    with pytest.raises(TopologyError, match=r"^size: np\.True_ is not a byte size"):
        parse_bytes(np.bool_(True))  # a bool is no number, numpy's neither
    with pytest.raises(TopologyError, match=r"^size: True is not a byte size"):
        parse_bytes(True)


def _same_cluster(a, b):
    assert a.name == b.name and a.params == b.params
    assert sorted(a.graph.edges(data=True), key=repr) == sorted(b.graph.edges(data=True), key=repr)


def test_builders_and_build_cluster_take_numpy_ratios_and_bandwidths():
    plain = leaf_spine("H100", 4, servers_per_leaf=2, oversubscription=2, nic_bandwidth=50_000_000_000)
    _same_cluster(leaf_spine("H100", np.int64(4), servers_per_leaf=np.int64(2), oversubscription=np.int64(2),
                             nic_bandwidth=np.int64(50_000_000_000)), plain)
    _same_cluster(fat_tree("H100", 8, servers_per_leaf=2, leaves_per_pod=2, spines=2, cores=4,
                           core_oversubscription=np.float32(2.0)),
                  fat_tree("H100", 8, servers_per_leaf=2, leaves_per_pod=2, spines=2, cores=4,
                           core_oversubscription=2.0))
    doc = {"preset": "dgx-h100", "nodes": 4, "nodes_per_leaf": 2, "oversubscription": 2,
           "core_oversubscription": 1, "nic_bandwidth": 50_000_000_000}
    numpy_doc = {"preset": "dgx-h100", "nodes": np.int64(4), "nodes_per_leaf": np.int64(2),
                 "oversubscription": np.int64(2), "core_oversubscription": np.float32(1),
                 "nic_bandwidth": np.int64(50_000_000_000)}
    _same_cluster(build_cluster(numpy_doc), build_cluster(doc))
    with pytest.raises(TopologyError, match=r"^oversubscription: np\.True_ is not a number >= 1"):
        leaf_spine("H100", 4, servers_per_leaf=2, oversubscription=np.bool_(True))
    with pytest.raises(TopologyError, match=r"^cluster\.oversubscription: np\.float64\(0\.5\) is not a ratio >= 1"):
        build_cluster({**doc, "oversubscription": np.float64(0.5)})


def test_topology_document_takes_numpy_bandwidths():
    doc = {"gpu": "H100", "nodes": ["gpu:0:0", "gpu:0:1", "nvswitch:0"],
           "links": [{"a": "gpu:0:0", "b": "nvswitch:0", "bandwidth": 450e9, "latency": 1e-6},
                     {"a": "gpu:0:1", "b": "nvswitch:0", "bandwidth": 450e9, "latency": 1e-6}]}
    plain = build_cluster(doc)
    for link in doc["links"]:
        link["bandwidth"], link["latency"] = np.float32(450e9), np.float64(1e-6)
    numpy_cluster = build_cluster(doc)
    assert numpy_cluster.graph.number_of_edges() == plain.graph.number_of_edges()
    assert ({d["bandwidth"] for *_, d in numpy_cluster.graph.edges(data=True)}
            == {float(np.float32(450e9))})


def test_engine_takes_numpy_ranks_in_slowdown_and_rank_compute():
    cluster = single_server("H100", 2)

    def graph():
        g = OpGraph(2)
        g.compute(0, duration_s=1e-3, category="fixed")
        g.compute(1, duration_s=1e-3, category="fixed")
        return g

    plain = Engine(graph(), cluster, slowdown={1: 2.0}).run()
    numpy_run = Engine(graph(), cluster, slowdown={np.int64(1): np.float64(2.0)}).run()
    assert numpy_run.step_time_s == plain.step_time_s == pytest.approx(2e-3)
    engine = Engine(graph(), cluster, slowdown={np.int64(1): 2.0})
    assert [type(r) for r in engine.slowdown] == [int]
    from simulator.compute import ComputeModel
    engine = Engine(graph(), cluster, rank_compute={np.int32(0): ComputeModel(cluster.gpu)})
    assert [type(r) for r in engine.rank_compute] == [int]
    with pytest.raises(ValueError, match=r"^slowdown: np\.int64\(2\) is not a rank of this graph \(0\.\.1\)$"):
        Engine(graph(), cluster, slowdown={np.int64(2): 2.0})
    with pytest.raises(ValueError, match=r"^rank_compute: np\.True_ is not a rank"):
        Engine(graph(), cluster, rank_compute={np.bool_(True): ComputeModel(cluster.gpu)})


def test_sweep_takes_a_numpy_jobs_count():
    grid = {"parallel.tp": [2]}
    plain = sweep(DEMO, grid, jobs=1, progress=False)
    numpy_table = sweep(DEMO, grid, jobs=np.int64(1), progress=False)
    assert numpy_table.drop(columns=[c for c in numpy_table if "wall" in c]).equals(
        plain.drop(columns=[c for c in plain if "wall" in c]))
    with pytest.raises(ValueError, match=r"^jobs: must be an integer >= 1 .*got np\.int64\(0\)$"):
        sweep(DEMO, grid, jobs=np.int64(0), progress=False)
    with pytest.raises(ValueError, match=r"^jobs: must be an integer >= 1 .*got np\.True_$"):
        sweep(DEMO, grid, jobs=np.bool_(True), progress=False)


# ------------------------------------------------------------ 5. save_plots without bars
@pytest.mark.parametrize("make", ["compute", "collective"])
def test_save_plots_skips_the_timeline_when_every_op_takes_no_time(tmp_path, make):
    if make == "compute":
        g = OpGraph(1)
        g.compute(0, duration_s=0.0, category="fixed")
        cluster = single_server("H100", 1)
    else:
        g = OpGraph(4)
        g.collective("all_reduce", range(4), 0)
        cluster = single_server("H100", 4)
    result = simulate(g, cluster)
    assert result.timeline().empty
    written = result.save_plots(str(tmp_path / "figs"))
    names = {p.rsplit("/", 1)[-1] for p in written}
    assert "timeline.png" not in names and "tier_bandwidth.png" in names
    # a run with bars still draws its timeline
    g = OpGraph(1)
    g.compute(0, duration_s=1e-3, category="fixed")
    assert "timeline.png" in {p.rsplit("/", 1)[-1] for p in
                              simulate(g, single_server("H100", 1)).save_plots(str(tmp_path / "figs2"))}


# ------------------------------------------------------------ 6. None for a cluster or a path
@pytest.mark.parametrize("export", [cluster_to_dict, cluster_to_yaml])
def test_cluster_export_refuses_what_is_not_a_cluster_in_one_line(export):
    for bad in (None, 5, "dgx-h100"):
        with pytest.raises(TypeError) as e:
            export(bad)
        message = str(e.value)
        assert message.startswith(f"cluster: must be a Cluster (topologies.build_cluster), got "
                                  f"{type(bad).__name__}") and "\n" not in message


def test_load_cluster_refuses_what_is_not_a_path_in_one_line():
    for bad in (None, 5, ["a.yaml"]):
        with pytest.raises(TypeError) as e:
            load_cluster(bad)
        assert str(e.value).startswith(f"path: must be a file path (str or os.PathLike), got "
                                       f"{type(bad).__name__}")


@pytest.mark.parametrize("build", [
    lambda: __import__("topologies").leaf_spine("H100", 2, servers_per_leaf=1, spines=10**12),
    lambda: __import__("topologies").fat_tree("H100", 4, servers_per_leaf=1, spines=2, cores=10**12),
    lambda: __import__("topologies").leaf_spine("H100", 2, servers_per_leaf=10**9),
    lambda: __import__("topologies").leaf_spine("H100", 32768, servers_per_leaf=1, spines=65536),
])
def test_builders_refuse_more_switches_than_supported_before_building(build):
    """The GPU count was capped; a tier's switch count was not: spines=10**12 built switches until memory ran out
    (found by the API hunt). The loader's cap, now the builders' too, refuses it at once."""
    import time

    from topologies.cluster import TopologyError
    start = time.perf_counter()
    with pytest.raises(TopologyError, match="exceeds the supported (65,536|16,777,216)"):
        build()
    assert time.perf_counter() - start < 1.0
