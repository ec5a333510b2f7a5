"""Context parallelism audit (TE's ``AttnFuncWithCPAndKVP2P`` under Megatron-Core's selective recomputation).

Truths used (from Transformer Engine's code, never the simulator's own numbers):

* ``transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py``,
  ``AttnFuncWithCPAndKVP2P.forward``: the ring's exchanges (``flash_attn_p2p_communicate``) are issued from
  inside the attention call, on the compute stream's context; NCCL's stream waits for the issuing stream, so a
  recomputed attention core (Megatron-Core's ``checkpoint_core_attention``, re-run by the backward) starts
  passing K and V only when the rank's compute has reached that recomputation -- not earlier;
* from that point the recomputed attention's last step starts ``(cp - 1) max(a, c)`` later, for steps of ``a``
  seconds on average and a block transfer of ``c`` (step ``i`` waits for block ``i``, sent during step
  ``i - 1``). The CP ranks' steps differ (the causal diagonal step, the unmasked ones and their merges by rank:
  tests/test_cp_ring_steps.py), so the ring, one collective here, starts when its last member reaches it.
"""

import pytest

from simulator.experiment import experiment_from_dict, run_experiment

MODEL = {"name": "cpm", "layers": 3, "hidden": 1024, "heads": 8, "kv_heads": 8, "ffn_hidden": 4096, "vocab": 1024,
         "gated_mlp": False, "tied_embeddings": False}


def _ops(cp, comm_bound, kind="p2p", recompute="selective", m=2, network=None, rank=0):
    cluster = ({"preset": "dgx-h100", "nodes": cp, "gpus_per_node": 1, "nic_bandwidth": "1Gb/s"} if comm_bound
               else {"preset": "dgx-h100", "nodes": 1, "gpus_per_node": cp})
    doc = {"cluster": cluster, "model": MODEL,
           "parallel": {"tp": 1, "cp": cp, "cp_comm_type": kind, "dp": 1, "global_batch": m,
                        "recompute": recompute},
           "training": {"seq_len": 32768}, "compute": {"comm_sms": 0, "p2p_sms": 0}, "network": network or {}}
    ops = run_experiment(experiment_from_dict(doc), fidelity="full", force=True).ops
    if rank is not None:
        ops = ops[ops["rank"] == rank]
    return ops.sort_values("start_s").reset_index(drop=True)


@pytest.mark.parametrize("comm_bound", [False, True])
def test_recomputed_ring_starts_when_the_recomputation_runs(comm_bound):
    cp = 4
    every = _ops(cp, comm_bound, rank=None)
    ops = every[every["rank"] == 0]
    rings = ops[ops["name"].str.match(r"B\d+\.c0\.L\d+\.cp_ring$")]
    assert len(rings) == 2 * 3  # one recomputed forward ring per layer and micro-batch
    for _, ring in rings.iterrows():
        firsts = every[every["name"] == ring["name"].replace("B", "R", 1).replace("cp_ring", "cp1")]
        assert len(firsts) == cp
        first = firsts[firsts["rank"] == 0].iloc[0]
        # everything the rank ran on its compute stream before this pass ended before the ring started
        before = ops[(ops["stream"] == "compute") & (ops["start_s"] < first["start_s"])]
        assert ring["start_s"] >= before["end_s"].max() - 1e-12
        # ... and it starts with the recomputation of the CP rank that reaches it last
        assert ring["start_s"] == pytest.approx(firsts["start_s"].max(), abs=1e-9)


def test_recomputed_ring_attention_takes_the_closed_form_when_comm_bound():
    cp = 4
    # one block: K and V of s / cp = 8,192 tokens x 8 KV heads x 128 x 2 bytes, over a 1 Gb/s NIC at full rate
    c = 2 * (32768 // cp) * 8 * 128 * 2 / (1e9 / 8)
    every = _ops(cp, True, network={"bandwidth_efficiency": 1.0}, rank=None)
    for layer in range(3):
        p = f"R1.c0.L{layer}"
        firsts = every[every["name"] == f"{p}.cp1"]
        rank = int(firsts.loc[firsts["start_s"].idxmax(), "rank"])  # the CP rank the ring waits for
        ops = every[every["rank"] == rank].set_index("name")
        first, mid, last = ops.loc[f"{p}.cp1"], ops.loc[f"{p}.cp2"], ops.loc[f"{p}.cp3"]
        ring = ops.loc[f"B1.c0.L{layer}.cp_ring"]
        a = (mid["end_s"] - first["start_s"]) / (cp - 1)  # one step, on average
        assert ring["duration_s"] == pytest.approx((cp - 1) * c, rel=1e-3)  # (plus microseconds of latency)
        assert c > a  # really comm-bound
        # the last step starts once every block is in: (cp - 1) max(a, c) after the recomputation starts
        assert last["start_s"] - first["start_s"] == pytest.approx((cp - 1) * c, rel=1e-3)


@pytest.mark.parametrize("kind", ["all_gather", "a2a"])
def test_blocking_cp_kinds_already_wait_for_the_compute_stream(kind):
    ops = _ops(4, True, kind).set_index("name")
    first = "B1.c0.L1.cp_all_gather" if kind == "all_gather" else "B1.c0.L1.cp_a2a"
    coll = ops.loc[first]
    coll = coll.iloc[0] if coll.ndim > 1 else coll
    before = ops[(ops["stream"] == "compute") & (ops["start_s"] < coll["start_s"])]
    assert coll["start_s"] >= before["end_s"].max() - 1e-12
