"""The sandbox against a hostile corpus: every program must end in bounded time with a
non-passing status (or a harmless one), leave the host untouched and leave no process
behind. Each program embeds a unique marker, so /proc tells whether any part of its run
(unshare, sh, the interpreter, its children) is still alive afterwards.

The corpus runs through every namespace level that works on this machine (`root` and
`rootless`, the latter forced even when the tests run as root, as in CI), the fallback
`basic` level through its own class, and `test_rootless_as_an_ordinary_user` runs the
sandbox itself as `nobody`: the case the rootless level exists for."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from gspo_cli.errors import RunError, SpecError
from gspo_cli.tasks import sandbox
from gspo_cli.tasks.sandbox import Job, detect_isolation, run_many, run_program
from gspo_cli.tasks.sandbox_setup import ENV_VAR, LEVELS

TIMEOUT = 1.0
BOUND = TIMEOUT + 2.5  # wall-clock seconds a hostile run may take at most, kill included

HOSTILE = {
    "loop": "while True:\n    pass",
    "fork_bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
    "memory_bomb": "x = []\nwhile True:\n    x.append(bytearray(10**7))",
    "flood": "while True:\n    print('x' * 1000)",
    "segfault": "import ctypes\nctypes.string_at(0)",
    "kill_parent": "import os\nos.kill(os.getppid(), 9)\nwhile True:\n    pass",
    "threads": "import threading, time\nfor _ in range(100):\n    threading.Thread(target=time.sleep, args=(60,)).start()",
    "sleep": "import time\ntime.sleep(60)",
}


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


def _use_level(level: str):
    """Switch the sandbox to `level`, or skip the test with the reason it does not work here."""
    try:
        return sandbox.reset_isolation(level)
    except RunError as err:
        pytest.skip(f"{level} isolation does not work on this machine: {err}")


@pytest.fixture(params=["root", "rootless"], scope="class")
def ns_level(request):
    yield _use_level(request.param)
    sandbox.reset_isolation()


@pytest.fixture
def world_dir():
    """A world-writable directory under /var/tmp: not behind the sandbox's private /tmp,
    so only the read-only root keeps a program from writing there."""
    shared = Path(tempfile.mkdtemp(dir="/var/tmp"))
    shared.chmod(0o777)
    yield shared
    shutil.rmtree(shared)


def test_plain_program_runs_and_reads_stdin():
    res, elapsed, _ = _run("a, b = map(int, input().split())\nprint(a + b)", "2 3\n")
    assert (res.status, res.stdout, res.returncode) == ("ok", "5\n", 0)
    assert elapsed < BOUND


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


@pytest.mark.usefixtures("ns_level")
class TestNamespaceLevels:
    """The hostile corpus, once per namespace level (root, rootless) that works here."""

    def test_infinite_loop_times_out(self):
        res, elapsed, _ = _run("while True:\n    pass")
        assert res.status == "timeout" and res.returncode is None
        assert TIMEOUT <= elapsed < BOUND

    def test_fork_bomb_is_contained(self):
        res, elapsed, _ = _run(HOSTILE["fork_bomb"])
        assert res.status != "ok" and elapsed < BOUND

    def test_fork_bomb_without_handler_dies_fast(self):
        res, elapsed, _ = _run("import os\nwhile True:\n    os.fork()")
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
        res, elapsed, _ = _run(HOSTILE["memory_bomb"], memory_mb=128)
        assert res.status == "memory" and elapsed < BOUND
        res, _, _ = _run("x = bytearray(10**10)")
        assert res.status == "memory"

    def test_output_flood_is_capped(self):
        res, elapsed, _ = _run(HOSTILE["flood"], output_limit_bytes=10_000)
        assert res.status == "output_limit" and len(res.stdout) <= 10_000 and elapsed < BOUND

    def test_segfault_is_killed(self):
        res, elapsed, _ = _run(HOSTILE["segfault"])
        assert res.status == "killed" and elapsed < BOUND

    def test_killing_the_parent_fails_and_the_judge_survives(self):
        # The parent is the wrapper `sh`, PID 1 of the namespace: root's program may not
        # signal it (another uid), rootless's may, but the kernel drops a SIGKILL sent to a
        # namespace's init from inside. Either way the run goes on and the judge survives.
        body = ("import os\nprint(os.getppid(), flush=True)\ntry:\n    os.kill(os.getppid(), 9)\n"
                "except PermissionError:\n    pass\nprint('survived')")
        res, elapsed, _ = _run(body)
        assert (res.status, res.stdout) == ("ok", "1\nsurvived\n") and elapsed < BOUND
        assert sandbox.run_program("print(1)").stdout == "1\n"  # the judge still works

    def test_kill_everything_reaches_nothing_outside(self):
        # kill(-1) signals every process the program may signal: only its own namespace's.
        res, elapsed, _ = _run("import os\nos.kill(-1, 9)\nprint('after')")
        assert res.status != "ok" and elapsed < BOUND

    def test_parent_environment_is_not_visible(self, monkeypatch):
        secret = f"secret-{uuid.uuid4().hex}"
        monkeypatch.setenv("GSPO_TEST_SECRET", secret)
        body = ("import os, glob\nprint(dict(os.environ))\n"
                "for p in glob.glob('/proc/*/environ'):\n"
                "    try:\n        print(open(p, 'rb').read())\n    except OSError:\n        pass")
        res, _, _ = _run(body)
        assert res.status == "ok" and "GSPO_TEST_SECRET" not in res.stdout and secret not in res.stdout

    def test_network_is_unreachable(self):
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

    def test_writes_outside_the_sandbox_do_not_reach_the_host(self, tmp_path, world_dir):
        target = world_dir / "target.txt"
        target.write_text("original")
        target.chmod(0o666)
        marker = _marker()
        body = (f"import os\nfor p in ['/tmp/{marker}', '/var/tmp/{marker}', '/dev/shm/{marker}', "
                f"'{tmp_path}/{marker}', '{world_dir}/{marker}']:\n"
                "    try:\n        open(p, 'w').write('pwned')\n    except OSError:\n        pass\n"
                f"try:\n    open('{target}', 'w').write('pwned')\nexcept OSError:\n    pass\n"
                "open('local.txt', 'w').write('fine')\nprint(open('local.txt').read())")
        res, elapsed, _ = _run(body)
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
            f"try:\n    os.remove('{c}')\nexcept OSError as e:\n    print(e)\n" for c in canaries)
        res, elapsed, _ = _run(body)
        assert res.stdout.count("Read-only file system") + res.stdout.count("No such file") == 2
        assert elapsed < BOUND
        for c in canaries:
            assert c.read_text() == "alive" and stat.S_IMODE(c.stat().st_mode) == 0o644

    def test_no_capability_to_undo_the_mounts(self):
        # rootless runs the program as uid 0 of its user namespace: without dropping every
        # capability it could remount / read-write.
        body = ("import subprocess\nprint(open('/proc/self/status').read().split('CapEff:')[1].split()[0])\n"
                "r = subprocess.run(['mount', '-o', 'remount,bind,rw', '/'], capture_output=True)\n"
                "print(r.returncode != 0)\nopen('/etc/gspo-pwned', 'w')")
        res, _, _ = _run(body)
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
            body = (f"import os\nprint(os.listdir('{home}'), os.listdir('/run'), os.listdir('/home'))\n"
                    f"open('{home}/secret.txt')")
            res, _, _ = _run(body)
        finally:
            monkeypatch.undo()
            sandbox.reset_isolation(ns_level.level)
        assert res.stdout == "[] [] []\n" and "FileNotFoundError" in res.stderr

    def test_escaped_daemon_dies_with_the_run(self):
        body = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\nprint('parent done')"
        res, elapsed, _ = _run(body)  # _run asserts that no process survives
        assert res.status == "ok" and elapsed < BOUND

    def test_hostile_corpus_in_parallel_is_bounded(self):
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
        assert detect_isolation().level == "basic" and detect_isolation().hidden == ()

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


class TestLevelSelection:
    @pytest.fixture(autouse=True)
    def _restore(self):
        yield
        sandbox.reset_isolation()

    def test_auto_picks_the_strongest_level_that_works(self, monkeypatch):
        works = []
        for level in LEVELS:
            try:
                works.append(sandbox.reset_isolation(level).level)
            except RunError:
                pass
        monkeypatch.delenv(ENV_VAR, raising=False)
        assert works and sandbox.reset_isolation().level == works[0]
        monkeypatch.setenv(ENV_VAR, "auto")
        assert sandbox.reset_isolation().level == works[0]

    @pytest.mark.parametrize("level", LEVELS)
    def test_the_variable_selects_a_level(self, monkeypatch, level):
        monkeypatch.setenv(ENV_VAR, level)
        try:
            iso = sandbox.reset_isolation()
        except RunError as err:
            pytest.skip(f"{level} isolation does not work on this machine: {err}")
        assert iso.level == level and detect_isolation() is iso
        assert run_program("print(6 * 7)").stdout == "42\n"

    def test_an_unknown_level_is_a_usage_error(self, monkeypatch):
        monkeypatch.setenv(ENV_VAR, "chroot")
        with pytest.raises(SpecError) as info:
            sandbox.reset_isolation()
        assert str(info.value) == f"{ENV_VAR}=chroot: unknown sandbox level; use auto, root, rootless, basic"

    def test_a_level_that_cannot_work_is_an_error_not_a_fallback(self, monkeypatch):
        # Without util-linux on PATH neither namespace level can be set up.
        monkeypatch.setenv("PATH", "/nonexistent")
        for level in ("root", "rootless"):
            with pytest.raises(RunError, match=f"^{ENV_VAR}={level}: this sandbox level does not work here") as info:
                sandbox.reset_isolation(level)
            assert "\n" not in str(info.value)
        # Auto-detection does fall back, and says so once.
        with pytest.warns(UserWarning, match="code sandbox: basic isolation .*NO network"):
            assert sandbox.reset_isolation().level == "basic"

    def test_an_unusable_interpreter_is_a_clear_error(self, monkeypatch):
        monkeypatch.setenv("GSPO_SANDBOX_PYTHON", "/nonexistent/python3")
        with pytest.raises(RunError, match="GSPO_SANDBOX_PYTHON"):
            sandbox.reset_isolation()
        monkeypatch.delenv("GSPO_SANDBOX_PYTHON")


# Run by the system python3 as `nobody`: reports the level and a small corpus as JSON.
_AS_USER = '''
import json, os, sys, time
from gspo_cli.tasks.sandbox import Job, detect_isolation, run_many, run_program
from gspo_cli.tasks.sandbox_setup import summary
port, marker, target = int(sys.argv[1]), sys.argv[2], sys.argv[3]
iso = detect_isolation()
bomb = Job("# " + marker + "\\nimport os\\nwhile True:\\n    try:\\n        os.fork()\\n    except OSError:\\n        pass",
           timeout_s=1.5)
plain = Job("import subprocess, time\\ntime.sleep(0.3)\\nprint(subprocess.run(['/bin/true']).returncode)", timeout_s=1.5)
programs = {
    "ids": "import os\\nprint(os.getuid(), os.getgid(), sorted(os.listdir('/proc'))[:0])",
    "network": f"import socket\\nsocket.create_connection(('127.0.0.1', {port}), timeout=0.5)",
    "write": f"open('{target}', 'w').write('pwned')",
    "daemon": f"# {marker}\\nimport os, time\\nif os.fork() == 0:\\n    os.setsid()\\n    time.sleep(60)\\nprint('done')",
    "loop": f"# {marker}\\nwhile True:\\n    pass",
}
out = {"summary": summary(iso), "level": iso.level}
for name, code in programs.items():
    r = run_program(code, timeout_s=1.0)
    out[name] = [r.status, r.stdout, r.stderr[-300:], r.wall_s]
out["concurrent"] = [[r.status, r.stdout] for r in run_many([bomb, plain, bomb])]
print(json.dumps(out))
'''


def _as_nobody(*argv: str, env: dict[str, str] | None = None, cwd: str = "/") -> subprocess.CompletedProcess:
    cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--", "env", "-i",
           "PATH=/usr/bin:/bin", "HOME=/nonexistent", *(f"{k}={v}" for k, v in (env or {}).items()), *argv]
    return subprocess.run(cmd, check=False, capture_output=True, text=True, cwd=cwd, timeout=60)


@pytest.fixture
def package_for_nobody(world_dir):
    """A world-readable copy of the sandbox modules (all they import), for the system
    python3: `nobody` may not execute the test virtualenv or read this checkout."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root with setpriv to become another user (non-root runs exercise rootless directly)")
    if not os.access("/usr/bin/python3", os.X_OK):
        pytest.skip("needs the system /usr/bin/python3 (the interpreter a non-root judge would use)")
    src = Path(sandbox.__file__).parent
    pkg = world_dir / "pkg" / "gspo_cli"
    (pkg / "tasks").mkdir(parents=True)
    for f in (pkg / "__init__.py", pkg / "tasks" / "__init__.py"):
        f.write_text("")
    shutil.copy(src.parent / "errors.py", pkg)
    for name in ("sandbox.py", "sandbox_setup.py", "sandbox_check.py"):
        shutil.copy(src / name, pkg / "tasks")
    for p in [world_dir / "pkg", *(world_dir / "pkg").rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return world_dir / "pkg"


def test_rootless_as_an_ordinary_user(package_for_nobody, world_dir):
    """The case the rootless level is for: a judge running as an ordinary user gets PID,
    network and mount namespaces, and a root level it asks for is a one-line error."""
    probe = _as_nobody("unshare", "--user", "--map-root-user", "--pid", "--fork", "--mount-proc", "--net",
                       "--mount", "/bin/true")
    if probe.returncode != 0:
        pytest.skip(f"the kernel refuses unprivileged user namespaces here: {probe.stderr.strip()}")
    env = {"PYTHONPATH": str(package_for_nobody)}
    check = _as_nobody("/usr/bin/python3", "-m", "gspo_cli.tasks.sandbox_check", env=env)
    assert check.returncode == 0 and check.stdout.startswith("code sandbox: rootless isolation ("), check
    refused = _as_nobody("/usr/bin/python3", "-m", "gspo_cli.tasks.sandbox_check", env={**env, ENV_VAR: "root"})
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr == (f"error: {ENV_VAR}=root: this sandbox level does not work here (needs the judge "
                              "to run as root); unset it to use the strongest level that does\n")

    target = world_dir / "target.txt"
    target.write_text("original")
    target.chmod(0o666)  # the uid drop alone would not protect it: nobody may write it
    marker = _marker()
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        srv.settimeout(0.2)
        res = _as_nobody("/usr/bin/python3", "-c", _AS_USER, str(srv.getsockname()[1]), marker, str(target), env=env)
        assert res.returncode == 0, res.stderr
        with pytest.raises(socket.timeout):
            srv.accept()
    out = json.loads(res.stdout)
    assert out["level"] == "rootless"
    assert out["ids"][:2] == ["ok", "0 0 []\n"]  # uid 0 of its own user namespace
    assert out["network"][0] == "runtime_error" and "OSError" in out["network"][2]
    assert out["write"][0] == "runtime_error" and "Read-only file system" in out["write"][2]
    assert target.read_text() == "original"
    assert out["daemon"][:2] == ["ok", "done\n"] and out["loop"][0] == "timeout"
    assert all(r[3] < BOUND for r in (out["daemon"], out["loop"]))
    # Two fork bombs of the same real uid leave a third program free to fork.
    assert out["concurrent"] == [["timeout", ""], ["ok", "0\n"], ["timeout", ""]]
    _assert_no_leftovers(marker)
