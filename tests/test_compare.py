"""`gspo compare` on hand-written run directories: every number checked against hand values."""

from __future__ import annotations

import csv
import io
import json
import math
import subprocess
import sys

import numpy as np
import pytest
from synthetic_runs import make_experiment
from typer.testing import CliRunner

from gspo_cli.analysis.rundata.runs import ema
from gspo_cli.analysis.stats import t975
from gspo_cli.analysis.stats.seeds import seed_stats
from gspo_cli.analysis.tables.compare import compare_runs, render
from gspo_cli.cli.app import app
from gspo_cli.errors import SpecError

runner = CliRunner()
T2 = 4.302653  # t_{0.975} with 2 degrees of freedom (3 seeds), printed tables round it to 4.303


@pytest.fixture(scope="module")
def exp(tmp_path_factory):
    return make_experiment(tmp_path_factory.mktemp("runs"))


def _compare_json(exp, *args):
    res = runner.invoke(app, ["compare", str(exp), "--format", "json", *args])
    assert res.exit_code == 0, res.output
    return {g["group"]: g for g in json.loads(res.stdout)["groups"]}, json.loads(res.stdout)


def test_t_quantiles_match_tables():
    # scipy's quantiles against published tables
    for df, t in ((1, 12.706), (2, 4.303), (30, 2.042), (40, 2.0211), (60, 2.0003), (120, 1.9799), (10_000, 1.9602)):
        assert t975(df) == pytest.approx(t, abs=1e-3)
    assert math.isnan(t975(0))


def test_seed_stats_by_hand():
    st = seed_stats([0.5, 0.6, 0.7, float("nan")])  # NaN = a seed without the value
    assert st.n == 3 and st.mean == pytest.approx(0.6) and st.std == pytest.approx(0.1)
    assert st.ci95 == pytest.approx(T2 * 0.1 / math.sqrt(3))
    lone = seed_stats([0.3])
    assert lone.mean == 0.3 and math.isnan(lone.ci95)


def test_ema_is_debiased_and_skips_nan():
    out = ema(np.array([1.0, np.nan, 3.0]), 0.5)
    # step 1: 0.5*1 / 0.5 = 1; step 3: (0.25 + 1.5) / 0.75
    assert out[0] == 1.0 and math.isnan(out[1]) and out[2] == pytest.approx(1.75 / 0.75)
    assert np.array_equal(ema(np.array([1.0, 2.0]), 0.0), [1.0, 2.0])


def test_json_means_std_ci_and_status(exp):
    groups, doc = _compare_json(exp, "--last", "5", "--threshold", "0.38")
    assert list(groups) == ["grpo", "gspo"]
    gspo, grpo = groups["gspo"]["metrics"], groups["grpo"]["metrics"]
    # Last-5 reward: gspo seeds 0.5, 0.6, 0.7; grpo 0.2, 0.3 (running, 12 steps), 0.45.
    assert gspo["reward"]["mean"] == pytest.approx(0.6)
    assert gspo["reward"]["std"] == pytest.approx(0.1)
    assert gspo["reward"]["ci95"] == pytest.approx(T2 * 0.1 / math.sqrt(3))
    r = [0.2, 0.3, 0.45]
    assert grpo["reward"]["mean"] == pytest.approx(np.mean(r))
    assert grpo["reward"]["ci95"] == pytest.approx(T2 * np.std(r, ddof=1) / math.sqrt(3))
    # Token clip fraction, mean over all steps of each seed.
    assert gspo["clip"]["mean"] == pytest.approx(0.2) and grpo["clip"]["mean"] == pytest.approx(0.005 / 3)
    assert gspo["clip_low"]["mean"] == pytest.approx(0.1)
    # The torn 13th line of the running seed is ignored: 20, 12, 20 steps.
    assert grpo["steps"]["mean"] == pytest.approx(52 / 3)
    assert groups["grpo"]["status"] == {"completed": 1, "running": 1, "diverged": 1}
    assert groups["gspo"]["status"] == {"completed": 3}
    assert groups["gspo"]["seeds"] == [0, 1, 2]
    assert any("grpo/seed1: running at step 12/20" in n for n in doc["notes"])
    assert any("grpo/seed2: diverged" in n for n in doc["notes"])


def test_threshold_steps_and_time(exp):
    groups, _ = _compare_json(exp, "--last", "5", "--threshold", "0.38")
    gspo, grpo = groups["gspo"]["metrics"], groups["grpo"]["metrics"]
    # gspo seed k: zeros up to step 5+k, then c_k; the 5-step mean first reaches 0.38 at
    # steps 9 (4 x 0.5 / 5), 10 (4 x 0.6 / 5) and 10 (3 x 0.7 / 5); elapsed time = 2 x step.
    assert gspo["threshold_step"]["mean"] == pytest.approx(29 / 3)
    assert gspo["threshold_step"]["n"] == 3
    assert gspo["threshold_time"]["mean"] == pytest.approx(58 / 3)
    # grpo: only seed 2 (0.45) gets there, at the first full window.
    assert grpo["threshold_step"] == {"mean": 5.0, "std": None, "ci95": None, "n": 1}
    assert grpo["threshold_time"]["mean"] == 10.0


def test_eval_best_and_final(exp):
    groups, doc = _compare_json(exp, "--metrics", "eval")
    gspo = groups["gspo"]["metrics"]
    assert gspo["eval_best:arith"]["mean"] == pytest.approx(0.4)
    assert gspo["eval_final:arith"]["mean"] == pytest.approx(0.3)
    assert groups["grpo"]["metrics"]["eval_best:arith"]["n"] == 0
    assert [c["label"] for c in doc["columns"]] == ["arith avg@4 best", "arith avg@4 final"]


def test_csv_columns_and_values(exp):
    res = runner.invoke(app, ["compare", str(exp), "-f", "csv", "-m", "reward,clip", "--last", "5"])
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader(io.StringIO(res.stdout)))
    assert [r["group"] for r in rows] == ["grpo", "gspo"]
    gspo = rows[1]
    assert float(gspo["reward_mean"]) == pytest.approx(0.6)
    assert float(gspo["reward_ci95"]) == pytest.approx(T2 * 0.1 / math.sqrt(3))
    assert gspo["reward_n"] == "3" and gspo["seeds"] == "3"
    assert rows[0]["status"] == "1 completed, 1 running, 1 diverged"
    assert list(rows[0]) == [
        "group",
        "seeds",
        "status",
        "algorithm",
        "routing_replay",
        "mismatch",
        "reward_mean",
        "reward_std",
        "reward_ci95",
        "reward_n",
        "clip_mean",
        "clip_std",
        "clip_ci95",
        "clip_n",
    ]


def test_table_markdown_and_out_file(exp, tmp_path):
    comp = compare_runs([str(exp)], last=5, threshold=0.38)
    md = render(comp, "markdown")
    assert md.startswith("| arm | seeds | status |")
    assert "0.6 ± 0.25" in md and "5 (1/3)" in md  # grpo's threshold step: one seed of three
    table = render(comp, "table")
    assert "KL" not in table  # no run logs it: dropped from the default columns
    assert "1 completed, 1 running, 1 diverged" in table
    out = tmp_path / "cmp.md"
    res = runner.invoke(app, ["compare", str(exp), "-f", "markdown", "--out", str(out), "--last", "5"])
    assert res.exit_code == 0 and out.read_text().startswith("| arm |")


def test_group_by_spec_field(exp):
    groups, _ = _compare_json(exp, "--group-by", "clip_high", "-m", "reward")
    assert list(groups) == ["clip_high=0.0004", "clip_high=0.27"]  # numeric order
    groups, _ = _compare_json(exp, "--group-by", "rollout.group_size", "-m", "reward")
    assert list(groups) == ["group_size=2"] and len(groups["group_size=2"]["seeds"]) == 6


def test_run_without_metrics_yet(tmp_path):
    d = tmp_path / "e" / "a" / "seed0"
    d.mkdir(parents=True)
    (d / "run.json").write_text('{"status": "running", "arm": "a", "seed": 0}')
    res = runner.invoke(app, ["compare", str(tmp_path), "-f", "markdown", "-m", "steps,reward"])
    assert res.exit_code == 0, res.output
    assert "| a | 1 | running | — | — | — | 0 | — |" in res.stdout and "e/a/seed0: running at step 0/?" in res.stdout


def test_globs_and_single_run_dirs(exp):
    res = runner.invoke(app, ["compare", str(exp / "gs*" / "seed*"), "-f", "json", "-m", "reward"])
    assert res.exit_code == 0, res.output
    assert [g["group"] for g in json.loads(res.stdout)["groups"]] == ["gspo"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["/nonexistent/dir"], "no such file or directory"),
        (["{tmp}"], "no run directories"),
        (["{exp}", "-m", "reward,bogus"], "unknown metric 'bogus'"),
        (["{exp}", "--group-by", "nosuch.field"], "'nosuch.field' is not a field"),
        (["{exp}", "-m", "threshold"], "needs --threshold"),
        (["{exp}", "-f", "xml"], "unknown format"),
    ],
)
def test_bad_input_is_one_line_exit_2(exp, tmp_path, args, message):
    res = runner.invoke(app, ["compare", *(a.format(tmp=tmp_path, exp=exp) for a in args)])
    assert res.exit_code == 2
    assert message in res.stderr and len(res.stderr.strip().splitlines()) == 1
    with pytest.raises(SpecError):
        compare_runs([str(tmp_path)])


def test_compare_and_plot_never_import_torch(exp):
    code = (
        "import sys, gspo_cli.analysis.tables.compare, gspo_cli.analysis.figures.plot\n"
        "import gspo_cli.train.sinks, gspo_cli.cli.app\n"
        "from typer.testing import CliRunner\n"
        f"r = CliRunner().invoke(gspo_cli.cli.app.app, ['compare', {str(exp)!r}, '-f', 'csv'])\n"
        "assert r.exit_code == 0, r.output\n"
        "bad = [m for m in ('torch', 'transformers') if m in sys.modules]\n"
        "assert not bad, bad"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0, res.stderr
