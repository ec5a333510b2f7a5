"""``clustersim run FILE [--json] [--trace OUT] [--force]``: outputs and every user-error path.

Contract (DESIGN.md, "Units and inputs" and "The experiment file"): every
invalid input ends in ONE line on stderr naming the field, a non-zero exit,
never a traceback; ``--json`` prints one object with the documented keys;
``--trace`` writes Chrome-trace JSON with one track per rank and stream.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from simulator.cli import main

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "examples" / "demo.yaml"
JSON_KEYS = {"step_time_s", "bubble_fraction", "exposed_comm_s", "mfu", "tflops_per_gpu", "memory_per_gpu_bytes",
             "bytes_by_class", "bytes_by_tier", "sim_wall_s"}


def cli(*args: str) -> subprocess.CompletedProcess:
    """The real entry point in a fresh interpreter (what a user's shell runs)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "simulator.cli", *args], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=120)


def write(tmp_path: Path, text: str, name: str = "exp.yaml") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def one_line_error(err: str) -> str:
    assert "Traceback" not in err
    lines = err.strip("\n").split("\n")
    assert len(lines) == 1, err
    assert lines[0].startswith("clustersim: error: ")
    return lines[0]


SMALL_CLUSTER = "cluster: {preset: dgx-h100, nodes: 1}\n"
TINY = "model: {preset: tiny}\n"

# (case id, YAML text, words the one-line message must contain)
ERRORS = [
    ("malformed-yaml", "cluster: [dgx-h100\nmodel: tiny\n", ["malformed YAML", "line"]),
    ("not-a-mapping", "- just\n- a list\n", ["mapping"]),
    ("empty-file", "", ["empty"]),
    ("unknown-section", SMALL_CLUSTER + "modle: {preset: tiny}\n", ["modle", "unknown section"]),
    ("unknown-parallel-field", SMALL_CLUSTER + TINY + "parallel: {tpp: 2}\n", ["parallel.tpp", "unknown field"]),
    ("unknown-cluster-field", "cluster: {preset: dgx-h100, nodez: 2}\n" + TINY, ["cluster.nodez", "unknown field"]),
    ("unknown-model-field", SMALL_CLUSTER + "model: {preset: tiny, hiden: 64}\n", ["model.hiden"]),
    ("unknown-training-field", SMALL_CLUSTER + TINY + "training: {seqlen: 128}\n", ["training.seqlen"]),
    ("unknown-cluster-preset", "cluster: {preset: dgx-h900}\n" + TINY, ["cluster.preset", "dgx-h100"]),
    ("unknown-model-preset", SMALL_CLUSTER + "model: {preset: gpt5}\n", ["model.preset", "gpt2-small"]),
    ("tp-not-dividing-heads", SMALL_CLUSTER + "model: {preset: tiny}\nparallel: {tp: 8}\n",
     ["parallel.tp", "model.heads=4", "valid tp"]),
    ("world-size-mismatch", SMALL_CLUSTER + "model: {preset: tiny}\nparallel: {tp: 2, dp: 3}\n",
     ["tp*pp*dp", "8 GPUs"]),
    ("layers-vs-pp", SMALL_CLUSTER + "model: {preset: tiny}\nparallel: {pp: 4, dp: 2}\n",
     ["parallel.pp", "model.layers=2"]),
    ("layers-vs-pp-times-v", SMALL_CLUSTER + "model: {preset: gpt2-small}\n"
     "parallel: {pp: 4, dp: 2, schedule: interleaved, virtual_stages: 2, global_batch: 8}\n",
     ["parallel.pp", "pp*virtual_stages"]),
    ("batch-not-divisible", SMALL_CLUSTER + "model: {preset: tiny}\nparallel: {dp: 8, global_batch: 12}\n",
     ["parallel.global_batch", "12"]),
    ("interleaved-micro-batches", SMALL_CLUSTER + "model: {preset: gpt2-small}\n"
     "parallel: {pp: 4, dp: 2, schedule: interleaved, virtual_stages: 3, global_batch: 6}\n",
     ["parallel.global_batch", "multiple of pp"]),
    ("negative-bandwidth", "cluster: {preset: dgx-h100, nodes: 1, nvlink_bandwidth: -5GB/s}\n" + TINY,
     ["cluster.nvlink_bandwidth"]),
    ("bad-unit", "cluster: {preset: dgx-h100, nodes: 1, nic_bandwidth: 400 parsecs}\n" + TINY,
     ["cluster.nic_bandwidth"]),
    ("unitless-bandwidth", "cluster: {preset: dgx-h100, nodes: 1, nic_bandwidth: 400}\n" + TINY,
     ["cluster.nic_bandwidth", "no unit", "400 bytes/s"]),
    ("unitless-latency", SMALL_CLUSTER + TINY + "training: {seq_len: 128}\nnetwork: {step_latency: 2}\n",
     ["network.step_latency", "no unit"]),
    ("missing-model", SMALL_CLUSTER, ["model", "required section"]),
    ("too-many-nodes", "cluster: {preset: dgx-h100, nodes: 1000000000000000000}\n" + TINY,
     ["cluster.nodes", "262,144"]),
    ("too-many-layers", SMALL_CLUSTER + "model: {preset: tiny, layers: 1000000000}\n", ["model.layers", "4,096"]),
    ("too-many-micro-batches", SMALL_CLUSTER + TINY + "parallel: {global_batch: 1000000000000000}\n"
     "training: {seq_len: 128}\n", ["parallel.global_batch", "65,536"]),
    ("infinite-overhead", SMALL_CLUSTER + TINY + "training: {seq_len: 128}\ncompute: {op_overhead_s: .inf}\n",
     ["compute.op_overhead_s", "finite"]),
    ("nan-overhead", SMALL_CLUSTER + TINY + "training: {seq_len: 128}\ncompute: {op_overhead_s: .nan}\n",
     ["compute.op_overhead_s", "finite"]),
    ("missing-cluster", TINY, ["cluster", "required section"]),
    ("duplicate-key", SMALL_CLUSTER + TINY + "parallel: {dp: 8, dp: 4}\n", ["duplicate key", "line"]),
    ("yaml-alias", "c: &c {preset: dgx-h100, nodes: 1}\ncluster: *c\n" + TINY, ["alias", "line"]),
    ("bad-schedule", SMALL_CLUSTER + "model: {preset: tiny}\nparallel: {dp: 8, schedule: zigzag}\n",
     ["parallel.schedule", "1f1b"]),
    ("out-of-memory", SMALL_CLUSTER + "model: {preset: gpt3-175b}\nparallel: {tp: 8}\n",
     ["out of memory", "--force"]),
]


@pytest.mark.parametrize("text, words", [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS])
def test_every_error_is_one_line_and_non_zero(tmp_path, capsys, text, words):
    path = write(tmp_path, text)
    rc = main(["run", path])
    out, err = capsys.readouterr()
    assert rc == 2
    assert out == ""
    line = one_line_error(err)
    for w in words:
        assert w in line, line
    if "out of memory" not in words:
        assert path in line                     # input errors are found while loading, and say where


def test_missing_file(tmp_path, capsys):
    rc = main(["run", str(tmp_path / "nope.yaml")])
    line = one_line_error(capsys.readouterr().err)
    assert rc == 2 and "no such experiment file" in line


@pytest.mark.parametrize("case", ["malformed-yaml", "unknown-model-preset", "out-of-memory"])
def test_errors_through_the_real_entry_point(tmp_path, case):
    text, words = next(e[1:] for e in ERRORS if e[0] == case)
    proc = cli("run", write(tmp_path, text))
    assert proc.returncode == 2
    assert proc.stdout == ""
    line = one_line_error(proc.stderr)
    for w in words:
        assert w in line


def test_force_simulates_a_config_that_does_not_fit(tmp_path, capsys):
    path = write(tmp_path, SMALL_CLUSTER + "model: {preset: gpt3-175b}\nparallel: {tp: 8}\n")
    rc = main(["run", path, "--force", "--json"])
    out, err = capsys.readouterr()
    assert rc == 0 and err == ""
    s = json.loads(out)
    assert s["fits_in_memory"] is False
    assert s["memory_per_gpu_bytes"] > 80e9                      # 175B·16 bytes / 8 GPUs ≈ 350 GB
    assert s["step_time_s"] > 0


def test_demo_json_and_trace(tmp_path):
    trace = tmp_path / "trace.json"
    proc = cli("run", str(DEMO), "--json", "--trace", str(trace))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    s = json.loads(proc.stdout)                                  # exactly one JSON object
    assert JSON_KEYS <= set(s)
    assert s["step_time_s"] > 0 and 0 < s["mfu"] < 1 and 0 <= s["bubble_fraction"] < 1
    assert s["tflops_per_gpu"] > 0 and s["memory_per_gpu_bytes"] > 0 and s["sim_wall_s"] > 0
    assert {"tp", "pp", "dp"} <= set(s["bytes_by_class"])        # TP2 x PP2 x DP4
    assert {"nvlink", "pcie", "leaf"} <= set(s["bytes_by_tier"])  # 2 nodes: DP crosses the NICs

    doc = json.loads(trace.read_text())
    events = doc["traceEvents"]
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
               if e["ph"] == "M" and e["name"] == "thread_name"}
    procs = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    spans = [e for e in events if e["ph"] == "X"]
    from simulator.trace import FABRIC_PID
    assert sorted(procs) == [0, 8, FABRIC_PID]                   # one rank per pipeline stage, and the fabric
    assert spans
    for e in spans:
        assert (e["pid"], e["tid"]) in threads                   # every span sits on a named track
        assert e["ts"] >= 0 and e["dur"] >= 0
        assert isinstance(e["name"], str) and "cat" in e
    proc = cli("run", str(DEMO), "--trace", str(trace), "--trace-ranks", "all")
    assert proc.returncode == 0, proc.stderr
    events = json.loads(trace.read_text())["traceEvents"]
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
               if e["ph"] == "M" and e["name"] == "thread_name"}
    spans = [e for e in events if e["ph"] == "X"]
    assert {e["pid"] for e in spans} == set(range(16))          # every rank when asked
    for rank in range(16):
        names = [n for (pid, _tid), n in threads.items() if pid == rank]
        assert len(names) == len(set(names))                     # one track per stream
        used = {threads[(e["pid"], e["tid"])] for e in spans if e["pid"] == rank}
        assert {"compute", "dp"} <= used
        assert used & {"pp_send_act", "pp_recv_act", "pp_send_grad", "pp_recv_grad"}
    # the trace spans the whole step
    end_us = max(e["ts"] + e["dur"] for e in spans)
    assert end_us == pytest.approx(s["step_time_s"] * 1e6, rel=1e-9)


def test_human_summary(capsys):
    rc = main(["run", str(DEMO)])
    out, err = capsys.readouterr()
    assert rc == 0 and err == ""
    for words in ("step time", "MFU", "pipeline bubble", "memory per GPU", "exposed comm", "bytes sent by class"):
        assert words in out


@pytest.mark.skipif(shutil.which("clustersim") is None, reason="console script not installed")
def test_console_script_runs_the_demo():
    proc = subprocess.run(["clustersim", "run", str(DEMO), "--json"], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert JSON_KEYS <= set(json.loads(proc.stdout))


@pytest.mark.parametrize("command", ["run", "validate"])
def test_cli_offers_every_experiment_fidelity(command):
    import argparse

    from simulator.cli import build_parser
    from simulator.experiment import FIDELITIES
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    fidelity = next(a for a in sub.choices[command]._actions if a.dest == "fidelity")
    assert tuple(fidelity.choices) == FIDELITIES


def test_run_fidelity_overrides_the_file(capsys):
    demo = str(Path(__file__).parent.parent / "examples" / "demo.yaml")
    assert main(["run", demo, "--json", "--fidelity", "lockstep"]) == 0
    lockstep = json.loads(capsys.readouterr().out)
    assert main(["run", demo, "--json"]) == 0
    fast = json.loads(capsys.readouterr().out)
    assert lockstep["step_time_s"] == pytest.approx(fast["step_time_s"], rel=0.02)
    assert lockstep["events"] < fast["events"]
    with pytest.raises(SystemExit) as exit_:
        main(["run", demo, "--fidelity", "medium"])
    assert exit_.value.code == 2
    assert "--fidelity" in capsys.readouterr().err


DEMO_YAML = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "demo.yaml")


@pytest.mark.parametrize("argv, flag", [
    (["run", DEMO_YAML, "--trace", "/nonexistent/folder/t.json"], "--trace"),
    (["sweep", DEMO_YAML, "-o", "/nonexistent/folder/x.csv", "--grid", "parallel.micro_batch=1,2",
      "--no-progress"], "--output"),
])
def test_bad_output_paths_are_refused_before_any_work(capsys, argv, flag):
    import time
    t0 = time.perf_counter()
    assert main(argv) == 2
    assert time.perf_counter() - t0 < 1.0
    line = one_line_error(capsys.readouterr().err)
    assert flag in line and "does not exist" in line


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc (a folder no file can be made in)")
@pytest.mark.parametrize("argv, flag", [
    (["run", DEMO_YAML, "--trace", "/proc/t.json"], "--trace"),
    (["run", DEMO_YAML, "--plots", "/proc/plots"], "--plots"),
    (["sweep", DEMO_YAML, "-o", "/proc/x.csv", "--grid", "parallel.micro_batch=1,2", "--no-progress"], "--output"),
    (["plan", "dgx-h100", "--csv", "/proc/x.csv"], "--csv"),
    (["topology", "dgx-h100:2", "-o", "/proc/x.yaml"], "--output"),
])
def test_an_output_folder_that_exists_but_takes_no_file_is_refused_by_its_option(capsys, argv, flag):
    # /proc exists and os.access says root may write there, but no file can be created in it: the write
    # used to fail after the work with a bare "[Errno 2] ... '/proc/.x.csv.lock'" naming no option.
    assert main(argv) == 2
    captured = capsys.readouterr()
    line = one_line_error(captured.err)
    assert flag in line and "cannot write" in line and "/proc/" in line
    assert captured.out == ""  # refused before anything was printed
