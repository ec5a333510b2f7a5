"""The fast paths of MoE step building and compute timing give what the plain paths give, bit for bit.

Skewed routing gives every EP rank its own expert load, so a step builds and times tens of thousands of
distinct expert kernels. The fast paths (GEMM times of a block of shapes at once, the graph's positional
builders, the per-kernel duration, rows checked once by the generator) must not change a single value:
each test compares a fast path with the plain one it stands for, element by element with ``==``.
"""

import dataclasses

import numpy as np
import pytest

from simulator import gemm as gemm_module
from simulator.compute import ComputeModel
from simulator.gemm import GemmModel, _best_time, _block_times
from topologies import get_gpu
from workloads.ops import Kernel, OpGraph, OpGraphError

MODELS = [
    GemmModel(989e12, 132, 0.803, 160.0, 3.35e12),                      # H100 bf16
    GemmModel(1979e12, 132, 0.709, 320.0, 3.35e12, 1, 256, True),      # H100 FP8 with stream-K
    GemmModel(312e12, 108, 0.869, 100.0, 2.0e12),                       # A100 bf16
    GemmModel(989e12 * 112 / 132, 112, 0.8, 160.0, 3.35e12, 2, 7),      # SMs reserved, odd k overhead
]


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("axis", [0, 1, 2])
def test_block_times_equal_the_scalar_model(model, axis):
    """Every shape of a block, along each dimension, small and large (split-K and wave-bound), and batched."""
    rng = np.random.default_rng(axis)
    for start in (1, 100, 4000, 30000):
        values = np.arange(start, start + 200, dtype=np.int64)
        for fixed in ((64, 128), (7168, 2048), tuple(int(x) for x in rng.integers(1, 20000, 2))):
            for batch in (1, 3):
                dims: list = list(fixed)
                dims.insert(axis, values)
                got = _block_times(model, *dims, batch)
                assert got is not None
                for v, t in zip(values.tolist(), got.tolist()):
                    shape = list(fixed)
                    shape.insert(axis, v)
                    assert t == _best_time(model, *shape, batch)[0], (shape, batch)


def test_block_times_decline_shapes_past_exact_integers():
    """Shapes whose integer intermediates could pass 2**53 stay with the scalar model."""
    assert _block_times(MODELS[0], np.arange(1, 10, dtype=np.int64), 1 << 30, 1 << 30, 1) is None
    assert _block_times(MODELS[0], np.arange(0, 10, dtype=np.int64), 64, 64, 1) is None  # a zero dimension


def test_time_after_the_blocks_take_over():
    """GemmModel.time over thousands of shapes of one family (past the point where blocks are timed at once)
    equals the scalar model shape by shape."""
    model = dataclasses.replace(MODELS[1], efficiency=0.7)  # a model object of this test's own
    rng = np.random.default_rng(7)
    for m in rng.integers(1, 8000, 3000).tolist():  # ~190 shapes per block of 512: past VECTOR_AFTER
        for n, k in ((4096, 7168), (7168, 2048)):
            assert model.time(m, n, k) == _best_time(model, m, n, k, 1)[0]
            assert model.time(n, k, m) == _best_time(model, n, k, m, 1)[0]  # the token count as k (wgrad)
    assert gemm_module._TIMES[id(model)].blocks  # the blocks were used


def test_time_of_shapes_past_int64_stays_the_scalar_models():
    """Dimensions past 2**63 (an imported graph's shapes are not bounded) are timed shape by shape, past the
    point where a block would be, as the scalar model times them (review: numpy's int64 range overflowed)."""
    model = dataclasses.replace(MODELS[0], efficiency=0.71)
    for i in range(gemm_module.VECTOR_AFTER + 3):
        m = 2**64 + i
        assert model.time(m, 4096, 4096) == _best_time(model, m, 4096, 4096, 1)[0]
        assert model.time(4096, 4096, 2**63 + i) == _best_time(model, 4096, 4096, 2**63 + i, 1)[0]


KERNELS = [
    Kernel("gemm", 2.0 * 5000 * 4096 * 7168, 1e8, (5000, 4096, 7168)),
    Kernel("gemm", 2.0 * 3 * 17 * 4096 * 128, 1e6, (17, 4096, 128)),
    Kernel("gemm", 2.0 * 8 * 2048 * 2048 * 128, 3e7, (2048, 2048, 128), batch=8),
    Kernel("gemm", 2.0 * 4096 * 4096 * 4096, 1e8, (4096, 4096, 4096), sm_reserved=16),
    Kernel("gemm", 1e12, 1e8),
    Kernel("gemm_fp8", 2.0 * 4096 * 4096 * 4096, 5e7, (4096, 4096, 4096)),
    Kernel("attention", 1e12, 1e8, (4096, 4096, 128), batch=32),
    Kernel("elementwise", 0.0, 1e9),
    Kernel("scores", 1e9, 1e9),
    Kernel("gemm", 0.0, 0.0, (1, 1, 1)),
]


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_kernel_duration_equals_duration(dtype):
    """The per-kernel path of a coarsened op times each kernel as :meth:`ComputeModel.duration` does."""
    cm = ComputeModel(get_gpu("H100-SXM"), dtype=dtype)
    for k in KERNELS:
        assert cm._kernel_duration(k) == cm.duration(k), k
    total = 0
    for k in KERNELS:
        total += cm.duration(k)
    graph = OpGraph(1)
    op = graph.ops[graph.compute(0, parts=tuple(KERNELS))]
    assert cm.duration(op) == total


def plain_and_fast():
    return OpGraph(8), OpGraph(8)


def fields(op):
    return [getattr(op, f.name) for f in dataclasses.fields(op)] + [op.kind]


def test_positional_builders_make_the_same_ops():
    plain, fast = plain_and_fast()
    parts = (Kernel("gemm", 1e9, 1e6, (10, 20, 30)), Kernel("elementwise", 0.0, 5e5))
    group, split = (0, 2, 4, 6), (1.0, 2.0, 0.0, 3.0)
    whole = (split, (0.0, 1.0, 1.0, 1.0), (2.0, 2.0, 2.0, 2.0), (0.5, 0.0, 0.0, 0.0))
    for g in (plain, fast):
        g.compute(0, 1.0, name="first")
    a = plain.compute(2, parts=parts, name="x.pre", deps=[0], category="gemm", layer=3, micro_batch=1, stage=2,
                      stream="compute")
    b = fast._compute_parts(2, parts, "x.pre", [0], "gemm", 3, 1, 2, "compute")
    c = plain.collective_op(0, "all_to_all", group, 0, split=split, rows=None, traffic_class="ep", name="x.ep",
                            deps=[a], layer=3, micro_batch=1, stage=2, stream="ep")
    d = fast._alltoallv(0, group, split, None, "x.ep", [b], "ep", 3, 1, 2)
    e = plain.collective_op(0, "all_to_all", group, 0, split=split, rows=whole, traffic_class="ep", name="x.ep2",
                            deps=(), layer=3, micro_batch=1, stage=2, stream="compute")
    f = fast._alltoallv(0, group, split, whole, "x.ep2", (), "compute", 3, 1, 2)
    assert (a, c, e) == (b, d, f)
    assert [fields(op) for op in plain.ops] == [fields(op) for op in fast.ops]
    assert fast.ops[d].nbytes == 6.0


@pytest.mark.parametrize("call, message", [
    (lambda g: g._compute_parts(9, (), "x", (), "gemm", 0, 0, 0, "compute"), "rank: 9 is outside 0..7"),
    (lambda g: g._compute_parts(0, (), "x", (), "matmul", 0, 0, 0, "compute"), "category: 'matmul' unknown"),
    (lambda g: g._compute_parts(0, (), "x", [5], "gemm", 0, 0, 0, "compute"), "deps: op id 5 does not exist"),
    (lambda g: g._alltoallv(0, (0, 0), (1.0, 1.0), None, "x", (), "ep", 0, 0, 0), "group: must be a non-empty"),
    (lambda g: g._alltoallv(0, (0, 9), (1.0, 1.0), None, "x", (), "ep", 0, 0, 0), "group: 9 is outside"),
    (lambda g: g._alltoallv(1, (0, 2), (1.0, 1.0), None, "x", (), "ep", 0, 0, 0), "group: rank 1 issues"),
    (lambda g: g._alltoallv(0, (0, 2), (1.0, -1.0), None, "x", (), "ep", 0, 0, 0), "split: need 2 finite non-negative"),
    (lambda g: g._alltoallv(0, (0, 2), (1.0,), None, "x", (), "ep", 0, 0, 0), "split: need 2 finite non-negative"),
    (lambda g: g._alltoallv(0, (0, 2), (1.0, 1.0), ((1.0, 2.0), (0.0, 0.0)), "x", (), "ep", 0, 0, 0),
     "rows: row 0 (rank 0's own) differs"),
])
def test_positional_builders_keep_the_errors(call, message):
    with pytest.raises(OpGraphError, match=message.replace("(", r"\(").replace(")", r"\)")):
        call(OpGraph(8))


def test_known_splits_still_checked_against_the_group():
    """A row the generator recorded as checked is used as it is, but its length must still fit the group."""
    g = OpGraph(8)
    row = (1.0, 2.0, 3.0)
    g._known_splits([row])
    op = g.ops[g._alltoallv(0, (0, 1, 2), row, None, "x", (), "ep", 0, 0, 0)]
    assert op.split == row and op.nbytes == 6.0
    with pytest.raises(OpGraphError, match="split: need 2 finite non-negative"):
        g._alltoallv(0, (0, 1), row, None, "x", (), "ep", 0, 0, 0)
