"""What a newcomer reads first: the docs' front page links the guides for their own problem, a
resumed run says how many steps are left, and a misspelled reward is said before anything else."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from helpers import TINY
from typer.testing import CliRunner

from gspo_cli.cli.app import app
from gspo_cli.train.reporting import PlainReporter, training_line

ROOT = Path(__file__).resolve().parents[1]


def test_the_front_page_links_the_guides_for_your_own_problem():
    index = (ROOT / "docs" / "index.md").read_text()
    linked = set(re.findall(r"\]\(([^)#]+)", index))
    assert {"guides/own-task.md", "guides/lora.md", "guides/tools.md", "guides/judges.md"} <= linked
    assert all((ROOT / "docs" / page).is_file() for page in linked if not page.startswith("http"))


def test_a_resumed_run_says_how_many_steps_are_left(capsys):
    assert training_line(4) == "training 4 steps" and training_line(1) == "training 1 step"
    assert training_line(4, 2) == "training 2 more steps (steps 3-4 of 4)"
    assert training_line(4, 3) == "training 1 more step (step 4 of 4)"
    assert training_line(4, 4) == "all 4 steps trained before; finishing the run"
    PlainReporter().run_started("gspo/seed0", 4, 2)
    assert capsys.readouterr().out == "[gspo/seed0] training 2 more steps (steps 3-4 of 4)\n"


def test_a_misspelled_reward_is_said_before_the_worker_pool_line(tmp_path):
    (tmp_path / "r.py").write_text("def short(completions, **kw):\n    return [0.0] * len(completions)\n")
    spec = {
        **TINY,
        "task": {**TINY["task"], "rewards": [{"function": f"{tmp_path}/r.py:shrot"}], "reward_workers": 1},
        "output_dir": str(tmp_path / "out"),
    }
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    res = CliRunner().invoke(app, ["train", str(tmp_path / "s.yaml")])
    assert res.exit_code == 2, res.output
    lines = res.output.splitlines()
    assert lines[0].startswith("error: task.rewards[0].function: ") and "shrot" in lines[0], lines
    assert "worker process" not in res.output and "Traceback" not in res.output


def test_code_blocks_wrap_instead_of_scrolling_sideways():
    """At 1400 px wide the content column holds ~105 columns of code: 17 code lines in the docs are
    wider (up to 266). Measured with headless Chromium at 1400 x 1000 on the built site: 9 blocks
    on 5 pages overflowed before this rule, none of 54 pages' after."""
    css = (ROOT / "docs" / "assets" / "extra.css").read_text()
    rule = css[css.index(".md-typeset pre > code {") :].split("}")[0]
    assert "white-space: pre-wrap" in rule and "overflow-wrap: anywhere" in rule


def test_a_long_cold_start_says_how_far_it_is_and_how_long_is_left(tmp_path, monkeypatch):
    """Every PROGRESS_S (here 0: every step) a line with the step, the time so far and an
    estimate of what is left; before, one line per fifth of the steps (the tools testbed's 300
    steps: 60 steps, 5 minutes and more on a loaded 2-core box, without a word)."""
    from gspo_cli.models import builtin, resolve_model_source
    from gspo_cli.spec import ModelConfig
    from gspo_cli.tasks import make_task

    monkeypatch.setenv("GSPO_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(builtin, "PROGRESS_S", 0.0)
    model = {**TINY["model"], "builtin": {**TINY["model"]["builtin"], "hidden_size": 16}, "cold_start": {"steps": 3}}
    said = []
    resolve_model_source(ModelConfig(**model), make_task("arithmetic", TINY["task"]["params"]), log=said.append)
    steps = [line for line in said if line.startswith("cold start step")]
    assert [s.split(":")[0] for s in steps] == [f"cold start step {i}/3" for i in (1, 2, 3)]
    assert re.fullmatch(r"cold start step 1/3: loss \d+\.\d{3} \(\d+ s so far, about \d+ s left\)", steps[0])
    assert re.fullmatch(r"cold start step 3/3: loss \d+\.\d{3} \(\d+ s so far\)", steps[2])
