"""Defects found in the twenty-third session (helper hunts and known gaps), each pinned against its own truth.

Every test here failed on the session's start (``a774273``) unless its docstring says it was kept.
"""

from __future__ import annotations

import pytest
from test_chakra import TINY_YAML as TINY_3D  # (the tiny 3D step the Chakra tests export)

from simulator.cli import main


def _never(*_a, **_k):
    raise AssertionError("simulated before refusing the export")


def test_export_chakra_over_the_op_budget_is_refused_before_the_run(tmp_path, capsys, monkeypatch):
    """--export-chakra builds every rank's program; over the op budget it was refused only after the whole
    run (the known gap of the twenty-first session). The budget is lowered so that the tiny step's
    every-rank graph is over it: the refusal must come before any simulation."""
    exp_file = tmp_path / "exp.yaml"
    exp_file.write_text(TINY_3D)
    monkeypatch.setattr("simulator.experiment.MAX_OPS", 50)
    monkeypatch.setattr("simulator.experiment.run_experiment", _never)
    assert main(["run", str(exp_file), "--no-progress", "--export-chakra", str(tmp_path / "et")]) == 2
    err = capsys.readouterr().err
    assert "--export-chakra: every rank's program" in err and "--force" in err and "Traceback" not in err
    assert not (tmp_path / "et").exists() or not any((tmp_path / "et").iterdir())


def test_export_chakra_of_a_step_that_does_not_fit_writes_nothing(tmp_path, capsys):
    """Kept: an out-of-memory step is refused before its trace is written (the export now runs before the run,
    after the memory check)."""
    exp_file = tmp_path / "exp.yaml"
    exp_file.write_text(TINY_3D.replace("preset: tiny", "preset: gpt3-175b").replace("seq_len: 128",
                                                                                        "seq_len: 2048"))
    assert main(["run", str(exp_file), "--no-progress", "--export-chakra", str(tmp_path / "et")]) == 2
    err = capsys.readouterr().err
    assert "out of memory" in err and "Traceback" not in err
    assert not (tmp_path / "et").exists() or not any((tmp_path / "et").iterdir())


def test_export_chakra_still_writes_the_trace_and_the_run_still_reports(tmp_path, capsys):
    """Kept: the export and the run's report both come out, in that order of work, as before."""
    exp_file = tmp_path / "exp.yaml"
    exp_file.write_text(TINY_3D)
    assert main(["run", str(exp_file), "--no-progress", "--export-chakra", str(tmp_path / "et")]) == 0
    out = capsys.readouterr().out
    assert "Chakra trace in" in out and "step time" in out.lower()
    assert len(list((tmp_path / "et").glob("clustersim.*.et"))) == 16


# ------------------------------------------------------------------ Megatron-Core mechanisms (a hunt against its code)
def _builder(model: str = "gpt2-small", **par):
    from workloads.models import get_preset
    from workloads.parallel import ParallelConfig, TrainingSpec
    from workloads.training import StepOptions, _StepBuilder
    fields = {"tp": 1, "micro_batch": 1, "global_batch": 1, **par}
    return _StepBuilder(get_preset(model), ParallelConfig(**fields), TrainingSpec(seq_len=1024), StepOptions())


def _kernels(builder, phase: str, stage: int = 0):
    return [k for seg in builder.segments(stage, 0, phase, True) for k in seg.kernels]


def test_the_embedding_gradient_is_accumulated_every_micro_batch():
    """The lookup's backward (PyTorch's embedding_dense_backward) zero-fills a dense gradient of the table and
    Megatron's hook adds it into the fp32 main_grad: 2 + 2 + 4 + 4 bytes an element (gpt2-small: the 50,304-row
    padded vocabulary and the 1,024 learned positions, h = 768), with gradient-accumulation fusion or without.
    Only the layers' weight gradients were accumulated (README "Per-step costs" says every micro-batch's are)."""
    b = _builder()
    acc = [k for k in _kernels(b, "B") if k.name == "embedding.grad_accumulate"]
    assert len(acc) == 1 and acc[0].nbytes == (50304 + 1024) * 768 * (2 + 2 + 4 + 4)


def test_the_output_layers_weight_gradient_accumulates_into_the_fp32_buffer():
    """The output layer is a ColumnParallelLinear: under gradient-accumulation fusion its weight-gradient GEMM
    reads and writes the fp32 main_grad (the layers' GEMMs did, the output layer's wrote bf16 and stopped):
    2 (h T + T V) operand bytes + 2 x 4 V h for the buffer (gpt2-small, T = 1,024 tokens, V = 50,304, h = 768)."""
    b = _builder()
    wgrad = next(k for k in _kernels(b, "B") if k.name == "logits.wgrad")
    h, t, v = 768, 1024, 50304
    assert wgrad.nbytes == 2 * (h * t + t * v) + 2 * 4 * v * h


def _tp_ops(doc_model: str, sp: bool, tp: int = 2, **model):
    from simulator.experiment import experiment_from_dict, run_experiment
    doc = {"cluster": {"preset": "dgx-h100", "nodes": 1, "gpus_per_node": tp},
           "model": {"preset": doc_model, **model},
           "parallel": {"tp": tp, "sequence_parallel": sp, "micro_batch": 1, "global_batch": 2},
           "training": {"seq_len": 1024}}
    ops = run_experiment(experiment_from_dict(doc), fidelity="full").ops
    return ops[(ops["rank"] == 0) & (ops["traffic_class"] == "tp")]


def test_sequence_parallel_gpt_embedding_is_all_reduced_not_reduce_scattered():
    """Megatron-Core's LanguageModelEmbedding reduce-scatters the embedding only without learned positions
    (``reduce_scatter_embeddings``); GPT's is all-reduced, the positions added, then split locally. Per micro-batch
    of gpt2-small at TP 2 with SP: one all-reduce forward (the rest AG / RS), where there was none; Llama (rotary)
    keeps its reduce-scatter."""
    gpt = _tp_ops("gpt2-small", True)
    embedding = gpt[gpt["name"].str.startswith("F") & gpt["name"].str.endswith("tp_all_reduce")]
    assert len(embedding) == 2 and (embedding["nbytes"] == 1024 * 768 * 2).all()  # one per micro-batch
    rotary = _tp_ops("tiny", True, learned_positions=False)
    assert not rotary["name"].str.endswith("tp_all_reduce").any()


def test_the_vocab_parallel_loss_all_reduces_over_tp_every_micro_batch():
    """Megatron-Core's fused vocab-parallel cross-entropy all-reduces the fp32 logit maximum (4 bytes a token) and
    then the predicted logit and the sum of exponentials (8 bytes a token) over TP, in every micro-batch's
    forward on the last stage; nothing in the backward; nothing without TP."""
    ops = _tp_ops("gpt2-small", False)
    loss = ops[ops["name"].str.endswith("loss_all_reduce")]
    assert sorted(loss["nbytes"]) == [4 * 1024] * 2 + [8 * 1024] * 2
    assert loss["name"].str.startswith("F").all() and (loss["collective"] == "all_reduce").all()
    from simulator.experiment import experiment_from_dict, run_experiment
    alone = {"cluster": {"preset": "dgx-h100", "nodes": 1, "gpus_per_node": 1}, "model": {"preset": "gpt2-small"},
             "parallel": {"micro_batch": 1, "global_batch": 1}, "training": {"seq_len": 1024}}
    assert not run_experiment(experiment_from_dict(alone)).ops["name"].str.endswith("loss_all_reduce").any()


def test_sequence_parallel_norm_gradients_are_all_reduced_once_per_step():
    """finalize_model_grads → _allreduce_layernorm_grads: with SP one all-reduce over TP of the fp32 gradients of
    the norms and row-parallel biases (gpt2-small: 12 layers x (2 LayerNorms x 2h + 2 biases x h) + the final
    LayerNorm's 2h, h = 768), after the DP reductions and before the gradient norm; none without SP."""
    ops = _tp_ops("gpt2-small", True)
    sync = ops[ops["name"] == "sequence_parallel_grad_sync"]
    assert len(sync) == 1 and sync["nbytes"].iloc[0] == (12 * 6 * 768 + 2 * 768) * 4
    assert not (_tp_ops("gpt2-small", False)["name"] == "sequence_parallel_grad_sync").any()


# ------------------------------------------------------------------ blockwise FP8 (DeepSeek-V3's recipe)
def _fp8_layer(recipe: str):
    from workloads.flops import layer_ops
    from workloads.models import get_preset
    return layer_ops(get_preset("llama3-8b"), 1, 4096, 1, fp8=True, fp8_recipe=recipe)


def test_blockwise_fp8_weight_gradients_are_their_own_kernels():
    """Under blockwise scaling only the weight gradients change kind (both operands scaled along the reduced
    token dimension: DeepGEMM's 1D1D kernels); the forward and data-gradient GEMMs stay FP8 GEMMs, and the
    default recipe is unchanged."""
    block, tensor = _fp8_layer("blockwise"), _fp8_layer("tensorwise")
    kinds = {op.name: op.category for op in block.backward}
    assert {n for n, c in kinds.items() if c == "gemm_fp8_wgrad"} == {n for n in kinds if n.endswith(".wgrad")}
    assert all(kinds[n] == "gemm_fp8" for n in kinds if n.endswith(".dgrad"))
    assert not any(op.category == "gemm_fp8_wgrad" for op in tensor.backward)
    assert [(o.name, o.flops, o.nbytes) for o in block.backward] == [(o.name, o.flops, o.nbytes)
                                                                     for o in tensor.backward]


def test_blockwise_fp8_runs_slower_weight_gradients_and_no_amax_reductions():
    from simulator.experiment import experiment_from_dict, run_experiment
    doc = {"cluster": {"preset": "dgx-h100", "nodes": 1, "gpus_per_node": 2}, "model": {"preset": "tiny"},
           "parallel": {"tp": 1, "dp": 2, "micro_batch": 1, "global_batch": 2},
           "training": {"seq_len": 128, "dtype": "fp8"}}
    tensor = run_experiment(experiment_from_dict(doc)).ops
    doc["training"]["fp8_recipe"] = "blockwise"
    block = run_experiment(experiment_from_dict(doc)).ops
    assert tensor["name"].str.contains("fp8_amax|fp8_scale_update").any()
    assert not block["name"].str.contains("fp8_amax|fp8_scale_update").any()
    from simulator.compute import ComputeModel
    from topologies.gpus import get_gpu
    from workloads.flops import layer_ops
    from workloads.models import get_preset
    cm = ComputeModel(get_gpu("H100"), dtype="fp8")
    times = {r: [cm.duration(o.kernel()) for o in layer_ops(get_preset("llama3-8b"), 1, 4096, fp8=True,
                                                             fp8_recipe=r).backward if o.name.endswith(".wgrad")]
             for r in ("tensorwise", "blockwise")}
    assert len(times["blockwise"]) == 4  # qkv, attn_out, mlp_up, mlp_down
    assert all(b > 1.2 * a for a, b in zip(times["tensorwise"], times["blockwise"]))  # every weight gradient


@pytest.mark.parametrize("training, message", [
    ({"seq_len": 128, "fp8_recipe": "blockwise"}, "training.fp8_recipe: blockwise needs training.dtype: fp8"),
    ({"seq_len": 128, "dtype": "fp8", "fp8_recipe": "mxfp8"}, "training.fp8_recipe"),
])
def test_fp8_recipe_bad_values_are_one_line(training, message, tmp_path, capsys):
    import yaml
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump({"cluster": {"preset": "dgx-h100", "nodes": 1}, "model": {"preset": "tiny"},
                                    "parallel": {"dp": 8, "micro_batch": 1, "global_batch": 8},
                                    "training": training}))
    assert main(["run", str(path), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    if training.get("fp8_recipe") == "mxfp8":
        assert "tensorwise" in err and "blockwise" in err


def test_the_wgrad_ceiling_falls_back_to_the_fp8_ceiling_without_a_measurement():
    from simulator.compute import ComputeModel
    from topologies.gpus import get_gpu
    b200 = ComputeModel(get_gpu("B200"), dtype="fp8")
    assert b200.fp8_wgrad_gemm.efficiency == b200.fp8_gemm.efficiency  # (no published blockwise wgrad on B200)
    h800 = ComputeModel(get_gpu("H800"), dtype="fp8", sustained_clock_fraction=1.0)  # (the burst ceilings)
    assert h800.fp8_wgrad_gemm.efficiency == pytest.approx(1092 / 1978.9, rel=2e-3)  # DeepGEMM's best row
    given = ComputeModel(get_gpu("H800"), dtype="fp8", fp8_wgrad_matmul_efficiency=0.6, sustained_clock_fraction=1.0)
    assert given.fp8_wgrad_gemm.efficiency == 0.6


# ------------------------------------------------------------------ public workloads functions (the API hunt)
def _gpt3():
    from workloads.models import get_preset
    return get_preset("gpt3-175b")


@pytest.mark.parametrize("call, message", [
    (lambda w, m: w.model_flops_per_step(m, -1, 2048), "global_batch: must be a positive integer, got -1"),
    (lambda w, m: w.narayanan_flops_per_step(m, 2.5, 2048), "global_batch: must be a positive integer, got 2.5"),
    (lambda w, m: w.layer_ops(m, 1, -5), "seq_len: must be a positive integer, got -5"),
    (lambda w, m: w.layer_ops(m, 1, 2048, 7), "tp: 7 does not divide model.heads=96"),
    (lambda w, m: w.optimizer_op(-1), "params_per_gpu"),
    (lambda w, m: w.micro_batches_in_flight(
        w.parallel_from_dict({"tp": 8, "pp": 8, "dp": 16, "micro_batch": 1, "global_batch": 1536}), 99),
     "stage: 99 is outside 0..7"),
])
def test_public_flop_and_memory_functions_refuse_what_they_cannot_count(call, message):
    """They returned negative FLOPs (batch -1), a fraction of a column (tp 7 over 96 heads: 5266.3 cut to 5266),
    -91 micro-batches in flight (stage 99 of 8)."""
    import workloads
    from workloads.errors import ConfigError
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        call(workloads, _gpt3())


@pytest.mark.parametrize("call, argument", [
    (lambda: __import__("workloads").model_flops_per_step("gpt3-175b", 8, 2048), "model: must be a ModelSpec"),
    (lambda: __import__("simulator").ComputeModel(None), "gpu: must be a GPUSpec or a GPU name"),
])
def test_objects_of_the_wrong_type_are_named(call, argument):
    """A preset's name where a ModelSpec belongs, None where a GPU belongs: an AttributeError from inside before."""
    with pytest.raises(TypeError, match=argument):
        call()


# ------------------------------------------------------------------ MoE routing: a token's k experts are distinct
def _exact_top2_inclusion(p):
    """P(expert i among a token's 2 distinct picks), picked one after another in proportion to ``p`` among those
    not picked yet: first pick i, or first pick j != i and then i from the rest (p_i / (1 - p_j))."""
    import numpy as np
    p = np.asarray(p, dtype=float)
    return np.array([p[i] + sum(p[j] * p[i] / (1 - p[j]) for j in range(len(p)) if j != i)
                     for i in range(len(p))])


@pytest.mark.parametrize("s", [0.5, 1.0, 2.0])
def test_zipf_choices_land_with_the_distinct_experts_inclusion_probabilities(s):
    """Routing drew a token's k choices independently: at zipf s 2, top-2 of 8, one rank sent 5,416 choices from
    4,096 tokens to one expert (imbalance 5.2 where E / k = 4 bounds it). The hottest expert now takes the share
    of choices of its exact top-2 inclusion probability (closed form for k = 2), within the Monte Carlo's error."""
    from workloads.moe import RoutingModel, inclusion_probabilities, route_layer
    routing = RoutingModel(kind="zipf", zipf_s=s)
    popularity = routing.probabilities(8, 0)
    assert inclusion_probabilities(popularity, 2) == pytest.approx(_exact_top2_inclusion(popularity), abs=0.012)
    r = route_layer(8, 2, 4096, 8, routing)
    assert r.imbalance <= 8 / 2 and r.choices.max() <= 4096
    hot = int(popularity.argmax())
    share = r.choices[:, hot].sum() / r.choices.sum()
    assert share == pytest.approx(_exact_top2_inclusion(popularity)[hot] / 2, abs=0.01)


def test_uniform_routing_draws_are_unchanged():
    """Kept: equal popularities: the inclusion probability is exactly k / E, so the draws are the multinomial of T k
    choices over 1 / E, bit for bit as before."""
    import numpy as np

    from workloads.moe import RoutingModel, route_layer
    r = route_layer(8, 2, 1000, 4, RoutingModel("uniform", seed=3), layer=2, micro_batch=5)
    same = np.random.default_rng([3, 2, 2, 5]).multinomial(2000, np.full(8, 1 / 8), size=4)
    assert (r.choices == same).all()


def test_custom_loads_are_shares_capped_at_one_over_k():
    """A measured load is the share of the choices each expert takes: kept as given where no share exceeds 1/k,
    capped there otherwise (a token picks an expert at most once) and the rest spread in proportion."""
    import numpy as np

    from workloads.moe import RoutingModel
    valid = RoutingModel("custom", expert_load=(3, 2, 1, 1, 1))
    assert valid.choice_probabilities(5, 2) == pytest.approx(np.array([3, 2, 1, 1, 1]) / 8)
    heavy = RoutingModel("custom", expert_load=(8, 1, 1, 1, 1, 1, 1, 1))
    assert heavy.choice_probabilities(8, 2) == pytest.approx([0.5] + [0.5 / 7] * 7)


def test_deepeps_distinct_tokens_follow_the_distinct_experts():
    """DeepEP sends a token once per GPU (and node) holding any of its experts; with a token's k experts distinct,
    equal popularities give the hypergeometric miss C(E - g, k) / C(E, k) for a group of g experts (DeepSeek-V3's
    EP 64: g = 4 a GPU, 32 a node, k = 8 of E = 256), and one expert per GPU gives one token per choice at any
    skew (the independent-choice formula made 29,753 choices 23,009 tokens for the hot GPU at zipf s 2)."""
    from math import comb

    import numpy as np

    from workloads.moe import deepep_matrices
    ep, k, per_rank = 64, 8, 4096 * 8 / 64
    first, _ = deepep_matrices(np.full((ep, ep), per_rank), np.full(ep, 1 / ep), k, [r // 8 for r in range(ep)],
                               experts_per_rank=4)
    assert first[0, 1] == pytest.approx(per_rank * (1 - comb(252, 8) / comb(256, 8)) / (8 / 64), rel=1e-12)
    assert first[0, 8] == pytest.approx(8 * per_rank * (1 - comb(224, 8) / comb(256, 8)) / (8 / 8), rel=1e-12)
    hot = np.array([0.4533] + [0.5467 / 7] * 7)
    first, _ = deepep_matrices(np.outer(np.full(8, 1000.0), hot), hot, 2, [0] * 8, experts_per_rank=1)
    assert first == pytest.approx(np.outer(np.full(8, 1000.0), hot), rel=1e-12)


def test_custom_loads_on_fewer_experts_than_top_k_are_refused():
    """A token picks top_k distinct experts: with fewer experts loaded the capped shares summed to 0.5 and numpy
    gave the missing half to the last expert (972 choices to a zero-load expert; 2,000 from 1,000 tokens)."""
    from workloads.errors import ConfigError
    from workloads.moe import RoutingModel, route_layer
    with pytest.raises(ConfigError, match="moe.expert_load: 1 experts with a load, but every token picks top_k = 2"):
        route_layer(4, 2, 1000, 1, RoutingModel("custom", expert_load=(0, 0, 0, 1)))


def test_without_a_pipeline_a_faster_rank_waits_as_what_it_waits_for():
    """pp 1, rank 1 a 2x straggler of a DP pair: rank 0's micro-batches end first and it waits for rank 1 in the
    gradient reduction. That wait was bubble (a pipeline's idle, of a run without one); it is now exposed DP or
    idle, no bubble anywhere, and the stage's busy time is its ranks' own windows (busy + idle within the step)."""
    from simulator.experiment import experiment_from_dict, run_experiment
    doc = {"cluster": {"preset": "dgx-h100", "nodes": 1, "gpus_per_node": 2}, "model": {"preset": "tiny"},
           "parallel": {"dp": 2, "micro_batch": 1, "global_batch": 4}, "training": {"seq_len": 128},
           "faults": [{"kind": "straggler", "gpu": 1, "factor": 2.0}]}
    r = run_experiment(experiment_from_dict(doc), fidelity="full")
    table = r.time_breakdown()
    assert "bubble" not in table or (table["bubble"] == 0).all()
    assert table.loc[0, "forward"] + table.loc[0, "backward"] < 0.6 * r.step_time  # (the case: rank 0 waits)
    row = r.stages.iloc[0]
    assert row["busy_s"] + row["idle_s"] <= r.step_time * (1 + 1e-9)


def test_the_sequence_parallel_sync_carries_routers_and_mlas_replicated_weights():
    """Megatron-Core tags ``sequence_parallel`` the router of a MoE layer (TopKRouter) and MLA's duplicated
    down-projections and latent norms too, and _allreduce_layernorm_grads reduces them all: DeepSeek-V3's layer
    adds h x E = 7168 x 256 router weights and 7168 x (1536 + 576) + (1536 + 512) MLA weights to its 2 x 7168 norms
    (found by the session's review: the sync carried the norms alone, 0.23 MB where Megatron sends ~272 MB)."""
    from workloads.models import get_preset
    from workloads.parallel import ParallelConfig, TrainingSpec
    from workloads.training import StepOptions, _StepBuilder
    model = get_preset("deepseek-v3")
    b = _StepBuilder(model, ParallelConfig(tp=2, pp=61, micro_batch=1, global_batch=61, sequence_parallel=True,
                                           stage_layers=[1] * 61), TrainingSpec(seq_len=1024),
                     StepOptions(embedding_and_loss=False))
    h = 7168
    mla = h * (1536 + 576) + (1536 + 512)
    assert b.sequence_parallel_grad_bytes(0) == (2 * h + mla) * 4  # a dense layer (the first three are)
    assert b.sequence_parallel_grad_bytes(10) == (2 * h + mla + h * 256) * 4  # a MoE layer


@pytest.mark.parametrize("recipe, noted", [("tensorwise", True), ("blockwise", False)])
def test_the_delayed_scaling_recompute_note_is_for_delayed_scaling_only(recipe, noted):
    """Megatron-Core refuses layernorm / moe_act recomputation under its delayed-scaling FP8 recipe only; the note
    fired under DeepSeek's blockwise recipe too (its own example, which recomputes them as the report says)."""
    import dataclasses

    from simulator.experiment import load_experiment, unused_settings
    exp = load_experiment("examples/deepseek-v3-dualpipe-h800.yaml")
    exp = dataclasses.replace(exp, training=dataclasses.replace(exp.training, fp8_recipe=recipe))
    assert any("delayed-scaling" in note for note in unused_settings(exp)) == noted


def test_rotary_models_run_a_rope_kernel_on_q_and_k():
    """Rotary position embedding reads and writes the rank's Q and K heads each pass (Megatron-Core's fused RoPE);
    no kernel was emitted. Llama 3 8B at TP 2, 4,096 tokens: Q 4096 and K 1024 columns, split over TP, bf16; its
    backward rotates the gradients back, the same bytes. GPT's learned positions have none."""
    from workloads.flops import layer_ops
    from workloads.models import get_preset
    ops = layer_ops(get_preset("llama3-8b"), 1, 4096, 2)
    rope = [o for o in ops.forward if o.name == "rope"]
    assert len(rope) == 1 and rope[0].nbytes == 2 * 4096 * (4096 + 1024) / 2 * 2
    assert [o.nbytes for o in ops.backward if o.name == "rope.bwd"] == [rope[0].nbytes]
    assert not any(o.name == "rope" for o in layer_ops(get_preset("gpt3-175b"), 1, 2048, 8).forward)


def test_a_users_fp8_ceiling_scales_the_blockwise_wgrad_ceiling_alike():
    """Calibrating FP8 down (compute.fp8_matmul_efficiency) left blockwise weight gradients at the GPU's measured
    0.552, faster than every other FP8 GEMM (the review's finding): they now scale by the same factor."""
    from simulator.compute import ComputeModel
    from topologies.gpus import get_gpu
    h800 = get_gpu("H800")
    cm = ComputeModel(h800, dtype="fp8", fp8_matmul_efficiency=0.45, sustained_clock_fraction=1.0)
    assert cm.fp8_wgrad_gemm.efficiency == pytest.approx(0.552 * 0.45 / h800.matmul_efficiency_fp8, rel=1e-12)
    assert cm.fp8_wgrad_gemm.efficiency < cm.fp8_gemm.efficiency


def test_the_run_header_names_the_fp8_recipe():
    import dataclasses

    from simulator.experiment import describe_setup, load_experiment
    exp = load_experiment("examples/deepseek-v3-dualpipe-h800.yaml")
    assert "fp8 blockwise" in describe_setup(exp)["training"]
    tensorwise = dataclasses.replace(exp, training=dataclasses.replace(exp.training, fp8_recipe="tensorwise"))
    assert "fp8 tensorwise" in describe_setup(tensorwise)["training"]


def test_deepeps_distinct_tokens_stay_within_their_physical_bounds():
    """Under node-limited skewed routing the pool interpolation fell below what a token can put on a rank or node
    (the review: 800 choices to a one-expert GPU read 450 tokens on its own node). r is held in [1/min(g, k), 1]:
    a one-expert GPU gets a token per choice, a node of 2 experts at least one token per 2 choices."""
    import numpy as np

    from workloads.moe import deepep_matrices
    p = np.array([0.8, 0.1, 0.05, 0.05])
    choices = np.outer(np.full(4, 1000.0), p)
    first, _fwd = deepep_matrices(choices, p, 2, [0, 0, 1, 1], max_nodes=1, experts_per_rank=1)
    assert (first[0, :2] == choices[0, :2]).all() and (first[2, 2:] == choices[2, 2:]).all()  # own node
    assert first[2, 0] >= (choices[2, 0] + choices[2, 1]) / 2 and first[0, 2] >= (choices[0, 2] + choices[0, 3]) / 2
