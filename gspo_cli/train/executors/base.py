"""What every executor shares: a run's record (what `gspo sweep --json` prints), the file
names of a run's spec and log, and the command that trains one run."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def record(r, status: str, code: int | None, wall_s: float, skipped: bool = False) -> dict[str, Any]:
    """One run's outcome: `r` a planned run (name, seed, path); `code` its exit code (4:
    stopped before it ended, None: unknown); `wall_s` seconds from its start to its end."""
    return {
        "run": r.name,
        "seed": r.seed,
        "path": str(r.path),
        "status": status,
        "exit": code,
        "wall_s": round(wall_s, 1),
        "skipped": skipped,
        "reason": None,  # a run that did not end well: its log's last line
        "log": None,  # ... and its log, kept
    }


def file_stem(r, index: int) -> str:
    """A file name for run `r`'s spec and log: its name and seed, readable and short enough."""
    name = "".join(c if c.isalnum() or c in ",=.-_" else "_" for c in r.name)[:150]
    return f"{index:03d}-{name}-seed{r.seed}"


def train_command(spec_file, force: bool) -> list[str]:
    """`gspo train` on one run's spec, in this Python (the one the executor's worker runs)."""
    return [sys.executable, "-m", "gspo_cli", "train", str(spec_file), "--quiet", *(["--force"] if force else [])]


def last_line(path: Path) -> str:
    """The last non-empty line of a text file; '' when there is none or no file."""
    try:
        lines = [x for x in path.read_text(errors="replace").splitlines() if x.strip()]
    except OSError:
        return ""
    return lines[-1].strip() if lines else ""


def wait_for(proc: subprocess.Popen, every_s: float = 0.5) -> int:
    """The child's exit code, looked at every `every_s` seconds. Never a blocking Popen.wait() in
    a job or task: a signal handler that looks at the child while it waits (submitit's time-limit
    checkpoint) would wait forever on the Popen's lock, and an exception sent to the waiting thread
    (Ray's cancel) only lands between Python steps, never inside a blocking wait."""
    while proc.poll() is None:
        time.sleep(every_s)
    return proc.returncode
