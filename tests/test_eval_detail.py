"""Evaluation rows a reader can check: the prompt the model saw, and for code each test's verdict."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from gspo_cli.cli.app import app
from gspo_cli.eval.scores import score_problems
from gspo_cli.tasks import Problem, make_task
from gspo_cli.tasks.code_judge import STDERR_LINES, TestCase

runner = CliRunner()


def fence(code: str) -> str:
    return f"```python\n{code}\n```"


def _problem() -> Problem:
    tests = (TestCase("2 3\n", "5\n"), TestCase("10 1\n", "11\n"), TestCase("0 0\n", "0\n"))
    return Problem(id="sum", prompt="Read a and b. Print a+b.\n", answer="", meta={"tests": tests})


def test_code_rows_carry_each_tests_verdict_and_stderr():
    task = make_task("code", {"timeout_s": 1.0, "partial_reward": True})  # all tests run: partial credit
    completions = [
        fence("a,b=map(int,input().split())\nprint(a+b)"),  # right
        fence("a,b=map(int,input().split())\nprint(a+b if a else 7)"),  # wrong on the last test
        fence("a,b=map(int,input().split())\nprint(1/(a-10))\nprint(a+b)"),  # crashes on test 2
        fence("while True:\n    pass"),  # times out
        fence("print(("),  # does not compile
        "no code here",
    ]
    (row,) = score_problems(task, [_problem()], [completions], prompts=["<seen>Read a and b. Print a+b.\n"])
    rec = json.loads(json.dumps(row.record()))
    assert rec["prompt"] == "<seen>Read a and b. Print a+b.\n"
    statuses = [[t["status"] for t in d["tests"]] for d in rec["details"]]
    assert statuses[0] == ["pass", "pass", "pass"]
    assert statuses[1] == ["pass", "pass", "fail"]
    assert statuses[2] == ["fail", "error", "fail"]  # an extra line of output, then a crash at a = 10
    crash = rec["details"][2]["tests"][1]["stderr"]
    assert crash.splitlines()[-1] == "ZeroDivisionError: division by zero" and len(crash.splitlines()) <= STDERR_LINES
    assert statuses[3][0] == "timeout" and statuses[3][1:] == ["not_run", "not_run"]  # not rerun after a timeout
    syntax = rec["details"][4]["tests"][0]
    assert syntax["status"] == "error" and syntax["stderr"].startswith("SyntaxError: ")
    assert statuses[4][1:] == ["not_run", "not_run"]
    assert rec["details"][5] == {"tests": [{"status": "not_run"}] * 3, "no_code": True}
    assert rec["correct"] == [True, False, False, False, False, False]


def test_a_failed_first_test_leaves_the_others_not_run():
    """Without partial credit the judge runs the other tests only after the first passed."""
    task = make_task("code", {"timeout_s": 1.0})
    (row,) = score_problems(task, [_problem()], [[fence("print(7)"), fence("print(5)")]])
    tests = [[t["status"] for t in d["tests"]] for d in row.record()["details"]]
    assert tests == [["fail", "not_run", "not_run"], ["pass", "fail", "fail"]]


def test_rows_without_a_model_keep_the_tasks_prompt(tmp_path):
    task = make_task("arithmetic", {})
    probs = task.eval_problems(2)
    comp = tmp_path / "c.jsonl"
    comp.write_text("".join(json.dumps({"id": p.id, "completion": "x"}) + "\n" for p in probs))
    res = runner.invoke(app, ["eval", "-c", str(comp), "-t", "arithmetic", "-o", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in (tmp_path / "o" / "eval_problems.jsonl").read_text().splitlines()]
    assert [r["prompt"] for r in rows] == [p.prompt for p in probs]
    assert all("details" not in r for r in rows)  # arithmetic has nothing per test to add
