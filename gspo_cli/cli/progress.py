"""Rendering training progress: a live Rich view on a terminal, plain lines otherwise."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from gspo_cli.errors import redact
from gspo_cli.train.reporting import PlainReporter, format_eval, format_step, training_line


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
            self.progress.console.print(redact(msg), markup=False, highlight=False)

    def run_started(self, name, total_steps, done=0):
        self.tasks[name] = self.progress.add_task("", total=total_steps, completed=done, name=name, info="")
        if done:  # a resumed run: the bar starts where it left off, and says so above the bars
            self.log(f"[{name}] {training_line(total_steps, done)}")

    def step_done(self, name, m):
        self.progress.update(self.tasks[name], completed=m["step"], info=format_step(m))

    def eval_done(self, name, record):
        # Above the bars, so every score stays on screen as training goes on.
        self.log(f"[{name}] {format_eval(record)}")

    def run_finished(self, name, status, summary):
        pass


def make_reporter(quiet: bool = False, to_stderr: bool = False):
    """A live view on a terminal; plain lines (to stderr when stdout carries JSON) otherwise."""
    stream = sys.stderr if to_stderr else sys.stdout
    if stream.isatty() and not quiet and not to_stderr:
        return RichReporter(quiet)
    return PlainReporter(quiet, stream=stream)


def _eval_head(results) -> str:
    """What the eval columns show: one evaluation set's first score key (e.g. "aime24 avg@4"),
    the set named in each cell when the runs' differ."""
    shown = {(r.summary.get("eval_set"), next(iter(r.summary.get("eval_first") or {}), None)) for r in results}
    shown.discard((None, None))
    return " ".join(str(x) for x in shown.pop() if x) if len(shown) == 1 else "eval"


def _eval_cell(summary: dict, key: str, named: bool) -> str:
    scores = summary.get(key) or {}
    if not scores:
        return ""
    name, value = next(iter(scores.items()))
    text = f"{value:.3f}" if isinstance(value, (int, float)) else str(value)
    return f"{summary.get('eval_set') or ''} {name} {text}".strip() if named else text


def _on_disk(r) -> dict:
    """A run that did not complete, as `gspo list` shows it: the step it reached and the rewards of
    its first and last logged steps, read from its run directory ({} when there is none)."""
    from gspo_cli.errors import GspoError
    from gspo_cli.runs import RunDir

    rd = RunDir(r.path)
    try:
        info, metrics = rd.info(), rd.metrics()
    except GspoError:  # an unreadable run.json or metrics.jsonl: the table stays as it was
        return {}
    rewards = [v for m in metrics if isinstance(v := m.get("reward/mean"), (int, float))]
    elapsed = metrics[-1].get("time/elapsed_s") if metrics else None
    return {
        "step": info.get("step", len(metrics)),
        "total_steps": info.get("total_steps"),
        **({"reward_first": round(rewards[0], 4), "reward_last": round(rewards[-1], 4)} if rewards else {}),
        **({"train_s": round(elapsed, 1)} if isinstance(elapsed, (int, float)) else {}),
    }


def _step_cell(s: dict) -> str:
    if "step" in s:
        return f"{s['step']}/{s['total_steps']}" if s.get("total_steps") else str(s["step"])
    return f"{s['steps']}/{s['steps']}" if "steps" in s else ""


def render_summary(results) -> None:
    """The final table of `gspo train`, then one line per run that failed or diverged saying why
    (with --quiet, the only place it is said)."""
    table = Table(title="runs")
    head = _eval_head(results)
    named = head == "eval"  # several sets or score keys: each cell says which
    for col in ("arm", "seed", "status", "step", "reward first", "reward last", f"{head} first", f"{head} last"):
        table.add_column(col)
    table.add_column("train s")
    table.add_column("path", overflow="fold")  # a long path wraps, never cut with "…"
    reasons = []
    for r in results:
        s = r.summary if r.status == "completed" else {**_on_disk(r), **r.summary}
        if s.get("error"):
            reasons.append(f"{r.arm}/seed{r.seed} {r.status}: {str(s['error']).strip().splitlines()[0]}")
        table.add_row(
            r.arm,
            str(r.seed),
            r.status,
            _step_cell(s),
            str(s.get("reward_first", "")),
            str(s.get("reward_last", "")),
            _eval_cell(s, "eval_first", named),
            _eval_cell(s, "eval_last", named),
            str(s.get("train_s", "")),
            r.path,
        )
    console = Console(width=200 if not sys.stdout.isatty() else None)
    console.print(table)
    for line in reasons:
        console.print(line, markup=False, highlight=False, soft_wrap=True)
