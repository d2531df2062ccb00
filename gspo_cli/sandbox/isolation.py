"""The sandbox's isolation levels and the `/bin/sh` wrapper that sets each one up.

`programs` picks a level (`detect_isolation`) and runs programs through `wrapper_argv`; this
module only builds command lines and says what each level isolates, so it runs nothing.
The levels, strongest first (what each does and does not give is in `programs`'s docstring):

* ``root``: PID, network and mount namespaces made by root; the program runs as a uid of
  its own per sandbox slot.
* ``rootless``: the same namespaces inside an unprivileged user namespace
  (`unshare --user --map-root-user`), for a judge that is not root.
* ``basic``: rlimits, a session killed as a whole and a private working directory only.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass

LEVELS = ("root", "rootless", "basic")  # strongest first: auto-detection tries them in this order
ENV_VAR = "GSPO_SANDBOX_ISOLATION"  # "auto" (default) or one of LEVELS; a named level is never swapped
SETUP_FAILED = 125  # the wrapper's own exit code when it cannot set up the sandbox
NOGROUP = 65534

# One line per level, for `summary` (the basic-level warning, `python -m gspo_cli.sandbox.check`).
ISOLATES = {
    "root": "PID, network and mount namespaces, read-only root, private /tmp, a uid of its own per program",
    "rootless": "PID, network and mount namespaces in a user namespace, read-only root, private /tmp; "
    "runs as the judging user, not a uid of its own",
    "basic": "rlimits, killed as a session, private working directory; NO network, PID or filesystem isolation",
}

# Hidden behind an empty read-only tmpfs in the namespace levels: the judging user's files
# (rootless runs the program as that user) and /run's sockets (the system bus, a container
# engine's socket, /run/user/<uid>): a socket on a read-only mount can still be connected to.
_HIDE = ("/root", "/home", "/run")


@dataclass(frozen=True)
class Isolation:
    level: str  # one of LEVELS
    python: str
    drop_uid: bool  # run as a private uid + gid 65534 (only possible when the judge is root)
    python_version: tuple[int, int] | None  # of `python`, to know if compile() here agrees
    hidden: tuple[str, ...] = ()  # directories replaced by an empty tmpfs (namespace levels)


def hidden_dirs(python: str, home: str | None) -> tuple[str, ...]:
    """The existing directories of `_HIDE` plus `home` (resolved, none inside another) that
    do not hold `python`: an interpreter under a hidden directory could not start."""
    py = os.path.realpath(python)
    out = []
    for d in (*_HIDE, home or ""):
        d = os.path.realpath(d) if d else ""
        covered = any(d == e or d.startswith(e + "/") for e in out)  # already hidden with its parent
        if d and d != "/" and not covered and os.path.isdir(d) and not py.startswith(d + "/"):
            out.append(d)
    return tuple(out)


def summary(iso: Isolation) -> str:
    """One line: the level, what it isolates, and the interpreter judged code runs with."""
    version = ".".join(map(str, iso.python_version)) if iso.python_version else "?"
    return f"code sandbox: {iso.level} isolation ({ISOLATES[iso.level]}); python {version} at {iso.python}"


def wrapper_argv(iso: Isolation, uid: int, workdir: str | None, limits: dict[str, int]) -> list[str]:
    """argv that sets up the sandbox and runs `python -c "$1"`; the caller appends the code
    as $1. `uid` is the slot's private uid (used when `iso.drop_uid`); `workdir` is the basic
    level's working directory; `limits` maps `ulimit` flags to values."""
    ulimits = " && ".join(f"ulimit -{flag} {value}" for flag, value in limits.items())
    py = f"{shlex.quote(iso.python)} -I -S -B -X utf8 -c \"$1\""
    drop = f"setpriv --reuid={uid} --regid={NOGROUP} --clear-groups --no-new-privs --"
    if iso.level == "basic":
        if iso.drop_uid:
            py = f"{drop} {py}"
        script = f"cd {shlex.quote(workdir or '.')} && unset OLDPWD && {ulimits} || exit {SETUP_FAILED}\nexec {py}"
        return ["/bin/sh", "-c", script, "sandbox"]
    ns = ["unshare", "--pid", "--fork", "--mount-proc", "--net", "--mount"]
    if iso.level == "root":
        py = f"{drop} {py}"
    else:
        # uid 0 of the user namespace holds every capability over these mounts: drop them
        # all (bounding set included, so exec cannot regain them) or it could remount / rw.
        py = f"setpriv --bounding-set=-all --inh-caps=-all --no-new-privs -- {py}"
        ns[1:1] = ["--user", "--map-root-user"]
        if iso.drop_uid:
            # A root judge forcing this level (CI) enters as the slot uid, exactly as an
            # ordinary user would: `unshare -r` straight from root would map real uid 0.
            ns = [*drop.split(), *ns]
    hides = "".join(f"mount -t tmpfs -o ro,size=16k,mode=0755 tmpfs {shlex.quote(d)} && " for d in iso.hidden)
    mounts = (
        f"{hides}mount -o remount,bind,ro / && "
        "mount -t tmpfs -o size=32m,mode=1777,nosuid,nodev tmpfs /tmp && "
        "{ [ ! -d /dev/shm ] || mount -t tmpfs -o size=1m,mode=1777,nosuid,nodev tmpfs /dev/shm; }"
    )
    # `; exit $?` keeps sh from exec-ing the program: sh must stay PID 1 of the namespace
    # so that killing it takes every descendant down.
    script = f"{mounts} && cd /tmp && unset OLDPWD && {ulimits} || exit {SETUP_FAILED}\n{py}; exit $?"
    return [*ns, "/bin/sh", "-c", script, "sandbox"]
