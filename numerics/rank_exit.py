"""How a distributed rank's process ends: ``exit_rank(code)``, for spawned ranks (``numerics.ep.launch``) and
torchrun's (``numerics.cli.exit_process``)."""

from __future__ import annotations

import os
import sys
from typing import NoReturn


def exit_rank(code: int) -> NoReturn:
    """End a distributed rank's process once its process group is torn down, skipping the interpreter's
    finalization. ``destroy_process_group`` drops torch's own references to a group; one still held elsewhere
    (a device mesh, FSDP's state) is destroyed during finalization, where gloo aborted a rank now and then
    after all its work was done ("terminate called without an active exception", exit -6; pytorch/pytorch#96017
    on what destroy leaves behind, #179291, abandoned, on the abort). Output is flushed first; every file the
    suite writes is closed by then (whole-line appends, atomic renames)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
