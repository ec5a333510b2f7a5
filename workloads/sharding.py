"""Sharded data parallelism as the frameworks run it: ZeRO stages under Megatron, DeepSpeed, FSDP, FSDP2.

The ZeRO paper (Rajbhandari et al., SC'20) says *what* each stage shards; the
frameworks differ in *how* they move it, and that decides the time a step
spends communicating. :func:`sharding_plan` resolves ``parallel.zero`` and
``parallel.zero_impl`` into those semantics; :func:`gather_schedule` decides,
use by use, which parameter all-gathers a ZeRO-3 step issues and how they are
prefetched; the training generator (:mod:`workloads.training`) emits them.

What each implementation does (sources: DeepSpeed 0.16.4 ``runtime/zero/``,
PyTorch 2.6 ``distributed/fsdp``, Megatron-Core 0.19 ``core/distributed``;
read from the code, see docs/DESIGN.md "Sharded data parallelism"):

==========  =================================  ==================================  ===============================
impl        parameter all-gather                gradients                           after the optimizer step
==========  =================================  ==================================  ===============================
megatron    none per layer (ZeRO <= 1: every    reduce-scatter (ZeRO-1) or          all-gather of the updated
            rank keeps the 16-bit weights)      all-reduce once per step, buckets   16-bit weights (ZeRO-1)
                                                of max(40M, 1M·dp) params, fp32
                                                for bf16 (``grad_reduce_in_fp32``)
deepspeed   ZeRO-3: every module's own          reduce-scatter every micro-batch    ZeRO-1/2: all-gather of the
            parameters (each Linear), before    (ZeRO-2/3), buckets of 5e8          updated 16-bit weights;
            forward, recomputed forward and     elements, in the model dtype        ZeRO-3: none (lazy)
            backward; upcoming modules
            prefetched together up to
            ``stage3_prefetch_bucket_size``
            (5e7); kept when reused within
            ``stage3_max_reuse_distance``
            (1e9); parameters of <= 1e5
            elements never partitioned
fsdp        one flat parameter per unit (a      reduce-scatter per unit every       none
            transformer block), before forward  micro-batch (unless ``no_sync``),
            and backward, one unit ahead; the   in ``param_dtype``
            recomputed forward reuses the
            backward's gather; the root unit
            (embeddings, output) stays gathered
            through the micro-batch; ZeRO-2
            (``SHARD_GRAD_OP``): no backward
            gather
fsdp2       as fsdp; each all-gather is         as fsdp                             none
            followed by a copy-out of the
            gathered parameters into per-
            parameter tensors (HBM traffic)
==========  =================================  ==================================  ===============================

DeepSpeed 0.5 and older (2021) fetched every parameter tensor with its own
all-gather and synchronised the device after it: ``parallel.zero_overlap:
false`` models that.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .models import ModelSpec
from .parallel import ParallelConfig, chunk_layers, num_micro_batches, padded_vocab
from .schedules import rank_schedule

__all__ = ["ShardingPlan", "sharding_plan", "Unit", "Use", "GatherSchedule", "gather_schedule", "layer_units",
           "end_units", "stage_uses", "module_of", "zero_figures", "parse_count",
           "MEGATRON_BUCKET_PARAMS", "DEEPSPEED_REDUCE_BUCKET"]

MEGATRON_BUCKET_PARAMS = 40_000_000
"""Megatron-Core's gradient bucket: ``max(40M, 1M · dp)`` parameters (``DistributedDataParallel``)."""
DEEPSPEED_REDUCE_BUCKET = 5e8
"""DeepSpeed ``reduce_bucket_size`` (elements)."""


@dataclass(frozen=True)
class ShardingPlan:
    """The resolved semantics of one configuration's data parallelism.

    Attributes
    ----------
    impl : str
        ``megatron``, ``deepspeed``, ``fsdp`` or ``fsdp2``.
    stage : int
        ZeRO stage 0-3.
    grad_sync : {"micro_batch", "step"}
        Whether gradients are reduced after every micro-batch or once per step.
    grad_bytes : int
        Bytes per element of the gradient buffer and of its reduction.
    bucket_bytes : float or None
        Gradient bucket, bytes; None: one bucket per gathered unit (FSDP).
    gather : {"module", "layer", None}
        Granularity of per-layer parameter all-gathers (ZeRO-3, FSDP ZeRO-2); None: none.
    reshard_after_forward : bool
        Gathered parameters are freed after a unit's forward (re-gathered for backward).
    regather_recompute : bool
        The recomputed forward of full activation recomputation gathers like a forward (DeepSpeed's
        hooks fire on it); FSDP's reuses the backward's gather.
    overlap : bool
        All-gathers on their own stream, prefetched; False: blocking on the compute stream (DeepSpeed: one per
        parameter tensor; FSDP: the unit's one flat all-gather, unprefetched).
    prefetch : float
        Elements of upcoming parameters one prefetch gathers at most (DeepSpeed); FSDP prefetches one unit.
    reuse_distance, persistence : float
        DeepSpeed's ``stage3_max_reuse_distance`` and ``stage3_param_persistence_threshold`` (elements).
    copy_out : bool
        FSDP2's copy of every gathered group into per-parameter tensors.
    step_gather : bool
        All-gather of the updated 16-bit parameters after the optimizer step (ZeRO-1/2).
    fp32_main_grads : bool
        The optimizer keeps fp32 copies of 16-bit gradients (Megatron's ``Float16OptimizerWithFloat16Params``
        with a 16-bit gradient buffer: ``_copy_model_grads_to_main_grads``), 4 bytes per parameter it updates;
        with an fp32 buffer (bf16's default) it reads that buffer instead.
    """

    impl: str
    stage: int
    grad_sync: str
    grad_bytes: int
    bucket_bytes: float | None
    gather: str | None
    reshard_after_forward: bool = True
    regather_recompute: bool = False
    overlap: bool = True
    prefetch: float = 5e7
    reuse_distance: float = 0.0
    persistence: float = 0.0
    copy_out: bool = False
    step_gather: bool = False
    fp32_main_grads: bool = False

    @property
    def shards_optimizer(self) -> bool:
        return self.stage >= 1

    def persistent(self, unit: Unit) -> bool:
        """Whether ``unit`` is never partitioned: DeepSpeed ZeRO-3 keeps a module of at most
        ``stage3_param_persistence_threshold`` elements whole on every rank (never gathered, held in full)."""
        return self.impl == "deepspeed" and unit.total <= self.persistence


def sharding_plan(parallel: ParallelConfig, dtype: str = "bf16", grad_dtype_bytes: int | None = None) -> ShardingPlan:
    """Resolve ``parallel.zero`` / ``zero_impl`` / ``zero_grad_sync`` into a :class:`ShardingPlan`.

    ``grad_dtype_bytes`` (``options.grad_dtype_bytes``) overrides the
    implementation's gradient dtype: Megatron keeps fp32 gradient buffers for
    bf16 training (``grad_reduce_in_fp32``, forced by ``--bf16``) and 16-bit
    ones for fp16; DeepSpeed (``communication_data_type``) and FSDP
    (``reduce_dtype``) reduce in the model dtype by default.
    """
    z = parallel.zero
    impl = parallel.zero_impl
    if impl == "auto":
        impl = "megatron" if z <= 1 else "deepspeed"
    dtype_bytes = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1}.get(dtype, 2)
    if impl == "megatron":
        default_grad = 4 if dtype in ("bf16", "fp8") else dtype_bytes
    else:
        default_grad = dtype_bytes
    grad_bytes = grad_dtype_bytes or default_grad
    sync = parallel.zero_grad_sync
    if sync == "auto":
        sync = "micro_batch" if (impl in ("fsdp", "fsdp2") or (impl == "deepspeed" and z >= 2)) else "step"
    if parallel.grad_bucket_bytes is not None:
        bucket: float | None = float(parallel.grad_bucket_bytes)
    elif impl == "megatron":
        bucket = (max(MEGATRON_BUCKET_PARAMS, 1_000_000 * parallel.grad_dp) * grad_bytes
                  if parallel.overlap_grad_reduce else float("inf"))
    elif impl == "deepspeed":
        bucket = DEEPSPEED_REDUCE_BUCKET * grad_bytes
    else:
        bucket = None
    if impl == "deepspeed":
        return ShardingPlan(impl, z, sync, grad_bytes, bucket, "module" if z == 3 else None,
                            regather_recompute=True, overlap=parallel.zero_overlap, prefetch=parallel.zero_prefetch,
                            reuse_distance=parallel.zero_reuse_distance, persistence=parallel.zero_persistence,
                            step_gather=z in (1, 2))
    if impl in ("fsdp", "fsdp2"):
        return ShardingPlan(impl, z, sync, grad_bytes, bucket, "layer", reshard_after_forward=z == 3,
                            overlap=parallel.zero_overlap, copy_out=impl == "fsdp2")
    # Megatron's docs (distributed optimizer): fp16 params with fp16 grads take 20 bytes a parameter (4 + 16/d
    # distributed), bf16 with fp32 grads 18 (6 + 12/d): the 16-bit buffer's fp32 main-grad copy is the difference
    return ShardingPlan(impl, z, sync, grad_bytes, bucket, None, step_gather=z == 1,
                        fp32_main_grads=dtype_bytes < 4 and grad_bytes < 4)


# ------------------------------------------------------------------ units
@dataclass(frozen=True)
class Unit:
    """A set of parameters gathered together: one module (DeepSpeed) or one layer (FSDP).

    ``params`` are one TP rank's, gathered over the data-parallel group;
    ``expert_params`` the routed-expert part, gathered over the expert-DP group;
    ``tensors`` the parameter tensors (one all-gather each without overlap).
    """

    key: tuple
    params: float
    expert_params: float = 0.0
    tensors: int = 1
    root: bool = False

    @property
    def total(self) -> float:
        return self.params + self.expert_params


_MODULE_OF_KERNEL = {
    "qkv": "qkv", "attn_out": "out", "mlp_up": "up", "mlp_down": "down",
    "q_down": "qkv", "q_up": "qkv", "q_proj": "qkv", "kv_down": "qkv", "kv_up": "qkv",  # MLA's projections
    "router": "moe", "experts_up": "moe", "experts_down": "moe", "shared_up": "moe", "shared_down": "moe",
    "embedding": "embedding", "logits": "output", "final_norm": "output",
}


def module_of(kernel_name: str) -> str | None:
    """The parameter module a kernel (forward or backward, e.g. ``qkv.wgrad``) needs; None: only persistent
    parameters or none (norms, attention core, element-wise)."""
    return _MODULE_OF_KERNEL.get(kernel_name.split(".")[0])


def layer_units(model: ModelSpec, layer: int, tp: int, ep: int, granularity: str) -> dict[str, Unit]:
    """The gathered units of one layer on one TP/EP rank, by module name (``layer``: one unit ``"layer"``).

    Modules (DeepSpeed): ``qkv`` (QKV weight and bias; MLA: its down and up projections and latent
    norms), ``out`` (output
    projection), ``up`` and ``down`` (MLP; gate and up fused), ``moe`` (router
    and local experts of a MoE layer). The two norms (``2·h`` or ``4·h``
    elements) are below DeepSpeed's persistence threshold and never gathered
    (their gradients are still reduced). ``layer``: the whole layer, norms
    included (an FSDP unit).
    """
    h, kv, t = model.hidden, model.kv_hidden, tp
    routed = model.routed_expert_params(layer, t, ep)
    # MLA: the "qkv" unit holds every projection but the output one, and the two latent norms
    mla = len(model.mla_projections()) - 1 + (2 if model.q_lora_rank is not None else 1) if model.is_mla else 0
    if granularity == "layer":
        total = model.params_per_layer(layer, t, ep)
        return {"layer": Unit((layer, "layer"), total - routed, routed,
                              tensors=model.mlp_matrices + 4 + (4 if model.bias else 0) + max(mla - 1, 0))}
    bias = model.bias
    q = model.q_hidden
    if model.is_mla:
        out = model.heads * model.v_dim * h // t
        units = {"qkv": Unit((layer, "qkv"), model.attention_params(t) - out, 0.0, mla),
                 "out": Unit((layer, "out"), out, 0.0, 1)}
    else:
        units = {"qkv": Unit((layer, "qkv"), h * (q + 2 * kv) // t + ((q + 2 * kv) // t if bias else 0), 0.0,
                             2 if bias else 1),
                 "out": Unit((layer, "out"), q * h // t + (h if bias else 0), 0.0, 2 if bias else 1)}
    if model.is_moe_layer(layer):
        units["moe"] = Unit((layer, "moe"), model.mlp_params(layer, t, ep) - routed, routed,
                            tensors=1 + model.mlp_matrices * (model.experts // ep + model.shared_experts))
    else:
        f, gates = model.ffn_hidden, model.mlp_matrices - 1
        units["up"] = Unit((layer, "up"), gates * h * f // t + (gates * f // t if bias else 0), 0.0,
                           gates + (1 if bias else 0))
        units["down"] = Unit((layer, "down"), f * h // t + (h if bias else 0), 0.0, 2 if bias else 1)
    return units


def end_units(model: ModelSpec, parallel: ParallelConfig, granularity: str, stage: int = 0) -> dict[str, Unit]:
    """The embedding (first stage) and output (last stage) units; FSDP's root unit holds what ``stage`` has."""
    t = parallel.tp
    word = model.word_embedding_params(t, padded_vocab(model.vocab, t))
    emb = word + model.position_embedding_params()
    out = model.final_norm_params() + (word if (not model.tied_embeddings or parallel.pp > 1) else 0)
    if granularity == "layer":
        held = (emb if stage == 0 else 0) + (out if stage == parallel.pp - 1 else 0)
        root = Unit(("root",), held, root=True, tensors=3)
        return {"embedding": root, "output": root}
    embedding = Unit(("embedding",), emb, tensors=2 if model.learned_positions else 1)
    shared = model.tied_embeddings and parallel.pp == 1
    output = embedding if shared else Unit(("output",), out, tensors=2)
    return {"embedding": embedding, "output": output}


# --------------------------------------------------------------- schedule
@dataclass(frozen=True)
class Use:
    """One use of a unit in a rank's step, in execution order: forward (``F``), recomputed forward (``R``)
    or backward (``B``, which produces its gradients), of micro-batch ``micro_batch``."""

    unit: Unit
    phase: str
    micro_batch: int = 0


def _pass_uses(model: ModelSpec, parallel: ParallelConfig, plan: ShardingPlan, layers: list[int], phase: str,
               first: bool, last: bool, ends: dict[str, Unit]) -> list[Use]:
    gran = plan.gather or "module"
    per_layer = []
    for i in layers:
        units = list(layer_units(model, i, parallel.tp, parallel.ep, gran).values())
        if gran == "layer" or model.is_moe_layer(i) and parallel.ep > 1:
            units = [layer_units(model, i, parallel.tp, parallel.ep, "layer")["layer"]]
            per_layer.append([Use(units[0], phase)])
        elif phase == "F":
            per_layer.append([Use(u, "F") for u in units])
        else:
            recompute = ([Use(u, "R") for u in units]
                         if parallel.recompute == "full" and plan.regather_recompute else [])
            per_layer.append(recompute + [Use(u, "B") for u in reversed(units)])
    if phase == "F":
        uses = [Use(ends["embedding"], "F")] if first else []
        uses += [u for group in per_layer for u in group]
        return uses + ([Use(ends["output"], "F")] if last else [])
    uses = [Use(ends["output"], "B")] if last else []
    uses += [u for group in reversed(per_layer) for u in group]
    return uses + ([Use(ends["embedding"], "B")] if first else [])


def stage_uses(model: ModelSpec, parallel: ParallelConfig, plan: ShardingPlan, stage: int,
               embedding_and_loss: bool = True) -> tuple[list[list[int]], list[Use]]:
    """Every use of a gathered unit by one rank of pipeline ``stage`` over a step, in execution order.

    Returns ``(use indices per pipeline action, uses)``. The order is the
    pipeline schedule's actions; inside a forward the embedding (first virtual
    stage), each layer's units in forward order, the output layer (last); a
    backward the reverse, a recomputed forward (DeepSpeed, full recomputation)
    before each layer's backward. The training generator cuts its kernels at
    exactly these uses.
    """
    p, v = parallel.pp, parallel.virtual_stages
    ends = end_units(model, parallel, plan.gather or "module", stage)
    per_action: list[list[int]] = []
    uses: list[Use] = []
    for a in rank_schedule(parallel.schedule, p, num_micro_batches(parallel), v, stage, parallel.microbatch_group_size):
        j = a.chunk * p + stage
        chunk = chunk_layers(model.layers, parallel, stage, a.chunk)  # (chunks of a stage may differ in size)
        new = [Use(u.unit, u.phase, a.micro_batch)
               for u in _pass_uses(model, parallel, plan, chunk, a.phase, embedding_and_loss and j == 0,
                                   embedding_and_loss and j == p * v - 1, ends)]
        per_action.append(list(range(len(uses), len(uses) + len(new))))
        uses += new
    return per_action, uses


@dataclass
class GatherSchedule:
    """Which uses gather, grouped into collectives.

    ``group_of[i]`` is the index into ``groups`` of the all-gather use ``i``
    waits for (None: its parameters are resident or persistent); each group is
    the list of use indices whose parameters one collective gathers, the first
    of them the use that needs it first. ``peak_live`` is the most
    non-persistent parameters (elements, one rank) gathered at once, counting
    the prefetch in flight.
    """

    group_of: list[int | None]
    groups: list[list[int]]
    peak_live: float


def gather_schedule(uses: Sequence[Use], plan: ShardingPlan, expert_gathered: bool = True) -> GatherSchedule:
    """Simulate parameter residency over one step's uses and group the all-gathers as the framework does.

    ``expert_gathered=False``: the routed experts are not gathered (an expert-DP group of one rank, which holds
    them whole: the generator issues no all-gather for them), so ``peak_live`` counts only the units' other
    parameters; which uses gather, and their groups, are unchanged."""
    n = len(uses)

    def held(unit: Unit) -> float:  # elements a gather of ``unit`` adds to the rank's memory
        return unit.total if expert_gathered else unit.params
    persistent = [plan.persistent(u.unit) for u in uses]
    next_use: list[int | None] = [None] * n
    last: dict[tuple, int] = {}
    for i in range(n - 1, -1, -1):
        key = uses[i].unit.key
        next_use[i] = last.get(key)
        last[key] = i
    prefix = [0.0]
    for u in uses:
        prefix.append(prefix[-1] + u.unit.total)
    # FSDP's SHARD_GRAD_OP under no_sync (``zero_grad_sync: step``) frees nothing in the backward of a micro-batch
    # that does not sync its gradients (PyTorch's ``_should_free_in_backward``: ``state._sync_gradients or`` a
    # strategy that reshards after forward), so a unit stays gathered until its last use of the step, in the
    # backward that syncs (whatever the schedule's order of micro-batches).
    unsynced = plan.impl == "fsdp" and not plan.reshard_after_forward and plan.grad_sync == "step"
    resident: dict[tuple, float] = {}
    need = [False] * n
    live_at = [0.0] * n
    released: dict[tuple, int] = {}  # unit key -> the use after which it was last released
    released_before = [-1] * n  # of a use that gathers: the use after which its unit was last released
    for i, u in enumerate(uses):
        key = u.unit.key
        if not persistent[i] and key not in resident:
            need[i] = True
            resident[key] = held(u.unit)
            released_before[i] = released.get(key, -1)
        live_at[i] = sum(resident.values())
        j = next_use[i]
        if persistent[i]:
            continue
        if plan.impl == "deepspeed":
            keep = j is not None and prefix[j] - prefix[i + 1] <= plan.reuse_distance
        elif unsynced:
            keep = j is not None
        elif u.unit.root:  # not resharded after forward; resharded after its micro-batch's last backward use
            keep = j is not None and (u.phase != "B" or (uses[j].phase == "B"
                                                         and uses[j].micro_batch == u.micro_batch))
        else:
            keep = u.phase == "F" and not plan.reshard_after_forward
        if not keep and resident.pop(key, None) is not None:
            released[key] = i
    groups: list[list[int]] = []
    group_of: list[int | None] = [None] * n
    size, keys = 0.0, set()
    for i in range(n):
        if not need[i]:
            continue
        key = uses[i].unit.key
        # A DeepSpeed prefetch takes upcoming modules until it holds the bucket; it cannot take a module it
        # already holds (that use comes after the module's release and needs a gather of its own).
        coalesce = (plan.impl == "deepspeed" and plan.overlap and groups and size < plan.prefetch
                    and key not in keys)
        if coalesce:
            groups[-1].append(i)
            size += uses[i].unit.total
            keys.add(key)
        else:
            groups.append([i])
            size, keys = uses[i].unit.total, {key}
        group_of[i] = len(groups) - 1
    # At use i, the next group to be gathered may already be in flight (one prefetch ahead), but not a unit of it
    # that is still gathered at i (released at i or later, before the group gathers it again): a prefetch skips a
    # module it holds, and the unit's storage is one. (Counting it as well held the root twice from two
    # micro-batches on. The generator's timeline may still start that gather before the release: see DESIGN.)
    sizes = [sum(held(uses[j].unit) for j in g) for g in groups]
    latest = [max(released_before[j] for j in g) for g in groups]  # a group's last release of a unit it gathers
    peak, upcoming = 0.0, None
    for i in range(n - 1, -1, -1):
        ahead = 0.0
        if upcoming is not None and plan.overlap:
            ahead = sizes[upcoming]
            if latest[upcoming] >= i:
                ahead -= sum(held(uses[j].unit) for j in groups[upcoming] if released_before[j] >= i)
        peak = max(peak, live_at[i] + ahead)
        if group_of[i] is not None and groups[group_of[i]][0] == i:
            upcoming = group_of[i]
    return GatherSchedule(group_of, groups, peak)


# ----------------------------------------------------------- the paper
_COUNT_SUFFIX = {"": 1.0, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}


def parse_count(value: object, field: str = "params") -> float:
    """A positive count such as ``1T``, ``175B``, ``7.5e9`` or ``70000000``; ConfigError naming ``field``."""
    from .errors import ConfigError
    text = str(value).strip().upper().replace("_", "")
    suffix = text[-1:] if text[-1:] in "KMBGT" else ""
    try:
        x = float(text[: len(text) - len(suffix)]) * _COUNT_SUFFIX[suffix]
    except ValueError:
        x = float("nan")
    if not (x > 0 and x < 1e16):
        raise ConfigError(f"{field}: must be a positive count below 1e16 such as 1T, 175B, 7.5e9, got {value!r}")
    return x


def optimizer_bytes_per_param(dtype_bytes: int = 2) -> int:
    """Adam state ``K`` per parameter: 12 for mixed precision (ZeRO's K: fp32 master weights, momentum,
    variance), 8 for fp32 training (momentum and variance; the weights are the master copy)."""
    return 12 if dtype_bytes < 4 else 8


def zero_figures(params: float, gpus: int, dtype_bytes: int = 2, k: int | None = None) -> list[dict]:
    """Model-state memory and gradient/parameter traffic per GPU for ZeRO stages 0-3 (Rajbhandari et al. SC'20).

    ``params`` (Ψ) trained by data parallelism over ``gpus`` (N) GPUs with
    Adam: parameters and gradients of ``dtype_bytes`` (d) each and ``k`` bytes
    of optimizer state per parameter (default :func:`optimizer_bytes_per_param`:
    12 under mixed precision, 8 in fp32). Memory per GPU (section 3.1,
    Figure 1, with d = 2): ``(d + d + K)Ψ``, ``(d + d)Ψ + KΨ/N``,
    ``dΨ + (d + K)Ψ/N``, ``(d + d + K)Ψ/N``. Bytes one GPU sends per step with
    one micro-batch (section 7): a ring all-reduce of the gradients,
    ``2(N-1)/N · dΨ``, for DDP; a reduce-scatter of gradients plus an
    all-gather of parameters, the same, for ZeRO-1/2; one more all-gather of
    the parameters for ZeRO-3, ``3(N-1)/N · dΨ`` (1.5x). These are the paper's
    figures; a framework's (:func:`sharding_plan`) can differ: Megatron's fp32
    gradients, FSDP's root unit, DeepSpeed's reuse of gathered modules and
    persistent small parameters, gathers repeated for every micro-batch.

    ``params`` may be text (``"1T"``, ``"175B"``: :func:`parse_count`); a bad argument raises a one-line
    :class:`~workloads.errors.ConfigError` naming it.
    """
    from .errors import ConfigError, check_int
    psi = parse_count(params)  # (a count given as text too, as clustersim zero --params takes it)
    check_int("gpus", gpus)
    if dtype_bytes not in (2, 4):
        raise ConfigError(f"dtype_bytes: must be 2 (bf16/fp16) or 4 (fp32), got {dtype_bytes!r}")
    if k is not None:
        check_int("k", k, minimum=0)
    n, d = gpus, dtype_bytes
    k = optimizer_bytes_per_param(d) if k is None else k
    ring = (n - 1) / n
    rows = []
    for stage in range(4):
        p = d * psi / (n if stage >= 3 else 1)
        g = d * psi / (n if stage >= 2 else 1)
        o = k * psi / (n if stage >= 1 else 1)
        memory_formula = ["(d+d+K)Ψ", "(d+d)Ψ + KΨ/N", "dΨ + (d+K)Ψ/N", "(d+d+K)Ψ/N"][stage]
        traffic = (3 if stage == 3 else 2) * ring * d * psi
        traffic_formula = "3(N-1)/N·dΨ" if stage == 3 else "2(N-1)/N·dΨ"
        rows.append({"zero": stage, "parameters_bytes": p, "gradients_bytes": g, "optimizer_bytes": o,
                     "model_states_bytes": p + g + o,
                     "memory_formula": memory_formula.replace("K", str(k)).replace("d", str(d)),
                     "traffic_bytes_per_gpu": traffic, "traffic_formula": traffic_formula.replace("d", str(d))})
    return rows
