"""Distributed-optimizer parameter all-gather overlapped with the forward (``parallel.overlap_param_gather``).

Truths used (Megatron-Core's semantics, worked by hand):

* steady state: the all-gathers of the parameters the previous step's optimizer updated run at the start of
  this step's forward; the step ends at its optimizer step. The bytes are those of the gather after the
  optimizer step without overlap;
* buckets are filled in backward order, so the forward gathers the partial bucket (the first layers and the
  embedding) first; a layer waits for the bucket holding its parameters;
* unaligned (no interleaving): the forward pre-hook of a bucket's first module waits for it and dispatches
  the next bucket. With one layer per bucket, a forward of ``n`` layers of ``a`` seconds whose buckets take
  ``c`` (the small first bucket ``c0``) ends ``c0 + c + (n - 1) max(a, c) + a`` after the gathers start;
* aligned (interleaved, Megatron's default ``align_param_gather``): every stage dispatches the gathers of
  chunks 0 and 1 before its first forward and those of chunk ``c >= 2`` before its forward number
  ``(c - 1) p - r`` (Megatron's ``param_sync_virtual_microbatch_id = k + r`` rule).
"""

import pytest

from simulator.experiment import experiment_from_dict, run_experiment
from workloads.errors import ConfigError
from workloads.models import model_from_dict
from workloads.parallel import ParallelConfig, TrainingSpec, validate
from workloads.schedules import pipeline_schedule
from workloads.training import training_step

H, F = 1024, 4096
MODEL = {"name": "pgm", "layers": 4, "hidden": H, "heads": 8, "kv_heads": 8, "ffn_hidden": F, "vocab": 1024,
         "gated_mlp": False, "tied_embeddings": False, "max_seq_len": 4096}
LAYER = model_from_dict(MODEL).params_per_layer(0, 1, 1)
GRAD = 4  # Megatron's fp32 gradient buffer under bf16


def _doc(overlap=True, *, dp=2, pp=1, m=1, cluster=None, **par):
    return {"cluster": cluster or {"preset": "dgx-h100", "nodes": 1, "gpus_per_node": dp * pp}, "model": MODEL,
            "parallel": {"dp": dp, "pp": pp, "zero": 1, "global_batch": m * dp, "overlap_param_gather": overlap,
                         **par},
            "training": {"seq_len": 4096}, "options": {"embedding_and_loss": False},
            # (the closed forms take each layer's time alone: tests/test_comm_interference.py slows it beside
            # the gathers)
            "compute": {"comm_sms": 0, "p2p_sms": 0}}


def _run(overlap=True, fidelity="full", **kw):
    return run_experiment(experiment_from_dict(_doc(overlap, **kw)), fidelity=fidelity, force=True)


# two servers of one GPU at 10 Gb/s: a bucket's all-gather takes longer than a layer's forward
SLOW = {"preset": "dgx-h100", "nodes": 2, "gpus_per_node": 1, "nic_bandwidth": "10Gb/s"}


@pytest.mark.parametrize("comm_bound", [False, True])
def test_each_layer_waits_for_its_bucket_and_dispatches_the_next(comm_bound):
    r = _run(grad_bucket_bytes=LAYER * GRAD, cluster=SLOW if comm_bound else None)
    ops = r.ops[r.ops["rank"] == 0]
    gathers = ops[ops["name"] == "param_all_gather"].sort_values("start_s")
    layers = ops[ops["name"].str.match(r"F0\.c0\.L\d+$")].sort_values("start_s")
    n = MODEL["layers"]
    assert len(gathers) == n + 1 and len(layers) == n        # the partial bucket (embedding, output) + 1 per layer
    c0, c = gathers["duration_s"].iloc[0], gathers["duration_s"].iloc[1]
    a = layers["duration_s"].iloc[1]
    assert gathers["start_s"].iloc[0] == 0.0
    end = layers["end_s"].iloc[-1]
    assert end == pytest.approx(c0 + c + (n - 1) * max(a, c) + a, rel=1e-9)
    assert (c > a) == comm_bound


def test_one_bucket_moves_the_gather_to_the_front_and_changes_nothing_else():
    big = 10 * LAYER * MODEL["layers"] * GRAD
    on, off = _run(grad_bucket_bytes=big), _run(False, grad_bucket_bytes=big)
    assert on.step_time == pytest.approx(off.step_time, rel=1e-9)
    first = on.ops[(on.ops["rank"] == 0)].sort_values("start_s").iloc[0]
    assert first["name"] == "param_all_gather"


@pytest.mark.parametrize("par", [{}, {"pp": 2, "schedule": "interleaved", "virtual_stages": 2, "m": 4},
                                 {"pp": 2, "m": 4, "grad_bucket_bytes": 3_000_000}])
def test_the_same_bytes_as_the_gather_after_the_optimizer(par):
    kw = {"cluster": {"preset": "dgx-h100", "nodes": 1}, "dp": 2 if par else 8, **par}
    kw["cluster"]["gpus_per_node"] = kw["dp"] * kw.get("pp", 1)
    on, off = _run(**kw), _run(False, **kw)
    assert on.bytes_by_class["zero"] == pytest.approx(off.bytes_by_class["zero"], rel=1e-12)
    assert on.summary["executed_flops_per_step"] == pytest.approx(off.summary["executed_flops_per_step"])


def test_fp8_casts_each_layer_once_gathered():
    model = model_from_dict(MODEL)
    par = dict(dp=2, zero=1, global_batch=2, grad_bucket_bytes=LAYER * GRAD)

    def casts(overlap):
        step = training_step(model, ParallelConfig(overlap_param_gather=overlap, **par),
                             TrainingSpec(seq_len=4096, dtype="fp8"))
        return [op for op in step.graph.ops if op.rank == 0 and op.name.endswith("fp8_weight_cast")], step.graph
    on, graph = casts(True)
    off, _ = casts(False)
    assert len(on) == MODEL["layers"] and len(off) == 1
    assert sum(op.nbytes for op in on) == pytest.approx(sum(op.nbytes for op in off))
    gathers = {op.id for op in graph.ops if op.name == "param_all_gather"}
    assert all(set(op.deps) & gathers for op in on)          # each cast waits for its layer's bucket


@pytest.mark.parametrize("pp, v", [(2, 4), (4, 3)])
def test_aligned_dispatch_follows_megatron_interleaved_rule(pp, v):
    model = model_from_dict({**MODEL, "layers": pp * v})
    m = 2 * pp
    step = training_step(model, ParallelConfig(pp=pp, dp=2, zero=1, schedule="interleaved", virtual_stages=v,
                                               global_batch=2 * m, overlap_param_gather=True),
                         TrainingSpec(seq_len=4096))
    sched = pipeline_schedule("interleaved", pp, m, v)
    for stage in range(pp):
        rank = step.layout.rank(pp=stage)
        mine = [op for op in step.graph.ops if op.rank == rank]
        compute = [op for op in mine if op.stream == "compute"]
        forwards = [a for a in sched[stage] if a.phase == "F"]
        for chunk in range(v):
            gathers = [op for op in mine if op.name == "param_all_gather" and op.layer == chunk * pp + stage]
            assert gathers                               # one layer per chunk: its layer is c p + stage
            if chunk < 2:                                # dispatched before anything runs
                assert all(op.deps == () for op in gathers)
                continue
            k = (chunk - 1) * pp - stage                 # dispatched on reaching forward number k
            nxt = next(op for op in compute if op.id > gathers[-1].id and op.kind == "compute")
            assert nxt.name.startswith(f"F{forwards[k].micro_batch}.c{forwards[k].chunk}.")
            prev = max(op.id for op in compute if op.id < gathers[0].id)
            assert all(op.deps == (prev,) for op in gathers)


def test_aligned_gathers_of_the_first_chunks_start_at_time_zero_on_every_stage():
    r = _run(dp=2, pp=2, m=4, schedule="interleaved", virtual_stages=2, cluster={"preset": "dgx-h100", "nodes": 1,
                                                                                 "gpus_per_node": 4})
    g = r.ops[r.ops["name"] == "param_all_gather"]
    assert (g.groupby("rank")["start_s"].min() == 0.0).all()
    # unaligned, the last stage waits for its first activation before gathering
    u = _run(dp=2, pp=2, m=4, schedule="interleaved", virtual_stages=2, align_param_gather=False,
             cluster={"preset": "dgx-h100", "nodes": 1, "gpus_per_node": 4})
    ug = u.ops[u.ops["name"] == "param_all_gather"]
    assert (ug[ug["stage"] == 1]["start_s"].min() > 0.0)


@pytest.mark.parametrize("fidelity", ["fast", "lockstep"])
def test_representatives_agree_with_full(fidelity):
    kw = {"dp": 2, "pp": 2, "m": 4, "tp": 2, "schedule": "interleaved", "virtual_stages": 2,
          "cluster": {"preset": "dgx-h100", "nodes": 1}}
    full, rep = _run(**kw), _run(fidelity=fidelity, **kw)
    assert rep.step_time == pytest.approx(full.step_time, rel=0.02)
    for cls, nbytes in full.bytes_by_class.items():
        assert rep.bytes_by_class[cls] == pytest.approx(nbytes, rel=1e-9)


@pytest.mark.parametrize("par, match", [
    ({"zero": 0}, "parallel.overlap_param_gather: .* needs zero: 1"),
    ({"zero": 2}, "needs zero: 1"),
    ({"zero": 1, "zero_impl": "deepspeed"}, "zero_impl: deepspeed"),
    ({"zero": 1, "overlap_grad_reduce": False}, "needs overlap_grad_reduce: true"),
    ({"zero": 1, "overlap_param_gather": 1}, "parallel.overlap_param_gather: must be true or false"),
    ({"zero": 1, "align_param_gather": "no"}, "parallel.align_param_gather: must be true or false"),
])
def test_bad_configs_are_one_line_errors(par, match):
    with pytest.raises(ConfigError, match=match):
        validate(model_from_dict(MODEL), ParallelConfig(**{"dp": 2, "overlap_param_gather": True, **par}),
                 TrainingSpec(seq_len=4096))


def test_stages_after_the_first_gather_one_bucket():
    # Megatron-Core turns bucketing off for pp_rank > 0 (DistributedDataParallel: bucket_size None), and the
    # parameter all-gathers use the same buckets: stage 1 gathers its chunk at once, stage 0 layer by layer.
    r = _run(grad_bucket_bytes=LAYER * GRAD, pp=2, m=2, placement=["tp", "dp", "pp"])
    gathers = r.ops[r.ops["name"] == "param_all_gather"]
    per_rank = gathers.groupby("rank")["nbytes"].agg(["count", "sum"])
    assert per_rank.loc[0, "count"] > 1 and per_rank.loc[2, "count"] == 1
    assert per_rank.loc[2, "sum"] == pytest.approx(per_rank.loc[0, "sum"], rel=0.01)  # equal stages


def test_chunks_after_the_first_gather_one_bucket():
    # per_chunk_bucket_sizes is None for chunk > 0 too: with quarter-layer buckets, stage 0 gathers its chunk 0
    # (layer 0 and the embedding) in several buckets and its chunk 1 (layer 2: virtual stage 2) in one.
    r = _run(grad_bucket_bytes=LAYER * GRAD // 4, pp=2, m=2, schedule="interleaved", virtual_stages=2,
             placement=["tp", "dp", "pp"])
    gathers = r.ops[(r.ops["name"] == "param_all_gather") & (r.ops["rank"] == 0)]
    assert (gathers["layer"] == 0).sum() > 4 and (gathers["layer"] == 2).sum() == 1
