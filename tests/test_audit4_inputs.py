"""Input handling found wanting by the tenth session's new-user audit: each case its one-line error, its note, or
its accepted spelling."""
import pytest

from simulator.cli import main
from simulator.experiment import experiment_from_dict, run_experiment, unused_settings
from topologies import build_cluster
from topologies.units import TopologyError
from workloads.errors import ConfigError
from workloads.models import get_preset

BASE = {"cluster": {"preset": "dgx-h100", "nodes": 2}, "model": {"preset": "gpt2-small"},
        "parallel": {"tp": 2, "pp": 2, "dp": 4}, "training": {"seq_len": 1024}}


@pytest.mark.parametrize("section, value, message", [
    ("network", {"bandwidth_efficiency": 1e-9},
     "network.bandwidth_efficiency: must be a fraction of the link rate in [0.01, 1], got 1e-09"),
    ("network", {"bandwidth_efficiency": {"leaf": 0.001}}, "network.bandwidth_efficiency.leaf: must be a fraction"),
    ("compute", {"matmul_efficiency": 1e-12}, "compute.matmul_efficiency: must be a fraction of the peak in [0.01, 1]"),
    ("compute", {"memory_efficiency": 0.005}, "compute.memory_efficiency: must be a fraction"),
    ("compute", {"attention_kernel": ""}, "compute.attention_kernel: must be a kernel name"),
    ("compute", {"attention_kernel": "  "}, "compute.attention_kernel: must be a kernel name"),
])
def test_absurd_knobs_are_one_line_errors(section, value, message):
    with pytest.raises((ConfigError, ValueError)) as err:
        experiment_from_dict({**BASE, section: value})
    assert message in str(err.value) and "\n" not in str(err.value)


def test_the_efficiency_floor_itself_runs():
    exp = experiment_from_dict({**BASE, "network": {"bandwidth_efficiency": 0.01},
                                "compute": {"matmul_efficiency": 0.01}})
    assert exp.network.bandwidth_efficiency == 0.01


def test_settings_without_effect_are_noted():
    doc = {**BASE, "cluster": {"preset": "dgx-h100", "nodes": 2, "core_oversubscription": 2},
           "network": {"bandwidth_efficiency": {"core": 0.5, "nvlink": 0.9}}}
    notes = unused_settings(experiment_from_dict(doc))
    assert any(n.startswith("cluster.core_oversubscription has no effect with fabric leaf_spine") for n in notes)
    assert any(n.startswith("network.bandwidth_efficiency.core has no effect: this cluster has no core links")
               for n in notes)
    assert not any("bandwidth_efficiency.nvlink" in n for n in notes)
    fat = {**doc, "cluster": {"preset": "dgx-h100", "nodes": 4, "fabric": "fat_tree", "nodes_per_leaf": 1,
                              "leaves_per_pod": 2, "core_oversubscription": 2},
           "parallel": {"tp": 2, "pp": 2, "dp": 8}}
    assert not any("core" in n for n in unused_settings(experiment_from_dict(fat)))


def test_shared_expert_overlap_without_shared_experts_is_noted():
    moe = {"preset": "mixtral-8x7b", "layers": 2}
    doc = {**BASE, "model": moe, "parallel": {"tp": 2, "pp": 1, "dp": 8, "ep": 8, "sequence_parallel": True},
           "moe": {"shared_expert_overlap": True}}
    notes = unused_settings(experiment_from_dict(doc))
    assert any(n.startswith("moe.shared_expert_overlap has no effect: model mixtral-8x7b has no shared experts")
               for n in notes)
    doc["model"] = {**moe, "shared_experts": 1}
    assert not any("shared_expert_overlap" in n for n in unused_settings(experiment_from_dict(doc)))


def test_model_presets_ignore_case_and_spaces_like_cluster_presets():
    assert get_preset(" GPT2-Small ") is get_preset("gpt2-small")
    with pytest.raises(ConfigError, match=r"^model.preset: unknown preset 3; valid presets: "):
        get_preset(3)


def test_collective_takes_preset_colon_nodes(capsys):
    assert main(["collective", "--op", "all_reduce", "--cluster", "dgx-h100:2", "--gpus", "16", "--min-size", "1MiB",
                 "--max-size", "1MiB"]) == 0
    assert "16 GPUs of 2x dgx-h100" in capsys.readouterr().out
    assert main(["collective", "--op", "all_reduce", "--cluster", "dgx-h100:two"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "clustersim: error: --cluster: 'dgx-h100:two': NODES must be an integer, as in dgx-h100:4"


def test_uneven_stage_errors_name_the_other_stages():
    doc = {**BASE, "model": {"preset": "gpt2-small", "layers": 7},
           "parallel": {"tp": 2, "pp": 2, "dp": 4, "first_stage_layers": 7}}
    with pytest.raises(ConfigError, match=r"leaves 0 of model.layers=7 for the 1 other stage\(s\)"):
        experiment_from_dict(doc)


def test_a_preset_with_a_list_of_nodes_blames_nodes():
    with pytest.raises(TopologyError, match=r"^cluster\.nodes: must be a number of servers with a preset, got \[\]"):
        build_cluster({"preset": "dgx-h100", "nodes": []})


# ------------------------------------------------------------- the Python API (second audit of the session)
def test_sweep_partition_columns_are_zero_where_a_layout_has_none():
    import simulator
    base = {"cluster": {"preset": "dgx-h100", "nodes": 1, "gpus_per_node": 2}, "model": {"preset": "gpt2-small"},
            "parallel": {"micro_batch": 1, "global_batch": 4}, "training": {"seq_len": 512}}
    df = simulator.sweep(base, {"parallel.tp": [1, 2], "parallel.dp": [2, 1]}, jobs=1, progress=False)
    ok = df[df["status"] == "ok"]
    assert len(ok) == 2
    partition = [c for c in ok.columns if c.startswith("time_") and c.endswith("_s")]
    assert "time_exposed_tp_s" in partition and not ok[partition].isna().any().any()
    assert (ok.loc[ok["parallel.tp"] == 1, "time_exposed_tp_s"] == 0.0).all()
    assert (ok.loc[ok["parallel.tp"] == 2, "time_exposed_tp_s"] > 0.0).all()


def test_plot_stages_of_a_bare_op_graph_is_a_one_line_error():
    from simulator import simulate
    from topologies import single_server
    from workloads.ops import OpGraph
    g = OpGraph(2)
    g.collective("all_reduce", range(2), 2**20)
    with pytest.raises(ValueError, match=r"^plot_stages: this run has no stage table"):
        simulate(g, single_server("H100", 2)).plot_stages()


def test_one_validation_entry_may_be_named_by_a_string():
    from simulator.validation import select_entries
    assert [e.name for e in select_entries("korthikanti22-22b")] == ["korthikanti22-22b"]


def test_timeline_of_a_rank_a_representative_stands_for():
    from simulator.experiment import run_experiment
    doc = {"cluster": {"preset": "dgx-h100", "nodes": 1}, "model": {"preset": "gpt2-small"},
           "parallel": {"tp": 2, "pp": 2, "dp": 2}, "training": {"seq_len": 512}}
    r = run_experiment(experiment_from_dict(doc), fidelity="fast")
    rep, member = r.timeline([0]), r.timeline([1])  # rank 1 is rank 0's TP peer
    assert set(member["rank"]) == {1} and len(member) == len(rep) > 0
    assert member.drop(columns="rank").equals(rep.drop(columns="rank"))
    both = r.timeline([5, 0])
    assert list(dict.fromkeys(both["rank"])) == [5, 0]


def test_ops_frame_carries_each_collectives_count():
    # a coarsened collective (a layer's TP collectives) is count calls of nbytes each. Hand count for one
    # micro-batch of gpt2-small (12 layers) on TP 4 with sequence parallelism: per layer 2 all-gathers and 2
    # reduce-scatters forward, as many backward plus 2 re-gathers; the embedding and the output layer one each
    # way, and the output layer's re-gather: 12 * 10 + 5 buffers of b s h bf16 elements on every rank; besides,
    # the loss's two all-reduces (4 and 8 bytes a token) and the step's all-reduce of the norms' and row-parallel
    # biases' fp32 gradients (12 x 6h + 2h).
    from simulator.experiment import run_experiment
    doc = {"cluster": {"preset": "dgx-h100", "nodes": 1, "gpus_per_node": 4}, "model": {"preset": "gpt2-small"},
           "parallel": {"tp": 4, "sequence_parallel": True, "micro_batch": 1, "global_batch": 1},
           "training": {"seq_len": 512}}
    ops = run_experiment(experiment_from_dict(doc), fidelity="full").ops
    assert (ops["count"] > 1).any() and (ops.loc[ops["kind"] == "compute", "count"] == 1).all()
    tp = ops[(ops["rank"] == 0) & (ops["traffic_class"] == "tp")]
    assert (tp["nbytes"] * tp["count"]).sum() == pytest.approx((12 * 10 + 5) * 512 * 768 * 2 + 12 * 512
                                                               + (12 * 6 * 768 + 2 * 768) * 4)
    assert tp["nbytes"].sum() < (tp["nbytes"] * tp["count"]).sum()  # (nbytes alone undercounts)


def test_a_leaf_spine_link_narrower_than_one_port_is_noted():
    # 4 nodes per rail pod at 4:1 over 4 spines: 4 x 50 GB/s / (4 x 4) = 12.5 GB/s per link, a quarter of a
    # port; one spine gives the same ratio with whole ports, and is the default (a pod's ports / the ratio).
    doc = {**BASE, "cluster": {"preset": "dgx-h100", "nodes": 8, "nodes_per_leaf": 4, "fabric": "rail_optimized",
                               "oversubscription": 4, "spines": 4}, "parallel": {"tp": 2, "pp": 2, "dp": 16}}
    notes = [n for n in unused_settings(experiment_from_dict(doc)) if n.startswith("cluster.spines")]
    assert len(notes) == 1 and "12.5 GB/s, less than one 50 GB/s port" in notes[0] and "spines: 1 " in notes[0]
    del doc["cluster"]["spines"]
    assert experiment_from_dict(doc).cluster.params["spines"] == 1
    assert not any(n.startswith("cluster.spines") for n in unused_settings(experiment_from_dict(doc)))
    doc["cluster"] = {**doc["cluster"], "fabric": "leaf_spine", "spines": 4}  # 4 x 8 x 50 / 16: 100 GB/s
    assert not any(n.startswith("cluster.spines") for n in unused_settings(experiment_from_dict(doc)))


def test_scale_out_settings_on_one_node_or_one_leaf_are_noted():
    one_node = {**BASE, "cluster": {"preset": "dgx-h100", "nodes": 1, "fabric": "single_node",
                                    "nic_bandwidth": "200Gbps", "spines": 2}, "parallel": {"tp": 2, "pp": 2, "dp": 2}}
    notes = unused_settings(experiment_from_dict(one_node))
    assert "cluster.nic_bandwidth has no effect with fabric single_node (one NVLink domain, no NICs)" in notes
    assert any(n.startswith("cluster.spines has no effect with fabric single_node") for n in notes)
    one_leaf = {**BASE, "cluster": {"preset": "dgx-h100", "nodes": 2, "spines": 4, "oversubscription": 2},
                "network": {"routing": "spray"}}
    notes = unused_settings(experiment_from_dict(one_leaf))
    assert any(n.startswith("cluster.spines has no effect: the 2 nodes hang off one leaf") for n in notes)
    assert any(n.startswith("cluster.oversubscription has no effect: the 2 nodes hang off one leaf") for n in notes)
    assert "network.routing: spray has no effect: one leaf gives every pair one path" in notes
    cores = {**one_leaf, "cluster": {"preset": "dgx-h100", "nodes": 2, "cores": 4, "leaves_per_pod": 2}}
    notes = unused_settings(experiment_from_dict(cores))
    assert "cluster.cores has no effect with fabric leaf_spine (only fat_tree has a core tier)" in notes
    assert "cluster.leaves_per_pod has no effect with fabric leaf_spine (only fat_tree has a core tier)" in notes
    two_leaves = {**one_leaf, "cluster": {**one_leaf["cluster"], "nodes": 4, "nodes_per_leaf": 2},
                  "parallel": {"tp": 2, "pp": 2, "dp": 8}}
    assert not any(("spines" in n or "oversubscription" in n or "spray" in n)
                   for n in unused_settings(experiment_from_dict(two_leaves)))


def test_zero_knobs_of_another_implementation_are_noted():
    """DeepSpeed's ZeRO-3 fetch knobs under FSDP, and zero_overlap where nothing is gathered per layer, change
    nothing (a helper measured the step identical): each is noted; where they act, they are not."""
    gpt = {"preset": "gpt2-small", "layers": 4}
    base = {**BASE, "model": gpt}
    fsdp = {**base, "parallel": {"tp": 1, "pp": 1, "dp": 16, "zero": 3, "zero_impl": "fsdp", "zero_prefetch": 1e6,
                                 "zero_persistence": 10}}
    notes = unused_settings(experiment_from_dict(fsdp))
    assert "parallel.zero_prefetch has no effect with zero_impl: fsdp (it is DeepSpeed ZeRO-3's parameter " \
           "fetching)" in notes and any(n.startswith("parallel.zero_persistence has no effect") for n in notes)
    deepspeed = {**fsdp, "parallel": {**fsdp["parallel"], "zero_impl": "deepspeed"}}
    assert not any("zero_" in n for n in unused_settings(experiment_from_dict(deepspeed)))
    # Blocking gathers (zero_overlap: false) fetch no module ahead: the prefetch bucket is noted, and the step
    # and memory are indeed those of another bucket size.
    blocking = {**deepspeed, "parallel": {**deepspeed["parallel"], "zero_overlap": False}}
    assert [n for n in unused_settings(experiment_from_dict(blocking)) if "zero_" in n] == [
        "parallel.zero_prefetch has no effect with zero_overlap: false (blocking gathers fetch each module when it "
        "is used, none ahead)"]
    other = {**blocking, "parallel": {**blocking["parallel"], "zero_prefetch": 1e9}}
    exps = [experiment_from_dict(d) for d in (blocking, other)]
    assert run_experiment(exps[0], fidelity="full").step_time == run_experiment(exps[1], fidelity="full").step_time
    assert exps[0].memory() == exps[1].memory()
    megatron = {**base, "parallel": {"tp": 1, "pp": 1, "dp": 16, "zero": 1, "zero_overlap": False}}
    assert any(n.startswith("parallel.zero_overlap has no effect") for n in unused_settings(
        experiment_from_dict(megatron)))
