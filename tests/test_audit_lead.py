"""Defects found by a new-user audit (2026-12-02) in the lead's files: each a case that was silently wrong or
a traceback, with the behaviour the project's standards ask for."""

from simulator.experiment import describe_setup, experiment_from_dict


def _exp(nodes: int, oversubscription: float):
    return experiment_from_dict({"cluster": {"preset": "dgx-h100", "nodes": nodes,
                                             "oversubscription": oversubscription},
                                 "model": {"preset": "gpt2-small"}, "parallel": {"tp": 4, "dp": 2 * nodes},
                                 "training": {"seq_len": 512}})


def test_oversubscription_on_one_leaf_is_said_to_have_no_effect():
    """Two DGX nodes sit under one leaf: no uplink exists, so a 4:1 ratio changes nothing, and the summary
    must not call the fabric oversubscribed (it did, while the step time equalled the 1:1 one)."""
    one_leaf = describe_setup(_exp(2, 4))["fabric"]
    assert "4:1 has no effect" in one_leaf and "oversubscribed" not in one_leaf
    assert "non-blocking" in describe_setup(_exp(2, 1))["fabric"]
    assert "4:1 oversubscribed" in describe_setup(_exp(64, 4))["fabric"]  # 4 leaves: the ratio is real


def test_a_bandwidth_with_a_unit_below_one_megabyte_per_second_is_named_as_given():
    """``1bps`` was parsed to 0.125 B/s and then refused downstream as a bare number "with no unit" under a
    field name without its section; now it is refused where it is read, as written, with the floor."""
    import pytest

    from topologies import build_cluster
    from topologies.cluster import TopologyError

    with pytest.raises(TopologyError, match=r"^cluster\.nic_bandwidth: '1bps' is 0\.125 bytes/s; a link needs "
                                            r"at least 1e\+06 bytes/s"):
        build_cluster({"preset": "dgx-h100", "nodes": 2, "nic_bandwidth": "1bps"})
    assert build_cluster({"preset": "dgx-h100", "nodes": 2, "nic_bandwidth": "8Mbps"}).num_gpus == 16


def test_layout_errors_suggest_only_values_that_exist():
    """``tp: 3`` on 16 GPUs suggested "set dp to 2.66667"; virtual_stages that divide no split of the layers
    listed an empty set of valid pp values. Both now say what would work."""
    import pytest

    from workloads.errors import ConfigError

    base = {"cluster": {"preset": "dgx-h100", "nodes": 2}, "model": {"preset": "gpt2-small"},
            "training": {"seq_len": 512}}
    with pytest.raises(ConfigError, match=r"tp\*pp = 3 does not divide 16, so no dp fits") as err:
        experiment_from_dict({**base, "parallel": {"tp": 3, "pp": 1, "dp": 5}})
    assert "2.6" not in str(err.value)
    with pytest.raises(ConfigError, match=r"set dp to 4 or resize"):
        experiment_from_dict({**base, "parallel": {"tp": 4, "pp": 1, "dp": 3}})
    with pytest.raises(ConfigError, match=r"^parallel\.virtual_stages: 5 does not divide model\.layers=12, so no pp "
                                          r"splits it .*; valid virtual_stages: 1, 2, 3, 4, 6, 12 "):
        experiment_from_dict({**base, "parallel": {"tp": 1, "pp": 2, "dp": 8, "schedule": "interleaved",
                                                   "virtual_stages": 5, "micro_batch": 1, "global_batch": 16}})


def test_a_moe_section_on_a_dense_model_is_noted_and_a_wrong_expert_load_refused_at_load_time():
    """A ``moe:`` section on a dense model was silently ignored (now a note: the README's annotated file has
    one), and a custom expert load of the wrong length was found only when the step was built (without the
    file's name)."""
    import pytest

    from simulator.experiment import unused_settings
    from workloads.errors import ConfigError

    dense = {"cluster": {"preset": "dgx-h100", "nodes": 2}, "model": {"preset": "gpt2-small"},
             "parallel": {"tp": 4, "dp": 4}, "training": {"seq_len": 512}}
    assert unused_settings(experiment_from_dict({**dense, "moe": {"routing": "zipf"}})) == [
        "moe: has no effect: model gpt2-small has no experts (model.experts, model.top_k)"]
    moe = {"cluster": {"preset": "dgx-h100", "nodes": 2}, "model": {"preset": "tiny", "experts": 8, "top_k": 2},
           "parallel": {"tp": 1, "pp": 2, "dp": 8, "ep": 4, "micro_batch": 1, "global_batch": 32},
           "training": {"seq_len": 128}}
    with pytest.raises(ConfigError, match=r"^moe\.expert_load: has 2 entries but the model has 8 experts"):
        experiment_from_dict({**moe, "moe": {"routing": "custom", "expert_load": [1, 2]}})
    assert experiment_from_dict({**moe, "moe": {"routing": "custom", "expert_load": [1] * 8}}).model.is_moe


def test_the_python_entry_points_name_a_wrong_argument_type():
    """``load_experiment(3)`` read file descriptor 3; ``simulate(g, "dgx-h100")`` and ``run_experiment(dict)``
    failed deep inside with an AttributeError."""
    import pytest

    from simulator import simulate
    from simulator.experiment import load_experiment, run_experiment
    from workloads.ops import OpGraph

    with pytest.raises(TypeError, match=r"^experiment file: must be a path .*got int 3"):
        load_experiment(3)
    with pytest.raises(TypeError, match=r"^run_experiment: needs an Experiment .*got dict"):
        run_experiment({"cluster": {}})
    g = OpGraph(2)
    g.compute(0, duration_s=1e-3, category="fixed")
    with pytest.raises(TypeError, match=r"^cluster: must be a Cluster .*got str 'dgx-h100'"):
        simulate(g, "dgx-h100")
    with pytest.raises(TypeError, match=r"^graph: must be an OpGraph"):
        simulate([], "dgx-h100")


def test_op_graph_builders_refuse_non_finite_sizes_and_non_integer_ranks():
    """An infinite FLOP count made the network loop forever; NaN made the step time NaN or a deadlock with no
    reason; a fractional rank or world size was taken. Each is now a one-line OpGraphError naming the field."""
    import math

    import pytest

    from topologies import single_server
    from workloads.ops import OpGraph, OpGraphError

    cases = [
        (lambda g: g.compute(0, flops=math.inf), r"^compute 'compute': flops and nbytes must be finite"),
        (lambda g: g.compute(0, nbytes=math.nan), r"^compute 'compute': flops and nbytes must be finite"),
        (lambda g: g.compute(0, flops="1e12"), r"^compute 'compute': flops and nbytes must be finite .*'1e12'"),
        (lambda g: g.compute(0, duration_s=math.inf), r"^duration_s: must be a finite number of seconds"),
        (lambda g: g.send(0, 1, math.inf), r"^nbytes: must be a finite number of bytes >= 0, got inf"),
        (lambda g: g.recv(1, 0, math.nan), r"^nbytes: must be a finite number of bytes >= 0, got nan"),
        (lambda g: g.collective("all_reduce", [0, 1], math.nan), r"^nbytes: must be a finite number"),
        (lambda g: g.collective("all_reduce", [0, 1], 1e6, count=1.5), r"^count: must be an integer >= 1"),
        (lambda g: g.compute(0.5), r"^rank: must be an integer rank in 0\.\.1, got 0\.5"),
        (lambda g: g.send(0, 1.0, 1e6), r"^peer: must be an integer rank in 0\.\.1, got 1\.0"),
    ]
    for build, message in cases:
        with pytest.raises(OpGraphError, match=message):
            build(OpGraph(2))
    for size in (2.5, "2", True, 0):
        with pytest.raises(OpGraphError, match=r"^world_size: must be an integer >= 1"):
            OpGraph(size)
    g = OpGraph(2)  # the largest finite values still run (and end)
    a = g.compute(0, flops=1e300, category="gemm")
    g.send(0, 1, 64e6, deps=[a])
    g.recv(1, 0, 64e6)
    from simulator import simulate
    assert math.isfinite(simulate(g, single_server("H100", 2)).step_time)


def test_an_integer_zipf_exponent_does_not_overflow():
    """``zipf_s: 21`` (a YAML integer, inside the documented [0, 100]) raised integers and overflowed int64:
    NaN probabilities and numpy's "pvals" error. Zipf's law with s = 21 over 8 experts is hand-computable."""
    import numpy as np

    from workloads.moe import RoutingModel

    for s, experts in ((21, 8), (11, 64), (8, 256), (100, 256)):
        p = RoutingModel("zipf", zipf_s=s).probabilities(experts)
        assert np.isfinite(p).all() and abs(p.sum() - 1) < 1e-12
        ranked = np.sort(p)[::-1]
        assert np.allclose(ranked[:3] / ranked[0], [1, 2.0 ** -s, 3.0 ** -s], rtol=1e-12, atol=0)
    assert np.array_equal(RoutingModel("zipf", zipf_s=2).probabilities(16),
                          RoutingModel("zipf", zipf_s=2.0).probabilities(16))


def test_an_error_led_by_the_file_name_keeps_its_type_or_becomes_a_config_error():
    """Errors are re-raised with the file's name in front; one whose type takes more than a message (a
    UnicodeDecodeError from a topology file that is not UTF-8) became an internal TypeError."""
    from topologies.cluster import TopologyError
    from workloads.errors import ConfigError, with_prefix

    again = with_prefix(TopologyError("cluster.nodes: must be >= 1"), "exp.yaml")
    assert type(again) is TopologyError and str(again) == "exp.yaml: cluster.nodes: must be >= 1"
    decode = UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")
    again = with_prefix(decode, "latin.yaml")
    assert type(again) is ConfigError and str(again).startswith("latin.yaml: 'utf-8' codec can't decode")


def test_settings_no_part_of_the_run_reads_are_noted(tmp_path, capsys):
    """Knobs of a mechanism the layout does not use were taken silently (the audit's list); each is now a
    one-line note on stderr (not an error: a sweep's base file may set them for the points that use them)."""
    from simulator.cli import main
    from simulator.experiment import unused_settings

    base = {"cluster": {"preset": "dgx-h100", "nodes": 2}, "model": {"preset": "gpt2-small"},
            "parallel": {"tp": 4, "dp": 4}, "training": {"seq_len": 512}}
    assert unused_settings(experiment_from_dict(base)) == []
    exp = experiment_from_dict({**base, "parallel": {"tp": 4, "dp": 4, "cp_comm_type": "a2a", "zero_prefetch": 1e6},
                                "options": {"tp_comm_overlap_sms": 8},
                                "compute": {"fp8_matmul_efficiency": 0.6}, "network": {"all_to_all": "bulk"}})
    notes = unused_settings(exp)
    assert [n.split(" ")[0] for n in notes] == ["parallel.cp_comm_type", "parallel.zero_prefetch",
                                                "options.tp_comm_overlap_sms", "compute.fp8_matmul_efficiency",
                                                "network.all_to_all"]
    moe = {"cluster": {"preset": "dgx-h100", "nodes": 2}, "model": {"preset": "tiny", "experts": 8, "top_k": 2},
           "parallel": {"tp": 1, "pp": 2, "dp": 8, "ep": 4, "micro_batch": 1, "global_batch": 32},
           "training": {"seq_len": 128}}
    assert unused_settings(experiment_from_dict({**moe, "moe": {"routing": "uniform", "zipf_s": 3}})) == [
        "moe.zipf_s has no effect with routing: uniform (only routing: zipf reads it)"]
    assert unused_settings(experiment_from_dict({**moe, "moe": {"routing": "zipf", "zipf_s": 3},
                                                 "network": {"all_to_all": "bulk"}})) == []
    import yaml
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump({**base, "parallel": {"tp": 4, "dp": 4, "cp_comm_type": "a2a"}}))
    assert main(["run", str(path), "--json", "--trace-ranks", "all"]) == 0
    err = capsys.readouterr().err
    assert "clustersim: note: parallel.cp_comm_type has no effect" in err
    assert "clustersim: note: --trace-ranks has no effect without --trace" in err


# ---------------------------------------------------------------- review of this round's diff (2026-12-02)
def test_deferred_frames_survive_copies_and_failed_builds():
    """A shallow copy shared the table of deferred frames (the first to read one took it from the other: an empty
    ``stages`` on the original); a build that raised was dropped (the next read gave an empty frame)."""
    import copy

    import pandas as pd

    from simulator.engine import RunRecord
    from simulator.result import Result

    record = RunRecord.__new__(RunRecord)
    record.step_time_s, record.events = 1.0, 0
    r = Result(record)
    frame = pd.DataFrame({"stage": [0, 1]})
    r.defer("stages", lambda: frame)
    c = copy.copy(r)
    # (built once, the frame deferred; a user gets a copy of it: 2026-12-04)
    assert c._stage_frame() is frame and r._stage_frame() is frame and c.stages.equals(frame)
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) == 1:
            raise ImportError("no pandas")
        return frame

    r2 = Result(record)
    r2.defer("stages", flaky)
    import pytest
    with pytest.raises(ImportError):
        _ = r2.stages
    assert r2._stage_frame() is frame  # tried again, not an empty frame


def test_patching_simulator_sweep_is_kept_and_undone():
    """``mock.patch("simulator.sweep", f)`` was ignored and crashed on exit (a property without a deleter)."""
    from unittest import mock

    import simulator
    import simulator.sweep  # noqa: F401 (the submodule's import must not replace the function)
    from simulator.sweeps import sweep

    assert simulator.sweep is sweep

    def fake(*_a, **_k):
        return "patched"

    with mock.patch("simulator.sweep", fake):
        assert simulator.sweep is fake
    assert simulator.sweep is sweep


def test_a_slowdown_must_be_a_positive_factor():
    """A negative slowdown ran with time going backwards once compute ends were scheduled unchecked."""
    import pytest

    from simulator.engine import Engine
    from topologies import single_server
    from workloads.ops import OpGraph

    g = OpGraph(2)
    g.compute(0, 1e12)
    for bad in (-1.0, 0, float("nan"), float("inf"), "2"):
        with pytest.raises(ValueError, match=r"^slowdown\[0\]: must be a finite factor > 0"):
            Engine(g, single_server("H100", 2), slowdown={0: bad})


def test_chakra_writer_takes_the_numbers_the_op_graph_takes(tmp_path):
    """numpy scalars and fractions in duration_s and kernel parts were refused by the writer's new checks."""
    import fractions

    import numpy as np
    import pytest

    pytest.importorskip("google.protobuf")
    from workloads.chakra import read_chakra, write_chakra
    from workloads.ops import Kernel, OpGraph

    g = OpGraph(2)
    g.compute(0, 1e9, duration_s=np.float32(1e-3))
    g.compute(1, parts=(Kernel("gemm", np.int64(10**9), np.float32(1e6)),))
    g.compute(1, 1e9, duration_s=fractions.Fraction(1, 1000))
    write_chakra(g, tmp_path)
    assert len(read_chakra(tmp_path).ops) == 3


def test_a_capacity_plan_built_from_a_frame_as_before_still_reads_back():
    """``CapacityPlan`` holds its bill of materials as rows since the frame became lazy; a plan made from a
    frame (the field's former type) must give that frame back."""
    from topologies import build_cluster
    from topologies.capacity import CapacityPlan, capacity_plan

    plan = capacity_plan(build_cluster({"preset": "dgx-h100", "nodes": 4}))
    again = CapacityPlan(plan.bom, plan.summary)
    assert again.bom.equals(plan.bom) and len(again.rows) == len(plan.rows)
