"""The sandbox against a hostile corpus: every program must end in bounded time with a
non-passing status (or a harmless one), leave the host untouched and leave no process
behind (see `sandbox_corpus`). The corpus runs through every namespace level that works on
this machine (`root`, and `rootless` forced even when the tests run as root, as in CI), and
the fallback `basic` level through its own class. Choosing a level, and the sandbox run as
an ordinary user, are in test_sandbox_levels.py."""

from __future__ import annotations

import os
import socket
import stat
import time
import uuid
from pathlib import Path

import pytest
from sandbox_corpus import (
    BOUND,
    HOSTILE,
    TIMEOUT,
    assert_no_leftovers,
    new_marker,
    run_marked,
    use_level,
    world_writable_dir,
)

from gspo_cli.sandbox import programs as sandbox
from gspo_cli.sandbox.programs import Job, detect_isolation, run_many, run_program


@pytest.fixture(params=["root", "rootless"], scope="class")
def ns_level(request):
    yield use_level(request.param)
    sandbox.reset_isolation()


@pytest.fixture
def world_dir():
    with world_writable_dir() as d:
        yield d


def test_plain_program_runs_and_reads_stdin():
    res, elapsed, _ = run_marked("a, b = map(int, input().split())\nprint(a + b)", "2 3\n")
    assert (res.status, res.stdout, res.returncode) == ("ok", "5\n", 0)
    assert elapsed < BOUND


def test_exit_semantics():
    # sys.exit(0) before printing: "ok" but nothing printed, so no answer matches.
    res, _, _ = run_marked("import sys\nsys.exit(0)\nprint(3)")
    assert (res.status, res.stdout) == ("ok", "")
    # os._exit(0) after an unflushed print loses the output, as it would in a terminal...
    res, _, _ = run_marked("import os\nprint(3)\nos._exit(0)")
    assert (res.status, res.stdout) == ("ok", "")
    # ...and keeps it when flushed: judged on the output like any other program.
    res, _, _ = run_marked("import os, sys\nprint(3)\nsys.stdout.flush()\nos._exit(0)")
    assert (res.status, res.stdout) == ("ok", "3\n")
    res, _, _ = run_marked("import sys\nprint(3)\nsys.exit(1)")
    assert res.status == "runtime_error"


@pytest.mark.usefixtures("ns_level")
class TestNamespaceLevels:
    """The hostile corpus, once per namespace level (root, rootless) that works here."""

    def test_infinite_loop_times_out(self):
        res, elapsed, _ = run_marked("while True:\n    pass")
        assert res.status == "timeout" and res.returncode is None
        assert TIMEOUT <= elapsed < BOUND

    def test_fork_bomb_is_contained(self):
        res, elapsed, _ = run_marked(HOSTILE["fork_bomb"])
        assert res.status != "ok" and elapsed < BOUND

    def test_fork_bomb_without_handler_dies_fast(self):
        res, elapsed, _ = run_marked("import os\nwhile True:\n    os.fork()")
        assert res.status != "ok" and elapsed < BOUND

    def test_fork_bomb_does_not_starve_a_concurrent_program(self):
        # RLIMIT_NPROC counts per uid (root: a uid per slot) or per user namespace
        # (rootless): two bombs at their cap must leave a third program free to fork.
        plain = "import subprocess, time\ntime.sleep(0.3)\nprint(subprocess.run(['/bin/true']).returncode)"
        bomb = Job(HOSTILE["fork_bomb"], timeout_s=1.5)
        results = run_many([bomb, Job(plain, timeout_s=1.5), bomb])
        assert [r.status for r in results] == ["timeout", "ok", "timeout"]
        assert results[1].stdout == "0\n"

    def test_memory_bomb(self):
        res, elapsed, _ = run_marked(HOSTILE["memory_bomb"], memory_mb=128)
        assert res.status == "memory" and elapsed < BOUND
        res, _, _ = run_marked("x = bytearray(10**10)")
        assert res.status == "memory"

    def test_output_flood_is_capped(self):
        res, elapsed, _ = run_marked(HOSTILE["flood"], output_limit_bytes=10_000)
        assert res.status == "output_limit" and len(res.stdout) <= 10_000 and elapsed < BOUND

    def test_segfault_is_killed(self):
        res, elapsed, _ = run_marked(HOSTILE["segfault"])
        assert res.status == "killed" and elapsed < BOUND

    def test_killing_the_parent_fails_and_the_judge_survives(self):
        # The parent is the wrapper `sh`, PID 1 of the namespace: root's program may not
        # signal it (another uid), rootless's may, but the kernel drops a SIGKILL sent to a
        # namespace's init from inside. Either way the run goes on and the judge survives.
        body = (
            "import os\nprint(os.getppid(), flush=True)\ntry:\n    os.kill(os.getppid(), 9)\n"
            "except PermissionError:\n    pass\nprint('survived')"
        )
        res, elapsed, _ = run_marked(body)
        assert (res.status, res.stdout) == ("ok", "1\nsurvived\n") and elapsed < BOUND
        assert sandbox.run_program("print(1)").stdout == "1\n"  # the judge still works

    def test_kill_everything_reaches_nothing_outside(self):
        # kill(-1) signals every process the program may signal: only its own namespace's.
        res, elapsed, _ = run_marked("import os\nos.kill(-1, 9)\nprint('after')")
        assert res.status != "ok" and elapsed < BOUND

    def test_parent_environment_is_not_visible(self, monkeypatch):
        secret = f"secret-{uuid.uuid4().hex}"
        monkeypatch.setenv("GSPO_TEST_SECRET", secret)
        body = (
            "import os, glob\nprint(dict(os.environ))\n"
            "for p in glob.glob('/proc/*/environ'):\n"
            "    try:\n        print(open(p, 'rb').read())\n    except OSError:\n        pass"
        )
        res, _, _ = run_marked(body)
        assert res.status == "ok" and "GSPO_TEST_SECRET" not in res.stdout and secret not in res.stdout

    def test_network_is_unreachable(self):
        with socket.socket() as srv:
            srv.bind(("127.0.0.1", 0))
            srv.listen()
            srv.settimeout(0.2)
            port = srv.getsockname()[1]
            body = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=0.5)\nprint('connected')"
            res, elapsed, _ = run_marked(body)
            assert res.status == "runtime_error" and "connected" not in res.stdout and elapsed < BOUND
            with pytest.raises(socket.timeout):
                srv.accept()

    def test_writes_outside_the_sandbox_do_not_reach_the_host(self, tmp_path, world_dir):
        target = world_dir / "target.txt"
        target.write_text("original")
        target.chmod(0o666)
        marker = new_marker()
        body = (
            f"import os\nfor p in ['/tmp/{marker}', '/var/tmp/{marker}', '/dev/shm/{marker}', "
            f"'{tmp_path}/{marker}', '{world_dir}/{marker}']:\n"
            "    try:\n        open(p, 'w').write('pwned')\n    except OSError:\n        pass\n"
            f"try:\n    open('{target}', 'w').write('pwned')\nexcept OSError:\n    pass\n"
            "open('local.txt', 'w').write('fine')\nprint(open('local.txt').read())"
        )
        res, elapsed, _ = run_marked(body)
        assert res.status == "ok" and res.stdout == "fine\n" and elapsed < BOUND  # its own working dir is writable
        for d in (Path("/tmp"), Path("/var/tmp"), Path("/dev/shm"), tmp_path, world_dir):
            assert not (d / marker).exists()
        assert target.read_text() == "original"

    def test_deleting_files_fails(self, tmp_path, world_dir):
        canaries = [world_dir / "canary", tmp_path / "canary"]
        for c in canaries:
            c.write_text("alive")
            c.chmod(0o644)
        body = "import os\n" + "".join(
            f"try:\n    os.remove('{c}')\nexcept OSError as e:\n    print(e)\n" for c in canaries
        )
        res, elapsed, _ = run_marked(body)
        assert res.stdout.count("Read-only file system") + res.stdout.count("No such file") == 2
        assert elapsed < BOUND
        for c in canaries:
            assert c.read_text() == "alive" and stat.S_IMODE(c.stat().st_mode) == 0o644

    def test_no_capability_to_undo_the_mounts(self):
        # rootless runs the program as uid 0 of its user namespace: without dropping every
        # capability it could remount / read-write.
        body = (
            "import subprocess\nprint(open('/proc/self/status').read().split('CapEff:')[1].split()[0])\n"
            "r = subprocess.run(['mount', '-o', 'remount,bind,rw', '/'], capture_output=True)\n"
            "print(r.returncode != 0)\nopen('/etc/gspo-pwned', 'w')"
        )
        res, _, _ = run_marked(body)
        assert res.stdout == "0000000000000000\nTrue\n" and "Read-only file system" in res.stderr
        assert not Path("/etc/gspo-pwned").exists()

    def test_home_and_run_are_hidden(self, monkeypatch, ns_level, world_dir):
        # A world-readable file in the judging user's home: the rootless program runs as
        # that user and could read even private ones, so the whole directory is hidden.
        home = world_dir / "home"
        home.mkdir(mode=0o755)
        (home / "secret.txt").write_text("key")
        (home / "secret.txt").chmod(0o644)
        monkeypatch.setenv("HOME", str(home))
        sandbox.reset_isolation(ns_level.level)
        try:
            body = (
                f"import os\nprint(os.listdir('{home}'), os.listdir('/run'), os.listdir('/home'))\n"
                f"open('{home}/secret.txt')"
            )
            res, _, _ = run_marked(body)
        finally:
            monkeypatch.undo()
            sandbox.reset_isolation(ns_level.level)
        assert res.stdout == "[] [] []\n" and "FileNotFoundError" in res.stderr

    def test_escaped_daemon_dies_with_therun_marked(self):
        body = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\nprint('parent done')"
        res, elapsed, _ = run_marked(body)  # _run asserts that no process survives
        assert res.status == "ok" and elapsed < BOUND

    def test_hostile_corpus_in_parallel_is_bounded(self):
        markers = {name: new_marker() for name in HOSTILE}
        jobs = [
            Job(f"# {markers[n]}\n{body}", timeout_s=TIMEOUT, memory_mb=128, output_limit_bytes=10_000)
            for n, body in HOSTILE.items()
        ]
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
            assert_no_leftovers(marker)


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
        assert detect_isolation().level == "basic" and detect_isolation().hidden == ()

    @pytest.mark.parametrize(
        "name,status",
        [("loop", "timeout"), ("memory_bomb", "memory"), ("flood", "output_limit"), ("segfault", "killed")],
    )
    def test_bounded(self, name, status):
        res, elapsed, _ = run_marked(HOSTILE[name], memory_mb=128, output_limit_bytes=10_000)
        assert res.status == status and elapsed < BOUND

    def test_process_group_is_killed(self):
        body = "import os, time\nif os.fork() == 0:\n    time.sleep(60)\ntime.sleep(60)"
        res, elapsed, _ = run_marked(body)
        assert res.status == "timeout" and elapsed < BOUND

    def test_escaped_daemon_is_killed(self):
        if not detect_isolation().drop_uid:
            pytest.skip("needs root: the run's own uid is what finds escaped processes")
        body = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\nprint('parent done')"
        res, _, _ = run_marked(body)  # _run asserts that no process survives
        assert res.status == "ok"

    def test_plain_program(self):
        res, _, _ = run_marked("print(input()[::-1])", "abc\n")
        assert (res.status, res.stdout) == ("ok", "cba\n")
