"""A protocol's runs as Slurm jobs: ``options`` (what each job asks Slurm for), ``jobs`` (submitting them, their
states read back from Slurm), ``node`` (what a job runs on its node, and when its worker stops) and ``executor``
(``SlurmExecutor``, the protocol's executor over them, and its ``--slurm-*`` flags); docs/slurm.md.
"""
