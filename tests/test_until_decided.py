"""The spec's `comparison` section and `gspo sweep --until-decided` on synthetic runs: training
is replaced by writing run directories with known final held-out scores."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from helpers import TINY
from synthetic_runs import write_run
from typer.testing import CliRunner

from gspo_cli.cli.app import app
from gspo_cli.errors import RunError, SpecError
from gspo_cli.spec.loading import same_spec, spec_from_dict
from gspo_cli.train import sweep as sw
from gspo_cli.train.loop import run_spec

ARMS = [
    {"name": "grpo", "preset": "paper-grpo", "mini_batches": 2},
    {"name": "gspo", "preset": "paper-gspo", "mini_batches": 2},
]


def spec_dict(tmp: Path, **comparison) -> dict:
    return {**TINY, "name": "exp", "output_dir": str(tmp), "seeds": [0, 1, 2], "arms": ARMS, "comparison": comparison}


# --- the comparison section ------------------------------------------------------------------


def test_comparison_names_two_arms_of_the_experiment(tmp_path):
    spec = spec_from_dict(spec_dict(tmp_path, baseline="grpo", arm="gspo", margin=0.02))
    assert (spec.comparison.baseline, spec.comparison.arm, spec.comparison.metric, spec.comparison.margin) == (
        "grpo",
        "gspo",
        None,
        0.02,
    )
    for bad, says in (
        ({"baseline": "grpo", "arm": "gpso"}, "comparison.arm: no arm named 'gpso' (did you mean 'gspo'?)"),
        ({"baseline": "grpo", "arm": "gspo", "margin": -0.1}, "comparison.margin"),
        ({"baseline": "gspo", "arm": "gspo"}, "comparison.arm: 'gspo' is also the baseline"),
        ({"baseline": "grpo", "arm": "gspo", "alpha": 0.1}, "comparison.alpha"),
    ):
        with pytest.raises(SpecError, match=None) as err:
            spec_from_dict(spec_dict(tmp_path, **bad))
        assert says in str(err.value)


def test_a_runs_own_spec_keeps_the_comparison_and_changing_it_changes_no_run(tmp_path):
    spec = spec_from_dict(spec_dict(tmp_path, baseline="grpo", arm="gspo"))
    own = run_spec(spec, spec.arms[1], 0)
    reloaded = spec_from_dict(own.to_dict())  # a run's spec.yaml: one arm, still valid
    assert reloaded.comparison == spec.comparison
    other = spec_from_dict({**spec_dict(tmp_path, baseline="gspo", arm="grpo", margin=0.05)})
    assert same_spec(yaml.safe_dump(own.to_dict()), run_spec(other, other.arms[1], 0))  # analysis, not training


# --- --until-decided -------------------------------------------------------------------------

# Per-seed baselines that spread widely (0.1 .. 0.6) and a constant shift between the arms: a paired
# design sees the shift at once, where the seeds' spread would hide it from an unpaired one.
BASE = [0.1, 0.6, 0.3, 0.5, 0.2, 0.4, 0.15, 0.55, 0.35, 0.25]
NOISE = [0.004, -0.003, 0.002, -0.001, 0.003, -0.004, 0.001, -0.002, 0.0, 0.002]


def fake_training(monkeypatch, root: Path, shift: float) -> list[tuple[str, int]]:
    """Replace training: each planned run becomes a completed synthetic run whose final avg@4 is
    BASE[seed] (+ shift + NOISE[seed] for gspo). Returns the runs 'trained', in order."""
    trained: list[tuple[str, int]] = []

    def run_plan(runs, *, jobs, force, log, executor=None, stop=None):
        out = []
        for r in runs:
            skipped = (r.path / "run.json").is_file()
            if not skipped:
                final = BASE[r.seed] + (shift + NOISE[r.seed] if r.name == "gspo" else 0.0)
                evals = [
                    {"step": s, "task": "arith", "n": 4, "samples": 4, "scores": {"avg@4": v}}
                    for s, v in ((0, 0.1), (2, final))
                ]
                write_run(root, r.name, r.seed, [], evals=evals)
                trained.append((r.name, r.seed))
            out.append(
                {
                    "run": r.name,
                    "seed": r.seed,
                    "status": "completed",
                    "exit": 0,
                    "wall_s": 0,
                    "path": str(r.path),
                    "skipped": skipped,
                }
            )
        return out

    monkeypatch.setattr(sw, "run_plan", run_plan)
    return trained


def until_decided(tmp_path: Path, *extra: str, **comparison):
    spec = tmp_path / "exp.yaml"
    spec.write_text(yaml.safe_dump(spec_dict(tmp_path, **comparison)))
    return CliRunner().invoke(app, ["sweep", str(spec), "--until-decided", "--json", "-q", *extra])


def test_a_clear_difference_stops_early_and_a_rerun_resumes_to_the_same_verdict(tmp_path, monkeypatch):
    trained = fake_training(monkeypatch, tmp_path, shift=0.05)
    res = until_decided(tmp_path, "--max-seeds", "10", baseline="grpo", arm="gspo")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["verdict"] == "better" and out["metric"] == "avg@4" and out["higher_is_better"]
    n = out["looks"][-1]["n"]
    assert 3 <= n < 10 and out["seeds"] == list(range(n))  # stopped before --max-seeds
    assert [lk["verdict"] for lk in out["looks"]] == ["continue"] * (n - 3) + ["better"]
    assert out["looks"][-1]["delta"] == pytest.approx(0.05 + sum(NOISE[:n]) / n)
    assert sorted(trained) == sorted((a, s) for a in ("grpo", "gspo") for s in range(n))  # only the two arms
    assert len(out["runs"]) == 2 * n and all(r["status"] == "completed" for r in out["runs"])
    assert json.loads((tmp_path / "exp" / "until_decided.json").read_text())["verdict"] == "better"
    trained.clear()
    again = json.loads(until_decided(tmp_path, "--max-seeds", "10", baseline="grpo", arm="gspo").stdout)
    assert trained == [] and again["looks"] == out["looks"]  # completed runs skipped, looks replayed


def test_the_decision_file_holds_every_look_made_before_a_round_failed(tmp_path, monkeypatch):
    fake_training(monkeypatch, tmp_path, shift=0.0)
    trains = sw.run_plan

    def second_round_dies(runs, **kw):  # the first look's seeds train, the next round's do not
        if max(r.seed for r in runs) > 2:
            raise RunError("--until-decided: a run of this round did not complete")
        return trains(runs, **kw)

    monkeypatch.setattr(sw, "run_plan", second_round_dies)
    res = until_decided(tmp_path, "--max-seeds", "10", baseline="grpo", arm="gspo")
    assert res.exit_code == 1, res.output
    written = json.loads((tmp_path / "exp" / "until_decided.json").read_text())
    assert [lk["n"] for lk in written["looks"]] == [3] and written["looks"][0]["verdict"] == "continue"


def test_the_same_seeds_welch_would_not_resolve(tmp_path, monkeypatch):
    from scipy import stats

    fake_training(monkeypatch, tmp_path, shift=0.05)
    out = json.loads(until_decided(tmp_path, "--max-seeds", "10", baseline="grpo", arm="gspo").stdout)
    n = out["looks"][-1]["n"]
    gspo = [BASE[s] + 0.05 + NOISE[s] for s in range(n)]
    welch = stats.ttest_ind(gspo, BASE[:n], equal_var=False)
    assert welch.pvalue > 0.3  # unpaired, the seeds' spread hides the shift the paired looks found


def test_no_difference_goes_to_max_seeds_or_shows_equivalence_with_a_margin(tmp_path, monkeypatch):
    trained = fake_training(monkeypatch, tmp_path, shift=0.0)
    out = json.loads(until_decided(tmp_path, "--max-seeds", "5", baseline="grpo", arm="gspo").stdout)
    assert out["verdict"] == "not resolved" and out["looks"][-1]["n"] == 5 and len(trained) == 10
    # A margin added after looking changes the stopping rule: refused, and the record stays
    res = until_decided(tmp_path, "--max-seeds", "5", baseline="grpo", arm="gspo", margin=0.02)
    assert res.exit_code == 2 and "records a decision under another design (margin None there, 0.02 now" in res.output
    assert json.loads((tmp_path / "exp" / "until_decided.json").read_text())["margin"] is None
    # With the record moved away, the same runs with a margin of 0.02: the differences (|noise| <
    # 0.005) are shown to lie within it.
    (tmp_path / "exp" / "until_decided.json").unlink()
    out = json.loads(until_decided(tmp_path, "--max-seeds", "5", baseline="grpo", arm="gspo", margin=0.02).stdout)
    assert out["verdict"] == "equivalent" and len(trained) == 10  # decided from the runs already there


def test_round_seeds_and_mistakes(tmp_path, monkeypatch):
    fake_training(monkeypatch, tmp_path, shift=0.05)
    out = json.loads(
        until_decided(tmp_path, "--max-seeds", "9", "--round-seeds", "3", baseline="grpo", arm="gspo").stdout
    )
    assert out["schedule"] == [3, 6, 9] and out["looks"][-1]["n"] in (6, 9)
    for args, says in (
        ((), "--max-seeds N"),
        (("--max-seeds", "2"), "--max-seeds: max_seeds (2) must be at least 3"),
        (("--max-seeds", "5", "--force"), "not with --force"),
    ):
        res = until_decided(tmp_path, *args, baseline="grpo", arm="gspo")
        assert res.exit_code == 2 and says in res.output and "Traceback" not in res.output
    spec = tmp_path / "none.yaml"
    spec.write_text(yaml.safe_dump({**spec_dict(tmp_path), "comparison": None}))
    res = CliRunner().invoke(app, ["sweep", str(spec), "--until-decided", "--max-seeds", "4"])
    assert res.exit_code == 2 and "no comparison section" in res.output
    res = CliRunner().invoke(app, ["sweep", str(spec), "--max-seeds", "4"])
    assert res.exit_code == 2 and "go with --until-decided" in res.output


def test_the_table_and_summary_without_a_margin(tmp_path, monkeypatch):
    fake_training(monkeypatch, tmp_path, shift=0.0)
    spec = tmp_path / "exp.yaml"
    spec.write_text(yaml.safe_dump(spec_dict(tmp_path, baseline="grpo", arm="gspo")))
    res = CliRunner().invoke(app, ["sweep", str(spec), "--until-decided", "--max-seeds", "4", "-q"])
    assert res.exit_code == 0, res.output
    assert "gspo vs grpo: not resolved at 4 seeds on avg@4 (higher is better)" in res.stdout


def test_the_design_lives_in_the_spec_and_a_dry_run_prints_the_looks(tmp_path, monkeypatch):
    trained = fake_training(monkeypatch, tmp_path, shift=0.05)
    spec = tmp_path / "exp.yaml"
    spec.write_text(yaml.safe_dump(spec_dict(tmp_path, baseline="grpo", arm="gspo", max_seeds=7, round_seeds=2)))
    res = CliRunner().invoke(app, ["sweep", str(spec), "--until-decided", "--dry-run", "--json"])
    assert res.exit_code == 0, res.output
    plan = json.loads(res.stdout)
    assert [lk["seeds"] for lk in plan["looks"]] == [3, 5, 7] and plan["design_from"] == "spec"
    bounds = [lk["boundary"] for lk in plan["looks"]]
    assert bounds == sorted(bounds, reverse=True) and bounds[-1] > 2.447  # the last look: above t_0.975,6
    assert trained == []  # nothing trained
    text = CliRunner().invoke(app, ["sweep", str(spec), "--until-decided", "--dry-run"]).stdout
    assert "boundary |t| >=" in text and "up to 7 seeds per arm, 2 more per round (design from the spec)" in text
    res = CliRunner().invoke(app, ["sweep", str(spec), "--until-decided", "--max-seeds", "9"])
    assert res.exit_code == 2 and "--max-seeds 9: the spec's comparison fixes max_seeds: 7" in res.output
    out = json.loads(CliRunner().invoke(app, ["sweep", str(spec), "--until-decided", "--json", "-q"]).stdout)
    assert out["schedule"] == [3, 5, 7] and out["design_from"] == "spec"
    assert all(lk["boundary"] > 0 and lk["method"].startswith("paired t") for lk in out["looks"])  # no records here


def test_compare_and_report_show_the_sequential_decision_beside_the_fixed_design_row(tmp_path, monkeypatch):
    fake_training(monkeypatch, tmp_path, shift=0.05)
    out = json.loads(until_decided(tmp_path, "--max-seeds", "10", baseline="grpo", arm="gspo").stdout)
    last = out["looks"][-1]
    res = CliRunner().invoke(app, ["compare", str(tmp_path / "exp"), "--baseline", "grpo", "-f", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    (seq,) = doc["sequential"]
    assert seq["verdict"] == "better" and seq["looks"] == out["looks"]
    line = next(n for n in doc["difference_notes"] if n.startswith("Sequential decision"))
    assert f"look {len(out['looks'])} of at most 8 at {last['n']} seeds, boundary |t| >= " in line
    assert f"[{last['ci_low']:+.4f}, {last['ci_high']:+.4f}]" in line and line.endswith("one look at the same runs.")
    text = CliRunner().invoke(app, ["compare", str(tmp_path / "exp"), "--baseline", "grpo"]).stdout
    assert "Sequential decision (gspo sweep --until-decided" in text
    res = CliRunner().invoke(app, ["report", str(tmp_path / "exp")])
    assert res.exit_code == 0, res.output
    assert "- Sequential decision (gspo sweep --until-decided" in (tmp_path / "exp" / "REPORT.md").read_text()
