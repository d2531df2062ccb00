"""Where the planned runs of a sweep, a tune or a round of `--until-decided` train: `local`
(processes on this machine), `slurm` (one job array per round, through submitit) or `ray` (one
task per run). `train.sweep.run_plan` decides which runs to train (completed ones are skipped,
interrupted ones resume, by the run directories) and hands them to one executor; every executor
trains a run the same way, as `gspo train` on the run's own spec, so a run's files are the same
wherever it trained.

An executor has `run(runs, *, force, log) -> list[record]` (one record per run: `base.record`)
and may have `cancel(runs, log)`. `make_executor` builds the one a spec's `executor:` section
and the command line ask for."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gspo_cli.errors import SpecError

if TYPE_CHECKING:
    from gspo_cli.spec import ExecutorConfig

# kind -> module under gspo_cli.train.executors; the spec's executor.kind lists the same names
# (tests/test_executors.py holds the two together).
EXECUTORS = {"local": "local", "slurm": "slurm", "ray": "ray"}


def make_executor(config: ExecutorConfig | None, *, kind: str | None = None, jobs: int = 1, root=None):
    """The executor of `kind` (the command line's --executor), else of `config.kind`, else local.
    `jobs`: runs at once for the local executor. `root`: the experiment's directory of runs,
    where a scheduler's job files go unless the config names a folder. SpecError for an unknown
    kind or a missing optional package (with the extra that installs it)."""
    from gspo_cli.spec import ExecutorConfig

    config = config or ExecutorConfig()
    kind = kind or config.kind
    if kind not in EXECUTORS:
        raise SpecError(f"--executor: unknown executor {kind!r}; one of {', '.join(EXECUTORS)}")
    if kind == "local":
        from gspo_cli.train.executors.local import LocalExecutor

        return LocalExecutor(jobs)
    if kind == "slurm":
        from gspo_cli.train.executors.slurm import SlurmExecutor

        return SlurmExecutor(config.slurm, root)
    from gspo_cli.train.executors.ray import RayExecutor

    return RayExecutor(config.ray, root)
