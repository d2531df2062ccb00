#!/usr/bin/env bash
# Run a sweep as a SLURM job array: each task takes a stable shard of the plan, so the
# array covers every run exactly once. Resubmitting skips completed runs and resumes
# interrupted ones from their last checkpoint.
#
#   gspo sweep experiments/sweep_clip.yaml --dry-run      # count the runs: N
#   sbatch --array=0-5 experiments/job_array.sh experiments/sweep_clip.yaml
#
# Without SLURM, the same shards by hand:  gspo sweep SPEC --shard 0/6  ...  --shard 5/6
#SBATCH --job-name=gspo-sweep
#SBATCH --cpus-per-task=2
#SBATCH --time=02:00:00
#SBATCH --output=logs/%x-%A_%a.out
set -euo pipefail
spec="${1:?usage: job_array.sh SPEC}"
# gspo reads SLURM_ARRAY_TASK_ID / SLURM_ARRAY_TASK_COUNT itself; --json prints a summary.
gspo sweep "$spec" --json
