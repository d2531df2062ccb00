"""Which way is better is defined once (metrics.direction): compare's differences and
--until-decided read the same direction for a metrics.jsonl key."""

from __future__ import annotations

import json

import pytest
from helpers import TINY
from synthetic_runs import write_run
from typer.testing import CliRunner

from gspo_cli.analysis.tables.differences import metric_direction
from gspo_cli.metrics import direction
from gspo_cli.runs import run_path
from gspo_cli.spec.loading import spec_from_dict
from gspo_cli.train.until_decided import decide_until

ARMS = [{"name": "grpo", "preset": "paper-grpo"}, {"name": "gspo", "preset": "paper-gspo"}]


@pytest.mark.parametrize(
    ("key", "want"),
    [
        ("policy/loss", -1),
        ("time/elapsed_s", -1),
        ("policy/kl_old_k3", -1),
        ("reward/mean", 1),
        ("reward/std", 0),
        ("avg@4", 1),
        ("eval/aime/pass@8", 1),
        ("timeout_frac", -1),
        ("policy/entropy", 0),
        ("response/length_mean", 0),
    ],
)
def test_one_direction_per_key(key, want):
    assert direction(key) == want
    if "/" in key:
        assert metric_direction(key) == want  # compare's column of that key


def test_compare_calls_a_lower_loss_and_a_shorter_time_lower_is_better(tmp_path):
    for arm, loss, t in (("grpo", 0.5, 100.0), ("gspo", 0.3, 80.0)):
        for seed in range(3):
            recs = [{"step": s, "policy/loss": loss + 0.01 * seed, "time/elapsed_s": t * s} for s in range(1, 4)]
            write_run(tmp_path, arm, seed, recs)
    res = CliRunner().invoke(
        app_(), ["compare", str(tmp_path / "exp"), "-b", "grpo", "-m", "policy/loss,time/elapsed_s", "-f", "json"]
    )
    assert res.exit_code == 0, res.output
    rows = {d["metric"]: d for d in json.loads(res.stdout)["differences"]}
    assert rows["policy/loss"]["direction"] == "lower is better"
    assert rows["time/elapsed_s"]["direction"] == "lower is better"


def app_():
    from gspo_cli.cli.app import app

    return app


def test_until_decided_reads_time_as_lower_is_better(tmp_path):
    spec = spec_from_dict(
        {
            **TINY,
            "name": "exp",
            "output_dir": str(tmp_path),
            "seeds": [0, 1, 2],
            "arms": ARMS,
            "comparison": {"baseline": "grpo", "arm": "gspo", "metric": "time/elapsed_s"},
        }
    )

    def train(seeds):
        for s in seeds:
            for arm, t in (("grpo", 100.0), ("gspo", 80.0)):
                path = run_path(str(tmp_path), "exp", arm, s)
                if not path.exists():
                    write_run(tmp_path, arm, s, [{"step": 1, "time/elapsed_s": t + s}])

    decision = decide_until(spec, 3, 1, train)
    assert not decision.higher_is_better and decision.metric == "time/elapsed_s"
    assert decision.looks[-1].delta == pytest.approx(20.0)  # baseline - arm: positive is better
