"""Pipeline schedules through the engine (hunt 27).

Truths used: deepseek-ai/DualPipe ``DualPipe._forward_backward_chunk`` posts the receive of the forward's
activation *and* of the backward's gradient, then one ``_commit_and_wait_comm()``, and only then computes the
overlapped pair; :class:`workloads.schedules.PipeAction` documents the same ("inputs are both received before
it starts"), and :func:`workloads.schedules.simulate_unit_times` is the list scheduler of that contract. With
free communication the engine's pipeline must therefore end when the list scheduler says, on uneven stages too.
"""

import re
import sys
from collections import defaultdict
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from test_dualpipe import _run  # noqa: E402
from test_training import uniform_model  # noqa: E402

from workloads.schedules import chain_position, pipeline_schedule, simulate_unit_times  # noqa: E402

_PASS = re.compile(r"^([FBW])(\d+)\.c(\d+)\.")


@pytest.mark.parametrize("p, m, counts", [(6, 22, [1, 3, 2, 2, 3, 4])])  # (stages whose inputs arrive apart)
def test_dualpipe_pairs_wait_for_both_inputs_on_uneven_stages(p, m, counts):
    res = _run(p, m, model=uniform_model(sum(counts)), stage_layers=counts)
    ops = res.ops[res.ops["kind"] != "collective"]
    dur, start, end = defaultdict(float), {}, defaultdict(float)
    recv_end = {}
    for rank, name, kind, s, e, d in zip(ops["rank"], ops["name"], ops["kind"], ops["start_s"], ops["end_s"],
                                         ops["duration_s"]):
        if kind == "recv":
            recv_end[(rank, name.split(".", 1)[1])] = e  # "recv_act.F3.c0" -> "F3.c0"
            continue
        hit = _PASS.match(name)
        if kind != "compute" or not hit:
            continue
        key = (rank, hit.group(1), int(hit.group(2)), int(hit.group(3)))
        dur[key] += d
        start[key] = min(start.get(key, s), s)
        end[key] = max(end[key], e)
    sched = pipeline_schedule("dualpipe", p, m)
    # 1. no pass of a pair starts before both of the pair's inputs have arrived
    for rank, acts in enumerate(sched):
        for i, a in enumerate(acts):
            if not (a.paired and a.phase == "F"):
                continue
            f, b = a, acts[i + 1]
            first = min(start[(rank, x.phase, x.micro_batch, x.chunk)] for x in (f, b))
            inputs = [recv_end[(rank, f"{x.phase}{x.micro_batch}.c{x.chunk}")] for x in (f, b)
                      if (rank, f"{x.phase}{x.micro_batch}.c{x.chunk}") in recv_end]
            assert first >= max(inputs, default=0.0) - 1e-12, (rank, f, b)
    # 2. the pipeline ends when the list scheduler, fed the engine's own pass times, says
    tf, tb, tw = [0.0] * p, [0.0] * p, [0.0] * p
    for rank in range(p):
        for chunk in range(2):
            j = chain_position("dualpipe", p, rank, chunk)
            mine = {(ph, mb): d for (r, ph, mb, c), d in dur.items() if r == rank and c == chunk}
            tf[j] = next(d for (ph, _mb), d in mine.items() if ph == "F")
            split = [mb for (ph, mb) in mine if ph == "W"]
            tw[j] = mine[("W", split[0])]
            tb[j] = mine[("B", split[0])]  # the input gradient alone; a whole backward takes tb + tw
    step, _busy = simulate_unit_times(sched, tf, tb, 0.0, tw, dualpipe=True)
    assert max(end.values()) == pytest.approx(step, rel=1e-6)


def test_a_deadlock_over_many_ranks_is_reported_in_a_bounded_line():
    # Rank 0 issues an all-reduce over 512 ranks that no other rank joins: the report names the first absent
    # ranks, the last and how many, where it listed all 511 (a 5,000-character line).
    from simulator import simulate
    from simulator.engine import DeadlockError
    from topologies import build_cluster
    from workloads.ops import OpGraph

    g = OpGraph(512)
    g.collective_op(0, "all_reduce", tuple(range(512)), 1e6)
    with pytest.raises(DeadlockError) as caught:
        simulate(g, build_cluster({"preset": "dgx-h100", "nodes": 64}))
    message = str(caught.value)
    assert "[1, 2, 3, 4, 5, 6, ..., 511] (511)" in message and len(message) < 400, message
