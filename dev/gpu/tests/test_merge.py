"""dev/gpu/merge.sh keeps what a GPU machine made: the protocol runs it finished, and nothing it stopped part-way
(their checkpoints stay on that machine); a tarball that lost, changed or cut short a tracked file is refused
whole. On the machine, dev/gpu/workdir.sh picks the folder a call continues in, so that no finished run is made
twice. Development tooling, outside the product's tests: python -m pytest dev/gpu/tests"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
GPU = Path("dev") / "gpu"  # where the scripts live, relative to the repository root they are run from

pytestmark = pytest.mark.skipif(not (shutil.which("bash") and shutil.which("git") and shutil.which("tar")),
                                reason="needs bash, git and tar")


def _run(cwd: Path, *argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, env=env, timeout=60)


def _repo(tmp_path: Path) -> Path:
    """A git checkout holding merge.sh, workdir.sh and a tracked protocol folder with one finished run."""
    repo = tmp_path / "repo"
    (repo / GPU / "proto" / "runs" / "bf16" / "bf16").mkdir(parents=True)
    for script in ("merge.sh", "workdir.sh"):
        shutil.copy(ROOT / GPU / script, repo / GPU / script)
    tracked = repo / GPU / "proto"
    (tracked / "protocol.json").write_text(json.dumps({"model": "proxy"}))
    (tracked / "pace.jsonl").write_text('{"run": "bf16"}\n')
    (tracked / "runs" / "bf16" / "bf16" / "metrics.jsonl.gz").write_bytes(b"first run")
    for argv in (("git", "init", "-q"), ("git", "add", "-A"),
                 ("git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "start")):
        assert _run(repo, *argv).returncode == 0
    return repo


def _tarball(tmp_path: Path, repo: Path, *, drop: str | None = None, write: dict | None = None) -> Path:
    """What protocol.sh sends back: the tracked folder grown by one finished run and one stopped part-way."""
    made = tmp_path / "machine" / "proto"
    shutil.copytree(repo / GPU / "proto", made)
    (made / "pace.jsonl").write_text('{"run": "bf16"}\n{"run": "bf16_rounding1"}\n{"run": "mxfp8"}\n')
    for name, recipe, files in (("bf16_rounding1", "bf16", ("metrics.jsonl.gz",)), ("mxfp8", "mxfp8",
                                                                                     ("metrics.jsonl",))):
        (made / "runs" / name / recipe).mkdir(parents=True)
        for f in files:
            (made / "runs" / name / recipe / f).write_bytes(name.encode())
    (made / "unfinished.txt").write_text("runs/mxfp8/mxfp8\n")  # its checkpoint.pt stayed behind
    if drop:
        (made / drop).unlink()
    for name, data in (write or {}).items():
        (made / name).write_bytes(data)
    tgz = tmp_path / "results.tgz"
    with tarfile.open(tgz, "w:gz") as t:
        t.add(made, arcname="proto")
    return tgz


def test_merge_keeps_the_finished_runs_and_stages_them(tmp_path):
    repo = _repo(tmp_path)
    done = _run(repo, "bash", "dev/gpu/merge.sh", str(_tarball(tmp_path, repo)), env={**os.environ, "NAME": "proto"})
    assert done.returncode == 0, done.stderr
    assert "not merged (stopped part-way): runs/mxfp8/mxfp8" in done.stdout
    folder = repo / GPU / "proto"
    assert (folder / "runs" / "bf16_rounding1" / "bf16" / "metrics.jsonl.gz").read_bytes() == b"bf16_rounding1"
    assert not (folder / "runs" / "mxfp8").exists() and not (folder / "unfinished.txt").exists()
    assert (folder / "pace.jsonl").read_text().count("\n") == 3  # every piece's pace, the stopped one's too
    staged = _run(repo, "git", "diff", "--cached", "--name-only").stdout.split()
    assert staged == ["dev/gpu/proto/pace.jsonl", "dev/gpu/proto/runs/bf16_rounding1/bf16/metrics.jsonl.gz"]


def test_merge_of_a_call_that_stopped_no_run_part_way(tmp_path):
    """unfinished.txt holding only a blank line (what unfinished.py once wrote when every run was finished) names
    no run: the finished runs are merged."""
    repo = _repo(tmp_path)
    tgz = _tarball(tmp_path, repo, write={"unfinished.txt": b"\n"})
    done = _run(repo, "bash", "dev/gpu/merge.sh", str(tgz), env={**os.environ, "NAME": "proto"})
    assert done.returncode == 0, done.stderr
    assert "not merged" not in done.stdout
    folder = repo / GPU / "proto"
    assert (folder / "runs" / "mxfp8" / "mxfp8" / "metrics.jsonl").read_bytes() == b"mxfp8"


def test_merge_refuses_a_tarball_that_lost_a_tracked_run(tmp_path):
    """The control: the same tarball without the tracked run's log is refused with exit 2, and nothing is copied."""
    repo = _repo(tmp_path)
    tgz = _tarball(tmp_path, repo, drop="runs/bf16/bf16/metrics.jsonl.gz")
    refused = _run(repo, "bash", "dev/gpu/merge.sh", str(tgz), env={**os.environ, "NAME": "proto"})
    assert refused.returncode == 2
    assert "metrics.jsonl.gz is tracked but not in" in refused.stderr and refused.stderr.count("\n") == 1
    assert not (repo / GPU / "proto" / "runs" / "bf16_rounding1").exists()
    assert _run(repo, "git", "status", "--porcelain").stdout == ""


@pytest.mark.parametrize("same", [True, False])
def test_merge_takes_a_tracked_log_compacted_on_the_machine(tmp_path, same):
    """A log merged plain (a fork's trunk before its continuations were done) and compacted since comes back as
    its gzip: merged when it decompresses to the tracked bytes, the plain file removed from the index; a gzip of
    other bytes is refused in one line, nothing copied (the control)."""
    import gzip

    repo = _repo(tmp_path)
    trunk = repo / GPU / "proto" / "runs" / "trunk1" / "bf16"
    trunk.mkdir(parents=True)
    (trunk / "metrics.jsonl").write_bytes(b'{"step": 1}\n')
    assert _run(repo, "git", "add", "-A").returncode == 0
    assert _run(repo, "git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "trunk").returncode == 0
    sent = b'{"step": 1}\n' if same else b'{"step": 2}\n'
    tgz = _tarball(tmp_path, repo, drop="runs/trunk1/bf16/metrics.jsonl",
                   write={"runs/trunk1/bf16/metrics.jsonl.gz": gzip.compress(sent, mtime=0)})
    done = _run(repo, "bash", "dev/gpu/merge.sh", str(tgz), env={**os.environ, "NAME": "proto"})
    if same:
        assert done.returncode == 0, done.stderr
        assert "compacted: ./runs/trunk1/bf16/metrics.jsonl" in done.stdout
        assert not (trunk / "metrics.jsonl").exists()
        assert gzip.decompress((trunk / "metrics.jsonl.gz").read_bytes()) == sent
        staged = _run(repo, "git", "status", "--porcelain").stdout
        assert "D  dev/gpu/proto/runs/trunk1/bf16/metrics.jsonl" in staged
        assert "A  dev/gpu/proto/runs/trunk1/bf16/metrics.jsonl.gz" in staged
    else:
        assert done.returncode == 2 and "is not the tracked" in done.stderr and done.stderr.count("\n") == 1
        assert (trunk / "metrics.jsonl").exists() and not (trunk / "metrics.jsonl.gz").exists()
        assert _run(repo, "git", "status", "--porcelain").stdout == ""


@pytest.mark.parametrize("write, says", [
    ({"runs/bf16/bf16/metrics.jsonl.gz": b"garbage"}, "differs from the tracked one"),
    ({"protocol.json": b"not json"}, "differs from the tracked one"),
    ({"pace.jsonl": b'{"run": "mxfp8"}\n'}, "is not the tracked one with lines appended"),
    ({"unfinished.txt": b"runs/mxfp8/mxfp8\n../../canary\n"}, "not a run folder"),
])
def test_merge_refuses_a_tarball_that_changed_a_tracked_file(tmp_path, write, says):
    """A tracked finished run, the plan or the tracked pace lines changed on the machine (or in transfer), or an
    unfinished.txt naming a path outside the unpacked folder: refused in one line, exit 2, nothing copied or
    deleted. The control is the merge test above, whose tarball only adds."""
    repo = _repo(tmp_path)
    (tmp_path / "t" / "u").mkdir(parents=True)
    canary = tmp_path / "t" / "u" / "canary"  # ../../canary from the unpacked folder TMPDIR/tmp.XXXX/proto
    canary.write_text("a user's file")
    tgz = _tarball(tmp_path, repo, write=write)
    refused = _run(repo, "bash", "dev/gpu/merge.sh", str(tgz),
                   env={**os.environ, "NAME": "proto", "TMPDIR": str(tmp_path / "t" / "u")})
    assert refused.returncode == 2 and says in refused.stderr and refused.stderr.count("\n") == 1, refused.stderr
    assert canary.read_text() == "a user's file"
    assert not (repo / GPU / "proto" / "runs" / "bf16_rounding1").exists()
    assert _run(repo, "git", "status", "--porcelain").stdout == ""


@pytest.mark.parametrize("argv, name, says", [([], "proto", "usage"), (["nothing.tgz"], "proto", "no such file"),
                                              (["not.tgz"], "proto", "not a whole gzip tarball"),
                                              (["results.tgz"], "", "set NAME")])
def test_merge_bad_arguments_are_one_line(tmp_path, argv, name, says):
    repo = _repo(tmp_path)
    (repo / "not.tgz").write_text("not a tarball")
    (repo / "results.tgz").write_bytes(_tarball(tmp_path, repo).read_bytes())
    refused = _run(repo, "bash", "dev/gpu/merge.sh", *argv, env={**os.environ, "NAME": name})
    assert refused.returncode == 2 and says in refused.stderr and refused.stderr.count("\n") == 1, refused.stderr
    assert not (repo / GPU / "proto" / "runs" / "bf16_rounding1").exists()


def _warm(tmp_path: Path, repo: Path, *, lacking: bool) -> Path:
    """A warm machine's working folder: an earlier call's copy with a stopped run's checkpoint, which either holds
    the tracked finished run (it started from the tracked copy) or lacks it (it started from one not yet merged)."""
    work = tmp_path / "machine-tmp" / "proto"
    shutil.copytree(repo / GPU / "proto", work)
    if lacking:
        shutil.rmtree(work / "runs" / "bf16")
    (work / "runs" / "mxfp8" / "mxfp8").mkdir(parents=True)
    (work / "runs" / "mxfp8" / "mxfp8" / "checkpoint.pt").write_bytes(b"stopped at step 700")
    return work


@pytest.mark.parametrize("lacking", [False, True])
def test_a_warm_folder_is_continued_only_when_it_holds_every_tracked_finished_run(tmp_path, lacking):
    """A warm machine's folder that lacks a finished run the tracked copy holds (a call started from a copy not yet
    merged) would make that run again: workdir.sh replaces it by the tracked copy (its stopped run's checkpoint
    goes with it), and keeps a folder that holds every tracked finished run (the control)."""
    repo = _repo(tmp_path)
    work = _warm(tmp_path, repo, lacking=lacking)
    chose = _run(repo, "bash", "dev/gpu/workdir.sh", env={**os.environ, "NAME": "proto", "W": str(work)})
    assert chose.returncode == 0 and chose.stdout.count("\n") == (2 if lacking else 1), chose.stdout + chose.stderr
    assert (work / "runs" / "bf16" / "bf16" / "metrics.jsonl.gz").read_bytes() == b"first run"
    assert (work / "runs" / "mxfp8" / "mxfp8" / "checkpoint.pt").exists() is not lacking
    assert ("lacked 1 finished run(s) the tracked copy holds: replaced" in chose.stdout) is lacking
    assert ("warm machine, its folder replaced: " in chose.stdout) is lacking  # not "fresh machine": it was warm
    assert "fresh machine" not in chose.stdout
    assert ("warm machine: continuing" in chose.stdout) is not lacking


def test_a_fresh_machine_starts_from_the_tracked_copy(tmp_path):
    repo = _repo(tmp_path)
    work = tmp_path / "machine-tmp" / "proto"
    work.parent.mkdir()  # the machine's /tmp
    chose = _run(repo, "bash", "dev/gpu/workdir.sh", env={**os.environ, "NAME": "proto", "W": str(work)})
    assert chose.returncode == 0 and chose.stdout.startswith("fresh machine"), chose.stdout + chose.stderr
    assert (work / "runs" / "bf16" / "bf16" / "metrics.jsonl.gz").read_bytes() == b"first run"
    assert (work / "protocol.json").exists() and not (work / "proto").exists()


def test_unfinished_lists_runs_stopped_part_way_and_not_a_finished_trunk(tmp_path, monkeypatch):
    """A fork's finished trunk keeps its checkpoint for its continuations: its logs are sent back and merged (a
    fresh machine makes it again, held to them); a run stopped part-way with its checkpoint is listed (control)."""
    monkeypatch.syspath_prepend(str(ROOT / GPU))
    from unfinished import stopped_part_way

    from convergence.protocol.folder import open_protocol, run_dir
    from convergence.protocol.plan import ProtocolPlan

    plan = ProtocolPlan(model="tiny", steps=20, design="fork", fork_step=10, replicates=2).check()
    open_protocol(plan, tmp_path)
    trunk, first, *_ = plan.runs()
    for spec, steps in ((trunk, 10), (first, 14)):  # the trunk at its stop, the first continuation part-way
        d = run_dir(tmp_path, spec)
        d.mkdir(parents=True, exist_ok=True)
        (d / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n"
                                                 for s in range(1, steps + 1)))
        (d / "checkpoint.pt").write_bytes(b"")
    assert stopped_part_way(tmp_path) == [f"runs/{first.name}/{first.recipe}"]
