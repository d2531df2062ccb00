"""Where a run starts: skipped (completed with this spec), resumed from its last complete
checkpoint (weights, optimizer, scheduler and RNG state; metrics rewound to that step), or
afresh; agreed by all ranks. Ranks other than 0 see the run directory read-only."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from gspo_cli import distributed
from gspo_cli.distributed import DistInfo
from gspo_cli.errors import SpecError
from gspo_cli.runs import RunDir, truncate_jsonl
from gspo_cli.spec import ExperimentSpec
from gspo_cli.spec.loading import check_stored_spec
from gspo_cli.train.checkpoint import load_trainer_state, valid_checkpoints
from gspo_cli.train.staleness import CHECKPOINT_KEY
from gspo_cli.train.step import Ctx


class ReadOnlyRunDir(RunDir):
    """What ranks other than 0 see: reads go to disk, writes go nowhere."""

    def update_info(self, **fields):
        return {**self.info(), **fields}

    def log_metrics(self, record):
        pass

    def log_eval(self, record):
        pass

    def log_samples(self, records):
        pass

    def reset(self):
        pass


def decide_start(rd: RunDir, own_spec: ExperimentSpec, force: bool, info: DistInfo, unshared: str | None = None):
    """'skip', or the checkpoint to resume from (None: from scratch), agreed by all ranks.

    A completed run is skipped only if its spec.yaml is this spec; a completed or unfinished
    run of another spec is a SpecError (exit 2) unless `force` (then it starts afresh)."""
    decision: tuple = ("fresh", None)
    if info.is_main:
        try:
            if rd.status() == "completed" and not force:
                check_stored_spec(rd.path, own_spec, "completed")
                decision = ("skip", None)
            else:
                ckpt = None if force else resumable_checkpoint(rd, own_spec)
                decision = ("resume", str(ckpt)) if ckpt else ("fresh", None)
                if ckpt and unshared:
                    raise SpecError(
                        f"output_dir: resuming {rd.path} needs every rank to read {ckpt.name}, but the run "
                        f"directory is not shared ({unshared}): put output_dir on a shared filesystem"
                    )
        except SpecError as err:
            decision = ("error", str(err))
    decision = distributed.broadcast_object(decision, info)
    if decision[0] == "error":
        raise SpecError(decision[1])
    if decision[0] == "resume":  # this rank's own path to it (output_dir may be relative, or mounted elsewhere)
        decision = ("resume", str(rd.checkpoints / Path(decision[1]).name))
    return decision


def resumable_checkpoint(rd: RunDir, own_spec: ExperimentSpec):
    """The latest complete checkpoint of an unfinished run with the same spec, else None."""
    if not rd.exists():
        return None
    ckpts = valid_checkpoints(rd)
    if not ckpts:
        return None
    check_stored_spec(rd.path, own_spec, "unfinished")
    return ckpts[-1]


def restore(ctx: Ctx, rd: RunDir, ckpt) -> tuple[int, dict | None]:
    """Load checkpoint `ckpt` into `ctx` (every rank together), rewind metrics and evaluations
    to its step and drop later checkpoints; (its step, the pre-sampled batch of a staleness-1
    run or None)."""
    state = load_trainer_state(
        ckpt, ctx.model, ctx.optimizer, ctx.scheduler, rng=ctx.rng, shuffle=ctx.shuffle, info=ctx.dist
    )
    step = int(state["step"])
    ctx.train_time = float(state.get("train_time", 0.0))
    ctx.skipped = int(state.get("skipped", 0))
    if ctx.dist.rank:  # the checkpoint holds rank 0's sampling RNG; others derive their own
        torch.manual_seed(distributed.rank_seed(step, ctx.dist.rank))
    if ctx.dist.is_main:
        truncate_jsonl(rd.metrics_file, step)
        truncate_jsonl(rd.eval_file, step)
        truncate_jsonl(rd.samples_file, step)
        for later in rd.checkpoint_dirs():  # checkpoints past the one we resume from are orphans
            if later.name > ckpt.name:
                shutil.rmtree(later, ignore_errors=True)
    return step, state.get(CHECKPOINT_KEY)
