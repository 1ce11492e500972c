"""Convergence protocol: many training runs of one plan (a paired candidate, BF16 replicates, both controls),
run in resumable pieces and judged on held-out validation loss.

Modules: ``plan`` (the runs, their state, the verdicts and result files), ``pieces`` (scheduling the runs'
pieces on the GPUs or CPU workers, their pace), ``cli`` (python -m convergence protocol).
"""
