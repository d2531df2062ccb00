"""`gspo sweep SPEC --until-decided`: rounds of seeds for the spec's comparison (the rounds
and the reading of runs: train/until_decided.py; the rule: analysis/stats/sequential.py; the training:
train/sweep.py)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from gspo_cli.cli.common import _exit_code, _print_table, err_console
from gspo_cli.errors import InterruptedRun, RunError, SpecError


def until_decided(
    spec_path: Path,
    overrides: list[str],
    *,
    jobs: int,
    max_seeds: int | None,
    round_seeds: int,
    log,
    as_json: bool,
    executor: str | None = None,
) -> None:
    """Train the comparison's two arms round by round and print the decision (GspoError on a
    user mistake or a failed run, for the caller to report)."""
    from gspo_cli.spec.loading import load_spec
    from gspo_cli.train import sweep as sw
    from gspo_cli.train.until_decided import FINISHED, decide_until, write_decision
    from gspo_cli.train.watch import stop_on_signals

    spec = load_spec(spec_path, overrides)
    _check_comparison(spec)
    if spec.sweep is not None:
        raise SpecError("--until-decided: decides the comparison of two arms; drop the spec's sweep: section")
    placed = sw.executor_for(spec, executor, jobs)  # the same executor for every round
    records: dict[str, dict] = {}  # by run path: each run's latest record (trained, or skipped as completed)

    def train(seeds: list[int]) -> None:
        c = spec.comparison
        runs = sw.plan(spec_path, [*overrides, f"seeds={json.dumps(seeds)}"])
        runs = [r for r in runs if r.base_arm in (c.baseline, c.arm)]
        if not stop:
            done = sw.run_plan(runs, jobs=jobs, force=False, log=log, executor=placed, stop=stop)
            records.update({r["path"]: r for r in done})
        if stop or any(r["exit"] == 4 for r in records.values()):  # one signal stops every round to come
            raise InterruptedRun(
                f"--until-decided: stopped by {stop.signal_name or 'a signal to a run'} during a round; completed "
                "runs are kept: rerun the same command to resume"
            )
        if _exit_code([r["status"] for r in done]) == 1:
            failed = [f"{r['run']}/seed{r['seed']} {r['status']}" for r in done if r["status"] not in FINISHED]
            raise RunError(
                f"--until-decided: {', '.join(failed[:4])} (by run.json) in this round; rerun the same command to "
                "resume"
            )

    # one flag for all rounds: a stop between rounds is not lost; the decision is written after every
    # look too, so a login session that dies between rounds leaves its looks
    with stop_on_signals() as stop:
        decision = decide_until(spec, max_seeds, round_seeds, train, log, after_look=lambda d: write_decision(spec, d))
    path = write_decision(spec, decision)
    if as_json:
        typer.echo(json.dumps({**decision.to_dict(), "runs": list(records.values()), "file": str(path)}))
        return
    _print_table(
        ["seeds", "difference", "boundary |t| >=", "95% repeated CI", "verdict"],
        [
            [lk.n, f"{lk.delta:+.4f}", f"{lk.boundary:.3g}", f"[{lk.ci_low:+.4f}, {lk.ci_high:+.4f}]", lk.verdict]
            for lk in decision.looks
        ],
    )
    if decision.looks:
        err_console.print(f"estimate: {decision.looks[-1].method}", markup=False, highlight=False, soft_wrap=True)
    err_console.print(f"method: {decision.method}", markup=False, highlight=False, soft_wrap=True)
    typer.echo(decision.summary())
    typer.echo(f"written: {path}")


def _check_comparison(spec) -> None:
    """The comparison's metric and margin, checked before the first round trains: a misspelled
    metric or an impossible margin found after training wastes the round."""
    from gspo_cli.cli.common import check_margin
    from gspo_cli.metrics import is_known

    c = spec.comparison
    if c is None:
        return  # decide_until says what is missing
    if c.metric is not None and (c.metric == "collapse" or c.metric.startswith("collapse:")):
        raise SpecError(
            f"comparison.metric: {c.metric!r} is a time to collapse (a log-rank test over runs, no per-seed "
            "difference), which --until-decided cannot look at seed by seed; train a fixed number of seeds "
            "(gspo sweep --seeds ...) and read the verdict with gspo compare"
        )
    if c.metric is not None and not is_known(c.metric):
        raise SpecError(
            f"comparison.metric: {c.metric!r} is no metric a run writes: a held-out score (avg@K, pass@k, maj@K, "
            "reward_<name>), a metrics.jsonl key (e.g. reward/mean, policy/kl_old_k3), or null for the held-out score"
        )
    check_margin(c.margin, "comparison.margin")


def planned_looks(
    spec_path: Path, overrides: list[str], *, max_seeds: int | None, round_seeds: int | None, as_json: bool
):
    """`--until-decided --dry-run`: the design's looks and boundaries, nothing trained."""
    from gspo_cli.spec.loading import load_spec
    from gspo_cli.train import until_decided as ud

    spec = load_spec(spec_path, overrides)
    _check_comparison(spec)
    if spec.sweep is not None:
        raise SpecError("--until-decided: decides the comparison of two arms; drop the spec's sweep: section")
    top, step, source = ud.plan_design(spec, max_seeds, round_seeds)
    looks = ud.planned_looks(spec, top, step)
    c = spec.comparison
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "baseline": c.baseline,
                    "arm": c.arm,
                    "margin": c.margin,
                    "max_seeds": top,
                    "round_seeds": step,
                    "design_from": source,
                    "looks": looks,
                }
            )
        )
        return
    _print_table(
        ["look", "seeds", "boundary |t| >=", "nominal p", "90% boundary (equivalence)"],
        [
            [
                lk["look"],
                lk["seeds"],
                f"{lk['boundary']:.4g}",
                f"{lk['nominal_p']:.2g}",
                f"{lk['boundary_equivalence']:.4g}",
            ]
            for lk in looks
        ],
    )
    typer.echo(
        f"planned: {c.arm} vs {c.baseline}, up to {top} seeds per arm, {step} more per round (design from the "
        f"{source}); nothing trained"
    )
