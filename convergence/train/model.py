"""The DeepSeek-V3 model family in plain PyTorch: MLA attention + DeepSeekMoE, configs tiny / proxy / 16b.

Public: ``ModelConfig``, ``tiny()``, ``proxy()``, ``deepseek_v3_16b()``, ``CONFIGS``, ``get_config(name)``,
``param_count(cfg)`` (closed-form, no allocation), ``Transformer``.

Module names follow torchtitan's DeepSeek-V3 (``layers.N.attention.wq``, ``layers.N.feed_forward.w1``,
``layers.N.moe.router.gate``, ``layers.N.moe.shared_experts.w1``, ``layers.N.moe.experts``, ``output``) so a
recipe's fully-qualified-name filter reads the same here and there.

Mixed precision: parameters are FP32 masters. Every matmul casts its weight and input to the *compute
dtype* (the active autocast dtype, else the input's dtype) explicitly, i.e. the FSDP ``param_dtype=bf16``
convention. For plain tensors this is exactly what ``torch.autocast`` does; it is needed because torchao's
MXFP8 ops run above autocast (its weight wrapper intercepts ``F.linear`` at ``__torch_function__``; its
functional ops, which the recipes use, are autograd functions) and would otherwise see a BF16 input and an
FP32 weight (FINDINGS.md T1). A recipe's MXFP8 op goes into a module's ``mxfp8_op``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from convergence.train.moe import MoE, compute_dtype, linear


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
    """DeepSeek-V3 16B (= DeepSeek-V2-Lite shape), as torchtitan's ``16B`` flavour."""
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


# ------------------------------------------------------------------------------------------ layers
class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight
        return y.to(compute_dtype(x))


class Linear(nn.Linear):
    """nn.Linear without bias whose matmul runs in the compute dtype (see the module docstring)."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__(in_features, out_features, bias=False)
        self.mxfp8_op = None  # set by convergence.train.recipes.apply_recipe

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.mxfp8_op)


def _yarn_correction_dim(num_rot: float, dim: int, base: float, max_seq: int) -> float:
    return dim * math.log(max_seq / (num_rot * 2 * math.pi)) / (2 * math.log(base))


def rope_frequencies(cfg: ModelConfig, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape [seq_len, rope_dim/2], with DeepSeek's YaRN frequency interpolation."""
    dim, base = cfg.qk_rope_head_dim, cfg.rope_theta
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    if cfg.max_seq_len > cfg.original_seq_len:
        low = max(math.floor(_yarn_correction_dim(cfg.beta_fast, dim, base, cfg.original_seq_len)), 0)
        high = min(math.ceil(_yarn_correction_dim(cfg.beta_slow, dim, base, cfg.original_seq_len)), dim - 1)
        ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / max(high - low, 1e-3)).clamp(0, 1)
        smooth = 1 - ramp
        freqs = freqs / cfg.rope_factor * (1 - smooth) + freqs * smooth
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float64), freqs)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate consecutive pairs (x[2i], x[2i+1]) as DeepSeek's complex-number RoPE does. x: [b, s, h, d]."""
    xf = x.float().unflatten(-1, (-1, 2))
    a, b = xf[..., 0], xf[..., 1]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.stack((a * c - b * s, a * s + b * c), dim=-1).flatten(-2).to(x.dtype)


class Attention(nn.Module):
    """Multi-head Latent Attention: low-rank joint KV (kv_lora_rank) with a shared decoupled RoPE key."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        h = cfg.n_heads
        if cfg.q_lora_rank:
            self.wq_a = Linear(cfg.dim, cfg.q_lora_rank)
            self.q_norm = RMSNorm(cfg.q_lora_rank, cfg.norm_eps)
            self.wq_b = Linear(cfg.q_lora_rank, h * cfg.qk_head_dim)
        else:
            self.wq = Linear(cfg.dim, h * cfg.qk_head_dim)
        self.wkv_a = Linear(cfg.dim, cfg.kv_lora_rank + cfg.qk_rope_head_dim)
        self.kv_norm = RMSNorm(cfg.kv_lora_rank, cfg.norm_eps)
        self.wkv_b = Linear(cfg.kv_lora_rank, h * (cfg.qk_nope_head_dim + cfg.v_head_dim))
        self.wo = Linear(h * cfg.v_head_dim, cfg.dim)
        self.softmax_scale = cfg.qk_head_dim**-0.5
        if cfg.max_seq_len > cfg.original_seq_len:  # YaRN attention temperature, as DeepSeek-V3
            m = 0.1 * cfg.mscale * math.log(cfg.rope_factor) + 1.0
            self.softmax_scale *= m * m

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        cfg, (b, s, _) = self.cfg, x.shape
        q = self.wq_b(self.q_norm(self.wq_a(x))) if cfg.q_lora_rank else self.wq(x)
        q = q.view(b, s, cfg.n_heads, cfg.qk_head_dim)
        q_nope, q_pe = q.split([cfg.qk_nope_head_dim, cfg.qk_rope_head_dim], dim=-1)
        q = torch.cat([q_nope, apply_rope(q_pe, cos, sin)], dim=-1)
        kv, k_pe = self.wkv_a(x).split([cfg.kv_lora_rank, cfg.qk_rope_head_dim], dim=-1)
        k_pe = apply_rope(k_pe.unsqueeze(2), cos, sin)
        kv = self.wkv_b(self.kv_norm(kv)).view(b, s, cfg.n_heads, cfg.qk_nope_head_dim + cfg.v_head_dim)
        k_nope, v = kv.split([cfg.qk_nope_head_dim, cfg.v_head_dim], dim=-1)
        k = torch.cat([k_nope, k_pe.expand(-1, -1, cfg.n_heads, -1)], dim=-1)
        o = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2).to(q.dtype),
            is_causal=True, scale=self.softmax_scale,
        )
        return self.wo(o.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x). Used as the dense FFN and as the shared experts."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1, self.w2, self.w3 = Linear(dim, hidden), Linear(hidden, dim), Linear(dim, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int):
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.moe = None
        self.feed_forward = None
        if layer_id < cfg.n_dense_layers:
            self.feed_forward = FeedForward(cfg.dim, cfg.dense_hidden)
        else:
            self.moe = MoE(
                dim=cfg.dim, hidden=cfg.moe_hidden, n_experts=cfg.n_routed_experts, top_k=cfg.top_k,
                n_shared=cfg.n_shared_experts, score_func=cfg.score_func, route_norm=cfg.route_norm,
                route_scale=cfg.route_scale, shared_factory=FeedForward, gate_factory=Linear,
            )

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin)
        ffn = self.feed_forward if self.moe is None else self.moe
        return x + ffn(self.ffn_norm(x))


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = Linear(cfg.dim, cfg.vocab_size)

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator) -> None:
        """Normal(0, init_std) weights; projections back into the residual stream (wo, w2) scaled by
        1/sqrt(2 n_layers) as GPT-2/torchtitan do; norms at 1; expert bias 0. Draws from ``generator``
        in parameter order, so two models built from one seed are identical."""
        std = self.cfg.init_std
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
                continue
            into_residual = name.endswith((".wo.weight", ".w2.weight", ".experts.w2"))
            scale = std / math.sqrt(2 * self.cfg.n_layers) if into_residual else std
            p.copy_(torch.randn(p.shape, generator=generator, dtype=torch.float32) * scale)
        for mod in self.modules():
            if isinstance(mod, MoE):
                mod.expert_bias.zero_()

    def moe_layers(self) -> list[tuple[int, MoE]]:
        return [(i, blk.moe) for i, blk in enumerate(self.layers) if blk.moe is not None]

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [b, s] -> logits [b, s, vocab] (compute dtype)."""
        s = tokens.shape[1]
        cos, sin = rope_frequencies(self.cfg, s)
        cos, sin = cos.to(tokens.device), sin.to(tokens.device)
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, cos, sin)
        return self.output(self.norm(h))


def build_on_meta(cfg: ModelConfig) -> Transformer:
    """The model without storage: for counting parameters of shapes too large to allocate."""
    with torch.device("meta"):
        return Transformer(cfg)
