"""What the trainer's spawned helper processes share (the staleness-1 sampler,
rollout/async_worker.py, and the reward pool's workers, rewards/pool.py): how the parent
starts one, how the child takes signals, and the child's request loop. No torch import: the
reward workers never load it.

- Starting: the parent's `__main__` hidden (spawn would import it again in the child, running a
  user's script that lacks an `if __name__ == "__main__"` guard, and paying the CLI's imports),
  SIGINT/SIGTERM blocked (held pending, not lost) so a Ctrl-C during the child's imports cannot
  kill it; the child inherits the mask and unblocks only after ignoring them (the trainer
  decides when to stop, then stops its children), as multiprocessing's resource tracker does.
- Dying with the parent: on Linux the kernel sends the child SIGKILL when its parent dies
  (PR_SET_PDEATHSIG); elsewhere the request loop notices within one poll. The kernel's "parent"
  is the thread that started the child, not the process: a child started from a thread that
  ends (a staleness-1 scoring thread) would be killed with it, so a parent that may start
  children from such threads starts them through a `Starter`, one thread that lives as long as
  the children's owner.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import queue
import signal
import sys
import threading
import types
from collections.abc import Iterator

STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


@contextlib.contextmanager
def starting_child() -> Iterator[None]:
    """Around `Process.start()`: the parent's __main__ hidden and the stop signals blocked."""
    main = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")  # no __file__, no __spec__
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
        if main is not None:
            sys.modules["__main__"] = main


def child_signals() -> None:
    """First thing in the child: ignore the stop signals (then unblock them) and die with the parent."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG


def requests_until_stop(requests, poll_s: float) -> Iterator[tuple]:
    """The child's requests from `requests` until a ("stop",) message or the parent's death."""
    parent = multiprocessing.parent_process()
    while True:
        try:
            msg = requests.get(timeout=poll_s)
        except queue.Empty:
            if parent is not None and not parent.is_alive():
                return
            continue
        if msg[0] == "stop":
            return
        yield msg


class Starter:
    """Starts processes from one thread of its own (see the module docstring: the children die
    with the thread that started them), with `starting_child` around each start. `close` ends
    the thread; processes started before stay as they are."""

    def __init__(self, name: str):
        self._jobs: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def start(self, proc) -> None:
        """`proc.start()` in the starter's thread; returns once it has started (raises what it raised)."""
        done, out = threading.Event(), {}
        self._jobs.put((proc, done, out))
        done.wait()
        if "error" in out:
            raise out["error"]

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            proc, done, out = job
            try:
                with starting_child():
                    proc.start()
            except BaseException as err:  # noqa: BLE001 - raised again in the caller's thread
                out["error"] = err
            finally:
                done.set()

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join()
