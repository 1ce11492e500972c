"""A fork plan's runs that depend on others: where each starts and ends, when it may start, when a trunk's
checkpoint may go, and a lost trunk made again.

Public: ``span(plan, spec)``, ``train_config(plan, spec, out)``, ``ready(plan, out, spec)``, ``needed(plan, out,
trunk, status)``, ``release(plan, out, status)``, ``lost_trunks(plan, out, status)``, ``remaking(plan, out, trunk,
status)``, ``set_aside(out, trunk)``, ``earlier_records(out, trunk)``, ``settle_remade(plan, out, trunk)``,
``check_remade(plan, out, trunk, before)``, ``TrunkChanged``, ``EARLIER``.

A continuation (``RunSpec.after``) starts from its trunk's checkpoint at ``fork_step`` (``convergence.train.
checkpoint``: the trunk's records up to there are copied into its log), so it may start only when that checkpoint
exists, or when it holds a checkpoint of its own (``ready``). A trunk's checkpoint (~11 GB on the proxy) is kept
while a run after it may still need it, one neither finished nor holding its own checkpoint (``needed``), and
deleted then, its logs compacted (``release``: after every piece, and at the end of ``schedule.execute``, whatever
executor made them). A trunk whose checkpoint is gone while a continuation still needs it (a GPU machine's disk
that ended with its call: ``dev/gpu/protocol.sh`` sends no checkpoint back) is made again from step 0
(``lost_trunks``); it trains with ``--deterministic``, so it comes out bit-identical, and ``check_remade`` holds
it to that: its records up to the fork step must equal its earlier ones and every continuation's copy of them
(timing fields aside), else the continuations made so far continued another trunk (``TrunkChanged``). Its earlier
logs and config.json wait in the trunk's ``EARLIER`` folder while it is made again, in one piece or several
(``set_aside``), and stay its record (``settle_remade``): the remake's timing is in ``pace.jsonl``. A trunk made
again that differs keeps no checkpoint, so that no run continues it, whoever runs the plan next.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from convergence.protocol.folder import COMPACTED, can_continue, compact_run, metrics_path, run_dir, run_state
from convergence.protocol.plan import ProtocolPlan, RunSpec
from convergence.train.checkpoint import JsonlLog
from convergence.train.loop import TrainConfig, computed
from convergence.train.placement import CHECKPOINT_FILE
from numerics.errors import BadInput
from numerics.files import gzip_or_plain

EARLIER = "earlier"  # in a trunk's run folder: its logs while it is made again (set_aside)


class TrunkChanged(BadInput):
    """A trunk made again is not the one its continuations forked from."""


def span(plan: ProtocolPlan, spec: RunSpec) -> tuple[int, int]:
    """The steps a run trains: from 0 (a continuation: the fork step) to the plan's steps (a trunk: its stop)."""
    return (plan.fork_step if spec.after else 0), (spec.stop_at or plan.steps)


def _trunk(plan: ProtocolPlan, name: str) -> RunSpec:
    return next(r for r in plan.runs() if r.name == name)


def train_config(plan: ProtocolPlan, spec: RunSpec, out: Path) -> TrainConfig:
    """``plan.train_config(spec)`` with a continuation's trunk: its run folder in ``out``."""
    cfg = plan.train_config(spec)
    if not spec.after:
        return cfg
    return dataclasses.replace(cfg, fork_from=str(run_dir(out, _trunk(plan, spec.after))), fork_step=plan.fork_step)


def ready(plan: ProtocolPlan, out: Path, spec: RunSpec) -> bool:
    """Whether a run may start now: it continues no trunk, or its trunk's checkpoint is here, or it holds its own."""
    if not spec.after or can_continue(out, spec):
        return True
    return (run_dir(out, _trunk(plan, spec.after)) / CHECKPOINT_FILE).is_file()


def needed(plan: ProtocolPlan, out: Path, trunk: RunSpec, status: dict) -> bool:
    """Whether a run after ``trunk`` may still start from its checkpoint: not done, no checkpoint of its own."""
    return any(s.after == trunk.name and status.get(s.name) != "done" and not can_continue(out, s)
               for s in plan.runs())


def release(plan: ProtocolPlan, out: Path, status: dict) -> list[str]:
    """Delete the checkpoint of every finished trunk no run needs any more, and compact its logs; the trunks
    released."""
    gone = []
    for trunk in plan.runs():
        folder = run_dir(out, trunk)
        if trunk.stop_at is None or status.get(trunk.name) != "done" or needed(plan, out, trunk, status):
            continue
        if (folder / CHECKPOINT_FILE).exists():
            gone.append(trunk.name)
        for name in (CHECKPOINT_FILE, CHECKPOINT_FILE + ".tmp"):
            (folder / name).unlink(missing_ok=True)
        compact_run(folder)
    return gone


def lost_trunks(plan: ProtocolPlan, out: Path, status: dict) -> list[RunSpec]:
    """Finished trunks without their checkpoint while a run after them still needs it: to make again."""
    return [t for t in plan.runs() if t.stop_at is not None and status.get(t.name) == "done"
            and not can_continue(out, t) and needed(plan, out, t, status)]


def remaking(plan: ProtocolPlan, out: Path, trunk: RunSpec, status: dict | None = None) -> bool:
    """Whether ``trunk`` is to be made again, or is being: lost (``lost_trunks``; ``status``: the plan's runs'
    states, read here when None) or its earlier logs set aside."""
    if trunk.stop_at is None:
        return False
    if (run_dir(out, trunk) / EARLIER).is_dir():
        return True
    status = status or {s.name: run_state(plan, out, s) for s in plan.runs()}
    return trunk in lost_trunks(plan, out, status)


def _logs(folder: Path) -> list[Path]:
    """A run folder's record of how it was made: its logs (plain or gzip) and its config.json (its environment)."""
    names = [n for name in COMPACTED for n in (name, name + ".gz")] + ["config.json"]
    return [folder / n for n in names if (folder / n).exists()]


def set_aside(out: Path, trunk: RunSpec) -> None:
    """Move a lost trunk's logs and config.json into its ``EARLIER`` folder before it is made again (kept there until
    ``settle_remade``; a remake stopped part-way and continued later is still held to them)."""
    folder = run_dir(out, trunk)
    (folder / EARLIER).mkdir(exist_ok=True)
    for p in _logs(folder):
        p.replace(folder / EARLIER / p.name)


def earlier_records(out: Path, trunk: RunSpec) -> list[dict] | None:
    """The records of the trunk's earlier log, while it is made again; None when it is not."""
    earlier = run_dir(out, trunk) / EARLIER
    return JsonlLog(gzip_or_plain(earlier / "metrics.jsonl")).records() if earlier.is_dir() else None


def settle_remade(plan: ProtocolPlan, out: Path, trunk: RunSpec) -> None:
    """A trunk made again to its stop: ``check_remade`` against its earlier log; then the earlier logs and
    config.json are put back as its record (the new ones, equal but for timing and environment, go). On
    ``TrunkChanged`` (or any failure of the check), the same, and its new checkpoint goes too: no run may continue
    a trunk that is not the one the others continued."""
    folder, earlier = run_dir(out, trunk), run_dir(out, trunk) / EARLIER
    try:
        check_remade(plan, out, trunk, earlier_records(out, trunk) or [])
    except BaseException:  # refused, or not checked (a damaged log, an interrupt): only a checked trunk continues
        (folder / CHECKPOINT_FILE).unlink(missing_ok=True)
        raise
    finally:
        for p in _logs(folder):
            p.unlink()
        for p in _logs(earlier):
            p.replace(folder / p.name)
        earlier.rmdir()


def _upto(records: list[dict], step: int) -> list[dict]:
    return [computed(r) for r in records if r.get("step", 0) <= step]


def check_remade(plan: ProtocolPlan, out: Path, trunk: RunSpec, before: list[dict]) -> None:
    """``TrunkChanged`` unless the trunk made again logged what it did before (``before``: its earlier records)
    and what each of its continuations copied from it, step for step up to the fork step (timing aside)."""
    now = _upto(JsonlLog(metrics_path(out, trunk)).records(), plan.fork_step)
    sources = [("its earlier log", before)] + [
        (f"the copy in {s.name}", JsonlLog(metrics_path(out, s)).records()) for s in plan.runs()
        if s.after == trunk.name]
    for where, records in sources:
        then = _upto(records, plan.fork_step)
        if then and then != now:
            step = next((a.get("step") for a, b in zip(then, now) if a != b), min(len(then), len(now)) + 1)
            raise TrunkChanged(f"{run_dir(out, trunk)}: the trunk made again differs from {where} at step {step}: "
                               "the runs forked from it continued another trunk (was it trained without "
                               "--deterministic, or on another machine or version?)")
