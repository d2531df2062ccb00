import random

import pytest

from gspo_cli.errors import SpecError
from gspo_cli.tasks import extract_boxed, make_task
from gspo_cli.tasks.base import in_eval_split


def test_extract_boxed_takes_the_last_balanced_box():
    assert extract_boxed(r"x \boxed{1} then \boxed{42}") == "42"
    assert extract_boxed(r"\boxed{\frac{1}{2}}") == r"\frac{1}{2}"
    assert extract_boxed(r"\boxed{12") is None
    assert extract_boxed("no box") is None


def test_arithmetic_reference_solutions_score_full_marks():
    task = make_task("arithmetic", {"num_operands": 3, "max_operand": 50})
    probs = task.train_problems(random.Random(0), 50)
    for p in probs:
        # The worked solution evaluates left to right and ends in the boxed answer.
        assert eval(p.id) == int(p.answer)  # noqa: S307 - our own generated expression
        s = task.score(p, p.solution)
        assert s.correct and s.reward == 1.0


def test_arithmetic_scoring_of_wrong_and_garbage_answers():
    task = make_task("arithmetic", {"format_weight": 0.25})
    p = task.train_problems(random.Random(1), 1)[0]
    wrong = task.score(p, rf"... \boxed{{{int(p.answer) + 1}}}")
    assert (wrong.correct, wrong.reward, wrong.components["format"]) == (False, 0.25, 1.0)
    assert task.score(p, r"\boxed{abc}").reward == 0.25
    assert task.score(p, "").reward == 0.0
    right = task.score(p, rf"\boxed{{ {p.answer} }}")
    assert right.correct and right.reward == 1.25


def test_train_and_eval_splits_are_disjoint_and_eval_is_fixed():
    task = make_task("arithmetic", {"num_operands": 2, "max_operand": 20})
    ev = task.eval_problems(40)
    assert len(ev) == 40 and len({p.id for p in ev}) == 40
    assert [p.id for p in ev] == [p.id for p in task.eval_problems(40)]
    train_ids = {p.id for p in task.train_problems(random.Random(3), 2000)}
    assert not train_ids & {p.id for p in ev}
    assert all(in_eval_split(p.id) for p in ev)


def test_same_rng_same_problems():
    task = make_task("arithmetic", {})
    a = task.train_problems(random.Random(7), 10)
    b = task.train_problems(random.Random(7), 10)
    assert a == b


def test_unknown_task_and_bad_params_are_spec_errors():
    with pytest.raises(SpecError, match="task.name: unknown task 'algebra'"):
        make_task("algebra", {})
    with pytest.raises(SpecError, match=r"task.params.num_operandz: unknown key"):
        make_task("arithmetic", {"num_operandz": 2})
    with pytest.raises(SpecError, match=r"task.params.num_operands"):
        make_task("arithmetic", {"num_operands": 1})


def test_problems_with_meta_are_hashable_and_compare_without_it():
    from gspo_cli.tasks.base import Problem

    a = Problem("p1", "1+1=?", "2", meta={"tests": [{"input": "", "output": "2"}]})
    b = Problem("p1", "1+1=?", "2", meta=None)
    assert a == b and hash(a) == hash(b)
    assert len({a, b, Problem("p2", "1+2=?", "3")}) == 2


def test_default_score_batch_is_score_for_each_pair():
    from gspo_cli.tasks import make_task

    task = make_task("math", {"source": "synthetic", "num_operands": 2, "max_operand": 9})
    probs = task.eval_problems(4)
    comps = [f"so \\boxed{{{p.answer}}}" if i % 2 == 0 else "\\boxed{999}" for i, p in enumerate(probs)]
    batch = task.score_batch(probs, comps)
    assert batch == [task.score(p, c) for p, c in zip(probs, comps)]
    assert [s.correct for s in batch] == [True, False, True, False][: len(probs)]


def test_arithmetic_rewrite_style_hand_written_and_self_consistent():
    rewrite = make_task("arithmetic", {"num_operands": 4, "max_operand": 9, "style": "rewrite"})
    steps = make_task("arithmetic", {"num_operands": 4, "max_operand": 9})
    a, b = rewrite.train_problems(random.Random(2), 30), steps.train_problems(random.Random(2), 30)
    assert [p.id for p in a] == [p.id for p in b]  # the same problems, only the worked solution differs
    for p in a:
        lines = p.solution.split(" ")
        assert lines[-1] == rf"\boxed{{{p.answer}}}" and len(lines) == 4  # 3 rewrites + the answer
        # every rewrite is an expression equal to the problem's value
        assert all(eval(line[1:]) == int(p.answer) for line in lines[:-1])  # noqa: S307 - our own expressions
        assert lines[-2] == f"={p.answer}"
        assert rewrite.score(p, p.solution).correct

    class Scripted:  # hands out 5, 2, 7, 1 and then -, +, +
        def __init__(self):
            self.nums, self.ops = [5, 2, 7, 1], ["-", "+", "+"]

        def randint(self, lo, hi):
            return self.nums.pop(0)

        def choice(self, options):
            return self.ops.pop(0)

    made = rewrite._make(Scripted())
    assert (made.id, made.answer) == ("5-2+7+1", "11")
    assert made.solution == r"=3+7+1 =10+1 =11 \boxed{11}"
    # fingerprints: the default style keeps the pre-existing one (cached cold starts stay valid)
    assert steps.fingerprint() == 'arithmetic:{"num_operands":4,"max_operand":9,"operators":"+-","format_weight":0.0}'
    assert rewrite.fingerprint().endswith(',"style":"rewrite"}')
