"""Physical properties that must hold for any input: determinism, monotonicity, conservation.

* the same inputs give the same result bit for bit, whatever Python's string-hash seed;
* more bandwidth (NIC or NVLink) never makes a step slower; more oversubscription never makes it faster;
* every byte a collective or transfer sends is carried by the links of its route (bytes by class ×
  hops = link bytes), and the traffic matrix of payload bytes sums to what the GPUs sent.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator import NetworkConfig, simulate
from simulator.experiment import experiment_from_dict, run_experiment
from topologies import leaf_spine
from workloads.ops import OpGraph

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROPS = settings(max_examples=12, deadline=None, derandomize=True)


def test_results_do_not_depend_on_the_string_hash_seed():
    outs = []
    for seed in ("0", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-m", "simulator.cli", "run",
                              os.path.join(ROOT, "examples", "demo.yaml"), "--json"],
                             capture_output=True, text=True, check=True, env=env).stdout
        doc = json.loads(out)
        outs.append({k: doc[k] for k in ("step_time_s", "bytes_by_class", "bytes_by_tier", "exposed_comm_s")})
    assert outs[0] == outs[1]


def _step(nic: str, nvlink: str, oversub: float, tp: int, zero: int) -> float:
    doc = {"cluster": {"preset": "dgx-h100", "nodes": 4, "nodes_per_leaf": 2, "spines": 2, "nic_bandwidth": nic,
                       "nvlink_bandwidth": nvlink, "oversubscription": oversub},
           "model": {"preset": "gpt2-small"},
           "parallel": {"tp": tp, "dp": 32 // tp, "zero": zero, "global_batch": 2 * (32 // tp)},
           "training": {"seq_len": 512}}
    return run_experiment(experiment_from_dict(doc)).step_time


CONFIG = st.tuples(st.sampled_from(["100Gbps", "200Gbps", "400Gbps"]), st.sampled_from(["150GB/s", "450GB/s"]),
                   st.sampled_from([1.0, 2.0]), st.sampled_from([1, 2, 4]), st.sampled_from([0, 1, 3]))


@PROPS
@given(CONFIG)
def test_more_nic_bandwidth_is_never_slower(cfg):
    nic, nvlink, oversub, tp, zero = cfg
    faster = {"100Gbps": "200Gbps", "200Gbps": "400Gbps", "400Gbps": "800Gbps"}[nic]
    assert _step(faster, nvlink, oversub, tp, zero) <= _step(nic, nvlink, oversub, tp, zero) * (1 + 1e-9)


@PROPS
@given(CONFIG)
def test_more_oversubscription_is_never_faster(cfg):
    nic, nvlink, oversub, tp, zero = cfg
    assert _step(nic, nvlink, oversub * 2, tp, zero) >= _step(nic, nvlink, oversub, tp, zero) * (1 - 1e-9)


@PROPS
@given(st.lists(st.tuples(st.integers(0, 31), st.integers(0, 31), st.floats(1e3, 1e9)), min_size=1, max_size=20),
       st.sampled_from(["all_reduce", "all_gather", "all_to_all"]), st.integers(2, 32))
def test_bytes_are_conserved_for_any_mix_of_transfers(sends, kind, n):
    c = leaf_spine("H100-SXM", servers=4, servers_per_leaf=2, spines=2, oversubscription=2)
    g = OpGraph(c.num_gpus)
    sent = 0.0
    for k, (a, b, nbytes) in enumerate(sends):
        if a == b:
            continue
        g.send(a, b, nbytes, stream=f"s{k}", traffic_class="p2p")
        g.recv(b, a, nbytes, stream=f"r{k}", traffic_class="p2p")
        sent += nbytes
    g.collective(kind, list(range(n)), 2**24, traffic_class="coll")
    res = simulate(g, c, network=NetworkConfig(step_latency_s=2e-6, bandwidth_efficiency=1.0))
    if sent:
        assert res.bytes_by_class["p2p"] == pytest.approx(sent, rel=1e-9)
    # every payload byte crosses each link of its route: link bytes by class >= payload, equal hop-weighted
    links = res.links
    for cls in res.bytes_by_class:
        assert float(links[f"bytes_{cls}"].sum()) >= res.bytes_by_class[cls] * (1 - 1e-9)
    assert float(links["bytes"].sum()) == pytest.approx(
        sum(float(links[f"bytes_{cls}"].sum()) for cls in res.bytes_by_class), rel=1e-9)
