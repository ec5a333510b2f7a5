"""Defects a bad-input fuzz and an invariant hunt found (2026-12-04), each checked the way a user meets it.

Truth: the project's rule for bad input (README, "Command line"): one line naming the field, exit status 2,
never an internal error and never a silently simulated impossible value.
"""

import pytest
import yaml

from simulator.cli import main
from simulator.experiment import experiment_from_dict
from topologies import build_cluster, fat_tree, leaf_spine, rail_optimized
from topologies.loader import TopologyError
from workloads.errors import ConfigError

TINY = {"cluster": {"preset": "dgx-h100", "nodes": 2, "gpus_per_node": 2},
        "model": {"preset": "tiny"},
        "parallel": {"tp": 1, "pp": 2, "dp": 2, "micro_batch": 1, "global_batch": 4},
        "training": {"seq_len": 128}}
HUGE = 10 ** 400  # YAML reads "1" followed by 400 zeros as this exact int: beyond any float


def _cli(tmp_path, capsys, text: str) -> tuple[int, str]:
    path = tmp_path / "exp.yaml"
    path.write_text(text)
    code = main(["run", str(path), "--json", "--no-progress"])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("section", ["network", "compute", "options", "moe"])
def test_unknown_keys_of_two_types_name_one_field(tmp_path, capsys, section):
    # A number and a word as unknown keys: plain sorted() raised TypeError (an internal error, exit 1).
    doc = {**TINY, section: {1: "a", "foo": "b"}}
    with pytest.raises(ConfigError, match=rf"^{section}\.(1|foo): unknown field; valid fields: "):
        experiment_from_dict(doc)
    code, err = _cli(tmp_path, capsys, yaml.safe_dump(doc))
    assert code == 2 and "internal error" not in err and len(err.strip().splitlines()) == 1


def test_unknown_top_level_keys_of_two_types(tmp_path, capsys):
    doc = {**TINY, 1: "a", "foo": "b"}
    with pytest.raises(ConfigError, match=r"^(1|foo): unknown section"):
        experiment_from_dict(doc)


def test_an_int_beyond_any_float_is_a_bad_bandwidth_not_an_internal_error(tmp_path, capsys):
    text = yaml.safe_dump(TINY).replace("gpus_per_node: 2", f"gpus_per_node: 2\n  nic_bandwidth: {HUGE}")
    code, err = _cli(tmp_path, capsys, text)
    assert code == 2 and "cluster.nic_bandwidth" in err and "internal error" not in err
    with pytest.raises(TopologyError, match="cluster.nic_bandwidth"):
        build_cluster({**TINY["cluster"], "nic_bandwidth": HUGE})
    with pytest.raises(TopologyError, match="cluster.oversubscription"):
        build_cluster({**TINY["cluster"], "nodes_per_leaf": 1, "oversubscription": HUGE})
    with pytest.raises(TopologyError, match="^oversubscription"):
        leaf_spine("H100", servers=2, servers_per_leaf=1, oversubscription=HUGE)


@pytest.mark.parametrize("fabric, field", [("leaf-spine", "oversubscription"), ("rail-optimized", "oversubscription"),
                                           ("fat-tree", "core_oversubscription")])
def test_a_ratio_leaving_uplinks_under_a_link_s_floor_is_refused(tmp_path, capsys, fabric, field):
    # 1e30:1 made each uplink ~1e-19 B/s, simulated to a 3.8e24 s step with exit 0; 1 MB/s is the least any link
    # may have (a written bandwidth, a degraded link).
    cluster = {"preset": "dgx-h100", "nodes": 4, "gpus_per_node": 2, "nodes_per_leaf": 1, "fabric": fabric,
               field: 1e30}
    if fabric == "fat-tree":
        cluster["leaves_per_pod"] = 2
    with pytest.raises(TopologyError, match=rf"^cluster\.{field}: 1e\+30 leaves each uplink .* below the 1e\+06"):
        build_cluster(cluster)
    code, err = _cli(tmp_path, capsys, yaml.safe_dump({**TINY, "cluster": cluster}))
    assert code == 2 and f"cluster.{field}" in err


def test_the_builders_check_the_uplinks_they_derive():
    for build in (leaf_spine, rail_optimized):
        with pytest.raises(TopologyError, match="^oversubscription: .* below the 1e\\+06 a link needs"):
            build("H100", servers=2, servers_per_leaf=1, oversubscription=1e30)
    with pytest.raises(TopologyError, match="^core_oversubscription: "):
        fat_tree("H100", servers=4, servers_per_leaf=1, leaves_per_pod=2, core_oversubscription=1e30)
    # a large but sane ratio still builds, every link at 1 MB/s or more
    c = leaf_spine("H100", servers=2, servers_per_leaf=1, oversubscription=1000)
    assert min(d["bandwidth"] for _u, _v, d in c.graph.edges(data=True)) >= 1e6


def test_context_parallelism_with_unfused_attention_is_refused_at_load(tmp_path, capsys):
    # It was refused only when the kernels were made: load_experiment and memory() passed, and the CLI's error
    # did not name the file.
    doc = {"cluster": {"preset": "dgx-h100", "nodes": 1}, "model": "tiny", "parallel": {"cp": 2, "dp": 4},
           "training": {"seq_len": 128}, "options": {"flash_attention": False}}
    with pytest.raises(ConfigError, match=r"^options\.flash_attention: context parallelism runs fused attention"):
        experiment_from_dict(doc)
    code, err = _cli(tmp_path, capsys, yaml.safe_dump(doc))
    assert code == 2 and "exp.yaml: options.flash_attention" in err


def test_expert_load_without_custom_routing_gets_a_note(tmp_path, capsys):
    doc = {"cluster": {"preset": "dgx-h100", "nodes": 1}, "model": {"preset": "mixtral-8x7b", "layers": 2},
           "parallel": {"tp": 1, "pp": 1, "dp": 8, "ep": 8, "micro_batch": 1, "global_batch": 8},
           "training": {"seq_len": 256}, "moe": {"routing": "zipf", "expert_load": [1] * 8}}
    code, err = _cli(tmp_path, capsys, yaml.safe_dump(doc))
    assert code == 0
    assert "moe.expert_load has no effect with routing: zipf (only routing: custom reads it)" in err


def test_fsdp_zero2_keeps_only_its_shard_of_the_parameters_at_rest():
    # SHARD_GRAD_OP reshards after the backward: at rest each of the 8 GPUs holds 2 Psi / 8 bytes of bf16
    # weights; from the first forward to the end of the backward the whole model is gathered on top (it does
    # not reshard after the forward): 2 Psi (1 + 1/8) at the peak. It read 2 Psi x 2 (the full copy counted
    # twice). DeepSpeed's ZeRO-2 keeps the full 2 Psi, its closed form.
    def params(impl):
        doc = {"cluster": {"preset": "dgx-h100", "nodes": 1}, "model": {"preset": "llama3-8b"},
               "parallel": {"tp": 1, "pp": 1, "dp": 8, "micro_batch": 1, "global_batch": 8, "zero": 2,
                            "zero_impl": impl}, "training": {"seq_len": 2048}}
        return experiment_from_dict(doc).memory().parameters

    full = params("deepspeed")
    assert params("fsdp") == pytest.approx(full * (1 + 1 / 8), rel=1e-12)
