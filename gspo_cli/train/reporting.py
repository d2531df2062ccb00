"""How the trainer talks to a user interface: the Reporter protocol and the plain-line
reporter (library use, pipes, logs, job arrays). The live Rich view is in progress.py."""

from __future__ import annotations

import sys
from typing import Protocol

from gspo_cli.errors import redact
from gspo_cli.runs import plural


class Reporter(Protocol):
    def log(self, msg: str) -> None: ...
    def run_started(self, name: str, total_steps: int, done: int = 0) -> None: ...
    def step_done(self, name: str, metrics: dict) -> None: ...
    def eval_done(self, name: str, record: dict) -> None: ...
    def run_finished(self, name: str, status: str, summary: dict) -> None: ...


def format_step(m: dict) -> str:
    parts = [
        f"reward {m['reward/mean']:.3f}",
        f"acc {m['reward/accuracy']:.2f}",
        f"clip {m['policy/clip_frac_token']:.2e}",
    ]
    if "moe/expert_change_frac" in m:
        parts.append(f"experts Δ {m['moe/expert_change_frac']:.3f}")
    parts.append(f"{m['time/step_s']:.1f}s/step")
    return "  ".join(parts)


def format_eval(record: dict) -> str:
    """An eval.jsonl record as one line: the set (or held-out task) and its scores."""
    scores = "  ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in record["scores"].items())
    n = plural(record["n"], "problem")
    return f"eval {record.get('set', record['task'])} at step {record['step']} ({n}): {scores}"


def training_line(total_steps: int, done: int = 0) -> str:
    """What a run is about to train: its steps, or (resumed after `done` steps) the rest of them."""
    if not done:
        return f"training {plural(total_steps, 'step')}"
    left = total_steps - done
    if left <= 0:
        return f"all {total_steps} steps trained before; finishing the run"
    which = f"step {total_steps}" if left == 1 else f"steps {done + 1}-{total_steps}"
    return f"training {plural(left, 'more step')} ({which} of {total_steps})"


class PlainReporter:
    """One line per step on `stream` (stdout by default); `quiet` prints nothing at all."""

    def __init__(self, quiet: bool = False, stream=None):
        self.quiet = quiet
        self.out = stream or sys.stdout

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def log(self, msg: str) -> None:
        if not self.quiet:
            print(redact(msg), file=self.out, flush=True)

    def run_started(self, name: str, total_steps: int, done: int = 0) -> None:
        self.log(f"[{name}] {training_line(total_steps, done)}")

    def step_done(self, name: str, m: dict) -> None:
        self.log(f"[{name}] step {m['step']}  {format_step(m)}")

    def eval_done(self, name: str, record: dict) -> None:
        self.log(f"[{name}] {format_eval(record)}")

    def run_finished(self, name: str, status: str, summary: dict) -> None:
        self.log(f"[{name}] {status}: reward {summary.get('reward_first')} -> {summary.get('reward_last')}")


def quiet_reporter() -> PlainReporter:
    """A reporter that shows nothing (ranks other than 0, tests)."""
    return PlainReporter(quiet=True)
