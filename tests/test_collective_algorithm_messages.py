"""An algorithm asked for a kind it does not implement names the algorithms that do, and only those.

Truth: trying them. Every (kind, algorithm) pair is planned over groups of several shapes (one server,
equal servers, unequal servers); a refusal must be one line of the form ``algorithm: A does not implement
K; valid for K: ...``, and every algorithm it suggests must then plan K without error, on the planner and
end to end through the engine (``auto`` included), while every algorithm that plans K is suggested.
``sendrecv`` (point-to-point, no algorithm) refuses ``--algo`` other than ``auto`` on the command line.
"""

import re
import subprocess
import sys

import pytest

from simulator.bench import collective_time
from simulator.collectives import (
    ALGORITHM_KINDS,
    ALGORITHMS,
    AUTO_CANDIDATES,
    COLLECTIVE_ALGORITHMS,
    CollectiveError,
    plan_collective,
    valid_algorithms,
)
from simulator.fabric import NetworkConfig
from workloads.ops import COLLECTIVE_KINDS

NAMED = [a for a in COLLECTIVE_ALGORITHMS if a != "auto"]
SIZE = 2.0**20
MESSAGE = re.compile(r"algorithm: (\w+) does not implement (\w+); valid for (\w+): ([\w, ]+)")
SHAPES = {  # member -> server, as a list indexed by rank
    "one server of 8": [0] * 8,
    "2 servers x 4": [0] * 4 + [1] * 4,
    "4 servers x 4": [s for s in range(4) for _ in range(4)],
    "servers of 8 and 4": [0] * 8 + [1] * 4,
    "8 servers x 1": list(range(8)),
}


def _plan(kind, algorithm, servers):
    """Plan ``kind`` with ``algorithm`` over ranks ``0..n-1`` of the given servers; the error or None."""
    try:
        plan_collective(kind, range(len(servers)), SIZE, servers.__getitem__, algorithm)
    except CollectiveError as exc:
        return str(exc)
    return None


def _suggested(message, kind, algorithm):
    """The algorithms a refusal names, after checking its form."""
    assert "\n" not in message
    m = MESSAGE.fullmatch(message)
    assert m, message
    assert m.group(1) == algorithm and m.group(2) == kind and m.group(3) == kind, message
    return m.group(4).split(", ")


def test_registries_agree():
    assert set(ALGORITHM_KINDS) == set(ALGORITHMS) == set(NAMED)
    assert set(AUTO_CANDIDATES) == set(COLLECTIVE_KINDS)
    for kind, candidates in AUTO_CANDIDATES.items():  # auto only picks among algorithms that plan the kind
        assert set(candidates) <= set(valid_algorithms(kind)), kind


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind", COLLECTIVE_KINDS)
def test_every_refusal_suggests_exactly_the_algorithms_that_plan_the_kind(kind, shape):
    servers = SHAPES[shape]
    outcome = {a: _plan(kind, a, servers) for a in NAMED}
    works = {a for a, err in outcome.items() if err is None}
    assert works == set(valid_algorithms(kind)) - {"auto"}, shape
    for algorithm, err in outcome.items():
        if err is None:
            continue
        suggested = _suggested(err, kind, algorithm)
        assert suggested[0] == "auto" and len(set(suggested)) == len(suggested), err
        # every suggestion really plans the kind here, and every algorithm that does is suggested
        assert set(suggested[1:]) == works, err
        assert algorithm not in suggested, err


@pytest.mark.parametrize("kind", COLLECTIVE_KINDS)
def test_suggestions_run_end_to_end(kind, two_leaves):
    net = NetworkConfig(step_latency_s=2e-6, bandwidth_efficiency=1.0)
    refusals = {}
    for algorithm in NAMED:
        try:
            collective_time(two_leaves, kind, 16, SIZE, algorithm, net)
        except CollectiveError as exc:
            refusals[algorithm] = str(exc)
    messages = {tuple(_suggested(err, kind, a)) for a, err in refusals.items()}
    assert len(messages) <= 1  # (every refusal for one kind names the same list)
    for suggested in messages:
        for a in suggested:
            assert collective_time(two_leaves, kind, 16, SIZE, a, net) > 0, a


@pytest.mark.parametrize("kind,algorithm,listed", [
    ("all_gather", "direct", "auto, ring, hierarchical"),
    ("all_gather", "tree", "auto, ring, hierarchical"),
    ("all_to_all", "tree", "auto, direct"),
    ("all_reduce", "direct", "auto, ring, tree, hierarchical, parameter_server"),
    ("gather", "parameter_server", "auto, direct"),
    ("broadcast", "hierarchical", "auto, ring, tree, direct"),
])
def test_the_reported_cases(kind, algorithm, listed):
    for shape in ("one server of 8", "2 servers x 4"):
        assert _plan(kind, algorithm, SHAPES[shape]) == (
            f"algorithm: {algorithm} does not implement {kind}; valid for {kind}: {listed}")


def cli(*args):
    return subprocess.run([sys.executable, "-m", "simulator.cli", *args], capture_output=True, text=True, timeout=120)


def test_cli_refusal_names_working_algorithms():
    p = cli("collective", "--op", "all_gather", "--gpus", "16", "--min-size", "1MiB", "--max-size", "1MiB",
            "--algo", "direct")
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "valid for all_gather: auto, ring, hierarchical" in lines[0], p.stderr


@pytest.mark.parametrize("algo", NAMED)
def test_sendrecv_refuses_an_algorithm(algo):
    p = cli("collective", "--op", "sendrecv", "--gpus", "16", "--min-size", "1MiB", "--max-size", "1MiB",
            "--algo", algo)
    assert p.returncode == 2 and not p.stdout
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    assert "--algo" in lines[0] and "sendrecv" in lines[0] and "point-to-point" in lines[0], lines[0]


def test_sendrecv_runs_with_auto():
    p = cli("collective", "--op", "sendrecv", "--gpus", "16", "--min-size", "1MiB", "--max-size", "1MiB",
            "--algo", "auto")
    assert p.returncode == 0, p.stderr
    assert "sendrecv" in p.stdout
