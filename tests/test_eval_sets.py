"""Training data and evaluation data kept apart: dataset schemas and column mapping, named
evaluation sets, exclusion of evaluation problems from training (and from the built-in cold
start), the held-out fallback, and the one-line refusals of bad evaluation sets."""

from __future__ import annotations

import json
import random
import warnings
from pathlib import Path

import pyarrow as pa
import pytest
import yaml
from helpers import TINY
from typer.testing import CliRunner

from gspo_cli.cli.app import app
from gspo_cli.errors import SpecError
from gspo_cli.eval.sets import cold_start_task, plan_data
from gspo_cli.spec.loading import spec_from_dict
from gspo_cli.tasks import make_task
from gspo_cli.tasks.base import normalize_text

FIXTURES = Path(__file__).parent / "fixtures"
DATASETS = FIXTURES / "datasets"
LCB = FIXTURES / "lcb_sample.jsonl"


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def spec(task: dict, **top) -> dict:
    return {**TINY, "task": task, "arms": [{"name": "gspo", "preset": "paper-gspo", "mini_batches": 2}], **top}


# --- every shipped schema loads -----------------------------------------------------------


@pytest.mark.parametrize(
    "name, ids, answers",
    [
        ("aime24.parquet", ["70", "71", "72"], ["065", "132", "8"]),
        ("aime25.jsonl", ["1", "2", "3"], ["9", "89", "12"]),  # answer column as integers, no solution
        (
            "math500",
            ["test/prealgebra/9001.json", "test/algebra/9002.json", "test/algebra/9003.json"],
            ["15", "5\\sqrt{2}", "4"],
        ),
        ("gsm8k.parquet", ["0", "1", "2"], ["10", "24", "2400"]),  # after ####, thousands comma dropped
        ("dapo_math.jsonl", ["4a7d1ed4-0001", "4a7d1ed4-0002", "4a7d1ed4-0003"], ["43", "180", "80"]),
        ("chat_messages.jsonl", ["0", "1"], ["17", "5"]),  # answers boxed in the assistant message
    ],
)
def test_each_fixture_schema_loads(name, ids, answers):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        task = make_task("math", {"source": str(DATASETS / name)})
    # The DAPO export repeats rows: one kept, the repeat counted in a warning, never an error.
    assert [str(w.message).split(": ")[-1] for w in seen] == (
        ["kept one of each repeated row (1 repeats)"] if name == "dapo_math.jsonl" else []
    )
    assert [p.id for p in task.problems] == ids
    assert [p.answer for p in task.problems] == answers
    for p in task.problems:  # every row can cold-start: a solution or the boxed answer alone
        assert p.solution is not None and f"\\boxed{{{p.answer}}}" in p.solution.replace(",", "")
        assert p.text and p.text in p.prompt


def test_fixture_details():
    dapo = make_task("math", {"source": str(DATASETS / "dapo_math.jsonl")})
    assert dapo.problems[0].text.endswith('after "Answer:".')  # the chat prompt's user message, whole
    assert "Find $17 + 26$." in dapo.problems[0].text
    gsm = make_task("math", {"source": str(DATASETS / "gsm8k.parquet")})
    assert gsm.problems[1].solution == "4 boxes hold 4 * 6 = <<4*6=24>>24 pens.\n\\boxed{24}"
    aime25 = make_task("math", {"source": str(DATASETS / "aime25.jsonl")})
    assert aime25.problems[0].solution == "\\boxed{9}"  # no solution: the cold start sees the answer alone
    chat = make_task("math", {"source": str(DATASETS / "chat_messages.jsonl")})
    assert chat.problems[0].text == "What is $8 + 9$?"  # the user turn, not the system turn


def test_lcb_fixture_loads_with_compressed_private_tests():
    task = make_task("code", {"source": str(LCB)})
    assert task.num_problems == len(task.problems) >= 3
    avg = next(p for p in task.problems if p.id == "1900A")
    assert len(avg.meta["tests"]) == 3  # one public + two from the base64/zlib/pickle private field
    assert avg.text.startswith("Read N then N integers")


def test_save_to_disk_dataset_dict_reads_the_split(tmp_path):
    root = tmp_path / "dd"
    for split, answer in (("train", "1"), ("test", "2")):
        d = root / split
        d.mkdir(parents=True)
        table = pa.Table.from_pylist([{"question": f"Q {split}?", "answer": answer}])
        with pa.OSFile(str(d / "data-00000-of-00001.arrow"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
            w.write_table(table)
        (d / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}))
    (root / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test"]}))
    assert make_task("math", {"source": str(root), "split": "test"}).problems[0].answer == "2"
    with pytest.raises(SpecError, match=r"no split 'dev' \(it has: train, test\)"):
        make_task("math", {"source": str(root), "split": "dev"})


# --- columns the way datasets name them ---------------------------------------------------


def test_column_mapping_and_boxed_answers(tmp_path):
    rows = [{"stem": "What is 2+2?", "meta": {"gold": "4"}, "worked": "2+2=4"}]
    src = write_jsonl(tmp_path / "m.jsonl", rows)
    task = make_task("math", {"source": str(src), "columns": {"problem": "stem", "answer": "meta.gold"}})
    assert (task.problems[0].text, task.problems[0].answer) == ("What is 2+2?", "4")
    # No answer column: the last \boxed{} of the solution is the answer.
    boxed = write_jsonl(tmp_path / "b.jsonl", [{"question": "Q?", "solution": "so \\boxed{1} then \\boxed{7}"}])
    assert make_task("math", {"source": str(boxed)}).problems[0].answer == "7"
    with pytest.raises(SpecError, match=r"task.params.columns: unknown role 'hint'"):
        make_task("math", {"source": str(src), "columns": {"hint": "x"}})


def test_unusable_file_names_found_and_accepted_columns(tmp_path):
    src = write_jsonl(tmp_path / "bad.jsonl", [{"Query_Text": "a", "Gold": "1"}, {"query_text": "b"}])
    with pytest.raises(SpecError) as err:
        make_task("math", {"source": str(src)})
    line = str(err.value)
    assert "\n" not in line
    assert "columns found: query_text, gold" in line
    assert "accepted: problem from problem/question/query/prompt/messages" in line
    assert "map others with task.params.columns" in line


def test_eval_keys_are_defined_once():
    from gspo_cli.metrics import describe, eval_key, split_eval_key

    assert eval_key("aime24", "avg@4") == "eval/aime24/avg@4"
    assert split_eval_key("eval/lcb/pass@1") == ("lcb", "pass@1")
    assert split_eval_key("reward/mean") is None
    assert describe("eval/aime24/avg@4") == ("score avg@4 on evaluation set aime24", "score")


# --- the exclusion rule -------------------------------------------------------------------


def test_normalised_text_rule():
    assert normalize_text("What is  $12\\,\\cdot 11$?") == normalize_text("what is $12 \\cdot 11$?")
    assert normalize_text("A\u00a0B\tC\n") == normalize_text("a b c") == "abc"  # NFKC, case, whitespace
    assert normalize_text("x\\quad y~z\\!w") == "xyzw"
    assert normalize_text("12+3") != normalize_text("12-3")


def test_planted_overlaps_are_excluded_and_counted(tmp_path):
    aime = make_task("math", {"source": str(DATASETS / "aime24.parquet")}).problems
    rows = [{"id": f"t{i}", "problem": f"What is {i}+{i}?", "answer": str(2 * i)} for i in range(6)]
    rows += [
        {"id": "o1", "problem": "FIND $3^4 - 2^4$.", "answer": "65"},  # aime24 row 70, upper case
        {"id": "o2", "problem": "What is $12\\,\\cdot\n11$?", "answer": "132"},  # row 71, LaTeX spacing, newline
        {"id": "o3", "problem": "Find the number of primes below $20$.", "answer": "8"},  # row 72 verbatim
        {"id": "o4", "problem": "Find the number of primes below $30$.", "answer": "10"},  # near miss: kept
    ]
    src = write_jsonl(tmp_path / "train.jsonl", rows)
    s = spec_from_dict(
        spec(
            {
                "name": "math",
                "params": {"source": str(src)},
                "eval_sets": [
                    {"name": "aime24", "params": {"source": str(DATASETS / "aime24.parquet")}},
                    {"name": "lcb", "task": "code", "params": {"source": str(LCB)}, "size": 2, "samples": 3},
                ],
            }
        )
    )
    task = make_task(s.task.name, s.task.params)
    sets, info = plan_data(s, task)
    assert [x.name for x in sets] == ["aime24", "lcb"]
    assert [len(x.problems) for x in sets] == [3, 2]
    assert (sets[1].samples, sets[0].samples) == (3, s.train.eval_samples)
    assert info["excluded_from_training"] == 3 and info["train_problems"] == 7
    drawn = {p.id for p in task.train_problems(random.Random(0), 500)}
    assert drawn == {f"t{i}" for i in range(6)} | {"o4"}
    assert {p.id for p in aime} == {"70", "71", "72"}


def test_without_eval_sets_a_file_is_split_and_says_so(tmp_path):
    rows = [{"id": str(i), "problem": f"What is {i}+1?", "answer": str(i + 1)} for i in range(5)]
    src = write_jsonl(tmp_path / "train.jsonl", rows)
    s = spec_from_dict(spec({"name": "math", "params": {"source": str(src)}, "eval_size": 2}))
    task = make_task("math", s.task.params)
    sets, info = plan_data(s, task)
    assert [p.id for p in sets[0].problems] == ["0", "1"] and sets[0].name == "math"
    assert {p.id for p in task.train_problems(random.Random(0), 200)} == {"2", "3", "4"}
    assert info["excluded_from_training"] == 2 and "held-out split" in info["note"]
    with pytest.raises(SpecError, match=r"task.eval_size: holding out 5 problems leaves none of the 5"):
        plan_data(
            spec_from_dict(spec({"name": "math", "params": {"source": str(src)}, "eval_size": 9})),
            make_task("math", s.task.params),
        )
    # A generator's hash split is disjoint already: nothing to remove, and it says so.
    synth = spec_from_dict(spec({"name": "arithmetic", "eval_size": 3}))
    _, info = plan_data(synth, make_task("arithmetic", {}))
    assert info["excluded_from_training"] is None and "never drawn for training" in info["note"]


# --- the built-in cold start never sees evaluation problems ------------------------------


def test_cold_start_key_changes_with_the_excluded_data(tmp_path):
    from gspo_cli.models.builtin import cache_key
    from gspo_cli.spec import BuiltinModelConfig, ColdStartConfig

    size, cold = BuiltinModelConfig(), ColdStartConfig()
    task = make_task("math", {})
    before = cache_key("tiny-moe", size, cold, task)
    assert cache_key("tiny-moe", size, cold, make_task("math", {})) == before  # same data, same model
    aime = make_task("math", {"source": str(DATASETS / "aime24.parquet")})
    cold_task, line = cold_start_task(aime, aime.problems)
    assert cold_task.train_pool is None and len(cold_task.excluded) == 3  # synthetic, minus the file
    assert "not the evaluated dataset" in line
    assert cache_key("tiny-moe", size, cold, cold_task) != before
    # A synthetic task is cold-started on itself: its held-out split is never drawn.
    same, _ = cold_start_task(task, task.eval_problems(4))
    assert same is task


def test_cold_start_refuses_data_without_solutions():
    from gspo_cli.models.builtin import _with_solutions

    with pytest.raises(SpecError, match=r"model.cold_start: the training data of task code has no reference"):
        _with_solutions(make_task("code", {"source": str(LCB)}), random.Random(0), 4)
    aime25 = make_task("math", {"source": str(DATASETS / "aime25.jsonl")})  # no solutions: the answer alone
    assert {p.solution for p in _with_solutions(aime25, random.Random(0), 8)} <= {
        "\\boxed{9}",
        "\\boxed{89}",
        "\\boxed{12}",
    }


# --- bad evaluation sets: one line, exit 2, before any model --------------------------------


def gspo(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def refused(tmp_path, task: dict) -> str:
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(spec(task, output_dir=str(tmp_path / "out"))))
    result = gspo("train", path)
    assert result.exit_code == 2, result.output
    lines = [x for x in result.output.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    assert not (tmp_path / "out").exists()
    return lines[0]


def test_bad_eval_sets_are_refused_before_any_model(tmp_path, monkeypatch):
    monkeypatch.setenv("GSPO_CACHE_DIR", str(tmp_path / "cache"))
    missing = {"name": "a", "params": {"source": str(tmp_path / "nope.jsonl")}}
    line = refused(tmp_path, {"name": "arithmetic", "eval_sets": [missing]})
    assert "task.eval_sets[0].params.source: no such file" in line
    unreadable = tmp_path / "locked.jsonl"
    unreadable.write_bytes(b"\xff\xfe\x00garbage")
    line = refused(
        tmp_path, {"name": "arithmetic", "eval_sets": [{"name": "a", "params": {"source": str(unreadable)}}]}
    )
    assert line.startswith("error: task.eval_sets[0].params.source:") and "not a UTF-8 text file" in line
    # A code set pointed at a math file, a math set at a LiveCodeBench file: the wrong schema.
    wrong = {"name": "lcb", "task": "code", "params": {"source": str(DATASETS / "aime25.jsonl")}}
    line = refused(tmp_path, {"name": "arithmetic", "eval_sets": [wrong]})
    assert line.startswith("error: task.eval_sets[0].params.source:") and "no problems left" in line
    assert "columns found: problem_idx, problem, answer, problem_type; accepted: LiveCodeBench" in line
    wrong = {"name": "aime", "task": "math", "params": {"source": str(LCB)}}
    line = refused(tmp_path, {"name": "arithmetic", "eval_sets": [wrong]})
    assert "columns found: question_title" in line
    line = refused(
        tmp_path, {"name": "arithmetic", "eval_sets": [{"name": "x", "task": "poetry", "params": {"source": str(LCB)}}]}
    )
    assert "task.eval_sets[0].task: unknown task 'poetry'" in line
    assert not (tmp_path / "cache").exists()  # no model was built


# --- end to end: train on one file, score a math and a code set by name ------------------


@pytest.mark.slow
def test_train_on_one_file_and_score_two_named_sets(tmp_path, monkeypatch):
    rows = [
        {
            "id": f"t{i}",
            "problem": f"What is ${i}+{i}$?",
            "solution": f"{i}+{i}={2 * i} \\boxed{{{2 * i}}}",
            "answer": str(2 * i),
        }
        for i in range(6)
    ]
    rows.append({"id": "dup", "problem": "What is $12 \\cdot 11$?", "answer": "132"})  # aime24's row 71
    train = write_jsonl(tmp_path / "train.jsonl", rows)
    raw = spec(
        {
            "name": "math",
            "params": {"source": str(train)},
            "eval_sets": [
                {"name": "aime24", "params": {"source": str(DATASETS / "aime24.parquet")}, "samples": 2},
                {"name": "lcb", "task": "code", "params": {"source": str(LCB)}, "size": 1, "max_tokens": 8, "every": 0},
            ],
        },
        output_dir=str(tmp_path / "out"),
        name="sets",
        model={**TINY["model"], "cold_start": {"steps": 10, "batch_size": 8, "lr": 1e-2}},
        rollout={"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 8},
        train={"steps": 2, "eval_every": 1},
    )
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(raw))
    result = gspo("train", path)
    assert result.exit_code == 0, result.output
    assert "1 evaluation problem excluded" in result.output
    assert "evaluation sets: aime24 (math, 3 problems x 2), lcb (code, 1 problem x 1)" in result.output
    run = tmp_path / "out/sets/gspo/seed0"
    evals = [json.loads(line) for line in (run / "eval.jsonl").read_text().splitlines()]
    assert [(e["set"], e["step"]) for e in evals] == [
        ("aime24", 0),
        ("lcb", 0),
        ("aime24", 1),
        ("aime24", 2),
        ("lcb", 2),
    ]
    assert all(f"avg@{e['samples']}" in e["scores"] for e in evals)
    info = json.loads((run / "run.json").read_text())
    assert info["data"]["excluded_from_training"] == 1 and info["data"]["train_problems"] == 6
    assert info["data"]["eval_sets"]["lcb"] == {
        "task": "code",
        "source": str(LCB),
        "problems": 1,
        "samples": 1,
        "max_tokens": 8,
        "every": 0,
    }
    assert info["cold_start"]["excluded_problems"] == 4 and info["cold_start"]["train_problems"] == 6
    table = gspo("compare", tmp_path / "out/sets").output
    assert "aime24 avg@2 best" in table and "lcb avg@1 final" in table
    result = gspo("plot", tmp_path / "out/sets", "-o", tmp_path / "figs")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "figs/eval_aime24.png").is_file() and (tmp_path / "figs/eval_lcb.png").is_file()
    # Re-scoring one set by name, then refusing a name the run does not have.
    result = gspo("eval", run, "--set", "lcb", "-q")
    assert result.exit_code == 0, result.output
    summary = json.loads((run / "eval_sets/lcb/eval_summary.json").read_text())
    assert (summary["set"], summary["task"], summary["problems"], summary["samples"]) == ("lcb", "code", 1, 1)
    assert "no evaluation set 'aime25'; the run's sets: aime24, lcb" in gspo("eval", run, "--set", "aime25").output


@pytest.mark.slow
def test_math_file_without_solutions_trains_and_evaluates(tmp_path):
    from gspo_cli.train.loop import train_experiment
    from gspo_cli.train.reporting import quiet_reporter

    raw = spec(
        {"name": "math", "params": {"source": str(DATASETS / "aime25.jsonl")}, "eval_size": 1},
        output_dir=str(tmp_path / "out"),
        model={**TINY["model"], "cold_start": {"steps": 5, "batch_size": 4, "lr": 1e-2}},
        rollout={"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 8},
        train={"steps": 1},
    )
    (res,) = train_experiment(spec_from_dict(raw), reporter=quiet_reporter())
    assert res.status == "completed"
    info = json.loads((Path(res.path) / "run.json").read_text())
    assert info["data"]["train_problems"] == 2 and info["data"]["excluded_from_training"] == 1
    assert info["cold_start"]["with_solution"] == 2  # the boxed answer alone stands in for a solution
    assert [e["n"] for e in map(json.loads, (Path(res.path) / "eval.jsonl").read_text().splitlines())] == [1, 1]
    result = gspo("eval", res.path, "-k", 1, "-q")
    assert result.exit_code == 0, result.output


@pytest.mark.slow
def test_builtin_eval_on_a_dataset_never_cold_starts_on_it(tmp_path):
    """Problems whose answers are random 6-digit codes: no model can know them, so a score far
    above 0 means the model saw them (before this fix the cold start trained on the file)."""
    from gspo_cli.eval.run import Sampling, Target, evaluate_model

    rng = random.Random(7)
    rows = []
    for i in range(12):
        code = rng.randint(100000, 999999)
        rows.append(
            {"id": i, "problem": f"Secret code of vault {i}?", "solution": f"\\boxed{{{code}}}", "answer": code}
        )
    data = write_jsonl(tmp_path / "secret.jsonl", rows)
    small = spec_from_dict(
        spec(
            {"name": "math"},
            model={**TINY["model"], "cold_start": {"steps": 20, "batch_size": 8, "lr": 1e-2}},
            rollout={"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 12},
        )
    )
    task = make_task("math", {"source": str(data)})
    lines = []
    results, summary = evaluate_model(
        Target("builtin:tiny-moe", spec=small), task, Sampling(samples=2), None, log=lines.append
    )
    assert summary["scores"]["avg@2"] == 0.0
    assert any("not the evaluated dataset (its 12 problems excluded)" in line for line in lines)
    cold = summary["cold_start"]
    assert cold["excluded_problems"] == 12 and cold["train_problems"] is None  # synthetic, minus the file
    assert cold["data"].startswith("arithmetic:")
