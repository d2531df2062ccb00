"""Calling the user's environment (task.environment, environments/) from a rollout,
so that nothing it does can hang the run.

Every start(), step() and finish() runs in a daemon thread, and the rollout waits for it at most
`task.environment_timeout_s` seconds, counted from when the call began: a call still running then
ends the run (RunError, one line naming the method and the rollout's prompt). Python cannot stop a
thread, so that call is abandoned: its thread goes on until it returns or the process exits (being
a daemon, it never keeps the process alive, and nothing waits for it).

A stop signal (SIGINT/SIGTERM, `stop`: the training loop's StopFlag) lets the step finish as usual;
an environment call still running `STOP_GRACE_S` seconds after the signal is abandoned with its
step, and the run stops at its last checkpoint (InterruptedRun, exit 4). A second Ctrl-C raises in
the waiting main thread at once (exit 130).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from gspo_cli.errors import GspoError, InterruptedRun, RunError
from gspo_cli.user_code import output_to_stderr

POLL_S = 0.1  # how often the waiting rollout looks at the clock and the stop flag
STOP_GRACE_S = 5.0  # how long calls still running after a stop signal may go on


def prompt_start(prompt: Any) -> str:
    """The first 40 characters of a rollout's prompt, quoted, for messages."""
    return repr(str(prompt)[:40])


def first_line(err: BaseException, limit: int = 200) -> str:
    """`Type: message` of an exception, its first line, at most `limit` characters of message."""
    lines = str(err).strip().splitlines()
    text = lines[0] if lines else ""
    text = text if len(text) <= limit else text[:limit] + "..."
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


class EnvironmentCalls:
    """Runs the environments' calls of one round in daemon threads (`workers` at a time), each
    bounded by `timeout_s`, watching `stop` (anything whose truth says a stop signal came, with
    `signal_name` and `since`, its time.monotonic(); None: never stopped)."""

    def __init__(self, timeout_s: float, stop: Any = None, workers: int = 8):
        self.timeout_s, self.stop, self.workers = float(timeout_s), stop, workers

    def run(self, method: str, calls: list[Callable[[], Any]], prompts: list[Any], one_at_a_time=False) -> list:
        """The results of `calls` (each `method` of one rollout's environment, `prompts[i]` that
        rollout's prompt), in order; `one_at_a_time`: in that order, each after the last.
        RunError for a call that raised (the first in order) or that runs past the time-out;
        InterruptedRun once a stop signal is older than STOP_GRACE_S."""
        n = len(calls)
        if not n:
            return []
        results: list[Any] = [None] * n
        errors: list[BaseException | None] = [None] * n
        started: list[float | None] = [None] * n
        finished = [False] * n
        state = {"next": 0, "abandoned": False}
        cond = threading.Condition()

        def work() -> None:
            while True:
                with cond:
                    i = state["next"]
                    if i >= n or state["abandoned"]:
                        return
                    state["next"], started[i] = i + 1, time.monotonic()
                try:
                    out, err = calls[i](), None
                except BaseException as e:  # noqa: BLE001 - the user's code, even sys.exit(): reported, not lost
                    out, err = None, e
                with cond:
                    results[i], errors[i], finished[i] = out, err, True
                    cond.notify_all()

        # What the calls print goes to standard error while they run: stdout is the command's (--json).
        quiet = output_to_stderr()
        quiet.__enter__()
        for _ in range(1 if one_at_a_time else min(self.workers, n)):
            threading.Thread(target=work, name="gspo-environment", daemon=True).start()
        try:
            with cond:
                # A call that raised fails the run now, not once a blocked one times out.
                while not all(finished) and not any(e is not None for e in errors):
                    cond.wait(POLL_S)
                    self._check(method, started, finished, prompts)
        finally:
            with cond:
                state["abandoned"] = True  # calls not yet begun never begin
            quiet.__exit__(None, None, None)
        for i, err in enumerate(errors):
            if isinstance(err, InterruptedRun):
                raise err
            if isinstance(err, GspoError):  # our own checks of what the call returned, with the rollout named
                raise type(err)(f"{err} (the rollout whose prompt starts {prompt_start(prompts[i])})") from None
            if err is not None:
                raise RunError(
                    f"task.environment: {method} raised {first_line(err)} (the rollout whose prompt starts "
                    f"{prompt_start(prompts[i])})"
                )
        return results

    def _check(self, method: str, started: list, finished: list, prompts: list) -> None:
        now = time.monotonic()
        for i, t in enumerate(started):
            if t is not None and not finished[i] and now - t > self.timeout_s:
                raise RunError(
                    f"task.environment: {method} did not return within {self.timeout_s:g} s "
                    f"(task.environment_timeout_s) for the rollout whose prompt starts {prompt_start(prompts[i])}; "
                    "the call was abandoned and the run stopped"
                )
        stop, since = self.stop, getattr(self.stop, "since", None)
        if stop and since is not None and now - since > STOP_GRACE_S:
            raise InterruptedRun(
                f"stopped by {getattr(stop, 'signal_name', None) or 'a signal'}: the environment's {method} was "
                f"still running {STOP_GRACE_S:g} s later; this step is lost, its run keeps the last checkpoint: "
                "rerun the same command to resume"
            )
