"""The sandbox against a hostile corpus: every program must end in bounded time with a
non-passing status (or a harmless one), leave the host untouched and leave no process
behind. Each program embeds a unique marker, so /proc tells whether any part of its run
(unshare, sh, the interpreter, its children) is still alive afterwards."""

from __future__ import annotations

import os
import socket
import stat
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from gspo_cli.errors import RunError
from gspo_cli.tasks import sandbox
from gspo_cli.tasks.sandbox import Job, detect_isolation, run_many, run_program

TIMEOUT = 1.0
BOUND = TIMEOUT + 2.5  # wall-clock seconds a hostile run may take at most, kill included

needs_namespaces = pytest.mark.skipif(detect_isolation().level != "namespaces",
                                      reason="needs root with unshare/setpriv (namespaces isolation)")


def _marker() -> str:
    return f"gspo-hostile-{uuid.uuid4().hex}"


def _procs_with(marker: str) -> list[int]:
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


def _assert_no_leftovers(marker: str) -> None:
    # Allow a moment for the kernel to finish reaping; anything alive after that leaked.
    deadline = time.monotonic() + 1.0
    while _procs_with(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _procs_with(marker) == [], f"processes left behind for {marker}"


def _run(body: str, stdin: str = "", **kw):
    marker = _marker()
    code = f"# {marker}\n{body}"
    t0 = time.monotonic()
    res = run_program(code, stdin, timeout_s=kw.pop("timeout_s", TIMEOUT), **kw)
    elapsed = time.monotonic() - t0
    _assert_no_leftovers(marker)
    return res, elapsed, marker


def test_plain_program_runs_and_reads_stdin():
    res, elapsed, _ = _run("a, b = map(int, input().split())\nprint(a + b)", "2 3\n")
    assert (res.status, res.stdout, res.returncode) == ("ok", "5\n", 0)
    assert elapsed < BOUND


def test_infinite_loop_times_out():
    res, elapsed, _ = _run("while True:\n    pass")
    assert res.status == "timeout" and res.returncode is None
    assert TIMEOUT <= elapsed < BOUND


def test_fork_bomb_is_contained():
    res, elapsed, _ = _run("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass")
    assert res.status != "ok" and elapsed < BOUND


def test_fork_bomb_without_handler_dies_fast():
    res, elapsed, _ = _run("import os\nwhile True:\n    os.fork()")
    assert res.status != "ok" and elapsed < BOUND


def test_memory_bomb():
    res, elapsed, _ = _run("x = []\nwhile True:\n    x.append(bytearray(10**7))", memory_mb=128)
    assert res.status == "memory" and elapsed < BOUND
    res, _, _ = _run("x = bytearray(10**10)")
    assert res.status == "memory"


def test_output_flood_is_capped():
    res, elapsed, _ = _run("while True:\n    print('x' * 1000)", output_limit_bytes=10_000)
    assert res.status == "output_limit" and len(res.stdout) <= 10_000 and elapsed < BOUND


def test_segfault_is_killed():
    res, elapsed, _ = _run("import ctypes\nctypes.string_at(0)")
    assert res.status == "killed" and elapsed < BOUND


def test_killing_the_parent_fails_and_the_judge_survives():
    res, elapsed, _ = _run("import os\nos.kill(os.getppid(), 9)\nprint('survived')")
    assert res.status != "ok" and "survived" not in res.stdout and elapsed < BOUND
    assert sandbox.run_program("print(1)").stdout == "1\n"  # the judge still works


@needs_namespaces
def test_kill_everything_reaches_nothing_outside():
    # kill(-1) signals every process the uid may signal: only the program's own.
    res, elapsed, _ = _run("import os\nos.kill(-1, 9)\nprint('after')")
    assert res.status != "ok" and elapsed < BOUND


def test_parent_environment_is_not_visible(monkeypatch):
    secret = f"secret-{uuid.uuid4().hex}"
    monkeypatch.setenv("GSPO_TEST_SECRET", secret)
    body = ("import os, glob\nprint(dict(os.environ))\n"
            "for p in glob.glob('/proc/*/environ'):\n"
            "    try:\n        print(open(p, 'rb').read())\n    except OSError:\n        pass")
    res, _, _ = _run(body)
    assert res.status == "ok" and "GSPO_TEST_SECRET" not in res.stdout and secret not in res.stdout


@needs_namespaces
def test_network_is_unreachable():
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        srv.settimeout(0.2)
        port = srv.getsockname()[1]
        body = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=0.5)\nprint('connected')"
        res, elapsed, _ = _run(body)
        assert res.status == "runtime_error" and "connected" not in res.stdout and elapsed < BOUND
        with pytest.raises(socket.timeout):
            srv.accept()


@needs_namespaces
def test_writes_outside_the_sandbox_do_not_reach_the_host(tmp_path):
    shared = Path(tempfile.mkdtemp(dir="/var/tmp"))  # world-writable: the uid drop alone won't stop it
    try:
        shared.chmod(0o777)
        target = shared / "target.txt"
        target.write_text("original")
        target.chmod(0o666)
        marker = _marker()
        body = (f"import os\nfor p in ['/tmp/{marker}', '/var/tmp/{marker}', '/dev/shm/{marker}', "
                f"'{tmp_path}/{marker}']:\n"
                "    try:\n        open(p, 'w').write('pwned')\n    except OSError:\n        pass\n"
                f"try:\n    open('{target}', 'w').write('pwned')\nexcept OSError:\n    pass\n"
                "open('local.txt', 'w').write('fine')\nprint(open('local.txt').read())")
        res, elapsed, _ = _run(body)
        assert res.status == "ok" and res.stdout == "fine\n" and elapsed < BOUND  # its own working dir is writable
        for p in (Path("/tmp") / marker, Path("/var/tmp") / marker, Path("/dev/shm") / marker, tmp_path / marker):
            assert not p.exists()
        assert target.read_text() == "original"
    finally:
        for f in shared.iterdir():
            f.unlink()
        shared.rmdir()


@needs_namespaces
def test_deleting_files_fails(tmp_path):
    shared = Path(tempfile.mkdtemp(dir="/var/tmp"))
    try:
        shared.chmod(0o777)  # a directory anyone may delete from, were it visible and writable
        canaries = [shared / "canary", tmp_path / "canary"]
        for c in canaries:
            c.write_text("alive")
            c.chmod(0o644)
        body = "import os\n" + "".join(
            f"try:\n    os.remove('{c}')\nexcept OSError as e:\n    print(e)\n" for c in canaries)
        res, elapsed, _ = _run(body)
        assert res.stdout.count("Read-only file system") + res.stdout.count("No such file") == 2
        assert elapsed < BOUND
        for c in canaries:
            assert c.read_text() == "alive" and stat.S_IMODE(c.stat().st_mode) == 0o644
    finally:
        for f in shared.iterdir():
            f.unlink()
        shared.rmdir()


def test_exit_semantics():
    # sys.exit(0) before printing: "ok" but nothing printed, so no answer matches.
    res, _, _ = _run("import sys\nsys.exit(0)\nprint(3)")
    assert (res.status, res.stdout) == ("ok", "")
    # os._exit(0) after an unflushed print loses the output, as it would in a terminal...
    res, _, _ = _run("import os\nprint(3)\nos._exit(0)")
    assert (res.status, res.stdout) == ("ok", "")
    # ...and keeps it when flushed: judged on the output like any other program.
    res, _, _ = _run("import os, sys\nprint(3)\nsys.stdout.flush()\nos._exit(0)")
    assert (res.status, res.stdout) == ("ok", "3\n")
    res, _, _ = _run("import sys\nprint(3)\nsys.exit(1)")
    assert res.status == "runtime_error"


@needs_namespaces
def test_escaped_daemon_dies_with_the_run():
    body = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\nprint('parent done')"
    res, elapsed, _ = _run(body)  # _run asserts that no process survives
    assert res.status == "ok" and elapsed < BOUND


HOSTILE = {
    "loop": "while True:\n    pass",
    "fork_bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
    "memory_bomb": "x = []\nwhile True:\n    x.append(bytearray(10**7))",
    "flood": "while True:\n    print('x' * 1000)",
    "segfault": "import ctypes\nctypes.string_at(0)",
    "kill_parent": "import os\nos.kill(os.getppid(), 9)\nprint(1)",
    "threads": "import threading, time\nfor _ in range(100):\n    threading.Thread(target=time.sleep, args=(60,)).start()",
    "sleep": "import time\ntime.sleep(60)",
}


def test_hostile_corpus_in_parallel_is_bounded():
    markers = {name: _marker() for name in HOSTILE}
    jobs = [Job(f"# {markers[n]}\n{body}", timeout_s=TIMEOUT, memory_mb=128, output_limit_bytes=10_000)
            for n, body in HOSTILE.items()]
    t0 = time.monotonic()
    results = run_many(jobs)
    elapsed = time.monotonic() - t0
    for name, res in zip(HOSTILE, results):
        assert res.status != "ok", name
        assert res.wall_s < BOUND, (name, res.wall_s)
    # 8 programs on os.cpu_count() workers, most running into the timeout.
    waves = -(-len(jobs) // (os.cpu_count() or 1))
    assert elapsed < waves * BOUND
    for marker in markers.values():
        _assert_no_leftovers(marker)


def test_batch_time_cap_skips_what_it_cannot_start():
    jobs = [Job("import time\ntime.sleep(5)", timeout_s=5.0)] * 6
    t0 = time.monotonic()
    results = run_many(jobs, total_timeout_s=1.0)
    assert time.monotonic() - t0 < 1.0 + 2.5
    assert all(r.status == "timeout" for r in results)


def test_large_or_nul_programs_are_rejected_without_running():
    assert run_program("print(1)\x00").status == "runtime_error"
    assert run_program("#" * (sandbox.MAX_CODE_BYTES + 1)).status == "runtime_error"


class TestBasicIsolation:
    """The fallback without namespaces still bounds time, memory and output."""

    @pytest.fixture(autouse=True)
    def _basic(self):
        sandbox.reset_isolation("basic")
        yield
        sandbox.reset_isolation()

    def test_level_is_basic(self):
        assert detect_isolation().level == "basic"

    @pytest.mark.parametrize("name,status", [("loop", "timeout"), ("memory_bomb", "memory"),
                                             ("flood", "output_limit"), ("segfault", "killed")])
    def test_bounded(self, name, status):
        res, elapsed, _ = _run(HOSTILE[name], memory_mb=128, output_limit_bytes=10_000)
        assert res.status == status and elapsed < BOUND

    def test_process_group_is_killed(self):
        body = "import os, time\nif os.fork() == 0:\n    time.sleep(60)\ntime.sleep(60)"
        res, elapsed, _ = _run(body)
        assert res.status == "timeout" and elapsed < BOUND

    def test_escaped_daemon_is_killed(self):
        if not detect_isolation().drop_uid:
            pytest.skip("needs root: the run's own uid is what finds escaped processes")
        body = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\nprint('parent done')"
        res, _, _ = _run(body)  # _run asserts that no process survives
        assert res.status == "ok"

    def test_plain_program(self):
        res, _, _ = _run("print(input()[::-1])", "abc\n")
        assert (res.status, res.stdout) == ("ok", "cba\n")


def test_an_unusable_interpreter_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("GSPO_SANDBOX_PYTHON", "/nonexistent/python3")
    try:
        with pytest.raises(RunError, match="GSPO_SANDBOX_PYTHON"):
            sandbox.reset_isolation()
    finally:
        monkeypatch.delenv("GSPO_SANDBOX_PYTHON")
        sandbox.reset_isolation()
