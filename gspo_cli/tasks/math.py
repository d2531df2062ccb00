r"""AIME-style math: a problem, free-form reasoning, a final answer in \boxed{}.

`source` picks the problems:

- ``synthetic`` (default): the templated integer arithmetic of `ArithmeticTask`, with its
  difficulty knobs (`num_operands`, `max_operand`, `operators`). The problems, and the
  random draws that make them, are exactly arithmetic's, so a spec switched from
  ``arithmetic`` to ``math`` keeps its calibration and its cached cold start.
- a local file (``.jsonl``, ``.json``, ``.parquet``), a `save_to_disk` directory or
  ``hub:<dataset id>``, its columns found as `math_rows` says (problem/question/chat prompt,
  answer / GSM8K ``####`` / DAPO ``reward_model.ground_truth`` / a \boxed{} in the solution,
  optional solution, id and a numeric ``rating``/``difficulty``) or mapped by ``columns``.
  Rows without a problem or an answer are skipped with a warning saying how many. The
  held-out set is the file in its order; training draws from `train_pool`, which the trainer
  strips of every evaluation problem (`Task.exclude`).

Scoring (see `math_answer`): the last \boxed{} answer, else with `answer_fallbacks` the last
"the answer is X" / "Answer: X"; integers compared as numbers (033 = 33), anything else by
math-verify. Reward = correct + format_weight x (a \boxed{} is present).
"""

from __future__ import annotations

import hashlib
import json
import random
import warnings
from typing import Any

from pydantic import Field, field_validator

from gspo_cli.errors import SpecError
from gspo_cli.tasks.arithmetic import ArithmeticParams, ArithmeticTask
from gspo_cli.tasks.base import Problem, Score, Task, extract_boxed
from gspo_cli.tasks.math_answer import answers_match, extract_answer, normalize_answer
from gspo_cli.tasks.math_rows import ROLES, accepted_columns, read_math_row
from gspo_cli.tasks.records import columns_of, load_records

DEFAULT_TEMPLATE = "{problem}\n\nPlease reason step by step, and put your final answer within \\boxed{}.\n"
SYNTHETIC_ONLY = ("num_operands", "max_operand", "operators")


class MathParams(ArithmeticParams):
    """Arithmetic's difficulty knobs (used by the synthetic source only), plus the data source."""

    source: str = Field("synthetic", min_length=1, description="synthetic | a .jsonl/.json/.parquet file | hub:<id>")
    split: str = Field("train", description="dataset split, for hub: sources")
    prompt_template: str = Field(DEFAULT_TEMPLATE, description="prompt for dataset problems; {problem} is replaced")
    answer_fallbacks: bool = Field(True, description='also accept "the answer is X" / "Answer: X" without a box')
    columns: dict[str, str] = Field(
        default_factory=dict,
        description="dataset columns by role, e.g. {problem: question, answer: reward_model.ground_truth}",
    )

    @field_validator("columns")
    @classmethod
    def _known_roles(cls, v: dict[str, str]) -> dict[str, str]:
        unknown = sorted(set(v) - set(ROLES))
        if unknown:
            raise ValueError(f"unknown role {unknown[0]!r}; roles: {', '.join(ROLES)}")
        return v

    @field_validator("prompt_template")
    @classmethod
    def _has_slot(cls, v: str) -> str:
        if "{problem}" not in v:
            raise ValueError("must contain {problem}")
        return v


class MathTask(Task):
    name = "math"
    synthetic_params = SYNTHETIC_ONLY  # dropped by `gspo eval --dataset` when it swaps the source

    def __init__(self, **params):
        self.p = MathParams(**params)
        self._synthetic: ArithmeticTask | None = None
        self.problems: list[Problem] = []
        if self.p.source == "synthetic":
            self._synthetic = ArithmeticTask(**self.p.model_dump(include=set(ArithmeticParams.model_fields)))
            return
        stray = sorted(set(SYNTHETIC_ONLY) & self.p.model_fields_set)
        if stray:
            raise SpecError(f"task.params.{stray[0]}: only used with source: synthetic (source is {self.p.source})")
        self.problems = load_math_problems(
            self.p.source, split=self.p.split, template=self.p.prompt_template, columns=self.p.columns
        )
        self.train_pool = list(self.problems)

    @property
    def num_problems(self) -> int | None:
        """How many problems the dataset holds; None for the (unbounded) synthetic source."""
        return None if self._synthetic is not None else len(self.problems)

    def train_problems(self, rng: random.Random, n: int) -> list[Problem]:
        if self._synthetic is not None:
            return self._synthetic.train_problems(rng, n)
        return [rng.choice(self.train_pool) for _ in range(n)]

    def exclude(self, problems, what: str = "the evaluation sets") -> int | None:
        problems = list(problems)
        if self._synthetic is not None:
            problems = [p for p in problems if not self._synthetic.never_drawn(p)]
            self._synthetic.exclude(problems, what)
        return super().exclude(problems, what)

    def eval_problems(self, n: int) -> list[Problem]:
        if self._synthetic is not None:
            return self._synthetic.eval_problems(n)
        return self.problems[:n]

    def extract_answer(self, completion: str) -> str | None:
        """The completion's final answer, normalised (what majority voting counts), or None."""
        raw = extract_answer(completion, fallbacks=self.p.answer_fallbacks)
        return normalize_answer(raw) if raw is not None else None

    def score(self, problem: Problem, completion: str) -> Score:
        correct = answers_match(problem.answer, extract_answer(completion, fallbacks=self.p.answer_fallbacks))
        fmt = 1.0 if extract_boxed(completion) is not None else 0.0
        reward = float(correct) + self.p.format_weight * fmt
        return Score(reward=reward, correct=correct, components={"correct": float(correct), "format": fmt})

    def fingerprint(self) -> str:
        if self._synthetic is not None:
            # Same problems as arithmetic with these knobs, so the same cached cold start.
            return self._synthetic.fingerprint()
        digest = hashlib.sha256(
            json.dumps([(p.prompt, p.answer, p.solution) for p in self.train_pool]).encode()
        ).hexdigest()
        return f"{self.name}:{digest[:16]}"


def load_math_problems(
    source: str, *, split: str = "train", template: str = DEFAULT_TEMPLATE, columns: dict[str, str] | None = None
) -> list[Problem]:
    """Problems from a dataset file, saved dataset or hub id (columns: see `math_rows`).

    SpecError when the file cannot be read, holds no usable row (naming the columns it has and
    the ones accepted), or repeats an id.
    """
    columns = {k: v.lower() for k, v in (columns or {}).items()}
    rows = load_records(source, split=split)
    problems, skipped, repeats, seen = [], 0, 0, {}
    for i, row in enumerate(rows):
        got = read_math_row(row, columns)
        if got is None:
            skipped += 1
            continue
        pid = got.id if got.id is not None else str(i)
        if pid in seen:
            if seen[pid] == (got.text, got.answer):  # exports repeat rows (DAPO-Math-17k): keep one
                repeats += 1
                continue
            raise SpecError(f"task.params.source: {source}: duplicate id {pid!r} (ids must be unique)")
        seen[pid] = (got.text, got.answer)
        problems.append(
            Problem(
                id=pid,
                prompt=template.replace("{problem}", got.text),
                answer=got.answer,
                solution=_reference(got.solution, got.answer),
                meta=_meta(row),
                text=got.text,
            )
        )
    if not problems:
        found = ", ".join(columns_of(rows)) or "none"
        raise SpecError(
            f"task.params.source: {source}: no usable problems ({len(rows)} rows, none with both a problem and "
            f"an answer); columns found: {found}; accepted: {accepted_columns(columns)}"
        )
    if repeats:
        warnings.warn(f"task.params.source: {source}: kept one of each repeated row ({repeats} repeats)", stacklevel=2)
    if skipped:
        warnings.warn(
            f"task.params.source: {source}: skipped {skipped} of {len(rows)} rows without a problem or an answer",
            stacklevel=2,
        )
    return problems


def _reference(solution: str | None, answer: str) -> str:
    """A worked solution ending in the boxed answer, as the cold start expects; a row with no
    solution gives the boxed answer alone (the cold start then learns the format only)."""
    if solution is None:
        return f"\\boxed{{{answer}}}"
    return solution if extract_boxed(solution) is not None else f"{solution}\n\\boxed{{{answer}}}"


def _meta(row: dict[str, Any]) -> dict[str, Any] | None:
    meta = {
        k: row[k]
        for k in ("rating", "difficulty")
        if isinstance(row.get(k), (int, float)) and not isinstance(row.get(k), bool)
    }
    return meta or None
