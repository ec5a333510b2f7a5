"""``lockstep`` on Megatron-Core's expert grid (``etp != tp`` or ``cp > 1`` with experts; 2026-12-05).

On the grid a stage's EP groups are segments of its ranks in tp-cp-dp order, so a rank's TP and CP peers are
other EP members. Where one rank can issue for its whole EP group (balanced routing; skewed routing without an
expert-TP gather per member, shared-expert overlap, a split backward or stragglers) the lockstep representative
stands for its stage's whole block: every other EP, TP, CP and DP group of the stage is a translate of its own
(``simulator.engine.lanes``). Truths: ``full`` simulates every rank; every replica's flows still cross the
fabric, so bytes per traffic class are exactly ``full``'s; the step agrees within the fraction of a percent that
dense CP steps show (their ring's representative).
"""

from __future__ import annotations

import pytest

from simulator.experiment import build_step, experiment_from_dict, representatives_for, run_experiment

MOE = {"name": "moe-small", "layers": 2, "hidden": 1024, "heads": 8, "kv_heads": 8, "ffn_hidden": 4096,
       "vocab": 32000, "gated_mlp": True, "tied_embeddings": False, "experts": 8, "top_k": 2,
       "moe_ffn_hidden": 1024, "max_seq_len": 8192}


def _doc(tp, cp, dp, ep, etp, routing, pp=1, **model):
    gpus = tp * cp * dp * pp
    return {"cluster": {"preset": "dgx-h100", "nodes": max(1, gpus // 8), "gpus_per_node": min(8, gpus)},
            "model": {**MOE, **model},
            "parallel": {"tp": tp, "cp": cp, "dp": dp, "pp": pp, "ep": ep, "etp": etp, "micro_batch": 1,
                         "global_batch": 2 * dp, "sequence_parallel": tp > 1},
            "training": {"seq_len": 2048}, "moe": {"routing": routing}}


CASES = [  # (tp, cp, dp, ep, etp, routing, pp)
    (2, 1, 4, 8, 1, "zipf", 1),       # NeMo's DeepSeek-V3 H100 shape: TP 2, expert TP 1, EP over the stage
    (2, 1, 4, 4, 1, "uniform", 2),    # two EP groups per stage, two stages
    (1, 2, 4, 4, 1, "zipf", 1),       # the grid from CP (Mixtral 8x22B's NeMo layout, small)
    (2, 2, 2, 4, 2, "balanced", 1),   # expert TP 2 under balanced routing: one program per EP index
]


IDS = [f"tp{c[0]}cp{c[1]}dp{c[2]}ep{c[3]}etp{c[4]}-{c[5]}-pp{c[6]}" for c in CASES]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_lockstep_stands_for_the_stage_and_agrees_with_full(case):
    tp, cp, dp, ep, etp, routing, pp = case
    exp = experiment_from_dict(_doc(tp, cp, dp, ep, etp, routing, pp))
    replicas = build_step(exp, representatives_for(exp, "lockstep"), True).graph.replicas
    assert replicas is not None and len(replicas) == pp                      # one rank per stage
    assert all(len(block) == tp * cp * dp for block in replicas.values())    # each for its whole stage
    full = run_experiment(exp, fidelity="full", force=True)
    lock = run_experiment(exp, fidelity="lockstep", force=True)
    assert lock.step_time == pytest.approx(full.step_time, rel=0.01)
    for cls, nbytes in full.bytes_by_class.items():
        assert lock.bytes_by_class[cls] == pytest.approx(nbytes, rel=1e-9), cls


@pytest.mark.parametrize("why", ["etp", "shared_overlap"])
def test_skewed_grids_a_rank_cannot_stand_for_run_every_rank(why):
    # Under zipf routing: expert TP 2 (each member's gather carries its own load), or the shared expert
    # overlapping the exchanges (a faster member starts it early): lockstep emits every rank, as full does.
    doc = (_doc(1, 1, 8, 4, 2, "zipf") if why == "etp" else
           {**_doc(2, 1, 4, 8, 1, "zipf", shared_experts=1),
            "moe": {"routing": "zipf", "shared_expert_overlap": True}})
    exp = experiment_from_dict(doc)
    assert build_step(exp, representatives_for(exp, "lockstep"), True).graph.replicas is None
    assert (run_experiment(exp, fidelity="lockstep", force=True).step_time
            == run_experiment(exp, fidelity="full", force=True).step_time)


@pytest.mark.parametrize("why", ["shared_in_order", "overlap_without_shared"])
def test_skewed_grids_with_nothing_beside_the_experts_stand_for_the_stage(why):
    # The fallback above is for work a faster member would start early; a shared expert run in the layer's
    # order (no overlap), or shared_expert_overlap on a model without a shared expert (nothing to overlap),
    # leaves none: under zipf routing with expert TP 1 one rank still stands for the stage, and agrees with
    # full (which simulates every member at its own load).
    doc = (_doc(2, 1, 4, 8, 1, "zipf", shared_experts=1) if why == "shared_in_order" else
           {**_doc(2, 1, 4, 8, 1, "zipf"), "moe": {"routing": "zipf", "shared_expert_overlap": True}})
    exp = experiment_from_dict(doc)
    replicas = build_step(exp, representatives_for(exp, "lockstep"), True).graph.replicas
    assert replicas is not None and [len(block) for block in replicas.values()] == [8]
    full = run_experiment(exp, fidelity="full", force=True)
    lock = run_experiment(exp, fidelity="lockstep", force=True)
    assert lock.step_time == pytest.approx(full.step_time, rel=0.01)
    for cls, nbytes in full.bytes_by_class.items():
        assert lock.bytes_by_class[cls] == pytest.approx(nbytes, rel=1e-9), cls
