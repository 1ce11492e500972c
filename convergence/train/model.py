"""The DeepSeek-V3 model: a stack of ``numerics.layer.deepseek_v3`` layers, configs tiny / proxy / 16b.

Public: ``Block``, ``Transformer``, ``build_on_meta``. The configs (``ModelConfig``, ``tiny``, ``proxy``,
``deepseek_v3_16b``, ``get_config``, ``param_count``) live in ``numerics.layer.configs`` and the layers in
``numerics.layer.deepseek_v3``: the layer level measures exactly the modules this model trains.

Activation checkpointing (``Transformer.activation_checkpointing``): each block keeps only its input for
backward and runs again there, with the same bits (deterministic ops) and without counting its tokens twice.

Mixed precision: parameters are FP32 masters; every matmul runs in the compute dtype (the module
docstring of ``numerics.layer.deepseek_v3`` says how and why); a recipe's MXFP8 op goes into a module's
``mxfp8_op`` seam (``numerics.layer.recipes.apply_recipe``).
"""

from __future__ import annotations

import contextlib
import math

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from numerics.layer.configs import ModelConfig
from numerics.layer.deepseek_v3 import Attention, FeedForward, Linear, MoE, RMSNorm, rope_frequencies


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
            self.moe = MoE(cfg)

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
        # keep only each block's input for backward and run the block again there (activation checkpointing)
        self.activation_checkpointing = False

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
            into_residual = name.endswith((".wo.weight", ".w2.weight"))  # attention, FFN and expert w2
            scale = std / math.sqrt(2 * self.cfg.n_layers) if into_residual else std
            p.normal_(generator=generator).mul_(scale)  # randn's draws in place: no copy of the 16b's 63 GB
        for buf in self.buffers():  # every buffer starts at zero: the experts' bias and token counts
            buf.zero_()

    def moe_layers(self) -> list[tuple[int, MoE]]:
        return [(i, blk.moe) for i, blk in enumerate(self.layers) if blk.moe is not None]

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [b, s] -> logits [b, s, vocab] (compute dtype)."""
        s = tokens.shape[1]
        cos, sin = rope_frequencies(self.cfg, s)
        cos, sin = cos.to(tokens.device), sin.to(tokens.device)
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            if self.activation_checkpointing and torch.is_grad_enabled():
                h = checkpoint(layer, h, cos, sin, use_reentrant=False,
                               context_fn=lambda layer=layer: (contextlib.nullcontext(), _recomputing(layer)))
            else:
                h = layer(h, cos, sin)
        return self.output(self.norm(h))


@contextlib.contextmanager
def _recomputing(block: Block):
    """While backward runs a checkpointed block's forward again: the MoE must not count its tokens twice
    (the expert-load metric and the bias update read the counts of the step's forward passes)."""
    moe = block.moe
    if moe is None:
        yield
        return
    moe.count_tokens = False
    try:
        yield
    finally:
        moe.count_tokens = True


def build_on_meta(cfg: ModelConfig) -> Transformer:
    """The model without storage: for counting parameters of shapes too large to allocate."""
    with torch.device("meta"):
        return Transformer(cfg)


def build_initialised(cfg: ModelConfig, seed: int) -> Transformer:
    """The model on the CPU with its initial weights from ``seed``. Built without storage first, so no module
    spends time on a default initialisation that ``init_weights`` overwrites (8 % of building a 1.09B slice of
    the 16b on a CPU: 12.2 -> 11.2 s); every parameter and buffer is set by ``init_weights``."""
    model = build_on_meta(cfg)
    model.to_empty(device="cpu")
    model.init_weights(torch.Generator().manual_seed(seed))
    return model
