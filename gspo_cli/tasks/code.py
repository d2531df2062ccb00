"""LiveCodeBench-style code tasks: write a Python program, judged by running it on tests.

Two sources behind one task (`source` param):

* ``synthetic`` (default): templated stdin/stdout problems a few-million-parameter model
  can learn by pattern from a cold start. A prompt reads like
  "Read two integers a and b. Print the larger of a and b, plus 3." with one example,
  and the reference is two lines, e.g. ``a,b=map(int,input().split())`` /
  ``print(max(a,b)+3)`` in a ```python fence (under 120 characters). To solve it the
  model must map the phrase to an expression and copy the constants: the difficulty
  knobs are the input kinds, the size of the constants, how often a second operation
  ("plus k", "times k") is added, and the number of hidden tests. Train and eval are
  split by problem (program and tests), as arithmetic splits by expression; `heldout:
  program` holds out whole programs instead, a test of composition that the built-in
  tiny model fails (it memorises phrase-to-program pairs: 2% on unseen programs while
  it solved 30-60% of the training ones).
* a LiveCodeBench JSONL file (see `lcb`): filtered by contest date and difficulty, for
  evaluation (training samples from the same rows, as the math task does).

Judging is LiveCodeBench's (see `code_judge`), every program runs in the sandbox.
"""

from __future__ import annotations

import hashlib
import random
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from gspo_cli.errors import SpecError
from gspo_cli.files import unreadable
from gspo_cli.sandbox.programs import detect_isolation
from gspo_cli.tasks.base import Problem, Score, Task, in_eval_split, problems_digest
from gspo_cli.tasks.code_judge import JudgeSpec, TestCase, extract_code, judge_many
from gspo_cli.tasks.lcb import REQUIRED_COLUMNS, LoadStats, lcb_prompt, load_lcb

Kind = Literal["pair", "int", "list", "word"]
SYNTHETIC_ONLY = (
    "kinds",
    "max_operand",
    "max_const",
    "modifiers",
    "modifier_prob",
    "num_tests",
    "eval_fraction",
    "heldout",
)
LCB_ONLY = ("date_from", "date_to", "difficulties")


class CodeParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str = Field("synthetic", min_length=1, description="synthetic | a LiveCodeBench .jsonl file")
    # The synthetic generator's difficulty knobs.
    kinds: tuple[Kind, ...] = Field(("pair", "int", "list", "word"), min_length=1, description="input shapes")
    max_operand: int = Field(20, ge=1, le=10**6, description="largest number in a test input")
    max_const: int = Field(9, ge=2, le=99, description="largest constant a prompt asks for")
    modifiers: str = Field("+*", pattern=r"^[+*]*$", description="second operations: + (plus k), * (times k)")
    modifier_prob: float = Field(0.5, ge=0, le=1, description="chance a numeric problem gets a second operation")
    num_tests: int = Field(3, ge=1, le=20, description="hidden tests per problem (the first is the example)")
    eval_fraction: float = Field(0.1, gt=0, lt=1, description="share of problems (or programs) held out")
    heldout: Literal["problem", "program"] = Field(
        "problem", description="hold out problems (a program may recur with other tests) or whole programs"
    )
    # LiveCodeBench filters (inclusive; contest_date is the problem's release date).
    date_from: date | None = None
    date_to: date | None = None
    difficulties: tuple[Literal["easy", "medium", "hard"], ...] | None = None
    # Judging.
    timeout_s: float = Field(2.0, gt=0, le=60, description="wall-clock seconds per test")
    memory_mb: int = Field(256, ge=64, le=16384, description="address-space cap per program")
    partial_reward: bool = Field(False, description="reward = fraction of tests passed when not all pass")
    format_weight: float = Field(0.0, ge=0, le=1, description="reward for a closed code block, right or wrong")


@dataclass(frozen=True)
class _Template:
    kind: Kind
    name: str
    phrase: str  # what to print; {k} is the constant
    expr: str  # the Python expression printed; {k} is the constant
    numeric: bool  # a number, so a second operation can follow

    @property
    def has_const(self) -> bool:
        return "{k}" in self.expr


_READERS: dict[str, tuple[str, str]] = {
    "pair": ("two integers a and b", "a,b=map(int,input().split())"),
    "int": ("an integer n", "n=int(input())"),
    "list": ("a list of integers x", "x=list(map(int,input().split()))"),
    "word": ("a word s", "s=input()"),
}
_TEMPLATES = (
    _Template("pair", "sum", "the sum of a and b", "a+b", True),
    _Template("pair", "diff", "a minus b", "a-b", True),
    _Template("pair", "prod", "the product of a and b", "a*b", True),
    _Template("pair", "max", "the larger of a and b", "max(a,b)", True),
    _Template("pair", "min", "the smaller of a and b", "min(a,b)", True),
    _Template("int", "plus", "n plus {k}", "n+{k}", True),
    _Template("int", "times", "n times {k}", "n*{k}", True),
    _Template("int", "square", "n squared", "n*n", True),
    _Template("int", "mod", "n modulo {k}", "n%{k}", True),
    _Template("list", "lsum", "the sum of x", "sum(x)", True),
    _Template("list", "lmax", "the largest number in x", "max(x)", True),
    _Template("list", "lmin", "the smallest number in x", "min(x)", True),
    _Template("list", "llen", "the length of x", "len(x)", True),
    _Template("list", "lsort", "x sorted", "*sorted(x)", False),
    _Template("word", "rev", "s reversed", "s[::-1]", False),
    _Template("word", "upper", "s in capitals", "s.upper()", False),
    _Template("word", "wlen", "the length of s", "len(s)", True),
    _Template("word", "repeat", "s {k} times", "s*{k}", False),
)
_SAFE_BUILTINS = {"max": max, "min": min, "sum": sum, "len": len, "sorted": sorted}


def _stdout_of(expr: str, env: dict) -> str:
    """What `print(expr)` writes, computed here (the expression is ours, not a model's)."""
    values = eval(f"({expr},)", {"__builtins__": _SAFE_BUILTINS}, env)
    return " ".join(str(v) for v in values) + "\n"


class CodeTask(Task):
    name = "code"

    def __init__(self, **params):
        self.p = CodeParams(**params)
        self.load_stats: LoadStats | None = None
        self.problems: list[Problem] = []
        self._templates = [t for t in _TEMPLATES if t.kind in self.p.kinds]
        synthetic = self.p.source == "synthetic"
        stray = sorted(set(LCB_ONLY if synthetic else SYNTHETIC_ONLY) & self.p.model_fields_set)
        if stray:
            other = "a LiveCodeBench file" if synthetic else "source: synthetic"
            raise SpecError(f"task.params.{stray[0]}: only used with {other} (source is {self.p.source})")
        if not synthetic:
            self.problems = self._load()
            self.train_pool = list(self.problems)
        detect_isolation()  # fail now, not with every reward 0, if no program can run here

    # -- problems ---------------------------------------------------------------------

    @property
    def num_problems(self) -> int | None:
        """How many problems the file holds; None for the (unbounded) synthetic source."""
        return None if self.p.source == "synthetic" else len(self.problems)

    def _load(self) -> list[Problem]:
        try:
            rows, stats = load_lcb(
                self.p.source, date_from=self.p.date_from, date_to=self.p.date_to, difficulties=self.p.difficulties
            )
        except (OSError, UnicodeDecodeError) as err:
            raise unreadable(self.p.source, err, "task.params.source") from None
        self.load_stats = stats
        if stats.malformed or stats.unsafe_pickle:
            warnings.warn(
                f"task.params.source: {self.p.source}: skipped {stats.malformed} malformed and "
                f"{stats.unsafe_pickle} unsafe rows of {stats.rows} ({stats.reasons})",
                stacklevel=2,
            )
        if not rows:
            raise SpecError(
                f"task.params.source: {self.p.source}: no problems left ({stats.rows} rows, "
                f"{stats.filtered_date} outside the dates, {stats.filtered_difficulty} of "
                f"other difficulties, {stats.malformed + stats.unsafe_pickle} unusable); "
                f"columns found: {', '.join(stats.columns) or 'none'}; accepted: LiveCodeBench "
                f"code_generation_lite rows ({', '.join(REQUIRED_COLUMNS)}, private_test_cases, metadata, ...)"
            )
        return [
            Problem(
                id=r.question_id,
                prompt=lcb_prompt(r),
                text=r.content,
                answer="",
                solution=None,
                meta={
                    "tests": r.tests,
                    "func_name": r.func_name,
                    "lcb_imports": True,
                    "num_public": r.num_public,
                    "platform": r.platform,
                    "difficulty": r.difficulty,
                    "contest_date": r.contest_date.isoformat(),
                    "title": r.title,
                },
            )
            for r in rows
        ]

    def _make(self, rng: random.Random) -> tuple[Problem, str]:
        """One synthetic problem and its split key (see `heldout`)."""
        t = rng.choice(self._templates)
        k = rng.randint(2, self.p.max_const)
        phrase, expr = t.phrase.format(k=k), t.expr.format(k=k)
        tag = f"{t.name}{k if t.has_const else ''}"
        if t.numeric and self.p.modifiers and rng.random() < self.p.modifier_prob:
            op, m = rng.choice(self.p.modifiers), rng.randint(2, self.p.max_const)
            phrase += f", plus {m}" if op == "+" else f", times {m}"
            # Parenthesise only an expression with an operator of its own: max(a,b)*3, (a+b)*3.
            inner = f"({expr})" if any(c in expr for c in "+-*%") else expr
            expr = f"{expr}+{m}" if op == "+" else f"{inner}*{m}"
            tag += f"{op}{m}"
        reader_text, reader_code = _READERS[t.kind]
        tests = tuple(self._test(t.kind, expr, rng) for _ in range(self.p.num_tests))
        program = f"{reader_code}\nprint({expr})"
        ex = tests[0]
        prompt = f"Read {reader_text}. Print {phrase}.\nInput: {ex.input.strip()}\nOutput: {ex.output.strip()}\n"
        digest = hashlib.sha256("|".join(x.input for x in tests).encode()).hexdigest()[:8]
        prob = Problem(
            id=f"{tag}#{digest}",
            prompt=prompt,
            answer=program,
            solution=f"```python\n{program}\n```",
            meta={"tests": tests, "template": t.name},
        )
        return prob, program if self.p.heldout == "program" else prob.id

    def _test(self, kind: str, expr: str, rng: random.Random) -> TestCase:
        hi = self.p.max_operand
        if kind == "pair":
            a, b = rng.randint(0, hi), rng.randint(0, hi)
            text, env = f"{a} {b}", {"a": a, "b": b}
        elif kind == "int":
            n = rng.randint(0, hi)
            text, env = str(n), {"n": n}
        elif kind == "list":
            x = [rng.randint(0, hi) for _ in range(rng.randint(1, 5))]
            text, env = " ".join(map(str, x)), {"x": x}
        else:
            s = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(1, 6)))
            text, env = s, {"s": s}
        return TestCase(input=text + "\n", output=_stdout_of(expr, env))

    def train_problems(self, rng: random.Random, n: int) -> list[Problem]:
        if self.train_pool is not None:
            return [rng.choice(self.train_pool) for _ in range(n)]
        out: list[Problem] = []
        while len(out) < n:
            prob, key = self._make(rng)
            if not in_eval_split(key, self.p.eval_fraction) and self.trainable(prob):
                out.append(prob)
        return out

    def eval_problems(self, n: int) -> list[Problem]:
        if self.p.source != "synthetic":
            return self.problems[:n]
        rng = random.Random(1234)
        out, seen = [], set()
        for _ in range(200 * max(n, 1)):
            if len(out) >= n:
                break
            prob, key = self._make(rng)
            if in_eval_split(key, self.p.eval_fraction) and prob.id not in seen:
                seen.add(prob.id)
                out.append(prob)
        return out

    # -- scoring ----------------------------------------------------------------------

    def judge_spec(self, problem: Problem) -> JudgeSpec:
        meta = problem.meta or {}
        return JudgeSpec(
            tests=tuple(meta.get("tests") or ()),
            func_name=meta.get("func_name"),
            lcb_imports=bool(meta.get("lcb_imports")),
            timeout_s=self.p.timeout_s,
            memory_mb=self.p.memory_mb,
        )

    def score(self, problem: Problem, completion: str) -> Score:
        return self.score_batch([problem], [completion])[0]

    def score_batch(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[Score]:
        """Scores of completions[i] for problems[i], all programs judged in parallel: use
        this for a whole rollout batch (one `score` call judges one program at a time)."""
        codes = [extract_code(c) if isinstance(c, str) else None for c in completions]
        verdicts = judge_many(
            [(code, self.judge_spec(p)) for code, p in zip(codes, problems)], all_tests=self.p.partial_reward
        )
        scores = []
        for code, v in zip(codes, verdicts):
            fmt = 0.0 if code is None else 1.0
            base = 1.0 if v.correct else v.pass_frac if self.p.partial_reward else 0.0
            scores.append(
                Score(
                    reward=base + self.p.format_weight * fmt,
                    correct=v.correct,
                    components={
                        "correct": float(v.correct),
                        "pass_frac": v.pass_frac,
                        "timeout": float(v.timeout),
                        "runtime_error": float(v.runtime_error),
                        "format": fmt,
                    },
                    detail={"tests": [t.record() for t in v.tests], **({"no_code": True} if v.no_code else {})},
                )
            )
        return scores

    def fingerprint(self) -> str:
        if self.p.source == "synthetic":
            # Only what changes the problems: judging knobs do not change the cold start.
            return f"{self.name}:{self.p.model_dump_json(include=set(SYNTHETIC_ONLY))}"
        # By content (problems, tests), not the file's size and time: a file fixed in place is new data.
        filters = self.p.model_dump_json(include=set(LCB_ONLY))
        return f"{self.name}:{problems_digest(self.problems)}:{filters}"
