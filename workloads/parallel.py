"""Parallel and training configuration, their validation, and rank placement.

:class:`ParallelConfig` says how one training step is split (TP, CP, PP, DP,
EP, ZeRO, schedule, recomputation, rank placement); :class:`TrainingSpec` says
what is trained on (sequence length, dtype). Each dataclass checks its own
fields on construction; :func:`validate` checks the combinations that a model
and a cluster size make impossible, one clear :class:`ConfigError` each.

:class:`RankLayout` maps global ranks to ``(tp, dp, pp, cp)`` coordinates and
back, and lists the communication groups of every parallel dimension.

Decisions (Megatron-LM conventions unless said otherwise)
---------------------------------------------------------
* ``kv_heads`` must be a multiple of ``tp`` (Megatron-core divides the query
  groups over TP and asserts divisibility; it does not replicate KV heads).
* The vocabulary is padded up to a multiple of ``128 * tp``
  (``--make-vocab-size-divisible-by 128``), see :func:`padded_vocab`; any
  vocabulary size is therefore valid.
* ``sequence_parallel`` with ``tp == 1`` is a no-op (Megatron turns it off),
  not an error; with ``tp > 1`` the sequence length must divide by ``tp``.
* Expert parallelism lives inside data parallelism: ``dp % ep == 0``; the EP
  group is ``ep`` consecutive DP ranks and the expert-DP group is the DP ranks
  with the same EP index.
* Context parallelism (``cp``) splits every sequence over ``cp`` ranks that
  hold the same weights; Megatron-Core's rank order is ``tp-cp-ep-dp-pp``, so
  a placement that does not name ``cp`` gets it right after ``tp``. The CP
  ranks of a model shard reduce gradients (and shard the distributed
  optimizer) together with the DP ranks: the ``dp x cp`` group
  (:meth:`RankLayout.grad_group`). Ring attention (``cp_comm_type: p2p``) and
  ``all_gather`` need the sequence to divide into ``2 cp`` chunks (causal load balancing),
  times ``tp`` with sequence parallelism; all-to-all (``a2a``, Ulysses) needs
  ``cp`` to divide the query and key/value heads of a TP rank. Not modelled
  with CP: MoE models, ZeRO-2/3, unfused attention, hierarchical ``a2a+p2p``.
* Layers divide evenly over ``pp * virtual_stages`` unless the stages are
  given: ``stage_layers`` (one count per pipeline stage) or Megatron-Core's
  ``num_layers_in_first_pipeline_stage`` / ``num_layers_in_last_pipeline_stage``
  (``first_stage_layers`` / ``last_stage_layers``: the other layers split
  evenly over the middle stages). Each stage's count must divide by
  ``virtual_stages``; chunk ``c`` of stage ``i`` holds ``n_i / v`` consecutive
  layers, virtual stages ``j = c p + i`` taking the layers in order of ``j``
  (Megatron-Core ``get_transformer_layer_offset``). E.g. Llama 3 405B's 126
  layers on 16 stages: ``first_stage_layers: 7, last_stage_layers: 7``. A
  stage may also list one count per chunk (``stage_layers: [[1, 2, 2, 2],
  ...]``, as Megatron's ``pipeline_model_parallel_layout`` can), so 7 layers
  interleave over 4 chunks.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import NamedTuple

from .errors import ConfigError, check_bool, check_choice, check_int, check_keys, check_number, divisors
from .models import ModelSpec
from .schedules import group_size_problem, group_sizes

__all__ = [
    "TrainingSpec", "ParallelConfig", "RankLayout", "RankCoords",
    "parallel_from_dict", "training_from_dict", "validate", "num_micro_batches",
    "padded_vocab", "stage_layers", "chunk_layers", "layers_per_stage", "DTYPE_BYTES", "SCHEDULES", "RECOMPUTE",
    "RECOMPUTE_MODULES", "resolve_recompute_modules",
    "DP_SYNC", "CP_COMM_TYPES",
]

DTYPE_BYTES: dict[str, int] = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 2}
"""Bytes per element of the weights, activations and activation gradients the step keeps, per
``training.dtype``. FP8 training (Transformer Engine) keeps all of them in bf16 and casts only the inputs of
its FP8 GEMMs to 1-byte copies (:mod:`workloads.flops`), hence 2."""
SCHEDULES = ("1f1b", "gpipe", "interleaved", "zb-h1", "dualpipe")
SPLIT_BACKWARD_SCHEDULES = ("zb-h1", "dualpipe")
"""Schedules that split a backward into B (input gradient) and a later W (weight gradient) pass."""
RECOMPUTE = ("none", "selective", "full")
RECOMPUTE_MODULES = ("core_attn", "layernorm", "mla_up_proj", "moe_act")
"""What ``recompute: selective`` may recompute (Megatron-Core's ``--recompute-modules``; default ``core_attn``)."""
DP_SYNC = ("allreduce", "parameter_server")
DIMS = ("tp", "dp", "pp")
"""The default placement, innermost first (Megatron: TP in a server, PP outermost)."""
COORDS = ("tp", "cp", "dp", "pp")
"""Parallel dimensions of a rank's coordinates, in Megatron-Core's order (tp-cp-ep-dp-pp)."""
CP_COMM_TYPES = ("p2p", "all_gather", "a2a")
"""Megatron-Core's ``cp_comm_type`` values that are modelled (not the hierarchical ``a2a+p2p``)."""
VOCAB_DIVISIBLE_BY = 128
DDP_BUCKET_BYTES = 25 * 2**20
ZERO_IMPLS = ("auto", "megatron", "deepspeed", "fsdp", "fsdp2")
"""Sharded data-parallel implementations (:mod:`workloads.sharding`)."""
"""PyTorch DDP's default ``bucket_cap_mb=25`` (25 MiB)."""


FP8_RECIPES = ("tensorwise", "blockwise")
"""``training.fp8_recipe`` values (:class:`TrainingSpec`); the first is the default."""


@dataclass(frozen=True)
class TrainingSpec:
    """What one step trains on.

    Parameters
    ----------
    seq_len : int, default 2048
        Tokens per sequence ``s``.
    dtype : {"bf16", "fp16", "fp32", "fp8"}, default "bf16"
        Compute/activation dtype; 16-bit means mixed precision with fp32
        master weights and Adam states. ``fp8``: Transformer Engine FP8 under
        Megatron-Core (delayed scaling, the ``hybrid`` format): the GEMMs of
        the linear layers run on FP8 inputs at the GPU's FP8 rate, everything
        else (attention, softmax, norms, the output layer, the router) in bf16,
        plus TE's casts, amax reductions and FP8 weight copies
        (:mod:`workloads.flops`, :mod:`workloads.memory`).
    fp8_param_gather : bool, default False
        Megatron's ``--fp8-param-gather`` (TE ``fp8_model_init``): the model
        keeps its GEMM weights in FP8 only (no bf16 copy); the distributed
        optimizer casts the updated master weights straight to FP8 and
        all-gathers them in FP8 (1 byte per weight). Needs ``dtype: fp8``.
    fp8_recipe : {"tensorwise", "blockwise"}, default "tensorwise"
        How FP8 tensors are scaled (:data:`FP8_RECIPES`). ``tensorwise``:
        Transformer Engine's one scale per tensor (delayed scaling), whose
        amax histories are all-reduced every pass. ``blockwise``: DeepSeek-V3's
        fine-grained scaling (report section 3.3.2: a scale per 1 x 128
        activation tile and per 128 x 128 weight block, computed online, so no
        amax reduction); its weight-gradient GEMMs, both operands scaled along
        the reduced token dimension, run at their own measured ceiling
        (``GPUSpec.matmul_efficiency_fp8_wgrad``, category ``gemm_fp8_wgrad``).
        Needs ``dtype: fp8`` when not the default.
    """

    seq_len: int = 2048
    dtype: str = "bf16"
    fp8_param_gather: bool = False
    fp8_recipe: str = "tensorwise"

    def __post_init__(self) -> None:
        check_int("training.seq_len", self.seq_len)
        check_choice("training.dtype", self.dtype, tuple(DTYPE_BYTES))
        check_bool("training.fp8_param_gather", self.fp8_param_gather)
        check_choice("training.fp8_recipe", self.fp8_recipe, FP8_RECIPES)
        if self.fp8_param_gather and not self.fp8:
            raise ConfigError(f"training.fp8_param_gather: needs training.dtype: fp8 (got {self.dtype})")
        if self.fp8_recipe != FP8_RECIPES[0] and not self.fp8:
            raise ConfigError(f"training.fp8_recipe: {self.fp8_recipe} needs training.dtype: fp8 (got {self.dtype})")

    @property
    def dtype_bytes(self) -> int:
        """Bytes per element of the weights and activations the step keeps (:data:`DTYPE_BYTES`)."""
        return DTYPE_BYTES[self.dtype]

    @property
    def fp8(self) -> bool:
        """FP8 training (Transformer Engine semantics)."""
        return self.dtype == "fp8"

    @property
    def fp8_amax_reductions(self) -> bool:
        """FP8 under delayed scaling (``fp8_recipe: tensorwise``): amax histories reduced after every pass, and
        Megatron-Core's refusal of some recomputation under that recipe. Blockwise scales are computed online."""
        return self.fp8 and self.fp8_recipe == "tensorwise"

    @property
    def base_dtype(self) -> str:
        """The dtype of everything that is not an FP8 GEMM: ``bf16`` under ``fp8``, else :attr:`dtype`."""
        return "bf16" if self.fp8 else self.dtype


@dataclass(frozen=True)
class ParallelConfig:
    """How one training step is split over ``tp * cp * pp * dp`` GPUs.

    Parameters
    ----------
    tp, pp, dp : int, default 1
        Tensor-, pipeline- and data-parallel degrees.
    ep : int, default 1
        Expert-parallel degree (inside DP: ``dp % ep == 0``, unless ``etp`` differs from ``tp``).
    etp : int or None, default None
        Expert tensor-parallel degree (Megatron-Core ``--expert-tensor-parallel-size``): the routed
        experts' MLPs are split over ``etp`` ranks, independently of the attention's ``tp``. ``None``
        means ``tp`` (Megatron-Core's default, ``arguments.py``: ``expert_tensor_parallel_size =
        tensor_model_parallel_size`` when unset). Megatron-Core lays the experts out on their own grid
        of each pipeline stage's ``tp * cp * dp`` ranks, ``etp`` innermost, then ``ep``, then the
        expert-data-parallel ``edp = tp * cp * dp / (etp * ep)`` (``parallel_state``'s expert
        ``RankGenerator(tp=etp, ep=ep, dp=edp, order=...)``); see :class:`RankLayout`.
    cp : int, default 1
        Context-parallel degree: each sequence is split over ``cp`` ranks
        (Megatron-Core / Transformer Engine context parallelism).
    cp_comm_type : {"p2p", "all_gather", "a2a"}
        How CP attention sees the whole sequence: ``p2p`` (default, Megatron's)
        ring attention, K and V passed around the CP ring and overlapped with
        the attention blocks; ``all_gather``: K and V all-gathered before
        attention, not overlapped (Llama 3's choice); ``a2a``
        (DeepSpeed-Ulysses) all-to-alls that trade the sequence split for a
        head split around attention.
    dp_sync : {"allreduce", "parameter_server"}
        How DP replicas synchronise gradients.
    micro_batch : int, default 1
        Sequences per micro-batch ``b``.
    global_batch : int or None
        Sequences per step ``B``; ``None`` means ``micro_batch * dp``
        (one micro-batch per replica). Resolved to an int on construction, so
        ``dataclasses.replace(cfg, dp=...)`` keeps the old value: pass
        ``global_batch`` explicitly when sweeping ``dp`` or ``micro_batch``.
    schedule : {"1f1b", "gpipe", "interleaved", "zb-h1", "dualpipe"}
        Pipeline schedule (:mod:`workloads.schedules`); ``zb-h1`` is Zero
        Bubble H1 (the backward split into input and weight gradients);
        ``dualpipe`` is DeepSeek-V3's DualPipe (every rank holds stage ``r``
        and stage ``pp - 1 - r`` of the model, micro-batches fed from both
        ends, forward and backward chunks overlapped in pairs).
    virtual_stages : int, default 1
        Model chunks per pipeline stage ``v`` (interleaved 1F1B only).
    zero : {0, 1, 2, 3}
        ZeRO stage: shard optimizer (1), + gradients (2), + parameters (3) over DP.
    sequence_parallel : bool
        Megatron sequence parallelism (needs ``tp > 1`` to have an effect).
    recompute : {"none", "selective", "full"}
        Activation recomputation (Korthikanti et al. 2022).
    recompute_modules : tuple of str or None
        What ``selective`` recomputes, as Megatron-Core's ``--recompute-modules``
        (:data:`RECOMPUTE_MODULES`): ``core_attn`` (the attention core: its
        scores are not stored), ``layernorm`` (the two norms' outputs, the
        attention's and the MLP's inputs), ``mla_up_proj`` (MLA's Q, K, V from
        the up projections), ``moe_act`` (the routed experts' activation
        output, their fc2 input). None: ``(core_attn,)`` under ``selective``,
        ``()`` otherwise (:attr:`selective_modules` resolves it); only
        ``selective`` takes a list.
    placement : tuple of str
        Order of the dimensions over the cluster's GPU order, innermost
        (fastest-varying) first; a permutation of ``("tp", "dp", "pp")`` or
        of ``("tp", "cp", "dp", "pp")``; without ``cp``, CP ranks follow TP
        (Megatron-Core's tp-cp-ep-dp-pp), see :attr:`rank_order`.
    stage_layers : tuple or None
        Transformer layers of each pipeline stage: ``pp`` entries summing to
        ``model.layers``, each a count (a multiple of ``virtual_stages``,
        split evenly over the stage's chunks) or a list of ``virtual_stages``
        per-chunk counts (each >= 1, but the model's first chunk, stage 0's
        first, and its last, the last stage's last, may be 0: the embedding,
        or the output layer and loss, alone, as Megatron-Core's
        ``account_for_embedding_in_pipeline_split`` /
        ``account_for_loss_in_pipeline_split`` and Llama 3's schedule do);
        None: even.
    first_stage_layers, last_stage_layers : int or None
        Megatron-Core's ``num_layers_in_first_pipeline_stage`` /
        ``num_layers_in_last_pipeline_stage``: layers of the first (last)
        stage, the rest split evenly over the others. Not with ``stage_layers``.
    grad_bucket_bytes : int or None
        Gradient bucket size for DP reduction, bytes. ``None`` (default): the
        implementation's (:mod:`workloads.sharding`): Megatron-Core
        ``max(40M, 1M·dp)`` parameters, DeepSpeed ``reduce_bucket_size`` 5e8
        elements, FSDP one unit. PyTorch DDP's is 25 MiB.
    overlap_grad_reduce : bool
        Reduce gradient buckets during backward rather than after it.
    overlap_param_gather : bool
        Megatron-Core's ``--overlap-param-gather`` (default False): the
        distributed optimizer's all-gather of updated parameters runs during
        the next step's forward, bucket by bucket, each layer waiting for its
        bucket, instead of after the optimizer step (the routed experts'
        buckets on a chain of their own, as Megatron-Core's expert buffers).
        Needs ``zero: 1`` and ``overlap_grad_reduce`` (Megatron asserts both).
    align_param_gather : bool
        Megatron's ``align_param_gather`` (default True; ``--no-align-param-gather``
        turns it off): with the interleaved schedule, every pipeline stage
        dispatches all the parameter all-gathers of model chunks 0 and 1 at the
        start and of chunk ``c >= 2`` at the same virtual micro-batch, instead
        of each bucket prefetching the next. Megatron forces it off without
        interleaving.
    align_grad_reduce : bool
        Megatron's ``align_grad_reduce`` (default False here; Megatron's default
        is True, ``--no-align-grad-reduce`` turns it off there; False is what
        PyTorch DDP, FSDP and DeepSpeed do), with ``overlap_grad_reduce`` and
        Megatron's pipeline schedules (``1f1b``, ``interleaved``; ``pp > 1``)
        and its distributed data parallelism (``zero_impl`` megatron): the
        pipeline stages launch their gradient reductions together instead of
        as each bucket fills.
        Interleaved, rank ``r`` launches all buckets of a chunk ``r`` backward
        iterations after the chunk's last micro-batch, the chunks not yet
        launched after its last backward (``forward_backward_pipelining_*``'
        ``grad_sync_func``). False: each chunk's reduction starts when its
        gradients are ready. Either way Megatron buckets only the first
        stage's first chunk; every other chunk is one bucket, reduced after its
        last backward (so non-interleaved the two settings coincide: the first
        stage reduces buckets during its last backward, the others everything
        after theirs). Other frameworks bucket every stage.
    tp_comm_overlap : bool
        Megatron-Core's ``--tp-comm-overlap`` (default False): Transformer
        Engine's userbuffers overlap the sequence-parallel all-gathers and
        reduce-scatters of the linear layers with their GEMMs, by TE's default
        method per GEMM (ring exchange, pipelined chunks, bulk); see
        :mod:`workloads.training`. Needs sequence parallelism.
    zero_impl : {"auto", "megatron", "deepspeed", "fsdp", "fsdp2"}
        Which framework's sharded data parallelism runs the ZeRO stage, with
        its own gather granularity, prefetch, re-gathers and gradient
        reduction (:mod:`workloads.sharding`). ``auto``: ``megatron`` for
        ZeRO 0-1 (DDP, distributed optimizer), ``deepspeed`` for 2-3.
    zero_grad_sync : {"auto", "micro_batch", "step"}
        When sharded gradients are reduce-scattered: after every micro-batch
        (DeepSpeed ZeRO-2/3; FSDP without ``no_sync``) or once per step
        (Megatron; FSDP inside ``no_sync``). ``auto``: the implementation's.
    zero_overlap : bool
        ZeRO-3 parameter all-gathers run on their own stream, prefetched ahead
        of use (default). False: each fetch blocks the compute stream; under
        DeepSpeed one collective per parameter tensor (DeepSpeed <= 0.5, 2021,
        which synchronised the device after every fetch), under FSDP the
        unit's one all-gather without prefetch.
    zero_prefetch : float
        DeepSpeed ``stage3_prefetch_bucket_size``, elements (default 5e7):
        upcoming modules are gathered together until this many.
    zero_reuse_distance : float
        DeepSpeed ``stage3_max_reuse_distance``, elements (default 1e9): a
        gathered parameter used again within this many elements is kept.
    zero_persistence : float
        DeepSpeed ``stage3_param_persistence_threshold``, elements (default
        1e5): smaller parameters (norms, biases) are never partitioned.
    microbatch_group_size : int or None
        Interleaved schedule only: contiguous micro-batches each model chunk
        runs before the next chunk, ``N`` (Megatron-Core's
        ``microbatch_group_size_per_vp_stage``,
        ``--microbatch-group-size-per-virtual-pipeline-stage``; the Llama 3
        paper's ``N``, section 3.3.2). None: ``pp`` (depth-first, Megatron's
        default). ``pp <= N <=`` micro-batches, and the micro-batches a
        multiple of ``N`` or leaving at least ``pp``: then they need not be a
        multiple of ``pp``. A larger ``N`` runs ``(v - 1)(N - pp)`` more
        warm-up forwards (more activations in flight) and leaves the pipeline
        more slack to hide transfers (:mod:`workloads.schedules`).
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1
    etp: int | None = None
    cp: int = 1
    cp_comm_type: str = "p2p"
    dp_sync: str = "allreduce"
    micro_batch: int = 1
    global_batch: int | None = None
    schedule: str = "1f1b"
    virtual_stages: int = 1
    zero: int = 0
    sequence_parallel: bool = False
    recompute: str = "none"
    placement: tuple[str, ...] = DIMS
    stage_layers: tuple[int | tuple[int, ...], ...] | None = None
    first_stage_layers: int | None = None
    last_stage_layers: int | None = None
    grad_bucket_bytes: int | None = None
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = False
    align_param_gather: bool = True
    align_grad_reduce: bool = False
    tp_comm_overlap: bool = False
    zero_impl: str = "auto"
    zero_grad_sync: str = "auto"
    zero_overlap: bool = True
    zero_prefetch: float = 5e7
    zero_reuse_distance: float = 1e9
    zero_persistence: float = 1e5
    recompute_modules: tuple[str, ...] | None = None
    microbatch_group_size: int | None = None

    def __post_init__(self) -> None:
        for f in fields(self):  # numpy's integers (a DataFrame's, a grid's) as Python ints
            value = getattr(self, f.name)
            if isinstance(value, numbers.Integral) and not isinstance(value, (bool, int)):
                object.__setattr__(self, f.name, int(value))
        for f in ("tp", "pp", "dp", "ep", "cp", "micro_batch", "virtual_stages"):
            check_int(f"parallel.{f}", getattr(self, f))
        if self.microbatch_group_size is not None:
            check_int("parallel.microbatch_group_size", self.microbatch_group_size)
        if self.etp is not None:
            check_int("parallel.etp", self.etp)
        if self.grad_bucket_bytes is not None:
            check_int("parallel.grad_bucket_bytes", self.grad_bucket_bytes)
        check_choice("parallel.zero_impl", self.zero_impl, ZERO_IMPLS)
        check_choice("parallel.cp_comm_type", self.cp_comm_type, CP_COMM_TYPES)
        check_choice("parallel.zero_grad_sync", self.zero_grad_sync, ("auto", "micro_batch", "step"))
        check_bool("parallel.zero_overlap", self.zero_overlap)
        for f in ("zero_prefetch", "zero_reuse_distance", "zero_persistence"):
            value = getattr(self, f)
            if isinstance(value, str):  # YAML 1.1 reads 5e7 (no dot) as a string
                try:
                    object.__setattr__(self, f, float(value))
                except ValueError:
                    pass
            check_number(f"parallel.{f}", getattr(self, f), minimum=0.0, maximum=1e15, unit="elements")
        if self.global_batch is None:
            object.__setattr__(self, "global_batch", self.micro_batch * self.dp)
        check_int("parallel.global_batch", self.global_batch)
        check_int("parallel.zero", self.zero, minimum=0)
        check_choice("parallel.zero", self.zero, (0, 1, 2, 3))
        check_choice("parallel.dp_sync", self.dp_sync, DP_SYNC)
        check_choice("parallel.schedule", self.schedule, SCHEDULES)
        check_choice("parallel.recompute", self.recompute, RECOMPUTE)
        if self.recompute_modules is not None:  # given: checked, and kept as a tuple (None resolves late, so
            # that dataclasses.replace(recompute=...) of a default config stays valid)
            object.__setattr__(self, "recompute_modules",
                               resolve_recompute_modules(self.recompute, self.recompute_modules))
        check_bool("parallel.sequence_parallel", self.sequence_parallel)
        for f in ("overlap_grad_reduce", "overlap_param_gather", "align_param_gather", "align_grad_reduce",
                  "tp_comm_overlap"):
            check_bool(f"parallel.{f}", getattr(self, f))
        if isinstance(self.placement, str) or not isinstance(self.placement, Sequence):
            raise ConfigError(f"parallel.placement: must be a list such as [tp, cp, dp, pp], got {self.placement!r}")
        placement = tuple(self.placement)
        if not all(isinstance(d, str) for d in placement) or sorted(placement) not in (sorted(DIMS),
                                                                                        sorted(COORDS)):
            raise ConfigError(f"parallel.placement: {list(placement)} must be a permutation of [tp, dp, pp] "
                              f"(or [tp, cp, dp, pp]), innermost first (ep lives inside dp)")
        object.__setattr__(self, "placement", placement)
        if self.stage_layers is not None:
            if isinstance(self.stage_layers, (str, bytes)) or not isinstance(self.stage_layers, Sequence):
                raise ConfigError(f"parallel.stage_layers: must be a list of layer counts, one per pipeline "
                                  f"stage, got {self.stage_layers!r}")
            counts: list[int | tuple[int, ...]] = []
            for i, n in enumerate(self.stage_layers):
                if isinstance(n, Sequence) and not isinstance(n, (str, bytes)):
                    if len(n) != self.virtual_stages:
                        raise ConfigError(f"parallel.stage_layers[{i}]: {len(n)} chunk counts for "
                                          f"virtual_stages={self.virtual_stages}; give one per chunk")
                    for c, x in enumerate(n):
                        # the model's two end chunks may hold no layer: only the embedding / the output layer
                        # and loss (Megatron-Core's account_for_embedding / loss_in_pipeline_split)
                        end = (i, c) in ((0, 0), (self.pp - 1, len(n) - 1))
                        if x == 0 and not end and not isinstance(x, bool):
                            raise ConfigError(f"parallel.stage_layers[{i}][{c}]: must be a positive integer, got 0 "
                                              f"(only the model's first chunk, stage 0's first, and its last may "
                                              f"be empty)")
                        check_int(f"parallel.stage_layers[{i}][{c}]", x, minimum=0 if end else 1)
                    counts.append(tuple(n))
                else:
                    # One chunk a stage: the same as [n], so the model's end stages may hold no layer, as there
                    end = self.virtual_stages == 1 and i in (0, self.pp - 1)
                    if n == 0 and not end and not isinstance(n, bool):
                        raise ConfigError(f"parallel.stage_layers[{i}]: must be a positive integer, got 0 (only "
                                          f"the first and the last stage may be empty, without interleaving; "
                                          f"with virtual_stages give one count per chunk)")
                    check_int(f"parallel.stage_layers[{i}]", n, minimum=0 if end else 1)
                    counts.append(n)
            object.__setattr__(self, "stage_layers", tuple(counts))
            if len(self.stage_layers) != self.pp:
                raise ConfigError(f"parallel.stage_layers: {len(self.stage_layers)} counts for pp={self.pp} "
                                  f"pipeline stages; give one per stage")
            if self.first_stage_layers is not None or self.last_stage_layers is not None:
                raise ConfigError("parallel.stage_layers: give either stage_layers or first_stage_layers / "
                                  "last_stage_layers, not both")
        for f in ("first_stage_layers", "last_stage_layers"):
            if getattr(self, f) is not None:
                check_int(f"parallel.{f}", getattr(self, f))
                if self.pp < 2:
                    raise ConfigError(f"parallel.{f}: needs pp >= 2 (got pp={self.pp})")

    @property
    def world_size(self) -> int:
        """GPUs this configuration needs, ``tp * cp * pp * dp``."""
        return self.tp * self.cp * self.pp * self.dp

    @property
    def selective_modules(self) -> tuple[str, ...]:
        """What ``recompute: selective`` re-runs: :attr:`recompute_modules`, or ``(core_attn,)`` when not
        given; ``()`` unless selective (:func:`resolve_recompute_modules`)."""
        return resolve_recompute_modules(self.recompute, self.recompute_modules)

    @property
    def rank_order(self) -> tuple[str, ...]:
        """:attr:`placement` with ``cp`` right after ``tp`` where it does not name ``cp``."""
        if "cp" in self.placement:
            return self.placement
        i = self.placement.index("tp") + 1
        return self.placement[:i] + ("cp",) + self.placement[i:]

    @property
    def grad_dp(self) -> int:
        """Ranks that hold the same weights and reduce their gradients together: ``dp * cp`` (Megatron's
        data-parallel group with context parallelism; also the distributed optimizer's shards)."""
        return self.dp * self.cp

    @property
    def model_chunks(self) -> int:
        """Model chunks each pipeline rank holds: ``virtual_stages``, or 2 under ``dualpipe`` (its stage of
        the forward direction and its mirror stage ``pp - 1 - r`` of the reverse direction)."""
        return 2 if self.schedule == "dualpipe" else self.virtual_stages

    @property
    def weight_copies(self) -> int:
        """Copies of every weight along the pipeline: 2 under ``dualpipe`` (rank ``r`` and rank ``pp - 1 - r``
        both hold stages ``r`` and ``pp - 1 - r``, and sum their gradients), else 1."""
        return 2 if self.schedule == "dualpipe" else 1

    @property
    def sp(self) -> bool:
        """Sequence parallelism in effect (requested and ``tp > 1``)."""
        return self.sequence_parallel and self.tp > 1

    @property
    def num_micro_batches(self) -> int:
        """Micro-batches per replica per step, ``global_batch / (micro_batch * dp)``."""
        return num_micro_batches(self)

    @property
    def expert_tp(self) -> int:
        """The routed experts' tensor-parallel degree: ``etp``, or ``tp`` when unset."""
        return self.etp or self.tp

    def routed_tokens(self, seq_len: int) -> int:
        """Tokens each rank's router draws per micro-batch of ``seq_len``: its TP group's ``b·s`` with
        ``etp = tp`` (routed once per TP group, as :mod:`workloads.training` draws them), its own sequence-parallel
        ``b·(s/cp)/tp`` on the expert grid (``s/cp``: its context-parallel share of the sequence)."""
        if not self.expert_grid:
            return self.micro_batch * seq_len
        return self.micro_batch * (seq_len // self.cp) // (self.tp if self.sp else 1)

    @property
    def routers(self) -> int:
        """Routers sharing the tokens :meth:`routed_tokens` counts, each with its own capacity: the TP group's
        ``t`` ranks with ``etp = tp`` (Megatron-Core routes each rank's sequence-parallel share), else 1."""
        return 1 if self.expert_grid else self.tp

    @property
    def expert_grid(self) -> bool:
        """The experts have their own grid: ``etp`` differs from ``tp`` (EP groups may cross TP groups), or
        context parallelism (``cp > 1``: Megatron-Core's EP groups are drawn from a stage's DP x CP ranks, each
        routing its own ``s/cp`` tokens). A configuration alone: it does not know the model, so it is true for a
        dense model under CP too, where :meth:`size` ``("expert_dp")`` then reads ``cp*dp`` and the layout's expert
        groups are empty of experts; callers with a model ask ``model.is_moe and parallel.expert_grid`` (as
        :class:`workloads.training._StepBuilder` does) or read nothing expert-side for dense models (memory's
        routed parameters are 0)."""
        return self.expert_tp != self.tp or self.cp > 1

    def size(self, dim: str) -> int:
        """Degree of dimension ``dim`` (``tp``, ``cp``, ``dp``, ``pp``, ``ep`` or ``expert_dp``)."""
        if dim == "expert_dp":
            if self.expert_grid:
                return self.tp * self.cp * self.dp // (self.expert_tp * self.ep)
            return self.dp // self.ep
        check_choice("dim", dim, COORDS + ("ep", "expert_dp"))
        return getattr(self, dim)


def num_micro_batches(parallel: ParallelConfig) -> int:
    """Micro-batches each DP replica runs per step, ``B / (b * dp)`` (floor)."""
    return parallel.global_batch // (parallel.micro_batch * parallel.dp)  # type: ignore[operator]


def padded_vocab(vocab: int, tp: int, divisible_by: int = VOCAB_DIVISIBLE_BY) -> int:
    """Vocabulary padded to a multiple of ``divisible_by * tp`` (Megatron-LM).

    Examples
    --------
    >>> padded_vocab(50257, 8)
    51200
    """
    multiple = divisible_by * tp
    return -(-vocab // multiple) * multiple


def layers_per_stage(num_layers: int, parallel: ParallelConfig) -> tuple[int, ...]:
    """Transformer layers of each pipeline stage: ``parallel.stage_layers``, Megatron's first/last-stage
    counts with the rest split evenly over the middle stages, or ``num_layers / pp`` each.

    Does not validate (:func:`validate` does): with counts that do not add up the result is what the
    fields say.

    Examples
    --------
    >>> layers_per_stage(126, ParallelConfig(pp=16, first_stage_layers=7, last_stage_layers=7))[:3]
    (7, 8, 8)
    """
    p = parallel.pp
    if parallel.stage_layers is not None:
        return tuple(n if isinstance(n, int) else sum(n) for n in parallel.stage_layers)
    first, last = parallel.first_stage_layers, parallel.last_stage_layers
    middle = p - (first is not None) - (last is not None)
    rest = num_layers - (first or 0) - (last or 0)
    each = rest // middle if middle else 0
    counts = [each] * p
    if first is not None:
        counts[0] = first
    if last is not None:
        counts[-1] = last
    return tuple(counts)


def chunk_layers(num_layers: int, parallel: ParallelConfig, stage: int, chunk: int = 0) -> list[int]:
    """0-based indices of the layers of model chunk ``chunk`` of pipeline stage ``stage``.

    Stage ``i`` holds ``n_i`` layers (:func:`layers_per_stage`), ``n_i / v`` in
    each of its ``v`` chunks; virtual stage ``j = c p + i`` takes the next
    layers in order of ``j`` (Megatron-Core's ``get_transformer_layer_offset``).
    With even stages chunk ``c`` of stage ``i`` is the ``(c p + i)``-th block
    of ``num_layers / (p v)`` layers. Under ``dualpipe`` chunk 0 of rank
    ``i`` is model stage ``i`` and chunk 1 model stage ``p - 1 - i``.
    """
    p, v = parallel.pp, parallel.model_chunks
    if not 0 <= stage < p:
        raise ConfigError(f"stage: {stage} is outside 0..{p - 1}")
    if not 0 <= chunk < v:
        raise ConfigError(f"chunk: {chunk} is outside 0..{v - 1}")
    if parallel.schedule == "dualpipe":
        counts = layers_per_stage(num_layers, parallel)
        s = stage if chunk == 0 else p - 1 - stage
        return list(range(sum(counts[:s]), sum(counts[:s + 1])))
    given = parallel.stage_layers or ()
    per = [given[i] if i < len(given) and not isinstance(given[i], int) else (n // v,) * v
           for i, n in enumerate(layers_per_stage(num_layers, parallel))]  # per[stage][chunk]
    j = chunk * p + stage
    start = sum(per[k % p][k // p] for k in range(j))
    return list(range(start, start + per[stage][chunk]))


def stage_layers(num_layers: int, parallel: ParallelConfig, stage: int) -> list[int]:
    """0-based indices of the layers pipeline stage ``stage`` holds, chunk after chunk (:func:`chunk_layers`).

    Without interleaving stage ``i`` holds a contiguous block of layers; with
    ``v`` virtual stages the model is cut into ``pp * v`` chunks and stage
    ``i`` holds chunks ``i, i + pp, i + 2 pp, ...``. Under ``dualpipe`` stage
    ``i`` holds model stages ``i`` and ``pp - 1 - i``.
    """
    return [i for c in range(parallel.model_chunks) for i in chunk_layers(num_layers, parallel, stage, c)]


# ------------------------------------------------------------------ loading
_PARALLEL_FIELDS = tuple(f.name for f in fields(ParallelConfig))
_TRAINING_FIELDS = tuple(f.name for f in fields(TrainingSpec))


def parallel_from_dict(section: Mapping[str, object]) -> ParallelConfig:
    """Build a :class:`ParallelConfig` from the ``parallel:`` section (strict keys).

    Examples
    --------
    >>> parallel_from_dict({"tp": 8, "dp": 4, "placement": ["tp", "dp", "pp"]}).global_batch
    4
    """
    check_keys("parallel", section, _PARALLEL_FIELDS)
    return ParallelConfig(**section)  # type: ignore[arg-type]


def training_from_dict(section: Mapping[str, object]) -> TrainingSpec:
    """Build a :class:`TrainingSpec` from the ``training:`` section (strict keys)."""
    check_keys("training", section, _TRAINING_FIELDS)
    return TrainingSpec(**section)  # type: ignore[arg-type]


# --------------------------------------------------------------- validation
def _valid_list(values: Sequence[int], limit: int = 12) -> str:
    shown = ", ".join(str(v) for v in values[:limit])
    return shown + (", ..." if len(values) > limit else "")


def tp_split_widths(model: ModelSpec) -> list[tuple[str, int]]:
    """``(model field, width)`` of every width tensor parallelism splits, which a TP degree must divide: the
    heads, the key/value heads, the MLP width and a MoE model's expert width."""
    widths = [("heads", model.heads), ("kv_heads", model.kv_heads), ("ffn_hidden", model.ffn_hidden)]
    if model.is_moe:
        widths.append(("moe_ffn_hidden", model.expert_ffn_hidden))
    return widths


def _valid_tp(model: ModelSpec) -> list[int]:
    widths = tp_split_widths(model)
    return [d for d in divisors(model.heads) if all(w % d == 0 for _field, w in widths)]


def _check_tp(model: ModelSpec, parallel: ParallelConfig, training: TrainingSpec) -> None:
    t = parallel.tp
    for field, value in tp_split_widths(model):
        if value % t:
            what = "the expert width " if field == "moe_ffn_hidden" else ""
            raise ConfigError(f"parallel.tp: {t} does not divide {what}model.{field}={value}; valid tp values: "
                              f"{_valid_list(_valid_tp(model))}")
    if parallel.sp and parallel.cp == 1 and training.seq_len % t:
        raise ConfigError(f"training.seq_len: {training.seq_len} is not a multiple of parallel.tp={t}, "
                          f"which sequence_parallel needs")


def _check_stages(model: ModelSpec, parallel: ParallelConfig) -> None:
    """Uneven stages: counts that add up to the model's layers, each a positive multiple of ``v``."""
    p, v, n = parallel.pp, parallel.virtual_stages, model.layers
    if parallel.stage_layers is not None:
        counts = layers_per_stage(n, parallel)
        if sum(counts) != n:
            raise ConfigError(f"parallel.stage_layers: {list(counts)} layers per stage sum to {sum(counts)}, not "
                              f"model.layers={n}")
        for i, c in enumerate(counts):
            if isinstance(parallel.stage_layers[i], int) and c % v:
                raise ConfigError(f"parallel.stage_layers[{i}]: {c} layers cannot be split into "
                                  f"virtual_stages={v} equal chunks")
        return
    given = [(f, getattr(parallel, f)) for f in ("first_stage_layers", "last_stage_layers")
             if getattr(parallel, f) is not None]
    for f, c in given:
        if c % v:
            raise ConfigError(f"parallel.{f}: {c} layers cannot be split into virtual_stages={v} equal chunks")
    middle = p - len(given)
    rest = n - sum(c for _, c in given)
    if middle == 0 and rest:
        raise ConfigError(f"parallel.first_stage_layers: first + last stage layers = {n - rest}, but "
                          f"model.layers={n} and pp={p} leaves no middle stage for the other {rest}")
    if rest < 0 or (middle and rest < middle * v):
        # (the stages without a count of their own: the middle ones, and the last with first_stage_layers alone)
        raise ConfigError(f"parallel.{given[0][0]}: leaves {rest} of model.layers={n} for the {middle} other "
                          f"stage(s), which need at least virtual_stages={v} layers each")
    if middle and rest % (middle * v):
        raise ConfigError(f"parallel.{given[0][0]}: the {rest} remaining layers cannot be split evenly over the "
                          f"{middle} other stage(s) x virtual_stages={v}")


def _end_chunks_hint(layers: int, p: int, v: int) -> str:
    """The ``parallel.stage_layers`` of Megatron-Core's ``account_for_embedding_in_pipeline_split`` and
    ``account_for_loss_in_pipeline_split`` (the embedding and the loss each take a layer's place: ``layers + 2``
    split into ``p * v`` equal chunks, the model's first and last chunk one layer short), as the hint's clause;
    "" where ``layers + 2`` does not split so or there is no pipeline."""
    chunks = p * v
    if p < 2 or (layers + 2) % chunks:
        return ""
    k = (layers + 2) // chunks
    if v == 1:
        stages: list[object] = [k - 1] + [k] * (p - 2) + [k - 1]
    else:
        stages = [[k - 1] + [k] * (v - 1)] + [k * v] * (p - 2) + [[k] * (v - 1) + [k - 1]]
    shown = str(stages).replace(" ", "")
    return (f"; Megatron's account_for_embedding/loss_in_pipeline_split ({layers}+2 layers in {chunks} chunks) is "
            f"stage_layers: {shown}")


def _check_pipeline(model: ModelSpec, parallel: ParallelConfig) -> None:
    p, v, m = parallel.pp, parallel.virtual_stages, num_micro_batches(parallel)
    uneven = (parallel.stage_layers is not None or parallel.first_stage_layers is not None
              or parallel.last_stage_layers is not None)
    if uneven:
        _check_stages(model, parallel)
    elif model.layers % (p * v):
        valid = [d for d in divisors(model.layers) if (model.layers // d) % v == 0]
        hint = _end_chunks_hint(model.layers, p, v)
        if not valid:  # v itself does not divide the layers: no pp can help
            raise ConfigError(f"parallel.virtual_stages: {v} does not divide model.layers={model.layers}, so no "
                              f"pp splits it into pp*virtual_stages equal chunks; valid virtual_stages: "
                              f"{_valid_list(divisors(model.layers))} (or give parallel.stage_layers{hint})")
        raise ConfigError(f"parallel.pp: model.layers={model.layers} cannot be split into pp*virtual_stages="
                          f"{p}*{v} equal chunks; valid pp values for virtual_stages={v}: {_valid_list(valid)} "
                          f"(or give parallel.stage_layers{hint})")
    if parallel.schedule == "interleaved":
        if v < 2:
            raise ConfigError("parallel.virtual_stages: the interleaved schedule needs virtual_stages >= 2, "
                              f"got {v}")
        if p < 2:
            raise ConfigError("parallel.schedule: interleaved needs pp >= 2; use 1f1b for pp=1")
        n = parallel.microbatch_group_size
        if n is None:
            if m % p:
                fits = group_sizes(p, m)
                other = (f", or set parallel.microbatch_group_size (Megatron-Core; valid: {_valid_list(fits)})"
                         if fits else "")
                raise ConfigError(f"parallel.global_batch: the interleaved schedule needs the number of "
                                  f"micro-batches ({m}) to be a multiple of pp={p} (Megatron-LM){other}")
        elif (problem := group_size_problem(p, m, n)) is not None:
            raise ConfigError(f"parallel.microbatch_group_size: {n} {problem}")
    elif parallel.microbatch_group_size is not None:
        raise ConfigError(f"parallel.microbatch_group_size: needs schedule: interleaved "
                          f"(schedule is {parallel.schedule}); leave it out")
    elif v != 1:
        raise ConfigError(f"parallel.virtual_stages: {v} needs schedule: interleaved "
                          f"(schedule is {parallel.schedule}); use virtual_stages: 1")
    if parallel.schedule == "dualpipe":
        _check_dualpipe(model, parallel, m)
    if parallel.schedule == "zb-h1":
        if m < p:
            raise ConfigError(f"parallel.global_batch: the zb-h1 schedule needs at least pp={p} micro-batches, "
                              f"got {m}")
        if model.is_moe:
            raise ConfigError(f"parallel.schedule: zb-h1 is modelled for dense models (model.experts="
                              f"{model.experts})")
        if parallel.zero >= 2:
            raise ConfigError(f"parallel.schedule: zb-h1 is modelled with DDP / the distributed optimizer "
                              f"(zero 0 or 1), not zero: {parallel.zero}")


def _check_dualpipe(model: ModelSpec, parallel: ParallelConfig, m: int) -> None:
    """DualPipe's requirements (the reference asserts an even pp and an even m >= 2 pp) and what is not
    modelled with it."""
    p = parallel.pp
    if p < 2 or p % 2:
        raise ConfigError(f"parallel.pp: the dualpipe schedule needs an even pp >= 2, got {p}")
    if m % 2 or m < 2 * p:
        raise ConfigError(f"parallel.global_batch: the dualpipe schedule needs an even number of micro-batches, at "
                          f"least 2*pp={2 * p} (half enter at each end), got {m}")
    if parallel.zero >= 2:
        raise ConfigError(f"parallel.schedule: dualpipe is modelled with DDP / the distributed optimizer "
                          f"(zero 0 or 1), not zero: {parallel.zero}")
    if parallel.cp > 1:
        raise ConfigError(f"parallel.cp: context parallelism is not modelled with schedule: dualpipe "
                          f"(cp={parallel.cp})")
    if parallel.overlap_param_gather:
        raise ConfigError("parallel.overlap_param_gather: not modelled with schedule: dualpipe")


def _check_batch(parallel: ParallelConfig) -> None:
    per_step = parallel.micro_batch * parallel.dp
    if parallel.global_batch % per_step:  # type: ignore[operator]
        raise ConfigError(f"parallel.global_batch: {parallel.global_batch} is not a multiple of "
                          f"micro_batch*dp={parallel.micro_batch}*{parallel.dp}={per_step}")


def _check_expert_tp(model: ModelSpec, parallel: ParallelConfig) -> None:
    etp = parallel.etp
    if etp is None or etp == parallel.tp:
        return
    if not model.is_moe:
        raise ConfigError(f"parallel.etp: {etp} needs a mixture-of-experts model (model.experts > 0); leave it unset")
    if parallel.ep == 1:
        raise ConfigError(f"parallel.etp: {etp} differs from tp={parallel.tp}; that is modelled with expert "
                          f"parallelism (ep > 1)")
    if model.expert_ffn_hidden % etp:
        raise ConfigError(f"parallel.etp: {etp} does not divide the expert width "
                          f"model.moe_ffn_hidden={model.expert_ffn_hidden}")
    ranks = parallel.tp * parallel.cp * parallel.dp
    if ranks % (etp * parallel.ep):
        raise ConfigError(f"parallel.etp: etp*ep = {etp}*{parallel.ep} does not divide the {ranks} ranks of a pipeline "
                          f"stage (tp*cp*dp); Megatron-Core's expert-data-parallel size is tp*cp*dp/(etp*ep)")
    if parallel.zero >= 2:
        raise ConfigError(f"parallel.etp: a separate expert TP is modelled with zero 0 or 1 (Megatron's "
                          f"distributed optimizer), got zero: {parallel.zero}")


def _check_experts(model: ModelSpec, parallel: ParallelConfig) -> None:
    ep = parallel.ep
    if model.is_moe and parallel.tp > 1 and not parallel.sequence_parallel:
        # Megatron-Core's MoELayer.forward raises in training: "performance may degrade if MoE and tensor
        # parallelism are enabled without also enabling sequence parallelism" (each TP rank routes its shard;
        # with or without expert parallelism, a separate expert TP or not)
        raise ConfigError(f"parallel.sequence_parallel: a mixture-of-experts model with tensor parallelism "
                          f"(tp: {parallel.tp}) needs sequence_parallel: true (as Megatron-Core requires)")
    _check_expert_tp(model, parallel)
    if ep == 1:
        return
    if not model.is_moe:
        raise ConfigError(f"parallel.ep: {ep} needs a mixture-of-experts model (model.experts > 0); use ep: 1")
    ranks = parallel.tp * parallel.cp * parallel.dp
    # On the expert grid EP is folded into a stage's tp*cp*dp ranks (etp*ep must divide them), else into DP
    fits = ((lambda d: ranks % (parallel.expert_tp * d) == 0) if parallel.expert_grid else
            (lambda d: parallel.dp % d == 0))
    valid = _valid_list([d for d in divisors(model.experts) if fits(d)])
    if model.experts % ep:
        raise ConfigError(f"parallel.ep: {ep} does not divide model.experts={model.experts}; "
                          f"valid ep values: {valid}")
    if parallel.cp > 1 and ranks % (parallel.expert_tp * ep):
        raise ConfigError(f"parallel.ep: etp*ep = {parallel.expert_tp}*{ep} does not divide the {ranks} ranks of a "
                          f"pipeline stage (tp*cp*dp), which Megatron-Core's expert grid folds EP into under "
                          f"context parallelism; valid ep values: {valid}")
    if parallel.dp % ep and not parallel.expert_grid:
        raise ConfigError(f"parallel.ep: {ep} does not divide parallel.dp={parallel.dp} (expert parallelism "
                          f"lives inside data parallelism); valid ep values: {valid}")


_ZERO_STAGES_OF = {"megatron": (0, 1), "deepspeed": (0, 1, 2, 3), "fsdp": (2, 3), "fsdp2": (2, 3)}


MAX_WORLD_SIZE = 262_144
"""The most GPUs a configuration may span (the cluster builder's limit)."""
MAX_MICRO_BATCHES = 65_536
"""The most micro-batches per replica per step: the op graph grows with them (``global_batch: 1e15``)."""
MAX_SEQ_LEN = 1 << 24
"""The longest sequence (tokens) accepted."""


def _check_limits(parallel: ParallelConfig, training: TrainingSpec) -> None:
    if parallel.world_size > MAX_WORLD_SIZE:
        raise ConfigError(f"parallel: tp*pp*dp = {parallel.world_size:,} GPUs exceeds the supported "
                          f"{MAX_WORLD_SIZE:,}")
    m = num_micro_batches(parallel)
    if m > MAX_MICRO_BATCHES:
        raise ConfigError(f"parallel.global_batch: {parallel.global_batch:,} makes {m:,} micro-batches per replica "
                          f"(global_batch / (micro_batch * dp)); the supported maximum is {MAX_MICRO_BATCHES:,}")
    if training.seq_len > MAX_SEQ_LEN:
        raise ConfigError(f"training.seq_len: {training.seq_len:,} exceeds the supported {MAX_SEQ_LEN:,}")


def _check_sync(parallel: ParallelConfig) -> None:
    if parallel.dp_sync == "parameter_server" and parallel.zero:
        raise ConfigError(f"parallel.zero: {parallel.zero} cannot shard state under dp_sync: parameter_server; "
                          f"use zero: 0 or dp_sync: allreduce")
    impl = parallel.zero_impl
    if impl != "auto" and parallel.zero not in _ZERO_STAGES_OF[impl]:
        fits = [k for k, v in _ZERO_STAGES_OF.items() if parallel.zero in v]
        raise ConfigError(f"parallel.zero_impl: {impl} runs ZeRO stages {list(_ZERO_STAGES_OF[impl])}, not "
                          f"zero: {parallel.zero}; valid for it: {', '.join(['auto'] + fits)}")
    if parallel.zero_grad_sync == "step" and impl == "deepspeed" and parallel.zero >= 2:
        raise ConfigError("parallel.zero_grad_sync: DeepSpeed ZeRO-2/3 reduce gradients every micro-batch "
                          "(no_sync is not supported); valid: auto, micro_batch")


def _check_fp8(parallel: ParallelConfig, training: TrainingSpec) -> None:
    if not training.fp8:
        return
    impl = parallel.zero_impl if parallel.zero_impl != "auto" else ("megatron" if parallel.zero <= 1 else "deepspeed")
    if impl != "megatron":
        raise ConfigError(f"training.dtype: fp8 is modelled as Transformer Engine under Megatron-Core (DDP or the "
                          f"distributed optimizer: parallel.zero 0 or 1, zero_impl auto or megatron); got zero: "
                          f"{parallel.zero}, zero_impl: {parallel.zero_impl}")
    if training.fp8_param_gather and parallel.zero != 1:
        raise ConfigError(f"training.fp8_param_gather: Megatron gathers FP8 parameters in its distributed optimizer; "
                          f"needs parallel.zero: 1 (got {parallel.zero})")


def _check_context(model: ModelSpec, parallel: ParallelConfig, training: TrainingSpec) -> None:
    c, t, s = parallel.cp, parallel.tp, training.seq_len
    if c == 1:
        return
    if parallel.zero >= 2:
        raise ConfigError(f"parallel.cp: context parallelism is modelled with Megatron's DDP / distributed "
                          f"optimizer (zero 0 or 1), not zero: {parallel.zero}")
    if parallel.cp_comm_type != "a2a":
        chunks = 2 * c * (t if parallel.sp else 1)
        if s % chunks:
            raise ConfigError(f"training.seq_len: {s} is not a multiple of 2*cp{'*tp' if parallel.sp else ''} = "
                              f"{chunks}, which context parallelism's causal load balancing needs")
    else:
        if s % (c * (t if parallel.sp else 1)):
            raise ConfigError(f"training.seq_len: {s} is not a multiple of cp{'*tp' if parallel.sp else ''} = "
                              f"{c * (t if parallel.sp else 1)}")
        for field, heads in (("heads", model.heads), ("kv_heads", model.kv_heads)):
            if (heads // t) % c:
                raise ConfigError(f"parallel.cp: {c} does not divide the {heads // t} model.{field} of a TP rank "
                                  f"(model.{field}={heads}, tp={t}), which cp_comm_type: a2a splits over CP; "
                                  f"use cp_comm_type: p2p")


def _check_overlap(model: ModelSpec, parallel: ParallelConfig) -> None:
    """Megatron-Core's communication overlaps: what they need, and what is not modelled with them."""
    if parallel.tp_comm_overlap:
        if parallel.schedule in ("zb-h1", "dualpipe"):
            raise ConfigError(f"parallel.tp_comm_overlap: not modelled with schedule: {parallel.schedule} (its bulk "
                              f"overlaps pair each data gradient with its weight gradient, which a split backward "
                              f"postpones)")
        if not parallel.sp:
            raise ConfigError(f"parallel.tp_comm_overlap: needs sequence_parallel with tp > 1 (Megatron asserts it); "
                              f"got tp={parallel.tp}, sequence_parallel={parallel.sequence_parallel}")
        if model.is_moe:
            raise ConfigError("parallel.tp_comm_overlap: userbuffer overlap is modelled for dense models; "
                              f"model.experts={model.experts}")
        if model.is_mla:
            # Megatron-Core's TELinear sets the shared config's tp_comm_overlap to False for a buffer name TE does
            # not know (q_down_proj, kv_down_proj, ...: megatron/core/extensions/transformer_engine.py, since
            # NVIDIA/Megatron-LM commit 4e6ae3a2, 2025-04; TE asserted on the missing name before)
            raise ConfigError(f"parallel.tp_comm_overlap: Megatron-Core turns userbuffer overlap off for multi-head "
                              f"latent attention (model.kv_lora_rank={model.kv_lora_rank}); set tp_comm_overlap: false")
        if parallel.cp > 1:
            raise ConfigError(f"parallel.tp_comm_overlap: not modelled with context parallelism (cp={parallel.cp})")
        if parallel.zero >= 2:
            raise ConfigError(f"parallel.tp_comm_overlap: modelled with Megatron's DDP / distributed optimizer "
                              f"(zero 0 or 1), not zero: {parallel.zero}")
    if parallel.overlap_param_gather:
        impl = parallel.zero_impl
        if parallel.zero != 1 or impl not in ("auto", "megatron"):
            raise ConfigError(f"parallel.overlap_param_gather: overlaps the distributed optimizer's parameter "
                              f"all-gather; needs zero: 1 (zero_impl auto or megatron), got zero: {parallel.zero}, "
                              f"zero_impl: {impl}")
        if not parallel.overlap_grad_reduce:
            raise ConfigError("parallel.overlap_param_gather: needs overlap_grad_reduce: true (Megatron asserts it)")


def _check_positions(model: ModelSpec, training: TrainingSpec) -> None:
    if model.learned_positions and training.seq_len > model.max_seq_len:
        raise ConfigError(f"training.seq_len: {training.seq_len} exceeds model.max_seq_len={model.max_seq_len} "
                          f"of its learned position table")


def resolve_recompute_modules(recompute: str, modules: object) -> tuple[str, ...]:
    """``parallel.recompute_modules`` checked and resolved (see :class:`ParallelConfig`)."""
    if modules is None:
        return ("core_attn",) if recompute == "selective" else ()
    if isinstance(modules, str) or not isinstance(modules, Sequence):
        raise ConfigError(f"parallel.recompute_modules: must be a list such as [core_attn, layernorm], got "
                          f"{modules!r}")
    modules = tuple(modules)
    if modules and recompute != "selective":
        raise ConfigError(f"parallel.recompute_modules: needs parallel.recompute: selective (got {recompute!r})")
    for m in modules:
        check_choice("parallel.recompute_modules", m, RECOMPUTE_MODULES)
    if len(set(modules)) != len(modules):
        raise ConfigError(f"parallel.recompute_modules: {list(modules)} names a module twice")
    return modules


def validate(model: ModelSpec, parallel: ParallelConfig, training: TrainingSpec,
             world_size: int | None = None) -> None:
    """Raise :class:`ConfigError` if the combination cannot be trained.

    Parameters
    ----------
    model, parallel, training
        The three workload sections.
    world_size : int, optional
        GPUs in the cluster; must equal ``tp * pp * dp`` when given.

    Raises
    ------
    ConfigError
        One message for the first impossible combination found: world size,
        TP vs heads / kv_heads / ffn (and SP vs seq_len), PP vs layers and
        schedule, batch divisibility, EP vs experts and dp, parameter-server vs
        ZeRO, FP8 vs the data-parallel implementation, context parallelism vs
        sequence length, heads and the rest of the layout, communication
        overlaps vs what they need, sequence length vs a learned position
        table.
    """
    if world_size is not None:
        check_int("cluster world size", world_size)
        if parallel.world_size != world_size:
            shard = parallel.tp * parallel.cp * parallel.pp
            rest = world_size // shard
            hint = (f"; dp={rest} would fit" if world_size % shard == 0 else "")
            cp = ("cp*", f"{parallel.cp}*") if parallel.cp > 1 else ("", "")
            raise ConfigError(f"parallel: tp*{cp[0]}pp*dp = {parallel.tp}*{cp[1]}{parallel.pp}*{parallel.dp} = "
                              f"{parallel.world_size} does not equal the cluster's {world_size} GPUs{hint}")
    if "mla_up_proj" in parallel.selective_modules and not model.is_mla:
        raise ConfigError(f"parallel.recompute_modules: mla_up_proj needs multi-head latent attention "
                          f"(model.kv_lora_rank); {model.name} has standard attention")
    if "moe_act" in parallel.selective_modules and not model.experts:
        raise ConfigError(f"parallel.recompute_modules: moe_act needs a MoE model; {model.name} has no experts")
    _check_limits(parallel, training)
    _check_tp(model, parallel, training)
    _check_batch(parallel)
    _check_pipeline(model, parallel)
    _check_experts(model, parallel)
    _check_sync(parallel)
    _check_fp8(parallel, training)
    _check_context(model, parallel, training)
    _check_overlap(model, parallel)
    _check_positions(model, training)


# ----------------------------------------------------------------- placement
class RankCoords(NamedTuple):
    """Coordinates of one global rank (``cp`` last, so that ``(tp, dp, pp)`` unpacking of the first three
    still reads as before context parallelism)."""

    tp: int
    dp: int
    pp: int
    cp: int = 0


class RankLayout:
    """Global rank <-> ``(tp, dp, pp, cp)`` coordinates, and the communication groups.

    Ranks enumerate the dimensions of ``parallel.placement`` innermost first:
    with the default ``("tp", "dp", "pp")`` (Megatron) consecutive ranks form
    a TP group, TP groups then step through CP (:attr:`ParallelConfig.rank_order`),
    then DP, and PP is outermost.

    Examples
    --------
    >>> lay = RankLayout(ParallelConfig(tp=2, dp=2, pp=2))
    >>> lay.coords(5)
    RankCoords(tp=1, dp=0, pp=1, cp=0)
    >>> lay.tp_group(5), lay.dp_group(5), lay.pp_group(5)
    ((4, 5), (5, 7), (1, 5))
    """

    def __init__(self, parallel: ParallelConfig) -> None:
        self.parallel = parallel
        self.world_size = parallel.world_size
        self._stride: dict[str, int] = {}
        stride = 1
        for dim in parallel.rank_order:
            self._stride[dim] = stride
            stride *= parallel.size(dim)
        # the degrees, looked up once: a step generator asks for coordinates and groups at every rank
        self._size = {dim: parallel.size(dim) for dim in COORDS}

    def _check(self, rank: int) -> None:
        if not 0 <= rank < self.world_size:
            raise ConfigError(f"rank: {rank} is outside 0..{self.world_size - 1}")

    def coords(self, rank: int) -> RankCoords:
        """The ``(tp, dp, pp)`` coordinates of global ``rank``."""
        self._check(rank)
        st, size = self._stride, self._size
        return RankCoords(tp=rank // st["tp"] % size["tp"], dp=rank // st["dp"] % size["dp"],
                          pp=rank // st["pp"] % size["pp"], cp=rank // st["cp"] % size["cp"])

    def rank(self, tp: int = 0, dp: int = 0, pp: int = 0, cp: int = 0) -> int:
        """The global rank at coordinates ``(tp, dp, pp, cp)``."""
        size, st = self._size, self._stride
        if not (0 <= tp < size["tp"] and 0 <= dp < size["dp"] and 0 <= pp < size["pp"] and 0 <= cp < size["cp"]):
            for dim, value in (("tp", tp), ("dp", dp), ("pp", pp), ("cp", cp)):
                if not 0 <= value < size[dim]:
                    raise ConfigError(f"{dim}: {value} is outside 0..{size[dim] - 1}")
        return tp * st["tp"] + dp * st["dp"] + pp * st["pp"] + cp * st["cp"]

    def _along(self, rank: int, dim: str, indices: range | Sequence[int]) -> tuple[int, ...]:
        """The ranks with ``rank``'s coordinates but index ``i`` along ``dim``, for each of ``indices``."""
        stride, size = self._stride[dim], self._size[dim]
        base = rank - getattr(self.coords(rank), dim) * stride
        for i in indices:
            if not 0 <= i < size:
                raise ConfigError(f"{dim}: {i} is outside 0..{size - 1}")
        return tuple(base + i * stride for i in indices)

    def tp_group(self, rank: int) -> tuple[int, ...]:
        """Ranks sharing ``rank``'s DP and PP coordinates, by TP index."""
        return self._along(rank, "tp", range(self.parallel.tp))

    def dp_group(self, rank: int) -> tuple[int, ...]:
        """Ranks sharing ``rank``'s TP, CP and PP coordinates, by DP index."""
        return self._along(rank, "dp", range(self.parallel.dp))

    def cp_group(self, rank: int) -> tuple[int, ...]:
        """Ranks sharing ``rank``'s TP, DP and PP coordinates, by CP index (the ring of ring attention)."""
        return self._along(rank, "cp", range(self.parallel.cp))

    def grad_group(self, rank: int) -> tuple[int, ...]:
        """The ranks that hold ``rank``'s weights: its DP x CP ranks, DP-major (Megatron's data-parallel group
        with context parallelism); the DP group without CP."""
        if self.parallel.cp == 1:
            return self.dp_group(rank)
        return tuple(x for d in self.dp_group(rank) for x in self.cp_group(d))

    def pp_group(self, rank: int) -> tuple[int, ...]:
        """Ranks sharing ``rank``'s TP, CP and DP coordinates, ordered by stage."""
        return self._along(rank, "pp", range(self.parallel.pp))

    def ep_group(self, rank: int) -> tuple[int, ...]:
        """The ``ep`` consecutive DP ranks of ``rank``'s expert-parallel block (expert grid: the ranks with
        ``rank``'s expert-TP and expert-DP indices, by EP index)."""
        ep = self.parallel.ep
        if self.parallel.expert_grid:
            etp_i, _ep_i, edp_i = self.expert_coords(rank)
            return self._expert_ranks(rank, [etp_i + self.parallel.expert_tp * (j + ep * edp_i) for j in range(ep)])
        start = self.coords(rank).dp // ep * ep
        return self._along(rank, "dp", range(start, start + ep))

    def expert_dp_group(self, rank: int) -> tuple[int, ...]:
        """DP ranks holding the same experts as ``rank`` (same EP index), by DP index (expert grid: the ranks
        with ``rank``'s expert-TP and EP indices, by expert-DP index)."""
        ep = self.parallel.ep
        if self.parallel.expert_grid:
            etp, (etp_i, ep_i, _edp_i) = self.parallel.expert_tp, self.expert_coords(rank)
            return self._expert_ranks(rank, [etp_i + etp * (ep_i + ep * j)
                                             for j in range(self.parallel.size("expert_dp"))])
        return self._along(rank, "dp", range(self.coords(rank).dp % ep, self.parallel.dp, ep))

    def etp_group(self, rank: int) -> tuple[int, ...]:
        """The expert-tensor-parallel group of ``rank``: its TP group when ``etp = tp``; on the expert grid the
        ``etp`` ranks with ``rank``'s EP and expert-DP indices."""
        if not self.parallel.expert_grid:
            return self.tp_group(rank)
        etp, (_etp_i, ep_i, edp_i) = self.parallel.expert_tp, self.expert_coords(rank)
        base = etp * (ep_i + self.parallel.ep * edp_i)
        return self._expert_ranks(rank, [base + i for i in range(etp)])

    def expert_coords(self, rank: int) -> tuple[int, int, int]:
        """``(etp, ep, edp)`` indices of ``rank`` on Megatron-Core's expert grid: its index in the pipeline stage
        in Megatron order (``tp`` innermost, then ``cp``, then ``dp``) read as ``etp`` innermost, then ``ep``, then
        the expert-data-parallel index."""
        c, par = self.coords(rank), self.parallel
        local = c.tp + par.tp * (c.cp + par.cp * c.dp)
        etp = par.expert_tp
        return local % etp, local // etp % par.ep, local // (etp * par.ep)

    def _expert_ranks(self, rank: int, locals_: Sequence[int]) -> tuple[int, ...]:
        """Global ranks of the stage-local Megatron-order indices ``locals_`` on ``rank``'s pipeline stage."""
        par, pp = self.parallel, self.coords(rank).pp
        return tuple(self.rank(tp=i % par.tp, cp=i // par.tp % par.cp, dp=i // (par.tp * par.cp), pp=pp)
                     for i in locals_)

    def all_groups(self, dim: str) -> list[tuple[int, ...]]:
        """Every group of ``dim`` (``tp``, ``cp``, ``dp``, ``pp``, ``ep``, ``expert_dp``, ``etp``, ``grad``), in
        order of first rank."""
        check_choice("dim", dim, COORDS + ("ep", "expert_dp", "etp", "grad"))
        group_of = getattr(self, f"{dim}_group")
        seen: set[int] = set()
        groups = []
        for r in range(self.world_size):
            if r not in seen:
                g = group_of(r)
                seen.update(g)
                groups.append(g)
        return groups
