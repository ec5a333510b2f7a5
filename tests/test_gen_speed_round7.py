"""Round seven's fast paths give what the plain paths give, bit for bit (compared with ``==``).

* :func:`simulator.gemm.times` (many GEMM shapes at once) against :func:`simulator.gemm._best_time`;
* :func:`simulator.compute.op_durations` (the engine's duration pass, the plain GEMM kernels of all coarsened ops
  timed as arrays) against :meth:`ComputeModel.duration` of each op, one by one;
* the MoE generator's expert kernels and the totals it records for the graph against :func:`_scale_kernel` and
  :meth:`OpGraph._part_sums`; the alltoallv builder's group check by identity keeps its errors.
"""

import dataclasses
import math

import numpy as np
import pytest

from simulator import gemm as gemm_module
from simulator.compute import ComputeModel, op_durations
from simulator.experiment import _REPRESENTATIVES, experiment_from_dict
from simulator.gemm import GemmModel, _best_time, times
from topologies import get_gpu
from workloads.flops import LayerOp
from workloads.ops import Compute, Kernel, OpGraph, OpGraphError
from workloads.training import _scale_kernel, _StepBuilder, training_step

MODELS = [
    GemmModel(989e12, 132, 0.803, 160.0, 3.35e12),                      # H100 bf16
    GemmModel(1979e12, 132, 0.709, 320.0, 3.35e12, 1, 256, True),      # H100 FP8 with stream-K
    GemmModel(312e12, 108, 0.869, 100.0, 2.0e12),                       # A100 bf16
]


@pytest.mark.parametrize("model", MODELS)
def test_times_equal_the_scalar_model(model):
    """Shapes varying in all three dimensions and the batch at once, small (split-K) and large, and shapes whose
    integers could pass 2**53 (timed one by one) mixed among them."""
    rng = np.random.default_rng(3)
    n = 3000
    m = rng.integers(1, 60000, n)
    nn = rng.choice([1, 7, 64, 2048, 4096, 7168, 129280], n)
    k = rng.integers(1, 40000, n)
    batch = rng.choice([1, 1, 1, 2, 8], n)
    m[:5], nn[:5], k[:5] = 2**40, 2**20, 2**20  # past the exact-integer bound: the scalar model's own path
    got = times(model, m, nn, k, batch).tolist()
    for t, shape in zip(got, zip(m.tolist(), nn.tolist(), k.tolist(), batch.tolist())):
        assert t == _best_time(model, *shape)[0], shape


# ---------------------------------------------------------------- the duration pass
def reference_durations(ops, compute, rank_compute=None):
    """:meth:`ComputeModel.duration` of every compute op, one by one on its rank's model (NaN for the other ops):
    the definition that :func:`op_durations` caches per shape and times as arrays, with neither."""
    models = rank_compute or {}
    return [models.get(op.rank, compute).duration(op) if op.kind == "compute" else float("nan") for op in ops]


def same(a, b):
    """Element-wise equal, NaN (the ops that are not compute) matching NaN."""
    return len(a) == len(b) and all(x == y or (math.isnan(x) and math.isnan(y)) for x, y in zip(a, b))


MOE = {"name": "moe-small", "layers": 4, "hidden": 1024, "heads": 8, "kv_heads": 8, "ffn_hidden": 4096,
       "vocab": 32000, "gated_mlp": True, "tied_embeddings": False, "experts": 16, "top_k": 2,
       "moe_ffn_hidden": 2048, "max_seq_len": 4096}


def moe_step(moe=None, parallel=None, training=None):
    par = {"tp": 1, "pp": 2, "dp": 8, "ep": 8, "micro_batch": 1, "global_batch": 32, "recompute": "full"}
    par.update(parallel or {})
    exp = experiment_from_dict({
        "cluster": {"preset": "dgx-h100", "nodes": 2}, "model": dict(MOE), "parallel": par,
        "training": {"seq_len": 2048, **(training or {})},
        "moe": {"routing": "zipf", "zipf_s": 0.8, **(moe or {})}})
    step = training_step(exp.model, exp.parallel, exp.training, exp.options, exp.routing,
                         representatives=_REPRESENTATIVES["fast"])
    return exp, step


@pytest.mark.parametrize("moe, parallel, training", [
    ({}, {}, {}),
    ({"dispatch": "deepep", "shared_expert_overlap": True}, {}, {}),
    ({}, {"tp": 2, "dp": 4, "ep": 4, "etp": 1, "sequence_parallel": True}, {}),
    ({}, {}, {"dtype": "fp8"}),
])
def test_op_durations_equal_the_former_pass_on_moe_steps(moe, parallel, training):
    exp, step = moe_step(moe, parallel, training)
    ops = step.graph.ops
    compute = exp.compute_model()
    assert same(op_durations(ops, compute), reference_durations(ops, compute))
    # every other rank on another GPU (jobs sharing a fabric give each job's ranks their own model)
    other = ComputeModel(get_gpu("A100"), dtype="bf16") if training.get("dtype") != "fp8" \
        else dataclasses.replace(compute, op_overhead_s=2e-6)
    per_rank = {r: other for r in range(0, step.graph.world_size, 2)}
    assert same(op_durations(ops, compute, per_rank), reference_durations(ops, compute, per_rank))


class Marked(Kernel):
    """A Kernel subclass: :meth:`ComputeModel.duration` times it by the generic path."""


def test_op_durations_keep_the_former_pass_corner_cases():
    """One parts tuple on ops with and without ``duration_s`` (each op with it takes it; the others share the
    tuple's time), empty parts, unusual kernels (reserved SMs, batched, FP8, a subclass, no FLOPs, shapes of
    floats, one past 2**53), ops without parts (and a fixed one), on two models."""
    cm = ComputeModel(get_gpu("H100-SXM"), dtype="fp8")
    g = OpGraph(4)
    plain = (Kernel("gemm", 2.0 * 5000 * 4096 * 7168, 1e8, (5000, 4096, 7168)), Kernel("elementwise", 0.0, 1e9))
    odd = (Kernel("gemm", 2.0 * 4096 ** 3, 1e8, (4096, 4096, 4096), sm_reserved=16),
           Kernel("gemm", 2.0 * 8 * 2048 * 2048 * 128, 3e7, (2048, 2048, 128), batch=8),
           Kernel("gemm_fp8", 2.0 * 4096 ** 3, 5e7, (4096, 4096, 4096)),
           Marked("gemm", 1e12, 1e8, (1000, 1000, 500)),
           Kernel("gemm", 0.0, 0.0, (1, 1, 1)),
           Kernel("gemm", 1e12, 1e8),
           Kernel("scores", 1e9, 1e9),
           Kernel("scores", 0.0, 1e9),
           Kernel("gemm", 0.0, 1e6, (8, 8, 8), batch=4),
           Kernel("fp8_cast", 0.0, 3e8),
           Kernel("elementwise", -0.0, 0.0),
           Kernel("optimizer", 0.0, -0.0))
    floats = (Kernel("gemm", 1e12, 1e8, (1000.0, 2048, 512)),)
    huge = (Kernel("gemm", 1e12, 1e8, (2**53 + 1, 1, 1)),)
    g.compute(0, parts=plain, name="fixed first", duration_s=0.5)
    g.compute(1, parts=plain, name="then plain")
    g.compute(1, parts=odd, name="odd")
    g.compute(2, parts=odd, name="odd, fixed second", duration_s=0.25)
    g.compute(2, parts=(), name="empty")
    g.compute(3, parts=(), name="empty again", category="elementwise")
    g.compute(3, parts=floats, name="float shape")
    g.compute(3, parts=huge, name="huge")
    g.compute(0, 1e12, 1e8, shape=(4096, 4096, 4096), name="unparted")
    g.compute(0, category="fixed", duration_s=1e-3, name="fixed")
    g.send(0, 1, 1e6)
    g.recv(1, 0, 1e6)
    g.compute(1, parts=tuple(plain), name="an equal tuple, another object")
    other = ComputeModel(get_gpu("H200-SXM"), dtype="fp8", op_overhead_s=0.0)
    for per_rank in (None, {1: other, 3: other}):
        got = op_durations(g.ops, cm, per_rank)
        assert same(got, reference_durations(g.ops, cm, per_rank))
        by_name = {op.name: got[op.id] for op in g.ops if op.kind == "compute"}
        assert by_name["fixed first"] == 0.5 and by_name["odd, fixed second"] == 0.25
        rank1 = (per_rank or {}).get(1, cm)
        assert by_name["then plain"] == sum(rank1._kernel_duration(k) for k in plain) != 0.5  # not the first's


def test_op_durations_of_many_expert_kernels_use_the_arrays():
    """A graph of thousands of distinct expert kernels (as skewed routing makes) is timed as the former pass
    times it, past the point where :func:`~simulator.gemm._time` would switch to its blocks."""
    cm = ComputeModel(get_gpu("H100-SXM"))
    g = OpGraph(1)
    rng = np.random.default_rng(11)
    for load in rng.integers(1, 50000, 2000).tolist():
        g.compute(0, parts=(Kernel("gemm", 2.0 * load * 4096 * 7168, 1e6 * load, (load, 4096, 7168)),
                            Kernel("elementwise", 0.0, 3e3 * load),
                            Kernel("gemm", 2.0 * load * 7168 * 2048, 1e6 * load, (7168, 2048, load))))
    assert same(op_durations(g.ops, cm), reference_durations(g.ops, dataclasses.replace(cm)))
    assert not gemm_module._TIMES.get(id(cm.gemm))  # timed as arrays, not one by one


def test_op_durations_time_a_kernel_object_once_per_model_wherever_it_sits():
    """One kernel object in several tuples, at different places and beside different kernels, on ranks of two
    models (a MoE rank's recomputed forward: the layer's shared kernels around its own scaled experts): each
    op's time is still the sum over its own kernels on its own rank's model."""
    cm, other = ComputeModel(get_gpu("H100-SXM")), ComputeModel(get_gpu("A100"))
    shared = Kernel("gemm", 2.0 * 4096 * 4096 * 1024, 5e7, (4096, 4096, 1024))
    norm = Kernel("elementwise", 0.0, 4e7)
    scores = Kernel("attention", 2.0 * 4096 * 4096 * 128 * 16, 1e8, (4096, 4096, 128), batch=16)
    g = OpGraph(2)
    for rank in (0, 1):
        for load in (100, 3000, 100):
            expert = Kernel("gemm", 2.0 * load * 7168 * 2048, 1e4 * load, (load, 7168, 2048))
            g.compute(rank, parts=(norm, shared, expert, scores), name="pre")
            g.compute(rank, parts=(expert, shared, norm), name="post")
            g.compute(rank, parts=(shared,), name="alone")
    timed = []  # (model, kernel) of every kernel the pass times one by one (the attention kernel's path)
    scalar = ComputeModel._kernel_duration

    def counted(self, k):
        timed.append((id(self), id(k)))
        return scalar(self, k)

    ComputeModel._kernel_duration = counted
    try:
        got = op_durations(g.ops, cm, {1: other})
    finally:
        ComputeModel._kernel_duration = scalar
    assert sorted(timed) == sorted({(id(cm), id(scores)), (id(other), id(scores))})  # once per model, not 3x
    assert same(got, reference_durations(g.ops, cm, {1: other}))
    assert got[0] != got[9]  # the same kernels on the other model: another time


def test_joined_parts_check_each_piece_and_keep_the_graphs_totals():
    """:meth:`OpGraph._joined_parts` records the concatenation with the totals :meth:`OpGraph._part_sums` makes
    of it (one ``sum`` over its kernels in order: summing the pieces apart and carrying on differs in the last bit
    from Python 3.12, whose ``sum`` compensates within a call), and still refuses a piece with a bad kernel."""
    head = (Kernel("elementwise", 0.0, 0.1), Kernel("gemm", 0.3, 0.2, (1, 2, 3)))
    middle = (Kernel("gemm", 0.7, 1e-17, (3, 2, 1)),)
    tail = (Kernel("elementwise", 1e-16, 0.3),)
    g = OpGraph(1)
    joined = g._joined_parts((head, middle, tail), "pre")
    assert joined == head + middle + tail
    fresh = OpGraph(1)
    assert g._part_sums(joined, "pre") == fresh._part_sums(head + middle + tail, "pre")
    op = g.ops[g.compute(0, parts=joined, name="pre")]
    assert (op.flops, op.nbytes) == (sum(k.flops for k in joined), sum(k.nbytes for k in joined))
    for pieces in [((), middle, tail), (head, (), ()), (tail, head, middle, head)]:  # an empty first piece too
        other = OpGraph(1)
        joined = other._joined_parts(pieces, "pre")
        assert joined == sum(pieces, ())
        assert other._part_totals[id(joined)][1:] == OpGraph(1)._part_sums(sum(pieces, ()), "pre")
    bad = (Kernel("gemm", 1.0, 1.0, (0, 1, 1)),)
    with pytest.raises(OpGraphError, match="shape"):
        g._joined_parts((head, bad), "pre")


# ---------------------------------------------------------------- the generator
def test_expert_parts_equal_scale_kernel_and_record_the_graphs_totals():
    """:meth:`_StepBuilder._expert_parts` against :func:`_scale_kernel` kernel by kernel: the token rows scale (a
    GEMM's m, a weight gradient's reduced m), the other dimensions do not even where they equal the tokens (a
    hidden size equal to b·s·k, found by a QA hunt: the hidden dimension was scaled too); a kernel without a
    shape; the totals it records equal :meth:`OpGraph._part_sums` on a fresh graph."""
    builder = _StepBuilder.__new__(_StepBuilder)  # only what _balanced and _expert_parts read
    tokens = 1 * 2048 * 2
    builder.par = type("P", (), {"micro_batch": 1})()
    builder.train = type("T", (), {"seq_len": 2048})()
    builder.local_seq = 2048  # (tokens of each sequence on the rank: no context parallelism)
    builder.model = type("M", (), {"top_k": 2})()
    builder._moe_parts, builder._scale_plans, builder._balanced_kernels = {}, {}, {}
    builder.graph = OpGraph(1)
    ops = [LayerOp("experts_up", "gemm", 2.0 * tokens * 1024 * 512, 3e6, (tokens, 1024, 512)),
           LayerOp("experts_activation", "elementwise", 0.0, 2e6),
           LayerOp("experts_down", "gemm", 2.0 * tokens * tokens * 64, 1e6, (tokens, tokens, 64)),
           LayerOp("experts_up.wgrad", "gemm", 2.0 * 1024 * 512 * tokens, 3e6, (1024, 512, tokens)),
           LayerOp("experts_down.wgrad", "gemm", 2.0 * tokens * 64 * tokens, 1e6, (tokens, 64, tokens))]
    balanced = builder._balanced(ops)
    assert builder._balanced(list(ops)) is balanced  # one object per distinct set
    at = (0, None, 0, 2, 2)
    for load in (0, 1, 3, 2047, 4096, 4097, 10000, 123457):
        parts = builder._expert_parts(balanced, load)
        assert parts == tuple(_scale_kernel(k, load / tokens, i) for k, i in zip(balanced, at))
        assert [k.shape for k in parts if k.shape] == [
            (max(1, round(load)), 1024, 512), (max(1, round(load)), tokens, 64), (1024, 512, max(1, round(load))),
            (tokens, 64, max(1, round(load)))]
        assert [type(d) for k in parts if k.shape for d in k.shape] == [int] * 12
        assert builder.graph._part_totals[id(parts)][1:] == OpGraph(1)._part_sums(parts, "x")
        assert builder._expert_parts(balanced, load) is parts


def test_expert_parts_leave_unsound_kernels_to_the_graphs_check():
    """Kernels the graph would refuse are not recorded as checked: the op still fails as before."""
    builder = _StepBuilder.__new__(_StepBuilder)
    builder.par = type("P", (), {"micro_batch": 1})()
    builder.train = type("T", (), {"seq_len": 8})()
    builder.local_seq = 8
    builder.model = type("M", (), {"top_k": 1})()
    builder._moe_parts, builder._scale_plans, builder._balanced_kernels = {}, {}, {}
    builder.graph = OpGraph(1)
    parts = builder._expert_parts(builder._balanced([LayerOp("experts_up", "gemm", -1.0, 1.0, (8, 8, 8))]), 4)
    assert id(parts) not in builder.graph._part_totals
    with pytest.raises(OpGraphError, match="parts must be Kernels of finite, non-negative"):
        builder.graph._compute_parts(0, parts, "x", (), "gemm", 0, 0, 0, "compute")


def test_alltoallv_group_checked_by_identity_keeps_its_errors():
    g = OpGraph(8)
    group = (0, 2, 4, 6)
    g._alltoallv(0, group, (1.0, 1.0, 1.0, 1.0), None, "x", (), "ep", 0, 0, 0)
    g._alltoallv(0, group, (1.0, 1.0, 1.0, 1.0), None, "x", (0,), "ep", 0, 0, 0)  # cached: the same op
    assert g.ops[1].group is group and g.ops[1].deps == (0,)
    with pytest.raises(OpGraphError, match="group: rank 1 issues"):
        g._alltoallv(1, group, (1.0, 1.0, 1.0, 1.0), None, "x", (), "ep", 0, 0, 0)
    with pytest.raises(OpGraphError, match="deps: op id 7 does not exist"):
        g._alltoallv(0, group, (1.0, 1.0, 1.0, 1.0), None, "x", [7], "ep", 0, 0, 0)
    with pytest.raises(OpGraphError, match="group: must be a non-empty"):
        g._alltoallv(0, [0, 0], (1.0, 1.0), None, "x", (), "ep", 0, 0, 0)
    assert g._alltoallv(2, list(group), (1.0, 1.0, 1.0, 1.0), None, "x", (), "ep", 0, 0, 0) == 2
    assert isinstance(g.ops[2], type(g.ops[0])) and not isinstance(g.ops[2], Compute)
