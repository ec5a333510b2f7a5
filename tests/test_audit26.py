"""Twenty-sixth session's fixes: each test fails on the session's starting code (3dd89b7)."""

from __future__ import annotations

import pytest

from simulator.experiment import experiment_from_dict, run_experiment


def _mixtral(recompute: str) -> dict:
    """A 4-layer Mixtral on 16 GPUs (TP2 PP2 DP4 EP4, skewed routing), communication SMs off so that the
    compute categories are the kernels' own time."""
    return {"cluster": {"preset": "dgx-h100", "nodes": 2},
            "model": {"preset": "mixtral-8x7b", "layers": 4},
            "parallel": {"tp": 2, "pp": 2, "dp": 4, "ep": 4, "micro_batch": 1, "global_batch": 16, "zero": 1,
                         "sequence_parallel": True, "recompute": recompute},
            "training": {"seq_len": 1024}, "moe": {"routing": "zipf", "seed": 0},
            "compute": {"comm_sms": 0, "p2p_sms": 0}}


def test_moe_recomputation_is_recompute_not_backward():
    """Recomputation re-runs forward kernels; it adds no backward work. A MoE layer's backward folded its
    recomputed forward into its first op (``B….pre``), so the breakdown filed it under backward: with
    ``full`` the backward read 46% longer than without recomputation, and no stage had a recompute time."""
    none, full, core = (run_experiment(experiment_from_dict(_mixtral(r)), force=True)
                        for r in ("none", "full", "selective"))
    for r in (full, core):
        assert r.summary["time_breakdown_s"]["backward"] == pytest.approx(
            none.summary["time_breakdown_s"]["backward"], rel=1e-12)
        assert (r.stages["recompute_s"] > 0).all()
    # full recomputation re-runs each stage's forward: all of stage 0's but the embedding lookup
    first = full.stages.iloc[0]
    assert first["recompute_s"] == pytest.approx(first["forward_s"], rel=0.02)
    assert full.step_time > core.step_time > none.step_time * (1 - 1e-12)
