"""Regression tests of the twenty-seventh QA hunt (silently wrong numbers), each against an independent truth:
a hand-worked schedule or a closed form, never the simulator's own output of the same quantity."""

from __future__ import annotations

import pytest

from simulator import simulate
from topologies import single_server
from workloads.ops import OpGraph, merge_graphs


def _step_with_tail() -> OpGraph:
    """One 'training step' per rank: 1 ms of compute, then 2 ms of work on another stream that depends on it
    and that nothing in the step waits for (a ZeRO-1 parameter all-gather after the optimizer, say)."""
    g = OpGraph(2)
    for r in range(2):
        a = g.compute(r, name="fwd_bwd_opt", duration_s=1e-3, category="fixed")
        g.compute(r, name="param_gather", duration_s=2e-3, category="fixed", stream="aux", deps=[a])
    return g


def test_consecutive_steps_do_not_overlap_on_a_rank():
    # By hand: one step ends at 1 + 2 = 3 ms. The second step may start on a GPU only once the first has ended
    # there (its forward reads the gathered parameters): 6 ms for two, 9 ms for three. Stream order alone let the
    # second step's compute start at 1 ms, beside the first step's tail (two steps in 5 ms, 3 per 2.5 ms).
    cluster = single_server("H100", 2)
    one = _step_with_tail()
    assert simulate(one, cluster).step_time == pytest.approx(3e-3, rel=1e-12)
    assert simulate(merge_graphs([(one, 0)] * 2), cluster).step_time == pytest.approx(6e-3, rel=1e-12)
    assert simulate(merge_graphs([(one, 0)] * 3), cluster).step_time == pytest.approx(9e-3, rel=1e-12)


def test_side_by_side_parts_still_run_concurrently():
    # Parts on disjoint ranks (jobs) are independent: two copies at offsets 0 and 2 end together at 3 ms.
    cluster = single_server("H100", 4)
    one = _step_with_tail()
    assert simulate(merge_graphs([(one, 0), (one, 2)]), cluster).step_time == pytest.approx(3e-3, rel=1e-12)


def test_jobs_multi_step_time_is_per_step():
    # A DP-only ZeRO-1 job run for 3 steps alone: every step is the same step (one DP stage: no pipeline skew to
    # carry over), so the per-step time is one step's. Before the fix the next step's forward ran beside the
    # previous step's parameter all-gather and the per-step time read ~5% short.
    from simulator.experiment import run_experiment
    from simulator.jobs import jobs_from_dict, run_jobs

    model = {"preset": "llama3-8b", "layers": 2, "hidden": 1024, "heads": 8, "kv_heads": 8, "ffn_hidden": 3584,
             "vocab": 32000}
    doc = {"cluster": {"preset": "dgx-h100", "nodes": 2, "nodes_per_leaf": 1},
           "steps": 3,
           "jobs": [{"name": "a", "nodes": 1, "model": model,
                     "parallel": {"tp": 1, "pp": 1, "zero": 1, "micro_batch": 1, "global_batch": 8},
                     "training": {"seq_len": 1024}}]}
    spec = jobs_from_dict(doc)
    one = run_experiment(spec.jobs[0].experiment, force=True).step_time
    row = run_jobs(spec, force=True).jobs.iloc[0]
    assert row["alone_step_time_s"] == pytest.approx(one, rel=1e-9)
    assert row["step_time_s"] == pytest.approx(one, rel=1e-9)


def test_every_stream_of_the_next_step_waits_for_the_whole_previous_step():
    # By hand: a step of two independent streams on each rank, 3 ms on one and 1 ms on the other. The next step
    # begins on a GPU once the previous has ended there: every op of the second copy starts at 3 ms, the short
    # stream's too (stream order alone would start it at 1 ms; the first op of the rank alone waiting would miss
    # the other stream's).
    g = OpGraph(2)
    for r in range(2):
        g.compute(r, name="long", duration_s=3e-3, category="fixed")
        g.compute(r, name="short", duration_s=1e-3, category="fixed", stream="aux")
    result = simulate(merge_graphs([(g, 0)] * 2), single_server("H100", 2))
    second = result.ops[result.ops["id"] >= len(g.ops)]
    assert len(second) == len(g.ops)
    assert (second["start_s"] >= 3e-3 - 1e-15).all(), second[["name", "start_s"]]
    assert result.step_time == pytest.approx(6e-3, rel=1e-12)
