"""Zero Bubble H1 (``parallel.schedule: zb-h1``; Qi et al., ICLR 2024): the backward split into ``B`` (input
gradient) and ``W`` (weight gradient), the ``W`` filling 1F1B's bubbles.

Truths used (the paper's closed forms and hand-derived orders, never the code's own numbers):

* the handcrafted order of section 3.1 (Figure 3), e.g. the first of 4 ranks with 8 micro-batches runs
  ``F0 F1 F2 F3 B0 W0 F4 B1 W1 ...`` and the last ``F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 ...``;
* at most ``p`` micro-batches in flight (forward done, weight gradient not) on every rank: 1F1B's peak;
* with free communication and uniform stages the bubble is ``(p - 1)(T_F + T_B - T_W)`` (the paper's, for
  ``T_W <= T_F, T_B``), in general ``(p - 1) max(T_F, T_B, T_F + T_B - T_W)``, against 1F1B's
  ``(p - 1)(T_F + T_B + T_W)``: a third of it when ``T_F = T_B = T_W``;
* ``B`` and ``W`` together are 1F1B's backward: same kernels, FLOPs and bytes.
"""

import sys
from pathlib import Path

import pytest

from simulator.experiment import experiment_from_dict, run_experiment
from workloads.errors import ConfigError
from workloads.memory import micro_batches_in_flight
from workloads.models import model_from_dict
from workloads.parallel import ParallelConfig, TrainingSpec, validate
from workloads.schedules import max_in_flight, pipeline_schedule, simulate_unit_times
from workloads.training import StepOptions, training_step

sys.path.insert(0, str(Path(__file__).parent))
from test_training import free_cluster, uniform_model  # noqa: E402


def _order(actions) -> str:
    return " ".join(f"{a.phase}{a.micro_batch}" for a in actions)


# ------------------------------------------------------------------ the order
def test_order_is_the_papers_figure_3():
    s = pipeline_schedule("zb-h1", 4, 8)
    assert _order(s[0]) == "F0 F1 F2 F3 B0 W0 F4 B1 W1 F5 B2 W2 F6 B3 W3 F7 B4 W4 B5 W5 B6 W6 B7 W7"
    assert _order(s[3]) == "F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 F5 B5 W2 F6 B6 W3 F7 B7 W4 W5 W6 W7"
    for acts in s:  # every pass of every micro-batch exactly once, W after its B
        assert sorted((a.phase, a.micro_batch) for a in acts) == sorted(
            (ph, i) for ph in "BFW" for i in range(8))


@pytest.mark.parametrize("p, m", [(2, 2), (4, 4), (4, 9), (8, 16)])
def test_memory_is_1f1b_peak_on_every_rank(p, m):
    assert [max_in_flight(a) for a in pipeline_schedule("zb-h1", p, m)] == [p] * p
    assert max(max_in_flight(a) for a in pipeline_schedule("1f1b", p, m)) == p
    assert micro_batches_in_flight(ParallelConfig(pp=p, global_batch=m, schedule="zb-h1"), p - 1) == p


@pytest.mark.parametrize("p, m", [(2, 3), (4, 8), (6, 6), (8, 20)])
@pytest.mark.parametrize("tf, tb, tw", [(1.0, 1.0, 1.0), (1.0, 1.2, 0.8), (1.0, 2.0, 1.5), (1.0, 0.5, 1.0)])
def test_unit_time_bubble_closed_form(p, m, tf, tb, tw):
    step, busy = simulate_unit_times(pipeline_schedule("zb-h1", p, m), tf, tb, 0.0, tw)
    assert busy == pytest.approx([m * (tf + tb + tw)] * p)
    assert step - m * (tf + tb + tw) == pytest.approx((p - 1) * max(tf, tb, tf + tb - tw))
    one_f_one_b, _ = simulate_unit_times(pipeline_schedule("1f1b", p, m), tf, tb + tw)
    assert one_f_one_b - m * (tf + tb + tw) == pytest.approx((p - 1) * (tf + tb + tw))
    if tf == tb == tw:
        assert (step - m * 3 * tf) / (one_f_one_b - m * 3 * tf) == pytest.approx(1 / 3)


def test_too_few_micro_batches_are_refused():
    with pytest.raises(ValueError, match="at least stages"):
        pipeline_schedule("zb-h1", 4, 3)
    with pytest.raises(ConfigError, match="parallel.global_batch: the zb-h1 schedule needs at least pp=4"):
        validate(model_from_dict(uniform_model(4)), ParallelConfig(pp=4, global_batch=2, schedule="zb-h1"),
                 TrainingSpec(seq_len=128))


# --------------------------------------------------------- through the engine
def _run(schedule, p, m, model=None, seq=128, **par):
    doc = {"cluster": free_cluster(p * par.get("dp", 1)), "model": model or uniform_model(p),
           "parallel": {"pp": p, "dp": 1, "micro_batch": 1, "global_batch": m * par.get("dp", 1),
                        "schedule": schedule, **par},
           "training": {"seq_len": seq}, "network": {"step_latency": 0},
           "options": {"embedding_and_loss": False}}
    return run_experiment(experiment_from_dict(doc), force=True, fidelity="full")


def _pass_times(result):
    ops = result.ops[result.ops["rank"] == 0].set_index("name")["duration_s"]
    return ops["F0.c0.L0"], ops["B0.c0.L0"], ops["W0.c0.L0"]


@pytest.mark.parametrize("p, m", [(2, 5), (4, 4), (4, 8)])
def test_bubble_through_the_engine(p, m):
    z, o = _run("zb-h1", p, m), _run("1f1b", p, m)
    tf, tb, tw = _pass_times(z)
    assert tw < tf and tw < tb                                  # the paper's regime
    assert list(z.stages["busy_s"]) == pytest.approx([m * (tf + tb + tw)] * p, rel=1e-9)
    assert list(z.stages["bubble_s"]) == pytest.approx([(p - 1) * (tf + tb - tw)] * p, rel=1e-6)
    assert list(o.stages["bubble_s"]) == pytest.approx([(p - 1) * (tf + tb + tw)] * p, rel=1e-6)
    assert z.step_time < o.step_time


def test_a_third_of_1f1b_when_the_passes_are_equal():
    # a wide, short model: GEMMs dominate, so F, B (dgrads) and W (wgrads) take about the same time
    wide = {**uniform_model(4), "hidden": 8192, "heads": 64, "kv_heads": 64, "ffn_hidden": 32768}
    z, o = _run("zb-h1", 4, 8, wide, seq=2048), _run("1f1b", 4, 8, wide, seq=2048)
    tf, tb, tw = _pass_times(z)
    assert tb == pytest.approx(tf, rel=0.1) and tw == pytest.approx(tf, rel=0.1)
    ratio = z.stages["bubble_s"].mean() / o.stages["bubble_s"].mean()
    assert ratio == pytest.approx(max(tf, tb, tf + tb - tw) / (tf + tb + tw), rel=1e-6)
    assert ratio == pytest.approx(1 / 3, abs=0.05)


def test_activations_in_flight_on_the_simulated_timeline():
    p, m = 4, 8
    ops = _run("zb-h1", p, m).ops
    for stage in range(p):
        mine = ops[(ops["stage"] == stage) & ops["name"].str.match(r"[FW]\d+\.c0\.L\d+$")].sort_values("start_s")
        live = peak = 0
        for name in mine["name"]:
            live += 1 if name[0] == "F" else -1
            peak = max(peak, live)
        assert peak == p


def test_split_backward_runs_1f1bs_kernels_and_reduces_after_the_weight_gradients():
    model = model_from_dict(uniform_model(4))
    par = dict(pp=2, dp=2, zero=1, global_batch=8)
    z = training_step(model, ParallelConfig(schedule="zb-h1", **par), TrainingSpec(seq_len=128))
    o = training_step(model, ParallelConfig(schedule="1f1b", **par), TrainingSpec(seq_len=128))
    assert z.executed_flops == pytest.approx(o.executed_flops)
    assert sum(op.nbytes for op in z.graph.ops if op.kind == "compute") == pytest.approx(
        sum(op.nbytes for op in o.graph.ops if op.kind == "compute"))
    w_ops = [op for op in z.graph.ops if op.name.startswith("W")]
    assert {k.category for op in w_ops for k in op.parts} == {"gemm", "elementwise"}
    # the only element-wise weight gradient: the embedding's scatter-add, on the first stage
    assert {op.stage for op in w_ops if any(k.category == "elementwise" for k in op.parts)} == {0}
    ops = z.graph.ops
    for rs in (op for op in ops if op.name == "grad_reduce_scatter"):
        assert ops[rs.deps[0]].name.startswith("W")          # a bucket is ready once its weight gradients are
    dp = lambda step: sum(op.nbytes * op.count for op in step.graph.ops  # noqa: E731
                          if op.kind == "collective" and op.name.startswith("grad_"))
    assert dp(z) == pytest.approx(dp(o))


@pytest.mark.parametrize("fidelity", ["fast", "lockstep"])
def test_representatives_agree_with_full(fidelity):
    doc = {"cluster": {"preset": "dgx-h100", "nodes": 2},
           "model": {"preset": "gpt2-small", "heads": 16, "kv_heads": 16},
           "parallel": {"tp": 2, "pp": 2, "dp": 4, "zero": 1, "global_batch": 16, "schedule": "zb-h1",
                        "sequence_parallel": True},
           "training": {"seq_len": 1024}}
    exp = experiment_from_dict(doc)
    full = run_experiment(exp, force=True, fidelity="full")
    rep = run_experiment(exp, force=True, fidelity=fidelity)
    assert rep.step_time == pytest.approx(full.step_time, rel=0.02)
    for cls, nbytes in full.bytes_by_class.items():
        assert rep.bytes_by_class[cls] == pytest.approx(nbytes, rel=1e-9)


@pytest.mark.parametrize("par, match", [
    ({"pp": 2, "global_batch": 4, "schedule": "zb-h1", "virtual_stages": 2}, "parallel.virtual_stages: 2 needs"),
    ({"pp": 2, "dp": 2, "global_batch": 4, "schedule": "zb-h1", "zero": 3}, "zb-h1 is modelled with DDP"),
    ({"pp": 2, "global_batch": 4, "schedule": "zb-h1", "tp": 2, "sequence_parallel": True, "tp_comm_overlap": True},
     "parallel.tp_comm_overlap: not modelled with schedule: zb-h1"),
    ({"pp": 2, "global_batch": 4, "schedule": "zb-1p"}, "parallel.schedule"),
])
def test_bad_configs_are_one_line_errors(par, match):
    with pytest.raises(ConfigError, match=match):
        validate(model_from_dict(uniform_model(4)), ParallelConfig(**par), TrainingSpec(seq_len=128))


def test_moe_and_blocking_p2p_are_refused():
    moe = {**uniform_model(4), "experts": 4, "top_k": 2, "moe_ffn_hidden": 512}
    with pytest.raises(ConfigError, match="zb-h1 is modelled for dense models"):
        validate(model_from_dict(moe), ParallelConfig(pp=2, global_batch=4, schedule="zb-h1"),
                 TrainingSpec(seq_len=128))
    with pytest.raises(ConfigError, match="options.p2p: blocking .* use p2p: async with zb-h1"):
        training_step(model_from_dict(uniform_model(4)), ParallelConfig(pp=2, global_batch=4, schedule="zb-h1"),
                      TrainingSpec(seq_len=128), StepOptions(p2p="blocking"))
