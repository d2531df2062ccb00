"""Choosing the sandbox level (auto-detection, GSPO_SANDBOX_ISOLATION, errors instead of
fallbacks), and `test_rootless_as_an_ordinary_user`: the sandbox itself run as `nobody`,
the case the rootless level exists for."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest
from sandbox_corpus import BOUND, assert_no_leftovers, new_marker, world_writable_dir

from gspo_cli.errors import RunError, SpecError
from gspo_cli.sandbox import programs as sandbox
from gspo_cli.sandbox.isolation import ENV_VAR, LEVELS
from gspo_cli.sandbox.programs import detect_isolation, run_program


@pytest.fixture
def world_dir():
    with world_writable_dir() as d:
        yield d


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
from gspo_cli.sandbox.programs import Job, detect_isolation, run_many, run_program
from gspo_cli.sandbox.isolation import summary
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
    cmd = [
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--",
        "env",
        "-i",
        "PATH=/usr/bin:/bin",
        "HOME=/nonexistent",
        *(f"{k}={v}" for k, v in (env or {}).items()),
        *argv,
    ]
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
    (pkg / "sandbox").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    shutil.copy(src.parent / "errors.py", pkg)
    for name in ("__init__.py", "programs.py", "isolation.py", "check.py"):
        shutil.copy(src / name, pkg / "sandbox")
    for p in [world_dir / "pkg", *(world_dir / "pkg").rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return world_dir / "pkg"


def test_rootless_as_an_ordinary_user(package_for_nobody, world_dir):
    """The case the rootless level is for: a judge running as an ordinary user gets PID,
    network and mount namespaces, and a root level it asks for is a one-line error."""
    probe = _as_nobody(
        "unshare", "--user", "--map-root-user", "--pid", "--fork", "--mount-proc", "--net", "--mount", "/bin/true"
    )
    if probe.returncode != 0:
        pytest.skip(f"the kernel refuses unprivileged user namespaces here: {probe.stderr.strip()}")
    env = {"PYTHONPATH": str(package_for_nobody)}
    check = _as_nobody("/usr/bin/python3", "-m", "gspo_cli.sandbox.check", env=env)
    assert check.returncode == 0 and check.stdout.startswith("code sandbox: rootless isolation ("), check
    refused = _as_nobody("/usr/bin/python3", "-m", "gspo_cli.sandbox.check", env={**env, ENV_VAR: "root"})
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr == (
        f"error: {ENV_VAR}=root: this sandbox level does not work here (needs the judge "
        "to run as root); unset it to use the strongest level that does\n"
    )

    target = world_dir / "target.txt"
    target.write_text("original")
    target.chmod(0o666)  # the uid drop alone would not protect it: nobody may write it
    marker = new_marker()
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
    assert_no_leftovers(marker)
