"""Multi-head latent attention's tensor-parallel collectives against hand-worked closed forms.

Megatron-Core, ``megatron/core/transformer/multi_latent_attention.py`` (NVIDIA/Megatron-LM main, 2026-08):
``MLASelfAttention.get_query_key_value_tensors`` runs ``linear_q_down_proj`` and ``linear_kv_down_proj``
(``TELinear``, ``parallel_mode='duplicated'``) on the rank's sequence shard, all-gathers the RoPE key with
``gather_from_sequence_parallel_region`` and hands the query and key/value latents to ``linear_q_up_proj`` and
``linear_kv_up_proj`` (column-parallel, ``gather_output=False``), which all-gather their sequence-parallel input
as every column-parallel linear does (``linear_q_proj`` takes the hidden states themselves without
``q_lora_rank``); ``linear_proj`` (row-parallel) reduce-scatters ``b s h``. Each all-gather's backward is a
reduce-scatter of its size and vice versa; the column-parallel backward all-gathers its saved input again for the
weight gradient (Megatron-LM's ``LinearWithGradAccumulationAndAsyncCommunication``, TE's ``Linear``). With
``recompute_modules: [mla_up_proj]`` ``CheckpointWithoutOutput`` re-runs ``qkv_up_proj_and_rope_apply`` (the two
up projections, not the RoPE key's gather, which precedes it) in the backward. Without sequence parallelism
``copy_to_tensor_model_parallel_region`` all-reduces the up projections' input gradients.

Per layer and micro-batch, elements times ``b s`` (``h`` hidden, ``r_q``/``r_kv`` the latents, ``r`` the RoPE key
width; a dense MLP adds its ``b s h`` all-gather and reduce-scatter each way and a re-gather):

* forward: ``h + (r_q + r_kv + r)`` all-gathered, ``2 h`` reduce-scattered;
* backward: ``2 h`` all-gathered, ``h + (r_q + r_kv + r)`` reduce-scattered, ``h + r_q + r_kv`` re-gathered;
* so ``7 h + 3 r_q + 3 r_kv + 2 r`` in all, against ``10 h`` for standard attention.
"""

import pytest

from simulator.experiment import experiment_from_dict, run_experiment
from simulator.screen import _fabric, collective_time, screen_experiment
from workloads.errors import ConfigError

H, RQ, RKV, ROPE = 1024, 384, 128, 32
MLA = {"preset": "deepseek-v3", "layers": 2, "first_dense_layers": 2, "experts": 0, "top_k": 0,
       "shared_experts": 0, "hidden": H, "heads": 16, "kv_heads": 16, "ffn_hidden": 2048, "vocab": 32000,
       "q_lora_rank": RQ, "kv_lora_rank": RKV, "qk_nope_head_dim": 64, "qk_rope_head_dim": ROPE, "v_head_dim": 64}
MHA = dict(MLA, q_lora_rank=None, kv_lora_rank=None, qk_nope_head_dim=None, qk_rope_head_dim=None, v_head_dim=None)
S, LAYERS, MB, TP, D = 1024, 2, 2, 2, 2  # tokens, layers, micro-batches, TP ranks, bf16 bytes


def _doc(model: dict, sp: bool = True, **parallel) -> dict:
    return {"cluster": {"preset": "dgx-h100", "nodes": 1, "gpus_per_node": TP}, "model": model,
            "parallel": {"tp": TP, "dp": 1, "pp": 1, "sequence_parallel": sp, "global_batch": MB, **parallel},
            "training": {"seq_len": S}, "options": {"embedding_and_loss": False}}


def _tp_bytes(doc: dict) -> float:
    """Bytes of the step's TP collectives (nccl-tests sizes, every rank), less the per-step all-reduce of the
    sequence-parallel weights' gradients."""
    r = run_experiment(experiment_from_dict(doc), force=True)
    tp = r.ops[(r.ops["traffic_class"] == "tp") & (r.ops["name"] != "sequence_parallel_grad_sync")]
    return float((tp["nbytes"] * tp["count"]).sum())


def _step(elements_per_token: int) -> float:
    """``elements_per_token`` per layer and micro-batch, over the step's layers, micro-batches and TP ranks."""
    return float(elements_per_token * S * D * LAYERS * MB * TP)


@pytest.mark.parametrize("parallel, per_layer", [
    ({}, 7 * H + 3 * RQ + 3 * RKV + 2 * ROPE),
    # full recomputation runs the forward's again in the backward
    ({"recompute": "full"}, 7 * H + 3 * RQ + 3 * RKV + 2 * ROPE + 3 * H + (RQ + RKV + ROPE)),
    # mla_up_proj re-runs the up projections, and their all-gathers, in the backward
    ({"recompute": "selective", "recompute_modules": ["mla_up_proj"]}, 7 * H + 4 * RQ + 4 * RKV + 2 * ROPE),
])
def test_sequence_parallel_tp_bytes_by_hand(parallel, per_layer):
    assert _tp_bytes(_doc(MLA, **parallel)) == _step(per_layer)


def test_without_query_latent_the_query_projection_gathers_the_hidden_states():
    # linear_q_proj (column-parallel) takes the b s h hidden states: r_q reads h
    assert _tp_bytes(_doc(dict(MLA, q_lora_rank=None))) == _step(7 * H + 3 * H + 3 * RKV + 2 * ROPE)


def test_without_sequence_parallelism_the_backward_all_reduces_the_latents_gradients():
    # forward: the output projection's and the MLP's b s h all-reduces; backward: the MLP input's and the two up
    # projections' input gradients (no RoPE key gather without SP)
    assert _tp_bytes(_doc(MLA, sp=False)) == _step(2 * H + H + RQ + RKV)


def test_standard_attention_keeps_its_ten_buffers_per_layer():
    # the dense path unchanged: 4 b s h forward, 4 backward, 2 re-gathers (QKV and MLP inputs); 4 without SP
    assert _tp_bytes(_doc(MHA)) == _step(10 * H)
    assert _tp_bytes(_doc(MHA, sp=False)) == _step(4 * H)
    assert _tp_bytes(_doc(MHA, recompute="full")) == _step(14 * H)


def test_moe_layer_keeps_only_the_attentions_collectives():
    # an expert-parallel MoE layer without shared experts (tokens routed as they are sharded): the attention's
    # latents and output projection alone among the layer's .tp_ collectives, full recomputation included
    moe = dict(MLA, first_dense_layers=0, experts=4, top_k=2, moe_ffn_hidden=512)
    doc = {**_doc(moe, recompute="full", ep=2, dp=2, global_batch=2 * MB),
           "cluster": {"preset": "dgx-h100", "nodes": 1, "gpus_per_node": 4}}
    r = run_experiment(experiment_from_dict(doc), force=True)
    tp = r.ops[r.ops["name"].str.contains(".tp_", regex=False) & (r.ops["rank"] == 0)]
    latents = RQ + RKV + ROPE
    # forward: latents gathered, h reduce-scattered; backward: h gathered, latents reduce-scattered, the two up
    # inputs re-gathered, the recomputed forward's latents gathered and h reduce-scattered again
    per_layer = (latents + H) + (H + latents + RQ + RKV + latents + H)
    assert float((tp["nbytes"] * tp["count"]).sum()) == float(per_layer * S * D * LAYERS * MB)


def test_tp_comm_overlap_is_refused_for_mla():
    # Megatron-Core's TELinear turns the overlap off for buffer names TE does not know (q_down_proj, kv_down_proj:
    # megatron/core/extensions/transformer_engine.py, TELinear.__init__)
    with pytest.raises(ConfigError, match="parallel.tp_comm_overlap: .*multi-head latent attention"):
        experiment_from_dict(_doc(MLA, tp_comm_overlap=True))


def _blocking_tp_per_micro_batch(exp) -> float:
    """Seconds of one micro-batch's blocking TP collectives on the TP pair, each priced at its own size: per layer
    three b s h all-gathers and reduce-scatters (the output projection's and the MLP's, forward and backward) and
    an all-gather and a reduce-scatter of each latent."""
    fabric, groups = _fabric(exp), [(0, 1)]

    def cost(kind, width):
        return collective_time(fabric, kind, groups, float(S * width * D))

    return LAYERS * (3 * cost("all_gather", H) + 3 * cost("reduce_scatter", H) + sum(
        cost("all_gather", w) + cost("reduce_scatter", w) for w in (RQ, RKV, ROPE)))


def test_screen_prices_the_latents_at_their_widths():
    # One stage, no DP: the screen's exposed TP seconds are every micro-batch's blocking TP collectives, each
    # priced at its own size (the backward's re-gathers hide under its compute here); without the SMs the
    # communication kernels hold (which the screen leaves out, tests/test_screen.py) it is fast's step exactly
    exp = experiment_from_dict({**_doc(MLA), "compute": {"comm_sms": 0, "p2p_sms": 0}})
    per_mb = _blocking_tp_per_micro_batch(exp)
    out = screen_experiment(exp)
    assert out["exposed_comm_by_class_s"]["tp"] == pytest.approx(MB * per_mb, rel=1e-12)
    assert out["step_time_s"] == pytest.approx(run_experiment(exp).step_time, rel=1e-9)


# ---------------------------------------------------------------- review (hunt 6): branches the tests above missed
def _rank0_tp(doc: dict, fidelity: str = "fast"):
    """Rank 0's TP collectives (less the per-step sequence-parallel weight-gradient all-reduce)."""
    r = run_experiment(experiment_from_dict(doc), force=True, fidelity=fidelity)
    ops = r.ops
    return ops[(ops["traffic_class"] == "tp") & (ops["name"] != "sequence_parallel_grad_sync") & (ops["rank"] == 0)]


def _rank0_bytes(doc: dict) -> float:
    tp = _rank0_tp(doc)
    return float((tp["nbytes"] * tp["count"]).sum())


def _per_rank(elements_per_token: int, tokens: int = S) -> float:
    """``elements_per_token`` per layer and micro-batch over rank 0's ``tokens`` tokens, layers and micro-batches."""
    return float(elements_per_token * tokens * D * LAYERS * MB)


def test_context_parallel_latents_are_each_ranks_share_of_the_sequence():
    # With CP each rank holds s/cp tokens (Megatron-Core splits the sequence before the layers): every TP
    # collective, latents included, is b (s/cp) w, the same per-token counts as without CP.
    doc = _doc(MLA, cp=2)
    doc["cluster"]["gpus_per_node"] = TP * 2
    assert _rank0_bytes(doc) == _per_rank(7 * H + 3 * RQ + 3 * RKV + 2 * ROPE, S // 2)


def test_without_sequence_parallelism_full_recomputation_repeats_only_the_forwards_all_reduces():
    # Without SP the forward communicates no latent (the up projections' inputs are replicated): the re-run
    # forward all-reduces the output projection's and the MLP's b s h again; the backward all-reduces the MLP
    # input's gradient and the two up projections' input gradients once.
    assert _rank0_bytes(_doc(MLA, sp=False, recompute="full")) == _per_rank(2 * H + 2 * H + H + RQ + RKV)


def test_zero3_units_keep_the_latents_once_per_pass():
    # ZeRO-3 cuts a pass into its parameter units; the pass's TP collectives still run once (on its last piece)
    doc = _doc(MLA, zero=3, dp=2, global_batch=2 * MB)
    doc["cluster"]["gpus_per_node"] = TP * 2
    assert _rank0_bytes(doc) == _per_rank(7 * H + 3 * RQ + 3 * RKV + 2 * ROPE)


@pytest.mark.parametrize("sp, recompute, by_kind", [
    # SP: forward gathers the MLP input (h) and the three latents, reduce-scatters the two row-parallel outputs;
    # backward gathers their gradients (2 h), reduce-scatters the MLP input's (h) and the latents' gradients, and
    # re-gathers the MLP input (h) and the two up projections' inputs (all-gathers too)
    (True, "none", {"all_gather": (H + RQ + RKV + ROPE) + 2 * H + (H + RQ + RKV),
                    "reduce_scatter": 2 * H + (H + RQ + RKV + ROPE)}),
    # full recomputation adds the forward's collectives once more
    (True, "full", {"all_gather": 2 * (H + RQ + RKV + ROPE) + 2 * H + (H + RQ + RKV),
                    "reduce_scatter": 2 * 2 * H + (H + RQ + RKV + ROPE)}),
    (False, "none", {"all_reduce": 2 * H + H + RQ + RKV}),
])
def test_each_collective_kind_by_hand(sp, recompute, by_kind):
    tp = _rank0_tp(_doc(MLA, sp=sp, recompute=recompute))
    got = (tp["nbytes"] * tp["count"]).groupby(tp["collective"]).sum().to_dict()
    assert got == {kind: _per_rank(n) for kind, n in by_kind.items()}


def test_screen_prices_the_latent_regathers_where_they_outlast_the_backward():
    # NVLink at 2% of its rate: the backward's re-gathers (the MLP input's b s h and the two latents, on their own
    # stream) outlast the backward's compute, and the pass's blocking collectives wait for them. The screen adds
    # what is left of them, as fast runs it (fast's step, to the last bits, as in the test above).
    doc = {**_doc(MLA), "compute": {"comm_sms": 0, "p2p_sms": 0},
           "network": {"bandwidth_efficiency": {"nvlink": 0.02}}}
    exp = experiment_from_dict(doc)
    blocking = _blocking_tp_per_micro_batch(exp)
    out = screen_experiment(exp)
    assert out["exposed_comm_by_class_s"]["tp"] > MB * blocking * 1.01  # the re-gathers are exposed
    assert out["step_time_s"] == pytest.approx(run_experiment(exp).step_time, rel=1e-9)
