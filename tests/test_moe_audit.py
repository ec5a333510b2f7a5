"""MoE defects a QA hunt found (seventeenth session), each against a count worked here by hand.

The routing is ``custom`` (a fixed expert load) or ``balanced`` with a capacity, so every rank's token slots
are known without the simulator: ``T·k`` choices per EP rank per micro-batch, ``capacity = ceil(T·k/E·cf)``
slots per (source rank, expert).
"""

import math

import pytest

from simulator.experiment import experiment_from_dict, run_experiment
from workloads.errors import ConfigError
from workloads.training import training_step

T, K, E, EP = 512, 2, 8, 4  # tokens per rank (b·s), top-k, experts, EP degree


def doc(moe: dict, *, hidden: int = 512, recompute: str = "none", micro_batches: int = 1, **par) -> dict:
    return {"cluster": {"preset": "dgx-h100", "nodes": 1, "gpus_per_node": EP},
            "model": {"name": "m", "layers": 1, "hidden": hidden, "heads": 8, "kv_heads": 8, "ffn_hidden": 1024,
                      "vocab": 32000, "gated_mlp": True, "tied_embeddings": False, "experts": E, "top_k": K,
                      "moe_ffn_hidden": 1024, "max_seq_len": 4096},
            "parallel": {"tp": 1, "pp": 1, "dp": EP, "ep": EP, "micro_batch": 1, "global_batch": EP * micro_batches,
                         "recompute": recompute, **par},
            "training": {"seq_len": T}, "moe": moe, "options": {"embedding_and_loss": False}}


SKEWED = {"routing": "custom", "expert_load": [8, 1, 1, 1, 1, 1, 1, 1], "seed": 1}


def test_expert_gemms_scale_their_token_rows_only():
    # hidden = b·s·k = 1024: the forward's expert GEMMs have two dimensions of that size (the up-projection's
    # input, the down-projection's output), and only the token rows grow with the rank's load. They were found
    # by value, so the hidden dimension was scaled too and the GEMM's shape (which picks its efficiency) no
    # longer matched its FLOPs.
    h, f = 1024, 768
    d = doc(SKEWED, hidden=h)
    d["model"]["moe_ffn_hidden"] = f
    exp = experiment_from_dict(d)
    step = training_step(exp.model, exp.parallel, exp.training, exp.options, exp.routing)
    loads = []
    for op in step.graph.ops:
        if op.kind == "compute" and op.name == "F0.c0.L0.experts":
            up, down = [k for k in op.parts if k.shape is not None]
            rows = round(up.flops / (2.0 * 2 * f * h))
            assert (up.shape, down.shape) == ((rows, 2 * f, h), (rows, h, f)), op.rank
            loads.append(rows)
    assert len(loads) == EP and sum(loads) == EP * T * K and max(loads) > 3 * min(loads)


@pytest.mark.parametrize("moe, label", [(SKEWED, "skewed"),
                                        ({"routing": "balanced", "capacity_factor": 0.5}, "drops half")])
def test_full_recompute_reruns_each_ranks_experts_at_its_own_load(moe, label):
    # recompute: full re-runs the forward first in the backward (its routed experts between its own dispatch and
    # combine): the recomputed expert FLOPs of every rank equal its forward's, skew and dropped choices included;
    # they ran at the balanced load on every rank
    runs = {rec: run_experiment(experiment_from_dict(doc(moe, recompute=rec)), fidelity="full", force=True)
            for rec in ("none", "full")}
    flops = {rec: r.ops.groupby(["rank", "name"])["flops"].sum() for rec, r in runs.items()}
    forward_experts = []
    for rank in range(EP):
        experts = flops["full"][rank, "F0.c0.L0.experts"]
        forward_rest = flops["none"][rank, "F0.c0.L0.pre"] + flops["none"][rank, "F0.c0.L0.post"]
        # the recomputed forward is ops of its own (``R…``, as a dense layer's) before the backward's own
        recomputed_rest = flops["full"][rank, "R0.c0.L0"] + flops["full"][rank, "R0.c0.L0.post"]
        assert flops["full"][rank, "B0.c0.L0.pre"] == flops["none"][rank, "B0.c0.L0.pre"], (label, rank)
        assert recomputed_rest == pytest.approx(forward_rest, rel=1e-9), (label, rank)
        assert flops["full"][rank, "R0.c0.L0.experts"] == pytest.approx(experts, rel=1e-9), (label, rank)
        forward_experts.append(experts)
    if label == "drops half":  # capacity 0.5: every rank computes half the balanced slots
        per_rank = 2 * 3 * 512 * 1024 * T * K / 2  # 2·(3 GEMMs)·h·f per slot
        assert forward_experts == pytest.approx([per_rank] * EP, rel=1e-9)
    else:
        assert max(forward_experts) > 3 * min(forward_experts)


@pytest.mark.parametrize("micro_batches", [1, 2, 4])
def test_padded_rank_load_counts_every_micro_batchs_slots(micro_batches):
    # pad_to_capacity: every (source, expert) pair carries `capacity` slots in each micro-batch, so each EP rank
    # computes EP·capacity·E/EP slots per micro-batch; the summary summed the draws without their padding
    moe = dict(SKEWED, capacity_factor=1.0, pad_to_capacity=True)
    r = run_experiment(experiment_from_dict(doc(moe, micro_batches=micro_batches)), fidelity="full", force=True)
    capacity = math.ceil(T * K / E * 1.0)
    assert r.summary["moe"]["rank_load_tokens"] == [EP * capacity * (E // EP) * micro_batches] * EP


@pytest.mark.parametrize("ep", [1, 2])
def test_moe_with_tensor_parallelism_needs_sequence_parallelism(ep):
    # Megatron-Core's MoELayer.forward raises in training whenever tp > 1 without sequence parallelism ("performance
    # may degrade if MoE and tensor parallelism are enabled without also enabling sequence parallelism"), with or
    # without expert parallelism; ep 1 was accepted
    with pytest.raises(ConfigError, match=r"parallel\.sequence_parallel: .*needs sequence_parallel: true"):
        experiment_from_dict(doc({"routing": "balanced"}, tp=2, dp=2, ep=ep, sequence_parallel=False))


@pytest.mark.parametrize("fidelity", ["full", "fast", "lockstep"])
def test_full_recompute_replays_the_exchanges(fidelity):
    # Megatron-Core's full recomputation re-runs a MoE layer's forward whole, its token dispatcher's all-to-alls
    # included (NVIDIA/Megatron-LM PR 7425 adds a flag to reuse DeepEP's dispatch layout in exactly that replay).
    # Balanced routing, by hand: each rank sends (EP - 1)/EP of its T·k token slots of h bf16 elements per
    # exchange; a layer's forward and backward hold two exchanges each, and full recomputation two more.
    h = 512
    per_exchange = EP * T * K * h * 2 * (EP - 1) / EP  # bytes over every rank of the group
    for recompute, exchanges in (("none", 4), ("full", 6)):
        r = run_experiment(experiment_from_dict(doc({"routing": "balanced"}, recompute=recompute)),
                           fidelity=fidelity, force=True)
        assert r.bytes_by_class["ep"] == pytest.approx(exchanges * per_exchange, rel=1e-12), recompute
        names = set(r.ops["name"])
        assert ({"R0.c0.L0.ep_dispatch", "R0.c0.L0.ep_combine"} <= names) == (recompute == "full")


def _full_recompute_run(fidelity="full", tp=1, moe=None, **par):
    """The module's one-layer model, fully recomputed, on EP ranks (TP 2: expert TP over the TP pair)."""
    d = doc(dict({"routing": "balanced"}, **(moe or {})), recompute="full", tp=tp, dp=EP // tp if tp > 1 else EP,
            ep=EP // tp if tp > 1 else EP, **par)
    if tp > 1:
        d["parallel"]["sequence_parallel"] = True
    return run_experiment(experiment_from_dict(d), fidelity=fidelity, force=True)


def test_the_rerun_forward_runs_in_order_around_its_exchanges():
    # Rank 0's re-run forward, op by op: each piece starts once the one before it has ended (the dispatch waits
    # for the kernels before the experts, the experts for the dispatch, the combine for the experts, the kernels
    # after for the combine), and the backward's own first piece after all of them.
    ops = _full_recompute_run().ops
    rank0 = ops[ops["rank"] == 0].set_index("name")
    chain = ["R0.c0.L0", "R0.c0.L0.ep_dispatch", "R0.c0.L0.experts", "R0.c0.L0.ep_combine", "R0.c0.L0.post",
             "B0.c0.L0.pre"]
    for before, after in zip(chain, chain[1:]):
        assert rank0.loc[after, "start_s"] >= rank0.loc[before, "end_s"] - 1e-15, (before, after)
        assert rank0.loc[after, "end_s"] > rank0.loc[before, "end_s"], (before, after)


def test_the_rerun_forward_gathers_over_expert_tp_as_the_forward_does():
    # TP 2 (expert TP = TP): the re-run forward all-gathers the dispatched tokens over the TP pair and
    # reduce-scatters them back, as the forward does: the same two collectives at the same sizes.
    ops = _full_recompute_run(tp=2).ops
    rank0 = ops[ops["rank"] == 0].set_index("name")
    for piece in ("etp_gather", "etp_scatter"):
        forward, rerun = rank0.loc[f"F0.c0.L0.{piece}"], rank0.loc[f"R0.c0.L0.{piece}"]
        assert rerun["nbytes"] == forward["nbytes"] > 0, piece
    assert rank0.loc["R0.c0.L0.etp_gather", "start_s"] >= rank0.loc["R0.c0.L0.ep_dispatch", "end_s"] - 1e-15
    assert rank0.loc["R0.c0.L0.experts", "start_s"] >= rank0.loc["R0.c0.L0.etp_gather", "end_s"] - 1e-15


def test_the_rerun_shared_expert_runs_beside_the_rerun_exchanges():
    # moe.shared_expert_overlap: the forward runs the shared expert's halves beside its dispatch and combine;
    # the re-run forward does the same (Megatron-Core replays MoELayer.forward, overlap included), where it ran
    # them after its combine, on an idle compute stream.
    d = doc({"routing": "balanced", "shared_expert_overlap": True}, recompute="full")
    d["model"]["shared_experts"] = 1
    ops = run_experiment(experiment_from_dict(d), fidelity="full", force=True).ops
    rank0 = ops[ops["rank"] == 0].set_index("name")
    for half, exchange in (("shared_1", "ep_dispatch"), ("shared_2", "ep_combine")):
        for phase in ("F", "R"):
            a, b = rank0.loc[f"{phase}0.c0.L0.{half}"], rank0.loc[f"{phase}0.c0.L0.{exchange}"]
            assert a["start_s"] < b["end_s"] and b["start_s"] < a["end_s"], (phase, half)  # they overlap in time


@pytest.mark.parametrize("moe", [{"routing": "zipf", "zipf_s": 1.0, "seed": 3}, SKEWED])
def test_lockstep_equals_full_with_full_recompute_under_skew(moe):
    # Skewed routing and full recomputation: lockstep's one representative per stage (its re-run experts at the
    # slowest member's load, every member's kernels kept) gives full's step, bytes and FLOPs.
    runs = {f: _full_recompute_run(fidelity=f, moe=moe) for f in ("full", "lockstep")}
    assert runs["lockstep"].step_time == pytest.approx(runs["full"].step_time, rel=1e-9)
    assert runs["lockstep"].bytes_by_class["ep"] == pytest.approx(runs["full"].bytes_by_class["ep"], rel=1e-12)
