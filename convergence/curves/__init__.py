"""Loss curves: load anyone's logs, align them, detect divergence and decide equivalence.

Modules: ``load`` (JSONL / CSV / torchtitan / TensorBoard), ``tbevents``, ``align``, ``divergence``,
``compare`` (verdicts), ``calibrate``, ``synthetic`` (curves with a known truth), ``plots``, ``cli``.
"""
