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


def test_a_runs_nodes_and_tasks_per_node_become_one_task_per_node_and_torchrun(tmp_path):
    config = SlurmConfig(nodes=2, tasks_per_node=4, cpus_per_run=16, gpus_per_run=4, time_min=120, partition="gpu")
    p = SlurmExecutor(config, tmp_path)._parameters()
    assert p == {
        "job_name": "gspo",
        "time": 120,
        "cpus_per_task": 16,
        "nodes": 2,
        "ntasks_per_node": 1,  # one torchrun per node starts the node's 4 processes
        "stderr_to_stdout": True,
        "signal_delay_s": 120,
        "partition": "gpu",
        "gpus_per_node": 4,
    }
    plain = SlurmExecutor(SlurmConfig(time_min=1), tmp_path)._parameters()  # signal 30 s before a 1 min limit
    assert (plain["nodes"], plain["ntasks_per_node"], plain["cpus_per_task"], plain["signal_delay_s"]) == (1, 1, 1, 30)


def test_the_launch_command_is_gspo_train_alone_or_under_torchrun():
    import sys

    from gspo_cli.train.executors.slurm import launch_command

    train = [sys.executable, "-m", "gspo_cli", "train", "s.yaml", "--quiet"]
    assert launch_command("s.yaml", False, nodes=1, per_node=1) == train
    torchrun = [sys.executable, "-m", "torch.distributed.run"]
    assert launch_command("s.yaml", True, nodes=1, per_node=2) == [
        *torchrun, "--nnodes", "1", "--nproc-per-node", "2", "--standalone", *train[1:], "--force"
    ]  # fmt: skip
    # every node of job 4127 names the same master and port; each its own node rank
    assert launch_command("s.yaml", False, nodes=2, per_node=8, node_rank=1, head="gpu07", job_id="4127") == [
        *torchrun, "--nnodes", "2", "--nproc-per-node", "8",
        "--node-rank", "1", "--master-addr", "gpu07", "--master-port", "24127", *train[1:],
    ]  # fmt: skip


class _Child:
    returncode = 0

    def __init__(self, command, **kw):
        _Child.commands.append((command, kw["env"]["OMP_NUM_THREADS"]))

    def poll(self):
        return 0


def test_a_job_slurm_runs_again_resumes_its_run_instead_of_forcing_it(tmp_path, monkeypatch):
    """A job requeued by hand (or after a node failure) runs the same pickled call again: only its
    first run passes --force. Node 1 of a two-node run writes its own log."""
    import importlib.util
    import os
    import sys
    import types

    from gspo_cli.train.executors import slurm

    if importlib.util.find_spec("submitit") is None:  # `make test` has no slurm extra: its job environment, by hand
        env = lambda: types.SimpleNamespace(node=int(os.environ["SLURM_NODEID"]), hostnames=["node3", "node4"])  # noqa: E731
        monkeypatch.setitem(sys.modules, "submitit", types.SimpleNamespace(JobEnvironment=env))
    for k, v in {"SUBMITIT_EXECUTOR": "slurm", "SLURM_JOB_ID": "77", "SLURM_CPUS_PER_TASK": "6"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node[3-4]")
    monkeypatch.setenv("SLURM_NODEID", "0")
    _Child.commands = []
    monkeypatch.setattr(slurm.subprocess, "Popen", _Child)
    job = slurm.TrainJob(str(tmp_path / "s.yaml"), str(tmp_path / "r.log"), True, nodes=2, per_node=3)
    assert job() == 0 and job() == 0
    (first, threads), (again, _) = _Child.commands
    assert first[-1] == "--force" and "--force" not in again and threads == "2"  # 6 CPUs / 3 processes
    assert first[first.index("--master-addr") + 1] == "node3" and first[first.index("--node-rank") + 1] == "0"
    monkeypatch.setenv("SLURM_NODEID", "1")
    assert slurm.TrainJob(str(tmp_path / "s.yaml"), str(tmp_path / "r.log"), True, nodes=2, per_node=3)() == 0
    assert _Child.commands[-1][0][-1] == "--force" and (tmp_path / "r.log.node1").exists()


def test_executor_flags_override_the_spec_and_a_flag_of_another_executor_is_refused(tmp_path):
    from typer.testing import CliRunner

    from gspo_cli.cli.app import app
    from gspo_cli.cli.common import placement_overrides
    from gspo_cli.spec.loading import load_spec

    path = tmp_path / "s.yaml"
    path.write_text(dump_spec(spec_from_dict({**TINY, "output_dir": str(tmp_path)})))
    got = placement_overrides(path, ["seeds=[0]"], "slurm", nodes=2, tasks_per_node=4)
    assert got == ["seeds=[0]", "executor.slurm.nodes=2", "executor.slurm.tasks_per_node=4"]
    ex = sw.executor_for(load_spec(path, got), "slurm")
    assert (ex._parameters()["nodes"], ex.config.tasks_per_node) == (2, 4)
    got = placement_overrides(path, [], "ray", address="10.0.0.1:6379")
    assert sw.executor_for(load_spec(path, got), "ray").config.address == "10.0.0.1:6379"
    # without --executor the spec's kind decides; this spec trains locally
    res = CliRunner().invoke(app, ["sweep", str(path), "--address", "10.0.0.1:6379", "--dry-run"])
    assert res.exit_code == 2
    assert "--address goes with the ray executor (--executor ray); the runs train on local" in res.output
    res = CliRunner().invoke(app, ["tune", str(path), "--executor", "ray", "--nodes", "2"])
    assert res.exit_code == 2 and "--nodes goes with the slurm executor" in res.output
