"""`gspo train` and `gspo sweep`: run an experiment's arms x seeds (one process, torchrun, or a
sweep's job pool). Torch is imported only once the spec has loaded."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Annotated, Optional

import typer

from gspo_cli.cli.common import (
    EXECUTOR_HELP,
    AddressOption,
    NodesOption,
    TasksPerNodeOption,
    _exit_code,
    _fail,
    _print_table,
    _show_warning,
    err_console,
    placement_overrides,
)
from gspo_cli.errors import GspoError, HardInterrupt, InterruptedRun, SpecError


def _unique(items: list | None) -> list | None:
    return list(dict.fromkeys(items)) if items else None


def _check_selection(spec, arms: list[str] | None, seeds: list[int] | None) -> None:
    """Refuse unknown --arm names and out-of-range --seed values before any model is built.

    A --seed need not be listed in the spec's `seeds`: running an extra seed of an existing
    experiment is a normal thing to do, and its run directory records the seed it used.
    """
    from gspo_cli.spec import SEED_LIMIT

    for name in arms or []:
        spec.arm(name)  # SpecError naming the known arms
    for s in seeds or []:
        if not 0 <= s < SEED_LIMIT:
            raise SpecError(f"--seed: {s} is out of range (0 <= seed < {SEED_LIMIT})")


def _stopped(message: str, code: int = InterruptedRun.exit_code) -> None:
    """A stop by SIGINT/SIGTERM: one plain line (no `error:`), exit 4 (rerun to resume)."""
    err_console.print(message, markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def _resume_target(run_dir: Path) -> tuple[Path, list[str]]:
    """The spec file and output-dir override that retrain exactly `run_dir`."""
    from gspo_cli.runs import RunDir

    rd = RunDir(run_dir)
    if not rd.spec_file.is_file():
        raise SpecError(f"--resume {run_dir}: not a run directory (no spec.yaml)")
    # results/<experiment>/<arm>/seed<k>: the output dir is three levels up.
    return rd.spec_file, [f"output_dir={json.dumps(str(rd.path.resolve().parents[2]))}"]


def _load_selected(spec_path: Path, overrides: list[str], output_dir: Path | None, arms, seeds):
    """The spec with its overrides and the unique --arm and --seed values, the selection and the
    output directory checked: what `train` and `check` both do before the preflight."""
    from gspo_cli.runs import check_output_dir
    from gspo_cli.spec.loading import load_spec

    if output_dir is not None:
        # Quoted (JSON is YAML): a directory named `2024`, `null` or `a #1` stays a string.
        overrides = [*overrides, f"output_dir={json.dumps(str(output_dir))}"]
    spec = load_spec(spec_path, overrides)
    arms, seeds = _unique(arms), _unique(seeds)
    _check_selection(spec, arms, seeds)
    check_output_dir(spec.output_dir, "--output-dir" if output_dir is not None else "output_dir")
    return spec, arms, seeds


def train(
    spec_path: Annotated[Optional[Path], typer.Argument(metavar="SPEC", help="experiment spec (YAML)")] = None,
    set_: Annotated[
        Optional[list[str]],
        typer.Option(
            "--set",
            "-s",
            metavar="KEY.PATH=VALUE",
            help="override a spec field (repeatable), e.g. arms.gspo.clip_high=5e-4",
        ),
    ] = None,
    arm: Annotated[Optional[list[str]], typer.Option("--arm", help="train only this arm (repeatable)")] = None,
    seed: Annotated[
        Optional[list[int]],
        typer.Option("--seed", help="train only this seed (repeatable); seeds not listed in the spec are allowed"),
    ] = None,
    output_dir: Annotated[
        Optional[Path], typer.Option("--output-dir", "-o", help="write runs here instead of the spec's output_dir")
    ] = None,
    resume: Annotated[
        Optional[Path],
        typer.Option(
            "--resume", metavar="RUN_DIR", help="continue this run from its last checkpoint (instead of SPEC)"
        ),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="rerun runs that already completed (no resume)")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="only errors and the final summary")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print a JSON summary on stdout; logs go to stderr")] = False,
) -> None:
    """Train every arm x seed of an experiment; each run gets its own run directory.

    Runs already completed with the same spec are skipped (a completed run of another spec
    is refused: --force or another -o); a run with a checkpoint resumes from it.

    Exit codes: 0 done, 1 a run failed, 2 bad usage, spec or file, 3 a run diverged, 4 stopped
    by SIGINT or SIGTERM (after a checkpoint, or before training started; rerun to resume),
    130 a second Ctrl-C.

    Example: `gspo train experiments/quickstart.yaml --set train.steps=20 -o /tmp/runs`
    """
    warnings.showwarning = _show_warning
    try:
        overrides = list(set_ or [])
        if resume is not None:
            if spec_path is not None:
                raise SpecError("give either SPEC or --resume RUN_DIR, not both")
            spec_path, extra = _resume_target(resume)
            overrides = extra + overrides
        elif spec_path is None:
            raise SpecError("missing SPEC (or --resume RUN_DIR)")
        spec, arm, seed = _load_selected(spec_path, overrides, output_dir, arm, seed)
        # Imported only now: torch and transformers take seconds, and usage errors should not wait.
        import torch

        from gspo_cli.cli.progress import make_reporter, render_summary
        from gspo_cli.rewards import pool as reward_pool
        from gspo_cli.train.loop import train_experiment

        reporter = make_reporter(quiet=quiet, to_stderr=as_json)
        workers, pool_line = reward_pool.planned(spec.task, torch.get_num_threads())
        with reporter:
            chunks = spec.task.reward_calls == "chunks"
            with reward_pool.running(workers, spec.task.reward_timeout_s, chunks):  # stopped on every way out
                # the pool's line comes once the rewards resolve: a misspelled one's error first
                lines = [pool_line] if pool_line else []
                results = train_experiment(
                    spec, arms=arm, seeds=seed, reporter=reporter, force=force, setup_lines=lines
                )
    except InterruptedRun as err:  # a clean stop the user asked for: said plainly, not as an error
        _stopped(str(err), err.exit_code)
    except GspoError as err:
        _fail(err)
    except HardInterrupt:
        err_console.print("interrupted by a second Ctrl-C: no checkpoint written (rerun to resume from the last one)")
        raise typer.Exit(130) from None
    except KeyboardInterrupt:  # before any run started: nothing to resume, nothing half-written
        _stopped("stopped by SIGINT before training started (cold start or model loading); rerun the same command")
    code = _exit_code([r.status for r in results])
    if os.environ.get("RANK", "0") != "0":  # under torchrun rank 0 speaks for all
        raise typer.Exit(code)
    if as_json:
        typer.echo(json.dumps([r.__dict__ for r in results]))
    else:
        render_summary(results)
    raise typer.Exit(code)


def check(
    spec_path: Annotated[Path, typer.Argument(metavar="SPEC", help="experiment spec (YAML)")],
    set_: Annotated[
        Optional[list[str]],
        typer.Option(
            "--set",
            "-s",
            metavar="KEY.PATH=VALUE",
            help="override a spec field (repeatable), e.g. arms.gspo.clip_high=5e-4",
        ),
    ] = None,
    arm: Annotated[Optional[list[str]], typer.Option("--arm", help="check only this arm (repeatable)")] = None,
    seed: Annotated[Optional[list[int]], typer.Option("--seed", help="check only this seed (repeatable)")] = None,
    output_dir: Annotated[
        Optional[Path], typer.Option("--output-dir", "-o", help="check the runs' directories here instead")
    ] = None,
) -> None:
    """Check a spec as `gspo train` would before loading a model, and train nothing.

    Runs the same checks in the same order (the spec, the selection, then train/preflight.py:
    sinks, task and rewards, data, prompt lengths, processes, LoRA, vLLM, divisibility, shared
    directory, run directories) and prints each one. A problem ends it with the one line and exit
    code training would give: 2 a spec or file to fix, 1 a server that does not answer.

    Example: `gspo check experiments/quickstart.yaml --set rollout.group_size=8`
    """
    warnings.showwarning = _show_warning
    try:
        spec, arm, seed = _load_selected(spec_path, list(set_ or []), output_dir, arm, seed)
        from gspo_cli.train.preflight import preflight

        lines: list[str] = []

        def said(name: str, skipped: str | None) -> None:
            lines.append(f"ok    {name}" if skipped is None else f"skip  {name} ({skipped})")

        checked = preflight(spec, arm, seed, on_check=said)
    except GspoError as err:
        _fail(err)
    except KeyboardInterrupt:
        _stopped("stopped by SIGINT while checking; nothing was written")
    if os.environ.get("RANK", "0") != "0":  # under torchrun rank 0 speaks for all
        raise typer.Exit(0)
    for line in lines:
        typer.echo(line)
    runs = len(checked.arms) * len(checked.seeds)
    typer.echo(f"{spec_path}: every check passed for {runs} run{'s' if runs != 1 else ''}; no model was loaded")


def sweep(
    spec_path: Annotated[
        Path, typer.Argument(metavar="SPEC", help="experiment spec; its optional `sweep:` section adds a grid")
    ],
    set_: Annotated[
        Optional[list[str]],
        typer.Option(
            "--set", "-s", metavar="KEY.PATH=VALUE", help="override a spec field before expanding (repeatable)"
        ),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="list the planned runs and their settings; train nothing")
    ] = False,
    jobs: Annotated[int, typer.Option("--jobs", "-j", min=1, help="runs trained at once, each in its own process")] = 1,
    shard: Annotated[
        Optional[str],
        typer.Option(
            "--shard", metavar="I/N", help="take shard I of N (0-based); default from SLURM_ARRAY_TASK_ID/COUNT"
        ),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="rerun completed runs")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="only errors and the final summary")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print a JSON summary on stdout; logs go to stderr")] = False,
    until_decided: Annotated[
        bool,
        typer.Option(
            "--until-decided",
            help="add seeds in rounds until the spec's comparison is decided (better, worse, equivalent) or "
            "--max-seeds is reached; e.g. --until-decided --max-seeds 10",
        ),
    ] = False,
    max_seeds: Annotated[
        Optional[int],
        typer.Option("--max-seeds", min=2, help="with --until-decided: the most seeds per arm, e.g. --max-seeds 10"),
    ] = None,
    round_seeds: Annotated[
        Optional[int],
        typer.Option(
            "--round-seeds",
            min=1,
            help="with --until-decided: new seeds per arm in each round (default 1), e.g. --round-seeds 2",
        ),
    ] = None,
    executor: Annotated[Optional[str], typer.Option("--executor", metavar="KIND", help=EXECUTOR_HELP)] = None,
    nodes: NodesOption = None,
    tasks_per_node: TasksPerNodeOption = None,
    address: AddressOption = None,
    cancel: Annotated[
        bool,
        typer.Option(
            "--cancel",
            help="cancel this sweep's jobs still queued or running on the scheduler (recorded beside the runs), "
            "then stop; e.g. gspo sweep SPEC --executor slurm --cancel",
        ),
    ] = False,
) -> None:
    """Expand the spec's arms x seeds (x its optional `sweep:` grid) into named runs and train them.

    Runs go seed by seed (every arm's seed 0, then seed 1...), so a sweep stopped early leaves
    seeds paired across arms. Idempotent: completed runs of the same spec are skipped, of another
    spec refused, and interrupted ones resume. Exit codes as for `gspo train`; a run that failed is
    listed after the table with its log's last line and the path of its kept log.

    --until-decided needs a spec with a comparison: section (baseline, arm, metric, margin).

    It trains the comparison's two arms on the spec's seeds, then --round-seeds more per round.

    After each round a group-sequential paired test decides: 5% false positives over all looks.

    It stops when decided or at --max-seeds, and writes until_decided.json beside the runs.

    Its design (comparison.max_seeds, comparison.round_seeds) belongs in the spec, fixed in advance.

    With --dry-run it prints the planned looks and their boundaries and trains nothing.

    Example: `gspo sweep experiments/sweep_clip.yaml --dry-run`
    """
    from gspo_cli.spec.loading import load_spec
    from gspo_cli.train import sweep as sw

    warnings.showwarning = _show_warning
    try:
        overrides = placement_overrides(
            spec_path, list(set_ or []), executor, nodes=nodes, tasks_per_node=tasks_per_node, address=address
        )
    except GspoError as err:
        _fail(err)
    if cancel:
        _cancel(spec_path, overrides, executor)
        return
    if until_decided:
        _decide(spec_path, overrides, jobs, max_seeds, round_seeds, quiet, as_json, dry_run, force or shard, executor)
        return
    if max_seeds is not None or round_seeds is not None:
        _fail(SpecError("--max-seeds and --round-seeds go with --until-decided"))
    try:
        runs = sw.plan(spec_path, overrides)
        picked = sw.parse_shard(shard) if shard else sw.shard_from_env()
        if picked:
            runs = sw.shard(runs, *picked)
        if dry_run:
            _show_plan(runs, as_json)
            return
        log = (
            (lambda m: None)
            if quiet
            else (lambda m: err_console.print(m, markup=False, highlight=False, soft_wrap=True))
        )
        placed = sw.executor_for(load_spec(spec_path, overrides), executor, jobs)
        records = sw.run_plan(runs, jobs=jobs, force=force, log=log, executor=placed)
    except GspoError as err:
        _fail(err)
    except HardInterrupt:
        err_console.print("interrupted by a second Ctrl-C: runs stopped without a new checkpoint")
        raise typer.Exit(130) from None
    except KeyboardInterrupt:  # during the cold start, before any run started
        _stopped("stopped by SIGINT before any run started (cold start); rerun the same command")
    if as_json:
        typer.echo(json.dumps(records))
    else:
        _print_table(
            ["run", "seed", "status", "exit", "wall s", "path"],
            [
                [
                    r["run"],
                    r["seed"],
                    r["status"] + (" (skipped)" if r["skipped"] else ""),
                    r["exit"],
                    r["wall_s"],
                    r["path"],
                ]
                for r in records
            ],
        )
        for r in records:  # -q shows no run's log: each failure's reason and log path here
            if r.get("log") and r["status"] not in ("completed", "diverged"):
                why = f": {r['reason']}" if r.get("reason") else ""
                err_console.print(
                    f"{r['run']}/seed{r['seed']} {r['status']}{why} (log: {r['log']})",
                    markup=False,
                    highlight=False,
                    soft_wrap=True,
                )
    interrupted = any(r["exit"] == 4 for r in records)
    raise typer.Exit(4 if interrupted else _exit_code([r["status"] for r in records]))


def _cancel(spec_path, overrides, executor) -> None:
    """`--cancel`: cancel the jobs recorded beside this experiment's runs that are still queued or
    running (every round's, with or without --until-decided)."""
    from gspo_cli.spec.loading import load_spec
    from gspo_cli.train import sweep as sw

    try:
        placed = sw.executor_for(load_spec(spec_path, overrides), executor)
        if not hasattr(placed, "cancel"):
            raise SpecError(f"--cancel: the {placed.name} executor keeps no jobs to cancel (e.g. --executor slurm)")
        placed.cancel(lambda m: err_console.print(m, markup=False, highlight=False, soft_wrap=True))
    except GspoError as err:
        _fail(err)


def _decide(
    spec_path, overrides, jobs, max_seeds, round_seeds, quiet, as_json, dry_run, refused, executor=None
) -> None:
    from gspo_cli.cli.decide import planned_looks, until_decided

    log = (lambda m: None) if quiet else (lambda m: err_console.print(m, markup=False, highlight=False, soft_wrap=True))
    try:
        if refused:
            raise SpecError("--until-decided: not with --force or --shard (its rounds keep completed runs)")
        if dry_run:
            planned_looks(spec_path, overrides, max_seeds=max_seeds, round_seeds=round_seeds, as_json=as_json)
            return
        until_decided(
            spec_path,
            overrides,
            jobs=jobs,
            max_seeds=max_seeds,
            round_seeds=round_seeds,
            log=log,
            as_json=as_json,
            executor=executor,
        )
    except InterruptedRun as err:  # a stop the user asked for: said plainly, exit 4
        _stopped(str(err), err.exit_code)
    except GspoError as err:
        _fail(err)
    except HardInterrupt:
        err_console.print("interrupted by a second Ctrl-C: runs stopped without a new checkpoint")
        raise typer.Exit(130) from None
    except KeyboardInterrupt:
        _stopped("stopped by SIGINT before any run started (cold start); rerun the same command")


def _show_plan(runs, as_json: bool) -> None:
    rows = [
        {
            "run": r.name,
            "arm": r.base_arm,
            "seed": r.seed,
            "status": r.status(),
            "settings": {k: v for k, v in r.settings},
            "path": str(r.path),
        }
        for r in runs
    ]
    if as_json:
        typer.echo(json.dumps(rows))
        return
    _print_table(
        ["run", "seed", "status", "settings", "path"],
        [
            [
                x["run"],
                x["seed"],
                x["status"],
                ", ".join(f"{k}={v}" for k, v in x["settings"].items()) or "-",
                x["path"],
            ]
            for x in rows
        ],
    )
    typer.echo(f"{len(rows)} run(s) planned")
