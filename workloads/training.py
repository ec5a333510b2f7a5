"""One training step of a dense (or MoE) transformer as per-rank op graphs.

:func:`training_step` turns a model, a parallel configuration and a training
spec into an :class:`~workloads.ops.OpGraph`. It is the only place that knows
what DP, TP, PP and ZeRO mean; the simulator just runs the ops.

What each rank runs (Megatron-LM semantics)
-------------------------------------------
Pipeline
    The actions of :func:`~workloads.schedules.pipeline_schedule` (GPipe, 1F1B
    or interleaved 1F1B) in order. A forward of virtual stage ``j > 0`` waits
    for the activation from stage ``j - 1`` (a send/recv of ``b·s·h``
    elements, ``/ tp`` with sequence parallelism); a backward of ``j < last``
    waits for the activation gradient from ``j + 1``. Activations and
    gradients travel on their own streams and tags, so they never block each
    other; sends are asynchronous to compute.
Tensor parallel
    Megatron column/row split. Per layer, forward: two all-reduces of
    ``b·s·h`` elements (with sequence parallelism: two all-gathers and two
    reduce-scatters of the same size); backward: the same count again; full
    recomputation repeats the forward's. The vocab-parallel embedding adds
    one forward all-reduce (reduce-scatter with SP, all-gather back in
    backward) on the first stage; the output layer on the last stage adds the
    all-reduce of its input gradient in backward (with SP: an all-gather
    before it in forward, a reduce-scatter in backward). TP collectives run
    on the compute stream: Megatron does not overlap them with compute.
Data parallel
    Gradients (``grad_dtype_bytes`` per element, default the training dtype)
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

from collections.abc import Sequence
from dataclasses import dataclass, field

from .errors import ConfigError
from .flops import (
    LayerOp,
    accumulate_gradients,
    embedding_ops,
    hardware_flops_per_step,
    layer_ops,
    logits_ops,
    model_flops_per_step,
    optimizer_step_ops,
)
from .memory import stage_params
from .models import ModelSpec
from .moe import LayerRouting, RoutingModel, route_layer
from .ops import Kernel, OpGraph
from .parallel import ParallelConfig, RankLayout, TrainingSpec, num_micro_batches, padded_vocab, stage_layers, validate
from .schedules import PipeAction, pipeline_schedule
from .sharding import (
    GatherSchedule,
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
        action waits until its previous sends have been received. Modelled
        for GPipe and 1F1B (Megatron's interleaved schedule batches its
        transfers differently; ``blocking`` is refused there). Default
        ``async``.
    pp_scatter_gather : bool
        Without sequence parallelism, each TP rank sends only its ``1/t`` of
        the activation (gradient) to the next (previous) stage and the
        receiving stage all-gathers it over TP (Megatron-LM's
        ``scatter_gather_tensors_in_pipeline``, Narayanan et al. SC'21,
        section 4.1): ``1/t`` of the scale-out bytes for one NVLink
        all-gather. Default True (Megatron-LM's default). With sequence
        parallelism the activation is already split and nothing is gathered.
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
        the wire; default the training dtype's (PyTorch DDP, DeepSpeed).
        Megatron-LM keeps and reduces bf16 gradients in fp32: set 4 to model
        that.
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
    """

    p2p: str = "async"
    pp_scatter_gather: bool = True
    grad_accumulation_fusion: bool = True
    granularity: str = "chunk"
    grad_dtype_bytes: int | None = None
    causal: bool = False
    flash_attention: bool = True
    embedding_and_loss: bool = True

    def __post_init__(self) -> None:
        if self.p2p not in P2P_MODES:
            raise ConfigError(f"options.p2p: {self.p2p!r} unknown; valid: {', '.join(P2P_MODES)}")
        if self.granularity not in GRANULARITIES:
            raise ConfigError(f"options.granularity: {self.granularity!r} unknown; valid: {', '.join(GRANULARITIES)}")
        if self.grad_dtype_bytes is not None and self.grad_dtype_bytes not in (1, 2, 4):
            raise ConfigError(f"options.grad_dtype_bytes: must be 1, 2 or 4, got {self.grad_dtype_bytes}")
        for name in ("causal", "flash_attention", "embedding_and_loss", "pp_scatter_gather",
                     "grad_accumulation_fusion"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"options.{name}: must be true or false, got {getattr(self, name)!r}")


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
    """MoE layer index → its token routing over an EP group (empty without expert parallelism)."""

    hardware_flops: float = 0.0
    """Model FLOPs plus the recomputed forward FLOPs, by the same counting convention (Narayanan et
    al.'s "hardware FLOPs", the HFU numerator): :func:`~workloads.flops.hardware_flops_per_step`."""

    @property
    def executed_flops(self) -> float:
        """FLOPs the GPUs execute (sum over compute ops): recomputation included, a causal FlashAttention
        kernel's masked half and dropped MoE tokens left out, its backward's recomputed ``Q Kᵀ`` in."""
        replicas = getattr(self.graph, "replicas", None)
        if replicas:  # a graph of representatives: each op runs on every rank its rank stands for
            return sum(op.flops * len(replicas[op.rank]) for op in self.graph.ops if op.kind == "compute")
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
    moe: tuple[list[LayerOp], list[LayerOp], list[LayerOp]] | None = None  # (before, experts, after) dispatch
    phase: str = "F"  # the pipeline pass it belongs to: "F" or "B"
    recompute: tuple[bool, ...] = ()  # per kernel: a forward kernel re-run in the backward (activation recompute)
    recompute_parts: tuple[Kernel, ...] = ()  # the recomputed kernels, run as their own op before ``parts``


def _scale_kernel(op: LayerOp, factor: float, tokens: int) -> Kernel:
    """``op`` run on ``factor`` times the ``tokens`` it was sized for (the token dimension of a GEMM scales)."""
    k = op.kernel()
    shape = k.shape
    if shape is not None:
        shape = tuple(max(1, round(d * factor)) if d == tokens else d for d in shape)
    return Kernel(k.category, k.flops * factor, k.nbytes * factor, shape, k.batch)


def _kernels(ops: Sequence[LayerOp]) -> tuple[Kernel, ...]:
    return tuple(o.kernel() for o in ops)


def _leading(n: int, total: int) -> list[bool]:
    """A mask of ``total`` kernels whose first ``n`` are recomputed."""
    return [True] * n + [False] * (total - n)


class _StepBuilder:
    def __init__(self, model: ModelSpec, parallel: ParallelConfig, training: TrainingSpec,
                 options: StepOptions, routing: RoutingModel | None = None) -> None:
        self.model, self.par, self.train, self.opt = model, parallel, training, options
        self.layout = RankLayout(parallel)
        self.m = num_micro_batches(parallel)
        self.p, self.v, self.t = parallel.pp, parallel.virtual_stages, parallel.tp
        self.sp = parallel.sp
        self.dtype = training.dtype_bytes
        self.plan = sharding_plan(parallel, training.dtype, options.grad_dtype_bytes)
        self.grad_bytes = self.plan.grad_bytes
        b, s, h = parallel.micro_batch, training.seq_len, model.hidden
        self.act_elems = b * s * h
        # With SP the activation between stages is already split over TP. Without it, Megatron's
        # scatter/gather optimisation (Narayanan et al. SC'21, section 4.1) sends 1/t per TP rank and
        # all-gathers it over NVLink on the receiving stage.
        self.pp_gather = self.t > 1 and not self.sp and options.pp_scatter_gather
        self.p2p_bytes = self.act_elems * self.dtype / (self.t if (self.sp or self.pp_gather) else 1)
        self.tp_bytes = self.act_elems * self.dtype
        self.graph = OpGraph(parallel.world_size)
        self.schedules = pipeline_schedule(parallel.schedule, self.p, self.m, self.v)
        self._segments_cache: dict[tuple, list[_Segment]] = {}
        self._tp_groups: dict[int, tuple[int, ...]] = {}
        self._ep_groups: dict[int, tuple[int, ...]] = {}
        self._moe_rows: dict[tuple[int, int], tuple[tuple[float, ...], tuple[float, ...]]] = {}
        self._moe_kernels: dict[int, tuple] = {}  # id(segment's MoE split) -> (split, kernels before, after)
        self._end_params: dict[int, float] = {}
        self.routing = routing or RoutingModel()
        self.expert_parallel = model.is_moe and parallel.ep > 1
        self.routes: dict[int, LayerRouting] = {}
        self._moe_parts: dict[tuple, tuple] = {}
        self._unit_segments: dict[tuple, list[tuple[_Segment, Unit, str]]] = {}
        self._traces: dict[int, tuple[list[list[int]], list[Use], GatherSchedule]] = {}

    # -------------------------------------------------------------- layers
    def chunk_layers(self, stage: int, chunk: int) -> list[int]:
        layers = stage_layers(self.model.layers, self.par, stage)
        per = len(layers) // self.v
        return layers[chunk * per:(chunk + 1) * per]

    def _tp_counts(self, n: int, phase: str, first: bool, last: bool) -> dict[str, int]:
        """TP collectives of ``n`` layers (+ embedding/output layer) for one pass."""
        if self.t == 1:
            return {}
        full = self.par.recompute == "full" and phase == "B"
        if not self.sp:
            # Forward: the vocab-parallel embedding's all-reduce (first stage). Backward: the all-reduce of
            # the output layer's input gradient (last stage; Megatron's copy_to_tensor_model_parallel_region).
            extra = (1 if first else 0) if phase == "F" else (1 if last else 0)
            return {"all_reduce": 2 * n * (2 if full else 1) + extra}
        ag = 2 * n * (2 if full else 1) + ((1 if last else 0) if phase == "F" else (1 if first else 0))
        rs = 2 * n * (2 if full else 1) + ((1 if first else 0) if phase == "F" else (1 if last else 0))
        return {"all_gather": ag, "reduce_scatter": rs}

    def end_params(self, stage: int, chunk: int) -> float:
        """Embedding / output-layer parameters (one TP rank) that virtual stage ``(stage, chunk)`` holds.

        They belong to the first (last) virtual stage: what :func:`stage_params` adds to the layers.
        """
        j = chunk * self.p + stage
        if j not in (0, self.p * self.v - 1):
            return 0.0
        if stage not in self._end_params:
            t, ep = self.t, self.par.ep
            dense_extra, _ = stage_params(self.model, self.par, stage)
            dense_layers = sum(self.model.params_per_layer(i, t, ep) - self.model.routed_expert_params(i, t, ep)
                               for i in stage_layers(self.model.layers, self.par, stage))
            self._end_params[stage] = dense_extra - dense_layers
        return self._end_params[stage]

    def _layer_pass(self, layer: int, phase: str) -> tuple[list[LayerOp], int]:
        """The kernels of one layer in one pass, and how many of them (at the front) are recomputed forward
        kernels (activation recomputation: all of the forward for ``full``, the attention core for
        ``selective``)."""
        ops = layer_ops(self.model, self.par.micro_batch, self.train.seq_len, self.t, layer=layer,
                        sequence_parallel=self.sp, dtype_bytes=self.dtype, causal=self.opt.causal,
                        flash_attention=self.opt.flash_attention)
        if phase == "F":
            return ops.forward, 0
        backward = accumulate_gradients(ops.backward, self.model.params_per_layer(layer, self.t, self.par.ep),
                                        self.grad_bytes, self.dtype, self.opt.grad_accumulation_fusion)
        recompute = self.par.recompute
        again = (ops.forward if recompute == "full" else
                 [o for o in ops.forward if o.name.startswith("attention")] if recompute == "selective" else [])
        return again + backward, len(again)

    def segments(self, stage: int, chunk: int, phase: str, per_layer: bool) -> list[_Segment]:
        """The compute segments of one forward/backward of one chunk (cached: identical for every micro-batch)."""
        key = (stage, chunk, phase, per_layer)
        if key in self._segments_cache:
            return self._segments_cache[key]
        layers = self.chunk_layers(stage, chunk)
        j = chunk * self.p + stage
        first, last = j == 0, j == self.p * self.v - 1
        mb, s, t = self.par.micro_batch, self.train.seq_len, self.t
        head: list[LayerOp] = []
        tail: list[LayerOp] = []
        ends = self.opt.embedding_and_loss
        if first and ends:
            emb = embedding_ops(self.model, mb, s, t, dtype_bytes=self.dtype)
            (head if phase == "F" else tail).extend(emb.forward if phase == "F" else emb.backward)
        if last and ends:
            out = logits_ops(self.model, mb, s, t, sequence_parallel=self.sp, dtype_bytes=self.dtype)
            (tail if phase == "F" else head).extend(out.forward if phase == "F" else out.backward)
        order = layers if phase == "F" else list(reversed(layers))
        emb_params = self.end_params(stage, chunk)
        first, last = first and ends, last and ends  # no embedding / output-layer TP collectives without them
        grads = {i: (self.model.params_per_layer(i, t, self.par.ep)
                     - self.model.routed_expert_params(i, t, self.par.ep),
                     self.model.routed_expert_params(i, t, self.par.ep)) for i in layers}
        gb = self.grad_bytes
        if per_layer or self.expert_parallel:
            segs = []
            for i in order:
                kernels, again = self._layer_pass(i, phase)
                segs.append(_Segment(kernels, self._tp_counts(1, phase, False, False), i, grads[i][0] * gb,
                                     grads[i][1] * gb, moe=self._moe_split(i, phase),
                                     recompute=tuple(_leading(again, len(kernels)))))
            if head:
                segs.insert(0, _Segment(head, {}, order[0]))
            if tail:
                segs.append(_Segment(tail, {}, order[-1]))
            # The embedding / output-layer collectives: counted on the last segment (order inside a pass
            # does not change its time).
            for kind, n in self._tp_counts(0, phase, first, last).items():
                segs[-1].tp[kind] = segs[-1].tp.get(kind, 0) + n
            segs[-1].grad_bytes += emb_params * gb
        else:
            kernels = list(head)
            again: list[bool] = [False] * len(head)
            for i in order:
                layer_kernels, n = self._layer_pass(i, phase)
                kernels += layer_kernels
                again += _leading(n, len(layer_kernels))
            kernels += tail
            again += [False] * len(tail)
            segs = [_Segment(kernels, self._tp_counts(len(layers), phase, first, last), order[0],
                             (sum(g[0] for g in grads.values()) + emb_params) * gb,
                             sum(g[1] for g in grads.values()) * gb, recompute=tuple(again))]
        for seg in segs:
            seg.phase = phase
        self._segments_cache[key] = segs
        return segs

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
            if end_seg:
                unit = ends["embedding" if any(module_of(k.name) == "embedding" for k in seg.kernels) else "output"]
                pieces = [(unit, phase, seg.kernels)]
            elif gran == "layer" or seg.moe is not None:
                unit = layer_units(self.model, seg.layer, t, ep, "layer")["layer"]
                pieces = [(unit, phase, seg.kernels)]
            else:
                units = layer_units(self.model, seg.layer, t, ep, "module")
                pieces = []
                waiting: list[LayerOp] = []
                for op in seg.kernels:
                    mod = module_of(op.name)
                    use = "F" if phase == "F" else ("B" if "." in op.name else "R")
                    if mod is None:
                        (pieces[-1][2] if pieces else waiting).append(op)
                    elif pieces and pieces[-1][0] is units[mod] and pieces[-1][1] == use:
                        pieces[-1][2].append(op)
                    else:
                        pieces.append((units[mod], use, waiting + [op]))
                        waiting = []
            modules = not end_seg and gran != "layer" and seg.moe is None
            # persistent parameters (module granularity) are reduced, never gathered: a layer's norms with its
            # first backward module; the final norm with a tied output layer (which is the embedding unit)
            persistent = (self.model.norm_params() if modules else
                          self.model.final_norm_params() if end_seg and unit.key == ("embedding",)
                          and any(k.name.startswith("final_norm") for k in seg.kernels) else 0)
            for i, (unit, use, ops) in enumerate(pieces):
                extra = persistent and use == "B" and i == next(k for k, p in enumerate(pieces) if p[1] == "B")
                whole = len(pieces) == 1 and len(ops) == len(seg.kernels)
                again = seg.recompute if whole else (use == "R",) * len(ops)
                sub = _Segment(list(ops), dict(seg.tp) if i == len(pieces) - 1 else {}, seg.layer,
                               persistent * gb if extra else 0.0, moe=seg.moe, phase=phase, recompute=again)
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
        overlap, one blocking collective per parameter tensor on the compute stream."""
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
        count = 1 if plan.overlap else tensors
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
    def _moe_split(self, layer: int, phase: str) -> tuple[list[LayerOp], list[LayerOp], list[LayerOp]] | None:
        """A MoE layer's kernels cut at the two all-to-alls: (before dispatch, experts, after combine)."""
        if not (self.expert_parallel and self.model.is_moe_layer(layer)):
            return None
        ops, start = self._layer_pass(layer, phase)
        # Recomputed forward kernels (the first ``start``) run first and stay local to the rank.
        idx = [i for i in range(start, len(ops)) if ops[i].name.startswith("experts")]
        return ops[:idx[0]], ops[idx[0]:idx[-1] + 1], ops[idx[-1] + 1:]

    def route(self, layer: int) -> LayerRouting:
        """Token routing of MoE layer ``layer`` over one EP group (drawn once per layer, seeded)."""
        r = self.routes.get(layer)
        if r is None:
            r = self.routes[layer] = route_layer(self.model.experts, self.model.top_k,
                                                 self.par.micro_batch * self.train.seq_len, self.par.ep,
                                                 self.routing, layer)
        return r

    def _expert_parts(self, layer: int, phase: str, ep_index: int, experts: list[LayerOp]) -> tuple[Kernel, ...]:
        """Expert kernels of one EP rank, scaled from balanced routing to the tokens it really receives."""
        key = (layer, phase, ep_index)
        parts = self._moe_parts.get(key)
        if parts is None:
            balanced = self.par.micro_batch * self.train.seq_len * self.model.top_k
            f = float(self.route(layer).rank_load[ep_index]) / balanced
            parts = self._moe_parts[key] = tuple(_scale_kernel(k, f, balanced) for k in experts)
        return parts

    def emit_moe(self, rank: int, seg: _Segment, deps: list[int], name: str, mb: int, stage: int) -> int:
        """Before-dispatch kernels (+ TP collectives) → dispatch all-to-all → this rank's experts → combine → rest.

        Backward runs the same shape in reverse: the gradient of the combine travels like the
        dispatch (token owner → expert), the gradient of the dispatch like the combine.
        """
        g = self.graph
        before, experts, after = seg.moe
        group = self._ep_groups.get(rank)
        if group is None:
            group = self._ep_groups[rank] = self.layout.ep_group(rank)
        e = group.index(rank)
        rows = self._moe_rows.get((seg.layer, e))  # the same for every micro-batch and EP group
        if rows is None:
            tokens = self.route(seg.layer).rank_matrix()
            per_token = self.model.hidden * self.dtype / self.t  # each TP rank ships its 1/t of the tokens
            rows = self._moe_rows[(seg.layer, e)] = (
                tuple(float(x) * per_token for x in tokens[e, :]),   # owner → experts
                tuple(float(x) * per_token for x in tokens[:, e]))  # experts → owners
        out_row, back_row = rows
        kernels = self._moe_kernels.get(id(seg.moe))
        if kernels is None or kernels[0] is not seg.moe:
            kernels = self._moe_kernels[id(seg.moe)] = (seg.moe, _kernels(before), _kernels(after))
        tags = {"layer": seg.layer, "micro_batch": mb, "stage": stage, "stream": COMPUTE_STREAM}
        last = g.compute(rank, parts=kernels[1], name=f"{name}.pre", deps=deps, category="gemm", **tags)
        last = self._emit_tp(rank, seg, name, last, mb, stage)
        g.collective_op(rank, "all_to_all", group, 0, split=out_row, traffic_class="ep",
                        name=f"{name}.ep_{'dispatch' if seg.phase == 'F' else 'combine_grad'}", **tags)
        g.compute(rank, parts=self._expert_parts(seg.layer, seg.phase, e, experts), name=f"{name}.experts",
                  category="gemm", **tags)
        g.collective_op(rank, "all_to_all", group, 0, split=back_row, traffic_class="ep",
                        name=f"{name}.ep_{'combine' if seg.phase == 'F' else 'dispatch_grad'}", **tags)
        return g.compute(rank, parts=kernels[2], name=f"{name}.post", category="gemm", **tags)

    def _emit_tp(self, rank: int, seg: _Segment, name: str, last: int, mb: int, stage: int) -> int:
        group = self._tp_groups.get(rank)
        if group is None:
            group = self._tp_groups[rank] = self.layout.tp_group(rank)
        for kind in ("all_reduce", "all_gather", "reduce_scatter"):
            count = seg.tp.get(kind, 0)
            if count:
                last = self.graph.collective_op(rank, kind, group, self.tp_bytes, name=f"{name}.tp_{kind}",
                                                stream=COMPUTE_STREAM, count=count, traffic_class="tp",
                                                layer=seg.layer, micro_batch=mb, stage=stage)
        return last

    # ---------------------------------------------------------------- emit
    def emit_segment(self, rank: int, seg: _Segment, deps: list[int], name: str, mb: int, stage: int) -> int:
        g = self.graph
        if seg.moe is not None:
            return self.emit_moe(rank, seg, deps, name, mb, stage)
        if seg.parts is None:
            again = seg.recompute or (False,) * len(seg.kernels)
            seg.recompute_parts = _kernels([k for k, r in zip(seg.kernels, again) if r])
            seg.parts = _kernels([k for k, r in zip(seg.kernels, again) if not r])
        tags = {"stream": COMPUTE_STREAM, "category": "gemm", "layer": seg.layer, "micro_batch": mb, "stage": stage}
        last = None
        if seg.recompute_parts:
            # Recomputed forward kernels first, as their own op ("R…"), so timelines can tell them apart.
            last = g.compute(rank, parts=seg.recompute_parts, name=RECOMPUTE_PHASE + name[1:], deps=deps, **tags)
            deps = [last]
        if seg.parts or last is None:
            last = g.compute(rank, parts=seg.parts, name=name, deps=deps, **tags)
        return self._emit_tp(rank, seg, name, last, mb, stage)

    def build_rank(self, rank: int) -> None:
        g, par, lay = self.graph, self.par, self.layout
        c = lay.coords(rank)
        stage = c.pp
        actions = self.schedules[stage]
        nvs = self.p * self.v
        overlap = par.overlap_grad_reduce and par.dp > 1
        last_b = {}
        for idx, a in enumerate(actions):
            if a.phase == "B":
                last_b[a.chunk] = idx
        dp_group = lay.dp_group(rank)
        plan = self.plan
        every_mb = plan.grad_sync == "micro_batch"
        gathered = plan.gather is not None and par.dp > 1
        trace = self.zero_trace(stage) if gathered else None
        use_end: dict[int, int] = {}
        gather_of: dict[int, int] = {}
        pending = _Buckets(self, rank, dp_group)
        last_op = None
        blocking = self.opt.p2p == "blocking"
        sent: list[int] = []  # sends of the previous action (blocking: the next action waits for them)
        for idx, a in enumerate(actions):
            j = a.chunk * self.p + stage
            deps: list[int] = list(sent) if blocking else []
            posted = [last_op] if blocking and last_op is not None else []  # recv posted on reaching the action
            sent = []
            name = f"{a.phase}{a.micro_batch}.c{a.chunk}"
            if a.phase == "F" and j > 0:
                src = lay.rank(tp=c.tp, dp=c.dp, pp=(j - 1) % self.p)
                deps.append(self._gathered(rank, g.recv(
                    rank, src, self.p2p_bytes, name=f"recv_act.{name}", stream="pp_recv_act", traffic_class="pp",
                    micro_batch=a.micro_batch, stage=stage, tag=0, deps=posted), name, a.micro_batch, stage))
            if a.phase == "B" and j < nvs - 1:
                src = lay.rank(tp=c.tp, dp=c.dp, pp=(j + 1) % self.p)
                deps.append(self._gathered(rank, g.recv(
                    rank, src, self.p2p_bytes, name=f"recv_grad.{name}", stream="pp_recv_grad", traffic_class="pp",
                    micro_batch=a.micro_batch, stage=stage, tag=1, deps=posted), name, a.micro_batch, stage))
            reduce_now = a.phase == "B" and (every_mb or idx == last_b[a.chunk])
            if gathered:
                per_action, uses, sched = trace
                segs = self.unit_segments(stage, a.chunk, a.phase)
                for (seg, _unit, _use), u in zip(segs, per_action[idx]):
                    grp = sched.group_of[u]
                    if grp is not None:
                        if grp not in gather_of:
                            gather_of[grp] = self._emit_gather(rank, sched.groups[grp], uses, use_end, sched.groups,
                                                               grp, a.micro_batch, stage)
                        if gather_of[grp] is not None:
                            deps.append(gather_of[grp])
                    last_op = self.emit_segment(rank, seg, deps, f"{name}.L{seg.layer}", a.micro_batch, stage)
                    use_end[u] = last_op
                    deps = []
                    if reduce_now:
                        pending.add(seg, last_op if overlap else None)
            else:
                per_layer = self.opt.granularity == "layer" or (a.phase == "B" and overlap and reduce_now)
                for seg in self.segments(stage, a.chunk, a.phase, per_layer):
                    last_op = self.emit_segment(rank, seg, deps, f"{name}.L{seg.layer}", a.micro_batch, stage)
                    deps = []
                    if reduce_now:
                        pending.add(seg, last_op if overlap else None)
            if reduce_now and every_mb:
                pending.flush(last_op)  # the end of every backward (DeepSpeed's epilogue, FSDP's last unit)
            if a.phase == "F" and j < nvs - 1:
                dst = lay.rank(tp=c.tp, dp=c.dp, pp=(j + 1) % self.p)
                sent.append(g.send(rank, dst, self.p2p_bytes, name=f"send_act.{name}", stream="pp_send_act",
                                   deps=[last_op], traffic_class="pp", micro_batch=a.micro_batch, stage=stage,
                                   tag=0))
            if a.phase == "B" and j > 0:
                dst = lay.rank(tp=c.tp, dp=c.dp, pp=(j - 1) % self.p)
                sent.append(g.send(rank, dst, self.p2p_bytes, name=f"send_grad.{name}", stream="pp_send_grad",
                                   deps=[last_op], traffic_class="pp", micro_batch=a.micro_batch, stage=stage,
                                   tag=1))
        # Gradient synchronisation that is not overlapped, then the optimizer.
        pending.flush(last_op)
        dp_ops = pending.emitted
        tied = self._tied_embedding_sync(rank, stage, last_op)
        dense, experts = stage_params(self.model, par, stage)
        shard = (dense / par.dp + experts / max(1, par.dp // par.ep)) if par.zero >= 1 else dense + experts
        before, after = optimizer_step_ops(shard, dense + experts, self.grad_bytes, self.dtype)
        step_deps = [last_op] + dp_ops[-1:] + tied
        norm = g.compute(rank, parts=_kernels(before), name="grad_norm", deps=step_deps, stream=COMPUTE_STREAM,
                         category="optimizer", stage=stage)
        norm = self._norm_all_reduce(rank, norm, stage)
        opt_id = g.compute(rank, parts=_kernels(after), name="optimizer", deps=[norm], stream=COMPUTE_STREAM,
                           category="optimizer", stage=stage)
        if plan.step_gather and par.dp > 1:
            pending.gather_params(opt_id)

    def _norm_all_reduce(self, rank: int, after: int, stage: int) -> int:
        """The global gradient norm: an fp32 scalar all-reduced over the model-parallel group (TP x PP) and,
        when the optimizer state is sharded (ZeRO >= 1), over the data-parallel group too (Megatron's
        ``get_grad_norm_fp32``); latency-bound collectives that every pipeline stage must join before its
        optimizer step. Traffic class ``sync``."""
        par, lay, last = self.par, self.layout, after
        c = lay.coords(rank)
        mp = tuple(lay.rank(tp=t, dp=c.dp, pp=p) for p in range(self.p) for t in range(self.t))
        groups = [mp] + ([lay.dp_group(rank)] if par.zero >= 1 and par.dp > 1 else [])
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

    def _tied_embedding_sync(self, rank: int, stage: int, after: int) -> list[int]:
        """All-reduce of the tied word-embedding gradient between the first and last pipeline stage."""
        if not self.model.tied_embeddings or self.p == 1 or stage not in (0, self.p - 1):
            return []
        c = self.layout.coords(rank)
        group = (self.layout.rank(tp=c.tp, dp=c.dp, pp=0), self.layout.rank(tp=c.tp, dp=c.dp, pp=self.p - 1))
        vocab = padded_vocab(self.model.vocab, self.t)  # the shard Megatron holds is of the padded vocabulary
        nbytes = self.model.word_embedding_params(self.t, vocab) * self.grad_bytes
        return [self.graph.collective_op(rank, "all_reduce", group, nbytes, name="embedding_grad_sync",
                                         stream="dp", deps=[after], traffic_class="dp", stage=stage)]

    def build(self, representatives: str | None = None) -> OpGraph:
        ranks: Sequence[int] = range(self.par.world_size)
        lay = self.layout
        ep = self.par.ep
        if representatives == "stage" and self.t * self.par.dp // ep > 1:
            # Every rank of a pipeline stage runs the same program as the ranks with its EP index in the
            # other EP groups and their TP peers: same kernels, same TP collectives, the same all-to-all
            # rows (routing is drawn per layer, the same in every EP group); its DP, EP and PP peers are the
            # same coordinates with their own indices. So emit the tp = 0 ranks of the first EP group (for
            # dense models: the tp = 0, dp = 0 rank) of each stage; each stands for its expert-DP x TP
            # block, listed DP-major (TP and DP groups are rows and columns: see engine.lanes).
            ranks = [r for r in ranks if lay.coords(r).tp == 0 and lay.coords(r).dp < ep]
            self.graph.replicas = {r: tuple(x for d in lay.expert_dp_group(r) for x in lay.tp_group(d))
                                   for r in ranks}
        elif representatives and self.t > 1:
            ranks = [r for r in ranks if lay.coords(r).tp == 0]
            self.graph.replicas = {r: lay.tp_group(r) for r in ranks}
        for rank in ranks:
            self.build_rank(rank)
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
        self.emitted: list[int] = []
        self.reduced: dict[float, int] = {}  # bucket bytes -> how many buckets of that size were reduced
        par = builder.par
        self.kind = "all_reduce" if par.zero == 0 else "reduce_scatter"
        self.algorithm = "parameter_server" if par.dp_sync == "parameter_server" else "auto"
        self.expert_group = builder.layout.expert_dp_group(rank) if builder.model.is_moe else dp_group

    def add(self, seg: _Segment, ready_op: int | None) -> None:
        if self.b.par.dp == 1 and len(self.expert_group) == 1:
            return
        self.fill += seg.grad_bytes
        self.expert_fill += seg.expert_grad_bytes
        if self.size is None:
            if ready_op is not None:
                self.flush(ready_op)
            return
        if ready_op is not None and self.fill >= self.size:
            full = int(self.fill // self.size)
            self._emit(self.size, [ready_op], count=full)
            self.fill -= full * self.size

    def _emit(self, nbytes: float, deps: list[int], group: tuple[int, ...] | None = None,
              traffic_class: str = "dp", count: int = 1) -> None:
        group = group or self.group
        if len(group) < 2 or nbytes <= 0 or count < 1:
            return
        self.emitted.append(self.b.graph.collective_op(
            self.rank, self.kind, group, nbytes, name=f"grad_{self.kind}", stream="dp", deps=deps, count=count,
            algorithm=self.algorithm if self.kind == "all_reduce" else "auto", traffic_class=traffic_class))
        if group == self.group:
            self.reduced[nbytes] = self.reduced.get(nbytes, 0) + count

    def _emit_all(self, total: float, deps: list[int], group: tuple[int, ...], traffic_class: str) -> None:
        if self.size is None or self.size == float("inf"):
            self._emit(total, deps, group, traffic_class)
            return
        full = int(total // self.size)
        self._emit(self.size, deps, group, traffic_class, count=full)
        self._emit(total - full * self.size, deps, group, traffic_class)

    def flush(self, last_op: int) -> None:
        """Reduce whatever is left after the backward (or everything, without overlap)."""
        self._emit_all(self.fill, [last_op], self.group, "dp")
        self.fill = 0.0
        self._emit_all(self.expert_fill, [last_op], self.expert_group, "edp" if self.b.par.ep > 1 else "dp")
        self.expert_fill = 0.0

    def gather_params(self, after: int) -> None:
        """ZeRO-1/2: all-gather the updated 16-bit parameters of every reduced bucket."""
        ratio = self.b.dtype / self.b.grad_bytes
        for nbytes, count in self.reduced.items():
            self.b.graph.collective_op(self.rank, "all_gather", self.group, nbytes * ratio, name="param_all_gather",
                                       stream="dp", deps=[after], count=count, traffic_class="zero")


def training_step(model: ModelSpec, parallel: ParallelConfig, training: TrainingSpec,
                  options: StepOptions | None = None, routing: RoutingModel | None = None, *,
                  representatives: str | bool | None = None) -> TrainingStep:
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
    representatives : {None, "tp", "stage"}
        ``"tp"`` (or True): emit the program of one representative per TP
        group only (its ``tp = 0`` rank) and set ``graph.replicas`` to
        ``{representative: its TP group}``: the members of a TP group run
        identical programs, so the simulator can run one and still put every
        member's DP/PP flows and the whole group's TP collectives on the
        network (``fidelity="fast"``). ``"stage"``: one representative per
        pipeline stage and EP index (the ``tp = 0`` ranks of the first EP
        group; for dense models the ``tp = 0, dp = 0`` rank) standing for its
        expert-DP x TP block, listed DP-major (``fidelity="lockstep"``).
        Default None: every rank's program.

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
    if representatives not in (None, False, "tp", "stage"):
        raise ConfigError(f"representatives: {representatives!r} unknown; valid: None, 'tp', 'stage'")
    options = options or StepOptions()
    if options.p2p == "blocking" and parallel.schedule == "interleaved":
        raise ConfigError("options.p2p: blocking send/recv is modelled for the gpipe and 1f1b schedules; "
                          "use p2p: async with interleaved")
    builder = _StepBuilder(model, parallel, training, options, routing)
    graph = builder.build(representatives)
    flops = model_flops_per_step(model, parallel.global_batch, training.seq_len, causal=options.causal)
    hw_flops = hardware_flops_per_step(model, parallel.global_batch, training.seq_len,
                                       recompute=parallel.recompute, causal=options.causal)
    if not options.embedding_and_loss:
        output_layer = 6.0 * model.hidden * model.vocab * parallel.global_batch * training.seq_len
        flops -= output_layer
        hw_flops -= output_layer
    stages = [builder.layout.coords(r).pp for r in range(parallel.world_size)]
    return TrainingStep(graph, model, parallel, training, builder.layout, builder.m, flops, stages,
                        routes=dict(sorted(builder.routes.items())), hardware_flops=hw_flops)


__all__ = ["StepOptions", "TrainingStep", "training_step", "GRANULARITIES", "PipeAction"]
