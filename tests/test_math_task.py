"""The math task: answer extraction and equivalence, the dataset loaders, the synthetic source."""

import json
import random
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gspo_cli.errors import SpecError
from gspo_cli.tasks import Problem, make_task
from gspo_cli.tasks.math_answer import answers_match, extract_answer, normalize_answer

FIXTURES = Path(__file__).parent / "fixtures"


# --- extraction ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        (r"first \boxed{1}, then \boxed{42}.", "42"),  # the last box wins
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),  # nested braces
        (r"\boxed{ \{1, 2\} }", r"\{1, 2\}"),
        (r"\boxed{7} and the answer is 8", "7"),  # a box beats the fallbacks
        ("So the answer is 33.", "33"),
        ("The final answer is $\\frac{1}{2}$.", r"\frac{1}{2}"),
        ("The answer is **7**.", "7"),
        ("the answer is 3.5 because 7/2 = 3.5", "3.5"),
        ("Reasoning...\n**Answer:** 204\n", "204"),
        ("Answer: $17$", "17"),
        (r"unclosed \boxed{12", None),
        ("no answer here", None),
        ("", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_fallbacks_can_be_turned_off():
    assert extract_answer("the answer is 5", fallbacks=False) is None
    task = make_task("math", {"answer_fallbacks": False})
    p = Problem(id="x", prompt="", answer="5")
    assert not task.score(p, "the answer is 5").correct
    assert make_task("math", {}).score(p, "the answer is 5").correct


# --- equivalence -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "gold, pred, ok",
    [
        ("33", "033", True),
        ("033", "33", True),
        ("1000", "1,000", True),
        ("1000", "1000.0", True),
        ("33", "33.", True),
        ("33", "33.5", False),
        ("45", r"45^\circ", True),
        ("33", "x = 33", True),
        ("33", r"\text{33}", True),
        ("33", "$33$", True),
        ("-4", "-4", True),
        # An integer gold needs a number: copying the expression into the box is not an answer.
        ("10", "5+5", False),
        ("33", r"\frac{66}{2}", False),
        (r"\frac{1}{2}", "0.5", True),
        ("0.5", r"\frac12", True),
        (r"\frac{1}{2}", r"\dfrac{1}{2}", True),
        (r"3\sqrt{2}", r"\sqrt{18}", True),
        (r"\frac{1}{2}", r"\frac{1}{3}", False),
        ("33", "abc", False),
        ("33", "", False),
        ("33", None, False),
        ("33", "3" * 500, False),
        (r"\frac{1}{2}", "}}{{\\frac{", False),
    ],
)
def test_answers_match(gold, pred, ok):
    assert answers_match(gold, pred) is ok


def test_huge_exponents_are_refused_not_computed():
    # sympy would spend minutes on 9^(9^9); the guard answers at once.
    assert not answers_match(r"\sqrt{2}", "9^{9^{9}}")
    assert not answers_match(r"\sqrt{2}", "2^{999999}")
    assert not answers_match("5", "9^{9^{9}}")


def test_normalize_answer_for_voting():
    assert normalize_answer(" $ 1,000 $. ") == "1000"
    assert normalize_answer("033") == normalize_answer("33.0") == "33"
    assert normalize_answer(r"\dfrac{1}{2}") == r"\frac{1}{2}"


def test_scoring_works_off_the_main_thread():
    # math-verify's own time-outs use signal.alarm, which raises off the main thread.
    task = make_task("math", {})
    p = Problem(id="h", prompt="", answer=r"\frac{1}{2}")
    out = []
    t = threading.Thread(target=lambda: out.append(task.score(p, r"so \boxed{0.5}").correct))
    t.start()
    t.join()
    assert out == [True]
    with ThreadPoolExecutor(4) as pool:
        verdicts = list(
            pool.map(
                lambda c: task.score(p, c).correct,
                [r"\boxed{0.5}", r"\boxed{\frac{2}{4}}", r"\boxed{0.4}", "garbage"] * 3,
            )
        )
    assert verdicts == [True, True, False, False] * 3


def test_reward_is_correctness_plus_format_weight():
    task = make_task("math", {"format_weight": 0.1})
    p = Problem(id="x", prompt="", answer="33")
    assert task.score(p, r"\boxed{033}").reward == pytest.approx(1.1)
    assert task.score(p, r"\boxed{34}").reward == pytest.approx(0.1)
    assert task.score(p, "the answer is 33").reward == pytest.approx(1.0)
    s = task.score(p, "")
    assert (s.reward, s.correct, s.components) == (0.0, False, {"correct": 0.0, "format": 0.0})


# --- the synthetic source is arithmetic ------------------------------------------------


def test_synthetic_math_makes_exactly_arithmetics_problems():
    knobs = {"num_operands": 2, "max_operand": 20}
    arith, math = make_task("arithmetic", knobs), make_task("math", {"source": "synthetic", **knobs})
    a, m = arith.train_problems(random.Random(0), 20), math.train_problems(random.Random(0), 20)
    assert [p.prompt for p in a] == [p.prompt for p in m] and a == m
    assert arith.eval_problems(64) == math.eval_problems(64)
    assert arith.corpus_text(random.Random(1)) == math.corpus_text(random.Random(1))
    # Same problems, same cold start: the built-in model cache is shared.
    assert arith.fingerprint() == math.fingerprint()
    assert math.num_problems is None
    for p in m:
        assert math.score(p, p.solution).correct


def test_quickstart_uses_synthetic_math_with_arithmetics_problems():
    from gspo_cli.spec.loading import load_spec

    spec = load_spec(Path(__file__).parent.parent / "experiments" / "quickstart.yaml")
    assert spec.task.name == "math" and spec.task.params.get("source") == "synthetic"
    math = make_task(spec.task.name, spec.task.params)
    arith = make_task("arithmetic", {k: v for k, v in spec.task.params.items() if k != "source"})
    assert math.train_problems(random.Random(0), 20) == arith.train_problems(random.Random(0), 20)


# --- real data -------------------------------------------------------------------------


def test_h4_jsonl_loads_and_skips_malformed_rows():
    with pytest.warns(UserWarning, match="skipped 2 of 5 rows"):
        task = make_task("math", {"source": str(FIXTURES / "aime_h4.jsonl")})
    assert task.num_problems == 3
    probs = task.eval_problems(10)
    assert [p.id for p in probs] == ["60", "61", "62"]
    assert [p.answer for p in probs] == ["054", "033", "16"]
    assert probs[0].prompt.startswith("Find the remainder") and r"\boxed{}" in probs[0].prompt
    assert task.score(probs[0], r"... \boxed{54}").correct  # 054 == 54
    assert task.score(probs[1], r"\boxed{33}").correct
    # Reference solutions end in the boxed answer (appended where the export lacks one).
    assert all(task.score(p, p.solution).correct for p in probs)
    assert task.eval_problems(2) == probs[:2]


def test_maxwell_json_with_capitalised_columns_and_integer_answers():
    task = make_task("math", {"source": str(FIXTURES / "aime_maxwell.json")})
    probs = task.eval_problems(100)
    assert [(p.id, p.answer) for p in probs] == [("2024-I-1", "999"), ("2024-I-2", "24"), ("2024-II-1", "33")]
    assert task.score(probs[1], r"\boxed{024}").correct
    train = task.train_problems(random.Random(0), 7)
    assert len(train) == 7 and {p.id for p in train} <= {p.id for p in probs}
    assert train == task.train_problems(random.Random(0), 7)


def test_parquet_with_question_column_gaps_and_ratings(tmp_path):
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    df = pd.DataFrame(
        {
            "Question": ["What is 2+2?", "What is 3+3?", "No answer here", None],
            "ANSWER": [4, 6, None, 1],  # a gap makes pandas store floats: 4.0, 6.0, NaN
            "rating": [800, 1200, 900, 1000],
        }
    )
    path = tmp_path / "set.parquet"
    df.to_parquet(path)
    with pytest.warns(UserWarning, match="skipped 2 of 4"):
        task = make_task("math", {"source": str(path), "prompt_template": "Q: {problem}\nA:"})
    probs = task.eval_problems(10)
    assert [(p.id, p.prompt, p.answer) for p in probs] == [
        ("0", "Q: What is 2+2?\nA:", "4"),
        ("1", "Q: What is 3+3?\nA:", "6"),
    ]
    assert probs[1].meta == {"rating": 1200}
    assert task.fingerprint().startswith("math:")


def test_fingerprint_follows_the_data(tmp_path):
    a = tmp_path / "a.jsonl"
    a.write_text(json.dumps({"problem": "p", "answer": "1"}) + "\n")
    f1 = make_task("math", {"source": str(a)}).fingerprint()
    a.write_text(json.dumps({"problem": "p", "answer": "2"}) + "\n")
    assert make_task("math", {"source": str(a)}).fingerprint() != f1


def test_empty_and_unusable_files_are_spec_errors_naming_the_file(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(SpecError, match=r"task.params.source: .*empty.jsonl: no usable problems"):
        make_task("math", {"source": str(empty)})
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"problem": "p", "answer": "1"}\nnot json\n')
    with pytest.raises(SpecError, match=r"bad.jsonl:2: not JSON"):
        make_task("math", {"source": str(bad)})
    notlist = tmp_path / "obj.json"
    notlist.write_text('{"problem": "p"}')
    with pytest.raises(SpecError, match="expected a JSON list of objects"):
        make_task("math", {"source": str(notlist)})
    with pytest.raises(SpecError, match="no such file"):
        make_task("math", {"source": str(tmp_path / "missing.jsonl")})
    csv = tmp_path / "x.csv"
    csv.write_text("problem,answer\n")
    with pytest.raises(SpecError, match="unknown format .csv"):
        make_task("math", {"source": str(csv)})
    dup = tmp_path / "dup.jsonl"
    dup.write_text('{"id": 1, "problem": "p", "answer": "1"}\n{"id": 1, "problem": "q", "answer": "2"}\n')
    with pytest.raises(SpecError, match="duplicate id '1'"):
        make_task("math", {"source": str(dup)})


def test_bad_params_are_spec_errors():
    with pytest.raises(SpecError, match=r"task.params.num_operands: only used with source: synthetic"):
        make_task("math", {"source": str(FIXTURES / "aime_maxwell.json"), "num_operands": 3})
    with pytest.raises(SpecError, match=r"task.params.prompt_template"):
        make_task("math", {"prompt_template": "no slot"})
    with pytest.raises(SpecError, match=r"task.params.sourse: unknown key"):
        make_task("math", {"sourse": "synthetic"})


def test_hub_source_without_datasets_is_one_line(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "datasets", None)  # as if not installed
    with pytest.raises(SpecError, match=r"hub:HuggingFaceH4/aime_2024 needs the `datasets` package") as err:
        make_task("math", {"source": "hub:HuggingFaceH4/aime_2024"})
    assert "\n" not in str(err.value)
