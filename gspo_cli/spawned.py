"""What the trainer's spawned helper processes share (the staleness-1 sampler,
rollout/async_worker.py, and the reward pool's workers, tasks/reward_pool.py): how the parent
starts one, how the child takes signals, and the child's request loop. No torch import: the
reward workers never load it.

- Starting: the parent's `__main__` hidden (spawn would import it again in the child, running a
  user's script that lacks an `if __name__ == "__main__"` guard, and paying the CLI's imports),
  SIGINT/SIGTERM blocked (held pending, not lost) so a Ctrl-C during the child's imports cannot
  kill it; the child inherits the mask and unblocks only after ignoring them (the trainer
  decides when to stop, then stops its children), as multiprocessing's resource tracker does.
- Dying with the parent: on Linux the kernel sends the child SIGKILL when its parent dies
  (PR_SET_PDEATHSIG); elsewhere the request loop notices within one poll.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import queue
import signal
import sys
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
