"""Sharded data parallelism as each framework runs it, against hand counts and the α-β model.

Truths used: the frameworks' documented semantics (workloads/sharding.py cites the
code), counted by hand on small models; Rajbhandari et al.'s ZeRO formulas
(memory ``(2+2+K)Ψ`` by stage, ZeRO-3 = 1.5x DP traffic); and the α-β cost of
a ring all-gather / reduce-scatter, ``(n-1)·α + (n-1)/n · S / B``, worked by
hand for a communication-bound step.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from simulator import ComputeModel, NetworkConfig, simulate
from simulator.experiment import experiment_from_dict, run_experiment
from topologies import build_cluster, single_server
from workloads.errors import ConfigError
from workloads.models import ModelSpec
from workloads.parallel import ParallelConfig, TrainingSpec
from workloads.sharding import Unit, Use, gather_schedule, sharding_plan, zero_figures
from workloads.training import training_step

BF16 = 2


def model(**kw) -> ModelSpec:
    """h = 256, f = 1024, 4 heads, V = 512, untied: every Linear has more than 1e5 elements except attn_out."""
    fields = dict(name="m", layers=4, hidden=256, heads=4, kv_heads=4, ffn_hidden=1024, vocab=512,
                  gated_mlp=False, tied_embeddings=False)
    fields.update(kw)
    return ModelSpec(**fields)


def run(m: ModelSpec, par: ParallelConfig, cluster=None, network=None, seq=128):
    cluster = cluster or single_server("H100-SXM", par.world_size)
    step = training_step(m, par, TrainingSpec(seq_len=seq))
    return step, simulate(step.graph, cluster, ComputeModel(cluster.gpu), network or NetworkConfig())


def rank0(res, cls):
    ops = res.rep_ops
    return ops[(ops["rank"] == 0) & (ops["traffic_class"] == cls)]


# ------------------------------------------------------- per-step bytes
def test_deepspeed_full_recompute_gathers_three_times_and_reduces_once():
    # DeepSpeed's hooks fire on the recomputed forward: keeping nothing that is not reused at once (reuse
    # distance 0), every Linear is gathered before its forward, its recomputed forward and its backward —
    # 3 all-gathers of Ψ per micro-batch — except what is used again immediately: each layer's last recomputed
    # module (``down``) is its first backward one, the output layer's forward is followed by its backward, and
    # micro-batch 0's embedding backward by micro-batch 1's embedding forward. Gradients: one reduce-scatter
    # of Ψ per micro-batch.
    m, n = model(), 8
    par = ParallelConfig(dp=n, zero=3, zero_impl="deepspeed", recompute="full", zero_reuse_distance=0,
                         zero_persistence=0, global_batch=2 * n)                     # 2 micro-batches
    step, res = run(m, par)
    h, V, L, f = m.hidden, m.vocab, m.layers, m.ffn_hidden
    linears, down = 4 * h * h + 2 * h * f, h * f
    gathered = 2 * L * (3 * linears - down) + 3 * (V * h) + 2 * (V * h + h)       # 2 micro-batches
    zero = rank0(res, "zero")
    assert zero["nbytes"].sum() == pytest.approx(gathered * BF16, rel=1e-12)
    params = L * (linears + 2 * h) + 2 * V * h + h
    ring = (n - 1) / n * BF16
    assert res.bytes_by_class["dp"] == pytest.approx(n * 2 * params * ring, rel=1e-9)
    assert set(rank0(res, "dp")["collective"]) == {"reduce_scatter"}


def test_fsdp_full_recompute_reuses_the_backward_gather():
    # FSDP: the checkpointed forward runs inside the unit's backward, with its parameters already gathered:
    # 2 all-gathers per layer per micro-batch and the root once; one reduce-scatter per unit per micro-batch.
    m, n = model(), 8
    par = ParallelConfig(dp=n, zero=3, zero_impl="fsdp", recompute="full", global_batch=2 * n)
    step, res = run(m, par)
    h, V, L, f = m.hidden, m.vocab, m.layers, m.ffn_hidden
    layer = 4 * h * h + 2 * h * f + 2 * h
    root = 2 * V * h + h
    zero = rank0(res, "zero")
    assert len(zero) == 2 * (2 * L + 1)                       # per micro-batch: L forward + L backward + root
    assert zero["nbytes"].sum() == pytest.approx(2 * (2 * L * layer + root) * BF16, rel=1e-12)
    rs = rank0(res, "dp")
    assert len(rs) == 2 * (L + 1)                            # one per unit per micro-batch
    assert set(rs["collective"]) == {"reduce_scatter"}


def test_gradient_sync_once_per_step_reduces_once():
    m, n = model(), 8
    every = run(m, ParallelConfig(dp=n, zero=3, zero_impl="fsdp", global_batch=4 * n))[1]
    once = run(m, ParallelConfig(dp=n, zero=3, zero_impl="fsdp", zero_grad_sync="step", global_batch=4 * n))[1]
    assert every.bytes_by_class["dp"] == pytest.approx(4 * once.bytes_by_class["dp"], rel=1e-12)
    assert len(rank0(every, "dp")) == 4 * len(rank0(once, "dp"))


def test_megatron_reduces_fp32_gradients_once_per_step_and_gathers_bf16_parameters():
    m, n = model(), 8
    step, res = run(m, ParallelConfig(dp=n, zero=1, global_batch=4 * n))
    params = m.total_params()
    ring = (n - 1) / n
    assert res.bytes_by_class["dp"] == pytest.approx(n * ring * params * 4, rel=1e-9)    # fp32 reduce-scatter
    assert res.bytes_by_class["zero"] == pytest.approx(n * ring * params * 2, rel=1e-9)  # bf16 all-gather


# ------------------------------------------------------ collective counts
def test_deepspeed_gathers_one_module_at_a_time_or_coalesced_up_to_the_prefetch_bucket():
    m, n = model(), 8
    base = dict(dp=n, zero=3, zero_impl="deepspeed", zero_reuse_distance=0, zero_persistence=0, global_batch=n)
    alone = rank0(run(m, ParallelConfig(**base, zero_prefetch=0))[1], "zero")
    # one micro-batch: embedding, 4 Linears x 4 layers, output layer, each forward and backward
    assert len(alone) == 2 * (1 + 4 * m.layers + 1) - 1       # the output layer's backward follows its forward
    bucket = 5e5   # elements: the 256x1024 MLP matrices (262,144) pair up, smaller ones group by three
    together = rank0(run(m, ParallelConfig(**base, zero_prefetch=bucket))[1], "zero")
    assert len(together) < len(alone)
    assert together["nbytes"].sum() == pytest.approx(alone["nbytes"].sum(), rel=1e-12)
    assert together["nbytes"].max() <= (bucket + 262144) * BF16      # closes once it holds the bucket


def test_deepspeed_2021_fetches_every_tensor_on_the_compute_stream():
    m, n = model(bias=True), 8
    par = ParallelConfig(dp=n, zero=3, zero_impl="deepspeed", zero_overlap=False, zero_reuse_distance=0,
                         zero_persistence=0, global_batch=n)
    zero = rank0(run(m, par)[1], "zero")
    assert set(zero["stream"]) == {"compute"}
    # weight + bias of each Linear: the collective op stands for 2 back-to-back all-gathers
    step = training_step(m, par, TrainingSpec(seq_len=128))
    ops = [o for o in step.graph.ops if o.rank == 0 and o.traffic_class == "zero"]
    assert {o.count for o in ops} >= {2}


def test_fsdp2_copies_every_gathered_unit_out():
    m, n = model(), 8
    step, res = run(m, ParallelConfig(dp=n, zero=3, zero_impl="fsdp2", global_batch=n))
    ops = res.rep_ops
    copies = ops[(ops["rank"] == 0) & (ops["name"] == "zero_copy_out")]
    gathers = rank0(res, "zero")
    assert len(copies) == len(gathers)
    assert copies["nbytes"].sum() == pytest.approx(2 * gathers["nbytes"].sum(), rel=1e-12)   # read + write


# ----------------------------------------------------------- residency
def _units(*sizes):
    return [Unit((i,), s) for i, s in enumerate(sizes)]


def test_reuse_distance_keeps_what_comes_back_soon():
    a, b, c = _units(4e8, 4e8, 4e8)
    uses = [Use(a, "F"), Use(b, "F"), Use(c, "F"), Use(c, "B"), Use(b, "B"), Use(a, "B")]
    plan = sharding_plan(ParallelConfig(dp=2, zero=3, zero_impl="deepspeed"))        # reuse distance 1e9
    sched = gather_schedule(uses, plan)
    gathered = [i for i, g in enumerate(sched.group_of) if g is not None]
    # c comes back at once (0 in between), b after 8e8 <= 1e9 (kept), a after 1.6e9 (released)
    assert gathered == [0, 1, 2, 5]


def test_live_gathered_parameters_are_bounded_by_the_prefetch():
    units = _units(*([1e8] * 12))
    uses = [Use(u, "F") for u in units] + [Use(u, "B") for u in reversed(units)]
    fsdp = gather_schedule(uses, sharding_plan(ParallelConfig(dp=2, zero=3, zero_impl="fsdp")))
    assert fsdp.peak_live == pytest.approx(2e8)               # the unit in use and the one prefetched
    ds = gather_schedule(uses, sharding_plan(ParallelConfig(dp=2, zero=3, zero_impl="deepspeed",
                                                            zero_reuse_distance=0, zero_prefetch=3e8)))
    assert ds.peak_live <= 1e8 + 3e8 + 1e8                    # in use + one prefetch bucket (overshoot one)


@pytest.mark.parametrize("zero", [2, 3])
def test_fsdp_gathers_a_unit_once_however_many_micro_batches(zero):
    """A unit is gathered at most once at a time: its next gather (the root's, at the next micro-batch's forward)
    waits for its release. The peak of gathered parameters therefore cannot grow with the micro-batches, and
    under SHARD_GRAD_OP (zero 2, nothing resharded in between) it is at most the stage's whole parameters. (A
    found defect: from two micro-batches on, the root unit was counted twice, resident and "prefetched".)"""
    from workloads.memory import memory_per_gpu
    from workloads.sharding import stage_uses

    peaks, params = [], []
    for m in (1, 2, 4):
        par = ParallelConfig(dp=8, micro_batch=1, global_batch=8 * m, zero=zero, zero_impl="fsdp")
        plan = sharding_plan(par)
        units = stage_uses(model(vocab=32000), par, plan, 0)[1]
        peaks.append(gather_schedule(units, plan).peak_live)
        params.append(memory_per_gpu(model(vocab=32000), par, TrainingSpec(seq_len=128), 0).parameters)
    assert peaks[1] == peaks[2] == peaks[0] and params[1] == params[2] == params[0]
    if zero == 2:
        whole = sum({u.unit.key: u.unit.total for u in units}.values())
        assert peaks[0] <= whole


def test_fsdp_no_sync_accumulates_whole_gradients_and_shard_grad_op_keeps_its_parameters():
    """FSDP's no_sync (``zero_grad_sync: step``): "FSDP will accumulate the full model gradients (instead of
    gradient shards) until the eventual sync" (torch FSDP.no_sync), and SHARD_GRAD_OP frees nothing in a backward
    that does not sync (``_should_free_in_backward``), so its parameters are gathered once per step, not once per
    micro-batch. FULL_SHARD still reshards after every forward and backward."""
    from workloads.memory import memory_per_gpu
    from workloads.sharding import stage_uses

    m, seq, mbs = model(), TrainingSpec(seq_len=128), 4
    for impl in ("fsdp", "fsdp2"):
        for zero in (2, 3):
            sync = ParallelConfig(dp=8, global_batch=8 * mbs, zero=zero, zero_impl=impl, zero_grad_sync="step")
            each = ParallelConfig(dp=8, global_batch=8 * mbs, zero=zero, zero_impl=impl)
            whole, shard = memory_per_gpu(m, sync, seq, 0).gradients, memory_per_gpu(m, each, seq, 0).gradients
            assert whole == pytest.approx(8 * shard)  # the full gradients against a 1/dp shard
    for zero in (2, 3):
        par = ParallelConfig(dp=8, global_batch=8 * mbs, zero=zero, zero_impl="fsdp", zero_grad_sync="step")
        plan = sharding_plan(par)
        uses = stage_uses(m, par, plan, 0)[1]
        gathers = [uses[g[0]] for g in gather_schedule(uses, plan).groups]
        if zero == 2:  # each unit gathered once, in the first micro-batch's forward
            assert len(gathers) == len({u.unit.key for u in uses}) and {u.micro_batch for u in gathers} == {0}
        else:  # re-gathered every micro-batch
            assert {u.micro_batch for u in gathers} == set(range(mbs))


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe", "zb-h1"])
def test_shard_grad_op_under_no_sync_gathers_once_whatever_the_backward_order(schedule):
    """GPipe runs the backwards last micro-batch first and ZB-H1 splits off weight gradients: SHARD_GRAD_OP under
    no_sync still frees a unit only after its last use of the step, so each is gathered once per stage."""
    from workloads.sharding import stage_uses

    par = ParallelConfig(dp=4, pp=2, micro_batch=1, global_batch=16, zero=2, zero_impl="fsdp",
                         zero_grad_sync="step", schedule=schedule)
    plan = sharding_plan(par)
    for stage in range(2):
        uses = stage_uses(model(layers=8), par, plan, stage)[1]
        sched = gather_schedule(uses, plan)
        gathered = [uses[g[0]].unit.key for g in sched.groups]
        assert len(gathered) == len(set(gathered)) == len({u.unit.key for u in uses})


def test_deepspeed_holds_persistent_modules_whole():
    """DeepSpeed ZeRO-3 never partitions a module at or below ``stage3_param_persistence_threshold``: with a
    threshold above every module, every rank holds all of its parameters (2 bytes each), not a 1/dp shard."""
    from workloads.memory import memory_per_gpu
    from workloads.sharding import stage_uses

    m, seq = model(), TrainingSpec(seq_len=128)
    par = ParallelConfig(dp=8, global_batch=8, zero=3, zero_impl="deepspeed", zero_persistence=1e12)
    units = {u.unit.key: u.unit.total for u in stage_uses(m, par, sharding_plan(par), 0)[1]}
    held = memory_per_gpu(m, par, seq, 0).parameters
    assert held >= 2 * sum(units.values())
    assert held <= 2 * m.total_params()


# --------------------------------------------------- α-β, communication-bound
@pytest.mark.parametrize("nodes", [2, 4, 8])
def test_comm_bound_zero3_step_follows_the_alpha_beta_model(nodes):
    """DP-only FSDP ZeRO-3 of a wide, shallow model with one short sequence per GPU: the step is its
    collectives. Ideal network (uniform α per step, links at their rate). Each all-gather / reduce-scatter of
    S bytes over n = 8·nodes ranks is a ring through 8 rails: (n-1)·α_step + (n-1)/n · S / (8 B_nic), every
    step's α being the software α plus the slowest (cross-leaf) hop's link latencies. Forward: the gathers
    run back to back; backward: gathers and reduce-scatters share the rails, so the NICs move 3 Ψ in all.
    """
    m = model(layers=4, hidden=4096, heads=32, kv_heads=32, ffn_hidden=16384, vocab=1024)
    n = 8 * nodes
    alpha = 2e-6
    cluster = build_cluster({"preset": "dgx-h100", "nodes": nodes})
    net = NetworkConfig(step_latency_s=alpha, bandwidth_efficiency=1.0)
    par = ParallelConfig(dp=n, zero=3, zero_impl="fsdp", global_batch=n)
    _step, res = run(m, par, cluster, net, seq=16)
    g = cluster.graph
    hop = max(sum(g.edges[e]["latency"] for e in zip(path, path[1:]))
              for path in [[("gpu", 0, 7), ("nic", 0, 7), ("leaf", 0), ("nic", 1, 7), ("gpu", 1, 7)]])
    node_bw = 8 * cluster.gpu.nic_bandwidth
    layer = m.params_per_layer(0) * BF16
    root = (2 * m.vocab * m.hidden + m.hidden) * BF16
    # latency on the critical path: the forward's root + L gathers, the backward's L gathers (each unit's
    # reduce-scatter overlaps the next gather) and the last (root's) reduce-scatter
    serial = (m.layers + 1) + m.layers + 1
    latency = serial * (n - 1) * (alpha + hop)
    volume = (n - 1) / n * (3 * m.layers * layer + 2 * root) / node_bw
    expected = latency + volume
    assert expected <= res.step_time <= 1.12 * expected               # + the little compute that is exposed


def test_zero3_step_time_grows_with_dp_at_fixed_work_per_gpu():
    m = model(layers=4, hidden=4096, heads=32, kv_heads=32, ffn_hidden=16384, vocab=1024)
    times = []
    for nodes in (2, 4, 8):
        n = 8 * nodes
        cluster = build_cluster({"preset": "dgx-h100", "nodes": nodes})
        times.append(run(m, ParallelConfig(dp=n, zero=3, zero_impl="fsdp", global_batch=n), cluster, seq=16)
                     [1].step_time)
    assert times[0] < times[1] < times[2]


# ------------------------------------------------------------- errors
@pytest.mark.parametrize("kw, field", [
    ({"zero": 3, "zero_impl": "megatron"}, "parallel.zero_impl"),
    ({"zero": 1, "zero_impl": "fsdp"}, "parallel.zero_impl"),
    ({"zero": 3, "zero_impl": "nope"}, "parallel.zero_impl"),
    ({"zero": 3, "zero_impl": "deepspeed", "zero_grad_sync": "step"}, "parallel.zero_grad_sync"),
    ({"zero": 3, "zero_prefetch": -1}, "parallel.zero_prefetch"),
    ({"zero": 3, "zero_reuse_distance": float("nan")}, "parallel.zero_reuse_distance"),
])
def test_bad_sharding_settings_name_the_field(kw, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        experiment_from_dict({"cluster": {"preset": "dgx-h100", "nodes": 1}, "model": {"preset": "tiny"},
                              "parallel": {"dp": 8, **kw}})


def test_zero_prefetch_accepts_yaml_exponent_strings():
    assert ParallelConfig(dp=2, zero=3, zero_prefetch="5e7").zero_prefetch == 5e7


# --------------------------------------------------------------- the paper
@pytest.mark.parametrize("zero, paper_gb", [(0, 120), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_figures_reproduce_the_paper_figure_1(zero, paper_gb):
    # Rajbhandari et al., Figure 1: Ψ = 7.5B, N_d = 64, K = 12.
    assert zero_figures(7.5e9, 64)[zero]["model_states_bytes"] / 1e9 == pytest.approx(paper_gb, abs=0.05)


def test_fp32_adam_holds_no_master_copy():
    # fp32 training: 4-byte weights and gradients, momentum and variance (K = 8; the weights are the master
    # copy): 16 bytes per parameter unsharded, as Megatron's distributed-optimizer table gives for fp32.
    rows = zero_figures(7.5e9, 64, dtype_bytes=4)
    assert [r["model_states_bytes"] / 7.5e9 for r in rows] == pytest.approx([16, 8 + 8 / 64, 4 + 12 / 64, 16 / 64])
    assert [r["memory_formula"] for r in rows] == ["(4+4+8)Ψ", "(4+4)Ψ + 8Ψ/N", "4Ψ + (4+8)Ψ/N", "(4+4+8)Ψ/N"]
    assert rows[3]["traffic_formula"] == "3(N-1)/N·4Ψ"
    text = subprocess.run([sys.executable, "-m", "simulator.cli", "zero", "--params", "7.5B", "--gpus", "64",
                           "--dtype-bytes", "4"], capture_output=True, text=True, check=True).stdout
    assert "fp32 Adam (K = 8)" in text and "120.0 GB" in text


def test_zero3_traffic_is_one_and_a_half_times_dp():
    rows = zero_figures(1e12, 1024)
    assert rows[3]["traffic_bytes_per_gpu"] == pytest.approx(1.5 * rows[0]["traffic_bytes_per_gpu"])
    assert rows[1]["traffic_bytes_per_gpu"] == rows[2]["traffic_bytes_per_gpu"] == rows[0]["traffic_bytes_per_gpu"]
    assert rows[0]["traffic_bytes_per_gpu"] == pytest.approx(2 * 1023 / 1024 * 2e12)


def test_cli_zero_prints_the_figures_with_their_formulas():
    out = subprocess.run([sys.executable, "-m", "simulator.cli", "zero", "--params", "1T", "--gpus", "1024",
                          "--json"], capture_output=True, text=True, check=True).stdout
    rows = json.loads(out)
    assert rows[3]["model_states_bytes"] / 1e9 == pytest.approx(15.6, abs=0.05)
    assert rows[3]["memory_formula"] == "(2+2+12)Ψ/N"
    text = subprocess.run([sys.executable, "-m", "simulator.cli", "zero"], capture_output=True, text=True).stdout
    assert "15.6 GB" in text and "3(N-1)/N·2Ψ" in text
    bad = subprocess.run([sys.executable, "-m", "simulator.cli", "zero", "--params", "lots"], capture_output=True,
                         text=True)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "--params" in bad.stderr


def test_run_experiment_with_each_implementation():
    for impl in ("deepspeed", "fsdp", "fsdp2"):
        m = {"name": "m", "layers": 4, "hidden": 256, "heads": 4, "kv_heads": 4, "ffn_hidden": 1024, "vocab": 512,
             "gated_mlp": False, "tied_embeddings": False}
        res = run_experiment(experiment_from_dict({
            "cluster": {"preset": "dgx-a100", "nodes": 2}, "model": m,
            "parallel": {"dp": 16, "zero": 3, "zero_impl": impl, "recompute": "full", "global_batch": 32},
            "training": {"seq_len": 128}}))
        assert res.step_time > 0 and res.bytes_by_class["zero"] > 0
