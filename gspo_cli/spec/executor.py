"""The `executor:` section: where the runs of `gspo sweep`, `gspo sweep --until-decided` and
`gspo tune` train (this machine's processes, SLURM jobs, Ray tasks) and what each run may use
there. It says where a run trains, never what the run is: a completed run is the same run
whichever executor trained it (spec comparison ignores this section)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from gspo_cli.spec.base import _Strict


class SlurmConfig(_Strict):
    """Resources of one run's SLURM job (sbatch options), and where the job files go. A run
    directory must be on a filesystem that the submitting machine and the nodes share."""

    partition: str | None = Field(None, description="sbatch --partition; null: the cluster's default")
    time_min: int = Field(
        60,
        ge=1,
        description="time limit of one run's job in minutes (sbatch --time); shortly before it the run checkpoints "
        "and its job is requeued, and resumes",
    )
    cpus_per_run: int = Field(
        1,
        ge=1,
        description="CPUs of one run on each of its nodes (sbatch --cpus-per-task, one task per node); its "
        "processes on a node share them as torch threads",
    )
    gpus_per_run: int = Field(0, ge=0, description="GPUs of one run on each node (sbatch --gpus-per-node); 0: none")
    nodes: int = Field(
        1,
        ge=1,
        description="nodes of one run (sbatch --nodes); above 1 the run trains under torchrun across them, "
        "rank 0 on the job's first node",
    )
    tasks_per_node: int = Field(
        1,
        ge=1,
        description="training processes of one run on each node (torchrun --nproc-per-node, e.g. its GPUs); "
        "above 1 the run trains under torchrun: nodes x tasks_per_node processes",
    )
    account: str | None = Field(None, description="sbatch --account; null: the user's default")
    mem_gb: float | None = Field(None, gt=0, description="memory of one run's node in GB (sbatch --mem); null: default")
    sbatch: list[str] = Field(
        default_factory=list,
        description='extra sbatch options, one per item as on an #SBATCH line (e.g. "--qos=low", "--constraint=a100")',
    )
    max_running: int | None = Field(
        None, ge=1, description="the most runs of one job array running at once (sbatch --array=...%N); null: all"
    )
    poll_s: float = Field(5.0, gt=0, description="seconds between two looks at the jobs' states while waiting")
    folder: str | None = Field(
        None,
        description="where the job scripts, logs and the record of submitted jobs go; null: "
        "<output_dir>/<name>/.slurm beside the runs (must be on the shared filesystem)",
    )


class RayConfig(_Strict):
    """Where the Ray cluster is and what one run's task reserves on it."""

    address: str | None = Field(
        None,
        description='an existing cluster: the head\'s HOST:PORT (ray start --head --port PORT), "auto" or '
        '"ray://head:10001"; null: start a local one for the command and stop it after',
    )
    num_cpus: float = Field(1.0, gt=0, description="CPUs one run's task reserves (its torch threads: at least 1)")
    num_gpus: float = Field(0.0, ge=0, description="GPUs one run's task reserves; 0: none")


class ExecutorConfig(_Strict):
    """Where the runs of a study train: `local` (processes on this machine, `--jobs` at a time),
    `slurm` (one job array per round, through submitit) or `ray` (one task per run). The command
    line's `--executor` overrides `kind`."""

    kind: Literal["local", "slurm", "ray"] = Field(
        "local", description="local: processes here; slurm: SLURM jobs (submitit); ray: Ray tasks"
    )
    slurm: SlurmConfig = Field(SlurmConfig(), description="resources of each run's job when kind is slurm")
    ray: RayConfig = Field(RayConfig(), description="cluster and resources of each run's task when kind is ray")
