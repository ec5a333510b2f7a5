"""Time breakdown, timeline, trace, summary header and figures, against independent truths.

* The breakdown partitions each rank's step: its columns sum to the step time.
* With uniform stages and free communication the timeline's bubble bars add
  up to the textbook bubble, ``(p-1)/(m+p-1)`` of the window (GPipe, 1F1B),
  and the bars are laid out as the schedules are defined: GPipe runs every
  forward before any backward (backwards in reverse order, as torchgpipe's
  autograd does), with stage 0's bubble one block of
  ``(p-1)(t_f + t_b)``; 1F1B runs ``p-1-s`` warm-up forwards on stage ``s``
  then alternates (Narayanan et al., SC'21, section 2.2).
* The trace follows the Trace Event Format's required fields per phase type.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from test_training import free_cluster, uniform_model

from simulator.experiment import DEMO_EXPERIMENT, experiment_from_dict, run_experiment


def free_run(schedule: str, p: int, m: int, v: int = 1, recompute: str = "none"):
    doc = {"cluster": free_cluster(p), "model": uniform_model(p * v),
           "parallel": {"pp": p, "dp": 1, "micro_batch": 1, "global_batch": m, "schedule": schedule,
                        "virtual_stages": v, "recompute": recompute},
           "training": {"seq_len": 128}, "network": {"step_latency": 0},
           "options": {"embedding_and_loss": False}}
    return run_experiment(experiment_from_dict(doc))


@pytest.fixture(scope="module")
def demo():
    return run_experiment(experiment_from_dict(DEMO_EXPERIMENT))


MOE = {"name": "moe-small", "layers": 2, "hidden": 1024, "heads": 8, "kv_heads": 8, "ffn_hidden": 4096,
       "vocab": 32000, "gated_mlp": True, "tied_embeddings": False, "experts": 8, "top_k": 2,
       "moe_ffn_hidden": 4096, "max_seq_len": 4096}


def moe_run(routing: dict):
    doc = {"cluster": {"preset": "dgx-h100", "nodes": 1}, "model": dict(MOE),
           "parallel": {"tp": 1, "pp": 2, "dp": 4, "ep": 4, "micro_batch": 1, "global_batch": 8},
           "training": {"seq_len": 2048}, "moe": routing, "options": {"embedding_and_loss": False}}
    return run_experiment(experiment_from_dict(doc))


# ----------------------------------------------------------------- breakdown
@pytest.mark.parametrize("case", ["demo", "recompute", "interleaved", "zero3", "moe"])
def test_breakdown_partitions_every_rank_step(case, demo):
    if case == "demo":
        r = demo
    elif case == "recompute":
        r = free_run("1f1b", 4, 8, recompute="full")
    elif case == "interleaved":
        r = free_run("interleaved", 2, 4, v=2)
    elif case == "zero3":
        doc = {**DEMO_EXPERIMENT, "parallel": {**DEMO_EXPERIMENT["parallel"], "pp": 1, "dp": 8, "zero": 3,
                                               "global_batch": 32}}
        r = run_experiment(experiment_from_dict(doc))
    else:
        r = moe_run({"routing": "zipf", "zipf_s": 1.2})
    table = r.time_breakdown()
    sums = table.drop(columns="replicas").sum(axis=1).to_numpy()
    np.testing.assert_allclose(sums, r.step_time, rtol=1e-9)
    assert (table.drop(columns="replicas").to_numpy() >= 0).all()
    stage_cols = [c for c in r.stages.columns if c.endswith("_s") and c != "busy_s"]
    np.testing.assert_allclose(r.stages[stage_cols].sum(axis=1).to_numpy(), r.step_time, rtol=1e-9)
    assert table["replicas"].sum() == r.record.graph.world_size
    assert sum(r.summary["time_breakdown_s"].values()) == pytest.approx(r.step_time, rel=1e-9)


def test_recompute_is_its_own_category_and_costs_one_forward():
    plain, full = free_run("1f1b", 2, 4), free_run("1f1b", 2, 4, recompute="full")
    assert "recompute_s" not in plain.stages or (plain.stages["recompute_s"] == 0).all()
    # full recomputation re-runs the forward once per micro-batch: the same kernels, the same time
    np.testing.assert_allclose(full.stages["recompute_s"], full.stages["forward_s"], rtol=1e-9)
    bars = full.timeline()
    assert set(bars.loc[bars["category"] == "recompute", "label"]) == {"0", "1", "2", "3"}


def test_moe_imbalance_is_a_wait_not_a_bubble():
    """Skewed routing makes the lightly loaded EP ranks wait in the all-to-all for the heavy ones: that
    time is ``moe_wait``; balanced routing (every EP rank the same tokens) never waits."""
    skewed = moe_run({"routing": "zipf", "zipf_s": 1.5})
    balanced = moe_run({"routing": "balanced"})
    assert balanced.stages.get("moe_wait_s", pd.Series([0.0])).max() == pytest.approx(0.0, abs=1e-12)
    waits = skewed.time_breakdown()["moe_wait"]
    assert waits.min() >= 0 and waits.max() > 0.01 * skewed.step_time


# ------------------------------------------------------------------ timeline
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p, m", [(2, 3), (4, 8)])
def test_timeline_bubble_area_is_the_closed_form(schedule, p, m):
    r = free_run(schedule, p, m)
    bars = r.timeline()
    assert bars["rank"].nunique() == p and list(dict.fromkeys(bars["stage"])) == list(range(p))
    window = r.pipeline_window_s
    bubble = bars[bars["category"] == "bubble"]
    per_stage = (bubble["end_s"] - bubble["start_s"]).groupby(bubble["stage"]).sum()
    np.testing.assert_allclose(per_stage.to_numpy() / window, (p - 1) / (m + p - 1), rtol=1e-6)
    np.testing.assert_allclose(per_stage.to_numpy(), r.stages["bubble_s"].to_numpy(), rtol=1e-9)


def _phase_sequence(bars, stage):
    comp = bars[(bars["stage"] == stage) & bars["category"].isin(["forward", "backward"])]
    return [("F" if c == "forward" else "B") + lab for c, lab in zip(comp["category"], comp["label"])]


def test_gpipe_and_1f1b_timelines_differ_as_the_schedules_do():
    p, m = 4, 8
    gpipe, one_f = free_run("gpipe", p, m).timeline(), free_run("1f1b", p, m).timeline()
    for s in range(p):
        # backwards in reverse micro-batch order, as autograd runs them after a GPipe flush (torchgpipe)
        assert _phase_sequence(gpipe, s) == [f"F{i}" for i in range(m)] + [f"B{i}" for i in reversed(range(m))]
        warm = p - 1 - s
        expected = [f"F{i}" for i in range(warm)]
        for i in range(m - warm):
            expected += [f"F{warm + i}", f"B{i}"]
        expected += [f"B{i}" for i in range(m - warm, m)]
        assert _phase_sequence(one_f, s) == expected
    # GPipe: stage 0 idles once, between its last forward and first backward, for (p-1)(t_f + t_b)
    comp = gpipe[(gpipe["stage"] == 0)]
    tf = float((comp.loc[comp["category"] == "forward", "end_s"] - comp.loc[comp["category"] == "forward",
                                                                             "start_s"]).iloc[0])
    tb = float((comp.loc[comp["category"] == "backward", "end_s"] - comp.loc[comp["category"] == "backward",
                                                                              "start_s"]).iloc[0])
    bubbles = comp[comp["category"] == "bubble"]
    assert len(bubbles) == 1
    assert float(bubbles["end_s"].iloc[0] - bubbles["start_s"].iloc[0]) == pytest.approx((p - 1) * (tf + tb),
                                                                                          rel=1e-6)
    # 1F1B spreads the same bubble over the steady state: more, shorter pieces on stage 0
    assert (one_f[(one_f["stage"] == 0) & (one_f["category"] == "bubble")].shape[0]) >= p - 1


def test_timeline_labels_chunks_of_an_interleaved_schedule():
    bars = free_run("interleaved", 2, 4, v=2).timeline()
    labels = set(bars.loc[bars["category"] == "forward", "label"])
    assert labels == {f"{mb}.{c}" for mb in range(4) for c in range(2)}


def test_timeline_of_a_represented_rank_is_its_representatives(demo):
    # fast fidelity: rank 1 is represented by rank 0, whose bars it shows under its own number (as the trace)
    bars = demo.timeline([1])
    assert set(bars["rank"]) == {1}
    assert bars.drop(columns="rank").equals(demo.timeline([0]).drop(columns="rank"))
    from simulator.timeline import timeline_bars
    with pytest.raises(ValueError, match="ranks: 1 has no ops"):  # the frame itself has none of rank 1
        timeline_bars(demo.rep_ops, demo.step_time, [1])


# --------------------------------------------------------------------- trace
TRACE_REQUIRED = {"X": {"name", "ph", "ts", "dur", "pid", "tid"}, "M": {"name", "ph", "pid", "args"},
                  "C": {"name", "ph", "ts", "pid", "args"}, "s": {"name", "ph", "ts", "pid", "tid", "id"},
                  "f": {"name", "ph", "ts", "pid", "tid", "id"}}


def check_trace_schema(doc: dict) -> dict[str, int]:
    """The Trace Event Format's required fields and types (JSON Object Format), per phase used here."""
    assert isinstance(doc, dict) and isinstance(doc["traceEvents"], list)
    assert doc.get("displayTimeUnit", "ms") in ("ms", "ns")
    counts: dict[str, int] = {}
    starts, finishes = set(), set()
    for e in doc["traceEvents"]:
        ph = e["ph"]
        assert ph in TRACE_REQUIRED, ph
        missing = TRACE_REQUIRED[ph] - set(e)
        assert not missing, (ph, missing)
        assert isinstance(e["pid"], int) and isinstance(e.get("tid", 0), int) and isinstance(e["name"], str)
        if "ts" in e:
            assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0
        if ph == "X":
            assert e["dur"] >= 0
        if ph == "C":
            assert all(isinstance(v, (int, float)) for v in e["args"].values())
        if ph == "s":
            starts.add(e["id"])
        if ph == "f":
            finishes.add(e["id"])
            assert e.get("bp") == "e"
        counts[ph] = counts.get(ph, 0) + 1
    assert starts == finishes  # every flow arrow has both ends
    return counts


def test_trace_schema_default_ranks_flows_and_counters(demo, tmp_path):
    path = tmp_path / "t.json.gz"
    n = demo.to_chrome_trace(str(path))
    with gzip.open(path, "rt") as fh:
        doc = json.load(fh)
    counts = check_trace_schema(doc)
    assert sum(counts.values()) == n
    pids = {e["pid"] for e in doc["traceEvents"] if e["ph"] == "X"}
    assert pids == {0, 8}  # one rank per pipeline stage
    # one arrow per activation and per gradient between the two stages: 2 per micro-batch
    assert counts["s"] == 2 * demo.summary["num_micro_batches"]
    assert counts["C"] > 0
    # the ops of the two ranks, nothing else
    ops = demo.rep_ops
    assert counts["X"] == int(ops["rank"].isin([0, 8]).sum())


def test_trace_of_a_represented_rank_is_its_representatives_events(demo, tmp_path):
    path = tmp_path / "t.json"
    demo.to_chrome_trace(str(path), ranks=[1, 9], counters=False)
    doc = json.loads(path.read_text())
    check_trace_schema(doc)
    x = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert {e["pid"] for e in x} == {1, 9}
    rep = demo.rep_ops
    assert sorted(e["ts"] for e in x if e["pid"] == 1) == pytest.approx(sorted(rep.loc[rep["rank"] == 0,
                                                                                       "start_s"] * 1e6))
    flows = [e for e in doc["traceEvents"] if e["ph"] in "sf"]
    assert {(e["ph"], e["pid"]) for e in flows} == {("s", 1), ("f", 9), ("s", 9), ("f", 1)}
    with pytest.raises(ValueError, match="trace ranks: 99"):
        demo.to_chrome_trace(str(path), ranks=[99])


# ------------------------------------------------------------ summary, plots
def test_summary_header_says_what_was_simulated(demo):
    setup = demo.summary["setup"]
    assert setup["cluster"] == "2 x 8 H100-SXM = 16 GPUs (dgx-h100)"
    assert "leaf_spine" in setup["fabric"] and "non-blocking" in setup["fabric"]
    assert setup["model"].startswith("gpt2-small")
    assert setup["layout"].startswith("TP 2 x PP 2 x DP 4, 1f1b, micro-batch 4 x 4 per pipeline")


def test_save_plots_writes_every_figure(demo, tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    paths = demo.save_plots(str(tmp_path / "figs"))
    names = {p.rsplit("/", 1)[-1] for p in paths}
    # (the demo's 2 servers hang off one leaf: no leaf matrix, which would be one cell)
    assert names == {"timeline.png", "stages.png", "tier_bandwidth.png", "link_heatmap.png", "traffic_node.png",
                     "link_utilization.png", "bytes_by_class_and_tier.png"}
    for p in paths:
        with open(p, "rb") as fh:
            assert fh.read(8) == b"\x89PNG\r\n\x1a\n"


def test_cli_run_writes_plots_and_a_compressed_trace(tmp_path):
    trace, figs = tmp_path / "t.json.gz", tmp_path / "figs"
    out = subprocess.run([sys.executable, "-m", "simulator.cli", "run", "examples/demo.yaml", "--trace", str(trace),
                          "--plots", str(figs), "--trace-ranks", "0,1,8"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "where the step went per pipeline stage" in out.stdout and "layout" in out.stdout
    with gzip.open(trace, "rt") as fh:
        doc = json.load(fh)
    assert {e["pid"] for e in doc["traceEvents"] if e["ph"] == "X"} == {0, 1, 8}
    assert (figs / "timeline.png").exists()
    bad = subprocess.run([sys.executable, "-m", "simulator.cli", "run", "examples/demo.yaml", "--trace-ranks", "x"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--trace-ranks" in bad.stderr
