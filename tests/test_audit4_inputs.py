"""Input handling found wanting by the tenth session's new-user audit: each case its one-line error, its note, or
its accepted spelling."""
import pytest

from simulator.cli import main
from simulator.experiment import experiment_from_dict, unused_settings
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
    doc = {**BASE, "model": moe, "parallel": {"tp": 2, "pp": 1, "dp": 8, "ep": 8},
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
