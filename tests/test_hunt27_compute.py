"""Compute-model invariants found broken in review (hunt 27, compute).

A batched GEMM (``batch`` problems of ``m × n × k`` in one launch: unfused attention's heads) can always run each
problem as that problem runs alone, with the same tile and split, so its tile work is never more than ``batch``
times one problem's (:mod:`simulator.gemm`, "Split-K"). Split-K used to be offered only while the whole batch's
tiles were fewer than the SMs, so 3 problems of 8192×64×8192 on an H100 took 1.12x as long as three launches of
one problem (the batched launch ran 2 full-depth waves; one problem alone splits ``k`` in two and fills one wave).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from simulator.compute import ComputeModel
from simulator.gemm import _best_time, times
from topologies import get_gpu
from workloads.flops import layer_ops
from workloads.models import get_preset

GPUS = ("A100", "H100", "B200")
DIMS = (64, 100, 128, 256, 512, 1000, 1024, 2048, 4096, 8192)
BATCHES = (2, 3, 5, 8, 12, 40, 96)


@pytest.mark.parametrize("gpu", GPUS)
def test_a_batched_gemm_never_takes_longer_than_its_problems_one_by_one(gpu):
    gemm = ComputeModel(get_gpu(gpu)).gemm
    worst = max(gemm.time(m, n, k, b) / (b * gemm.time(m, n, k))
                for m, n, k in itertools.product(DIMS, repeat=3) for b in BATCHES)
    assert worst <= 1 + 1e-12


@pytest.mark.parametrize("gpu", ("H100", "B200"))
def test_the_shapes_that_broke_it(gpu):
    # (8192, 64, 8192) x 3: H100 1.121x, B200 1.109x three launches before the fix; unfused attention's P V (and
    # the Q Kᵀ weight gradient) of gpt2-small at TP 4 and 8K tokens is this GEMM, 3 heads per rank
    gemm = ComputeModel(get_gpu(gpu)).gemm
    for shape, batch in (((8192, 64, 8192), 3), ((64, 8192, 8192), 3), ((8192, 128, 8192), 5),
                         ((2048, 1024, 8192), 3)):
        assert gemm.time(*shape, batch) <= batch * gemm.time(*shape) * (1 + 1e-12), (shape, batch)
    ops = layer_ops(get_preset("gpt2-small"), 1, 8192, 4, flash_attention=False)
    for op in ops.forward + ops.backward:
        if op.category == "gemm" and op.batch > 1:
            assert gemm.time(*op.shape, op.batch) <= op.batch * gemm.time(*op.shape) * (1 + 1e-12), op.name


@pytest.mark.parametrize("gpu", GPUS)
def test_batched_gemms_stay_monotone_and_the_array_path_agrees(gpu):
    gemm = ComputeModel(get_gpu(gpu)).gemm
    for m, n, k in itertools.product((64, 1000, 8192), repeat=3):
        ts = [gemm.time(m, n, k, b) for b in range(1, 200)]
        assert all(a <= b * (1 + 1e-12) for a, b in zip(ts, ts[1:])), (m, n, k)
    rng = np.random.default_rng(27)
    m, n, k = (rng.integers(1, 9000, 2000) for _ in range(3))
    batch = rng.choice(np.array(BATCHES + (1,)), 2000)
    scalar = [_best_time(gemm, int(a), int(b), int(c), int(d))[0] for a, b, c, d in zip(m, n, k, batch)]
    assert times(gemm, m, n, k, batch).tolist() == scalar
