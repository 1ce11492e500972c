"""The protocol's verdicts and result files (convergence.protocol.judge)."""

from __future__ import annotations

import gzip
import json
import shutil

import pytest

from convergence.protocol.folder import metrics_path
from convergence.protocol.judge import as_expected, check_design, judge, write_results
from convergence.protocol.plan import ProtocolPlan
from numerics.errors import BadInput


def test_as_expected_counts_a_diverged_positive_control_as_told_apart():
    assert as_expected("diverged", "not_equivalent") and as_expected("not_equivalent", "not_equivalent")
    assert not as_expected("inconclusive", "not_equivalent") and not as_expected("diverged", "equivalent")
    assert as_expected("equivalent", None) is None  # the candidate has no expected verdict


def test_judging_checks_that_the_runs_are_what_their_design_says(tmp_path):
    """Runs of one init seed must carry one init fingerprint, runs of different seeds different ones (read from
    their config.json), and no two runs may end with the same validation losses; a mismatch is one line naming
    the runs. Fingerprints older than SHA-256 are not compared. The controls: a rounding plan's runs given two
    fingerprints, an init plan whose seeds give one, and a run whose losses copy another's."""
    def write(plan, fingerprint):
        for spec in plan.runs():
            path = metrics_path(tmp_path, spec).parent / "config.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"init_fingerprint": fingerprint(spec)}))

    rounding = ProtocolPlan(model="tiny", control="mxfp8-head", steps=10,
                            overrides=(("val_every", 5),), replicates=3).check()
    write(rounding, lambda s: "sha256:aaaa")
    check_design(rounding, tmp_path)  # one seed, one fingerprint
    odd = rounding.runs()[2].name
    write(rounding, lambda s: "sha256:bbbb" if s.name == odd else "sha256:aaaa")
    with pytest.raises(BadInput, match=f"runs of init seed 0 start from different weights .*{odd}: sha256:bbbb"):
        check_design(rounding, tmp_path)
    write(rounding, lambda s: "0123abcd" if s.name == odd else "sha256:aaaa")  # pre-SHA-256: not compared
    check_design(rounding, tmp_path)

    shutil.rmtree(tmp_path / "runs")
    init = ProtocolPlan(model="tiny", control="mxfp8-head", steps=10,
                        overrides=(("val_every", 5),), replicates=3, design="init").check()
    assert len({s.seed for s in init.runs()}) > 1
    write(init, lambda s: f"sha256:{s.seed:04d}")
    check_design(init, tmp_path)  # each seed its own weights
    write(init, lambda s: "sha256:same")
    with pytest.raises(BadInput, match="init seeds 0, 1, 2.* gave the same weights"):
        check_design(init, tmp_path)

    # no two runs end with the same validation losses: a replicate the change did not reach is a copy
    write(init, lambda s: f"sha256:{s.seed:04d}")
    runs = init.runs()
    for i, spec in enumerate(runs):
        metrics_path(tmp_path, spec).write_text(json.dumps({"step": 10, "val_batch_losses": [2.0, 2.0 + i]}) + "\n")
    check_design(init, tmp_path)
    metrics_path(tmp_path, runs[3]).write_text(json.dumps({"step": 10, "val_batch_losses": [2.0, 2.0 + 1]}) + "\n")
    with pytest.raises(BadInput, match=f"runs {runs[1].name} and {runs[3].name} ended with the same validation"):
        check_design(init, tmp_path)


def test_judge_a_compacted_folder_gives_the_verdicts_and_results_of_the_plain_one(copy_finished, finished_protocol,
                                                                                 monkeypatch):
    """Compaction changes how a finished run's logs are stored, not what they say: the same folder with every log
    gunzipped back to plain (the control: the only difference) gives the same verdicts, but for the file each
    names as its source, and the same results byte for byte (write_results copies a compacted log as it is and
    compresses a plain one to the same bytes). results/ is written whole or not at all: a kill while writing it
    leaves the results before it."""
    plan = finished_protocol["plan"]
    packed, plain = copy_finished("packed"), copy_finished("plain")
    for gz in (plain / "runs").rglob("*.jsonl.gz"):
        gz.with_suffix("").write_bytes(gzip.decompress(gz.read_bytes()))
        gz.unlink()
    assert not list((packed / "runs").rglob("*.jsonl")) and not list((plain / "runs").rglob("*.gz"))
    assert list((packed / "runs").rglob("probes.jsonl.gz"))

    def judged(root):  # each run's file, named in the verdicts as their source, by its run's name
        text = json.dumps(judge(plan, root), sort_keys=True)
        for spec in plan.runs():
            text = text.replace(json.dumps(str(metrics_path(root, spec))), json.dumps(f"<{spec.name}>"))
        return json.loads(text)

    verdicts = judged(packed)
    assert verdicts == judged(plain) and f"{packed}" not in json.dumps(verdicts)
    results = {}
    for root in (packed, plain):
        write_results(plan, root, verdicts, plan.command("OUT"), "cpu")
        results[root] = {p.name: p.read_bytes() for p in (root / "results").iterdir()}
    assert results[packed] == results[plain]
    assert sum(n.endswith("_probes__cpu.jsonl.gz") for n in results[packed]) == 2  # the candidate and the control

    from convergence.curves import plots

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(plots, "plot_comparison", killed)
        with pytest.raises(KeyboardInterrupt):
            write_results(plan, packed, verdicts, plan.command("OUT"), "cpu")
    assert {p.name: p.read_bytes() for p in (packed / "results").iterdir()} == results[packed]
    write_results(plan, packed, verdicts, plan.command("OUT"), "cpu")  # the repeat replaces what the kill left
    assert {p.name: p.read_bytes() for p in (packed / "results").iterdir()} == results[packed]
    assert not (packed / "results.partial").exists()
