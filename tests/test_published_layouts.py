"""Published training layouts as a new user writes them (helper hunt 11): the refusal of a step too large
suggests ``fidelity: lockstep`` only where lockstep would simulate fewer ranks; layers that do not split over
the pipeline are answered with Megatron-Core's end-chunk split where it applies.

Truth: which ranks the builder emits per fidelity (workloads/training.py ``TrainingStep.build``: lockstep is
``representatives="stage"``; an expert grid, ``etp != tp``, emits every rank in fast and full, and in lockstep
too unless one rank can issue for its whole EP group), read off the refusal's own rank count."""

import dataclasses

import pytest

from simulator.cli import main
from workloads.errors import ConfigError
from workloads.models import get_preset, model_from_dict
from workloads.op_budget import LOCKSTEP_HINT, StepTooLargeError
from workloads.parallel import ParallelConfig, TrainingSpec, validate
from workloads.training import training_step

DENSE = ParallelConfig(tp=2, pp=2, dp=2, micro_batch=1, global_batch=16, sequence_parallel=True)
# NeMo's DeepSeek-V3 H100 recipe has TP 2 with expert TP 1 (model_configs_h100.csv): experts on their own grid
MOE = model_from_dict({"preset": "tiny", "experts": 4, "top_k": 2})
EXPERT_GRID = ParallelConfig(tp=2, pp=1, dp=4, ep=4, etp=1, micro_batch=1, global_batch=8, sequence_parallel=True)


def _refusal(model, parallel, representatives) -> StepTooLargeError:
    with pytest.raises(StepTooLargeError) as info:
        training_step(model, parallel, TrainingSpec(seq_len=128), representatives=representatives, max_ops=10)
    return info.value


def test_fast_suggests_lockstep_for_a_dense_layout():
    # fast simulates one rank per TP group (4 of 8), lockstep one per stage (2): the hint is worth giving
    err = _refusal(get_preset("tiny"), DENSE, "tp")
    assert "(4 simulated ranks" in str(err) and str(err).endswith(LOCKSTEP_HINT)


def test_lockstep_does_not_suggest_itself():
    err = _refusal(get_preset("tiny"), DENSE, "stage")
    assert "(2 simulated ranks" in str(err)  # one per pipeline stage: this is lockstep already
    assert "lockstep" not in str(err)


@pytest.mark.parametrize("representatives", ["tp", None])
def test_an_expert_grid_suggests_lockstep_where_one_rank_stands_for_the_stage(representatives):
    # etp 1 under TP 2: fast and full emit all 8 ranks (TP peers are other EP members), lockstep one: its
    # representative issues for its whole EP group (no expert-TP gather carries a member's own load)
    err = _refusal(MOE, EXPERT_GRID, representatives)
    assert "(8 simulated ranks" in str(err) and str(err).endswith(LOCKSTEP_HINT)
    assert "(1 simulated ranks" in str(_refusal(MOE, EXPERT_GRID, "stage"))


@pytest.mark.parametrize("representatives", ["tp", "stage", None])
def test_an_expert_grid_lockstep_cannot_shrink_never_suggests_it(representatives):
    # etp 2 over tp 1 under (default, uniform) routing: each member's expert-TP all-gather carries its own load,
    # which one collective of a representative's cannot, so every fidelity emits all 8 ranks
    grid = dataclasses.replace(EXPERT_GRID, tp=1, etp=2, dp=8, sequence_parallel=False)
    err = _refusal(MOE, grid, representatives)
    assert "(8 simulated ranks" in str(err)
    assert "lockstep" not in str(err)


def test_expert_tp_equal_to_tp_keeps_the_hint():
    # the same MoE layout with etp = tp: fast emits 4 ranks, lockstep fewer, so the hint stays
    err = _refusal(MOE, dataclasses.replace(EXPERT_GRID, etp=None), "tp")
    assert "(4 simulated ranks" in str(err) and str(err).endswith(LOCKSTEP_HINT)


def _layout_error(model: str, **parallel) -> str:
    with pytest.raises(ConfigError) as info:
        validate(get_preset(model), ParallelConfig(micro_batch=1, global_batch=64, **parallel),
                        TrainingSpec(seq_len=8192))
    return str(info.value)


def test_uneven_layers_hint_megatrons_end_chunk_split():
    # NeMo's Llama 3.1 405B recipe (model_configs_h100.csv: TP 8, PP 8, VP 8; pretrain_llama31_405b.py sets
    # account_for_embedding/loss_in_pipeline_split): 126 layers + embedding + loss = 128 = 64 chunks of 2, the
    # model's first chunk (embedding + 1 layer) and last (1 layer + loss) one layer short. Worked by hand:
    message = _layout_error("llama3-405b", tp=8, pp=8, dp=1, virtual_stages=8, schedule="interleaved")
    assert message.endswith("stage_layers: [[1,2,2,2,2,2,2,2],16,16,16,16,16,16,[2,2,2,2,2,2,2,1]])")
    # without interleaving, PP 16: 128 / 16 = 8 a stage, the end stages 7 (Llama 3's 405B schedule)
    message = _layout_error("llama3-405b", tp=8, pp=16, dp=1)
    assert message.endswith("stage_layers: [7,8,8,8,8,8,8,8,8,8,8,8,8,8,8,7])")


def test_the_hinted_split_is_accepted():
    stages = [[1, 2, 2, 2, 2, 2, 2, 2]] + [16] * 6 + [[2, 2, 2, 2, 2, 2, 2, 1]]
    validate(get_preset("llama3-405b"), ParallelConfig(tp=8, pp=8, dp=1, micro_batch=1, global_batch=64,
                    virtual_stages=8, schedule="interleaved", stage_layers=stages), TrainingSpec(seq_len=8192))


def test_no_end_chunk_hint_where_layers_plus_two_do_not_split():
    # DeepSeek-V3: 61 + 2 = 63 layers' places do not split over 16 stages (NeMo gives first 3, last 2 instead)
    message = _layout_error("deepseek-v3", tp=2, pp=16, dp=1)
    assert message.endswith("(or give parallel.stage_layers)") and "Megatron's" not in message


def test_one_micro_batch_is_singular(tmp_path, capsys):
    # OPT-175B's layout (Zhang et al. 2022: FSDP + TP 8, no pipeline) runs one micro-batch a step per replica
    path = tmp_path / "one.yaml"
    path.write_text("cluster: {preset: dgx-h100, nodes: 1}\nmodel: {preset: tiny}\n"
                    "parallel: {tp: 1, pp: 1, dp: 8, micro_batch: 1, global_batch: 8}\ntraining: {seq_len: 128}\n")
    assert main(["run", str(path), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "(1 micro-batch)" in out and "micro-batches)" not in out
