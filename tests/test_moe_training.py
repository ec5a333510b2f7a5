"""Expert parallelism end to end: all-to-all bytes, stragglers, drops, placement, CLI errors."""

import json
import subprocess
import sys

import pytest

from simulator.compute import ComputeModel
from simulator.experiment import experiment_from_dict, run_experiment
from workloads.flops import layer_ops
from workloads.models import ModelSpec
from workloads.ops import Kernel

# A small MoE: 2 layers, h 1024, 8 experts top-2 (Mixtral-shaped, scaled down).
MOE = {"name": "moe-small", "layers": 2, "hidden": 1024, "heads": 8, "kv_heads": 8, "ffn_hidden": 4096,
       "vocab": 32000, "gated_mlp": True, "tied_embeddings": False, "experts": 8, "top_k": 2,
       "moe_ffn_hidden": 4096, "max_seq_len": 4096}
B, S, H, K, DTYPE = 1, 2048, 1024, 2, 2


def doc(ep=8, tp=1, dp=8, pp=1, nodes=1, moe=None, placement=("tp", "dp", "pp"), gb=None):
    return {"cluster": {"preset": "dgx-h100", "nodes": nodes}, "model": dict(MOE),
            "parallel": {"tp": tp, "pp": pp, "dp": dp, "ep": ep, "micro_batch": B, "global_batch": gb or dp * B,
                         "sequence_parallel": tp > 1, "placement": list(placement)},
            "training": {"seq_len": S}, "moe": moe or {"routing": "balanced"},
            "options": {"embedding_and_loss": False}}


def run(d, **kw):
    return run_experiment(experiment_from_dict(d), **kw)


def test_all_to_all_bytes_match_the_hand_count_under_balanced_routing():
    # Per MoE layer and micro-batch, each EP rank moves tokens*top_k*hidden*bytes in each of 4 all-to-alls
    # (dispatch, combine; forward and backward); the share addressed to itself, 1/ep, stays on the GPU.
    ep = 8
    r = run(doc(ep=ep))
    per_rank = B * S * K * H * DTYPE
    expected = 4 * MOE["layers"] * ep * per_rank * (ep - 1) / ep
    assert r.bytes_by_class["ep"] == pytest.approx(expected, rel=1e-12)
    # Inside one NVLink domain every EP byte stays on NVLink.
    assert set(r.bytes_by_class_and_tier().loc["ep"][lambda x: x > 0].index) == {"nvlink"}


def test_ep_across_nodes_moves_all_to_all_to_the_nic_tiers():
    inside = run(doc(ep=8, tp=1, dp=16, nodes=2))
    across = run(doc(ep=8, tp=2, dp=8, nodes=2))     # TP innermost: an EP group strides over both nodes
    t_in, t_across = inside.bytes_by_class_and_tier(), across.bytes_by_class_and_tier()
    assert t_in.loc["ep"].get("leaf", 0) == 0
    assert t_across.loc["ep", "leaf"] > 0


def expert_seconds(layer_phase_kernels):
    from topologies import get_gpu
    cm = ComputeModel(get_gpu("H100-SXM"))
    return sum(cm.duration(Kernel(o.category, o.flops, o.nbytes, o.shape)) for o in layer_phase_kernels)


def test_skewed_routing_is_slower_by_the_straggler_expert_load():
    balanced = run(doc(moe={"routing": "balanced"}))
    skewed = run(doc(moe={"routing": "custom", "expert_load": [8, 1, 1, 1, 1, 1, 1, 1], "seed": 1}))
    assert skewed.step_time > balanced.step_time
    # Every MoE layer waits at the combine all-to-all for the most loaded EP rank, so its expert GEMMs
    # (forward and backward) run f_max times as long as under balanced routing (f = tokens received /
    # balanced tokens). Lower bound: the extra expert time alone; all-to-all imbalance only adds to it.
    model = ModelSpec(**MOE)
    ops = layer_ops(model, B, S, 1, layer=0)
    fwd = [o for o in ops.forward if o.name.startswith("experts")]
    bwd = [o for o in ops.backward if o.name.startswith("experts")]
    t_experts = expert_seconds(fwd) + expert_seconds(bwd)
    balanced_tokens = B * S * K
    extra = 0.0
    for route in skewed.step.routes.values():
        f_max = route.rank_load.max() / balanced_tokens
        extra += (f_max - 1) * t_experts
    slowdown = skewed.step_time - balanced.step_time
    assert slowdown >= 0.9 * extra          # 10 %: roofline/wave effects of the larger GEMM
    assert skewed.summary["moe"]["imbalance_max"] > 3


def test_capacity_factor_drops_tokens_and_counts_them():
    r = run(doc(moe={"routing": "custom", "expert_load": [8, 1, 1, 1, 1, 1, 1, 1], "capacity_factor": 1.0}))
    moe = r.summary["moe"]
    routes = list(r.step.routes.values())
    # Capacity 1.0 (Megatron-Core, per source rank): each rank keeps at most ceil(tokens*k/E) choices per
    # expert; the hot expert's overflow is dropped at every source.
    cap = B * S * K // 8
    for route in routes:
        assert route.kept.max() <= cap
        assert route.dropped == int((route.choices - route.kept).sum()) == sum(
            max(0, c - cap) for c in route.choices.ravel())
    assert moe["dropped_fraction"] == pytest.approx(
        sum(r_.dropped for r_ in routes) / sum(r_.choices.sum() for r_ in routes))
    assert moe["dropped_fraction"] > 0.3
    assert set(r.expert_load.columns) >= {"layer", "expert", "ep_rank", "tokens_routed", "tokens_kept"}


def test_same_seed_same_routing_and_result():
    d = doc(moe={"routing": "zipf", "zipf_s": 1.0, "seed": 5})
    a, b = run(d), run(d)
    assert a.step_time == b.step_time and a.summary["moe"] == b.summary["moe"]


def test_fast_and_full_fidelity_agree_with_ep_and_tp():
    d = doc(ep=4, tp=2, dp=4, nodes=1, moe={"routing": "zipf", "seed": 3})
    fast, full = run(d, fidelity="fast"), run(d, fidelity="full")
    assert fast.step_time == pytest.approx(full.step_time, rel=0.02)
    assert fast.bytes_by_class["ep"] == pytest.approx(full.bytes_by_class["ep"])


def test_expert_gradients_are_their_own_traffic_class():
    r = run(doc(ep=4, dp=8))            # expert-data-parallel groups of 2
    assert r.bytes_by_class.get("edp", 0) > 0


@pytest.mark.parametrize("parallel,needle", [
    ({"ep": 3}, "parallel.ep"),
    ({"ep": 16, "dp": 8}, "parallel.ep"),
])
def test_invalid_ep_configs_fail_with_one_line(tmp_path, parallel, needle):
    import yaml
    d = doc()
    d["parallel"].update(parallel)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(d))
    p = subprocess.run([sys.executable, "-m", "simulator.cli", "run", str(path)], capture_output=True, text=True)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and needle in p.stderr


def test_ep_on_a_dense_model_is_rejected(tmp_path):
    import yaml
    d = doc()
    d["model"] = {"preset": "gpt2-small"}
    path = tmp_path / "dense.yaml"
    path.write_text(yaml.safe_dump(d))
    p = subprocess.run([sys.executable, "-m", "simulator.cli", "run", str(path), "--json"], capture_output=True,
                       text=True)
    assert p.returncode == 2 and "parallel.ep" in p.stderr and not p.stdout


def test_mixtral_example_runs_with_ep_tp_pp_dp():
    p = subprocess.run([sys.executable, "-m", "simulator.cli", "run", "examples/mixtral-8x7b-ep.yaml", "--json"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)
    assert s["bytes_by_class"]["ep"] > 0 and s["moe"]["layers"] == 32
