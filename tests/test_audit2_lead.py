"""Defects found by the second new-user audit (fabrics, plan, sweeps, CLI), each with its reproducer."""

import copy
import re

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


def test_plan_cache_tells_apart_infiniband_and_ethernet_links():
    """The same fabric with its network links marked eth instead of ib is priced with Ethernet switches (found
    in review: the key hashed rates, not kinds)."""
    from topologies.capacity import bill_of_materials
    ib = _two_racks()
    eth = copy.deepcopy(ib)
    for link in eth["links"]:  # every network cable (NIC to rack, rack to rack): ib by default or by name
        if "rack" in link["a"] + link["b"]:
            link["kind"] = "eth"
    families = []
    for doc in (ib, eth, ib):
        bom = bill_of_materials(cluster_from_dict(doc))
        families.append(frozenset(bom.loc[bom["item"].str.endswith("switch"), "component"]))
    assert families[0] == families[2] != families[1]


def _fabric_sweep(tmp_path):
    import shutil
    shutil.copy("examples/custom-fabric.yaml", tmp_path / "custom-fabric.yaml")
    shutil.copytree("examples/fabrics", tmp_path / "fabrics")
    return tmp_path / "custom-fabric.yaml", tmp_path / "fabrics" / "two-racks.yaml"


def test_a_resumed_sweep_simulates_again_when_its_topology_file_changed(tmp_path):
    from simulator.sweeps import sweep
    experiment, fabric = _fabric_sweep(tmp_path)
    out = tmp_path / "out.csv"
    starts = []

    def run():
        return sweep(experiment, {"parallel.micro_batch": [2, 4]}, jobs=1, progress=False, output=out,
                     on_start=lambda points, reused: starts.append((points, reused)))

    first = run()
    again = run()  # unchanged file: every row reused, the same numbers
    assert starts[:2] == [(2, 0), (2, 2)]
    assert list(again["step_time_s"]) == list(first["step_time_s"])
    fabric.write_text(fabric.read_text().replace("800Gbps", "8Gbps"))  # the racks' cable, 100x slower
    slower = run()
    assert starts[2] == (2, 0)  # nothing reused: the file is not what the rows were simulated on
    assert (slower.set_index("parallel.micro_batch")["step_time_s"]
            > 5 * first.set_index("parallel.micro_batch")["step_time_s"]).all()


def test_grid_topology_paths_resolve_like_the_files_own(tmp_path, monkeypatch):
    """The file's sweep: grid names a fabric relative to the file (as its cluster: section does); a grid given
    to sweep() names one relative to the working directory. Both ran as 'cannot read topology file' when the
    working directory was elsewhere."""
    from simulator.sweeps import sweep
    experiment, fabric = _fabric_sweep(tmp_path)
    doc = yaml.safe_load(experiment.read_text())
    doc["sweep"] = {"grid": {"cluster.topology": ["fabrics/two-racks.yaml"], "parallel.micro_batch": [2]}}
    experiment.write_text(yaml.safe_dump(doc))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    from_file = sweep(experiment, jobs=1, progress=False)
    assert list(from_file["status"]) == ["ok"]
    from_cwd = sweep(experiment, {"cluster.topology": ["../fabrics/two-racks.yaml"]}, jobs=1, progress=False)
    assert list(from_cwd["status"]) == ["ok"]
    assert from_cwd["step_time_s"].iloc[0] == from_file["step_time_s"].iloc[0]
    # a single value, and whole cluster sections, resolve the same way (found in review)
    doc["sweep"]["grid"] = {"cluster.topology": "fabrics/two-racks.yaml", "parallel.micro_batch": [2]}
    experiment.write_text(yaml.safe_dump(doc))
    assert list(sweep(experiment, jobs=1, progress=False)["step_time_s"]) == list(from_file["step_time_s"])
    doc["sweep"]["grid"] = {"cluster": [{"topology": "fabrics/two-racks.yaml"}], "parallel.micro_batch": [2]}
    experiment.write_text(yaml.safe_dump(doc))
    assert list(sweep(experiment, jobs=1, progress=False)["step_time_s"]) == list(from_file["step_time_s"])


def test_collective_on_a_small_cluster_without_gpus_takes_every_gpu(tmp_path, capsys):
    """A 4-GPU fabric file and no --gpus: 'the 8 GPUs' the default asked for blamed a flag never given."""
    from simulator.cli import main
    mesh = tmp_path / "mesh.yaml"
    gpus = [f"gpu:0:{i}" for i in range(4)]
    mesh.write_text(yaml.safe_dump({"gpu": "H100", "nodes": gpus, "links": [
        {"a": a, "b": b, "bandwidth": "100GB/s", "latency": "1us"} for i, a in enumerate(gpus) for b in gpus[i + 1:]]}))
    assert main(["collective", "--op", "all_reduce", "--cluster", str(mesh), "--max-size", "1MiB"]) == 0
    assert "# all_reduce over 4 GPUs of" in capsys.readouterr().out
    assert main(["collective", "--cluster", str(mesh), "--gpus", "8"]) == 2
    assert "--gpus: 8 exceeds the 4 GPUs" in capsys.readouterr().err


@pytest.mark.parametrize("rate", ["1bps", "1e-6bps", "8Kbps"])
def test_topology_files_refuse_a_link_slower_than_1_mb_s_as_cluster_sections_do(rate):
    """A topology file took 1bps (a step of 5.5e15 s); a cluster: section refused anything under 1 MB/s."""
    from topologies.cluster import TopologyError
    doc = _two_racks()
    doc["links"][0]["bandwidth"] = rate
    with pytest.raises(TopologyError, match=r"^links\[0\]\.bandwidth: .* a link needs at least 1e\+06 bytes/s"):
        cluster_from_dict(doc)
    doc["links"][0]["bandwidth"] = "8Mbps"  # 1 MB/s: the floor itself is a link
    assert cluster_from_dict(doc).graph.number_of_edges() > 0


@pytest.mark.parametrize("field, value", [("cost_usd", 1e300), ("power_w", 5e6)])
def test_a_part_priced_or_powered_absurdly_is_refused(field, value):
    from topologies.cluster import TopologyError
    from topologies.components import plan_options
    with pytest.raises(TopologyError, match=rf"^plan\.components\.QM9700\.{field}: .* is more than .* for one part"):
        plan_options({"components": {"QM9700": {field: value}}})
    assert plan_options({"components": {"QM9700": {"cost_usd": 25_000, "power_w": 650}}})


def test_plots_folder_is_printed_with_one_separator(tmp_path, capsys):
    from simulator.cli import main
    assert main(["run", "examples/demo.yaml", "--plots", f"{tmp_path}/figs/", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert f"figures written to   {tmp_path}/figs/ (" in out and "figs//" not in out


@pytest.mark.parametrize("command", [["run"], ["plan"]])
def test_a_binary_file_is_told_apart_from_malformed_yaml(tmp_path, capsys, command):
    """A binary file read 'malformed YAML: ReaderError' (PyYAML's class name, no position)."""
    from simulator.cli import main
    path = tmp_path / "model.yaml"
    path.write_bytes(b"\x00\x01\x02binary")
    assert main([*command, str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"clustersim: error: {path}: malformed YAML at byte 0: character #x0000 is not allowed in a "
                   f"YAML text file (a binary file?)")


def test_a_moe_sweep_can_rank_by_exposed_expert_data_parallel_time():
    """A MoE step's summary has exposed_edp_s (its expert-DP gradient reductions), which --metric refused."""
    from simulator.sweeps.columns import check_metric
    check_metric("exposed_edp_s")
    with pytest.raises(ValueError, match="exposed_edq_s"):
        check_metric("exposed_edq_s")


def test_a_topology_files_layout_mismatch_does_not_suggest_cluster_nodes():
    """cluster.nodes cannot be combined with a topology file, yet the layout error told the user to resize it."""
    from simulator.experiment import experiment_from_dict
    from workloads.errors import ConfigError
    with open("examples/custom-fabric.yaml") as f:
        doc = yaml.safe_load(f)
    doc["cluster"] = {"topology": "examples/fabrics/two-racks.yaml"}
    doc["parallel"]["dp"] = 3
    with pytest.raises(ConfigError, match=r"set dp to 2 or give the topology file 12 GPUs$"):
        experiment_from_dict(doc)
    with pytest.raises(ConfigError, match=r"or resize cluster\.nodes$"):
        experiment_from_dict({**doc, "cluster": {"preset": "dgx-h100", "nodes": 1}})


def test_topology_of_an_experiment_with_faults_says_it_is_the_healthy_fabric(tmp_path, capsys):
    from simulator.cli import main
    path = tmp_path / "faulty.yaml"
    path.write_text("cluster: {preset: dgx-h100, nodes: 2}\nmodel: {preset: gpt2-small}\n"
                    "parallel: {tp: 2, pp: 1, dp: 8}\ntraining: {seq_len: 1024}\n"
                    "faults:\n  - {kind: straggler, gpu: 3, factor: 1.5}\n")
    assert main(["topology", str(path)]) == 0
    err = capsys.readouterr().err
    assert err.strip() == (f"clustersim: note: {path}'s faults: section is not applied here: this is the healthy "
                           f"fabric (clustersim run simulates the faults)")
    assert main(["topology", "examples/demo.yaml"]) == 0
    assert capsys.readouterr().err == ""


def test_graphml_text_in_a_numeric_attribute_is_explained(tmp_path):
    import re

    from topologies.cluster import TopologyError
    from topologies.custom import load_topology
    from topologies.export import cluster_to_graphml
    path = tmp_path / "racks.graphml"
    cluster_to_graphml(cluster_from_dict(_two_racks()), path)
    text = path.read_text()
    key = re.search(r'<key id="(\w+)" for="edge" attr.name="bandwidth" attr.type="double"', text).group(1)
    path.write_text(re.sub(rf'(<data key="{key}">)[^<]+', r"\1fast", text, count=1))
    with pytest.raises(TopologyError, match="could not convert string to float: 'fast'; an attribute its <key> "
                                            "declares numeric"):
        load_topology(path)


def test_fp8_on_a100_lists_only_dtypes_a_step_can_be_given():
    """The list offered tf32, which training.dtype then refused (tf32 is a GEMM mode of fp32 training)."""
    from simulator.experiment import experiment_from_dict, run_experiment
    doc = {"cluster": {"preset": "dgx-a100", "nodes": 1}, "model": {"preset": "gpt2-small"},
           "parallel": {"tp": 4, "dp": 2}, "training": {"seq_len": 1024, "dtype": "fp8"}}
    with pytest.raises(ValueError, match=r"^training\.dtype: 'fp8' is not supported by A100-80GB-SXM; valid: "
                                         r"bf16, fp16, fp32$"):
        run_experiment(experiment_from_dict(doc))


@pytest.mark.parametrize("key, value", [("training", "bf16"), ("options", "x"), ("compute", "fast"),
                                        ("parallel", "tp8"), ("moe", "zipf"), ("network", "fast")])
def test_a_section_given_as_text_is_refused_as_such(key, value):
    """'training: bf16' read 'training.preset: unknown field', a field the user never wrote; only cluster and
    model take a bare preset name."""
    from simulator.experiment import experiment_from_dict
    from workloads.errors import ConfigError
    doc = {"cluster": "dgx-h100", "model": "gpt2-small", "parallel": {"tp": 4, "dp": 8},
           "training": {"seq_len": 1024}}
    assert experiment_from_dict(doc).model.name == "gpt2-small"  # the two preset shorthands
    with pytest.raises(ConfigError, match=rf"^{key}: must be a mapping of fields .* got the text '{value}'$"):
        experiment_from_dict({**doc, key: value})


def test_fidelity_screen_in_a_run_file_says_it_is_for_sweeps():
    from simulator.experiment import experiment_from_dict
    from workloads.errors import ConfigError
    doc = {"cluster": "dgx-h100", "model": "gpt2-small", "parallel": {"tp": 4, "dp": 8},
           "training": {"seq_len": 1024}, "fidelity": "screen"}
    with pytest.raises(ConfigError, match=r"^fidelity: 'screen' ranks sweep points without simulating them \("
                                          r"clustersim sweep --fidelity screen\); a run simulates the step: valid: "
                                          r"fast, full, lockstep$"):
        experiment_from_dict(doc)


def _run_out_of_memory(tmp_path, capsys, text: str) -> tuple:
    """``clustersim run`` of the experiment ``text``, which must not fit: (its path, the one-line error)."""
    from simulator.cli import main
    path = tmp_path / "oom.yaml"
    path.write_text(text)
    assert main(["run", str(path)]) == 2
    return path, capsys.readouterr().err.strip()


def test_out_of_memory_names_the_file_and_the_remedies_and_force_flags_it(tmp_path, capsys):
    from simulator.cli import main
    path, err = _run_out_of_memory(
        tmp_path, capsys, "cluster: {preset: dgx-h100, nodes: 2}\nmodel: {preset: llama3-70b, layers: 8}\n"
        "parallel: {tp: 1, pp: 1, dp: 16, micro_batch: 1, global_batch: 16}\ntraining: {seq_len: 1024}\n")
    assert err.startswith(f"clustersim: error: {path}: out of memory: stage 0: ") and "\n" not in err
    # the remedies that fit, each one change of the layout, with the memory it leaves: ZeRO-1 shards the Adam
    # state over the 16 DP ranks (Rajbhandari et al.; by hand from the breakdown), ZeRO-2 the gradients too
    # (in the implementation's own buffers: less again), ZeRO-3 the parameters
    p, g, o, a = map(float, re.search(r"params ([\d.]+) GB \+ grads ([\d.]+) GB \+ optimizer ([\d.]+) GB \+ "
                                      r"activations ([\d.]+) GB", err).groups())
    fits = dict(re.findall(r"(parallel\.zero: \d) \(([\d.]+) GB\)", err))
    assert set(fits) == {"parallel.zero: 1", "parallel.zero: 2", "parallel.zero: 3"}
    assert float(fits["parallel.zero: 1"]) == pytest.approx(p + g + o / 16 + a, abs=0.2)
    assert float(fits["parallel.zero: 3"]) < float(fits["parallel.zero: 2"]) < float(fits["parallel.zero: 1"])
    assert "recompute" not in err  # full recomputation would leave 2.8 GB of activations: still over 80 GB
    assert err.endswith("(or use --force to simulate anyway)")
    assert main(["run", str(path), "--force", "--no-progress"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "memory per GPU" in x)
    assert line.endswith("does not fit in the GPU (simulated with --force)")


@pytest.mark.parametrize("value", [1e9, 0.002, True])
def test_op_overhead_above_a_millisecond_is_refused(value):
    from simulator.compute import ComputeModel
    from topologies import get_gpu
    with pytest.raises(ValueError, match=r"^compute\.op_overhead_s: must be a finite number of seconds in \[0, "
                                         r"0\.001\]"):
        ComputeModel(get_gpu("H100"), op_overhead_s=value)
    assert ComputeModel(get_gpu("H100"), op_overhead_s=1e-3).op_overhead_s == 1e-3


def test_readme_lists_every_model_and_cluster_preset():
    from topologies.loader import PRESETS as CLUSTERS
    from workloads.models import PRESETS as MODELS
    with open("README.md") as f:
        text = f.read()
    cluster_line = next(x for x in text.splitlines() if x.strip().startswith("preset: dgx-h100"))
    model_line = next(x for x in text.splitlines() if x.strip().startswith("preset: gpt3-175b"))
    assert all(name in cluster_line for name in CLUSTERS)
    assert all(name in model_line or name.replace("llama3-", "") in model_line for name in MODELS)


def test_a_small_models_size_reads_in_millions():
    from simulator.experiment import describe_setup, experiment_from_dict
    exp = experiment_from_dict({"cluster": {"preset": "dgx-h100", "nodes": 1}, "model": {"preset": "gpt2-small"},
                                "parallel": {"tp": 1, "dp": 8}, "training": {"seq_len": 1024}})
    line = describe_setup(exp)["model"]
    assert line.startswith(f"gpt2-small: {exp.model.total_params() / 1e6:,.1f} M parameters, 12 layers")


def test_moe_model_fields_that_do_nothing_are_noted():
    from simulator.experiment import experiment_from_dict, unused_settings
    base = {"cluster": {"preset": "dgx-h100", "nodes": 1}, "parallel": {"tp": 1, "dp": 8},
            "training": {"seq_len": 1024}}
    dense = experiment_from_dict({**base, "model": {"preset": "gpt2-small", "moe_ffn_hidden": 128,
                                                    "first_dense_layers": 2}})
    assert unused_settings(dense) == [
        f"model.{k} has no effect: model gpt2-small has no experts (model.experts, model.top_k)"
        for k in ("moe_ffn_hidden", "first_dense_layers")]
    no_moe_layer = experiment_from_dict({**base, "parallel": {"tp": 1, "dp": 8, "ep": 2}, "model": {
        "preset": "gpt2-small", "experts": 8, "top_k": 2, "first_dense_layers": 12}})
    assert unused_settings(no_moe_layer) == [
        "model: no layer of gpt2-small is a MoE layer (first_dense_layers 12, moe_layer_freq 1, 12 layers): its "
        "experts have no effect; the step is dense"]
    some = experiment_from_dict({**base, "parallel": {"tp": 1, "dp": 8, "ep": 2}, "model": {
        "preset": "gpt2-small", "experts": 8, "top_k": 2, "first_dense_layers": 11}})
    assert unused_settings(some) == []


@pytest.mark.parametrize("base", [{"cluster": {"preset": "dgx-h100"}, "model": "gpt2-small"},
                                  {"cluster": "dgx-h100"}, {"model": "tiny"}, {"cluster": 5}])
def test_sweep_keys_without_a_topology_file_are_the_documented_hash(base):
    """Keys of sweeps that read no topology file stay SHA-256 of the base and overrides alone (their outputs
    resume as before the topology digest was added); a malformed cluster section gives a key, not an error."""
    import hashlib
    import json

    from simulator.sweeps.points import point_key
    overrides = {"parallel.tp": 2, "cluster.nodes": 2}
    text = json.dumps({"base": base, "overrides": overrides}, sort_keys=True, default=str)
    assert point_key(base, overrides) == hashlib.sha256(text.encode()).hexdigest()[:16]


def test_a_degraded_link_below_one_megabyte_per_second_is_refused():
    """fraction 1e-6 of a 50 GB/s NIC cable left 5e4 B/s, under the 1 MB/s floor every other link obeys."""
    from simulator.experiment import experiment_from_dict
    from topologies.cluster import TopologyError
    doc = {"cluster": {"preset": "dgx-h100", "nodes": 2}, "model": "gpt2-small", "parallel": {"tp": 4, "dp": 4},
           "training": {"seq_len": 1024},
           "faults": [{"kind": "degraded_link", "link": ["nic:0:0", "leaf:0"], "fraction": 1e-6}]}
    with pytest.raises(TopologyError, match=r"^faults\[0\]\.fraction: 1e-06 leaves the cable \[nic:0:0, leaf:0\] "
                                            r"at 50000 bytes/s, below the 1e\+06 a link needs"):
        experiment_from_dict(doc)
    doc["faults"][0]["fraction"] = 0.02  # 1 GB/s: a link
    assert experiment_from_dict(doc).faults


def test_a_gpu_without_its_nic_and_nvswitch_borrows_nothing():
    """nic_down with the server's NVSwitch down too simulated the GPU's traffic over an NVLink edge to a
    neighbour's NIC that no longer exists (found by the faults helper); it is refused as a partition now, while
    nic_down alone still borrows (and runs slower than the healthy fabric)."""
    from simulator.experiment import experiment_from_dict, run_experiment
    from topologies.cluster import TopologyError
    base = {"cluster": {"preset": "dgx-h100", "nodes": 2}, "model": "gpt2-small", "parallel": {"tp": 4, "dp": 4},
            "training": {"seq_len": 1024}}
    nic = {"kind": "nic_down", "gpu": 0}
    with pytest.raises(TopologyError, match=r"^faults\[0\]\.gpu: rank 0 \(gpu:0:0\) loses its NIC and its NVSwitch is "
                                            r"down, so it reaches no neighbour's NIC over NVLink"):
        experiment_from_dict({**base, "faults": [nic, {"kind": "switch_down", "switch": "nvswitch:0"}]})
    alone = run_experiment(experiment_from_dict({**base, "faults": [nic]}))
    assert alone.summary["fault_slowdown"] > 1


def test_out_of_memory_without_a_single_change_that_fits_gives_the_general_hint(tmp_path, capsys):
    """Llama 3 405B on one server (TP 8, no DP to shard over): no one change of the layout fits, and 16 of its
    layers' states alone (16 bytes a parameter) exceed the server's memory (the general hint names only knobs with
    room left since the twenty-second session, tests/test_audit22.py)."""
    _path, err = _run_out_of_memory(
        tmp_path, capsys, "cluster: {preset: dgx-h100, nodes: 1}\nmodel: {preset: llama3-405b, layers: 16}\n"
        "parallel: {tp: 8, pp: 1, dp: 1}\ntraining: {seq_len: 1024}\n")
    assert "; the cluster is too small: the model's states alone" in err
    assert err.endswith("sharded over all (or use --force to simulate anyway)")
