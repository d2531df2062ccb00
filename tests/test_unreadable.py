"""Every file a command reads, handed a binary file (or a directory, or one it may not read):
one `error:` line naming the file, exit code 2, never a traceback."""

import builtins
import json
import os
import shutil
from pathlib import Path

import pytest
import yaml
from synthetic_runs import make_experiment
from typer.testing import CliRunner

from gspo_cli.cli.app import app
from gspo_cli.errors import SpecError
from gspo_cli.files import iter_lines, read_text

FIXTURES = Path(__file__).parent / "fixtures"
H4 = FIXTURES / "aime_h4.jsonl"
BINARY = b"\x89PNG\r\n\x1a\n\xff\xfe\x00\x01binary\n"  # not UTF-8 (a PNG header, then 0xff)
SPEC = {
    "name": "exp",
    "rollout": {"prompts_per_step": 4, "group_size": 2},
    "arms": [{"name": "grpo", "preset": "paper-grpo"}],
}


def one_error(result, names: Path | str, why: str = "not a UTF-8 text file") -> str:
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    lines = [ln for ln in result.stderr.splitlines() if ln.startswith(("error: ", "       "))]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert f"{names}: {why}" in lines[0], lines[0]
    return lines[0]


def gspo(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def binary(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(BINARY)
    return path


def test_spec_files(tmp_path):
    spec = binary(tmp_path / "exp.yaml")
    one_error(gspo("train", spec), spec)
    one_error(gspo("sweep", spec, "--dry-run"), spec)
    one_error(gspo("train", tmp_path), tmp_path, "is a directory, not a spec file")


def test_datasets(tmp_path):
    comp = tmp_path / "c.jsonl"
    comp.write_text(json.dumps({"id": 60, "completion": "x"}) + "\n")
    for name in ("data.jsonl", "data.json"):
        data = binary(tmp_path / name)
        line = one_error(gspo("eval", "-c", comp, "-t", "math", "-d", data), data)
        assert line.startswith("error: task.params.source: ")
    lcb = binary(tmp_path / "lcb.jsonl")
    one_error(gspo("eval", "-c", comp, "-t", "code", "-d", lcb), lcb)
    one_error(gspo("eval", "-c", comp, "-t", "math", "-d", tmp_path), tmp_path, "is a directory, not a dataset file")
    # A training spec's dataset goes through the same loader, before any model is built.
    spec = tmp_path / "exp.yaml"
    spec.write_text(yaml.safe_dump({**SPEC, "task": {"name": "math", "params": {"source": str(data)}}}))
    one_error(gspo("train", spec), data)


def test_completions(tmp_path):
    comp = binary(tmp_path / "c.jsonl")
    one_error(gspo("eval", "-c", comp, "-t", "math", "-d", H4), comp)
    one_error(gspo("eval", "-c", tmp_path, "-t", "math", "-d", H4), tmp_path, "is a directory, not a file")


@pytest.mark.parametrize("name", ["run.json", "metrics.jsonl", "eval.jsonl", "spec.yaml"])
def test_run_directory_files(tmp_path, name):
    exp = make_experiment(tmp_path)
    bad = binary(exp / "gspo/seed1" / name)
    for args in (["compare", exp], ["plot", exp, "-o", tmp_path / "figs"], ["report", exp, "-o", tmp_path / "r.md"]):
        one_error(gspo(*args), bad)
    if name in ("run.json", "metrics.jsonl"):
        one_error(gspo("list", exp), bad)
    bad.unlink()
    bad.mkdir()  # a directory where the file should be
    one_error(gspo("compare", exp), bad, "is a directory, not a file")


def test_run_spec_read_by_eval_train_and_sweep(tmp_path):
    run = tmp_path / "out/exp/grpo/seed0"
    spec_file = binary(run / "spec.yaml")
    (run / "run.json").write_text(json.dumps({"status": "completed"}))
    comp = tmp_path / "c.jsonl"
    comp.write_text(json.dumps({"id": 60, "completion": "x"}) + "\n")
    one_error(gspo("eval", "-c", comp, run), spec_file)
    one_error(gspo("train", "--resume", run), spec_file)
    # A sweep compares a completed run's stored spec before it starts anything.
    sweep_spec = tmp_path / "sweep.yaml"
    sweep_spec.write_text(yaml.safe_dump({**SPEC, "output_dir": str(tmp_path / "out")}))
    one_error(gspo("sweep", sweep_spec), spec_file)
    binary(run / "run.json")
    one_error(gspo("sweep", sweep_spec, "--dry-run"), run / "run.json")


def test_train_reads_its_run_directory_through_the_same_reader(tmp_path):
    from gspo_cli.distributed import DistInfo
    from gspo_cli.runs import RunDir
    from gspo_cli.spec.loading import spec_from_dict
    from gspo_cli.train.loop import run_spec
    from gspo_cli.train.resume import decide_start

    spec = spec_from_dict({**SPEC, "output_dir": str(tmp_path)})
    rd = RunDir(tmp_path / "exp/grpo/seed0")
    binary(rd.info_file)
    with pytest.raises(SpecError, match=f"{rd.info_file}: not a UTF-8 text file"):
        decide_start(rd, run_spec(spec, spec.arms[0], 0), False, DistInfo())
    rd.info_file.write_text(json.dumps({"status": "completed"}))
    binary(rd.spec_file)
    with pytest.raises(SpecError, match=f"{rd.spec_file}: not a UTF-8 text file"):
        decide_start(rd, run_spec(spec, spec.arms[0], 0), False, DistInfo())


def test_no_permission_is_one_line(tmp_path, monkeypatch):
    """As root (our machines, CI) chmod does not stop a read, so the error is injected."""
    path = tmp_path / "secret.jsonl"
    path.write_text("{}\n")
    real_open = builtins.open

    def guarded(file, *args, **kwargs):
        if str(file) == str(path):
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", guarded)
    with pytest.raises(SpecError, match=f"^--completions: {path}: permission denied$"):
        read_text(path, "--completions")
    with pytest.raises(SpecError, match=f"^{path}: permission denied$"):
        list(iter_lines(path))
    one_error(gspo("eval", "-c", path, "-t", "math", "-d", H4), path, "permission denied")


@pytest.mark.skipif(os.geteuid() == 0 or shutil.which("chmod") is None, reason="root reads any file")
def test_no_permission_for_real(tmp_path):
    spec = tmp_path / "exp.yaml"
    spec.write_text(yaml.safe_dump(SPEC))
    spec.chmod(0)
    one_error(gspo("train", spec), spec, "permission denied")
