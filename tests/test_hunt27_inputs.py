"""Defects found by the twenty-seventh hunt (bad inputs), each with the test that fails on the old code."""

from __future__ import annotations

import pytest

from simulator.cli import main


def _chakra_trace(tmp_path):
    """A two-rank Chakra trace (one GEMM, one all-reduce per rank), written with test_chakra's helpers."""
    import test_chakra as tc  # (tests/ is on the path under pytest)

    programs = [[tc.node(0, tc.COMP, "gemm", duration_us=10), tc.coll(1, tc.ALL_REDUCE, 1 << 20, deps=[0], name="ar")]
                for _ in range(2)]
    return tc.write_trace(tmp_path / "trace", programs)


@pytest.mark.parametrize("suffix", [".graphml", ".YAML"])
def test_run_chakra_cluster_reads_a_graphml_or_upper_case_file(tmp_path, capsys, suffix):
    """``run --chakra DIR --cluster FILE``: a GraphML topology (which topology, plan and collective take) or a
    ``.YAML`` file was read as a preset name: 'cluster.preset: unknown preset '/path/x.graphml''."""
    folder = _chakra_trace(tmp_path)
    topo = tmp_path / f"fabric{suffix}"
    assert main(["topology", "dgx-h100:1", "-o", str(topo)]) == 0
    capsys.readouterr()
    assert main(["run", "--chakra", str(folder), "--cluster", str(topo), "--no-progress", "--json"]) == 0
    assert "unknown preset" not in capsys.readouterr().err


def test_run_chakra_cluster_file_is_checked_like_every_commands(tmp_path, capsys):
    """``run --chakra DIR --cluster FILE.yaml``: a misspelled section of FILE was ignored without a word, and its
    ``faults:`` section silently not applied; collective and topology refuse the one and note the other."""
    folder = _chakra_trace(tmp_path)
    typo = tmp_path / "typo.yaml"
    typo.write_text("clusterr: {preset: dgx-h100}\ncluster: dgx-h100:1\n")
    assert main(["run", "--chakra", str(folder), "--cluster", str(typo), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("clustersim: error: --cluster: ") and "clusterr: unknown section" in err, err
    assert len(err.splitlines()) == 1
    faulty = tmp_path / "faulty.yaml"
    faulty.write_text("cluster: dgx-h100:1\nfaults:\n  - {kind: straggler, gpu: 0, factor: 5}\n")
    assert main(["run", "--chakra", str(folder), "--cluster", str(faulty), "--no-progress", "--json"]) == 0
    assert "faults: section is not applied here" in capsys.readouterr().err


TINY = ("cluster: dgx-h100:1\nmodel: tiny\nparallel: {tp: 2, pp: 1, micro_batch: 1, global_batch: 8}\n"
        "training: {seq_len: 128}\n")


@pytest.mark.parametrize("argv", [
    ["run", "{f}", "--no-progress", "--json", "--trace", "{name}"],
    ["demo", "--json", "--trace", "{name}"],
    ["plan", "dgx-h100:1", "--json", "--csv", "{name}"],
    ["topology", "dgx-h100:1", "-o", "{name}"],
])
@pytest.mark.parametrize("name", ["", "  "])
def test_a_blank_output_file_name_is_refused(tmp_path, monkeypatch, capsys, argv, name):
    """``--trace ''`` / ``--csv ''`` were taken as not given (no trace, no CSV, exit 0, not a word), and
    ``--trace '  '`` / ``--csv ' '`` wrote a file named by spaces into the current folder; ``--plots ''`` and
    ``--export-chakra ''`` were refused already."""
    f = tmp_path / "tiny.yaml"
    f.write_text(TINY)
    monkeypatch.chdir(tmp_path)
    assert main([a.format(f=f, name=name) for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("clustersim: error: ") and "needs a file name" in err and len(err.splitlines()) == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.yaml"]


@pytest.mark.parametrize("attr, owner, value", [("server", "node 'gpu:0:1'", "abc"), ("rank", "node 'gpu:0:1'", "1.5"),
                                                ("gpus_per_server", "graph", "eight")])
def test_graphml_text_in_an_integer_attribute_is_explained(tmp_path, capsys, attr, owner, value):
    """Text in a GraphML attribute declared ``long`` (server, rank, gpus_per_server) was the bare 'malformed
    GraphML: invalid literal for int() with base 10: 'abc'', naming neither the attribute nor the element (text in
    a ``double`` had the hint already); both are named now."""
    import re

    path = tmp_path / "fabric.graphml"
    assert main(["topology", "dgx-h100:1", "-o", str(path)]) == 0
    capsys.readouterr()
    text = path.read_text()
    key = re.search(rf'<key id="(\w+)" for="(?:node|graph)" attr.name="{attr}" attr.type="long"', text).group(1)
    anchor = text.index('<node id="gpu:0:1">') if owner != "graph" else 0
    head, tail = text[:anchor], text[anchor:]
    path.write_text(head + re.sub(rf'(<data key="{key}">)[^<]+', rf"\g<1>{value}", tail, count=1))
    assert main(["topology", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.endswith(f"holds text here: {owner} {attr} '{value}' (declared long)"), err


def test_a_collective_over_many_ranks_is_built_in_linear_time():
    """``OpGraph.collective`` checked every member's rank against the group by hashing and scanning the whole
    tuple: O(n) per member, O(n^2) in all. ``clustersim collective --op all_to_all --gpus 262144`` (a --gpus the
    command accepts) ran for minutes building the graph (65,536 ranks: ~30 s) before its one-line refusal
    (at most 8,192 ranks per all_to_all) was reached; it comes in seconds now."""
    from workloads.ops import OpGraph, OpGraphError

    class CountingSet(set):
        """The graph's set of checked groups, counting the lookups (each hashes and compares the whole group)."""
        lookups = 0

        def __contains__(self, item):
            CountingSet.lookups += 1
            return super().__contains__(item)

    n = 65536  # (~0.2 s to build now, ~30 s before; not timed here: the lookups are counted)
    graph = OpGraph(n)
    graph._valid_groups = CountingSet()
    ids = graph.collective("all_reduce", range(n), 2**20, traffic_class="bench")
    assert CountingSet.lookups <= 1  # one check of the group for all its members' ops, not one per member
    assert len(ids) == n and graph.ops[ids[n - 1]].group == tuple(range(n))
    big = tuple(range(100, 200))  # a group checked once, then a rank outside it: still refused
    graph.collective_op(100, "all_reduce", big, 1.0)
    with pytest.raises(OpGraphError, match="rank 5 issues a collective on a group it is not in"):
        graph.collective_op(5, "all_reduce", big, 1.0)
