"""`gspo compare --baseline`: the differences table on synthetic run directories with known effects."""

from __future__ import annotations

import csv
import io
import json

import pytest
from synthetic_runs import make_experiment, make_problem_experiment
from typer.testing import CliRunner

from gspo_cli.analysis.tables.differences import COLUMNS
from gspo_cli.cli.app import app

runner = CliRunner()


def _json(path, *args) -> dict:
    res = runner.invoke(app, ["compare", str(path), "--format", "json", *args])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def _rows(doc: dict) -> dict[tuple[str, str], dict]:
    return {(d["arm"], d["metric"]): d for d in doc["differences"]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """grpo (baseline), gspo +0.25 (clear), cispo +0.0: 4 seeds x 60 problems x 4 samples."""
    arms = {"grpo": 0.0, "gspo": 0.25, "cispo": 0.0}
    return make_problem_experiment(tmp_path_factory.mktemp("p"), arms=arms, seeds=(0, 1, 2, 3), problems=60)


def test_json_differences_from_problem_records(runs):
    doc = _json(runs, "--baseline", "grpo", "-m", "eval_final,reward")
    rows = _rows(doc)
    assert set(rows) == {(a, m) for a in ("gspo", "cispo") for m in ("eval_final:arith", "reward")}
    d = rows[("gspo", "eval_final:arith")]
    assert set(COLUMNS) <= set(d) and d["baseline"] == "grpo" and d["direction"] == "higher is better"
    # the seeds' paired t is wider than the two-level interval on these runs, so it is taken
    assert d["method"] == "seeds t + problem bootstrap, 4 seeds x 60 problems (the seeds' paired t, wider here)"
    assert d["verdict"] == "better" and 0 < d["ci_low"] < d["delta"] < d["ci_high"]
    assert sum(d["variance_shares"].values()) == pytest.approx(1.0)
    # the held-out difference equals the difference of the arms' mean scores (table above)
    means = {g["group"]: g["metrics"]["eval_final:arith"]["mean"] for g in doc["groups"]}
    assert d["delta"] == pytest.approx(means["gspo"] - means["grpo"])
    assert rows[("gspo", "reward")]["method"] == "paired t, 4 seeds"
    c = rows[("cispo", "eval_final:arith")]
    assert c["verdict"] == "not resolved" and c["resolve"]
    # Holm over the 4 rows: the adjusted p is at least the raw one, and reproducible
    assert _json(runs, "--baseline", "grpo", "-m", "eval_final,reward")["differences"] == doc["differences"]


def test_margin_gives_equivalence_and_the_seeds_it_needs(tmp_path):
    exp = make_problem_experiment(
        tmp_path,
        arms={"grpo": 0.0, "gspo": 0.0},
        seeds=tuple(range(8)),
        problems=200,
        samples=8,
        sd_seed=0.0,
        sd_problem=0.0,
    )
    d = _rows(_json(exp, "--baseline", "grpo", "--margin", "0.1", "-m", "eval_final"))[("gspo", "eval_final:arith")]
    assert d["verdict"] == "equivalent" and -0.1 < d["ci_low"] and d["ci_high"] < 0.1
    no_margin = _rows(_json(exp, "--baseline", "grpo", "-m", "eval_final"))[("gspo", "eval_final:arith")]
    assert no_margin["verdict"] == "not resolved"


def test_old_runs_without_problem_records_still_compare(tmp_path):
    exp = make_problem_experiment(tmp_path, arms={"grpo": 0.0, "gspo": 0.25}, records=False)
    d = _rows(_json(exp, "--baseline", "grpo", "-m", "eval_final"))[("gspo", "eval_final:arith")]
    assert d["method"] == "paired t, 3 seeds (no problem records)" and d["variance_shares"] is None
    old = _rows(_json(make_experiment(tmp_path / "old"), "--baseline", "grpo"))  # grpo has no evaluations
    assert old[("gspo", "eval_final:arith")]["method"] == "no values: 3 vs 0 seeds have one"
    assert old[("gspo", "reward")]["verdict"] == "better"


def test_unpaired_seeds_fall_back_on_welch(tmp_path):
    make_problem_experiment(tmp_path, arms={"grpo": 0.0}, seeds=(0, 1, 2), rng_seed=1)
    exp = make_problem_experiment(tmp_path, arms={"gspo": 0.2}, seeds=(3, 4, 5), rng_seed=2)
    d = _rows(_json(exp, "--baseline", "grpo", "-m", "eval_final"))[("gspo", "eval_final:arith")]
    assert d["method"] == "Welch, 3 vs 3 seeds (no seed in common)" and d["n_paired"] == 0


def test_csv_markdown_table_pairs_and_robust(runs):
    res = runner.invoke(app, ["compare", str(runs), "--baseline", "grpo", "-f", "csv", "-m", "eval_final"])
    rows = list(csv.DictReader(io.StringIO(res.stdout)))
    assert res.exit_code == 0 and list(rows[0])[: len(COLUMNS)] == list(COLUMNS) and len(rows) == 2
    md = runner.invoke(app, ["compare", str(runs), "--baseline", "grpo", "-f", "markdown", "-m", "eval_final"]).stdout
    assert "| arm | baseline | metric | difference | 95% CI | method | verdict | adj. p | seeds needed |" in md
    assert "variance from seeds at least " in md and "sampling at most " in md and "(95% intervals; " in md
    table = runner.invoke(app, ["compare", str(runs), "--baseline", "grpo", "-m", "eval_final"]).stdout
    assert "differences from the baseline" in table and "gspo − grpo" in table
    pairs = _json(runs, "--pairs", "-m", "eval_final", "--robust")["differences"]
    assert {(d["arm"], d["baseline"]) for d in pairs} == {("gspo", "cispo"), ("grpo", "cispo"), ("gspo", "grpo")}
    assert all(0 <= d["prob_improvement"] <= 1 and d["iqm_arm"] is not None for d in pairs)


def test_spec_comparison_section_sets_baseline_and_margin(tmp_path):
    exp = make_problem_experiment(
        tmp_path,
        arms={"grpo": 0.0, "gspo": 0.25},
        comparison={"baseline": "grpo", "arm": "gspo", "metric": None, "margin": 0.5},
    )
    rows = _json(exp)["differences"]
    assert {d["baseline"] for d in rows} == {"grpo"} and {d["margin"] for d in rows} == {0.5}


@pytest.mark.parametrize(
    "args,message",
    [
        (["--baseline", "nope"], "--baseline: no arm 'nope' among the runs (arms: cispo, grpo, gspo)"),
        (["--baseline", "grpo", "--margin", "-1"], "--margin: must be >= 0, got -1"),
    ],
)
def test_user_mistakes_are_one_line(runs, args, message):
    res = runner.invoke(app, ["compare", str(runs), *args])
    assert res.exit_code == 2 and res.stderr.strip() == f"error: {message}"


def test_plot_writes_the_differences_figure(runs, tmp_path):
    res = runner.invoke(
        app, ["plot", str(runs), "--baseline", "grpo", "--margin", "0.05", "--no-panel", "-o", str(tmp_path)]
    )
    assert res.exit_code == 0, res.output
    fig = tmp_path / "differences.png"
    assert str(fig) in res.stdout.splitlines() and fig.stat().st_size > 5000
    plain = tmp_path / "plain"
    assert runner.invoke(app, ["plot", str(runs), "--no-panel", "-o", str(plain)]).exit_code == 0
    assert not (plain / "differences.png").exists()  # no baseline given, none in the spec
    bad = runner.invoke(app, ["plot", str(runs), "--baseline", "nope", "-o", str(plain)])
    assert bad.exit_code == 2 and bad.stderr.startswith("error: --baseline: no arm 'nope'")


def test_report_findings_use_problem_records_and_say_what_would_resolve(tmp_path):
    """GSPO +0.25 on the held-out set (clear), the train reward equal to the held-out score: the
    report's finding 1 is paired, from problem records for the held-out score, Holm over the
    findings; a difference left unresolved says what would resolve it."""
    from gspo_cli.analysis.report.build import write_report

    exp = make_problem_experiment(
        tmp_path / "a",
        arms={"grpo": 0.0, "gspo": 0.25},
        seeds=(0, 1, 2, 3),
        problems=60,
        arm_fields={"mini_batches": 4},
    )
    text = write_report(exp).read_text()
    assert "**1. GSPO learns more per step than GRPO — holds.**" in text
    assert "(significant; seeds t + problem bootstrap, 4 seeds x 60 problems (the seeds' paired t" in text
    assert "Holm's step-down" in text
    small = make_problem_experiment(
        tmp_path / "b", arms={"grpo": 0.0, "gspo": 0.02}, problems=60, arm_fields={"mini_batches": 4}, rng_seed=3
    )
    text = write_report(small).read_text()
    assert "**1. GSPO learns more per step than GRPO — not resolved.**" in text
    # here the observed difference is +0.0014: more than 1000 seeds; and more seeds help most
    assert "a difference of +0.00139 needs more than 1000 seeds" in text
    assert "doubling the seeds by 50% [39%, 50%], the problems by 25% [7%, 50%] (95% intervals); doubling the " in text
    assert "samples per problem by at most 25% (a bound:" in text and "; most: more seeds" in text


def test_metrics_chosen_with_m_are_the_family(runs):
    doc = _json(runs, "--baseline", "grpo", "-m", "reward,wall")
    assert {(d["arm"], d["metric"]) for d in doc["differences"]} == {
        (a, m) for a in ("gspo", "cispo") for m in ("reward", "wall")
    }
    assert {d["direction"] for d in doc["differences"] if d["metric"] == "wall"} == {"lower is better"}
    default = _json(runs, "--baseline", "grpo")  # no -m: held-out final score and train reward
    assert {d["metric"] for d in default["differences"]} == {"eval_final:arith", "reward"}
