"""Rendering training progress: a live Rich view on a terminal, plain lines otherwise."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from gspo_cli.train.reporting import PlainReporter, format_step


class RichReporter(PlainReporter):
    """A progress bar per run with step, reward, clip fraction and ETA."""

    def __init__(self, quiet: bool = False):
        super().__init__(quiet)
        self.console = Console()
        self.progress = Progress(
            TextColumn("[bold]{task.fields[name]}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=self.console,
            transient=False,
        )
        self.tasks: dict[str, int] = {}

    def __enter__(self):
        self.progress.start()
        return self

    def __exit__(self, *exc):
        self.progress.stop()
        return False

    def log(self, msg: str) -> None:
        if not self.quiet:
            self.progress.console.print(msg, markup=False, highlight=False)

    def run_started(self, name, total_steps):
        self.tasks[name] = self.progress.add_task("", total=total_steps, name=name, info="")

    def step_done(self, name, m):
        self.progress.update(self.tasks[name], completed=m["step"], info=format_step(m))

    def run_finished(self, name, status, summary):
        pass


def make_reporter(quiet: bool = False, to_stderr: bool = False):
    """A live view on a terminal; plain lines (to stderr when stdout carries JSON) otherwise."""
    stream = sys.stderr if to_stderr else sys.stdout
    if stream.isatty() and not quiet and not to_stderr:
        return RichReporter(quiet)
    return PlainReporter(quiet, stream=stream)


def render_summary(results) -> None:
    table = Table(title="runs")
    for col in ("arm", "seed", "status", "reward first", "reward last", "eval first", "eval last", "train s", "path"):
        table.add_column(col)
    for r in results:
        s = r.summary
        ev0 = (s.get("eval_first") or {}).get(next(iter(s.get("eval_first") or {}), ""), "")
        ev1 = (s.get("eval_last") or {}).get(next(iter(s.get("eval_last") or {}), ""), "")
        table.add_row(
            r.arm,
            str(r.seed),
            r.status,
            str(s.get("reward_first", "")),
            str(s.get("reward_last", "")),
            f"{ev0:.3f}" if ev0 != "" else "",
            f"{ev1:.3f}" if ev1 != "" else "",
            str(s.get("train_s", "")),
            r.path,
        )
    Console(width=200 if not sys.stdout.isatty() else None).print(table)
