"""The run folders of a protocol folder that were stopped part-way and hold a checkpoint (runs/RUN/RECIPE, one a
line): the checkpoint stays on the GPU machine, so merge.sh leaves these runs out. A fork's finished trunk keeps
its checkpoint for its continuations but is finished: its logs are merged, and a fresh machine makes it again
from step 0, held to them (convergence.protocol.forks.check_remade).   python3 dev/gpu/unfinished.py FOLDER"""

from __future__ import annotations

import sys
from pathlib import Path

from convergence.protocol.folder import load_plan, run_dir, run_state
from convergence.train.placement import CHECKPOINT_FILE


def stopped_part_way(out: Path) -> list[str]:
    plan = load_plan(out)
    return [run_dir(out, s).relative_to(out).as_posix() for s in plan.runs()
            if (run_dir(out, s) / CHECKPOINT_FILE).exists() and run_state(plan, out, s) != "done"]


if __name__ == "__main__":
    for folder in stopped_part_way(Path(sys.argv[1])):  # none stopped: an empty file, not an empty line
        print(folder)
