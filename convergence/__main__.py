"""python -m convergence train | compare | bench | validate — thin dispatch to each subcommand's main()."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

from numerics.cli import EXIT_BAD_INPUT, run_main

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
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print("usage: python -m convergence {" + ",".join(SUBCOMMANDS) + "} ...\n")
        for name, (_, text) in SUBCOMMANDS.items():
            print(f"  {name:<11} {text}")
        return 0 if args else EXIT_BAD_INPUT
    name, rest = args[0], args[1:]
    if name not in SUBCOMMANDS:
        sys.stderr.write(f"error: unknown subcommand {name!r}; choose from {', '.join(SUBCOMMANDS)}\n")
        return EXIT_BAD_INPUT
    module = importlib.import_module(SUBCOMMANDS[name][0])
    return run_main(module.main, rest)


if __name__ == "__main__":
    sys.exit(main())
