"""Reward functions from the user's code in a pool of worker processes (`task.reward_workers`).

Only FILE.py:NAME, module:NAME and plugin functions go to the pool; the rewards we ship,
reward models and LLM judges run in the trainer. The trainer (`RewardPool`):

- starts `workers` processes with multiprocessing's spawn context (never fork: torch has
  started threads by then); each imports the user's file or module itself, by the reward's
  `source` (a function from a file path cannot be pickled by reference), once, on first use;
- sends each call (one reward on a step's rows, or with `chunks` on a contiguous chunk of them,
  TRL's keyword arguments) to the worker with the fewest rows outstanding, and reads answers
  from one result queue;
- ends a call that runs longer than `timeout_s` (`task.reward_timeout_s`, counted from when
  the worker starts it) with a RunError naming the reward and the call's first row, after
  killing every worker (they are started again on the next call, from the pool's own starter
  thread whatever thread makes the call, so that they outlive a staleness-1 scoring thread);
  a worker that dies (segfault, os._exit) is a RunError too: one line, never a hang;
- stops the workers on `close()` (`running` does that at the end of `gspo train`, Ctrl-C
  included). Workers ignore SIGINT/SIGTERM (the trainer decides when they stop) and die with
  the trainer (PR_SET_PDEATHSIG), so none is left behind;
- ends what a reward started: each worker leads a session (and process group) of its own, and
  whenever a worker is stopped or killed its whole group is killed with it, so a `sleep` a
  reward left running, or the child of a `subprocess.run` that a time-out interrupted, ends
  too. (If the trainer itself is killed with SIGKILL, the kernel kills the workers, but what
  they started outlives them.)
- keeps the trainer's standard output for its own (`gspo train --json` prints its summary
  there): a worker's file descriptor 1 is its standard error, and a reward called in the
  trainer writes there too while it runs (`user_functions.output_to_stderr`).

How one call runs in a worker (TRL's keyword arguments, `async def` functions, errors as one
line, what a worker sends back) is `rewards/user_functions.py`, shared with rewards called in the
trainer.
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import os
import queue
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Callable

from gspo_cli.errors import RunError
from gspo_cli.rewards.user_functions import RAISED, call_rows, error_line, failing_row, portable
from gspo_cli.spawned import Starter, child_signals, requests_until_stop

MAX_WORKERS = 8  # the default's cap
POLL_S = 0.1  # how often a waiting trainer checks time-outs and workers' health
STOP_S = 2.0  # how long `close` lets workers stop before killing them


def auto_workers(cpus: int, threads: int, omp_set: bool) -> int:
    """The default pool size: the cores this run has that torch's `threads` leave free, at
    least 1 and at most MAX_WORKERS. Under `gspo sweep --jobs J` each run gets cpus // J
    cores, which its OMP_NUM_THREADS says (`omp_set`: sweep sized torch's threads so)."""
    jobs = max(1, cpus // max(1, threads)) if omp_set else 1
    return max(1, min(MAX_WORKERS, cpus // jobs - threads))


def planned(task_cfg, threads: int) -> tuple[int, str | None]:
    """(workers, the setup line) for a spec's `task` section and torch's thread count: (0, None)
    when no reward (training's or an evaluation set's) is a user or plugin function."""
    from gspo_cli.rewards.shipped import SHIPPED

    cfgs = list(task_cfg.rewards) + [r for s in task_cfg.eval_sets for r in (s.rewards or [])]
    pooled = sorted({c.label for c in cfgs if c.function is not None and c.function not in SHIPPED})
    if not pooled:
        return 0, None
    names = f"reward functions ({', '.join(pooled)})"
    if task_cfg.reward_workers == 0:
        return 0, f"{names}: scored in the trainer process (task.reward_workers: 0)"
    if task_cfg.reward_workers is not None:
        n, why = task_cfg.reward_workers, "task.reward_workers"
    else:
        cpus = usable_cpus()
        n = auto_workers(cpus, threads, "OMP_NUM_THREADS" in os.environ)
        why = f"default: {cpus} cores, {threads} torch thread(s); task.reward_workers sets it"
    return n, f"{names}: {n} worker process(es) ({why}), at most {task_cfg.reward_timeout_s:g} s per call"


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


# ---------------------------------------------------------------------------------------
# The pool (trainer side)


class RewardRaised(Exception):
    """A pooled reward raised: `row` (in the call's rows) and "Type: first line"."""

    def __init__(self, row: int, text: str):
        super().__init__(text)
        self.row, self.text = row, text


@dataclass
class _Call:
    slot: int
    reward: str
    prompt: str  # the first row's prompt, for error messages
    rows: int
    started: float | None = None
    done: bool = False
    value: Any = None
    error: tuple[int, str] | None = None  # (row, error line) once the failing row is known
    raised: str | None = None  # the error line, sent before the worker looks for the row


class RewardPool:
    """`workers` spawned processes running reward functions; see the module docstring."""

    def __init__(self, workers: int, timeout_s: float, chunks: bool = False):
        if workers < 1:
            raise ValueError("a RewardPool has at least one worker")
        self.size, self.timeout_s = workers, timeout_s
        self.chunks = chunks  # task.reward_calls: chunks (rows streamed in chunks, async rewards per row)
        self._mp = multiprocessing.get_context("spawn")
        self.results = self._mp.Queue()
        self.slots: list[tuple[Any, Any] | None] = [None] * workers
        self.calls: dict[int, _Call] = {}
        self._ids = itertools.count()
        self._lock = threading.RLock()  # the trainer and a staleness-1 scoring thread share the pool
        self.closed = False
        self._starter = Starter("gspo-reward-starter")  # workers restarted from a scoring thread outlive it
        for i in range(workers):
            self._start(i)

    def _start(self, i: int) -> None:
        requests = self._mp.Queue()
        proc = self._mp.Process(
            target=_worker_main, args=(i, requests, self.results), name=f"gspo-reward-{i}", daemon=True
        )
        self._starter.start(proc)
        self.slots[i] = (proc, requests)

    def pids(self) -> list[int]:
        return [s[0].pid for s in self.slots if s is not None]

    def submit(self, reward: str, source: str, prompt: str, kwargs: dict[str, Any], rows: int) -> int:
        """Send one call (reward `reward`, loaded from `source`, on `rows` rows) to the worker with
        the fewest rows outstanding; its id."""
        with self._lock:
            if self.closed:
                raise RunError("the reward pool is closed")
            self._pump(wait=False)  # answers that arrived: which workers are free now
            load = [0] * self.size  # rows outstanding per worker
            for c in self.calls.values():
                load[c.slot] += 0 if c.done else c.rows
            slot = min(range(self.size), key=lambda i: (load[i], i))
            if self.slots[slot] is None:
                self._start(slot)
            call_id = next(self._ids)
            self.calls[call_id] = _Call(slot, reward, prompt, rows)
            self.slots[slot][1].put(("call", call_id, source, kwargs, rows, self.chunks))
            return call_id

    def result(self, call_id: int) -> Any:
        """What call `call_id` returned (RewardRaised when the function raised; RunError when it
        timed out or its worker died)."""
        while True:
            with self._lock:
                call = self.calls.get(call_id)
                if call is None:
                    raise RunError("reward pool: the call was abandoned (a worker was stopped)")
                if call.done:
                    del self.calls[call_id]
                    if call.error is not None:
                        raise RewardRaised(*call.error)
                    return call.value
                self._pump()

    def discard(self, call_ids) -> None:
        """Forget calls whose answers are no longer wanted (they are dropped when they arrive)."""
        with self._lock:
            for i in call_ids:
                self.calls.pop(i, None)

    def _pump(self, wait: bool = True) -> None:
        """Read the answers that arrived (waiting up to POLL_S for one when `wait`), then check
        time-outs and workers' health."""
        while True:
            try:
                msg = self.results.get(timeout=POLL_S) if wait else self.results.get_nowait()
            except queue.Empty:
                break
            except (OSError, ValueError, EOFError):
                raise RunError("the reward pool was closed while a reward ran") from None
            self._read(msg)
            wait = False  # then whatever else is there, without waiting
        self._check()

    def _read(self, msg) -> None:
        if msg is not None:
            call = self.calls.get(msg[2])
            if call is not None:
                if msg[0] == "start":
                    call.started = msg[3]
                elif msg[0] == "ok":
                    call.done, call.value = True, msg[3]
                elif msg[0] == "raised":
                    call.raised = msg[3]
                else:  # "row": the row it raised on
                    call.done, call.error = True, (msg[3], call.raised)

    def _check(self) -> None:
        now = time.time()
        for call in self.calls.values():
            if call.done:
                continue
            slot = self.slots[call.slot]
            where = f"on {call.rows} row(s), the first whose prompt starts {call.prompt[:40]!r}"
            if call.started is not None and now - call.started > self.timeout_s:
                self._reset()
                if call.raised is not None:  # it raised; finding the row on its own took the rest of the time
                    raise RunError(
                        f"reward {call.reward} raised {where} (the row not found within task.reward_timeout_s): "
                        f"{call.raised}"
                    )
                raise RunError(
                    f"reward {call.reward} took more than {self.timeout_s:g} s (task.reward_timeout_s) {where}; "
                    "its worker was stopped"
                )
            if slot is None or not slot[0].is_alive():
                code = None if slot is None else slot[0].exitcode
                self._reset()
                raise RunError(
                    f"reward {call.reward}'s worker process died (exit code {code}) {where}: the reward function "
                    "or a library it calls crashed"
                )

    def _reset(self) -> None:
        """Kill every worker and forget every call (workers start again on the next call)."""
        for i, slot in enumerate(self.slots):
            if slot is not None:
                _stop(slot, grace_s=0)
            self.slots[i] = None
        self.calls.clear()

    def close(self) -> None:
        """Stop the workers: ask, then kill; returns once they are gone."""
        with self._lock:
            self.closed = True
            live = [s for s in self.slots if s is not None]
            for _, requests in live:
                with contextlib.suppress(ValueError, OSError):
                    requests.put(("stop",))
            deadline = time.time() + STOP_S
            while any(p.is_alive() for p, _ in live) and time.time() < deadline:
                with contextlib.suppress(queue.Empty, OSError, EOFError, ValueError):
                    self.results.get(timeout=POLL_S)  # lets a worker's queue flush so that it can exit
            for slot in live:
                _stop(slot, grace_s=0)
            self.slots = [None] * self.size
            self._starter.close()
            self.results.cancel_join_thread()
            self.results.close()


def _stop(slot, grace_s: float) -> None:
    proc, requests = slot
    proc.join(timeout=grace_s)
    if proc.is_alive():
        proc.kill()  # workers ignore SIGTERM
        proc.join(timeout=10)
    # What the reward started: the worker's process group (its id is the worker's pid, and it
    # stays reserved while any member lives, so no other group can have taken it).
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    requests.cancel_join_thread()
    requests.close()


_active: RewardPool | None = None


def active() -> RewardPool | None:
    """The pool of the `gspo train` running in this process (None: rewards run in the trainer)."""
    return _active


@contextlib.contextmanager
def running(workers: int, timeout_s: float, chunks: bool = False) -> Iterator[RewardPool | None]:
    """A pool of `workers` processes (none for 0) that reward scoring uses until the block ends;
    `chunks`: rows are sent in chunks as they are sampled (task.reward_calls: chunks)."""
    global _active
    pool = RewardPool(workers, timeout_s, chunks) if workers > 0 else None
    _active = pool
    try:
        yield pool
    finally:
        _active = None
        if pool is not None:
            pool.close()


# ---------------------------------------------------------------------------------------
# Worker process


def _worker_main(slot: int, requests, results) -> None:
    child_signals()
    os.setsid()  # a session and process group of its own: the trainer kills it whole (`_stop`)
    os.dup2(2, 1)  # what a reward prints (or a program it runs) never reaches the trainer's stdout
    from gspo_cli.rewards.sources import load_source

    functions: dict[str, Callable] = {}
    for msg in requests_until_stop(requests, 0.5):
        _, call_id, source, kwargs, n, per_row = msg
        results.put(("start", slot, call_id, time.time()))
        fn = functions.get(source)
        try:
            if fn is None:
                fn = functions[source] = load_source(source)
            results.put(("ok", slot, call_id, portable(call_rows(fn, kwargs, n, per_row))))
        except RAISED as err:  # the user's function: one line back to the trainer, then the row
            results.put(("raised", slot, call_id, error_line(err)))  # kept if the row search times out
            results.put(("row", slot, call_id, failing_row(fn, kwargs, n) if fn is not None else 0))
