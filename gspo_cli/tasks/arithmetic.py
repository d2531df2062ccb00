r"""Synthetic integer arithmetic with templated step-by-step reasoning and a \boxed{} answer.

Learnable by pattern for a few-million-parameter model: each step rewrites one operation
("23+45=68"), so the policy can improve by getting individual carries right. Difficulty is
set by the number of operands and their size.
"""

from __future__ import annotations

import random
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from gspo_cli.tasks.base import Problem, Score, Task, extract_boxed, in_eval_split


class ArithmeticParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    num_operands: int = Field(3, ge=2, le=8)
    max_operand: int = Field(99, ge=1, le=10**6)
    operators: str = Field("+-", pattern=r"^[+\-*]+$")
    format_weight: float = Field(0.0, ge=0, le=1, description="reward for a \\boxed{} answer, wrong or right")
    style: Literal["steps", "rewrite", "tool"] = Field(
        "steps",
        description="worked solution: steps writes each operation ('3+5=8 8-2=6'); rewrite writes the "
        "whole remaining expression after each one ('=8-2+7 =6+7 =13'), longer responses in which "
        "each line is a local edit of the one before; tool calls Python on the expression and copies "
        "its output (for task.environment: python; the output block is the tool's, never trained on)",
    )


class ArithmeticTask(Task):
    name = "arithmetic"

    def __init__(self, **params):
        self.p = ArithmeticParams(**params)

    def _make(self, rng: random.Random) -> Problem:
        nums = [rng.randint(0, self.p.max_operand) for _ in range(self.p.num_operands)]
        ops = [rng.choice(self.p.operators) for _ in range(self.p.num_operands - 1)]
        expr = str(nums[0]) + "".join(f"{o}{n}" for o, n in zip(ops, nums[1:]))
        # Evaluate left to right, as the worked solution does.
        acc, steps = nums[0], []
        for o, n in zip(ops, nums[1:]):
            new = acc + n if o == "+" else acc - n if o == "-" else acc * n
            steps.append(f"{acc}{o}{n}={new}")
            acc = new
        if self.p.style == "rewrite":
            # After operation i, the value so far followed by the operations not yet done.
            values = [int(st.rsplit("=", 1)[1]) for st in steps]
            lines = [
                f"={v}" + "".join(f"{o}{n}" for o, n in zip(ops[i + 1 :], nums[i + 2 :])) for i, v in enumerate(values)
            ]
            solution = " ".join(lines) + f" \\boxed{{{acc}}}"
        elif self.p.style == "tool":  # left to right, as the task evaluates: parenthesised
            code = str(nums[0])
            for i, (o, n) in enumerate(zip(ops, nums[1:])):
                code = f"({code}{o}{n})" if i < len(ops) - 1 else f"{code}{o}{n}"
            solution = f"```python\nprint({code})\n```\n```output\n{acc}\n```\n\\boxed{{{acc}}}"  # RAW_WRAP
        else:
            solution = " ".join(steps) + f" \\boxed{{{acc}}}"
        return Problem(id=expr, prompt=f"{expr}=?\n", answer=str(acc), solution=solution)

    def never_drawn(self, problem: Problem) -> bool:
        """One of this generator's held-out problems: training never draws it already."""
        return problem.prompt == f"{problem.id}=?\n" and in_eval_split(problem.id)

    def exclude(self, problems, what: str = "the evaluation sets") -> int | None:
        # Excluding a held-out problem changes no draw, so it stays out of `excluded` and of the
        # built-in model's cache key: evaluation sets cut from the held-out split share its cold start.
        return super().exclude([p for p in problems if not self.never_drawn(p)], what)

    def train_problems(self, rng: random.Random, n: int) -> list[Problem]:
        out: list[Problem] = []
        while len(out) < n:
            prob = self._make(rng)
            if not in_eval_split(prob.id) and self.trainable(prob):
                out.append(prob)
        return out

    def eval_problems(self, n: int) -> list[Problem]:
        rng = random.Random(1234)
        out, seen = [], set()
        for _ in range(200 * max(n, 1)):
            if len(out) >= n:
                break
            prob = self._make(rng)
            if in_eval_split(prob.id) and prob.id not in seen:
                seen.add(prob.id)
                out.append(prob)
        return out

    def score(self, problem: Problem, completion: str) -> Score:
        boxed = extract_boxed(completion)
        correct = False
        if boxed is not None:
            try:
                correct = int(boxed.strip()) == int(problem.answer)
            except ValueError:
                correct = False
        fmt = 1.0 if boxed is not None else 0.0
        reward = float(correct) + self.p.format_weight * fmt
        return Score(reward=reward, correct=correct, components={"correct": float(correct), "format": fmt})

    def fingerprint(self) -> str:
        # The default style stays out of the fingerprint: caches made before the field existed stay valid.
        return f"{self.name}:{self.p.model_dump_json(exclude={'style'} if self.p.style == 'steps' else None)}"
