"""The repository keeps its promises: README quickstart matches CI, notebooks carry no outputs."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _quickstart_lines() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quickstart", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [line for line in block.splitlines() if line.strip()]


def test_readme_quickstart_has_exactly_two_commands():
    assert len(_quickstart_lines()) == 2


def test_readme_test_command_is_what_ci_runs():
    test_cmd = _quickstart_lines()[1].strip()
    ci = (ROOT / ".ci" / "run").read_text()
    assert test_cmd in ci.splitlines(), f"CI does not run the README's test command {test_cmd!r}"


def test_committed_notebooks_carry_no_outputs():
    notebooks = sorted((ROOT / "notebooks").glob("*.ipynb"))
    assert notebooks, "notebooks/ is empty"
    for path in notebooks:
        nb = json.loads(path.read_text())
        for i, cell in enumerate(nb["cells"]):
            if cell["cell_type"] == "code":
                assert cell.get("outputs") == [] and cell.get("execution_count") is None, (
                    f"{path.name} cell {i} was committed with outputs; clear them (jupyter nbconvert "
                    "--clear-output --inplace) before committing")


def test_every_notebook_has_one_parameters_cell():
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        tagged = [c for c in cells if "parameters" in c.get("metadata", {}).get("tags", [])]
        assert len(tagged) == 1 and tagged[0]["cell_type"] == "code", path.name
