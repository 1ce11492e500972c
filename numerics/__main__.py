"""python -m numerics report | layers | bench | ep — thin dispatch to each subcommand's main()."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from numerics.cli import dispatch

# subcommand -> (module, one-line help); each module has main(argv) -> int
SUBCOMMANDS = {
    "report": ("numerics.tensor.report", "tensor-level report: torchao MXFP8 cast vs the oracle and vs BF16"),
    "layers": ("numerics.layer.cli", "layer level: FP32 / BF16 / MXFP8 per layer, forward and backward"),
    "bench": ("numerics.tensor.bench", "throughput of the oracle against torchao's cast"),
    "ep": ("numerics.ep.__main__", "communication level: DeepEP vs an all-to-all reference (check | bench)"),
}


def main(argv: Sequence[str] | None = None) -> int:
    return dispatch("python -m numerics", SUBCOMMANDS, argv)


if __name__ == "__main__":
    sys.exit(main())
