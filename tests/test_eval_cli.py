"""`gspo eval`: scoring files of completions (no model), the scores' hand values, the Elo
estimate, error paths, and (slow) sampling from a tiny trained run."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gspo_cli.cli.app import app
from gspo_cli.eval.scores import ProblemResult, elo_rating, pass_ks, summarize
from gspo_cli.tasks import Problem, Score

FIXTURES = Path(__file__).parent / "fixtures"
H4 = FIXTURES / "aime_h4.jsonl"
runner = CliRunner()


def gspo(*args):
    return runner.invoke(app, [str(a) for a in args])


def one_error_line(result) -> str:
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert "Traceback" not in result.output and result.stdout == ""
    lines = [ln for ln in result.stderr.splitlines() if not ln.startswith("warning: ")]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0].removeprefix("error: ")


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# Problems 60 (answer 054), 61 (033) and 62 (16) of the H4-schema fixture, K = 4 each.
COMPLETIONS = [
    {"id": 60, "completion": r"so \boxed{54}"},
    {"id": 60, "completion": r"\boxed{054}"},
    {"id": 60, "completion": r"\boxed{55}"},
    {"id": 60, "completion": "no idea"},
    # Two right, two wrong, tied 2-2 in the vote: the answer seen first (34) wins and is wrong.
    {"id": "61", "completions": [r"\boxed{34}", r"\boxed{34}", "the answer is 33", r"\boxed{33.0}"]},
    {"id": 62, "completions": [r"\boxed{15}"] * 4},
]


@pytest.fixture
def scored(tmp_path):
    comp = write_jsonl(tmp_path / "completions.jsonl", COMPLETIONS)
    out = tmp_path / "out"
    result = gspo("eval", "--completions", comp, "--task", "math", "--dataset", H4, "--out", out)
    assert result.exit_code == 0, result.output
    return result, out


def test_completions_give_the_hand_computed_scores(scored):
    result, out = scored
    summary = json.loads((out / "eval_summary.json").read_text())
    s = summary["scores"]
    # Correct per problem: 2, 2, 0 of 4.
    assert s["avg@4"] == pytest.approx(4 / 12)
    assert s["pass@1"] == pytest.approx(1 / 3)
    assert s["pass@2"] == pytest.approx((5 / 6 + 5 / 6 + 0) / 3)  # 1 - C(2,2)/C(4,2) for c = 2
    assert s["pass@4"] == pytest.approx(2 / 3)
    assert s["maj@4"] == pytest.approx(1 / 3)  # only problem 60's vote (54) is right
    assert set(s) == {"avg@4", "pass@1", "pass@2", "pass@4", "maj@4"}
    assert (summary["task"], summary["problems"], summary["samples"], summary["rating"]) == ("math", 3, 4, None)
    assert summary["completions_file"].endswith("completions.jsonl")
    for key in ("avg@4", "pass@4", "maj@4"):
        assert key in result.stdout


def test_completions_write_one_record_per_problem(scored):
    _, out = scored
    rows = [json.loads(line) for line in (out / "eval_problems.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == ["60", "61", "62"]
    assert rows[0]["answer"] == "054"
    assert rows[0]["extracted"] == ["54", "54", "55", None]
    assert rows[0]["correct"] == [True, True, False, False]
    assert rows[1]["extracted"] == ["34", "34", "33", "33"] and rows[1]["majority_correct"] is False
    assert rows[2]["completions"] == [r"\boxed{15}"] * 4


def test_uneven_completions_use_each_problems_own_count(tmp_path):
    """4, 2 and 1 samples: avg@K is the mean of per-problem means, pass@k the unbiased
    estimator with each problem's own n over the problems with n >= k, counts in the summary."""
    comp = write_jsonl(
        tmp_path / "uneven.jsonl",
        [
            *COMPLETIONS[:4],  # problem 60: 4 samples, 2 correct, majority 54 (right)
            {"id": 61, "completions": [r"\boxed{34}", r"\boxed{33}"]},  # 2 samples, 1 correct, tie: 34 (wrong)
            {"id": 62, "completion": r"\boxed{16}"},  # 1 sample, correct
        ],
    )
    result = gspo("eval", "-c", comp, "-t", "math", "-d", H4, "-o", tmp_path / "o")
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "o" / "eval_summary.json").read_text())
    s = summary["scores"]
    assert s["avg@4"] == pytest.approx((2 / 4 + 1 / 2 + 1 / 1) / 3)
    assert s["pass@1"] == pytest.approx(2 / 3)
    assert s["pass@2"] == pytest.approx((5 / 6 + 1) / 2)  # problem 62 (one sample) cannot enter
    assert s["pass@4"] == pytest.approx(1.0)  # only problem 60: 1 - C(2,4)/C(4,4) = 1
    assert s["maj@4"] == pytest.approx(2 / 3)
    assert summary["samples"] == 4
    assert summary["samples_per_problem"] == {"1": 1, "2": 1, "4": 1}
    assert summary["pass_k_problems"] == {"pass@1": 3, "pass@2": 2, "pass@4": 1}
    assert "uneven samples (1 with 1, 1 with 2, 1 with 4)" in result.stdout


def test_limit_and_default_output_outside_the_data_folder(tmp_path, monkeypatch):
    data = tmp_path / "data"
    data.mkdir()
    comp = write_jsonl(data / "completions.jsonl", COMPLETIONS)
    monkeypatch.chdir(tmp_path)
    result = gspo("eval", "-c", comp, "-t", "math", "-d", H4, "--limit", 1)
    assert result.exit_code == 0, result.output
    # Before: eval_summary.json and eval_problems.jsonl went into data/, beside the user's files.
    assert sorted(p.name for p in data.iterdir()) == ["completions.jsonl"]
    summary = json.loads((tmp_path / "results/eval/completions/eval_summary.json").read_text())
    assert summary["problems"] == 1 and summary["scores"]["avg@4"] == pytest.approx(0.5)
    assert "math: 1 problem x 4 samples" in result.stdout  # not "1 problems"


def test_rating_through_the_cli(tmp_path):
    data = write_jsonl(
        tmp_path / "rated.jsonl",
        [
            {"id": "a", "problem": "p", "answer": "1", "rating": 1000},
            {"id": "b", "problem": "q", "answer": "2", "rating": 1400},
        ],
    )
    comp = write_jsonl(
        tmp_path / "c.jsonl", [{"id": "a", "completion": r"\boxed{1}"}, {"id": "b", "completion": r"\boxed{3}"}]
    )
    result = gspo("eval", "-c", comp, "-t", "math", "-d", data, "-o", tmp_path / "o")
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "o" / "eval_summary.json").read_text())
    # One of {1000, 1400} solved: by symmetry the rating is halfway.
    assert summary["rating"] == pytest.approx(1200, abs=1e-3) == summary["scores"]["rating"]


# --- the scores themselves -------------------------------------------------------------


def test_elo_rating_hand_solved():
    assert elo_rating([1000, 1000], 1) == pytest.approx(1000, abs=1e-4)
    assert elo_rating([1000, 1400], 1) == pytest.approx(1200, abs=1e-4)
    # One problem of rating 1500 solved 3 times in 4: 1/(1+10^((1500-R)/400)) = 3/4.
    assert elo_rating([1500], 0.75) == pytest.approx(1500 + 400 * math.log10(3), abs=1e-4)
    assert elo_rating([1500, 1800], 0) == 0.0 and elo_rating([1500, 1800], 2) == 4000.0  # clamped
    assert elo_rating([], 0) is None


def test_pass_ks():
    assert pass_ks(1) == [1] and pass_ks(4) == [1, 2, 4] and pass_ks(6) == [1, 2, 4, 6]


def test_failure_shares_for_tasks_that_record_them():
    def score(ok, **comp):
        return Score(reward=float(ok), correct=ok, components={"correct": float(ok), **comp})

    p = Problem(id="x", prompt="", answer="")
    results = [
        ProblemResult(
            p, ["a", "b"], [score(True, timeout=0.0, runtime_error=0.0), score(False, timeout=1.0, runtime_error=0.0)]
        ),
        ProblemResult(
            p, ["c", "d"], [score(False, timeout=0.0, runtime_error=1.0), score(False, timeout=1.0, runtime_error=0.0)]
        ),
    ]
    s = summarize(results)
    assert s["timeout_frac"] == pytest.approx(0.5) and s["runtime_error_frac"] == pytest.approx(0.25)
    assert "maj@2" not in s  # no extracted answers: no vote
    with pytest.raises(ValueError):
        summarize([results[0], ProblemResult(p, [], [])])
    # Uneven: 1 of 2 with a timeout, 1 of 1 with one: a share of all 3 samples.
    uneven = summarize([results[0], ProblemResult(p, ["e"], [score(False, timeout=1.0)])])
    assert uneven["timeout_frac"] == pytest.approx(2 / 3) and uneven["avg@2"] == pytest.approx(0.25)


def test_completions_path_never_imports_torch(tmp_path):
    comp = write_jsonl(tmp_path / "completions.jsonl", COMPLETIONS)
    code = (
        "import sys; from typer.testing import CliRunner; from gspo_cli.cli.app import app; "
        f"r = CliRunner().invoke(app, ['eval', '-c', {str(comp)!r}, '-t', 'math', '-d', {str(H4)!r}, "
        f"'-o', {str(tmp_path)!r}]); "
        "assert r.exit_code == 0, r.output; "
        "bad = [m for m in ('torch', 'transformers') if m in sys.modules]; assert not bad, bad"
    )
    proc = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


# --- errors: exit 2, one line ----------------------------------------------------------


def test_bad_targets_and_inputs_are_one_line(tmp_path):
    comp = write_jsonl(tmp_path / "c.jsonl", COMPLETIONS)
    assert "no such directory" in one_error_line(gspo("eval", tmp_path / "nope", "--task", "math"))
    assert "is a file" in one_error_line(gspo("eval", comp, "--task", "math"))
    assert "neither a run directory" in one_error_line(gspo("eval", tmp_path, "--task", "math"))
    assert "or --completions FILE" in one_error_line(gspo("eval"))
    assert "TARGET must be a run directory" in one_error_line(gspo("eval", tmp_path, "-c", comp))
    assert "--task: needed" in one_error_line(gspo("eval", "-c", comp))
    assert "unknown task 'algebra'" in one_error_line(gspo("eval", "-c", comp, "-t", "algebra"))
    assert "no such file" in one_error_line(gspo("eval", "-c", tmp_path / "none.jsonl", "-t", "math", "-d", H4))
    assert "no such file" in one_error_line(gspo("eval", "-c", comp, "-t", "math", "-d", tmp_path / "none.jsonl"))
    assert "--limit: must be >= 1" in one_error_line(gspo("eval", "-c", comp, "-t", "math", "-d", H4, "--limit", 0))


def test_bad_completion_files_are_one_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 60, "completion": "x"}\n{oops\n')
    assert "bad.jsonl:2: not JSON" in one_error_line(gspo("eval", "-c", bad, "-t", "math", "-d", H4))
    bad.write_text('{"completion": "x"}\n')
    assert "bad.jsonl:1: expected" in one_error_line(gspo("eval", "-c", bad, "-t", "math", "-d", H4))
    nomatch = write_jsonl(tmp_path / "n.jsonl", [{"id": "zzz", "completion": "x"}])
    assert "none of the 1 ids" in one_error_line(gspo("eval", "-c", nomatch, "-t", "math", "-d", H4))


# --- a real run: sampling from a tiny trained model ------------------------------------


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    from helpers import TINY

    from gspo_cli.spec.loading import spec_from_dict
    from gspo_cli.train.loop import train_experiment
    from gspo_cli.train.reporting import quiet_reporter

    out = tmp_path_factory.mktemp("runs")
    raw = {
        **TINY,
        "output_dir": str(out),
        "train": {"steps": 1},
        "task": {**TINY["task"], "name": "math", "params": {**TINY["task"]["params"], "source": "synthetic"}},
        "arms": [{"name": "gspo", "preset": "paper-gspo", "mini_batches": 2}],
    }
    (result,) = train_experiment(spec_from_dict(raw), reporter=quiet_reporter())
    assert result.status == "completed"
    return Path(result.path)


@pytest.mark.slow
def test_eval_of_a_run_directory(tiny_run):
    result = gspo("eval", tiny_run, "--samples", 2, "--limit", 4, "-q")
    assert result.exit_code == 0, result.output
    summary = json.loads((tiny_run / "eval_summary.json").read_text())
    assert {"task", "problems", "samples", "scores", "model", "checkpoint", "sampling", "rating"} <= set(summary)
    assert (summary["task"], summary["problems"], summary["samples"]) == ("math", 4, 2)
    assert summary["checkpoint"] == "step_000001"
    assert set(summary["scores"]) == {"avg@2", "pass@1", "pass@2", "maj@2"}
    assert all(0.0 <= v <= 1.0 for v in summary["scores"].values())
    rows = [json.loads(line) for line in (tiny_run / "eval_problems.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and all(len(r["completions"]) == len(r["correct"]) == 2 for r in rows)
    assert "avg@2" in result.stdout


@pytest.mark.slow
def test_eval_of_a_checkpoint_directory_with_options(tiny_run, tmp_path):
    ckpt = tiny_run / "checkpoints" / "step_000001"
    out = tmp_path / "ev"
    result = gspo(
        "eval", ckpt, "-k", 1, "-n", 2, "--top-p", 0.9, "--temperature", 0.5, "--max-tokens", 8, "-o", out, "-q"
    )
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "eval_summary.json").read_text())
    assert summary["sampling"] == {"samples": 1, "temperature": 0.5, "top_p": 0.9, "max_tokens": 8, "seed": 0}
    assert summary["task"] == "math" and summary["problems"] == 2  # the task came from the run's spec
    assert "step_000009" in one_error_line(gspo("eval", tiny_run, "--checkpoint", 9))


@pytest.mark.slow
def test_eval_of_a_run_on_another_dataset(tiny_run, tmp_path):
    # The run trained on synthetic math; --dataset swaps the source and drops the synthetic knobs.
    out = tmp_path / "aime"
    result = gspo(
        "eval", tiny_run, "--dataset", FIXTURES / "aime_maxwell.json", "-k", 1, "--max-tokens", 4, "-o", out, "-q"
    )
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (out / "eval_problems.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == ["2024-I-1", "2024-I-2", "2024-II-1"]


@pytest.mark.slow
def test_completions_for_a_run_use_its_task_and_directory(tiny_run):
    # The run's task is synthetic math with its own knobs; its held-out ids are expressions.
    from gspo_cli.spec.loading import load_spec
    from gspo_cli.tasks import make_task

    spec = load_spec(tiny_run / "spec.yaml")
    probs = make_task(spec.task.name, spec.task.params).eval_problems(10)
    comp = write_jsonl(tiny_run / "vllm.jsonl", [{"id": p.id, "completion": rf"\boxed{{{p.answer}}}"} for p in probs])
    result = gspo("eval", tiny_run, "-c", comp)
    assert result.exit_code == 0, result.output
    assert "warning" not in result.stderr  # every id matched
    summary = json.loads((tiny_run / "eval_summary.json").read_text())
    assert summary["problems"] == len(probs) and summary["scores"]["avg@1"] == 1.0
    assert summary["completions_file"] == str(comp)


def test_completions_for_more_synthetic_problems_than_the_default(tmp_path):
    from gspo_cli.tasks import make_task

    probs = make_task("arithmetic", {}).eval_problems(80)  # the default held-out size is 64
    comp = write_jsonl(tmp_path / "c.jsonl", [{"id": p.id, "completion": rf"\boxed{{{p.answer}}}"} for p in probs])
    result = gspo("eval", "-c", comp, "-t", "arithmetic", "-o", tmp_path)
    assert result.exit_code == 0 and "warning" not in result.stderr, result.output
    summary = json.loads((tmp_path / "eval_summary.json").read_text())
    assert summary["problems"] == 80 and summary["scores"]["avg@1"] == 1.0
    assert "maj@1" not in summary["scores"]  # arithmetic extracts no answers to vote on


def test_problem_records_are_json_whatever_meta_holds():
    p = Problem(id="x", prompt="", answer="1", meta={"tests": [object()], "rating": 1500})
    rec = ProblemResult(p, ["a"], [Score(reward=0.0, correct=False)]).record()
    assert json.loads(json.dumps(rec))["rating"] == 1500 and "tests" not in rec


def test_eval_tables_are_headed_by_the_evaluation_set():
    """`gspo eval RUN` scores each named set on its own: two sets of one task (aime24 and aime25,
    both `math`) were both headed `math: ...`."""
    import io

    from rich.console import Console

    from gspo_cli.eval.results import render

    base = {"task": "math", "problems": 30, "samples": 4, "scores": {"avg@4": 0.25}, "model": "m"}
    heads = []
    for extra in ({"set": "aime24"}, {"set": "aime25"}, {}):
        console = Console(file=io.StringIO(), width=200)
        render({**base, **extra}, console)
        heads.append(console.file.getvalue().splitlines()[0])
    assert heads == [
        "aime24 (math): 30 problems x 4 samples, m",
        "aime25 (math): 30 problems x 4 samples, m",
        "math: 30 problems x 4 samples, m",
    ]
