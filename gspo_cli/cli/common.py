"""What every `gspo` command shares: the error console and the one-line failure."""

from __future__ import annotations

import json
import math
import sys
from typing import Annotated, Optional

import typer
from rich.console import Console

from gspo_cli.errors import GspoError, SpecError, redact

err_console = Console(stderr=True)


def _fail(err: GspoError) -> None:
    for i, line in enumerate(redact(str(err)).splitlines() or [type(err).__name__]):
        # soft_wrap: never break a problem over two lines (Rich wraps at 80 columns off a terminal).
        err_console.print(("error: " if i == 0 else "       ") + line, markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(err.exit_code)


MARGIN_LIMIT = 1e6  # a margin past this (in any metric's units) makes every difference "equivalent"


def check_margin(margin: float | None, field: str) -> float | None:
    """`margin` when it is a finite number in [0, MARGIN_LIMIT); SpecError naming `field` otherwise
    (nan, inf or 1e300 would call any two arms equivalent, or none)."""
    if margin is None:
        return None
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not math.isfinite(margin):
        raise SpecError(f"{field}: {margin!r} is not a finite number (a margin in the metric's units, e.g. 0.02)")
    if margin < 0:
        raise SpecError(f"{field}: must be >= 0, got {margin:g}")
    if margin >= MARGIN_LIMIT:
        raise SpecError(
            f"{field}: {margin:g} is outside [0, {MARGIN_LIMIT:g}) (a margin in the metric's units, e.g. 0.02: one "
            "this wide calls any two arms equivalent)"
        )
    return float(margin)


def _print_table(columns: list[str], rows: list[list]) -> None:
    from rich.table import Table

    table = Table()
    for c in columns:
        table.add_column(c, overflow="fold")  # a long value (a run's path) wraps, never cut with "…"
    for row in rows:
        table.add_row(*(str(v) for v in row))
    # Off a terminal (pipes, job logs) Rich would squeeze to 80 columns and cut paths.
    Console(soft_wrap=True, width=None if sys.stdout.isatty() else 250).print(table)


def _show_warning(message, category, filename, lineno, file=None, line=None):
    err_console.print(f"warning: {message}", markup=False, highlight=False, soft_wrap=True)


def _exit_code(statuses: list[str]) -> int:
    """Worst outcome wins: a failed (or locked) run (1) over a diverged one (3) over success (0)."""
    if any(st not in ("completed", "diverged") for st in statuses):
        return 1
    if "diverged" in statuses:
        return 3
    return 0


EXECUTOR_HELP = (
    "where the runs train: local (processes here, --jobs at a time), slurm (a job array per round) or ray "
    "(a task per run); default: the spec's executor.kind, else local; e.g. --executor slurm"
)


# Where the runs train, from the command line: the spec's executor section, field by field.
NodesOption = Annotated[
    Optional[int],
    typer.Option(
        "--nodes",
        min=1,
        metavar="N",
        help="with the slurm executor: nodes of each run (executor.slurm.nodes); above 1 each run trains under "
        "torchrun across them; e.g. --executor slurm --nodes 2 --tasks-per-node 8",
    ),
]
TasksPerNodeOption = Annotated[
    Optional[int],
    typer.Option(
        "--tasks-per-node",
        min=1,
        metavar="N",
        help="with the slurm executor: training processes of each run per node, started by torchrun "
        "(executor.slurm.tasks_per_node); e.g. --executor slurm --tasks-per-node 2",
    ),
]
AddressOption = Annotated[
    Optional[str],
    typer.Option(
        "--address",
        metavar="HOST:PORT",
        help="with the ray executor: an existing Ray cluster (executor.ray.address: its head's HOST:PORT, auto or "
        "ray://HOST:10001); default: a local cluster for this command; e.g. --executor ray --address 10.0.0.1:6379",
    ),
]


def placement_overrides(
    spec_path, overrides: list[str], executor: str | None, *, nodes=None, tasks_per_node=None, address=None
) -> list[str]:
    """`overrides` plus the executor flags given (--nodes, --tasks-per-node, --address) as overrides of
    the spec's executor section. SpecError for a flag of another executor than the one the runs
    train on (--executor, else the spec's executor.kind): it would be ignored."""
    given = {
        "--nodes": ("slurm", "nodes", nodes),
        "--tasks-per-node": ("slurm", "tasks_per_node", tasks_per_node),
        "--address": ("ray", "address", address),
    }
    given = {flag: v for flag, v in given.items() if v[2] is not None}
    if not given:
        return overrides
    kind = executor
    if kind is None:
        from gspo_cli.spec.loading import apply_override, read_spec_file

        raw = read_spec_file(spec_path)
        for assignment in overrides:
            raw = apply_override(raw, assignment)
        section = raw.get("executor")
        kind = (section.get("kind") if isinstance(section, dict) else None) or "local"
    out = list(overrides)
    for flag, (needs, field, value) in given.items():
        if kind != needs:
            raise SpecError(f"{flag} goes with the {needs} executor (--executor {needs}); the runs train on {kind}")
        out.append(f"executor.{needs}.{field}={json.dumps(value)}")
    return out
