"""MoE layers in DualPipe's overlapped pairs with DeepEP dispatch, shared-expert overlap and ``etp != tp``
(issue 14; DeepSeek-V3 technical report section 3.2.1, Figure 4: DualPipe with node-aggregated dispatch).

Truths used (never numbers computed by the code under test):

* causality: a chunk's experts start after its dispatch (both of DeepEP's hops, the expert-TP all-gather) has
  ended, its after-combine kernels after its combine;
* the same exchanges happen whatever the schedule: every micro-batch passes every MoE layer once forward and
  once backward, on the same EP groups, so the EP and TP bytes per tier equal 1F1B's; with balanced routing
  the all-to-all bytes are the hand count ``L B s 4 k h d (ep - 1) / ep``;
* shared-expert overlap only moves the shared expert's kernels: the compute time and FLOPs are conserved,
  and all of them run on the one compute stream (the GPU's compute is not shared);
* the representatives of ``fast`` and ``lockstep`` run the programs their ranks run.
"""

import math

import pytest

from simulator.experiment import experiment_from_dict, run_experiment
from workloads.training import training_step

# A small MoE (4 layers, 16 experts top-2, one shared expert), 4 GPUs per node so that an EP group of 8
# spans two nodes and DeepEP forwards over NVLink.
MOE = {"name": "moe-small", "layers": 4, "hidden": 1024, "heads": 8, "kv_heads": 8, "ffn_hidden": 4096,
       "vocab": 32000, "gated_mlp": True, "tied_embeddings": False, "experts": 16, "top_k": 2,
       "moe_ffn_hidden": 1024, "max_seq_len": 4096, "shared_experts": 1}
S, H, K, D = 1024, 1024, 2, 2

OPTIONS = {  # name -> (moe section, parallel overrides)
    "deepep": ({"dispatch": "deepep"}, {}),
    "shared": ({"shared_expert_overlap": True}, {}),
    "etp1-tp2": ({}, {"tp": 2, "etp": 1}),
    "etp2-tp1": ({}, {"etp": 2, "ep": 4}),
    "all": ({"dispatch": "deepep", "shared_expert_overlap": True}, {"tp": 2, "etp": 1}),
}


def doc(schedule="dualpipe", moe=None, parallel=None, routing="balanced", gb=64, shared=1):
    par = {"tp": 1, "pp": 2, "dp": 8, "ep": 8, "micro_batch": 1, "global_batch": gb, "schedule": schedule,
           "placement": ["tp", "dp", "pp"]}
    par.update(parallel or {})
    par["sequence_parallel"] = par["tp"] > 1
    gpus = par["tp"] * par["pp"] * par["dp"]
    return {"cluster": {"preset": "dgx-h100", "nodes": gpus // 4, "gpus_per_node": 4},
            "model": dict(MOE, shared_experts=shared), "parallel": par, "training": {"seq_len": S},
            "moe": dict({"routing": routing}, **(moe or {}))}


def option_doc(name, **kw):
    moe, par = OPTIONS[name]
    return doc(moe=moe, parallel=par, **kw)


def _in_pairs(ops):
    """The rows of ``ops`` that belong to passes run inside an overlapped pair on their rank (the passes
    with exchanges on ``ep_f`` / ``ep_b``), as a boolean mask."""
    pass_ = ops["rank"].astype(str) + ":" + ops["name"].str.split(".").str[:2].str.join(".")
    return pass_.isin(set(pass_[ops["stream"].isin(["ep_f", "ep_b"])]))


# ------------------------------------------------------------------ (1) the options run, in their pieces
@pytest.mark.parametrize("name", list(OPTIONS))
def test_each_option_runs_in_the_pairs_in_causal_order(name):
    r = run_experiment(experiment_from_dict(option_doc(name)), force=True)
    assert 0 < r.step_time < math.inf
    ops = r.ops
    ops = ops.assign(pass_=ops["name"].str.split(".").str[:3].str.join("."), piece=ops["name"].str.split(".").str[3])
    in_pair = ops[_in_pairs(ops)]
    assert len(in_pair), "the schedule has overlapped pairs"
    moe, par = OPTIONS[name]
    streams = set(in_pair["stream"])
    if moe.get("dispatch") == "deepep":   # the NVLink forwarding of each chunk on a stream of its own
        assert {"ep_f_forward", "ep_b_forward"} <= streams
        assert set(in_pair[in_pair["piece"] == "ep_forward"]["stream"]) == {"ep_f_forward", "ep_b_forward"}
    if par.get("etp", 1) > 1:  # expert TP's all-gather / reduce-scatter beside, with the chunk's exchanges
        assert set(in_pair[in_pair["piece"].isin(["etp_gather", "etp_scatter"])]["stream"]) == {"ep_f", "ep_b"}
    if moe.get("shared_expert_overlap"):  # the shared expert's halves are compute pieces of their own
        assert set(in_pair[in_pair["piece"].isin(["shared_1", "shared_2"])]["stream"]) == {"compute"}
    # every compute op, shared halves included, runs on the one compute stream
    assert set(ops[ops["kind"] == "compute"]["stream"]) == {"compute"}
    # causality inside every MoE layer pass of a pair, on every rank
    for (_rank, _p), g in in_pair[in_pair["piece"].notna()].groupby(["rank", "pass_"]):
        at = {row.piece: row for row in g.itertuples()}
        if "experts" not in at:
            continue
        for before in ("ep_dispatch", "ep_combine_grad", "ep_forward", "etp_gather"):
            if before in at:
                assert at["experts"].start_s >= at[before].end_s - 1e-15
        for before in ("ep_combine", "ep_dispatch_grad", "ep_forward_back"):
            if before in at:
                assert at["post"].start_s >= at[before].end_s - 1e-15
        if "etp_scatter" in at:
            assert at["etp_scatter"].start_s >= at["experts"].end_s - 1e-15


# ------------------------------------------------------------------ (2) the same exchanges as 1F1B
@pytest.mark.parametrize("name", ["deepep", "etp1-tp2", "etp2-tp1", "all"])
def test_exchange_bytes_per_tier_equal_1f1b(name):
    # uniform routing: every (layer, micro-batch) draws its own rows; both schedules draw the same ones
    # (TP: the per-micro-batch collectives compared op by op; the step's all-reduce of the norms' gradients under
    # sequence parallelism differs by design: DualPipe holds every stage twice, so each rank syncs twice the norms)
    runs = {s: run_experiment(experiment_from_dict(option_doc(name, schedule=s, routing="uniform")), force=True)
            for s in ("dualpipe", "1f1b")}
    dual, one = (runs[s].bytes_by_class_and_tier() for s in ("dualpipe", "1f1b"))
    for tier in one.columns:
        assert dual.loc["ep", tier] == pytest.approx(one.loc["ep", tier], rel=1e-9, abs=1e-6), tier
    if OPTIONS[name][1]:
        def tp_payload(result, sync: bool) -> float:
            ops = result.ops
            tp = ops[(ops["traffic_class"] == "tp") & ((ops["name"] == "sequence_parallel_grad_sync") == sync)]
            return float((tp["nbytes"] * tp["count"]).sum())
        assert tp_payload(runs["dualpipe"], False) == pytest.approx(tp_payload(runs["1f1b"], False), rel=1e-12)
        assert tp_payload(runs["dualpipe"], True) == pytest.approx(2 * tp_payload(runs["1f1b"], True), rel=1e-12)


def test_all_to_all_bytes_are_the_hand_count():
    # balanced routing, all-to-all dispatch: per MoE layer each of the B s tokens' k choices crosses to another
    # EP rank with probability (ep - 1) / ep, in 4 all-to-alls (dispatch, combine and their gradients)
    ep, gb = 8, 64
    r = run_experiment(experiment_from_dict(doc(moe={"shared_expert_overlap": True}, gb=gb)), force=True)
    assert r.bytes_by_class["ep"] == pytest.approx(MOE["layers"] * gb * S * 4 * K * H * D * (ep - 1) / ep,
                                                   rel=1e-12)


# ------------------------------------------------------------------ (3) shared-expert overlap
@pytest.mark.parametrize("moe", [{}, {"dispatch": "deepep"}])
def test_shared_expert_overlap_conserves_compute_and_does_not_lengthen_the_step(moe):
    runs, steps = {}, {}
    for overlap in (False, True):
        d = doc(moe=dict(moe, shared_expert_overlap=overlap), routing="uniform", shared=4)
        d["compute"] = {"comm_sms": 0, "p2p_sms": 0}  # (the kernels' own times: busy time compares the work)
        exp = experiment_from_dict(d)
        steps[overlap] = training_step(exp.model, exp.parallel, exp.training, exp.options, exp.routing)
        runs[overlap] = run_experiment(exp, force=True)
    off, on = runs[False], runs[True]
    # the same kernels, cut differently: per rank the same compute time and FLOPs
    busy = {k: r.ops[r.ops["kind"] == "compute"].groupby("rank")["duration_s"].sum() for k, r in runs.items()}
    assert busy[True].to_numpy() == pytest.approx(busy[False].to_numpy(), rel=1e-12)
    assert steps[True].executed_flops == pytest.approx(steps[False].executed_flops, rel=1e-12)
    # premise: the shared expert's compute fits under the all-to-alls it hides under (it was under half of them
    # until the all-to-all latency model became NCCL's rounds, which shortened the exchanges: 0.63 of them now)
    ops = on.ops[on.ops["rank"] == 0]
    shared = ops[ops["name"].str.endswith((".shared_1", ".shared_2"))]["duration_s"].sum()
    a2a = ops[(ops["traffic_class"] == "ep")]["duration_s"].sum()
    assert 0 < shared < a2a
    assert on.step_time <= off.step_time
    # and the pairs carry the shared halves as pieces of their own
    assert ops[_in_pairs(ops)]["name"].str.endswith(".shared_1").any()


# ------------------------------------------------------------------ (4) representatives agree with full
@pytest.mark.parametrize("fidelity", ["fast", "lockstep"])
@pytest.mark.parametrize("name", ["all", "etp2-tp1", "deepep"])
def test_representatives_agree_with_full(name, fidelity):
    exp = experiment_from_dict(option_doc(name))
    full = run_experiment(exp, force=True, fidelity="full")
    assert _in_pairs(full.ops).any()
    rep = run_experiment(exp, force=True, fidelity=fidelity)
    if name == "deepep" and fidelity == "lockstep":  # balanced routing, TP 1: one rank stands for each stage
        assert len(rep.record.graph.replicas) == 2
    assert rep.step_time == pytest.approx(full.step_time, rel=0.02)
    for cls, nbytes in full.bytes_by_class.items():
        assert rep.bytes_by_class[cls] == pytest.approx(nbytes, rel=1e-9)


# ------------------------------------------------ (n) the SMs the pair's exchanges hold (dualpipe_comm_sms)
def _step(d):
    exp = experiment_from_dict(d)
    return training_step(exp.model, exp.parallel, exp.training, exp.options, exp.routing)


def _reserved(step):
    """Per compute op of ``step``: (op, the SMs each of its GEMM kernels leaves to communication, and those
    of its other kernels)."""
    out = []
    for op in step.graph.ops:
        if op.kind != "compute":
            continue
        kernels = op.parts or ()
        out.append((op, {k.sm_reserved for k in kernels if k.category in ("gemm", "gemm_fp8")},
                    {k.sm_reserved for k in kernels if k.category not in ("gemm", "gemm_fp8")}))
    return out


def test_the_gemms_of_overlapped_moe_pairs_leave_the_exchanges_their_sms():
    # DeepSeek-V3 section 3.2.2: the dispatch and combine kernels hold 20 SMs while the other chunk computes.
    step = _step(option_doc("deepep"))
    paired = {(op.rank, ".".join(op.name.split(".")[:2])) for op in step.graph.ops if op.stream in ("ep_f", "ep_b")}
    assert paired, "the schedule has overlapped pairs"
    seen_in, seen_out = set(), set()
    for op, gemm, other in _reserved(step):
        in_pair = (op.rank, ".".join(op.name.split(".")[:2])) in paired
        (seen_in if in_pair else seen_out).update(gemm)
        assert other <= {0}  # attention and memory-bound kernels keep every SM
        if in_pair:  # a bare GEMM op became a kernel
            assert op.parts is not None or op.category not in ("gemm", "gemm_fp8") or op.duration_s is not None
    assert seen_in == {20}
    assert seen_out <= {0}


def test_no_sms_for_the_exchanges_leaves_every_kernel_on_every_sm_and_more_sms_never_speed_the_step():
    steps, times = {}, {}
    for sms in (0, 20, 60):
        d = dict(option_doc("deepep"), options={"dualpipe_comm_sms": sms})
        steps[sms] = _step(d)
        times[sms] = run_experiment(experiment_from_dict(d), force=True).step_time
    assert all(not gemm - {0} for _op, gemm, _other in _reserved(steps[0]))
    assert times[0] < times[20] < times[60]
    # the same kernels, FLOPs and graph either way
    assert steps[20].executed_flops == pytest.approx(steps[0].executed_flops, rel=1e-12)
    assert len(steps[20].graph.ops) == len(steps[0].graph.ops)


def test_dense_dualpipe_pairs_keep_every_sm():
    d = option_doc("deepep")
    d["model"] = dict(d["model"], experts=0, top_k=0, shared_experts=0, moe_ffn_hidden=0)
    d["parallel"] = dict(d["parallel"], ep=1)
    d.pop("moe")
    assert all(not gemm - {0} for _op, gemm, _other in _reserved(_step(d)))


@pytest.mark.parametrize("value, expected", [(-1, "0..1024"), (True, "0..1024"), (2.5, "0..1024"),
                                             (132, "leave none of the 132 SMs")])
def test_a_bad_dualpipe_comm_sms_is_refused_naming_the_field(value, expected):
    from workloads.errors import ConfigError

    with pytest.raises(ConfigError, match=r"options\.dualpipe_comm_sms: .*" + expected.replace(".", r"\.")):
        experiment_from_dict(dict(option_doc("deepep"), options={"dualpipe_comm_sms": value}))


# ------------------------------------------------------------------ weight gradients at the drawn load
def _gemm_flops(op) -> float:
    return sum(k.flops for k in op.parts if k.category in ("gemm", "gemm_fp8"))


@pytest.mark.parametrize("name", list(OPTIONS))
def test_split_weight_gradients_of_routed_experts_follow_each_ranks_drawn_load(name):
    # An expert's weight-gradient GEMMs do what its forward GEMMs do (2 x tokens x the same two dimensions per
    # matrix), so under skewed routing the W pass of a MoE layer differs from rank to rank exactly as the
    # forward's routed-expert piece does; the rest of the W pass (attention, router, shared expert) does not
    # depend on routing. (Until 2026-12-02 the W pass ran every rank's experts at the balanced load.)
    step = training_step(*_step_args(option_doc(name, routing="zipf")))
    forward = {(op.rank, op.layer, op.micro_batch): _gemm_flops(op) for op in step.graph.ops
               if op.kind == "compute" and op.name.startswith("F") and op.name.endswith(".experts")}
    weight: dict[tuple, float] = {}  # W pass GEMM FLOPs per (rank, layer, micro-batch), over its ops
    for op in step.graph.ops:
        key = (op.rank, op.layer, op.micro_batch)
        if op.kind == "compute" and op.name.startswith("W") and key in forward and op.parts:
            weight[key] = weight.get(key, 0.0) + _gemm_flops(op)
    rest: dict[int, set] = {}
    loads: dict[int, set] = {}
    for (rank, layer, mb), flops in weight.items():
        rest.setdefault(layer, set()).add(round(flops - forward[rank, layer, mb]))
        loads.setdefault(layer, set()).add(forward[rank, layer, mb])
    assert rest, "the schedule splits some MoE backward passes"
    for layer, values in rest.items():
        assert len(values) == 1, (layer, sorted(values))  # the routing-independent part, the same everywhere
        assert len(loads[layer]) > 1  # ... while the experts' work differs between ranks


def _step_args(d):
    exp = experiment_from_dict(d)
    return exp.model, exp.parallel, exp.training, exp.options, exp.routing
