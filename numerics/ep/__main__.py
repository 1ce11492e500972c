"""python -m numerics.ep check | bench — thin dispatch to each subcommand's main()."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

from numerics.cli import EXIT_BAD_INPUT, run_main

SUBCOMMANDS = {
    "check": ("numerics.ep.check", "DeepEP (or the reference) against a reference, bit for bit, on many routings"),
    "bench": ("numerics.ep.bench", "dispatch / combine latency and bandwidth, DeepEP vs NCCL, vs the NVLink limit"),
}


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print("usage: python -m numerics.ep {" + ",".join(SUBCOMMANDS) + "} ...\n")
        for name, (_, text) in SUBCOMMANDS.items():
            print(f"  {name:<6} {text}")
        return 0 if args else EXIT_BAD_INPUT
    name, rest = args[0], args[1:]
    if name not in SUBCOMMANDS:
        sys.stderr.write(f"error: unknown subcommand {name!r}; choose from {', '.join(SUBCOMMANDS)}\n")
        return EXIT_BAD_INPUT
    return run_main(importlib.import_module(SUBCOMMANDS[name][0]).main, rest)


if __name__ == "__main__":
    sys.exit(main())
