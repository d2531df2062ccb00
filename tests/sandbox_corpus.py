"""Shared by the sandbox tests: the hostile corpus, a marker per program so /proc tells
whether anything of a run survived it, and level switching. Test modules import these from
here, never from each other."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import pytest

from gspo_cli.errors import RunError
from gspo_cli.sandbox import programs as sandbox
from gspo_cli.sandbox.programs import run_program

TIMEOUT = 1.0
BOUND = TIMEOUT + 2.5  # wall-clock seconds a hostile run may take at most, kill included

HOSTILE = {
    "loop": "while True:\n    pass",
    "fork_bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
    "memory_bomb": "x = []\nwhile True:\n    x.append(bytearray(10**7))",
    "flood": "while True:\n    print('x' * 1000)",
    "segfault": "import ctypes\nctypes.string_at(0)",
    "kill_parent": "import os\nos.kill(os.getppid(), 9)\nwhile True:\n    pass",
    "threads": "import threading, time\nfor _ in range(100):\n    threading.Thread(target=time.sleep, args=(60,)).start()",  # noqa: E501 - a program, kept on one line
    "sleep": "import time\ntime.sleep(60)",
}


def new_marker() -> str:
    return f"gspo-hostile-{uuid.uuid4().hex}"


def procs_with(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            found.append(int(entry))
    return found


def assert_no_leftovers(marker: str) -> None:
    # Allow a moment for the kernel to finish reaping; anything alive after that leaked.
    deadline = time.monotonic() + 1.0
    while procs_with(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert procs_with(marker) == [], f"processes left behind for {marker}"


def run_marked(body: str, stdin: str = "", **kw):
    marker = new_marker()
    code = f"# {marker}\n{body}"
    t0 = time.monotonic()
    res = run_program(code, stdin, timeout_s=kw.pop("timeout_s", TIMEOUT), **kw)
    elapsed = time.monotonic() - t0
    assert_no_leftovers(marker)
    return res, elapsed, marker


def use_level(level: str):
    """Switch the sandbox to `level`, or skip the test with the reason it does not work here."""
    try:
        return sandbox.reset_isolation(level)
    except RunError as err:
        pytest.skip(f"{level} isolation does not work on this machine: {err}")


@contextmanager
def world_writable_dir():
    """A world-writable directory under /var/tmp, removed afterwards: not behind the
    sandbox's private /tmp, so only the read-only root keeps a program from writing there."""
    shared = Path(tempfile.mkdtemp(dir="/var/tmp"))
    try:
        shared.chmod(0o777)
        yield shared
    finally:
        shutil.rmtree(shared)
