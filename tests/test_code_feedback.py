"""The built-in `code_feedback` environment on code problems, driven by scripted model turns (no
model): each attempt's public-test failures come back as the observation, the attempt limit
ends the rollout, the private tests give the reward; hostile programs are error observations."""

import pytest
from sandbox_corpus import HOSTILE

from gspo_cli.environments import resolve_environment
from gspo_cli.errors import RunError, SpecError
from gspo_cli.tasks.base import Problem
from gspo_cli.tasks.code_judge import TestCase

# "Print a+b": the first test is public (the prompt's example, as the synthetic source makes
# them), the other two private.
TESTS = (TestCase("1 2\n", "3\n"), TestCase("5 5\n", "10\n"), TestCase("0 7\n", "7\n"))
PROBLEM = Problem(
    id="sum", prompt="Read two integers a and b. Print the sum of a and b.\n", answer="", meta={"tests": TESTS}
)
READ = "a,b=map(int,input().split())\n"


def _env(**params):
    env = resolve_environment("code_feedback", {"timeout_s": 1.0, "memory_mb": 128, **params})()
    assert env.start(PROBLEM.prompt, problem=PROBLEM) is None  # the task's prompt is kept
    return env


def _turn(code: str) -> str:
    return f"Here is my program.\n```python\n{code}\n```"


def test_an_attempt_that_fails_then_one_that_passes():
    env = _env(attempts=3)
    first = env.step(_turn(READ + "print(a*b)"))
    assert not first.done and first.reward is None and not first.error
    assert first.text == (
        "Attempt 1 of 3 failed (2 left). 1 of 1 public tests failed.\nTest 1: input:\n1 2\nexpected:\n3\ngot:\n2\n"
    )
    second = env.step(_turn(READ + "print(a+b)"))
    assert second.done and second.text is None and second.reward == 1.0


def test_the_attempt_limit_ends_the_rollout_rewarded_by_the_private_tests():
    env = _env(attempts=2)
    assert not env.step(_turn(READ + "print(a*b)")).done
    # the second wrong attempt is the last: no observation, the private tests give 0
    last = env.step(_turn(READ + "print(a-b)"))
    assert last.done and last.text is None and last.reward == 0.0
    # passing the public test only (1 2 -> 3) is not enough: the private ones decide
    env = _env(attempts=1)
    assert env.step(_turn(READ + "print(3)")).reward == 0.0
    # a turn without code ends the rollout: the last attempt so far is rewarded (none: 0)
    env = _env()
    assert env.step("I give up.").reward == 0.0
    env = _env()
    env.step(_turn(READ + "print(a+b+1)"))
    assert env.step("Done.").reward == 0.0
    # a limit ended the rollout: finish() judges the attempt in the turn step never saw
    env = _env()
    env.step(_turn(READ + "print(a*b)"))
    assert env.finish(_turn(READ + "print(a+b)")) == 1.0 and env.finish(None) == 1.0


def test_a_hostile_or_broken_program_is_an_error_observation():
    outs = {}
    for name in ("loop", "flood", "memory_bomb", "fork_bomb"):
        outs[name] = _env(max_chars=40).step(_turn(HOSTILE[name]))
    for name, obs in outs.items():
        assert not obs.done and obs.error and obs.text.startswith("Attempt 1 of 3 failed"), (name, obs)
    assert outs["loop"].timeout and "error: TimeoutError: stopped after 1 s" in outs["loop"].text
    assert outs["fork_bomb"].text.endswith("expected:\n3\nerror: TimeoutError: stopped after 1 s\n")
    assert outs["flood"].text.endswith("expected:\n3\nerror: output stopped at 65536 bytes\n")
    assert outs["memory_bomb"].text.endswith("expected:\n3\nerror: MemoryError\n")  # the error's last line
    long = _env(max_chars=40).step(_turn("print('x' * 5000)"))
    assert long.text.endswith("got:\n" + "x" * 40 + "... [cut at 40 characters]\n") and not long.error
    syntax = _env().step(_turn("print(("))
    assert syntax.error and not syntax.done and "SyntaxError" in syntax.text


def test_code_feedback_needs_a_code_problem():
    env = resolve_environment("code_feedback")()
    with pytest.raises(RunError, match="code_feedback runs code problems' tests; this row has none"):
        env.start("1+2=?", problem=Problem(id="x", prompt="1+2=?", answer="3"))
    with pytest.raises(SpecError, match=r"code_feedback\(\*\*task.environment_params\) fails \(ValueError: attempts"):
        resolve_environment("code_feedback", {"attempts": 0})
