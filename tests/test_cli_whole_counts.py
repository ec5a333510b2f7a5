"""The CLI's message sizes are whole bytes and its parameter counts whole parameters: ``--min-size 1.5B`` or
``zero --params 1.5`` is a slip (1.5 bytes, 1.5 parameters), refused in one line with exit status 2."""

import pytest

from simulator.cli import main


@pytest.mark.parametrize("argv, message", [
    (["collective", "--op", "all_reduce", "--gpus", "16", "--min-size", "1.5B", "--max-size", "3B"],
     "--min-size: 1.5B is 1.5 bytes, not a whole number; give e.g. 2B or 1MiB"),
    (["collective", "--op", "all_reduce", "--gpus", "16", "--min-size", "1.4MiB", "--max-size", "3MiB"],
     "--min-size: 1.4MiB is 1468006.4 bytes, not a whole number"),
    (["collective", "--op", "all_reduce", "--gpus", "16", "--min-size", "1MiB", "--max-size", "2.5B"],
     "--max-size: 2.5B is 2.5 bytes, not a whole number"),
    (["zero", "--params", "1.5"], "--params: 1.5 is 1.5 parameters, not a whole number"),
])
def test_fractional_sizes_and_counts_are_refused(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err


def test_whole_sizes_and_counts_run(capsys):
    assert main(["collective", "--op", "all_reduce", "--gpus", "16", "--min-size", "2B", "--max-size", "4B",
                 "--json"]) == 0
    assert main(["zero", "--params", "1.5B", "--gpus", "8", "--json"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 2  # two JSON lines
