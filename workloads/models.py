"""Transformer model descriptions: shapes, parameter counts and named presets.

A :class:`ModelSpec` is the architecture of a decoder-only transformer, dense or
mixture-of-experts, with everything the memory and FLOP accounting needs and
nothing about how it is parallelised (the ``tp``/``ep`` arguments of the
parameter counters only say how Megatron would shard it).

Parameter-count conventions
---------------------------
Per layer, with ``h = hidden``, ``kv = kv_heads * head_dim`` and ``f = ffn_hidden``:

* attention: QKV projection ``h * (h + 2 kv)`` + output projection ``h * h``;
  multi-head latent attention (MLA, DeepSeek-V2/V3: ``kv_lora_rank`` set), with ``a`` heads,
  ``r_q = q_lora_rank``, ``r_kv = kv_lora_rank``, ``d_qk = qk_nope_head_dim + qk_rope_head_dim``
  and ``d_v = v_head_dim``: query down ``h r_q`` + its RMSNorm ``r_q`` + query up ``r_q a d_qk``
  (without ``q_lora_rank``: one query projection ``h a d_qk``), key/value down
  ``h (r_kv + qk_rope_head_dim)`` + its RMSNorm ``r_kv``, key/value up ``r_kv a (qk_nope_head_dim + d_v)``
  and output ``a d_v h``; the down projections and latent norms are replicated over TP, the up and
  output projections split by heads (Megatron-Core's ``MLASelfAttention``);
* MLP: ``2 h f`` (GPT: up, down) or ``3 h f`` (``gated_mlp``, SwiGLU: gate, up, down);
* norms: two per layer; RMSNorm has ``h`` weights each (``2h`` per layer),
  LayerNorm with ``bias`` has weight and bias (``4h`` per layer);
* with ``bias`` (GPT-2/3): linear biases ``(h + 2kv) + h`` in attention and
  ``f (mats - 1) + h`` in the MLP, i.e. ``13h`` per layer for GPT-3 together
  with the LayerNorms (the ``12 l h^2 + 13 l h`` of Narayanan et al. 2021).

MoE layers replace the MLP by a router ``h * experts`` plus ``experts`` routed
and ``shared_experts`` always-active expert MLPs of width ``moe_ffn_hidden``.
Layer ``i`` is an MoE layer when ``experts > 0``, ``i >= first_dense_layers``
and ``i % moe_layer_freq == 0`` (the HuggingFace DeepSeek rule).

Embeddings: word embedding ``vocab * h``; an untied output layer another
``vocab * h``; learned absolute positions (GPT) ``max_seq_len * h``; the final
norm ``h`` (``2h`` with bias).
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields, replace

from .errors import ConfigError, check_bool, check_int, check_keys

__all__ = ["ModelSpec", "PRESETS", "model_from_dict", "preset_names", "get_preset"]


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer, dense or mixture-of-experts.

    Parameters
    ----------
    name : str
        Label used in reports.
    layers : int
        Number of transformer layers ``l``.
    hidden : int
        Model width ``h``.
    heads : int
        Query heads ``a``; ``hidden`` must be a multiple.
    kv_heads : int
        Key/value heads (GQA); equal to ``heads`` for multi-head attention.
    ffn_hidden : int
        Width of the dense MLP.
    vocab : int
        Vocabulary size ``V`` (before any tensor-parallel padding).
    gated_mlp : bool
        SwiGLU-style MLP with three weight matrices; otherwise GPT's two.
    tied_embeddings : bool
        Output layer shares the word-embedding matrix.
    experts : int, default 0
        Routed experts per MoE layer; 0 means a dense model.
    top_k : int, default 0
        Routed experts per token.
    moe_ffn_hidden : int, default 0
        Width of one expert MLP; 0 means ``ffn_hidden``.
    moe_layer_freq : int, default 1
        Every ``moe_layer_freq``-th layer is an MoE layer.
    shared_experts : int, default 0
        Always-active experts per MoE layer (DeepSeek).
    max_seq_len : int, default 2048
        Longest sequence (size of a learned position table).
    first_dense_layers : int, default 0
        Leading layers that stay dense in an MoE model (DeepSeek-V3: 3).
    bias : bool, default False
        Linear biases and LayerNorm (weight + bias) as in GPT-2/3; otherwise
        bias-free linears and RMSNorm as in Llama.
    learned_positions : bool, default False
        Learned absolute position embeddings (GPT); otherwise rotary (no params).
    kv_channels : int, default 0
        Width of one attention head (Megatron's ``--kv-channels``, HF ``head_dim``);
        0 means ``hidden / heads``. Set it when the query width ``heads * kv_channels``
        differs from ``hidden`` (Qwen3-235B-A22B: 64 heads of 128 on a 4,096-wide
        model, so 8,192-wide Q and output projections).
    q_lora_rank : int or None, default None
        MLA: width of the compressed query (``None``: the query is projected from the
        hidden state directly, as DeepSeek-V2-Lite).
    kv_lora_rank : int or None, default None
        MLA: width of the compressed key/value latent. Setting it turns on multi-head latent
        attention (DeepSeek-AI 2024, arXiv:2405.04434 section 2.1); ``None`` is standard attention.
    qk_nope_head_dim, qk_rope_head_dim, v_head_dim : int or None, default None
        MLA: per-head widths of the non-rotary and rotary parts of queries and keys (the
        query/key head width is their sum) and of the values; required with ``kv_lora_rank``.
    dropout : float, default 0.1
        Dropout probability of the hidden states and attention probabilities (Megatron-LM's
        ``hidden_dropout`` / ``attention_dropout``, whose default is 0.1; GPT-3 trained with it).
        Only whether it is 0 matters here: at 0 PyTorch's dropout returns its input, so no
        mask is stored and unfused attention runs no dropout kernel. The Llama 3, Mixtral,
        DeepSeek-V3 and Qwen3 presets are 0 (their configs' ``attention_dropout: 0.0``; no
        hidden dropout).

    Examples
    --------
    >>> m = get_preset("llama3-8b")
    >>> m.head_dim, m.kv_hidden
    (128, 1024)
    >>> round(m.total_params() / 1e9, 2)
    8.03
    """

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn_hidden: int
    vocab: int
    gated_mlp: bool
    tied_embeddings: bool
    experts: int = 0
    top_k: int = 0
    moe_ffn_hidden: int = 0
    moe_layer_freq: int = 1
    shared_experts: int = 0
    max_seq_len: int = 2048
    first_dense_layers: int = 0
    bias: bool = False
    learned_positions: bool = False
    kv_channels: int = 0
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_nope_head_dim: int | None = None
    qk_rope_head_dim: int | None = None
    v_head_dim: int | None = None
    dropout: float = 0.1

    def __post_init__(self) -> None:
        _validate_model(self)

    # ------------------------------------------------------------ shapes
    @property
    def head_dim(self) -> int:
        """Width of one attention head: ``kv_channels``, or ``hidden / heads`` when that is 0."""
        return self.kv_channels or self.hidden // self.heads

    @property
    def q_hidden(self) -> int:
        """Width of the Q projection (and of the output projection's input), ``heads * head_dim``."""
        return self.heads * self.head_dim

    @property
    def kv_hidden(self) -> int:
        """Width of the K (or V) projection, ``kv_heads * head_dim``."""
        return self.kv_heads * self.head_dim

    @property
    def is_mla(self) -> bool:
        """True for multi-head latent attention (``kv_lora_rank`` set)."""
        return self.kv_lora_rank is not None

    @property
    def qk_head_dim(self) -> int:
        """Width of one query (and key) head: ``qk_nope_head_dim + qk_rope_head_dim`` under MLA, else
        :attr:`head_dim`."""
        if self.is_mla:
            return self.qk_nope_head_dim + self.qk_rope_head_dim  # type: ignore[operator]
        return self.head_dim

    @property
    def v_dim(self) -> int:
        """Width of one value head: ``v_head_dim`` under MLA, else :attr:`head_dim`."""
        return self.v_head_dim if self.is_mla else self.head_dim  # type: ignore[return-value]

    @property
    def attention_widths(self) -> tuple[int, int, int, int]:
        """Widths of Q, K, V and the attention output (the output projection's input) per token, all heads:
        ``(a d_qk, a_kv d_qk, a_kv d_v, a d_v)``; ``(q_hidden, kv_hidden, kv_hidden, q_hidden)`` for
        standard attention. MLA expands its latent into ``heads`` full K and V heads."""
        a, a_kv = self.heads, self.kv_heads
        return a * self.qk_head_dim, a_kv * self.qk_head_dim, a_kv * self.v_dim, a * self.v_dim

    @property
    def attention_head_dim(self) -> int:
        """Head width of a standard attention kernel with the same FLOPs: ``(d_qk + d_v) / 2`` (Q Kᵀ costs
        ``2 s² d_qk``, P V ``2 s² d_v`` per head); :attr:`head_dim` for standard attention. The fused
        kernel's rate is looked up at this width (:mod:`simulator.attention` has rates by head width)."""
        return (self.qk_head_dim + self.v_dim) // 2 if self.is_mla else self.head_dim

    def mla_projections(self) -> dict[str, tuple[int, int, bool]]:
        """MLA's linear layers of one layer: ``name -> (input width, output width, split over TP)``.

        ``q_down`` (absent without ``q_lora_rank``: ``q_proj`` instead), ``q_up``, ``kv_down``, ``kv_up``,
        ``attn_out``; the down projections are replicated over TP (Megatron-Core ``parallel_mode:
        duplicated``), the others split by heads. Empty for standard attention.
        """
        if not self.is_mla:
            return {}
        h, a, q = self.hidden, self.heads, self.attention_widths[0]
        out: dict[str, tuple[int, int, bool]] = {}
        if self.q_lora_rank is None:
            out["q_proj"] = (h, q, True)
        else:
            out["q_down"] = (h, self.q_lora_rank, False)
            out["q_up"] = (self.q_lora_rank, q, True)
        out["kv_down"] = (h, self.kv_lora_rank + self.qk_rope_head_dim, False)  # type: ignore[operator]
        out["kv_up"] = (self.kv_lora_rank, a * (self.qk_nope_head_dim + self.v_dim), True)  # type: ignore[misc]
        out["attn_out"] = (a * self.v_dim, h, True)
        return out

    def mla_norm_params(self) -> int:
        """Weights of MLA's latent RMSNorms (query and key/value latents), replicated over TP; 0 otherwise."""
        if not self.is_mla:
            return 0
        return (self.q_lora_rank or 0) + self.kv_lora_rank  # type: ignore[operator]

    def attention_matmul_params(self, tp: int = 1) -> int:
        """Weights of the attention's linear layers on one of ``tp`` ranks (no biases, no norms)."""
        if self.is_mla:
            return sum(i * o // (tp if split else 1) for i, o, split in self.mla_projections().values())
        h, kv, q = self.hidden, self.kv_hidden, self.q_hidden
        return (h * (q + 2 * kv) + q * h) // tp

    @property
    def is_moe(self) -> bool:
        """True for a mixture-of-experts model (``experts > 0``)."""
        return self.experts > 0

    @property
    def expert_ffn_hidden(self) -> int:
        """Width of one expert MLP (``moe_ffn_hidden``, or ``ffn_hidden`` if 0)."""
        return self.moe_ffn_hidden or self.ffn_hidden

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices per MLP: 3 for a gated (SwiGLU) MLP, 2 for GPT."""
        return 3 if self.gated_mlp else 2

    def is_moe_layer(self, index: int) -> bool:
        """Whether layer ``index`` (0-based) has a mixture-of-experts MLP."""
        return (self.is_moe and index >= self.first_dense_layers
                and index % self.moe_layer_freq == 0)

    # -------------------------------------------------------- parameters
    def attention_params(self, tp: int = 1) -> int:
        """Attention parameters of one layer held by one of ``tp`` ranks.

        QKV is column-split and the output projection row-split (Megatron), so
        weights and the QKV bias divide by ``tp``; the output bias is replicated.
        MLA: :meth:`mla_projections` (down projections replicated) plus the latent norms.
        """
        if self.is_mla:
            return self.attention_matmul_params(tp) + self.mla_norm_params()
        h, kv, q = self.hidden, self.kv_hidden, self.q_hidden
        n = (h * (q + 2 * kv) + q * h) // tp
        if self.bias:
            n += (q + 2 * kv) // tp + h
        return n

    def norm_params(self) -> int:
        """Parameters of the two norms of one layer (replicated over TP)."""
        return 2 * self._norm_size()

    def mlp_params(self, index: int = 0, tp: int = 1, ep: int = 1, etp: int | None = None) -> int:
        """MLP (or MoE block) parameters of layer ``index`` held by one TP/EP rank.

        Dense: ``mats * h * f / tp`` (+ biases). MoE: the replicated router
        ``h * experts``, all shared experts split over ``tp``, and ``experts / ep``
        local routed experts split over the expert TP ``etp`` (Megatron-Core's
        default ``etp = tp``).
        """
        if not self.is_moe_layer(index):
            return self._one_mlp(self.ffn_hidden, tp)
        return (self.hidden * self.experts + self.shared_experts * self._one_mlp(self.expert_ffn_hidden, tp)
                + self.routed_expert_params(index, tp, ep, etp))

    def routed_expert_params(self, index: int = 0, tp: int = 1, ep: int = 1, etp: int | None = None) -> int:
        """Parameters of the ``experts / ep`` routed experts of layer ``index`` on one expert-TP/EP rank
        (split over ``etp``, default ``tp``).

        These are the parameters sharded over the expert-data-parallel group
        rather than the full DP group; 0 for a dense layer.
        """
        if not self.is_moe_layer(index):
            return 0
        return self.experts // ep * self._one_mlp(self.expert_ffn_hidden, etp or tp)

    def params_per_layer(self, index: int = 0, tp: int = 1, ep: int = 1, etp: int | None = None) -> int:
        """Parameters of layer ``index`` (0-based) held by one TP/EP rank (routed experts split over ``etp``,
        default ``tp``).

        With ``tp = ep = 1`` this is the layer's full parameter count.
        """
        return self.attention_params(tp) + self.norm_params() + self.mlp_params(index, tp, ep, etp)

    def active_params_per_layer(self, index: int = 0) -> int:
        """Parameters of layer ``index`` that one token uses (top-k + shared experts)."""
        if not self.is_moe_layer(index):
            return self.params_per_layer(index)
        active = (self.top_k + self.shared_experts) * self._one_mlp(self.expert_ffn_hidden, 1)
        return self.attention_params() + self.norm_params() + self.hidden * self.experts + active

    def word_embedding_params(self, tp: int = 1, vocab: int | None = None) -> int:
        """Word-embedding matrix ``vocab * h`` split over ``tp`` (vocab-parallel).

        ``vocab`` overrides :attr:`vocab`, e.g. with the TP-padded vocabulary.
        """
        return (vocab or self.vocab) * self.hidden // tp

    def position_embedding_params(self) -> int:
        """Learned position table ``max_seq_len * h`` (0 for rotary); replicated over TP."""
        return self.max_seq_len * self.hidden if self.learned_positions else 0

    def final_norm_params(self) -> int:
        """Parameters of the norm after the last layer."""
        return self._norm_size()

    def embedding_params(self) -> int:
        """Word and position embeddings plus an untied output layer (full model)."""
        word = self.word_embedding_params()
        output = 0 if self.tied_embeddings else word
        return word + output + self.position_embedding_params()

    def total_params(self) -> int:
        """All parameters of the model (all experts counted)."""
        layers = sum(self.params_per_layer(i) for i in range(self.layers))
        return layers + self.embedding_params() + self.final_norm_params()

    def active_params(self) -> int:
        """Parameters one token touches (MoE: top-k routed and shared experts only)."""
        layers = sum(self.active_params_per_layer(i) for i in range(self.layers))
        return layers + self.embedding_params() + self.final_norm_params()

    # ------------------------------------------------------------ private
    def _norm_size(self) -> int:
        return 2 * self.hidden if self.bias else self.hidden

    def _one_mlp(self, width: int, tp: int) -> int:
        n = self.mlp_matrices * self.hidden * width // tp
        if self.bias:  # up (and gate) biases split over TP, down bias replicated
            n += (self.mlp_matrices - 1) * width // tp + self.hidden
        return n


_INT_FIELDS = ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "max_seq_len",
               "moe_layer_freq")
_COUNT_FIELDS = ("experts", "top_k", "moe_ffn_hidden", "shared_experts", "first_dense_layers", "kv_channels")
_BOOL_FIELDS = ("gated_mlp", "tied_embeddings", "bias", "learned_positions")
_MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


MODEL_LIMITS = {"layers": 4096, "hidden": 1 << 20, "heads": 1 << 16, "kv_heads": 1 << 16, "ffn_hidden": 1 << 22,
                "moe_ffn_hidden": 1 << 22, "vocab": 1 << 24, "experts": 1 << 16, "shared_experts": 1 << 10,
                "kv_channels": 1 << 16, "q_lora_rank": 1 << 20, "kv_lora_rank": 1 << 20,
                "qk_nope_head_dim": 1 << 16, "qk_rope_head_dim": 1 << 16, "v_head_dim": 1 << 16,
                "max_seq_len": 1 << 24}
"""Upper limits per model field: far above any published model, low enough that the per-layer work the
generator does (and the arithmetic on sizes) stays bounded for a mistyped value such as ``layers: 1e9``."""


def _validate_model(m: ModelSpec) -> None:
    """Raise :class:`ConfigError` for the first impossible field of ``m``."""
    if not isinstance(m.name, str) or not m.name:
        raise ConfigError(f"model.name: must be a non-empty string, got {m.name!r}")
    for f in _INT_FIELDS:
        check_int(f"model.{f}", getattr(m, f))
    for f in _COUNT_FIELDS:
        check_int(f"model.{f}", getattr(m, f), minimum=0)
    for f in _BOOL_FIELDS:
        check_bool(f"model.{f}", getattr(m, f))
    for f in _MLA_FIELDS:
        if getattr(m, f) is not None:
            check_int(f"model.{f}", getattr(m, f))
    for f, limit in MODEL_LIMITS.items():
        if (getattr(m, f) or 0) > limit:
            raise ConfigError(f"model.{f}: {getattr(m, f):,} exceeds the supported {limit:,}")
    if m.hidden % m.heads and not m.kv_channels and not m.is_mla:
        raise ConfigError(f"model.heads: {m.heads} does not divide model.hidden={m.hidden}")
    if m.heads % m.kv_heads:
        raise ConfigError(f"model.kv_heads: {m.kv_heads} does not divide model.heads={m.heads}")
    if m.experts == 0:
        for f in ("top_k", "shared_experts"):
            if getattr(m, f):
                raise ConfigError(f"model.{f}: needs model.experts > 0 (a mixture-of-experts model)")
    elif not 1 <= m.top_k <= m.experts:
        raise ConfigError(f"model.top_k: must be in 1..{m.experts} (model.experts), got {m.top_k}")
    if m.is_mla:
        for f in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            if getattr(m, f) is None:
                raise ConfigError(f"model.{f}: required with model.kv_lora_rank (multi-head latent attention)")
        for f, bad in (("kv_heads", m.kv_heads != m.heads), ("kv_channels", m.kv_channels != 0),
                       ("bias", m.bias)):
            if bad:
                raise ConfigError(f"model.{f}: multi-head latent attention (model.kv_lora_rank) needs "
                                  + ("kv_heads == heads" if f == "kv_heads" else f"{f} unset ({getattr(m, f)!r})"))
    else:
        for f in _MLA_FIELDS:
            if getattr(m, f) is not None:
                raise ConfigError(f"model.{f}: needs model.kv_lora_rank (multi-head latent attention)")
    x = m.dropout
    if not (isinstance(x, numbers.Real) and not isinstance(x, bool) and 0.0 <= x < 1.0):
        raise ConfigError(f"model.dropout: must be a probability in [0, 1), got {x!r}")
    if m.first_dense_layers > m.layers:
        raise ConfigError(f"model.first_dense_layers: {m.first_dense_layers} exceeds model.layers={m.layers}")


# --------------------------------------------------------------------- presets
def _gpt(name: str, layers: int, hidden: int, heads: int, vocab: int, seq: int) -> ModelSpec:
    return ModelSpec(name, layers, hidden, heads, heads, 4 * hidden, vocab, gated_mlp=False,
                     tied_embeddings=True, max_seq_len=seq, bias=True, learned_positions=True)


def _llama(name: str, layers: int, hidden: int, heads: int, kv: int, ffn: int, seq: int) -> ModelSpec:
    return ModelSpec(name, layers, hidden, heads, kv, ffn, 128256, gated_mlp=True,
                     tied_embeddings=False, max_seq_len=seq, dropout=0.0)


PRESETS: dict[str, ModelSpec] = {
    # Small GPT for tests and demos (not a published model).
    "tiny": _gpt("tiny", 2, 64, 4, 512, 128),
    # Radford et al. 2019; HF `gpt2` config.json (124,439,808 parameters).
    "gpt2-small": _gpt("gpt2-small", 12, 768, 12, 50257, 1024),
    # Brown et al. 2020, Table 2.1 (the table's d_model 5140 is a typo for 40 x 128);
    # vocab: GPT-2 BPE padded to 51200 as Megatron-LM does.
    "gpt3-13b": _gpt("gpt3-13b", 40, 5120, 40, 51200, 2048),
    # Brown et al. 2020, Table 2.1; Narayanan et al. 2021 (vocab 51200).
    "gpt3-175b": _gpt("gpt3-175b", 96, 12288, 96, 51200, 2048),
    # Meta Llama 3 / 3.1 HF config.json files (Dubey et al. 2024, Table 3).
    "llama3-8b": _llama("llama3-8b", 32, 4096, 32, 8, 14336, 8192),
    "llama3-70b": _llama("llama3-70b", 80, 8192, 64, 8, 28672, 8192),
    "llama3-405b": _llama("llama3-405b", 126, 16384, 128, 8, 53248, 131072),
    # Jiang et al. 2024; HF mistralai/Mixtral-8x7B-v0.1 config.json.
    "mixtral-8x7b": ModelSpec("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000, gated_mlp=True,
                              tied_embeddings=False, experts=8, top_k=2, moe_ffn_hidden=14336,
                              max_seq_len=32768, dropout=0.0),
    # DeepSeek-AI 2024 (arXiv:2412.19437); HF deepseek-ai/DeepSeek-V3 config.json: multi-head latent
    # attention with q_lora_rank 1536, kv_lora_rank 512, qk_nope_head_dim 128, qk_rope_head_dim 64,
    # v_head_dim 128 (187,107,328 attention parameters per layer). total_params 671.0B is the report's
    # 671B main model; the multi-token-prediction module (14B more in the HF checkpoint's 685B) is left out.
    "deepseek-v3": ModelSpec("deepseek-v3", 61, 7168, 128, 128, 18432, 129280, gated_mlp=True,
                             tied_embeddings=False, experts=256, top_k=8, moe_ffn_hidden=2048,
                             shared_experts=1, max_seq_len=163840, first_dense_layers=3,
                             q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
                             v_head_dim=128, dropout=0.0),
    # Qwen Team 2025 (arXiv:2505.09388, Table 2); HF Qwen/Qwen3-235B-A22B config.json: 94 layers,
    # hidden 4096, 64 query heads / 4 KV heads of head_dim 128 (Q width 8192 > hidden), 128 experts,
    # top-8, moe_intermediate_size 1536, no shared experts, vocab 151936, untied embeddings,
    # max_position_embeddings 40960. QK-norm (2 x 128 weights per layer) is left out.
    "qwen3-235b-a22b": ModelSpec("qwen3-235b-a22b", 94, 4096, 64, 4, 12288, 151936, gated_mlp=True,
                                 tied_embeddings=False, experts=128, top_k=8, moe_ffn_hidden=1536,
                                 max_seq_len=40960, kv_channels=128, dropout=0.0),
    # Mistral AI 2024 (mistral.ai/news/mixtral-8x22b: 141B total, 39B active); HF
    # mistral-community/Mixtral-8x22B-v0.1 config.json: 56 layers, hidden 6144, 48 heads / 8 KV heads,
    # intermediate 16384, 8 experts top-2, vocab 32000 (the Instruct release's 32768 adds 768 rows),
    # untied, max_position_embeddings 65536; NeMo's MixtralConfig8x22B has the same shapes.
    "mixtral-8x22b": ModelSpec("mixtral-8x22b", 56, 6144, 48, 8, 16384, 32000, gated_mlp=True,
                               tied_embeddings=False, experts=8, top_k=2, moe_ffn_hidden=16384,
                               max_seq_len=65536, dropout=0.0),
    # Touvron et al. 2023 (arXiv:2307.09288); HF meta-llama/Llama-2-70b-hf config.json: 80 layers, hidden
    # 8192, 64 heads / 8 KV heads, intermediate 28672, vocab 32000, untied, 4,096-token context
    # (68,976,648,192 parameters).
    "llama2-70b": ModelSpec("llama2-70b", 80, 8192, 64, 8, 28672, 32000, gated_mlp=True,
                            tied_embeddings=False, max_seq_len=4096, dropout=0.0),
    # NVIDIA 2024, Nemotron-4 15B (arXiv:2402.16819, Table 1) and 340B (arXiv:2406.11704, Table 1);
    # NeMo nemo/collections/llm/gpt/model/nemotron.py Nemotron4Config15B / Nemotron4Config340B: squared-ReLU
    # MLP (two matrices, not gated), GQA with 8 KV heads, RoPE, no linear biases, untied embeddings,
    # vocab 256000, 4,096-token sequences, dropout 0. Its LayerNorms carry a bias (h more per norm than
    # the RMSNorm counted here: 0.001% of the parameters).
    "nemotron4-15b": ModelSpec("nemotron4-15b", 32, 6144, 48, 8, 24576, 256000, gated_mlp=False,
                               tied_embeddings=False, max_seq_len=4096, dropout=0.0),
    "nemotron4-340b": ModelSpec("nemotron4-340b", 96, 18432, 96, 8, 73728, 256000, gated_mlp=False,
                                tied_embeddings=False, max_seq_len=4096, dropout=0.0),
    # BigScience 2022 (arXiv:2211.05100); HF bigscience/bloom config.json and the training script
    # bigscience-workshop/bigscience train/tr11-176B-ml: 70 layers, hidden 14336, 112 heads, vocab 250880
    # (padded), tied embeddings, linear biases and LayerNorms, ALiBi (no position parameters), sequence 2048.
    # The embedding LayerNorm (2h) is left out: 176,247,242,752 of HF's 176,247,271,424 parameters.
    "bloom-176b": ModelSpec("bloom-176b", 70, 14336, 112, 112, 57344, 250880, gated_mlp=False,
                            tied_embeddings=True, max_seq_len=2048, bias=True),
    # Zhang et al. 2022 (arXiv:2205.01068, Table 1); metaseq / HF OPT configs: 96 layers, hidden 12288,
    # 96 heads, ffn 49152 (ReLU), vocab 50272, tied, biases, LayerNorm, learned positions of 2048 tokens
    # (OPT's table has 2 more rows for its padding offset, left out).
    "opt-175b": ModelSpec("opt-175b", 96, 12288, 96, 96, 49152, 50272, gated_mlp=False, tied_embeddings=True,
                          max_seq_len=2048, bias=True, learned_positions=True),
    # Megatron-Turing NLG 530B, Smith et al. 2022 (arXiv:2201.11990, section 3.1): 105 layers, hidden
    # 20480, 128 heads, sequence 2048, GPT-2 BPE vocabulary padded to 51200 as Megatron-LM does (as gpt3-175b).
    "mt-nlg-530b": _gpt("mt-nlg-530b", 105, 20480, 128, 51200, 2048),
}


def preset_names() -> list[str]:
    """Names of the model presets, in definition order."""
    return list(PRESETS)


def get_preset(name: str) -> ModelSpec:
    """The preset called ``name`` (case and surrounding spaces ignored, as cluster presets);
    :class:`ConfigError` listing presets otherwise."""
    try:
        return PRESETS[name.strip().lower()]
    except (KeyError, TypeError, AttributeError):
        raise ConfigError(f"model.preset: unknown preset {name!r}; valid presets: "
                          f"{', '.join(PRESETS)}") from None


_MODEL_FIELDS = tuple(f.name for f in fields(ModelSpec))


def model_from_dict(section: Mapping[str, object]) -> ModelSpec:
    """Build a :class:`ModelSpec` from the ``model:`` section of an experiment file.

    Parameters
    ----------
    section : Mapping
        Optional ``preset`` plus any :class:`ModelSpec` field overriding it.
        Without a preset every field without a default is required.

    Returns
    -------
    ModelSpec

    Raises
    ------
    ConfigError
        Unknown key (lists the valid fields), unknown preset (lists presets),
        missing or non-positive integer, or an impossible shape.

    Examples
    --------
    >>> model_from_dict({"preset": "gpt3-175b", "layers": 48}).layers
    48
    """
    check_keys("model", section, ("preset",) + _MODEL_FIELDS)
    overrides = {k: v for k, v in section.items() if k != "preset"}
    if "preset" in section:
        base = get_preset(section["preset"])  # type: ignore[arg-type]
        return replace(base, **overrides)
    overrides.setdefault("name", "custom")
    for f in fields(ModelSpec):
        if f.name not in overrides and f.default is MISSING:
            raise ConfigError(f"model.{f.name}: required when no model.preset is given; "
                              f"presets: {', '.join(PRESETS)}")
    return ModelSpec(**overrides)  # type: ignore[arg-type]
