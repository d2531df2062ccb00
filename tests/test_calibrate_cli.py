"""`make calibrate ARGS=--report-only`: it never rewrites the report from runs that are not
calibration runs, and keeps a report edited by hand."""

from __future__ import annotations

import json

import yaml

from benchmarks import calibrate


def _foreign_run(root, arm: str, seed: int) -> None:
    d = root / "results" / "calibration" / arm / f"seed{seed}"
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"status": "completed", "arm": arm, "seed": seed}))
    other = {"name": "quick", "arms": [{"name": arm, "preset": "paper-gspo"}], "seeds": [seed]}
    (d / "spec.yaml").write_text(yaml.safe_dump(other))


def test_report_only_refuses_runs_of_another_spec_and_leaves_the_report(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # the calibration spec's output_dir (results) is relative
    _foreign_run(tmp_path, "gspo_a", 0)
    _foreign_run(tmp_path, "gspo_b", 12)  # a whole A/A pair at the planned paths, of another spec
    out = tmp_path / "results" / "calibration"
    (out / "REPORT.md").write_text("# my calibration notes\n")
    assert calibrate.main(["--report-only", "--out", str(out)]) == 2
    assert "no completed A/A pair of calibration runs under" in capsys.readouterr().err
    assert (out / "REPORT.md").read_text() == "# my calibration notes\n"
    assert not (out / "calibration.json").exists()


def test_the_makefile_passes_report_only_through_args():
    from pathlib import Path

    make = (Path(calibrate.__file__).parents[1] / "Makefile").read_text()
    assert "$(BIN)/python -m benchmarks.calibrate --budget-min 65 $(EXECUTOR_FLAG) $(ARGS)" in make


def test_a_signal_between_batches_starts_no_more_runs(tmp_path, monkeypatch):
    import time

    from gspo_cli.train import sweep as sw
    from gspo_cli.train.watch import StopFlag

    monkeypatch.chdir(tmp_path)
    started = []
    monkeypatch.setattr(sw, "run_plan", lambda batch, **kw: started.append(batch) or [])
    stop = StopFlag()
    tr = calibrate.Trainer(calibrate.SPEC, 2, time.time() + 600, tmp_path, stop)
    assert tr.train([("gspo_a", 0), ("gspo_b", 12)]) and len(started) == 1  # no signal: the batch runs
    stop.set("SIGTERM")
    assert tr.train([("gspo_a", 1), ("gspo_b", 13)]) is False and len(started) == 1
