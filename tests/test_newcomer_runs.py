"""A newcomer's run directories: gspo
never deletes what it did not write, a run made with other data, model or code is neither
skipped nor resumed, `-o` naming a file is one line, and the cold-start line shows no cache keys."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from helpers import TINY
from typer.testing import CliRunner

from gspo_cli.cli.app import app
from gspo_cli.distributed import DistInfo
from gspo_cli.errors import SpecError
from gspo_cli.eval.sets import plan_data
from gspo_cli.models.builtin import cold_start_line
from gspo_cli.runs import BEHAVIOUR_VERSION, RUN_FILES, RUN_FOLDERS, RunDir, run_path
from gspo_cli.spec.loading import dump_spec, spec_from_dict
from gspo_cli.tasks import make_task
from gspo_cli.train.resume import decide_start, model_digest, run_identity

FIXTURES = Path(__file__).parent / "fixtures"
ONE_ARM = {**TINY, "arms": [TINY["arms"][0]]}  # grpo


def gspo(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def last_line(result) -> str:
    assert "Traceback" not in result.output, result.output
    lines = [x for x in result.output.splitlines() if x.strip()]
    return lines[-1]


def write_spec(tmp_path: Path, raw: dict) -> Path:
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


# --- item 2: nothing is deleted that gspo did not write ------------------------------------


def test_a_prepopulated_run_directory_is_refused_and_kept(tmp_path):
    spec = write_spec(tmp_path, {**ONE_ARM, "name": "prepop"})
    run = tmp_path / "runs" / "prepop" / "grpo" / "seed0"
    run.mkdir(parents=True)
    (run / "notes.txt").write_text("my notes\n")
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    lone = tmp_path / "runs" / "prepop" / "gspo" / "seed0"  # only a file of gspo's name, no run.json
    lone.mkdir(parents=True)
    (lone / "metrics.jsonl").write_text('{"step": 7}\n')
    for extra in ([], ["--force"]):
        res = gspo("train", spec, "-o", tmp_path / "runs", *extra)
        assert res.exit_code == 2, res.output
        line = last_line(res)
        assert str(run) in line and "notes.txt" in line and "did not write" in line
        assert (run / "notes.txt").read_text() == "my notes\n"
        assert (run / "metrics.jsonl").read_text() == '{"step": 1}\n'
        assert not (run / "run.json").exists()
    (run / "notes.txt").unlink()
    res = gspo("train", spec, "-o", tmp_path / "runs", "--arm", "grpo")
    assert res.exit_code == 2 and "holds files gspo did not write (metrics.jsonl)" in last_line(res)
    assert (run / "metrics.jsonl").read_text() == '{"step": 1}\n'
    res = gspo("train", write_spec(tmp_path, {**TINY, "name": "prepop"}), "-o", tmp_path / "runs", "--arm", "gspo")
    assert res.exit_code == 2 and f"{lone}: holds files gspo did not write (metrics.jsonl)" in last_line(res)


def test_reset_deletes_only_what_gspo_writes(tmp_path):
    rd = RunDir(tmp_path / "run")
    rd.path.mkdir()
    for name in RUN_FILES:
        (rd.path / name).write_text("x")
    for name in RUN_FOLDERS:
        (rd.path / name / "sub").mkdir(parents=True)
    (rd.path / ".run.json.tmp").write_text("{")  # a crash between write and rename
    (rd.path / ".tmp-model").mkdir()  # an interrupted export
    assert rd.foreign_entries() == []
    rd.reset()
    assert not rd.path.exists()

    rd.path.mkdir()
    (rd.path / "metrics.jsonl").write_text("x")
    (rd.path / "checkpoints").mkdir()
    (rd.path / "plots").mkdir()  # not ours
    with pytest.raises(SpecError, match=r"holds files gspo did not write \(plots\)"):
        rd.reset()
    assert sorted(p.name for p in rd.path.iterdir()) == ["checkpoints", "metrics.jsonl", "plots"]


def test_force_on_a_completed_run_with_a_file_of_the_users_is_refused(tmp_path):
    spec = spec_from_dict({**ONE_ARM, "output_dir": str(tmp_path / "runs")})
    rd = RunDir(run_path(spec.output_dir, spec.name, "grpo", 0))
    rd.path.mkdir(parents=True)
    rd.spec_file.write_text(dump_spec(spec))
    rd.update_info(status="completed")
    (rd.path / "analysis.ipynb").write_text("{}")
    with pytest.raises(SpecError, match="analysis.ipynb"):
        decide_start(rd, spec, True, DistInfo())
    assert (rd.path / "analysis.ipynb").is_file() and rd.info()["status"] == "completed"


# --- item 3: runs made with other data, model or code ---------------------------------------


def math_rows(path: Path, answers: list[str]) -> Path:
    rows = [{"problem": f"What is {i} + {i}?", "answer": a} for i, a in enumerate(answers)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def fake_completed_run(spec, identity) -> RunDir:
    """A run directory as `gspo train` leaves a completed run: spec.yaml and run.json."""
    rd = RunDir(run_path(spec.output_dir, spec.name, "grpo", 0))
    rd.path.mkdir(parents=True)
    rd.spec_file.write_text(dump_spec(spec))
    rd.update_info(status="completed", step=2, total_steps=2, **({"identity": identity} if identity else {}))
    return rd


def identity_of(spec) -> dict:
    task = make_task(spec.task.name, spec.task.params)
    sets, _ = plan_data(spec, task)
    return run_identity(spec, task, sets)


def data_spec(tmp_path: Path, train: Path, aime: Path):
    raw = {
        **ONE_ARM,
        "output_dir": str(tmp_path / "runs"),
        "task": {
            "name": "math",
            "params": {"source": str(train)},
            "eval_sets": [{"name": "aime", "task": "math", "params": {"source": str(aime)}}],
        },
    }
    return raw, spec_from_dict(raw)


def test_a_data_file_changed_in_place_is_not_skipped(tmp_path):
    train = math_rows(tmp_path / "train.jsonl", ["0", "2", "4", "6", "8", "10"])
    aime = math_rows(tmp_path / "aime.jsonl", ["1", "3"])
    raw, spec = data_spec(tmp_path, train, aime)
    rd = fake_completed_run(spec, identity_of(spec))
    assert decide_start(rd, spec, False, DistInfo()) == ("skip", None)

    math_rows(aime, ["1", "5"])  # a wrong answer fixed in place: same rows, same size
    with pytest.raises(SpecError, match=r"another evaluation set aime \(.*aime.jsonl changed\)"):
        decide_start(rd, spec, False, DistInfo())
    math_rows(aime, ["1", "3"])
    math_rows(train, ["0", "2", "4", "6", "8", "12"])
    with pytest.raises(SpecError, match=r"other training data \(.*train.jsonl changed\)"):
        decide_start(rd, spec, False, DistInfo())
    # Through the CLI: one line, exit 2, before any model is built (no cold start on these rows).
    res = gspo("train", write_spec(tmp_path, raw))
    assert res.exit_code == 2, res.output
    line = last_line(res)
    assert line.startswith(f"error: {rd.path}: this completed run was made with other training data")
    assert "another output directory (-o) or use --force" in line


def test_runs_of_another_behaviour_version_or_without_one_are_not_skipped_or_resumed(tmp_path):
    spec = spec_from_dict({**ONE_ARM, "output_dir": str(tmp_path / "runs")})
    identity = identity_of(spec)
    assert identity["behaviour_version"] == BEHAVIOUR_VERSION
    rd = fake_completed_run(spec, {**identity, "behaviour_version": BEHAVIOUR_VERSION - 1})
    with pytest.raises(SpecError, match=f"behaviour version {BEHAVIOUR_VERSION - 1} of the training code"):
        decide_start(rd, spec, False, DistInfo())
    rd.update_info(identity=None)  # an old run.json: loads, and counts as another version
    assert rd.info()["status"] == "completed"
    with pytest.raises(SpecError, match="this completed run was made with an older gspo"):
        decide_start(rd, spec, False, DistInfo())
    # Unfinished, with a checkpoint to resume: refused likewise.
    rd.update_info(status="interrupted")
    ckpt = rd.checkpoints / "step_000001"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer_state.pt").write_bytes(b"")
    (ckpt / "config.json").write_text("{}")
    with pytest.raises(SpecError, match="this unfinished run was made with an older gspo"):
        decide_start(rd, spec, False, DistInfo())
    rd.update_info(identity=identity)
    assert decide_start(rd, spec, False, DistInfo()) == ("resume", str(ckpt))


def test_the_model_digest_follows_the_weights(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"\0" * 64)
    task = make_task("arithmetic", {})
    spec = spec_from_dict({**ONE_ARM, "model": {"name": str(model)}})
    before = model_digest(spec.model, task)
    assert before.startswith("dir:") and model_digest(spec.model, task) == before
    (model / "model.safetensors").write_bytes(b"\1" * 64)
    assert model_digest(spec.model, task) != before
    # A built-in model: its cache key, which changes with the cold start.
    tiny = spec_from_dict(ONE_ARM)
    longer = spec_from_dict({**ONE_ARM, "model": {**ONE_ARM["model"], "cold_start": {"steps": 121}}})
    assert model_digest(tiny.model, task) != model_digest(longer.model, task)
    assert model_digest(spec_from_dict({**ONE_ARM, "model": {"name": "org/not-cached"}}).model, task) == (
        "hub:org/not-cached"
    )


def test_a_code_source_is_fingerprinted_by_content(tmp_path):
    pytest.importorskip("gspo_cli.sandbox.programs")
    src = tmp_path / "lcb.jsonl"
    text = (FIXTURES / "lcb_sample.jsonl").read_text()
    src.write_text(text)
    st = src.stat()
    try:
        before = make_task("code", {"source": str(src)}).fingerprint()
    except SpecError as err:  # no sandbox on this machine
        pytest.skip(str(err))
    first = json.loads(text.splitlines()[0])
    title = first["question_title"]
    edited = title[:-1] + ("x" if title[-1] != "x" else "y")  # same size
    src.write_text(text.replace(json.dumps(title)[1:-1], json.dumps(edited)[1:-1], 1))
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size and time as before
    assert src.stat().st_size == st.st_size
    assert make_task("code", {"source": str(src)}).fingerprint() != before


def test_gspo_eval_says_when_a_runs_evaluation_set_changed(tmp_path):
    """`gspo eval RUN` re-reads the run's evaluation sets: one that changed since training is
    said (even with --quiet) and marked in its eval_summary.json; an unchanged one is not."""
    import shutil

    from helpers import tiny_model_dir

    aime = math_rows(tmp_path / "aime.jsonl", ["1", "3"])
    raw = {
        **ONE_ARM,
        "output_dir": str(tmp_path / "runs"),
        "task": {**ONE_ARM["task"], "eval_sets": [{"name": "aime", "task": "math", "params": {"source": str(aime)}}]},
        "rollout": {**ONE_ARM["rollout"], "max_new_tokens": 4},
    }
    spec = spec_from_dict(raw)
    rd = fake_completed_run(spec, identity_of(spec))
    shutil.copytree(tiny_model_dir(), rd.checkpoints / "step_000002")  # any model will do: no training here
    res = gspo("eval", rd.path, "-q")
    assert res.exit_code == 0, res.output
    assert "changed" not in res.output
    assert "set_changed" not in json.loads((rd.path / "eval_sets" / "aime" / "eval_summary.json").read_text())

    math_rows(aime, ["1", "5"])  # fixed in place after training
    res = gspo("eval", rd.path, "-q")
    assert res.exit_code == 0, res.output
    warning = f"warning: evaluation set aime: {aime} changed since {rd.path} was trained"
    assert warning in res.output
    summary = json.loads((rd.path / "eval_sets" / "aime" / "eval_summary.json").read_text())
    assert summary["set_changed"].startswith(f"evaluation set aime: {aime} changed")
    assert sorted(p.name for p in rd.path.iterdir()) == sorted(["checkpoints", "eval_sets", "run.json", "spec.yaml"])


# --- item 8: -o naming a file -----------------------------------------------------------------


def test_output_dir_naming_a_file_is_one_line_before_any_model(tmp_path, monkeypatch):
    import gspo_cli.train.loop as loop

    def no_model(*a, **k):
        raise AssertionError("a model was resolved before the output directory was checked")

    monkeypatch.setattr(loop, "resolve_model_source", no_model)
    spec = write_spec(tmp_path, ONE_ARM)
    afile = tmp_path / "results.txt"
    afile.write_text("not a directory\n")
    for out in (afile, afile / "sub"):
        res = gspo("train", spec, "-o", out)
        assert res.exit_code == 2, res.output
        assert (
            last_line(res)
            == f"error: --output-dir: {afile} is a file; runs are written into a directory: name another one"
        )
    assert afile.read_text() == "not a directory\n"


# --- item 14: the cold-start line ------------------------------------------------------------


def test_the_cold_start_line_shows_no_cache_key():
    info = {
        "steps": 300,
        "batch_size": 64,
        "final_loss": 0.1012,
        "threads": 2,
        "cpu_capability": "AVX512",
        "task": "math",
        "data": 'arithmetic:{"num_operands":2,"max_operand":50,"operators":"+-","format_weight":0.0}-minus:0123abcd',
        "train_problems": None,
        "excluded_problems": 12,
    }
    line = cold_start_line(info)
    assert line == (
        "built-in model cold-started for 300 steps x 64 on generated math problems, "
        "12 evaluation problems excluded (final loss 0.101)"
    )
