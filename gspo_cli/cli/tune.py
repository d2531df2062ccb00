"""`gspo tune SPEC`: every arm tuned on the same budget, selected on one evaluation set, the
selected settings trained on fresh seeds and compared on another (the spec's `tune:` section)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Annotated, Optional

import typer

from gspo_cli.cli.common import (
    EXECUTOR_HELP,
    AddressOption,
    NodesOption,
    TasksPerNodeOption,
    _fail,
    _show_warning,
    err_console,
    placement_overrides,
)
from gspo_cli.errors import GspoError, HardInterrupt, RunError, SpecError


def tune(
    spec_path: Annotated[Path, typer.Argument(metavar="SPEC", help="experiment spec with a `tune:` section")],
    set_: Annotated[
        Optional[list[str]],
        typer.Option("--set", "-s", metavar="KEY.PATH=VALUE", help="override a spec field first (repeatable)"),
    ] = None,
    jobs: Annotated[int, typer.Option("--jobs", "-j", min=1, help="runs trained at once, each in its own process")] = 1,
    resume: Annotated[
        bool, typer.Option("--resume", help="continue a tune whose runs exist (completed kept, interrupted resumed)")
    ] = False,
    unequal: Annotated[
        bool, typer.Option("--unequal", help="allow arms with different tuning budgets (the report says so)")
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="check the spec, list the budgets and tuning runs; train nothing")
    ] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="only errors and the final report path")] = False,
    executor: Annotated[Optional[str], typer.Option("--executor", metavar="KIND", help=EXECUTOR_HELP)] = None,
    nodes: NodesOption = None,
    tasks_per_node: TasksPerNodeOption = None,
    address: AddressOption = None,
) -> None:
    """Tune every arm on the same budget, select on a validation set, compare on a test set.

    Trains each arm's grid (tune.grids) on tune.seeds for tune.steps, selects each arm's setting by
    one rule (highest mean selection score; ties: first in grid order), trains the selections on
    tune.final_seeds and compares them on tune.test_set with the statistics engine; writes
    OUTPUT_DIR/NAME/REPORT.md (budgets, grids, selections and their grid positions, the verdict; one
    edited by hand is kept as REPORT.edited.md). After each round, OUTPUT_DIR/NAME/tune_state.json
    says how its runs ended, the selection, and where --resume starts.

    The tuning runs never score the test set (its problems stay out of their training): no test
    number exists before the selection is final.

    Refused before any run trains: selection and test sets that share a problem; an arm without a
    grid, a grid value listed twice; a tune.metric the selection set does not write; unequal
    budgets without --unequal; existing runs without --resume. Exit codes as for gspo train.

    Example: gspo tune experiments/tune_clip.yaml --jobs 2 (rerun with --resume after a stop)
    """
    from gspo_cli.train import sweep as sw
    from gspo_cli.train import tune as tn

    warnings.showwarning = _show_warning
    log = (lambda m: None) if quiet else (lambda m: err_console.print(m, markup=False, highlight=False, soft_wrap=True))
    try:
        overrides = placement_overrides(
            spec_path, list(set_ or []), executor, nodes=nodes, tasks_per_node=tasks_per_node, address=address
        )
        raw, spec = tn.load(spec_path, overrides)
        budgets = tn.check_budgets(spec, unequal)
        metric = tn.selection_metric(spec)
        sizes = tn.check_disjoint(spec)
        planned = tn.tuning_runs(raw, spec)
        root = tn.root(spec)
        if dry_run:
            steps = spec.tune.steps or spec.train.steps
            for arm, b in budgets.items():
                n, seeds = len(spec.tune.points(arm)), len(spec.tune.seeds)
                typer.echo(f"{arm}: {n} settings x {seeds} seed(s) x {steps} steps per run = {b} steps of tuning")
            for r in planned:
                typer.echo(f"{r.name}/seed{r.seed}  {r.status()}  {r.path}")
            typer.echo(f"{len(planned)} tuning run(s) planned, then {len(spec.tune.final_seeds)} final run(s) per arm")
            return
        if not resume and any(r.status() != "planned" for r in planned):
            raise SpecError(f"{root}: runs of an earlier tune exist; --resume continues it (or remove the directory)")
        from gspo_cli.train.watch import stop_on_signals

        placed = sw.executor_for(spec, executor, jobs)  # the same executor for both rounds
        state = tn.read_state(spec)
        if resume and state:
            at = state.get("next", tn.TUNING)
            where = "both rounds completed" if at == "report" else f"at its {at} round"
            log(f"resuming the tune: {where} ({root / tn.STATE_FILE})")
        with stop_on_signals() as stop:  # one flag for both phases: a stop between them is not lost
            records = sw.run_plan(planned, jobs=jobs, force=False, log=log, executor=placed, stop=stop)
            if stop or any(r["status"] not in ("completed", "diverged") for r in records):
                tn.write_state(spec, tn.TUNING, records)
            _check(records, "tuning", stop)
            command = " ".join([str(spec_path), *(f"--set {a}" for a in set_ or [])])
            info, selection, chosen = _select(spec, planned, budgets, sizes, command, metric)
            selected = {arm: p.settings for arm, p in chosen.items()}
            tn.check_selection(state, selected)
            tn.write_state(spec, tn.TUNING, records, selected)  # the decision, before any final run trains
            final = tn.final_runs(raw, spec, selected)
            records = sw.run_plan(final, jobs=jobs, force=False, log=log, executor=placed, stop=stop)
            tn.write_state(spec, tn.FINAL, records)
            _check(records, "final", stop)
        from gspo_cli.analysis.report import tune as tr

        table = tr.compare_final([r.path for r in final], spec.tune.test_set, info["baseline"], info["margin"])
        report = tr.write(root, info, selection, chosen, table)
    except GspoError as err:
        _fail(err)
    except HardInterrupt:
        err_console.print("interrupted by a second Ctrl-C: runs stopped without a new checkpoint")
        raise typer.Exit(130) from None
    except KeyboardInterrupt:
        err_console.print("stopped by SIGINT; rerun with --resume")
        raise typer.Exit(4) from None
    typer.echo(str(report))


def _check(records: list[dict], phase: str, stop=None) -> None:
    if stop or any(r["exit"] == 4 for r in records):
        how = f" by {stop.signal_name}" if stop else ""
        err_console.print(f"stopped{how} during the {phase} runs; rerun with --resume to continue")
        raise typer.Exit(4)
    failed = [f"{r['run']}/seed{r['seed']}" for r in records if r["status"] not in ("completed", "diverged")]
    if failed:
        raise RunError(f"{phase} runs did not complete: {', '.join(failed[:4])}; fix and rerun with --resume")


def _select(spec, planned, budgets, sizes, spec_path: str, metric: str):
    """Each arm's points with their selection scores, the chosen point, and the report's facts."""
    from gspo_cli.analysis.report import tune as tr

    tune = spec.tune
    points: dict[str, dict[str, tr.Point]] = {}
    for r in planned:
        p = points.setdefault(r.base_arm, {}).setdefault(r.name, tr.Point(r.base_arm, dict(r.settings), r.name))
        p.scores[r.seed] = tr.last_score(r.path, tune.selection_set, metric)
    selection = {arm: list(ps.values()) for arm, ps in points.items()}
    chosen = {arm: tr.select(ps) for arm, ps in selection.items()}
    baseline = (
        spec.comparison.baseline if spec.comparison and spec.comparison.baseline in chosen else next(iter(chosen))
    )
    info = {
        "experiment": spec.name,
        "spec": spec_path,
        "rule": tune.rule(metric),
        "metric": metric,
        "selection_set": tune.selection_set,
        "test_set": tune.test_set,
        "sizes": list(sizes),
        "seeds": tune.seeds,
        "final_seeds": tune.final_seeds,
        "steps": tune.steps or spec.train.steps,
        "train_steps": spec.train.steps,
        "budgets": budgets,
        "grids": tune.grids,
        "baseline": baseline,
        "margin": spec.comparison.margin if spec.comparison else None,
        "selected": {arm: p.settings for arm, p in chosen.items()},
    }
    return info, selection, chosen
