"""numerics.cli's process ends: a torchrun rank skips the interpreter's finalization, anything else does not."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# an atexit handler stands for everything finalization runs (torch's destructors among them): it must not run in a
# rank, and the rank's last output must still arrive, with its exit code
SCRIPT = """
import atexit, sys
from numerics.cli import exit_process
atexit.register(lambda: print("finalized", flush=True))
print("last line of output", end="")
sys.stderr.write("and of errors")
exit_process(3)
"""


@pytest.mark.parametrize("rank", [True, False], ids=["torchrun-rank", "one-process"])
def test_exit_process_skips_finalization_only_in_a_torchrun_rank(rank):
    env = {k: v for k, v in os.environ.items() if k != "WORLD_SIZE"} | {"PYTHONPATH": str(ROOT)}
    if rank:
        env["WORLD_SIZE"] = "2"
    r = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 3
    assert r.stdout.startswith("last line of output") and r.stderr.endswith("and of errors")
    assert ("finalized" in r.stdout) is not rank
