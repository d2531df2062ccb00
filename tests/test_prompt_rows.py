"""The `prompts` task's rows: rows without a usable prompt are dropped and counted in one line,
and columns whose names differ only in case are refused."""

from __future__ import annotations

import json
import warnings

import pytest
from typer.testing import CliRunner

from gspo_cli.cli.app import app
from gspo_cli.errors import SpecError
from gspo_cli.rewards import with_rewards
from gspo_cli.tasks import make_task

REWARD = "def short(completions, **kwargs):\n    return [-float(len(c)) for c in completions]\n"


def sixty_rows() -> list[dict]:
    """60 rows, 40 of them without a usable prompt: 10 without the column, 10 null, 10 numbers,
    5 objects, 5 empty strings; the 20 good ones every third row."""
    bad = [{}] * 10 + [{"prompt": None}] * 10 + [{"prompt": 7}] * 10 + [{"prompt": {"q": "x"}}] * 5
    bad += [{"prompt": ""}] * 5
    rows, good = [], 0
    for i in range(60):
        if i % 3 == 0:
            rows.append({"prompt": f"Question {good}?", "answer": str(good), "solution": str(good)})
            good += 1
        else:
            rows.append({**bad.pop(0), "answer": "0", "solution": "0"})
    return rows


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_sixty_rows_with_forty_bad_prompts_say_how_many_were_dropped_and_why(tmp_path):
    source = str(write(tmp_path / "rows.jsonl", sixty_rows()))
    (tmp_path / "r.py").write_text(REWARD)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        task = with_rewards(make_task("prompts", {"source": source}), [])
    assert [p.prompt for p in task.train_pool] == [f"Question {i}?" for i in range(20)]
    assert [str(w.message) for w in said] == [
        f"task.params.source: {source}: dropped 40 of 60 rows: 10 without a `prompt` column (first: row 1), "
        "10 whose `prompt` is null (first: row 16), 10 whose `prompt` is a number, not a string or a list of "
        "messages (first: row 31), 5 whose `prompt` is an object, not a string or a list of messages "
        "(first: row 46), 5 whose `prompt` is empty (first: row 53)"
    ]
    # the same line through the CLI (`gspo eval --completions` reads the rows, no model needed)
    comp = write(tmp_path / "c.jsonl", [{"id": "0", "completions": ["a", "bb"]}])
    res = CliRunner().invoke(
        app,
        [
            "eval",
            "-c",
            str(comp),
            "-t",
            "prompts",
            "-d",
            source,
            "-o",
            str(tmp_path / "out"),
            "--reward",
            f"{tmp_path}/r.py:short",
        ],
    )
    assert res.exit_code == 0, res.output
    assert f"warning: task.params.source: {source}: dropped 40 of 60 rows: 10 without a `prompt` column" in res.output
    assert "Traceback" not in res.output


def test_a_file_of_good_prompts_says_nothing(tmp_path):
    source = str(
        write(tmp_path / "rows.jsonl", [r for r in sixty_rows() if isinstance(r.get("prompt"), str) and r["prompt"]])
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(with_rewards(make_task("prompts", {"source": source}), []).train_pool) == 20


def test_columns_differing_only_in_case_are_refused_naming_both(tmp_path):
    rows = sixty_rows()
    rows[4] = {**rows[4], "Solution": "the other one"}
    source = str(write(tmp_path / "rows.jsonl", rows))
    with pytest.raises(SpecError) as err:
        with_rewards(make_task("prompts", {"source": source}), [])
    assert str(err.value) == (
        f"task.params.source: {source}: columns 'solution' and 'Solution' differ only in case (row 4); column "
        "names are read in lower case, so one would replace the other: rename or drop one"
    )
    # in a spec: one line, exit 2, before any model is built
    spec = tmp_path / "s.yaml"
    spec.write_text(
        json.dumps(
            {
                "name": "case",
                "model": {"name": "builtin:tiny-dense"},
                "task": {
                    "name": "prompts",
                    "params": {"source": source},
                    "rewards": [{"function": f"{tmp_path}/r.py:short"}],
                },
                "arms": [{"name": "gspo", "preset": "paper-gspo"}],
            }
        )
    )
    (tmp_path / "r.py").write_text(REWARD)
    res = CliRunner().invoke(app, ["train", str(spec), "-o", str(tmp_path / "out")])
    assert res.exit_code == 2, res.output
    assert "columns 'solution' and 'Solution' differ only in case (row 4)" in " ".join(res.output.split())
    assert "Traceback" not in res.output and "cold start" not in res.output
