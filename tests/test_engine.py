"""The engine: streams, dependencies, rendezvous, deadlock detection, records."""

import numpy as np
import pytest

from simulator import DeadlockError, simulate
from simulator.engine import run
from workloads.ops import OpGraph, OpGraphError
from workloads.training import training_step


def test_stream_order_and_cross_rank_dependencies(node8):
    g = OpGraph(2)
    a = g.compute(0, duration_s=1.0, category="fixed", name="a")
    g.compute(0, duration_s=2.0, category="fixed", name="b")               # same stream: after a
    g.compute(0, duration_s=0.5, category="fixed", name="c", stream="other")  # other stream: parallel
    g.compute(1, duration_s=1.0, category="fixed", name="d", deps=[a])     # waits for rank 0's a
    r = simulate(g, node8)
    ops = r.ops.set_index("name")
    assert ops.loc["b", "start_s"] == pytest.approx(1.0)
    assert ops.loc["c", "start_s"] == pytest.approx(0.0)
    assert ops.loc["d", "start_s"] == pytest.approx(1.0)
    assert r.step_time == pytest.approx(3.0)


def test_collective_starts_when_last_member_arrives(node8):
    g = OpGraph(4)
    late = g.compute(3, duration_s=1e-3, category="fixed")
    ids = g.collective("all_reduce", [0, 1, 2, 3], 1e6, deps={3: [late]}, algorithm="ring")
    r = simulate(g, node8)
    starts = r.ops.loc[list(ids.values()), "start_s"]
    issues = r.ops.loc[list(ids.values()), "issue_s"]
    assert list(starts) == pytest.approx([1e-3] * 4)
    assert issues.loc[ids[0]] == 0.0
    assert r.ops.loc[list(ids.values()), "end_s"].nunique() == 1


def test_step_time_at_least_critical_path_of_compute(two_leaves):
    g = OpGraph(16)
    prev = {}
    for _layer in range(3):
        for r in range(16):
            prev[r] = g.compute(r, flops=1e12 * (1 + r % 3), deps=[prev[r]] if r in prev else [])
        ids = g.collective("all_reduce", list(range(16)), 5e7, deps={r: [prev[r]] for r in range(16)})
        prev = dict(ids)
    res = simulate(g, two_leaves)
    compute = res.ops[res.ops.kind == "compute"].groupby("rank")["duration_s"].sum()
    assert res.step_time >= compute.max()


def test_mismatched_send_recv_is_reported_before_running(node8):
    g = OpGraph(2)
    g.recv(1, peer=0, nbytes=100)
    with pytest.raises(DeadlockError, match=r"rank 1 .*recv.* no matching send"):
        run(g, node8)


def test_collective_a_member_never_joins(node8):
    g = OpGraph(3)
    g.collective_op(0, "all_reduce", [0, 1, 2], 10)
    g.collective_op(1, "all_reduce", [0, 1, 2], 10)
    with pytest.raises(DeadlockError, match=r"never joined by rank\(s\) \[2\]"):
        run(g, node8)


def test_cyclic_wait_across_ranks_is_detected(node8):
    # Each rank receives before it sends: the classic head-to-head deadlock.
    g = OpGraph(2)
    r0 = g.recv(0, peer=1, nbytes=10)
    r1 = g.recv(1, peer=0, nbytes=10)
    g.send(0, peer=1, nbytes=10, deps=[r0])
    g.send(1, peer=0, nbytes=10, deps=[r1])
    with pytest.raises(DeadlockError, match="can never finish"):
        run(g, node8)


def test_mismatched_collective_sizes_are_an_error(node8):
    g = OpGraph(2)
    g.collective_op(0, "all_reduce", [0, 1], 10)
    g.collective_op(1, "all_reduce", [0, 1], 20)
    with pytest.raises(OpGraphError, match="does not match"):
        run(g, node8)


def test_bad_graph_input_is_rejected_with_the_field():
    g = OpGraph(2)
    with pytest.raises(OpGraphError, match="peer"):
        g.send(0, peer=5, nbytes=1)
    with pytest.raises(OpGraphError, match="deps"):
        g.compute(0, deps=[42])
    with pytest.raises(OpGraphError, match="collective"):
        g.collective("all_sum", [0, 1], 1)
    with pytest.raises(OpGraphError, match="nbytes"):
        g.collective("all_reduce", [0, 1], -1)


def test_same_inputs_same_results(two_leaves):
    def build():
        g = OpGraph(32)
        for k in range(4):
            g.collective("all_to_all", list(range(k, 32, 4)), 1e8 * (k + 1))
        g.collective("all_reduce", list(range(32)), 3e8)
        return g
    a, b = simulate(build(), two_leaves), simulate(build(), two_leaves)
    assert a.step_time == b.step_time
    assert (a.links["bytes"].to_numpy() == b.links["bytes"].to_numpy()).all()


def test_results_break_bytes_down_by_class_and_tier(two_leaves):
    g = OpGraph(32)
    g.collective("all_reduce", list(range(8)), 1e8, traffic_class="tp", algorithm="ring")
    g.collective("all_reduce", [0, 8, 16, 24], 1e8, traffic_class="dp", algorithm="ring")
    r = simulate(g, two_leaves)
    # Ring payload: every member sends 2(n-1)/n·S.
    assert r.bytes_by_class["tp"] == pytest.approx(8 * 2 * 7 / 8 * 1e8)
    assert r.bytes_by_class["dp"] == pytest.approx(4 * 2 * 3 / 4 * 1e8)
    table = r.bytes_by_class_and_tier()
    assert table.loc["tp", "nvlink"] > 0 and table.loc["tp"].drop("nvlink").sum() == 0
    assert table.loc["dp", "leaf"] > 0 and table.loc["dp", "spine"] > 0
    # TP: each of the 8 ring hops crosses two NVLink edges.
    assert table.loc["tp", "nvlink"] == pytest.approx(2 * 8 * 2 * 7 / 8 * 1e8)


def test_chrome_trace_is_valid_json(tmp_path, node8):
    import json
    g = OpGraph(2)
    g.compute(0, flops=1e12)
    g.collective("all_reduce", [0, 1], 1e6)
    r = simulate(g, node8)
    path = tmp_path / "t.json"
    r.to_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    assert sum(e["ph"] == "X" for e in events) == 3


def test_lanes_tile_a_replica_block_by_rows_and_by_columns():
    from simulator.engine import lanes
    block = (10, 11, 12, 13, 14, 15)  # 3 DP replicas x 2 TP ranks, DP-major
    assert lanes((10, 11), block) == [(10, 11), (12, 13), (14, 15)]        # a TP group: rows
    assert lanes((10, 12, 14), block) == [(10, 12, 14), (11, 13, 15)]      # a DP group: columns
    assert lanes((12, 10, 14), block) == [(12, 10, 14), (13, 11, 15)]      # member order is kept
    with pytest.raises(OpGraphError, match="does not tile"):
        lanes((10, 11, 12, 13), block)


def test_a_group_that_is_part_of_one_replica_set_runs_once_per_lane(node8):
    # Rank 0 stands for ranks 0-7 as 2 DP replicas x 4 TP ranks; its TP all-reduce over (0..3) must also
    # run over (4..7): the same bytes on the network as the full graph's two all-reduces.
    full = OpGraph(8)
    for grp in [(0, 1, 2, 3), (4, 5, 6, 7)]:
        for r in grp:
            full.collective_op(r, "all_reduce", grp, 2**26)
    reps = OpGraph(8)
    reps.replicas = {0: tuple(range(8))}
    reps.collective_op(0, "all_reduce", (0, 1, 2, 3), 2**26)
    a, b = run(full, node8), run(reps, node8)
    assert b.step_time_s == pytest.approx(a.step_time_s, rel=1e-12)
    assert b.fabric.network.ledger.bytes.sum() == pytest.approx(a.fabric.network.ledger.bytes.sum(), rel=1e-12)


def test_compute_ends_due_together_share_one_event(node8):
    """Four ranks leave an all-reduce at one instant and each runs 1 ms of compute: their four ends are due at
    the same time and scheduled back to back, so one SimPy event ends them all (three fewer events than one
    per end); the times are the hand-worked ones either way."""
    from simulator.engine import Engine

    def record(share: bool):
        g = OpGraph(4)
        ids = g.collective("all_reduce", [0, 1, 2, 3], 1e6, algorithm="ring")
        for r in range(4):
            g.compute(r, duration_s=1e-3, category="fixed", name=f"after{r}", deps=[ids[r]])
        engine = Engine(g, node8)
        engine.share_compute_ends = share
        return engine.run()

    shared, apart = record(True), record(False)
    done = apart.end_s[0]
    assert list(apart.end_s[4:]) == [done + 1e-3] * 4
    assert list(shared.end_s) == list(apart.end_s) and list(shared.start_s) == list(apart.start_s)
    assert shared.events == apart.events - 3


def _moe_pipeline_doc() -> dict:
    """A skewed MoE step across two servers: pipeline sends, alltoallv whose members' expert kernels differ
    in length, DP gradient reductions, TP collectives."""
    model = {"name": "moe", "layers": 4, "hidden": 1024, "heads": 8, "kv_heads": 8, "ffn_hidden": 4096,
             "vocab": 32000, "gated_mlp": True, "tied_embeddings": False, "experts": 8, "top_k": 2,
             "moe_ffn_hidden": 1024}
    return {"cluster": {"preset": "dgx-h100", "nodes": 2}, "model": model,
            "parallel": {"tp": 2, "pp": 2, "dp": 4, "ep": 4, "micro_batch": 1, "global_batch": 16,
                         "sequence_parallel": True},
            "training": {"seq_len": 1024}, "moe": {"routing": "zipf", "zipf_s": 1.0, "seed": 3}}


@pytest.mark.parametrize("representatives, schedule", [(None, "1f1b"), ("tp", "1f1b"), ("stage", "dualpipe"),
                                                       ("tp", "dualpipe")])
def test_shared_compute_ends_change_nothing_but_the_event_count(representatives, schedule):
    # The reference is the engine with one event per compute end: every op's issue, start and end time, the
    # step and the bytes on every link must be bit-identical, with fewer (never more) events. (One rank per TP
    # group, as fast emitted before it stood one rank for a whole EP group: that graph has no ends to share.)
    from simulator.engine import Engine
    from simulator.experiment import experiment_from_dict

    doc = _moe_pipeline_doc()
    doc["parallel"]["schedule"] = schedule
    exp = experiment_from_dict(doc)
    step = training_step(exp.model, exp.parallel, exp.training, exp.options, exp.routing,
                         representatives=representatives)
    records = []
    for share in (False, True):
        engine = Engine(step.graph, exp.cluster, exp.compute_model(), exp.network)
        engine.share_compute_ends = share
        records.append(engine.run())
    apart, shared = records
    for column in ("issue_s", "start_s", "end_s"):
        assert np.array_equal(getattr(shared, column), getattr(apart, column), equal_nan=True), column
    assert shared.step_time_s == apart.step_time_s
    assert np.array_equal(shared.fabric.network.ledger.bytes, apart.fabric.network.ledger.bytes)
    assert shared.events < apart.events
