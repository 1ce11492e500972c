"""Every notebook in notebooks/ runs top to bottom on CPU at its default size; bad parameters give one
clear message, not a traceback. ``tox -e notebooks`` runs this file; the normal pytest run does too.

Parameters are injected the way papermill does it: a code cell placed right after the cell tagged
``parameters``. A notebook runs in a Jupyter kernel where being a notebook is the property: at its default size,
and where a bad parameter must show as one line (``NotebookInputError``'s rendering). Its other parameters are
tested on its code cells run in this process (``run_here``): the same code on the same inputs, without a kernel
start and a second import of torch for each.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

nbclient = pytest.importorskip("nbclient", reason="needs nbclient: pip install -e '.[notebooks]'")
nbformat = pytest.importorskip("nbformat", reason="needs nbformat: pip install -e '.[notebooks]'")

from mxval.notebook import NotebookInputError  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
TIMEOUT_S = 120  # the bar: each notebook under 2 minutes on CPU at its default size


def execute(path: Path, params: dict | None = None):
    nb = nbformat.read(path, as_version=4)
    if params:
        at = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
        src = "\n".join(f"{k} = {v!r}" for k, v in params.items())
        nb.cells.insert(at + 1, nbformat.v4.new_code_cell(src, metadata={"tags": ["injected-parameters"]}))
    os.environ.setdefault("JUPYTER_PLATFORM_DIRS", "1")  # jupyter_core's path-migration DeprecationWarning
    # the kernel imports the packages from this checkout, installed or not (the GPU machines run uninstalled)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    if os.environ.get("PYTEST_XDIST_WORKER"):  # as tests/conftest.py: one intra-op thread per parallel worker
        env["OMP_NUM_THREADS"] = "1"
    client = nbclient.NotebookClient(nb, timeout=TIMEOUT_S, kernel_name="python3",
                                     resources={"metadata": {"path": str(ROOT / "notebooks")}})
    client.execute(env=env)
    return nb


def run_here(path: Path, params: dict, monkeypatch) -> str:
    """The notebook's code cells, with ``params`` injected after its parameters cell, run in a fresh namespace in
    this process, from notebooks/ as the kernel runs them; what they print. A cell's exception propagates (its kind
    and message are the test's to check). Figures are closed where a kernel would show them."""
    import contextlib
    import io

    from matplotlib import pyplot as plt

    nb = nbformat.read(path, as_version=4)
    at = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
    sources = [c.source for c in nb.cells if c.cell_type == "code"]
    code_at = sum(c.cell_type == "code" for c in nb.cells[: at + 1])
    sources.insert(code_at, "\n".join(f"{k} = {v!r}" for k, v in params.items()))
    monkeypatch.chdir(ROOT / "notebooks")
    monkeypatch.setattr(plt, "show", lambda *a, **k: plt.close("all"))
    printed, namespace = io.StringIO(), {"__name__": "__main__"}
    try:
        with contextlib.redirect_stdout(printed):
            for i, src in enumerate(sources):
                exec(compile(src, f"{path.name}, code cell {i}", "exec"), namespace)
    finally:
        plt.close("all")
    return printed.getvalue()


def outputs_text(nb) -> str:
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            parts.append(out.get("text", "") if out.get("output_type") == "stream" else "")
            parts.append(json.dumps(out.get("data", {}).get("text/plain", "")))
    return "\n".join(parts)


def error_of(path: Path, params: dict) -> str:
    with pytest.raises(nbclient.exceptions.CellExecutionError) as info:
        execute(path, params)
    return str(info.value)


def test_notebooks_exist():
    assert [p.name for p in NOTEBOOKS] == ["01_mx_error_statistics.ipynb", "02_layer_errors.ipynb",
                                           "03_loss_curves.ipynb", "04_ep_bandwidth.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_at_default_size(path):
    nb = execute(path)
    text = outputs_text(nb)
    assert any(c.get("outputs") for c in nb.cells if c.cell_type == "code")
    if path.stem.startswith("01"):  # the oracle and torchao agree on every block of the Gaussian tensor
        lines = [ln for ln in text.splitlines() if "blocks bit-identical" in ln]
        assert len(lines) == 8
        for ln in lines:
            eq, n = ln.split()[2].split("/")
            assert eq == n, ln
    if path.stem.startswith("02"):
        assert "all MXFP8 figures above their floors" in text
    if path.stem.startswith("03"):
        assert "synthetic demonstration" in text and "verdict: " in text
    if path.stem.startswith("04") and not list((ROOT / "golden" / "ep").glob("*.json")):
        assert "No DeepEP/NCCL bench results under golden/ep/ yet" in text


def test_notebook_layer_errors_missing_file_is_a_notebook_input_error_naming_it(monkeypatch):
    with pytest.raises(NotebookInputError) as e:
        run_here(NOTEBOOKS[1], {"LAYERS_JSON": "no/such/layers.json", "FRESH_CONFIG": None}, monkeypatch)
    assert "LAYERS_JSON" in str(e.value) and "no/such/layers.json" in str(e.value)


def test_notebook_layer_errors_reads_a_layers_json(tmp_path, monkeypatch):
    from numerics.layer import harness
    from numerics.layer.configs import suite
    from numerics.layer.results import to_json

    s = suite("tiny")
    results = harness.run_linear(s.linears[0], recipes=harness.RECIPES, seed=s.seed)
    path = tmp_path / "layers.json"
    path.write_text(to_json([results], harness.header("tiny", "cpu")))
    text = run_here(NOTEBOOKS[1], {"LAYERS_JSON": str(path), "FRESH_CONFIG": None}, monkeypatch)
    assert f"{len(results.stats)} fresh records (layers.json)" in text
    assert "in the golden file, not measured" in text  # one linear against the whole golden config


def test_notebook_loss_curves_missing_run_is_a_notebook_input_error_naming_it(monkeypatch):
    with pytest.raises(NotebookInputError) as e:
        run_here(NOTEBOOKS[2], {"RESULTS_DIR": "results/not-a-run"}, monkeypatch)
    assert "RESULTS_DIR" in str(e.value) and "results/not-a-run" in str(e.value)


def test_notebook_loss_curves_reads_a_validate_results_folder(tmp_path, fake_validate_folder, monkeypatch):
    """The candidate against the BF16 runs the curves level judges, each named by its run (the files are all
    <run>/<recipe>/metrics.jsonl.gz), and the folder's own verdict beside the notebook's."""
    fake_validate_folder(tmp_path)
    (tmp_path / "curves").mkdir()  # validate's own verdict, on validation loss, printed beside the notebook's
    (tmp_path / "curves" / "verdict.json").write_text('{"verdict": "equivalent", "reason": "r", "metric": "val_loss"}')
    text = run_here(NOTEBOOKS[2], {"RESULTS_DIR": str(tmp_path)}, monkeypatch)
    assert "baselines: bf16, bf16_rounding1, bf16_rounding2 | candidate: mxfp8" in text and "verdict: " in text
    assert "(training loss, the first candidate run)" in text and "the folder's own verdict" in text


def test_notebook_loss_curves_reads_files(tmp_path, monkeypatch):
    from convergence.curves import synthetic

    bases, cand = synthetic.make_runs(synthetic.SyntheticSpec(steps=3000), seed=1, drift=0.02)
    paths = []
    for c, name in ((bases[0], "base.jsonl"), (cand, "cand.jsonl")):
        p = tmp_path / name
        lines = (json.dumps({"step": int(s), "loss": float(v)}) + "\n" for s, v in zip(c.steps, c.values, strict=True))
        p.write_text("".join(lines))
        paths.append(str(p))
    text = run_here(NOTEBOOKS[2], {"BASELINES": [paths[0]], "CANDIDATE": paths[1]}, monkeypatch)
    assert "verdict: not_equivalent" in text  # 2 % against a 0.25 % margin


def test_notebook_loss_curves_half_a_run_is_incomplete_and_a_damaged_one_is_a_notebook_input_error(tmp_path,
                                                                                                    monkeypatch):
    lines = [json.dumps({"step": s, "loss": 3.0 / s ** 0.3}) + "\n" for s in range(1, 401)]
    (tmp_path / "base.jsonl").write_text("".join(lines))
    (tmp_path / "half.jsonl").write_text("".join(lines[:200]))
    (tmp_path / "bad.jsonl").write_bytes(b"\x00\xff garbage\n" * 3)
    base = str(tmp_path / "base.jsonl")
    text = run_here(NOTEBOOKS[2], {"BASELINES": [base], "CANDIDATE": str(tmp_path / "half.jsonl")}, monkeypatch)
    assert "verdict: incomplete" in text and "baseline 200/400 points" in text
    with pytest.raises(NotebookInputError, match="bad.jsonl"):
        run_here(NOTEBOOKS[2], {"BASELINES": [base], "CANDIDATE": str(tmp_path / "bad.jsonl")}, monkeypatch)


def test_notebook_ep_bandwidth_missing_file_is_one_clear_message():
    """In a kernel: a bad parameter shows as the one line NotebookInputError renders, not a traceback (the other
    notebooks' bad parameters raise the same error, tested in this process)."""
    msg = error_of(NOTEBOOKS[3], {"BENCH_JSON": "golden/ep/none.json"})
    assert "bench result (BENCH_JSON) 'golden/ep/none.json' does not exist" in msg
    assert "Traceback" not in msg


def test_notebook_ep_bandwidth_plots_a_bench_result(cpu_ep_bench, monkeypatch):
    path, doc, _ = cpu_ep_bench
    text = run_here(NOTEBOOKS[3], {"BENCH_JSON": str(path)}, monkeypatch)
    assert f"{len(doc['rows'])} rows, 2 ranks over gloo" in text
    assert f"{doc['args']['iters']} timed calls per op (< 50)" in text
    assert "no DeepEP rows in this result" in text
