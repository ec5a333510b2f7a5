"""Activations in flight under the interleaved schedule, chunk by chunk.

The memory model reads how many (micro-batch, chunk) forwards a stage holds at its peak off the schedule's
order of actions, each chunk weighted by its own layers. The truth here is independent of that replay: the
simulated timeline of a real step (which forwards have started and whose backward has not, on one rank), and
Megatron-Core's warm-up counts.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_training import _peak_live_forwards as _peak_live_layers
from test_training import run_step, small_model

from topologies import single_server
from workloads.memory import memory_per_gpu, micro_batches_in_flight
from workloads.parallel import ParallelConfig, TrainingSpec


def test_few_micro_batches_follow_the_schedule_rank_by_rank():
    # Megatron-Core (get_pp_rank_microbatches): a rank whose warm-up 2 (p - r - 1) + (v - 1) p reaches its
    # m v forwards runs them all first. p = m = 4, v = 2: warm-ups 10, 8, 6, 4 of 8 chunk-forwards, so 8, 8, 7
    # and 5 are live at the peaks: 4, 4, 3.5 and 2.5 micro-batches' worth. The simulated timeline agrees.
    par = ParallelConfig(pp=4, global_batch=4, schedule="interleaved", virtual_stages=2)
    assert [micro_batches_in_flight(par, i) for i in range(4)] == [4.0, 4.0, 3.5, 2.5]
    assert micro_batches_in_flight(par, np.int64(2)) == 3.5  # a stage as numpy gives it
    _step, res = run_step(small_model(layers=8), par, TrainingSpec(seq_len=128), single_server("H100-SXM", 4))
    one_layer_chunks = {"c0": 1, "c1": 1}
    assert [_peak_live_layers(res, r, one_layer_chunks) / 2 for r in range(4)] == [4.0, 4.0, 3.5, 2.5]


def test_more_micro_batches_keep_megatrons_warm_up_count():
    par = ParallelConfig(pp=4, global_batch=8, schedule="interleaved", virtual_stages=2)
    warm_up = [2 * (4 - i - 1) + (2 - 1) * 4 for i in range(4)]  # Megatron-LM's num_warmup_microbatches
    assert [micro_batches_in_flight(par, i) for i in range(4)] == [(w + 1) / 2 for w in warm_up]


def test_empty_end_chunks_count_their_own_layers():
    # Stage 0's first chunk is the embedding only, the last stage's last chunk the output layer only
    # (Llama 3's pipeline, section 3.3.2): their activations are the other chunk's alone, at the moments the
    # schedule holds them, not the stage's average chunk times the chunk-forwards in flight.
    layers = [[0, 1], [1, 1], [1, 1], [1, 0]]
    par = ParallelConfig(pp=4, global_batch=8, schedule="interleaved", virtual_stages=2, stage_layers=layers)
    model, train = small_model(layers=6), TrainingSpec(seq_len=128)
    _step, res = run_step(model, par, train, single_server("H100-SXM", 4))
    peaks = [_peak_live_layers(res, r, {f"c{c}": n for c, n in enumerate(layers[r])}) for r in range(4)]
    acts = [memory_per_gpu(model, par, train, stage=r).activations for r in range(3)]
    # stages 1 and 2 hold one layer per chunk: the stage's bytes per layer-micro-batch
    per_layer = acts[1] / peaks[1]
    assert acts[2] / peaks[2] == pytest.approx(per_layer, rel=1e-12)
    assert acts[0] == pytest.approx(peaks[0] * per_layer, rel=1e-12)
    # the averaged count (5.5 chunk-forwards x one layer) would overstate stage 0
    assert peaks[0] < micro_batches_in_flight(par, 0) * 1
