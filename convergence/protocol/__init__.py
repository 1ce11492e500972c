"""Convergence protocol: many training runs of one plan (a paired candidate, BF16 replicates, its controls),
made in resumable pieces and judged on held-out validation loss.

Modules, one concern each: ``plan`` (the design and the run list, the commands that make them), ``folder`` (the
runs' state on disk, compaction), ``schedule`` (which run goes where: the ``Executor`` seam, ``LocalExecutor``
for this machine's GPUs or CPU workers, the pace), ``slurm`` (each run a Slurm job: ``slurm.executor`` over
``slurm.jobs``, which submits them and reads their states, and ``slurm.node``, what a job runs on its node),
``forks`` and ``pilot`` (the fork design's dependencies, its pilot's spread), ``projection`` (a declared plan's
chances and cost), ``judge`` (verdicts and result files),
``provenance`` (the runs' environments, the hardware tag), ``replicate_drift`` (how fast replicates drift from
their paired run, the spread at each evaluation), ``status`` (how far a folder is, as data), ``render`` (that data
in words and figures), ``worker`` (one piece of one run, as a worker process or a Slurm job runs it), ``cli``
(python -m convergence protocol).
"""
