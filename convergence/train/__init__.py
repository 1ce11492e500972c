"""Training level: paired BF16 / MXFP8 pretraining runs of the DeepSeek-V3 family.

Modules: ``model`` (Block, Transformer, stacked from ``numerics.layer.deepseek_v3``), ``data`` (token streams and
batches), ``loop`` (the one training loop), ``placement`` (one process) and ``distributed`` (FSDP2 + expert
parallelism) for where a run lives, ``ep_dispatch`` (the MoE seam over ``numerics.ep``), ``checkpoint`` /
``dist_checkpoint``, ``stopping`` (a scheduler's signal stops a run at its next checkpoint), ``probes``,
``profile`` (a run's cost read back from its metrics), ``perf`` (one step's speed: ``bench``, ``profile_step``),
``ep_identity``, ``cli`` (train, bench, ep-identity). The protocol that runs many of them: ``convergence.protocol``.
"""
