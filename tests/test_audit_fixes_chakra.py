"""Audit fixes of the Chakra paths: bad input ends in one line and exit 2, never a traceback or a partial trace."""

from __future__ import annotations

import importlib.util
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
        with pytest.raises(ChakraError, match=r"pip install 'clustersim\[chakra\]'"):
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
    assert "pip install 'clustersim[chakra]'" in one_line(capsys.readouterr().err)
    assert list(Path(out).iterdir()) == []
