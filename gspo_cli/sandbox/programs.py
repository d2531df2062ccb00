"""Run untrusted Python programs (model completions) and capture what they print.

Every program runs in its own subprocess of the system's `python3` in isolated mode
(`-I -S -B`: no environment variables, no site-packages, no user directory, no .pyc
writes), with a minimal environment, stdin/stdout/stderr redirected to files the judge
owns, and resource limits set by a `/bin/sh` wrapper before the interpreter starts
(RLIMIT_CPU, RLIMIT_AS, RLIMIT_FSIZE, RLIMIT_NOFILE, RLIMIT_NPROC, RLIMIT_CORE=0).
No signal handler, alarm or `preexec_fn` is involved, so it is safe to call from worker threads.

Three isolation levels (see `isolation`), chosen once per process by `detect_isolation()`:
the strongest that works here, or the one `GSPO_SANDBOX_ISOLATION` names (root, rootless,
basic; a named level that does not work here is an error, never a silent fallback).
`python -m gspo_cli.sandbox.check` prints the level in use.

* ``root`` (the judge is root, with util-linux `unshare`, `setpriv` and `mount`): the
  program runs in fresh PID, network and mount namespaces. `sh` is PID 1 of the PID
  namespace and the program its child, so when the wrapper dies *every* descendant dies
  with it, including ones that called `setsid()`; a timeout kills the wrapper and nothing
  survives. The network namespace has only a loopback that is down: no connection to
  anything. In the mount namespace the root filesystem is remounted read-only, `/tmp` and
  `/dev/shm` are fresh size-capped tmpfs (the working directory is that `/tmp`), and
  /root, /home, /run and the judge's $HOME are empty: the program can write nowhere the
  host sees, nor reach a socket under /run. It runs as gid 65534 (nogroup) and a uid of
  its own from a private range, no supplementary groups, no new privileges. The uid is per
  sandbox slot, not the shared `nobody`, because RLIMIT_NPROC counts processes per uid:
  with a shared uid one fork bomb would make every concurrent sandbox's `exec` fail.
  Not isolated: the program can *read* world-readable host files elsewhere, and it shares
  the host kernel (no seccomp filter); CPU time of its processes is bounded only by the
  wall-clock timeout and RLIMIT_CPU per process.
* ``rootless`` (any user, where the kernel allows unprivileged user namespaces): the same
  namespaces, mounts and rlimits, made inside a new user namespace whose uid 0 is the
  judging user; the program runs as that uid 0 with every capability dropped (bounding
  set included), so it cannot undo the mounts. Concurrent programs stay apart: each has
  its own PID namespace (no signal or ptrace reaches another), its own /tmp, and its own
  RLIMIT_NPROC count (the kernel counts processes per user namespace). What it lacks
  against ``root``: no uid of its own, so the program can read every file the judging user
  (and the user's groups) may read outside the hidden directories, not only world-readable
  ones. A root judge that forces this level (CI) enters it as the slot uid, as a user would.
* ``basic`` (the kernel refuses user namespaces, or util-linux is missing): a new session
  (process group) killed as a whole on timeout, the same rlimits, a fresh temporary working
  directory, and, when root with `setpriv`, the same uid drop, after which every process
  left with the run's uid is killed. Not isolated: the network, other world-writable
  directories such as /tmp, the PID space, and (without the uid drop) descendants that
  leave the process group. Landing here by auto-detection is warned about once.

`GSPO_SANDBOX_PYTHON` picks the interpreter (it must be executable by the sandbox uid: a
virtualenv under /root is not; nor is one under a hidden directory other than its own).

Exit semantics, decided once: a run is judged on what the process really wrote and how
it ended. Status "ok" needs exit status 0; `sys.exit(0)` before printing gives empty
output; `os._exit(0)` after `print` without a flush loses the buffered output exactly as
it would in a terminal run, and passes only if the output was flushed and matches.
"""

from __future__ import annotations

import math
import os
import queue
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from gspo_cli.errors import RunError, SpecError
from gspo_cli.sandbox.isolation import ENV_VAR, LEVELS, NOGROUP, Isolation, hidden_dirs, summary, wrapper_argv

Status = Literal["ok", "timeout", "runtime_error", "memory", "output_limit", "killed"]

MAX_CODE_BYTES = 100_000  # the program travels as one argv string (Linux caps one at 128 KiB)
_SLOTS = 64  # concurrent sandboxes per process, each with its own uid
_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": "/tmp"}


@dataclass(frozen=True)
class RunResult:
    status: Status
    stdout: str
    stderr: str
    returncode: int | None  # None when the judge killed it (timeout) or never started it
    wall_s: float


@dataclass(frozen=True)
class Job:
    """One program run; the arguments of `run_program` as a value, for `run_many`."""

    code: str
    stdin: str = ""
    timeout_s: float = 2.0
    memory_mb: int = 256
    output_limit_bytes: int = 1 << 20


def _python() -> str:
    env = os.environ.get("GSPO_SANDBOX_PYTHON")
    if env:
        return env
    # The system interpreter is world-readable; a venv or pyenv under /root (0700) is not.
    for cand in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.access(cand, os.X_OK):
            return cand
    return shutil.which("python3") or sys.executable


_iso_lock = threading.Lock()
_iso: Isolation | None = None


def detect_isolation() -> Isolation:
    """The isolation level in use, found once per process by a smoke run: the one
    `GSPO_SANDBOX_ISOLATION` names, else the strongest that works here. SpecError for an
    unknown name; RunError when the named level does not work here, or when no program can
    run at all (e.g. an interpreter the sandbox uid may not execute)."""
    global _iso
    with _iso_lock:
        if _iso is None:
            _iso = _detect(os.environ.get(ENV_VAR, "auto"))
        return _iso


def reset_isolation(level: str | None = None) -> Isolation:
    """Detect again (tests): `level` as if `GSPO_SANDBOX_ISOLATION` named it, None for the
    environment's choice. Raises as `detect_isolation` does."""
    global _iso
    with _iso_lock:
        _iso = None
        _iso = _detect(level or os.environ.get(ENV_VAR, "auto"))
        return _iso


def _unavailable(level: str, root: bool) -> str | None:
    """Why `level` cannot even be tried here, or None."""
    if level == "root" and not root:
        return "needs the judge to run as root"
    if level != "basic":
        missing = [t for t in ("unshare", "setpriv", "mount") if shutil.which(t) is None]
        if missing:
            return f"{', '.join(missing)} not found on PATH"
    return None


def _detect(requested: str) -> Isolation:
    requested = requested.strip().lower() or "auto"
    if requested not in ("auto", *LEVELS):
        raise SpecError(f"{ENV_VAR}={requested}: unknown sandbox level; use auto, {', '.join(LEVELS)}")
    python = _python()
    root = os.geteuid() == 0
    drop = root and shutil.which("setpriv") is not None
    hidden = hidden_dirs(python, os.environ.get("HOME"))
    probe = "import sys; print(sys.version_info[0], sys.version_info[1])"
    why = ""
    for level in LEVELS if requested == "auto" else (requested,):
        why = _unavailable(level, root) or ""
        if why:
            continue
        iso = Isolation(level, python, drop, None, hidden if level != "basic" else ())
        res = _run(iso, probe, "", 10.0, 256, 4096)
        if res.status == "ok":
            major, minor = (int(v) for v in res.stdout.split())
            iso = Isolation(level, python, drop, (major, minor), iso.hidden)
            if level == "basic" and requested == "auto":
                warnings.warn(f"{summary(iso)}: the kernel or this machine allows no stronger level", stacklevel=2)
            return iso
        why = f"{res.status}: {' '.join(res.stderr.split())[-300:] or f'exit code {res.returncode}'}"  # one line
    if requested != "auto":
        raise RunError(
            f"{ENV_VAR}={requested}: this sandbox level does not work here ({why}); "
            f"unset it to use the strongest level that does"
        )
    # Every program would fail and every reward be 0: a run must not go on silently.
    raise RunError(
        f"the code sandbox cannot run {python} ({why}); "
        "set GSPO_SANDBOX_PYTHON to an interpreter that any user may execute"
    )


# Sandbox slots: each concurrent run gets a distinct uid (see the module docstring).
_slot_lock = threading.Lock()
_slot_queue: queue.Queue[int] | None = None


def _uid_base() -> int:
    # A private range far above real accounts, distinct per judging process.
    return 2_000_000 + (os.getpid() % 100_000) * _SLOTS


@contextmanager
def _slot():
    global _slot_queue
    with _slot_lock:
        if _slot_queue is None:
            _slot_queue = queue.Queue()
            for s in range(_SLOTS):
                _slot_queue.put(s)
    slot = _slot_queue.get()
    try:
        yield _uid_base() + slot
    finally:
        _slot_queue.put(slot)


def run_program(
    code: str, stdin: str = "", *, timeout_s: float = 2.0, memory_mb: int = 256, output_limit_bytes: int = 1 << 20
) -> RunResult:
    """Run `code` with `stdin` in the sandbox. `timeout_s` is wall-clock seconds;
    `memory_mb` caps the address space of each process; stdout and stderr are each cut at
    `output_limit_bytes` (status "output_limit" when exceeded). Never raises for anything
    the program does; a program over MAX_CODE_BYTES or with a NUL byte is a runtime_error."""
    return _run(detect_isolation(), code, stdin, timeout_s, memory_mb, output_limit_bytes)


def _run(iso: Isolation, code: str, stdin: str, timeout_s: float, memory_mb: int, out_cap: int) -> RunResult:
    if "\x00" in code or len(code.encode("utf-8", "surrogatepass")) > MAX_CODE_BYTES:
        return RunResult("runtime_error", "", "program too large or contains NUL", None, 0.0)
    limits = {
        "t": max(1, math.ceil(timeout_s)) + 1,  # CPU seconds; the wall clock is the real cap
        "v": memory_mb * 1024,  # KiB of address space
        "f": out_cap // 512 + 2,  # 512-byte blocks; sizes are checked exactly below
        "n": 64,
        "c": 0,
    }
    if iso.drop_uid or iso.level == "rootless":
        # Binds only a non-root uid: a uid of its own per slot, or (rootless) a count of
        # its own per user namespace.
        limits["p"] = 32
    with _slot() as uid, tempfile.TemporaryDirectory(prefix="gspo-judge-") as io_dir:
        io = Path(io_dir)
        workdir = None
        if iso.level == "basic":
            workdir = io / "work"
            workdir.mkdir()
            if iso.drop_uid:
                os.chown(workdir, uid, NOGROUP)
        (io / "stdin").write_text(stdin, encoding="utf-8", errors="surrogateescape")
        argv = wrapper_argv(iso, uid, str(workdir) if workdir else None, limits) + [code]
        t0 = time.monotonic()
        with open(io / "stdin", "rb") as fin, open(io / "stdout", "wb") as fout, open(io / "stderr", "wb") as ferr:
            try:
                proc = subprocess.Popen(
                    argv,
                    stdin=fin,
                    stdout=fout,
                    stderr=ferr,
                    env=_ENV,
                    cwd=io_dir,
                    start_new_session=True,
                    close_fds=True,
                )
            except OSError as err:
                return RunResult("runtime_error", "", f"could not start sandbox: {err}", None, 0.0)
            rc: int | None = _wait(proc, timeout_s)
            timed_out = rc is None
            if timed_out:
                _kill(proc, iso.level)
            if iso.level == "basic":
                _killpg(proc.pid)  # descendants still in the group (the leader is gone)
                if iso.drop_uid:
                    _kill_uid(uid)  # and those that left it: the uid is this run's alone
        wall = time.monotonic() - t0
        out, out_over = _read_capped(io / "stdout", out_cap)
        err, err_over = _read_capped(io / "stderr", out_cap)
    return RunResult(_classify(rc, timed_out, out_over or err_over, err), out, err, rc, round(wall, 4))


def _wait(proc: subprocess.Popen, timeout_s: float) -> int | None:
    """Exit status, or None on timeout. Popen.wait(timeout) polls with sleeps of up to
    50 ms, a large share of a 20 ms run; a pidfd wakes up the moment the process exits."""
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        try:
            return proc.wait(timeout=max(timeout_s, 0.0))
        except subprocess.TimeoutExpired:
            return None
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        if not poller.poll(max(timeout_s, 0.0) * 1000):
            return None
    finally:
        os.close(fd)
    return proc.wait()


def _kill(proc: subprocess.Popen, level: str) -> None:
    """Kill a timed-out run and wait until nothing of it is left."""
    if level != "basic":
        # Killing sh (PID 1 of the namespace) kills every process in it, and `unshare`
        # returns only once they are all gone: so kill sh, then wait for unshare.
        for child in _children(proc.pid):
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            pass
    if proc.poll() is None:  # not reaped yet, so the group id is still ours
        _killpg(proc.pid)
    proc.wait()


def _kill_uid(uid: int) -> None:
    """SIGKILL every process running as `uid`: kill(-1) sent *as* that uid reaches exactly
    those (and, unlike a /proc scan, cannot miss a child forked meanwhile)."""
    argv = ["setpriv", f"--reuid={uid}", f"--regid={NOGROUP}", "--clear-groups", "--", "/bin/sh", "-c", "kill -9 -1"]
    subprocess.run(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_ENV, check=False
    )


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _read_capped(path: Path, cap: int) -> tuple[str, bool]:
    with open(path, "rb") as f:
        data = f.read(cap + 1)
    return data[:cap].decode("utf-8", "replace"), len(data) > cap


def _classify(rc: int | None, timed_out: bool, over: bool, stderr: str) -> Status:
    if timed_out:
        return "timeout"
    if over:
        return "output_limit"
    # A signal death shows as -N (basic: python is the direct child) or 128+N (sh reports it).
    sig = -rc if rc is not None and rc < 0 else rc - 128 if rc is not None and rc > 128 else None
    if sig == signal.SIGXCPU:
        return "timeout"
    if sig == signal.SIGXFSZ:
        return "output_limit"
    if rc == 0:
        return "ok"
    if "MemoryError" in stderr[-2000:]:
        return "memory"
    if sig is not None:
        return "killed"
    return "runtime_error"


_pool_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None


def _shared_pool() -> ThreadPoolExecutor:
    # One pool per process, sized to the cores: each run is one busy subprocess.
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=os.cpu_count() or 1, thread_name_prefix="gspo-judge")
        return _pool


def run_many(jobs: Sequence[Job], *, total_timeout_s: float | None = None) -> list[RunResult]:
    """Run `jobs` in parallel (as many at once as there are cores), results in order.
    `total_timeout_s` caps the whole batch: a job gets at most the time left before that
    deadline, and a job not started by then is reported as a "timeout" without running.
    Do not call from inside a job (the pool is shared)."""
    if not jobs:
        return []
    deadline = None if total_timeout_s is None else time.monotonic() + total_timeout_s

    def one(job: Job) -> RunResult:
        timeout = job.timeout_s
        if deadline is not None:
            timeout = min(timeout, deadline - time.monotonic())
            if timeout <= 0:
                return RunResult("timeout", "", "not run: the batch time cap was reached", None, 0.0)
        return run_program(
            job.code, job.stdin, timeout_s=timeout, memory_mb=job.memory_mb, output_limit_bytes=job.output_limit_bytes
        )

    return list(_shared_pool().map(one, jobs))
