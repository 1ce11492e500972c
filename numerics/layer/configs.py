"""The DeepSeek-V3 model configs (tiny / proxy / 16b) and the layer-level cases derived from them.

Public: ``ModelConfig``, ``deepseek_v3_16b()``, ``proxy()``, ``tiny()``, ``CONFIGS``, ``get_config(name)``,
``param_count(cfg)``; for the layer level ``LinearShape``, ``GroupedShape``, ``LayerSuite``, ``suite(name)``
and ``SUITES``.

Configs are functions returning frozen dataclasses; ``proxy`` and ``tiny`` derive from the 16B with a
comment on each deviation. The layer level measures the model's own modules at the model's own shapes:
``suite(name)`` takes every dimension from ``get_config(name)`` and adds only what a layer test needs
beyond the model (how many tokens, how routed rows split over experts). Every size MXFP8 quantizes
along (K of a GEMM, N for the input gradient, tokens for the weight gradient) is a multiple of the MX
block of 32, as torchao requires; the group splits deliberately are not always.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class ModelConfig:
    name: str
    vocab_size: int
    dim: int
    n_layers: int
    n_dense_layers: int  # the first n layers use a dense SwiGLU FFN, the rest DeepSeekMoE
    n_heads: int
    dense_hidden: int
    # MLA
    q_lora_rank: int  # 0: q projected directly from x (16B); > 0: low-rank q with its own RMSNorm (671B)
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    # MoE
    n_routed_experts: int
    n_shared_experts: int
    top_k: int
    moe_hidden: int
    score_func: str = "softmax"  # "softmax" (16B) or "sigmoid" (671B)
    route_norm: bool = False  # renormalise the top-k weights (671B's sigmoid router does)
    route_scale: float = 1.0
    load_balance_coeff: float | None = 1e-3  # auxiliary-loss-free bias update step; None disables it
    # RoPE / YaRN, as DeepSeek-V3 (YaRN frequency correction applies when max_seq_len > original_seq_len)
    max_seq_len: int = 16384
    original_seq_len: int = 4096
    rope_theta: float = 10000.0
    rope_factor: float = 40.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 0.70
    norm_eps: float = 1e-6
    init_std: float = 0.02

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def n_moe_layers(self) -> int:
        return self.n_layers - self.n_dense_layers


def deepseek_v3_16b() -> ModelConfig:
    """DeepSeek-V3 16B (= DeepSeek-V2-Lite shape), as torchtitan's ``16B`` flavour: dim 2048, dense FFN
    hidden 10944, 64 routed experts top-6 with softmax scores, 2 shared experts, expert hidden 1408, MLA
    with no q LoRA, kv_lora_rank 512, qk_nope 128, qk_rope 64, v_head 128, 16 heads, vocab 102400."""
    return ModelConfig(
        name="16b", vocab_size=102400, dim=2048, n_layers=27, n_dense_layers=1, n_heads=16,
        dense_hidden=10944, q_lora_rank=0, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
        v_head_dim=128, n_routed_experts=64, n_shared_experts=2, top_k=6, moe_hidden=1408,
    )


def proxy() -> ModelConfig:
    """One-H200 proxy: the 16B's per-layer shapes (attention, experts, router) with fewer layers/experts.

    About 0.93B parameters in total, 0.46B active per token (``param_count``); attention, dense FFN,
    expert and router matmuls have exactly the 16B's shapes, so per-GEMM MXFP8 numerics match the 16B's.
    """
    return dataclasses.replace(
        deepseek_v3_16b(),
        name="proxy",
        vocab_size=256,  # 16B: 102400 -- the byte tokenizer's vocabulary (the head stays BF16 either way)
        n_layers=6,  # 16B: 27 -- still 1 dense layer, then 5 MoE layers: fits a paired run in minutes
        n_routed_experts=16,  # 16B: 64 -- top-6 of 16: fewer, fuller experts; fits memory and time
    )


def tiny() -> ModelConfig:
    """CPU flavour: seconds per step or less on 2 cores. Every matmul dimension is a multiple of 32,
    MXFP8's block size, so every layer the 16B quantizes is quantized here too."""
    return dataclasses.replace(
        deepseek_v3_16b(),
        name="tiny",
        vocab_size=256,  # 16B: 102400 -- the byte tokenizer's vocabulary
        dim=64,  # 16B: 2048
        n_layers=3,  # 16B: 27 -- still 1 dense layer followed by MoE layers
        n_heads=4,  # 16B: 16
        dense_hidden=192,  # 16B: 10944
        kv_lora_rank=32,  # 16B: 512 -- kv_lora_rank and kv_lora_rank + rope stay multiples of 32
        qk_nope_head_dim=32,  # 16B: 128
        qk_rope_head_dim=32,  # 16B: 64
        v_head_dim=32,  # 16B: 128
        n_routed_experts=8,  # 16B: 64
        top_k=2,  # 16B: 6
        moe_hidden=64,  # 16B: 1408
        max_seq_len=512,  # 16B: 16384 -- still > original_seq_len so the YaRN path runs in CI
        original_seq_len=128,  # 16B: 4096
    )


CONFIGS = {"tiny": tiny, "proxy": proxy, "16b": deepseek_v3_16b}


def get_config(name: str) -> ModelConfig:
    if name not in CONFIGS:
        raise KeyError(f"unknown model {name!r}; choose from {', '.join(CONFIGS)}")
    return CONFIGS[name]()


def param_count(cfg: ModelConfig) -> dict[str, int]:
    """Parameters by part, from the shapes alone (no tensors): embedding, attention, dense FFN,
    routed experts, shared experts, router, norms, head, and total / active-per-token."""
    d = cfg.dim
    if cfg.q_lora_rank:
        q = d * cfg.q_lora_rank + cfg.q_lora_rank + cfg.q_lora_rank * cfg.n_heads * cfg.qk_head_dim
    else:
        q = d * cfg.n_heads * cfg.qk_head_dim
    kv = d * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) + cfg.kv_lora_rank
    kv += cfg.kv_lora_rank * cfg.n_heads * (cfg.qk_nope_head_dim + cfg.v_head_dim)
    attn = q + kv + cfg.n_heads * cfg.v_head_dim * d
    expert = 3 * d * cfg.moe_hidden
    parts = {
        "embedding": cfg.vocab_size * d,
        "attention": cfg.n_layers * attn,
        "dense_ffn": cfg.n_dense_layers * 3 * d * cfg.dense_hidden,
        "routed_experts": cfg.n_moe_layers * cfg.n_routed_experts * expert,
        "shared_experts": cfg.n_moe_layers * cfg.n_shared_experts * expert,
        "router": cfg.n_moe_layers * cfg.n_routed_experts * d,
        "norms": cfg.n_layers * 2 * d + d,
        "head": cfg.vocab_size * d,
    }
    parts["total"] = sum(parts.values())
    parts["active"] = parts["total"] - parts["routed_experts"] + (
        cfg.n_moe_layers * cfg.top_k * expert
    )
    return parts


# ------------------------------------------------------------------------------- layer-level cases

@dataclass(frozen=True)
class LinearShape:
    """One dense projection of the model: (tokens, in_features) @ (out_features, in_features)^T."""

    name: str
    tokens: int
    in_features: int
    out_features: int


@dataclass(frozen=True)
class GroupedShape:
    """One grouped GEMM of the experts, (tokens x dim) @ (experts: dim -> hidden), for one split of
    the routed rows over the experts."""

    name: str
    dim: int
    hidden: int
    group_sizes: tuple[int, ...]

    @property
    def tokens(self) -> int:
        return sum(self.group_sizes)

    @property
    def experts(self) -> int:
        return len(self.group_sizes)


@dataclass(frozen=True)
class LayerSuite:
    """What the layer level runs for one model config: its dense projections, its experts' grouped GEMM
    over several group splits, and its MoE block and MLA attention at ``tokens`` tokens."""

    name: str
    model: ModelConfig
    tokens: int
    linears: tuple[LinearShape, ...]
    grouped: tuple[GroupedShape, ...]
    seed: int = 0

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _group_cases(rows: int, experts: int, dim: int, hidden: int) -> tuple[GroupedShape, ...]:
    """Splits of ``rows`` routed rows (a multiple of 32) over ``experts``: even, Zipf-like, every other
    expert empty, one expert taking all, and sizes that are not multiples of 32 (torchao pads them)."""
    assert rows % 32 == 0 and rows >= 32 * experts
    even = (rows // experts,) * experts
    w = [1.0 / (i + 1) for i in range(experts)]  # expert i gets ~1/(i+1): routing concentrates on a few
    uneven = [max(32, int(rows * x / sum(w)) // 32 * 32) for x in w]
    uneven[0] += rows - sum(uneven)
    empty = [0] * experts
    live = list(range(0, experts, 2))
    for i in live:
        empty[i] = rows // len(live)
    empty[live[0]] += rows - sum(empty)
    one = [0] * experts
    one[experts // 2] = rows
    ragged = [rows // experts + (7 if i % 2 == 0 else -7) for i in range(experts)]
    ragged[-1] += rows - sum(ragged)
    cases = {"even": even, "uneven": uneven, "empty": empty, "one_group": one, "unaligned": ragged}
    return tuple(GroupedShape(name, dim, hidden, tuple(sizes)) for name, sizes in cases.items())


def _suite(model: ModelConfig, *, tokens: int, grouped_rows: int, local_experts: int) -> LayerSuite:
    linears = (
        LinearShape("ffn.w1", tokens, model.dim, model.dense_hidden),
        LinearShape("ffn.w2", tokens, model.dense_hidden, model.dim),
        # torchtitan keeps `output` in BF16; measured to show what MXFP8 would cost it
        LinearShape("output", tokens, model.dim, model.vocab_size),
    )
    grouped = _group_cases(grouped_rows, local_experts, model.dim, model.moe_hidden)
    return LayerSuite(model.name, model, tokens, linears, grouped)


def _suite_16b() -> LayerSuite:
    # 4096 tokens: one 4096-long sequence. Grouped GEMM: 16384 routed rows over 8 local experts (64
    # experts over 8 GPUs), the grouped GEMM of docs/layer.md (on an H200: 28.5 dB, 1.7 ms vs 0.15 ms for BF16).
    return _suite(deepseek_v3_16b(), tokens=4096, grouped_rows=16384, local_experts=8)


def _suite_tiny() -> LayerSuite:
    # CPU-sized: every code path of the 16B suite in seconds on 2 cores; 128 tokens = tiny's
    # original_seq_len, so attention runs the YaRN path as the 16B's does beyond 4096 tokens.
    return _suite(tiny(), tokens=128, grouped_rows=256, local_experts=4)


SUITES = {"tiny": _suite_tiny, "16b": _suite_16b}


def suite(name: str) -> LayerSuite:
    try:
        return SUITES[name]()
    except KeyError:
        raise KeyError(f"unknown layer suite {name!r}; choose from {', '.join(SUITES)}") from None
