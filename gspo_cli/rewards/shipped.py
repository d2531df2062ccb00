"""The reward functions we ship (`SHIPPED`), each built for the task it scores:
`math_accuracy` (the math task's answer check), `code_tests` (the code task's tests) and `env`
(the environment's own reward, `environments.protocol.env_reward`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gspo_cli.environments.protocol import env_reward
from gspo_cli.errors import SpecError
from gspo_cli.tasks.base import Problem, Task
from gspo_cli.tasks.math_answer import answers_match, extract_answer

# A shipped reward is built for the task it scores: factory(task) -> fn(problems, completions).
ShippedFactory = Callable[[Task], Callable[[Sequence[Problem], Sequence[str]], list[float]]]


def _math_accuracy(task: Task) -> Callable[[Sequence[Problem], Sequence[str]], list[float]]:
    """1 when the completion's final answer (\\boxed{}, else "the answer is X") matches the
    problem's `answer`, as the math task judges it; else 0."""

    def fn(problems, completions):
        return [float(answers_match(p.answer, extract_answer(c))) for p, c in zip(problems, completions)]

    return fn


def _code_tests(task: Task) -> Callable[[Sequence[Problem], Sequence[str]], list[float]]:
    """1 when the program passes every test of the code task's problem; else 0."""
    if task.name != "code":
        raise SpecError(f"task.rewards: code_tests judges code problems; task.name is {task.name}")

    def fn(problems, completions):
        return [float(s.correct) for s in task.score_batch(problems, completions)]

    return fn


SHIPPED: dict[str, ShippedFactory] = {"math_accuracy": _math_accuracy, "code_tests": _code_tests}
SHIPPED["env"] = env_reward  # the task.environment's own reward
