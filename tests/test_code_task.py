"""The code task: extraction, LiveCodeBench-style comparison and harness, the JSONL
loader (including the pickled and the malicious test-case encodings), the synthetic
generator and the rewards."""

from __future__ import annotations

import base64
import json
import os
import pickle
import random
import warnings
import zlib
from datetime import date
from pathlib import Path

import pytest

from gspo_cli.errors import SpecError
from gspo_cli.tasks import Problem, make_task
from gspo_cli.tasks.base import in_eval_split
from gspo_cli.tasks.code_judge import JudgeSpec, TestCase, extract_code, judge_many, outputs_match
from gspo_cli.tasks.lcb import UnsafePickle, decode_tests, load_lcb, safe_unpickle

FIXTURE = Path(__file__).parent / "fixtures" / "lcb_sample.jsonl"
PWNED = Path("/tmp/gspo-lcb-pickle-pwned")  # what the fixture's malicious pickle would create


def fence(code: str, lang: str = "python") -> str:
    return f"```{lang}\n{code}\n```"


# -- extraction ------------------------------------------------------------------------


def test_extract_takes_the_last_closed_block():
    text = "Plan:\n```python\nprint(1)\n```\nBetter:\n```\nprint(2)\n```\nDone."
    assert extract_code(text) == "print(2)"
    assert extract_code(fence("x = 1\nprint(x)", "py")) == "x = 1\nprint(x)"
    assert extract_code("  ```python\n    print(3)\n  ```") == "    print(3)"


def test_extract_ignores_unclosed_empty_and_missing_blocks():
    assert extract_code("```python\nprint(1)\n```\n```python\nprint(2)") == "print(1)"  # cut off
    assert extract_code("```python\nprint(2)") is None
    assert extract_code("print(1)") is None
    assert extract_code("```python\n\n```") is None
    assert extract_code("") is None


# -- stdout comparison -----------------------------------------------------------------


@pytest.mark.parametrize(
    "got,expected,ok",
    [
        ("3\n", "3", True),
        ("  3  \n\n\n", "3\n", True),  # surrounding whitespace and trailing blank lines
        ("1 2   3\n", "1 2 3\n", True),  # whitespace between tokens
        ("1.0\n", "1\n", True),  # numbers compare as Decimal
        ("2.50 x\n", "2.5 x\n", True),  # token by token: text and numbers mixed
        ("1e1\n", "10\n", True),
        ("1.0001\n", "1\n", False),
        ("YES\n", "yes\n", False),
        ("1\n2\n", "1\n", False),  # an extra line
        ("1\n\n2\n", "1\n2\n", False),  # a blank line inside counts
        ("1 2\n", "1\n", False),
        ("nan\n", "nan\n", True),  # identical text
        ("NaN\n", "nan\n", False),  # NaN never equals as a number
        ("", "", True),
    ],
)
def test_outputs_match(got, expected, ok):
    assert outputs_match(got, expected) is ok


# -- the judge -------------------------------------------------------------------------

STDIN_SPEC = JudgeSpec(tests=(TestCase("1 2\n", "3\n"), TestCase("2 2\n", "4\n"), TestCase("0 5\n", "5\n")))


def test_stdin_judge_right_wrong_and_partial():
    right, partial, wrong, crash = judge_many(
        [
            ("a,b=map(int,input().split())\nprint(a+b)", STDIN_SPEC),
            ("a,b=map(int,input().split())\nprint(2*b)", STDIN_SPEC),  # passes only the second test
            ("print(0)", STDIN_SPEC),
            ("raise SystemExit(3)", STDIN_SPEC),
        ],
        all_tests=True,
    )
    assert right.correct and right.pass_frac == 1.0
    assert not partial.correct and partial.pass_frac == pytest.approx(1 / 3)
    assert wrong.passed == 0 and not wrong.runtime_error
    assert crash.runtime_error and crash.passed == 0


def test_judge_stops_after_a_failed_first_test_unless_asked():
    (v,) = judge_many([("a,b=map(int,input().split())\nprint(2*b)", STDIN_SPEC)], all_tests=False)
    assert v.passed == 0 and not v.correct  # the second test, which it would pass, never ran


def test_syntax_errors_and_missing_code_fail_without_running():
    bad, none = judge_many([("print(", STDIN_SPEC), (None, STDIN_SPEC)])
    assert bad.runtime_error and bad.passed == 0 and not bad.no_code
    assert none.no_code and none.passed == 0


def test_the_compile_check_shows_no_warnings():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        (v,) = judge_many([("a,b=map(int,input().split())\nprint(a+b if 1else 0)", STDIN_SPEC)])
    assert v.correct and not caught  # "invalid decimal literal" is the model's business


def test_timeouts_are_reported_and_not_repeated_per_test():
    spec = JudgeSpec(tests=STDIN_SPEC.tests, timeout_s=0.5)
    (v,) = judge_many([("while True:\n    pass", spec)], all_tests=True)
    assert v.timeout and not v.correct and v.passed == 0


FUNC_TESTS = (
    TestCase("[1, 5, 2]\n3", "8", "functional"),
    TestCase("[0]\n0", "0", "functional"),
    TestCase('["a", "b"]\n1', '["b", "a"]', "functional"),
)


def test_functional_harness_with_a_solution_class():
    spec = JudgeSpec(tests=FUNC_TESTS[:2], func_name="maxPlus", lcb_imports=True)
    right = "class Solution:\n    def maxPlus(self, nums: List[int], k: int) -> int:\n        return max(nums) + k"
    wrong = "class Solution:\n    def maxPlus(self, nums, k):\n        return max(nums) - k"
    crash = "class Solution:\n    def maxPlus(self, nums, k):\n        return nums[10]"
    noisy = "class Solution:\n    def maxPlus(self, nums, k):\n        print('debug', 99)\n        return max(nums) + k"
    r, w, c, n = judge_many([(right, spec), (wrong, spec), (crash, spec), (noisy, spec)], all_tests=True)
    assert r.correct and not w.correct and w.passed == 1  # max([0]) - 0 == 0 still passes
    assert c.runtime_error and not c.correct
    assert n.correct  # printing while computing is fine: only the returned value counts


def test_functional_harness_with_a_top_level_function_and_tuples():
    spec = JudgeSpec(tests=FUNC_TESTS[2:], func_name="swap")
    (v,) = judge_many([("def swap(xs, k):\n    return tuple(reversed(xs))", spec)])
    assert v.correct  # a returned tuple compares as a list, as in LiveCodeBench
    (v,) = judge_many([("def swap(xs, k):\n    return xs", spec)])
    assert not v.correct


# -- the LiveCodeBench loader ----------------------------------------------------------


def test_loader_reads_each_fixture_row():
    PWNED.unlink(missing_ok=True)
    problems, stats = load_lcb(FIXTURE)
    assert [p.question_id for p in problems] == ["abc300_a", "1900A", "3001"]
    assert (stats.rows, stats.loaded, stats.malformed, stats.unsafe_pickle) == (5, 3, 1, 1)
    plain, pickled, functional = problems
    assert len(plain.tests) == 3 and plain.num_public == 1 and plain.func_name is None
    assert [t.output for t in pickled.tests] == ["1.5\n", "2\n", "7.0\n"]  # private ones unpickled
    assert functional.func_name == "maxPlus" and {t.kind for t in functional.tests} == {"functional"}
    assert functional.contest_date == date(2024, 3, 10) and functional.difficulty == "hard"
    assert not PWNED.exists()  # the malicious pickle never ran


def test_malicious_pickle_is_refused():
    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {PWNED}",))

    PWNED.unlink(missing_ok=True)
    blob = base64.b64encode(zlib.compress(pickle.dumps(Evil()))).decode()
    with pytest.raises(UnsafePickle):
        decode_tests(blob)
    with pytest.raises(UnsafePickle):
        safe_unpickle(pickle.dumps(Evil()))
    assert not PWNED.exists()
    assert safe_unpickle(pickle.dumps(json.dumps([{"input": "1", "output": "1"}]))) == '[{"input": "1", "output": "1"}]'
    assert safe_unpickle(pickle.dumps({"a": [1, 2.5, "x", None]})) == {"a": [1, 2.5, "x", None]}


def test_decode_tests_rejects_garbage():
    for raw in (
        "not base64 !!",
        base64.b64encode(b"not zlib").decode(),
        base64.b64encode(zlib.compress(b"not a pickle")).decode(),
        42,
        '{"a": 1}',
    ):
        with pytest.raises(ValueError):
            decode_tests(raw)


def test_date_and_difficulty_filters():
    problems, stats = load_lcb(FIXTURE, date_from=date(2024, 1, 1))
    assert [p.question_id for p in problems] == ["1900A", "3001"] and stats.filtered_date == 1
    problems, _ = load_lcb(FIXTURE, date_from=date(2024, 1, 15), date_to=date(2024, 1, 15))  # inclusive
    assert [p.question_id for p in problems] == ["1900A"]
    problems, stats = load_lcb(FIXTURE, difficulties=["easy", "hard"])
    assert [p.question_id for p in problems] == ["abc300_a", "3001"] and stats.filtered_difficulty == 1


def test_lcb_task_scores_fixture_solutions():
    with pytest.warns(UserWarning, match="1 malformed and 1 unsafe"):
        task = make_task("code", {"source": str(FIXTURE), "date_to": "2024-12-31"})
    by_id = {p.id: p for p in task.eval_problems(10)}
    assert set(by_id) == {"abc300_a", "1900A", "3001"}
    assert "class Solution" in by_id["3001"].prompt  # the starter code is shown
    sols = {
        "abc300_a": "a,b=map(int,input().split())\nprint(a+b)",
        "1900A": "n=int(input())\nxs=list(map(int,input().split()))\nprint(sum(xs)/n)",  # "2.0" == "2"
        "3001": "class Solution:\n    def maxPlus(self, nums: List[int], k: int) -> int:\n        return max(nums)+k",
    }
    scores = task.score_batch(list(by_id.values()), [fence(sols[i]) for i in by_id])
    assert all(s.correct and s.reward == 1.0 for s in scores)
    assert not task.score(by_id["1900A"], fence("n=int(input())\nprint(sum(map(int,input().split()))//n)")).correct


def test_lcb_task_errors_name_the_field(tmp_path):
    with pytest.raises(SpecError, match="task.params.source: .*missing.jsonl: no such file"):
        make_task("code", {"source": str(tmp_path / "missing.jsonl")})
    with pytest.raises(SpecError, match="no problems left"), pytest.warns(UserWarning):
        make_task("code", {"source": str(FIXTURE), "date_from": "2030-01-01"})
    with pytest.raises(SpecError, match="task.params.num_tests: only used with source: synthetic"):
        make_task("code", {"source": str(FIXTURE), "num_tests": 3})
    with pytest.raises(SpecError, match="task.params.date_from: only used with a LiveCodeBench file"):
        make_task("code", {"date_from": "2024-01-01"})
    with pytest.raises(SpecError, match="task.params.bogus: unknown key"):
        make_task("code", {"bogus": 1})


# -- the synthetic generator -----------------------------------------------------------


def test_reference_solutions_pass_and_are_short():
    task = make_task("code", {"modifier_prob": 0.7})
    probs = task.train_problems(random.Random(0), 60)
    assert {p.meta["template"] for p in probs} >= {"sum", "plus", "lsum", "rev"}
    assert all(len(p.solution) < 120 for p in probs)
    scores = task.score_batch(probs, [p.solution for p in probs])
    assert all(s.correct and s.reward == 1.0 for s in scores)
    assert all(
        s.components == {"correct": 1.0, "pass_frac": 1.0, "timeout": 0.0, "runtime_error": 0.0, "format": 1.0}
        for s in scores
    )


def test_wrong_programs_fail():
    task = make_task("code", {"kinds": ["pair"], "modifier_prob": 1.0, "modifiers": "*", "max_const": 9})
    probs = task.train_problems(random.Random(1), 20)
    # Dropping the second operation ("times k") is wrong on every test with a non-zero value.
    wrong = [p.solution.replace(p.solution[p.solution.rindex("*") : p.solution.rindex(")")], "") for p in probs]
    scores = task.score_batch(probs, wrong)
    assert sum(s.correct for s in scores) <= 2
    assert task.score(probs[0], "no code at all").reward == 0.0
    assert task.score(probs[0], fence("print(")).components["runtime_error"] == 1.0


def test_partial_reward_and_format_weight():
    prob = Problem(id="t", prompt="", answer="", meta={"tests": STDIN_SPEC.tests})
    half = make_task("code", {"partial_reward": True, "format_weight": 0.1})
    s = half.score(prob, fence("a,b=map(int,input().split())\nprint(2*b)"))
    assert not s.correct and s.reward == pytest.approx(1 / 3 + 0.1)
    assert s.components["pass_frac"] == pytest.approx(1 / 3)
    assert half.score(prob, fence("a,b=map(int,input().split())\nprint(a+b)")).reward == pytest.approx(1.1)
    assert half.score(prob, "nothing").reward == 0.0
    strict = make_task("code", {})
    assert strict.score(prob, fence("a,b=map(int,input().split())\nprint(2*b)")).reward == 0.0


def test_splits_are_disjoint_and_eval_is_fixed():
    task = make_task("code", {})
    ev = task.eval_problems(64)
    assert len(ev) == 64 and len({p.id for p in ev}) == 64
    assert [p.id for p in ev] == [p.id for p in task.eval_problems(64)]
    assert all(in_eval_split(p.id, 0.1) for p in ev)
    assert not {p.id for p in task.train_problems(random.Random(3), 3000)} & {p.id for p in ev}
    a = task.train_problems(random.Random(7), 10)
    assert [p.id for p in a] == [p.id for p in task.train_problems(random.Random(7), 10)]


def test_heldout_programs_are_never_trained_on():
    task = make_task("code", {"heldout": "program", "eval_fraction": 0.2})
    ev = task.eval_problems(64)
    assert all(in_eval_split(p.answer, 0.2) for p in ev)  # the answer is the reference program
    assert not {p.answer for p in task.train_problems(random.Random(3), 3000)} & {p.answer for p in ev}


def test_score_never_raises_on_garbage():
    task = make_task("code", {})
    prob = task.train_problems(random.Random(0), 1)[0]
    for junk in [
        "",
        "```",
        "```\n```",
        "\x00\x01```python\n\x00\n```",
        "```python\n" + "(" * 500 + "\n```",
        "```python\n" + "x" * 200_000 + "\n```",
        "```python\nimport os\nos._exit(3)\n```",
    ]:
        s = task.score(prob, junk)
        assert s.reward == 0.0 and not s.correct
    assert task.score(Problem(id="x", prompt="", answer=""), fence("print(1)")).reward == 0.0  # no tests


def test_fingerprint_ignores_judging_knobs():
    assert make_task("code", {}).fingerprint() == make_task("code", {"partial_reward": True}).fingerprint()
    assert make_task("code", {}).fingerprint() != make_task("code", {"max_const": 5}).fingerprint()
