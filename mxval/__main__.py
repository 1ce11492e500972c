"""mxval validate | numerics ... | convergence ... | golden ... — forwards to python -m <package>.

``mxval validate`` (``mxval.validate``) runs the whole ladder on this machine.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

PACKAGES = {
    "validate": "run every level this machine can run and write results/<timestamp>/report.html",
    "numerics": "tensor, layer and communication levels",
    "convergence": "training runs and loss-curve comparison",
    "golden": "check or regenerate the versioned reference artifacts",
}

# commands of this package: name -> the module whose main(argv) runs it
ROUTES = {"validate": "mxval.validate.run"}


def main(argv: Sequence[str] | None = None) -> int:
    from numerics.cli import print_usage, run_command

    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        return print_usage("usage: mxval {" + ",".join(PACKAGES) + "} ...", PACKAGES, asked=bool(args))
    if args[0] not in PACKAGES:
        sys.stderr.write(f"error: unknown command {args[0]!r}; choose from {', '.join(PACKAGES)}\n")
        return 2
    if args[0] in ROUTES:
        return run_command(ROUTES[args[0]], args[1:])
    return importlib.import_module(f"{args[0]}.__main__").main(args[1:])


if __name__ == "__main__":
    sys.exit(main())
