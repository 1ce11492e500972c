"""The one library error for bad user input, shared by every level.

``BadInput`` means "something the user gave (a file, a shape, a setting) cannot be used", with a message
that says what and how to fix it. Library code raises it (or a subclass, e.g. ``CurveError``); only the
command-line entry points turn it into one stderr line and exit code 2 (``numerics.cli.run_main``).
``SEED_MAX`` is the one bound of user input that library checks and command lines share. ``RankFailed`` is
not bad input but gets one line too (exit code 1): a rank of a distributed run that failed.
"""

from __future__ import annotations


class BadInput(ValueError):
    """Input a user supplied cannot be used; the message says what and how to fix it."""


class RankFailed(RuntimeError):
    """Not bad input: a rank of a distributed run failed its set-up, ended (a crash, ``os._exit``, a signal) or
    stopped answering while rank 0 waited on it. The message names the rank and what happened in one line (gloo's
    own error names only a peer's address); command lines print it as that line, exit code 1."""


SEED_MAX = 2**32 - 1  # 32-bit seeds, as numpy's legacy seeding takes; torch's generator overflowed past 2**64 - 1
