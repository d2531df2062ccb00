"""Every spec value a study depends on is checked before the first run trains: the comparison's
metric and margin (`sweep --until-decided`), `compare --margin` and `plot --margin`."""

from __future__ import annotations

import pytest
import yaml
from helpers import TINY
from synthetic_runs import make_experiment
from typer.testing import CliRunner

from gspo_cli.cli.app import app
from gspo_cli.metrics import is_known
from gspo_cli.train import sweep as sw

runner = CliRunner()
ARMS = [{"name": "grpo", "preset": "paper-grpo"}, {"name": "gspo", "preset": "paper-gspo"}]


def _decide(tmp_path, monkeypatch, **comparison):
    def no_training(*a, **k):
        raise AssertionError("a round trained before the comparison was checked")

    monkeypatch.setattr(sw, "run_plan", no_training)
    spec = tmp_path / "exp.yaml"
    raw = {**TINY, "name": "exp", "output_dir": str(tmp_path), "arms": ARMS, "comparison": comparison}
    spec.write_text(yaml.safe_dump(raw))
    return runner.invoke(app, ["sweep", str(spec), "--until-decided", "--max-seeds", "4"])


def test_an_unknown_comparison_metric_is_refused_before_any_round(tmp_path, monkeypatch):
    res = _decide(tmp_path, monkeypatch, baseline="grpo", arm="gspo", metric="acuracy")
    assert res.exit_code == 2, res.output
    assert res.stderr.startswith("error: comparison.metric: 'acuracy' is no metric a run writes")


@pytest.mark.parametrize("margin", [float("inf"), 1e300])
def test_an_impossible_comparison_margin_is_refused_before_any_round(tmp_path, monkeypatch, margin):
    res = _decide(tmp_path, monkeypatch, baseline="grpo", arm="gspo", margin=margin)
    assert res.exit_code == 2, res.output
    assert res.stderr.startswith("error: comparison.margin: ")


def test_known_metric_names():
    for key in ("avg@4", "pass@8", "maj@16", "reward_mean", "reward/mean", "policy/loss", "eval/aime/avg@4"):
        assert is_known(key), key
    for key in ("acuracy", "reward/mean/x", "policy/lossy", "avg4"):
        assert not is_known(key), key


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("nan", "--margin: nan is not a finite number"),
        ("inf", "--margin: inf is not a finite number"),
        ("1e300", "--margin: 1e+300 is outside [0, 1e+06)"),
    ],
)
def test_compare_and_plot_refuse_a_margin_that_decides_everything(tmp_path, value, says):
    exp = make_experiment(tmp_path)
    for cmd in (["compare", str(exp), "--baseline", "grpo"], ["plot", str(exp), "-o", str(tmp_path / "f")]):
        res = runner.invoke(app, [*cmd, "--margin", value])
        assert res.exit_code == 2, res.output
        assert res.stderr.strip() == f"error: {says} (a margin in the metric's units, e.g. 0.02" + (
            ")" if "finite" in says else ": one this wide calls any two arms equivalent)"
        )
