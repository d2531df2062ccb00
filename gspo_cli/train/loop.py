"""Training runs: every arm x seed, each in its run directory.

For each run: skip it if completed, resume it from its last checkpoint if it has one,
else start afresh; then step (step.py holds the recipe of one step), log metrics,
evaluate and checkpoint on schedule, and stop cleanly on SIGINT/SIGTERM.
"""

from __future__ import annotations

import contextlib
import math
import socket
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gspo_cli import distributed
from gspo_cli.distributed import DistInfo
from gspo_cli.errors import DivergedError, GspoError, InterruptedRun, RunError, redact
from gspo_cli.eval.sets import EvalSet, data_lines, plan_data, score_and_log
from gspo_cli.metrics import no_signal
from gspo_cli.models import lora, resolve_model_source
from gspo_cli.models.builtin import cold_start_info, cold_start_line, share_across_nodes
from gspo_cli.params import param_line
from gspo_cli.runs import RunDir, RunLockedError, git_commit, now_iso, run_lock, run_path, versions
from gspo_cli.spec import ArmConfig, ExperimentSpec
from gspo_cli.spec.loading import dump_spec
from gspo_cli.tasks import Task
from gspo_cli.train.checkpoint import save_checkpoint, weights_to_load
from gspo_cli.train.export import export_checkpoint
from gspo_cli.train.preflight import preflight
from gspo_cli.train.reporting import PlainReporter, Reporter, quiet_reporter
from gspo_cli.train.resume import ReadOnlyRunDir, decide_start, restore, run_identity, run_spec
from gspo_cli.train.sinks import make_sinks
from gspo_cli.train.staleness import StaleRollouts
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
    setup_lines: Sequence[str] = (),
) -> list[RunResult]:
    """Train the selected arms x seeds one after another.

    A run that fails or diverges is recorded and the next one starts; a bad spec or model
    (SpecError) or a stop signal (InterruptedRun) ends the whole call. Everything that can be
    refused before a model is built is checked first, in one ordered list (`preflight`, also run
    by `gspo check`); `setup_lines` (the reward pool's) are said after it: after its errors.
    """
    reporter = reporter or PlainReporter()
    checked = preflight(spec, arms, seeds, force=force)
    selected, seed_list, task, info = checked.arms, checked.seeds, checked.task, checked.info
    eval_sets, data, unshared = checked.eval_sets, checked.data, checked.unshared
    if not info.is_main:
        reporter = quiet_reporter()
    for line in [*setup_lines, *data_lines(data)]:
        reporter.log(line)
    # Cold start once, shared by every run; rank 0 builds it while the others wait.
    source = resolve_model_source(spec.model, task, log=reporter.log) if info.is_main else None
    if info.enabled and spec.model.name.startswith("builtin:"):
        source = share_across_nodes(source, info)  # caches may be per node (no shared disk)
    else:
        distributed.barrier(info)
        source = source or resolve_model_source(spec.model, task, log=reporter.log)
    if (cold := cold_start_info(source)) is not None:
        reporter.log(cold_start_line(cold))
    results = []
    with stop_on_signals() as stop:
        for arm in selected:
            for seed in seed_list:
                try:
                    results.append(
                        train_run(
                            spec,
                            arm,
                            seed,
                            task,
                            source,
                            reporter=reporter,
                            force=force,
                            stop=stop,
                            dist_info=info,
                            unshared=unshared,
                            eval_sets=(eval_sets, data),
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
                    results.append(RunResult(arm.name, seed, str(path), status, {"error": redact(str(err))}))
    return results


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
    unshared: str | None = None,
    eval_sets: "tuple[list[EvalSet], dict] | None" = None,
) -> RunResult:
    """Train one arm x seed into its run directory.

    A completed run is skipped (unless `force`); a run with a checkpoint is resumed from it
    with its optimizer and RNG state, metrics rewound to that step; anything else starts
    afresh. The model is loaded before any file is touched, so a bad model name costs nothing.
    `unshared`: why the run directory is not one filesystem for all ranks (None: it is); such
    a run trains (rank 0 writes everything) but cannot resume.
    `eval_sets`: `plan_data(spec, task)` when the caller made it (else made here).
    """
    sets = eval_sets if eval_sets is not None else plan_data(spec, task)
    path = run_path(spec.output_dir, spec.name, arm.name, seed)
    # Only rank 0 writes the run directory (and holds its lock); the others read it.
    kw = dict(reporter=reporter, force=force, stop=stop, info=dist_info, unshared=unshared)
    if not dist_info.is_main:
        return _train_locked(spec, arm, seed, task, source, ReadOnlyRunDir(path), sets, **kw)
    with run_lock(path):
        return _train_locked(spec, arm, seed, task, source, RunDir(path), sets, **kw)


def _train_locked(
    spec, arm, seed, task, source, rd: RunDir, sets, *, reporter, force, stop, info, unshared
) -> RunResult:
    name = f"{arm.name}/seed{seed}"
    own_spec = run_spec(spec, arm, seed)
    identity = run_identity(own_spec, task, sets[0]) if info.is_main else None
    kind, ckpt_path = decide_start(rd, own_spec, force, info, unshared, identity=identity)
    if kind == "skip":
        reporter.log(f"[{name}] already completed in {rd.path}; skipping (use --force to rerun)")
        return RunResult(arm.name, seed, str(rd.path), "completed", rd.info().get("summary", {}))
    ckpt = Path(ckpt_path) if ckpt_path else None
    stop = stop if stop is not None else StopFlag()
    ctx = setup(spec, arm, seed, task, source, weights=weights_to_load(ckpt), dist_info=info, stop=stop)
    params = lora.param_info(ctx.model, spec.model.lora, spec.model.dtype)  # run.json; LoRA: the setup line
    if params.get("lora"):
        reporter.log(f"[{name}] {param_line(params)}")
    reporter.log(f"[{name}] {ctx.packing_line}")  # train.packing: which path the forwards take
    t_start = time.time()
    pending = None  # rollout.staleness k: the batches the checkpoint pre-sampled for the next steps
    if ckpt is not None:
        start_step, pending = restore(ctx, rd, ckpt)
        reporter.log(f"[{name}] resuming from {ckpt.name}")
        rd.update_info(
            status="running",
            resumed_at=now_iso(),
            resumed_from=ckpt.name,
            step=start_step,
            resumes=rd.info().get("resumes", 0) + 1,
            params=params,
            **({"identity": identity} if identity else {}),  # a fixed reward file's new fingerprint
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
            data=sets[1],
            identity=identity,
            params=params,
            **({"cold_start": cold} if (cold := cold_start_info(source)) else {}),
        )
    prior_wall = rd.info().get("wall_s", 0.0) if ckpt is not None else 0.0

    def finish(status: str, **fields) -> None:
        rd.update_info(status=status, ended_at=now_iso(), wall_s=round(prior_wall + time.time() - t_start, 2), **fields)

    try:
        summary = _loop(ctx, rd, name, reporter, start_step, stop, sets[0], source=source, seed=seed, pending=pending)
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
    if summary.get("no_signal"):
        reporter.log(
            f"[{name}] warning: no learning signal: every group's rewards were equal at every step "
            "(reward/zero_var_group_frac 1), so every advantage was 0 and nothing was learned from the rewards"
        )
    return RunResult(arm.name, seed, str(rd.path), "completed", summary)


def _loop(
    ctx: Ctx,
    rd: RunDir,
    name: str,
    reporter: Reporter,
    start_step: int,
    stop: StopFlag,
    eval_sets: list[EvalSet],
    *,
    source,
    seed,
    pending,
) -> dict:
    spec = ctx.spec
    steps = spec.train.steps
    reporter.run_started(name, steps, start_step)
    # metrics.jsonl stays the truth; sinks are views, written by rank 0 like everything else
    sinks = make_sinks(list(spec.train.sinks) if ctx.dist.is_main else [], rd.path, spec.to_dict())
    # rollout.staleness: the worker process starts now, loading while step 0 evaluates
    stale = StaleRollouts(ctx, source=source, seed=seed, pending=pending) if spec.rollout.staleness else None
    try:
        if start_step == 0:
            _evaluate(
                ctx,
                rd,
                [s for s in eval_sets if s.scored],
                step=0,
                sinks=sinks,
                report=lambda rec: reporter.eval_done(name, rec),
            )
        _steps(ctx, rd, name, reporter, start_step, stop, eval_sets, sinks, stale)
        if distributed.is_sharded(ctx.model):  # its checkpoints are shards: transformers needs a whole copy
            export_checkpoint(rd.checkpoints / f"step_{steps:06d}", rd.path / "model", info=ctx.dist, step=steps)
    finally:
        if stale is not None:
            stale.close()  # on every way out: the worker is never left behind
        for sink in sinks:
            sink.close()
    return _summary(rd, steps)


def _steps(
    ctx: Ctx, rd: RunDir, name: str, reporter: Reporter, start_step: int, stop: StopFlag, eval_sets, sinks, stale
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
        rd.log_samples([{"step": step, "arm": ctx.arm.name, "seed": ctx.seed, **r} for r in ctx.samples])
        watch.observe(metrics, step)  # after logging: the collapsed steps stay on record
        for sink in sinks:
            sink.log(metrics, step)
        rd.update_info(step=step)
        reporter.step_done(name, metrics)
        gap_warning.check(metrics, reporter)
        is_last = step == steps
        stopping = distributed.broadcast_object(bool(stop), ctx.dist)  # every rank stops at the same step
        due_sets = [s for s in eval_sets if s.due(step, steps)]
        _evaluate(ctx, rd, due_sets, step=step, sinks=sinks, report=lambda rec: reporter.eval_done(name, rec))
        due = spec.train.checkpoint_every and step % spec.train.checkpoint_every == 0
        if is_last or stopping or due:
            _checkpoint(ctx, rd, step, extra=stale.checkpoint_state() if stale is not None else None)
        if stopping and not is_last:
            raise InterruptedRun(
                f"{name}: stopped by {stop.signal_name or 'a signal to rank 0'} after step {step}; "
                f"checkpoint written, rerun the same command to resume"
            )


def _checkpoint(ctx: Ctx, rd: RunDir, step: int, extra: dict | None = None) -> None:
    """Every rank together (a sharded model's ranks each write their own slices); a failure
    (disk full...) fails the run on every rank."""
    save_checkpoint(
        rd,
        step,
        ctx.model,
        ctx.optimizer,
        ctx.engine.tokenizer,
        ctx.scheduler,
        info=ctx.dist,
        rng=ctx.rng,
        shuffle=ctx.shuffle,
        keep=ctx.spec.train.keep_checkpoints,
        dtype=ctx.spec.model.dtype,
        extra={"train_time": ctx.train_time, "skipped": ctx.skipped, **(extra or {})},
    )


def _summary(rd: RunDir, steps: int) -> dict:
    metrics, evals = rd.metrics(), rd.evals()
    first = [m["reward/mean"] for m in metrics[: max(1, steps // 10)]]
    last = [m["reward/mean"] for m in metrics[-max(1, steps // 10) :]]
    # First and last score of one evaluation set (the first logged), never two sets' mixed.
    set_name = next((e.get("set") or e.get("task") for e in evals), None)
    one_set = [e for e in evals if (e.get("set") or e.get("task")) == set_name]
    column = lambda key: [v for m in metrics if isinstance(v := m.get(key), (int, float))]  # noqa: E731
    return {
        "steps": steps,
        "reward_first": round(sum(first) / max(len(first), 1), 4),
        "reward_last": round(sum(last) / max(len(last), 1), 4),
        "no_signal": no_signal(column("reward/zero_var_group_frac"), column("reward/std")),
        "eval_set": set_name,
        "eval_first": one_set[0]["scores"] if one_set else None,
        "eval_last": one_set[-1]["scores"] if one_set else None,
        "train_s": round(metrics[-1]["time/elapsed_s"], 1) if metrics else 0.0,
    }


def _check_finite(metrics: dict, step: int) -> None:
    for key in ("policy/loss", "policy/grad_norm"):
        v = metrics.get(key)
        if v is not None and not math.isfinite(v):
            raise DivergedError(f"step {step}: {key} is {v}")


def _teed(log_eval, report):
    """`log_eval`, then `report` (None: nothing else) with the same record."""
    if report is None:
        return log_eval

    def both(record: dict) -> None:
        log_eval(record)
        report(record)

    return both


def _evaluate(ctx: Ctx, rd: RunDir, sets: list[EvalSet], step: int, sinks=(), report=None) -> None:
    """Rank 0 scores the sets due and logs them (and hands each eval.jsonl record to `report`,
    the reporter's view). With sharded weights (FSDP) every rank must
    take part in each generation step, so all ranks sample the same evaluation and only rank 0
    logs it (the others' RunDir writes nowhere); so do the members of rank 0's tensor-parallel
    vLLM engine."""
    if not sets:
        return
    refresh = getattr(ctx.engine, "sync_if_stale", None)
    if refresh is not None and getattr(ctx.engine, "sharded", False):
        refresh()  # streaming sharded weights into the engine takes every rank, even if rank 0 alone samples
    group = getattr(ctx.engine, "samples_with_rank0", False)
    if not (ctx.dist.is_main or getattr(ctx.engine, "synced", False) or group):
        return
    stats = getattr(ctx.engine, "sampler_logprobs", False)  # evaluation needs only the texts
    if stats:
        ctx.engine.sampler_logprobs = False
    try:
        with ctx.compute(), ctx.engine.same_prompts() if group else contextlib.nullcontext():
            score_and_log(ctx.engine, sets, step, _teed(rd.log_eval, report), sinks, seed=ctx.seed)
    finally:
        if stats:
            ctx.engine.sampler_logprobs = True


# ---------------------------------------------------------------------------------------
# One step: the recipe
