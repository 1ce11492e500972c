"""Numerics probes: each MXFP8-eligible layer run in BF16 and in MXFP8 side by side on the run's
current activations and upstream gradients, without touching the training state.

Public: ``probe(model, tokens, *, recipe, device) -> dict`` (one probes.jsonl record).

For every module the ``mxfp8`` recipe would quantize (attention / dense FFN / shared-expert linears,
routed-expert grouped GEMMs), a forward + backward of the model on the step's batch captures the
module's input and the gradient arriving at its output. Two private copies of the module — one with
plain BF16 weights, one given the recipe's torchao MXFP8 op by ``apply_recipe`` — are run
on that input, backpropagated with that gradient, and compared: SQNR (dB) of the MXFP8 output, input
gradient and weight gradients against BF16's (``numerics.metrics.sqnr_db``). Both bf16 and mxfp8 runs
are probed, so a diverging pair shows which layer's error grew first and on which trajectory.

Seam: this is a self-contained stand-in for the layer-level harness ``numerics/layers.py`` (run a layer
as FP32 / BF16 / MXFP8 on identical inputs, fwd + bwd); ``_compare_module`` is the call to replace
with it once it lands.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from convergence.train.checkpoint import plain
from convergence.train.moe import MoE
from convergence.train.recipes import Recipe, apply_recipe, get_recipe, quantized_fqns
from numerics.metrics import sqnr_db


def _plain_copy(module: nn.Module, device: torch.device) -> nn.Module:
    """A copy of ``module`` with plain (unwrapped) FP32 parameters on ``device``, no gradients and no
    MXFP8 op (a module of an mxfp8 run carries its recipe's op; the copy starts from plain precision)."""
    twin = copy.deepcopy(module)
    for name, p in module.named_parameters(recurse=False):
        setattr(twin, name, nn.Parameter(plain(p).to(device)))
    if hasattr(twin, "mxfp8_op"):
        twin.mxfp8_op = None
    return twin


def _run(module: nn.Module, inputs: tuple, grad_out: torch.Tensor, device_type: str):
    x = inputs[0].detach().clone().requires_grad_(True)
    with torch.autocast(device_type, dtype=torch.bfloat16):
        y = module(x, *inputs[1:])
    y.backward(grad_out)
    grads = {n: p.grad.detach().float() for n, p in module.named_parameters()}
    return y.detach().float(), x.grad.detach().float(), grads


def _compare_module(module: nn.Module, inputs: tuple, grad_out: torch.Tensor, recipe: Recipe,
                    device: torch.device) -> dict:
    """SQNR of MXFP8 against BF16 for one layer on identical inputs (seam: numerics/layers.py)."""
    ref = _plain_copy(module, device)
    mx = _plain_copy(module, device)
    wrapper = nn.ModuleDict({"m": mx})
    probe_recipe = Recipe(
        name=recipe.name, mxfp8=True, linear_fqns=("m",), grouped_experts=True,
        wgrad_with_hp=recipe.wgrad_with_hp, scale_calculation_mode=recipe.scale_calculation_mode,
    )
    apply_recipe(wrapper, probe_recipe, device)
    y_ref, dx_ref, dw_ref = _run(ref, inputs, grad_out, device.type)
    y_mx, dx_mx, dw_mx = _run(wrapper["m"], inputs, grad_out, device.type)
    rec = {"out_sqnr_db": sqnr_db(y_ref, y_mx), "dx_sqnr_db": sqnr_db(dx_ref, dx_mx)}
    for name in dw_ref:
        rec[f"d{name}_sqnr_db"] = sqnr_db(dw_ref[name], dw_mx[name])
    return rec


def probe(model: nn.Module, tokens: torch.Tensor, *, recipe: Recipe, device: torch.device) -> dict:
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
            layers[fqn] = _compare_module(targets[fqn], inputs, grad_out, recipe, device)
    return {"layers": layers}
