"""What a notebook user passes to a result's tables, plots and trace: a typo, a wrong type or an empty selection is
refused in one line naming the argument and what is valid (never a raw numpy/pandas/matplotlib error, never a
silently empty or all-zero answer), and valid inputs give what they gave before (checked against the result's own
link and traffic data, computed here independently).
"""

from __future__ import annotations

import gzip
import json
import os
import pathlib

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from simulator import plotting, simulate
from simulator.experiment import DEMO_EXPERIMENT, experiment_from_dict, run_experiment
from simulator.timeline import timeline_bars
from simulator.trace import trace_events, write_trace
from simulator.traffic import traffic_matrix
from workloads.ops import OpGraph

matplotlib.use("Agg")  # files only: no display
VALID_TIERS = "valid: nvlink, pcie, leaf, spine, core"


@pytest.fixture(scope="module")
def demo():
    """The demo run: 16 ranks on 2 DGX-H100 nodes, tp/pp/dp (no MoE, so no ``ep`` bytes), no spine."""
    return run_experiment(experiment_from_dict(DEMO_EXPERIMENT))


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def refused(exc_type, fragment, call, *args, **kwargs):
    """``call(*args, **kwargs)`` raises ``exc_type`` with a one-line message containing ``fragment``; return the
    message."""
    with pytest.raises(exc_type) as info:
        call(*args, **kwargs)
    message = str(info.value)
    assert fragment in message, message
    assert "\n" not in message, message
    return message


# ------------------------------------------------------------------------------------------ (a) traffic classes
def independent_matrix(result, classes):
    """The gpu-level matrix from ``result.traffic`` (long form), by hand."""
    n = result.record.graph.world_size
    out = np.zeros((n, n))
    for row in result.traffic.itertuples(index=False):
        if row.traffic_class in classes:
            out[row.src, row.dst] += row.bytes
    return out


def test_unknown_traffic_class_is_refused_naming_the_valid_classes(demo):
    msg = refused(ValueError, "traffic_class: 'xx' unknown; valid: tp, pp, dp, ep, edp, cp, zero, sync",
                  lambda: demo.traffic_matrix("gpu", traffic_class="xx"))
    assert "compute" not in msg  # compute is not traffic
    refused(ValueError, "traffic_class: 'xx' unknown", lambda: demo.traffic_matrix("gpu", traffic_class=["tp", "xx"]))
    refused(ValueError, "traffic_class: 'TP' unknown", lambda: demo.traffic_matrix("node", traffic_class="TP"))
    refused(ValueError, "traffic_class: an empty list selects no traffic; give one or more of tp",
            lambda: demo.traffic_matrix("gpu", traffic_class=[]))
    refused(ValueError, "traffic_class: need a class name or a list of them, got 5",
            lambda: demo.traffic_matrix("gpu", traffic_class=5))
    refused(ValueError, "traffic_class: 5 unknown", lambda: demo.traffic_matrix("gpu", traffic_class=[5]))
    refused(ValueError, "traffic_class: 'xx' unknown", lambda: demo.plot_traffic_matrix("node", traffic_class="xx"))
    refused(ValueError, "level: 'rack' unknown; valid: gpu, node, leaf", lambda: demo.traffic_matrix("rack"))
    refused(ValueError, "level: None unknown; valid: gpu, node, leaf", lambda: demo.traffic_matrix(None))


def test_a_known_class_without_bytes_is_zeros_not_an_error(demo):
    assert "ep" not in demo.bytes_by_class and "edp" not in demo.bytes_by_class
    for cls in ("ep", "edp", "cp", "zero", ["ep", "cp"]):
        m = demo.traffic_matrix("gpu", traffic_class=cls)
        assert m.shape == (16, 16) and not m.to_numpy().any()
    ax = demo.plot_traffic_matrix("node", traffic_class="ep")
    assert ax.get_title().endswith("(none sent in this run)")
    assert "none sent" not in demo.plot_traffic_matrix("node", traffic_class="tp").get_title()


def test_valid_classes_give_the_matrices_they_gave_before(demo):
    for classes in (["tp"], ["pp"], ["dp"], ["tp", "pp"], list(demo.bytes_by_class)):
        arg = classes[0] if len(classes) == 1 else classes
        np.testing.assert_allclose(demo.traffic_matrix("gpu", traffic_class=arg).to_numpy(),
                                   independent_matrix(demo, classes), rtol=1e-12)
    np.testing.assert_allclose(demo.traffic_matrix("gpu").to_numpy(),
                               independent_matrix(demo, set(demo.traffic["traffic_class"])), rtol=1e-12)


def test_a_hand_built_graphs_own_class_names_are_known(node8):
    g = OpGraph(8)
    g.collective("all_reduce", range(8), 8e6, algorithm="ring", traffic_class="mine")
    g.send(0, 1, 0.0, traffic_class="empty_one")  # a class of this run that carried no bytes
    g.recv(1, 0, 0.0, traffic_class="empty_one")
    r = simulate(g, node8)
    assert r.traffic_matrix("gpu", traffic_class="mine").to_numpy().sum() == pytest.approx(
        independent_matrix(r, {"mine"}).sum(), rel=1e-12)
    assert r.traffic_matrix("gpu", traffic_class="mine").to_numpy().sum() > 0
    assert not r.traffic_matrix("gpu", traffic_class="empty_one").to_numpy().any()
    refused(ValueError, "traffic_class: 'mime' unknown; valid: tp, pp, dp, ep, edp, cp, zero, sync, empty_one, mine",
            lambda: r.traffic_matrix("gpu", traffic_class="mime"))


def test_the_module_function_refuses_a_typo_too(demo):
    labels = [f"gpu{i}" for i in range(16)]
    refused(ValueError, "traffic_class: 'xx' unknown", lambda: traffic_matrix(demo.traffic, labels, "xx"))
    assert traffic_matrix(demo.traffic, labels, "tp").to_numpy().sum() == pytest.approx(
        independent_matrix(demo, {"tp"}).sum(), rel=1e-12)


# ------------------------------------------------------------------------------------------ (b), (c) links
def independent_busiest(result, n=None, tier=None):
    """Link ids by bytes carried, most first, ties by id; only links that carried bytes."""
    rows = [(b, i) for i, (b, t) in enumerate(zip(result.links["bytes"], result.links["tier"]))
            if b > 0 and (tier is None or t == tier)]
    rows.sort(key=lambda bi: (-bi[0], bi[1]))
    return [i for _, i in rows][:n]


def test_unknown_tier_is_refused_naming_the_valid_tiers(demo):
    for tier in ("galaxy", "NVLINK", "", 3):
        refused(ValueError, f"tier: {tier!r} unknown; {VALID_TIERS}", demo.busiest_links, 5, tier=tier)
    refused(ValueError, f"tier: 'bogus' unknown; {VALID_TIERS}", lambda: demo.link_timeseries(tier="bogus"))
    refused(ValueError, "tier: 'bogus' unknown", lambda: demo.link_timeseries(links=[0], tier="bogus"))


def test_a_valid_tier_the_cluster_lacks_gives_an_empty_frame(demo):
    assert "spine" not in set(demo.links["tier"])
    empty = demo.busiest_links(5, tier="spine")
    assert empty.empty and list(empty.columns) == list(demo.links.columns)
    assert demo.link_timeseries(tier="spine").empty


def test_counts_must_be_whole_numbers(demo):
    for bad in (-1, 1.5, True, False, "3", None):
        refused(ValueError, f"n: need a whole number >= 0, got {bad!r}", demo.busiest_links, bad)
    refused(ValueError, "top: need a whole number >= 0, got 2.5", lambda: demo.link_timeseries(top=2.5))
    refused(ValueError, "top: need a whole number >= 0, got -2", lambda: demo.link_timeseries(top=-2))
    refused(ValueError, "links: True is not a link id; valid: 0..", lambda: demo.link_timeseries(links=[True]))
    refused(ValueError, "links: 1.0 is not a link id", lambda: demo.link_timeseries(links=[1.0]))
    refused(ValueError, "links: -1 is not a link id", lambda: demo.link_timeseries(links=[-1]))
    refused(ValueError, "links: need a list of link ids", lambda: demo.link_timeseries(links=3))


def test_valid_counts_and_tiers_give_the_same_links_as_before(demo):
    full = demo.busiest_links(len(demo.links))
    assert list(full.index) == independent_busiest(demo)
    for n in (0, 1, 3, np.int64(3), 10**6):
        top = demo.busiest_links(n)
        assert list(top.index) == independent_busiest(demo, int(n))
        pd.testing.assert_frame_equal(top, full.head(int(n)))
    for tier in ("nvlink", "leaf", "pcie"):
        assert list(demo.busiest_links(4, tier=tier).index) == independent_busiest(demo, 4, tier)
    series = demo.link_timeseries(top=3)
    assert sorted(series["link"].unique()) == sorted(independent_busiest(demo, 3))
    assert sorted(demo.link_timeseries(top=np.int64(2), tier="leaf")["link"].unique()) == sorted(
        independent_busiest(demo, 2, "leaf"))
    assert demo.link_timeseries(links=[]).empty  # an explicit empty list of links: an empty frame, as before
    assert demo.link_timeseries(top=0).empty


# ------------------------------------------------------------------------------------------ (d) timeline ranks
def test_timeline_ranks_are_refused_when_empty_out_of_range_or_not_integers(demo):
    refused(ValueError, "ranks: an empty list selects no rank; give at least one (0..15)", lambda: demo.timeline([]))
    refused(ValueError, "ranks: an empty list selects no rank", lambda: demo.plot_timeline(ranks=[]))
    for bad in (True, 16, -1, 0.0, "0"):
        refused(ValueError, f"ranks: {bad!r} is not a rank; valid: 0..15", demo.timeline, [bad])
    refused(ValueError, "ranks: need a list of ranks (0..15), got 3", lambda: demo.timeline(3))
    refused(ValueError, "ranks: need a list of ranks (0..15), got '0,8'", lambda: demo.timeline("0,8"))
    # fast fidelity: rank 1 shows its representative's bars (test_insight); the frame itself has none of rank 1
    refused(ValueError, "ranks: 1 has no ops", lambda: timeline_bars(demo.rep_ops, demo.step_time, [1]))
    refused(ValueError, "ranks: an empty list selects no rank",
            lambda: timeline_bars(demo.rep_ops, demo.step_time, []))
    refused(ValueError, "ranks: an empty list selects no rank", lambda: plotting.plot_timeline(demo.rep_ops, []))
    refused(ValueError, "bars: no timeline bars to draw", lambda: plotting.plot_timeline(demo.timeline().iloc[:0]))


def test_valid_timeline_ranks_give_the_same_bars(demo):
    default = demo.timeline()
    assert sorted(default["rank"].unique()) == [0, 8]  # one per pipeline stage
    pd.testing.assert_frame_equal(demo.timeline([0, 8]), default)
    pd.testing.assert_frame_equal(demo.timeline(np.array([0, 8])), default)
    only8 = demo.timeline([8])
    pd.testing.assert_frame_equal(only8.reset_index(drop=True),
                                  default[default["rank"] == 8].reset_index(drop=True))
    assert len(demo.plot_timeline([0]).get_yticks()) == 1


# ------------------------------------------------------------------------------------------ (e) plots of links
def test_link_heatmap_arguments_are_checked(demo):
    refused(ValueError, "top: need a whole number >= 1, got 0", lambda: demo.plot_link_heatmap(top=0))
    refused(ValueError, "top: need a whole number >= 1, got 2.5", lambda: demo.plot_link_heatmap(top=2.5))
    refused(ValueError, f"tier: 'x' unknown; {VALID_TIERS}", lambda: demo.plot_link_heatmap(tier="x"))
    refused(ValueError, "bins: need a whole number >= 1, got 0", lambda: demo.plot_link_heatmap(bins=0))
    refused(ValueError, "bins: need a whole number >= 1, got -5", lambda: demo.plot_link_heatmap(bins=-5))
    refused(ValueError, "bins: need a whole number >= 1, got 2.5", lambda: demo.plot_link_heatmap(bins=2.5))
    refused(ValueError, "tier: no 'spine' link carried bytes in this run, nothing to draw (tiers that did: leaf, "
            "nvlink, pcie)", lambda: demo.plot_link_heatmap(tier="spine"))
    empty = demo.link_timeseries(links=[])
    refused(ValueError, "series: no links to draw", lambda: plotting.plot_link_heatmap(empty))
    refused(ValueError, "links: no link carried bytes, nothing to draw",
            lambda: plotting.plot_link_utilization(demo.links.iloc[:0]))
    idle = demo.links.assign(bytes=0.0)
    refused(ValueError, "links: no link carried bytes", lambda: plotting.plot_link_utilization(idle))


def test_valid_link_plots_still_draw(demo):
    ax = demo.plot_link_heatmap(top=3, bins=10)
    assert len(ax.get_yticks()) == 3
    assert ax.images[0].get_array().shape == (3, 10)
    ax = demo.plot_link_heatmap(top=np.int64(2), tier="leaf", bins=np.int64(5))
    assert ax.images[0].get_array().shape == (2, 5)
    ax = demo.plot_link_utilization()
    assert [t.get_text() for t in ax.get_xticklabels()] == ["nvlink", "pcie", "leaf"]


# ------------------------------------------------------------------------------------------ (f), (g) traces
def x_pids(path):
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as fh:
        return {e["pid"] for e in json.load(fh)["traceEvents"] if e["ph"] == "X"}


def test_trace_ranks_take_the_clis_forms(demo, tmp_path):
    path = tmp_path / "t.json"
    n_all = demo.to_chrome_trace(str(path), ranks="all", counters=False)
    assert x_pids(path) == set(range(16))
    assert n_all == len(trace_events(demo, list(range(16)), counters=False))  # what the CLI passes for 'all'
    n_stages = demo.to_chrome_trace(str(path), ranks="stages", counters=False)
    assert x_pids(path) == {0, 8}
    assert n_stages == demo.to_chrome_trace(str(path), counters=False)
    assert trace_events(demo, "stages") == trace_events(demo, None) == trace_events(demo, [0, 8])


def test_bad_trace_ranks_are_refused(demo, tmp_path):
    path = str(tmp_path / "t.json")
    refused(ValueError, "trace ranks: 'every' unknown; valid: 'stages', 'all' or a list of ranks in 0..15",
            lambda: demo.to_chrome_trace(path, ranks="every"))
    refused(ValueError, "trace ranks: 'ALL' unknown", lambda: demo.to_chrome_trace(path, ranks="ALL"))
    refused(ValueError, "trace ranks: True is not a rank; valid: 0..15",
            lambda: demo.to_chrome_trace(path, ranks=[True]))
    refused(ValueError, "trace ranks: 99 is not a rank; valid: 0..15", lambda: demo.to_chrome_trace(path, ranks=[99]))
    refused(ValueError, "trace ranks: 1.5 is not a rank", lambda: demo.to_chrome_trace(path, ranks=[1.5]))
    refused(ValueError, "trace ranks: an empty list selects no rank", lambda: demo.to_chrome_trace(path, ranks=[]))
    refused(ValueError, "trace ranks: need a list of ranks (0..15), got 3", lambda: demo.to_chrome_trace(path, 3))
    assert not os.path.exists(path)


def test_trace_path_must_be_a_path(demo, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for bad in (5, True, 0, None, b"t.json", 1.5):
        refused(TypeError, f"path: need a file path (str or os.PathLike), got {type(bad).__name__} {bad!r}",
                write_trace, demo, bad)
        refused(TypeError, "path: need a file path", demo.to_chrome_trace, bad)
    assert os.listdir(tmp_path) == []
    n = write_trace(demo, pathlib.Path("t.json.gz"), counters=False)  # os.PathLike, gzip by suffix
    assert n > 0 and x_pids(tmp_path / "t.json.gz") == {0, 8}
