"""Defects a new-user audit found (2026-12-03), each checked here the way a user meets it.

Truth: what the files say (a 10% capacity factor drops tokens; a model's position table bounds its sequence),
what each message must name (the field to change), and the summary's own numbers.
"""

import copy
from pathlib import Path

import pytest
import yaml

from simulator.cli import main
from simulator.experiment import experiment_from_dict, load_experiment, run_experiment
from simulator.jobs import jobs_from_dict
from topologies.loader import TopologyError, load_cluster

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
DROPPING = {"cluster": {"preset": "dgx-h100", "nodes": 1}, "model": {"preset": "mixtral-8x7b", "layers": 2},
            "parallel": {"tp": 1, "pp": 1, "dp": 8, "ep": 8, "micro_batch": 1, "global_batch": 8, "zero": 1},
            "training": {"seq_len": 512}, "moe": {"routing": "zipf", "zipf_s": 1.0, "capacity_factor": 0.1}}


def _run_text(tmp_path, capsys, doc):
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["run", str(path), "--force", "--no-progress"]) == 0
    return capsys.readouterr().out


def test_run_says_how_many_token_choices_were_dropped(tmp_path, capsys):
    out = _run_text(tmp_path, capsys, DROPPING)
    line = next(x for x in out.splitlines() if x.strip().startswith("MoE routing"))
    dropped = run_experiment(experiment_from_dict(DROPPING), force=True).summary["moe"]["dropped_fraction"]
    assert dropped > 0.5  # a tenth of the balanced capacity keeps at most a tenth of the choices
    assert f"{dropped * 100:.1f} % of token choices dropped" in line
    dropless = copy.deepcopy(DROPPING)
    dropless["moe"]["capacity_factor"] = None
    assert "no tokens dropped" in _run_text(tmp_path, capsys, dropless)


def test_a_dense_run_has_no_moe_line_and_no_sub_nanosecond_compute_stretch(capsys):
    # examples/custom-fabric.yaml's compute beside communication read ~1e-18 s per rank, rounding residues of
    # ops never slowed ("+0 ps"): the engine counts them as none
    assert run_experiment(load_experiment(EXAMPLES / "custom-fabric.yaml")).summary["compute_beside_comm_s"] == 0.0
    assert main(["run", str(EXAMPLES / "custom-fabric.yaml"), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "MoE routing" not in out and "compute beside comm" not in out
    assert "counted in each" in out  # the header's exposed comm overlaps classes; the stage table does not
    assert "every instant counted once" in out


def test_the_default_sequence_fits_a_small_model():
    doc = {"cluster": {"preset": "dgx-h100", "nodes": 1}, "model": {"preset": "tiny"}}
    exp = experiment_from_dict(doc)
    assert exp.training.seq_len == exp.model.max_seq_len < 2048
    big = experiment_from_dict({**doc, "model": {"preset": "gpt3-175b"}})
    assert big.training.seq_len == 2048  # the documented default where the model allows it
    with pytest.raises(ValueError, match=r"training\.seq_len"):  # given explicitly: still checked
        experiment_from_dict({**doc, "training": {"seq_len": 4096}})


def test_a_jobs_size_mismatch_names_the_jobs_nodes():
    doc = {"cluster": {"preset": "dgx-h100", "nodes": 4},
           "jobs": [{"name": "a", "nodes": 2, "model": {"preset": "tiny"},
                     "parallel": {"tp": 2, "pp": 1, "dp": 3, "global_batch": 6}}]}
    with pytest.raises(ValueError, match=r"^jobs\[0\] \(a\): .*set dp to 8 or give the job other nodes") as info:
        jobs_from_dict(doc)
    assert "cluster.nodes" not in str(info.value)


def test_a_cluster_file_without_its_cluster_section_says_so(tmp_path):
    path = tmp_path / "f.yaml"
    path.write_text("model: gpt2-small\n")
    with pytest.raises(TopologyError, match=r"no 'cluster:' section \(the file has model\)"):
        load_cluster(path)
    path.write_text("preset: dgx-h100\nnodes: 2\n")  # cluster fields at top level still load
    assert load_cluster(path).num_gpus == 16


@pytest.mark.parametrize("argv", [["topology", "dgx-h100:x"], ["plan", "dgx-h100:x"]])
def test_a_bad_node_count_names_the_argument_not_an_option(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == "clustersim: error: cluster: 'dgx-h100:x': NODES must be an integer, as in dgx-h100:4"


# ---------------------------------------------------------------- the Python API (second audit)
def test_zero_figures_checks_its_arguments_and_reads_text_counts():
    from workloads.sharding import zero_figures
    assert zero_figures("1T", 1024) == zero_figures(1e12, 1024)  # as clustersim zero --params 1T
    for args, field in (((1e12, 0), "gpus"), ((-1, 8), "params"), ((float("nan"), 8), "params"),
                        ((1e9, 8.5), "gpus"), ((1e9, 8, 3), "dtype_bytes")):
        with pytest.raises(ValueError, match=rf"^{field}: "):
            zero_figures(*args)


@pytest.mark.parametrize("name", ["plan_summary", "bill_of_materials", "capacity_plan", "bisection_bandwidth"])
def test_capacity_functions_name_a_cluster_that_is_not_one(name):
    import topologies.bisection
    import topologies.capacity
    f = getattr(topologies.capacity, name, None) or getattr(topologies.bisection, name)
    with pytest.raises(TypeError, match=r"^cluster: must be a Cluster .*got str; build it first"):
        f("dgx-h100")


def test_build_cluster_takes_preset_colon_nodes_as_files_do():
    from topologies import build_cluster
    assert build_cluster("dgx-h100:4").num_gpus == build_cluster({"preset": "dgx-h100", "nodes": 4}).num_gpus == 32
    with pytest.raises(ValueError, match=r"^cluster: 'dgx-h100:x': NODES must be an integer"):
        build_cluster("dgx-h100:x")


TINY_RUN = {"cluster": {"preset": "dgx-h100", "nodes": 2}, "model": {"preset": "tiny"},
            "parallel": {"tp": 2, "pp": 2, "dp": 4, "global_batch": 8}, "training": {"seq_len": 128}}


def test_memory_breakdown_holds_bytes_only_and_the_stage_apart():
    s = run_experiment(experiment_from_dict(TINY_RUN)).summary
    assert sum(s["memory_breakdown_bytes"].values()) == pytest.approx(s["memory_per_gpu_bytes"])
    assert s["memory_stage"] in (0, 1)


def test_link_timeseries_refuses_a_tier_beside_explicit_links_and_save_plots_checks_dpi(tmp_path):
    r = run_experiment(experiment_from_dict(TINY_RUN))
    with pytest.raises(ValueError, match=r"^tier: .*with links given"):
        r.link_timeseries(links=[0], tier="spine")
    assert len(r.link_timeseries(links=[0])) >= 1
    with pytest.raises(ValueError, match=r"^dpi: "):
        r.save_plots(str(tmp_path), dpi=0)


def test_leaf_traffic_matrix_is_refused_where_a_server_spans_leaves():
    doc = {**TINY_RUN, "cluster": {"preset": "dgx-h100", "nodes": 4, "nodes_per_leaf": 2, "spines": 2,
                                   "fabric": "rail_optimized"},
           "parallel": {"tp": 2, "pp": 2, "dp": 8, "global_batch": 16}}
    r = run_experiment(experiment_from_dict(doc))
    with pytest.raises(ValueError, match=r"^level: 'leaf' .*several leaves"):
        r.traffic_matrix("leaf")
    node = r.traffic_matrix("node")
    assert node.to_numpy().sum() == pytest.approx(sum(r.bytes_by_class.values()))
    leaf_spine = run_experiment(experiment_from_dict({**doc, "cluster": {**doc["cluster"], "fabric": "leaf_spine"}}))
    assert leaf_spine.traffic_matrix("leaf").to_numpy().sum() == pytest.approx(sum(leaf_spine.bytes_by_class.values()))


def test_plan_reads_a_graphml_topology_as_the_fabric_it_was_written_from(tmp_path, capsys):
    import json
    path = tmp_path / "two.graphml"
    assert main(["topology", "dgx-h100:2", "--output", str(path)]) == 0
    capsys.readouterr()
    assert main(["plan", "dgx-h100:2", "--json"]) == 0
    preset = json.loads(capsys.readouterr().out)["summary"]
    assert main(["plan", str(path), "--json"]) == 0
    written = json.loads(capsys.readouterr().out)["summary"]
    for key in ("fabric_cost_usd", "fabric_power_kw", "bisection_bytes_s", "port_speed_Gbps"):
        assert written[key] == pytest.approx(preset[key]), key
    assert main(["plan", str(path), "--nodes", "2"]) == 2
    assert "--nodes: cannot be used with a topology file" in capsys.readouterr().err
