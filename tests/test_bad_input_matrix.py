"""The bad-input matrix for the command lines of the numerics, training and validate levels (the
curves and golden ones have theirs in tests/convergence/curves/test_bad_input.py and tests/golden/test_cli.py,
the communication ones in tests/numerics/ep/): missing, empty, truncated and garbage files, a directory
where a file belongs, an unwritable or existing output, a wrong type or range. Each gives one line on
stderr that names what is at fault (the option, value, field or file; not its wording), exit code 2, no
traceback, and leaves every file that was there byte-identical.

Also: the two known-benign log lines every command printed first are gone, and only those.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from convergence.__main__ import main as convergence_main
from convergence.protocol.plan import ProtocolPlan
from mxval.__main__ import main as mxval_main
from numerics.__main__ import main as numerics_main
from numerics.cli import KnownBenignLogs

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def files(tmp_path) -> dict[str, Path]:
    """One of each kind of bad file, plus an existing output that must survive."""
    good = [json.dumps({"step": s, "loss": 5.0 - 0.01 * s}) for s in range(1, 40)]
    f = {
        "missing": tmp_path / "missing.jsonl",
        "empty": tmp_path / "empty.jsonl",
        "truncated": tmp_path / "truncated.jsonl",
        "garbage": tmp_path / "garbage.jsonl",
        "directory": tmp_path / "a_directory",
        "existing": tmp_path / "existing.json",
        "unwritable": tmp_path / "blocker" / "out.json",  # under a file: no folder can be made there
        "good": tmp_path / "good.jsonl",
        "verdict": ROOT / "golden" / "training" / "proxy_long_verdict__h200x2.json",  # read only
    }
    f["empty"].write_bytes(b"")
    f["truncated"].write_text("\n".join(good[:5]) + '\n{"step": 6, "lo')
    f["garbage"].write_bytes(bytes(range(256)) * 8)
    f["directory"].mkdir()
    f["existing"].write_text('{"keep": "me"}\n')
    (tmp_path / "blocker").write_text("a file, not a folder")
    f["good"].write_text("\n".join(good) + "\n")
    f["a_list"] = tmp_path / "a_list.json"
    f["a_list"].write_text("[1, 2]\n")
    f["window_text"] = tmp_path / "window_text.json"
    f["window_text"].write_text(json.dumps({"metric": "val_loss", "final_window": "x"}) + "\n")
    f["probes"] = tmp_path / "probes.jsonl"
    f["probes"].write_text('{"step": 1, "layer1": {"sqnr_db": 30.0}}\n')
    (tmp_path / "runs" / "bf16" / "bf16").mkdir(parents=True)  # a train/protocol run folder given to compare
    (tmp_path / "runs" / "bf16" / "bf16" / "metrics.jsonl").write_text("\n".join(good) + "\n")
    f["protocol"] = tmp_path / "protocol"  # a protocol folder with its plan and no runs yet
    f["protocol"].mkdir()
    (f["protocol"] / "protocol.json").write_text(json.dumps(ProtocolPlan(model="tiny", steps=20).as_dict()))
    f["runs_a_file"] = tmp_path / "runs_a_file"  # a protocol folder whose runs/ is a file
    f["runs_a_file"].mkdir()
    (f["runs_a_file"] / "protocol.json").write_bytes((f["protocol"] / "protocol.json").read_bytes())
    (f["runs_a_file"] / "runs").write_text("not a folder")
    f["gpus_text"] = tmp_path / "gpus_text"  # a run's config.json whose environment names its GPU as a string
    (f["gpus_text"] / "runs" / "bf16" / "bf16").mkdir(parents=True)
    (f["gpus_text"] / "protocol.json").write_bytes((f["protocol"] / "protocol.json").read_bytes())
    (f["gpus_text"] / "runs" / "bf16" / "bf16" / "config.json").write_text(
        json.dumps({"environment": {"torch": "2.13.0", "gpus": "NVIDIA H200"}}))
    f["ids_u32"] = tmp_path / "ids_u32.bin"  # token ids written as uint32, read with the default --data-dtype uint16
    f["ids_u32"].write_bytes(b"".join(i.to_bytes(4, "little") for i in range(1, 201)))
    verdict = json.loads(f["verdict"].read_text())  # the golden verdict with one final-window field damaged
    for name, key, value in (("spread_negative", "seed_spread", -0.01), ("spread_nan", "seed_spread", float("nan")),
                             ("se_negative", "se_set", -0.001), ("estimate_text", "estimate", "big"),
                             ("batches_text", "heldout_batches", "many"), ("levels_one", "replicate_levels", [0.0])):
        f[name] = tmp_path / f"{name}.json"
        f[name].write_text(json.dumps(verdict | {"final_window": verdict["final_window"] | {key: value}}))
    return f


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _one_line_exit_2(capsys, main, argv: list[str], root: Path) -> str:
    before = _snapshot(root)
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's usage errors exit from inside parse_args
        code = exc.code
    err = capsys.readouterr().err.strip()
    assert code == 2, (argv, code, err)
    assert len(err.splitlines()) == 1 and "Traceback" not in err, (argv, err)
    assert _snapshot(root) == before, argv
    return err


CASES = [
    # (id, package main, argv with {placeholders}, what the line must name: the option, value, field or file at
    # fault, or the file to pass instead; {placeholders} too)
    ("train-steps-type", "convergence", ["train", "--model", "tiny", "--steps", "abc", "--out", "{tmp}/r"], "--steps"),
    ("train-steps-range", "convergence", ["train", "--model", "tiny", "--steps", "0", "--out", "{tmp}/r"], "--steps"),
    ("train-data-missing", "convergence", ["train", "--model", "tiny", "--steps", "1", "--data", "{missing}",
                                           "--out", "{tmp}/r"], "{missing}"),
    ("train-data-empty", "convergence", ["train", "--model", "tiny", "--steps", "1", "--data", "{empty}",
                                         "--out", "{tmp}/r"], "{empty}"),
    ("train-data-directory", "convergence", ["train", "--model", "tiny", "--steps", "1", "--data", "{directory}",
                                             "--out", "{tmp}/r"], "{directory}"),
    ("train-out-unwritable", "convergence", ["train", "--model", "tiny", "--steps", "1", "--out", "{tmp}/blocker/r"],
     "{tmp}/blocker/r"),
    ("train-out-a-file", "convergence", ["train", "--model", "tiny", "--steps", "1", "--out", "{existing}"],
     "{existing}"),
    ("train-kernel", "convergence", ["train", "--model", "tiny", "--steps", "1", "--mxfp8-kernel", "real",
                                     "--out", "{tmp}/r"], "--mxfp8-kernel"),
    ("train-recipe-kernel", "convergence", ["train", "--model", "tiny", "--steps", "1", "--recipe", "mxfp8-e5m2",
                                            "--mxfp8-kernel", "emulated", "--out", "{tmp}/r"], "mxfp8-e5m2"),
    ("train-val-percent", "convergence", ["train", "--model", "tiny", "--steps", "1", "--val-percent", "0",
                                          "--out", "{tmp}/r"], "--val-percent"),
    ("train-optimizer-state-cpu", "convergence", ["train", "--model", "tiny", "--steps", "1", "--optimizer-state",
                                                  "host", "--out", "{tmp}/r"], "--optimizer-state host"),
    ("train-optimizer-state-choice", "convergence", ["train", "--model", "tiny", "--steps", "1", "--optimizer-state",
                                                     "disk", "--out", "{tmp}/r"], "--optimizer-state"),
    ("bench-json-existing", "convergence", ["bench", "--model", "tiny", "--device", "cpu", "--json", "{existing}"],
     "{existing}"),
    ("bench-json-unwritable", "convergence", ["bench", "--model", "tiny", "--device", "cpu", "--json",
                                              "{unwritable}"], "{unwritable}"),
    ("bench-range", "convergence", ["bench", "--model", "tiny", "--device", "cpu", "--steps", "0"], "--steps"),
    ("bench-repeats", "convergence", ["bench", "--model", "tiny", "--device", "cpu", "--repeats", "0"], "--repeats"),
    ("profile-step-json-existing", "convergence", ["profile-step", "--model", "tiny", "--device", "cpu", "--json",
                                                   "{existing}"], "{existing}"),
    ("profile-step-trace-is-json", "convergence", ["profile-step", "--model", "tiny", "--device", "cpu", "--json",
                                                   "{tmp}/a.json", "--trace", "{tmp}/a.json"], "--trace"),
    ("profile-step-from-trace-garbage", "convergence", ["profile-step", "--from-trace", "{garbage}"], "{garbage}"),
    ("profile-step-model", "convergence", ["profile-step", "--model", "huge"], "'huge'"),
    ("ep-identity-missing", "convergence", ["ep-identity", "{good}", "{missing}"], "{missing}"),
    ("ep-identity-empty", "convergence", ["ep-identity", "{good}", "{empty}"], "{empty}"),
    ("ep-identity-truncated", "convergence", ["ep-identity", "{good}", "{garbage}"], "{garbage}"),
    ("ep-identity-directory", "convergence", ["ep-identity", "{good}", "{directory}"], "{directory}"),
    ("ep-identity-json-existing", "convergence", ["ep-identity", "{good}", "{good}", "--json", "{existing}"],
     "{existing}"),
    ("protocol-model", "convergence", ["protocol", "--model", "huge", "--steps", "10", "--out", "{tmp}/p"], "'huge'"),
    # --status reads the folder's plan: a plan flag beside it would be ignored, so it is refused
    *[(f"protocol-status-{flag[2:]}", "convergence", ["protocol", "--status", "--out", "{protocol}", flag, value],
       flag)
      for flag, value in (("--margin", "nan"), ("--steps", "-3"), ("--model", "huge"), ("--hardware", "bad tag!"),
                          ("--lr", "1e-3"))],
    # the plan's own command with --status is taken only when it is the folder's plan (tiny, 20 steps)
    ("protocol-status-other-plan", "convergence", ["protocol", "--status", "--out", "{protocol}", "--model", "tiny",
                                                   "--steps", "20", "--margin", "0.01"], "margin=0.01"),
    ("protocol-status-bad-margin", "convergence", ["protocol", "--status", "--out", "{protocol}", "--model", "tiny",
                                                   "--steps", "20", "--margin", "nan"], "--margin"),
    # a field a run may change (replicates, control): --status reports the folder's plan, so it is refused
    ("protocol-status-other-replicates", "convergence", ["protocol", "--status", "--out", "{protocol}", "--model",
                                                         "tiny", "--steps", "20", "--replicates", "6"],
     "replicates"),
    ("protocol-steps-type", "convergence", ["protocol", "--model", "tiny", "--steps", "x", "--out", "{tmp}/p"],
     "--steps"),
    ("protocol-replicates", "convergence", ["protocol", "--model", "tiny", "--steps", "20", "--replicates", "1",
                                            "--out", "{tmp}/p"], "--replicates"),
    ("protocol-design", "convergence", ["protocol", "--model", "tiny", "--steps", "20", "--design", "luck",
                                        "--out", "{tmp}/p"], "--design"),
    ("protocol-control", "convergence", ["protocol", "--model", "tiny", "--steps", "20", "--control", "bf16",
                                         "--out", "{tmp}/p"], "--control"),
    ("protocol-control-kernel", "convergence", ["protocol", "--model", "tiny", "--steps", "20", "--val-every", "10",
                                                "--control", "mxfp8-e5m2", "--mxfp8-kernel", "emulated",
                                                "--out", "{tmp}/p"], "mxfp8-e5m2"),
    ("protocol-out-not-a-protocol", "convergence", ["protocol", "--model", "tiny", "--steps", "20", "--out",
                                                    "{directory}/.."], "{directory}/.."),
    ("power-missing", "convergence", ["power", "{missing}"], "{missing}"),
    # a file of another kind: what power reads, not "restore it from git" (it is the user's file, not the suite's)
    ("power-garbage", "convergence", ["power", "{garbage}"], "power reads the JSON that `python -m convergence"),
    ("power-not-a-verdict", "convergence", ["power", "{good}"], "power reads the JSON that `python -m convergence"),
    ("power-directory", "convergence", ["power", "{directory}"], "{directory}"),
    ("power-protocol-running", "convergence", ["power", "{protocol}"], "{protocol}"),
    ("power-json-existing", "convergence", ["power", "{verdict}", "--json", "{existing}"], "{existing}"),
    ("power-margin", "convergence", ["power", "{verdict}", "--margin", "2"], "--margin"),
    # a result of the wrong shape, an output over its input, one file given twice
    ("power-a-list", "convergence", ["power", "{a_list}"], "{a_list}"),
    ("power-window-text", "convergence", ["power", "{window_text}"], "{window_text}"),
    ("power-twice", "convergence", ["power", "{verdict}", "{verdict}"], "{verdict}"),
    # an output over an input: even with --force, an input is never overwritten
    ("compare-same-keys", "convergence", ["compare", "{good}", "{good}", "--loss-key", "step", "--step-key",
                                          "step"], "--loss-key"),
    ("compare-json-is-an-input", "convergence", ["compare", "{good}", "{truncated}", "--json", "{truncated}",
                                                 "--force"], "--json {truncated}"),
    ("profile-json-is-an-input", "convergence", ["profile", "{good}", "--json", "{good}", "--force"],
     "--json {good}"),
    ("profile-name-twice", "convergence", ["profile", "{good}", "{good}", "--name", "a", "--name", "a"],
     "'a'"),
    ("probes-name-twice", "convergence", ["probes", "{probes}", "{probes}", "--name", "a", "--name", "a"],
     "'a'"),
    ("profile-same-run-twice", "convergence", ["profile", "{good}", "{good}"], "{good}"),
    # a result's numbers, checked (a negative or NaN spread, text where a number belongs)
    *[(f"power-{name}", "convergence", ["power", "{" + name + "}", "--larger-set", "2"], words)
      for name, words in (("spread_negative", "final_window.seed_spread"), ("spread_nan", "final_window.seed_spread"),
                          ("se_negative", "final_window.se_set"), ("estimate_text", "final_window.estimate"),
                          ("batches_text", "final_window.heldout_batches"),
                          ("levels_one", "final_window.replicate_levels"))],
    ("power-larger-set-inf", "convergence", ["power", "{verdict}", "--larger-set", "inf"], "--larger-set"),
    ("power-larger-set-tiny", "convergence", ["power", "{verdict}", "--larger-set", "1e-320"], "--larger-set"),
    ("profile-probes", "convergence", ["profile", "{probes}"], "{probes}"),
    ("profile-same-output", "convergence", ["profile", "{good}", "--json", "{tmp}/o", "--plot", "{tmp}/o"],
     "{tmp}/o"),
    ("protocol-status-same-figure", "convergence", ["protocol", "--status", "--out", "{protocol}", "--plot",
                                                    "{tmp}/f.png", "--plot-parting", "{tmp}/f.png"],
     "{tmp}/f.png"),
    ("compare-a-run-folder", "convergence", ["compare", "{tmp}/runs/bf16", "{good}"],
     "{tmp}/runs/bf16/bf16/metrics.jsonl"),  # the file to pass instead
    # flags that would be ignored, a file in a run folder's place, a garbled environment, empty data
    ("protocol-gpus-cpu", "convergence", ["protocol", "--model", "tiny", "--steps", "20", "--gpus", "2",
                                          "--out", "{tmp}/p"], "--gpus"),
    ("protocol-gpus-zero", "convergence", ["protocol", "--model", "tiny", "--steps", "20", "--device", "cuda",
                                           "--gpus", "0", "--out", "{tmp}/p"], "--gpus"),
    ("protocol-status-gpus", "convergence", ["protocol", "--status", "--out", "{protocol}", "--gpus", "2"],
     "--gpus"),
    ("protocol-data-empty", "convergence", ["protocol", "--model", "tiny", "--steps", "20", "--data", "{empty}",
                                            "--out", "{tmp}/p"], "{empty}"),
    ("protocol-runs-a-file", "convergence", ["protocol", "--status", "--out", "{runs_a_file}"],
     "{runs_a_file}/runs"),
    ("protocol-gpus-text", "convergence", ["protocol", "--status", "--out", "{gpus_text}"],
     "{gpus_text}/runs/bf16/bf16/config.json"),
    ("ep-identity-recipe-file", "convergence", ["ep-identity", "{good}", "{good}", "--recipe", "mxfp8"],
     "--recipe"),
    ("layers-same-output", "numerics", ["layers", "--device", "cpu", "--json", "{tmp}/o", "--markdown", "{tmp}/o"],
     "{tmp}/o"),
    ("layers-json-existing", "numerics", ["layers", "--device", "cpu", "--json", "{existing}"], "{existing}"),
    ("layers-json-unwritable", "numerics", ["layers", "--device", "cpu", "--json", "{unwritable}"], "{unwritable}"),
    ("layers-config", "numerics", ["layers", "--config", "huge"], "--config"),
    ("report-size", "numerics", ["report", "--size", "huge"], "--size"),
    ("report-out-a-file", "numerics", ["report", "--out", "{existing}"], "{existing}"),
    ("bench-elements", "numerics", ["bench", "cast", "--elements", "100"], "--elements"),
    ("bench-layers-iters", "numerics", ["bench", "layers", "--device", "cpu", "--iters", "-1"], "--iters"),
    ("bench-layers-iters-0", "numerics", ["bench", "layers", "--device", "cpu", "--iters", "0"], "--iters"),
    ("validate-out-unwritable", "mxval", ["validate", "--out", "{tmp}/blocker/r"], "{tmp}/blocker/r"),
    ("validate-out-a-file", "mxval", ["validate", "--out", "{existing}"], "{existing}"),
    ("validate-levels", "mxval", ["validate", "--levels", "everything", "--out", "{tmp}/v"], "--levels"),
    ("validate-steps", "mxval", ["validate", "--steps", "5", "--out", "{tmp}/v"], "--steps"),
    ("validate-progress-every", "mxval", ["validate", "--progress-every", "-1", "--out", "{tmp}/v"],
     "--progress-every"),
    # seeds: refused while parsing, before any folder is made (torch takes seeds below 2**64 only)
    ("validate-seed", "mxval", ["validate", "--seed", "-1", "--levels", "training", "--out", "{tmp}/v"],
     "--seed"),
    ("train-seed-big", "convergence", ["train", "--model", "tiny", "--steps", "2", "--seed", "99999999999999999999999",
                                       "--out", "{tmp}/r"], "--seed"),
    ("train-row-order", "convergence", ["train", "--model", "tiny", "--steps", "2", "--row-order", "-3",
                                        "--out", "{tmp}/r"], "--row-order"),
    ("protocol-seed-big", "convergence", ["protocol", "--model", "tiny", "--steps", "4", "--val-every", "2",
                                          "--seed", "4294967290", "--replicates", "4", "--candidate-replicates", "2",
                                          "--out", "{tmp}/p"], "--seed"),
    ("calibrate-seed", "convergence", ["calibrate", "--pairs", "1", "--seed", "-1"], "--seed"),
    ("ep-check-seed", "numerics", ["ep", "check", "--seed", "-1"], "--seed"),
    ("ep-check-timeout-nan", "numerics", ["ep", "check", "--timeout", "nan"], "--timeout"),
    ("ep-bench-timeout-nan", "numerics", ["ep", "bench", "--timeout", "nan"], "--timeout"),
    # a --json under a file: refused before the check runs, not after it
    ("ep-check-json-under-a-file", "numerics", ["ep", "check", "--json", "{tmp}/blocker/x.json"],
     "{tmp}/blocker/x.json"),
    ("ep-bench-json-under-a-file", "numerics", ["ep", "bench", "--json", "{tmp}/blocker/x.json"],
     "{tmp}/blocker/x.json"),
    # train's run flags: NaN, infinite and negative values
    *[(f"train-{flag[2:]}-{value}", "convergence", ["train", "--model", "tiny", "--steps", "2", flag, value,
                                                     "--out", "{tmp}/r"], flag)
      for flag, value in (("--lr", "nan"), ("--lr", "inf"), ("--threads", "-1"), ("--threads", "0"),
                          ("--stop-after-minutes", "-1"), ("--stop-after-minutes", "nan"), ("--dist-timeout", "nan"),
                          ("--warmup", "-1"), ("--probe-every", "-2"), ("--ckpt-every", "-1"))],
    # a deadline without checkpoints: such a run could not be continued with --resume
    ("train-stop-without-checkpoints", "convergence", ["train", "--model", "tiny", "--steps", "2", "--ckpt-every",
                                                       "0", "--stop-after-minutes", "1", "--out", "{tmp}/r"],
     "--ckpt-every 0"),
    # flags that would be recorded in config.json though nothing used them
    ("train-ep-backend-without-ep", "convergence", ["train", "--model", "tiny", "--steps", "2", "--ep-backend",
                                                    "deepep", "--out", "{tmp}/r"], "--ep-backend"),
    ("train-ep-backend-unknown", "convergence", ["train", "--model", "tiny", "--steps", "2", "--ep", "2",
                                                 "--ep-backend", "bogus", "--out", "{tmp}/r"], "--ep-backend"),
    ("validate-steps-without-training", "mxval", ["validate", "--out", "{tmp}/v", "--levels", "tensor", "--steps",
                                                  "50"], "--steps"),
    ("bench-compile-emulated-no-compile", "convergence", ["bench", "--model", "tiny", "--device", "cpu",
                                                          "--no-compile", "--compile-emulated"], "--compile-emulated"),
    ("train-tokenizer-with-bin", "convergence", ["train", "--model", "tiny", "--steps", "2", "--tokenizer", "bpe",
                                                 "--data", "{tmp}/ids.bin", "--out", "{tmp}/r"], "--tokenizer"),
    ("protocol-status-parallel-on-cpu", "convergence", ["protocol", "--status", "--out", "{protocol}", "--parallel",
                                                        "2"], "--parallel"),
    ("train-dist-timeout-without-ep", "convergence", ["train", "--model", "tiny", "--steps", "2", "--dist-timeout",
                                                      "60", "--out", "{tmp}/r"], "--dist-timeout"),
    ("train-bin-other-dtype", "convergence", ["train", "--model", "tiny", "--steps", "2", "--data", "{ids_u32}",
                                              "--out", "{tmp}/r"], "--data-dtype"),
    ("train-data-dtype-without-bin", "convergence", ["train", "--model", "tiny", "--steps", "2", "--data-dtype",
                                                     "uint32", "--out", "{tmp}/r"], "--data-dtype"),
]
MAINS = {"convergence": convergence_main, "numerics": numerics_main, "mxval": mxval_main}


@pytest.mark.parametrize(("case", "package", "argv", "words"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_2_and_touches_nothing(capsys, tmp_path, files, case, package, argv, words):
    values = {k: str(v) for k, v in files.items()} | {"tmp": str(tmp_path)}
    err = _one_line_exit_2(capsys, MAINS[package], [a.format(**values) for a in argv], tmp_path)
    assert words.format(**values) in err, err


def test_known_benign_logs_are_dropped_and_nothing_else():
    f = KnownBenignLogs()

    def record(name: str, msg: str) -> logging.LogRecord:
        return logging.LogRecord(name, logging.WARNING, __file__, 1, msg, None, None)

    lib = "/site-packages/torchao/_C_mxfp8.cpython-310-x86_64-linux-gnu.so"
    assert not f.filter(record("torchao", f"Failed to load {lib}: Could not load this library"))
    assert not f.filter(record("torch.utils._pytree", "<enum 'KernelPreference'> is an Enum subclass and is now "
                                                     "natively supported by torch.compile as an opaque value type"))
    assert f.filter(record("torchao", "Failed to load something_else.so"))  # not torchao's own library
    assert f.filter(record("torchao", "a real warning"))
    assert f.filter(record("torch.utils._pytree", "<enum 'Other'> is an Enum subclass and is now natively supported"))


def test_a_command_prints_none_of_the_known_benign_lines():
    """A command's output starts with its own lines: neither torchao's 'Failed to load ..._C_mxfp8...so' nor
    torch's '<enum 'KernelPreference'> is an Enum subclass' (the filter's own test above is the control)."""
    r = subprocess.run([sys.executable, "-m", "numerics", "bench", "cast", "--elements", "4096", "--repeat", "1"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Failed to load" not in r.stderr and "is an Enum subclass" not in r.stderr, r.stderr[-2000:]
