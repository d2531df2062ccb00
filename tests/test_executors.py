"""The executor seam without a scheduler: which executor a spec and --executor ask for, the
executor section never making a run another run, sbatch options from the spec, and the SLURM
executor's reading of job states (squeue/sacct replaced by fakes)."""

import subprocess
from typing import get_args

import pytest
from helpers import TINY

from gspo_cli.errors import SpecError
from gspo_cli.spec import ExecutorConfig, SlurmConfig
from gspo_cli.spec.loading import dump_spec, spec_differences, spec_from_dict
from gspo_cli.train import sweep as sw
from gspo_cli.train.executors import EXECUTORS, make_executor
from gspo_cli.train.executors.base import last_line
from gspo_cli.train.executors.local import LocalExecutor
from gspo_cli.train.executors.slurm import JobBook, SlurmExecutor, job_states, sbatch_options


def test_the_spec_names_exactly_the_registered_executors():
    assert set(get_args(ExecutorConfig.model_fields["kind"].annotation)) == set(EXECUTORS)


def test_the_command_line_overrides_the_specs_kind_and_local_is_the_default(tmp_path):
    assert isinstance(make_executor(None, jobs=3), LocalExecutor) and make_executor(None, jobs=3).jobs == 3
    slurm = ExecutorConfig(kind="slurm", slurm=SlurmConfig(partition="gpu"))
    assert isinstance(make_executor(slurm, kind="local"), LocalExecutor)
    ex = make_executor(slurm, root=tmp_path / "exp")
    assert isinstance(ex, SlurmExecutor) and ex.folder == (tmp_path / "exp/.slurm").absolute()
    with pytest.raises(SpecError, match="unknown executor 'slurn'"):
        make_executor(None, kind="slurn")
    assert make_executor(None, kind="ray", root=tmp_path).folder == (tmp_path / ".ray").absolute()


def test_the_executor_section_is_where_a_run_trains_never_what_it_is(tmp_path):
    raw = {**TINY, "output_dir": str(tmp_path), "seeds": [0, 1]}
    plain = spec_from_dict(raw)
    placed = spec_from_dict({**raw, "executor": {"kind": "slurm", "slurm": {"partition": "a", "time_min": 5}}})
    assert spec_differences(dump_spec(plain), placed) == []
    path = tmp_path / "s.yaml"
    path.write_text(dump_spec(placed))
    runs = sw.plan(path)
    assert all(r.spec.executor is None for r in runs)  # each run's own spec says nothing of where it trains
    assert sw.executor_for(placed).name == "slurm" and sw.executor_for(placed, "local", 2).jobs == 2


def test_unknown_executor_fields_are_refused_with_the_field():
    with pytest.raises(SpecError, match="executor.slurm.partiton"):
        spec_from_dict({**TINY, "executor": {"kind": "slurm", "slurm": {"partiton": "gpu"}}})


def test_sbatch_lines_become_submitit_parameters():
    assert sbatch_options(["--qos=low", "#SBATCH --mail-type END", "--exclusive"]) == {
        "qos": "low",
        "mail_type": "END",
        "exclusive": True,
    }
    with pytest.raises(SpecError, match="not one long sbatch option"):
        sbatch_options(["-p gpu"])


def _fake_run(outputs):
    def run(cmd, **kw):
        tool = cmd[0]
        if tool == "squeue":
            base = cmd[-1]
            return subprocess.CompletedProcess(
                cmd, 0 if base in outputs["squeue"] else 1, outputs["squeue"].get(base, ""), ""
            )
        return subprocess.CompletedProcess(cmd, 0, outputs.get("sacct", ""), "")

    return run


def test_job_states_come_from_squeue_then_sacct(monkeypatch):
    outputs = {"squeue": {"12": "12_0|RUNNING\n12_1|PENDING\n"}, "sacct": "7_0|CANCELLED by 0\n"}
    monkeypatch.setattr(subprocess, "run", _fake_run(outputs))
    assert job_states(["12_0", "12_1", "7_0", "9"]) == {"12_0": "RUNNING", "12_1": "PENDING", "7_0": "CANCELLED"}


def test_the_job_record_survives_a_new_session(tmp_path):
    book = JobBook(tmp_path / ".slurm")
    book.jobs["/runs/a/seed0"] = {"job": "12_0", "log": "x.log", "submitted": 1.0}
    book.write()
    assert JobBook(tmp_path / ".slurm").jobs == book.jobs
    (tmp_path / "log").write_text("one\ntwo\n\n")
    assert last_line(tmp_path / "log") == "two" and last_line(tmp_path / "missing") == ""
