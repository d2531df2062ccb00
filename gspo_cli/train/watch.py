"""Watching a run from the outside of a step: stop signals, collapse detection, and the
sampler/trainer log-prob gap warning. The training loop (train.py) consults them between steps."""

from __future__ import annotations

import contextlib
import signal
import threading
import time

from gspo_cli.errors import DivergedError, HardInterrupt
from gspo_cli.train.reporting import Reporter
from gspo_cli.user_code import abandon


@contextlib.contextmanager
def stop_on_signals():
    """SIGINT/SIGTERM set a flag the loop checks between steps (checkpoint, then stop); a call of
    the user's code running then (a reward function) is abandoned at once with its step
    (InterruptedRun: the last checkpoint stays); a second SIGINT interrupts at once. Only the main
    thread can own signal handlers."""
    stop = StopFlag()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def handler(signum, frame):
        if stop and signum == signal.SIGINT:
            raise HardInterrupt
        stop.set(signal.Signals(signum).name)
        abandon(stop.signal_name)  # a slow reward call is not waited for (user_code.user_call)

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for s, h in old.items():
            signal.signal(s, h)


class StopFlag:
    """Set by a signal handler; the loop checks it between steps and stops cleanly. `since`:
    time.monotonic() of the first signal (environment calls give way STOP_GRACE_S after it)."""

    def __init__(self):
        self.signal_name: str | None = None
        self.since: float | None = None

    def set(self, signal_name: str) -> None:
        if self.signal_name is None:
            self.since = time.monotonic()
        self.signal_name = signal_name

    def __bool__(self) -> bool:
        return self.signal_name is not None


class GapWarning:
    """Warns once per run when the sampler's log-probs are far from the trainer's: a mean
    per-token gap above half the arm's narrower clip range shifts every ratio by about as
    much as the clip band allows (GSPO's 3e-4 is crossed by bf16 gaps of 1e-3). Also once
    when rows longer than the micro-batch token budget first ran alone."""

    def __init__(self, name: str, clip_low: float, clip_high: float):
        self.name, self.limit, self.warned = name, 0.5 * min(clip_low, clip_high), False
        self.oversize_warned = False

    def check(self, metrics: dict, reporter: Reporter) -> None:
        oversize = metrics.get("perf/oversize_rows")  # also: rows over the micro-batch budget, once
        if oversize and not self.oversize_warned:
            self.oversize_warned = True
            reporter.log(
                f"[{self.name}] warning: {int(oversize)} rows longer than train.micro_batch_tokens ran alone as "
                f"their own micro-batches at step {metrics['step']} (perf/oversize_rows counts them each step)"
            )
        gap = metrics.get("rollout/logprob_diff_mean")
        if gap is not None and gap > self.limit and not self.warned:
            self.warned = True
            reporter.log(
                f"[{self.name}] warning: sampler and trainer log-probs differ by {gap:.2e} nats per token "
                f"on average (step {metrics['step']}), more than half the clip range ({self.limit:.1e}): "
                "importance ratios are biased before any update (see rollout/logprob_diff_*)"
            )


class CollapseWatch:
    """Declares a collapse when mean reward or entropy stays under its threshold for
    `patience` consecutive steps (history included, so a resume does not reset it)."""

    def __init__(self, cfg, history: list[dict]):
        self.cfg = cfg
        self.below = {"reward/mean": 0, "policy/entropy": 0}
        for m in history:
            self._count(m)

    def _count(self, m: dict) -> None:
        limits = {"reward/mean": self.cfg.reward_below, "policy/entropy": self.cfg.entropy_below}
        for key, limit in limits.items():
            v = m.get(key)
            if limit is not None and v is not None:
                self.below[key] = self.below[key] + 1 if v < limit else 0

    def observe(self, m: dict, step: int) -> None:
        self._count(m)
        for key, n in self.below.items():
            if n >= self.cfg.patience:
                limit = self.cfg.reward_below if key == "reward/mean" else self.cfg.entropy_below
                raise DivergedError(f"step {step}: collapse: {key} below {limit} for {n} steps")
