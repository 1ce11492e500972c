"""Layer level: the DeepSeek-V3 layers the model trains with, run in FP32, BF16 and MXFP8 on identical
inputs, forward and backward.

Modules: ``configs`` (model configs and the layer suites derived from them), ``modules`` (the layers, once),
``mxfp8`` (the one MXFP8 seam: the op and its kernel choice emulated | fast | real), ``recipes`` (the one
recipe registry and converter), ``fast`` (fused cast kernels, bit-identical to torchao's emulated ops),
``harness`` (the three-way runner), ``results`` (statistics, tables, floors), ``strategies`` (Hypothesis),
``bench``, ``cli``.
"""
