"""`gspo sweep SPEC --until-decided`: rounds of seeds for the spec's comparison (the rule and
the reading of runs: analysis/until_decided.py; the training: train/sweep.py)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from gspo_cli.cli.common import _exit_code, _print_table, err_console
from gspo_cli.errors import RunError, SpecError


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
    from gspo_cli.analysis.until_decided import decide_until, write_decision
    from gspo_cli.spec.loading import load_spec
    from gspo_cli.train import sweep as sw

    if max_seeds is None:
        raise SpecError("--until-decided: give --max-seeds N, the most seeds per arm it may train")
    spec = load_spec(spec_path, overrides)
    if spec.sweep is not None:
        raise SpecError("--until-decided: decides the comparison of two arms; drop the spec's sweep: section")
    placed = sw.executor_for(spec, executor, jobs)  # the same executor for every round
    records: dict[str, dict] = {}  # by run path: each run's latest record (trained, or skipped as completed)

    def train(seeds: list[int]) -> None:
        c = spec.comparison
        runs = sw.plan(spec_path, [*overrides, f"seeds={json.dumps(seeds)}"])
        runs = [r for r in runs if r.base_arm in (c.baseline, c.arm)]
        done = sw.run_plan(runs, jobs=jobs, force=False, log=log, executor=placed)
        records.update({r["path"]: r for r in done})
        code = _exit_code([r["status"] for r in done])
        if code == 1 or any(r["exit"] == 4 for r in done):
            raise RunError("--until-decided: a run of this round did not complete; rerun the same command to resume")

    decision = decide_until(spec, max_seeds, round_seeds, train, log)
    path = write_decision(spec, decision)
    if as_json:
        typer.echo(json.dumps({**decision.to_dict(), "runs": list(records.values()), "file": str(path)}))
        return
    _print_table(
        ["seeds", "difference", "95% repeated CI", "verdict"],
        [[lk.n, f"{lk.delta:+.4f}", f"[{lk.ci_low:+.4f}, {lk.ci_high:+.4f}]", lk.verdict] for lk in decision.looks],
    )
    err_console.print(f"method: {decision.method}", markup=False, highlight=False, soft_wrap=True)
    typer.echo(decision.summary())
    typer.echo(f"written: {path}")
