"""python -m convergence protocol: exit codes, one-line refusals, the result files, and what --status shows."""

from __future__ import annotations

import gzip
import json

import pytest
import torch

from convergence.__main__ import main as convergence_main
from convergence.curves.compare import EXIT_CODES
from convergence.protocol.cli import EXECUTORS
from convergence.protocol.folder import compact_run, metrics_path, run_dir
from convergence.protocol.plan import VERDICTS, ProtocolPlan
from convergence.protocol.render import verdict_line
from convergence.protocol.status import progress

TINY = ["--model", "tiny", "--steps", "20"]


def test_protocol_cli_bad_input_is_one_line_and_touches_nothing(tmp_path, refused):
    assert "--model and --steps" in refused("--out", str(tmp_path / "p"))
    (tmp_path / "mine.txt").write_text("a user's file")
    assert "holds no protocol run" in refused(*TINY, "--out", str(tmp_path))
    assert (tmp_path / "mine.txt").read_text() == "a user's file"
    out = tmp_path / "p"
    out.mkdir()
    (out / "protocol.json").write_text(json.dumps(ProtocolPlan(model="tiny", steps=20).as_dict()))
    err = refused("--model", "tiny", "--steps", "30", "--out", str(out))
    assert "steps=20" in err and "steps=30" in err and "--force" in err
    # a finished run of the folder's plan is not read as another plan's damaged one; --force gets past it
    spec = ProtocolPlan(model="tiny", steps=20).runs()[0]
    run = run_dir(out, spec)
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 3.0}) + "\n" for s in range(1, 21)))
    compact_run(run)
    err = refused("--model", "tiny", "--steps", "30", "--out", str(out))
    assert "steps=20" in err and "steps=30" in err and "damaged" not in err
    if not torch.cuda.is_available():  # to the GPU check of a --device cuda plan, before --force deletes anything
        assert "no CUDA device" in refused("--model", "tiny", "--steps", "30", "--device", "cuda", "--out", str(out),
                                           "--force")
        assert metrics_path(out, spec).exists()
    assert "a tag such as h200" in refused(*TINY, "--out", str(out), "--hardware", "../../elsewhere")
    with pytest.raises(SystemExit) as exit_:
        convergence_main(["protocol", *TINY, "--out", str(out), "--executor", "elsewhere"])
    assert exit_.value.code == 2 and list(EXECUTORS) == ["local", "slurm"]


def test_protocol_cli_refuses_bad_values_and_damaged_plans_in_one_line(tmp_path, refused):
    """Values out of range, a --data that is no file, and a damaged protocol.json (for a run and for --status)
    are one line and exit 2, and record nothing the corrected command would have to --force; the controls: the
    good plan's --status is accepted."""
    out = tmp_path / "p"
    for argv, says in ((["--name", "../../x"], "letters, digits"), (["--name", "a/b"], "letters, digits"),
                       (["--lr", "nan"], "--lr nan: out of range"), (["--lr", "inf"], "--lr inf: out of range"),
                       (["--threads", "-2"], "--threads must be >= 1"),
                       (["--stop-after-minutes", "nan"], "--stop-after-minutes"),
                       (["--stop-after-minutes", "inf"], "--stop-after-minutes"),
                       (["--data", str(tmp_path / "nothing.txt")], "does not exist"),
                       (["--data", str(tmp_path)], "is a directory")):
        assert says in refused(*TINY, *argv, "--out", str(out)), argv
        assert not (out / "protocol.json").exists(), argv
    good = ProtocolPlan(model="tiny", steps=20).as_dict()
    for damaged, says in (("{not json", "not JSON"), ("", "not JSON"), ("[1, 2]", "a JSON list"),
                          (json.dumps({k: v for k, v in good.items() if k != "model"}), "model"),
                          (json.dumps(good | {"bogus": 1}), "bogus"), (json.dumps(good | {"steps": "many"}), "str"),
                          (json.dumps(good | {"design": "xx"}), "--design"),
                          (json.dumps(good | {"replicates": 0}), "--replicates"),
                          (json.dumps(good | {"overrides": 5}), "not a protocol plan"),
                          (json.dumps(good | {"model": "huge"}), "unknown model")):
        out.mkdir(exist_ok=True)
        (out / "protocol.json").write_text(damaged)
        for argv in (["--status"], TINY):
            err = refused(*argv, "--out", str(out))
            assert str(out / "protocol.json") in err and says in err, (damaged, err)
    (out / "protocol.json").write_text(json.dumps(good))
    assert convergence_main(["protocol", "--status", "--out", str(out)]) == 0
    assert "--parallel must be >= 1" in refused("--status", "--parallel", "0", "--out", str(out))
    for flag in (["--whole-runs"], ["--stop-after-minutes", "5"], ["--mixed-environment"]):
        assert "goes with a run, not with --status" in refused("--status", *flag, "--out", str(out))
    assert "--margin" in refused("--status", "--margin", "0.01", "--out", str(out))
    assert "no run of that name" in refused("--piece", "nosuch", "--out", str(out))
    assert "--whole-runs needs --stop-after-minutes" in refused(*TINY, "--whole-runs", "--out", str(tmp_path / "q"))
    run = out / "runs" / "bf16" / "bf16"
    run.mkdir(parents=True)
    (run / "config.json").write_text("{not json")
    err = refused("--status", "--out", str(out))
    assert str(run / "config.json") in err and "a run's config" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_protocol_cli_cuda_without_a_gpu_is_one_line(tmp_path, refused):
    assert "no CUDA device" in refused(*TINY, "--device", "cuda", "--out", str(tmp_path))


def test_protocol_cli_runs_to_the_end_and_exits_with_the_candidates_verdict(finished_protocol, copy_finished,
                                                                           refused):
    """A protocol run to its end exits with its candidate's verdict as compare does, and leaves every verdict
    with its figure, every run's curve as the run wrote it (compacted), the MXFP8 runs' probes and a sidecar per
    file; repeating the command judges it again and runs nothing; a finished run's damaged log is refused in one
    line and left as it is, never trained again over."""
    from convergence.curves.load import load_curve

    out, plan = finished_protocol["out"], finished_protocol["plan"]
    verdict = json.loads((out / "results" / "tiny_long_verdict__cpu.json").read_text())
    assert finished_protocol["rc"] == EXIT_CODES[verdict["verdict"]]
    assert "protocol complete" in finished_protocol["printed"]
    names = {p.name for p in (out / "results").iterdir()}
    assert {"record.sh"} | {f"tiny_long_{v}__cpu.{ext}" for v in VERDICTS for ext in ("json", "png")} <= names
    assert len([n for n in names if n.endswith(".jsonl.gz") and "_probes__" not in n]) == len(plan.runs())
    for spec in plan.runs():  # each run's metrics as the run wrote them, gzip-compressed, loading as they are
        packed = out / "results" / f"tiny_long_{spec.name}__cpu.jsonl.gz"
        assert packed.read_bytes() == metrics_path(out, spec).read_bytes()  # compacted when it finished
        assert metrics_path(out, spec).name == "metrics.jsonl.gz"
        assert load_curve(packed).values.tolist() == load_curve(metrics_path(out, spec)).values.tolist()
    probed = {s.name for s in plan.runs() if s.recipe != "bf16"}  # probes compare MXFP8 with BF16: MXFP8 runs only
    assert {n.split("_probes__")[0].removeprefix("tiny_long_") for n in names if "_probes__" in n
            and not n.endswith(".meta.json")} == probed
    assert all((out / "results" / f"{n}.meta.json").exists() for n in names if n.endswith((".json", ".jsonl.gz"))
               and not n.endswith(".meta.json"))

    again = copy_finished()
    argv = [*finished_protocol["argv"][:-1], str(again)]
    pace = (again / "pace.jsonl").read_bytes()
    assert convergence_main(["protocol", *argv]) == finished_protocol["rc"]
    assert (again / "pace.jsonl").read_bytes() == pace  # judged again, nothing run
    log = metrics_path(again, plan.runs()[1])
    lines = gzip.decompress(log.read_bytes()).splitlines(keepends=True)
    for damaged in (gzip.compress(b"".join([*lines[:2], lines[2][:20] + b"\n", *lines[3:]]), mtime=0),  # mid-file
                    gzip.compress(b"".join(lines[:-1]), mtime=0),  # cut short at a line's end
                    b"garbage"):  # not gzip at all
        log.write_bytes(damaged)
        for extra in ([], ["--status"]):
            err = refused(*argv, *extra)
            assert str(log) in err and "damaged" in err, err
        assert log.read_bytes() == damaged


@pytest.mark.timeout(300)
def test_protocol_cli_grows_to_candidate_replicates_and_judges_the_groups(copy_finished, finished_protocol, capsys):
    """A finished protocol given --candidate-replicates 2 makes only the new runs (a candidate replicate, a control
    replicate and a second held-out run), keeps the runs made as they were, and judges the candidate and both
    controls as groups of two."""
    out = copy_finished()
    argv = ["protocol", *finished_protocol["argv"][:-1], str(out)]
    first = {p: p.read_bytes() for p in (out / "runs").rglob("metrics.jsonl.gz")}
    capsys.readouterr()
    rc = convergence_main([*argv, "--candidate-replicates", "2"])
    assert "candidate_replicates 1 -> 2" in capsys.readouterr().out
    assert all(p.read_bytes() == b for p, b in first.items())
    assert {p.parts[-3] for p in (out / "runs").rglob("metrics.jsonl.gz")} - {p.parts[-3] for p in first} == {
        "mxfp8_seed1", "mxfp8-head_seed1", "bf16_seed4"}
    judged = {v: json.loads((out / "results" / f"tiny_long_{v}__cpu.json").read_text()) for v in VERDICTS}
    assert rc == EXIT_CODES[judged["verdict"]["verdict"]]
    assert {v: r["protocol"]["judged_runs"] for v, r in judged.items()} == {
        "verdict": ["mxfp8", "mxfp8_seed1"], "positive_control": ["mxfp8-head", "mxfp8-head_seed1"],
        "negative_control": ["bf16_seed3", "bf16_seed4"]}
    assert judged["verdict"]["final_window"]["candidate_runs"] == 2
    assert judged["positive_control"]["final_window"]["candidate_runs"] == 2


def test_protocol_cli_status_shows_the_key_numbers_and_draws_on_request(finished_protocol, tmp_path, capsys,
                                                                       refused):
    """--status prints how far the folder is: the runs done, the verdicts as they stand, what the whole plan
    resolves, the time left at its pace, each number as the status data holds it; --plot and --plot-parting
    draw their figures and overwrite nothing unasked; they go with --status only."""
    out = finished_protocol["out"]
    p = progress(finished_protocol["plan"], out)
    capsys.readouterr()
    assert convergence_main(["protocol", "--status", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"{p.done} of {len(p.states)} runs done" in text
    assert all(f"{g.title}: {g.done} of {g.runs}" in text for g in p.groups)
    for name, r in p.level.verdicts.items():
        assert verdict_line(name, r) in text
    assert p.level.resolves in text and "should resolve about +-" in p.level.resolves
    assert "| independent | equivalence | +0.000% | favourable |" in text  # the table by design and test
    assert f"about {p.left.seconds / 3600:.1f} GPU-hours" in text or not p.left.recipes
    assert "spread at each evaluation" in text and "replicates drift" not in text  # the seed design: no drift

    fig, drift = tmp_path / "verdicts.png", tmp_path / "drift.png"
    argv = ["protocol", "--status", "--out", str(out), "--plot", str(fig), "--plot-parting", str(drift)]
    assert convergence_main(argv) == 0
    assert fig.stat().st_size > 10_000 and not drift.exists()  # the seed design changes the batches: no drift
    assert f"figure: {fig}" in capsys.readouterr().out
    assert "exists" in refused(*argv[1:])
    assert convergence_main([*argv, "--force"]) == 0
    assert "--plot goes with --status" in refused(*TINY, "--out", str(tmp_path / "p"), "--plot", str(fig))
    assert "--plot-parting goes with --status" in refused(*TINY, "--out", str(tmp_path / "p"),
                                                          "--plot-parting", str(drift))
    assert "--status" in refused("--status", "--out", str(tmp_path / "none"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a visible CUDA GPU, as a login node")
def test_a_slurm_submitter_leaves_the_kernels_device_to_the_jobs_node(tmp_path, refused, monkeypatch):
    """A login node has no GPU: a --device cuda plan with --mxfp8-kernel fast is submitted from it (the job's node
    checks the kernel, run_worker), where the local executor refuses it on this machine. The submitter is stopped at
    its executor (a stub: no sbatch is called), past every check before it, with nothing recorded yet
    (protocol.json is written after the executor's options pass)."""
    from numerics.cli import CLIError

    def stub(*_args, **_kw):
        raise CLIError("stub executor reached")

    monkeypatch.setitem(EXECUTORS, "slurm", stub)
    argv = [*TINY, "--device", "cuda", "--mxfp8-kernel", "fast", "--out", str(tmp_path / "p")]
    assert "no CUDA device" in refused(*argv)  # the local executor: this machine would train
    assert "stub executor reached" in refused(*argv, "--executor", "slurm")
    assert not (tmp_path / "p" / "protocol.json").exists()
