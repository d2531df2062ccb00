"""`gspo report`: paired, Holm-corrected differences against hand-computed values, arm roles read from the
spec, and verdicts on hand-written run directories with known per-seed rewards."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gspo_cli.analysis.report.build import arm_role, write_report
from gspo_cli.analysis.rundata.runs import group_runs, load_runs
from gspo_cli.analysis.stats.stability import Collapse, run_collapse
from gspo_cli.analysis.tables.compare import compare_runs
from gspo_cli.cli.app import app
from gspo_cli.errors import SpecError

STEPS = 30


def _write(
    root: Path,
    arm: str,
    loss: str,
    replay: str,
    seed: int,
    reward: float,
    clip: float,
    change: float,
    status: str = "completed",
    evals: tuple[float, float] | None = None,
    extra: dict | None = None,
) -> None:
    d = root / "paper" / arm / f"seed{seed}"
    d.mkdir(parents=True)
    spec = {
        "name": "paper",
        "model": {"name": "builtin:tiny-moe", "builtin": {"num_layers": 8}},
        "rollout": {"prompts_per_step": 4, "group_size": 2},
        "arms": [{"name": arm, "loss": loss, "routing_replay": replay, "mini_batches": 4}],
        "seeds": [seed],
    }
    (d / "spec.yaml").write_text(yaml.safe_dump(spec))
    recs = [
        {
            "step": t,
            "reward/mean": reward,
            "policy/clip_frac_token": clip,
            "policy/clip_frac_seq": clip,
            "moe/expert_change_frac": change,
            "time/step_s": 1.0,
            "time/elapsed_s": float(t),
            **(extra or {}),
        }
        for t in range(1, STEPS + 1)
    ]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    ev = evals or (0.1, reward / 2)
    (d / "eval.jsonl").write_text(
        "".join(
            json.dumps({"step": s, "task": "math", "n": 10, "samples": 4, "scores": {"avg@4": v}}) + "\n"
            for s, v in ((0, ev[0]), (STEPS, ev[1]))
        )
    )
    (d / "run.json").write_text(
        json.dumps(
            {
                "status": status,
                "experiment": "paper",
                "arm": arm,
                "seed": seed,
                "step": STEPS,
                "total_steps": STEPS,
                "wall_s": 60.0,
            }
        )
    )


def _experiment(
    root: Path,
    rewards: dict[str, tuple[float, ...]],
    clips: dict[str, float],
    status: dict[str, tuple[str, ...]] | None = None,
) -> Path:
    roles = {
        "grpo": ("grpo", "off"),
        "grpo_rr": ("grpo", "r2"),
        "gspo": ("gspo", "off"),
        "gspo_token": ("gspo_token", "off"),
    }
    for arm, values in rewards.items():
        loss, replay = roles[arm]
        for seed, r in enumerate(values):
            st = (status or {}).get(arm, ("completed",) * 3)[seed]
            _write(root, arm, loss, replay, seed, r, clips[arm], 0.004 if arm != "gspo" else 0.002, st)
    return root / "paper"


def test_finding_differences_are_paired_and_corrected(tmp_path):
    """Per-seed rewards with a shared seed spread: grpo (0.20, 0.30, 0.40), gspo 0.05 above each
    seed but one (0.25, 0.36, 0.44): paired d = (0.05, 0.06, 0.04), mean 0.05, sd 0.01, t(2)
    4.3027 x 0.01 / sqrt(3) = 0.0248. Welch on the same numbers would not resolve it (its
    interval spans about ±0.25)."""
    from gspo_cli.analysis.report.differences import finding_family

    exp = _experiment(tmp_path, {"grpo": (0.20, 0.30, 0.40), "gspo": (0.25, 0.36, 0.44)}, {"grpo": 0.001, "gspo": 0.1})
    groups = {g.name: g for g in group_runs(load_runs([str(exp)]), "arm")}
    cols = compare_runs([str(exp)], metrics=["reward"], last=10).columns
    fam = finding_family(groups, [("gspo", "grpo", "reward"), ("x", "grpo", "reward")], {}, cols)
    d = fam[("gspo", "grpo", "reward")]
    assert d.delta == pytest.approx(0.05) and d.significant == 1
    assert d.diff.method == "paired t, 3 seeds"
    assert d.diff.ci95 == (pytest.approx(0.05 - 0.02484, abs=1e-4), pytest.approx(0.05 + 0.02484, abs=1e-4))
    assert d.text().startswith("+0.050 [+0.025, +0.075] (significant; paired t, 3 seeds, adj. p 0.0")
    assert fam[("x", "grpo", "reward")].text() == "n/a" and fam[("x", "grpo", "reward")].significant == 0
    # two copies of the same difference in one family: Holm doubles its p (0.0088 -> 0.018)
    two = finding_family(
        groups,
        [("gspo", "grpo", "reward"), ("gspo", "grpo", "reward/mean")],
        {},
        cols + [c for c in compare_runs([str(exp)], metrics=["reward/mean"], last=10).columns],
    )
    assert two[("gspo", "grpo", "reward")].diff.p_adjusted == pytest.approx(2 * d.diff.p_adjusted)


def test_roles_come_from_the_spec_not_the_arm_name(tmp_path):
    _write(tmp_path, "whatever", "grpo", "r2", 0, 0.3, 0.001, 0.01)
    _write(tmp_path, "baseline", "grpo", "off", 0, 0.3, 0.001, 0.01)
    _write(tmp_path, "seq", "gspo", "off", 0, 0.3, 0.2, 0.01)
    roles = {r.arm: arm_role(r) for r in load_runs([str(tmp_path / "paper")])}
    assert roles == {"whatever": "grpo_rr", "baseline": "grpo", "seq": "gspo"}


def test_report_verdicts_when_the_findings_hold(tmp_path):
    exp = _experiment(
        tmp_path,
        {
            "grpo": (0.20, 0.22, 0.24),
            "grpo_rr": (0.31, 0.32, 0.33),
            "gspo": (0.40, 0.43, 0.43),
            "gspo_token": (0.40, 0.41, 0.45),
        },
        {"grpo": 0.001, "grpo_rr": 0.001, "gspo": 0.2, "gspo_token": 0.2},
    )
    out = write_report(exp)
    text = out.read_text()
    assert out == exp / "REPORT.md"
    assert "**1. GSPO learns more per step than GRPO — holds.**" in text
    # finding 1: gspo - grpo per seed (0.20, 0.21, 0.19): mean 0.2, sd 0.01, t(2) 4.3027 x 0.01 /
    # sqrt(3) = 0.0248 (seeds that all differ by exactly 0.2 would have no spread and no verdict)
    assert "final train reward +0.200 [+0.175, +0.225] (significant; paired t, 3 seeds, adj. p 0.0" in text
    assert "clipping part holds" in text and "200x" in text
    assert "**3. GRPO needs routing replay on a MoE, GSPO does not — holds.**" in text
    # expert change: mean over roles of 0.004, 0.004, 0.002, 0.004 = 0.35%
    assert "lower at this scale" in text and "0.35%" in text and "on 8 layers" in text
    assert "| grpo_rr | 3 | completed |" in text
    # regime: first-25-step reward pooled over the 12 runs = (0.66 + 0.96 + 1.26 + 1.26) / 12
    assert "train reward over the first 25 steps (all runs): 0.345" in text
    assert "held-out score at step 0: 0.100" in text
    for fig in ("reward", "reward_time", "eval_math", "clip", "expert_change"):
        assert f"![{fig}](figures/{fig}.png)" in text
        assert (exp / "figures" / f"{fig}.png").stat().st_size > 1000
    assert not (exp / "figures" / "panel.png").exists()  # the report embeds single figures only
    # regenerating gives the same text
    assert write_report(exp).read_text() == text


def test_report_verdicts_when_they_do_not(tmp_path):
    exp = _experiment(
        tmp_path,
        {"grpo": (0.40, 0.30, 0.50), "grpo_rr": (0.35, 0.45, 0.30), "gspo": (0.20, 0.22, 0.24)},
        {"grpo": 0.01, "grpo_rr": 0.01, "gspo": 0.05},
    )
    text = write_report(exp, tmp_path / "out" / "R.md").read_text()
    assert "— not resolved.**" in text  # GSPO lower, but grpo's seeds are too spread to tell
    assert "clipping part does not hold" in text and "5x" in text
    assert "— does not hold at this scale.**" in text
    assert (tmp_path / "out" / "figures" / "reward.png").exists()


def test_diverged_grpo_without_replay_counts_for_finding_3(tmp_path):
    exp = _experiment(
        tmp_path,
        {"grpo": (0.30, 0.31, 0.05), "grpo_rr": (0.31, 0.32, 0.30), "gspo": (0.31, 0.30, 0.32)},
        {"grpo": 0.001, "grpo_rr": 0.001, "gspo": 0.2},
        status={"grpo": ("completed", "completed", "diverged")},
    )
    text = write_report(exp).read_text()
    assert "— holds.** GRPO+RR − GRPO" in text
    assert "Diverged/failed runs: GRPO 1/3, GRPO+RR 0/3" in text


def test_cli_report_and_bad_input(tmp_path):
    exp = _experiment(tmp_path, {"grpo": (0.2, 0.3, 0.25), "gspo": (0.3, 0.35, 0.4)}, {"grpo": 0.001, "gspo": 0.1})
    res = CliRunner().invoke(app, ["report", str(exp)])
    assert res.exit_code == 0, res.output
    assert (exp / "REPORT.md").exists()
    assert "**3.** not testable" in (exp / "REPORT.md").read_text()
    res = CliRunner().invoke(app, ["report", str(tmp_path / "missing")])
    assert res.exit_code == 2 and "no such directory" in res.output
    with pytest.raises(SpecError):
        write_report(tmp_path / "missing")
    res = CliRunner().invoke(app, ["report", str(exp / "REPORT.md")])  # a file, not a directory
    assert res.exit_code == 2 and "not a directory" in res.output and "Traceback" not in res.output
    res = CliRunner().invoke(app, ["report", str(exp), "-o", str(exp / "REPORT.md" / "R.md")])  # parent is a file
    assert res.exit_code == 2 and "cannot write" in res.output and "Traceback" not in res.output


def _logvar_experiment(root: Path, grpo_var: tuple[float, ...], other_var: float, grpo_status=("completed",) * 3):
    """grpo / grpo_rr / gspo, 3 seeds; mini-batch 0 on-policy (1e-10), mini-batches 1-3 at the
    seed's variance, length buckets 1-16 and 33-64 at 1x and 3x it."""
    for arm, loss, replay in (("grpo", "grpo", "off"), ("grpo_rr", "grpo", "r2"), ("gspo", "gspo", "off")):
        for seed in range(3):
            v = grpo_var[seed] if arm == "grpo" else other_var * (1 + 0.1 * seed)
            extra = {"ratio/logvar_mb0": 1e-10, **{f"ratio/logvar_mb{i}": v for i in (1, 2, 3)}}
            extra |= {"ratio/logvar_len_1_16": v, "ratio/logvar_len_33_64": 3 * v}
            status = grpo_status[seed] if arm == "grpo" else "completed"
            _write(root, arm, loss, replay, seed, 0.3, 0.01, 0.05, status, extra=extra)
    return root / "paper"


def test_ratio_diagnostic_tables_and_finding_5(tmp_path):
    exp = _logvar_experiment(tmp_path, (1.0e-3, 1.1e-3, 1.2e-3), 1e-4)
    text = write_report(exp).read_text()
    # seed means: grpo 1.1e-3 (buckets 1.1e-3 and 3.3e-3), others 1.1e-4 / 3.3e-4
    assert "| arm | length 1-16 | length 33-64 |" in text
    assert "| grpo | 0.0011 | 0.0033 |" in text and "| gspo | 0.00011 | 0.00033 |" in text
    assert "| grpo | 1e-10 | 0.0011 | 0.0011 | 0.0011 |" in text
    assert "**5. Without routing replay GRPO's token ratios are noisier and it trains less stably — holds.**" in text
    # paired: grpo (1.0, 1.1, 1.2)e-3 - (1.0, 1.1, 1.2)e-4 = (0.9, 0.99, 1.08)e-3, t = 19 on 2 df, raw p
    # 0.0027; Holm over the 8 differences of the findings (6 of them exactly 0, p 1): 8 x 0.0027 = 0.022
    assert (
        "GRPO − GRPO+RR +0.00099 [" in text
        and "(significant; paired t, 3 seeds, adj. p 0.022, findings family of 8)" in text
    )
    assert "GRPO 3x, GRPO + routing replay 3x, GSPO 3x" in text
    assert "Finding 5 (without routing replay" in text
    for fig in ("logvar_length", "logvar_minibatch"):
        assert (exp / "figures" / f"{fig}.png").stat().st_size > 1000


def test_finding_5_does_not_hold_and_diverged_grpo_counts(tmp_path):
    text = write_report(_logvar_experiment(tmp_path / "a", (1e-4, 2e-4, 3e-4), 1e-4)).read_text()
    assert "trains less stably — does not hold.**" in text
    diverged = _logvar_experiment(tmp_path / "b", (1e-4, 2e-4, 3e-4), 1e-4, ("completed", "diverged", "completed"))
    text = write_report(diverged).read_text()
    assert "trains less stably — holds.**" in text and "GRPO 1/3, GRPO + routing replay 0/3, GSPO 0/3" in text


def _collapse_experiment(root: Path) -> Path:
    """grpo: step-0 score 0.2, evals every 10 steps. Seed 0 falls below 0.1 at step 20, seed 1 at
    10, seed 2 ends at exactly 0.1 (not below: never). gspo: seed 0 starts at 0 (not rated),
    seed 1 diverges (status) without a drop (collapses at its last step, 30), seed 2 holds."""
    curves = {
        ("grpo", 0): (0.2, 0.15, 0.08, 0.05),
        ("grpo", 1): (0.2, 0.09, 0.12, 0.03),
        ("grpo", 2): (0.2, 0.15, 0.12, 0.1),
        ("gspo", 0): (0.0, 0.1, 0.1, 0.1),
        ("gspo", 1): (0.2, 0.18, 0.16, 0.14),
        ("gspo", 2): (0.2, 0.25, 0.3, 0.3),
    }
    for (arm, seed), scores in curves.items():
        status = "diverged" if (arm, seed) == ("gspo", 1) else "completed"
        _write(root, arm, arm, "off", seed, 0.3, 0.01, 0.01, status)
        (root / "paper" / arm / f"seed{seed}" / "eval.jsonl").write_text(
            "".join(
                json.dumps({"step": 10 * i, "task": "math", "n": 10, "samples": 4, "scores": {"avg@4": v}}) + "\n"
                for i, v in enumerate(scores)
            )
        )
    return root / "paper"


def test_collapse_rule_on_synthetic_runs(tmp_path):
    exp = _collapse_experiment(tmp_path)
    got = {(r.arm, r.seed): run_collapse(r, "math") for r in load_runs([str(exp)])}
    assert got[("grpo", 0)] == Collapse(step=20, start=0.2, low=0.05)
    assert got[("grpo", 1)] == Collapse(step=10, start=0.2, low=0.03)
    assert got[("grpo", 2)] == Collapse(step=None, start=0.2, low=0.1)  # 0.1 is half, not below
    assert got[("gspo", 0)] is None  # nothing to fall from
    assert got[("gspo", 1)] == Collapse(step=STEPS, start=0.2, low=0.14, diverged=True)
    assert got[("gspo", 2)].step is None
    assert run_collapse(load_runs([str(exp / "grpo" / "seed0")])[0], "other") is None  # no such eval set
    text = write_report(exp).read_text()
    # grpo: 2 of 3 collapse, median of (20, 10) = 15; step-0 mean 0.2, mean of lows (0.05, 0.03, 0.1) = 0.06
    assert "| grpo | 2/3 | s0: 20, s1: 10, s2: – | 15 | 0.200 | 0.060 |" in text
    # gspo: seed 0 not rated; 1 of 2 (the divergence) is not more than half; lows (0.14, 0.25)
    assert "| gspo | 1/2 | s1: 30 (diverged), s2: – | 30 | 0.200 | 0.195 |" in text
    assert "Arms that collapse (median step, earliest first): `grpo` at step 15." in text
    assert "Collapse rule (fixed before the runs" in text and "below 0.5 x its own step-0" in text
    for seed in range(3):  # every grpo seed holds on: no arm collapses
        (exp / "grpo" / f"seed{seed}" / "eval.jsonl").write_text(
            json.dumps({"step": 0, "task": "math", "n": 10, "samples": 4, "scores": {"avg@4": 0.2}}) + "\n"
        )
    text = write_report(exp).read_text()
    assert "| grpo | 0/3 | s0: –, s1: –, s2: – | – | 0.200 | n/a |" in text
    assert "No arm collapses: in none do more than half of the rated seeds" in text


def test_the_learning_rate_schedule_in_words():
    from gspo_cli.analysis.report.build import lr_text

    assert lr_text({"lr": 5e-05}) == "lr 5e-05"
    assert lr_text({"lr": 5e-05, "decay": "constant", "warmup_steps": 0}) == "lr 5e-05"
    sched = {"lr": 5e-05, "warmup_steps": 10, "decay": "linear", "min_lr_ratio": 0.0}
    assert lr_text(sched) == "lr 5e-05, 10 warm-up steps, linear decay to 0 x lr"
    assert lr_text({"lr": 1e-3, "decay": "cosine", "min_lr_ratio": 0.1}) == "lr 0.001, cosine decay to 0.1 x lr"


def test_learning_rule_on_synthetic_runs(tmp_path):
    """Did each arm end above its step-0 held-out score? grpo: changes +0.1, +0.05, -0.05 (mean
    +0.0333, std 0.0764, t(2) 4.303 -> half-width 0.190: above, not significantly, 2 of 3 seeds);
    gspo: +0.1, +0.11, +0.09 (mean 0.1, std 0.01 -> 0.025: significantly); grpo_rr: -0.05 each
    (std 0, so any interval excludes 0: below, significantly)."""
    from gspo_cli.analysis.report.collapse import learning_lines

    ends = {"grpo": (0.2, 0.15, 0.05), "gspo": (0.2, 0.21, 0.19), "grpo_rr": (0.05, 0.05, 0.05)}
    roles = {"grpo": ("grpo", "off"), "gspo": ("gspo", "off"), "grpo_rr": ("grpo", "r2")}
    for arm, vals in ends.items():
        for seed, end in enumerate(vals):
            _write(tmp_path, arm, *roles[arm], seed, 0.3, 0.01, 0.004, evals=(0.1, end))
    groups = group_runs(load_runs([str(tmp_path / "paper")]), "arm")
    text = "\n".join(learning_lines(groups, "math", "math avg@4", window=10))
    assert "| grpo | 0.100 → 0.133 | +0.033 ± 0.190 | 2/3 | 0.300 → 0.300 | ends above step 0 |" in text
    assert "| gspo | 0.100 → 0.200 | +0.100 ± 0.025 | 3/3 | 0.300 → 0.300 | ends above step 0, significantly |" in text
    assert "| grpo_rr | 0.100 → 0.050 | -0.050 ± 0.000 | 0/3 |" in text and "ends below step 0, significantly" in text
    assert learning_lines(groups, None) == [] and learning_lines(groups, "other") == []
    # too few steps for the windows: the train reward column says so
    assert "| 3/3 | n/a |" in "\n".join(learning_lines(groups, "math", window=25))
    assert "## Did each arm learn?" in write_report(tmp_path / "paper").read_text()
