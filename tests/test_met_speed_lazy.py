"""The metrics a run attaches, computed without pandas, equal the DataFrame code they replace, bit for bit;
the frames are built on first access, and a run that reads only its summary never imports pandas.

The references below are the pandas formulas the numpy code replaced (kept here as the independent truth).
"""

import copy
import math
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

import simulator
from simulator import breakdown, intervals
from simulator.experiment import (
    DEMO_EXPERIMENT,
    FIDELITIES,
    experiment_from_dict,
    expert_load_table,
    pipeline_stages,
    run_experiment,
    stage_rows,
)
from simulator.result import _kahan_sums
from topologies import leaf_spine
from topologies.capacity import BOM_COLUMNS, bill_of_materials, capacity_plan, plan_summary

MOE = {"name": "moe-small", "layers": 2, "hidden": 1024, "heads": 8, "kv_heads": 8, "ffn_hidden": 4096,
       "vocab": 32000, "gated_mlp": True, "tied_embeddings": False, "experts": 8, "top_k": 2,
       "moe_ffn_hidden": 4096, "max_seq_len": 4096}


def _doc(nodes=4, tp=2, pp=2, **par):
    """The demo on ``nodes`` DGX-H100 servers: with ``fidelity: fast`` 8·nodes/pp representatives a stage."""
    d = copy.deepcopy(DEMO_EXPERIMENT)
    d["cluster"]["nodes"] = nodes
    dp = nodes * 8 // (tp * pp)
    d["parallel"].update({"tp": tp, "pp": pp, "dp": dp, "global_batch": 4 * dp * 4, **par})
    return d


@pytest.fixture(scope="module")
def dense():
    return run_experiment(experiment_from_dict(_doc()))


@pytest.fixture(scope="module")
def moe():
    d = {"cluster": {"preset": "dgx-h100", "nodes": 2}, "model": dict(MOE),
         "parallel": {"tp": 1, "pp": 2, "dp": 8, "ep": 8, "micro_batch": 1, "global_batch": 16},
         "training": {"seq_len": 2048}, "moe": {"routing": "zipf", "zipf_s": 1.2, "seed": 3}}
    return run_experiment(experiment_from_dict(d))


# ------------------------------------------------------------------ the old pandas code, as the reference
def old_time_breakdown(ops, window, step_time):
    """``breakdown.time_breakdown`` before: a frame of the partition's sums, then its columns reordered."""
    ranks, seg_rank, start, end, owner, layer_names = breakdown._partition_owners(ops, window, step_time)
    present = sorted(set(np.asarray(layer_names, dtype=object)[np.unique(owner)].tolist()))
    position = {c: i for i, c in enumerate(present)}
    code = np.array([position.get(c, -1) for c in layer_names], dtype=np.int64)[owner]
    names = np.array(present, dtype=object)
    sums = np.bincount(seg_rank * len(names) + code, weights=end - start,
                       minlength=len(ranks) * len(names)).reshape(len(ranks), len(names))
    table = pd.DataFrame(sums, index=pd.Index(ranks, name="rank"), columns=pd.Index(names, name="category"))
    return table[[c for c in breakdown.category_order(table.columns) if c in table.columns]]


def old_pipeline_stages(window, table, stage_of_rank, pp):
    """``experiment.pipeline_stages`` before, from ``result.time_breakdown()`` (with its ``replicas``)."""
    table = table.copy()
    weight = table.pop("replicas").astype(float)
    stage = pd.Series({r: stage_of_rank[r] for r in table.index})
    rows = []
    for s in range(pp):
        sel = stage[stage == s].index
        w = weight[sel]
        mean = (table.loc[sel].mul(w, axis=0).sum() / w.sum()) if len(sel) else table.iloc[:0].sum()
        bubble = float(mean.get("bubble", 0.0))
        rows.append({"stage": s, "ranks": int(w.sum()), "busy_s": window - bubble, "bubble_s": bubble,
                     "bubble_fraction": bubble / window if window else 0.0,
                     **{f"{c}_s": float(v) for c, v in mean.items()}})
    return pd.DataFrame(rows)


def old_stage_summary(stages):
    """The summary's figures of the stages frame, as ``attach_training_metrics`` computed them before."""
    window = stages["busy_s"].iloc[0] + stages["bubble_s"].iloc[0]
    w = stages["ranks"].to_numpy(dtype=float)
    cols = [c for c in stages.columns if c.endswith("_s") and c != "busy_s"]
    return {"bubble_fraction": max(0.0, float(stages["bubble_s"].mean() / window)) if window else 0.0,
            "bubble_fraction_by_stage": [float(x) for x in stages["bubble_fraction"]],
            "time_breakdown_s": {c[:-2]: float((stages[c].to_numpy() * w).sum() / w.sum()) for c in cols}}


# ----------------------------------------------------------------------------------------- the tests
@pytest.mark.parametrize("which", ["dense", "moe"])
def test_stages_breakdown_and_summary_equal_the_dataframe_code(which, request):
    res = request.getfixturevalue(which)
    table = res.time_breakdown()
    expected = old_time_breakdown(res._op_arrays, res.pipeline_window_s, res.step_time)
    pd.testing.assert_frame_equal(table.drop(columns="replicas"), expected, check_exact=True)
    replicas = getattr(res.record.graph, "replicas", None) or {}
    expected.insert(0, "replicas", [len(replicas.get(r, (r,))) for r in expected.index])
    pd.testing.assert_frame_equal(table, expected, check_exact=True)
    stages = old_pipeline_stages(res.pipeline_window_s, table, res.step.stage_of_rank, res.step.parallel.pp)
    pd.testing.assert_frame_equal(res.stages, stages, check_exact=True)
    pd.testing.assert_frame_equal(pipeline_stages(res, res.step), stages, check_exact=True)
    assert res.stages.to_csv() == stages.to_csv()
    for key, value in old_stage_summary(stages).items():
        assert res.summary[key] == value, key


def test_the_stage_means_add_as_pandas_does_on_wide_uneven_tables():
    # Hundreds of ranks per stage, values over 12 decades, unequal weights: numpy's pairwise sums differ
    # from a sequential (strided) sum here, so only the very order pandas used gives equal bits.
    rng = np.random.default_rng(7)
    n, cats = 1500, ["forward", "backward", "exposed_ep", "exposed_tp", "moe_wait", "bubble", "idle"]
    ranks = np.sort(rng.choice(10**6, n, replace=False))
    seconds = rng.random((n, len(cats))) * 10.0 ** rng.integers(-9, 3, (n, len(cats)))
    replicas = rng.integers(1, 9, n)
    stage_of_rank = {int(r): int(s) for r, s in zip(ranks, rng.integers(0, 4, n))}

    class Fake:
        pipeline_window_s = 1.25
        breakdown_window = 1.25

        def time_breakdown_arrays(self):
            return ranks, list(cats), seconds, replicas

    class Step:
        parallel = type("P", (), {"pp": 5})()  # stage 4 has no rank
        stage_of_rank = None

    Step.stage_of_rank = stage_of_rank
    got = pd.DataFrame(stage_rows(Fake(), Step()))
    table = breakdown.breakdown_frame(ranks, cats, seconds)
    table.insert(0, "replicas", replicas)
    want = old_pipeline_stages(Fake.pipeline_window_s, table, stage_of_rank, 5)
    pd.testing.assert_frame_equal(got, want, check_exact=True)
    assert got.iloc[4]["ranks"] == 0 and got.iloc[4]["bubble_s"] == 0.0


def test_frames_are_built_on_first_access_and_can_be_replaced(moe):
    assert "stages" not in moe.__dict__["_deferred"] or moe._stages is None
    pd.testing.assert_frame_equal(moe.expert_load, expert_load_table(moe.step), check_exact=True)
    res = run_experiment(experiment_from_dict(DEMO_EXPERIMENT))
    with pytest.raises(AttributeError, match="expert_load"):
        _ = res.expert_load  # a dense model has none
    assert getattr(res, "expert_load", None) is None
    first = res.stages  # (a copy of the frame built once: 2026-12-04)
    assert res._stage_frame() is res._stage_frame() and res.stages.equals(first) and len(first) == 2
    res.stages = pd.DataFrame({"stage": [0]})
    assert list(res.stages.columns) == ["stage"]
    res.defer("stages", lambda: pd.DataFrame({"x": [1]}))
    assert list(res.stages.columns) == ["x"]
    with pytest.raises(ValueError, match="defer"):
        res.defer("links", pd.DataFrame)
    bare = simulator.simulate(res.record.graph, res.record.fabric.cluster)
    assert bare.stages.empty and bare.stage_records() == []


def test_stage_records_are_the_stage_frame_rows_before_and_after_it_is_built():
    """Kept rows (no frame built yet) and the frame's rows read the same, values, column order and all; a frame
    set or deferred anew replaces the kept rows."""
    res = run_experiment(experiment_from_dict(DEMO_EXPERIMENT))
    kept = res.stage_records()
    assert res._stages is None  # read from the rows: nothing built
    frame = res.stages.to_dict("records")
    assert kept == frame and [list(r) for r in kept] == [list(r) for r in frame] and len(kept) == 2
    assert res.stage_records() == frame  # (now from the frame)
    res.stages = pd.DataFrame({"stage": [0], "x_s": [1.0]})
    assert res.stage_records() == [{"stage": 0, "x_s": 1.0}]
    res.defer("stages", lambda: pd.DataFrame({"stage": [3]}))
    assert res.stage_records() == [{"stage": 3}]
    with pytest.raises(ValueError, match="records are kept for stages only"):
        res.defer("expert_load", pd.DataFrame, records=[])


@pytest.mark.parametrize("which", ["dense", "moe"])
def test_bytes_by_tier_equals_the_links_frame_groupby(which, request):
    res = request.getfixturevalue(which)
    links = res.links
    want = {t: float(v) for t, v in links.groupby("tier")["bytes"].sum().items() if v > 0}
    assert res.bytes_by_tier == want and list(res.bytes_by_tier) == list(want)


def test_kahan_sums_equal_pandas_groupby_sum_bit_for_bit():
    rng = np.random.default_rng(11)
    for trial in range(60):
        n = int(rng.integers(1, 4000))
        values = rng.random(n) * 10.0 ** rng.integers(-4, 16, n)
        if trial % 5 == 0:
            values[rng.integers(0, n, 3)] = np.nan
        if trial % 7 == 0:
            values[rng.integers(0, n)] = np.inf
        labels = np.array(["nvlink", "leaf", "spine", "pcie", "core"])[rng.integers(0, 5, n)]
        want = pd.DataFrame({"tier": labels, "bytes": values}).groupby("tier")["bytes"].sum()
        got = _kahan_sums(labels.tolist(), values.tolist())
        for t, v in want.items():
            assert got.get(t, 0.0) == v or (math.isnan(v) and math.isnan(got[t])), (trial, t)


def test_grouped_cummax_equals_pandas_including_nan_and_negative_zero():
    rng = np.random.default_rng(5)
    for trial in range(100):
        n = int(rng.integers(1, 600))
        group = np.sort(rng.integers(0, int(rng.integers(1, 30)), n))
        values = np.round(rng.random(n) * 3, int(rng.integers(0, 3)))
        if trial % 4 == 1:
            values[rng.integers(0, n, 2)] = np.nan
        if trial % 4 == 2:
            values[values == 0] = -0.0
        want = pd.Series(values).groupby(group).cummax().to_numpy()
        assert intervals.grouped_cummax(group, values).tobytes() == want.tobytes()


def old_grouped_union_length(group, starts, ends, num_groups):
    """``intervals.grouped_union_length`` before: a lexsort per call, pandas' grouped cummax, np.add.at."""
    out = np.zeros(num_groups)
    if len(starts) == 0:
        return out
    order = np.lexsort((starts, group))
    g, s, e = group[order], starts[order], ends[order]
    first = np.empty(len(g), dtype=bool)
    first[0] = True
    first[1:] = g[1:] != g[:-1]
    running = pd.Series(e).groupby(g).cummax().to_numpy()
    new_block = first.copy()
    new_block[1:] |= s[1:] > running[:-1]
    blocks = np.flatnonzero(new_block)
    block_end = np.maximum.reduceat(e, blocks)
    np.add.at(out, g[blocks], block_end - s[blocks])
    return out


def test_union_lengths_of_subsets_equal_the_per_call_sort():
    rng = np.random.default_rng(3)
    for trial in range(40):
        n = int(rng.integers(1, 3000))
        group = rng.integers(0, 50, n)
        starts = np.round(rng.random(n) * 5, int(rng.integers(1, 7)))
        ends = starts + np.round(rng.random(n) * 0.2, int(rng.integers(1, 7)))
        if trial % 10 == 3:
            ends[rng.integers(0, n)] = np.nan
        shared = intervals.GroupedIntervals(group, starts, ends)
        for mask in (None, rng.random(n) < 0.5, rng.random(n) < 0.05, np.zeros(n, dtype=bool)):
            sel = np.ones(n, dtype=bool) if mask is None else mask
            want = old_grouped_union_length(group[sel], starts[sel], ends[sel], 51)
            assert shared.union_length(mask, 51).tobytes() == want.tobytes()


def test_grouped_union_length_is_a_per_group_union():
    # independent truth: intervals.union on each group alone
    rng = np.random.default_rng(2)
    group = rng.integers(0, 6, 300)
    starts = np.round(rng.random(300) * 10, 1)
    ends = starts + np.round(rng.random(300), 1)
    got = intervals.grouped_union_length(group, starts, ends, 7)
    for g in range(7):
        mine = group == g
        assert got[g] == pytest.approx(intervals.length(*intervals.union(starts[mine], ends[mine])), abs=1e-12)
    assert got[6] == 0.0


def test_capacity_summary_equals_the_bill_of_materials_frame():
    cluster = leaf_spine("H100", servers=6, servers_per_leaf=2, spines=2)
    for plan in (None, {"components": {"transceiver-400G": {"power_w": 12.5, "cost_usd": 1000.1}}},
                 {"nic_media": "dac", "switch_media": "aoc"}):
        bom = bill_of_materials(cluster, plan)
        assert list(bom.columns) == list(BOM_COLUMNS)
        fabric, gpus = bom[bom["fabric"]], bom[~bom["fabric"]]
        per_tier = fabric[fabric["item"].str.endswith(" switch")].groupby("tier", sort=False)["count"].sum()
        s = plan_summary(cluster, plan)
        assert s["switches"] == int(per_tier.sum())
        assert s["switches_by_tier"] == {k: int(v) for k, v in per_tier.items()}
        assert s["nics"] == int(fabric.loc[fabric["item"] == "NIC", "count"].sum())
        assert s["cables"] == int(fabric.loc[fabric["item"].isin(["fiber", "aoc cable", "dac cable"]), "count"].sum())
        assert s["transceivers"] == int(fabric.loc[fabric["item"] == "transceiver", "count"].sum())
        assert s["fabric_power_kw"] == float(fabric["power_w"].sum()) / 1e3
        assert s["fabric_cost_usd"] == float(fabric["cost_usd"].sum())
        assert s["gpu_power_kw"] == float(gpus["power_w"].sum()) / 1e3
        assert s["gpu_cost_usd"] == float(gpus["cost_usd"].sum())
        assert capacity_plan(cluster, plan).bom is capacity_plan(cluster, plan).bom  # built once, cached


def test_the_package_attributes_stay_what_they_were():
    import importlib

    module = importlib.import_module("simulator.sweep")
    from simulator.sweeps import sweep

    assert simulator.sweep is sweep and module.sweep is sweep
    from simulator import sweep as again
    assert again is sweep
    assert isinstance(simulator.__version__, str) and simulator.__version__
    assert "sweep" in dir(simulator)
    from simulator import bench, cli
    assert cli._BENCH_OPS == bench.BENCH_OPS and cli._FIDELITIES == FIDELITIES


def _modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys; print(' '.join(sys.modules))"],
                         capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_a_run_that_reads_its_summary_never_imports_pandas():
    loaded = _modules_after("import simulator.cli\nimport simulator.experiment")
    assert "pandas" not in loaded and "simulator.sweeps" not in loaded
    loaded = _modules_after(
        "from simulator.experiment import load_experiment, run_experiment\n"
        "r = run_experiment(load_experiment('examples/demo.yaml'))\n"
        "s = r.summary\nassert s['bubble_fraction'] > 0 and s['fabric_cost_usd'] > 0")
    assert "pandas" not in loaded
    loaded = _modules_after("import contextlib, io\nfrom simulator.cli import main\n"
                            "with contextlib.redirect_stdout(io.StringIO()):\n"
                            "    assert main(['run', 'examples/demo.yaml', '--json']) == 0")
    assert "pandas" not in loaded  # ``clustersim run --json``
    loaded = _modules_after("import contextlib, io\nfrom simulator.cli import main\nout = io.StringIO()\n"
                            "with contextlib.redirect_stdout(out):\n"
                            "    assert main(['run', 'examples/demo.yaml', '--no-progress']) == 0\n"
                            "assert 'where the step went per pipeline stage' in out.getvalue()")
    assert "pandas" not in loaded  # the printed summary, its stage table too (from Result.stage_records)
    loaded = _modules_after("import simulator\nfrom simulator.experiment import load_experiment\n"
                            "exp = load_experiment('examples/demo.yaml')\n"
                            "from workloads.training import training_step\n"
                            "g = training_step(exp.model, exp.parallel, exp.training).graph\n"
                            "assert simulator.simulate(g, exp.cluster).stage_records() == []")
    assert "pandas" not in loaded  # a bare result (a Chakra trace's too) has no stages to print
    loaded = _modules_after(
        "from simulator.experiment import load_experiment, run_experiment\n"
        "r = run_experiment(load_experiment('examples/demo.yaml'))\nassert len(r.stages) == 2")
    assert "pandas" in loaded
