"""Numerics probes: each MXFP8-eligible layer run in BF16 and in MXFP8 side by side on the run's
current activations and upstream gradients, without touching the training state.

Public: ``probe(model, tokens, *, recipe, device) -> dict`` (one probes.jsonl record).

For every module the ``mxfp8`` recipe would quantize (attention / dense FFN / shared-expert linears,
routed-expert grouped GEMMs), a forward + backward of the model on the step's batch captures the
module's input and the gradient arriving at its output; the layer level's ``mxfp8_vs_bf16``
(``numerics.layer.harness``) then runs a BF16 and an MXFP8 copy of that module on them and reports the
SQNR (dB) of the MXFP8 output, input gradient and weight gradient against BF16's. Both bf16 and mxfp8 runs
are probed, so a diverging pair shows which layer's error grew first and on which trajectory.
"""

from __future__ import annotations

import torch
from torch import nn

from numerics.layer.deepseek_v3 import MoE
from numerics.layer.harness import mxfp8_vs_bf16
from numerics.layer.recipes import Recipe, get_recipe, quantized_fqns


def probe(model: nn.Module, tokens: torch.Tensor, *, recipe: Recipe, device: torch.device,
          kernel: str | None = None) -> dict:
    """Per-layer BF16 vs MXFP8 SQNR of output and gradients on this batch. Leaves the model's
    parameters, gradients (cleared to None), expert counters and RNG exactly as it found them."""
    mx_recipe = recipe if recipe.mxfp8 else get_recipe("mxfp8")
    modules = dict(model.named_modules())
    targets = {fqn: modules[fqn] for fqn in quantized_fqns(model, mx_recipe)}
    captured: dict[str, list] = {}
    handles = []

    def hook(fqn):
        def fwd(mod, args, out):
            captured[fqn] = [tuple(a.detach() for a in args), None]
            out.register_hook(lambda g: captured[fqn].__setitem__(1, g.detach()))
        return fwd

    for fqn, mod in targets.items():
        handles.append(mod.register_forward_hook(hook(fqn)))
    counters = {i: m.tokens_per_expert.clone() for i, m in enumerate(model.modules()) if isinstance(m, MoE)}
    rng = torch.get_rng_state()
    try:
        inp, tgt = tokens[:, :-1].to(device), tokens[:, 1:].to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            logits = model(inp)
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tgt.flatten())
        loss.backward()
    finally:
        for h in handles:
            h.remove()
        model.zero_grad(set_to_none=True)
        for i, m in enumerate(model.modules()):
            if isinstance(m, MoE):
                m.tokens_per_expert.copy_(counters[i])
        torch.set_rng_state(rng)
    layers = {}
    for fqn, (inputs, grad_out) in captured.items():
        if grad_out is not None:
            layers[fqn] = mxfp8_vs_bf16(targets[fqn], inputs, grad_out, mx_recipe, device, kernel)
    return {"layers": layers}
