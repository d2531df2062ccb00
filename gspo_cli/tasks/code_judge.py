"""Judging code completions the way LiveCodeBench does, on top of the sandbox (`gspo_cli.sandbox.programs`).

* The program is the completion's last *closed* fenced block (```python ... ``` or
  ``` ... ```); an unclosed trailing block (a generation cut off by the token limit) does
  not count.
* stdin tests: the outputs are compared as lines after stripping the whole output and
  each line; two lines match when their whitespace-separated tokens pair up, each pair
  equal as text or as numbers (Decimal: "1.0" equals "1"). Blank lines inside count.
* functional (LeetCode-style) tests: a harness appended to the program instantiates
  `Solution()` and calls its method `func_name` (or calls a top-level `func_name`), with
  one argument per line of the test input, each line a JSON value; the returned value
  (tuples become lists) must equal the expected JSON. The harness runs in the sandbox.
* A sample is correct only if every test passes. By default judging stops at the first
  failing test, as LiveCodeBench does; `all_tests=True` runs them all (partial credit).
  Either way a program that times out on its first test is not run on the others: they
  would time out too, and each would hold a core for the whole timeout.
"""

from __future__ import annotations

import json
import secrets
import sys
import threading
import warnings
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Literal

from gspo_cli.sandbox.programs import Job, RunResult, detect_isolation, run_many

# What LiveCodeBench puts above every program, so that solutions using `List`, `deque` or
# `gcd` without importing them behave as they do there (used for LCB rows only).
LCB_IMPORTS = (
    "from string import *\nfrom re import *\nfrom datetime import *\nfrom collections import *\n"
    "from heapq import *\nfrom bisect import *\nfrom copy import *\nfrom math import *\n"
    "from random import *\nfrom statistics import *\nfrom itertools import *\nfrom functools import *\n"
    "from operator import *\nfrom io import *\nfrom sys import *\nfrom json import *\n"
    "from builtins import *\nfrom typing import *\nimport string, re, datetime, collections, heapq, "
    "bisect, copy, math, random, statistics, itertools, functools, operator, io, sys, json\n"
    "sys.setrecursionlimit(50000)\n"
)

_HARNESS = """
def _gspo_judge_main():
    import sys as _sys, json as _json
    _args = [_json.loads(_l) for _l in _sys.stdin.read().split("\\n") if _l.strip()]
    _cls = globals().get("Solution")
    if isinstance(_cls, type) and hasattr(_cls, {name!r}):
        _fn = getattr(_cls(), {name!r})
    else:
        _fn = globals()[{name!r}]
    _res = _fn(*_args)
    if isinstance(_res, tuple):
        _res = list(_res)
    _sys.stdout.flush()
    _sys.stdout.write("\\n{sentinel}" + _json.dumps(_res) + "\\n")
_gspo_judge_main()
"""


@dataclass(frozen=True)
class TestCase:
    __test__ = False  # not a pytest class, despite the name

    input: str
    output: str
    kind: Literal["stdin", "functional"] = "stdin"


@dataclass(frozen=True)
class JudgeSpec:
    """Everything that decides a verdict besides the program (hashable: a cache key)."""

    tests: tuple[TestCase, ...]
    func_name: str | None = None  # required when the tests are functional
    lcb_imports: bool = False
    timeout_s: float = 2.0  # per test, wall clock
    memory_mb: int = 256


STDERR_LINES = 3  # of a failing test's stderr kept in its TestVerdict (the last lines: the error)
STDERR_CHARS = 300


@dataclass(frozen=True)
class TestVerdict:
    """One test's outcome: pass, fail (ran, wrong output), timeout, error (crashed, out of
    memory or output, killed, or did not compile) or not_run (judging stopped earlier), with
    the last STDERR_LINES lines of its stderr (at most STDERR_CHARS characters)."""

    __test__ = False  # not a pytest class, despite the name

    status: Literal["pass", "fail", "timeout", "error", "not_run"]
    stderr: str = ""

    def record(self) -> dict[str, str]:
        return {"status": self.status, **({"stderr": self.stderr} if self.stderr else {})}


def _stderr_tail(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return "\n".join(lines[-STDERR_LINES:])[-STDERR_CHARS:]


@dataclass(frozen=True)
class Verdict:
    passed: int
    total: int
    timeout: bool = False  # some test timed out
    runtime_error: bool = False  # some test crashed, or the program does not compile
    no_code: bool = False  # the completion has no closed code block
    # Per test, in order (eval rows show them); () for a verdict built without running anything.
    tests: tuple[TestVerdict, ...] = field(default=(), compare=False)

    @property
    def correct(self) -> bool:
        return self.total > 0 and self.passed == self.total

    @property
    def pass_frac(self) -> float:
        """Passed tests over all tests; tests never run (after a failure) count as failed."""
        return self.passed / self.total if self.total else 0.0


def extract_code(completion: str) -> str | None:
    """Body of the last closed ``` fence, or None (no block, or only blank ones)."""
    blocks: list[str] = []
    current: list[str] | None = None
    for line in completion.split("\n"):
        if line.strip().startswith("```"):
            if current is None:
                current = []
            else:
                blocks.append("\n".join(current))
                current = None
        elif current is not None:
            current.append(line)
    for block in reversed(blocks):
        if block.strip():
            return block
    return None


def _as_decimal(token: str) -> Decimal | None:
    try:
        value = Decimal(token)
    except (InvalidOperation, ValueError):
        return None
    return None if value.is_nan() else value


def outputs_match(got: str, expected: str) -> bool:
    """LiveCodeBench's stdout comparison (see the module docstring)."""
    got_lines = [ln.strip() for ln in got.strip().split("\n")]
    exp_lines = [ln.strip() for ln in expected.strip().split("\n")]
    if len(got_lines) != len(exp_lines):
        return False
    for g, e in zip(got_lines, exp_lines):
        if g == e:
            continue
        g_tok, e_tok = g.split(), e.split()
        if len(g_tok) != len(e_tok):
            return False
        for a, b in zip(g_tok, e_tok):
            if a == b:
                continue
            da, db = _as_decimal(a), _as_decimal(b)
            if da is None or db is None or da != db:
                return False
    return True


def compile_error(code: str) -> str | None:
    """Why the sandbox's interpreter would refuse `code` (`SyntaxError: ... (line 2)`), checked
    here without running it (a syntax error is the commonest failure of a small model; this
    skips the subprocess); None when it compiles, or when the sandbox runs another Python
    version (then we cannot tell)."""
    version = detect_isolation().python_version
    if version != sys.version_info[:2]:
        return None
    try:
        with warnings.catch_warnings():
            # SyntaxWarnings about a model's code ("invalid decimal literal") are not ours to show.
            warnings.simplefilter("ignore")
            compile(code, "<completion>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError) as err:
        line = getattr(err, "lineno", None)
        msg = getattr(err, "msg", None) or str(err)
        return f"{type(err).__name__}: {msg}" + (f" (line {line})" if line else "")
    return None


def _program(code: str, spec: JudgeSpec, sentinel: str) -> str:
    head = LCB_IMPORTS if spec.lcb_imports else ""
    if spec.tests and spec.tests[0].kind == "functional":
        return head + code + "\n" + _HARNESS.format(name=spec.func_name or "", sentinel=sentinel)
    return head + code


def _passes(test: TestCase, res: RunResult, sentinel: str) -> bool:
    if res.status != "ok":
        return False
    if test.kind == "stdin":
        return outputs_match(res.stdout, test.output)
    at = res.stdout.rfind(sentinel)
    if at < 0:
        return False
    try:
        got = json.loads(res.stdout[at + len(sentinel) :].split("\n", 1)[0])
        return got == json.loads(test.output)
    except (ValueError, RecursionError):
        return False


_cache_lock = threading.Lock()
_cache: OrderedDict[tuple, Verdict] = OrderedDict()
_CACHE_SIZE = 8192  # rollouts of one group often repeat a program verbatim


def judge_many(
    items: Sequence[tuple[str | None, JudgeSpec]], *, all_tests: bool = False, output_limit_bytes: int = 1 << 20
) -> list[Verdict]:
    """Verdicts for (program, spec) pairs, running every sandboxed test of the batch in
    parallel. A program of None (nothing extracted) fails without running. Results are
    cached per process by (program, spec, all_tests). Never raises for a bad program."""
    verdicts: list[Verdict | None] = [None] * len(items)
    pending: dict[tuple, list[int]] = {}  # one run per distinct (program, spec) in the batch
    for i, (code, spec) in enumerate(items):
        key = (code, spec, all_tests)
        if not spec.tests:
            verdicts[i] = Verdict(passed=0, total=0)
        elif code is None:
            not_run = (TestVerdict("not_run"),) * len(spec.tests)
            verdicts[i] = Verdict(passed=0, total=len(spec.tests), no_code=True, tests=not_run)
        elif key in pending:
            pending[key].append(i)
        elif (hit := _cache_get(key)) is not None:
            verdicts[i] = hit
        elif (why := compile_error(code)) is not None:
            rest = (TestVerdict("not_run"),) * (len(spec.tests) - 1)
            verdicts[i] = Verdict(
                passed=0, total=len(spec.tests), runtime_error=True, tests=(TestVerdict("error", why), *rest)
            )
        else:
            pending[key] = [i]
    if pending:
        for key, verdict in zip(pending, _run_tests(list(pending), all_tests, output_limit_bytes)):
            for i in pending[key]:
                verdicts[i] = verdict
            if not verdict.timeout:  # a timeout may be the machine's load: judge it again
                _cache_put(key, verdict)
    return verdicts  # type: ignore[return-value]


def _run_tests(keys: list[tuple], all_tests: bool, output_limit_bytes: int) -> list[Verdict]:
    sentinel = "@@gspo-result-" + secrets.token_hex(8) + "@@"
    programs = [_program(code, spec, sentinel) for code, spec, _ in keys]
    specs = [spec for _, spec, _ in keys]

    def jobs(pairs: list[tuple[int, int]]) -> list[Job]:
        return [
            Job(programs[k], specs[k].tests[t].input, specs[k].timeout_s, specs[k].memory_mb, output_limit_bytes)
            for k, t in pairs
        ]

    # Phase 1: the first test of every program; phase 2: the other tests, where worth it.
    runs = [[r] for r in run_many(jobs([(k, 0) for k in range(len(keys))]))]
    rest = [
        (k, t)
        for k in range(len(keys))
        for t in range(1, len(specs[k].tests))
        if runs[k][0].status != "timeout" and (all_tests or _passes(specs[k].tests[0], runs[k][0], sentinel))
    ]
    for (k, _), res in zip(rest, run_many(jobs(rest))):
        runs[k].append(res)
    return [
        Verdict(
            passed=sum(_passes(spec.tests[t], r, sentinel) for t, r in enumerate(rs)),
            total=len(spec.tests),
            timeout=any(r.status == "timeout" for r in rs),
            runtime_error=any(r.status not in ("ok", "timeout") for r in rs),
            tests=tuple(_test_verdict(spec.tests[t], r, sentinel) for t, r in enumerate(rs))
            + (TestVerdict("not_run"),) * (len(spec.tests) - len(rs)),
        )
        for spec, rs in zip(specs, runs)
    ]


def run_tests_shown(
    code: str, spec: JudgeSpec, output_limit_bytes: int = 1 << 16
) -> list[tuple[TestVerdict, RunResult, str]]:
    """Every test of `spec` run on `code` (in parallel, uncached), each as (verdict, the run,
    what it returned: a stdin test's stdout, a functional test's value as JSON, or its stdout
    when it returned none): what code_feedback shows the model."""
    sentinel = "@@gspo-result-" + secrets.token_hex(8) + "@@"
    program = _program(code, spec, sentinel)
    jobs = [Job(program, t.input, spec.timeout_s, spec.memory_mb, output_limit_bytes) for t in spec.tests]
    out = []
    for test, res in zip(spec.tests, run_many(jobs)):
        got, at = res.stdout, res.stdout.rfind(sentinel)
        if test.kind == "functional" and at >= 0:
            got = res.stdout[at + len(sentinel) :].split("\n", 1)[0]
        out.append((_test_verdict(test, res, sentinel), res, got))
    return out


def _test_verdict(test: TestCase, res: RunResult, sentinel: str) -> TestVerdict:
    if _passes(test, res, sentinel):
        return TestVerdict("pass")
    if res.status == "timeout":
        return TestVerdict("timeout", _stderr_tail(res.stderr))
    if res.status == "ok":
        return TestVerdict("fail", _stderr_tail(res.stderr))
    # crashed, or stopped by a limit: say which when the program itself printed nothing
    return TestVerdict("error", _stderr_tail(res.stderr) or res.status.replace("_", " "))


def _cache_get(key: tuple) -> Verdict | None:
    with _cache_lock:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
        return hit


def _cache_put(key: tuple, verdict: Verdict) -> None:
    with _cache_lock:
        _cache[key] = verdict
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
