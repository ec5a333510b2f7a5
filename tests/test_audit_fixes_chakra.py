"""Audit fixes of the Chakra paths: bad input ends in one line and exit 2, never a traceback or a partial trace."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

from simulator.cli import main
from workloads.chakra import ChakraError, read_chakra, schema, write_chakra
from workloads.ops import OpGraph

TINY_YAML = """\
cluster: {preset: dgx-h100, nodes: 1}
model: {preset: tiny}
parallel: {tp: 2, pp: 1, dp: 4, micro_batch: 1, global_batch: 8}
training: {seq_len: 128}
"""


def one_line(err: str) -> str:
    assert "Traceback" not in err
    assert err.startswith("clustersim: error: ") and err.count("\n") == 1, err
    return err


@pytest.fixture
def no_protobuf(monkeypatch):
    """What a bare install looks like: no ``google`` package, so find_spec('google.protobuf') raises."""
    real = importlib.util.find_spec

    def find_spec(name, *a):
        if name == "google" or name.startswith("google."):
            raise ModuleNotFoundError(f"No module named {name.split('.')[0]!r}", name="google")
        return real(name, *a)
    monkeypatch.setattr(schema, "_CLASSES", None)
    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def test_without_google_package_the_reader_and_writer_say_what_to_install(tmp_path, no_protobuf):
    for call in (lambda: read_chakra(tmp_path), lambda: write_chakra(OpGraph(1), tmp_path)):
        with pytest.raises(ChakraError, match=r"pip install '\.\[chakra\]' in the checkout"):
            call()


@pytest.mark.parametrize("argv", [["run", "{yaml}", "--export-chakra", "{out}"], ["run", "--chakra", "{out}"]])
def test_cli_without_protobuf_exits_2_before_simulating(tmp_path, capsys, monkeypatch, no_protobuf, argv):
    from simulator import experiment

    def no_simulation(*a, **k):
        raise AssertionError("simulated before checking for protobuf")
    monkeypatch.setattr(experiment, "run_experiment", no_simulation)
    yaml = tmp_path / "ok.yaml"
    yaml.write_text(TINY_YAML)
    out = tmp_path / "out"
    out.mkdir()
    assert main([a.format(yaml=yaml, out=out) for a in argv]) == 2
    assert "pip install '.[chakra]' in the checkout" in one_line(capsys.readouterr().err)
    assert list(Path(out).iterdir()) == []


# ------------------------------------------------ values a trace cannot hold; partial traces
def _two_ranks(flops: float = 1e12) -> OpGraph:
    g = OpGraph(2)
    a = g.compute(0, flops=1e12, name="fwd0")
    g.compute(1, flops=flops, name="fwd1")
    g.send(0, peer=1, nbytes=1e6, deps=[a])
    g.recv(1, peer=0, nbytes=1e6)
    return g


def test_write_refuses_a_value_beyond_the_chakra_field_and_writes_nothing(tmp_path):
    with pytest.raises(ChakraError) as exc:
        write_chakra(_two_ranks(flops=1e300), tmp_path / "out")
    msg = str(exc.value)
    assert "\n" not in msg and "rank 1" in msg and "'fwd1'" in msg and "flops" in msg and "num_ops" in msg, msg
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []


def test_a_failure_while_writing_leaves_no_file(tmp_path):
    class Model:  # rank 0's ops are written before rank 1's duration fails
        def duration(self, op):
            return math.inf if op.rank == 1 else 1e-3
    with pytest.raises(ChakraError, match=r"rank 1 op \d+ 'fwd1': duration .*finite non-negative"):
        write_chakra(_two_ranks(flops=2e12), tmp_path, compute=Model())
    assert list(tmp_path.iterdir()) == []


def test_an_incomplete_trace_is_refused_naming_the_missing_files(tmp_path, capsys):
    write_chakra(_two_ranks(), tmp_path)
    (tmp_path / "clustersim.1.et").unlink()
    with pytest.raises(ChakraError, match=r"2 ranks but the folder holds 1 rank file.*clustersim\.1\.et"):
        read_chakra(tmp_path)
    assert main(["run", "--chakra", str(tmp_path)]) == 2
    assert "world_size" in one_line(capsys.readouterr().err)


def test_a_rank_file_of_another_rank_is_refused(tmp_path):
    write_chakra(_two_ranks(), tmp_path)
    (tmp_path / "clustersim.1.et").write_bytes((tmp_path / "clustersim.0.et").read_bytes())
    with pytest.raises(ChakraError, match="rank 0's program, not rank 1's"):
        read_chakra(tmp_path)


@pytest.mark.parametrize("value", [math.nan, math.inf, -1.0])
def test_reader_refuses_non_finite_or_negative_values_naming_the_node(tmp_path, value):
    from test_chakra import COMP, node, write_trace
    write_trace(tmp_path, [[node(0, COMP, "bad-gemm", num_ops=("double", value))]])
    with pytest.raises(ChakraError) as exc:
        read_chakra(tmp_path)
    msg = str(exc.value)
    assert "node 0 ('bad-gemm')" in msg and "num_ops" in msg and "finite non-negative" in msg, msg


@pytest.mark.parametrize("attr,kind,value", [("clustersim.duration_s", "double", math.inf),
                                             ("clustersim.flops", "double", math.nan)])
def test_reader_refuses_non_finite_clustersim_attributes(tmp_path, attr, kind, value):
    from test_chakra import COMP, A, node
    meta = schema.classes()["GlobalMetadata"](version="0.0.4")
    meta.attr.extend([A("clustersim.format", "int64", 1), A("clustersim.world_size", "int64", 1),
                      A("clustersim.rank", "int64", 0)])
    n = node(0, COMP, "k", **{"clustersim.op": ("int64", 0), attr: (kind, value)})
    (tmp_path / "t.0.et").write_bytes(schema.encode_messages([meta, n]))
    with pytest.raises(ChakraError, match=rf"node 0 \('k'\): attribute '{attr}' must be a finite non-negative"):
        read_chakra(tmp_path)


def test_a_trace_run_notes_each_section_of_the_file_it_does_not_read(tmp_path, capsys):
    # `run FILE --chakra DIR` takes the file's cluster, network, compute, faults and training.dtype; its model,
    # layout and the rest of training were dropped without a word (the README promises a note for every
    # setting without effect), and the summary was headed by the file's name, which describes its model.
    write_chakra(_two_ranks(), tmp_path / "et")
    yaml = tmp_path / "f.yaml"
    yaml.write_text("name: my model run\n" + TINY_YAML.replace("training: {seq_len: 128}",
                                                                "training: {seq_len: 128, dtype: fp16}"))
    assert main(["run", str(yaml), "--chakra", str(tmp_path / "et"), "--json"]) == 0
    captured = capsys.readouterr()
    noted = [line.split("note: ")[1].split(":")[0] for line in captured.err.splitlines() if "note: " in line]
    assert noted == ["model", "parallel", "training.seq_len"]
    assert "my model run" not in captured.out and "Chakra trace" in captured.out


def test_a_straggler_outside_the_traces_ranks_is_noted_not_an_error(tmp_path, capsys):
    # The trace has 2 ranks on a 16-GPU cluster; a straggler on GPU 9 slows nobody (the engine now refuses a
    # slowdown naming a rank its graph does not have, so the trace run drops it, with a note).
    write_chakra(_two_ranks(), tmp_path / "et")
    yaml = tmp_path / "f.yaml"
    yaml.write_text("cluster: {preset: dgx-h100, nodes: 2}\nfaults: [{kind: straggler, gpu: 9, factor: 2}]\n")
    assert main(["run", str(yaml), "--chakra", str(tmp_path / "et"), "--json"]) == 0
    assert "straggler on GPU 9 has no effect" in capsys.readouterr().err
