"""What each run's Slurm job asks for (partition, time, GPUs, CPUs, memory, nodes, extra sbatch flags), checked
before anything is submitted, and as submitit's parameters.

Public: ``SlurmOptions``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from convergence.protocol.slurm.node import SIGNAL_DELAY_S
from numerics.errors import BadInput

# flags an option of SlurmOptions sets, or that the executor relies on (logs, array, signal, requeue, one task a node)
_OWN_FLAGS = {"partition", "account", "qos", "time", "gpus-per-node", "gpus", "cpus-per-task", "mem", "nodes",
              "constraint", "job-name", "array", "output", "error", "signal", "open-mode", "ntasks-per-node",
              "ntasks", "requeue", "no-requeue", "wckey"}
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.,:&|+-]*")  # partition, account, qos, constraint: no spaces or quotes


@dataclass(frozen=True)
class SlurmOptions:
    """What each run's job asks Slurm for. ``gpus``, ``cpus`` and ``mem_gb`` are per run, spread evenly over its
    ``nodes``; None leaves it to the cluster's default. ``sbatch_flags``: other flags as ``--flag`` or
    ``--flag=value`` (e.g. ``--exclusive``, ``--reservation=x``)."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time_minutes: int = 60
    gpus: int = 0
    cpus: int | None = None
    mem_gb: float | None = None
    nodes: int = 1
    constraint: str | None = None
    sbatch_flags: tuple[str, ...] = ()

    def check(self) -> SlurmOptions:
        """Itself, or BadInput naming the first value Slurm could not take."""
        for key in ("partition", "account", "qos", "constraint"):
            v = getattr(self, key)
            if v is not None and not (isinstance(v, str) and _NAME.fullmatch(v)):
                raise BadInput(f"Slurm {key} {v!r}: a name without spaces or quotes")
        for key, low in (("time_minutes", 1), ("gpus", 0), ("nodes", 1), ("cpus", 1)):
            v = getattr(self, key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < low):
                raise BadInput(f"Slurm {key} {v!r}: a whole number >= {low}")
        if self.mem_gb is not None and not (isinstance(self.mem_gb, (int, float)) and 0 < self.mem_gb < math.inf):
            raise BadInput(f"Slurm mem_gb {self.mem_gb!r}: a number of GB > 0")
        for key in ("gpus", "cpus"):
            v = getattr(self, key)
            if v and v % self.nodes:
                raise BadInput(f"Slurm {key} {v} per run over {self.nodes} nodes: a run's nodes get the same share")
        self.additional()
        return self

    def per_node(self) -> tuple[int, int | None, float | None]:
        """(GPUs, CPUs, memory in GB) each node of a run gets."""
        return (self.gpus // self.nodes, None if self.cpus is None else self.cpus // self.nodes,
                None if self.mem_gb is None else self.mem_gb / self.nodes)

    def additional(self) -> dict[str, object]:
        """``sbatch_flags`` as submitit's ``additional_parameters`` (flag name -> value, True for a bare flag)."""
        out: dict[str, object] = {}
        for flag in self.sbatch_flags:
            m = re.fullmatch(r"--([a-z][a-z0-9-]*)(?:=(\S.*))?", flag) if isinstance(flag, str) else None
            if m is None or "\n" in flag:
                raise BadInput(f"sbatch flag {flag!r}: give it as --flag or --flag=value")
            if m.group(1) in _OWN_FLAGS:
                raise BadInput(f"sbatch flag {flag}: set by the executor or by its own option, not as an extra flag")
            out[m.group(1)] = True if m.group(2) is None else m.group(2)
        return out

    def parameters(self, name: str) -> dict[str, object]:
        """submitit ``SlurmExecutor.update_parameters`` for jobs named ``name``: one task per node (a ``Piece``,
        which starts torchrun for a run of several processes), the warning signal, requeue on preemption."""
        gpus, cpus, mem = self.per_node()
        p: dict[str, object] = {"job_name": name, "time": self.time_minutes, "nodes": self.nodes,
                                "ntasks_per_node": 1, "signal_delay_s": SIGNAL_DELAY_S, "stderr_to_stdout": True,
                                "additional_parameters": {"requeue": True, **self.additional()}}
        for key, v in (("partition", self.partition), ("account", self.account), ("qos", self.qos),
                       ("constraint", self.constraint), ("cpus_per_task", cpus),
                       ("gpus_per_node", gpus or None), ("mem", None if mem is None else f"{math.ceil(mem * 1024)}M")):
            if v is not None:
                p[key] = v
        return p
