"""compare, report and plot know the mismatch correction and R2/R3: arm settings from
spec.yaml, mismatch metrics from metrics.jsonl, on hand-written run directories."""

import json

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from gspo_cli.analysis.figures.plot import build_plot, make_figures
from gspo_cli.analysis.rundata.runs import group_runs, load_runs
from gspo_cli.cli.app import app

runner = CliRunner()
ARMS = {
    "grpo": {"routing_replay": "off"},
    "grpo_r3": {"routing_replay": "r3"},
    "grpo_tis": {"routing_replay": "r3", "mismatch": {"mode": "token_tis", "low": 0.5, "high": 2.0}},
}


def _write(root, arm, seed, extra):
    d = root / "exp" / arm / f"seed{seed}"
    d.mkdir(parents=True)
    spec = {"name": "exp", "arms": [{"name": arm, "loss": "grpo", "clip_low": 0.2, "clip_high": 0.27, **extra}]}
    (d / "spec.yaml").write_text(yaml.safe_dump(spec))
    recs = []
    for step in range(1, 6):
        r = {"step": step, "reward/mean": 0.5}
        if "mismatch" in extra:  # seed 0: weight 0.9, seed 1: 0.95; masked share 0.1 x step
            r |= {
                "mismatch/weight_mean": 0.9 + 0.05 * seed,
                "mismatch/masked_token_frac": 0.1 * step,
                "mismatch/truncated_token_frac": 0.02,
                "mismatch/masked_seq_frac": 0.3,
            }
        if extra.get("routing_replay") == "r3":
            r["moe/engine_route_diff_frac"] = 0.0
        recs.append(r)
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (d / "run.json").write_text(json.dumps({"status": "completed", "experiment": "exp", "arm": arm, "seed": seed}))


@pytest.fixture(scope="module")
def exp(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    for arm, extra in ARMS.items():
        for seed in (0, 1):
            _write(root, arm, seed, extra)
    return root / "exp"


def test_compare_shows_replay_and_mismatch_as_arm_settings(exp):
    res = runner.invoke(app, ["compare", str(exp), "-f", "json"])
    assert res.exit_code == 0, res.output
    groups = {g["group"]: g for g in json.loads(res.stdout)["groups"]}
    assert {k: g["settings"] for k, g in groups.items()} == {
        "grpo": {"algorithm": "grpo · clip 0.2/0.27", "routing_replay": "off", "mismatch": "off"},
        "grpo_r3": {"algorithm": "grpo · clip 0.2/0.27", "routing_replay": "r3", "mismatch": "off"},
        "grpo_tis": {"algorithm": "grpo · clip 0.2/0.27", "routing_replay": "r3", "mismatch": "token_tis [0.5, 2]"},
    }
    tis = groups["grpo_tis"]["metrics"]
    assert tis["mismatch_weight"]["mean"] == pytest.approx(0.925) and tis["mismatch_weight"]["n"] == 2
    assert tis["masked"]["mean"] == pytest.approx(0.3)  # mean over steps 0.1..0.5
    assert tis["truncated"]["mean"] == pytest.approx(0.02)
    assert groups["grpo"]["metrics"]["mismatch_weight"]["n"] == 0
    md = runner.invoke(app, ["compare", str(exp), "-f", "markdown", "-m", "reward"]).stdout
    assert md.startswith(
        "| arm | seeds | status | algorithm | routing replay | mismatch | reward (last 5) |"
    )  # the runs have 5 steps
    assert "| grpo_tis | 2 | completed | grpo · clip 0.2/0.27 | r3 | token_tis [0.5, 2] | 0.5 ± 0 |" in md
    by_replay = runner.invoke(app, ["compare", str(exp), "-f", "json", "-g", "routing_replay", "-m", "reward"])
    settings = {g["group"]: g["settings"] for g in json.loads(by_replay.stdout)["groups"]}
    assert settings["routing_replay=r3"] == {
        "algorithm": "grpo · clip 0.2/0.27",
        "routing_replay": "r3",
        "mismatch": "off/token_tis [0.5, 2]",
    }


def test_plot_draws_the_mismatch_metrics(exp):
    groups = group_runs(load_runs([str(exp)]), "arm")
    plot = build_plot(groups, ["mismatch", "mismatch_dropped", "engine_route_diff"])
    assert [p.name for p in plot.panels] == ["mismatch", "mismatch_dropped", "engine_route_diff"]
    figs = make_figures(plot)
    lines = [ln for ln in figs["mismatch"].axes[0].get_lines() if ln.get_label().startswith("grpo_tis")]
    assert len(lines) == 1 and np.allclose(lines[0].get_ydata(), 0.925)  # mean of the two seeds
    dropped = figs["mismatch_dropped"].axes[0].get_lines()
    solid = [ln for ln in dropped if ln.get_linestyle() == "-" and ln.get_label().startswith("grpo_tis")]
    assert np.allclose(solid[0].get_ydata(), [0.1, 0.2, 0.3, 0.4, 0.5])
    assert any(np.allclose(ln.get_ydata(), 0.02) for ln in dropped if ln.get_linestyle() == "--")


def test_report_leaves_corrected_arms_out_of_the_paper_roles(exp):
    from gspo_cli.analysis.report.build import arm_role

    roles = {r.arm: arm_role(r) for r in load_runs([str(exp)])}
    assert roles == {"grpo": "grpo", "grpo_r3": "grpo_rr", "grpo_tis": None}
