"""Tensor level: torchao's MX cast held bit for bit against an exact oracle of the OCP MX rules.

Modules: ``mx`` (the oracle: quantize / dequantize to E8M0 scales and FP8 element bytes), ``elements``
(exact element casts), ``cases`` (named byte cases), ``families`` (input families), ``findings``
(block predicates of known upstream defects), ``strategies`` (Hypothesis), ``torchao_cast`` (the
subject adapted to the oracle's byte interface), ``report`` and ``bench``.
"""
