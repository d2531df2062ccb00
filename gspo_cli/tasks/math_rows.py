r"""Math rows in the schemas datasets are published in: which column holds the problem, the
final answer, a worked solution and the id.

Defaults (first present wins; columns are matched lower-cased, a dotted name reads inside a
nested object):

- problem: ``problem``, ``question``, ``query``, ``prompt``, ``messages``; a chat list
  (``[{"role": "user", "content": ...}, ...]``, as in DAPO-Math-17k's ``prompt`` or SFT
  ``messages``) gives its first user message.
- answer: ``answer``, ``final_answer``, ``expected_answer``, ``reward_model.ground_truth``
  (DAPO-Math-17k), ``ground_truth``; a GSM8K answer ("reasoning ... #### 72") gives what
  follows ``####``, its reasoning becoming the solution; with no answer column, the last
  ``\boxed{}`` of the solution (MATH-style exports).
- solution: ``solution``, else the last assistant message of a chat list.
- id: ``id``, ``unique_id``, ``problem_idx``, ``extra_info.index``; else the row's position.

`task.params.columns` maps any of problem/answer/solution/id to another column, e.g.
``{problem: question, answer: reward_model.ground_truth}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gspo_cli.tasks.base import extract_boxed

DEFAULT_COLUMNS: dict[str, tuple[str, ...]] = {
    "problem": ("problem", "question", "query", "prompt", "messages"),
    "answer": ("answer", "final_answer", "expected_answer", "reward_model.ground_truth", "ground_truth"),
    "solution": ("solution", "messages"),
    "id": ("id", "unique_id", "problem_idx", "extra_info.index"),
}
ROLES = tuple(DEFAULT_COLUMNS)


@dataclass(frozen=True)
class MathRow:
    id: str | None
    text: str
    answer: str
    solution: str | None  # a worked solution as the file gives it (None: answer only)


def lookup(row: dict[str, Any], name: str) -> Any:
    """row[name], reading a dotted name inside nested objects (None when absent)."""
    value: Any = row
    for part in name.lower().split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def read_math_row(row: dict[str, Any], columns: dict[str, str]) -> MathRow | None:
    """The problem, answer, solution and id of one row (see the module docstring); None when
    it has no problem or no answer. `columns` overrides the default column of a role."""

    def first(role: str, convert) -> Any:
        names = (columns[role],) if role in columns else DEFAULT_COLUMNS[role]
        return next((v for n in names if (v := convert(lookup(row, n), role)) is not None), None)

    text = first("problem", _text)
    solution = first("solution", _text)
    answer = first("answer", _answer)
    if answer is not None and "####" in answer:  # GSM8K: reasoning, then "#### 72"
        reasoning, _, final = answer.rpartition("####")
        answer = final.strip().replace(",", "") or None
        if solution is None and reasoning.strip():
            solution = reasoning.strip()
    if answer is None and solution is not None:
        answer = extract_boxed(solution)
        answer = answer.strip() if answer and answer.strip() else None
    if text is None or answer is None:
        return None
    pid = first("id", _answer)
    return MathRow(id=pid, text=text, answer=answer, solution=solution)


def accepted_columns(columns: dict[str, str]) -> str:
    """What a math file may hold, for the error that lists what it holds instead."""
    names = {r: (columns[r],) if r in columns else DEFAULT_COLUMNS[r] for r in ("problem", "answer", "solution")}
    return (
        f"problem from {'/'.join(names['problem'])}; answer from {'/'.join(names['answer'])}, "
        f"or a \\boxed{{}} in {'/'.join(names['solution'])}; map others with task.params.columns"
    )


def _text(v: Any, role: str) -> str | None:
    """A non-empty string, or the right message of a chat list (user: problem, assistant: solution)."""
    if isinstance(v, list):
        want = "user" if role == "problem" else "assistant"
        msgs = [m for m in v if isinstance(m, dict) and m.get("role") == want and isinstance(m.get("content"), str)]
        if not msgs:
            return None
        v = (msgs[0] if role == "problem" else msgs[-1])["content"]
    return v.strip() if isinstance(v, str) and v.strip() else None


def _answer(v: Any, role: str = "answer") -> str | None:
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, float):
        return str(int(v)) if v.is_integer() else repr(v)  # parquet turns int columns with gaps into floats
    if isinstance(v, (int, str)):
        s = str(v).strip()
        return s or None
    return None
