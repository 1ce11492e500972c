"""Known findings: differences the check explains by a FINDINGS.md entry, counted and reported, never hidden.

A ``Known`` names the check row whose differences it may explain and a predicate over (expected,
actual) that picks the values it explains. ``compare.split_known`` divides a row's differences into
unexplained ones (the row fails) and, per finding, the explained ones (counted: how many values, in how
many cases). A run whose only differences are known passes as ``PASS (known: E1 on 44 values in 3
cases)``; with ``strict`` they fail it. ``numerics.ep.check.verdict`` writes that line and the status
from the same counts, so they cannot contradict each other.

Registered:

* ``E1`` (check ``combine``): a sum whose rows are all -0.0 comes back +0.0. It appears only when the
  expectation folds from the first row (``--combine-start first-row``); under the contract's
  convention (the sum starts at +0.0, ``numerics.ep.backend``) it is not a difference at all. Kept as a
  known finding so that the other convention can still be asked for and reported honestly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from numerics.ep.compare import negative_zero_lost


@dataclass(frozen=True)
class Known:
    id: str  # the FINDINGS.md id
    check: str  # the check row whose differences it may explain
    what: str  # one line for reports
    explains: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (expected, actual) -> bool mask


KNOWN: tuple[Known, ...] = (
    Known("E1", "combine", "a sum of -0.0 rows came back +0.0: the zero-initialised combine sum, "
          "checked against the first-row convention", negative_zero_lost),
)


def for_check(name: str) -> tuple[Known, ...]:
    return tuple(k for k in KNOWN if k.check == name)


def describe(finding_id: str) -> str:
    return next((k.what for k in KNOWN if k.id == finding_id), finding_id)
