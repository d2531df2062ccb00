"""Training runs: every arm x seed, each in its run directory.

For each run: skip it if completed, resume it from its last checkpoint if it has one,
else start afresh; then step (step.py holds the recipe of one step), log metrics,
evaluate and checkpoint on schedule, and stop cleanly on SIGINT/SIGTERM.
"""

from __future__ import annotations

import math
import shutil
import socket
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import torch

from gspo_cli import distributed
from gspo_cli.distributed import DistInfo
from gspo_cli.errors import DivergedError, GspoError, InterruptedRun, RunError, SpecError
from gspo_cli.eval.scores import evaluate_policy
from gspo_cli.models import resolve_model_source
from gspo_cli.rollout.vllm_settings import check_vllm_settings
from gspo_cli.runs import RunDir, RunLockedError, git_commit, now_iso, run_lock, run_path, truncate_jsonl, versions
from gspo_cli.spec import ArmConfig, ExperimentSpec
from gspo_cli.spec.loading import check_stored_spec, dump_spec
from gspo_cli.tasks import Task, make_task
from gspo_cli.train.checkpoint import load_trainer_state, save_checkpoint, valid_checkpoints
from gspo_cli.train.reporting import PlainReporter, Reporter, quiet_reporter
from gspo_cli.train.sinks import make_sinks
from gspo_cli.train.staleness import CHECKPOINT_KEY, StaleRollouts, check_supported
from gspo_cli.train.step import Ctx, setup, train_step
from gspo_cli.train.watch import CollapseWatch, GapWarning, StopFlag, stop_on_signals


@dataclass
class RunResult:
    arm: str
    seed: int
    path: str
    status: str
    summary: dict = field(default_factory=dict)


# ---------------------------------------------------------------------------------------
# Experiment: every arm x seed


def train_experiment(
    spec: ExperimentSpec,
    *,
    arms: list[str] | None = None,
    seeds: list[int] | None = None,
    reporter: Reporter | None = None,
    force: bool = False,
) -> list[RunResult]:
    """Train the selected arms x seeds one after another.

    A run that fails or diverges is recorded and the next one starts; a bad spec or model
    (SpecError) or a stop signal (InterruptedRun) ends the whole call.
    """
    reporter = reporter or PlainReporter()
    selected = [spec.arm(a) for a in arms] if arms else list(spec.arms)
    seed_list = seeds if seeds else spec.seeds
    task = make_task(spec.task.name, spec.task.params)
    info = distributed.setup(spec.model.device)  # a world of one unless under torchrun
    check_supported(spec, info.world_size)
    if spec.rollout.engine == "vllm":  # before any model loads: settings that cannot work, in one line
        check_vllm_settings(spec.rollout.vllm, any(a.routing_replay == "r3" for a in selected), info.world_size)
    distributed.check_divisible(
        spec.rollout.prompts_per_step, spec.rollout.group_size, [a.mini_batches for a in selected], info
    )
    if not info.is_main:
        reporter = quiet_reporter()
    # Cold start once, shared by every run; rank 0 builds it while the others wait.
    source = resolve_model_source(spec.model, task, log=reporter.log) if info.is_main else None
    distributed.barrier(info)
    source = source or resolve_model_source(spec.model, task, log=reporter.log)
    results = []
    with stop_on_signals() as stop:
        for arm in selected:
            for seed in seed_list:
                try:
                    results.append(
                        train_run(
                            spec, arm, seed, task, source, reporter=reporter, force=force, stop=stop, dist_info=info
                        )
                    )
                except (DivergedError, RunError, RunLockedError) as err:
                    status = (
                        "diverged"
                        if isinstance(err, DivergedError)
                        else "in use"
                        if isinstance(err, RunLockedError)
                        else "failed"
                    )
                    reporter.log(f"[{arm.name}/seed{seed}] {status}: {err}")
                    path = run_path(spec.output_dir, spec.name, arm.name, seed)
                    results.append(RunResult(arm.name, seed, str(path), status, {"error": str(err)}))
    return results


def run_spec(spec: ExperimentSpec, arm: ArmConfig, seed: int) -> ExperimentSpec:
    """The spec of exactly one run: this arm, this seed (itself runnable)."""
    return spec.model_copy(update={"arms": [arm], "seeds": [seed], "sweep": None})


# ---------------------------------------------------------------------------------------
# One run


def train_run(
    spec: ExperimentSpec,
    arm: ArmConfig,
    seed: int,
    task: Task,
    source: str,
    *,
    reporter: Reporter,
    force: bool = False,
    stop: "StopFlag | None" = None,
    dist_info: DistInfo = DistInfo(),
) -> RunResult:
    """Train one arm x seed into its run directory.

    A completed run is skipped (unless `force`); a run with a checkpoint is resumed from it
    with its optimizer and RNG state, metrics rewound to that step; anything else starts
    afresh. The model is loaded before any file is touched, so a bad model name costs nothing.
    """
    path = run_path(spec.output_dir, spec.name, arm.name, seed)
    # Only rank 0 writes the run directory (and holds its lock); the others read it.
    if not dist_info.is_main:
        return _train_locked(
            spec,
            arm,
            seed,
            task,
            source,
            _ReadOnlyRunDir(path),
            reporter=reporter,
            force=force,
            stop=stop,
            info=dist_info,
        )
    with run_lock(path):
        return _train_locked(
            spec, arm, seed, task, source, RunDir(path), reporter=reporter, force=force, stop=stop, info=dist_info
        )


class _ReadOnlyRunDir(RunDir):
    """What ranks other than 0 see: reads go to disk, writes go nowhere."""

    def update_info(self, **fields):
        return {**self.info(), **fields}

    def log_metrics(self, record):
        pass

    def log_eval(self, record):
        pass

    def reset(self):
        pass


def _decide_start(rd: RunDir, own_spec: ExperimentSpec, force: bool, info: DistInfo):
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
                ckpt = None if force else _resumable_checkpoint(rd, own_spec)
                decision = ("resume", str(ckpt)) if ckpt else ("fresh", None)
        except SpecError as err:
            decision = ("error", str(err))
    decision = distributed.broadcast_object(decision, info)
    if decision[0] == "error":
        raise SpecError(decision[1])
    return decision


def _train_locked(spec, arm, seed, task, source, rd: RunDir, *, reporter, force, stop, info) -> RunResult:
    name = f"{arm.name}/seed{seed}"
    own_spec = run_spec(spec, arm, seed)
    kind, ckpt_path = _decide_start(rd, own_spec, force, info)
    if kind == "skip":
        reporter.log(f"[{name}] already completed in {rd.path}; skipping (use --force to rerun)")
        return RunResult(arm.name, seed, str(rd.path), "completed", rd.info().get("summary", {}))
    ckpt = Path(ckpt_path) if ckpt_path else None
    ctx = setup(spec, arm, seed, task, source, weights=ckpt_path, dist_info=info)
    t_start = time.time()
    pending = None  # rollout.staleness 1: the batch the checkpoint pre-sampled for the next step
    if ckpt is not None:
        start_step, pending = _restore(ctx, rd, ckpt)
        reporter.log(f"[{name}] resuming from {ckpt.name}")
        rd.update_info(
            status="running",
            resumed_at=now_iso(),
            resumed_from=ckpt.name,
            step=start_step,
            resumes=rd.info().get("resumes", 0) + 1,
            ended_at=None,
        )
    else:
        start_step = 0
        if info.is_main:
            rd.reset()
            rd.path.mkdir(parents=True)
            rd.spec_file.write_text(dump_spec(own_spec))
        rd.update_info(
            status="running",
            experiment=spec.name,
            arm=arm.name,
            seed=seed,
            step=0,
            total_steps=spec.train.steps,
            started_at=now_iso(),
            host=socket.gethostname(),
            git_commit=git_commit(),
            versions=versions(),
            model_source=source,
        )
    prior_wall = rd.info().get("wall_s", 0.0) if ckpt is not None else 0.0

    def finish(status: str, **fields) -> None:
        rd.update_info(status=status, ended_at=now_iso(), wall_s=round(prior_wall + time.time() - t_start, 2), **fields)

    try:
        stop = stop if stop is not None else StopFlag()
        summary = _loop(ctx, rd, name, reporter, start_step, stop, source=source, seed=seed, pending=pending)
    except InterruptedRun:
        finish("interrupted")
        raise
    except KeyboardInterrupt:  # a second Ctrl-C: no checkpoint this time
        finish("interrupted")
        raise
    except DivergedError as err:
        finish("diverged", error=str(err))
        raise
    except GspoError as err:
        finish("failed", error=str(err))
        raise
    except Exception as err:  # a bug: keep the traceback in run.json, then let it surface
        finish("failed", error=f"{type(err).__name__}: {err}", traceback=traceback.format_exc())
        raise
    finally:
        close = getattr(ctx.engine, "close", None)  # a vLLM engine holds memory until closed
        if close is not None:
            close()
    finish("completed", summary=summary)
    reporter.run_finished(name, "completed", summary)
    return RunResult(arm.name, seed, str(rd.path), "completed", summary)


def _resumable_checkpoint(rd: RunDir, own_spec: ExperimentSpec):
    """The latest complete checkpoint of an unfinished run with the same spec, else None."""
    if not rd.exists():
        return None
    ckpts = valid_checkpoints(rd)
    if not ckpts:
        return None
    check_stored_spec(rd.path, own_spec, "unfinished")
    return ckpts[-1]


def _restore(ctx: "Ctx", rd: RunDir, ckpt) -> tuple[int, dict | None]:
    state = load_trainer_state(ckpt, ctx.model, ctx.optimizer, ctx.scheduler, rng=ctx.rng, shuffle=ctx.shuffle)
    step = int(state["step"])
    ctx.train_time = float(state.get("train_time", 0.0))
    ctx.skipped = int(state.get("skipped", 0))
    if ctx.dist.rank:  # the checkpoint holds rank 0's sampling RNG; others derive their own
        torch.manual_seed(distributed.rank_seed(step, ctx.dist.rank))
    if ctx.dist.is_main:
        truncate_jsonl(rd.metrics_file, step)
        truncate_jsonl(rd.eval_file, step)
        for later in rd.checkpoint_dirs():  # checkpoints past the one we resume from are orphans
            if later.name > ckpt.name:
                shutil.rmtree(later, ignore_errors=True)
    return step, state.get(CHECKPOINT_KEY)


def _loop(
    ctx: Ctx, rd: RunDir, name: str, reporter: Reporter, start_step: int, stop: StopFlag, *, source, seed, pending
) -> dict:
    spec = ctx.spec
    steps = spec.train.steps
    eval_problems = ctx.task.eval_problems(spec.task.eval_size)
    reporter.run_started(name, steps)
    # metrics.jsonl stays the truth; sinks are views, written by rank 0 like everything else
    sinks = make_sinks(list(spec.train.sinks) if ctx.dist.is_main else [], rd.path, spec.to_dict())
    # staleness 1: the worker process starts now, loading while step 0 evaluates
    stale = StaleRollouts(ctx, source=source, seed=seed, pending=pending) if spec.rollout.staleness else None
    try:
        if start_step == 0:
            _evaluate(ctx, rd, eval_problems, step=0, sinks=sinks)
        _steps(ctx, rd, name, reporter, start_step, stop, eval_problems, sinks, stale)
    finally:
        if stale is not None:
            stale.close()  # on every way out: the worker is never left behind
        for sink in sinks:
            sink.close()
    return _summary(rd, steps)


def _steps(
    ctx: Ctx, rd: RunDir, name: str, reporter: Reporter, start_step: int, stop: StopFlag, eval_problems, sinks, stale
) -> None:
    spec = ctx.spec
    steps = spec.train.steps
    watch = CollapseWatch(spec.train.divergence, rd.metrics())
    gap_warning = GapWarning(name, ctx.arm.clip_low, ctx.arm.clip_high)
    for step in range(start_step + 1, steps + 1):
        metrics = stale.step(ctx, step) if stale is not None else train_step(ctx, step)
        ctx.train_time += metrics["time/step_s"]
        metrics["time/elapsed_s"] = round(ctx.train_time, 3)
        _check_finite(metrics, step)
        rd.log_metrics(metrics)
        watch.observe(metrics, step)  # after logging: the collapsed steps stay on record
        for sink in sinks:
            sink.log(metrics, step)
        rd.update_info(step=step)
        reporter.step_done(name, metrics)
        gap_warning.check(metrics, reporter)
        is_last = step == steps
        stopping = distributed.broadcast_object(bool(stop), ctx.dist)  # every rank stops at the same step
        if is_last or (spec.train.eval_every and step % spec.train.eval_every == 0):
            _evaluate(ctx, rd, eval_problems, step=step, sinks=sinks)
        due = spec.train.checkpoint_every and step % spec.train.checkpoint_every == 0
        if is_last or stopping or due:
            _checkpoint(ctx, rd, step, extra=stale.checkpoint_state() if stale is not None else None)
        if stopping and not is_last:
            raise InterruptedRun(
                f"{name}: stopped by {stop.signal_name or 'a signal to rank 0'} after step {step}; "
                f"checkpoint written, rerun the same command to resume"
            )


def _checkpoint(ctx: Ctx, rd: RunDir, step: int, extra: dict | None = None) -> None:
    """Rank 0 writes the checkpoint (with `extra` in its trainer state); a failure (disk
    full...) fails the run on every rank."""
    failure = None
    model_state, optimizer_state = distributed.full_states(ctx.model, ctx.optimizer, ctx.dist)  # every rank
    if ctx.dist.is_main:
        try:
            save_checkpoint(
                rd,
                step,
                ctx.model,
                ctx.engine.tokenizer,
                optimizer_state,
                ctx.scheduler,
                rng=ctx.rng,
                shuffle=ctx.shuffle,
                keep=ctx.spec.train.keep_checkpoints,
                dtype=ctx.spec.model.dtype,
                model_state=model_state,
                extra={"train_time": ctx.train_time, "skipped": ctx.skipped, **(extra or {})},
            )
        except RunError as err:
            failure = str(err)
    failure = distributed.broadcast_object(failure, ctx.dist)
    if failure is not None:
        raise RunError(failure)


def _summary(rd: RunDir, steps: int) -> dict:
    metrics, evals = rd.metrics(), rd.evals()
    first = [m["reward/mean"] for m in metrics[: max(1, steps // 10)]]
    last = [m["reward/mean"] for m in metrics[-max(1, steps // 10) :]]
    return {
        "steps": steps,
        "reward_first": round(sum(first) / max(len(first), 1), 4),
        "reward_last": round(sum(last) / max(len(last), 1), 4),
        "eval_first": evals[0]["scores"] if evals else None,
        "eval_last": evals[-1]["scores"] if evals else None,
        "train_s": round(metrics[-1]["time/elapsed_s"], 1) if metrics else 0.0,
    }


def _check_finite(metrics: dict, step: int) -> None:
    for key in ("policy/loss", "policy/grad_norm"):
        v = metrics.get(key)
        if v is not None and not math.isfinite(v):
            raise DivergedError(f"step {step}: {key} is {v}")


def _evaluate(ctx: Ctx, rd: RunDir, problems, step: int, sinks=()) -> None:
    """Rank 0 evaluates and logs. With sharded weights (FSDP) every rank must take part in
    each generation step, so all ranks sample the same evaluation and only rank 0 logs it."""
    if not problems:
        return
    refresh = getattr(ctx.engine, "sync_if_stale", None)
    if refresh is not None and getattr(ctx.engine, "sharded", False):
        refresh()  # streaming sharded weights into the engine takes every rank, even if rank 0 alone samples
    if not (ctx.dist.is_main or getattr(ctx.engine, "synced", False)):
        return
    t = time.time()
    stats = getattr(ctx.engine, "sampler_logprobs", False)  # evaluation needs only the texts
    if stats:
        ctx.engine.sampler_logprobs = False
    try:
        with ctx.compute():
            scores = evaluate_policy(ctx.engine, ctx.task, problems, ctx.spec.train.eval_samples)
    finally:
        if stats:
            ctx.engine.sampler_logprobs = True
    rd.log_eval(
        {
            "step": step,
            "task": ctx.task.name,
            "n": len(problems),
            "samples": ctx.spec.train.eval_samples,
            "scores": scores,
            "time_s": round(time.time() - t, 3),
        }
    )
    for sink in sinks:
        sink.log({f"eval/{ctx.task.name}/{k}": v for k, v in scores.items()}, step)


# ---------------------------------------------------------------------------------------
# One step: the recipe
