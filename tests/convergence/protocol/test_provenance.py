"""Where a protocol's runs were made (convergence.protocol.provenance): each run's environment, the result files'
hardware tag, and a machine that would compute runs differently."""

from __future__ import annotations

import dataclasses
import gzip
import json
import shutil

import pytest
import torch

from convergence.__main__ import main as convergence_main
from convergence.protocol.folder import load_plan, run_dir
from convergence.protocol.plan import VERDICTS
from convergence.protocol.provenance import environment_change, made_with, runs_hardware_tag
from convergence.protocol.render import made_with_line
from numerics.environment import describe
from numerics.errors import BadInput


def test_a_plan_is_not_continued_where_its_runs_would_be_computed_differently(tmp_path, refused):
    """A plan's runs are compared with each other: a machine whose torch (or torchao, CUDA, GPU model) differs
    from a run already made is refused in one line, before any training; --mixed-environment goes on (the control
    that the refusal is the check's: the same command then reaches its deadline, exit 4), and so does the same
    machine. The GPU model is compared, not the count: one run saw both GPUs of a machine, another one of them."""
    out = tmp_path / "p"
    argv = ["protocol", "--model", "tiny", "--steps", "20", "--replicates", "3", "--out", str(out),
            "--stop-after-minutes", "0.0001"]  # a deadline already past: no run starts
    assert convergence_main(argv) == 4
    here = describe()
    plan = load_plan(out)
    made = run_dir(out, plan.runs()[0])
    made.mkdir(parents=True)
    (made / "config.json").write_text(json.dumps({"environment": here | {"torch": "0.0.0+elsewhere"}}))
    err = refused(*argv[1:])
    assert f"torch {here['torch']} here, 0.0.0+elsewhere in 1 run(s) (bf16" in err and "--mixed-environment" in err
    assert not list((out / "runs").rglob("metrics.jsonl*"))
    assert made_with(plan, out) == {"torch": [("0.0.0+elsewhere", ["bf16"])], "torchao": [(here["torchao"], ["bf16"])]}
    assert environment_change(plan, out, here) == {"torch": (here["torch"], [("0.0.0+elsewhere", ["bf16"])])}
    assert convergence_main([*argv, "--mixed-environment"]) == 4
    (made / "config.json").write_text(json.dumps({"environment": here}))
    assert environment_change(plan, out, here) == {}
    assert convergence_main(argv) == 4
    other = run_dir(out, plan.runs()[1])  # two runs made with two torches: mixed
    other.mkdir(parents=True)
    (other / "config.json").write_text(json.dumps({"environment": here | {"torch": "0.0.0+elsewhere"}}))
    assert sorted(made_with(plan, out)["torch"]) == sorted([("0.0.0+elsewhere", [plan.runs()[1].name]),
                                                            (here["torch"], ["bf16"])])
    assert "torch MIXED (" in made_with_line(made_with(plan, out))
    other.joinpath("config.json").unlink()

    cuda = dataclasses.replace(plan, device="cuda")
    h200 = {**here, "gpus": ["NVIDIA H200"], "cuda": "13.0", "capability": [9, 0]}
    (made / "config.json").write_text(json.dumps({"environment": h200 | {"gpus": ["NVIDIA H200"] * 2}}))
    assert environment_change(cuda, out, h200) == {}
    assert environment_change(cuda, out, h200 | {"gpus": ["NVIDIA H100"]}) == {
        "gpu": (["NVIDIA H100"], [(["NVIDIA H200"], ["bf16"])])}
    (made / "config.json").write_text(json.dumps({"environment": {k: v for k, v in h200.items() if k != "cuda"}}))
    assert environment_change(cuda, out, h200 | {"cuda": "13.1"}) == {}  # a run that did not record it


def test_provenance_a_runs_gpus_must_be_a_list_of_names(tmp_path, small_plan):
    plan = small_plan()
    made = run_dir(tmp_path, plan.runs()[0])
    made.mkdir(parents=True)
    (made / "config.json").write_text(json.dumps({"environment": {"gpus": "NVIDIA H200"}}))
    with pytest.raises(BadInput, match="not a list of GPU names"):
        made_with(plan, tmp_path)


@pytest.mark.skipif(torch.cuda.is_available(), reason="judges a GPU folder on a machine without CUDA")
@pytest.mark.timeout(300)
def test_a_finished_gpu_folder_is_judged_on_a_machine_without_one(copy_finished, finished_protocol, refused):
    """A protocol folder copied off the GPU machine that ran it is judged where it lands (no GPU is needed to
    read validation losses), tagged with the GPU its runs name; an unfinished one is still refused (the control),
    as are runs that name two kinds of GPU (then --hardware names it). Every sidecar names the environment that
    trained its file's runs, not the judging machine's (the CPU here, which made none of them): a run's its own
    config.json's, a verdict's the runs' (two commits listed when made at two), with the judging one beside it."""
    out = copy_finished()
    plan = finished_protocol["plan"]
    state = json.loads((out / "protocol.json").read_text())
    (out / "protocol.json").write_text(json.dumps(state | {"device": "cuda"}))  # as the GPU machine wrote it
    configs = sorted((out / "runs").rglob("config.json"))
    earlier = "e" * 40  # the first run made at an earlier commit, as a plan made over several calls is
    for i, path in enumerate(configs):
        c = json.loads(path.read_text())
        c["environment"] |= {"gpus": ["NVIDIA H200"], "torch": "2.11.0+cu130"} | (
            {"mxval_commit": earlier} if i == 0 else {})
        path.write_text(json.dumps(c))
    assert runs_hardware_tag(dataclasses.replace(plan, device="cuda"), out) == "h200"
    shutil.rmtree(out / "results")
    gpu = ["protocol", *finished_protocol["argv"][:-1], str(out), "--device", "cuda"]
    rc = convergence_main(gpu)
    assert rc == finished_protocol["rc"]
    assert {f"tiny_long_{v}__h200.json" for v in VERDICTS} <= {p.name for p in (out / "results").iterdir()}
    meta = json.loads((out / "results" / "tiny_long_verdict__h200.json.meta.json").read_text())
    assert "--device cuda" in meta["command"]
    here = describe()
    made = json.loads(configs[1].read_text())["environment"]["mxval_commit"]
    assert meta["versions"]["gpus"] == ["NVIDIA H200"] and meta["versions"]["torch"] == "2.11.0+cu130"
    assert meta["versions"]["mxval_commit"] == sorted({earlier, made})
    assert meta["versions"]["judged_with"]["gpus"] == [] == here["gpus"]  # the control: the judge's differs
    assert meta["commit"] == here["mxval_commit"]  # the verdict's arithmetic ran here
    for i, path in enumerate(configs):
        run = path.parent.parent.name
        side = json.loads((out / "results" / f"tiny_long_{run}__h200.jsonl.gz.meta.json").read_text())
        assert side["versions"] == json.loads(path.read_text())["environment"]
        assert side["commit"] == (earlier if i == 0 else made) and side["versions"]["torch"] == "2.11.0+cu130"

    c = json.loads(configs[0].read_text())
    configs[0].write_text(json.dumps(c | {"environment": c["environment"] | {"gpus": ["NVIDIA H100"]}}))
    assert "h100, h200" in refused(*gpu[1:])
    assert convergence_main([*gpu, "--hardware", "mixed"]) == rc  # named: judged as before
    configs[1].rename(configs[1].with_name("config.moved"))  # a run whose config.json is gone is named
    assert f"unknown: {configs[1].parent.parent.name}, whose config.json is missing" in refused(*gpu[1:])
    configs[1].with_name("config.moved").rename(configs[1])
    made = {p: p.read_bytes() for p in (out / "runs").rglob("metrics.jsonl*")}
    assert len(made) == len(configs)
    assert "no CUDA device" in refused(*gpu[1:], "--force")  # --force would run again: it needs the GPU
    assert {p: p.read_bytes() for p in (out / "runs").rglob("metrics.jsonl*")} == made  # and deleted nothing

    last = sorted((out / "runs").rglob("metrics.jsonl.gz"))[-1]  # a run one step short (stopped: plain)
    last.with_suffix("").write_bytes(b"".join(gzip.decompress(last.read_bytes()).splitlines(keepends=True)[:-1]))
    last.unlink()
    assert "no CUDA device" in refused(*gpu[1:])
