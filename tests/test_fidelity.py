"""fidelity="fast" (one representative per TP group) against fidelity="full" (every rank).

Fast mode runs one program per TP group but still puts every member's DP/PP
flows and the whole group's TP collectives on the network, so link loads and
contention are those of the full run. Tolerance: step time within 2% (in
practice the two agree to ~1e-12 on these configurations; they may drift
apart slightly where DP replicas of different TP ranks contend, since a
representative waits for the slowest of its replicas' flows).
"""

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
}


def _doc(cluster: dict, parallel: dict) -> dict:
    par = {"micro_batch": 1, "schedule": "1f1b", "sequence_parallel": parallel["tp"] > 1, **parallel}
    par["global_batch"] = 4 * par["dp"] * par["micro_batch"]
    return {"cluster": {"preset": "dgx-h100", **cluster}, "model": _model(parallel),
            "parallel": par, "training": {"seq_len": 1024}}


def _model(parallel: dict) -> dict:
    # gpt2-small with 16 heads so that TP 8 divides them.
    return {"preset": "gpt2-small", "heads": 16, "kv_heads": 16}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_fast_agrees_with_full(name):
    exp = experiment_from_dict(_doc(*CONFIGS[name]))
    full = run_experiment(exp, force=True, fidelity="full")
    fast = run_experiment(exp, force=True, fidelity="fast")
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
    # Fast mode simulates fewer ops, hence fewer engine events (when TP > 1).
    assert fast.events < full.events


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
