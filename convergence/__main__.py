"""python -m convergence train | compare | calibrate | bench | profile | profile-step | ep-identity | protocol | power |
probes: thin dispatch to each main()."""

from __future__ import annotations

from collections.abc import Sequence

from numerics.cli import dispatch, exit_process

# subcommand -> (module, one-line help); each module has main(argv) -> int
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "compare": ("convergence.curves.cli", "decide whether a candidate loss curve matches its baseline(s)"),
    "calibrate": ("convergence.curves.calibrate", "false-alarm / miss rates on synthetic truth; --bench: loader speed"),
    "train": ("convergence.train.cli", "paired BF16 / MXFP8 pretraining runs with probes and checkpoints"),
    "ep-identity": ("convergence.train.cli:ep_identity_main",
                    "are two runs (e.g. reference vs deepep EP) identical step for step"),
    "bench": ("convergence.train.cli:bench_main", "tokens/s of bf16 and mxfp8 (per kernel) training steps, one run"),
    "profile": ("convergence.train.profile", "a run's step time, tokens/s, phases and peak memory, from its metrics"),
    "profile-step": ("convergence.train.perf.profile_step",
                     "one training step under torch.profiler: GPU kernel time, idle gaps, launches, syncs, by kind"),
    "power": ("convergence.curves.cli:power_main", "replicates and steps a margin needs, from measured spreads"),
    "probes": ("convergence.curves.probes", "per-layer BF16-vs-MXFP8 SQNRs of a run's probes: a table and a figure"),
    "protocol": ("convergence.protocol.cli",
                 "paired candidate, BF16 replicates, positive and negative controls: verdicts on validation loss"),
}


def main(argv: Sequence[str] | None = None) -> int:
    return dispatch("python -m convergence", SUBCOMMANDS, argv)


if __name__ == "__main__":
    exit_process(main())  # under torchrun (train --ep): numerics.rank_exit.exit_rank
