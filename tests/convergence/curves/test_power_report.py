"""python -m convergence power's report names the estimate it plans from."""

from __future__ import annotations

import json
from pathlib import Path

from convergence.__main__ import main

VERDICT = Path(__file__).resolve().parents[3] / "golden" / "training" / "proxy_long_verdict__h200x2.json"


def test_power_names_the_final_window_estimate_it_plans_from(capsys):
    """The report plans from the final window's estimate, while the verdict it reads reports the whole range's
    (-3.682 % and -2.536 % here): the report names the one it prints."""
    result = json.loads(VERDICT.read_text())
    assert main(["power", str(VERDICT)]) == 0
    out = capsys.readouterr().out
    assert f"the candidate's final-window estimate {result['final_window']['estimate']:+.3%}" in out
    assert result["estimate"] != result["final_window"]["estimate"]  # the two differ here: the name matters
