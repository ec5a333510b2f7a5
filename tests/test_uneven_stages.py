"""Uneven pipeline stages (``parallel.stage_layers``, ``first_stage_layers`` / ``last_stage_layers``).

Truths used: Megatron-Core's layer offsets (``get_transformer_layer_offset``, worked by hand for a small
case), the flow-shop makespan of GPipe with per-stage times (``sum_i (f_i + b_i) + (m - 1)(max f + max
b)``, exact for identical micro-batches), 1F1B with the slow stage last (it never waits:
``sum_i (f_i + b_i) + (m - 1)(f_last + b_last)``), and memory that follows the layers a stage holds.
"""

import pytest

from simulator.experiment import describe_setup, experiment_from_dict, run_experiment
from workloads.errors import ConfigError
from workloads.memory import memory_per_gpu
from workloads.models import get_preset, model_from_dict
from workloads.parallel import ParallelConfig, TrainingSpec, chunk_layers, layers_per_stage, stage_layers, validate
from workloads.training import training_step

UNIFORM = {"name": "uniform", "layers": 12, "hidden": 256, "heads": 4, "kv_heads": 4, "ffn_hidden": 1024,
           "vocab": 512, "gated_mlp": False, "tied_embeddings": False}


def test_megatron_offsets_with_first_and_last_stage_counts_and_interleaving():
    # 12 layers, pp 4, v 2, first = last = 2: the middle 8 layers over 2 stages (4 each); per chunk 1, 2, 2, 1.
    # Megatron: offset = vp * (1 + 2 + 2 + 1) + first_per_chunk + middle_rank * 2 (pp_rank 0: vp * 6).
    par = ParallelConfig(pp=4, virtual_stages=2, schedule="interleaved", first_stage_layers=2, last_stage_layers=2,
                         global_batch=4)
    assert layers_per_stage(12, par) == (2, 4, 4, 2)
    assert [chunk_layers(12, par, r, 0) for r in range(4)] == [[0], [1, 2], [3, 4], [5]]
    assert [chunk_layers(12, par, r, 1) for r in range(4)] == [[6], [7, 8], [9, 10], [11]]
    assert stage_layers(12, par, 1) == [1, 2, 7, 8]


def test_even_split_is_unchanged():
    par = ParallelConfig(pp=4, virtual_stages=3, schedule="interleaved", global_batch=4)
    assert stage_layers(24, par, 1) == [2, 3, 10, 11, 18, 19]  # chunks 1, 5, 9 of 2 layers


def test_llama3_405b_on_16_stages_with_7_layers_first_and_last():
    model = get_preset("llama3-405b")  # 126 layers: 126 % 16 != 0
    with pytest.raises(ConfigError, match="parallel.pp"):
        validate(model, ParallelConfig(pp=16, global_batch=16), TrainingSpec())
    par = ParallelConfig(pp=16, first_stage_layers=7, last_stage_layers=7, global_batch=16)
    validate(model, par, TrainingSpec())
    assert layers_per_stage(126, par) == (7,) + (8,) * 14 + (7,)
    assert sorted(i for s in range(16) for i in stage_layers(126, par, s)) == list(range(126))


def test_per_chunk_counts_interleave_llama3_405b_over_4_chunks():
    # 7 layers cannot split into 4 equal chunks; per-chunk counts can (Megatron's pipeline layout).
    counts = [[1, 2, 2, 2]] + [[2, 2, 2, 2]] * 14 + [[2, 2, 2, 1]]
    par = ParallelConfig(pp=16, virtual_stages=4, schedule="interleaved", stage_layers=counts, global_batch=16)
    validate(get_preset("llama3-405b"), par, TrainingSpec())
    assert layers_per_stage(126, par) == (7,) + (8,) * 14 + (7,)
    assert chunk_layers(126, par, 0, 0) == [0] and chunk_layers(126, par, 1, 0) == [1, 2]
    assert chunk_layers(126, par, 15, 0) == [29, 30]   # round 0 holds 1 + 14 * 2 + 2 = 31 layers
    assert chunk_layers(126, par, 0, 1) == [31, 32] and chunk_layers(126, par, 15, 3) == [125]
    with pytest.raises(ConfigError, match=r"parallel.stage_layers\[0\]: 3 chunk counts"):
        ParallelConfig(pp=2, virtual_stages=4, schedule="interleaved", stage_layers=[[1, 2, 2], [2, 2, 2, 2]])


def test_deepseek_v3_61_layers_with_explicit_counts():
    model = get_preset("deepseek-v3")
    par = ParallelConfig(pp=16, dp=8, ep=8, stage_layers=[4] * 15 + [1], global_batch=16)
    validate(model, par, TrainingSpec())
    assert stage_layers(61, par, 15) == [60]


@pytest.mark.parametrize("fields, match", [
    ({"stage_layers": [4, 4, 4]}, "parallel.stage_layers: 3 counts"),
    ({"stage_layers": [4, 4, 4, 1]}, "sum to 13"),
    ({"stage_layers": [3, 3, 3, 3], "schedule": "interleaved", "virtual_stages": 2}, r"stage_layers\[0\]"),
    ({"stage_layers": [6, 6, 0, 0]}, r"stage_layers\[2\]"),
    ({"stage_layers": [4, 4, 4, 0], "schedule": "interleaved", "virtual_stages": 2},
     r"stage_layers\[3\]: .* per chunk"),
    ({"stage_layers": [3, 3, 3, 3], "first_stage_layers": 3}, "not both"),
    ({"first_stage_layers": 2, "last_stage_layers": 3}, "7 remaining layers cannot be split evenly"),
    ({"first_stage_layers": 11}, "other stage"),
    ({"first_stage_layers": 3, "schedule": "interleaved", "virtual_stages": 2}, "3 layers cannot be split into"),
])
def test_bad_stage_counts_are_one_line_errors(fields, match):
    model = model_from_dict(UNIFORM)
    par = {"pp": 4, "global_batch": 4, **fields}
    with pytest.raises(ConfigError, match=match):
        validate(model, ParallelConfig(**par), TrainingSpec())


def test_first_and_last_counts_that_fit_are_accepted():
    validate(model_from_dict(UNIFORM), ParallelConfig(pp=4, global_batch=4, first_stage_layers=3,
                                                      last_stage_layers=3), TrainingSpec())  # 6 over 2: 3 each


def test_first_stage_layers_need_a_pipeline():
    with pytest.raises(ConfigError, match="parallel.first_stage_layers: needs pp >= 2"):
        ParallelConfig(first_stage_layers=3)
    with pytest.raises(ConfigError, match="leaves no middle stage for the other 6"):
        validate(model_from_dict(UNIFORM), ParallelConfig(pp=2, first_stage_layers=3, last_stage_layers=3,
                                                          global_batch=2), TrainingSpec())


def test_memory_follows_the_layers_of_each_stage():
    model = model_from_dict(UNIFORM)
    par = ParallelConfig(pp=4, stage_layers=[2, 5, 3, 2], global_batch=8)
    tr = TrainingSpec(seq_len=256)
    one = memory_per_gpu(model, ParallelConfig(pp=4, global_batch=8), tr, stage=1)  # 3 layers, even split
    five = memory_per_gpu(model, par, tr, stage=1)
    assert five.gradients == pytest.approx(one.gradients * 5 / 3)
    # stage 1 keeps min(p - 1, m) = 3 micro-batches in flight either way: activations scale with its layers
    assert five.activations == pytest.approx(one.activations * 5 / 3)
    assert memory_per_gpu(model, par, tr).stage == 1  # the most loaded stage


def test_generated_step_runs_each_stages_layers():
    model = model_from_dict(UNIFORM)
    step = training_step(model, ParallelConfig(pp=4, stage_layers=[2, 5, 3, 2], global_batch=4),
                         TrainingSpec(seq_len=128))
    first_layer = {}
    for op in step.graph.ops:
        if op.kind == "compute" and op.name.startswith("F0."):
            first_layer[op.stage] = op.layer
    assert first_layer == {0: 0, 1: 2, 2: 7, 3: 10}


# --------------------------------------------------------------- closed forms
def _free_run(schedule: str, counts: list[int], m: int):
    p = len(counts)
    doc = {
        "cluster": {"preset": "dgx-h100", "nodes": 1, "gpus_per_node": p, "nvlink_bandwidth": "1000000TB/s",
                    "nic_bandwidth": "1000000TB/s", "pcie_bandwidth": "1000000TB/s", "nvlink_latency": 0,
                    "nic_latency": 0, "switch_latency": 0},
        "model": {**UNIFORM, "layers": sum(counts)},
        "parallel": {"pp": p, "global_batch": m, "schedule": schedule, "stage_layers": counts},
        "training": {"seq_len": 128},
        "network": {"step_latency": 0},
        "options": {"embedding_and_loss": False},
    }
    return run_experiment(experiment_from_dict(doc))


@pytest.mark.parametrize("counts", [[1, 1, 2, 1], [2, 1, 1, 1], [1, 1, 1, 3], [1, 2, 1, 1, 1, 1]])
@pytest.mark.parametrize("m", [1, 4, 8])
def test_gpipe_with_a_slow_stage_is_the_flow_shop_makespan(counts, m):
    st = _free_run("gpipe", counts, m).stages
    u = st["busy_s"].iloc[0] / (m * counts[0])  # forward + backward of one layer, one micro-batch
    window = st["busy_s"].iloc[0] + st["bubble_s"].iloc[0]
    assert window == pytest.approx(u * (sum(counts) + (m - 1) * max(counts)), rel=1e-6)
    # every stage's bubble is the window less its own work
    assert list(st["bubble_s"]) == pytest.approx([window - m * c * u for c in counts], rel=1e-6, abs=1e-12)


@pytest.mark.parametrize("counts", [[1, 1, 1, 2], [2, 2, 2, 4], [1, 1, 3]])
@pytest.mark.parametrize("m", [2, 8])
def test_1f1b_with_the_slow_stage_last_never_waits_there(counts, m):
    st = _free_run("1f1b", counts, m).stages
    u = st["busy_s"].iloc[0] / (m * counts[0])
    window = st["busy_s"].iloc[0] + st["bubble_s"].iloc[0]
    assert window == pytest.approx(u * (sum(counts) + (m - 1) * counts[-1]), rel=1e-6)
    # the bubble of a fast stage grows with the slow stage: (m - 1)(n_last - n_i) u more than with even stages
    even = u * (sum(counts) - counts[0])
    assert st["bubble_s"].iloc[0] == pytest.approx(even + (m - 1) * (counts[-1] - counts[0]) * u, rel=1e-6)


def test_uneven_interleaved_runs_and_the_setup_line_says_so():
    doc = {"cluster": {"preset": "dgx-h100", "nodes": 1}, "model": {**UNIFORM, "layers": 14},
           "parallel": {"pp": 4, "tp": 2, "global_batch": 8, "schedule": "interleaved", "virtual_stages": 2,
                        "first_stage_layers": 2, "last_stage_layers": 4},
           "training": {"seq_len": 128}}
    exp = experiment_from_dict(doc)
    assert "layers per stage [2, 4x3]" in describe_setup(exp)["layout"]
    full, fast = run_experiment(exp, fidelity="full"), run_experiment(exp, fidelity="fast")
    assert fast.step_time == pytest.approx(full.step_time, rel=0.02)
    lock = run_experiment(exp, fidelity="lockstep")
    assert lock.step_time == pytest.approx(full.step_time, rel=0.02)


def test_the_uneven_example_loads_with_126_layers_and_fits():
    from pathlib import Path

    from simulator.experiment import load_experiment
    exp = load_experiment(Path(__file__).resolve().parents[1] / "examples" / "llama3-405b-uneven-pp16.yaml")
    assert exp.model.layers == 126
    assert layers_per_stage(126, exp.parallel) == (7,) + (8,) * 14 + (7,)
    assert exp.memory().fits(80e9)


def test_zero3_module_gathers_follow_uneven_chunks():
    """DeepSpeed ZeRO-3 cuts each chunk's kernels at its modules' gathers; the gather trace split a stage's
    layers evenly over its chunks, so per-chunk counts of unequal size ([1, 2, 2, 2]) stopped the step with the
    trace's AssertionError (found 2026-12-02). ZeRO changes no compute: the step executes the FLOPs of the same
    layout under ZeRO-1."""
    doc = {"cluster": {"preset": "dgx-h100", "nodes": 4}, "model": {"preset": "llama3-8b", "layers": 30},
           "parallel": {"tp": 2, "pp": 4, "dp": 4, "micro_batch": 1, "global_batch": 32, "schedule": "interleaved",
                        "virtual_stages": 4, "sequence_parallel": True, "zero": 3, "zero_impl": "deepspeed",
                        "stage_layers": [[1, 2, 2, 2], 8, 8, [2, 2, 2, 1]]},
           "training": {"seq_len": 1024}}
    zero3 = experiment_from_dict(doc)
    one = experiment_from_dict({**doc, "parallel": {**doc["parallel"], "zero": 1, "zero_impl": "auto"}})
    a = training_step(zero3.model, zero3.parallel, zero3.training, zero3.options)
    b = training_step(one.model, one.parallel, one.training, one.options)
    assert a.executed_flops == pytest.approx(b.executed_flops, rel=1e-12)
    assert run_experiment(zero3, force=True).step_time > 0


# ------------------------------------------- embedding-only and output-only chunks
END_CHUNKS = {"cluster": {"preset": "dgx-h100", "nodes": 4}, "model": {"preset": "llama3-8b", "layers": 14},
              "parallel": {"tp": 2, "pp": 4, "dp": 4, "micro_batch": 1, "global_batch": 32,
                           "schedule": "interleaved", "virtual_stages": 4, "sequence_parallel": True,
                           "stage_layers": [[0, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 0]]},
              "training": {"seq_len": 1024}}


def test_end_chunks_may_hold_the_embedding_or_the_output_layer_alone():
    """Llama 3's schedule (Dubey et al. 2024, section 3.3.2: "the first model chunk on the first stage has only
    the embedding, and the last model chunk on the last stage has only output projection and loss") and
    Megatron-Core's account_for_embedding / loss_in_pipeline_split: the two end chunks may hold no layer.
    Their forward ops are exactly the embedding's and the output layer's kernels; every layer is still run
    once per micro-batch, so the step executes the FLOPs of the same model on an even 1F1B split."""
    from workloads.flops import embedding_ops, logits_ops

    exp = experiment_from_dict(END_CHUNKS)
    assert chunk_layers(14, exp.parallel, 0, 0) == [] and chunk_layers(14, exp.parallel, 3, 3) == []
    assert chunk_layers(14, exp.parallel, 0, 1) == [3]  # virtual stage 4 follows the first chunks of stages 1-3
    step = training_step(exp.model, exp.parallel, exp.training, exp.options)
    forward = [op for op in step.graph.ops if op.kind == "compute" and op.micro_batch == 0 and op.name[0] == "F"]
    last_rank = next(op.rank for op in forward if step.stage_of_rank[op.rank] == 3)
    first = [op for op in forward if op.rank == 0 and ".c0." in op.name]
    last = [op for op in forward if op.rank == last_rank and ".c3." in op.name]
    emb = tuple(o.kernel() for o in embedding_ops(exp.model, 1, 1024, 2, dtype_bytes=2).forward)
    out = tuple(o.kernel() for o in logits_ops(exp.model, 1, 1024, 2, sequence_parallel=True, dtype_bytes=2).forward)
    assert [op.parts for op in first] == [emb]
    assert [op.parts for op in last] == [out]
    even = experiment_from_dict({**END_CHUNKS, "parallel": {**END_CHUNKS["parallel"], "schedule": "1f1b",
                                                            "virtual_stages": 1, "stage_layers": [4, 4, 3, 3]}})
    plain = training_step(even.model, even.parallel, even.training, even.options)
    assert step.executed_flops == pytest.approx(plain.executed_flops, rel=1e-12)
    assert run_experiment(exp).step_time > 0


@pytest.mark.parametrize("counts, where", [
    ([[1, 0, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1]], r"stage_layers\[0\]\[1\]"),
    ([[1, 1, 1, 1], [0, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1]], r"stage_layers\[1\]\[0\]"),
    ([[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 0, 1]], r"stage_layers\[3\]\[2\]"),
])
def test_only_the_end_chunks_may_be_empty(counts, where):
    doc = {**END_CHUNKS, "parallel": {**END_CHUNKS["parallel"], "stage_layers": counts}}
    with pytest.raises(ConfigError, match=where + ": must be a positive integer"):
        experiment_from_dict(doc)


@pytest.mark.parametrize("doc, plain", [
    # zb-h1 splits the backward: the embedding-only chunk's input-gradient pass has nothing to run
    ({"model": {"preset": "llama3-8b", "layers": 12},
      "parallel": {"tp": 2, "pp": 4, "dp": 2, "global_batch": 8, "schedule": "zb-h1",
                   "stage_layers": [[0], [6], [6], [0]]}, "options": {"granularity": "layer"}}, [3, 3, 3, 3]),
    # DualPipe with a MoE model (layer-by-layer segments) and an embedding-only first stage
    ({"model": {"preset": "mixtral-8x7b", "layers": 6},
      "parallel": {"tp": 1, "pp": 4, "dp": 4, "ep": 2, "global_batch": 32, "schedule": "dualpipe",
                   "stage_layers": [[0], [2], [2], [2]]}}, [1, 2, 2, 1]),
])
def test_empty_end_chunks_under_split_backwards_run_and_conserve_flops(doc, plain):
    """Found in review: an empty input-gradient pass left no segment to hang the pass's collectives on. The
    step executes the FLOPs of the same model and schedule on a split with a layer on every stage."""
    doc = {"cluster": {"preset": "dgx-h100", "nodes": 2}, "training": {"seq_len": 1024}, **doc}
    exp = experiment_from_dict(doc)
    even = experiment_from_dict({**doc, "parallel": {**doc["parallel"], "stage_layers": plain}})
    a = training_step(exp.model, exp.parallel, exp.training, exp.options, exp.routing)
    b = training_step(even.model, even.parallel, even.training, even.options, even.routing)
    assert a.executed_flops == pytest.approx(b.executed_flops, rel=1e-12)
    assert run_experiment(exp, force=True).step_time > 0


def test_empty_end_chunk_needs_the_embedding_and_loss():
    doc = {**END_CHUNKS, "options": {"embedding_and_loss": False}}
    with pytest.raises(ConfigError, match=r"^parallel\.stage_layers: an empty end chunk .* needs "
                                          r"options\.embedding_and_loss: true$"):
        experiment_from_dict(doc)


def test_a_plain_count_is_a_one_chunk_stage_empty_ends_included():
    """Found by a new-user audit: ``[[12], [0]]`` ran while ``[12, 0]``, the same split, was refused. Without
    interleaving a stage's plain count is its one chunk, so the model's end stages may be empty in both forms
    and give the same step; a middle stage may not."""
    doc = {"cluster": {"preset": "dgx-h100", "nodes": 2}, "model": {"preset": "gpt2-small"},
           "parallel": {"tp": 2, "pp": 2, "dp": 4, "micro_batch": 4, "global_batch": 64},
           "training": {"seq_len": 1024}}
    for plain, nested in (([12, 0], [[12], [0]]), ([0, 12], [[0], [12]])):
        a, b = (run_experiment(experiment_from_dict({**doc, "parallel": {**doc["parallel"], "stage_layers": x}}))
                for x in (plain, nested))
        assert a.step_time == b.step_time
