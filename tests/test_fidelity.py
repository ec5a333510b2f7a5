"""fidelity="fast" (one representative per TP group) and "lockstep" (one per pipeline stage) against
fidelity="full" (every rank).

Fast mode runs one program per TP group but still puts every member's DP/PP
flows and the whole group's TP collectives on the network, so link loads and
contention are those of the full run. Tolerance: step time within 2% (in
practice the two agree to ~1e-12 on these configurations; they may drift
apart slightly where DP replicas of different TP ranks contend, since a
representative waits for the slowest of its replicas' flows). "lockstep" aggregates DP replicas too; it
is exact where they see the same contention (these configurations and the GPT-3 ladder up to 1,024 GPUs
within 0.003%) and pessimistic where they do not (docs/DESIGN.md).
"""

import os

import pytest

from simulator.experiment import experiment_from_dict, run_experiment

TOLERANCE = 0.02

CONFIGS = {
    "tp4-pp2-dp2-zero1": ({"nodes": 2}, {"tp": 4, "pp": 2, "dp": 2, "zero": 1}),
    "tp2-pp2-dp4-zero0": ({"nodes": 2}, {"tp": 2, "pp": 2, "dp": 4, "zero": 0}),
    "tp8-pp2-dp2-zero3": ({"nodes": 4, "nodes_per_leaf": 2, "spines": 2}, {"tp": 8, "pp": 2, "dp": 2, "zero": 3}),
    "tp2-pp2-dp16-interleaved-oversub": ({"nodes": 8, "nodes_per_leaf": 2, "spines": 1, "oversubscription": 4},
                                        {"tp": 2, "pp": 2, "dp": 16, "zero": 1, "schedule": "interleaved",
                                         "virtual_stages": 2}),
    "tp8-pp1-dp8-ps": ({"nodes": 8, "nodes_per_leaf": 4, "spines": 2},
                       {"tp": 8, "pp": 1, "dp": 8, "zero": 0, "dp_sync": "parameter_server"}),
    "tp1-pp4-dp4-gpipe-zero2": ({"nodes": 2}, {"tp": 1, "pp": 4, "dp": 4, "zero": 2, "schedule": "gpipe"}),
    "tp1-pp1-dp16-zero3": ({"nodes": 2, "nodes_per_leaf": 1, "spines": 2}, {"tp": 1, "pp": 1, "dp": 16, "zero": 3}),
}


def _doc(cluster: dict, parallel: dict) -> dict:
    par = {"micro_batch": 1, "schedule": "1f1b", "sequence_parallel": parallel["tp"] > 1, **parallel}
    par["global_batch"] = 4 * par["dp"] * par["micro_batch"]
    return {"cluster": {"preset": "dgx-h100", **cluster}, "model": _model(parallel),
            "parallel": par, "training": {"seq_len": 1024}}


def _model(parallel: dict) -> dict:
    # gpt2-small with 16 heads so that TP 8 divides them.
    return {"preset": "gpt2-small", "heads": 16, "kv_heads": 16}


@pytest.mark.parametrize("fidelity", ["fast", "lockstep"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_fast_agrees_with_full(name, fidelity):
    exp = experiment_from_dict(_doc(*CONFIGS[name]))
    full = run_experiment(exp, force=True, fidelity="full")
    fast = run_experiment(exp, force=True, fidelity=fidelity)
    assert fast.step_time == pytest.approx(full.step_time, rel=TOLERANCE)
    # The network sees the same flows and bytes either way.
    assert fast.summary["flows"] == full.summary["flows"]
    for cls, b in full.bytes_by_class.items():
        assert fast.bytes_by_class[cls] == pytest.approx(b, rel=1e-9)
    # Metrics that average over ranks see every rank in both modes.
    assert len(fast.ops) == len(full.ops)
    assert fast.summary["hardware_flops_per_step"] == pytest.approx(full.summary["hardware_flops_per_step"])
    assert fast.summary["bubble_fraction"] == pytest.approx(full.summary["bubble_fraction"], abs=TOLERANCE)
    assert fast.exposed_comm_s == pytest.approx(full.exposed_comm_s, rel=TOLERANCE, abs=1e-3 * full.step_time)
    # Representatives simulate fewer ops (fast: when TP > 1). (Not "fewer events": compute ends due together
    # share one event, and the DP replicas of a full run end theirs together.)
    if fidelity == "lockstep" or exp.parallel.tp > 1:
        assert len(fast.record.graph.ops) < len(full.record.graph.ops)


def test_lockstep_stands_one_rank_for_each_stage_block():
    from workloads.training import training_step
    exp = experiment_from_dict(_doc({"nodes": 2}, {"tp": 2, "pp": 2, "dp": 4, "zero": 1}))
    step = training_step(exp.model, exp.parallel, exp.training, exp.options, representatives="stage")
    replicas = step.graph.replicas
    assert sorted(replicas) == [0, 8]  # tp = dp = 0 of each stage (placement tp, dp, pp)
    assert replicas[0] == (0, 1, 2, 3, 4, 5, 6, 7)  # DP-major: TP groups (0,1), (2,3), ... are rows
    assert {op.rank for op in step.graph.ops} == {0, 8}


@pytest.mark.parametrize("routing", ["uniform", "zipf"])
def test_lockstep_of_a_skewed_moe_model_stands_one_rank_for_each_stage(routing):
    # TP2, DP8 with EP4: two EP groups per stage. Routing is drawn per layer, the same in every EP group: the
    # ranks with one EP index in every EP group (and their TP peers) run one program. (Without TP one
    # representative per stage issues for its whole EP group at its slowest member's load,
    # tests/test_lockstep_skewed_moe.py; with TP the dispatcher's all-gather over each member's TP group carries
    # that member's own load, so lockstep keeps one per stage and EP index.)
    doc = _doc({"nodes": 4, "nodes_per_leaf": 2, "spines": 2}, {"tp": 2, "pp": 2, "dp": 8, "ep": 4, "zero": 1})
    doc["model"] = {"preset": "mixtral-8x7b", "layers": 4, "hidden": 512, "ffn_hidden": 1024, "heads": 8,
                    "kv_heads": 8, "vocab": 1000}
    doc["moe"] = {"routing": routing, "seed": 3}
    exp = experiment_from_dict(doc)
    full = run_experiment(exp, force=True, fidelity="full")
    lockstep = run_experiment(exp, force=True, fidelity="lockstep")
    assert len(lockstep.record.graph.replicas) == 2 * 4
    # nothing runs beside the experts; latency-bound flows queue on their links (FlowNetwork._tiny), and a
    # representative's replicated sub-µs flow waits for the latest of its replicas' links: ~2e-9 (~20 ps) apart
    assert lockstep.step_time == pytest.approx(full.step_time, rel=1e-8)
    assert lockstep.summary["flows"] == full.summary["flows"]
    for cls, b in full.bytes_by_class.items():
        assert lockstep.bytes_by_class[cls] == pytest.approx(b, rel=1e-9)
    assert lockstep.summary["moe"] == full.summary["moe"]
    assert len(lockstep.record.graph.ops) < len(full.record.graph.ops)


BALANCED = {  # name -> (parallel, moe, cluster) overrides of a 32-GPU, 2-stage tiny Mixtral with 16 experts
    "all_to_all-tp2": ({"tp": 2, "dp": 8, "ep": 4}, {}, {}),
    # EP 16 over two 8-GPU nodes: DeepEP forwards over NVLink; one EP group per stage
    "deepep-ep16": ({"dp": 16, "ep": 16}, {"dispatch": "deepep"}, {}),
    # 4-GPU nodes: two EP groups per stage, each over two nodes (forwarding in both lanes)
    "deepep-two-groups": ({"dp": 16, "ep": 8}, {"dispatch": "deepep", "max_nodes": 1}, {"gpus_per_node": 4,
                                                                                      "nodes": 8}),
    "interleaved": ({"dp": 16, "ep": 8, "schedule": "interleaved", "virtual_stages": 2}, {}, {}),
    "capacity-padded": ({"dp": 16, "ep": 8}, {"capacity_factor": 1.25, "pad_to_capacity": True}, {}),
    "zero3": ({"tp": 2, "dp": 8, "ep": 8, "zero": 3}, {}, {}),
    "dualpipe-deepep": ({"dp": 16, "ep": 8, "schedule": "dualpipe", "placement": ["tp", "dp", "pp"]},
                        {"dispatch": "deepep"}, {"gpus_per_node": 4, "nodes": 8}),
}


@pytest.mark.parametrize("name", sorted(BALANCED))
def test_lockstep_of_a_balanced_moe_model_stands_one_rank_for_each_stage(name):
    # Balanced routing: every EP rank computes the same load and its rows are its peers' relabelled, so every
    # rank of a stage runs one program and lockstep needs one representative per stage (as for a dense model);
    # it issues each all-to-all for its whole EP group, every member's row carried along.
    parallel, moe, cluster = BALANCED[name]
    tp = parallel.get("tp", 1)
    doc = _doc({"nodes": 4, "nodes_per_leaf": 2, "spines": 2, **cluster}, {"tp": tp, "pp": 2, "zero": 1, **parallel})
    doc["model"] = {"preset": "mixtral-8x7b", "layers": 4, "hidden": 512, "ffn_hidden": 1024, "heads": 8,
                    "kv_heads": 8, "vocab": 1000, "experts": 16}
    doc["moe"] = {"routing": "balanced", **moe}
    exp = experiment_from_dict(doc)
    full = run_experiment(exp, force=True, fidelity="full")
    lockstep = run_experiment(exp, force=True, fidelity="lockstep")
    replicas = lockstep.record.graph.replicas
    assert len(replicas) == 2 and all(len(block) == 16 for block in replicas.values())  # one per stage block
    assert {op.rank for op in lockstep.record.graph.ops} == set(replicas)
    # Measured: equal to the last bit, but on 4-GPU nodes (two EP groups per stage), whose expert-DP pairs cross
    # unlike paths (some over a spine, some not) while their gradient buckets overlap the backward's
    # exchanges: the block's members then finish their reductions at different times and lockstep prices them
    # all as its representative's: -0.03% (deepep-two-groups), -0.09% (dualpipe-deepep) (docs/DESIGN.md:
    # exact only where replicas see the same contention). Elsewhere ~2e-9 since latency-bound flows queue on
    # their links (FlowNetwork._tiny): a representative's replicated sub-µs flow waits for the latest of its
    # replicas' links.
    tolerance = 1e-3 if cluster.get("gpus_per_node") == 4 else 1e-8
    assert lockstep.step_time == pytest.approx(full.step_time, rel=tolerance)
    assert lockstep.summary["flows"] == full.summary["flows"]
    for cls, b in full.bytes_by_class.items():
        assert lockstep.bytes_by_class[cls] == pytest.approx(b, rel=1e-9)
    assert lockstep.links["bytes"].to_numpy() == pytest.approx(full.links["bytes"].to_numpy(), rel=1e-9)
    assert lockstep.summary["moe"] == full.summary["moe"]
    assert len(lockstep.record.graph.ops) * 16 == len(full.record.graph.ops)  # each stands for 16 ranks' ops


@pytest.mark.parametrize("straggler", [False, True])
def test_lockstep_runs_as_fast_where_one_stages_ep_groups_need_different_deepep_matrices(straggler):
    # Pipeline-inner placement on 3 nodes: EP group (0, 3) lies on one node, (6, 9) on two, so DeepEP sends
    # them different matrices and no rank can stand for both (found by review: the stage's representative
    # used to replay its own group's matrix on the other, -12% EP bytes). Lockstep falls back to fast's
    # representatives (none at TP 1) and equals full. With a straggler too (lockstep then asks for a
    # representative per EP index, "stage_ep", which skipped this check: found in the twentieth session).
    doc = _doc({"nodes": 3}, {"tp": 1, "pp": 3, "dp": 8, "ep": 2, "zero": 1, "placement": ["tp", "pp", "dp"]})
    doc["model"] = {"preset": "mixtral-8x7b", "layers": 6, "hidden": 512, "ffn_hidden": 1024, "heads": 8,
                    "kv_heads": 8, "vocab": 1000, "experts": 16}
    doc["moe"] = {"routing": "balanced", "dispatch": "deepep", "max_nodes": 1}
    if straggler:
        doc["faults"] = [{"kind": "straggler", "gpu": 5, "factor": 1.2}]
    exp = experiment_from_dict(doc)
    full = run_experiment(exp, force=True, fidelity="full")
    lockstep = run_experiment(exp, force=True, fidelity="lockstep")
    assert lockstep.record.graph.replicas is None
    assert lockstep.step_time == full.step_time
    assert lockstep.bytes_by_class["ep"] == pytest.approx(full.bytes_by_class["ep"], rel=1e-12)


def test_lockstep_on_the_256_gpu_benchmark_rung():
    # GPT-3 175B, TP8 PP8 DP4 on 32 DGX nodes over 2 leaves (benchmarks/): DP replicas cross a leaf boundary.
    from simulator.experiment import load_experiment
    exp = load_experiment(os.path.join(os.path.dirname(__file__), "..", "benchmarks", "gpt3-175b-256.yaml"))
    full = run_experiment(exp, force=True, fidelity="full")
    lockstep = run_experiment(exp, force=True, fidelity="lockstep")
    assert lockstep.step_time == pytest.approx(full.step_time, rel=TOLERANCE)
    assert lockstep.summary["flows"] == full.summary["flows"]
    assert len(lockstep.record.graph.ops) < len(full.record.graph.ops) / 4


def test_fast_is_the_default_and_deterministic():
    exp = experiment_from_dict(_doc(*CONFIGS["tp4-pp2-dp2-zero1"]))
    assert exp.fidelity == "fast"
    a, b = run_experiment(exp, force=True), run_experiment(exp, force=True)
    assert a.step_time == b.step_time
    assert (a.links["bytes"].to_numpy() == b.links["bytes"].to_numpy()).all()


def test_unknown_fidelity_is_rejected():
    from workloads.errors import ConfigError
    doc = _doc(*CONFIGS["tp4-pp2-dp2-zero1"])
    doc["fidelity"] = "medium"
    with pytest.raises(ConfigError, match="fidelity"):
        experiment_from_dict(doc)


def test_lockstep_with_blocking_pipeline_transfers_matches_full():
    doc = _doc({"nodes": 4, "nodes_per_leaf": 2, "spines": 2}, {"tp": 4, "pp": 4, "dp": 2, "zero": 1})
    doc["options"] = {"p2p": "blocking"}
    exp = experiment_from_dict(doc)
    full = run_experiment(exp, force=True, fidelity="full")
    lockstep = run_experiment(exp, force=True, fidelity="lockstep")
    assert lockstep.step_time == pytest.approx(full.step_time, rel=TOLERANCE)
    assert len(lockstep.record.graph.ops) < len(full.record.graph.ops)


def test_lockstep_is_pessimistic_where_replicas_see_different_contention():
    # A deliberately comm-bound step: 8 stages on 8 single-server leaves, 4 spines at 8:1, 4 micro-batches.
    # ECMP sends some replicas' pipeline transfers through the same spine link and others not; in lockstep
    # every transfer waits for its slowest replica (documented in docs/DESIGN.md: +13.9% here).
    doc = _doc({"nodes": 8, "nodes_per_leaf": 1, "spines": 4, "oversubscription": 8},
               {"tp": 2, "pp": 8, "dp": 4, "zero": 1})
    doc["model"] = {"preset": "gpt2-small", "heads": 16, "kv_heads": 16, "hidden": 2048, "layers": 16,
                    "max_seq_len": 2048}
    doc["training"] = {"seq_len": 2048}
    exp = experiment_from_dict(doc)
    full = run_experiment(exp, force=True, fidelity="full")
    fast = run_experiment(exp, force=True, fidelity="fast")
    lockstep = run_experiment(exp, force=True, fidelity="lockstep")
    assert fast.step_time == pytest.approx(full.step_time, rel=TOLERANCE)
    assert lockstep.step_time > 1.05 * full.step_time


@pytest.mark.parametrize("placement", [["dp", "tp", "pp"], ["pp", "dp", "tp"], ["tp", "pp", "dp"]])
def test_lockstep_lanes_follow_coordinates_not_rank_order(placement):
    doc = _doc({"nodes": 4, "nodes_per_leaf": 2, "spines": 2},
               {"tp": 2, "pp": 2, "dp": 8, "zero": 1, "placement": placement})
    exp = experiment_from_dict(doc)
    full = run_experiment(exp, force=True, fidelity="full")
    lockstep = run_experiment(exp, force=True, fidelity="lockstep")
    assert lockstep.step_time == pytest.approx(full.step_time, rel=TOLERANCE)
    assert lockstep.summary["flows"] == full.summary["flows"]
    assert (lockstep.links["bytes"].to_numpy() == pytest.approx(full.links["bytes"].to_numpy(), rel=1e-9))
