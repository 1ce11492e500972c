"""python -m numerics.ep check | bench — thin dispatch to each subcommand's main()."""

from __future__ import annotations

from collections.abc import Sequence

from numerics.cli import dispatch, exit_process

SUBCOMMANDS = {
    "check": ("numerics.ep.check", "DeepEP (or the reference) against a reference, bit for bit, on many routings"),
    "bench": ("numerics.ep.bench", "dispatch / combine latency and bandwidth, DeepEP vs NCCL, vs the NVLink limit"),
}


def main(argv: Sequence[str] | None = None) -> int:
    return dispatch("python -m numerics.ep", SUBCOMMANDS, argv)


if __name__ == "__main__":
    exit_process(main())  # under torchrun (check, bench): numerics.rank_exit.exit_rank
