"""Audit 3 of the Chakra reader: a trace missing its highest rank files, and --chakra given a file or a wrong path,
end in one line naming what is wrong and what would be valid (exit 2), never a misleading message."""

from __future__ import annotations

import pytest

from simulator.cli import main
from workloads.chakra import ChakraError, read_chakra, write_chakra
from workloads.ops import OpGraph

pytest.importorskip("google.protobuf")


def one_line(err: str) -> str:
    assert "Traceback" not in err
    assert err.startswith("clustersim: error: --chakra: ") and err.count("\n") == 1, err
    return err


def _trace(folder):
    """Four ranks: an all-reduce of all four, then one of ranks 2 and 3 (process groups up to rank 3)."""
    g = OpGraph(4)
    first = {r: g.compute(r, flops=1e9, name=f"fwd{r}") for r in range(4)}
    ar = g.collective("all_reduce", [0, 1, 2, 3], 1e6, deps={r: [first[r]] for r in range(4)})
    g.collective("all_reduce", [2, 3], 1e6, deps={r: [ar[r]] for r in (2, 3)})
    write_chakra(g, folder)
    return folder


def _fails(path, capsys, **kwargs) -> str:
    """The reader's message for ``path``; the CLI says the same in one line, led by --chakra, and exits 2."""
    with pytest.raises(ChakraError) as exc:
        read_chakra(path, **kwargs)
    msg = str(exc.value)
    assert "\n" not in msg, msg
    if not kwargs:
        assert main(["run", "--chakra", str(path)]) == 2
        assert msg in one_line(capsys.readouterr().err)
    return msg


# ------------------------------------------------ (1) the highest rank files missing
def test_missing_highest_rank_file_is_named_not_blamed_on_the_comm_groups(tmp_path, capsys):
    _trace(tmp_path)
    (tmp_path / "clustersim.3.et").unlink()
    msg = _fails(tmp_path, capsys)
    assert msg == (f"{tmp_path}: missing rank file(s) clustersim.3.et: the comm groups in clustersim.comm_group.json "
                   f"name ranks up to 3 but the folder has files for ranks 0..2"), msg
    assert "distinct" not in msg


@pytest.mark.parametrize("gone,names", [((2, 3), "clustersim.2.et, clustersim.3.et"),
                                        ((1, 2, 3), "clustersim.1.et ... clustersim.3.et")])
def test_several_missing_highest_rank_files_are_named(tmp_path, capsys, gone, names):
    _trace(tmp_path)
    for r in gone:
        (tmp_path / f"clustersim.{r}.et").unlink()
    msg = _fails(tmp_path, capsys)
    assert f"missing rank file(s) {names}: the comm groups" in msg, msg
    assert f"name ranks up to 3 but the folder has files for ranks 0..{3 - len(gone)}" in msg, msg


@pytest.mark.parametrize("gone,words", [((3,), "; clustersim.3.et is missing;"),
                                        ((2, 3), "; clustersim.2.et, clustersim.3.et are missing;"),
                                        ((1, 2, 3), "; clustersim.1.et ... clustersim.3.et are missing;")])
def test_without_comm_groups_the_recorded_world_size_names_the_missing_files(tmp_path, capsys, gone, words):
    _trace(tmp_path)
    (tmp_path / "clustersim.comm_group.json").unlink()
    for r in gone:
        (tmp_path / f"clustersim.{r}.et").unlink()
    msg = _fails(tmp_path, capsys)
    assert "clustersim.world_size says the trace has 4 ranks" in msg and words in msg, msg
    if len(gone) == 1:
        assert "..." not in msg and "are missing" not in msg


def test_process_group_metadata_naming_a_missing_rank_names_the_file(tmp_path, capsys):
    """A foreign reader's view (no clustersim.world_size): the process_group:init node names rank 3."""
    _trace(tmp_path)
    (tmp_path / "clustersim.comm_group.json").unlink()
    (tmp_path / "clustersim.3.et").unlink()
    msg = _fails(tmp_path, capsys, clustersim_attrs=False)
    assert msg.startswith(f"{tmp_path}: missing rank file(s) clustersim.3.et: process group ")
    assert "names ranks up to 3 but the folder has files for ranks 0..2" in msg and "distinct" not in msg, msg


def test_a_missing_middle_rank_still_says_so(tmp_path, capsys):
    _trace(tmp_path)
    (tmp_path / "clustersim.1.et").unlink()
    assert "missing rank file(s) clustersim.1.et: a trace needs one file per rank 0..3" in _fails(tmp_path, capsys)


def test_a_group_naming_a_negative_or_repeated_rank_is_still_refused_as_such(tmp_path):
    _trace(tmp_path)
    (tmp_path / "clustersim.comm_group.json").write_text('{"1": [0, 1, 2, 3], "2": [2, 2]}')
    with pytest.raises(ChakraError, match=r"process group '2' = \[2, 2\]: ranks must be distinct and in 0\.\.3"):
        read_chakra(tmp_path)


# ------------------------------------------------ (2) --chakra given a file, or a path with no trace
def test_a_rank_file_is_refused_naming_its_folder_and_prefix(tmp_path, capsys):
    _trace(tmp_path)
    msg = _fails(tmp_path / "clustersim.0.et", capsys)
    assert msg == (f"{tmp_path}/clustersim.0.et is a file; give its folder ({tmp_path}) or {tmp_path}/clustersim "
                   f"(the folder and prefix)"), msg


def test_another_file_is_refused_as_not_a_folder(tmp_path, capsys):
    _trace(tmp_path)
    msg = _fails(tmp_path / "clustersim.comm_group.json", capsys)
    assert "is a file, not a folder of Chakra trace files (<prefix>.<rank>.et)" in msg and "no such" not in msg, msg


def test_an_existing_folder_without_a_trace_is_not_called_missing(tmp_path, capsys):
    _trace(tmp_path)
    (tmp_path / "other").mkdir()
    msg = _fails(tmp_path / "other", capsys)
    assert msg == f"{tmp_path}/other: no Chakra trace files (<prefix>.<rank>.et, one per rank) in this folder", msg


def test_a_prefix_with_no_files_lists_the_prefixes_there(tmp_path, capsys):
    _trace(tmp_path)
    msg = _fails(tmp_path / "other", capsys)
    assert msg == (f"{tmp_path}/other: no Chakra trace (other.<rank>.et files) in {tmp_path}; it has the prefix(es) "
                   f"clustersim: give {tmp_path} or {tmp_path}/clustersim"), msg
    assert read_chakra(tmp_path / "clustersim").world_size == 4  # the <folder>/<prefix> form still reads


def test_no_such_folder_only_when_nothing_is_there(tmp_path, capsys):
    msg = _fails(tmp_path / "nope" / "x", capsys)
    assert msg.startswith(f"{tmp_path}/nope/x: no such folder (give the folder of <prefix>.<rank>.et files"), msg
    msg = _fails(tmp_path / "x", capsys)  # the parent exists but holds no trace: both readings fail
    assert msg == (f"{tmp_path}/x: no such folder, nor Chakra trace files x.<rank>.et in {tmp_path} (the "
                   f"<folder>/<prefix> form)"), msg
