"""python -m convergence train | compare | bench | validate — thin dispatch to each subcommand's main()."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from numerics.cli import dispatch

# subcommand -> (module, one-line help); each module has main(argv) -> int
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "compare": ("convergence.compare_cli", "decide whether a candidate loss curve matches its baseline(s)"),
    "calibrate": ("convergence.calibrate", "false-alarm / miss rates on synthetic truth; --bench: loader speed"),
    "train": ("convergence.train", "paired BF16 / MXFP8 pretraining runs with probes and checkpoints"),
    "ep-identity": ("convergence.ep_identity", "are two runs (e.g. reference vs deepep EP) identical step for step"),
    "bench": ("convergence.bench", "tokens/s and MFU of bf16 and mxfp8 training steps, in one run"),
    "validate": ("convergence.validate", "the whole ladder on this machine -> results/<timestamp>/report.html"),
}


def main(argv: Sequence[str] | None = None) -> int:
    return dispatch("python -m convergence", SUBCOMMANDS, argv)


if __name__ == "__main__":
    sys.exit(main())
