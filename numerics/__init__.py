"""Tensor, layer and communication levels of mxval.

Public modules: ``mx`` (exact MX oracle), ``elements`` (exact element casts), ``strategies``
(Hypothesis strategies), ``metrics`` (error statistics), ``tolerances`` (the thresholds and why),
``assertions`` (the three comparison helpers), ``tensor.subjects`` (the MX casts under test, adapted to bytes).
Importing this package has no side effects.
"""
