"""Layer shapes for the layer level: the DeepSeek-V3 16B model's real sizes and a small CPU flavour.

Configs are functions returning frozen dataclasses (``small()`` beside ``sixteen_b()``); ``get(name)``
looks one up by its command-line name (``small`` | ``16b``). Every size that MXFP8 quantizes along
(K of a GEMM, N for the input gradient, tokens for the weight gradient) is a multiple of the MX
block of 32, as torchao requires; the group splits deliberately are not.

16B sizes are torchtitan's ``deepseek_v3`` "16B" flavour (DeepSeek-V2-Lite layout): dim 2048,
dense FFN hidden 10944, 64 routed experts top-6 with softmax scores, 2 shared experts, expert
hidden 1408, MLA with no q LoRA, kv_lora_rank 512, qk_nope 128, qk_rope 64, v_head 128,
16 heads, vocab 102400.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class LinearShape:
    name: str
    tokens: int
    in_features: int
    out_features: int
    bias: bool = False


@dataclass(frozen=True)
class GroupedShape:
    """A grouped GEMM (tokens x dim) @ (experts: dim -> hidden), one case of group sizes."""

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
class MoEShape:
    tokens: int
    dim: int
    experts: int
    top_k: int
    shared_experts: int
    expert_hidden: int


@dataclass(frozen=True)
class MLAShape:
    tokens: int
    dim: int
    heads: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class LayerConfig:
    name: str
    linears: tuple[LinearShape, ...]
    grouped: tuple[GroupedShape, ...]
    moe: MoEShape
    mla: MLAShape
    vocab: int
    seed: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


def _group_cases(tokens: int, experts: int, dim: int, hidden: int) -> tuple[GroupedShape, ...]:
    """The group splits the issue asks for, each summing to ``tokens`` (a multiple of 32)."""
    assert tokens % 32 == 0 and tokens >= 32 * experts
    even = (tokens // experts,) * experts
    # uneven, Zipf-like: expert i gets ~1/(i+1) of the tokens (routing concentrates on a few experts)
    w = [1.0 / (i + 1) for i in range(experts)]
    uneven = [max(32, int(tokens * x / sum(w)) // 32 * 32) for x in w]
    uneven[0] += tokens - sum(uneven)
    # empty groups: every other expert gets no token
    empty = [0] * experts
    live = list(range(0, experts, 2))
    for i in live:
        empty[i] = tokens // len(live)
    empty[live[0]] += tokens - sum(empty)
    # one expert takes every token
    one = [0] * experts
    one[experts // 2] = tokens
    # sizes that are not multiples of 32 (torchao pads them: see layers.grouped_mm)
    ragged = [tokens // experts + (7 if i % 2 == 0 else -7) for i in range(experts)]
    ragged[-1] += tokens - sum(ragged)
    cases = {"even": even, "uneven": uneven, "empty": empty, "one_group": one, "unaligned": ragged}
    return tuple(GroupedShape(name, dim, hidden, tuple(sizes)) for name, sizes in cases.items())


def small() -> LayerConfig:
    """CPU-sized: every code path of the 16B config at ~1/16 of each size, seconds on 2 cores."""
    dim, hidden, expert_hidden, tokens = 128, 320, 96, 256
    return LayerConfig(
        name="small",
        linears=(
            LinearShape("ffn.w1", tokens, dim, hidden),
            LinearShape("ffn.w2", tokens, hidden, dim),
            LinearShape("ffn.w1+bias", tokens, dim, hidden, bias=True),  # DeepSeek has none; tests bias
        ),
        grouped=_group_cases(tokens, 4, dim, expert_hidden),
        moe=MoEShape(tokens=tokens, dim=dim, experts=8, top_k=2, shared_experts=2, expert_hidden=expert_hidden),
        mla=MLAShape(tokens=128, dim=dim, heads=2, kv_lora_rank=64, qk_nope_head_dim=32,
                     qk_rope_head_dim=32, v_head_dim=32),
        vocab=1024,
    )


def sixteen_b() -> LayerConfig:
    """DeepSeek-V3 16B shapes for one H200; 4096 tokens is one 4096-long sequence per step."""
    dim, hidden, expert_hidden, tokens = 2048, 10944, 1408, 4096
    return LayerConfig(
        name="16b",
        linears=(
            LinearShape("ffn.w1", tokens, dim, hidden),
            LinearShape("ffn.w2", tokens, hidden, dim),
            LinearShape("ffn.w1+bias", tokens, dim, hidden, bias=True),
            # torchtitan keeps `output` in BF16; measured here to show what MXFP8 would cost it
            LinearShape("output", tokens, dim, 102400),
        ),
        # 16384 routed rows over 8 local experts: the grouped GEMM measured in GPU.md (28.5 dB)
        grouped=_group_cases(16384, 8, dim, expert_hidden),
        moe=MoEShape(tokens=tokens, dim=dim, experts=64, top_k=6, shared_experts=2, expert_hidden=expert_hidden),
        mla=MLAShape(tokens=tokens, dim=dim, heads=16, kv_lora_rank=512, qk_nope_head_dim=128,
                     qk_rope_head_dim=64, v_head_dim=128),
        vocab=102400,
    )


CONFIGS = {"small": small, "16b": sixteen_b}


def get(name: str) -> LayerConfig:
    try:
        return CONFIGS[name]()
    except KeyError:
        raise ValueError(f"unknown layer config {name!r}; choose from {', '.join(CONFIGS)}") from None
