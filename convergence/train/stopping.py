"""Stop training at the next step boundary, with its checkpoint, when a scheduler says time is up.

Public: ``stop_on_signals(*signums)`` (a context manager), ``stop_requested() -> str | None``.

A batch scheduler ends a job with a signal and then a kill: Slurm sends ``--signal``'s signal (submitit asks
SIGUSR2 90 s before the time limit) and, on preemption or ``scancel``, SIGTERM, then SIGKILL after its grace time.
A process that dies at that kill loses every step since its last checkpoint, which in a protocol piece is the
whole piece (it checkpoints only when it stops). Inside ``stop_on_signals``, the first of the named signals makes
the training loop stop after the step it is in, writing its checkpoint exactly as a stop by ``stop_after_s``
does, so the resumed run is bit-identical to an uninterrupted one; later signals change nothing (the scheduler's
SIGKILL is the escalation). On several ranks each rank sees its own signal and the loop's ``place.any`` makes
them stop at the same step.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

_received: list[str] = []  # the signal's name once one arrived inside stop_on_signals; empty otherwise


def stop_requested() -> str | None:
    """The name of the signal that asked training to stop (inside ``stop_on_signals``), or None."""
    return _received[0] if _received else None


@contextlib.contextmanager
def stop_on_signals(*signums: int) -> Iterator[None]:
    """While inside, the first of ``signums`` asks training to stop at the next step boundary
    (``stop_requested``); the handlers before it, and no request, are restored on exit. Main thread only (Python
    delivers signals there)."""
    def handler(signum, _frame):
        if not _received:
            _received.append(signal.Signals(signum).name)

    before = {s: signal.signal(s, handler) for s in signums}
    try:
        yield
    finally:
        for s, h in before.items():
            signal.signal(s, h)
        _received.clear()
