"""Ring attention's steps (``parallel.cp_comm_type: p2p``) as Transformer Engine runs them (2026-12-05).

Truths used (Transformer Engine's code, the published kernel rates and hand counts; never the simulator's numbers):

* ``AttnFuncWithCPAndKVP2P`` (``transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py``,
  TE >= 2.2; ``cp_p2p_fwd_prepare_qkv`` / ``cp_p2p_fwd_fused_attn`` and their backward twins), causal mask over
  the load-balanced split: forward step ``i`` of CP rank ``r`` is the diagonal (the causal kernel on the rank's
  ``s/cp`` queries and its own ``s/cp`` keys) at ``i = 0``, "lower-triangle" (every query over the first half of
  the keys, ``no_mask``) for ``1 <= i <= r``, "upper-triangle" (the second half of the queries over every key,
  ``no_mask``) for ``i > r``; the backward runs the sections in reverse (``i = cp - 1`` diagonal,
  ``i >= cp - 1 - r`` lower). Each step computes half of an ``s/cp x s/cp`` block: ``2 a d (s/cp)^2``
  FLOPs forward for ``a`` heads of width ``d`` (FlashAttention's convention: 4 per query-key pair and head
  dimension, a causal mask halving it), 2.5x that backward.
* Rates: Shah et al. 2024, *FlashAttention-3* (arXiv:2407.08608v2), Fig. 5 and 6, cuDNN 9.1.1 on an H100
  SXM5 (989.4 TFLOP/s peak), head dimension 128: forward 529 TFLOP/s causal at 8K, 600 / 609 without a mask
  at 8K / 4K; backward without a mask 518 / 499 at 8K / 4K; the causal backward is the unmasked one times the
  forward's causal / unmasked ratio (518 x 529 / 600 at 8K: simulator.attention's documented rule). A kernel's
  rate is looked up at its key length.
* Merges (the same file): forward ``torch.clone`` / ``flash_attn_fwd_softmax_lse_correction`` /
  ``flash_attn_fwd_second_half_softmax_lse_correction`` of the fp32 statistics, one per step;
  ``flash_attn_fwd_out_correction_init`` / ``flash_attn_fwd_out_correction`` /
  ``flash_attn_fwd_second_half_out_correction`` of the bf16 output after the loop; backward ``copy_`` / ``add_``
  of ``dq`` into ``dq_buffer`` and of ``dk``, ``dv`` into the received buffer, by the branches of
  ``AttnFuncWithCPAndKVP2P.backward``. A copy reads and writes each element, an add reads two and writes one.
"""

import pytest

from simulator.attention import attention_fraction
from simulator.compute import ComputeModel
from simulator.experiment import experiment_from_dict, run_experiment
from topologies import get_gpu
from workloads.flops import layer_ops, ring_attention_steps
from workloads.models import model_from_dict
from workloads.parallel import ParallelConfig, RankLayout, TrainingSpec
from workloads.training import training_step

HEADS, KV_HEADS, HD = 8, 2, 128
MODEL = {"name": "cpm", "layers": 2, "hidden": HEADS * HD, "heads": HEADS, "kv_heads": KV_HEADS, "ffn_hidden": 4096,
         "vocab": 1024, "gated_mlp": False, "tied_embeddings": False}
CP, S = 4, 32768          # s / cp = 8,192 tokens a rank, halves of 4,096
BLOCK, HALF = S // CP, S // (2 * CP)
H100 = get_gpu("H100")
TF = 1e12


def _steps(backward, rank):
    model = model_from_dict(MODEL)
    ops = layer_ops(model, 1, S, cp=CP, cp_comm_type="p2p")
    op = next(o for o in (ops.backward if backward else ops.forward) if o.name.startswith("attention"))
    return ring_attention_steps(op, model, 1, S, 1, CP, rank)


def _sections(backward, rank):
    """Hand table of TE's sections, step by step."""
    forward = ["diagonal"] + ["lower"] * rank + ["upper"] * (CP - 1 - rank)
    return ["upper"] * (CP - 1 - rank) + ["lower"] * rank + ["diagonal"] if backward else forward


@pytest.mark.parametrize("backward", [False, True])
@pytest.mark.parametrize("rank", range(CP))
def test_step_flops_and_rates_follow_te_sections(backward, rank):
    cm = ComputeModel(H100, op_overhead_s=0.0)
    flops = 2 * HEADS * HD * BLOCK ** 2 * (2.5 if backward else 1.0)  # half of an s/cp x s/cp block
    # published TFLOP/s (FA3 paper, cuDNN, d = 128) by section: (causal or not, key length)
    rate = ({"diagonal": 518 * 529 / 600, "lower": 499, "upper": 518} if backward
            else {"diagonal": 529, "lower": 609, "upper": 600})
    shape = {"diagonal": (BLOCK, BLOCK, HD), "lower": (BLOCK, HALF, HD), "upper": (HALF, BLOCK, HD)}
    steps = _steps(backward, rank)
    assert len(steps) == CP
    for step, section in zip(steps, _sections(backward, rank)):
        k = step[0].kernel()
        assert k.category == ("attention" if section == "diagonal" else "attention_nomask") + (
            "_bwd" if backward else "")
        assert k.shape == shape[section] and k.batch == HEADS
        assert k.flops == pytest.approx(flops, rel=1e-12)
        assert cm.duration(k) == pytest.approx(flops / (rate[section] * TF), rel=1e-9)
        assert all(x.category == "elementwise" and x.flops == 0 for x in step[1:])


# the rank's tensors: O and Q of b s/cp a d elements, K and V of b s/cp a_kv d, statistics b s/cp a fp32 values
O = Q = BLOCK * HEADS * HD * 2        # bytes (bf16)
K = V = BLOCK * KV_HEADS * HD * 2
L = BLOCK * HEADS * 4


@pytest.mark.parametrize("rank", range(CP))
def test_forward_merges_are_te_corrections(rank):
    steps = _steps(False, rank)
    merges = [[x.nbytes for x in step[1:]] for step in steps]
    lse = [2 * L] + [3 * L] * rank + [1.5 * L] * (CP - 1 - rank)         # clone; full; second half
    out = [2 * O + 2 * L] + [3 * O + 2 * L] * rank + [(3 * O + 2 * L) / 2] * (CP - 1 - rank)  # init; full; half
    assert merges[0] == []
    for i in range(1, CP - 1):  # step i - 1's statistics merged beside step i
        assert merges[i] == [lse[i - 1]]
    assert merges[-1] == pytest.approx([lse[-2], lse[-1], *out], rel=1e-12)  # then every output after the loop
    cm = ComputeModel(H100, op_overhead_s=0.0)
    assert cm.duration(steps[-1][-1].kernel()) == pytest.approx(steps[-1][-1].nbytes / (3.35e12 * 0.85), rel=1e-12)


def test_forward_merges_of_rank_1_by_hand():
    # rank 1 of 4: statistics 2 L + 3 L + 1.5 L + 1.5 L; outputs (2 O + 2 L) + (3 O + 2 L) + 2 (1.5 O + L)
    total = sum(x.nbytes for step in _steps(False, 1) for x in step[1:])
    assert total == pytest.approx(8 * 262_144 + 8 * 16_777_216 + 6 * 262_144, rel=1e-12)


# backward: per step, (dq, dk, dv) kernels' bytes by TE's branches, for each rank of 4
COPY, ADD = 2, 3  # bytes per element moved, over a 2-byte element: x 2 below
BACKWARD = {
    0: [  # upper, upper, upper, diagonal
        ([Q / 2 * COPY], [K * COPY], [V * COPY]),                        # dq[1].copy_; dk.copy_
        ([Q / 2 * ADD], [K * ADD], [V * ADD]),                           # dq[1].add_; dk.add_
        ([Q / 2 * ADD], [K * ADD], [V * ADD]),
        ([Q / 2 * COPY, Q / 2 * ADD], [K / 2 * ADD, K / 2 * COPY], [V / 2 * ADD, V / 2 * COPY]),
    ],
    2: [  # upper, lower, lower, diagonal
        ([Q / 2 * COPY], [K * COPY], [V * COPY]),
        ([Q / 2 * COPY, Q / 2 * ADD], [K / 2 * ADD], [V / 2 * ADD]),     # dq[0].copy_, dq[1].add_; dk[0].add_
        ([Q * ADD], [K / 2 * ADD], [V / 2 * ADD]),
        ([Q * ADD], [K * ADD], [V * ADD]),
    ],
    3: [  # lower, lower, lower, diagonal
        ([Q * COPY], [K / 2 * COPY], [V / 2 * COPY]),                    # dq.copy_; dk[0].copy_
        ([Q * ADD], [K / 2 * ADD], [V / 2 * ADD]),
        ([Q * ADD], [K / 2 * ADD], [V / 2 * ADD]),
        ([Q * ADD], [K * ADD], [V * ADD]),
    ],
}


@pytest.mark.parametrize("rank", sorted(BACKWARD))
def test_backward_accumulations_are_te_copies_and_adds(rank):
    steps = _steps(True, rank)
    for step, (dq, dk, dv) in zip(steps, BACKWARD[rank]):
        assert [x.nbytes for x in step[1:]] == pytest.approx(dq + dk + dv, rel=1e-12)


def test_merges_scale_with_micro_batch_tensor_parallel_and_dtype():
    """The generator's merges over one TP rank's heads (``a / t`` query, ``a_kv / t`` key heads) of a micro-batch of
    ``b`` sequences in fp32: the hand counts above with ``b / t`` times the elements, 4-byte values, and the
    statistics fp32 as always (b = 3, t = 2 so that neither factor can stand in for the other)."""
    b, t, d = 3, 2, 4
    q = b * BLOCK * HEADS // t * HD        # elements of a rank's Q (and O): s/cp tokens of b sequences, a/t heads
    k = b * BLOCK * KV_HEADS // t * HD     # of its K (and V)
    lse = b * BLOCK * HEADS // t * 4       # bytes of its statistics
    par = ParallelConfig(tp=t, cp=CP, micro_batch=b, global_batch=b, sequence_parallel=True)
    step = training_step(model_from_dict(MODEL), par, TrainingSpec(seq_len=S, dtype="fp32"))
    lay = RankLayout(par)
    ops = {(lay.coords(op.rank).cp, op.name): op.parts for op in step.graph.ops
           if op.kind == "compute" and op.parts and lay.coords(op.rank).tp == 0}
    for r in range(CP):
        # forward steps 1 and 2 (op cp3): each merges the previous step's statistics (the first one cloned)
        middle = [x.nbytes for x in ops[r, "F0.c0.L1.cp3"] if x.category == "elementwise"]
        assert middle == pytest.approx([2 * lse, (3 if r >= 1 else 1.5) * lse], rel=1e-12)
        # the last step (op cp4): steps 2 and 3's statistics, then every step's output after the loop
        last = [x.nbytes for x in ops[r, "F0.c0.L1.cp4"][1:7]]
        assert last == pytest.approx([(3 if r >= 2 else 1.5) * lse, (3 if r == 3 else 1.5) * lse,
                                      2 * q * d + 2 * lse,
                                      *((3 * q * d + 2 * lse) / (1 if i <= r else 2) for i in (1, 2, 3))], rel=1e-12)
        # backward step 0 (op cp2): an upper step copies dq's second half and the whole dk, dv; CP index
        # cp - 1's lower step the whole dq and dk, dv's first half
        first = [x.nbytes for x in ops[r, "B0.c0.L1.cp2"] if x.category == "elementwise"]
        copies = [q / 2, k, k] if r < CP - 1 else [q, k / 2, k / 2]
        assert first == pytest.approx([2 * x * d for x in copies], rel=1e-12)


def test_mha_backward_merges_most_on_cp_index_0_by_hand():
    """With as many K, V heads as query heads (X bytes each of Q, K, V on a rank), TE's backward branches merge
    (copy 2, add 3 per element) on CP index 0: step 0 dq[1] copy + dk, dv copy (1 + 2 + 2 X), the middle steps
    dq[1] add + dk, dv add (1.5 + 3 + 3 X), the diagonal dq[0] copy, dq[1] add, dk, dv half add half copy
    (2.5 + 2.5 + 2.5 X): 27.5 X at cp = 4; on index cp - 1: dq copy, dk[0], dv[0] copy (2 + 1 + 1 X), then dq
    add, dk[0], dv[0] add (3 + 1.5 + 1.5 X), the diagonal all added (9 X): 25 X. (The lockstep representative,
    index cp - 1, is not the most merging member here: docs/DESIGN.md, "Context parallelism".)"""
    model = model_from_dict({**MODEL, "kv_heads": HEADS})
    op = next(o for o in layer_ops(model, 1, S, cp=CP, cp_comm_type="p2p").backward if o.category == "attention_bwd")
    x = BLOCK * HEADS * HD * 2
    total = {r: sum(k.nbytes for step in ring_attention_steps(op, model, 1, S, 1, CP, r) for k in step[1:])
             for r in (0, CP - 1)}
    assert total == pytest.approx({0: 27.5 * x, CP - 1: 25 * x}, rel=1e-12)


def _cp_kernels(cp, kind, **par):
    model = model_from_dict(MODEL if kind != "a2a" else {**MODEL, "kv_heads": HEADS})
    step = training_step(model, ParallelConfig(cp=cp, cp_comm_type=kind, global_batch=1, **par),
                         TrainingSpec(seq_len=S))
    return {(op.rank, op.name): op.parts for op in step.graph.ops if op.kind == "compute" and op.parts}


def test_the_generator_runs_each_ranks_steps_around_the_ring():
    ops = _cp_kernels(CP, "p2p")
    for rank in range(CP):  # (the CP group is the whole world here: rank = CP index)
        forward = [k.category for i in (2, 3, 4) for k in ops[rank, f"F0.c0.L1.cp{i}"]]
        attention = [c for c in forward if c.startswith("attention")]
        assert attention == ["attention" if s == "diagonal" else "attention_nomask" for s in _sections(False, rank)]
        assert forward[:1] == ["attention"]
        assert forward.count("elementwise") >= CP + CP  # the statistics' and the outputs' merges
        backward = [k.category for i in (2, 3, 4) for k in ops[rank, f"B0.c0.L1.cp{i}"]]
        assert [c for c in backward if c.startswith("attention")] == [
            "attention_bwd" if s == "diagonal" else "attention_nomask_bwd" for s in _sections(True, rank)]


@pytest.mark.parametrize("kind", ["all_gather", "a2a"])
def test_other_cp_kinds_and_no_cp_keep_causal_kernels_only(kind):
    for parts in [*_cp_kernels(2, kind).values(), *_cp_kernels(1, "p2p").values()]:
        assert not any(k.category.startswith("attention_nomask") for k in parts)


def test_a_lockstep_representative_runs_the_slowest_cp_rank():
    """CP index ``cp - 1`` runs every step on all its queries (the full output merges, the full dq adds): with
    GQA's narrower K, V the slowest member; the ring waits for it in ``full``, and a representative standing
    for the CP group runs its steps (its own, index 0's, would finish the ring's steps early)."""
    def run(fidelity):
        doc = {"cluster": {"preset": "dgx-h100", "nodes": 1}, "model": MODEL,
               "parallel": {"tp": 2, "cp": CP, "dp": 1, "global_batch": 2, "recompute": "selective",
                            "sequence_parallel": True},
               "training": {"seq_len": S}}
        return run_experiment(experiment_from_dict(doc), fidelity=fidelity, force=True)
    full, lockstep = run("full"), run("lockstep")
    ops = lockstep.rep_ops
    assert sorted(ops["rank"].unique()) == [0]
    step = training_step(model_from_dict(MODEL), ParallelConfig(tp=2, cp=CP, global_batch=2, recompute="selective",
                                                                sequence_parallel=True),
                         TrainingSpec(seq_len=S), representatives="stage")
    first = next(op for op in step.graph.ops if op.name == "F0.c0.L1.cp2")
    model = model_from_dict(MODEL)
    attention = next(o for o in layer_ops(model, 1, S, 2, cp=CP).forward if o.category == "attention")
    assert list(first.parts) == [x.kernel() for x in ring_attention_steps(attention, model, 1, S, 2, CP, CP - 1)[0]]
    middle = next(op for op in step.graph.ops if op.name == "F0.c0.L1.cp3")
    assert [k.category for k in middle.parts] == ["attention_nomask", "elementwise"] * (CP - 2)
    # (index 0's steps read 1.6% faster here; cp - 1's are not the slowest of every op: its forward steps' keys
    # are half as long, which cuDNN runs 1.5% faster at 4K than at 8K)
    assert lockstep.step_time == pytest.approx(full.step_time, rel=1e-3)


def test_unmasked_rates_are_the_papers_and_head_dim_256_backward_is_derived():
    peak = 989.4  # FA3 paper's H100 SXM5 dense bf16
    assert attention_fraction("sm90", "cudnn", False, 128, 8192, causal=False) == pytest.approx(600 / peak)
    assert attention_fraction("sm90", "fa3", True, 64, 2048, causal=False) == pytest.approx(422 / peak)
    assert attention_fraction("sm80", "fa2", True, 128, 4096, causal=False) == pytest.approx(187 / 312)
    # no published backward at d = 256: d = 128's (518 at 8K) times the forwards' ratio (580 / 600)
    assert attention_fraction("sm90", "cudnn", True, 256, 8192, causal=False) == pytest.approx(518 * 580 / 600 / peak)
    # the causal rates are unchanged
    assert attention_fraction("sm90", "cudnn", False, 128, 8192) == pytest.approx(529 / peak)
