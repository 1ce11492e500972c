"""Tensor level: MX casts (torchao, microxcaling, ...) held bit for bit against an exact oracle of the OCP MX rules.

Modules: ``mx`` (the oracle: quantize / dequantize to E8M0 scales and FP8 element bytes), ``elements``
(exact element casts), ``cases`` (named byte cases), ``families`` (input families), ``findings``
(predicates of known upstream defects, per subject), ``strategies`` (Hypothesis), ``subjects`` (the casts
under test, each adapted to the oracle's byte interface), ``compare`` (a subject's bytes against the
oracle's, block by block), ``report`` and ``bench``.
"""
