"""Small helpers the notebooks in ``notebooks/`` share: bad parameters become one clear message.

``NotebookInputError``  raised for a parameter that points at nothing usable; IPython shows its
    message alone (``_render_traceback_``), not a traceback, and the notebook stops there.
``existing(path, what, hint)``  the path, or ``NotebookInputError`` naming it, what it should be and
    how to make one.
``repo_root()``  the repository folder (the notebooks' paths are relative to it).
``validate_training_runs(results_dir)``  (run name, metrics file) of a ``mxval validate`` folder's training level:
    the BF16 baselines, then the MXFP8 candidate (notebook 03).
``validate_verdict_line(results_dir)``  the folder's own verdict in one line (its curves level's), or None.
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


def validate_training_runs(results_dir) -> list[tuple[str, Path]]:
    """(run name, metrics file) of a ``mxval validate`` results folder's training level, a convergence protocol
    folder: the BF16 baseline and its replicates, then the MXFP8 candidate. The runs and files come from the
    protocol's own plan (``ProtocolPlan.baselines``, ``metrics_path``), as the curves level judges them, so a
    change of layout cannot leave the notebook reading a folder validate no longer writes (it had: seed*/mxfp8)."""
    from convergence.protocol import plan as pr
    from numerics.errors import BadInput

    training = Path(results_dir) / "training"
    if not (training / "protocol.json").is_file():
        raise NotebookInputError(f"{results_dir} holds no training level (training/protocol.json); run "
                                 "`mxval validate` with the training level to make one")
    try:
        plan = pr.load_plan(training)
    except BadInput as exc:  # a damaged protocol.json: its one line
        raise NotebookInputError(str(exc)) from None
    runs = [(spec.name, pr.metrics_path(training, spec)) for spec in [*plan.baselines(), plan.run("candidate")]]
    missing = next((path for _, path in runs if not path.is_file()), None)
    if missing is not None:
        raise NotebookInputError(f"{missing} does not exist: the training level did not finish that run "
                                 "(its log is logs/training.log)")
    return runs


def validate_verdict_line(results_dir) -> str | None:
    """The verdict ``mxval validate`` itself gave (its curves level's ``curves/verdict.json``: validation loss, every
    MXFP8 run against the BF16 runs), in one line; None when the folder has none. Notebook 03 compares training
    loss of the first MXFP8 run, which can differ: both are shown, each named."""
    from numerics.errors import BadInput
    from numerics.files import read_json_object

    path = Path(results_dir) / "curves" / "verdict.json"
    if not path.is_file():
        return None
    try:
        r = read_json_object(path, what="a curves verdict")
        return (f"validate's own verdict ({path}: {r.get('metric', 'loss')}, every candidate run): "
                f"{r['verdict']}: {r['reason']}")
    except (BadInput, KeyError, TypeError) as exc:
        raise NotebookInputError(f"{path}: {exc}") from None
