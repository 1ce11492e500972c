"""Layer level: the DeepSeek-V3 layers run in FP32, BF16 and MXFP8 on identical inputs, forward and backward.

Modules: ``configs`` (model configs and the layer shapes derived from them), ``modules`` (the layers),
``harness`` (the three-way runner and its statistics), ``strategies`` (Hypothesis), ``bench``, ``cli``.
"""
