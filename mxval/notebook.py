"""Small helpers the notebooks in ``notebooks/`` share: bad parameters become one clear message.

``NotebookInputError``  raised for a parameter that points at nothing usable; IPython shows its
    message alone (``_render_traceback_``), not a traceback, and the notebook stops there.
``existing(path, what, hint)``  the path, or ``NotebookInputError`` naming it, what it should be and
    how to make one.
``repo_root()``  the repository folder (the notebooks' paths are relative to it).
"""

from __future__ import annotations

from pathlib import Path


class NotebookInputError(Exception):
    """A notebook parameter that cannot be used; shown as its message only."""

    def _render_traceback_(self) -> list[str]:  # IPython's hook: what to print instead of a traceback
        return [f"NotebookInputError: {self}"]


def repo_root() -> Path:
    return Path(__file__).resolve().parents[1]


def existing(path, what: str, hint: str = "") -> Path:
    """``path`` (relative paths are taken from the repository root) if it exists, else a clear error."""
    if path is None:
        raise NotebookInputError(f"no {what} given" + (f"; {hint}" if hint else ""))
    p = Path(path).expanduser()
    if not p.is_absolute() and not p.exists():
        p = repo_root() / p
    if not p.exists():
        raise NotebookInputError(f"{what} {str(path)!r} does not exist" + (f"; {hint}" if hint else ""))
    return p
