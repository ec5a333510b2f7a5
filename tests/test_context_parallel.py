"""Context parallelism (``parallel.cp``): ring attention (``p2p``) and all-to-all (``a2a``, Ulysses).

Truths used (hand counts and closed forms, never the code's own numbers):

* ring attention: every rank sends ``(cp - 1)`` blocks of K and V, i.e. ``2 (cp - 1) / cp`` of one
  K-or-V tensor of the whole sequence (``b s kv / t`` elements), per layer per forward; the backward
  passes K, V and dK, dV: twice that; a recomputed attention core passes K, V once more;
* ring overlap: the last of the ``cp`` steps starts once the ring has delivered every block and the
  steps before it are done: ``(cp - 1) max(a, c)`` after the attention starts, for steps of ``a`` seconds
  on average and a block transfer of ``c`` (on the rank the ring, one collective, waited for);
* all-gather CP: the same bytes as the ring (K, V gathered; backward: gathered again and dK, dV
  reduce-scattered), but the attention waits for them;
* Ulysses: all-to-alls of Q, K, V before and of the output after attention: ``(cp - 1) / cp`` of a
  rank's ``b s / cp (2 h + 2 kv) / t`` elements per layer per pass;
* work and memory per rank: ``1 / cp`` of the tokens and of the attention, the same total;
* Megatron's rank order tp-cp-ep-dp-pp and its DP x CP gradient group.
"""

import pytest

from simulator.experiment import experiment_from_dict, run_experiment
from workloads.errors import ConfigError
from workloads.flops import layer_ops
from workloads.memory import memory_per_gpu
from workloads.models import model_from_dict
from workloads.parallel import ParallelConfig, RankLayout, TrainingSpec, validate
from workloads.training import StepOptions, training_step

H, KV, F, L = 1024, 256, 4096, 2   # GQA: 8 query heads, 2 KV heads of 128
MODEL = {"name": "cpm", "layers": L, "hidden": H, "heads": 8, "kv_heads": 2, "ffn_hidden": F, "vocab": 1024,
         "gated_mlp": False, "tied_embeddings": False}
MHA = {**MODEL, "kv_heads": 8}  # Ulysses splits K and V heads over CP too
BF16 = 2


def _run(cp, kind="p2p", *, tp=1, dp=1, m=1, seq=8192, recompute="none", fidelity="full", cluster=None,
         compute=None, **par):
    gpus = tp * cp * dp * par.get("pp", 1)
    doc = {"cluster": cluster or {"preset": "dgx-h100", "nodes": 1, "gpus_per_node": gpus},
           "model": MHA if kind == "a2a" else MODEL,
           "parallel": {"tp": tp, "cp": cp, "cp_comm_type": kind, "dp": dp, "global_batch": m * dp,
                        "recompute": recompute, "sequence_parallel": tp > 1, **par},
           "training": {"seq_len": seq}, "compute": compute or {}}
    return run_experiment(experiment_from_dict(doc), fidelity=fidelity, force=True)


# ------------------------------------------------------------------ placement
def test_megatron_rank_order_puts_cp_between_tp_and_dp():
    lay = RankLayout(ParallelConfig(tp=2, cp=2, dp=2, pp=2))
    assert lay.coords(2) == (0, 0, 0, 1) and lay.coords(2).cp == 1       # tp, dp, pp, cp
    assert lay.tp_group(0) == (0, 1) and lay.cp_group(0) == (0, 2) and lay.dp_group(0) == (0, 4)
    assert lay.pp_group(0) == (0, 8)
    assert lay.grad_group(1) == (1, 3, 5, 7)  # DP x CP hold the same weights
    assert sorted(x for g in lay.all_groups("cp") for x in g) == list(range(16))
    outer = RankLayout(ParallelConfig(tp=2, cp=2, dp=2, placement=["tp", "dp", "cp"] + ["pp"]))
    assert outer.cp_group(0) == (0, 4) and outer.dp_group(0) == (0, 2)


# ----------------------------------------------------------- work and memory
@pytest.mark.parametrize("kind", ["p2p", "a2a"])
def test_each_rank_does_one_cpth_of_the_tokens_and_of_the_attention(kind):
    model = model_from_dict(MODEL)
    s, cp = 8192, 2
    one, split = layer_ops(model, 1, s), layer_ops(model, 1, s, cp=cp, cp_comm_type=kind)
    assert split.flops == pytest.approx(one.flops / cp)
    att1 = next(o for o in one.forward if o.name == "attention")
    att = next(o for o in split.forward if o.name == "attention")
    assert att.flops == pytest.approx(att1.flops / cp)
    qkv = next(o for o in split.forward if o.name == "qkv")
    assert qkv.shape[0] == s // cp  # GEMM rows: this rank's tokens
    # the rate is looked up at the length of one ring block (p2p) or the whole sequence for 1/cp of the heads
    assert att.shape[:2] == ((s // cp, s // cp) if kind == "p2p" else (s, s))
    assert att.batch == (8 if kind == "p2p" else 8 // cp)


def test_executed_flops_of_the_step_do_not_change_with_cp():
    model = model_from_dict(MODEL)
    a = training_step(model, ParallelConfig(dp=4, global_batch=4), TrainingSpec(seq_len=4096))
    b = training_step(model, ParallelConfig(cp=4, global_batch=4), TrainingSpec(seq_len=4096))
    assert b.executed_flops == pytest.approx(a.executed_flops)
    assert b.model_flops == pytest.approx(a.model_flops)


def test_activations_shrink_by_cp_and_the_optimizer_shards_over_dp_times_cp():
    model = model_from_dict(MODEL)
    tr = TrainingSpec(seq_len=8192)
    one = memory_per_gpu(model, ParallelConfig(dp=2, zero=1, global_batch=2), tr, flash_attention=True)
    four = memory_per_gpu(model, ParallelConfig(cp=4, dp=2, zero=1, global_batch=2), tr, flash_attention=True)
    assert four.activations == pytest.approx(one.activations / 4)
    assert four.optimizer == pytest.approx(one.optimizer / 4)   # 12 bytes / (dp * cp) instead of / dp
    assert four.parameters == one.parameters and four.gradients == one.gradients


# ----------------------------------------------------------------- bytes
def _cp_bytes(result) -> float:
    return result.bytes_by_class.get("cp", 0.0)


@pytest.mark.parametrize("kind", ["p2p", "all_gather"])
@pytest.mark.parametrize("cp", [2, 4])
@pytest.mark.parametrize("recompute, passes", [("none", 1 + 2), ("selective", 1 + 1 + 2)])
def test_ring_attention_bytes_per_rank_are_2_cp_minus_1_over_cp_of_kv(kind, cp, recompute, passes):
    b, s = 1, 8192
    kv_one = b * s * KV * BF16                      # one of K or V for the whole sequence, bytes
    per_layer_fwd = 2 * (cp - 1) / cp * kv_one      # K and V
    r = _run(cp, kind, recompute=recompute, seq=s)
    assert _cp_bytes(r) == pytest.approx(cp * L * passes * per_layer_fwd)


def test_ring_attention_bytes_with_tensor_parallelism_are_per_tp_rank():
    cp, tp, s = 2, 2, 8192
    r = _run(cp, tp=tp, seq=s)
    per_rank = 3 * 2 * (cp - 1) / cp * s * KV / tp * BF16 * L  # forward + twice in backward
    assert _cp_bytes(r) == pytest.approx(per_rank * cp * tp)


@pytest.mark.parametrize("cp", [2, 4])
def test_ulysses_all_to_all_bytes(cp):
    s = 8192
    per_pass = (cp - 1) / cp * s / cp * (2 * H + 2 * H) * BF16  # Q, K, V in and O out (dO in, dQKV out); MHA
    r = _run(cp, "a2a", seq=s)
    assert _cp_bytes(r) == pytest.approx(cp * L * 2 * per_pass)


def test_gradients_are_reduced_over_dp_times_cp():
    step = training_step(model_from_dict(MODEL), ParallelConfig(cp=2, dp=2, zero=1, global_batch=2),
                         TrainingSpec(seq_len=4096))
    groups = {len(op.group) for op in step.graph.ops if op.kind == "collective" and op.name.startswith("grad_")}
    assert groups == {4}


# --------------------------------------------------------------- overlap
@pytest.mark.parametrize("comm_bound", [False, True])
def test_ring_steps_overlap_the_kv_transfer(comm_bound):
    # The CP ring on NVLink (compute-bound) or across four servers at 1 Gb/s (comm-bound).
    cluster = ({"preset": "dgx-h100", "nodes": 4, "gpus_per_node": 1, "nic_bandwidth": "1Gb/s"} if comm_bound
               else None)
    cp = 4
    # (the attention steps' own speed: the SMs the KV transfers hold beside them are another test's subject)
    all_ops = _run(cp, cluster=cluster, seq=32768, compute={"comm_sms": 0, "p2p_sms": 0}).ops
    layer = all_ops[all_ops["name"].str.startswith("F0.c0.L1.cp")]
    # The CP ranks' steps differ (2026-12-05: the diagonal step, the unmasked ones and their merges by rank,
    # tests/test_cp_ring_steps.py): the ring, one collective, starts once its last member has issued it.
    pres = layer[layer["name"] == "F0.c0.L1.cp1"]
    rings = layer[layer["name"] == "F0.c0.L1.cp_ring"]
    assert len(pres) == len(rings) == cp
    assert (rings["start_s"] - pres["end_s"].max()).abs().max() < 1e-12
    latest = int(pres.loc[pres["end_s"].idxmax(), "rank"])
    for rank in sorted(layer["rank"].unique()):
        ops = layer[layer["rank"] == rank].set_index("name")
        pre, first, mid, last = (ops.loc[f"F0.c0.L1.cp{i}"] for i in (1, 2, 3, 4))
        ring = ops.loc["F0.c0.L1.cp_ring"]
        assert first["start_s"] == pytest.approx(pre["end_s"], abs=1e-12) and mid["start_s"] == pytest.approx(
            first["end_s"], abs=1e-12)
        # the last step starts once every block is in and the steps before it are done
        assert last["start_s"] == pytest.approx(max(mid["end_s"], ring["end_s"]), abs=1e-12)
        c = ring["duration_s"] / (cp - 1)                      # one block's transfer
        a = (mid["end_s"] - first["start_s"]) / (cp - 1)       # one ring step, on average
        assert (c > a) == comm_bound  # each case really is what it says
        if rank == latest:  # the rank the ring waited for: its attention starts with the ring
            # the last step starts (cp - 1) max(a, c) after the attention starts
            assert last["start_s"] - first["start_s"] == pytest.approx((cp - 1) * max(a, c), rel=1e-9)


def test_all_gather_cp_is_not_overlapped():
    ops = _run(4, "all_gather", seq=32768).ops
    ops = ops[ops["rank"] == 0].set_index("name")
    gather, attention = ops.loc["F0.c0.L1.cp_all_gather"], ops.loc["F0.c0.L1.cp2"]
    assert gather["stream"] == "compute" and attention["start_s"] == pytest.approx(gather["end_s"])
    assert "B0.c0.L1.cp_reduce_scatter" in ops.index


# ------------------------------------------------------------- fidelity
@pytest.mark.parametrize("kind", ["p2p", "all_gather", "a2a"])
@pytest.mark.parametrize("fidelity", ["fast", "lockstep"])
def test_representatives_agree_with_full(kind, fidelity):
    kw = {"tp": 2, "dp": 2, "m": 2, "seq": 4096, "pp": 2, "zero": 1}
    kw["cluster"] = {"preset": "dgx-h100", "nodes": 2}
    full = _run(2, kind, fidelity="full", **kw)
    rep = _run(2, kind, fidelity=fidelity, **kw)
    assert rep.step_time == pytest.approx(full.step_time, rel=0.02)
    for cls, nbytes in full.bytes_by_class.items():
        assert rep.bytes_by_class[cls] == pytest.approx(nbytes, rel=1e-9)


# ---------------------------------------------------------------- errors
@pytest.mark.parametrize("par, seq, match", [
    ({"cp": 2}, 4098, "training.seq_len: 4098 is not a multiple of 2\\*cp = 4"),
    ({"cp": 2, "tp": 2, "sequence_parallel": True}, 4100, "2\\*cp\\*tp = 8"),
    ({"cp": 4, "cp_comm_type": "a2a"}, 4096, "parallel.cp: 4 does not divide the 2 model.kv_heads"),
    ({"cp": 2, "dp": 2, "zero": 3}, 4096, "parallel.cp: context parallelism is modelled with Megatron"),
    ({"cp": 2, "cp_comm_type": "ring"}, 4096, "parallel.cp_comm_type"),
])
def test_bad_context_parallel_configs_are_one_line_errors(par, seq, match):
    with pytest.raises(ConfigError, match=match):
        validate(model_from_dict(MODEL), ParallelConfig(**par), TrainingSpec(seq_len=seq))


def test_cp_with_unfused_attention_is_refused():
    # (CP with MoE is modelled since 2026-12-05: tests/test_cp_moe.py)
    with pytest.raises(ConfigError, match="options.flash_attention"):
        training_step(model_from_dict(MODEL), ParallelConfig(cp=2), TrainingSpec(seq_len=4096),
                      StepOptions(flash_attention=False))


def test_world_size_and_derived_dp_count_cp():
    doc = {"cluster": {"preset": "dgx-h100", "nodes": 2}, "model": MODEL,
           "parallel": {"tp": 2, "cp": 4}, "training": {"seq_len": 4096}}
    assert experiment_from_dict(doc).parallel.dp == 2
    doc["parallel"]["dp"] = 4
    with pytest.raises(ConfigError, match=r"tp\*cp\*pp\*dp = 2\*4\*1\*4 = 32"):
        experiment_from_dict(doc)


def test_the_long_context_example_loads_and_fits():
    from pathlib import Path

    from simulator.experiment import load_experiment
    exp = load_experiment(Path(__file__).resolve().parents[1] / "examples" / "llama3-405b-cp16-128k.yaml")
    par = exp.parallel
    assert (par.tp, par.cp, par.pp, par.dp, exp.training.seq_len) == (8, 16, 16, 1, 131072)
    assert exp.cluster.num_gpus == 2048 and exp.memory().fits(80e9)
