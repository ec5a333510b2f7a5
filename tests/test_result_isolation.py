"""What a result hands out is the caller's to edit (found by a determinism hunt, seventeenth session): a notebook
that rescales ``result.links`` to GB, or edits a summary dict, must not change what the result's other views
report. And a faults list's order must not renumber links (``topologies/faults.py`` promises the result does not
depend on it)."""

import copy
import itertools

import pytest

from simulator.experiment import DEMO_EXPERIMENT, experiment_from_dict, run_experiment


@pytest.fixture(scope="module")
def result():
    return run_experiment(experiment_from_dict(copy.deepcopy(DEMO_EXPERIMENT)))


def test_editing_the_links_frame_leaves_the_other_views_alone(result):
    table = result.bytes_by_class_and_tier().copy()
    busiest = result.busiest_links(3).copy()
    links = result.links
    links["bytes"] = links["bytes"] / 1e9
    for col in [c for c in links.columns if c.startswith("bytes_")]:
        links[col] = 0.0
    assert result.bytes_by_class_and_tier().equals(table)
    assert result.busiest_links(3).equals(busiest)
    assert result.links is links  # the caller's copy, kept: their edit stays where they made it


def test_editing_dicts_and_frames_handed_out_leaves_the_summary_alone(result):
    summary = copy.deepcopy(result.summary)
    exposed = result.exposed_comm_by_class
    exposed["total"] = -1.0
    exposed.clear()
    handed = result.summary
    for value in handed.values():
        if isinstance(value, dict):
            value.clear()
    result.traffic["bytes"] = -1.0
    assert result.summary == summary
    assert result.exposed_comm_by_class and result.exposed_comm_by_class["total"] == summary["exposed_comm_s"]
    assert (result.traffic_matrix("gpu").to_numpy() >= 0).all()


def test_editing_the_ops_frame_leaves_the_timeline_alone(result):
    bars = result.timeline().copy()
    for frame in (result.ops, result.rep_ops):  # (one frame for a full graph; a fast run's ops are copies)
        frame["start_s"] = -1.0
        frame["end_s"] = -1.0
    assert result.timeline().equals(bars)


def test_the_order_of_the_faults_list_does_not_renumber_links():
    doc = {"cluster": {"preset": "dgx-h100", "nodes": 2, "nodes_per_leaf": 1, "spines": 2},
           "model": {"preset": "gpt2-small", "layers": 4},
           "parallel": {"tp": 2, "pp": 2, "micro_batch": 2, "global_batch": 16},
           "training": {"seq_len": 512}}
    faults = [{"kind": "nic_down", "gpu": g} for g in (9, 10, 11)]  # three NICs of one server: two borrow one
    edges = {tuple(experiment_from_dict({**doc, "faults": list(order)}).cluster.graph.edges)
             for order in itertools.permutations(faults)}
    assert len(edges) == 1


def test_a_repeated_id_is_asked_for_once(result):
    """``links=[l, l]`` gave link ``l``'s series twice (its integral then read twice its bytes); a repeated rank
    doubled a timeline's bars and a trace's events. Ids are taken once each, in the order first given."""
    busiest = result.busiest_links(2).index.tolist()
    one = result.link_timeseries(links=busiest)
    assert result.link_timeseries(links=[busiest[0], *busiest, busiest[1]]).equals(one)
    rank = int(result.timeline()["rank"].iloc[0])
    assert result.timeline([rank, rank]).equals(result.timeline([rank]))
    from simulator.trace import trace_events
    assert trace_events(result, ranks=[rank, rank]) == trace_events(result, ranks=[rank])
