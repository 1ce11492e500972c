"""python -m numerics report | layers | bench | ep — thin dispatch to each subcommand's main()."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from numerics.cli import dispatch, run_command

# subcommand -> (module, one-line help); each module has main(argv) -> int
SUBCOMMANDS = {
    "report": ("numerics.tensor.report", "tensor-level report: torchao MXFP8 cast vs the oracle and vs BF16"),
    "layers": ("numerics.layer.cli", "layer level: FP32 / BF16 / MXFP8 per layer, forward and backward"),
    "bench": ("numerics.__main__", "bench [cast]: the oracle against torchao's cast; bench layers: BF16 vs MXFP8"),
    "ep": ("numerics.ep.__main__", "communication level: DeepEP vs an all-to-all reference (check | bench)"),
}


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["bench"]:  # one bench per level: cast (tensor) or layers (layer)
        rest = args[1:]
        if rest[:1] == ["layers"]:
            return run_command("numerics.layer.bench", rest[1:])
        return run_command("numerics.tensor.bench", rest)
    return dispatch("python -m numerics", SUBCOMMANDS, args)


if __name__ == "__main__":
    sys.exit(main())
