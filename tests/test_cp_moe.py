"""Context parallelism with mixture-of-experts models (``parallel.cp > 1`` with ``model.experts``; 2026-12-05).

Truths used (hand counts and published sources, never the code's own numbers):

* Megatron-Core's "MoE parallel folding" (NVIDIA/Megatron-LM megatron/core/parallel_state.py,
  ``initialize_model_parallel``): the attention side enumerates a pipeline stage's ranks in the order
  tp-cp-dp (``decoder_rank_generator``, order ``tp-cp-ep-dp-pp``), the expert side reads the same ranks as
  etp-ep-edp (``expert_decoder_rank_generator`` with ``cp=1``, ``expert_data_parallel_size =
  decoder_world_size // (etp * ep * pp)``, a ``RuntimeError`` when that does not divide);
* every rank routes its own ``b s / cp`` tokens (``/ tp`` under sequence parallelism): with balanced routing
  and top-k a rank sends ``b (s / cp) k / ep`` token copies to each EP peer, ``(ep - 1) / ep`` of its
  ``b (s / cp) k h`` elements leave it, per dispatch, combine and their two gradients, per layer and
  micro-batch;
* ring attention keeps its bytes: ``2 (cp - 1) / cp`` of one K-or-V tensor of the whole sequence per layer and
  forward, twice that backward (tests/test_context_parallel.py);
* ``moe.pad_to_capacity``: every expert padded to ``C = ceil(T k / (E c))`` slots per source rank, ``T`` the
  tokens the rank routes (Megatron-Core's ``get_capacity``).
"""

import math

import pytest

from simulator.experiment import build_step, experiment_from_dict, representatives_for, run_experiment
from workloads.errors import ConfigError
from workloads.memory import routed_rows_factor
from workloads.models import get_preset, model_from_dict
from workloads.parallel import ParallelConfig, RankLayout, TrainingSpec, validate
from workloads.training import training_step

MOE = {"name": "moe-small", "layers": 2, "hidden": 1024, "heads": 8, "kv_heads": 8, "ffn_hidden": 4096,
       "vocab": 32000, "gated_mlp": True, "tied_embeddings": False, "experts": 8, "top_k": 2,
       "moe_ffn_hidden": 1024, "max_seq_len": 8192}
S, H, K, D, L = 2048, 1024, 2, 2, 2


def _doc(tp=1, cp=2, dp=2, ep=4, m=2, routing="balanced", **par):
    return {"cluster": {"preset": "dgx-h100", "nodes": 1, "gpus_per_node": tp * cp * dp},
            "model": MOE,
            "parallel": {"tp": tp, "cp": cp, "dp": dp, "ep": ep, "micro_batch": 1, "global_batch": dp * m,
                         "sequence_parallel": tp > 1, **par},
            "training": {"seq_len": S}, "moe": {"routing": routing}, "options": {"embedding_and_loss": False}}


def _run(doc, fidelity="full"):
    return run_experiment(experiment_from_dict(doc), fidelity=fidelity, force=True)


# ------------------------------------------------------------------ groups
def test_ep_groups_fold_over_cp_and_dp_in_megatron_order():
    # tp 1, cp 2, dp 4, ep 4: stage ranks in order tp-cp-dp are r = cp_i + 2 dp_i; the expert side reads r as
    # ep_i = r % 4, edp_i = r // 4. EP groups: (0, 1, 2, 3), (4, 5, 6, 7), mixing CP and DP ranks (rank 1 is
    # cp 1 / dp 0, rank 2 cp 0 / dp 1); expert-DP groups (0, 4), (1, 5), ...
    lay = RankLayout(ParallelConfig(tp=1, cp=2, dp=4, ep=4))
    assert lay.all_groups("ep") == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert lay.all_groups("expert_dp") == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert lay.coords(1).cp == 1 and lay.coords(2).dp == 1
    # CP2 x DP2 x EP4 with tp 2 (etp = tp): r = tp_i + 2 (cp_i + 2 dp_i); etp_i = r % 2, ep_i = r // 2 % 4, edp 1.
    lay = RankLayout(ParallelConfig(tp=2, cp=2, dp=2, ep=4, sequence_parallel=True))
    assert lay.all_groups("ep") == [(0, 2, 4, 6), (1, 3, 5, 7)]
    assert lay.all_groups("etp") == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert lay.all_groups("expert_dp") == [(r,) for r in range(8)]


# ------------------------------------------------------------------ tokens and bytes
def test_routed_tokens_are_the_rank_local_sequence():
    assert ParallelConfig(cp=4, dp=2, ep=8).routed_tokens(8192) == 8192 // 4
    assert ParallelConfig(tp=2, cp=4, dp=2, ep=8, sequence_parallel=True).routed_tokens(8192) == 8192 // 4 // 2
    assert ParallelConfig(dp=2, ep=2).routed_tokens(8192) == 8192  # cp 1, etp = tp: as before


def test_ep_and_cp_bytes_per_step_closed_form():
    # tp 1, cp 2, dp 2, ep 4, 2 micro-batches per replica, balanced routing. Per rank, layer and micro-batch each
    # of the 4 exchanges (dispatch, combine, their gradients) carries b (s/cp) k h d = 1024 * 2 * 1024 * 2 bytes,
    # (ep - 1)/ep = 3/4 of them to other ranks; each peer's share is a quarter.
    r = _run(_doc())
    ranks, m = 4, 2
    per = 1 * (S // 2) * K * H * D
    assert r.bytes_by_class["ep"] == pytest.approx(ranks * L * m * 4 * per * 3 / 4, rel=1e-12)
    # ring attention as for dense models: K and V of the whole sequence 2 s h d, (cp - 1)/cp of it forward, twice
    # that backward
    kv = 2 * S * H * D
    assert r.bytes_by_class["cp"] == pytest.approx(ranks * L * m * 3 * kv / 2, rel=1e-12)
    st = training_step(*_parts(_doc()))
    row = next(o.split for o in st.graph.ops if o.rank == 0 and o.name.endswith("ep_dispatch"))
    assert row == pytest.approx((per / 4,) * 4, rel=0, abs=0)


def _parts(doc):
    exp = experiment_from_dict(doc)
    return exp.model, exp.parallel, exp.training, exp.options, exp.routing


def test_expert_gemm_flops_use_the_local_sequence():
    # Each rank's experts receive b (s/cp) k token slots (balanced): gated-MLP GEMM FLOPs 2 * rows * 3 h f.
    st = training_step(*_parts(_doc()))
    op = next(o for o in st.graph.ops if o.rank == 0 and o.name == "F0.c0.L0.experts")
    gemm = sum(k.flops for k in op.parts if k.category == "gemm")
    assert gemm == pytest.approx(6 * (S / 2) * K * H * MOE["moe_ffn_hidden"], rel=1e-12)


@pytest.mark.parametrize("routing,extra,one_per_stage", [
    ("balanced", {}, True), ("uniform", {"recompute": "full"}, False), ("balanced", {"recompute": "selective"}, True)])
def test_fast_full_and_lockstep_agree(routing, extra, one_per_stage):
    # fast emits every rank on the expert grid (TP peers are other EP members: different programs); lockstep's
    # representative stands for its stage where one rank can issue for its whole EP group (balanced routing
    # here; uniform routing with etp = tp = 2 cannot: each member's expert-TP gather carries its own load), and
    # agrees with full as dense CP steps do (their CP ring's representative: a fraction of a percent).
    doc = _doc(tp=2, routing=routing, **extra)
    times = {f: _run(doc, f).step_time for f in ("full", "fast", "lockstep")}
    assert times["fast"] == times["full"] > 0
    assert times["lockstep"] == pytest.approx(times["full"], rel=0.01)
    exp = experiment_from_dict(doc)
    replicas = build_step(exp, representatives_for(exp, "lockstep"), True).graph.replicas
    assert (replicas is not None and len(replicas) == 1) == one_per_stage
    if not one_per_stage:
        assert times["lockstep"] == times["full"]


def test_recomputed_attention_passes_its_ring_again():
    # Full recomputation re-runs the forward's attention before the backward: the ring passes K and V once more
    # (forward 1/2, recomputed forward 1/2, backward 2 * 1/2 of 2 s h d per layer and micro-batch).
    r = _run(_doc(recompute="full"))
    assert r.bytes_by_class["cp"] == pytest.approx(4 * L * 2 * 4 * (2 * S * H * D) / 2, rel=1e-12)


def test_capacity_padding_counts_the_rank_local_tokens():
    # T = b s / cp = 1022 tokens routed per rank, k 2, E 8, c 1: C = ceil(2044 / 8) = 256 slots per expert, a rank
    # holds C E = 2048 slots for T k = 2044 choices.
    model = model_from_dict(MOE)
    par = ParallelConfig(cp=2, dp=2, ep=4)
    got = routed_rows_factor(model, par, TrainingSpec(seq_len=2044), 1.0, True)
    assert got == pytest.approx(math.ceil(1022 * 2 / 8) * 8 / (1022 * 2), rel=1e-15)


# ------------------------------------------------------------------ configurations
def test_nemo_mixtral_8x22b_cp8_layout_validates():
    # NVIDIA/NeMo scripts/performance/recommended_model_configs/model_configs_h100.csv: Mixtral 8x22B, 64K tokens,
    # TP4 PP4 CP8 EP8 ETP1 on 256 H100 (dp = 256 / (4 * 4 * 8) = 2); refused before 2026-12-05.
    validate(get_preset("mixtral-8x22b"), ParallelConfig(tp=4, pp=4, cp=8, dp=2, ep=8, etp=1, sequence_parallel=True,
                                                        global_batch=256), TrainingSpec(seq_len=65536))


def test_small_cp_moe_step_runs():
    r = _run(_doc(m=1))
    assert r.step_time > 0 and r.bytes_by_class["ep"] > 0 and r.bytes_by_class["cp"] > 0


@pytest.mark.parametrize("par,match", [
    ({"tp": 1, "cp": 2, "dp": 1, "ep": 4}, r"parallel.ep: etp\*ep = 1\*4 does not divide the 2 ranks"),
    ({"tp": 1, "cp": 2, "dp": 2, "ep": 2, "zero": 3}, "parallel.cp: context parallelism is modelled with Megatron"),
])
def test_impossible_cp_moe_layouts_are_one_line_errors(par, match):
    with pytest.raises(ConfigError, match=match) as err:
        validate(model_from_dict(MOE), ParallelConfig(**par), TrainingSpec(seq_len=S))
    assert "\n" not in str(err.value)


# ------------------------------------------------------------------ review additions (2026-12-05)
def test_selective_recompute_passes_the_ring_for_the_recomputed_core():
    # Selective recomputation (Megatron-Core's default module core_attn) re-runs the attention core before the
    # backward: its ring passes K and V again, as full recomputation's does (forward 1/2, recomputed 1/2,
    # backward 2 * 1/2 of 2 s h d per layer and micro-batch; 4 ranks, 2 micro-batches).
    r = _run(_doc(recompute="selective"))
    assert r.bytes_by_class["cp"] == pytest.approx(4 * L * 2 * 4 * (2 * S * H * D) / 2, rel=1e-12)


@pytest.mark.parametrize("etp", [2, 1])
def test_expert_gemm_flops_with_tp_under_cp(etp):
    # tp 2 under SP: a rank routes b (s/cp) / 2 tokens. etp 2: the expert-TP all-gather brings b (s/cp) k rows to
    # experts of width f / 2; etp 1: b (s/cp) k / 2 rows at width f. Either way 6 (s/cp) k h f / 2 GEMM FLOPs.
    st = training_step(*_parts(_doc(tp=2, etp=etp)))
    op = next(o for o in st.graph.ops if o.rank == 0 and o.name == "F0.c0.L0.experts")
    gemm = sum(k.flops for k in op.parts if k.category == "gemm")
    assert gemm == pytest.approx(6 * (S / 2) * K * H * MOE["moe_ffn_hidden"] / 2, rel=1e-12)


@pytest.mark.parametrize("par,match", [
    # etp = tp = 2 counts: etp*ep = 8 does not divide the stage's 4 ranks (Megatron-Core's RuntimeError)
    ({"tp": 2, "cp": 2, "dp": 1, "ep": 4, "sequence_parallel": True}, r"etp\*ep = 2\*4 does not divide the 4 ranks"),
    # the valid values are those etp*ep fits into tp*cp*dp = 2 ranks: 1 and 2 (not dp's divisors alone: 1)
    ({"tp": 1, "cp": 2, "dp": 1, "ep": 4}, r"valid ep values: 1, 2$"),
    ({"tp": 1, "cp": 2, "dp": 1, "ep": 3}, r"does not divide model.experts=8; valid ep values: 1, 2$"),
])
def test_cp_moe_ep_errors_name_the_valid_values(par, match):
    with pytest.raises(ConfigError, match=match) as err:
        validate(model_from_dict(MOE), ParallelConfig(**par), TrainingSpec(seq_len=S))
    assert "\n" not in str(err.value)


def test_dense_model_under_cp_keeps_its_lockstep_representative():
    # A dense model has no experts to place: under CP its lockstep step emits one rank per stage, the tp = 0,
    # cp = 0, dp = 0 rank standing for the stage's TP x CP x DP block (8 ranks here), whatever
    # ParallelConfig.expert_grid (a configuration-only property) says.
    dense = {k: v for k, v in MOE.items() if k not in ("experts", "top_k", "moe_ffn_hidden")}
    doc = dict(_doc(tp=2, ep=1), model=dict(dense, name="dense-small"))
    st = training_step(*_parts(doc), representatives="stage")
    assert {o.rank for o in st.graph.ops} == {0}
    assert sorted(st.graph.replicas[0]) == list(range(8))
