"""A prompt longer than the built-in model's positions is refused in one line before any model
is built (it used to reach the cold start, whose batch tried to allocate gigabytes)."""

import json
import time

import yaml
from helpers import TINY
from typer.testing import CliRunner

from gspo_cli.cli.app import app


def test_a_10_mb_prompt_is_refused_in_one_line_before_the_cold_start(tmp_path):
    rows = [{"prompt": f"{a}+{a}=?", "answer": str(2 * a), "solution": f"\\boxed{{{2 * a}}}"} for a in range(20)]
    rows.insert(7, {"prompt": "x" * 10_000_000 + "1+1=?", "answer": "2", "solution": "\\boxed{2}"})
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = {
        "name": "prompts",
        "params": {"source": str(data)},
        "eval_size": 4,
        "rewards": [{"function": "math_accuracy"}],
    }
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({**TINY, "task": task, "output_dir": str(tmp_path / "runs")}))
    t0 = time.monotonic()
    res = CliRunner().invoke(app, ["train", str(spec)])
    assert res.exit_code == 2, res.output
    assert time.monotonic() - t0 < 60
    (line,) = [ln for ln in res.stderr.splitlines() if ln.startswith("error")]
    assert "task.params.source: the prompt of problem '7'" in line and "10,000,005 characters long" in line
    assert "prompts of at most 240 fit" in line and "Traceback" not in res.output
    assert "cold start" not in res.output and not (tmp_path / "runs").exists()
