"""Small helpers the notebooks in ``notebooks/`` share: bad parameters become one clear message.

``NotebookInputError``  raised for a parameter that points at nothing usable; IPython shows its
    message alone (``_render_traceback_``), not a traceback, and the notebook stops there.
``existing(path, what, hint)``  the path, or ``NotebookInputError`` naming it, what it should be and
    how to make one.
``repo_root()``  the repository folder (the notebooks' paths are relative to it).
``training_runs(folder)``  (run name, metrics file) of a ``mxval validate`` folder's training level or of a
    ``convergence protocol --out`` folder: the BF16 baselines, then the MXFP8 candidate (notebook 03), and the
    baselines a protocol still running has not finished.
``own_verdict_line(folder)``  the folder's own verdict in one line (validate's curves level's, the protocol's
    results/; a protocol still running: its last whole level's, judged here and marked interim), or None.
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


def _protocol_folder(folder) -> tuple[Path, bool]:
    """(the protocol folder, whether it is validate's): ``folder/training`` of a validate results folder, or
    ``folder`` itself when it holds ``protocol.json`` (``convergence protocol --out``)."""
    folder = Path(folder)
    if (folder / "protocol.json").is_file():
        return folder, False
    if (folder / "training" / "protocol.json").is_file():
        return folder / "training", True
    raise NotebookInputError(f"{folder} holds no training level (training/protocol.json) and is no protocol folder "
                             "(protocol.json); run `mxval validate` with the training level, or `python -m "
                             "convergence protocol --out FOLDER`, to make one")


def training_runs(folder) -> tuple[list[tuple[str, Path]], list[str]]:
    """(run name, metrics file) of the BF16 baseline and its replicates, then the MXFP8 candidate, of a
    ``mxval validate`` results folder's training level or of a ``convergence protocol --out`` folder; and the
    names of the baselines left out. The runs and files come from the protocol's own plan
    (``ProtocolPlan.baselines``, ``metrics_path``), as its verdicts judge them, so a change of layout cannot leave
    the notebook reading a folder nothing writes any more (it had: validate's seed*/mxfp8). Validate's level
    runs whole or not at all, so a missing run there is a failed level; a protocol folder fills over sessions
    (#15's took weeks), so its unfinished baselines are left out and named, and only the BF16 baseline and the
    candidate must be finished."""
    from convergence.protocol.folder import load_plan, metrics_path, run_status
    from numerics.errors import BadInput

    out, is_validate = _protocol_folder(folder)
    try:
        plan = load_plan(out)
        specs = [*plan.baselines(), plan.run("candidate")]
        if is_validate:
            missing = next((s for s in specs if not metrics_path(out, s).is_file()), None)
            if missing is not None:
                raise NotebookInputError(f"{metrics_path(out, missing)} does not exist: the training level did "
                                         "not finish that run (its log is logs/training.log)")
            return [(s.name, metrics_path(out, s)) for s in specs], []
        status = run_status(plan, out)
    except BadInput as exc:  # a damaged protocol.json or run log: its one line
        raise NotebookInputError(str(exc)) from None
    for spec in (plan.run("baseline"), plan.run("candidate")):
        if status[spec.name] != "done":
            raise NotebookInputError(f"{out}: the protocol has not finished its run {spec.name} ({status[spec.name]} "
                                     f"of {plan.steps} steps): continue it with the protocol's command")
    left_out = [s.name for s in specs if status[s.name] != "done"]
    return [(s.name, metrics_path(out, s)) for s in specs if s.name not in left_out], left_out


def own_verdict_line(folder) -> str | None:
    """The verdict the folder itself holds, in one line: ``mxval validate``'s curves level's
    (``curves/verdict.json``) or a whole protocol's (``results/<prefix>_verdict__<hardware>.json``), both on
    validation loss with every MXFP8 run. A protocol folder without results (one still running: #15's fills over
    weeks of sessions) gives what ``protocol --status`` prints, its last whole level judged here, nothing written,
    marked interim; None when there is nothing to judge. Notebook 03 compares training loss of the first MXFP8
    run, which can differ: both are shown, each named."""
    from numerics.errors import BadInput
    from numerics.files import read_json_object

    folder = Path(folder)
    paths = [folder / "curves" / "verdict.json", *sorted((folder / "results").glob("*_verdict__*.json"))]
    path = next((p for p in paths if p.is_file()), None)
    if path is None:
        return _judged_here_line(folder)
    try:
        r = read_json_object(path, what="a verdict")
        return (f"the folder's own verdict ({path}: {r.get('metric', 'loss')}, every candidate run): "
                f"{r['verdict']}: {r['reason']}")
    except (BadInput, KeyError, TypeError) as exc:
        raise NotebookInputError(f"{path}: {exc}") from None


def _judged_here_line(folder: Path) -> str | None:
    """The last whole level of the protocol in ``folder`` (a protocol or validate folder) judged in memory, as
    ``protocol --status`` judges it, with whether its controls came out as they must; None when the folder holds
    no protocol or no level is whole yet."""
    from convergence.protocol.folder import last_whole_level, load_plan
    from convergence.protocol.judge import judge
    from convergence.protocol.render import verdict_line
    from numerics.errors import BadInput

    try:
        out, _ = _protocol_folder(folder)
    except NotebookInputError:
        return None
    try:
        plan = load_plan(out)
        sub = last_whole_level(plan, out)
        if sub is None:
            return None
        verdicts = judge(sub, out)
    except (BadInput, ValueError) as exc:  # a damaged log, runs the design's check refuses: its one line
        raise NotebookInputError(f"{out}: cannot judge its runs: {exc}") from None
    whole = sub.candidate_replicates == plan.candidate_replicates
    stage = ("the whole plan, not yet written to results/: the protocol's command writes it" if whole else
             f"interim, k = {sub.replicates}, m = {sub.candidate_replicates} of the plan's k = {plan.replicates}, "
             f"m = {plan.candidate_replicates}: a partial plan decides nothing")
    controls = ", ".join(f"{name} {r['verdict']} ({'as it must' if r['protocol']['as_expected'] else 'NOT as it must'})"
                         for name, r in verdicts.items() if name != "verdict")
    return (f"the protocol's verdict as its runs stand ({out}: val_loss, every candidate run, judged here, {stage}): "
            f"{verdict_line('verdict', verdicts['verdict']).split(None, 1)[1]}; controls: {controls}")
