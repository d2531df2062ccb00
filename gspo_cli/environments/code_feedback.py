"""`code_feedback`, the built-in environment of code problems (task `code`, LiveCodeBench-style).

Each model turn with a closed fenced code block is an attempt: the problem's public tests run
on it in the sandbox, and the failures (input, expected, got, or the error or time-out, each
field cut to `max_chars`) come back as the observation, until every public test passes or
`attempts` attempts were made. Then the rollout ends, and the last attempt's verdict on the
private tests is the environment's reward: 1.0 when it passes them all, else 0.0 (the reward
`env`, rewards/shipped.py). A turn without a code block ends the rollout too (the last attempt so
far is rewarded, 0.0 when there was none); so does a limit of the rollout (`finish`: an attempt
in the turn the limit cut counts).

Public tests: a LiveCodeBench row's `public_test_cases` (`num_public`); a synthetic problem's
first test, the example its prompt shows. Private tests: the others (all the tests when a
problem has no other).
"""

from __future__ import annotations

from gspo_cli.environments.protocol import Observation
from gspo_cli.errors import RunError
from gspo_cli.tasks.code_judge import JudgeSpec, compile_error, extract_code, judge_many, run_tests_shown

OUTPUT_LIMIT = 1 << 16  # bytes of stdout (and stderr) a test run may write


def _cut(text: str, limit: int) -> str:
    text = text.strip("\n")
    return text if len(text) <= limit else text[:limit] + f"... [cut at {limit} characters]"


class CodeFeedback:
    def __init__(
        self,
        attempts: int = 3,
        timeout_s: float = 2.0,
        memory_mb: int = 256,
        shown_failures: int = 2,
        max_chars: int = 200,
    ):
        if int(attempts) < 1 or int(shown_failures) < 1 or int(max_chars) < 1 or float(timeout_s) <= 0:
            raise ValueError("attempts, shown_failures and max_chars must be at least 1, timeout_s above 0")
        self.attempts, self.shown, self.max_chars = int(attempts), int(shown_failures), int(max_chars)
        self.timeout_s, self.memory_mb = float(timeout_s), int(memory_mb)
        self.public = self.private = None
        self.made = 0  # attempts so far
        self.last: str | None = None  # the last attempt's code

    def start(self, prompt: str, problem=None) -> None:
        meta = getattr(problem, "meta", None) or {}
        tests = tuple(meta.get("tests") or ())
        if not tests:
            raise RunError("task.environment: code_feedback runs code problems' tests; this row has none (task: code)")
        n = max(1, min(int(meta.get("num_public") or 1), len(tests)))
        spec = dict(
            func_name=meta.get("func_name"),
            lcb_imports=bool(meta.get("lcb_imports")),
            timeout_s=self.timeout_s,
            memory_mb=self.memory_mb,
        )
        self.public = JudgeSpec(tests=tests[:n], **spec)
        self.private = JudgeSpec(tests=tests[n:] or tests, **spec)
        return None

    def reward(self) -> float:
        """1.0 when the last attempt passes every private test, else 0.0 (no attempt: 0.0)."""
        if self.last is None:
            return 0.0
        return float(judge_many([(self.last, self.private)])[0].correct)

    def step(self, turn: str) -> Observation:
        code = extract_code(turn)
        if code is None:
            return Observation(None, done=True, reward=self.reward())
        self.made, self.last = self.made + 1, code
        why = compile_error(code)
        runs = None if why is not None else run_tests_shown(code, self.public, OUTPUT_LIMIT)
        if runs is not None and all(v.status == "pass" for v, _, _ in runs):
            return Observation(None, done=True, reward=self.reward())
        if self.made >= self.attempts:
            return Observation(None, done=True, reward=self.reward())
        left = self.attempts - self.made
        head = f"Attempt {self.made} of {self.attempts} failed ({left} left)."
        if why is not None:
            return Observation(f"{head}\n{_cut(why, self.max_chars)}\n", error=True)
        failed = [
            (i, t, v, res, got)
            for i, ((v, res, got), t) in enumerate(zip(runs, self.public.tests))
            if v.status != "pass"
        ]
        lines = [f"{head} {len(failed)} of {len(runs)} public tests failed."]
        for i, test, v, res, got in failed[: self.shown]:
            lines += [
                f"Test {i + 1}: input:",
                _cut(test.input, self.max_chars),
                "expected:",
                _cut(test.output, self.max_chars),
            ]
            if v.status == "fail":
                lines += ["got:", _cut(got, self.max_chars)]
            elif v.status == "timeout":
                lines.append(f"error: TimeoutError: stopped after {self.timeout_s:g} s")
            elif res.status == "output_limit":
                lines.append(f"error: output stopped at {OUTPUT_LIMIT} bytes")
            else:
                last = [ln for ln in v.stderr.splitlines() if ln.strip()][-1:] or [res.status.replace("_", " ")]
                lines.append("error: " + _cut(last[0], self.max_chars))  # the error's last line
        errors = [v.status for _, _, v, _, _ in failed]
        return Observation("\n".join(lines) + "\n", error=any(s != "fail" for s in errors), timeout="timeout" in errors)

    def finish(self, turn: str | None) -> float:
        """A limit ended the rollout: an attempt in the turn it cut (step did not see it) is the last."""
        code = extract_code(turn) if turn else None
        if code is not None:
            self.last = code
        return self.reward()
