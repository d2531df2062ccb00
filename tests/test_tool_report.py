"""What users see of multi-turn runs (task.environment): `gspo compare`, `gspo plot` and `gspo
report` show the tool metrics (turns, calls, errors, time-outs per response, the environment's
token share) when the runs log them and say nothing of tools when they do not; `gspo eval`
records the tool use with the tool and without it (`--no-tools`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from synthetic_runs import make_experiment, write_run
from typer.testing import CliRunner

from gspo_cli.analysis.figures.plot import build_plot, make_figures
from gspo_cli.analysis.report.build import build_report
from gspo_cli.analysis.rundata.runs import group_runs, load_runs
from gspo_cli.cli.app import app
from gspo_cli.eval.scores import tool_use

TOOL_KEYS = ("turns", "tool_calls", "tool_errors", "tool_timeouts", "env_tokens")
STEPS = 4


def _calls(arm: str, seed: int) -> float:
    return (0.5 if arm == "grpo" else 1.0) + 0.1 * seed


def make_tool_experiment(root: Path) -> Path:
    """root/exp/{grpo,gspo}/seed{0,1}, 4 steps. Per response: calls 0.5 + 0.1 k (grpo) or 1.0 +
    0.1 k (gspo), turns = calls + 1, errors 0.25 k, time-outs 0.1 at step 1 only (run mean
    0.025), environment share 0.3 + 0.02 t (run mean 0.35)."""
    for arm in ("grpo", "gspo"):
        for k in (0, 1):
            recs = [
                {
                    "step": t,
                    "reward/mean": 0.5,
                    "reward/std": 0.3,
                    "tools/turns_mean": _calls(arm, k) + 1,
                    "tools/tool_calls_mean": _calls(arm, k),
                    "tools/tool_errors_mean": 0.25 * k,
                    "tools/tool_timeouts_mean": 0.1 if t == 1 else 0.0,
                    "tools/env_token_frac": 0.3 + 0.02 * t,
                    "time/elapsed_s": 2.0 * t,
                }
                for t in range(1, STEPS + 1)
            ]
            evals = [
                {"step": s, "task": "arithmetic", "scores": {"avg@2": v}} for s, v in ((0, 0.4), (4, 0.5 + 0.1 * k))
            ]
            write_run(root, arm, k, recs, evals=evals, task={"name": "arithmetic", "environment": "python"})
    return root / "exp"


def _compare_json(exp: Path, *extra) -> dict:
    res = CliRunner().invoke(app, ["compare", str(exp), "--format", "json", *extra])
    assert res.exit_code == 0, res.output
    return {g["group"]: g["metrics"] for g in json.loads(res.stdout)["groups"]}


def test_compare_shows_the_tool_columns_by_default_where_runs_log_them(tmp_path):
    got = _compare_json(make_tool_experiment(tmp_path / "t"))
    assert got["grpo"]["tool_calls"]["mean"] == pytest.approx(0.55)  # seed means 0.5 and 0.6
    assert got["gspo"]["tool_calls"]["mean"] == pytest.approx(1.05)
    assert got["gspo"]["turns"]["mean"] == pytest.approx(2.05)
    assert got["gspo"]["tool_errors"]["mean"] == pytest.approx(0.125)
    assert got["grpo"]["tool_timeouts"]["mean"] == pytest.approx(0.025)
    assert got["grpo"]["env_tokens"]["mean"] == pytest.approx(0.35)
    assert got["gspo"]["tool_errors"]["n"] == 2
    # Runs without an environment: no tool column at all.
    plain = _compare_json(make_experiment(tmp_path / "p"))
    assert not any(k in m for m in plain.values() for k in TOOL_KEYS)


def test_plot_draws_the_tool_figures_only_for_runs_that_have_them(tmp_path):
    groups = group_runs(load_runs([str(make_tool_experiment(tmp_path / "t"))]), "arm")
    plot = build_plot(groups, smooth=0.0)
    names = [p.name for p in plot.panels]
    assert "tools" in names and "env_tokens" in names
    assert next(p for p in plot.panels if p.name == "tools").in_panel  # in the combined figure too
    figs = make_figures(build_plot(groups, ["tools", "env_tokens"], smooth=0.0))
    lines = {ln.get_label(): ln.get_ydata() for ln in figs["tools"].axes[0].lines}
    assert list(lines["gspo (n=2)"]) == pytest.approx([1.05] * STEPS)  # calls, the solid line
    dashed = [ln for ln in figs["tools"].axes[0].lines if ln.get_label() == "_gspo"]
    assert list(dashed[0].get_ydata()) == pytest.approx([2.05] * STEPS)  # turns
    share = {ln.get_label(): ln.get_ydata() for ln in figs["env_tokens"].axes[0].lines}
    assert list(share["grpo (n=2)"]) == pytest.approx([0.32, 0.34, 0.36, 0.38])
    plain = group_runs(load_runs([str(make_experiment(tmp_path / "p"))]), "arm")
    got = build_plot(plain, smooth=0.0)
    assert not {"tools", "env_tokens"} & {p.name for p in got.panels}
    assert {"tools", "env_tokens"} <= set(got.skipped)


def _summary(path: Path, score: float, calls: float, tools: bool) -> None:
    path.mkdir(parents=True, exist_ok=True)
    s = {"task": "arithmetic", "scores": {"avg@2": score, "pass@1": score}, "created_at": "2026-12-06T08:00:00"}
    s["tool_use"] = {"turns_mean": 1 + calls, "tool_calls_mean": calls}
    if tools:
        s["tools"] = "python"
    (path / "eval_summary.json").write_text(json.dumps(s))


def test_report_has_a_tool_section_with_and_without_the_tool(tmp_path):
    exp = make_tool_experiment(tmp_path / "t")
    for k, score in ((0, 0.75), (1, 0.85)):
        _summary(exp / "gspo" / f"seed{k}", score, 1.0, tools=True)
        _summary(exp / "gspo" / f"seed{k}" / "eval_no_tools", 0.0, 0.0, tools=False)
    _summary(exp / "grpo" / "seed1" / "eval_no_tools", 0.125, 0.0, tools=False)  # and no gspo eval with it
    text = build_report(exp, out=tmp_path / "out" / "REPORT.md")
    section = text.split("## Tools", 1)[1].split("\n##", 1)[0]
    rows = {ln.split(" | ")[0].lstrip("| "): ln for ln in section.splitlines() if ln.startswith("| g")}
    # reward, turns, calls, errors, time-outs, env share; the CIs from two seeds (t = 12.71)
    assert rows["gspo"].startswith("| gspo | 2 | 0.5 ± 0 | 2.05 ± 0.64 | 1.05 ± 0.64 | 0.125 ± 1.6 | 0.025 ± 0 |")
    assert rows["grpo"].endswith("| 0.35 ± 0 |")
    evals = text.split("### With and without the tool", 1)[1].split("\n## ", 1)[0]
    # seeds 0.75 and 0.85: mean 0.800, CI 12.71 x 0.05 = 0.64; without the tool 0 and no calls
    assert "| gspo | 0.800 ± 0.64 (n=2) | 1.000 ± 0 (n=2) | 0.000 ± 0 (n=2) | 0.000 ± 0 (n=2) |" in evals
    # grpo: only seed 1 was evaluated, without the tool; its final in-run score (0.6) stands in
    assert "| grpo | 0.600 (n=1) | — | 0.125 (n=1) | 0.000 (n=1) |" in evals
    assert "first column: 1 run(s) here" in evals
    assert (tmp_path / "out" / "figures" / "tools.png").is_file()
    assert (tmp_path / "out" / "figures" / "env_tokens.png").is_file()
    plain = build_report(make_experiment(tmp_path / "p"), out=tmp_path / "p_out" / "REPORT.md")
    assert "## Tools" not in plain and "tool calls" not in plain and "tools,env_tokens" not in plain
    assert not (tmp_path / "p_out" / "figures" / "tools.png").exists()


def test_tool_use_is_the_per_response_mean_of_the_counts():
    counts = [
        {"turns": 3, "tool_calls": 2, "tool_errors": 1, "tool_timeouts": 1},
        {"turns": 2, "tool_calls": 1, "tool_errors": 0, "tool_timeouts": 0},
        {"turns": 1, "tool_calls": 0, "tool_errors": 0, "tool_timeouts": 0},
        {"turns": 2, "tool_calls": 1, "tool_errors": 0, "tool_timeouts": 0},
    ]
    assert tool_use(counts) == {
        "turns_mean": 2.0,
        "tool_calls_mean": 1.0,
        "tool_errors_mean": 0.25,
        "tool_timeouts_mean": 0.25,
    }


ECHO = '''
class Echo:
    """Answers the model's first turn with a hint; the second turn ends the rollout."""

    def __init__(self, hint="again", turns=2):
        self.hint, self.turns, self.seen = hint, turns, 0

    def start(self, prompt):
        return None

    def step(self, turn):
        self.seen += 1
        return (self.hint, False, None) if self.seen < self.turns else (None, True, 1.0)
'''


@pytest.mark.slow
def test_gspo_eval_scores_a_tools_run_with_the_tool_and_without_it(tmp_path):
    from helpers import TINY

    from gspo_cli.spec.loading import spec_from_dict
    from gspo_cli.train.loop import train_experiment
    from gspo_cli.train.reporting import quiet_reporter

    env = tmp_path / "echo.py"
    env.write_text(ECHO)
    raw = {
        **TINY,
        "output_dir": str(tmp_path / "runs"),
        "train": {"steps": 1},
        "task": {**TINY["task"], "environment": f"{env}:Echo", "environment_params": {"hint": "again"}},
        "rollout": {**TINY["rollout"], "max_new_tokens": 24, "tool_output_tokens": 4},
        "arms": [{"name": "gspo", "preset": "paper-gspo", "mini_batches": 2}],
    }
    (result,) = train_experiment(spec_from_dict(raw), reporter=quiet_reporter())
    run = Path(result.path)
    assert result.status == "completed"
    with_tool = CliRunner().invoke(app, ["eval", str(run), "-k", "2", "-q"])
    assert with_tool.exit_code == 0, with_tool.output
    out = run / "eval_no_tools"
    without = CliRunner().invoke(app, ["eval", str(run), "-k", "2", "--no-tools", "-o", str(out), "-q"])
    assert without.exit_code == 0, without.output
    on = json.loads((run / "eval_summary.json").read_text())
    off = json.loads((out / "eval_summary.json").read_text())
    assert on["tools"] == f"{env}:Echo" and "tools" not in off
    assert (on["problems"], on["samples"], off["problems"], off["samples"]) == (4, 2, 4, 2)
    # With the environment the cold-started model's answers (it ends them) get the hint, and every
    # answered call adds one model turn; without it every response is one turn and calls nothing.
    use = on["tool_use"]
    assert 0 < use["tool_calls_mean"] <= 1 and use["turns_mean"] == pytest.approx(1 + use["tool_calls_mean"])
    assert use["tool_errors_mean"] == 0 and use["tool_timeouts_mean"] == 0  # a hint is no error
    assert off["tool_use"] == {
        "turns_mean": 1.0,
        "tool_calls_mean": 0.0,
        "tool_errors_mean": 0.0,
        "tool_timeouts_mean": 0.0,
    }
    # The report reads both back into its tool section (one seed: no CI).
    text = build_report(run.parent.parent, out=tmp_path / "rep" / "REPORT.md")
    evals = text.split("### With and without the tool", 1)[1]
    calls = f"{use['tool_calls_mean']:.3f} (n=1)"
    assert f"| gspo | {on['scores']['avg@2']:.3f} (n=1) | {calls} | {off['scores']['avg@2']:.3f} (n=1) |" in evals
