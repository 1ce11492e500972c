"""Loss curves: load anyone's logs, align them, detect divergence and decide equivalence.

Modules: ``curve`` (the Curve type, CurveError, the rule for steps that go back), ``load`` (format
detection; CSV, torchtitan logs and loss files), ``jsonl``, ``tbevents`` and ``tbwire`` (TensorBoard),
``align``, ``divergence``, ``compare`` (verdicts), ``calibrate``, ``synthetic`` (curves with a known
truth), ``plots``, ``cli``.
"""
