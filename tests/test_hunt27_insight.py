"""Regression tests of the twenty-seventh QA hunt on the insight outputs (time breakdown, timeline), each
against a hand-worked schedule."""

from __future__ import annotations

import pytest

from simulator import simulate
from topologies import single_server
from workloads.ops import OpGraph

MS = 1e-3


def _two_stage(name: str) -> OpGraph:
    """Stage 0 computes 1 ms of micro-batch 0, sends 1 KB to stage 1, which then computes 1 ms of it."""
    g = OpGraph(2)
    a = g.compute(0, name=name, category="fixed", duration_s=MS, micro_batch=0, stage=0)
    g.send(0, 1, 1e3, deps=[a], micro_batch=0, stage=0)
    r = g.recv(1, 0, 1e3, micro_batch=0, stage=1)
    g.compute(1, name=name, category="fixed", duration_s=MS, micro_batch=0, stage=1, deps=[r])
    return g


@pytest.mark.parametrize("name", ["fwd", "attention"])
def test_micro_batch_compute_without_a_phase_letter_is_not_a_bubble(name):
    # By hand: each rank computes 1 ms of micro-batch work in a window of 2 ms + the 1 KB transfer; the other
    # ~1 ms is the bubble. An op of a micro-batch whose name has no F/B/W/R phase letter (a hand-built graph's)
    # was filed as other_compute below the bubble, so the whole window read as bubble (2 ms, 100 %).
    res = simulate(_two_stage(name), single_server("H100", 2))
    table = res.time_breakdown().drop(columns="replicas")
    transfer = res.step_time - 2 * MS
    for rank in (0, 1):
        row = table.loc[rank]
        assert row["other_compute"] == pytest.approx(MS, rel=1e-9)
        assert row["bubble"] == pytest.approx(MS, rel=1e-9)
        assert row["exposed_pp"] == pytest.approx(transfer, rel=1e-6)
        assert row.sum() == pytest.approx(res.step_time, rel=1e-12)
    # the timeline draws that compute once, as the partition does: its main lane adds up to the step
    bars = res.timeline(ranks=[0, 1])
    main = bars[bars["lane"] == "main"]
    for rank in (0, 1):
        mine = main[main["rank"] == rank]
        assert float((mine["end_s"] - mine["start_s"]).sum()) == pytest.approx(res.step_time, rel=1e-12)
        other = mine[mine["category"] == "other_compute"]
        assert float((other["end_s"] - other["start_s"]).sum()) == pytest.approx(MS, rel=1e-9)


def test_named_phases_keep_their_categories():
    # the generators' names (F…): forward, 1 ms per rank, and the same 1 ms bubble
    res = simulate(_two_stage("F0.c0.L0"), single_server("H100", 2))
    table = res.time_breakdown().drop(columns="replicas")
    assert "other_compute" not in table.columns
    assert table["forward"].tolist() == pytest.approx([MS, MS], rel=1e-9)
    assert table["bubble"].tolist() == pytest.approx([MS, MS], rel=1e-9)
