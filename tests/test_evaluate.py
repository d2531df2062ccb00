from math import comb

import pytest

from gspo_cli.eval.scores import evaluate_samples, pass_at_k
from gspo_cli.tasks import Problem, make_task


def test_pass_at_k_hand_values():
    assert pass_at_k(4, 0, 1) == 0.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    # 1 - C(2,2)/C(4,2) = 1 - 1/6
    assert pass_at_k(4, 2, 2) == pytest.approx(5 / 6)
    assert pass_at_k(4, 3, 2) == 1.0
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - comb(7, 5) / comb(10, 5))
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)


def test_evaluate_samples_avg_and_pass():
    task = make_task("arithmetic", {})
    probs = [Problem(id="1+1", prompt="1+1=?\n", answer="2"), Problem(id="2+2", prompt="2+2=?\n", answer="4")]
    comps = [[r"\boxed{2}", r"\boxed{3}"], [r"\boxed{5}", r"\boxed{5}"]]
    out = evaluate_samples(task, probs, comps)
    assert out["avg@2"] == pytest.approx(0.25)
    assert out["pass@1"] == pytest.approx(0.25)
    assert out["pass@2"] == pytest.approx(0.5)
