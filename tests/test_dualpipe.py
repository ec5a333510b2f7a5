"""DualPipe (``parallel.schedule: dualpipe``; DeepSeek-V3 technical report section 3.2.1, deepseek-ai/DualPipe).

Truths used (the paper's and the reference code's, never numbers computed by the code under test):

* the order of ``DualPipe.step`` worked by hand from its eight steps for 4 ranks and 8 micro-batches;
* the reference's asserts: pp even, micro-batches even and at least 2 pp;
* every rank runs the forward and backward of each micro-batch of each direction exactly once, the forward
  direction on chunk 0 and the reverse one on chunk 1, and a ``W`` for every backward it splits;
* Table 2: parameters 2x per device, activations PP + 1 (micro-batch-chunks in flight), bubble
  ``(PP/2 - 1)(F&B + B - 3W)`` with ``B`` the *full* backward, in the regime of the paper's figure
  (``F`` = the input-gradient backward, ``W <= F``, an overlapped pair between ``max(F, B)`` and ``F + B``);
* with ``pp = 2`` the bubble vanishes (``PP/2 - 1 = 0``) whatever the durations.
"""

import sys
from pathlib import Path

import pytest

from simulator.experiment import experiment_from_dict, run_experiment
from workloads.errors import ConfigError
from workloads.memory import memory_per_gpu, micro_batches_in_flight, stage_params
from workloads.models import model_from_dict
from workloads.parallel import ParallelConfig, TrainingSpec, chunk_layers, stage_layers, validate
from workloads.schedules import max_in_flight, pipeline_schedule, simulate_unit_times
from workloads.training import StepOptions, training_step

sys.path.insert(0, str(Path(__file__).parent))
from test_moe_training import MOE  # noqa: E402
from test_training import free_cluster, uniform_model  # noqa: E402


def _order(actions) -> str:
    """``F3`` / ``B5`` / ``W2``, an overlapped pair in brackets."""
    out = []
    for a in actions:
        s = f"{a.phase}{a.micro_batch}"
        out.append(("[" + s) if a.paired and a.phase == "F" else (s + "]") if a.paired else s)
    return " ".join(out)


# ------------------------------------------------------------------ the order
def test_order_is_the_reference_steps_worked_by_hand():
    # 4 ranks, 8 micro-batches: 0-3 enter at rank 0, 4-7 at rank 3. Rank 0 (h = 0): step 1 F0 F1; step 2
    # F2 F4; step 3 B4 W4 F5; step 4 (one round) [F3 B5] [F6 B0]; step 5 B6 [F7 B1]; step 6 B7 (whole) B2
    # (split); step 7 W2 B3; step 8 W3. Rank 1 (h = 1, a middle rank): step 2 F0 F4 F1 F5; step 4 (two
    # rounds, the first not overlapped) F2 B4 [F6 B0] [F3 B5] [F7 B1]; step 6 B6 B2 B7 B3 (the last two
    # split, h odd); step 8 W7 W3. Ranks 3 and 2 mirror them with the directions swapped.
    s = pipeline_schedule("dualpipe", 4, 8)
    assert _order(s[0]) == "F0 F1 F2 F4 B4 W4 F5 [F3 B5] [F6 B0] B6 [F7 B1] B7 B2 W2 B3 W3"
    assert _order(s[1]) == "F0 F4 F1 F5 F2 B4 [F6 B0] [F3 B5] [F7 B1] B6 B2 B7 B3 W7 W3"
    assert _order(s[2]) == "F4 F0 F5 F1 F6 B0 [F2 B4] [F7 B1] [F3 B5] B2 B6 B3 B7 W3 W7"
    assert _order(s[3]) == "F4 F5 F6 F0 B0 W0 F1 [F7 B1] [F2 B4] B2 [F3 B5] B3 B6 W6 B7 W7"
    # the reference posts these sends late: rank 0's F2 after F4; the middle ranks' last step-2 forward
    # of their second phase and their first step-4 forward, each one action later
    late = {(r, a.micro_batch): a.send_after for r in range(4) for a in s[r] if a.send_after}
    assert late == {(0, 2): 1, (1, 5): 1, (1, 2): 1, (2, 1): 1, (2, 6): 1, (3, 6): 1}


@pytest.mark.parametrize("p, m", [(2, 4), (4, 8), (4, 14), (6, 12), (8, 20), (16, 32)])
def test_every_micro_batch_once_per_direction(p, m):
    for r, acts in enumerate(pipeline_schedule("dualpipe", p, m)):
        for phase in "FB":
            assert sorted((a.micro_batch, a.chunk) for a in acts if a.phase == phase) == \
                [(i, 0) for i in range(m // 2)] + [(i, 1) for i in range(m // 2, m)]
        w = [(a.micro_batch, a.chunk) for a in acts if a.phase == "W"]
        assert len(w) == len(set(w)) == 2 * (p // 2 - min(r, p - 1 - r) - 1) + min(r, p - 1 - r) + 1
        for i, a in enumerate(acts):
            if a.paired:  # a pair is a forward and the backward of a micro-batch of the other direction
                first = i == 0 or not acts[i - 1].paired or acts[i - 1].phase == "B"
                other = acts[i + 1] if first else acts[i - 1]
                assert (a.phase, other.phase) == (("F", "B") if first else ("B", "F"))
                assert a.chunk != other.chunk


@pytest.mark.parametrize("p, m", [(2, 4), (4, 8), (6, 16), (8, 20), (16, 32)])
def test_activations_in_flight_are_pp_plus_one(p, m):
    assert [max_in_flight(a) for a in pipeline_schedule("dualpipe", p, m)] == [p + 1] * p
    assert micro_batches_in_flight(ParallelConfig(pp=p, global_batch=m, schedule="dualpipe"), 0) == (p + 1) / 2


@pytest.mark.parametrize("p, m, match", [(3, 6, "must be even"), (4, 7, "micro_batches = 7 must be even"),
                                         (4, 6, "at least 2 \\* stages")])
def test_reference_asserts_are_value_errors(p, m, match):
    with pytest.raises(ValueError, match=match):
        pipeline_schedule("dualpipe", p, m)


# ------------------------------------------------------- bubble, list scheduler
@pytest.mark.parametrize("p, m", [(4, 8), (4, 10), (6, 12), (8, 16), (8, 20), (16, 32)])
@pytest.mark.parametrize("tw", [0.25, 0.5, 1.0])
@pytest.mark.parametrize("overlap", [0.0, 0.5, 1.0])
def test_unit_time_bubble_is_table_2(p, m, tw, overlap):
    tf = tb = 1.0                                   # F and the input-gradient backward, as the paper draws them
    full = tb + tw                                  # Table 2's B: a full backward chunk
    tfb = max(tf, full) + overlap * (tf + full - max(tf, full))  # F&B: from perfect overlap to none
    step, busy = simulate_unit_times(pipeline_schedule("dualpipe", p, m), tf, tb, 0.0, tw, t_pair=tfb,
                                     dualpipe=True)
    assert max(step - b for b in busy) == pytest.approx((p / 2 - 1) * (tfb + full - 3 * tw))


@pytest.mark.parametrize("tf, tb, tw", [(1.0, 1.0, 1.0), (1.0, 2.0, 0.5), (1.0, 0.4, 0.9), (2.0, 3.0, 0.1)])
def test_two_ranks_have_no_bubble(tf, tb, tw):
    step, busy = simulate_unit_times(pipeline_schedule("dualpipe", 2, 6), tf, tb, 0.0, tw, dualpipe=True)
    assert busy == pytest.approx([6 * (tf + tb + tw)] * 2)
    assert step == pytest.approx(6 * (tf + tb + tw))


def test_fewer_bubbles_than_1f1b_and_zb_h1_at_equal_passes():
    p, m = 8, 16
    one, _ = simulate_unit_times(pipeline_schedule("1f1b", p, m), 1.0, 2.0)
    zb, _ = simulate_unit_times(pipeline_schedule("zb-h1", p, m), 1.0, 1.0, 0.0, 1.0)
    dual, _ = simulate_unit_times(pipeline_schedule("dualpipe", p, m), 1.0, 1.0, 0.0, 1.0, t_pair=3.0,
                                  dualpipe=True)
    assert (one - 3 * m, zb - 3 * m, dual - 3 * m) == pytest.approx((7 * 3, 7 * 1, 3 * 2))


# --------------------------------------------------------- through the engine
def _run(p, m, model=None, seq=128, fidelity="full", **par):
    doc = {"cluster": free_cluster(p * par.get("dp", 1)), "model": model or uniform_model(2 * p),
           "parallel": {"pp": p, "dp": 1, "micro_batch": 1, "global_batch": m * par.get("dp", 1),
                        "schedule": "dualpipe", **par},
           "training": {"seq_len": seq}, "network": {"step_latency": 0},
           "options": {"embedding_and_loss": False}}
    return run_experiment(experiment_from_dict(doc), force=True, fidelity=fidelity)


def _pass_times(result):
    """F, B (input gradient) and W of one chunk, from the engine's op durations on rank 0."""
    ops = result.ops[result.ops["rank"] == 0].set_index("name")["duration_s"]
    split = [n for n in ops.index if n.startswith("W")][0].split(".")[0][1:]  # a micro-batch whose B is split
    layers = [n for n in ops.index if n.startswith(f"B{split}.")]
    tb = sum(ops[n] for n in layers)
    tw = sum(ops[n] for n in ops.index if n.startswith(f"W{split}."))
    tf = sum(ops[n] for n in ops.index if n.startswith(f"F{split}."))
    return tf, tb, tw


# (12, 24): a middle rank's two chunks send to opposite neighbours; sharing one stream per transfer kind, a
# send waiting for its peer held up the other direction's and closed a cycle (deadlock) from pp = 12
@pytest.mark.parametrize("p, m", [(2, 4), (4, 8), (4, 12), (12, 24)])
def test_engine_runs_the_list_schedulers_timeline(p, m):
    res = _run(p, m)
    tf, tb, tw = _pass_times(res)
    assert list(res.stages["busy_s"]) == pytest.approx([m * (tf + tb + tw)] * p, rel=1e-8)  # float sums over 3 m ops
    # dense layers with free communication: a pair is its forward then its whole backward
    step, busy = simulate_unit_times(pipeline_schedule("dualpipe", p, m), tf, tb, 0.0, tw, dualpipe=True)
    assert list(res.stages["bubble_s"]) == pytest.approx([step - b for b in busy], rel=1e-6, abs=1e-12)
    if p == 2:
        assert list(res.stages["bubble_s"]) == pytest.approx([0.0, 0.0], abs=1e-12)


def test_whole_and_split_backwards_run_the_same_kernels_as_1f1b():
    model = model_from_dict(uniform_model(8))
    par = dict(pp=4, dp=2, zero=1, global_batch=16)
    d = training_step(model, ParallelConfig(schedule="dualpipe", **par), TrainingSpec(seq_len=128))
    o = training_step(model, ParallelConfig(schedule="1f1b", **par), TrainingSpec(seq_len=128))
    # every rank computes two stages' passes for half the micro-batches each: 1F1B's passes in total
    passes = lambda step, what: sum(getattr(op, what) for op in step.graph.ops  # noqa: E731
                                    if op.kind == "compute" and op.name[0] in "FBW")
    assert passes(d, "flops") == pytest.approx(passes(o, "flops"))
    assert passes(d, "nbytes") == pytest.approx(passes(o, "nbytes"))


def test_gradients_are_reduced_with_the_mirror_stage_copy():
    model = model_from_dict(uniform_model(8))
    par = dict(pp=4, dp=2, zero=1, global_batch=16, overlap_grad_reduce=True)
    d = training_step(model, ParallelConfig(schedule="dualpipe", **par), TrainingSpec(seq_len=128))
    o = training_step(model, ParallelConfig(schedule="1f1b", **par), TrainingSpec(seq_len=128))
    lay = d.layout
    for op in (op for op in d.graph.ops if op.name == "grad_reduce_scatter"):
        stages = {lay.coords(r).pp for r in op.group}
        s = lay.coords(op.rank).pp
        assert stages == {s, 3 - s} and len(op.group) == 2 * 2   # dp ranks of the stage and of its mirror
    nbytes = lambda step: sum(op.nbytes * op.count for op in step.graph.ops  # noqa: E731
                              if op.kind == "collective" and op.name == "grad_reduce_scatter")
    assert nbytes(d) == pytest.approx(2 * nbytes(o))  # each rank reduces two stages' gradients


def test_memory_holds_two_stages_of_parameters():
    model = model_from_dict(uniform_model(8))
    train = TrainingSpec(seq_len=128)
    dual = ParallelConfig(pp=4, dp=2, zero=1, global_batch=16, schedule="dualpipe")
    one = ParallelConfig(pp=4, dp=2, zero=1, global_batch=16)
    assert stage_layers(8, dual, 1) == [2, 3, 4, 5]          # stages 1 and 2 of 4, two layers each
    assert chunk_layers(8, dual, 0, 1) == [6, 7] and chunk_layers(8, dual, 3, 1) == [0, 1]
    mid_d, mid_o = stage_params(model, dual, 1), stage_params(model, one, 1)
    assert mid_d == (2 * mid_o[0], 0)
    # the first rank holds stage 0 (embedding) and stage 3 (output layer, final norm): rank 0 + rank 3 of 1F1B
    assert stage_params(model, dual, 0)[0] == stage_params(model, one, 0)[0] + stage_params(model, one, 3)[0]
    md, mo = memory_per_gpu(model, dual, train, stage=1), memory_per_gpu(model, one, train, stage=1)
    assert md.parameters == pytest.approx(2 * mo.parameters)
    assert md.gradients == pytest.approx(2 * mo.gradients)
    assert md.optimizer == pytest.approx(mo.optimizer)       # sharded over both copies' DP ranks
    # PP + 1 = 5 micro-batches of a 2-layer chunk, against 1F1B's p - 1 = 3 of a 2-layer stage on rank 1
    assert md.activations == pytest.approx(5 / 3 * mo.activations)


def test_moe_pairs_hide_all_to_all_under_the_other_chunk():
    moe = {**MOE, "layers": 4}
    doc = {"cluster": {"preset": "dgx-h100", "nodes": 2}, "model": moe,
           "parallel": {"pp": 2, "dp": 8, "ep": 8, "micro_batch": 1, "global_batch": 32, "schedule": "dualpipe"},
           "training": {"seq_len": 2048}, "moe": {"routing": "balanced"}}
    exp = experiment_from_dict(doc)
    full = run_experiment(exp, force=True, fidelity="full")
    ops = full.ops[full.ops["rank"] == 0]
    a2a = ops[ops["stream"].isin(["ep_f", "ep_b"])]
    assert len(a2a) and set(a2a["traffic_class"]) == {"ep"}
    compute = ops[ops["stream"] == "compute"]
    hidden = 0.0
    for row in a2a.itertuples():
        mine = row.name.split(".")[0]
        other = compute[~compute["name"].str.startswith(mine + ".")]
        hidden += (other["end_s"].clip(upper=row.end_s) - other["start_s"].clip(lower=row.start_s)).clip(
            lower=0).sum()
    assert hidden > 0.3 * (a2a["end_s"] - a2a["start_s"]).sum()  # under the other chunk's computation
    # outside the pairs the all-to-alls block the compute stream, as in the other schedules
    assert (ops[(ops["stream"] == "compute")]["name"].str.contains("ep_dispatch")).any()
    for fidelity in ("fast", "lockstep"):
        rep = run_experiment(exp, force=True, fidelity=fidelity)
        assert rep.step_time == pytest.approx(full.step_time, rel=0.02)
        for cls, nbytes in full.bytes_by_class.items():
            assert rep.bytes_by_class[cls] == pytest.approx(nbytes, rel=1e-9)


# ----------------------------------------------------------------- errors
@pytest.mark.parametrize("par, match", [
    ({"pp": 3, "global_batch": 12}, "parallel.pp: the dualpipe schedule needs an even pp"),
    ({"pp": 4, "global_batch": 6}, "parallel.global_batch: the dualpipe schedule needs an even number"),
    ({"pp": 4, "global_batch": 9}, "parallel.global_batch: the dualpipe schedule needs an even number"),
    ({"pp": 2, "dp": 2, "global_batch": 8, "zero": 3}, "dualpipe is modelled with DDP"),
    ({"pp": 2, "global_batch": 4, "cp": 2}, "parallel.cp: context parallelism is not modelled with schedule: dual"),
    ({"pp": 2, "global_batch": 4, "virtual_stages": 2}, "parallel.virtual_stages: 2 needs"),
    ({"pp": 2, "global_batch": 4, "tp": 2, "sequence_parallel": True, "tp_comm_overlap": True},
     "parallel.tp_comm_overlap: not modelled with schedule: dualpipe"),
])
def test_bad_configs_are_one_line_errors(par, match):
    with pytest.raises(ConfigError, match=match):
        validate(model_from_dict(uniform_model(12)), ParallelConfig(schedule="dualpipe", **par),
                 TrainingSpec(seq_len=128))


def test_blocking_p2p_is_refused():
    with pytest.raises(ConfigError, match="options.p2p: blocking .* use p2p: async with dualpipe"):
        training_step(model_from_dict(uniform_model(4)), ParallelConfig(pp=2, global_batch=4, schedule="dualpipe"),
                      TrainingSpec(seq_len=128), StepOptions(p2p="blocking"))


def test_deepseek_v3_example_is_the_reports_layout():
    from simulator.experiment import load_experiment
    from topologies.gpus import get_gpu

    h800, h100 = get_gpu("h800"), get_gpu("h100")
    assert h800.nvlink_bandwidth == 400e9 / 2 and h800.peak_flops == h100.peak_flops  # NVLink 400 GB/s bidir.
    exp = load_experiment(Path(__file__).resolve().parents[1] / "examples" / "deepseek-v3-dualpipe-h800.yaml")
    par, model = exp.parallel, exp.model
    assert (exp.cluster.num_gpus, exp.cluster.gpu.name) == (2048, "H800-SXM")
    assert (par.pp, par.ep, par.tp, par.dp, par.schedule, exp.training.fp8) == (16, 64, 1, 128, "dualpipe", True)
    assert par.global_batch * exp.training.seq_len == 15360 * 4096
    # section 3.2.2's node-aggregated dispatch (DeepEP), the shared expert overlapped with the all-to-alls
    assert (exp.routing.dispatch, exp.routing.shared_expert_overlap) == ("deepep", True)
    # 61 layers: stage 0 has 1, the others 4; rank 0 holds stages 0 and 15 (embedding and output head)
    assert [len(stage_layers(model.layers, par, r)) for r in range(16)] == [5] + [8] * 14 + [5]
    assert chunk_layers(model.layers, par, 0, 1) == [57, 58, 59, 60]


@pytest.mark.parametrize("fidelity", ["fast", "lockstep"])
def test_representatives_agree_with_full_for_a_dense_fp8_model(fidelity):
    doc = {"cluster": {"preset": "dgx-h100", "nodes": 2}, "model": {"preset": "gpt2-small", "heads": 16,
                                                                    "kv_heads": 16},
           "parallel": {"tp": 2, "pp": 2, "dp": 4, "zero": 1, "global_batch": 16, "schedule": "dualpipe",
                        "sequence_parallel": True},
           "training": {"seq_len": 1024, "dtype": "fp8"}}
    exp = experiment_from_dict(doc)
    full = run_experiment(exp, force=True, fidelity="full")
    rep = run_experiment(exp, force=True, fidelity=fidelity)
    assert rep.step_time == pytest.approx(full.step_time, rel=0.02)
    for cls, nbytes in full.bytes_by_class.items():
        assert rep.bytes_by_class[cls] == pytest.approx(nbytes, rel=1e-9)
