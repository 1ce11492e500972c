"""Training level: paired BF16 / MXFP8 pretraining runs of the DeepSeek-V3 family.

Modules: ``model`` (Block, Transformer), ``data`` (token streams and batches), ``loop`` (the training loop),
``distributed`` (FSDP2 + expert parallelism), ``ep_dispatch`` (the MoE seam over ``numerics.ep``),
``checkpoint`` / ``dist_checkpoint``, ``probes``, ``bench``, ``ep_identity``.
"""
