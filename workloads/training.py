"""One training step of a dense (or MoE) transformer as per-rank op graphs.

:func:`training_step` turns a model, a parallel configuration and a training
spec into an :class:`~workloads.ops.OpGraph`. It is the only place that knows
what DP, TP, PP and ZeRO mean; the simulator just runs the ops.

What each rank runs (Megatron-LM semantics)
-------------------------------------------
Pipeline
    The actions of :func:`~workloads.schedules.pipeline_schedule` (GPipe,
    1F1B, interleaved 1F1B or Zero Bubble H1) in order. A forward of virtual
    stage ``j > 0`` waits for the activation from stage ``j - 1`` (a send/recv of ``b·s·h``
    elements, ``/ tp`` with sequence parallelism); a backward of ``j < last``
    waits for the activation gradient from ``j + 1``. Activations and
    gradients travel on their own streams and tags, so they never block each
    other; sends are asynchronous to compute. Under ``zb-h1`` a backward
    ``B`` computes the input gradient (data-gradient GEMMs, attention and norm
    backward, the TP collectives, the gradient sent upstream) and a separate
    ``W`` action the weight gradients (the linear layers' ``.wgrad`` GEMMs,
    the gradient accumulation, the embedding's scatter-add); DP buckets are
    ready after ``W``.
DualPipe (``parallel.schedule: dualpipe``; DeepSeek-V3, arXiv 2412.19437 section 3.2.1)
    Rank ``r`` holds two chunks: model stage ``r`` for the micro-batches that
    enter at rank 0 and model stage ``p - 1 - r`` for those that enter at
    rank ``p - 1`` (:func:`~workloads.schedules.pipeline_schedule`). A
    backward whose weight gradient the reference defers is split into ``B``
    and ``W`` as under ``zb-h1``; the others are whole. An overlapped pair (a
    forward and a backward of the other direction) receives both inputs
    before it starts and sends both outputs after it ends, as the reference
    does; its two passes run interleaved on the compute stream piece by piece
    (a MoE layer cut at its exchanges: before the dispatch, the experts,
    after the combine, and the shared expert's two halves beside dispatch
    and combine with ``moe.shared_expert_overlap``), each chunk's exchanges
    (all-to-alls or DeepEP's two hops, expert-TP gather / scatter) on
    streams of its own (``ep_f``, ``ep_b``), so that one chunk's dispatch
    and combine run under the other chunk's computation.
    What is modelled: that hiding, with the pieces in the order above.
    In a pair with a MoE layer the GEMMs run on the SMs the exchanges leave
    (``options.dualpipe_comm_sms``, DeepSeek's 20 of 132; section 3.2.2).
    What is approximated: the pieces run one at a time, the SMs are held
    for the whole pair (not only while an exchange is in flight; attention
    and memory-bound kernels keep every SM), the
    order inside a pair is a fixed alternation rather than DeepSeek's
    hand-tuned one, and pipeline sends of a pair wait for the whole pair.
    Outside pairs the all-to-alls block the compute stream as usual. The two
    copies of a stage (ranks ``r`` and ``p - 1 - r``) reduce their gradients
    together: the gradient group is the DP x CP ranks of both stages (the
    distributed optimizer shards over it too).
Interleaved with blocking transfers (``options.p2p: blocking``)
    Megatron's batched ``batch_isend_irecv`` exchanges at the points of
    :func:`~workloads.schedules.interleaved_exchanges`: the sends and
    receives of an exchange are posted when the computation before it ends
    and the next computation waits for all of them (a send completes when its
    receiver has posted the matching receive). Received tensors are queued
    in arrival order for the actions that need them.
Tensor parallel
    Megatron column/row split. Per layer, forward: two all-reduces of
    ``b·s·h`` elements (with sequence parallelism: two all-gathers and two
    reduce-scatters of the same size); backward: the same count again; full
    recomputation repeats the forward's. The vocab-parallel embedding adds
    one forward all-reduce (reduce-scatter with SP, all-gather back in
    backward) on the first stage; the output layer on the last stage adds the
    all-reduce of its input gradient in backward (with SP: an all-gather
    before it in forward, a reduce-scatter in backward). TP collectives run
    on the compute stream: Megatron does not overlap them with compute,
    unless ``tp_comm_overlap``. The exception: with sequence parallelism the
    backward also all-gathers the QKV and MLP-up inputs again (saved split
    over the sequence) for their weight gradients, asynchronously beside the
    data-gradient GEMMs (Megatron-LM's
    ``LinearWithGradAccumulationAndAsyncCommunication``, TE's ``Linear``):
    2 more all-gathers per layer and backward on stream ``tp_regather``,
    which the pass's blocking TP collectives wait for; 10 buffers per layer
    in all, as with the overlap. Context-parallel layers run them too (their
    ``b s/cp h`` share); a MoE layer's pass re-gathers the QKV input and,
    with shared experts, theirs (:meth:`_StepBuilder._regathers`).
    Multi-head latent attention (``model.kv_lora_rank``) communicates its
    latents instead of the attention input (Megatron-Core's
    ``MLASelfAttention.get_query_key_value_tensors``; :meth:`_StepBuilder._tp_widths`):
    with SP the forward all-gathers ``b s r_q``, ``b s r_kv`` and
    ``b s d_rope`` (``b s h`` for the query without ``q_lora_rank``) where
    standard attention gathers ``b s h``, the backward reduce-scatters the
    same three and re-gathers the first two; ``mla_up_proj`` recomputation
    all-gathers the first two again; without SP the backward all-reduces
    the first two. The output projection keeps its ``b s h`` collectives.
TP communication overlap (``parallel.tp_comm_overlap``; Transformer Engine userbuffers, SP only)
    The layers' SP collectives are overlapped with their GEMMs by TE's
    default method per GEMM (:data:`UB_METHODS`): a ring exchange cuts the
    GEMM into ``t`` chunks along its tokens, one per arriving block, so it
    takes ``a + (t - 1) max(a, c)`` (chunk ``a``, block transfer ``c``); a
    pipelined reduce-scatter cuts it into 4 chunks whose reduce-scatters run
    beside the next chunk (``g + r + 3 max(g, r)``); the column-parallel
    backward runs its data gradient beside the all-gather of the saved input
    (which TE re-gathers for the weight gradient) and its weight gradient
    beside the reduce-scatter of the data gradient. The overlapped
    collectives run on stream ``tp_overlap``; GEMMs beside the pipelined and
    bulk communication run on the SMs it leaves
    (``options.tp_comm_overlap_sms``). Per layer and pass: forward 2
    all-gathers and 2 reduce-scatters, backward 4 all-gathers and 2
    reduce-scatters of ``b s h`` elements (the all-gathers in FP8 under
    ``fp8``); the embedding and output-layer collectives stay blocking.
Data parallel
    Gradients (``grad_dtype_bytes`` per element; default the ZeRO
    implementation's: fp32 under Megatron for bf16/fp8, the training dtype
    under DeepSpeed and FSDP — :func:`~workloads.sharding.sharding_plan`)
    of the rank's parameters are cut into buckets of
    ``parallel.grad_bucket_bytes`` in backward order and reduced as soon as a
    bucket's last layer has finished its final micro-batch backward
    (``overlap_grad_reduce``) or after the whole backward. ZeRO-0: all-reduce
    (or the parameter-server pattern with ``dp_sync: parameter_server``);
    ZeRO-1/2: reduce-scatter, optimizer step on the shard, then an all-gather
    of the updated 16-bit parameters (class ``zero``); ZeRO-3: reduce-scatter
    of gradients, plus an all-gather of each chunk's parameters (the
    embedding / output layer included on the first / last virtual stage)
    before every forward and every backward, prefetched one action ahead (class
    ``zero``). Gradients are reduced once per step, at the last micro-batch
    (Megatron's behaviour; DeepSpeed's ZeRO-2/3 reduce every micro-batch).
    Pipeline stages holding the tied word embedding all-reduce its gradient.
FP8 (``training.dtype: fp8``; Transformer Engine under Megatron-Core, delayed scaling)
    The layers' kernels come with their FP8 GEMMs and casts
    (:mod:`workloads.flops`). Before the first forward of each chunk in the
    step, ``F….fp8_weight_cast`` casts its FP8 weights (read 2, write the FP8
    copy and its transpose: 4 bytes per weight; 2 with
    ``training.fp8_param_gather``, whose weights are already FP8: transpose
    only); TE caches them for the other micro-batches. After every forward and
    every backward of a chunk (TE's ``fp8_autocast`` exit and end of backward)
    the amax buffer (fp32, history length 1, 3 forward and 2 backward entries
    per FP8 GEMM: :func:`~workloads.flops.fp8_gemm_modules`) is all-reduced
    (max) over the stage's TP x DP group, Megatron's default amax-reduction
    group, on the compute stream (class ``sync``), then a small kernel updates
    the scales. With ``fp8_param_gather`` the optimizer writes FP8 weights and
    the ZeRO-1 parameter all-gather carries 1 byte per FP8 weight.
Context parallel (``parallel.cp``; Megatron-Core / Transformer Engine)
    Every rank works on ``s / cp`` tokens (kernels, TP collectives and pipeline
    transfers shrink by ``cp``) and layers are emitted one by one, cut at their
    attention. Ring attention (``cp_comm_type: p2p``) passes K and V around the
    CP ring while the ``cp`` attention steps run: a ring all-gather (class
    ``cp``, stream ``cp``) of the layer's K and V, ``2 b s kv / t`` elements,
    starts when the QKV GEMM is done; the first attention step runs on the
    local block, the middle ``cp - 2`` steps after it, and the last step (with
    the rest of the layer) once the ring has delivered every block, so the
    attention takes ``a + (cp - 1) max(a, c)`` for a step's compute ``a`` and a
    block's transfer ``c``. The steps are Transformer Engine's
    (:func:`~workloads.flops.ring_attention_steps`, by the rank's CP index):
    the diagonal one causal, the others unmasked on half the queries or half
    the keys, with the merges of their softmax statistics and outputs (forward)
    or the accumulation of their dQ, dK, dV (backward). The CP ranks' programs
    differ, and the ring, one collective, starts when the slowest arrives; a
    lockstep representative, standing for its CP group, runs CP index
    ``cp - 1``'s steps (every step on all its queries: the most forward
    merging; with GQA's narrow K, V the most backward merging too, while with
    as many K, V heads as query heads index 0's whole dK, dV merge more: then
    lockstep reads up to 0.08% below ``full``). Backward passes K, V and the partial dK, dV: the ring
    carries twice the bytes; a recomputed attention core (selective or full
    recomputation) makes its forward pass again. ``all_gather``: K and
    V all-gathered over CP before attention, blocking (backward: gathered
    again, then dK, dV reduce-scattered). ``a2a`` (Ulysses):
    all-to-alls of Q, K, V before attention and of the output after it
    (backward: of the output gradient and of dQ, dK, dV), blocking, on the
    compute stream. Gradients are reduced (and the distributed optimizer
    sharded) over DP x CP (:meth:`~workloads.parallel.RankLayout.grad_group`).
Compute
    Kernels from :mod:`workloads.flops` (FLOPs, HBM bytes, GEMM shapes);
    recomputation adds the forward (``full``) or the attention core
    (``selective``) to the backward. By default the kernels of one chunk of
    layers for one micro-batch are fused into one coarse op (``granularity
    = "chunk"``), except the final backward of each chunk, which is emitted
    layer by layer so that gradient buckets overlap with it as they do in
    Megatron. ``granularity = "layer"`` emits every layer separately.

Tags
    Compute and TP ops of a forward/backward carry ``micro_batch``, ``stage``
    (pipeline rank) and ``layer`` (first layer of the op); pipeline-bubble
    metrics use the compute-stream ops that carry a micro-batch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from operator import itemgetter
from typing import NamedTuple

import numpy as np

from .errors import ConfigError
from .flops import (
    CP_NEEDS_FUSED_ATTENTION,
    EMBEDDING_GRAD_ACCUMULATE,
    FP8_CAST_BYTES,
    RECOMPUTED_KERNELS,
    LayerOp,
    accumulate_gradients,
    base_name,
    embedding_gradient_accumulation,
    embedding_ops,
    fp8_gemm_modules,
    fp8_weight_params,
    hardware_flops_per_step,
    layer_ops,
    logits_ops,
    model_flops_per_step,
    optimizer_step_ops,
    ring_attention_steps,
)
from .memory import stage_params
from .models import ModelSpec
from .moe import LayerRouting, RoutingModel, deepep_matrices, route_layer
from .op_budget import MAX_OPS, OpBudget
from .ops import FP8_GEMM_CATEGORIES, GEMM_CATEGORIES, Kernel, OpGraph
from .parallel import (
    SPLIT_BACKWARD_SCHEDULES,
    ParallelConfig,
    RankLayout,
    TrainingSpec,
    chunk_layers,
    num_micro_batches,
    padded_vocab,
    stage_layers,
    validate,
)
from .schedules import (
    Exchange,
    PipeAction,
    chain_neighbour,
    chain_position,
    interleaved_exchanges,
    interleaved_table,
    pipeline_schedule,
)
from .sharding import (
    GatherSchedule,
    ShardingPlan,
    Unit,
    Use,
    end_units,
    gather_schedule,
    layer_units,
    module_of,
    sharding_plan,
    stage_uses,
)

GRANULARITIES = ("chunk", "layer")
P2P_MODES = ("async", "blocking")
COMPUTE_STREAM = "compute"
FP8_AMAX_ENTRIES = (3, 2)
"""Transformer Engine's delayed-scaling entries per FP8 GEMM: forward (input, weight, output), backward
(output gradient, input gradient); one fp32 amax each (Megatron's ``fp8_amax_history_len`` default 1)."""
FP8_SCALE_UPDATE_BYTES = 20
"""HBM bytes per scaling entry of ``fused_amax_and_scale_update_after_reduction`` with history length 1:
read the reduced amax, read and write the history, write scale and inverse scale (4 bytes each)."""
UB_METHODS = {
    "qkv": "ring", "mlp_up": "ring",                      # qkv_fprop, fc1_fprop: all-gather of the input
    "attn_out": "pipeline", "mlp_down": "pipeline",        # proj_fprop, fc2_fprop: reduce-scatter of the output
    "attn_out.dgrad": "ring", "mlp_down.dgrad": "ring",    # proj_dgrad, fc2_dgrad: all-gather of dY
    "qkv.dgrad": "bulk_ag", "mlp_up.dgrad": "bulk_ag",     # qkv_dgrad, fc1_dgrad: all-gather of the input
    "qkv.wgrad": "bulk_rs", "mlp_up.wgrad": "bulk_rs",     # qkv_wgrad, fc1_wgrad: reduce-scatter of dX
}
"""Transformer Engine's default userbuffers overlap per GEMM (``initialize_ub`` in
``transformer_engine/pytorch/module/base.py``): ``ring_exchange`` for the all-gather before the column-parallel
forward GEMMs and the row-parallel data-gradient GEMMs (``num_splits = tp`` chunks, peer-to-peer copies on the
copy engines, ``num_sm`` 1 and no SM margin); ``pipeline`` for the reduce-scatter after the row-parallel
forward GEMMs (4 splits, 16 SMs, GEMM on the rest); ``bulk`` for the column-parallel backward: the all-gather of
the saved input beside the data-gradient GEMM, the reduce-scatter of its result beside the weight-gradient GEMM
(16 SMs). Row-parallel weight gradients reuse the gathered ``dY`` and communicate nothing. (Multi-head latent
attention has none: Megatron-Core turns the overlap off for it, :func:`~workloads.parallel.validate` refuses it.)"""
UB_PIPELINE_SPLITS = 4
"""TE's ``num_splits`` of the ``pipeline`` method."""
REGATHER_STREAM = "tp_regather"
"""The stream of the sequence-parallel backward's re-gathers of saved inputs (:meth:`_StepBuilder._regathers`)."""
UB_STREAM = "tp_overlap"
"""The stream of overlapped TP communication."""
DP_STREAM = "dp"
"""The stream of the dense gradients' reductions and parameter gathers (the DP group's NCCL communicator)."""
EXPERT_DP_STREAM = "edp"
"""The stream of the routed experts' gradient reductions and parameter gathers: Megatron-Core issues them over
the expert-DP process group, whose NCCL communicator has a CUDA stream of its own, so they run beside the dense
buffer's (:data:`DP_STREAM`) rather than after them."""
DP_STREAMS = (DP_STREAM, EXPERT_DP_STREAM)
"""The stream of a buffer's collectives, indexed by whether it is the routed experts'."""
LOSS_ALL_REDUCES = (4, 8)
"""Bytes per token of the vocab-parallel cross-entropy's all-reduces over TP, in order (Megatron-Core's fused
``_VocabParallelCrossEntropy.forward``, ``megatron/core/fusions/fused_cross_entropy.py``, the kernel whose HBM
bytes :data:`~workloads.flops.CROSS_ENTROPY_BYTES` are): the fp32 logits maximum (MAX), then the fp32 predicted
logit and sum of exponentials concatenated (SUM); none in the backward."""
RECOMPUTE_PHASE = "R"
"""First letter of a recompute op's name (``R3.c0.L5``: recomputed forward of micro-batch 3, chunk 0, from
layer 5), as ``F`` and ``B`` start forward and backward ops."""


@dataclass(frozen=True)
class StepOptions:
    """Knobs of the generator that are not part of the parallel config.

    Attributes
    ----------
    p2p : {"async", "blocking"}
        Pipeline send/recv semantics. ``async``: receives are posted at the
        start of the step and sends never hold up compute (optimistic).
        ``blocking`` (Megatron-LM's batched isend/irecv + wait): a rank posts
        its receive when it reaches the action that needs it, and its next
        action waits until its previous sends have been received (GPipe,
        1F1B); under ``interleaved`` the transfers are batched and waited for
        where Megatron's interleaved schedule posts them
        (:func:`~workloads.schedules.interleaved_exchanges`). Refused for
        ``zb-h1`` and ``dualpipe``. Default ``async``.
    pp_scatter_gather : bool
        Without sequence parallelism, each TP rank sends only its ``1/t`` of
        the activation (gradient) to the next (previous) stage and the
        receiving stage all-gathers it over TP (Megatron-LM's
        ``scatter_gather_tensors_in_pipeline``, Narayanan et al. SC'21,
        section 4.1): ``1/t`` of the scale-out bytes for one NVLink
        all-gather. Default False, as Megatron-Core runs since 2023: the
        scatter/gather was dropped when the pipeline schedules moved into
        Megatron-Core (commits ``39b83c795`` and ``3c92fa93b``; the unused
        ``--no-scatter-gather-tensors-in-pipeline`` flag was removed in
        NVIDIA/Megatron-LM PR 4140), so each stage sends the whole activation.
        True reproduces Megatron-LM 2021 (the SC'21 validation entries say
        so). With sequence parallelism the activation is already split and
        nothing is gathered either way.
    grad_accumulation_fusion : bool
        The weight-gradient GEMMs accumulate into the gradient buffer in place
        (Megatron-Core's ``gradient_accumulation_fusion``, default True);
        False adds an element-wise accumulation over the layer's gradients
        after every micro-batch's backward (Megatron-LM 2021, PyTorch
        autograd): :func:`~workloads.flops.accumulate_gradients`.
    granularity : {"chunk", "layer"}
        Coarse ops per chunk of layers (fast) or one op per layer (detailed).
    grad_dtype_bytes : int or None
        Bytes per element of the gradient buffer, which is also what goes on
        the wire; default (None) the ZeRO implementation's
        (:func:`~workloads.sharding.sharding_plan`): Megatron-LM (``zero_impl``
        ``auto`` for ZeRO 0-1) keeps and reduces bf16 and fp8 gradients in fp32
        (4), DeepSpeed and FSDP in the training dtype. Set 2 to reduce bf16
        gradients in bf16 under Megatron.
    causal : bool
        Count only the causal half of attention FLOPs (FlashAttention skips
        the masked half); default False, as Narayanan et al.'s formula.
    flash_attention : bool
        Fused attention that never stores the ``s × s`` scores: both the
        memory model and the attention kernels (one fused kernel at
        ``attention_efficiency``, vs. unfused GEMMs + softmax + dropout whose
        scores go through HBM). Default True, as current Megatron-LM /
        TransformerEngine training; False for 2021-22 Megatron runs.
    embedding_and_loss : bool
        Run the embedding lookup on the first pipeline stage and the output
        layer and loss on the last (default True, as real training). False
        leaves out their kernels and TP collectives so that every stage runs
        the same work: the uniform stages of the closed-form pipeline-bubble
        analyses (GPipe; Narayanan et al. SC'21). Their parameters, gradient
        synchronisation and memory are unchanged; the model FLOPs of the step
        (the MFU numerator) then leave out the output layer's ``6 h V`` per
        token, which no longer runs.
    tp_comm_overlap_sms : int
        SMs that Transformer Engine's userbuffers reserve for the
        communication kernels of the ``pipeline`` and ``bulk`` overlaps
        (``num_sm`` of ``initialize_ub``, default 16); the GEMM beside them
        runs on the others. Used with ``parallel.tp_comm_overlap``.
    dualpipe_comm_sms : int
        SMs that the expert-parallel exchanges of one chunk of a DualPipe
        pair hold while the other chunk computes (``parallel.schedule:
        dualpipe`` with a MoE model): the GEMMs of the pair's pieces run on
        the others. Default 20: DeepSeek-V3 runs its dispatch and combine
        kernels on 20 of an H800's 132 SMs, which suffice for IB and NVLink
        at full bandwidth (DeepSeek-V3 Technical Report, arXiv:2412.19437,
        section 3.2.2). 0 leaves every SM to the computation.
    """

    p2p: str = "async"
    pp_scatter_gather: bool = False
    grad_accumulation_fusion: bool = True
    granularity: str = "chunk"
    grad_dtype_bytes: int | None = None
    causal: bool = False
    flash_attention: bool = True
    embedding_and_loss: bool = True
    tp_comm_overlap_sms: int = 16
    dualpipe_comm_sms: int = 20

    def __post_init__(self) -> None:
        if self.p2p not in P2P_MODES:
            raise ConfigError(f"options.p2p: {self.p2p!r} unknown; valid: {', '.join(P2P_MODES)}")
        if self.granularity not in GRANULARITIES:
            raise ConfigError(f"options.granularity: {self.granularity!r} unknown; valid: {', '.join(GRANULARITIES)}")
        if self.grad_dtype_bytes is not None and (isinstance(self.grad_dtype_bytes, bool)
                                                  or self.grad_dtype_bytes not in (1, 2, 4)):  # (True == 1)
            raise ConfigError(f"options.grad_dtype_bytes: must be 1, 2 or 4, got {self.grad_dtype_bytes}")
        for name in ("causal", "flash_attention", "embedding_and_loss", "pp_scatter_gather",
                     "grad_accumulation_fusion"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"options.{name}: must be true or false, got {getattr(self, name)!r}")
        for name in ("tp_comm_overlap_sms", "dualpipe_comm_sms"):
            sms = getattr(self, name)
            if isinstance(sms, bool) or not isinstance(sms, int) or not 0 <= sms <= 1024:
                raise ConfigError(f"options.{name}: must be an integer number of SMs in 0..1024, got {sms!r}")


@dataclass
class TrainingStep:
    """A generated step: the op graph plus what metrics need to interpret it."""

    graph: OpGraph
    model: ModelSpec
    parallel: ParallelConfig
    training: TrainingSpec
    layout: RankLayout
    num_micro_batches: int
    model_flops: float
    """Model FLOPs of the whole step over all GPUs (MFU numerator; recompute not counted)."""
    stage_of_rank: list[int] = field(default_factory=list)
    routes: dict[int, LayerRouting] = field(default_factory=dict)
    """MoE layer index → its token routing over an EP group, summed over the micro-batches of one replica's
    step (``moe.draw: micro_batch``) or the layer's one draw (``moe.draw: layer``); empty without EP."""
    draw_imbalance: dict[tuple[int, int | None], float] = field(default_factory=dict)
    """(MoE layer, micro-batch or None for ``draw: layer``) → that draw's max/mean token slots per EP rank."""

    hardware_flops: float = 0.0
    """Model FLOPs plus the recomputed forward FLOPs, by the same counting convention (Narayanan et
    al.'s "hardware FLOPs", the HFU numerator): :func:`~workloads.flops.hardware_flops_per_step`."""

    @property
    def executed_flops(self) -> float:
        """FLOPs the GPUs execute (sum over compute ops): recomputation included, a causal FlashAttention
        kernel's masked half and dropped MoE tokens left out, its backward's recomputed ``Q Kᵀ`` in."""
        replicas = getattr(self.graph, "replicas", None)
        if replicas:  # a graph of representatives: each op runs on every rank its rank stands for
            return sum(op.mean_flops * len(replicas[op.rank]) for op in self.graph.ops if op.kind == "compute")
        return sum(getattr(op, "flops", 0.0) for op in self.graph.ops if op.kind == "compute")


# ------------------------------------------------------------------ segments
@dataclass
class _Segment:
    """Kernels run back to back, then TP collectives, on the compute stream."""

    kernels: list[LayerOp]
    tp: dict[str, int]
    layer: int
    grad_bytes: float = 0.0  # DP gradient bytes that become ready when this segment ends
    expert_grad_bytes: float = 0.0
    parts: tuple[Kernel, ...] | None = None  # _kernels(kernels), built once and shared by every op
    moe: tuple[list[LayerOp], ...] | None = None  # (before, experts, after) dispatch[, shared 1, shared 2]
    # per piece of ``moe``, per kernel: a forward kernel re-run in the backward (``recompute`` cut as ``moe`` is)
    moe_recompute: tuple[tuple[bool, ...], ...] = ()
    phase: str = "F"  # the pipeline pass it belongs to: "F" or "B"
    recompute: tuple[bool, ...] = ()  # per kernel: a forward kernel re-run in the backward (activation recompute)
    recompute_parts: tuple[Kernel, ...] = ()  # the recomputed kernels, run as their own op before ``parts``
    # TP communication overlap (userbuffers): (head kernels, runs of identical layers as (kernels, recompute
    # mask, count), tail kernels); ``tp`` then holds only the embedding / output-layer collectives
    ub: tuple[list[LayerOp], list[tuple[list[LayerOp], tuple[bool, ...], int]], list[LayerOp]] | None = None
    ub_parts: list[tuple[Kernel, ...]] = field(default_factory=list)  # the kernels of each emitted op, built once
    # sequence parallelism, backward: all-gathers of the column-parallel layers' saved (sequence-split) inputs
    # for their weight gradients, run beside the pass's compute (see :meth:`_StepBuilder._regathers`)
    regather: int = 0
    # a MoE layer's weight-gradient pass under skewed routing: (kernels before the routed experts' weight
    # gradients, those at the balanced load, kernels after them); the experts' part is scaled per rank and
    # micro-batch by its drawn load (:meth:`_StepBuilder._expert_wgrads`)
    expert_w: tuple[tuple[Kernel, ...], tuple[Kernel, ...], tuple[Kernel, ...]] | None = None
    # the last stage's forward with TP: the vocab-parallel cross-entropy's own all-reduces (:data:`LOSS_ALL_REDUCES`)
    loss_reduce: bool = False
    # TP collectives of ``b s w`` elements at widths ``w`` other than the hidden size (multi-head latent
    # attention's latents): ``(kind, w) -> count``, kind ``"regather"`` for the backward's re-gathers beside the
    # pass (:meth:`_StepBuilder._tp_widths`); ``tp`` and ``regather`` hold the ``b s h`` ones
    tp_widths: dict[tuple[str, int], int] = field(default_factory=dict)


def _scale_kernel(k: Kernel, factor: float, at: int | None) -> Kernel:
    """Kernel ``k`` run on ``factor`` times the token rows it was sized for: its FLOPs and bytes, and dimension
    ``at`` of its shape (the token rows, :func:`_token_position`; None: no shape to scale)."""
    shape = k.shape
    if shape is not None and at is not None:
        shape = shape[:at] + (max(1, round(shape[at] * factor)),) + shape[at + 1:]
    return Kernel(k.category, k.flops * factor, k.nbytes * factor, shape, k.batch)


def _token_position(op: LayerOp, tokens: int) -> int | None:
    """Which dimension of expert kernel ``op``'s shape is its ``tokens`` rows: a GEMM's ``m`` (forward and data
    gradient), or the reduced ``m`` of its weight gradient (``dW = Xᵀ dY``, shape ``(k, n, m)``); None for a
    kernel without a shape. By position, not by value: a model whose hidden size equals ``tokens`` has two
    dimensions of that size, and only one of them grows with the rank's load."""
    if op.shape is None:
        return None
    at = 2 if op.name.endswith(".wgrad") else 0
    if op.shape[at] != tokens:
        raise AssertionError(f"expert kernel {op.name} {op.shape}: no {tokens} token rows at dimension {at}")
    return at


def _pick(values: list, index: list[int]) -> tuple:
    """``tuple(values[i] for i in index)``, in C."""
    return itemgetter(*index)(values) if len(index) > 1 else tuple(values[i] for i in index)


def _column_sums(tokens: np.ndarray) -> list:
    """Each column's ``tokens[:, j].sum()`` (the token slots EP rank ``j``'s experts compute), in one pass: exact
    for the integer counts of a routing draw; column by column otherwise, as summed one at a time."""
    if tokens.dtype.kind in "iu":
        return tokens.sum(axis=0).tolist()
    return [tokens[:, j].sum() for j in range(tokens.shape[1])]


def _ub_chunk(op: LayerOp, n: int, sm_reserved: int) -> Kernel:
    """One of ``n`` chunks of GEMM ``op`` cut along its token rows (the first dimension of a forward or
    data-gradient GEMM), beside a communication kernel holding ``sm_reserved`` SMs. Its bytes are ``1/n`` of
    the GEMM's (the weight re-read by each chunk is not added: the GEMMs are compute-bound)."""
    k = op.kernel()
    shape = k.shape
    if shape is not None and n > 1:
        shape = (-(-shape[0] // n), shape[1], shape[2])
    return Kernel(k.category, k.flops / n, k.nbytes / n, shape, k.batch, sm_reserved)


def _weight_gradient(op: LayerOp) -> bool:
    """A weight-gradient kernel (``W`` of a split backward): a linear layer's ``dW = Xᵀ dY`` GEMM (not the
    second operand gradient of a batched activation GEMM) or the accumulation of the weight gradients."""
    return (op.category in GEMM_CATEGORIES and op.name.endswith(".wgrad") and op.batch == 1) \
        or op.name == "grad_accumulate"


def _kernels(ops: Sequence[LayerOp]) -> tuple[Kernel, ...]:
    return tuple(o.kernel() for o in ops)


def _unzip(pairs: Sequence[tuple[LayerOp, bool]]) -> tuple[list[LayerOp], tuple[bool, ...]]:
    """``(kernel, recomputed)`` pairs as the kernels and their recompute mask."""
    return [o for o, _again in pairs], tuple(again for _o, again in pairs)


def _recomputed_first(ops: Sequence[LayerOp], mask: Sequence[bool]) -> tuple[list[LayerOp], list[LayerOp]]:
    """The kernels of ``ops`` that ``mask`` marks recomputed, and the others, each in their order: a piece of a
    layer pass run as two ops, the recomputed forward kernels first (``R…``), as a dense layer's pass runs them
    (:meth:`_StepBuilder.emit_segment`). Back to back on the compute stream, the piece takes as long either way."""
    mask = mask or (False,) * len(ops)
    return [o for o, again in zip(ops, mask) if again], [o for o, again in zip(ops, mask) if not again]


def _shared_cut(shared: Sequence[LayerOp]) -> int:
    """Where a MoE layer pass's shared-expert kernels ``shared`` (in order) split into the half beside the first
    all-to-all and the half beside the second: after the last kernel of the first one's module (``shared_up`` in
    the forward, ``shared_down`` in the backward)."""
    base = base_name(shared[0].name)
    return max(i for i, o in enumerate(shared) if base_name(o.name) == base) + 1


def _leading(mask: Sequence[bool]) -> int:
    """How many kernels at the front of a recompute mask are recomputed (``full``, ``core_attn``)."""
    return next((i for i, again in enumerate(mask) if not again), len(mask))


def _recompute_before_use(forward: list[LayerOp], backward: list[LayerOp],
                          modules: Sequence[str]) -> list[tuple[LayerOp, bool]]:
    """``backward`` with the forward kernels that ``modules`` re-run (output-discarding checkpoints,
    :data:`~workloads.flops.RECOMPUTED_KERNELS`) inserted right before the first backward kernel of a layer
    that needs their output, in forward order; ``(kernel, recomputed)`` pairs. A kernel none of whose
    consumers runs in this backward (``B`` of a split backward without weight gradients) is not re-run."""
    consumers: dict[str, frozenset[str]] = {}
    for m in modules:
        consumers.update(RECOMPUTED_KERNELS.get(m, {}))
    before: dict[int, list[LayerOp]] = {}
    for op in forward:
        users = consumers.get(base_name(op.name))
        if users:
            at = next((i for i, b in enumerate(backward) if base_name(b.name) in users), None)
            if at is not None:
                before.setdefault(at, []).append(op)
    out: list[tuple[LayerOp, bool]] = []
    for i, op in enumerate(backward):
        out.extend((again, True) for again in before.get(i, ()))
        out.append((op, False))
    return out


def check_step_options(model: ModelSpec, parallel: ParallelConfig, options: StepOptions) -> None:
    """Raise :class:`ConfigError` for generator options the layout cannot take: an empty end chunk (the
    embedding, or the output layer and loss, alone) with ``options.embedding_and_loss: false`` would have
    nothing to run; unfused attention under context parallelism (its attention is fused only); and blocking
    send/recv with a schedule whose sends it does not model."""
    if options.p2p == "blocking" and parallel.schedule in ("zb-h1", "dualpipe"):
        raise ConfigError(f"options.p2p: blocking send/recv is modelled for the gpipe, 1f1b and interleaved schedules; "
                          f"use p2p: async with {parallel.schedule}")
    if parallel.cp > 1 and not options.flash_attention:  # (also where the kernels are made: workloads.flops)
        raise ConfigError(CP_NEEDS_FUSED_ATTENTION)
    if not options.embedding_and_loss and any(not chunk_layers(model.layers, parallel, s, c)
                                              for s in range(parallel.pp) for c in range(parallel.model_chunks)):
        raise ConfigError("parallel.stage_layers: an empty end chunk holds the embedding or the output layer "
                          "alone; it needs options.embedding_and_loss: true")


def megatron_grad_overlap(par: ParallelConfig, plan: ShardingPlan) -> bool:
    """Whether ``par``'s gradients are reduced by Megatron-Core's distributed data parallelism with overlap
    (``zero_impl`` megatron, reduced once per step over more than one rank) under Megatron's pipeline schedules
    (``1f1b``, ``interleaved``): :attr:`_StepBuilder.megatron_overlap`, for a layout without its builder."""
    return (par.overlap_grad_reduce and par.grad_dp * par.weight_copies > 1 and plan.impl == "megatron"
            and plan.grad_sync == "step" and par.schedule in ("1f1b", "interleaved"))


class _Exchange(NamedTuple):
    """One MoE layer pass's exchanges as :meth:`_StepBuilder.moe_pieces` emits them, for a pass and for the forward a
    full recomputation re-runs before it: the EP ``group``; ``rows`` (owner → expert, expert → owner) this rank
    sends; ``matrices``, every member's rows when the rank issues for its EP peers (lockstep), else None each;
    DeepEP's NVLink ``forward`` rows (and ``forward_rows``); the expert-TP ``gather`` group (None without one) and its
    ``gather_bytes`` (``gather_lanes``: every lane's, where the rank issues for members of unequal loads, else
    None); the experts' ``load`` (token slots); whether the exchanges run ``apart`` from the compute
    stream (on ``stream``, the forwarding on ``hop_stream``) and are waited for explicitly; the ops' tags."""

    rank: int
    group: tuple[int, ...]
    rows: tuple
    matrices: tuple
    forward: tuple
    forward_rows: tuple
    gather: tuple[int, ...] | None
    gather_bytes: float
    load: int
    apart: bool
    stream: str
    hop_stream: str
    layer: int
    mb: int
    stage: int
    gather_lanes: tuple[float, ...] | None = None


class _StepBuilder:
    def __init__(self, model: ModelSpec, parallel: ParallelConfig, training: TrainingSpec,
                 options: StepOptions, routing: RoutingModel | None = None) -> None:
        self.model, self.par, self.train, self.opt = model, parallel, training, options
        check_step_options(model, parallel, options)
        self.layout = RankLayout(parallel)
        self.m = num_micro_batches(parallel)
        self.p, self.v, self.t = parallel.pp, parallel.model_chunks, parallel.tp
        self.kind = parallel.schedule
        self.dual = parallel.schedule == "dualpipe"
        self.nvs = self.p if self.dual else self.p * self.v  # positions of a micro-batch's chain of stages
        self.sp = parallel.sp
        self.dtype = training.dtype_bytes
        self.fp8 = training.fp8
        self.fp8_amax = training.fp8_amax_reductions
        self._stage_groups: dict[int, tuple[int, ...]] = {}
        self._sp_grad_bytes: dict[int, float] = {}
        self._chunk_layers: dict[tuple[int, int], list[int]] = {}
        self._cp_groups: dict[int, tuple[int, ...]] = {}
        self._ring_cache: dict[tuple[LayerOp, int], list[list[Kernel]]] = {}
        self._whole_cp_groups = False  # set by build(): a representative stands for its CP group (lockstep)
        self._fp8_weights: dict[tuple[int, int], tuple[float, float]] = {}
        self._fp8_gemms: dict[tuple[int, int], int] = {}  # (stage, chunk) -> its FP8 GEMMs (amax entries)
        self._node_patterns: dict[tuple[int, ...], tuple[list[int], tuple[int, ...]]] = {}  # EP group -> nodes
        self._reserved: dict[tuple, tuple] = {}  # (id(kernel tuple), SMs[, "all"]) -> (tuple, reserved copy)
        # (stage, chunk, of the experts' buffer) -> param_buckets
        self._param_buckets: dict[tuple[int, int, bool], tuple[list[float], list[int], list[int]]] = {}
        self.plan = sharding_plan(parallel, training.dtype, options.grad_dtype_bytes)
        self.grad_bytes = self.plan.grad_bytes
        b, s, h = parallel.micro_batch, training.seq_len, model.hidden
        self.cp = parallel.cp
        self.local_seq = s // self.cp  # tokens of each sequence on this rank (context parallelism)
        self.act_elems = b * self.local_seq * h
        # With SP the activation between stages is already split over TP. Without it, Megatron-LM 2021's
        # scatter/gather optimisation (Narayanan et al. SC'21, section 4.1; options.pp_scatter_gather, off by
        # default as in Megatron-Core) sends 1/t per TP rank and all-gathers it over NVLink on the receiving stage.
        self.pp_gather = self.t > 1 and not self.sp and options.pp_scatter_gather
        self.p2p_bytes = self.act_elems * self.dtype / (self.t if (self.sp or self.pp_gather) else 1)
        self.tp_bytes = self.act_elems * self.dtype
        self.graph = OpGraph(parallel.world_size)
        self.schedules = pipeline_schedule(parallel.schedule, self.p, self.m, parallel.virtual_stages,
                                           parallel.microbatch_group_size)
        # contiguous micro-batches per chunk of the interleaved schedule (Megatron-Core's default: pp)
        self.group = parallel.microbatch_group_size or self.p
        self.split_backward = parallel.schedule in SPLIT_BACKWARD_SCHEDULES
        # (micro-batch, chunk) whose backward is split into B and a later W, per stage; other backwards are whole
        self.split_keys = [{(a.micro_batch, a.chunk) for a in acts if a.phase == "W"} for acts in self.schedules]
        self._segments_cache: dict[tuple, list[_Segment]] = {}
        self._tp_groups: dict[int, tuple[int, ...]] = {}
        self._ep_groups: dict[int, tuple[tuple[int, ...], int]] = {}
        self._etp_groups: dict[int, tuple[int, ...]] = {}
        self._rank_tokens: dict[tuple, np.ndarray] = {}  # draw -> its EP rank matrix (every e's rows read it)
        self._matrix_of: dict[int, tuple[LayerRouting, np.ndarray]] = {}  # id(routing) -> it, its rank matrix
        # (id(rank matrix),) -> every EP index's all-to-all rows; (id(rank matrix), node pattern) -> every EP
        # index's DeepEP rows (deepep_matrices). A rank matrix is one draw's, or balanced routing's for every
        # draw, whose probabilities do not depend on the layer either: the rows are a function of it.
        self._tables_of: dict[tuple, list] = {}
        self._draw_tables: dict[tuple[int, int], list] = {}  # (layer, micro-batch) -> its all-to-all rows' table
        # Set by build(): one representative issues each EP exchange for its whole EP group (symmetric routing
        # under lockstep), carrying every member's row. (id(rank matrix), group) -> those matrices; equal ones
        # are one object.
        self._whole_ep_groups = False
        self._ep_matrices: dict[tuple, tuple] = {}
        self._loads_of: dict[tuple, tuple[int, ...]] = {}  # (layer, draw's micro-batch, EP group) -> its loads
        self._member_parts: dict[tuple, tuple] = {}  # (id(kernels), loads) -> every member's kernels
        self._equal_matrices: dict[tuple, tuple] = {}
        self._moe_kernels: dict[int, tuple] = {}  # id(segment's MoE split) -> (split, kernels before, after)
        # id(a MoE piece's kernels) -> (them, their ops, recompute mask): pieces cut by CP communication (_cp_piece)
        self._cp_pieces: dict[int, tuple] = {}
        # inside a DualPipe pair (_emit_pair): (recompute op, op of the rest of its piece) of each MoE piece cut in two
        self._split_pieces: list[tuple[int, int]] | None = None
        self._end_params: dict[int, float] = {}
        self._stage_params: dict[int, tuple[float, float]] = {}
        self.routing = routing or RoutingModel()
        self.expert_parallel = model.is_moe and parallel.ep > 1
        self.etp = parallel.expert_tp
        # etp != tp, or cp > 1: experts on Megatron-Core's own expert grid (dense models have no experts to place)
        self.expert_grid = model.is_moe and parallel.expert_grid
        self.routes: dict[int, LayerRouting] = {}
        self._draws: dict[tuple[int, int | None], LayerRouting] = {}
        self._balanced_draw: LayerRouting | None = None  # balanced routing's one draw (the same every time)
        self.draw_imbalance: dict[tuple[int, int | None], float] = {}
        self._moe_parts: dict[tuple, tuple] = {}
        # distinct balanced expert kernel sets, one object each (kept alive: _moe_parts keys by their ids)
        self._balanced_kernels: dict[tuple, tuple[Kernel, ...]] = {}  # (kernels, token dimensions) -> kernels
        self._scale_plans: dict[int, list[tuple]] = {}  # id(balanced kernels) -> what _expert_parts reads of them
        self._unit_segments: dict[tuple, list[tuple[_Segment, Unit, str]]] = {}
        self._traces: dict[int, tuple[list[list[int]], list[Use], GatherSchedule]] = {}

    # -------------------------------------------------------------- layers
    def position(self, stage: int, chunk: int) -> int:
        """Position of ``(stage, chunk)`` in its micro-batches' chain (:func:`~workloads.schedules.chain_position`)."""
        return chain_position(self.kind, self.p, stage, chunk)

    def pass_of(self, stage: int, a: PipeAction) -> str:
        """The pass action ``a`` runs: its phase, or ``"BW"`` for a whole backward (input and weight gradients)
        in a schedule that splits other backwards (DualPipe's backwards whose weight gradient is not deferred)."""
        if self.dual and a.phase == "B" and (a.micro_batch, a.chunk) not in self.split_keys[stage]:
            return "BW"
        return a.phase

    def makes_grads(self, stage: int, a: PipeAction) -> bool:
        """Action ``a`` computes weight gradients (a whole backward, or the ``W`` of a split one)."""
        return self.pass_of(stage, a) in ("W", "BW") if self.split_backward else a.phase == "B"

    def _end_layer(self, stage: int, chunk: int) -> int:
        """The layer an embedding-only or output-only chunk's ops are tagged with (it has none of its own:
        Megatron-Core's account_for_embedding/loss_in_pipeline_split): the one next to it."""
        return 0 if self.position(stage, chunk) == 0 else self.model.layers - 1

    def chunk_layers(self, stage: int, chunk: int) -> list[int]:
        key = (stage, chunk)
        layers = self._chunk_layers.get(key)
        if layers is None:
            layers = self._chunk_layers[key] = chunk_layers(self.model.layers, self.par, stage, chunk)
        return layers

    def _tp_counts(self, n: int, phase: str, first: bool, last: bool) -> dict[str, int]:
        """TP collectives of ``n`` layers (+ embedding/output layer) for one pass (none for a weight-gradient
        pass: the backward's collectives carry input gradients)."""
        if self.t == 1 or phase == "W":
            return {}
        full = self.par.recompute == "full" and phase in ("B", "BW")
        if not self.sp:
            # Forward: the vocab-parallel embedding's all-reduce (first stage). Backward: the all-reduce of
            # the output layer's input gradient (last stage; Megatron's copy_to_tensor_model_parallel_region).
            extra = (1 if first else 0) if phase == "F" else (1 if last else 0)
            # (MLA: the backward's all-reduce of the attention input's gradient is the latents', _tp_widths)
            mla = n if self.model.is_mla and phase != "F" else 0
            return {"all_reduce": 2 * n * (2 if full else 1) + extra - mla}
        ag = 2 * n * (2 if full else 1) + ((1 if last else 0) if phase == "F" else (1 if first else 0))
        rs = 2 * n * (2 if full else 1) + ((1 if first else 0) if phase == "F" else (1 if last else 0))
        if self.model.is_mla:  # the attention input's gather (forward, recomputed forward) and its gradient's
            # reduce-scatter (backward) are the latents' (:meth:`_tp_widths`)
            ag -= n if phase == "F" else (n if full else 0)
            rs -= 0 if phase == "F" else n
        if phase == "F" and first and self.model.learned_positions:
            # Megatron-Core reduce-scatters the embedding only without learned positions (LanguageModelEmbedding's
            # reduce_scatter_embeddings): GPT's is all-reduced, the positions added, then the sequence split locally
            # (whose backward is the all-gather counted above)
            return {"all_reduce": 1, "all_gather": ag, "reduce_scatter": rs - 1}
        return {"all_gather": ag, "reduce_scatter": rs}

    def _tp_widths(self, n: int, phase: str) -> dict[tuple[str, int], int]:
        """Multi-head latent attention's TP collectives of ``n`` layers for one pass, as ``(kind, w) -> count``
        of ``b s w`` elements each (kind ``"regather"``: the backward's re-gathers beside the pass); ``{}`` for
        standard attention, whose attention input is :meth:`_tp_counts`'s ``b s h``.

        Megatron-Core's ``MLASelfAttention`` (``megatron/core/transformer/multi_latent_attention.py``,
        ``get_query_key_value_tensors``, since its down projections became ``TELinear`` with ``parallel_mode:
        duplicated``, NVIDIA/Megatron-LM commit 720c8b40, 2025-07) runs the down projections on the rank's own
        sequence shard and gathers only what the head-split layers read: ``linear_q_up_proj`` and
        ``linear_kv_up_proj`` (column-parallel, ``gather_output=False``) all-gather their sequence-parallel
        inputs, the query latent ``r_q`` (the ``linear_q_proj`` input ``h`` without ``q_lora_rank``) and the key/
        value latent ``r_kv``, and ``gather_from_sequence_parallel_region`` gathers the shared RoPE key
        (``qk_rope_head_dim``). The backward reduce-scatters the three gradients (each all-gather's backward) and
        re-gathers the two up projections' saved inputs for their weight gradients (:meth:`_regathers`); full
        recomputation repeats the forward's three; ``mla_up_proj`` (``CheckpointWithoutOutput`` over
        ``qkv_up_proj_and_rope_apply``, whose input the RoPE key's gather precedes) repeats the up projections'
        two. Without sequence parallelism only the backward communicates: the up projections' input-gradient
        all-reduces (``copy_to_tensor_model_parallel_region``)."""
        m = self.model
        if not m.is_mla or not n or self.t == 1 or phase == "W":
            return {}
        up = (m.q_lora_rank or m.hidden, m.kv_lora_rank)
        out: dict[tuple[str, int], int] = {}

        def add(kind: str, widths: tuple, count: int) -> None:
            for w in widths:
                out[kind, w] = out.get((kind, w), 0) + count

        if not self.sp:
            if phase != "F":
                add("all_reduce", up, n)
            return out
        gathered = (*up, m.qk_rope_head_dim)
        if phase == "F":
            add("all_gather", gathered, n)
            return out
        add("reduce_scatter", gathered, n)
        if self.par.recompute == "full":
            add("all_gather", gathered, n)
        if "mla_up_proj" in self.par.selective_modules:
            add("all_gather", up, n)
        if self._regathers(1, phase):
            add("regather", up, n)
        return out

    def tp_width_bytes(self, width: int) -> float:
        """Bytes of one TP collective of ``b s w`` elements (this rank's ``s/cp`` tokens; :attr:`tp_bytes` at
        ``w = h``)."""
        return self.par.micro_batch * self.local_seq * width * self.dtype

    def _end_counts(self, phase: str, first: bool, last: bool) -> dict[str, int]:
        """The embedding's (``first``) or the output layer's (``last``) TP collectives in one pass: :meth:`_tp_counts`
        of no layers, without the kinds it has none of."""
        return {kind: n for kind, n in self._tp_counts(0, phase, first, last).items() if n}

    def _regathers(self, inputs: int, phase: str, userbuffers: bool = True) -> int:
        """All-gathers of ``inputs`` column-parallel linears' inputs that a backward pass runs under sequence
        parallelism (0 otherwise, and for the layers' own linears under TP overlap, whose userbuffers run the
        gather beside the data-gradient GEMM: ``userbuffers`` False for the output layer, Megatron's own
        ``ColumnParallelLinear`` either way): ``inputs`` itself.

        Megatron-LM's ``LinearWithGradAccumulationAndAsyncCommunication`` and Transformer Engine's ``Linear``
        save the sequence-split input and all-gather it again in backward for the weight gradient, launched
        asynchronously before the data-gradient GEMM and waited for before the weight-gradient GEMM (with or
        without recomputation), ``b s h`` elements each, on their own stream. Inputs per layer:
        :meth:`_column_inputs`; the output layer (a ``ColumnParallelLinear``) adds one on the last stage.
        """
        if self.t == 1 or not self.sp or phase not in ("B", "BW") or (userbuffers and self.par.tp_comm_overlap):
            return 0
        return inputs

    def _column_inputs(self, moe: bool) -> int:
        """Column-parallel linears of one layer whose ``b s h`` input the backward re-gathers: QKV and MLP
        up-projection; in a MoE layer QKV and, with shared experts, their up-projection (Megatron-Core's
        ``SharedExpertMLP``), not the routed experts (their input is the token dispatcher's all-gather, which
        autograd keeps). Multi-head latent attention re-gathers its latents instead (:meth:`_tp_widths`)."""
        attention = 0 if self.model.is_mla else 1
        return attention + (1 if self.model.shared_experts else 0) if moe else attention + 1

    def _layer_tp_counts(self, layer: int, phase: str) -> dict[str, int]:
        """TP collectives of one layer's pass: :meth:`_tp_counts`, except that an expert-parallel MoE layer
        without shared experts keeps only the attention's pair: Megatron-Core routes the sequence-parallel tokens
        as they are and all-gathers the dispatched ones over the expert TP group after the exchange (the TP
        group itself when ``etp = tp``; :meth:`moe_pieces`), and reduce-scatters them before the combine. (Shared
        experts gather the layer's tokens as a dense MLP does: Megatron-Core's ``SharedExpertMLP``.)"""
        counts = self._tp_counts(1, phase, False, False)
        if self.expert_parallel and self.model.is_moe_layer(layer) and not self.model.shared_experts:
            # less the MLP's pair, once per forward the pass runs (MLA keeps fewer than half: _tp_widths)
            runs = 2 if self.par.recompute == "full" and phase in ("B", "BW") else 1
            counts = {k: v - runs for k, v in counts.items()}
        return counts

    def end_params(self, stage: int, chunk: int) -> float:
        """Embedding / output-layer parameters (one TP rank) that virtual stage ``(stage, chunk)`` holds.

        They belong to the first (last) position of the chain: what :func:`stage_params` adds to the layers.
        """
        j = self.position(stage, chunk)
        if j not in (0, self.nvs - 1):
            return 0.0
        if self.dual:  # ranks 0 and p-1 hold both ends, one per chunk
            model, t = self.model, self.t
            word = model.word_embedding_params(t, padded_vocab(model.vocab, t))
            return float(word + model.position_embedding_params() if j == 0 else model.final_norm_params() + word)
        if stage not in self._end_params:
            t, ep = self.t, self.par.ep
            dense_extra, _ = stage_params(self.model, self.par, stage)
            dense_layers = sum(self.model.params_per_layer(i, t, ep, self.etp)
                               - self.model.routed_expert_params(i, t, ep, self.etp)
                               for i in stage_layers(self.model.layers, self.par, stage))
            self._end_params[stage] = dense_extra - dense_layers
        return self._end_params[stage]

    def _layer_pass(self, layer: int, phase: str, tp: int | None = None) -> tuple[list[LayerOp], tuple[bool, ...]]:
        """The kernels of one layer in one pass, and which of them are recomputed forward kernels (activation
        recomputation): all of the forward for ``full`` and the attention core for ``selective``'s
        ``core_attn``, at the front; each kernel of ``selective``'s other modules right before the first
        backward kernel that needs its output (:data:`~workloads.flops.RECOMPUTED_KERNELS`). ``tp``: build it
        for another TP degree (the routed experts' ``etp``)."""
        ops = layer_ops(self.model, self.par.micro_batch, self.train.seq_len, tp or self.t, layer=layer,
                        sequence_parallel=self.sp, dtype_bytes=self.dtype, causal=self.opt.causal,
                        flash_attention=self.opt.flash_attention, fp8=self.fp8, cp=self.cp,
                        fp8_recipe=self.train.fp8_recipe,
                        cp_comm_type=self.par.cp_comm_type)
        if phase == "F":
            return ops.forward, (False,) * len(ops.forward)
        backward = accumulate_gradients(ops.backward, self.model.params_per_layer(layer, self.t, self.par.ep,
                                                                                  self.etp),
                                        self.grad_bytes, self.dtype, self.opt.grad_accumulation_fusion)
        if self.split_backward and phase != "BW":  # "B" computes the input gradient, "W" the weight gradients
            if phase == "W":
                kernels = [o for o in backward if _weight_gradient(o)]
                return kernels, (False,) * len(kernels)
            backward = [o for o in backward if not _weight_gradient(o)]
        modules = self.par.selective_modules  # () unless selective
        first = (list(ops.forward) if self.par.recompute == "full" else
                 [o for o in ops.forward if o.name.startswith("attention")] if "core_attn" in modules else [])
        placed = _recompute_before_use(ops.forward, backward, modules)
        return first + [o for o, _again in placed], (True,) * len(first) + tuple(again for _o, again in placed)

    def segments(self, stage: int, chunk: int, phase: str, per_layer: bool) -> list[_Segment]:
        """The compute segments of one forward/backward of one chunk (cached: identical for every micro-batch)."""
        key = (stage, chunk, phase, per_layer)
        if key in self._segments_cache:
            return self._segments_cache[key]
        layers = self.chunk_layers(stage, chunk)
        j = self.position(stage, chunk)
        first, last = j == 0, j == self.nvs - 1
        mb, s, t = self.par.micro_batch, self.local_seq, self.t
        head: list[LayerOp] = []
        tail: list[LayerOp] = []
        ends = self.opt.embedding_and_loss
        vocab_shard = self.model.word_embedding_params(t, padded_vocab(self.model.vocab, t))
        if first and ends:
            emb = embedding_ops(self.model, mb, s, t, dtype_bytes=self.dtype)
            # (its dense gradient into the gradient buffer, every micro-batch: embedding_gradient_accumulation)
            backward = emb.backward + [embedding_gradient_accumulation(
                vocab_shard + self.model.position_embedding_params(), self.dtype, self.grad_bytes)]
            (head if phase == "F" else tail).extend(emb.forward if phase == "F" else self._split(backward, phase))
        if last and ends:
            out = logits_ops(self.model, mb, s, t, sequence_parallel=self.sp, dtype_bytes=self.dtype)
            # (the output layer's weight gradient accumulates into the buffer as the layers' do)
            backward = accumulate_gradients(out.backward, vocab_shard, self.grad_bytes, self.dtype,
                                            self.opt.grad_accumulation_fusion)
            (tail if phase == "F" else head).extend(out.forward if phase == "F" else self._split(backward, phase))
        order = layers if phase == "F" else list(reversed(layers))
        at = order or [self._end_layer(stage, chunk)]
        emb_params = self.end_params(stage, chunk)
        first, last = first and ends, last and ends  # no embedding / output-layer TP collectives without them
        grads = {i: (self.model.params_per_layer(i, t, self.par.ep, self.etp)
                     - self.model.routed_expert_params(i, t, self.par.ep, self.etp),
                     self.model.routed_expert_params(i, t, self.par.ep, self.etp)) for i in layers}
        gb = self.grad_bytes
        ub = self.par.tp_comm_overlap
        if per_layer or self.expert_parallel or self.cp > 1:
            segs = []
            for i in order:
                kernels, mask = self._layer_pass(i, phase)
                moe, moe_mask = self._moe_split(i, phase) or (None, ())
                segs.append(_Segment(kernels, {} if ub else self._layer_tp_counts(i, phase), i,
                                     grads[i][0] * gb, grads[i][1] * gb, moe=moe, moe_recompute=moe_mask,
                                     recompute=mask, ub=([], [(kernels, mask, 1)], []) if ub else None,
                                     regather=self._regathers(self._column_inputs(moe is not None), phase),
                                     expert_w=None if ub else self._expert_wgrads(i, phase, kernels),
                                     tp_widths={} if ub else self._tp_widths(1, phase)))
            # The embedding's and the output layer's TP collectives go with their own kernels: the head is the
            # embedding's forward or the output layer's backward, the tail the output layer's forward or the
            # embedding's backward. The output layer (a ColumnParallelLinear) re-gathers its input in the
            # backward, beside its data-gradient GEMM at the start of the pass, held by that pass's collective.
            # An end with no kernels in this pass (the embedding's backward is all weight gradient, which a split
            # backward defers) leaves its collectives on the pass's last segment.
            fwd = phase == "F"
            head_ends, tail_ends = (first, False) if fwd else (False, last), (False, last) if fwd else (first, False)
            if head:
                segs.insert(0, _Segment(head, self._end_counts(phase, *head_ends), at[0],
                                        regather=0 if fwd or not last else self._regathers(1, phase, False)))
            if tail:
                segs.append(_Segment(tail, self._end_counts(phase, *tail_ends), at[-1],
                                     loss_reduce=fwd and tail_ends[1] and t > 1))
            if not segs:  # an embedding-only chunk's input-gradient pass (zb-h1, DualPipe): nothing to compute
                segs.append(_Segment([], {}, at[0]))
            for kernels, ends in ((head, head_ends), (tail, tail_ends)):
                if not kernels:
                    for kind, n in self._end_counts(phase, *ends).items():
                        segs[-1].tp[kind] = segs[-1].tp.get(kind, 0) + n
            segs[-1].grad_bytes += emb_params * gb
        else:
            kernels = list(head)
            again: list[bool] = [False] * len(head)
            for i in order:
                layer_kernels, layer_mask = self._layer_pass(i, phase)
                kernels += layer_kernels
                again += layer_mask
            kernels += tail
            again += [False] * len(tail)
            segs = [_Segment(kernels, self._tp_counts(0 if ub else len(layers), phase, first, last), at[0],
                             (sum(g[0] for g in grads.values()) + emb_params) * gb,
                             sum(g[1] for g in grads.values()) * gb, recompute=tuple(again),
                             ub=(head, self._layer_runs(order, phase), tail) if ub else None,
                             regather=self._regathers(self._column_inputs(False) * len(layers), phase)
                             + self._regathers(1 if last else 0, phase, False),
                             loss_reduce=phase == "F" and last and t > 1,
                             tp_widths=self._tp_widths(0 if ub else len(layers), phase))]
        for seg in segs:
            seg.phase = phase
        self._segments_cache[key] = segs
        return segs

    def _split(self, backward: list[LayerOp], phase: str) -> list[LayerOp]:
        """The part of an embedding / output-layer backward that pass ``phase`` runs (all of it unless
        zb-h1 splits the backward; the embedding's backward is its weight gradient)."""
        if not self.split_backward or phase == "BW":
            return backward
        wgrad = phase == "W"
        return [o for o in backward
                if (_weight_gradient(o) or o.name in ("embedding.bwd", EMBEDDING_GRAD_ACCUMULATE)) == wgrad]

    def _layer_runs(self, order: Sequence[int], phase: str) -> list[tuple[list[LayerOp], tuple[bool, ...], int]]:
        """The layers of one pass as runs of consecutive identical layers: ``(kernels, recompute mask, count)``."""
        runs: list[tuple[list[LayerOp], tuple[bool, ...], int]] = []
        for i in order:
            kernels, mask = self._layer_pass(i, phase)
            if runs and runs[-1][0] == kernels and runs[-1][1] == mask:
                runs[-1] = (runs[-1][0], mask, runs[-1][2] + 1)
            else:
                runs.append((kernels, mask, 1))
        return runs

    # ------------------------------------------------------- sharded units
    def unit_segments(self, stage: int, chunk: int, phase: str) -> list[tuple[_Segment, Unit, str]]:
        """One pass of a chunk cut at its gathered units: ``(segment, unit, use phase)`` in execution order.

        Module granularity (DeepSpeed ZeRO-3) cuts every layer at its GEMMs: a segment runs the kernels
        from one module's GEMM to the next module's (norms and the attention core go with the module
        before them); a recomputed forward inside a backward pass is its own use (``R``). Layer granularity
        (FSDP) keeps each layer (recomputation included) and the embedding / output kernels (the root unit)
        whole. A segment carries the gradients of its unit on the unit's last backward use in the pass.
        """
        key = (stage, chunk, phase)
        cached = self._unit_segments.get(key)
        if cached is not None:
            return cached
        gran = self.plan.gather
        ends = end_units(self.model, self.par, gran, stage)
        t, ep, gb = self.t, self.par.ep, self.grad_bytes
        out: list[tuple[_Segment, Unit, str]] = []
        for seg in self.segments(stage, chunk, phase, True):
            end_seg = all(module_of(k.name) in (None, "embedding", "output") for k in seg.kernels) and any(
                module_of(k.name) in ("embedding", "output") for k in seg.kernels)
            mask = seg.recompute or (False,) * len(seg.kernels)
            if end_seg:
                unit = ends["embedding" if any(module_of(k.name) == "embedding" for k in seg.kernels) else "output"]
                pieces = [(unit, phase, seg.kernels, list(mask))]
            elif gran == "layer" or seg.moe is not None:
                unit = layer_units(self.model, seg.layer, t, ep, "layer")["layer"]
                pieces = [(unit, phase, seg.kernels, list(mask))]
            else:
                units = layer_units(self.model, seg.layer, t, ep, "module")
                pieces = []
                waiting: list[tuple[LayerOp, bool]] = []
                full = self.par.recompute == "full"
                for op, again_op in zip(seg.kernels, mask):
                    mod = module_of(op.name)
                    # a recomputed forward is its own use under full recomputation (DeepSpeed re-gathers for
                    # it); a selective module's kernel re-run inside the backward uses the backward's gather
                    use = "F" if phase == "F" else ("R" if again_op and full else "B")
                    if mod is None:
                        if pieces:
                            pieces[-1][2].append(op)
                            pieces[-1][3].append(again_op)
                        else:
                            waiting.append((op, again_op))
                    elif pieces and pieces[-1][0] is units[mod] and pieces[-1][1] == use:
                        pieces[-1][2].append(op)
                        pieces[-1][3].append(again_op)
                    else:
                        pieces.append((units[mod], use, [o for o, _a in waiting] + [op],
                                       [a for _o, a in waiting] + [again_op]))
                        waiting = []
            modules = not end_seg and gran != "layer" and seg.moe is None
            # persistent parameters (module granularity) are reduced, never gathered: a layer's norms with its
            # first backward module; the final norm with a tied output layer (which is the embedding unit)
            persistent = (self.model.norm_params() if modules else
                          self.model.final_norm_params() if end_seg and unit.key == ("embedding",)
                          and any(k.name.startswith("final_norm") for k in seg.kernels) else 0)
            for i, (unit, use, ops, flags) in enumerate(pieces):
                extra = persistent and use == "B" and i == next(k for k, p in enumerate(pieces) if p[1] == "B")
                whole = len(pieces) == 1 and len(ops) == len(seg.kernels)
                again = seg.recompute if whole else tuple(flags)
                final = i == len(pieces) - 1  # the pass's TP collectives (and re-gathers) go with its last piece
                sub = _Segment(list(ops), dict(seg.tp) if final else {}, seg.layer,
                               persistent * gb if extra else 0.0, moe=seg.moe, moe_recompute=seg.moe_recompute,
                               phase=phase, recompute=again,
                               regather=seg.regather if final else 0, loss_reduce=final and seg.loss_reduce,
                               tp_widths=dict(seg.tp_widths) if final else {})
                out.append((sub, unit, use))
        # A unit's gradients are ready after its last backward use in the pass (a tied embedding is used twice).
        last_b = {unit.key: i for i, (_s, unit, use) in enumerate(out) if use == "B"}
        for i, (sub, unit, _use) in enumerate(out):
            if last_b.get(unit.key) == i:
                sub.grad_bytes += unit.params * gb
                sub.expert_grad_bytes += unit.expert_params * gb
        self._unit_segments[key] = out
        return out

    def zero_trace(self, stage: int) -> tuple[list[list[int]], list[Use], GatherSchedule]:
        """The uses of gathered units over one rank's step on ``stage`` (:func:`~workloads.sharding.stage_uses`)
        and the framework's all-gather schedule for them (the same for every rank of the stage)."""
        cached = self._traces.get(stage)
        if cached is None:
            per_action, uses = stage_uses(self.model, self.par, self.plan, stage, self.opt.embedding_and_loss)
            for a, ids in zip(self.schedules[stage], per_action):
                cut = [(unit.key, use) for _seg, unit, use in self.unit_segments(stage, a.chunk, a.phase)]
                if cut != [(uses[i].unit.key, uses[i].phase) for i in ids]:
                    raise AssertionError(f"stage {stage} {a}: kernels cut at {cut}, trace expects "
                                         f"{[(uses[i].unit.key, uses[i].phase) for i in ids]}")
            cached = self._traces[stage] = (per_action, uses, gather_schedule(uses, self.plan))
        return cached

    def _emit_gather(self, rank: int, group: list[int], uses: list[Use], use_end: dict[int, int],
                     groups: list[list[int]], g: int, mb: int, stage: int) -> int:
        """The all-gather of fetch group ``g``: one coalesced collective over the DP group (routed experts
        over the expert-DP group), prefetched once the previous group's first use is about to start; without
        overlap, blocking on the compute stream: DeepSpeed's one collective per parameter tensor, FSDP's the
        unit's one flat all-gather (turning prefetch off does not split it)."""
        lay, plan = self.layout, self.plan
        dense = sum(uses[i].unit.params for i in group) * self.dtype
        experts = sum(uses[i].unit.expert_params for i in group) * self.dtype
        tensors = max(1, sum(uses[i].unit.tensors for i in group))
        deps: list[int] = []
        if plan.overlap and g > 0:
            before = groups[g - 1][0] - 1
            if before in use_end:
                deps = [use_end[before]]
        stream = "zero" if plan.overlap else COMPUTE_STREAM
        count = tensors if not plan.overlap and plan.impl == "deepspeed" else 1
        last = None
        for nbytes, grp in ((dense, lay.dp_group(rank)), (experts, lay.expert_dp_group(rank))):
            if nbytes > 0 and len(grp) > 1:
                last = self.graph.collective_op(rank, "all_gather", grp, nbytes / count, name="zero_gather",
                                                stream=stream, deps=deps, count=count, traffic_class="zero",
                                                micro_batch=mb, stage=stage)
        if last is not None and plan.copy_out:  # FSDP2: split the gathered buffer into per-parameter tensors
            last = self.graph.compute(rank, parts=(Kernel("elementwise", 0.0, 2.0 * (dense + experts)),),
                                      name="zero_copy_out", deps=[last], stream=COMPUTE_STREAM,
                                      category="elementwise", micro_batch=mb, stage=stage)
        return last

    # ----------------------------------------------------------------- MoE
    def _moe_split(self, layer: int, phase: str
                   ) -> tuple[tuple[list[LayerOp], ...], tuple[tuple[bool, ...], ...]] | None:
        """A MoE layer's kernels cut at the two all-to-alls: (before dispatch, experts, after combine), and with
        ``moe.shared_expert_overlap`` two more: the shared-expert kernels run beside the first and the second
        all-to-all (taken out of before / after); with each piece's recompute mask (which of its kernels are
        forward kernels re-run in the backward: ``selective``'s modules re-run inside the pass, ``moe_act``'s
        activation among the experts', ``layernorm``'s norms around them). None for a weight-gradient pass,
        which exchanges nothing (its routed experts' GEMMs run at each rank's drawn load: :meth:`_expert_wgrads`)."""
        if not (self.expert_parallel and self.model.is_moe_layer(layer)) or phase == "W":
            return None
        ops, mask = self._layer_pass(layer, phase)
        start = _leading(mask)
        # Recomputed forward kernels (the first ``start``) run first (moe_pieces cuts them at their own experts).
        idx = [i for i in range(start, len(ops)) if ops[i].name.startswith("experts")]
        cuts = (slice(None, idx[0]), slice(idx[0], idx[-1] + 1), slice(idx[-1] + 1, None))
        (before, experts, after), masks = ([ops[c] for c in cuts], [mask[c] for c in cuts])
        if self.expert_grid:
            experts, masks[1] = self._grid_experts(layer, phase)
        if not (self.routing.shared_expert_overlap and self.model.shared_experts):
            return (before, experts, after), tuple(masks)
        shared = [(o, again) for o, again in zip(ops[start:], mask[start:]) if o.name.startswith("shared")]
        cut = _shared_cut([o for o, _a in shared])
        ids = {id(o) for o, _a in shared}
        (pre, pre_mask), (post, post_mask), (first, first_mask), (second, second_mask) = map(_unzip, (
            [(o, a) for i, (o, a) in enumerate(zip(before, masks[0])) if i < start or id(o) not in ids],
            [(o, a) for o, a in zip(after, masks[2]) if id(o) not in ids], shared[:cut], shared[cut:]))
        return (pre, experts, post, first, second), (pre_mask, masks[1], post_mask, first_mask, second_mask)

    def _recomputed_experts(self, layer: int, phase: str) -> list[LayerOp]:
        """The routed experts' kernels that a backward pass of ``layer`` recomputes at its front (``full``), at the
        balanced load; under an expert grid split over ``etp`` and run on the expert-TP group's tokens, as the
        forward ran them."""
        ops, mask = self._layer_pass(layer, phase, self.etp if self.expert_grid else None)
        return [o for o in ops[:_leading(mask)] if o.name.startswith("experts")]

    def _grid_experts(self, layer: int, phase: str) -> tuple[list[LayerOp], tuple[bool, ...]]:
        """The routed experts' kernels of one pass of ``layer`` under an expert grid: split over ``etp``, not
        ``tp`` (the recomputed forward kernels at the front left out: :meth:`_recomputed_experts` has theirs),
        with their recompute mask (``moe_act``'s activation)."""
        ops, mask = self._layer_pass(layer, phase, self.etp)
        keep = [i for i in range(_leading(mask), len(ops)) if ops[i].name.startswith("experts")]
        return [ops[i] for i in keep], tuple(mask[i] for i in keep)

    def _expert_wgrads(self, layer: int, phase: str, kernels: list[LayerOp]
                       ) -> tuple[tuple[Kernel, ...], tuple[Kernel, ...], tuple[Kernel, ...]] | None:
        """The weight-gradient pass (``W``, DualPipe's split backward) of MoE layer ``layer`` cut around its routed
        experts' GEMMs: (kernels before, the experts' at the balanced load, kernels after), for
        :meth:`emit_segment` to scale the experts' by each rank's drawn load, as the forward and the input
        gradient scale theirs (a rank whose experts took more tokens has more weight gradient to compute).
        None where nothing is to scale: another pass, a dense layer, no expert parallelism, balanced routing
        (every rank's load is the balanced one), or no expert kernels in the pass. (A ``W`` pass recomputes
        nothing: :meth:`_layer_pass`.)"""
        if (phase != "W" or not (self.expert_parallel and self.model.is_moe_layer(layer))
                or self.routing.kind == "balanced"):
            return None
        at = [i for i, k in enumerate(kernels) if k.name.startswith("experts")]
        if not at:
            return None
        experts = self._grid_experts(layer, phase)[0] if self.expert_grid else [kernels[i] for i in at]
        rest = set(at)
        return (_kernels(kernels[:at[0]]), self._balanced(experts),
                _kernels([k for i, k in enumerate(kernels) if i > at[0] and i not in rest]))

    def route(self, layer: int, mb: int = 0) -> LayerRouting:
        """Token routing of MoE layer ``layer`` in micro-batch ``mb`` over one EP group: drawn per (layer,
        micro-batch), or once per layer with ``moe.draw: layer``; seeded, the same in every EP group.
        :attr:`routes` accumulates the draws per layer (their sum over micro-batches)."""
        key = (layer, mb if self.routing.draw == "micro_batch" else None)
        r = self._draws.get(key)
        if r is None:
            # Balanced routing draws the same routing every time: one object for every draw, so that the tables
            # made from it (rows, DeepEP matrices) are made and kept once, not per (layer, micro-batch).
            r = self._balanced_draw
            if r is None:
                tokens = self.par.routed_tokens(self.train.seq_len)
                r = route_layer(self.model.experts, self.model.top_k, tokens, self.par.ep, self.routing, layer,
                                key[1], self.par.routers)
                if self.routing.kind == "balanced":
                    self._balanced_draw = r
            self._draws[key] = r
            self.draw_imbalance[key] = r.imbalance
            seen = self.routes.get(layer)
            self.routes[layer] = r if seen is None else seen.plus(r)
        return r

    def _balanced(self, ops: Sequence[LayerOp]) -> tuple[Kernel, ...]:
        """The kernels of expert ops ``ops`` at the balanced load, one object per distinct set (:meth:`_expert_parts`
        keys by identity), with what :meth:`_expert_parts` reads of each: its fields and the dimension of its
        shape that holds the token rows (:func:`_token_position`, known here from the ops' names)."""
        tokens = self.par.micro_batch * self.local_seq * self.model.top_k  # (the kernels' rows: s/cp)
        kernels = _kernels(ops)
        at = tuple(_token_position(o, tokens) for o in ops)
        balanced = self._balanced_kernels.setdefault((kernels, at), kernels)
        if id(balanced) not in self._scale_plans:
            self._scale_plans[id(balanced)] = (
                [(k.category, k.flops, k.nbytes, k.shape, k.batch,
                  None if i is None else (k.shape[:i], k.shape[i], k.shape[i + 1:])) for k, i in zip(kernels, at)],
                all(0 <= k.flops < math.inf and 0 <= k.nbytes < math.inf for k in kernels))
        return balanced

    def _expert_parts(self, balanced: tuple[Kernel, ...], load: int) -> tuple[Kernel, ...]:
        """Expert kernels of an EP rank that receives ``load`` token slots, scaled from the ``balanced`` routing's
        kernels (made by :meth:`_balanced`; :func:`_scale_kernel`).

        Cached by the kernels and the drawn count: draws that give a rank the same load share the kernels. A
        load seldom repeats within one layer but often across layers, which mostly run equal expert kernels;
        ``balanced`` is one object per distinct set of them, so it keys by identity."""
        key = (id(balanced), load)
        parts = self._moe_parts.get(key)
        if parts is None:
            tokens = self.par.micro_batch * self.local_seq * self.model.top_k
            plan, sound = self._scale_plans[id(balanced)]
            # _scale_kernel of each kernel, unrolled: the same operations on the same values
            factor = load / tokens
            out, all_flops, all_bytes = [], [], []
            for category, flops, nbytes, shape, batch, at in plan:
                if at is not None:  # the token rows (a GEMM's m, or the reduced m of a weight gradient)
                    head, dim, tail = at
                    d = round(dim * factor)
                    shape = head + (d if d > 1 else 1,) + tail  # max(1, d) in its place
                flops *= factor
                nbytes *= factor
                all_flops.append(flops)
                all_bytes.append(nbytes)
                out.append(Kernel(category, flops, nbytes, shape, batch))
            parts = self._moe_parts[key] = tuple(out)
            # The graph's totals of these kernels (:meth:`OpGraph._part_sums`: ``sum`` over the same floats in the
            # same order), recorded as checked: finite non-negative kernels times a finite factor >= 0 are
            # non-negative, and finite when their sums are.
            flops, nbytes = sum(all_flops), sum(all_bytes)
            if sound and 0 <= factor < math.inf and flops < math.inf and nbytes < math.inf:
                self.graph._known_parts(parts, flops, nbytes)
        return parts

    def _ep_group(self, rank: int) -> tuple[tuple[int, ...], int]:
        """``rank``'s EP group and its index in it (looked up once per rank: asked at every MoE layer pass)."""
        found = self._ep_groups.get(rank)
        if found is None:
            group = self.layout.ep_group(rank)
            found = self._ep_groups[rank] = (group, group.index(rank))
        return found

    def _moe_rows_for(self, rank: int, layer: int, mb: int) -> tuple[tuple[int, ...], int, tuple]:
        """``rank``'s EP group, its index ``e`` in it, and its rows in micro-batch ``mb`` of MoE layer ``layer``:
        bytes it sends to each EP peer in the dispatch (owner → experts), in the combine (experts → owners), the
        token slots its experts compute, and under ``moe.dispatch: deepep`` the NVLink forwards out and back."""
        group, e = self._ep_group(rank)
        table = self._draw_tables.get((layer, mb))
        if table is not None:  # (every EP index's rows of this layer and micro-batch, found below)
            return group, e, table[e]
        tokens = self._tokens(layer, mb, (layer, mb if self.routing.draw == "micro_batch" else None))
        if self.routing.dispatch == "deepep":  # kept per (matrix, which ranks share a node): see _deepep_rows
            return group, e, self._deepep_rows(tokens, layer, group, e)
        table = self._tables_of.get((id(tokens),))  # the same for every EP group (and micro-batch: draw: layer)
        if table is None:
            # etp = tp: the layer's tokens are routed once per TP group, each TP rank ships its 1/t of them.
            # Expert grid: every rank routes its own sequence-parallel tokens (drawn as b s / t per rank).
            per_token = self.model.hidden * self.dtype / (1 if self.expert_grid else self.t)
            # Every EP index of the draw at once (each reads its rows of the same matrix). The array product is
            # each ``float(count) * per_token`` exactly; the column sums are exact for integer counts.
            scaled = tokens * per_token
            # Each distinct size made a Python float once and shared by the rows that hold it (a draw's counts
            # repeat: ~4 million floats, ~90 MiB, of a 1,024-rank EP64 step were a few thousand values).
            values, where = np.unique(scaled, return_inverse=True)
            sizes, where = values.tolist(), where.reshape(scaled.shape)
            table = self._tables_of[(id(tokens),)] = [
                (_pick(sizes, out),   # owner → experts
                 _pick(sizes, back),  # experts → owners
                 int(load))           # token slots this rank's experts compute
                for out, back, load in zip(where.tolist(), where.T.tolist(), _column_sums(tokens))]
            if scaled.dtype == np.float64 and not (scaled < 0).any():  # floats, none negative: checked here
                self.graph._known_splits([row for out, back, _load in table for row in (out, back)])
        self._draw_tables[(layer, mb)] = table
        return group, e, table[e]

    def _whole_groups_possible(self, per_ep_index: bool, lane_sizes: bool = False) -> bool:
        """Whether one lockstep representative can issue for its whole EP group (:meth:`build`): always under
        balanced routing; under skewed routing unless a faster member would start work early (the shared expert
        overlapping the exchanges, a split backward's W passes and DualPipe's pairs, stragglers:
        ``per_ep_index``), or each member's expert-TP all-gather carries its own load (``etp > 1``: one collective
        of the representative's can only with ``lane_sizes``, a size per lane, as ``fast``'s representatives per
        EP group issue it off the expert grid with every TP group in one server: ``Collective.lane_bytes``,
        :meth:`_tp_groups_in_servers`). On the expert grid (``etp != tp`` or
        ``cp > 1``) the group's members are TP, CP and DP peers alike: with the conditions met the representative
        stands for its stage's whole block, every EP group of which is a translate of its own
        (:func:`simulator.engine.lanes`); without them every rank is emitted."""
        if self.routing.kind == "balanced":
            return True
        # (lane_sizes: fast's EP groups, never on the expert grid; only where no two lanes share a link)
        own_gathers = self.etp > 1 and not (lane_sizes and self._tp_groups_in_servers())
        return not (per_ep_index or self.split_backward or own_gathers
                    or (self.routing.shared_expert_overlap and self.model.shared_experts))

    def _tp_groups_in_servers(self) -> bool:
        """Whether every TP group lies in one server (``moe.node_gpus`` GPUs: rank ``r`` on server
        ``r // node_gpus``), so that the expert-TP collectives of an EP group's members, each over its own TP
        group, share no link (each GPU has its own NVLink ports).

        Why it matters: a representative issues its members' expert-TP reduce-scatters as one collective's lanes
        (``Collective.lane_bytes``), all when its slowest member's experts end; a lighter member's starts earlier
        in ``full``. Over links the lanes share (TP groups across servers, e.g. ``placement: [dp, pp, tp]``) the
        lanes then contend where they do not in ``full``: steps read up to +12% on a 2:1 fabric
        (tests/test_fast_ep_groups.py)."""
        lay, node_gpus = self.layout, self.routing.node_gpus
        return all(len({r // node_gpus for r in lay.tp_group(rank)}) == 1
                   for rank in range(self.par.world_size) if lay.coords(rank).tp == 0)

    def _ep_blocks_possible(self) -> bool:
        """Whether ``fast`` can emit one representative per EP group (``representatives="ep"``, :meth:`build`),
        standing for the group's ranks and their TP peers: where a ``lockstep`` representative could issue for its
        whole EP group (:meth:`_whole_groups_possible`), off the expert grid (an EP group is then ``ep`` consecutive
        DP ranks of one TP index, and its TP peers' groups are its translates) and with more than one EP rank.

        Why this is ``fast``'s and not only ``lockstep``'s: the members of one EP group meet at both exchanges of
        every MoE layer, forward and backward, and between them run the same program but for their experts' loads;
        the representative runs the slowest member's, as the exchange after the experts waits for it. What
        ``lockstep`` adds, and ``fast`` does not, is standing one EP group for the others of its stage, which share
        links elsewhere and drift apart (docs/DESIGN.md, "One representative per EP group in fast")."""
        return (self.expert_parallel and self.par.ep > 1 and not self.expert_grid
                and self._whole_groups_possible(False, lane_sizes=True) and self._ep_layouts_agree())

    def _ep_layouts_agree(self) -> bool:
        """Whether, under ``moe.dispatch: deepep``, the EP groups of each pipeline stage spread over nodes alike
        (the same members share a node). DeepEP's matrices depend on that (:meth:`_deepep_rows`), and a lockstep
        representative's exchanges run on every EP group of its stage with its own group's matrix; the
        all_to_all dispatcher's rows do not depend on nodes. True when nothing depends on it."""
        if self.routing.dispatch != "deepep":
            return True
        lay, node_gpus = self.layout, self.routing.node_gpus
        seen: dict[int, tuple[int, ...]] = {}
        for rank in range(self.par.world_size):
            nodes = [r // node_gpus for r in lay.ep_group(rank)]
            pattern = tuple(n - nodes[0] for n in nodes)
            if seen.setdefault(lay.coords(rank).pp, pattern) != pattern:
                return False
        return True

    def _group_matrices(self, rank: int, layer: int, mb: int) -> tuple[tuple[tuple[float, ...], ...], ...]:
        """Every member's rows of ``rank``'s EP group in micro-batch ``mb`` of ``layer``, one matrix per exchange
        (dispatch, combine, and DeepEP's forwards out and back): what a representative issuing for its whole EP
        group carries (``rows`` of :class:`~workloads.ops.Collective`). Equal matrices are one object (balanced
        routing draws the same matrix every time), so the engine and network see a recurring exchange."""
        group, _e = self._ep_group(rank)
        draw = (layer, mb if self.routing.draw == "micro_batch" else None)
        # Only balanced routing issues for whole groups, and its draws share one rank matrix (:meth:`route`): the
        # matrices are kept per that matrix and group, so a new draw costs a lookup.
        key = (id(self._tokens(layer, mb, draw)), group)
        found = self._ep_matrices.get(key)
        if found is None:
            # each member's (out, back, load, *forwards): the byte rows, without the load
            rows = [(out, back, *forwards) for out, back, _load, *forwards in
                    (self._moe_rows_for(r, layer, mb)[2] for r in group)]
            found = tuple(self._equal_matrices.setdefault(m, m) for m in zip(*rows))
            self._ep_matrices[key] = found
        return found

    def _group_loads(self, rank: int, layer: int, mb: int) -> tuple[int, ...]:
        """Token slots each member of ``rank``'s EP group computes in micro-batch ``mb`` of ``layer``, in group
        order (kept per draw and group: every lane's representative asks)."""
        group, _e = self._ep_group(rank)
        key = (layer, mb if self.routing.draw == "micro_batch" else None, group)
        loads = self._loads_of.get(key)
        if loads is None:
            loads = self._loads_of[key] = tuple(self._moe_rows_for(r, layer, mb)[2][2] for r in group)
        return loads

    def _members(self, kernels: tuple[Kernel, ...], loads: tuple[int, ...] | None, scaled) -> tuple | None:
        """Every member's kernels (``Compute.members``) made by ``scaled(kernels, load)`` for each member's
        load, one tuple per distinct (kernels, loads); None when every member has one load."""
        if loads is None:
            return None
        key = (id(kernels), loads)
        found = self._member_parts.get(key)
        if found is None:
            found = self._member_parts[key] = tuple(scaled(kernels, x) for x in loads)
        return found

    def emit_moe(self, rank: int, seg: _Segment, deps: list[int], name: str, mb: int, stage: int) -> int:
        """One pass of a MoE layer outside DualPipe's pairs: :meth:`moe_pieces` run to completion.

        The layer takes ``pre + a2a + experts + a2a + post``; with ``moe.shared_expert_overlap`` the
        all-to-alls go on their own stream (``ep``) and the shared expert's halves run on the compute stream
        meanwhile: ``pre + max(a2a, shared_1) + experts + max(a2a, shared_2) + post`` instead of the sum.
        """
        pieces = self.moe_pieces(rank, seg, deps, name, mb, stage)
        while True:
            try:
                next(pieces)
            except StopIteration as done:
                return done.value

    def moe_pieces(self, rank: int, seg: _Segment, deps: list[int], name: str, mb: int, stage: int,
                   stream: str | None = None) -> Generator[int, None, int]:
        """Emit one pass of MoE layer ``seg.layer`` piece by piece; the one description of a MoE layer's ops.

        In order: the before-dispatch kernels and the pass's TP collectives (compute stream); the dispatch
        (an all-to-all of owner → expert bytes or, under ``moe.dispatch: deepep``, DeepEP's network hop
        with its NVLink forwarding beside it, pipelined in chunks); with ``etp != tp`` an all-gather of the
        dispatched tokens over the expert-TP group; the first shared-expert half (``moe.shared_expert_overlap``)
        beside the dispatch; this rank's experts; the expert-TP reduce-scatter; the combine (and DeepEP's
        forwarding back); the second shared-expert half beside it; the after-combine kernels. The backward
        runs the same shape: the gradient of the combine travels like the dispatch (owner → expert), the
        gradient of the dispatch like the combine.

        Yields the id of each compute piece but the last (before, shared halves, experts), which it returns;
        ops after a yield are emitted when the generator is resumed. ``stream`` None (outside DualPipe's
        pairs): the exchanges block the compute stream, or run on stream ``ep`` (DeepEP's forwarding on
        ``ep_forward``) while the shared expert computes. ``stream`` given (a DualPipe pair, :meth:`_pieces`):
        every exchange runs on ``stream`` (forwarding on ``stream + "_forward"``) and the compute piece after
        it waits for it, so that the pair's other chunk computes meanwhile.
        """
        g = self.graph
        shared = seg.moe[3:]
        group, _e, row = self._moe_rows_for(rank, seg.layer, mb)
        out_row, back_row, load, forward = row[0], row[1], row[2], row[3:]
        # rows of the whole group, when this rank issues the exchanges for its EP peers too (lockstep, symmetric)
        if self._whole_ep_groups:
            out_rows, back_rows, *forward_rows = self._group_matrices(rank, seg.layer, mb)  # bytes, member x member
            loads = self._group_loads(rank, seg.layer, mb)
            load = max(loads)  # the slowest member's experts: the exchange after them waits for it
            if min(loads) == load:  # (balanced routing: one load, one program)
                loads = None
        else:
            out_rows = back_rows = loads = None
            forward_rows = (None, None)
        gather = None
        # Megatron-Core's alltoall dispatcher with etp > 1: all-gather the dispatched tokens over the expert TP
        # group, run the experts on all of them (width f / etp), reduce-scatter back before the combine.
        # (etp = tp: the expert TP group is the TP group, RankLayout.etp_group)
        if self.etp > 1:
            gather = self._etp_groups.get(rank)
            if gather is None:
                gather = self._etp_groups[rank] = self.layout.etp_group(rank)
        if self.expert_grid:  # (drawn per rank: etp x load rows; per TP group otherwise, load rows already)
            load *= self.etp
        kernels = self._moe_kernels.get(id(seg.moe))
        if kernels is None or kernels[0] is not seg.moe:
            before, experts, after = seg.moe[:3]
            masks = seg.moe_recompute or tuple((False,) * len(piece) for piece in seg.moe)
            # The recomputed forward (``full``'s whole forward, ``core_attn``'s attention core: the kernels at the
            # front of the backward, _moe_split) runs first as an op of its own, ``R…`` as the dense layers', so
            # that the breakdown tells recomputation from backward. Full recomputation re-runs the forward's routed
            # experts there between the exchanges (moe_pieces below), at this rank's load as the forward ran them:
            # cut out of the recomputed kernels to be scaled. The kernels that ``selective``'s other modules re-run
            # inside the pass (the norms before the GEMMs they feed, ``moe_act``'s activation before the experts'
            # down projection) run first in their piece, as an ``R…`` op of their own (none where a piece re-runs
            # nothing: no op added): ``R….pre`` before the kernels before the dispatch, ``R….experts`` at this
            # rank's load before its experts (with every member's), ``R….post`` before the kernels after the combine.
            start = _leading(seg.recompute) if seg.recompute else 0
            if any(any(m) for m in masks[3:]):
                raise AssertionError(f"layer {seg.layer}: a recomputed kernel among the shared expert's halves")
            pre_again, pre = _recomputed_first(before[start:], masks[0][start:])
            experts_again, experts = _recomputed_first(experts, masks[1])
            post_again, post = _recomputed_first(after, masks[2])
            rerun, halves = before[:start], ()
            again = [i for i, o in enumerate(rerun) if o.name.startswith("experts")]
            if again and shared:  # the re-run shared expert's halves beside the re-run exchanges, as _moe_split's
                extra = [o for o in rerun if o.name.startswith("shared")]
                cut = _shared_cut(extra)
                halves = (_kernels(extra[:cut]), _kernels(extra[cut:]))
                rerun = [o for o in rerun if not o.name.startswith("shared")]
                again = [i for i, o in enumerate(rerun) if o.name.startswith("experts")]
            if again and (pre_again or experts_again or post_again):
                raise AssertionError(f"layer {seg.layer}: kernels recomputed inside a fully recomputed pass")
            redo = ((_kernels(rerun[:again[0]]), self._balanced(self._recomputed_experts(seg.layer, seg.phase)),
                     _kernels(rerun[again[-1] + 1:])) if again else (_kernels(rerun), None, ()))
            pieces = ((_kernels(pre_again), _kernels(pre)), (_kernels(post_again), _kernels(post)))
            kernels = self._moe_kernels[id(seg.moe)] = (
                seg.moe, (*redo, pieces[0], halves), pieces[1],
                (self._balanced(experts_again) if experts_again else None, self._balanced(experts)),
                *(_kernels(k) for k in shared))
            # Context parallelism: the pieces holding an attention kernel run it with its CP communication
            head_ops = rerun[:again[0]] if again else rerun
            self._cp_piece(redo[0], head_ops, (True,) * len(head_ops))
            for piece, (first, rest) in zip(pieces, ((pre_again, pre), (post_again, post))):
                self._cp_piece(piece, first + rest, (True,) * len(first) + (False,) * len(rest))
        layer = seg.layer
        # off the compute stream: the exchanges are waited for explicitly
        apart = bool(shared) or stream is not None
        a2a_stream = stream or ("ep" if shared else COMPUTE_STREAM)
        hop_stream = f"{stream}_forward" if stream else "ep_forward"
        fwd = seg.phase == "F"
        # the hot ops by the graph's positional builders (the same checks and ops as compute / collective_op)
        compute = g._compute_parts
        regather = self._regather_op(rank, seg, deps, name, mb, stage)
        head, again, tail, pre, halves = kernels[1]
        # What both the pass and a recomputed forward run around the experts: the dispatch-direction exchange
        # (DeepEP's forwarding beside it), the expert-TP gather, the experts at this rank's load, the expert-TP
        # reduce-scatter, the combine-direction exchange (:meth:`_exchanged`).
        token_bytes = self.model.hidden * self.dtype
        # issuing for members of unequal loads (fast's representative of an EP group): the expert-TP gather runs on
        # a lane per member's TP group, the block's members in order, each at its own load
        lanes = tuple(m * token_bytes for m in loads) if gather is not None and loads is not None else None
        exchange = _Exchange(rank, group, (out_row, back_row), (out_rows, back_rows), forward, forward_rows, gather,
                             load * token_bytes, load, apart, a2a_stream, hop_stream, layer, mb, stage, lanes)
        redo = bool(head) or again is not None
        if redo:  # the recomputed kernels at the front (before the routed experts under full recomputation)
            cp_head = self._cp_ops(head)
            deps = [self._cp_run(rank, cp_head[1], cp_head[2], deps, name, layer, mb, stage) if cp_head else
                    compute(rank, head, RECOMPUTE_PHASE + name[1:], deps, "gemm", layer, mb, stage, COMPUTE_STREAM)]
        if again is not None:
            # Full recomputation re-runs the layer's forward whole before the backward, its token dispatcher's
            # exchanges included (Megatron-Core's checkpointed layer replays its dispatch and combine, with the
            # shared expert beside them under overlap; DeepEP's cached-dispatch flag, NVIDIA/Megatron-LM PR 7425,
            # exists to shorten exactly that replay): ``R…`` (the kernels before the experts), the dispatch,
            # ``R….experts`` at this rank's forward load (with every member's, :meth:`_members`), the combine,
            # ``R….post`` (the kernels after them); its pieces are yielded as the pass's are (DualPipe's other
            # chunk computes under its exchanges).
            yield deps[0]
            deps = [(yield from self._exchanged(exchange, deps[0], RECOMPUTE_PHASE + name[1:], ("dispatch", "combine"),
                                                (None, again), loads, halves, ((), tail)))]
        last = self._piece(rank, pre, f"{name}.pre", deps, layer, mb, stage, redo)
        last = self._emit_tp(rank, seg, name, last, mb, stage, after=regather)
        yield last
        directions = ("dispatch", "combine") if fwd else ("combine_grad", "dispatch_grad")
        return (yield from self._exchanged(exchange, last, name, directions, kernels[3], loads,
                                           (kernels[4], kernels[5]) if shared else (), kernels[2]))

    def _exchanged(self, x: _Exchange, last: int, name: str, directions: tuple[str, str],
                   balanced: tuple[tuple[Kernel, ...] | None, tuple[Kernel, ...]], loads: tuple[int, ...] | None,
                   halves: tuple, post: tuple[tuple[Kernel, ...], tuple[Kernel, ...]]) -> Generator[int, None, int]:
        """From compute op ``last`` on, the pieces of one pass (or re-run forward) of a MoE layer around its
        experts: the owner → expert exchange ``{name}.ep_{directions[0]}``, the first shared-expert half beside it
        (``halves``, under ``moe.shared_expert_overlap``), the experts (``balanced``: the recomputed kernels among
        them, or None, and the others, at the rank's load), the expert → owner exchange
        ``{name}.ep_{directions[1]}``, the second half beside it; yields each compute piece, returns the op of the
        ``post`` kernels after them (``{name}.post``; ``post``: the recomputed kernels among them, run first as
        ``R….post``, and the others)."""
        compute = self.graph._compute_parts
        first, wait = self._send_out(x, last, name, directions[0])
        if halves:
            yield compute(x.rank, halves[0], f"{name}.shared_1", (), "gemm", x.layer, x.mb, x.stage, COMPUTE_STREAM)
        done = self._experts_between(x, first, wait, balanced, loads, name)
        yield done
        wait = self._send_back(x, done, name, directions[1])
        if halves:
            yield compute(x.rank, halves[1], f"{name}.shared_2", (), "gemm", x.layer, x.mb, x.stage, COMPUTE_STREAM)
        return self._piece(x.rank, post, f"{name}.post", wait, x.layer, x.mb, x.stage)

    def _piece(self, rank: int, kernels: tuple[tuple[Kernel, ...], tuple[Kernel, ...]], name: str, deps: list[int],
               layer: int, mb: int, stage: int, optional: bool = False) -> int:
        """The compute op ``name`` of one piece of a MoE layer's pass, ``kernels`` = (the recomputed forward
        kernels among them, the others), after ``deps``: the recomputed ones first as an op of their own,
        ``R…`` (:data:`RECOMPUTE_PHASE`) for the breakdown (:meth:`_recompute_piece`), when there are any; the
        others' op, when there are any or nothing else runs (unless ``optional``: then ``deps[0]``, an op already
        emitted). Returns the piece's last op."""
        cp_ops = self._cp_ops(kernels)
        if cp_ops:  # (context parallelism: the attention's CP communication cuts the piece)
            return self._cp_run(rank, cp_ops[1], cp_ops[2], deps, name, layer, mb, stage)
        compute = self.graph._compute_parts
        again, rest = kernels
        if again:
            deps = [compute(rank, again, f"{RECOMPUTE_PHASE}{name[1:]}", deps, "gemm", layer, mb, stage,
                            COMPUTE_STREAM)]
            if not rest:
                return deps[0]
        elif not rest and optional:
            return deps[0]
        last = compute(rank, rest, name, deps, "gemm", layer, mb, stage, COMPUTE_STREAM)
        if again:
            self._recompute_piece(deps[0], last)
        return last

    def _cp_piece(self, kernels: tuple, ops: list[LayerOp], recompute: tuple[bool, ...]) -> None:
        """Record that the MoE piece ``kernels`` (a kernel tuple, or a pair of them) runs ``ops`` (``recompute``:
        which are recomputed forward kernels) with CP communication, when context parallelism is on and the
        piece holds an attention kernel (:meth:`_cp_ops` finds it at emission)."""
        if self.cp > 1 and any(o.category in ("attention", "attention_bwd") for o in ops):
            self._cp_pieces[id(kernels)] = (kernels, ops, recompute)

    def _cp_ops(self, kernels: tuple) -> tuple | None:
        """``(kernels, ops, recompute)`` recorded by :meth:`_cp_piece` for the MoE piece ``kernels``, or None."""
        found = self._cp_pieces.get(id(kernels)) if self._cp_pieces else None
        return found if found is not None and found[0] is kernels else None

    def _recompute_piece(self, again: int, rest: int) -> None:
        """Op ``again``, the recomputed kernels of a piece whose other kernels are op ``rest``, split from it for
        the breakdown alone: in a DualPipe pair it runs as ``rest`` does beside the exchanges (:meth:`_leave_sms`)."""
        if self._split_pieces is not None:
            self._split_pieces.append((again, rest))

    def _send_out(self, x: _Exchange, last: int, name: str, direction: str) -> tuple[int, list[int]]:
        """The owner → expert exchange ``{name}.ep_{direction}`` of ``x`` after op ``last`` (a dispatch, or the
        gradient of a combine), with DeepEP's NVLink forwarding beside it (``{name}.ep_forward``, pipelined in
        chunks): ``(its op, what the next piece waits for)``."""
        alltoallv = self.graph._alltoallv
        first = alltoallv(x.rank, x.group, x.rows[0], x.matrices[0], f"{name}.ep_{direction}",
                          [last] if x.apart else (), x.stream, x.layer, x.mb, x.stage)
        wait: list[int] = [first] if x.apart else []
        if x.forward:
            wait.append(alltoallv(x.rank, x.group, x.forward[0], x.forward_rows[0], f"{name}.ep_forward", [last],
                                  x.hop_stream, x.layer, x.mb, x.stage))
        return first, wait

    def _experts_between(self, x: _Exchange, first: int, wait: list[int],
                         balanced: tuple[tuple[Kernel, ...] | None, tuple[Kernel, ...]],
                         loads: tuple[int, ...] | None, name: str) -> int:
        """The experts between ``x``'s exchanges (``balanced``'s kernels scaled to the rank's load, every member's
        with ``loads``: the recomputed ones, ``moe_act``'s activation, first as ``R….experts`` when there are
        any, then the others), after the expert-TP all-gather of the dispatched tokens when there is one: the
        experts' op, or the reduce-scatter's after them."""
        g = self.graph
        if x.gather is not None:
            first = g.collective_op(x.rank, "all_gather", x.gather, x.gather_bytes, name=f"{name}.etp_gather",
                                    traffic_class="tp", deps=wait + [first], layer=x.layer, micro_batch=x.mb,
                                    stage=x.stage, stream=x.stream, lane_bytes=x.gather_lanes)
            wait = [first] if x.apart else []
        again, balanced = balanced
        if again is not None:
            wait = [g._compute_parts(x.rank, self._expert_parts(again, x.load), f"{RECOMPUTE_PHASE}{name[1:]}.experts",
                                     wait, "gemm", x.layer, x.mb, x.stage, COMPUTE_STREAM,
                                     self._members(again, loads, self._expert_parts))]
        members = self._members(balanced, loads, self._expert_parts)
        done = g._compute_parts(x.rank, self._expert_parts(balanced, x.load), f"{name}.experts", wait, "gemm",
                                x.layer, x.mb, x.stage, COMPUTE_STREAM, members)
        if again is not None:
            self._recompute_piece(wait[0], done)
        return done

    def _send_back(self, x: _Exchange, done: int, name: str, direction: str) -> list[int]:
        """The expert-TP reduce-scatter ``{name}.etp_scatter`` after the experts' op ``done`` (when there is one)
        and the expert → owner exchange ``{name}.ep_{direction}`` of ``x`` (a combine, or the gradient of a
        dispatch) with DeepEP's forwarding back (``{name}.ep_forward_back``): what the piece after them waits
        for."""
        g = self.graph
        if x.gather is not None:
            done = g.collective_op(x.rank, "reduce_scatter", x.gather, x.gather_bytes, name=f"{name}.etp_scatter",
                                   traffic_class="tp", deps=[done], layer=x.layer, micro_batch=x.mb, stage=x.stage,
                                   stream=x.stream, lane_bytes=x.gather_lanes)
        second = g._alltoallv(x.rank, x.group, x.rows[1], x.matrices[1], f"{name}.ep_{direction}",
                              [done] if x.apart else (), x.stream, x.layer, x.mb, x.stage)
        wait = [second] if x.apart else []
        if x.forward:
            wait.append(g._alltoallv(x.rank, x.group, x.forward[1], x.forward_rows[1], f"{name}.ep_forward_back",
                                     [done], x.hop_stream, x.layer, x.mb, x.stage))
        return wait

    def _tokens(self, layer: int, mb: int, draw: tuple) -> np.ndarray:
        """Tokens EP rank ``i`` sends to EP rank ``j`` in ``draw`` (:meth:`LayerRouting.rank_matrix`), made once
        per draw: every EP index's rows read it."""
        tokens = self._rank_tokens.get(draw)
        if tokens is None:
            r = self.route(layer, mb)
            found = self._matrix_of.get(id(r))  # one matrix per routing object (balanced: one for all draws)
            if found is None or found[0] is not r:
                found = self._matrix_of[id(r)] = (r, r.rank_matrix())
            tokens = self._rank_tokens[draw] = found[1]
        return tokens

    def _deepep_rows(self, tokens: np.ndarray, layer: int, group: tuple[int, ...], e: int) -> tuple:
        """EP rank ``e``'s rows under ``moe.dispatch: deepep`` (:func:`~workloads.moe.deepep_matrices`) of the draw
        whose rank matrix is ``tokens`` (of MoE layer ``layer``): first hop out, first hop back (its transpose),
        expert slots, NVLink forward out, forward back; every EP index's at once, kept per (matrix, node pattern)."""
        ep, experts = self.par.ep, self.model.experts
        found = self._node_patterns.get(group)
        if found is None:
            nodes = [x // self.routing.node_gpus for x in group]
            found = self._node_patterns[group] = (nodes, tuple(x - nodes[0] for x in nodes))
        nodes, pattern = found
        key = (id(tokens), pattern)  # the matrices read only which ranks share a node
        per_e = self._tables_of.get(key)
        if per_e is None:
            probs = self.routing.choice_probabilities(experts, self.model.top_k, layer)
            probs = probs.reshape(ep, experts // ep).sum(axis=1)
            first, forward = deepep_matrices(tokens, probs, self.model.top_k, nodes, self.routing.max_nodes,
                                             experts // ep)
            per_token = self.model.hidden * self.dtype / (1 if self.expert_grid else self.t)
            # FP8 training: tokens travel owner -> experts in FP8 with one fp32 scale per 128 elements (DeepEP's
            # FP8 dispatch; DeepSeek-V3 section 3.3.4 quantizes the activations before the up-projections and
            # the gradients before the down-projections), back in bf16 (both combines).
            out_token = per_token * (1 + 4 / 128) / self.dtype if self.fp8 else per_token
            # Every EP index's rows at once, as for the all-to-all (:meth:`_moe_rows_for`): the float64 products
            # are each ``float(x) * bytes per token`` exactly, the column sums of integer counts exact.
            arrays = [first * out_token, first.T * per_token]
            if forward.any():  # an EP group inside one node has nothing to forward
                arrays += [forward * out_token, forward.T * per_token]
            tables = [a.tolist() for a in arrays]
            tables.insert(2, _column_sums(tokens))
            per_e = self._tables_of[key] = [(tuple(out), tuple(back), int(load), *(tuple(row) for row in more))
                                            for out, back, load, *more in zip(*tables)]
            if all(a.dtype == np.float64 and not (a < 0).any() for a in arrays):  # floats, none negative
                self.graph._known_splits([row for out, back, _load, *more in per_e for row in (out, back, *more)])
        return per_e[e]

    def _tp_group(self, rank: int) -> tuple[int, ...]:
        group = self._tp_groups.get(rank)
        if group is None:
            group = self._tp_groups[rank] = self.layout.tp_group(rank)
        return group

    def _emit_tp(self, rank: int, seg: _Segment, name: str, last: int, mb: int, stage: int,
                 after: Sequence[int] = ()) -> int:
        """The pass's blocking TP collectives after ``last`` on the compute stream; the first also waits for
        ``after`` (the backward's re-gathers)."""
        if not seg.tp and not after and not seg.loss_reduce and not seg.tp_widths:  # no TP collectives: nothing
            return last
        group = self._tp_group(rank)
        for kind in ("all_reduce", "all_gather", "reduce_scatter"):
            count = seg.tp.get(kind, 0)
            if count:
                last = self.graph.collective_op(rank, kind, group, self.tp_bytes, name=f"{name}.tp_{kind}",
                                                stream=COMPUTE_STREAM, count=count, traffic_class="tp",
                                                layer=seg.layer, micro_batch=mb, stage=stage, deps=after)
                after = ()
        for (kind, width), count in seg.tp_widths.items():  # MLA's latents (_tp_widths)
            if kind != "regather" and count:
                last = self.graph.collective_op(rank, kind, group, self.tp_width_bytes(width),
                                                name=f"{name}.tp_latent{width}_{kind}", stream=COMPUTE_STREAM,
                                                count=count, traffic_class="tp", layer=seg.layer, micro_batch=mb,
                                                stage=stage, deps=after)
                after = ()
        if seg.loss_reduce:
            for nbytes in self.loss_all_reduce_bytes:
                last = self.graph.collective_op(rank, "all_reduce", group, nbytes,
                                                name=f"{name}.loss_all_reduce", stream=COMPUTE_STREAM,
                                                traffic_class="tp", layer=seg.layer, micro_batch=mb, stage=stage,
                                                deps=[last, *after])
                after = ()
        if after:
            raise AssertionError(f"{name}: re-gathers with no TP collective to wait for them")
        return last

    # ------------------------------------------------------ TP comm overlap
    def _ub_bytes(self, kind: str) -> float:
        """Bytes of one userbuffers collective (nccl-tests convention): an all-gather of ``b s h`` elements,
        FP8 under FP8 training (TE's ``fp8_buf`` for every all-gather overlap); a reduce-scatter in bf16."""
        if kind == "all_gather" and self.fp8:
            return float(self.act_elems)
        return self.tp_bytes

    def emit_tp_overlap(self, rank: int, seg: _Segment, deps: list[int], name: str, mb: int, stage: int) -> int:
        """One pass of ``seg`` with Transformer Engine's userbuffer overlaps (``parallel.tp_comm_overlap``).

        The kernels run in order on the compute stream; at each linear layer whose sequence-parallel
        communication TE overlaps (:data:`UB_METHODS`) the GEMM is cut as TE cuts it, the overlapped
        communication runs on stream ``tp_overlap`` and the rest waits for it. A run of ``n`` identical
        layers is emitted once with every kernel and collective ``n`` times (``count``): without contention
        ``n`` times a layer's time, since ``max(n a, n c) = n max(a, c)``.
        """
        g, t = self.graph, self.t
        group = self._tp_groups.get(rank)
        if group is None:
            group = self._tp_groups[rank] = self.layout.tp_group(rank)
        sms = self.opt.tp_comm_overlap_sms
        tags = {"layer": seg.layer, "micro_batch": mb, "stage": stage, "traffic_class": "tp"}
        cache, step = seg.ub_parts, [0]
        state: dict = {"last": None, "pending": list(deps), "bulk_ag": None}
        buf: list[Kernel] = []
        flag = [False]  # whether the kernels in ``buf`` are recomputed forward kernels

        def parts(build) -> tuple[Kernel, ...]:
            """The kernels of the next compute op: built on the first micro-batch, reused after."""
            i = step[0]
            step[0] += 1
            if i == len(cache):
                cache.append(tuple(build()))
            return cache[i]

        def compute(kernels, recompute: bool, extra: Sequence[int] = ()) -> int:
            op_name = (RECOMPUTE_PHASE + name[1:]) if recompute else name
            op = g.compute(rank, parts=parts(lambda: kernels), name=f"{op_name}.ub{step[0]}",
                           deps=state["pending"] + list(extra), stream=COMPUTE_STREAM, category="gemm",
                           layer=seg.layer, micro_batch=mb, stage=stage)
            state["last"], state["pending"] = op, []
            return op

        def flush() -> None:
            if buf:
                compute(list(buf), flag[0])
                buf.clear()

        def add(kernels: list[Kernel], recompute: bool) -> None:
            if buf and flag[0] != recompute:
                flush()
            flag[0] = recompute
            buf.extend(kernels)

        def anchor() -> list[int]:
            """What the communication of the next GEMM waits for: the op before it (or the segment's deps)."""
            return [state["last"]] if state["last"] is not None else list(state["pending"])

        def collective(kind: str, nbytes: float, count: int, stream: str, after: list[int], what: str) -> int:
            # (userbuffers' SMs are the GEMMs' sm_reserved, or none for the copy-engine ring exchange)
            return g.collective_op(rank, kind, group, nbytes, name=f"{name}.tp_{what}_{kind}", stream=stream,
                                   deps=after, count=count, holds_sms=stream != UB_STREAM, **tags)

        regather = self._regather_op(rank, seg, deps, name, mb, stage)  # (the output layer's, beside the pass)
        head, runs, tail = seg.ub
        add([k.kernel() for k in head], False)
        for kernels, again, n in runs:
            for op, rec in zip(kernels, again):
                method = UB_METHODS.get(op.name) if op.category in GEMM_CATEGORIES else None
                if method is None:
                    add([op.kernel()] * n, rec)
                elif method == "ring":
                    # ring exchange: t GEMM chunks, chunk i on the block that arrived at step i (copy engines,
                    # no SMs reserved); the first runs on the local block while the rest travel
                    flush()
                    ring = collective("all_gather", self._ub_bytes("all_gather"), n, UB_STREAM, anchor(), op.name)
                    chunk = _ub_chunk(op, t, 0)
                    if t > 1:
                        compute([chunk] * ((t - 1) * n), rec)
                    add([chunk] * n, rec)  # the last chunk waits for the whole ring
                    state["pending"] = state["pending"] + [ring]
                elif method == "pipeline":
                    # GEMM then reduce-scatter in UB_PIPELINE_SPLITS chunks on sm_reserved fewer SMs: the
                    # reduce-scatter of chunk i runs beside the GEMM of chunk i + 1; the last one is exposed
                    chunk = _ub_chunk(op, UB_PIPELINE_SPLITS, sms)
                    add([chunk] * n, rec)
                    flush()
                    first = state["last"]
                    rest = compute([chunk] * ((UB_PIPELINE_SPLITS - 1) * n), rec)
                    nbytes = self._ub_bytes("reduce_scatter") / UB_PIPELINE_SPLITS
                    before = collective("reduce_scatter", nbytes, (UB_PIPELINE_SPLITS - 1) * n, UB_STREAM, [first],
                                        op.name)
                    state["last"] = collective("reduce_scatter", nbytes, n, COMPUTE_STREAM, [rest, before], op.name)
                elif method == "bulk_ag":
                    # the data-gradient GEMM beside the all-gather of the layer's input (for the weight gradient)
                    flush()
                    state["bulk_ag"] = collective("all_gather", self._ub_bytes("all_gather"), n, UB_STREAM,
                                                  anchor(), op.name)
                    compute([_ub_chunk(op, 1, sms)] * n, rec)
                else:  # "bulk_rs": the weight-gradient GEMM beside the reduce-scatter of the data gradient
                    flush()
                    rs = collective("reduce_scatter", self._ub_bytes("reduce_scatter"), n, UB_STREAM, anchor(),
                                    op.name)
                    gathered = [state.pop("bulk_ag")] if state.get("bulk_ag") is not None else []
                    state["bulk_ag"] = None
                    compute([_ub_chunk(op, 1, sms)] * n, rec, gathered)
                    state["pending"] = [rs]
        add([k.kernel() for k in tail], False)
        flush()
        if state["pending"] or state.get("bulk_ag") is not None:
            raise AssertionError(f"{name}: a layer pass ended on overlapped communication")
        return self._emit_tp(rank, seg, name, state["last"], mb, stage, after=regather)

    # ---------------------------------------------------------------- emit
    # ------------------------------------------------------------------ CP
    def _cp_group(self, rank: int) -> tuple[int, ...]:
        group = self._cp_groups.get(rank)
        if group is None:
            group = self._cp_groups[rank] = self.layout.cp_group(rank)
        return group

    def _ring_steps(self, op: LayerOp, cp_rank: int) -> list[list[Kernel]]:
        """The kernels of ring attention's steps for ``op`` on CP rank ``cp_rank``
        (:func:`~workloads.flops.ring_attention_steps`), built once per kernel and CP rank."""
        key = (op, cp_rank)
        found = self._ring_cache.get(key)
        if found is None:
            steps = ring_attention_steps(op, self.model, self.par.micro_batch, self.train.seq_len, self.t, self.cp,
                                         cp_rank, self.dtype)
            found = self._ring_cache[key] = [[x.kernel() for x in step] for step in steps]
        return found

    def emit_cp(self, rank: int, seg: _Segment, deps: list[int], name: str, mb: int, stage: int) -> int:
        """One layer's pass under context parallelism: its kernels in order, cut at every attention kernel
        (the forward's, a recomputed one, the backward's) by that kernel's CP communication."""
        regather = self._regather_op(rank, seg, deps, name, mb, stage)
        last = self._cp_run(rank, seg.kernels, seg.recompute, deps, name, seg.layer, mb, stage)
        return self._emit_tp(rank, seg, name, last, mb, stage, after=regather)

    def _cp_run(self, rank: int, kernels: Sequence[LayerOp], recompute: Sequence[bool] | None, deps: list[int],
                name: str, layer: int, mb: int, stage: int) -> int:
        """``kernels`` (``recompute``: which are recomputed forward kernels) run in order after ``deps``, cut at
        every attention kernel by its CP communication (:meth:`emit_cp`; a MoE layer's pieces around its
        exchanges too, :meth:`moe_pieces`): the last op, a compute op or the communication the pass ended at."""
        g, cp = self.graph, self.cp
        group = self._cp_group(rank)
        tags = {"layer": layer, "micro_batch": mb, "stage": stage}
        b, s, h, kv, t, d = (self.par.micro_batch, self.train.seq_len, self.model.hidden, self.model.kv_hidden,
                             self.t, self.dtype)
        kv_bytes = 2.0 * b * s * kv / t * d  # K and V of the whole sequence, one TP rank's heads
        mla = self.model.is_mla
        if mla:  # multi-head latent attention: K and V expanded per head, at their own widths
            qw, kw, vw, ow = self.model.attention_widths
            kv_bytes = float(b * s * (kw + vw)) / t * d
        again = recompute or (False,) * len(kernels)
        buf: list[Kernel] = []
        state = {"last": None, "pending": list(deps), "recompute": False, "n": 0}

        def compute(parts: list[Kernel], recompute: bool, extra: Sequence[int] = ()) -> int:
            op_name = (RECOMPUTE_PHASE + name[1:]) if recompute else name
            state["n"] += 1
            op = g.compute(rank, parts=tuple(parts), name=f"{op_name}.cp{state['n']}",
                           deps=state["pending"] + list(extra), stream=COMPUTE_STREAM, category="gemm", **tags)
            state["last"], state["pending"] = op, []
            return op

        def flush(extra: Sequence[int] = ()) -> None:
            if buf:
                compute(list(buf), state["recompute"], extra)
                buf.clear()

        for op, recomputed in zip(kernels, again):
            k = op.kernel()
            if buf and state["recompute"] != recomputed:  # recomputed and backward kernels are separate ops
                flush()
            if not buf:
                state["recompute"] = recomputed
            if op.category not in ("attention", "attention_bwd"):
                buf.append(k)
                continue
            backward = op.category == "attention_bwd"
            flush()
            anchor = [state["last"]] if state["last"] is not None else list(state["pending"])
            if state["last"] is None:  # the pass opens with this attention (a recomputed core, selective)
                # TE issues the ring's first exchange from the compute stream when the recomputation runs
                # (NCCL's stream waits for the issuing stream): not before the rank's compute reaches this
                # pass. A pass after another has no explicit dependency, and on stream ``cp`` the ring was
                # otherwise free to start during the rank's earlier work (as :meth:`_regather_op`).
                before = self._last_on_compute(rank)
                if before is not None and before not in anchor:
                    anchor.append(before)
            kind = self.par.cp_comm_type
            if kind == "all_gather":
                gather = g.collective_op(rank, "all_gather", group, kv_bytes, name=f"{name}.cp_all_gather",
                                         deps=anchor, stream=COMPUTE_STREAM, traffic_class="cp", **tags)
                state["pending"] = [gather]
                att = compute([k], recomputed)
                if backward:
                    state["pending"] = [g.collective_op(rank, "reduce_scatter", group, kv_bytes,
                                                        name=f"{name}.cp_reduce_scatter", deps=[att],
                                                        stream=COMPUTE_STREAM, traffic_class="cp", **tags)]
                    state["last"] = state["pending"][0]
            elif kind == "p2p":
                ring = g.collective_op(rank, "all_gather", group, kv_bytes * (2 if backward else 1),
                                       name=f"{name}.cp_ring{'_bwd' if backward else ''}", stream="cp", deps=anchor,
                                       traffic_class="cp", algorithm="ring", **tags)
                # (a lockstep representative stands for its whole CP group: CP index cp - 1's steps, the slowest but for
                # MHA's backward merges: see the module docstring)
                steps = self._ring_steps(op, cp - 1 if self._whole_cp_groups else group.index(rank))
                compute(steps[0], recomputed)
                if cp > 2:
                    compute([x for step in steps[1:-1] for x in step], recomputed)
                buf.extend(steps[-1])  # the last step waits for the ring, then the layer goes on
                state["recompute"], state["pending"] = recomputed, [ring]
            else:
                q_kv = b * s / cp * (h + 2 * kv) / t * d  # this rank's Q, K, V (dQ, dK, dV) of its tokens
                out = b * s / cp * h / t * d                 # its attention output (gradient)
                if mla:
                    q_kv, out = b * s / cp * (qw + kw + vw) / t * d, b * s / cp * ow / t * d
                first, then = (out, q_kv) if backward else (q_kv, out)
                a2a = g.collective_op(rank, "all_to_all", group, first, name=f"{name}.cp_a2a", deps=anchor,
                                      stream=COMPUTE_STREAM, traffic_class="cp", **tags)
                state["pending"] = [a2a]
                att = compute([k], recomputed)
                state["pending"] = [g.collective_op(rank, "all_to_all", group, then, name=f"{name}.cp_a2a",
                                                    deps=[att], stream=COMPUTE_STREAM, traffic_class="cp", **tags)]
                state["last"] = state["pending"][0]
        flush()
        last = state["last"]
        if state["pending"]:  # the layer ended at a communication op: nothing after it on this stream yet
            last = state["pending"][-1]
        return last

    def emit_segment(self, rank: int, seg: _Segment, deps: list[int], name: str, mb: int, stage: int) -> int:
        g = self.graph
        if seg.moe is not None:
            return self.emit_moe(rank, seg, deps, name, mb, stage)
        if seg.ub is not None:
            return self.emit_tp_overlap(rank, seg, deps, name, mb, stage)
        if self.cp > 1 and any(k.category in ("attention", "attention_bwd") for k in seg.kernels):
            return self.emit_cp(rank, seg, deps, name, mb, stage)
        if seg.parts is None:
            again = seg.recompute or (False,) * len(seg.kernels)
            seg.recompute_parts = _kernels([k for k, r in zip(seg.kernels, again) if r])
            seg.parts = _kernels([k for k, r in zip(seg.kernels, again) if not r])
        tags = {"stream": COMPUTE_STREAM, "category": "gemm", "layer": seg.layer, "micro_batch": mb, "stage": stage}
        last = None
        regather = self._regather_op(rank, seg, deps, name, mb, stage)
        if seg.recompute_parts:
            # Recomputed forward kernels first, as their own op ("R…"), so timelines can tell them apart.
            last = g.compute(rank, parts=seg.recompute_parts, name=RECOMPUTE_PHASE + name[1:], deps=deps, **tags)
            deps = [last]
        parts = seg.parts
        if seg.expert_w is not None:  # the routed experts' weight gradients at this rank's load
            # (a split backward keeps a representative per EP index: never issued for a whole EP group)
            before, balanced, after = seg.expert_w
            load = self._moe_rows_for(rank, seg.layer, mb)[2][2] * (self.etp if self.expert_grid else 1)
            parts = before + self._expert_parts(balanced, load) + after
        if parts or last is None:
            last = g.compute(rank, parts=parts, name=name, deps=deps, **tags)
        return self._emit_tp(rank, seg, name, last, mb, stage, after=regather)

    def _regather_op(self, rank: int, seg: _Segment, deps: list[int], name: str, mb: int, stage: int) -> tuple:
        """The backward's re-gathers of the pass (``seg.regather`` all-gathers, :meth:`_regathers`) as one op
        beside its compute from its start, on their own stream; ``()`` when it has none. The pass's blocking TP
        collectives wait for it (:meth:`_emit_tp`'s ``after``)."""
        widths = [(w, n) for (kind, w), n in seg.tp_widths.items() if kind == "regather" and n]  # MLA's latents
        if not seg.regather and not widths:
            return ()
        # From the pass's start: after its explicit dependencies and after the rank's compute stream has reached
        # it (a backward right after its own forward has no explicit dependency; on its own stream the op was
        # otherwise free to start at t = 0, during the forwards).
        before = self._last_on_compute(rank)
        if before is not None and before not in deps:
            deps = [*deps, before]
        sizes = ([(self.tp_bytes, seg.regather, "")] if seg.regather else []) + [
            (self.tp_width_bytes(w), n, f"_latent{w}") for w, n in widths]
        return tuple(self.graph.collective_op(rank, "all_gather", self._tp_group(rank), nbytes,
                                              name=f"{name}.tp{what}_regather", stream=REGATHER_STREAM, deps=deps,
                                              count=count, traffic_class="tp", layer=seg.layer, micro_batch=mb,
                                              stage=stage) for nbytes, count, what in sizes)

    def _last_on_compute(self, rank: int) -> int | None:
        """The id of ``rank``'s latest op on the compute stream so far, or None. A rank's ops are built together
        (:meth:`build`), so the search back from the graph's end stops at the first op of another rank."""
        ops = self.graph.ops
        for i in range(len(ops) - 1, -1, -1):
            op = ops[i]
            if op.rank != rank:
                return None
            if op.stream == COMPUTE_STREAM:
                return i
        return None

    def build_rank(self, rank: int) -> None:
        g, par, lay = self.graph, self.par, self.layout
        c = lay.coords(rank)
        stage = c.pp
        actions = self.schedules[stage]
        nvs = self.nvs
        overlap = par.overlap_grad_reduce and par.grad_dp * par.weight_copies > 1
        last_b = {}
        for idx, a in enumerate(actions):
            if self.makes_grads(stage, a):
                last_b[a.chunk] = idx
        dp_group = self.grad_group(rank)  # DP x CP (x the mirror stage under dualpipe): the ranks with these weights
        plan = self.plan
        every_mb = plan.grad_sync == "micro_batch"
        gathered = plan.gather is not None and par.dp > 1
        trace = self.zero_trace(stage) if gathered else None
        use_end: dict[int, int] = {}
        gather_of: dict[int, int] = {}
        pending = _Buckets(self, rank, dp_group)
        # Megatron's aligned launch of the gradient reductions (parallel.align_grad_reduce; grad_sync_func of
        # forward_backward_pipelining_*): non-interleaved, stages after the first reduce everything after their
        # last backward; interleaved, a chunk's buckets are launched `stage` backward iterations after its last
        # micro-batch's backward (the same iteration on every stage), the rest after the last backward.
        align = self.aligned_grad_reduce
        defer = align and par.schedule == "1f1b" and stage > 0
        hold = align and par.schedule == "interleaved"
        launch_at: dict[int, int] = {}  # backward iteration -> the chunk whose reductions are launched after it
        if hold:
            table = interleaved_table(self.m, self.v, self.group)
            for j, (mb, chunk) in enumerate(table):
                if mb == self.m - 1 and j + stage < len(table):
                    launch_at[j + stage] = self.v - 1 - chunk
        backwards = 0
        last_op = None
        blocking = self.opt.p2p == "blocking"
        started: set[int] = set()  # chunks whose first forward of the step has run (FP8 casts, param gathers)
        sent: list[int] = []  # sends of the previous action (blocking: the next action waits for them)
        param_gather = par.overlap_param_gather and bool(self._gather_chains(rank))
        aligned = param_gather and par.schedule == "interleaved" and par.align_param_gather
        # (chunk, of the experts' buffer) -> its parameter all-gathers in gather order (overlap_param_gather)
        gathers: dict[tuple[int, bool], list[int]] = {}
        if aligned:  # Megatron dispatches chunks 0 and 1 before the first forward, the others on schedule
            for chunk in range(min(2, self.v)):
                self._dispatch_param_gathers(rank, stage, chunk, [], gathers)
        forwards = 0
        outbox: list[tuple[int, PipeAction]] = []  # (index of the action after which it is sent, action)
        # Megatron's interleaved schedule with blocking transfers: batched exchanges at fixed points, each
        # waited for before the next computation; received tensors queued for the actions that need them
        batched = blocking and par.schedule == "interleaved"
        posts = (interleaved_exchanges(self.p, self.m, self.v, stage, par.microbatch_group_size) if batched
                 else [])
        queues: dict[str, list[int]] = {"act": [], "grad": []}
        barrier = self._exchanges(rank, posts[0], actions, None, queues) if batched else []
        idx = 0
        budget = self._budget
        while idx < len(actions):
            budget.check(idx, len(actions))
            group = actions[idx:idx + 2] if actions[idx].paired else actions[idx:idx + 1]
            a = group[0]
            if aligned and a.phase == "F":
                for chunk in range(2, self.v):
                    if (chunk - 1) * self.group - stage == forwards:
                        self._dispatch_param_gathers(rank, stage, chunk, [last_op] if last_op is not None else [],
                                                     gathers)
                forwards += 1
            waits: list[list[int]] = []
            posted = [last_op] if blocking and last_op is not None else []  # recv posted on reaching the action
            for x in group:
                deps: list[int] = list(sent) if blocking else []
                j = self.position(stage, x.chunk)
                name = f"{x.phase}{x.micro_batch}.c{x.chunk}"
                if batched:
                    deps = list(barrier)
                    kind = "act" if x.phase == "F" and j > 0 else "grad" if x.phase == "B" and j < nvs - 1 else None
                    if kind is not None:
                        if not queues[kind]:
                            raise AssertionError(f"rank {rank} {x}: no {kind} received for it")
                        deps.append(self._gathered(rank, queues[kind].pop(0), name, x.micro_batch, stage))
                elif x.phase == "F" and j > 0:
                    src = lay.rank(tp=c.tp, dp=c.dp, pp=chain_neighbour(self.kind, self.p, stage, x.chunk, -1),
                                   cp=c.cp)
                    deps.append(self._gathered(rank, g.recv(
                        rank, src, self.p2p_bytes, name=f"recv_act.{name}", stream=self._p2p_stream("recv_act", x),
                        traffic_class="pp", micro_batch=x.micro_batch, stage=stage, tag=0, deps=posted),
                        name, x.micro_batch, stage))
                if x.phase == "B" and j < nvs - 1 and not batched:
                    src = lay.rank(tp=c.tp, dp=c.dp, pp=chain_neighbour(self.kind, self.p, stage, x.chunk, 1),
                                   cp=c.cp)
                    deps.append(self._gathered(rank, g.recv(
                        rank, src, self.p2p_bytes, name=f"recv_grad.{name}", stream=self._p2p_stream("recv_grad", x),
                        traffic_class="pp", micro_batch=x.micro_batch, stage=stage, tag=1, deps=posted),
                        name, x.micro_batch, stage))
                if x.phase == "F" and x.chunk not in started:
                    started.add(x.chunk)
                    if self.fp8 and not param_gather:
                        deps = [self._fp8_weight_cast(rank, x, stage, deps)]
                    first_forward = True
                else:
                    first_forward = False
                waits.append(deps)
            sent = []
            if len(group) == 2:
                last_op = self._emit_pair(rank, stage, group, waits, pending, overlap, last_b, idx, every_mb)
            else:
                deps = waits[0]
                phase = self.pass_of(stage, a)
                name = f"{a.phase}{a.micro_batch}.c{a.chunk}"
                reduce_now = self.makes_grads(stage, a) and (every_mb or idx == last_b[a.chunk])
                if reduce_now:  # (reduced every micro-batch: the optimizer gathers back the last round only)
                    pending.recording = idx == last_b[a.chunk]
                if param_gather and first_forward:
                    last_op = self._forward_after_gathers(rank, a, stage, deps, gathers, aligned)
                    deps = []
                if gathered:
                    per_action, uses, sched = trace
                    segs = self.unit_segments(stage, a.chunk, a.phase)
                    for (seg, _unit, _use), u in zip(segs, per_action[idx]):
                        grp = sched.group_of[u]
                        if grp is not None:
                            if grp not in gather_of:
                                gather_of[grp] = self._emit_gather(rank, sched.groups[grp], uses, use_end,
                                                                   sched.groups, grp, a.micro_batch, stage)
                            if gather_of[grp] is not None:
                                deps.append(gather_of[grp])
                        last_op = self.emit_segment(rank, seg, deps, f"{name}.L{seg.layer}", a.micro_batch, stage)
                        use_end[u] = last_op
                        deps = []
                        if reduce_now:
                            pending.add(seg, last_op if overlap else None)
                elif not (param_gather and first_forward):
                    # Megatron-Core reduces a chunk that it does not bucket as one collective once the chunk's
                    # last backward is done (without aligned launches; with them, launch_at and defer decide)
                    single = overlap and reduce_now and not (defer or hold) and self.unbucketed(stage, a.chunk)
                    per_layer = self.opt.granularity == "layer" or (overlap and reduce_now
                                                                    and not (defer or hold or single))
                    for seg in self.segments(stage, a.chunk, phase, per_layer):
                        last_op = self.emit_segment(rank, seg, deps, f"{name}.L{seg.layer}", a.micro_batch, stage)
                        deps = []
                        if reduce_now:
                            if hold or single:
                                pending.hold(seg, a.chunk)
                            else:
                                pending.add(seg, last_op if overlap and not defer else None)
                    if single:
                        pending.launch(a.chunk, last_op)
                if self.fp8_amax and a.phase != "W":
                    last_op = self._fp8_amax(rank, a, stage, last_op)
                if reduce_now and every_mb:
                    pending.flush(last_op)  # the end of every backward (DeepSpeed's epilogue, FSDP's last unit)
                if a.phase == "B":
                    if backwards in launch_at:
                        pending.launch(launch_at[backwards], last_op)
                    backwards += 1
            if batched:
                barrier = self._exchanges(rank, posts[idx + 1], actions, last_op, queues) or barrier
                idx += 1
                continue
            for k, x in enumerate(group):  # an activation to the next position, a gradient to the previous
                j = self.position(stage, x.chunk)
                if (x.phase == "F" and j < nvs - 1) or (x.phase == "B" and j > 0):
                    outbox.append((idx + k + x.send_after, x))
            idx += len(group)
            for item in [o for o in outbox if o[0] < idx]:
                outbox.remove(item)
                sent.append(self._send(rank, item[1], last_op))
        # Gradient synchronisation that is not overlapped, then the optimizer.
        if hold:  # the chunks not launched yet, in chunk order
            for chunk in range(self.v):
                pending.launch(chunk, last_op)
        pending.flush(last_op, whole=defer)
        # the last reduction of each stream (the dense buffer's and the experts'), which end after the others
        dp_ops = list(pending.last_by_stream.values())
        # (the gradient syncs the step's norm waits for besides the DP reductions)
        syncs = self._tied_embedding_sync(rank, stage, last_op) + self._sequence_parallel_grad_sync(
            rank, stage, [last_op] + dp_ops)
        dense, experts = self.stage_params(stage)
        holders, expert_holders = len(dp_group), len(pending.expert_group)  # the distributed optimizer's shards
        shard = (dense / holders + experts / expert_holders) if par.zero >= 1 else dense + experts
        fp8_shard = 0.0
        if self.train.fp8_param_gather:
            fp8_dense, fp8_routed = self.stage_fp8_weights(stage)
            fp8_shard = fp8_dense / holders + fp8_routed / expert_holders
        before, after = optimizer_step_ops(shard, dense + experts, self.grad_bytes, self.dtype, fp8_shard,
                                           plan.fp32_main_grads)
        step_deps = [last_op] + dp_ops + syncs
        norm = g.compute(rank, parts=_kernels(before), name="grad_norm", deps=step_deps, stream=COMPUTE_STREAM,
                         category="optimizer", stage=stage)
        norm = self._norm_all_reduce(rank, norm, stage)
        opt_id = g.compute(rank, parts=_kernels(after), name="optimizer", deps=[norm], stream=COMPUTE_STREAM,
                           category="optimizer", stage=stage)
        if plan.step_gather and not param_gather:  # (with overlap_param_gather: in the next forward)
            pending.gather_params(opt_id)  # (what was reduced over a group of one is neither reduced nor gathered)

    @property
    def megatron_overlap(self) -> bool:
        """Whether the gradients are reduced by Megatron-Core's distributed data parallelism with overlap
        (``zero_impl`` megatron, reduced once per step over more than one rank) under Megatron's pipeline
        schedules (``1f1b``, ``interleaved``): where its bucketing rule (:meth:`unbucketed`) and its aligned
        launch (:attr:`aligned_grad_reduce`) apply."""
        return megatron_grad_overlap(self.par, self.plan)

    def unbucketed(self, stage: int, chunk: int) -> bool:
        """Whether Megatron-Core reduces (and, with ``overlap_param_gather``, gathers) virtual stage ``(stage,
        chunk)``'s gradients as one bucket: its DistributedDataParallel turns bucketing off on every pipeline
        rank but the first (``bucket_size = None`` for ``pp_rank > 0``: "data-parallel communication on these
        stages is not on the critical path") and megatron/training/training.py on every model chunk but the
        first (``per_chunk_bucket_sizes``). Such a chunk's reduction starts once all its gradients are ready,
        after its last backward; only stage 0's chunk 0 is reduced bucket by bucket during the backward."""
        return (stage > 0 or chunk > 0) and self.megatron_overlap

    @property
    def aligned_grad_reduce(self) -> bool:
        """Whether the gradient reductions follow Megatron's aligned launch (``parallel.align_grad_reduce``):
        :attr:`megatron_overlap` with ``pp > 1``. Each chunk Megatron does not bucket (:meth:`unbucketed`) is
        then reduced as one collective."""
        return self.par.align_grad_reduce and self.p > 1 and self.megatron_overlap

    def stage_params(self, stage: int) -> tuple[float, float]:
        """:func:`~workloads.memory.stage_params` of ``stage``, made once per stage (every rank asks)."""
        out = self._stage_params.get(stage)
        if out is None:
            out = self._stage_params[stage] = stage_params(self.model, self.par, stage)
        return out

    def grad_group(self, rank: int) -> tuple[int, ...]:
        """The ranks that hold ``rank``'s weights and reduce their gradients together: its DP x CP ranks and,
        under DualPipe, those of the mirror stage ``p - 1 - stage`` (which holds the same two model stages; the
        reference sums the two copies' gradients), lower stage first so that both stages name one group."""
        return self._with_mirror(rank, self.layout.grad_group)

    def expert_grad_group(self, rank: int) -> tuple[int, ...]:
        """The ranks holding ``rank``'s routed experts: its expert-DP group (and the mirror stage's, under
        DualPipe)."""
        return self._with_mirror(rank, self.layout.expert_dp_group)

    def _with_mirror(self, rank: int, group_of: Callable[[int], tuple[int, ...]]) -> tuple[int, ...]:
        """``group_of(rank)``, and under DualPipe that group joined with the mirror stage's (lower stage first)."""
        lay = self.layout
        if not self.dual:
            return group_of(rank)
        c = lay.coords(rank)
        pair = sorted((c.pp, self.p - 1 - c.pp))
        return tuple(x for s in pair for x in group_of(lay.rank(tp=c.tp, dp=c.dp, pp=s, cp=c.cp)))

    def _exchanges(self, rank: int, post: tuple[Exchange, ...], actions: Sequence[PipeAction], after: int | None,
                   queues: dict[str, list[int]]) -> list[int]:
        """Megatron's batched blocking transfers at one point of the interleaved schedule, one batch after the
        other: the sends and receives of a batch are posted once ``after`` (and the previous batch) is done;
        returns the ops the next computation waits for (all of the last batch). Receives are queued in
        ``queues`` for the actions that need them."""
        lay, c = self.layout, self.layout.coords(rank)
        stage = c.pp
        wait: list[int] = [after] if after is not None else []
        for ex in post:
            ops = [self._send(rank, actions[i], after, wait) for i in ex.sends]
            for kind, want, step in (("act", ex.recv_act, -1), ("grad", ex.recv_grad, 1)):
                if not want:
                    continue
                # the previous (next) rank of the pipeline; which chunk it sends from does not matter here
                src = lay.rank(tp=c.tp, dp=c.dp, pp=(stage + step) % self.p, cp=c.cp)
                op = self.graph.recv(rank, src, self.p2p_bytes, name=f"recv_{kind}", stream=f"pp_recv_{kind}",
                                     traffic_class="pp", stage=stage, tag=0 if kind == "act" else 1, deps=wait)
                queues[kind].append(op)
                ops.append(op)
            wait = ops
        return wait if post else []

    def _p2p_stream(self, what: str, a: PipeAction) -> str:
        """The stream of a pipeline transfer ``what`` (``send_act``, ``recv_grad``, ...) of action ``a``:
        ``pp_<what>``, and under DualPipe one per chunk (``pp_<what>_c<chunk>``). A DualPipe middle rank sends
        (receives) chunk 0's tensors to (from) one neighbour and chunk 1's to (from) the other; on one stream
        a transfer waiting for its peer would hold up the other direction's, which the reference's batched
        ``isend``/``irecv`` do not (with pp >= 12 that closes a cycle)."""
        return f"pp_{what}_c{a.chunk}" if self.dual else f"pp_{what}"

    def _send(self, rank: int, a: PipeAction, after: int, deps: list[int] | None = None) -> int:
        """The send of action ``a``'s output (activation forward, input gradient backward) to the next rank of
        its chain, once ``after`` has run."""
        lay, c = self.layout, self.layout.coords(rank)
        stage = c.pp
        step = 1 if a.phase == "F" else -1
        dst = lay.rank(tp=c.tp, dp=c.dp, pp=chain_neighbour(self.kind, self.p, stage, a.chunk, step), cp=c.cp)
        what, tag = ("act", 0) if a.phase == "F" else ("grad", 1)
        return self.graph.send(rank, dst, self.p2p_bytes, name=f"send_{what}.{a.phase}{a.micro_batch}.c{a.chunk}",
                               stream=self._p2p_stream(f"send_{what}", a), deps=[after] if deps is None else deps,
                               traffic_class="pp", micro_batch=a.micro_batch, stage=stage, tag=tag)

    # ------------------------------------------------------- DualPipe pairs
    def _emit_pair(self, rank: int, stage: int, pair: Sequence[PipeAction], waits: list[list[int]],
                   pending: _Buckets, overlap: bool, last_b: dict[int, int], idx: int, every_mb: bool) -> int:
        """A DualPipe forward-backward pair (``pair`` = the forward and the backward, ``waits`` their inputs).

        Both run on the compute stream, interleaved piece by piece (a MoE layer is :meth:`moe_pieces`' pieces:
        before the dispatch, the experts, after the combine, and with ``moe.shared_expert_overlap`` the two
        shared-expert halves after the dispatch and after the combine; any other segment one piece): forward
        piece, backward piece, forward piece, ... Each chunk's exchanges (all-to-alls or DeepEP's two hops,
        expert-TP all-gather / reduce-scatter) run on streams of their own (``ep_f``, ``ep_b``; DeepEP's
        NVLink forwarding on ``ep_f_forward``, ``ep_b_forward``) as soon as the piece before them ends, and
        the chunk's next piece that needs them waits for them, so one chunk's communication runs under the
        other's computation and its own shared expert (DeepSeek-V3 section 3.2.1, Figure 4). The pieces
        run one at a time; in a pair with a MoE layer their GEMMs run on the SMs the exchanges leave
        (``options.dualpipe_comm_sms``, :meth:`_leave_sms`). Returns the last op of the pair.
        """
        per_layer = self.opt.granularity == "layer"
        first_op = len(self.graph.ops)
        moe = False
        runs = []
        # DualPipe receives both inputs of a pair before it computes either pass (``_forward_backward_chunk``:
        # recv_forward, recv_backward, then one commit-and-wait): each pass's first piece waits for both
        both = list(dict.fromkeys(d for deps in waits for d in deps))
        for k, a in enumerate(pair):
            phase = self.pass_of(stage, a)
            reduce_now = self.makes_grads(stage, a) and (every_mb or idx + k == last_b[a.chunk])
            if reduce_now:  # (as in build_rank; a pair holds one gradient pass, DualPipe's B or W)
                pending.recording = idx + k == last_b[a.chunk]
            segs = self.segments(stage, a.chunk, phase, per_layer or (overlap and reduce_now))
            moe = moe or any(seg.moe is not None for seg in segs)
            runs.append(self._pieces(rank, stage, a, segs, both, "ep_f" if a.phase == "F" else "ep_b",
                                     pending if reduce_now else None, overlap))
        last = None  # the last compute op emitted: the compute stream runs in program order, so it ends last
        live = [0, 1]
        self._split_pieces = []
        while live:
            for k in list(live):
                try:
                    last = next(runs[k])
                except StopIteration:
                    live.remove(k)
        split, self._split_pieces = self._split_pieces, None
        if moe and self.opt.dualpipe_comm_sms:
            self._leave_sms(first_op, self.opt.dualpipe_comm_sms, split)
        for a in pair:
            if self.fp8_amax and a.phase != "W":
                last = self._fp8_amax(rank, a, stage, last)
        if every_mb and any(self.makes_grads(stage, a) for a in pair):
            pending.flush(last)
        return last

    def _leave_sms(self, first_op: int, sms: int, split: Sequence[tuple[int, int]] = ()) -> None:
        """Run the GEMMs of the compute ops from op ``first_op`` on (the GPU's SMs - ``sms``): each GEMM kernel
        holds ``sms`` SMs for communication (:attr:`~workloads.ops.Kernel.sm_reserved`, the most of its own
        and ``sms``); a GEMM op without kernels becomes one such kernel. Other kernels are left alone: the
        compute model shares SMs out for GEMMs only (attention and memory-bound kernels keep their rate).

        ``split``: ``(recompute op, rest op)`` of each MoE piece whose recomputed kernels were cut out as an op of
        their own for the breakdown (:meth:`_piece`). The engine leaves an op with a kernel on fewer SMs at its
        own time, beside communication, and slows any other (:mod:`simulator.engine`): a recompute op without a
        GEMM whose piece holds one runs as it did inside that piece, its kernels marked as holding ``sms`` SMs
        back too (which their time, not a GEMM's, does not read)."""
        gemms = GEMM_CATEGORIES
        reserved = self._reserved  # (id of a kernel tuple, sms) -> (that tuple, its reserved copy): ops that
        for op in self.graph.ops[first_op:]:  # shared kernels keep sharing them (the engine caches by identity)
            if op.kind != "compute" or op.duration_s is not None:
                continue
            if op.parts:
                hit = reserved.get((id(op.parts), sms))
                if hit is None or hit[0] is not op.parts:
                    hit = reserved[(id(op.parts), sms)] = (op.parts, tuple(
                        replace(k, sm_reserved=max(k.sm_reserved, sms)) if k.category in gemms else k
                        for k in op.parts))
                op.parts = hit[1]
            elif op.category in gemms:
                op.parts = (Kernel(op.category, op.flops, op.nbytes, op.shape, 1, sms),)
        ops = self.graph.ops
        for again, rest in split:  # (a pair keeps a representative per EP index: no op has members)
            op = ops[again]
            if any(k.sm_reserved for k in ops[rest].parts) and not any(k.sm_reserved for k in op.parts):
                hit = reserved.get((id(op.parts), sms, "all"))
                if hit is None or hit[0] is not op.parts:
                    hit = reserved[(id(op.parts), sms, "all")] = (op.parts, tuple(
                        replace(k, sm_reserved=sms) for k in op.parts))
                op.parts = hit[1]

    def _pieces(self, rank: int, stage: int, a: PipeAction, segs: list[_Segment], deps: list[int], stream: str,
                pending: _Buckets | None, overlap: bool) -> Iterator[int]:
        """Emit one pass of a pair piece by piece, yielding the last compute op after each piece (see
        :meth:`_emit_pair`); a MoE layer's pieces are :meth:`moe_pieces`' with its exchanges on ``stream``."""
        name = f"{a.phase}{a.micro_batch}.c{a.chunk}"
        mb = a.micro_batch
        for seg in segs:
            op_name = f"{name}.L{seg.layer}"
            if seg.moe is None:
                last = self.emit_segment(rank, seg, deps, op_name, mb, stage)
            else:
                last = yield from self.moe_pieces(rank, seg, deps, op_name, mb, stage, stream)
            deps = []
            if pending is not None:
                pending.add(seg, last if overlap else None)
            yield last

    # ------------------------------------------------- overlapped param gather
    def param_buckets(self, stage: int, chunk: int, experts: bool = False) -> tuple[list[float], list[int], list[int]]:
        """The distributed optimizer's parameter buckets of virtual stage ``(stage, chunk)`` in the order the
        forward gathers them, against the pieces of its per-layer forward (:meth:`segments`); ``experts``:
        those of the routed experts' buffer (Megatron-Core keeps them in buffers of their own, with buckets
        and a gather chain of their own: ``expert_parallel_bucket_groups``).

        Megatron-Core fills a model chunk's buckets of ``bucket`` parameters in backward order, so the first
        bucket the forward needs (the first layers, the embedding) is the partial one. Returns ``(sizes,
        first, need)``: each bucket's parameter count (of one TP rank; dense, or the routed experts of one
        EP × expert-TP rank), the first piece that touches each bucket (whose forward pre-hook dispatches the
        next bucket of its chain), and for each piece the last bucket it needs (-1: none).
        """
        key = (stage, chunk, experts)
        cached = self._param_buckets.get(key)
        if cached is not None:
            return cached
        segs = self.segments(stage, chunk, "F", True)
        if experts:
            pieces = [seg.expert_grad_bytes / self.grad_bytes for seg in segs]
        else:
            pieces = [seg.grad_bytes / self.grad_bytes for seg in segs]
            ends = self.end_params(stage, chunk)
            if ends:  # segments() puts them on the last piece; the forward uses the embedding first
                pieces[-1] -= ends
                pieces[0 if chunk * self.p + stage == 0 else -1] += ends
        edges = [0]
        for x in pieces:
            edges.append(edges[-1] + max(0, round(x)))
        total, size = edges[-1], self.plan.bucket_bytes / self.grad_bytes
        if not size < float("inf") or self.unbucketed(stage, chunk):  # one bucket (Megatron: stage > 0, chunk > 0)
            size = max(total, 1)
        n = math.ceil(total / size)
        starts = [max(0, total - (n - g) * size) for g in range(n)]
        sizes = [min(total, total - (n - 1 - g) * size) - starts[g] for g in range(n)]
        first = [next(i for i in range(len(pieces)) if edges[i] <= st < edges[i + 1]) for st in starts]
        need = [n - 1 - int((total - edges[i + 1]) // size) if edges[i + 1] > edges[i] else -1
                for i in range(len(pieces))]
        out = self._param_buckets[key] = (sizes, first, need)
        return out

    def _param_gathers(self, rank: int, stage: int, chunk: int, buckets: list[int], deps: list[int],
                       experts: bool = False) -> list[int]:
        """The all-gathers of the updated parameters of ``buckets`` (gather indices) of a chunk, dispatched
        together after ``deps`` on the DP stream (class ``zero``), one collective per bucket, tagged with the
        chunk's first layer and first micro-batch; ``experts``: buckets of the routed experts' buffer, over
        the expert-DP group that reduced them."""
        sizes = self.param_buckets(stage, chunk, experts)[0]
        nbytes = self.param_gather_bytes(stage, experts)
        mb = next(a.micro_batch for a in self.schedules[stage] if a.phase == "F" and a.chunk == chunk)
        group = self.expert_grad_group(rank) if experts else self.grad_group(rank)  # (the groups _Buckets reduced)
        layer = (self.chunk_layers(stage, chunk) or [self._end_layer(stage, chunk)])[0]
        stream = DP_STREAMS[experts]
        return [self.graph.collective_op(rank, "all_gather", group, sizes[b] * nbytes, name="param_all_gather",
                                         stream=stream, deps=deps, traffic_class="zero", micro_batch=mb,
                                         stage=stage, layer=layer)
                for b in buckets]

    def _gather_chains(self, rank: int) -> tuple[bool, ...]:
        """The buffers whose parameters ``overlap_param_gather`` gathers in the forward, as ``experts`` flags,
        each on a bucket chain of its own: the dense one where its DP group has more than one rank and, for a
        MoE model whose expert-DP group has more than one rank, the routed experts' (a buffer sharded over one
        rank is neither reduced nor gathered)."""
        dense = (False,) if self.par.grad_dp > 1 else ()
        return dense + ((True,) if self.model.is_moe and len(self.expert_grad_group(rank)) > 1 else ())

    def _dispatch_param_gathers(self, rank: int, stage: int, chunk: int, deps: list[int],
                                gathers: dict[tuple[int, bool], list[int]]) -> None:
        """Megatron's aligned dispatch of a chunk's parameter all-gathers (``model_chunk.start_param_sync``):
        every bucket of each of its buffers, after ``deps``."""
        for experts in self._gather_chains(rank):
            buckets = list(range(len(self.param_buckets(stage, chunk, experts)[0])))
            gathers[chunk, experts] = self._param_gathers(rank, stage, chunk, buckets, deps, experts)

    def _forward_after_gathers(self, rank: int, a: PipeAction, stage: int, deps: list[int],
                               gathers: dict[tuple[int, bool], list[int]], aligned: bool) -> int:
        """The first forward of a chunk in the step under ``overlap_param_gather``: layer by layer, each
        waiting for its parameter buckets. Unaligned, the pre-hook of the first piece of bucket ``g`` (having
        waited for it) dispatches bucket ``g + 1`` of the same buffer; each buffer's bucket 0 is dispatched
        by the first piece that needs it (Megatron-Core's ``finish_param_sync`` dispatches a bucket group it
        finds undispatched, then waits: the dense one at the forward's first piece, the routed experts' at
        the first MoE layer). Under FP8 each layer casts its weights once gathered."""
        chains = [(experts, self.param_buckets(stage, a.chunk, experts), gathers.setdefault((a.chunk, experts), []))
                  for experts in self._gather_chains(rank)]
        name = f"F{a.micro_batch}.c{a.chunk}"
        last = None
        for i, seg in enumerate(self.segments(stage, a.chunk, "F", True)):
            wait = []
            for experts, (sizes, first, need), ops in chains:
                if not aligned:
                    before = list(deps) if last is None else [last]
                    start = bool(sizes) and first[0] == i
                    todo = ([0] if start else []) + [b + 1 for b, f in enumerate(first)
                                                      if f == i and b + 1 < len(sizes)]
                    ops += self._param_gathers(rank, stage, a.chunk, todo, before, experts)
                if need[i] >= 0:
                    wait.append(ops[need[i]])
            if self.fp8 and seg.kernels and any(k.category in FP8_GEMM_CATEGORIES for k in seg.kernels):
                dense, routed = fp8_weight_params(self.model, seg.layer, self.t, self.par.ep, self.etp)
                per_weight = 2 if self.train.fp8_param_gather else FP8_CAST_BYTES
                wait = [self.graph.compute(rank, parts=(Kernel("fp8_cast", 0.0, per_weight * (dense + routed)),),
                                           name=f"{name}.L{seg.layer}.fp8_weight_cast", deps=deps + wait,
                                           stream=COMPUTE_STREAM, category="elementwise",
                                           micro_batch=a.micro_batch, stage=stage)]
                deps = []
            last = self.emit_segment(rank, seg, deps + wait, f"{name}.L{seg.layer}", a.micro_batch, stage)
            deps = []
        return last

    # ----------------------------------------------------------------- FP8
    def stage_fp8_weights(self, stage: int) -> tuple[float, float]:
        """FP8 GEMM weights (one TP/EP rank) of every chunk of ``stage``: ``(dense, routed experts)``."""
        pairs = [self.fp8_weights(stage, c) for c in range(self.v)]
        return sum(p[0] for p in pairs), sum(p[1] for p in pairs)

    def param_gather_bytes(self, stage: int, experts: bool = False) -> float:
        """Bytes per dense (``experts``: routed-expert) parameter of the ZeRO-1 all-gather of updated
        parameters: the model dtype, or with ``fp8_param_gather`` 1 for the FP8 weights and the dtype for the
        rest (their average on this stage)."""
        if not self.train.fp8_param_gather:
            return float(self.dtype)
        params = stage_params(self.model, self.par, stage)[1 if experts else 0]
        fp8 = self.stage_fp8_weights(stage)[1 if experts else 0]
        return (self.dtype * (params - fp8) + fp8) / params if params else float(self.dtype)

    def fp8_weights(self, stage: int, chunk: int) -> tuple[float, float]:
        """FP8 GEMM weights (one TP/EP rank) of virtual stage ``(stage, chunk)``: ``(dense, routed experts)``."""
        key = (stage, chunk)
        if key not in self._fp8_weights:
            pairs = [fp8_weight_params(self.model, i, self.t, self.par.ep, self.etp)
                     for i in self.chunk_layers(stage, chunk)]
            self._fp8_weights[key] = (float(sum(p[0] for p in pairs)), float(sum(p[1] for p in pairs)))
        return self._fp8_weights[key]

    def _stage_group(self, rank: int) -> tuple[int, ...]:
        """Every rank of ``rank``'s pipeline stage (TP x CP x DP), DP-major: Megatron's FP8 amax-reduction
        group."""
        stage = self.layout.coords(rank).pp
        group = self._stage_groups.get(stage)
        if group is None:
            lay = self.layout
            group = self._stage_groups[stage] = tuple(lay.rank(tp=t, dp=d, pp=stage, cp=c)
                                                      for d in range(self.par.dp) for c in range(self.cp)
                                                      for t in range(self.t))
        return group

    def _fp8_weight_cast(self, rank: int, a: PipeAction, stage: int, deps: list[int]) -> int:
        """The once-per-step cast of a chunk's FP8 weights (and transposes), before its first forward."""
        dense, routed = self.fp8_weights(stage, a.chunk)
        per_weight = 2 if self.train.fp8_param_gather else FP8_CAST_BYTES
        return self.graph.compute(rank, parts=(Kernel("fp8_cast", 0.0, per_weight * (dense + routed)),),
                                  name=f"F{a.micro_batch}.c{a.chunk}.fp8_weight_cast", deps=deps,
                                  stream=COMPUTE_STREAM, category="elementwise", micro_batch=a.micro_batch,
                                  stage=stage)

    def _fp8_amax(self, rank: int, a: PipeAction, stage: int, after: int) -> int:
        """The amax all-reduce of one chunk's forward or backward and the scale update after it."""
        gemms = self._fp8_gemms.get((stage, a.chunk))
        if gemms is None:  # the same for every rank and action of the chunk
            gemms = self._fp8_gemms[(stage, a.chunk)] = sum(fp8_gemm_modules(self.model, i, self.par.ep)
                                                            for i in self.chunk_layers(stage, a.chunk))
        entries = gemms * FP8_AMAX_ENTRIES[0 if a.phase == "F" else 1]
        name = f"{a.phase}{a.micro_batch}.c{a.chunk}"
        last = after
        group = self._stage_group(rank)
        if len(group) > 1:
            last = self.graph.collective_op(rank, "all_reduce", group, 4.0 * entries, name=f"{name}.fp8_amax",
                                            stream=COMPUTE_STREAM, deps=[last], traffic_class="sync",
                                            micro_batch=a.micro_batch, stage=stage)
        return self.graph.compute(rank, parts=(Kernel("fp8_cast", 0.0, FP8_SCALE_UPDATE_BYTES * entries),),
                                  name=f"{name}.fp8_scale_update", deps=[last], stream=COMPUTE_STREAM,
                                  category="elementwise", micro_batch=a.micro_batch, stage=stage)

    def _norm_all_reduce(self, rank: int, after: int, stage: int) -> int:
        """The global gradient norm: an fp32 scalar all-reduced over the model-parallel group (TP x PP) and,
        when the optimizer state is sharded (ZeRO >= 1), over the data-parallel group too (Megatron's
        ``get_grad_norm_fp32``); latency-bound collectives that every pipeline stage must join before its
        optimizer step. Traffic class ``sync``."""
        par, lay, last = self.par, self.layout, after
        c = lay.coords(rank)
        mp = tuple(lay.rank(tp=t, dp=c.dp, pp=p, cp=c.cp) for p in range(self.p) for t in range(self.t))
        groups = [mp] + ([lay.grad_group(rank)] if par.zero >= 1 and par.grad_dp > 1 else [])
        for group in groups:
            if len(group) > 1:
                last = self.graph.collective_op(rank, "all_reduce", group, 4.0, name="grad_norm_all_reduce",
                                                stream=COMPUTE_STREAM, deps=[last], traffic_class="sync",
                                                stage=stage)
        return last

    def _gathered(self, rank: int, recv: int, name: str, mb: int, stage: int) -> int:
        """The received 1/t of an activation (gradient) all-gathered over TP, or the recv itself.

        Megatron's ``gather_split_1d_tensor`` runs on the compute stream right after the receive.
        """
        if not self.pp_gather:
            return recv
        group = self._tp_groups.get(rank)
        if group is None:
            group = self._tp_groups[rank] = self.layout.tp_group(rank)
        return self.graph.collective_op(rank, "all_gather", group, self.tp_bytes, name=f"pp_gather.{name}",
                                        stream=COMPUTE_STREAM, deps=[recv], traffic_class="pp", micro_batch=mb,
                                        stage=stage)

    def sequence_parallel_grad_bytes(self, stage: int) -> float:
        """Bytes of the step's all-reduce over TP, with sequence parallelism, of the gradients of the parameters
        that TP replicates but each rank trains on its own sequence share, the ones Megatron-Core tags
        ``sequence_parallel``: the norms and the row-parallel linears' biases of the stage's layers, a MoE layer's
        router (``TopKRouter``), MLA's replicated down-projections and latent norms (``parallel_mode:
        duplicated``), and the final norm (``finalize_model_grads`` → ``_allreduce_layernorm_grads``: one coalesced
        all-reduce of their ``main_grad`` after the data-parallel reductions and before the gradient norm). 0
        without TP or sequence parallelism."""
        if self.t == 1 or not self.sp:
            return 0.0
        found = self._sp_grad_bytes.get(stage)  # (every rank of the stage asks)
        if found is not None:
            return found
        model = self.model
        per_layer = model.norm_params() + (2 * model.hidden if model.bias else 0) + model.mla_norm_params() + sum(
            k * n for k, n, split in model.mla_projections().values() if not split)
        layers = stage_layers(model.layers, self.par, stage)
        params = per_layer * len(layers) + model.hidden * model.experts * sum(map(model.is_moe_layer, layers))
        if self.opt.embedding_and_loss and any(self.position(stage, c) == self.nvs - 1 for c in range(self.v)):
            params += model.final_norm_params()
        found = self._sp_grad_bytes[stage] = float(params * self.grad_bytes)
        return found

    def _sequence_parallel_grad_sync(self, rank: int, stage: int, deps: list[int]) -> list[int]:
        """:meth:`sequence_parallel_grad_bytes` all-reduced over ``rank``'s TP group on the compute stream."""
        nbytes = self.sequence_parallel_grad_bytes(stage)
        if not nbytes:
            return []
        return [self.graph.collective_op(rank, "all_reduce", self._tp_group(rank), nbytes,
                                         name="sequence_parallel_grad_sync", stream=COMPUTE_STREAM, deps=deps,
                                         traffic_class="tp", stage=stage)]

    @cached_property
    def loss_all_reduce_bytes(self) -> tuple[float, ...]:
        """Bytes of each of one micro-batch's cross-entropy all-reduces over TP (:data:`LOSS_ALL_REDUCES`)."""
        tokens = self.par.micro_batch * self.local_seq
        return tuple(float(per_token * tokens) for per_token in LOSS_ALL_REDUCES)

    def _tied_embedding_sync(self, rank: int, stage: int, after: int) -> list[int]:
        """All-reduce of the tied word-embedding gradient between the first and last pipeline stage.

        None under DualPipe: rank ``r`` holds stages ``r`` and ``p-1-r``, so the first and last ranks each hold
        the embedding and the output layer, whose gradients the mirrored stages already reduce together; the
        tied weight's gradient is their local sum (Megatron's embedding group exists because under 1F1B the two
        halves live on different ranks)."""
        if (not self.model.tied_embeddings or self.p == 1 or stage not in (0, self.p - 1)
                or self.dual):
            return []
        c = self.layout.coords(rank)
        group = (self.layout.rank(tp=c.tp, dp=c.dp, pp=0, cp=c.cp),
                 self.layout.rank(tp=c.tp, dp=c.dp, pp=self.p - 1, cp=c.cp))
        vocab = padded_vocab(self.model.vocab, self.t)  # the shard Megatron holds is of the padded vocabulary
        nbytes = self.model.word_embedding_params(self.t, vocab) * self.grad_bytes
        return [self.graph.collective_op(rank, "all_reduce", group, nbytes, name="embedding_grad_sync",
                                         stream="dp", deps=[after], traffic_class="dp", stage=stage)]

    def build(self, representatives: str | None = None, max_ops: int | None = MAX_OPS) -> OpGraph:
        ranks: Sequence[int] = range(self.par.world_size)
        lay = self.layout
        ep = self.par.ep
        per_ep_index = representatives == "stage_ep"  # (stragglers: members of an EP group differ in speed too)
        # The refusal of a step too large suggests fidelity lockstep only where it would simulate fewer ranks:
        # not when this is lockstep already, nor on an expert grid whose EP groups lockstep cannot stand for.
        lockstep_helps = (representatives not in ("stage", "stage_ep")
                          and (not self.expert_grid or self._whole_groups_possible(False)))
        # "ep" (fast): one representative per EP group, where it can issue for the whole group (_ep_blocks_possible)
        ep_blocks = representatives == "ep" and self._ep_blocks_possible()
        if representatives == "ep":
            representatives = "stage" if ep_blocks else "tp"
        if per_ep_index:
            representatives = "stage"
        if representatives == "stage" and not ep_blocks and self.expert_parallel and not self._ep_layouts_agree():
            representatives = "tp"  # one stage's EP groups need different DeepEP matrices: no lockstep
        # Balanced routing gives every EP rank the same expert load and rows that are one another's relabelling:
        # then every EP index runs one program, and one rank can stand for its whole EP group too. Under skewed
        # routing the members' programs differ only in their experts' loads, between the two exchanges that
        # synchronise them: one rank stands for the group there too, at its slowest member's load, unless work
        # runs beside the experts that a faster member would start early (:meth:`_whole_groups_possible`).
        self._whole_ep_groups = ep_blocks or (representatives == "stage" and self.expert_parallel
                                              and self._whole_groups_possible(per_ep_index))
        if self.expert_grid and not self._whole_ep_groups:
            # EP groups cross TP and CP groups: TP peers run different programs, and a representative per EP
            # index cannot stand for an expert-DP column whose TP peers are other EP indices: emit every rank
            representatives = None
        span = 1 if self._whole_ep_groups else ep  # EP indices with a representative of their own
        if representatives == "stage" and (self.t * self.cp * self.par.dp // span > 1 or ep_blocks):
            # Every rank of a pipeline stage runs the same program as the ranks with its EP index in the
            # other EP groups and their TP peers: same kernels, same TP collectives, the same all-to-all
            # rows (each draw, per layer and micro-batch, is the same in every EP group); its DP, EP, PP peers are the
            # same coordinates with their own indices. So emit the tp = 0 ranks of the first EP group (for
            # dense models, and MoE models under balanced routing: the tp = 0, dp = 0 rank) of each stage; each
            # stands for its expert-DP (DP) x TP block, listed DP-major (TP, DP and EP groups are rows, columns
            # and column segments: see engine.lanes); under balanced routing its exchanges carry every EP
            # member's rows (:meth:`_group_matrices`).
            ranks = [r for r in ranks if lay.coords(r).tp == 0 and lay.coords(r).cp == 0
                     and (lay.coords(r).dp % ep == 0 if ep_blocks else lay.coords(r).dp < span)]
            self._whole_cp_groups = True
            # (a dense model's block is its DP group: no experts, whatever the expert grid would say under CP)
            block = lay.dp_group if self._whole_ep_groups or not self.model.is_moe else lay.expert_dp_group
            if ep_blocks:
                block = lay.ep_group  # (its first member's EP group: DP ranks dp .. dp + ep - 1)
            self.graph.replicas = {r: tuple(x for d in block(r) for c in lay.cp_group(d) for x in lay.tp_group(c))
                                   for r in ranks}
        elif representatives and self.t > 1:
            ranks = [r for r in ranks if lay.coords(r).tp == 0]
            self.graph.replicas = {r: lay.tp_group(r) for r in ranks}
        self._budget = OpBudget(max_ops, len(ranks), self.graph, lockstep_helps)
        for rank in ranks:
            self.build_rank(rank)
            self._budget.rank_done()
        return self.graph


class _Buckets:
    """DDP-style gradient buckets of one rank, filled in backward order.

    Buckets that become ready at the same moment (a layer's gradients span
    several buckets) are emitted as one coarsened collective with ``count``
    = the number of full buckets: the same bytes and per-step latency as
    back-to-back buckets, in one engine op.
    """

    def __init__(self, builder: _StepBuilder, rank: int, dp_group: tuple[int, ...]) -> None:
        self.b = builder
        self.rank = rank
        self.group = dp_group
        self.size = builder.plan.bucket_bytes  # None: every unit's gradients are their own bucket (FSDP)
        self.fill = 0.0
        self.expert_fill = 0.0
        self.last_by_stream: dict[str, int] = {}  # stream -> its last reduction (ends after the others on it)
        self.held: dict[int, tuple[float, float]] = {}  # chunk -> (dense, expert) gradient bytes held (hold)
        self.stage = builder.layout.coords(rank).pp
        # (of the experts' buffer, bucket bytes) -> how many buckets of that size were reduced (over the dense
        # gradients' DP group, or the routed experts' expert-DP group): what the distributed optimizer gathers back
        self.reduced: dict[tuple[bool, float], int] = {}
        par = builder.par
        self.kind = "all_reduce" if par.zero == 0 else "reduce_scatter"
        self.algorithm = "parameter_server" if par.dp_sync == "parameter_server" else "auto"
        self.expert_group = builder.expert_grad_group(rank) if builder.model.is_moe else dp_group
        self.expert_class = "edp" if par.ep > 1 else "dp"
        # Whether reductions now are gathered back after the optimizer step: with gradients reduced every
        # micro-batch only the last round's are (each parameter once), else all
        self.recording = True

    def add(self, seg: _Segment, ready_op: int | None) -> None:
        if len(self.group) == 1 and len(self.expert_group) == 1:
            return
        self.fill += seg.grad_bytes
        self.expert_fill += seg.expert_grad_bytes
        if self.size is None:
            if ready_op is not None:
                self.flush(ready_op)
            return
        if ready_op is not None:  # full buckets of each buffer (the experts' own: its own buckets)
            self.fill = self._emit_full(self.fill, [ready_op])
            self.expert_fill = self._emit_full(self.expert_fill, [ready_op], experts=True)

    def _emit(self, nbytes: float, deps: list[int], experts: bool = False, count: int = 1) -> None:
        """One reduction of ``count`` buckets of ``nbytes``: of the dense gradients over the DP group, or
        (``experts``) of the routed experts' buffer over the expert-DP group."""
        group, traffic_class = (self.expert_group, self.expert_class) if experts else (self.group, "dp")
        if len(group) < 2 or nbytes <= 0 or count < 1:
            return
        stream = DP_STREAMS[experts]
        self.last_by_stream[stream] = self.b.graph.collective_op(
            self.rank, self.kind, group, nbytes, name=f"grad_{self.kind}", deps=deps, count=count, stream=stream,
            algorithm=self.algorithm if self.kind == "all_reduce" else "auto", traffic_class=traffic_class)
        if self.recording:
            key = (experts, nbytes)
            self.reduced[key] = self.reduced.get(key, 0) + count

    def _emit_full(self, total: float, deps: list[int], experts: bool = False) -> float:
        """Reduce the full buckets of ``total`` gradient bytes (one coarsened collective); returns the rest."""
        if total < self.size:
            return total
        full = int(total // self.size)
        self._emit(self.size, deps, experts, count=full)
        return total - full * self.size

    def _emit_all(self, total: float, deps: list[int], experts: bool = False) -> None:
        if self.size is None or self.size == float("inf"):
            self._emit(total, deps, experts)
            return
        self._emit(self._emit_full(total, deps, experts), deps, experts)

    def hold(self, seg: _Segment, chunk: int) -> None:
        """Keep ``seg``'s gradients with model chunk ``chunk``'s, for :meth:`launch` (Megatron's aligned launch:
        each chunk is its own DDP module with its own buckets)."""
        if len(self.group) == 1 and len(self.expert_group) == 1:
            return
        dense, experts = self.held.get(chunk, (0.0, 0.0))
        self.held[chunk] = (dense + seg.grad_bytes, experts + seg.expert_grad_bytes)

    def launch(self, chunk: int, after: int) -> None:
        """Reduce all of chunk ``chunk``'s held gradients once ``after`` is done (nothing if none are held): in
        buckets on the first stage's first chunk, as one collective elsewhere (Megatron buckets only those:
        :meth:`_StepBuilder.unbucketed`)."""
        dense, experts = self.held.pop(chunk, (0.0, 0.0))
        self._reduce(dense, experts, after, whole=self.b.unbucketed(self.stage, chunk))

    def flush(self, last_op: int, whole: bool = False) -> None:
        """Reduce whatever is left after the backward (or everything, without overlap; as one collective if
        ``whole``: an unbucketed module)."""
        self._reduce(self.fill, self.expert_fill, last_op, whole)
        self.fill = self.expert_fill = 0.0

    def _reduce(self, dense: float, expert_bytes: float, after: int, whole: bool) -> None:
        emit = self._emit if whole else self._emit_all
        emit(dense, [after])
        emit(expert_bytes, [after], experts=True)

    def gather_params(self, after: int) -> None:
        """ZeRO-1/2: all-gather the updated 16-bit (FP8, with ``fp8_param_gather``) parameters of every
        reduced bucket, over the group that reduced it (the routed experts' too: the distributed optimizer
        shards them over the expert-DP group)."""
        ratios = [self.b.param_gather_bytes(self.stage, experts) / self.b.grad_bytes for experts in (False, True)]
        for (experts, nbytes), count in self.reduced.items():
            group = self.expert_group if experts else self.group
            self.b.graph.collective_op(self.rank, "all_gather", group, nbytes * ratios[experts],
                                       name="param_all_gather", stream=DP_STREAMS[experts],
                                       deps=[after], count=count, traffic_class="zero")


def training_step(model: ModelSpec, parallel: ParallelConfig, training: TrainingSpec,
                  options: StepOptions | None = None, routing: RoutingModel | None = None, *,
                  representatives: str | bool | None = None, max_ops: int | None = MAX_OPS) -> TrainingStep:
    """Generate the op graph of one training step.

    Parameters
    ----------
    model, parallel, training
        Validated with :func:`workloads.parallel.validate` first (raises
        :class:`~workloads.errors.ConfigError` naming the field).
    options : StepOptions, optional
    routing : RoutingModel, optional
        Token routing of MoE layers (default uniform, dropless); used when
        ``parallel.ep > 1``.
    representatives : {None, "tp", "ep", "stage", "stage_ep"}
        ``"tp"`` (or True): emit the program of one representative per TP
        group only (its ``tp = 0`` rank) and set ``graph.replicas`` to
        ``{representative: its TP group}``: the members of a TP group run
        identical programs, so the simulator can run one and still put every
        member's DP/PP flows and the whole group's TP collectives on the
        network. ``"ep"`` (``fidelity="fast"``): as ``"tp"``, but a MoE model's
        EP group is one representative (its first member's ``tp = 0`` rank)
        standing for the group's ranks and their TP peers, listed DP-major,
        wherever it can issue for its whole EP group as ``"stage"`` below
        does (not on the expert grid); each EP group keeps its own
        representative. ``"stage"``: one representative per
        pipeline stage and EP index (the ``tp = 0`` ranks of the first EP
        group; for dense models, and MoE models under balanced routing, the
        ``tp = 0, dp = 0`` rank, whose exchanges then carry every EP member's
        rows) standing for its expert-DP (DP) x TP block, listed DP-major
        (``fidelity="lockstep"``); ``"tp"`` instead where DeepEP dispatch
        meets EP groups of one stage spread over nodes unalike. Under skewed
        routing a stage's representative issues for its whole EP group at its
        slowest member's expert load (``Compute.members``), except where work
        runs beside the experts (the overlapped shared expert, a split
        backward) or with ``"stage_ep"`` (ranks of unequal speed: stragglers),
        which keep one per EP index. Default None: every rank's program.
    max_ops : int or None
        Raise :class:`~workloads.op_budget.StepTooLargeError` (a ``ConfigError``) as soon as the graph is
        projected to exceed this many ops, early in its building (:mod:`workloads.op_budget`; default
        :data:`~workloads.op_budget.MAX_OPS`); None: no limit.

    Examples
    --------
    >>> from workloads.models import get_preset
    >>> step = training_step(get_preset("gpt2-small"), ParallelConfig(tp=2, pp=2, dp=2, global_batch=8),
    ...                      TrainingSpec(seq_len=1024))
    >>> step.graph.world_size, step.num_micro_batches
    (8, 4)
    """
    validate(model, parallel, training)
    if representatives is True:
        representatives = "tp"
    if representatives not in (None, False, "tp", "ep", "stage", "stage_ep"):
        raise ConfigError(f"representatives: {representatives!r} unknown; valid: None, 'tp', 'ep', 'stage', "
                          f"'stage_ep'")
    options = options or StepOptions()
    builder = _StepBuilder(model, parallel, training, options, routing)
    graph = builder.build(representatives, max_ops)
    flops = model_flops_per_step(model, parallel.global_batch, training.seq_len, causal=options.causal)
    hw_flops = hardware_flops_per_step(model, parallel.global_batch, training.seq_len,
                                       recompute=parallel.recompute, causal=options.causal,
                                       recompute_modules=parallel.recompute_modules)
    if not options.embedding_and_loss:
        output_layer = 6.0 * model.hidden * model.vocab * parallel.global_batch * training.seq_len
        flops -= output_layer
        hw_flops -= output_layer
    stages = [builder.layout.coords(r).pp for r in range(parallel.world_size)]
    return TrainingStep(graph, model, parallel, training, builder.layout, builder.m, flops, stages,
                        routes=dict(sorted(builder.routes.items())), hardware_flops=hw_flops,
                        draw_imbalance=dict(sorted(builder.draw_imbalance.items(), key=lambda kv: (kv[0][0],
                                                                                               kv[0][1] or 0))))


__all__ = ["StepOptions", "TrainingStep", "training_step", "GRANULARITIES", "PipeAction"]
