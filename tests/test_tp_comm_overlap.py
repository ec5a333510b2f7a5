"""TP communication overlap (``parallel.tp_comm_overlap``: Transformer Engine userbuffers under Megatron-Core).

Truths used (closed forms and hand counts, never the code's own numbers):

* ring exchange (all-gather before a GEMM, ``t`` chunks): the GEMM's chunks of ``a`` seconds and the
  ``t - 1`` block transfers of ``c`` seconds pipeline, so the GEMM ends ``a + (t - 1) max(a, c)`` after it
  starts (the chunk on the local block runs while the first block travels);
* pipelined reduce-scatter after a GEMM (TE's 4 splits): chunk ``i``'s reduce-scatter runs beside chunk
  ``i + 1``'s GEMM: ``g + r + 3 max(g, r)``;
* bulk overlap (column-parallel backward): the data-gradient GEMM runs beside the all-gather of the saved
  input, the weight-gradient GEMM beside the reduce-scatter of the data gradient: ``max(d, ag) + max(w, rs)``;
* TE's defaults: 16 SMs held by the pipelined and bulk communication (the GEMM beside it runs on the rest:
  ``132 / 116`` the time of a many-wave GEMM on an H100), none by the ring exchange (copy engines);
* bytes: per layer and micro-batch, forward 2 all-gathers + 2 reduce-scatters, backward 4 all-gathers (``dY``
  of both row-parallel layers and the re-gathered inputs of both column-parallel ones) + 2 reduce-scatters,
  each of ``b s h`` elements (all-gathers in FP8 under FP8 training); a ring over ``t`` ranks puts ``(t - 1)``
  times the buffer on the wire per group.
"""

import pytest

from simulator.compute import ComputeModel
from simulator.experiment import experiment_from_dict, run_experiment
from topologies.gpus import get_gpu
from workloads.errors import ConfigError
from workloads.models import model_from_dict
from workloads.ops import Kernel
from workloads.parallel import ParallelConfig, TrainingSpec, validate
from workloads.training import StepOptions, training_step

H, F, S = 4096, 16384, 4096
MODEL = {"name": "ubm", "layers": 2, "hidden": H, "heads": 32, "kv_heads": 32, "ffn_hidden": F, "vocab": 32000,
         "gated_mlp": False, "tied_embeddings": False, "max_seq_len": S}
O = 1e-6  # the compute model's launch cost per kernel


def _run(overlap=True, *, tp=8, dp=1, pp=1, m=1, dtype="bf16", cluster=None, options=None, fidelity="full",
         **par):
    gpus = tp * dp * pp
    doc = {"cluster": cluster or {"preset": "dgx-h100", "nodes": 1, "gpus_per_node": gpus}, "model": MODEL,
           "parallel": {"tp": tp, "dp": dp, "pp": pp, "sequence_parallel": True, "global_batch": m * dp,
                        "tp_comm_overlap": overlap, **par},
           "training": {"seq_len": S, "dtype": dtype},
           "options": {"granularity": "layer", "embedding_and_loss": False, **(options or {})}}
    return run_experiment(experiment_from_dict(doc), fidelity=fidelity, force=True)


def _norm_sync(tp: int, layers: int = MODEL["layers"], hidden: int = H, experts: int = 0) -> float:
    """Bytes one TP group's ranks send for the step's all-reduce under sequence parallelism of the fp32 gradients
    Megatron-Core tags ``sequence_parallel`` (``_allreduce_layernorm_grads``): two RMSNorms of ``h`` a layer, and a
    MoE layer's ``h x E`` router; a ring all-reduce sends ``2 (t - 1) / t`` of it from each of the ``t`` ranks."""
    return 2 * (tp - 1) * (2 * hidden + hidden * experts) * layers * 4


def _rank0(result):
    ops = result.ops
    return ops[ops["rank"] == 0].set_index("name")


# four servers of one GPU each at 25 GB/s: the TP collectives are far slower than the GEMMs
SLOW = {"preset": "dgx-h100", "nodes": 4, "gpus_per_node": 1, "nic_bandwidth": "200Gb/s"}


# ---------------------------------------------------------------- closed forms
@pytest.mark.parametrize("comm_bound", [False, True])
def test_ring_exchange_all_gather_pipelines_with_the_gemm_chunks(comm_bound):
    tp = 4
    ops = _rank0(_run(tp=tp, cluster=SLOW if comm_bound else None))
    before, over, ring = ops.loc["F0.c0.L0.ub1"], ops.loc["F0.c0.L0.ub2"], ops.loc["F0.c0.L0.tp_qkv_all_gather"]
    rest = ops.loc["F0.c0.L0.ub3"]                  # the last QKV chunk, then attention ...
    a = over["duration_s"] / (tp - 1)               # one chunk of the QKV GEMM (kernel launch included)
    c = ring["duration_s"] / (tp - 1)               # one block of the ring
    assert ring["stream"] == "tp_overlap" and over["stream"] == "compute"
    assert ring["start_s"] == pytest.approx(before["end_s"]) and over["start_s"] == pytest.approx(before["end_s"])
    # the last chunk starts once the ring is done and the other chunks have run:
    # the GEMM ends a + (t - 1) max(a, c) after it started
    assert rest["start_s"] + a - over["start_s"] == pytest.approx(a + (tp - 1) * max(a, c), rel=1e-9)
    assert (c > a) == comm_bound


@pytest.mark.parametrize("comm_bound", [False, True])
def test_pipelined_reduce_scatter_hides_all_but_one_chunk(comm_bound):
    ops = _rank0(_run(tp=4, cluster=SLOW if comm_bound else None))
    first = ops.loc["F0.c0.L0.ub7"]                 # ... the MLP activation, the first MLP-down chunk
    rest = ops.loc["F0.c0.L0.ub8"]                  # the other 3 chunks
    rs = ops[ops.index == "F0.c0.L0.tp_mlp_down_reduce_scatter"]
    hidden, exposed = rs[rs["stream"] == "tp_overlap"].iloc[0], rs[rs["stream"] == "compute"].iloc[0]
    g = rest["duration_s"] / 3
    r = exposed["duration_s"]                       # one chunk's reduce-scatter
    assert hidden["duration_s"] == pytest.approx(3 * r, rel=1e-9)
    assert hidden["start_s"] == pytest.approx(first["end_s"]) and rest["start_s"] == pytest.approx(first["end_s"])
    # g + r + 3 max(g, r) after the first chunk started
    assert exposed["end_s"] - (first["end_s"] - g) == pytest.approx(g + r + 3 * max(g, r), rel=1e-9)
    assert (r > g) == comm_bound


@pytest.mark.parametrize("comm_bound", [False, True])
def test_bulk_overlap_of_the_column_parallel_backward(comm_bound):
    ops = _rank0(_run(tp=4, cluster=SLOW if comm_bound else None))
    b = ops[ops.index.str.startswith("B0.c0.L1.")]
    ag, rs = b.loc["B0.c0.L1.tp_qkv.dgrad_all_gather"], b.loc["B0.c0.L1.tp_qkv.wgrad_reduce_scatter"]
    dgrad = b[(b["stream"] == "compute") & (b["start_s"] == ag["start_s"])].iloc[0]
    wgrad = b[(b["stream"] == "compute") & (b["start_s"] == rs["start_s"])].iloc[0]
    after = b[(b["stream"] == "compute") & (b["start_s"] > wgrad["start_s"])].sort_values("start_s").iloc[0]
    # dX is reduce-scattered once computed (and the gather before it on the stream is done), dW needs the
    # gathered input
    assert rs["start_s"] == pytest.approx(max(dgrad["end_s"], ag["end_s"]))
    assert wgrad["start_s"] == pytest.approx(max(dgrad["end_s"], ag["end_s"]))
    assert after["start_s"] == pytest.approx(max(wgrad["end_s"], rs["end_s"]))  # the norm backward needs dX
    total = after["start_s"] - dgrad["start_s"]
    assert total == pytest.approx(max(dgrad["duration_s"], ag["duration_s"]) +
                                  max(wgrad["duration_s"], rs["duration_s"]), rel=1e-9)
    assert (ag["duration_s"] > dgrad["duration_s"]) == comm_bound


def test_pipelined_and_bulk_gemms_run_on_the_sms_the_communication_leaves():
    gpu = get_gpu("H100-SXM")
    model = ComputeModel(gpu)
    big = (16384, 4096, 16384)  # 64 waves of 256x128 tiles: time goes as 1 / SMs
    flops = 2.0 * big[0] * big[1] * big[2]
    full = model.duration(Kernel("gemm", flops, 0.0, big))
    held = model.duration(Kernel("gemm", flops, 0.0, big, sm_reserved=16))
    assert (held - O) / (full - O) == pytest.approx(gpu.sm_count / (gpu.sm_count - 16), rel=0.02)
    # a run with no SMs held gives the pipelined chunks their full speed, the ring chunks never lose any
    default, free = _rank0(_run(tp=4)), _rank0(_run(tp=4, options={"tp_comm_overlap_sms": 0}))
    assert free.loc["F0.c0.L0.ub4", "duration_s"] < default.loc["F0.c0.L0.ub4", "duration_s"]
    assert free.loc["F0.c0.L0.ub2", "duration_s"] == default.loc["F0.c0.L0.ub2", "duration_s"]


# ------------------------------------------------------------------ invariants
@pytest.mark.parametrize("dtype, recompute, per_buffer", [
    ("bf16", "none", 10),       # forward 2 AG + 2 RS, backward 4 AG + 2 RS
    ("fp8", "none", 7),         # the 6 all-gathers carry FP8: 6 / 2 + 4
    ("bf16", "full", 14),       # the recomputed forward communicates again
])
def test_tp_bytes_by_hand(dtype, recompute, per_buffer):
    tp, m = 4, 2
    r = _run(tp=tp, m=m, dtype=dtype, recompute=recompute)
    buffer = 1 * S * H * 2                          # b s h bf16 elements
    assert r.bytes_by_class["tp"] == pytest.approx(MODEL["layers"] * m * per_buffer * (tp - 1) * buffer
                                                   + _norm_sync(tp))


@pytest.mark.parametrize("recompute, per_buffer", [("none", 10), ("full", 14)])
def test_without_overlap_the_same_buffers_move(recompute, per_buffer):
    # Without userbuffers the backward still re-gathers the QKV / MLP-up inputs (Megatron-LM's
    # LinearWithGradAccumulationAndAsyncCommunication, TE's Linear), beside the data-gradient GEMMs: the same
    # 10 buffers per layer as with the overlap (14 with full recompute), in bf16.
    tp, m = 4, 2
    r = _run(False, tp=tp, m=m, recompute=recompute)
    assert r.bytes_by_class["tp"] == pytest.approx(MODEL["layers"] * m * per_buffer * (tp - 1) * S * H * 2
                                                   + _norm_sync(tp))


@pytest.mark.parametrize("cp_comm_type", ["p2p", "all_gather", "a2a"])
def test_context_parallel_layers_re_gather_too(cp_comm_type):
    # A CP layer's backward re-gathers its column-parallel inputs like any other (their b s/cp h share): the
    # same 10 buffers per layer, each 1/cp of the sequence.
    tp, cp, m = 2, 2, 2
    doc = {"cluster": {"preset": "dgx-h100", "nodes": 1, "gpus_per_node": tp * cp}, "model": MODEL,
           "parallel": {"tp": tp, "cp": cp, "cp_comm_type": cp_comm_type, "sequence_parallel": True,
                        "global_batch": m},
           "training": {"seq_len": S}, "options": {"granularity": "layer", "embedding_and_loss": False}}
    r = run_experiment(experiment_from_dict(doc), fidelity="full", force=True)
    assert r.bytes_by_class["tp"] == pytest.approx(MODEL["layers"] * m * 10 * (tp - 1) * S // cp * H * 2 * cp
                                                   + cp * _norm_sync(tp))
    regathers = r.ops[r.ops["name"].str.endswith(".tp_regather")]
    assert len(regathers) == MODEL["layers"] * m * tp * cp and set(regathers["stream"]) == {"tp_regather"}


@pytest.mark.parametrize("shared, per_buffer", [(0, 13), (1, 18)])
def test_moe_layers_re_gather_their_qkv_and_shared_expert_inputs(shared, per_buffer):
    # A MoE layer, forward: the attention's AG + RS of b s h, the shared expert's (Megatron-Core's
    # SharedExpertMLP gathers the layer's tokens as a dense MLP does), and the dispatcher's AG over TP after the
    # exchange and RS before the combine of the k b s tokens the rank's experts run (k = 2: 2 buffers each);
    # backward the same and the re-gather of the QKV input (column-parallel attention), plus that of the shared
    # expert's up-projection input; the routed experts' input is the dispatcher's gather, kept by autograd, so
    # it is not gathered again. Per layer 2 (2 + 2k) + 1 = 13 buffers, 2 (4 + 2k) + 2 = 18 with shared experts
    # (9 and 10 until 2026-12-04, when the MoE layer had a dense MLP's pair in place of the dispatcher's).
    tp, dp, layers, s = 2, 4, 2, 1024
    doc = {"cluster": {"preset": "dgx-h100", "nodes": 1},
           "model": {"preset": "mixtral-8x7b", "layers": layers, "shared_experts": shared},
           "parallel": {"tp": tp, "dp": dp, "ep": 4, "sequence_parallel": True, "global_batch": dp},
           "training": {"seq_len": s}, "options": {"granularity": "layer", "embedding_and_loss": False},
           "moe": {"routing": "balanced"}}
    full = run_experiment(experiment_from_dict(doc), fidelity="full", force=True)
    groups, buffer = dp, s * 4096 * 2  # TP groups; b s h bf16 elements (mixtral hidden 4096)
    assert full.bytes_by_class["tp"] == pytest.approx(groups * (layers * per_buffer * (tp - 1) * buffer
                                                                + _norm_sync(tp, layers, 4096, experts=8)))
    fast = run_experiment(experiment_from_dict(doc), fidelity="fast", force=True)
    assert fast.bytes_by_class["tp"] == pytest.approx(full.bytes_by_class["tp"])
    assert fast.step_time == pytest.approx(full.step_time, rel=1e-9)


def test_overlap_runs_the_same_flops_and_hides_tp_time():
    on, off = _run(tp=8), _run(False, tp=8)
    assert on.summary["executed_flops_per_step"] == pytest.approx(off.summary["executed_flops_per_step"])
    exposed_on = on.time_breakdown()["exposed_tp"].mean()
    exposed_off = off.time_breakdown()["exposed_tp"].mean()
    assert exposed_on < 0.5 * exposed_off
    assert on.step_time < off.step_time


def test_identical_layers_are_emitted_once_with_counts():
    # chunk granularity: one run of both layers, every op twice its single-layer size; same step time
    coarse = _run(tp=4, options={"granularity": "chunk"})
    fine = _run(tp=4)
    assert coarse.step_time == pytest.approx(fine.step_time, rel=1e-9)
    assert len(coarse.ops) < len(fine.ops)
    assert coarse.bytes_by_class["tp"] == pytest.approx(fine.bytes_by_class["tp"])


@pytest.mark.parametrize("fidelity", ["fast", "lockstep"])
def test_representatives_agree_with_full(fidelity):
    kw = {"tp": 4, "dp": 2, "pp": 2, "m": 4, "zero": 1, "cluster": {"preset": "dgx-h100", "nodes": 2}}
    full, rep = _run(**kw), _run(fidelity=fidelity, **kw)
    assert rep.step_time == pytest.approx(full.step_time, rel=0.02)
    for cls, nbytes in full.bytes_by_class.items():
        assert rep.bytes_by_class[cls] == pytest.approx(nbytes, rel=1e-9)


# ---------------------------------------------------------------------- errors
@pytest.mark.parametrize("par, match", [
    ({"tp": 2}, "parallel.tp_comm_overlap: needs sequence_parallel with tp > 1"),
    ({"tp": 1, "sequence_parallel": True}, "parallel.tp_comm_overlap: needs sequence_parallel"),
    ({"tp": 2, "sequence_parallel": True, "dp": 2, "zero": 3}, "\\(zero 0 or 1\\), not zero: 3"),
    ({"tp": 2, "sequence_parallel": True, "cp": 2}, "parallel.tp_comm_overlap: not modelled with context"),
    ({"tp": 2, "sequence_parallel": True, "tp_comm_overlap": "yes"}, "parallel.tp_comm_overlap: must be true"),
])
def test_bad_configs_are_one_line_errors(par, match):
    with pytest.raises(ConfigError, match=match):
        validate(model_from_dict(MODEL), ParallelConfig(**{"tp_comm_overlap": True, **par}),
                 TrainingSpec(seq_len=S))


def test_moe_is_refused():
    moe = {**MODEL, "experts": 8, "top_k": 2, "moe_ffn_hidden": 1024}
    with pytest.raises(ConfigError, match="parallel.tp_comm_overlap: userbuffer overlap is modelled for dense"):
        validate(model_from_dict(moe), ParallelConfig(tp=2, sequence_parallel=True, tp_comm_overlap=True),
                 TrainingSpec(seq_len=S))


@pytest.mark.parametrize("sms, match", [(132, "leave none of the 132 SMs"), (-1, "0..1024"), (True, "0..1024")])
def test_bad_sm_counts_are_one_line_errors(sms, match):
    with pytest.raises(ConfigError, match=f"options.tp_comm_overlap_sms: .*{match}"):
        _run(tp=2, options={"tp_comm_overlap_sms": sms})


def test_training_step_api():
    step = training_step(model_from_dict(MODEL), ParallelConfig(tp=2, sequence_parallel=True, tp_comm_overlap=True),
                         TrainingSpec(seq_len=S), StepOptions(tp_comm_overlap_sms=8))
    held = {k.sm_reserved for op in step.graph.ops if op.kind == "compute" and op.parts for k in op.parts}
    assert held == {0, 8}
    streams = {op.stream for op in step.graph.ops if op.kind == "collective" and op.traffic_class == "tp"}
    # (tp_regather: the output layer's re-gather, Megatron's own ColumnParallelLinear, not a userbuffers layer)
    assert streams == {"compute", "tp_overlap", "tp_regather"}
    regathers = [op for op in step.graph.ops if op.kind == "collective" and op.stream == "tp_regather"]
    assert {op.count for op in regathers} == {1}


@pytest.mark.parametrize("pp, m", [(1, 3), (2, 4)])
def test_re_gathers_start_with_their_backward_pass_not_before(pp, m):
    # A backward right after its own forward (every micro-batch with pp = 1; the last stage's) has no explicit
    # dependency; its re-gathers, on their own stream, used to start at t = 0, during the forwards (found by a
    # QA hunt: the screen then read 1.8-2.5% under fast). Each must start no earlier than its pass's first
    # compute op, on the same rank.
    tp = 2
    doc = {"cluster": {"preset": "dgx-h100", "nodes": 1, "gpus_per_node": tp * pp}, "model": MODEL,
           "parallel": {"tp": tp, "pp": pp, "sequence_parallel": True, "global_batch": m},
           "training": {"seq_len": S}, "options": {"granularity": "layer", "embedding_and_loss": False}}
    ops = run_experiment(experiment_from_dict(doc), fidelity="full", force=True).ops
    regathers = ops[ops["name"].str.endswith(".tp_regather")]
    assert len(regathers) > 0
    compute = ops[ops["stream"] == "compute"]
    for row in regathers.itertuples():
        name = row.name[: -len(".tp_regather")]
        mine = compute[(compute["rank"] == row.rank)
                       & compute["name"].isin([name, "R" + name[1:]])]
        assert len(mine) and row.start_s >= mine["start_s"].min() - 1e-15, row.name


def test_output_layer_re_gathers_beside_its_own_backward():
    # The output layer (a ColumnParallelLinear) re-gathers its sequence-split input in the backward, launched
    # before its data-gradient GEMM. With per-layer segments and pp = 1 it used to ride on the pass's last
    # segment (the embedding's backward, which has no column-parallel linear) and wait for the end of the
    # backward, with the embedding's all-gather waiting for it (found by a review of the sixteenth session).
    # Now each backward's first re-gather starts with its first compute op (the output layer's), its last
    # before the embedding's backward, and there is one per column-parallel input: 2 per layer + 1.
    tp, m = 2, 2
    doc = {"cluster": {"preset": "dgx-h100", "nodes": 1, "gpus_per_node": tp}, "model": MODEL,
           "parallel": {"tp": tp, "sequence_parallel": True, "global_batch": m},
           "training": {"seq_len": S}, "options": {"granularity": "layer"}}
    ops = run_experiment(experiment_from_dict(doc), fidelity="full", force=True).ops
    ops = ops[(ops["rank"] == 0) & ops["name"].str.startswith("B")]
    for _mb, mine in ops.groupby("micro_batch"):
        compute = mine[(mine["stream"] == "compute") & (mine["kind"] == "compute")]
        regathers = mine[mine["stream"] == "tp_regather"]
        assert regathers["count"].sum() == 2 * MODEL["layers"] + 1
        assert regathers["start_s"].min() == compute["start_s"].min()
        assert regathers["start_s"].max() < compute["start_s"].max()
