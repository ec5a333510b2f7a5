"""Memory per GPU: model states by ZeRO stage, activations by schedule and recomputation.

Model states (Rajbhandari et al., *ZeRO*, SC'20, section 3.1): mixed-precision
Adam holds ``2 Psi`` bytes of 16-bit parameters, ``2 Psi`` of 16-bit gradients
and ``K Psi`` of optimizer state with ``K = 12`` (fp32 master weights,
momentum, variance); pure fp32 training holds ``4 + 4 + 8``. ``Psi`` is the
parameters this GPU holds after TP/EP/PP sharding. ZeRO-1 divides the
optimizer state by the DP degree, ZeRO-2 also the gradients, ZeRO-3 also the
parameters. Routed-expert parameters are sharded over the expert-DP group
(``dp / ep``), everything else over ``dp``. ``dp_sync: parameter_server`` is
counted like all-reduce DDP (every worker holds a full replica).

The frameworks depart from the paper where :mod:`workloads.sharding` says:
the gradient buffer is the implementation's (Megatron keeps fp32 gradients
for bf16 training: ``4 Psi``), and a ZeRO-3 (or FSDP ZeRO-2) GPU also holds
the parameters it has gathered at the peak of its step — the unit in use,
the prefetched one, and what DeepSpeed keeps for reuse
(:func:`~workloads.sharding.gather_schedule`).

FP8 training (``training.dtype: fp8``, Transformer Engine): the weights, gradients
and optimizer state are those of bf16 training; Transformer Engine also keeps,
for the whole step, the FP8 copy and FP8 transpose of every FP8 GEMM weight it
cast on the first micro-batch (:func:`~workloads.flops.fp8_weight_params`):
``+2`` bytes per such weight. With ``training.fp8_param_gather`` the weights
themselves are FP8 (1 byte) and only the transpose is added: the same 2 bytes
as a bf16 weight. Activations are counted in bf16 as below, except the inputs
of the FP8 GEMMs (QKV or MLA's projections, output projection, MLP or expert up
and down, shared experts; the output projection's only where no fused attention
core keeps that tensor in bf16): TE's ``Linear`` saves the FP8 copy of its input for
the weight gradient (``saved_inputmat = inputmat``, the quantized tensor; newer
releases keep only its column-wise FP8 data) and not the bf16 one, so those
terms are 1 byte per element. The router is a bf16 GEMM: a MoE layer's MLP input
stays in bf16 for it (plus the shared expert's FP8 copy). DeepSeek-V3 does the
same (report section 3.3.4, "cache the activations in FP8 format for the
backward pass of the Linear operator"); its further FP8 caching of the SwiGLU
inputs (custom, not TE) is not modelled.

Context parallelism (``parallel.cp``): the distributed optimizer shards over
the ``dp x cp`` ranks that hold the same weights, and a rank keeps the
activations of its ``s / cp`` tokens (ring attention keeps only its own K and
V block; Ulysses its heads over the whole sequence: the same bytes).

Activations (Korthikanti et al. 2022, *Reducing Activation Recomputation in
Large Transformer Models*, section 4 and Table 2), per layer and micro-batch,
16-bit activations and 1-byte dropout masks, ``a`` heads, TP degree ``t``:

=============================  ===================================
no SP, no recompute            ``s b h (10 + 24/t + 5 a s/(h t))``
sequence parallel              ``s b h / t (34 + 5 a s / h)``
selective recompute            ``s b h (10 + 24/t)``
selective recompute + SP       ``34 s b h / t``
full recompute                 ``2 s b h`` (layer input; ``/ t`` with SP)
=============================  ===================================

:func:`activation_bytes_per_layer` computes the same terms from their parts
(layer-norm inputs ``4sbh``, QKV and MLP inputs ``2sbh`` each, two dropout
masks ``2sbh``; Q, K, V, projection input ``8sbh``; MLP ``16sbh``; scores
``5 a s^2 b``), generalised to GQA (K, V of width ``kv_hidden``), gated MLPs
(``2f`` stored before the activation), MoE (routed tokens ``top_k`` times) and multi-head latent
attention (Q, K, V, output at :attr:`~workloads.models.ModelSpec.attention_widths`, split by heads, plus
the replicated latents: ``2 q_lora_rank + 2 kv_lora_rank + qk_rope_head_dim`` per token, the down
projections' outputs and the latent norms' outputs).
For GPT-shaped models it equals the table exactly. Embedding-dropout and
small per-stage terms are left out; the last stage adds the fp32 logits
``4 s b V / t`` of the loss. A model trained without dropout (``model.dropout``
0: Llama 3, Mixtral, DeepSeek-V3, Qwen3) stores no masks (``2 s b h`` less,
and of the scores only the softmax output ``2 a s^2 b``).

Selective recomputation by module (``parallel.recompute_modules``, Megatron-Core's
``--recompute-modules``; ``core_attn`` alone is Korthikanti's ``selective``):
``core_attn`` drops the scores, ``layernorm`` the two norms' outputs (the
attention's and the MLP's GEMM inputs), ``mla_up_proj`` MLA's Q, K, V and the
normed latents (rebuilt from the kept latents), ``moe_act`` the routed experts'
activation output (their fc2 input); the last three are Megatron-Core's
output-discarding checkpoints. The attention core's output (the output
projection's input) is kept once: by a fused core in bf16 unless ``core_attn``
recomputes it (the projection reuses it), else by the projection.

Micro-batches whose activations stage ``i`` (0-based) of ``p`` holds at peak,
with ``m`` micro-batches per step: GPipe ``m``; 1F1B ``min(p - i, m)``;
interleaved 1F1B with ``v`` chunks per stage: Megatron-LM runs
``w = 2 (p - i - 1) + (v - 1) N`` warm-up chunk-forwards (``N`` the micro-batch
group size, ``p`` by default), so ``min(w + 1, m v)`` chunks of ``1/v`` of the
stage's layers are live: with ``N = p``, ``(p v + p - 1) / v`` stage
equivalents on the first stage, ``1 + (p - 1)/(p v)`` times 1F1B's ``p``
(Narayanan et al. 2021, section 2.2.2). The count is read off the
schedule's order of actions, each chunk weighted by its own layers' bytes:
uneven stages (``parallel.stage_layers``, per stage or per chunk, an
embedding-only end chunk) and dense and MoE layers in one stage are exact,
not the stage's average chunk.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from .errors import ConfigError, is_int
from .flops import LOSS_BYTES, fp8_weight_params
from .models import ModelSpec
from .moe import capacity_slots
from .parallel import (
    ParallelConfig,
    TrainingSpec,
    chunk_layers,
    num_micro_batches,
    padded_vocab,
    resolve_recompute_modules,
    stage_layers,
    validate,
)
from .schedules import holding_changes, rank_schedule
from .sharding import gather_schedule, optimizer_bytes_per_param, sharding_plan, stage_uses

__all__ = [
    "MemoryBreakdown", "memory_per_gpu", "model_state_bytes", "stage_params",
    "activation_bytes_per_layer", "micro_batches_in_flight", "optimizer_bytes_per_param",
]

MASK_BYTES = 1
"""Bytes per element of a dropout mask (Korthikanti et al. store masks as bytes)."""

FP8_INPUT_BYTES = 1
"""Bytes per element of an FP8 GEMM's saved input under FP8 training (Transformer Engine keeps the FP8 copy)."""


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes one GPU needs at peak, by kind.

    Attributes
    ----------
    parameters, gradients, optimizer : float
        Model states, bytes, after TP/PP/EP sharding and ZeRO partitioning.
    activations : float
        Activations stored for backward at the schedule's peak, bytes.
    stage : int
        Pipeline stage these numbers are for.
    total : float
        Sum of the four, bytes.
    """

    parameters: float
    gradients: float
    optimizer: float
    activations: float
    stage: int = 0
    total: float = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "total", self.parameters + self.gradients + self.optimizer + self.activations)

    def fits(self, hbm_bytes: float) -> bool:
        """Whether :attr:`total` fits in ``hbm_bytes`` of GPU memory."""
        return self.total <= hbm_bytes

    def describe(self) -> str:
        """One line, in GB (1e9 bytes)."""
        gb = 1e-9
        return (f"stage {self.stage}: params {self.parameters * gb:.1f} GB + grads {self.gradients * gb:.1f} GB"
                f" + optimizer {self.optimizer * gb:.1f} GB + activations {self.activations * gb:.1f} GB"
                f" = {self.total * gb:.1f} GB per GPU")


# ----------------------------------------------------------- model states
def model_state_bytes(params: float, *, dp: int = 1, zero: int = 0,
                      dtype_bytes: int = 2) -> tuple[float, float, float]:
    """Parameter, gradient and optimizer bytes for ``params`` sharded by ZeRO over ``dp``.

    Parameters
    ----------
    params : float
        ``Psi``: parameters held before ZeRO partitioning.
    dp : int
        Size of the group ZeRO partitions over.
    zero : {0, 1, 2, 3}
        ZeRO stage.
    dtype_bytes : int
        Bytes of a parameter / gradient (2 for bf16 / fp16).

    Returns
    -------
    (parameters, gradients, optimizer) : tuple of float, bytes

    Examples
    --------
    >>> [x / 1e9 for x in model_state_bytes(7.5e9, dp=64, zero=0)]
    [15.0, 15.0, 90.0]
    """
    p = dtype_bytes * params
    g = dtype_bytes * params
    o = optimizer_bytes_per_param(dtype_bytes) * params
    return (p / dp if zero >= 3 else p, g / dp if zero >= 2 else g, o / dp if zero >= 1 else o)


def stage_params(model: ModelSpec, parallel: ParallelConfig, stage: int) -> tuple[int, int]:
    """Parameters one GPU of pipeline stage ``stage`` holds: ``(dense, routed_experts)``.

    Layers are split Megatron-style over TP (and experts over EP). The first
    stage adds the vocab-parallel word embedding (padded vocabulary) and any
    position table; the last stage the final norm and the output layer, which
    is a separate copy when untied or when ``pp > 1`` (Megatron keeps a tied
    copy on the last stage and syncs its gradient with the first). Under
    ``dualpipe`` a rank holds two model stages (``i`` and ``pp - 1 - i``), so
    twice the layers, and the first and last ranks both hold the embedding
    and the output layer.
    """
    t, ep, etp = parallel.tp, parallel.ep, parallel.expert_tp
    p = parallel.pp
    dense = experts = 0
    for i in stage_layers(model.layers, parallel, stage):
        routed = model.routed_expert_params(i, t, ep, etp)
        experts += routed
        dense += model.params_per_layer(i, t, ep, etp) - routed
    word = model.word_embedding_params(t, padded_vocab(model.vocab, t))
    ends = (0, p - 1) if parallel.schedule == "dualpipe" else None
    if stage == 0 or (ends and stage in ends):
        dense += word + model.position_embedding_params()
    if stage == p - 1 or (ends and stage in ends):
        dense += model.final_norm_params()
        if not model.tied_embeddings or parallel.pp > 1:
            dense += word
    return dense, experts


# ------------------------------------------------------------- activations
def activation_bytes_per_layer(model: ModelSpec, layer: int, micro_batch: int, seq_len: int,
                               tp: int = 1, *, sequence_parallel: bool = False,
                               recompute: str = "none", dtype_bytes: int = 2,
                               flash_attention: bool = False, fp8: bool = False,
                               recompute_modules: Sequence[str] | None = None, etp: int | None = None,
                               routed_factor: float = 1.0) -> float:
    """Bytes layer ``layer`` stores for backward, per micro-batch, on one TP rank.

    See the module docstring for the terms (Korthikanti et al. 2022, Table 2).
    ``flash_attention=True`` drops the ``5 a s^2 b`` score terms (a fused
    kernel never stores the score matrix), which is what ``selective`` also does.
    ``fp8=True`` (FP8 training): the inputs of the FP8 GEMMs are kept as their
    1-byte FP8 copies, as Transformer Engine saves them for the weight gradient
    (module docstring); every other term keeps ``dtype_bytes``.
    ``recompute_modules`` (``selective`` only; default ``core_attn``, see
    :class:`~workloads.parallel.ParallelConfig`): each module named drops what
    it recomputes: ``core_attn`` the scores, ``layernorm`` the two norms'
    outputs, ``mla_up_proj`` MLA's Q, K, V and normed latents, ``moe_act`` the
    routed experts' fc2 input (Megatron-Core's output-discarding checkpoints).
    ``etp``: the routed experts' TP degree (default ``tp``): the tokens entering
    them are this rank's, gathered over the expert-TP group.
    ``routed_factor``: token slots the routed experts hold over the balanced
    ``s b k`` (``moe.pad_to_capacity``: every expert padded to its capacity,
    :func:`routed_rows_factor`); their saved inputs and fc1 outputs scale with it.

    Examples
    --------
    GPT-3 175B layer, ``s = 2048, b = 1, t = 8``, no SP, no recompute
    (``s b h (10 + 24/t + 5 a s / (h t)) = 23 s b h`` bytes = 552 MiB):

    >>> from workloads.models import get_preset
    >>> activation_bytes_per_layer(get_preset("gpt3-175b"), 0, 1, 2048, 8) / 2**20
    552.0
    """
    s, b, h, t, d = seq_len, micro_batch, model.hidden, tp, dtype_bytes
    g = FP8_INPUT_BYTES if fp8 else d  # bytes per element of a saved FP8-GEMM input
    sbh = s * b * h
    sp = t if (sequence_parallel and tp > 1) else 1
    if recompute == "full":
        return d * sbh / sp
    modules = resolve_recompute_modules(recompute, recompute_modules)
    moe = model.is_moe_layer(layer)
    # 2 norm inputs, the attention's and the MLP's GEMM inputs (the norms' outputs), 2 masks. A MoE layer's
    # MLP input is the router's (a bf16 GEMM) and, under FP8, also the shared expert's FP8 copy.
    mlp_input = d + (g if fp8 and model.shared_experts else 0) if moe else g
    norm_outputs = 0 if "layernorm" in modules else g + mlp_input
    masks = MASK_BYTES if model.dropout else 0  # no dropout, no mask (PyTorch returns the input at p = 0)
    replicated = (2 * d + norm_outputs + 2 * masks) * sbh
    # The output projection's input is the attention core's output: a fused core keeps it (bf16) for its own
    # backward unless the core is recomputed, and then the projection reuses it (Megatron-Core's MLA saves
    # the original, not a second, FP8 copy); otherwise only the projection keeps it (FP8 under FP8 training).
    o_bytes = d if flash_attention and "core_attn" not in modules else g
    up = "mla_up_proj" in modules
    if model.is_mla:
        # MLA: the latents (the down projections' outputs = the latent norms' inputs, and the norms' outputs =
        # the up projections' inputs; the key's rotary part) are replicated over TP, Q, K, V and the
        # projection input split by heads at their own widths. mla_up_proj re-runs the latent norms with the
        # up projections (Megatron-Core's TE layout fuses each norm into its up projection).
        latent = (model.q_lora_rank or 0) + model.kv_lora_rank  # type: ignore[operator]
        replicated += s * b * ((d + (0 if up else g)) * latent + d * model.qk_rope_head_dim)
        qw, kw, vw, ow = model.attention_widths
        split = s * b * (d * (0 if up else qw + kw + vw) + o_bytes * ow)
    else:  # Q, K, V; projection input
        # Unfused attention under GQA keeps K and V expanded to every query head: Megatron-Core's
        # DotProductAttention repeat_interleaves them before its batched GEMMs, which save the copies (the
        # grouped ones are then free); a fused kernel, or a checkpointed core, keeps them grouped.
        kv = model.q_hidden if not flash_attention and "core_attn" not in modules else model.kv_hidden
        split = s * b * (d * (model.q_hidden + 2 * kv) + o_bytes * model.q_hidden)
    gates = model.mlp_matrices - 1
    if moe:
        k = model.top_k
        # routed copies of the tokens entering the experts: this rank's s b / sp tokens, gathered over the
        # expert-TP group (etp ranks; Megatron-Core's all-gather after the dispatch), k copies of each: with
        # etp = t under SP, s b k of them, the rows the experts' GEMMs have (flops.py). (TP without SP leaves
        # every TP rank all s b tokens already: nothing to gather.)
        gathered = (etp or t) if sp > 1 or t == 1 else 1
        routed = k * routed_factor  # (token slots per token: k, or more when padded to capacity)
        replicated += g * sbh * routed * gathered
        width = model.expert_ffn_hidden * (routed + model.shared_experts)
        fc2_inputs = model.expert_ffn_hidden * (model.shared_experts + (0 if "moe_act" in modules else routed))
        split += s * b * (width * d * gates + fc2_inputs * g)  # fc1 output(s), fc2 input
    else:
        split += s * b * model.ffn_hidden * (d * gates + g)  # fc1 output(s) + fc2 input
    total = replicated / sp + split / t
    if "core_attn" not in modules and not flash_attention:
        scores = 2 * d + masks if model.dropout else d  # softmax out (and with dropout: its mask and output)
        total += scores * model.heads * s * s * b / t
    return total


def micro_batches_in_flight(parallel: ParallelConfig, stage: int) -> float:
    """Micro-batches' worth of stage ``stage``'s activations live at the peak.

    GPipe ``m``; 1F1B ``min(p - i, m)``; interleaved ``min(w + 1, m v) / v``
    with ``w = 2 (p - i - 1) + (v - 1) N`` (Megatron-Core's warm-up count, ``N``
    ``parallel.microbatch_group_size``, ``p`` by default;
    read off the schedule's order, :func:`_peak_in_flight`);
    Zero Bubble H1 ``p`` on every stage (a micro-batch's inputs stay until its
    weight gradient; :func:`~workloads.schedules.max_in_flight`), counted as
    whole activations (an upper bound: after ``B`` only the linear layers'
    inputs are still needed). DualPipe: ``(p + 1) / 2`` (the report's
    ``PP + 1`` micro-batches of one of the rank's two chunks; its schedule's
    :func:`~workloads.schedules.max_in_flight`), the same upper bound.
    """
    p, m, i = parallel.pp, num_micro_batches(parallel), stage
    if not is_int(stage) or not 0 <= stage < p:  # (as chunk_layers: a stage past the last read -91 in flight)
        raise ConfigError(f"stage: {stage!r} is outside 0..{p - 1}")
    if parallel.schedule == "gpipe":
        return float(m)
    if parallel.schedule in ("dualpipe", "interleaved"):  # chunk-micro-batches in flight, over the chunks
        return _peak_in_flight(parallel, stage, (1.0,) * parallel.model_chunks) / parallel.model_chunks
    if parallel.schedule == "zb-h1":
        return float(min(p, m))
    return float(min(p - i, m))


@lru_cache(maxsize=64)
def _holding_changes(kind: str, pp: int, micro_batches: int, virtual_stages: int, stage: int,
                     group_size: int | None = None) -> tuple[int, ...]:
    """:func:`~workloads.schedules.holding_changes` of ``stage``'s order, kept (memory is asked per stage, and per
    layout change by :func:`simulator.experiment.memory_remedies`)."""
    return holding_changes(rank_schedule(kind, pp, micro_batches, virtual_stages, stage, group_size))


def _peak_in_flight(parallel: ParallelConfig, stage: int, per_chunk: Sequence[float]) -> float:
    """The peak, over ``stage``'s order of actions (interleaved or DualPipe), of the summed ``per_chunk``
    weights of the (micro-batch, chunk) pairs whose forward has run and whose backward (weight gradient,
    where the backward is split) has not; the forward of an overlapped pair counted before its backward
    frees anything. With equal weights this is :func:`~workloads.schedules.max_in_flight` (interleaved:
    Megatron-Core's warm-up ``2 (p - i - 1) + (v - 1) N`` plus one, at most ``m v``); weighted by each
    chunk's layers it is exact for chunks of unequal size
    (``parallel.stage_layers`` per chunk, an embedding-only end chunk, dense and MoE layers in one stage)."""
    v = parallel.virtual_stages if parallel.schedule == "interleaved" else 1
    live = peak = 0.0
    for change in _holding_changes(parallel.schedule, parallel.pp, num_micro_batches(parallel), v, int(stage),
                                   parallel.microbatch_group_size):
        if change > 0:
            live += per_chunk[change - 1]
            peak = max(peak, live)
        else:
            live -= per_chunk[-change - 1]
    return peak


def _stage_activations(model: ModelSpec, parallel: ParallelConfig, training: TrainingSpec, stage: int,
                       flash_attention: bool, routed_factor: float = 1.0) -> float:
    b, t, d = parallel.micro_batch, parallel.tp, training.dtype_bytes
    s = training.seq_len // parallel.cp  # context parallelism: this rank's tokens (attention is always fused)

    def per_mb(layers: list[int]) -> float:
        return sum(activation_bytes_per_layer(model, i, b, s, t, sequence_parallel=parallel.sp,
                                              recompute=parallel.recompute, dtype_bytes=d,
                                              flash_attention=flash_attention or parallel.cp > 1,
                                              fp8=training.fp8, recompute_modules=parallel.recompute_modules,
                                              etp=parallel.expert_tp, routed_factor=routed_factor)
                   for i in layers)

    if parallel.schedule in ("dualpipe", "interleaved"):  # chunks can differ: weigh each by its own layers
        acts = _peak_in_flight(parallel, stage, [per_mb(chunk_layers(model.layers, parallel, stage, c))
                                                 for c in range(parallel.model_chunks)])
    else:
        acts = micro_batches_in_flight(parallel, stage) * per_mb(stage_layers(model.layers, parallel, stage))
    if parallel.recompute == "full":
        # The layer being recomputed: its forward runs again right before its backward, whose activations then
        # live in full (one micro-batch, one layer: the largest of the stage's) on top of every checkpoint but
        # its own, its input, which those activations hold already (the first norm's input).
        layers = stage_layers(model.layers, parallel, stage)
        own = activation_bytes_per_layer(model, 0, b, s, t, sequence_parallel=parallel.sp, recompute="full",
                                         dtype_bytes=d) if layers else 0.0
        acts += max((activation_bytes_per_layer(model, i, b, s, t, sequence_parallel=parallel.sp, dtype_bytes=d,
                                                flash_attention=flash_attention or parallel.cp > 1, fp8=training.fp8,
                                                etp=parallel.expert_tp, routed_factor=routed_factor)
                     for i in layers), default=0.0) - own
    group = parallel.microbatch_group_size
    if parallel.schedule == "interleaved" and group is not None and stage in (0, parallel.pp - 1):
        # With groups of N > pp the first rank receives the last rank's outputs N - pp iterations before their
        # forward (the last rank the first rank's gradients before their backward): Megatron-Core sizes its
        # receive buffers for N - pp + 1 (fwd_recv_buffer_size), one of which any rank holds for its next pass.
        # The tensor between stages: this rank's tokens, split over TP with SP or Megatron's scatter/gather.
        acts += (group - parallel.pp) * b * s * model.hidden * d / t
    if stage == parallel.pp - 1 or (parallel.schedule == "dualpipe" and stage == 0):
        # fp32 logits kept by the loss; 1 live except under GPipe
        live = num_micro_batches(parallel) if parallel.schedule == "gpipe" else 1
        acts += live * LOSS_BYTES * s * b * padded_vocab(model.vocab, t) / t
    return acts


# ------------------------------------------------------------------ entry
def _stage_memory(model: ModelSpec, parallel: ParallelConfig, training: TrainingSpec, stage: int,
                  flash_attention: bool, grad_dtype_bytes: int | None, routed_factor: float = 1.0
                  ) -> MemoryBreakdown:
    dense, routed = stage_params(model, parallel, stage)
    d, z = training.dtype_bytes, parallel.zero
    plan = sharding_plan(parallel, training.dtype, grad_dtype_bytes)
    # CP ranks shard with DP; under dualpipe so do the mirror stage's ranks, which hold the same weights
    copies = parallel.weight_copies
    groups = ((dense, parallel.grad_dp * copies), (routed, parallel.size("expert_dp") * copies))
    states = [model_state_bytes(n, dp=g, zero=z, dtype_bytes=d) for n, g in groups]
    gathered = plan.gather is not None and parallel.dp > 1
    # Parameters at rest: a shard wherever they are gathered before use (ZeRO-3, and FSDP's SHARD_GRAD_OP, which
    # reshards only after the backward); what is gathered is added at the peak below.
    params = sum(model_state_bytes(n, dp=g, zero=3 if gathered else z, dtype_bytes=d)[0] for n, g in groups)
    grad_states = states
    if plan.impl in ("fsdp", "fsdp2") and plan.grad_sync == "step":
        # no_sync / set_requires_gradient_sync(False): FSDP accumulates the full gradients, not shards, until the
        # micro-batch that syncs (FSDP.no_sync: "FSDP will accumulate the full model gradients (instead of
        # gradient shards) until the eventual sync")
        grad_states = [model_state_bytes(n, dp=g, zero=min(z, 1), dtype_bytes=d) for n, g in groups]
    grads = sum(s[1] for s in grad_states) * plan.grad_bytes / d  # the framework's buffer (Megatron: fp32 for bf16)
    if training.fp8 and not training.fp8_param_gather:  # TE's cached FP8 weights and their transposes
        params += 2 * sum(sum(fp8_weight_params(model, i, parallel.tp, parallel.ep, parallel.expert_tp))
                          for i in stage_layers(model.layers, parallel, stage))
    if gathered:  # gathered parameters live at the peak (prefetch included)
        (_dense, dense_group), (_routed, expert_group) = groups
        uses = stage_uses(model, parallel, plan, stage)[1]
        # an expert-DP group of one rank holds its experts whole (counted above) and gathers none of them
        params += gather_schedule(uses, plan, expert_gathered=expert_group > 1).peak_live * d
        # persistent units are held whole on every rank (counted above as a shard); their optimizer states stay
        # partitioned
        whole = {u.unit.key: u.unit for u in uses if plan.persistent(u.unit)}.values()
        params += sum(u.params * (1 - 1 / dense_group) + u.expert_params * (1 - 1 / expert_group) for u in whole) * d
    optimizer = sum(s[2] for s in states)
    if plan.fp32_main_grads:  # fp32 copies of the 16-bit gradients, one per parameter the optimizer updates
        optimizer += 4 * sum(n / (g if z >= 1 else 1) for n, g in groups)
    return MemoryBreakdown(params, grads, optimizer,
                           _stage_activations(model, parallel, training, stage, flash_attention, routed_factor),
                           stage)


def memory_per_gpu(model: ModelSpec, parallel: ParallelConfig, training: TrainingSpec,
                   stage: int | None = None, *, flash_attention: bool = False,
                   grad_dtype_bytes: int | None = None, routed_factor: float = 1.0) -> MemoryBreakdown:
    """Peak memory of one GPU of pipeline stage ``stage`` (default: the most loaded stage).

    Parameters
    ----------
    model, parallel, training
        A combination :func:`~workloads.parallel.validate` accepts.
    stage : int, optional
        0-based pipeline stage; ``None`` returns the stage with the largest total.
    flash_attention : bool, default False
        Attention scores are never stored (FlashAttention). The default follows
        Korthikanti et al.'s table, which stores them unless recomputed.
    grad_dtype_bytes : int, optional
        Bytes per element of the gradient buffer; default the implementation's
        (:func:`~workloads.sharding.sharding_plan`: Megatron keeps fp32 gradients
        for bf16 training, DeepSpeed and FSDP the model dtype).
    routed_factor : float, default 1
        The routed experts' token slots over the balanced count
        (:func:`routed_rows_factor`: ``moe.pad_to_capacity``). Dropless and
        dropping routings are counted at the balanced count: a hot expert's
        rank under skewed routing holds more.

    Returns
    -------
    MemoryBreakdown

    Raises
    ------
    ConfigError
        If the combination is invalid or ``stage`` is out of range.

    Examples
    --------
    >>> from workloads.models import get_preset
    >>> m = memory_per_gpu(get_preset("gpt3-175b"), ParallelConfig(tp=8, pp=8, dp=16, global_batch=1536,
    ...                    sequence_parallel=True, recompute="selective", zero=1), TrainingSpec())
    >>> m.stage, m.fits(80e9)
    (0, True)
    """
    validate(model, parallel, training)
    stages = range(parallel.pp) if stage is None else [stage]
    return max((_stage_memory(model, parallel, training, i, flash_attention, grad_dtype_bytes, routed_factor)
                for i in stages), key=lambda mb: mb.total)


def routed_rows_factor(model: ModelSpec, parallel: ParallelConfig, training: TrainingSpec,
                       capacity_factor: float | None, pad_to_capacity: bool) -> float:
    """Token slots an EP rank's routed experts hold over the balanced ``T k`` (``T`` the tokens an EP rank
    routes, ``b s``, or ``b (s/cp) / t`` on the expert grid:
    :meth:`~workloads.parallel.ParallelConfig.routed_tokens`): with ``pad_to_capacity`` every expert is padded to its
    capacity, ``r`` routers' ``C = ceil(T/r k / E c)`` per source rank (:func:`~workloads.moe.capacity_slots`;
    ``r`` = :attr:`~workloads.parallel.ParallelConfig.routers`), so a rank holds ``r C E`` slots from its ``ep``
    sources for its ``E / ep`` experts; 1 otherwise, and without expert parallelism (the generator routes only
    with ``ep > 1``)."""
    if not (model.is_moe and parallel.ep > 1 and pad_to_capacity and capacity_factor is not None):
        return 1.0
    tokens, routers = parallel.routed_tokens(training.seq_len), parallel.routers
    slots = tokens * model.top_k
    return (routers * capacity_slots(tokens // routers, model.top_k, model.experts, capacity_factor)
            * model.experts / slots)
