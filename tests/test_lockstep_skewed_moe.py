"""``lockstep`` under skewed MoE routing: one representative per pipeline stage, at its slowest member's load.

The EP ranks of a stage run programs that differ only in their experts' loads, and those experts sit between
the two exchanges that synchronise the members (dispatch and combine, or their gradients). So a member with a
lighter load only finishes its experts sooner and then waits at the combine: one representative issuing for
its whole EP group with the slowest member's experts gives every member's timeline (``Compute.members`` keeps
each member's kernels, for the FLOPs and for the wait of the faster ones). The references here are ``full``
(every rank simulated with its own load) and hand-worked durations.
"""

from __future__ import annotations

import numpy as np
import pytest

from simulator.breakdown import breakdown_arrays
from simulator.compute import ComputeModel, op_durations
from simulator.experiment import experiment_from_dict, run_experiment
from topologies.gpus import get_gpu
from workloads.ops import Kernel, OpGraph, OpGraphError


def _doc(parallel: dict, moe: dict, cluster: dict | None = None, shared: int = 0) -> dict:
    """A 32-GPU, 2-stage tiny Mixtral with 16 experts (as tests/test_fidelity.py's MoE cases)."""
    par = {"tp": 1, "pp": 2, "micro_batch": 1, "schedule": "1f1b", "zero": 1, **parallel}
    par["sequence_parallel"] = par["tp"] > 1
    par["global_batch"] = 4 * par["dp"]
    model = {"preset": "mixtral-8x7b", "layers": 4, "hidden": 512, "ffn_hidden": 1024, "heads": 8, "kv_heads": 8,
             "vocab": 1000, "experts": 16, "shared_experts": shared}
    return {"cluster": {"preset": "dgx-h100", "nodes": 4, "nodes_per_leaf": 2, "spines": 2, **(cluster or {})},
            "model": model, "parallel": par, "training": {"seq_len": 1024}, "moe": moe}


SKEWED = {  # name -> (parallel, moe, cluster)
    "tp2-two-ep-groups": ({"tp": 2, "dp": 8, "ep": 4}, {"routing": "zipf", "seed": 3}, None),
    "ep16-one-group": ({"dp": 16, "ep": 16}, {"routing": "zipf", "zipf_s": 1.0, "seed": 1}, None),
    "deepep": ({"dp": 16, "ep": 16}, {"routing": "zipf", "zipf_s": 1.0, "seed": 1, "dispatch": "deepep"}, None),
    "interleaved": ({"dp": 16, "ep": 8, "schedule": "interleaved", "virtual_stages": 2},
                    {"routing": "zipf", "zipf_s": 1.0}, None),
    "zero3-full-recompute": ({"tp": 2, "dp": 8, "ep": 8, "zero": 3, "recompute": "full"},
                             {"routing": "zipf", "zipf_s": 1.0}, None),
    "oversubscribed": ({"dp": 16, "ep": 8}, {"routing": "zipf", "zipf_s": 1.0},
                       {"nodes_per_leaf": 1, "spines": 1, "oversubscription": 4}),
}


def full_and(fidelity: str, cases: dict) -> dict:
    """name -> (``full``'s result, ``fidelity``'s) of every ``(parallel, moe, cluster)`` of ``cases``."""
    out = {}
    for name, (parallel, moe, cluster) in cases.items():
        exp = experiment_from_dict(_doc(parallel, moe, cluster))
        out[name] = (run_experiment(exp, force=True, fidelity="full"),
                     run_experiment(exp, force=True, fidelity=fidelity))
    return out


def assert_same_traffic(got, full) -> None:
    """``got`` moved what ``full`` moved: the same flows, bytes per class and MoE summary."""
    assert got.summary["flows"] == full.summary["flows"]
    for cls, nbytes in full.bytes_by_class.items():
        assert got.bytes_by_class[cls] == pytest.approx(nbytes, rel=1e-9)
    assert got.summary["moe"] == full.summary["moe"]


@pytest.fixture(scope="module")
def runs() -> dict:
    return full_and("lockstep", SKEWED)


@pytest.mark.parametrize("name", sorted(SKEWED))
def test_one_representative_per_stage_gives_full_step_and_traffic(runs, name):
    full, lockstep = runs[name]
    replicas = lockstep.record.graph.replicas
    parallel = SKEWED[name][0]
    # one per stage block; with TP one per stage and EP index (the dispatcher's all-gather over each member's TP
    # group carries that member's own load, which one collective of a representative's cannot)
    assert len(replicas) == (2 * parallel["ep"] if parallel.get("tp", 1) > 1 else 2)
    assert sum(map(len, replicas.values())) == 32
    # the members synchronise around every load-dependent op; what differs is where a PP send or a DP
    # reduction of a faster replica would have met other flows (measured: at most 4.8e-4 on these configs)
    assert lockstep.step_time == pytest.approx(full.step_time, rel=1e-3)
    assert_same_traffic(lockstep, full)


@pytest.mark.parametrize("name", sorted(SKEWED))
def test_executed_flops_count_every_members_own_load(runs, name):
    # full sums every rank's own expert kernels; the representative's op carries its slowest member's, so
    # counting it for every replica would over-count (+34% on the DeepSeek-style benchmark rung, found here)
    full, lockstep = runs[name]
    assert lockstep.summary["executed_flops_per_step"] == pytest.approx(full.summary["executed_flops_per_step"],
                                                                         rel=1e-12)


@pytest.mark.parametrize("name", sorted(SKEWED))
def test_the_faster_members_wait_is_moe_wait_not_compute(runs, name):
    full, lockstep = runs[name]
    got, want = lockstep.summary["time_breakdown_s"], full.summary["time_breakdown_s"]
    assert want["moe_wait"] > 0
    for category in ("forward", "backward", "moe_wait"):
        assert got.get(category, 0.0) == pytest.approx(want[category], rel=0.01), category
    assert sum(got.values()) == pytest.approx(lockstep.step_time, rel=1e-9)


@pytest.mark.parametrize("parallel, moe, cluster, shared", [
    ({"dp": 16, "ep": 8}, {"routing": "zipf", "zipf_s": 1.0, "shared_expert_overlap": True}, None, 1),
    ({"dp": 16, "ep": 8, "schedule": "dualpipe", "placement": ["tp", "dp", "pp"]},
     {"routing": "zipf", "zipf_s": 1.0, "dispatch": "deepep"}, {"gpus_per_node": 4, "nodes": 8}, 0),
])
def test_work_beside_the_experts_keeps_a_representative_per_ep_index(parallel, moe, cluster, shared):
    # A faster member would start the overlapped shared expert (or DualPipe's other chunk, a W pass) early:
    # at the slowest member's load the step read +2.0% and +1.4% against full, so these keep one rank per
    # EP index (8 per stage), which reads within 3.3e-4.
    exp = experiment_from_dict(_doc(parallel, moe, cluster, shared))
    full = run_experiment(exp, force=True, fidelity="full")
    lockstep = run_experiment(exp, force=True, fidelity="lockstep")
    assert len(lockstep.record.graph.replicas) == 2 * 8
    assert lockstep.step_time == pytest.approx(full.step_time, rel=1e-3)


def test_balanced_routing_carries_no_members():
    exp = experiment_from_dict(_doc({"dp": 16, "ep": 8}, {"routing": "balanced"}))
    step = run_experiment(exp, force=True, fidelity="lockstep")
    assert all(getattr(op, "members", None) is None for op in step.record.graph.ops)
    assert not step.record.member_busy


def _memory_kernel(nbytes: float) -> Kernel:
    return Kernel("elementwise", 0.0, nbytes)


def test_an_op_with_members_takes_the_longest_and_reports_the_mean_share():
    # Memory-bound kernels: each takes nbytes / (HBM bandwidth x memory efficiency) + the per-kernel overhead.
    model = ComputeModel(get_gpu("h100"))
    rate = model.gpu.hbm_bandwidth * model.memory_efficiency
    light, heavy = (_memory_kernel(1e9),), (_memory_kernel(3e9), _memory_kernel(1e9))
    t_light = 1e9 / rate + model.op_overhead_s
    t_heavy = 3e9 / rate + 1e9 / rate + 2 * model.op_overhead_s
    g = OpGraph(2)
    g._compute_parts(0, heavy, "experts", (), "gemm", 0, 0, 0, "compute", (light, heavy))
    g.compute(1, parts=light, name="alone")
    busy: dict[int, float] = {}
    duration = op_durations(g.ops, model, member_busy=busy)
    assert duration[0] == pytest.approx(t_heavy, rel=1e-12)
    assert duration[1] == pytest.approx(t_light, rel=1e-12)
    assert busy == {0: pytest.approx((t_light + t_heavy) / 2 / t_heavy, rel=1e-12)}


def test_members_must_hold_the_ops_parts():
    g = OpGraph(1)
    heavy, light = (_memory_kernel(2e9),), (_memory_kernel(1e9),)
    with pytest.raises(OpGraphError, match="members"):
        g._compute_parts(0, heavy, "experts", (), "gemm", 0, 0, 0, "compute", (light,))
    with pytest.raises(OpGraphError, match="parts must be Kernels"):
        g._compute_parts(0, heavy, "experts", (), "gemm", 0, 0, 0, "compute", (heavy, ("not a kernel",)))


def test_the_breakdown_gives_the_members_wait_at_the_ops_end_to_moe_wait():
    # one rank, one forward op of 10 s whose members wait 4 s of it on average: forward 6, moe_wait 4
    ops = {"rank": [0], "kind": ["compute"], "name": ["F0.experts"], "micro_batch": [0], "stream": ["compute"],
           "traffic_class": ["compute"], "issue_s": [0.0], "start_s": [0.0], "end_s": [10.0],
           "member_wait_s": [4.0]}
    arrays = {k: np.array(v, dtype=object if isinstance(v[0], str) else None) for k, v in ops.items()}
    ranks, categories, seconds = breakdown_arrays(arrays, 10.0, 10.0)
    got = dict(zip(categories, seconds[0].tolist()))
    assert got == {"forward": 6.0, "moe_wait": 4.0}


def test_a_straggler_keeps_a_representative_per_ep_index():
    # A straggler is one EP member, not its whole group: at the slowest member's load and the slowest member's
    # speed (the representative runs at the slowest replica's), a slow light-load rank read +15.6% against full
    # (found in review). With stragglers lockstep keeps one representative per EP index, as before.
    doc = _doc({"dp": 16, "ep": 8}, {"routing": "zipf", "zipf_s": 1.0, "seed": 3})
    doc["faults"] = [{"kind": "straggler", "gpu": 20, "factor": 1.3}]
    exp = experiment_from_dict(doc)
    full = run_experiment(exp, force=True, fidelity="full")
    lockstep = run_experiment(exp, force=True, fidelity="lockstep")
    assert len(lockstep.record.graph.replicas) == 2 * 8
    assert lockstep.step_time == pytest.approx(full.step_time, rel=1e-3)


@pytest.mark.parametrize("name", ["tp2-two-ep-groups", "zero3-full-recompute"])
def test_the_ops_frames_flops_are_the_members_mean(runs, name):
    # Result.ops copies a representative's rows to every rank it stands for: its experts' FLOPs there are the
    # members' mean, so the frame sums to what full executes (the slowest member's: +163% on a ZeRO-2 config)
    full, lockstep = runs[name]
    assert lockstep.ops["flops"].sum() == pytest.approx(full.ops["flops"].sum(), rel=1e-9)

