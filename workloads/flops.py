"""Compute of one transformer layer (and the embedding / output layers) per TP rank.

Each function returns the kernels one tensor-parallel rank runs for one
micro-batch, as :class:`LayerOp` records with FLOPs, HBM bytes and, for GEMMs,
the ``(m, n, k)`` shape. The generators turn them into ``Compute`` ops.

Counting conventions
--------------------
* FLOPs are *model* FLOPs of the matrix multiplications (2 per multiply-add),
  exactly the terms of Narayanan et al. (SC'21, eq. 3): summed over a step
  they reproduce ``72 B s l h^2 (1 + s/(6h) + V/(12 l h))`` for GPT-3.
  Element-wise kernels (norms, activations, dropout, residual adds, softmax
  of the loss) carry ``flops = 0``: they are memory-bound, their arithmetic
  is < 0.1% of a layer, and their cost is in ``nbytes``.
* Attention is FlashAttention-style: forward ``QK^T`` and ``softmax . V`` are
  ``2 * 2 b s^2 h / t`` FLOPs (full ``s^2``, as Megatron's formula counts,
  by default; ``causal=True`` halves them, which is what a causal flash kernel
  executes), HBM bytes read Q, K, V and write O only (no ``s^2`` matrix).
  Backward is counted as 2x the forward FLOPs (the four gradient matmuls);
  a flash backward also recomputes ``QK^T`` (another 0.5x): that is in the
  kernel's executed FLOPs (``LayerOp.executed`` x 1.25, the FA papers' 2.5x
  backward convention of the published rates), so model FLOPs stay exact.
  Backward bytes read Q, K, V, O, dO and write dQ, dK, dV: 2x the forward.
* Every GEMM ``Y[m,n] = X[m,k] W[k,n]`` has two backward GEMMs of the same
  FLOPs: data-grad ``dX = dY W^T`` (shape ``(m, k, n)``, name ``*.dgrad``) and
  weight-grad ``dW = X^T dY`` (shape ``(k, n, m)``, name ``*.wgrad``), kept
  apart so a generator can overlap weight-grads or gradient buckets.
* Element-wise backward reads the saved input and the output gradient and
  writes the input gradient: 1.5x the forward bytes.
* Sequence parallelism: norms, dropout and residual adds run on ``s / t``
  tokens per rank; without it they run on all ``s`` tokens on every TP rank.
  GEMMs and attention are the same either way.
* Context parallelism (``cp > 1``, Megatron-Core / Transformer Engine): a
  rank holds ``s / cp`` tokens of every sequence, so GEMMs and element-wise
  kernels run on ``b s / cp`` rows, and its attention does ``1 / cp`` of the
  sequence's attention FLOPs. Ring attention (``p2p``) with causal load
  balancing (the sequence cut into ``2 cp`` chunks, rank ``i`` holding chunks
  ``i`` and ``2 cp - 1 - i``) gives every one of its ``cp`` ring steps the same
  work: half of a block of ``s / cp`` queries and keys; K and V of the whole
  sequence stream through HBM. The layer's kernel has the block's shape; the
  generator runs it as :func:`ring_attention_steps` (the causal diagonal step,
  the unmasked off-diagonal ones, the merges of their outputs). ``all_gather``:
  one kernel of the local queries over the whole sequence's keys. All-to-all
  (``a2a``, Ulysses) gives a rank ``heads / (t cp)`` heads over the whole
  sequence. The communication is the generator's.
* MoE layers assume balanced routing: an EP rank receives on average
  ``b s top_k`` token-expert pairs per micro-batch whatever ``ep`` is; the
  generator rescales ``experts_*`` ops for skewed routing.

FP8 (``fp8=True``: Transformer Engine under Megatron-Core, delayed scaling)
--------------------------------------------------------------------------
The GEMMs of TE's linear modules -- QKV, attention output projection, MLP (or
expert and shared-expert) up and down -- are FP8 GEMMs (category
``gemm_fp8``: FP8 operands, bf16 output, timed at the GPU's FP8 rate). The
attention core, softmax, norms, activations, the router and the output layer
stay bf16 (Megatron's output layer is not a TE module; FP8 attention is off by
default). Per FP8 GEMM ``Y[m,n] = X[m,k] W[k,n]``:

* forward: ``*.fp8_cast`` casts ``X`` to FP8 and to its FP8 transpose
  (Hopper's FP8 GEMMs take only the ``TN`` layout, so the weight-gradient GEMM
  needs ``Xᵀ``): read 2, write 1 + 1 = :data:`FP8_CAST_BYTES` per element.
  When the norm before QKV / MLP-up writes FP8 directly (TE's
  ``LayerNormLinear``, no sequence parallelism) only the transpose remains,
  less the byte the norm no longer writes: 1 byte per element;
* GEMM bytes: ``m k + k n`` FP8 operands, ``2 m n`` bf16 output;
* backward: ``*.fp8_cast_grad`` casts ``dY`` (``m n``, 4 bytes per element),
  then the FP8 ``dgrad`` and ``wgrad`` GEMMs;
* the weights are cast once per step, not per micro-batch (TE caches the FP8
  weights from the first micro-batch): :func:`fp8_weight_params` and the
  generator's ``fp8_weight_cast`` op; the amax reductions are the generator's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from .errors import ConfigError, check_int, check_number
from .models import ModelSpec
from .ops import GEMM_CATEGORIES, Kernel
from .parallel import FP8_RECIPES, padded_vocab, resolve_recompute_modules, tp_split_widths

__all__ = [
    "LayerOp", "PassOps", "layer_ops", "embedding_ops", "logits_ops", "optimizer_op", "optimizer_step_ops",
    "accumulate_gradients",
    "backward_of", "model_flops_per_step", "hardware_flops_per_step", "narayanan_flops_per_step",
    "fp8_weight_params", "fp8_gemm_modules", "base_name", "RECOMPUTED_KERNELS",
    "ADAM_BYTES_PER_PARAM", "ADAM_FLOPS_PER_PARAM", "FP8_CAST_BYTES", "LSE_BYTES", "ring_attention_steps",
]

FP8_CAST_BYTES = 4
"""HBM bytes per element of Transformer Engine's cast-transpose of a bf16 tensor to FP8: read 2, write the
FP8 copy (1) and its FP8 transpose (1) (``fp8_cast_transpose_fused``; cuBLASLt's FP8 GEMMs on Hopper take
only the ``TN`` layout, so the backward GEMMs need the transposed copies)."""
ADAM_BYTES_PER_PARAM = 28
"""HBM bytes per parameter of one Adam step.

Mixed precision: read the 16-bit gradient (2) and fp32 master weight, momentum
and variance (12); write those three (12) and the 16-bit weight copy (2).
Pure fp32: read gradient, weight, momentum, variance (16), write the last
three (12). Both are 28.
"""
ADAM_FLOPS_PER_PARAM = 12
"""Approximate FLOPs per parameter of an Adam update with weight decay."""

RECOMPUTED_KERNELS: dict[str, dict[str, frozenset[str]]] = {
    "layernorm": {"input_norm": frozenset({"qkv", "q_proj", "q_down", "kv_down"}),
                  "mlp_norm": frozenset({"mlp_up", "shared_up", "router"})},
    "mla_up_proj": {name: frozenset({"attention"}) for name in ("q_norm", "kv_norm", "q_proj", "q_up", "kv_up")},
    "moe_act": {"experts_activation": frozenset({"experts_down"})},
}
"""The output-discarding recompute modules (Megatron-Core's ``layernorm``, ``mla_up_proj``, ``moe_act``):
module -> forward kernel it re-runs (by name; its FP8 cast, ``q_up.fp8_cast``, with it) -> the layers whose
backward first needs that kernel's output: the kernel is re-run right before them (where the backward first
touches the discarded tensor). ``core_attn`` (normal checkpointing) re-runs every kernel named
``attention…`` (the fused core, or the unfused scores, softmax, dropout and values) at the start of the
layer's backward, as ``full`` re-runs the whole forward."""

MLA_UP_PROJECTIONS = frozenset({"q_proj", "q_up", "kv_up"})
"""MLA's up projections (``q_proj`` stands for ``q_up`` without a query latent): the GEMMs ``mla_up_proj``
recomputes (with the latent norms before them, fused into them in Megatron-Core's TE layout) from the
latents kept (Megatron-Core's ``qkv_up_proj_and_rope_apply``)."""

CP_NEEDS_FUSED_ATTENTION = ("options.flash_attention: context parallelism runs fused attention only "
                            "(Transformer Engine); set flash_attention: true")
"""The error for unfused attention under context parallelism (checked at load: ``check_step_options``)."""


def base_name(name: str) -> str:
    """The layer a kernel belongs to: ``q_up`` of ``q_up.fp8_cast``, ``attention`` of ``attention.bwd``."""
    return name.split(".", 1)[0]


LOSS_BYTES = 4
"""Cross-entropy works on fp32 logits (Megatron's vocab-parallel loss upcasts)."""

CROSS_ENTROPY_BYTES = (31.3, 21.8)
"""HBM bytes Megatron-Core's vocab-parallel cross-entropy moves per logit of the rank's vocabulary shard, forward
and backward: measured, not derived from its passes (it upcasts to fp32 and makes several unfused ones). From
Liger-Kernel's benchmark of Megatron-Core's ``fused_vocab_parallel_cross_entropy`` (``cross_entropy_loss_fusion``)
on an H100 SXM (github.com/linkedin/Liger-Kernel, ``benchmark/data/all_benchmark_data_megatron.csv``, commit
7097ab9): bf16 logits of 2048 x 4 tokens over a 131,072 vocabulary, forward 11.80 ms and forward plus backward
20.02 ms (medians), at the model's 0.85 of the H100's 3.35 TB/s. The same table's 4,096-65,536 vocabularies scale
with it (0.61-10.1 ms in all); Megatron's unfused loss takes 16% longer still, a single-kernel Triton loss
(Liger's) a third of it. Two fp32 passes forward and three backward, as counted before, read 2.65x fast."""


@dataclass(frozen=True, slots=True)
class LayerOp:
    """One kernel on one TP rank.

    Attributes
    ----------
    name : str
        Kernel name, e.g. ``"qkv"``, ``"qkv.wgrad"``, ``"attention.bwd"``.
    category : str
        Efficiency class for the hardware model, one of :data:`workloads.ops.COMPUTE_CATEGORIES` (``scores``:
        element-wise kernels over the ``s × s`` attention scores of unfused attention; ``gemm_fp8``: a GEMM on
        FP8 operands; ``gemm_fp8_wgrad``: a weight gradient of blockwise FP8; ``fp8_cast``: an FP8 cast).
    flops : float
        Floating-point operations (multiply and add counted separately).
    nbytes : float
        HBM bytes read plus written.
    shape : tuple of int or None
        ``(m, n, k)`` of a GEMM (of each GEMM of a batch); ``(s_q, s_kv,
        head_dim)`` of a fused attention kernel; else ``None``.
    batch : int
        Independent problems of ``shape`` in one kernel: a batched GEMM
        (``b·a/t`` heads of ``Q Kᵀ``), or the ``b·a/t`` heads of a fused
        attention kernel. 1 for ordinary GEMMs.
    executed : float
        FLOPs the kernel executes per counted FLOP. 1 except for attention:
        a causal FlashAttention kernel skips the masked upper triangle
        (0.5 of the full ``s²`` that Megatron's formula counts), while the
        unfused kernels compute every score (2 when the causal half is
        counted).
    """

    name: str
    category: str
    flops: float
    nbytes: float
    shape: tuple[int, int, int] | None = None
    batch: int = 1
    executed: float = 1.0

    def kernel(self) -> Kernel:
        """The hardware view of this op: executed FLOPs, bytes, shape (see :class:`workloads.ops.Kernel`)."""
        return Kernel(self.category, self.flops * self.executed, self.nbytes, self.shape, self.batch)


class PassOps(NamedTuple):
    """The kernels of one micro-batch: forward in execution order, then backward."""

    forward: list[LayerOp]
    backward: list[LayerOp]

    @property
    def flops(self) -> float:
        """Forward plus backward FLOPs."""
        return sum(op.flops for op in self.forward) + sum(op.flops for op in self.backward)


# -------------------------------------------------------------- primitives
def _gemm(name: str, m: int, n: int, k: int, dtype_bytes: int, batch: int = 1, counted: float = 1.0) -> LayerOp:
    """``Y[m,n] = X[m,k] W[k,n]``, ``batch`` times: ``2mnk`` FLOPs each; reads X and W, writes Y.

    ``counted`` is the fraction of the executed FLOPs the counting convention
    counts (0.5: the causal half of an unfused attention GEMM that computes every score).
    """
    executed = 2.0 * batch * m * n * k
    return LayerOp(name, "gemm", executed * counted, float(dtype_bytes * batch * (m * k + k * n + m * n)),
                   (m, n, k), batch, 1.0 / counted)


def _gemm_fp8(name: str, m: int, n: int, k: int, out_bytes: int) -> LayerOp:
    """``Y[m,n] = X[m,k] W[k,n]`` on FP8 operands (1 byte each), ``out_bytes`` per output element."""
    return LayerOp(name, "gemm_fp8", 2.0 * m * n * k, float(m * k + k * n + out_bytes * m * n), (m, n, k))


def _linear(name: str, m: int, n: int, k: int, dtype_bytes: int, fp8: bool, norm_fused: bool = False
            ) -> list[LayerOp]:
    """A linear layer ``Y[m,n] = X[m,k] W[k,n]``: one GEMM, or under FP8 the cast of ``X`` and an FP8 GEMM.

    ``norm_fused``: the norm before it writes FP8 directly (TE ``LayerNormLinear``), leaving the transpose
    (read 1, write 1) less the byte per element the norm no longer writes: 1 byte per element of ``X``.
    """
    if not fp8:
        return [_gemm(name, m, n, k, dtype_bytes)]
    per_element = 1 if norm_fused else FP8_CAST_BYTES
    return [LayerOp(f"{name}.fp8_cast", "fp8_cast", 0.0, float(per_element * m * k)),
            _gemm_fp8(name, m, n, k, dtype_bytes)]


def _elementwise(name: str, elements: float, dtype_bytes: int) -> LayerOp:
    """A memory-bound kernel touching ``elements`` values (reads plus writes)."""
    return LayerOp(name, "elementwise", 0.0, float(elements * dtype_bytes))


def accumulate_gradients(backward: list[LayerOp], params: float, main_grad_bytes: int, dtype_bytes: int,
                         fused: bool) -> list[LayerOp]:
    """``backward`` with the accumulation of the weight gradients into the gradient buffer, per micro-batch.

    Megatron-LM keeps a ``main_grad`` buffer (``main_grad_bytes`` per element;
    fp32 for 16-bit training in current Megatron-Core) that every micro-batch's
    weight gradients are added into. With ``fused`` (``gradient_accumulation_fusion``,
    Megatron-Core's default) the weight-gradient GEMM accumulates into it in
    place: its output tile is read and written at ``main_grad_bytes`` instead of
    written at ``dtype_bytes``. Without it (Megatron-LM 2021, PyTorch autograd
    into ``.grad``) the GEMM writes a 16-bit gradient and a separate element-wise
    ``grad_accumulate`` reads it and the buffer and writes the buffer:
    ``params · (2 main_grad_bytes + dtype_bytes)`` bytes per micro-batch.
    """
    if not fused:
        return backward + [LayerOp("grad_accumulate", "elementwise", 0.0,
                                   params * (2 * main_grad_bytes + dtype_bytes))]
    out = []
    for op in backward:
        if (op.category in GEMM_CATEGORIES and op.name.endswith(".wgrad") and op.batch == 1
                and op.shape is not None):
            k, n, _m = op.shape  # the output of a weight-gradient GEMM is the weight
            op = LayerOp(op.name, op.category, op.flops, op.nbytes + (2 * main_grad_bytes - dtype_bytes) * k * n,
                         op.shape, op.batch, op.executed)
        out.append(op)
    return out


ROPE = "rope"
"""Name of the rotary position embedding's kernel (its backward rotates the Q and K gradients back: the same
bytes, not an element-wise kernel's 1.5x)."""

FLASH_BACKWARD_RECOMPUTE = 1.25
"""A FlashAttention backward executes 5 ``s × s`` matmuls to the forward's 2: it
recomputes ``Q Kᵀ`` besides the four gradient matmuls, so it executes 2.5x the
forward's FLOPs where the model counts 2x (Dao 2023, FlashAttention-2, section
3.1.2; its benchmark counts backward FLOPs as 2.5x forward, which is the
convention of the published backward TFLOP/s this model uses)."""


def backward_of(forward: list[LayerOp], fp8_recipe: str = FP8_RECIPES[0]) -> list[LayerOp]:
    """Backward kernels of ``forward``, in reverse order, by the module's rules.

    A GEMM ``Y = X W`` (``batch`` times) has two backward GEMMs of its FLOPs
    and batch: ``dX = dY Wᵀ`` (``(m, k, n)``, ``.dgrad``) and ``dW = Xᵀ dY``
    (``(k, n, m)``, ``.wgrad``). For a batched GEMM of two activations (``Q Kᵀ``,
    ``P V``) the two are the gradients of both operands, each still one GEMM per
    head: the batch is never folded into a GEMM dimension. An FP8 GEMM's
    backward first casts ``dY`` to FP8 (and its transpose), then runs both
    GEMMs on FP8 operands with a bf16 output; an FP8 cast has no backward.
    Under ``fp8_recipe`` ``blockwise`` the weight gradient is a
    ``gemm_fp8_wgrad`` (its own measured rate: :class:`~workloads.parallel.TrainingSpec`).
    """
    wgrad_category = "gemm_fp8_wgrad" if fp8_recipe == "blockwise" else "gemm_fp8"
    out: list[LayerOp] = []
    for op in reversed(forward):
        if op.category == "fp8_cast":
            continue
        if op.category == "gemm_fp8":
            assert op.shape is not None
            m, n, k = op.shape
            d = (op.nbytes - m * k - k * n) / (m * n)  # bytes of the output element
            out.append(LayerOp(f"{op.name}.fp8_cast_grad", "fp8_cast", 0.0, float(FP8_CAST_BYTES * m * n)))
            out.append(LayerOp(f"{op.name}.dgrad", "gemm_fp8", op.flops, m * n + n * k + d * m * k, (m, k, n)))
            out.append(LayerOp(f"{op.name}.wgrad", wgrad_category, op.flops, k * m + m * n + d * k * n, (k, n, m)))
        elif op.category == "gemm":
            assert op.shape is not None
            m, n, k = op.shape
            d = op.nbytes / (op.batch * (m * k + k * n + m * n))
            out.append(LayerOp(f"{op.name}.dgrad", "gemm", op.flops, op.nbytes, (m, k, n), op.batch, op.executed))
            out.append(LayerOp(f"{op.name}.wgrad", "gemm", op.flops, d * op.batch * (k * m + m * n + k * n),
                               (k, n, m), op.batch, op.executed))
        elif op.category == "attention":
            out.append(LayerOp(f"{op.name}.bwd", "attention_bwd", 2 * op.flops, 2 * op.nbytes, op.shape, op.batch,
                               op.executed * FLASH_BACKWARD_RECOMPUTE))
        else:
            out.append(LayerOp(f"{op.name}.bwd", op.category, 0.0, (1.0 if op.name == ROPE else 1.5) * op.nbytes))
    return out


# ------------------------------------------------------------------ layers
def _unfused_attention(model: ModelSpec, b: int, s: int, t: int, d: int, causal: bool) -> list[LayerOp]:
    """Megatron-LM's attention before fused kernels (2021-22): the ``s × s`` scores go through HBM.

    Per TP rank with ``a/t`` heads of width ``d_h``: batched GEMM ``Q Kᵀ``
    (``b·a/t`` GEMMs of ``s × s × d_h``: ``2 b s² h / t`` FLOPs, writes the
    scores), fused scale-mask-softmax (reads and writes them), dropout (reads
    them, writes them and a 1-byte mask; none when ``model.dropout`` is 0), batched GEMM ``P V`` (``b·a/t`` GEMMs
    of ``s × d_h × s``, reads the scores). Every score is computed, masked or
    not; ``causal`` only halves what is counted.
    """
    qw, kw, vw, ow = model.attention_widths
    heads = model.heads // t
    batch = b * heads
    scores = batch * s * s
    counted = 0.5 if causal else 1.0
    qk = _gemm("attention_scores", s, s, model.qk_head_dim, d, batch, counted)
    pv = _gemm("attention_values", s, model.v_dim, s, d, batch, counted)
    # Q and K (V and O) are ``b s h / t`` (``b s kv / t``) wide: GQA shares K, V between query heads
    # (MLA: the widths of :attr:`ModelSpec.attention_widths`).
    dropout = [LayerOp("attention_dropout", "scores", 0.0, scores * (2 * d + 1))] if model.dropout else []
    return [
        LayerOp(qk.name, "gemm", qk.flops, d * (b * s * (qw + kw) / t + scores), qk.shape, batch, qk.executed),
        LayerOp("attention_softmax", "scores", 0.0, float(2 * scores * d)),
        *dropout,  # none at model.dropout 0 (PyTorch's dropout returns its input)
        LayerOp(pv.name, "gemm", pv.flops, d * (scores + b * s * (vw + ow) / t), pv.shape, batch, pv.executed),
    ]


def _attention_forward(model: ModelSpec, b: int, s: int, t: int, rows: int, d: int,
                       causal: bool, flash_attention: bool = True, fp8: bool = False, cp: int = 1,
                       cp_comm_type: str = "p2p") -> list[LayerOp]:
    if model.is_mla:
        return _mla_forward(model, b, s, t, rows, d, causal, flash_attention, fp8, cp, cp_comm_type)
    h, kv, q = model.hidden, model.kv_hidden, model.q_hidden
    tokens = b * s // cp
    if flash_attention:
        # A causal FlashAttention kernel computes only the unmasked half of the scores.
        counted = 0.5 if causal else 1.0
        core_flops = 4.0 * b * s * s * q / t * counted / cp
        if cp > 1 and cp_comm_type in ("p2p", "all_gather"):  # Q, O local, all of K, V
            # ring steps of s/cp x s/cp blocks; all-gather: the local queries over the whole sequence
            shape = (s // cp, s // cp if cp_comm_type == "p2p" else s, model.head_dim)
            heads = b * model.heads // t
            core_bytes = d * b * (2 * q * s // cp + 2 * kv * s) / t
        else:  # the whole sequence for 1/cp of the heads (a2a), or no CP
            shape, heads = (s, s, model.head_dim), b * model.heads // (t * cp)
            core_bytes = d * b * s * (2 * q + 2 * kv) / (t * cp)
        core = [LayerOp("attention", "attention", core_flops, core_bytes, shape, heads, 0.5 / counted)]
    else:
        if cp > 1:
            raise ConfigError(CP_NEEDS_FUSED_ATTENTION)
        core = _unfused_attention(model, b, s, t, d, causal)
    # rotary position embedding on the rank's Q and K heads (read and write each; none with learned positions):
    # Megatron-Core's fused kernel (TE fused_apply_rotary_pos_emb) as a memory-bound kernel of its own. A fused
    # RoPE measured 0.69 of an A100's HBM bandwidth (Liger-Kernel's, the same work: 2,048 tokens of 32 query and
    # 8 key heads, 0.0595 ms); TE's kernel has no published timing, so it streams at the element-wise rate.
    rope = [] if model.learned_positions else [_elementwise(ROPE, 2 * tokens * (q + kv) / t, d)]
    return [
        _elementwise("input_norm", 2 * rows * h, d),
        *_linear("qkv", tokens, (q + 2 * kv) // t, h, d, fp8, norm_fused=rows == tokens),
        *rope,
        *core,
        *_linear("attn_out", tokens, h, q // t, d, fp8),
        _elementwise("attn_residual", 3 * rows * h, d),
    ]


LSE_BYTES = 4
"""Bytes per value of a fused attention kernel's softmax statistics (the log-sum-exp per query and head: fp32,
the ``softmax_lse`` Transformer Engine's fused attention returns)."""


def ring_attention_steps(op: LayerOp, model: ModelSpec, micro_batch: int, seq_len: int, tp: int, cp: int,
                         rank: int, dtype_bytes: int = 2) -> list[list[LayerOp]]:
    """The kernels of ring attention's ``cp`` steps on CP rank ``rank`` (its index in the CP group), in order,
    as Transformer Engine runs them with a causal mask over the load-balanced split (``2 cp`` chunks, rank ``r``
    holding ``r`` and ``2 cp - 1 - r``): ``AttnFuncWithCPAndKVP2P`` of
    ``transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py`` (TE >= 2.2; Megatron-Core's
    ``sbhd`` layout, 16-bit attention). ``op`` is the layer's ``attention`` (its forward, or the recomputed
    one) or ``attention.bwd`` kernel of :func:`layer_ops` with ``cp_comm_type="p2p"``; item ``j`` holds step
    ``j``'s kernels, the last also what runs after the loop.

    Attention: every step does ``1 / cp`` of ``op``'s FLOPs (half of an ``s/cp × s/cp`` block) and bytes. The
    diagonal step (forward ``i = 0``, the rank's own K, V; backward ``i = cp - 1``) runs the causal kernel
    (``op``'s category) on ``(s/cp, s/cp)``; the others run without a mask (``attention_nomask[_bwd]``,
    ``cp_p2p_fwd_fused_attn`` / ``cp_p2p_bwd_fused_attn``'s ``no_mask``): a block from an earlier rank
    ("lower-triangle": forward ``1 <= i <= rank``, backward ``i >= cp - 1 - rank``) with all the queries over
    the first half of its keys, shape ``(s/cp, s/(2cp))``; one from a later rank ("upper-triangle") with the
    second half of the queries over all its keys, ``(s/(2cp), s/cp)``.

    Merges (``elementwise``, memory-bound), over the rank's ``O = b s/cp a d_v / t`` output, ``Q``, ``K``, ``V``
    elements (``dtype_bytes`` each) and ``L = b s/cp a / t`` statistics (:data:`LSE_BYTES` each); a copy
    reads and writes (2 per element), an add reads both and writes (3), each slice its own kernel:

    * forward, after step ``i``'s attention, step ``i - 1``'s statistics (the last step's after the loop):
      ``torch.clone`` of the first (``2 L``), ``flash_attn_fwd_softmax_lse_correction`` (``3 L``; for an
      upper step ``flash_attn_fwd_second_half_softmax_lse_correction``, ``3 L / 2``);
    * forward, after the loop, each step's output: ``flash_attn_fwd_out_correction_init`` for step 0 (reads
      its output and both statistics, writes the output: ``2 O + 2 L``), ``flash_attn_fwd_out_correction`` for
      a lower step (reads the step's output and both statistics, reads and writes the output: ``3 O + 2 L``),
      ``flash_attn_fwd_second_half_out_correction`` for an upper one (half of that);
    * backward, after each step, its partial ``dq`` into ``dq_buffer`` and ``dk``, ``dv`` into the received
      ``dkv`` (``copy_`` / ``add_`` on the whole tensor or one half, by section, as the code's branches).
    """
    check_int("cp", cp)
    if not 0 <= rank < cp:
        raise ConfigError(f"rank: {rank} is outside 0..{cp - 1}")
    if op.shape is None:
        raise ConfigError(f"{op.name}: ring attention needs a fused attention kernel with its shape")
    backward = op.category == "attention_bwd"
    qw, kw, vw, ow = model.attention_widths
    tokens, d = micro_batch * seq_len // cp, dtype_bytes
    q_el, k_el, v_el, o_el = (tokens * w / tp for w in (qw, kw, vw, ow))
    lse = float(tokens * (model.heads // tp) * LSE_BYTES)  # bytes of the rank's statistics
    full, half, hd = seq_len // cp, seq_len // (2 * cp), op.shape[2]
    no_mask = "attention_nomask_bwd" if backward else "attention_nomask"
    shapes = {"diagonal": (full, full, hd), "lower": (full, half, hd), "upper": (half, full, hd)}

    def section(i: int) -> str:
        if backward:
            return "diagonal" if i == cp - 1 else "lower" if i >= cp - 1 - rank else "upper"
        return "diagonal" if i == 0 else "lower" if i <= rank else "upper"

    def attention(i: int) -> LayerOp:
        where = section(i)
        return LayerOp(f"{op.name}.{where}", op.category if where == "diagonal" else no_mask, op.flops / cp,
                       op.nbytes / cp, shapes[where], op.batch, op.executed)

    def merge(name: str, nbytes: float) -> LayerOp:
        return LayerOp(f"{op.name}.{name}", "elementwise", 0.0, float(nbytes))

    def copy(name: str, elements: float) -> LayerOp:
        return merge(f"{name}_copy", 2 * elements * d)

    def add(name: str, elements: float) -> LayerOp:
        return merge(f"{name}_add", 3 * elements * d)

    steps = [[attention(i)] for i in range(cp)]
    if not backward:
        def lse_merge(i: int) -> LayerOp:
            return merge("lse_correction", 2 * lse if i == 0 else 3 * lse / (2 if section(i) == "upper" else 1))

        def out_merge(i: int) -> LayerOp:
            if i == 0:
                return merge("out_correction", 2 * o_el * d + 2 * lse)
            return merge("out_correction", (3 * o_el * d + 2 * lse) / (2 if section(i) == "upper" else 1))

        for i in range(1, cp):
            steps[i].append(lse_merge(i - 1))
        steps[-1] += [lse_merge(cp - 1), *(out_merge(i) for i in range(cp))]
        return steps
    first_lower = cp - 1 - rank
    for i, kernels in enumerate(steps):
        where = section(i)
        if i > first_lower:                 # dq.add_(dq_)
            kernels.append(add("dq", q_el))
        elif i == first_lower:
            kernels += ([copy("dq", q_el)] if rank == cp - 1  # dq.copy_(dq_)
                        else [copy("dq", q_el / 2), add("dq", q_el / 2)])  # dq[0].copy_(dq_[0]), dq[1].add_(dq_[1])
        else:                               # dq[1].add_(dq_) (dq[1].copy_(dq_) at i = 0)
            kernels.append(add("dq", q_el / 2) if i else copy("dq", q_el / 2))
        for name, x in (("dk", k_el), ("dv", v_el)):
            if where == "diagonal":         # dk[0].add_(dk_[0]), dk[1].copy_(dk_[1]) on rank 0; else dk.add_(dk_)
                kernels += [add(name, x / 2), copy(name, x / 2)] if rank == 0 else [add(name, x)]
            elif where == "lower":          # dk[0].add_(dk_) (dk[0].copy_(dk_) at i = 0 on rank cp - 1)
                kernels.append(copy(name, x / 2) if i == 0 else add(name, x / 2))
            else:                           # dk.add_(dk_) (dk.copy_(dk_) at i = 0)
                kernels.append(add(name, x) if i else copy(name, x))
    return steps


def _mla_forward(model: ModelSpec, b: int, s: int, t: int, rows: int, d: int, causal: bool,
                 flash_attention: bool, fp8: bool, cp: int, cp_comm_type: str) -> list[LayerOp]:
    """Multi-head latent attention (DeepSeek-V2/V3) on one TP rank, as Megatron-Core's ``MLASelfAttention``.

    ``q_down`` (``h -> q_lora_rank``) and ``kv_down`` (``h -> kv_lora_rank + qk_rope_head_dim``) are
    replicated over TP (``parallel_mode="duplicated"``) and run on the rank's ``rows`` tokens (its
    sequence-parallel share, or all of them without SP); the latent RMSNorms ``q_norm`` and ``kv_norm``
    likewise; ``q_up`` (``q_lora_rank -> a d_qk``) and ``kv_up`` (``kv_lora_rank -> a (d_nope + d_v)``)
    are column-parallel and ``attn_out`` (``a d_v -> h``) row-parallel by heads. The fused attention kernel
    computes ``Q Kᵀ`` at head width ``d_qk`` and ``P V`` at ``d_v``: ``2 b s² a (d_qk + d_v) / t`` FLOPs
    (full ``s²``, halved with ``causal``), reads Q, K, V and writes O; its rate is looked up at the
    equal-FLOP head width :attr:`ModelSpec.attention_head_dim`. RoPE (:data:`ROPE`) rotates the ``a/t`` query
    heads' and the shared key's ``qk_rope_head_dim``-wide parts: read and write each.
    """
    h = model.hidden
    tokens = b * s // cp
    qw, kw, vw, ow = model.attention_widths
    proj = model.mla_projections()
    ops = [_elementwise("input_norm", 2 * rows * h, d)]
    for name in ("q_down", "kv_down"):
        if name in proj:
            k, n, _split = proj[name]
            ops += _linear(name, rows, n, k, d, fp8)
    if model.q_lora_rank is not None:
        ops.append(_elementwise("q_norm", 2 * rows * model.q_lora_rank, d))
    ops.append(_elementwise("kv_norm", 2 * rows * model.kv_lora_rank, d))  # type: ignore[operator]
    for name in ("q_proj", "q_up", "kv_up"):
        if name in proj:
            k, n, _split = proj[name]
            ops += _linear(name, tokens, n // t, k, d, fp8, norm_fused=rows == tokens)
    rope_width = model.heads // t * model.qk_rope_head_dim + model.qk_rope_head_dim  # type: ignore[operator]
    ops.append(_elementwise(ROPE, 2 * tokens * rope_width, d))
    if flash_attention:
        counted = 0.5 if causal else 1.0
        core_flops = 2.0 * b * s * s * (qw + ow) / t * counted / cp
        hd = model.attention_head_dim
        if cp > 1 and cp_comm_type in ("p2p", "all_gather"):  # Q, O local, all of K, V
            shape = (s // cp, s // cp if cp_comm_type == "p2p" else s, hd)
            heads = b * model.heads // t
            core_bytes = d * b * ((qw + ow) * s // cp + (kw + vw) * s) / t
        else:
            shape, heads = (s, s, hd), b * model.heads // (t * cp)
            core_bytes = d * b * s * (qw + kw + vw + ow) / (t * cp)
        ops.append(LayerOp("attention", "attention", core_flops, core_bytes, shape, heads, 0.5 / counted))
    else:
        if cp > 1:
            raise ConfigError(CP_NEEDS_FUSED_ATTENTION)
        ops += _unfused_attention(model, b, s, t, d, causal)
    k, n, _split = proj["attn_out"]
    return ops + [*_linear("attn_out", tokens, n, k // t, d, fp8),
                  _elementwise("attn_residual", 3 * rows * h, d)]


def _mlp_forward(prefix: str, model: ModelSpec, tokens: int, width: int, d: int, fp8: bool = False,
                 norm_fused: bool = False) -> list[LayerOp]:
    """Up (gate+up fused when gated), activation, down for ``tokens`` rows of a ``width``-wide MLP shard."""
    h, gates = model.hidden, model.mlp_matrices - 1
    act_elements = tokens * width * (gates + 1)  # read 1 (GeLU) or 2 (SwiGLU) inputs, write 1
    return [
        *_linear(f"{prefix}_up", tokens, gates * width, h, d, fp8, norm_fused),
        # (its own category: Megatron's fused activation streams at a measured fraction of HBM of its own,
        # simulator.compute.ComputeModel.activation_memory_efficiency)
        LayerOp(f"{prefix}_activation", "activation", 0.0, float(act_elements * d)),
        *_linear(f"{prefix}_down", tokens, h, width, d, fp8),
    ]


def _moe_forward(model: ModelSpec, tokens: int, rows: int, t: int, d: int, fp8: bool = False) -> list[LayerOp]:
    h, k = model.hidden, model.top_k
    width = model.expert_ffn_hidden // t
    ops = [_gemm("router", rows, model.experts, h, d),
           _elementwise("moe_permute", 2 * rows * k * h, d)]
    ops += _mlp_forward("experts", model, tokens * k, width, d, fp8)
    ops.append(_elementwise("moe_unpermute", 2 * rows * k * h, d))
    if model.shared_experts:
        ops += _mlp_forward("shared", model, tokens, model.shared_experts * width, d, fp8)
    return ops


def fp8_gemm_modules(model: ModelSpec, layer: int, ep: int = 1) -> int:
    """FP8 GEMMs of layer ``layer`` on one EP rank, each with its own FP8 scaling state (amax history).

    Dense: QKV, output projection, MLP up and down (4; MLA: its five projections instead of two). MoE:
    the attention GEMMs, up and down of each
    of the ``experts / ep`` local experts (TE ``GroupedLinear`` keeps one state per expert GEMM) and of the
    shared-expert MLP. Transformer Engine keeps 3 forward (input, weight, output) and 2 backward (output
    gradient, input gradient) scaling entries per GEMM.
    """
    attention = len(model.mla_projections()) or 2  # MLA: q_down, q_up, kv_down, kv_up, attn_out
    if not model.is_moe_layer(layer):
        return attention + 2
    return attention + 2 * (model.experts // ep) + (2 if model.shared_experts else 0)


def fp8_weight_params(model: ModelSpec, layer: int, tp: int = 1, ep: int = 1,
                      etp: int | None = None) -> tuple[int, int]:
    """Weights of the FP8 GEMMs of layer ``layer`` on one TP/EP rank: ``(dense, routed_experts)`` (routed
    experts split over ``etp``, default ``tp``).

    The matrices of :func:`fp8_gemm_modules`: attention QKV and output projection, the MLP (dense, or the
    local routed experts and the shared experts). Biases, norms and the router stay in bf16.
    """
    h = model.hidden
    attention = model.attention_matmul_params(tp)
    if not model.is_moe_layer(layer):
        return attention + model.mlp_matrices * h * model.ffn_hidden // tp, 0
    one = model.mlp_matrices * h * model.expert_ffn_hidden // tp
    routed = model.mlp_matrices * h * model.expert_ffn_hidden // (etp or tp)
    return attention + model.shared_experts * one, model.experts // ep * routed


def _check_tokens(model: object, batch: int, seq_len: int, batch_field: str = "micro_batch") -> None:
    """Refuse, in one line naming the argument, what the public FLOP and kernel functions cannot count: a model
    that is not a :class:`~workloads.models.ModelSpec` (a preset's name), a batch or sequence length that is not a
    positive integer (-1 gave negative FLOPs, 2.5 a fraction of a sequence)."""
    if not isinstance(model, ModelSpec):
        raise TypeError(f"model: must be a ModelSpec (workloads.get_preset(name), model_from_dict(section)), "
                        f"got {type(model).__name__} {model!r:.60}")
    check_int(batch_field, batch)
    check_int("seq_len", seq_len)


def _check_tp(model: ModelSpec, tp: int) -> None:
    """``tp`` a positive integer dividing every width the layer splits over TP (heads, key/value heads, the MLP
    and expert widths), as ``parallel.tp`` must: 7 over 96 heads cut a GEMM to a fraction of a column."""
    check_int("tp", tp)
    for field, width in tp_split_widths(model):
        if width % tp:
            raise ConfigError(f"tp: {tp} does not divide model.{field}={width}")


def layer_ops(model: ModelSpec, micro_batch: int, seq_len: int, tp: int = 1, *, layer: int = 0,
              sequence_parallel: bool = False, dtype_bytes: int = 2, causal: bool = False,
              flash_attention: bool = True, fp8: bool = False, cp: int = 1, cp_comm_type: str = "p2p",
              fp8_recipe: str = FP8_RECIPES[0]) -> PassOps:
    """Kernels of transformer layer ``layer`` on one TP rank for one micro-batch.

    Parameters
    ----------
    model : ModelSpec
    micro_batch : int
        Sequences per micro-batch ``b``.
    seq_len : int
        Tokens per sequence ``s``.
    tp : int, default 1
        Tensor-parallel degree ``t`` (must divide heads, kv_heads, ffn widths).
    layer : int, default 0
        Layer index (selects dense or MoE MLP).
    sequence_parallel : bool, default False
        Element-wise kernels on ``s / t`` tokens (no-op for ``t = 1``).
    dtype_bytes : int, default 2
        Bytes per activation / weight element.
    causal : bool, default False
        Count only the causal half of the attention matrix. The default counts
        the full ``s^2`` like Narayanan et al.'s formula, so MFU is comparable
        with published numbers.
    flash_attention : bool, default True
        One fused attention kernel (FlashAttention). False: the unfused
        kernels of 2021-22 Megatron-LM, whose ``s × s`` scores go through HBM
        (same FLOPs, far more bytes).
    fp8 : bool, default False
        Transformer Engine FP8: the linear layers' GEMMs on FP8 operands with
        their casts (module docstring); ``dtype_bytes`` stays the bf16 of
        everything else.
    cp : int, default 1
        Context-parallel degree: this rank's ``seq_len / cp`` tokens and
        ``1 / cp`` of the attention (module docstring); ``seq_len`` stays the
        whole sequence.
    cp_comm_type : {"p2p", "all_gather", "a2a"}
        Ring attention, all-gather or all-to-all (the attention kernel's
        shape and heads).
    fp8_recipe : {"tensorwise", "blockwise"}
        FP8 scaling (:class:`~workloads.parallel.TrainingSpec`): ``blockwise``
        weight gradients are ``gemm_fp8_wgrad`` kernels (:func:`backward_of`).

    Returns
    -------
    PassOps
        ``forward``: input_norm, qkv, attention, attn_out, attn_residual,
        mlp_norm, MLP (``mlp_up``, ``mlp_activation``, ``mlp_down``, or the MoE
        ops), mlp_residual (multi-head latent attention: ``q_down``, ``kv_down``,
        ``q_norm``, ``kv_norm``, ``q_up``, ``kv_up`` in place of qkv, see
        :func:`_mla_forward`); ``backward``: see :func:`backward_of`.

    Examples
    --------
    >>> from workloads.models import get_preset
    >>> m = get_preset("gpt3-175b")
    >>> fwd = layer_ops(m, 1, 2048).forward
    >>> sum(op.flops for op in fwd) == 24 * 2048 * 12288**2 + 4 * 2048**2 * 12288
    True
    """
    _check_tokens(model, micro_batch, seq_len)
    _check_tp(model, tp)
    b, s, t, d = micro_batch, seq_len, tp, dtype_bytes
    tokens = b * s // cp
    rows = tokens // t if (sequence_parallel and t > 1) else tokens  # element-wise rows
    h = model.hidden
    fwd = _attention_forward(model, b, s, t, rows, d, causal, flash_attention, fp8, cp, cp_comm_type)
    fwd.append(_elementwise("mlp_norm", 2 * rows * h, d))
    if model.is_moe_layer(layer):
        fwd += _moe_forward(model, tokens, rows, t, d, fp8)
    else:
        fwd += _mlp_forward("mlp", model, tokens, model.ffn_hidden // t, d, fp8, norm_fused=rows == tokens)
    fwd.append(_elementwise("mlp_residual", 3 * rows * h, d))
    return PassOps(fwd, backward_of(fwd, fp8_recipe))


EMBEDDING_GRAD_ACCUMULATE = "embedding.grad_accumulate"
"""Name of :func:`embedding_gradient_accumulation`'s kernel (part of the embedding's weight gradient)."""


def embedding_gradient_accumulation(params: float, dtype_bytes: int, main_grad_bytes: int) -> LayerOp:
    """The dense gradient of ``params`` embedding parameters (one TP rank's vocabulary shard, and a learned
    position table) added into the gradient buffer, per micro-batch: ``params · (2 d + 2 main_grad_bytes)`` bytes.

    An embedding lookup's backward (PyTorch's ``embedding_dense_backward``, which Megatron-Core's
    ``VocabParallelEmbedding`` runs) zero-fills a dense gradient of the whole table (``d`` bytes an element) before
    it adds the rows in; Megatron's gradient hook then adds it into the ``main_grad`` buffer
    (``param.main_grad.add_(param.grad)``: read ``d``, read and write ``main_grad_bytes``). Weight-gradient GEMM
    fusion cannot apply: the lookup is not a GEMM. So this kernel runs every micro-batch, fusion or not.
    """
    return LayerOp(EMBEDDING_GRAD_ACCUMULATE, "elementwise", 0.0, params * (2 * dtype_bytes + 2 * main_grad_bytes))


def embedding_ops(model: ModelSpec, micro_batch: int, seq_len: int, tp: int = 1, *,
                  dtype_bytes: int = 2) -> PassOps:
    """Word (+ position) embedding lookup on one TP rank of the first stage.

    Vocab-parallel: each rank gathers the rows of its vocabulary shard into a
    full ``b s h`` partial result (then all-reduced or reduce-scattered over
    TP by the generator). No FLOPs; backward is a scatter-add of the gradient.
    """
    rows, h = micro_batch * seq_len, model.hidden
    per_row = 2 + (3 if model.learned_positions else 0)  # gather + write, (+ read pos, add, write)
    fwd = [_elementwise("embedding", per_row * rows * h, dtype_bytes)]
    return PassOps(fwd, backward_of(fwd))


def logits_ops(model: ModelSpec, micro_batch: int, seq_len: int, tp: int = 1, *,
               sequence_parallel: bool = False, dtype_bytes: int = 2,
               vocab: int | None = None) -> PassOps:
    """Final norm, output-layer GEMM and cross-entropy on one TP rank of the last stage.

    Parameters
    ----------
    vocab : int, optional
        Vocabulary the GEMM runs over; default the Megatron-padded
        ``padded_vocab(model.vocab, tp)``.

    Notes
    -----
    The output GEMM is ``(b s) x (V / t) x h``: ``2 b s h V / t`` FLOPs forward.
    The vocab-parallel cross-entropy moves :data:`CROSS_ENTROPY_BYTES` per logit
    of the shard, forward and backward (measured on Megatron-Core's kernels).
    """
    b, s, t, d = micro_batch, seq_len, tp, dtype_bytes
    tokens, h = b * s, model.hidden
    rows = tokens // t if (sequence_parallel and t > 1) else tokens
    v = (vocab or padded_vocab(model.vocab, t)) // t
    forward_bytes, backward_bytes = CROSS_ENTROPY_BYTES
    fwd = [
        _elementwise("final_norm", 2 * rows * h, d),
        _gemm("logits", tokens, v, h, d),
        LayerOp("cross_entropy", "elementwise", 0.0, forward_bytes * tokens * v),
    ]
    return PassOps(fwd, [LayerOp("cross_entropy.bwd", "elementwise", 0.0, backward_bytes * tokens * v),
                         *backward_of(fwd[:2])])


def optimizer_op(params_per_gpu: float) -> LayerOp:
    """One Adam update over the ``params_per_gpu`` parameters this GPU updates.

    Bytes: :data:`ADAM_BYTES_PER_PARAM` (28) per parameter; FLOPs:
    :data:`ADAM_FLOPS_PER_PARAM` (~12). With ZeRO >= 1 pass the rank's shard.
    """
    check_number("params_per_gpu", params_per_gpu)
    return LayerOp("optimizer", "optimizer", ADAM_FLOPS_PER_PARAM * params_per_gpu,
                   ADAM_BYTES_PER_PARAM * params_per_gpu)


def optimizer_step_ops(shard_params: float, local_params: float, grad_bytes: int,
                       dtype_bytes: int = 2, fp8_shard_params: float = 0.0, fp32_main_grads: bool = False
                       ) -> tuple[list[LayerOp], list[LayerOp]]:
    """The memory-bound kernels of one optimizer step, as Megatron-LM runs them (``optimizer.step()``).

    Returns ``(before, after)`` the global gradient-norm all-reduce:

    * before — ``grad_norm``: ``multi_tensor_l2norm`` reads the ``shard_params``
      gradients the optimizer owns (``grad_bytes`` each; Megatron keeps fp32
      ``main_grad`` buffers for 16-bit training).
    * after — ``optimizer``: fused Adam over the shard with fp32 master weights:
      reads the gradient, master weight, momentum and variance, writes the last
      three (``grad_bytes + 24`` bytes; pure fp32 training: 28); ``param_copy``:
      the updated fp32 master weights cast to the 16-bit model weights (reads 4,
      writes ``dtype_bytes``; not in pure fp32; the ``fp8_shard_params`` FP8
      weights of ``training.fp8_param_gather`` are cast straight to FP8: reads
      4, writes 1, TE's ``cast_master_weights_to_fp8`` under delayed scaling);
      ``zero_grad``: the memset of
      the gradient buffer of all ``local_params`` for the next step
      (``zero_grad_buffer``).

    With ``fp32_main_grads`` (16-bit gradients, Megatron's ``Float16OptimizerWithFloat16Params``) the step
    first copies them to fp32 main grads (``grad_copy``: reads ``grad_bytes``, writes 4), which the norm and
    Adam then read (4 bytes each).

    Gradient clipping's rescale (only when the norm exceeds the threshold) and fp16's loss-scale unscaling are
    left out. All are streaming kernels: their cost is their HBM bytes.
    """
    mixed = dtype_bytes < 4
    main = 4 if fp32_main_grads else grad_bytes  # the gradient the optimizer reads
    adam = main + 24
    before = [LayerOp("grad_norm", "optimizer", 2.0 * shard_params, main * shard_params)]
    if fp32_main_grads:
        before.insert(0, LayerOp("grad_copy", "optimizer", 0.0, (grad_bytes + 4) * shard_params))
    after = [LayerOp("optimizer", "optimizer", ADAM_FLOPS_PER_PARAM * shard_params, adam * shard_params)]
    if mixed:
        after.append(LayerOp("param_copy", "optimizer", 0.0,
                             (4 + dtype_bytes) * (shard_params - fp8_shard_params) + 5 * fp8_shard_params))
    after.append(LayerOp("zero_grad", "optimizer", 0.0, grad_bytes * local_params))
    return before, after


# ------------------------------------------------------------- step totals
def narayanan_flops_per_step(model: ModelSpec, global_batch: int, seq_len: int,
                             full_recompute: bool = False) -> float:
    """Narayanan et al. (SC'21) closed form for a GPT-style model, FLOPs per step.

    ``72 B s l h^2 (1 + s/(6h) + V/(12 l h))`` without recomputation and
    ``96 B s l h^2 (1 + s/(6h) + V/(16 l h))`` with full recomputation. Exact
    only for GPT-style layers (ungated MLP of width ``4h``, ``kv_heads ==
    heads``, dense); use :func:`model_flops_per_step` for anything else.
    """
    _check_tokens(model, global_batch, seq_len, "global_batch")
    B, s, l, h, V = global_batch, seq_len, model.layers, model.hidden, model.vocab
    if full_recompute:
        return 96.0 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    return 72.0 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h))


def _matmul_params_per_token(model: ModelSpec, index: int) -> int:
    """Weights of layer ``index`` one token multiplies by (MoE: router, top-k and shared experts)."""
    h = model.hidden
    attn = model.attention_matmul_params()
    if not model.is_moe_layer(index):
        return attn + model.mlp_matrices * h * model.ffn_hidden
    experts = (model.top_k + model.shared_experts) * model.mlp_matrices * h * model.expert_ffn_hidden
    return attn + h * model.experts + experts


def _layer_forward_flops(model: ModelSpec, tokens: int, seq_len: int, causal: bool) -> float:
    """Forward FLOPs of all layers: ``2 N_layer T`` plus the attention ``4 s q T`` per layer (``q`` the
    query width, ``h`` unless ``kv_channels`` says otherwise; MLA: ``2 s a (d_qk + d_v) T``)."""
    weights = sum(_matmul_params_per_token(model, i) for i in range(model.layers))
    return (2.0 * weights + _attention_core_flops(model, seq_len, causal)) * tokens


def _attention_core_flops(model: ModelSpec, seq_len: int, causal: bool) -> float:
    """Forward FLOPs of ``Q Kᵀ`` and ``P V`` per token, all layers: ``4 s q l`` (MLA: ``2 s a (d_qk + d_v)
    l``), halved with ``causal``."""
    if model.is_mla:
        qw, _kw, _vw, ow = model.attention_widths
        return 2.0 * seq_len * (qw + ow) * model.layers * (0.5 if causal else 1.0)
    return 4.0 * seq_len * model.q_hidden * model.layers * (0.5 if causal else 1.0)


def model_flops_per_step(model: ModelSpec, global_batch: int, seq_len: int, *,
                         causal: bool = False) -> float:
    """Model FLOPs of one training step (any dense or MoE model).

    ``6 N T + 12 l h s T``: ``N`` is the matmul weights a token uses (all
    layers, MoE: router plus top-k and shared experts; plus the output layer
    ``V h``), ``T = B s`` tokens, and ``12 l h s T`` the attention score and
    value matmuls (``6 l h s T`` with ``causal``). For GPT-style models this
    equals :func:`narayanan_flops_per_step` exactly. Input-embedding lookups,
    norms and element-wise work are not counted (the usual MFU convention).
    """
    _check_tokens(model, global_batch, seq_len, "global_batch")
    tokens = global_batch * seq_len
    output_layer = 6.0 * model.hidden * model.vocab * tokens
    return 3.0 * _layer_forward_flops(model, tokens, seq_len, causal) + output_layer


def hardware_flops_per_step(model: ModelSpec, global_batch: int, seq_len: int, *,
                            recompute: str = "none", causal: bool = False,
                            recompute_modules: Sequence[str] | None = None) -> float:
    """Model FLOPs plus what activation recomputation executes again.

    ``full`` repeats the forward of every layer (Narayanan et al.'s 96 instead
    of 72 for the layer terms); ``selective`` repeats what ``recompute_modules``
    names (default ``core_attn``, :class:`~workloads.parallel.ParallelConfig`):
    the attention core's forward (``4 B s^2 l h``, halved with ``causal``: the ``QKᵀ`` and ``PV`` GEMMs
    Megatron re-runs; Korthikanti et al. 2022's published HFU count ``12 B s^2 l h``, i.e.
    ``72 B s l h² (1 + s/3h + V/12lh)``, so their HFU reads 1-3.5% above ours for the same step) and, with
    ``mla_up_proj``, MLA's query and key/value up
    projections (``2 k n`` per token and layer each). ``layernorm`` and
    ``moe_act`` re-run element-wise kernels, which model FLOPs do not count.
    """
    flops = model_flops_per_step(model, global_batch, seq_len, causal=causal)
    tokens = global_batch * seq_len
    if recompute == "full":
        flops += _layer_forward_flops(model, tokens, seq_len, causal)
    elif recompute == "selective":
        modules = resolve_recompute_modules(recompute, recompute_modules)
        if "core_attn" in modules:
            if model.is_mla:
                flops += _attention_core_flops(model, seq_len, causal) * tokens
            else:
                flops += 4.0 * seq_len * model.q_hidden * model.layers * tokens * (0.5 if causal else 1.0)
        if "mla_up_proj" in modules:
            up = sum(2.0 * k * n for name, (k, n, _split) in model.mla_projections().items()
                     if name in MLA_UP_PROJECTIONS)
            flops += up * model.layers * tokens
    elif recompute != "none":
        raise ConfigError(f"parallel.recompute: {recompute!r} is not valid; valid: none, selective, full")
    return flops
