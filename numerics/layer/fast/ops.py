"""MXFP8 linear and grouped GEMM (forward, dX, dW) on the fast cast kernels, bit-identical to torchao
0.18.0's emulated ops: ``mxfp8_linear._to_mxfp8_then_scaled_mm`` and ``_to_mxfp8_then_scaled_grouped_mm``
with ``KernelPreference.EMULATED``, for every ``OpRecipe`` (``numerics.layer.op_recipe``) torchao has ops for,
and the same ops for those it has not (E5M2 or E2M1 elements: the convergence protocol's worse-by-construction
controls; the identity cast: its null control).

Only torchao's cast work (``to_mx``, the transposing copies before it, and the dequantize after it) is
replaced: each operand is read once by the fast kernel, which writes every layout the step's GEMMs take of it
(``mx_dequantize_both`` for x, W and dY; one layout where dW is computed in high precision). The layouts backward
takes of x and W are cast in forward and kept for it in place of x and W: more saved memory than torchao's ops,
which keep x and W and cast them again (the null control's identity cast keeps x and W themselves). Several ops on
one input (a SwiGLU's w1 and w3, attention's first two projections) can take its casts made once
(``input_casts`` / ``grouped_input_casts``, then ``x_casts=``): the same tensors each would have made, so no bit
changes, and each op stays its own autograd function, so x's gradient sums their contributions as separate calls
do. The GEMMs are the same ops (``torch.mm``, ``torch._grouped_mm``) on operands of the same dtype, shape and
strides, which is what makes cuBLAS pick the same kernel and return the same bits. Where torchao quantizes along
which dim:

=========  ===========================  ====================================  ======================
GEMM       linear                       grouped (w_t [E, K, N], w = w_t^T)    operand layout seen
=========  ===========================  ====================================  ======================
forward    x along K, W [N, K] along K  x along K, w along K                  B: transposed view
dX         dY along N, W along N        dY along N, w along N                 B: transposed view
dW         dY^T, x^T along M (tokens)   same, blocks span experts (L3)        A: contiguous, B: view
dW (hp)    dY^T @ x in high precision   same, per group                       as torchao
=========  ===========================  ====================================  ======================

Linear dequantizes to the operand's dtype (``MXTensor.dequantize``), the grouped GEMM always to BF16
(torchao's grouped emulation). Unlike torchao, non-contiguous operands and upstream gradients are
taken as they are (FINDINGS L1), and a dim that must hold whole blocks but does not raises ``BadInput``. Besides
the casts, torchao's group padding is replaced too (``pad_groups``): ``numerics.layer.fast.padding`` pads token
groups to 32 rows in torchao's layout on the device, with no host synchronisation, where torchao reads the group
sizes on the host; the casts of a padded operand read its unpadded rows by the layout's row map, so the padded copy is
not written (only the identity cast and a dW in high precision, which take the padded operand itself, make it).

Public: ``linear(x, weight, op=MXFP8, *, x_casts=None)``, ``grouped_mm(x, w_t, offs, op=MXFP8, *, pad_groups,
x_casts=None)``, ``input_casts(x, op, *, want_dw)``, ``grouped_input_casts(x, offs, op, *, pad_groups, want_dw)``.
"""

from __future__ import annotations

import torch

from numerics.errors import BadInput
from numerics.layer.fast import padding
from numerics.layer.fast.cast import TORCHAO_ELEMENTS, mx_dequantize, mx_dequantize_both
from numerics.layer.op_recipe import MXFP8, OpRecipe


def _flavour(op: OpRecipe) -> str:
    """torchao's casts where torchao has the element (its ops take E4M3; E5M2 through its to_mx), else the spec's."""
    return "torchao" if op.elements in TORCHAO_ELEMENTS else "spec"


def _cast(t: torch.Tensor, dim: int, op: OpRecipe, out_dtype: torch.dtype, rows=None) -> torch.Tensor:
    """``t`` as the GEMM sees it: cast to ``op``'s MX elements along ``dim`` by its scale rule, dequantized; with
    ``op.cast == "identity"`` (the null control) ``t`` itself in ``out_dtype``, in its own layout, as a BF16 GEMM
    takes it. ``rows``: cast ``t``'s rows gathered by this map (``padding.row_map``; not with the identity)."""
    if op.cast == "identity":
        return t.to(out_dtype)
    return mx_dequantize(t, elem=op.elements, mode=op.scale_calculation_mode.lower(), dim=dim, flavour=_flavour(op),
                         out_dtype=out_dtype, rows=rows)


def _cast_both(t: torch.Tensor, op: OpRecipe, out_dtype: torch.dtype, rows=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(_cast(t, -1, ...), _cast(t, -2, ...))`` in one launch over ``t``, for an operand one step casts both ways."""
    if op.cast == "identity":
        return t.to(out_dtype), t.to(out_dtype)
    return mx_dequantize_both(t, elem=op.elements, mode=op.scale_calculation_mode.lower(), flavour=_flavour(op),
                              out_dtype=out_dtype, rows=rows)


def _layouts(t: torch.Tensor, op: OpRecipe, out_dtype: torch.dtype, along_last: bool, along_rows: bool, rows=None):
    """``(t cast along -1, t cast along -2)``, each only where asked (else None); in one launch when both are."""
    if along_last and along_rows:
        return _cast_both(t, op, out_dtype, rows)
    return (_cast(t, -1, op, out_dtype, rows) if along_last else None,
            _cast(t, -2, op, out_dtype, rows) if along_rows else None)


def _padded(t: torch.Tensor, src, blank, gather, fold: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(operand, rows)`` for casting ``t`` in the padded layout: ``t`` and the map its casts gather by (``fold``:
    the padding folded into the casts' loads, the padded copy never written), or ``t`` padded (the identity cast
    returns its operand; dW in high precision multiplies it)."""
    return (t, gather) if fold else (padding.pad(t, src, blank), None)


def _given(casts: tuple, want_rows: bool, what: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(along -1, along -2 or None)`` of casts made by ``input_casts``, the second only where this op wants it."""
    a, x_m = casts
    if want_rows and x_m is None:
        raise BadInput(f"{what}: x_casts were made without the layout along the tokens, which this op's dW needs "
                       "(make them with want_dw=True)")
    return a, x_m if want_rows else None


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, op: OpRecipe, want_dx: bool, want_dw: bool, x_casts: tuple | None):
        ctx.op, ctx.x_shape = op, x.shape
        x2 = x.reshape(-1, x.shape[-1])
        # each operand read once: the layouts backward will take are cast with the forward's and kept for it (only
        # those of the gradients asked for: an evaluation's forward casts one layout)
        b, w_n = _layouts(weight, op, weight.dtype, True, want_dx)  # along K [N, K]; along N, [K, N] in memory
        x_rows = want_dw and not op.wgrad_with_hp
        a, x_m = (_layouts(x2, op, x.dtype, True, x_rows) if x_casts is None  # along K; along the tokens M
                  else _given(x_casts, x_rows, "linear"))
        ctx.save_for_backward(x2 if want_dw and op.wgrad_with_hp else x_m, w_n)
        return torch.mm(a, b.t()).reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad_out):
        x_m, w_n = ctx.saved_tensors
        op = ctx.op
        want_dx, want_dw = w_n is not None, x_m is not None
        g2 = grad_out.reshape(-1, grad_out.shape[-1])
        g_n, g_m = _layouts(g2, op, grad_out.dtype, want_dx, want_dw and not op.wgrad_with_hp)
        grad_x = grad_w = None
        if want_dx:  # dX = dY @ W, both along N; W's dequantized copy is [K, N] in memory, seen as [N, K]
            grad_x = torch.mm(g_n, w_n).reshape(*grad_out.shape[:-1], ctx.x_shape[-1])
        if want_dw and op.wgrad_with_hp:
            # torchao multiplies its contiguous copy of dY; the same layout gives the same GEMM
            grad_w = torch.mm(grad_out.contiguous().reshape(-1, grad_out.shape[-1]).t(), x_m)
        elif want_dw:  # dW = dY^T @ x, both along the tokens M
            grad_w = torch.mm(g_m.t(), x_m)
        return grad_x, grad_w, None, None, None, None


def _check_op(op) -> None:
    if not isinstance(op, OpRecipe):
        raise BadInput(f"op must be a numerics.layer.op_recipe.OpRecipe, got {op!r}")


def linear(x: torch.Tensor, weight: torch.Tensor, op: OpRecipe = MXFP8, *,
           x_casts: tuple | None = None) -> torch.Tensor:
    """``x @ weight.T`` with MX operands in forward and backward by ``op``, as torchao's emulated linear (and the
    same for the element formats torchao has not). ``x_casts``: x's casts from ``input_casts(x, op, ...)``, taken
    in place of casting x again."""
    _check_op(op)
    if weight.ndim != 2 or x.ndim < 1 or x.shape[-1] != weight.shape[1]:
        raise BadInput(f"linear needs x [..., K] and weight [N, K], got {tuple(x.shape)} and {tuple(weight.shape)}")
    _check_casts(x_casts, (x.numel() // max(x.shape[-1], 1), x.shape[-1]), "linear")
    grad = torch.is_grad_enabled()  # off inside Function.forward: asked here
    return _Linear.apply(x, weight, op, grad and x.requires_grad, grad and weight.requires_grad, x_casts)


def _check_casts(x_casts: tuple | None, shape: tuple, what: str) -> None:
    if x_casts is not None and tuple(x_casts[0].shape) != tuple(shape):
        raise BadInput(f"{what}: x_casts are of an operand of shape {tuple(x_casts[0].shape)}, not of this x "
                       f"({tuple(shape)} as the op casts it)")


def input_casts(x: torch.Tensor, op: OpRecipe = MXFP8, *, want_dw: bool) -> tuple:
    """x's casts as ``linear`` makes them (along K; along the tokens too where ``want_dw`` and dW is in MX), made
    once for several linears on one x, each given them as ``x_casts``. Outside autograd: each linear routes its own
    gradient to x."""
    _check_op(op)
    x2 = x.detach().reshape(-1, x.shape[-1])
    return _layouts(x2, op, x.dtype, True, want_dw and not op.wgrad_with_hp)


def _folds(op: OpRecipe, *, keeps_padded: bool) -> bool:
    """Whether an operand's padding goes into its casts: not for the identity cast or an operand dW in high
    precision multiplies as it is (``keeps_padded``), which need the padded copy itself."""
    return op.cast != "identity" and not keeps_padded


class _GroupedMM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w_t, offs, op: OpRecipe, pad_groups: bool, want_dx: bool, want_dw: bool,
                x_casts: tuple | None):
        xp, rows, offs_p, dest, src, blank, gather = x, None, offs, None, None, None, None
        if pad_groups:  # torchao's padded layout, computed on the device once for forward and backward
            dest, offs_p, src, blank, gather = padding.layout(offs, x.shape[0])
            keeps_padded = want_dw and op.wgrad_with_hp
            if x_casts is None or keeps_padded:  # given casts need no padded operand, unless dW multiplies it
                xp, rows = _padded(x, src, blank, gather, _folds(op, keeps_padded=keeps_padded))
        # each operand read once: the layouts backward will take are cast with the forward's and kept for it (only
        # those of the gradients asked for)
        x_rows = want_dw and not op.wgrad_with_hp
        a, x_m = (_layouts(xp, op, torch.bfloat16, True, x_rows, rows) if x_casts is None  # along K; along M
                  else _given(x_casts, x_rows, "grouped_mm"))
        w = w_t.transpose(-2, -1)  # [E, N, K]
        b, w_n = _layouts(w, op, torch.bfloat16, True, want_dx)  # along K; along N, [E, K, N] in memory
        out = torch._grouped_mm(a, b.transpose(-2, -1), offs=offs_p, out_dtype=torch.bfloat16)
        if pad_groups:
            out = padding.unpad(out, dest)
        ctx.save_for_backward(xp if want_dw and op.wgrad_with_hp else x_m, w_n, offs_p, dest, src, blank, gather)
        ctx.op = op
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x_m, w_n, offs_p, dest, src, blank, gather = ctx.saved_tensors
        op = ctx.op
        want_dx, want_dw = w_n is not None, x_m is not None
        g, rows = grad_out, None
        if dest is not None:
            g, rows = _padded(grad_out, src, blank, gather, _folds(op, keeps_padded=want_dw and op.wgrad_with_hp))
        g_n, g_m = _layouts(g, op, torch.bfloat16, want_dx, want_dw and not op.wgrad_with_hp, rows)
        grad_x = grad_w = None
        if want_dx:  # dX = dY @ w, both along N
            grad_x = torch._grouped_mm(g_n, w_n, offs=offs_p, out_dtype=torch.bfloat16)
            if dest is not None:
                grad_x = padding.unpad(grad_x, dest)
        if want_dw and op.wgrad_with_hp:
            grad_w = torch._grouped_mm(g.contiguous().transpose(-2, -1), x_m, offs=offs_p,
                                       out_dtype=torch.bfloat16).transpose(-2, -1)
        elif want_dw:  # dW = dY^T @ x per group, both along the tokens (blocks may span groups: FINDINGS L3)
            grad_w = torch._grouped_mm(g_m.transpose(-2, -1), x_m, offs=offs_p,
                                       out_dtype=torch.bfloat16).transpose(-2, -1)
        return grad_x, grad_w, None, None, None, None, None, None


def grouped_mm(x: torch.Tensor, w_t: torch.Tensor, offs: torch.Tensor, op: OpRecipe = MXFP8, *,
               pad_groups: bool, x_casts: tuple | None = None) -> torch.Tensor:
    """Grouped ``x[group e] @ w_t[e]`` (x [M, K], w_t [E, K, N], offs the groups' end rows) with MX operands by
    ``op`` in forward and backward, BF16 out, as torchao's emulated grouped GEMM. ``x_casts``: x's casts from
    ``grouped_input_casts`` with the same ``offs`` and ``pad_groups``, taken in place of casting x again."""
    _check_op(op)
    if x.ndim != 2 or w_t.ndim != 3 or x.shape[1] != w_t.shape[1] or offs.ndim != 1 or offs.numel() != w_t.shape[0]:
        raise BadInput(f"grouped_mm needs x [M, K], w_t [E, K, N] and offs [E], got {tuple(x.shape)}, "
                       f"{tuple(w_t.shape)} and {tuple(offs.shape)}")
    rows = padding.padded_rows(x.shape[0], offs.shape[0]) if pad_groups else x.shape[0]
    _check_casts(x_casts, (rows, x.shape[1]), "grouped_mm")
    grad = torch.is_grad_enabled()  # off inside Function.forward: asked here
    return _GroupedMM.apply(x, w_t, offs, op, pad_groups, grad and x.requires_grad, grad and w_t.requires_grad,
                            x_casts)


def grouped_input_casts(x: torch.Tensor, offs: torch.Tensor, op: OpRecipe = MXFP8, *, pad_groups: bool,
                        want_dw: bool) -> tuple:
    """x's casts as ``grouped_mm`` makes them for these groups (along K; along the tokens too where ``want_dw`` and
    dW is in MX), made once for several grouped GEMMs on one x, each given them as ``x_casts``."""
    _check_op(op)
    xp, rows = x.detach(), None
    if pad_groups:
        lay = padding.layout(offs, x.shape[0])
        # the casts read x's rows by the map even where dW in high precision multiplies the padded copy, which
        # each grouped GEMM then makes for itself: no third copy here
        xp, rows = _padded(xp, lay.src, lay.blank, lay.rows, _folds(op, keeps_padded=False))
    return _layouts(xp, op, torch.bfloat16, True, want_dw and not op.wgrad_with_hp, rows)
