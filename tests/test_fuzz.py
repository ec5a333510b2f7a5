"""Hostile inputs never crash, hang or run away: a property-based fuzz of every entry point.

Each target draws experiment documents, YAML texts or CLI flags from the
schema's fields with values of every kind (wrong types, non-finite numbers,
huge and negative sizes, unit-less bandwidths and times, nested junk) and
asserts the contract of DESIGN.md: the result is either a valid experiment or
one clear error — a ``ValueError`` subclass from the API, one line and exit
status 2 from the CLI — reached within a second. Examples are bounded
(``max_examples``) so the suite stays quick; the counts are reported in the
session notes.
"""

from __future__ import annotations

import contextlib
import io
import time

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from simulator.cli import main  # noqa: E402
from simulator.experiment import experiment_from_dict  # noqa: E402

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                derandomize=True)

JUNK = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-10**20, max_value=10**20),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
    st.sampled_from(["400Gbps", "2us", "1e9", "2:1", "fast", "auto", "-5GB/s", "0", "1T", "nan", "inf"]),
    st.lists(st.integers(-5, 5), max_size=3), st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)
CLUSTER_FIELDS = ["preset", "gpu", "nodes", "gpus_per_node", "nvlink_bandwidth", "nic_bandwidth", "fabric",
                  "nodes_per_leaf", "spines", "oversubscription", "nvlink_latency", "switch_latency"]
MODEL_FIELDS = ["preset", "layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "experts", "top_k"]
PARALLEL_FIELDS = ["tp", "pp", "dp", "ep", "micro_batch", "global_batch", "schedule", "virtual_stages", "zero",
                   "zero_impl", "recompute", "sequence_parallel", "placement", "grad_bucket_bytes",
                   "zero_prefetch", "zero_grad_sync"]
NETWORK_FIELDS = ["model", "step_latency", "seed", "bandwidth_efficiency", "fidelity"]
COMPUTE_FIELDS = ["matmul_efficiency", "attention_kernel", "attention_efficiency", "op_overhead_s",
                  "memory_efficiency", "gemm_k_overhead"]


def section(fields, base):
    return st.dictionaries(st.sampled_from(fields), JUNK, max_size=3).map(lambda d: {**base, **d})


DOCS = st.fixed_dictionaries({
    "cluster": section(CLUSTER_FIELDS, {"preset": "dgx-h100", "nodes": 1}),
    "model": section(MODEL_FIELDS, {"preset": "tiny"}),
    "parallel": section(PARALLEL_FIELDS, {"dp": 8}),
    "training": section(["seq_len", "dtype"], {"seq_len": 128}),
}, optional={
    "network": section(NETWORK_FIELDS, {}),
    "compute": section(COMPUTE_FIELDS, {}),
    "moe": section(["routing", "zipf_s", "capacity_factor", "seed", "expert_load"], {}),
    "options": section(["granularity", "flash_attention", "grad_dtype_bytes", "p2p"], {}),
    "fidelity": JUNK,
})


@FUZZ
@given(DOCS)
def test_api_answers_every_document_with_an_experiment_or_a_value_error(doc):
    t0 = time.process_time()
    try:
        exp = experiment_from_dict(doc)
        exp.memory()
    except ValueError as exc:
        assert str(exc) and "\n" not in str(exc)
    assert time.process_time() - t0 < 1.0


YAML_TEXT = st.one_of(
    st.text(max_size=200),
    st.lists(st.sampled_from(["cluster: {preset: dgx-h100, nodes: 1}", "model: {preset: tiny}", "model: tiny",
                              "parallel: {dp: 8}", "training: {seq_len: 128}", "a: &x [1, 2]", "b: *x",
                              "cluster: {nodes: 2:1}", "parallel: {dp: 8, dp: 4}", "[[[[", "- 1", "k: 010",
                              "network: {step_latency: 2}", "model: {preset: tiny, layers: 1e9}", ": :", "\t"]),
             max_size=6).map("\n".join),
)


def _run(argv):
    # The time limits below are on this process's CPU time (the CLI runs in-process), so that other load on the
    # machine cannot fail them; a run that spins still does.
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            rc = main(argv)
        except SystemExit as exc:  # argparse: usage errors exit 2 after one line
            rc = exc.code
    return rc, err.getvalue().strip().splitlines()


@FUZZ
@given(YAML_TEXT)
def test_cli_run_answers_any_file_with_a_result_or_one_line(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("fuzz") / "exp.yaml"
    path.write_text(text)
    t0 = time.process_time()
    rc, lines = _run(["run", str(path), "--json"])
    assert rc in (0, 2), lines
    if rc:
        assert len(lines) == 1 and lines[0].startswith("clustersim")
    assert time.process_time() - t0 < 2.0


FLAG = st.one_of(st.integers(-1000, 300).map(str), st.floats(allow_nan=True).map(str),
                 st.sampled_from(["1MiB", "8GiB", "0", "-1", "lots", "1e300", "nan", "1.000001", "dgx-h999",
                                  "10000000", "999999999999"]))


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(["--op", "--gpus", "--min-size", "--max-size", "--step-factor",
                                            "--cluster", "--algo"]), FLAG), max_size=4))
def test_cli_collective_flags_never_crash_or_run_away(flags):
    argv = ["collective", "--max-size", "64MiB", "--gpus", "8"] + [x for pair in flags for x in pair]
    t0 = time.process_time()
    rc, lines = _run(argv)
    if rc:  # a refusal comes at once; valid sweeps (up to 300 GPUs here) simply run
        assert rc == 2 and len(lines) >= 1 and lines[-1].startswith(("clustersim", "usage"))
        assert time.process_time() - t0 < 1.0
