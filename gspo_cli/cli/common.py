"""What every `gspo` command shares: the error console and the one-line failure."""

from __future__ import annotations

import sys

import typer
from rich.console import Console

from gspo_cli.errors import GspoError, redact

err_console = Console(stderr=True)


def _fail(err: GspoError) -> None:
    for i, line in enumerate(redact(str(err)).splitlines() or [type(err).__name__]):
        # soft_wrap: never break a problem over two lines (Rich wraps at 80 columns off a terminal).
        err_console.print(("error: " if i == 0 else "       ") + line, markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(err.exit_code)


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
